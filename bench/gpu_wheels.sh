#!/usr/bin/env bash
# Fills `.whl/` with the wheels bench/gpu_device.sh installs on the GPU machine: the packages
# Hydrant's engine and tests import that the machine's image lacks (it has torch, Triton,
# transformers, hypothesis, safetensors, tokenizers), at the versions of this checkout's
# .venv, and gemlite (the int4 kernels #29 measures against), built for the machine's
# CPython 3.12 on x86-64. Run here, where pip can fetch.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
names=(msgspec llguidance jsonschema jsonschema-specifications referencing rpds-py
       pytest pluggy iniconfig pytest-asyncio)
specs=()
for name in "${names[@]}"; do
    specs+=("$name==$(.venv/bin/pip show "$name" | awk '/^Version:/{print $2}')")
done
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
           manylinux_2_31 manylinux_2_34 manylinux_2_35; do
    platforms+=(--platform "${tag}_x86_64")
done
rm -rf .whl
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl "${specs[@]}"
# gemlite (#29's int4 peer) is pure Python but published as a source archive only: built
# into a wheel here (no compiler involved), pinned so the table compares one version.
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl "gemlite==${GEMLITE_VERSION:-0.6.0.post2}"
ls .whl
