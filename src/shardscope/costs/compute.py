"""Time of compute ops on one GPU: a roofline with op-class efficiencies (see `efficiency`), plus the
GPU-side gap of every kernel the op runs in series."""

from __future__ import annotations

import math

from shardscope.costs.efficiency import (
    ATEN_HBM_FRACTION,
    HBM_FRACTION,
    KERNEL_GAP_S,
    SCATTER_HBM_FRACTION,
    SPLIT_K_FIXED_S,
    attention_fraction,
    attention_grid_fill,
    gemm_fraction,
    split_k,
)
from shardscope.graph.common import OpGroup
from shardscope.graph.fp8 import QUANT_KERNELS
from shardscope.graph.ops import Op
from shardscope.hardware.catalog import CUBLASLT, GPU
from shardscope.plan.plan import Plan

# Transformer Engine issues a grouped GEMM's per-expert GEMMs and quantizations round-robin over four
# compute streams (transformer_engine/common/util/multi_stream.cpp, `num_compute_streams = 4`; used by
# cublaslt_gemm.cu's multi-stream GEMM and cast.cu's multi-tensor quantize, TE 2.9): four at a time
# overlap their launch gaps.
TE_COMPUTE_STREAMS = 4
# Flash attention's backward is three kernels: dO·O row sums, the main dQ/dK/dV loop and the dQ
# conversion (flash-attention csrc `flash_bwd_launch_template.h`; cuDNN's backward is alike).
ATTENTION_BWD_KERNELS = 3
# cuDNN's backward with a learned sink logit per head (GPT-OSS; Transformer Engine's learnable softmax
# offset) adds a pass over the query rows for the sinks' gradient: measured with cuDNN 9.19 on one H100
# (validation/kernels_measured_h100.json `cudnn_sinks`), +0.06 to +0.81 ms over 33k to 524k rows (batch x
# heads x queries), causal or in a 128-token window, 1.1 to 1.8 ns a row; the forward is unchanged. Not
# measured on other GPUs: the H100 figure is used for all.
SINK_BWD_ROW_S = 1.5e-9


def memory_time_s(gpu: GPU, nbytes: float, aten: bool = False) -> float:
    """Streaming time of `nbytes` at `HBM_FRACTION` of HBM bandwidth (`ATEN_HBM_FRACTION` for eager ATen
    kernels over strided, broadcast or mixed-precision operands)."""
    return nbytes / (gpu.hbm_gbps * 1e9 * (ATEN_HBM_FRACTION if aten else HBM_FRACTION))


# Bytes an operand element takes in a GEMM of this precision (FP4: E2M1 with one E4M3 scale per 16)
OPERAND_BYTES = {"fp8": 1.0, "fp4": 0.5625}


def gemm_time_s(
    gpu: GPU,
    m: int,
    n: int,
    k: int,
    precision: str = "bf16",
    groups: int = 1,
    weight_bytes: float | None = None,
    library: str = "",
) -> float:
    """Roofline of one GEMM, or of a grouped GEMM of `groups` problems of (M, N, K) each: FLOPs at the
    size-dependent fraction of the precision's peak, or the operand traffic at streaming bandwidth,
    whichever is longer, plus the partial sums' reduction of a GEMM split along K (`split_k`; kernel gaps
    are counted by `op_time_s`). `weight_bytes`: the (K, N) operand's bytes an element where they differ
    from the precision's (weights the kernel dequantizes); `library`: the kernel library (`gemm_library`)."""
    flops = 2.0 * m * n * k * groups
    compute = flops / (gpu.peak_tflops(precision) * 1e12 * gemm_fraction(gpu, m, n, k, precision, groups, library))
    elem = OPERAND_BYTES.get(precision, 2.0)
    weights = elem if weight_bytes is None else weight_bytes
    io = groups * (elem * m * k + weights * k * n + 2.0 * m * n)
    reduce = SPLIT_K_FIXED_S if split_k(gpu, m, n, k, groups) > 1 else 0.0
    return max(compute, memory_time_s(gpu, io)) + reduce


def gemm_passes(op: Op, backward: bool, plan: Plan) -> tuple[str, int, list[tuple[int, int, int]]]:
    """Precision, groups and per-problem (M, N, K) of the GEMMs one phase of a GEMM op runs: forward
    (M, N, K); backward dgrad (M, K, N) and wgrad (K, N, M), M being rows per problem of a grouped GEMM
    (tokens per local expert); one set per separate linear of a split op (`Op.splits`)."""
    m, n, k = op.mnk
    g = op.groups
    mg = max(1, round(m / g))
    precision = "fp8" if op.fp8 and plan.precision == "fp8" else "bf16"
    widths = op.splits or (n,)
    if backward:
        return precision, g, [p for n in widths for p in ((mg, k, n), (k, n, mg))]
    return precision, g, [(mg, n, k) for n in widths]


