"""The public serving measurements (`validation/inference_public.csv`: TensorRT-LLM 0.17 offline throughput,
TensorRT-LLM 0.14 online serving, Splitwise's static-batch prompt and per-token times, FasterTransformer
latencies) predicted from their columns, MAPE per metric, engine and GPU. The same as
`shardscope validate validation/inference_public.csv --no-rows`; constants are not tuned to these rows.

    python bench/serve_validation.py [--csv FILE] [--rows]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from shardscope.serve.validate import print_inference_validation, run_inference_validation

CSV = Path(__file__).resolve().parents[1] / "validation" / "inference_public.csv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args()
    start = time.perf_counter()
    report = run_inference_validation(args.csv)
    print_inference_validation(report, show_rows=args.rows)
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
