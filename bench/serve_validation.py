"""Offline throughput of TensorRT-LLM 0.17 (`trtllm-bench`, perf-overview table) for Llama-3.1 8B and 70B
on H100, against `shardscope serve --engine trtllm --precision fp8` at an infinite rate. Constants are not
tuned to these rows; this prints the errors as they are.

Conditions simulated: FP8 weights, a BF16 KV cache or `--kv-dtype fp8` (the table does not say), the engine file's
defaults (max_num_tokens 8192, max_batch_size 2048, free_gpu_memory_fraction 0.9; the table's runs used
0.95 and trtllm-bench's own per-shape batch limits), and `--num-prompts` requests instead of 30,000
(enough to reach steady state; the drain at the end weighs a little more).

    python bench/serve_validation.py [--num-prompts 2000]
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from shardscope.errors import ShardscopeError
from shardscope.serve.estimate import serve_estimate

CSV = Path(__file__).resolve().parents[2] / "shared" / "validation" / "inference_public.csv"
MODELS = {"LLaMA v3.1 8B": "llama3.1-8b", "LLaMA v3.1 70B": "llama3.1-70b"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--kv-dtype", default="bf16", help="bf16 | fp8 (the table does not say which it ran)")
    args = ap.parse_args()
    rows = [
        r
        for r in csv.DictReader(args.csv.open())
        if r["id"].startswith("trt017-tput") and r["gpu"].startswith("H100") and r["model"] in MODELS
    ]
    errors: dict[str, list[float]] = {}
    print(f"{'id':18s} {'model':14s} {'tp':>2s} {'isl/osl':>11s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for r in rows:
        model, tp = MODELS[r["model"]], int(r["tp"])
        isl, osl, measured = int(r["input_len"]), int(r["output_len"]), float(r["value"])
        try:
            res = serve_estimate(
                model, "H100", int(r["num_gpus"]), tp=tp, engine="trtllm", precision="fp8", kv_dtype=args.kv_dtype,
                rate=math.inf, num_prompts=args.num_prompts, input_len=isl, output_len=osl,
            )  # fmt: skip
        except ShardscopeError as exc:
            print(f"{r['id']:18s} {model:14s} {tp:2d} {isl:>5d}/{osl:<5d} {measured:9.0f}  skipped: {exc}")
            continue
        predicted = res.output_tokens_per_s
        err = predicted / measured - 1
        errors.setdefault(f"{model} TP{tp}", []).append(err)
        print(f"{r['id']:18s} {model:14s} {tp:2d} {isl:>5d}/{osl:<5d} {measured:9.0f} {predicted:9.0f} {err:+7.1%}")
    every = [e for errs in errors.values() for e in errs]
    print()
    for key, errs in errors.items():
        mape, bias = sum(map(abs, errs)) / len(errs), sum(errs) / len(errs)
        print(f"{key:20s} rows {len(errs):2d}  MAPE {mape:6.1%}  mean error {bias:+6.1%}")
    print(f"{'all':20s} rows {len(every):2d}  MAPE {sum(map(abs, every)) / len(every):6.1%}")


if __name__ == "__main__":
    main()