# Training frameworks issue every FP8 GEMM through cuBLASLt: Transformer Engine for each recipe
# (common/gemm/cublaslt_gemm.cu), torchao through `torch._scaled_mm`. Only its per-tensor GEMMs are measured on
# Blackwell (aiconfigurator's TRT-LLM FP8 Linear, `cublas_scaled_mm`): MXFP8 and block scaling take that rate.
TRAINING_FP8_LIBRARY = CUBLASLT


def gemm_library(op: Op, plan: Plan) -> str:
    """The kernel library a training GEMM op runs in (`GPU.matmul_fraction`): cuBLASLt for FP8."""
    return TRAINING_FP8_LIBRARY if op.fp8 and plan.precision == "fp8" else ""


def _kernels_per_expert(op: Op, backward: bool, plan: Plan) -> int:
    """A GEMM's kernels per expert in one phase: one GEMM forward, two backward (dgrad, wgrad), each per
    separate linear of a split op, and under an FP8 recipe the quantization of one operand (`QUANT_KERNELS`)."""
    gemms = (2 if backward else 1) * max(1, len(op.splits))
    return gemms + (QUANT_KERNELS[plan.fp8_recipe] if op.fp8 and plan.precision == "fp8" else 0)


def op_kernels(op: Op, backward: bool, plan: Plan) -> int:
    """Kernels one phase of `op` runs: a GEMM's per expert (`_kernels_per_expert`), flash attention's
    one forward and `ATTENTION_BWD_KERNELS` backward, a memory op's `launches` (`bwd_launches` backward
    where given; an FP8 cast op none: the GEMMs count its kernels)."""
    if op.kind == "gemm":
        return _kernels_per_expert(op, backward, plan) * op.groups
    if op.kind == "attention":
        return ATTENTION_BWD_KERNELS if backward else 1
    return op.bwd_launches if backward and op.bwd_launches is not None else op.launches


def serial_kernels(op: Op, backward: bool, plan: Plan) -> int:
    """Of `op_kernels`, those that run one after another, each paying `KERNEL_GAP_S`: a grouped GEMM
    spreads its experts over `TE_COMPUTE_STREAMS`."""
    if op.kind == "gemm" and op.groups > 1:
        return _kernels_per_expert(op, backward, plan) * math.ceil(op.groups / TE_COMPUTE_STREAMS)
    return op_kernels(op, backward, plan)


def op_time_s(gpu: GPU, op: Op, backward: bool, plan: Plan) -> float:
    """Forward or backward time of one op (backward of a GEMM = dgrad + wgrad GEMMs), its serial
    kernels' gaps included."""
    gaps = serial_kernels(op, backward, plan) * KERNEL_GAP_S
    if gpu.profile is not None:  # measured times where the GPU's profile covers the op (costs.profiled)
        from shardscope.costs.profiled import profiled_time_s

        measured = profiled_time_s(gpu.profile, gpu.arch, op, backward, plan)
        if measured is not None:
            return measured + gaps
    if op.kind == "gemm":
        precision, g, passes = gemm_passes(op, backward, plan)
        library = gemm_library(op, plan)
        return sum(gemm_time_s(gpu, m, n, k, precision, g, library=library) for m, n, k in passes) + gaps
    if op.kind == "attention":
        flops = op.bwd_flops if backward else op.flops
        # each query block loops over this rank's seq_len / cp keys, or over the window or chunk that bounds it
        span = op.kv_span or plan.seq_len // plan.cp
        frac = attention_fraction(gpu, plan.attention_kernel, span, backward, op.head_dim)
        if plan.causal:  # a causal grid's tiles differ in length; without a mask they are alike
            frac *= attention_grid_fill(gpu, op.query_rows)
        # Flash attention's compute runs at the BF16 rate even under FP8 GEMM recipes.
        io = memory_time_s(gpu, op.bwd_bytes if backward else op.bytes)
        sinks = SINK_BWD_ROW_S * op.query_rows if backward and op.sinks else 0.0
        return max(flops / (gpu.bf16_tflops * 1e12 * frac), io) + sinks + gaps
    nbytes = op.bwd_bytes if backward else op.bytes
    if op.scatter:
        return nbytes / (gpu.hbm_gbps * 1e9 * SCATTER_HBM_FRACTION) + gaps
    return memory_time_s(gpu, nbytes, op.aten) + gaps


def group_times_s(gpu: GPU, unit: OpGroup, plan: Plan) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Forward and backward time of each op of `unit`, memoised on the group: the op graph is shared by
    every plan that differs only outside its fields, and these are the only plan fields `op_time_s` reads."""
    key = ("times", gpu, plan.precision, plan.fp8_recipe, plan.attention_kernel, plan.seq_len, plan.cp, plan.causal)

    def times() -> tuple[tuple[float, ...], tuple[float, ...]]:
        fwd = tuple(op_time_s(gpu, op, False, plan) for op in unit.ops)
        return fwd, tuple(op_time_s(gpu, op, True, plan) for op in unit.ops)

    return unit.memoised(key, times)
