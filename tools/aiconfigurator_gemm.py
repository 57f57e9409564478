"""Extract NVIDIA aiconfigurator's measured GEMMs: decode-sized BF16 ones (M 1-512 rows) for the split-K
check, or (`--blackwell-fp8`) the per-tensor FP8 Linear layers of Blackwell at training sizes (M 4k-16k), the
rows of validation/gemm_measured_aiconfigurator.csv that fit `fp8_cublaslt_matmul_sustained_fraction`.

Run inside a clone of github.com/ai-dynamo/aiconfigurator (it reads commit `aiconfigurator_tables.REV` with
git), with `pyarrow` installed (`$SHARDSCOPE` is this repository):

    python $SHARDSCOPE/tools/aiconfigurator_gemm.py > $SHARDSCOPE/validation/gemm_decode_measured_aiconfigurator.csv
    python $SHARDSCOPE/tools/aiconfigurator_gemm.py --blackwell-fp8   # rows to append to gemm_measured_...csv

Each row of `aic-core/src/aiconfigurator_core/systems/data/<gpu>/gemm/<engine>/<release>/gemm_perf.parquet`
is one Linear layer's forward, timed as a CUDA-graph replay over distinct weight copies that together exceed
the L2 cache (collector/helper.py `benchmark_with_power`, collector/trtllm/collect_gemm.py): TRT-LLM's
Linear (cuBLAS / its own kernels) and vLLM's default GEMM path. Kept: BF16, M 1-512, N and K powers of two
from 1k to 16k, the median of repeated shapes.
"""

from __future__ import annotations

import csv
import statistics
import sys

from aiconfigurator_tables import read_table

# (system directory, GPU, engine, release)
TABLES = (
    ("h100_sxm", "H100", "trtllm", "1.3.0rc20"),
    ("h200_sxm", "H200", "trtllm", "1.3.0rc20"),
    ("b200_sxm", "B200", "trtllm", "1.3.0rc20"),
    ("gb200", "GB200", "trtllm", "1.3.0rc20"),
    ("a100_sxm", "A100-80GB", "trtllm", "1.0.0"),
    ("h100_sxm", "H100", "vllm", "0.19.0"),
    ("h200_sxm", "H200", "vllm", "0.19.0"),
    ("b200_sxm", "B200", "vllm", "0.19.0"),
    ("gb200", "GB200", "vllm", "0.19.0"),
)
ROWS = (1, 4, 8, 16, 32, 64, 128, 256, 512)
WIDTHS = (1024, 2048, 4096, 8192, 16384)
# Training sizes: TRT-LLM 1.3.0rc20's FP8 Linear (FP8QDQLinearMethod: dynamic per-tensor quantization, then
# cuBLASLt through `cublas_scaled_mm`) on each Blackwell system
BLACKWELL_FP8 = (("b200_sxm", "B200"), ("gb200", "GB200"), ("b300_sxm", "B300"), ("gb300", "GB300"))
TRAINING_ROWS = (4096, 8192, 16384)
TRAINING_WIDTHS = (1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


def blackwell_fp8() -> None:
    """The per-tensor FP8 rows in validation/gemm_measured_aiconfigurator.csv's columns (no header)."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    for system, gpu in BLACKWELL_FP8:
        times: dict[tuple[int, int, int], list[float]] = {}
        kernel = ""
        for r in read_table(system, "gemm", "trtllm", "1.3.0rc20"):
            if r["gemm_dtype"] != "fp8" or r["m"] not in TRAINING_ROWS:
                continue
            if r["n"] in TRAINING_WIDTHS and r["k"] in TRAINING_WIDTHS:
                times.setdefault((r["m"], r["n"], r["k"]), []).append(float(r["latency"]))
                kernel = r["kernel_source"]
        for (m, n, k), ms in sorted(times.items()):
            out.writerow([gpu, "fp8", kernel, "1.3.0rc20", m, n, k, f"{statistics.median(ms):.6g}"])


def main() -> None:
    if "--blackwell-fp8" in sys.argv[1:]:
        blackwell_fp8()
        return
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["gpu", "engine", "release", "m", "n", "k", "latency_ms"])
    for system, gpu, engine, release in TABLES:
        times: dict[tuple[int, int, int], list[float]] = {}
        for r in read_table(system, "gemm", engine, release):
            if r["gemm_dtype"] != "bfloat16" or r["m"] not in ROWS or r["n"] not in WIDTHS or r["k"] not in WIDTHS:
                continue
            times.setdefault((r["m"], r["n"], r["k"]), []).append(float(r["latency"]))
        for (m, n, k), ms in sorted(times.items()):
            out.writerow([gpu, engine, release, m, n, k, f"{statistics.median(ms):.6g}"])


if __name__ == "__main__":
    main()
