#!/usr/bin/env bash
# Everything issue #29 checks on a lent GPU, in one call (device time is short: 15 minutes a
# session, a start included; this takes about 8), on the machine's own python3 (its torch,
# Triton, transformers), each part under its own timeout so a slow one cannot hide the rest:
#
#   1. bench/gpu_decode.py --profile: decode tokens/s of 8B- and 1.1B-shaped Llamas (fp16
#      and int4 weights, batch 1/8/64, CUDA graphs) beside the bandwidth roofline, a batch-1
#      step split into GPU forward / input preparation / the rest, a torch.profiler table;
#   2. bench/gpu_kernels.py --no-attention: kernel correctness at full shapes, then
#      W4A16/W8A16 vs float16 and vs gemlite on the 8B layer shapes at M = 1, 4, 8, 64;
#   3. the CUDA-only engine tests: decode CUDA graphs token-identical to eager, sleep/wake
#      freeing and restoring GPU memory, the sampler against transformers' warpers.
#
# The machine cannot reach a package index, so what its image lacks travels as wheels in
# `.whl/` (ignored by git; `bench/gpu_wheels.sh` fills it, gemlite included) and Hydrant
# itself is put on PYTHONPATH as a tree of links, mirroring setup.py's folder-to-package map.
#
#   run(command="bash bench/gpu_device.sh", carry=[".whl"], kind="nvidia-h200", timeout_s=560)
#
# Logs and JSON land under $OUT. A failing part does not stop the others.
# HYDRANT_GPU_DECODE=0 / HYDRANT_GPU_BENCH=0 / HYDRANT_GPU_TESTS=0 skip a part;
# HYDRANT_GPU_DECODE_ARGS and HYDRANT_GPU_BENCH_ARGS replace each bench's arguments (e.g.
# `--shapes 8b --quant none` or `--tune gemv`); HYDRANT_GPU_PROBE=1 also runs
# bench/gpu_w4_probe.py (the W4A16 GEMV with parts taken out, about 35 s).
# HYDRANT_GPU_SMOKE=1 dry-runs the script on a CPU (both benches with --smoke, the Triton
# interpreter), to prove it before spending a device slot.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hydrant-gpu}
mkdir -p "$OUT"
root=$(pwd)
site=/tmp/hydrant-site
pkg=/tmp/hydrant-pkg

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ "${HYDRANT_GPU_SMOKE:-0}" = 0 ] && compgen -G ".whl/*.whl" >/dev/null; then
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

python3 -m pip list 2>/dev/null | grep -i -E "^(vllm|gemlite|triton|torch|transformers) " || true
smoke=()
if [ "${HYDRANT_GPU_SMOKE:-0}" = 1 ]; then
    smoke=(--smoke)
    export TRITON_INTERPRET=1
fi

if [ "${HYDRANT_GPU_DECODE:-1}" = 1 ]; then
echo "== bench/gpu_decode.py ${HYDRANT_GPU_DECODE_ARGS:---profile}"
timeout 210 python3 -P bench/gpu_decode.py --out "$OUT" "${smoke[@]}" \
    ${HYDRANT_GPU_DECODE_ARGS:---profile} 2>&1 | tee "$OUT/decode.log"
echo "decode exit: ${PIPESTATUS[0]}"
fi

if [ -n "${HYDRANT_GPU_PROBE:-}" ]; then
echo "== bench/gpu_w4_probe.py"
timeout 240 python3 -P bench/gpu_w4_probe.py --out "$OUT" 2>&1 | tee "$OUT/probe.log"
echo "probe exit: ${PIPESTATUS[0]}"
fi

if [ "${HYDRANT_GPU_BENCH:-1}" = 1 ]; then
echo "== bench/gpu_kernels.py ${HYDRANT_GPU_BENCH_ARGS:---no-attention}"
timeout 180 python3 -P bench/gpu_kernels.py --out "$OUT" "${smoke[@]}" --deadline 150 \
    ${HYDRANT_GPU_BENCH_ARGS:---no-attention} 2>&1 | tee "$OUT/bench.log"
echo "bench exit: ${PIPESTATUS[0]}"
fi

if [ "${HYDRANT_GPU_TESTS:-1}" = 1 ] && [ "${HYDRANT_GPU_SMOKE:-0}" = 0 ]; then
echo "== CUDA engine tests"
# -W default: the image's torch/transformers may warn where the pinned ones do not.
timeout 130 python3 -P -m pytest -q -p no:cacheprovider -W default -o addopts="-ra" \
    tests/engine/test_cuda_graphs.py tests/engine/test_sleep_wake.py tests/engine/test_sampler.py \
    tests/engine/test_kernel_choice.py 2>&1 | tee "$OUT/pytest.log"
echo "pytest exit: ${PIPESTATUS[0]}"
fi
