"""Extract NVIDIA aiconfigurator's measured TRT-LLM fused-MoE forward times for the training shapes, or
(`--serving`) for the tensor-parallel serving shapes.

Run inside a clone of github.com/ai-dynamo/aiconfigurator (it reads commit `aiconfigurator_tables.REV` with
git), with `pyarrow` installed (`$SHARDSCOPE` is this repository):

    python $SHARDSCOPE/tools/aiconfigurator_moe.py > $SHARDSCOPE/validation/moe_measured_aiconfigurator.csv
    python $SHARDSCOPE/tools/aiconfigurator_moe.py --serving > $SHARDSCOPE/validation/moe_tp_measured_aiconfigurator.csv
    python $SHARDSCOPE/tools/aiconfigurator_moe.py --serving-fp4 \
        > $SHARDSCOPE/validation/moe_fp4_measured_aiconfigurator.csv

Each row of `aic-core/src/aiconfigurator_core/systems/data/<gpu>/moe/trtllm/1.3.0rc20/moe_perf.parquet`
is one `moe.forward(hidden_states, router_logits)` (collector/trtllm/collect_moe.py): routing from given
logits, permutation, the gated grouped GEMMs, activation and the weighted un-permute. Kept: forced-balance
routing (`balanced`), no expert tensor or expert parallelism (every expert on the one GPU, as on a
training rank with EP 1), 4k-16k tokens, the gated CUTLASS kernels in BF16 and DeepGEMM's block-scaled
FP8 on Blackwell, at the expert shapes of five catalog models.

`--serving` keeps instead what a serving engine's MoE layer runs: each expert sharded over TP 1-8 (every
GPU holds a 1/TP slice of every expert and sees every token), 16-2048 tokens (decode batches and prefill
chunks), in BF16 and per-tensor FP8, at the four shapes with per-tensor FP8 measurements (not
DeepSeek-V3): TRT-LLM 1.3.0rc20's CUTLASS kernels on H100 and H200, and vLLM 0.19.0's Triton `fused_moe`
on H100 (`moe/vllm/0.19.0/moe_perf.parquet`, collector/vllm/collect_moe.py).

`--serving-fp4` keeps the same serving rows of TRT-LLM 1.3.0rc20's NVFP4 CUTLASS kernels on B200 and GB200,
at those four shapes and Llama 4 Scout's (16 experts, top-1).
"""

from __future__ import annotations

import argparse
import csv
import sys

from aiconfigurator_tables import read_table

# (hidden, expert ffn, top-k, experts) -> catalog model
SHAPES = {
    (2048, 768, 8, 128): "qwen3-30b-a3b",
    (4096, 1536, 8, 128): "qwen3-235b-a22b",
    (7168, 2048, 8, 256): "deepseek-v3",
    (4096, 14336, 2, 8): "mixtral-8x7b",
    (6144, 16384, 2, 8): "mixtral-8x22b",
}
SYSTEMS = {"h100_sxm": "H100", "b200_sxm": "B200", "gb200": "GB200"}
KERNELS = {"bfloat16": "moe_torch_flow_cutlass", "fp8_block": "deepgemm"}
VERSION = "1.3.0rc20"
FP4_SHAPES = {**{k: v for k, v in SHAPES.items() if v not in ("deepseek-v3",)}, (5120, 8192, 1, 16): "llama4-scout"}
FP4_SYSTEMS = {"b200_sxm": "B200", "gb200": "GB200"}
# (system, GPU, engine directory, release, kernel) of each serving table
SERVING_TABLES = (
    ("h100_sxm", "H100", "trtllm", VERSION, "moe_torch_flow_cutlass"),
    ("h200_sxm", "H200", "trtllm", VERSION, "moe_torch_flow_cutlass"),
    ("h100_sxm", "H100", "vllm", "0.19.0", "vllm_fused_moe"),
)


def _training_row(r: dict) -> bool:
    """Every expert on one GPU, 4k-16k tokens, the training kernels."""
    if r["moe_tp_size"] != 1 or r["num_tokens"] < 4096:
        return False
    return KERNELS.get(r["moe_dtype"]) == r["kernel_source"]


def _serving_row(r: dict) -> bool:
    """Experts sharded over TP 1-8, 16-2048 tokens, BF16 or per-tensor FP8."""
    if r["moe_tp_size"] not in (1, 2, 4, 8) or not 16 <= r["num_tokens"] <= 2048:
        return False
    return r["moe_dtype"] in ("bfloat16", "fp8") and r["num_experts"] != 256


def training() -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["gpu", "dtype", "kernel", "trtllm_version", "model", "num_tokens", "hidden", "inter", "top_k",
                  "experts", "latency_ms"])  # fmt: skip
    for system, gpu in SYSTEMS.items():
        for r in read_table(system, "moe", "trtllm", VERSION):
            shape = (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"])
            if shape not in SHAPES or r["distribution"] != "balanced" or r["moe_ep_size"] != 1 or not _training_row(r):
                continue
            out.writerow([gpu, r["moe_dtype"], r["kernel_source"], VERSION, SHAPES[shape], r["num_tokens"], *shape,
                          round(r["latency"], 6)])  # fmt: skip


def serving() -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["gpu", "engine", "dtype", "kernel", "model", "num_tokens", "hidden", "inter", "top_k", "experts",
                  "moe_tp", "latency_ms"])  # fmt: skip
    for system, gpu, engine, release, kernel in SERVING_TABLES:
        for r in read_table(system, "moe", engine, release):
            shape = (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"])
            if shape not in SHAPES or r["distribution"] != "balanced" or r["moe_ep_size"] != 1:
                continue
            if r["kernel_source"] != kernel or not _serving_row(r):
                continue
            out.writerow([gpu, f"{engine}@{release}", r["moe_dtype"], kernel, SHAPES[shape],
                          r["num_tokens"], *shape, r["moe_tp_size"], round(r["latency"], 6)])  # fmt: skip


def serving_fp4() -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["gpu", "engine", "dtype", "kernel", "model", "num_tokens", "hidden", "inter", "top_k", "experts",
                  "moe_tp", "latency_ms"])  # fmt: skip
    for system, gpu in FP4_SYSTEMS.items():
        for r in read_table(system, "moe", "trtllm", VERSION):
            shape = (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"])
            if shape not in FP4_SHAPES or r["distribution"] != "balanced" or r["moe_ep_size"] != 1:
                continue
            if r["moe_dtype"] != "nvfp4" or r["kernel_source"] != "moe_torch_flow_cutlass":
                continue
            if r["moe_tp_size"] not in (1, 2, 4, 8) or not 16 <= r["num_tokens"] <= 2048:
                continue
            out.writerow([gpu, f"trtllm@{VERSION}", "nvfp4", r["kernel_source"], FP4_SHAPES[shape],
                          r["num_tokens"], *shape, r["moe_tp_size"], round(r["latency"], 6)])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serving", action="store_true", help="the TP-sharded serving shapes")
    ap.add_argument("--serving-fp4", action="store_true", help="the same, NVFP4 on Blackwell")
    args = ap.parse_args()
    serving_fp4() if args.serving_fp4 else serving() if args.serving else training()


if __name__ == "__main__":
    main()
