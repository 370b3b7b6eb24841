"""Quantization accuracy against float32 on the engine's own model: the gates the tests assert.

    python bench/quant_accuracy.py [--seeds 3] [--backends cpu,reference]

For each seed it writes the Llama-shaped checkpoint of
`hydrant.engine.accuracy.evaluate` (realistic weight statistics), loads it
through the engine's loader on each kernel backend, and prints, for int8
weights, int4 weights (round-to-nearest and calibrated) and int8 KV: mean KL
divergence of next-token distributions against the float model on the same
backend, top-1 agreement, bytes against float16, the thresholds and
PASS/FAIL. "triton" needs CUDA (or TRITON_INTERPRET=1, very slow). CPU, a
few seconds per seed and backend. The thresholds and why the int4 ones are
loose are explained in that module.
"""

from __future__ import annotations

import argparse
import time

import torch

from hydrant.engine.accuracy.evaluate import CALIBRATION_MIN_KL_GAIN, evaluate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="how many model seeds to run")
    parser.add_argument(
        "--backends", default="cpu,reference", help="comma list of kernel backends to run"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny matmuls: threads only add contention
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's bar would interleave with the table
    failures = 0
    header = (
        f"{'backend':9s} | {'seed':>4} | {'candidate':28s} | {'mean KL':>9} | {'max KL':>7} | "
        f"{'top-1':>6} | {'min':>5} | {'bytes':>6} | {'max':>5} | result"
    )
    print(header)
    print("-" * len(header))
    for backend in args.backends.split(","):
        for seed in range(args.seeds):
            started = time.perf_counter()
            results, entropy = evaluate(seed, backend)
            for r in results:
                g = r.gate
                failures += not r.passed
                print(
                    f"{backend:9s} | {seed:>4} | {g.name:28s} | {r.metrics.mean_kl:9.5f} | "
                    f"{g.max_mean_kl:7.3f} | {r.metrics.top1_agreement:6.3f} | {g.min_top1:5.2f} | "
                    f"{r.bytes_ratio:6.3f} | {g.max_bytes_ratio:5.2f} | "
                    f"{'PASS' if r.passed else 'FAIL'}"
                )
            by_name = {r.gate.name: r.metrics.mean_kl for r in results}
            gain = 1 - by_name["int4 weights + calibration"] / by_name["int4 weights"]
            calibration_ok = gain >= CALIBRATION_MIN_KL_GAIN
            failures += not calibration_ok
            print(
                f"{backend:9s} | {seed:>4} | calibration KL gain over RTN {gain:.1%} (min "
                f"{CALIBRATION_MIN_KL_GAIN:.0%}) {'PASS' if calibration_ok else 'FAIL'}; "
                f"reference entropy {entropy:.2f} nats; {time.perf_counter() - started:.1f}s"
            )
    print("all gates pass" if not failures else f"{failures} gate(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
