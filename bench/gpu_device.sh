#!/usr/bin/env bash
# Everything issue #5 checks on a lent GPU, in one call (device time is short: 15 minutes a
# session, a start included), on the machine's own python3 (its torch, Triton, transformers):
#
#   1. the CUDA-only engine tests: decode CUDA graphs token-identical to eager, sleep/wake
#      freeing and restoring GPU memory, the sampler against transformers' warpers;
#   2. bench/gpu_kernels.py --e2e: kernel correctness at full shapes, decode attention
#      bandwidth, W4A16/W8A16 vs float16, end-to-end decode vs transformers.
#
# The machine cannot reach a package index, so what its image lacks travels as wheels in
# `.whl/` (ignored by git; `bench/gpu_wheels.sh` fills it) and Hydrant itself is put on
# PYTHONPATH as a tree of links, mirroring setup.py's folder-to-package map.
#
#   run(command="bash bench/gpu_device.sh", carry=[".whl"], timeout_s=560)
#
# Logs and gpu_kernels.json land under $OUT. A failing test does not stop the bench.
# HYDRANT_GPU_TESTS=0 skips the tests; HYDRANT_GPU_BENCH_ARGS replaces `--e2e` (e.g.
# `--tune gemv`); HYDRANT_GPU_PROBE=1 first runs bench/gpu_w4_probe.py (the W4A16 GEMV with
# parts taken out, about 35 s); HYDRANT_GPU_BENCH=0 skips gpu_kernels.py.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hydrant-gpu}
mkdir -p "$OUT"
root=$(pwd)
site=/tmp/hydrant-site
pkg=/tmp/hydrant-pkg

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || exit 1
fi
rm -rf "$pkg" && mkdir -p "$pkg/hydrant"
cp -r hydrant/. "$pkg/hydrant/"
for folder in platform engine kernels web migrations; do
    ln -s "$root/$folder" "$pkg/hydrant/$folder"
done
export PYTHONPATH="$site:$pkg"
python3 -P - <<'EOF' || exit 1
import torch, triton, transformers, pytest
import hydrant.engine.llm_engine, hydrant.kernels.ops
print("torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "pytest", pytest.__version__,
      "cuda", torch.cuda.is_available())
EOF

if [ "${HYDRANT_GPU_TESTS:-1}" = 1 ]; then
echo "== CUDA engine tests"
# -W default: the image's torch/transformers may warn where the pinned ones do not.
timeout 150 python3 -P -m pytest -q -p no:cacheprovider -W default -o addopts="-ra" \
    tests/engine/test_cuda_graphs.py tests/engine/test_sleep_wake.py tests/engine/test_sampler.py \
    2>&1 | tee "$OUT/pytest.log"
echo "pytest exit: ${PIPESTATUS[0]}"
fi

if [ -n "${HYDRANT_GPU_PROBE:-}" ]; then
echo "== bench/gpu_w4_probe.py"
timeout 240 python3 bench/gpu_w4_probe.py --out "$OUT" 2>&1 | tee "$OUT/probe.log"
echo "probe exit: ${PIPESTATUS[0]}"
fi

[ "${HYDRANT_GPU_BENCH:-1}" = 1 ] || exit 0
echo "== bench/gpu_kernels.py ${HYDRANT_GPU_BENCH_ARGS:---e2e}"
timeout 480 python3 bench/gpu_kernels.py --out "$OUT" ${HYDRANT_GPU_BENCH_ARGS:---e2e} 2>&1 | tee "$OUT/bench.log"
echo "bench exit: ${PIPESTATUS[0]}"
