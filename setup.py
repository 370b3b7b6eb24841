"""Package discovery for the folder layout of DESIGN.md.

`platform/` must not hold an `__init__.py` (it would shadow the standard
library's `platform`), nor `kernels/` (it would shadow Hugging Face's `kernels`
distribution, which transformers imports), so the packages cannot be found by
setuptools' usual scan. Each top folder is mapped to its `hydrant.*` name here and every
sub-package below it is listed, so new domains need no edit to packaging.
"""

from setuptools import find_namespace_packages, setup

ROOTS = {
    "hydrant": "hydrant",
    "hydrant.platform": "platform",
    "hydrant.engine": "engine",
    "hydrant.kernels": "kernels",
    "hydrant.web": "web",
    "hydrant.migrations": "migrations",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, path in ROOTS.items():
    package_dir[name] = path
    packages.append(name)
    packages.extend(
        f"{name}.{sub}" for sub in find_namespace_packages(where=path, exclude=["*__pycache__*"])
    )

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "": [
            "*.c",
            "*.h",
            "*.txt",
            "*.html",
            "*.css",
            "*.js",
            "*.svg",
            "*.mako",
            "*.ini",
            "*.json",
            "py.typed",
        ],
    },
)
