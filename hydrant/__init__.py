"""Hydrant: a serverless-style multi-tenant LLM inference platform with billing."""

import sys

__version__ = "0.1.0"

# `hydrant.platform` is a namespace package mapped from the top-level folder
# `platform/` (DESIGN.md: an `__init__.py` there would shadow the standard
# library). Under an editable install, setuptools resolves mapped namespaces
# through a placeholder entry that only namespace parents search; a regular
# parent such as this one must search it too. Installed wheels need nothing.
__path__ = [*__path__, *(p for p in sys.path if p.startswith("__editable__.hydrant"))]
