"""The per-op cost models against kernels measured on real GPUs by their vendor.

cuDNN frontend's training benchmarks (github.com/NVIDIA/cudnn-frontend, commit 3929da2, `benchmark/`):
`sdpa_benchmark_training/results` times cuDNN's BF16 flash attention forward and (non-deterministic)
backward on GB200 (cuDNN 9.22, 2026-04) and H200 (cuDNN 9.19, 2026-02) at the head shapes of Llama 3.1,
DeepSeek-V3 (MLA: 192/128 head dims) and GPT-OSS (sliding window), and on GB200 and GB300 (cuDNN 9.22,
2026-04) at the full (unmasked) self-attention of two video diffusion transformers, Wan 2.2 A14B and
LTX-2, from 6k to 76k tokens; `norms/results` times its RMSNorm
forward and backward at the shapes of the same models (cuDNN 9.19). Times are the kernels' device time
at boost clocks; the model prices attention at the GPU's sustained (power-capped) clock, so it is
compared after scaling by `clock_ratio`.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest

from shardscope.costs.compute import memory_time_s, op_time_s
from shardscope.costs.efficiency import KERNEL_GAP_S, clock_ratio, gemm_fraction
from shardscope.graph.attention import core_attention
from shardscope.graph.common import norm
from shardscope.graph.fp8 import CAST_BYTES
from shardscope.graph.mlp import moe_group
from shardscope.hardware.catalog import load_gpu, make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.spec import LayerKind
from shardscope.plan.plan import Plan, make_plan

# gpu, batch, seq, query heads, qk / vo head dims, causal, window, forward ms, backward ms
SDPA = [
    ("GB200", 2, 4096, 64, 128, 128, True, 0, 0.391, 1.198),  # Llama 3.1 GQA 64/8
    ("GB200", 2, 16384, 64, 128, 128, True, 0, 5.150, 16.554),
    ("GB200", 2, 4096, 64, 128, 128, False, 0, 0.687, 2.037),
    ("GB200", 2, 16384, 64, 128, 128, False, 0, 10.369, 32.014),
    ("GB200", 2, 4096, 128, 192, 128, True, 0, 0.977, 3.383),  # DeepSeek-V3 MLA
    ("GB200", 2, 16384, 128, 192, 128, True, 0, 13.103, 50.424),
    ("GB200", 2, 4096, 128, 192, 128, False, 0, 1.650, 6.085),
    ("GB200", 2, 16384, 128, 192, 128, False, 0, 24.270, 105.115),
    ("GB200", 2, 4096, 128, 64, 64, True, 128, 0.210, 0.465),  # GPT-OSS, 128-token window
    ("GB200", 2, 16384, 128, 64, 64, True, 128, 0.822, 1.818),
    ("H200", 1, 4096, 64, 128, 128, True, 0, 0.465, 1.450),  # Llama 3.1
    ("H200", 1, 16384, 64, 128, 128, True, 0, 6.531, 19.002),
    ("H200", 1, 4096, 64, 128, 128, False, 0, 0.819, 2.453),
    ("H200", 1, 16384, 64, 128, 128, False, 0, 12.524, 35.947),
    ("H200", 2, 4096, 64, 64, 64, True, 1024, 0.358, 1.042),  # GPT-OSS shape, 1024-token window
    ("H200", 2, 16384, 64, 64, 64, True, 1024, 1.499, 4.392),
]

# Video DiT self-attention, no mask, one sequence (results/wan22 and results/ltx2 at 3929da2; the
# non-deterministic backward, which Megatron-Core and PyTorch run by default)
SDPA_VIDEO_DIT = [
    ("GB200", 1, 7800, 40, 128, 128, False, 0, 0.803, 2.236),  # Wan 2.2 A14B
    ("GB200", 1, 17160, 40, 128, 128, False, 0, 3.383, 10.638),
    ("GB200", 1, 32760, 40, 128, 128, False, 0, 13.191, 41.653),
    ("GB200", 1, 48360, 40, 128, 128, False, 0, 28.902, 93.715),
    ("GB200", 1, 75600, 40, 128, 128, False, 0, 76.372, 233.302),
    ("GB300", 1, 7800, 40, 128, 128, False, 0, 0.678, 2.139),
    ("GB300", 1, 17160, 40, 128, 128, False, 0, 3.002, 9.883),
    ("GB300", 1, 32760, 40, 128, 128, False, 0, 11.213, 37.545),
    ("GB300", 1, 48360, 40, 128, 128, False, 0, 25.686, 88.194),
    ("GB300", 1, 75600, 40, 128, 128, False, 0, 64.212, 214.474),
    ("GB200", 1, 6144, 32, 128, 128, False, 0, 0.437, 1.199),  # LTX-2
    ("GB200", 1, 13376, 32, 128, 128, False, 0, 1.844, 5.225),
    ("GB200", 1, 17556, 32, 128, 128, False, 0, 2.959, 8.952),
    ("GB200", 1, 30240, 32, 128, 128, False, 0, 8.657, 28.505),
    ("GB200", 1, 37632, 32, 128, 128, False, 0, 14.403, 43.187),
    ("GB300", 1, 6144, 32, 128, 128, False, 0, 0.363, 1.089),
    ("GB300", 1, 13376, 32, 128, 128, False, 0, 1.551, 4.796),
    ("GB300", 1, 17556, 32, 128, 128, False, 0, 2.569, 8.245),
    ("GB300", 1, 30240, 32, 128, 128, False, 0, 7.623, 25.013),
    ("GB300", 1, 37632, 32, 128, 128, False, 0, 12.044, 38.088),
]

# gpu, rows, width, forward ms, backward ms (RMSNorm, bf16)
RMSNORM = [
    ("GB200", 16384, 4096, 0.042, 0.065),
    ("GB200", 8192, 8192, 0.045, 0.077),
    ("GB200", 4096, 16384, 0.044, 0.084),
    ("GB200", 8192, 4096, 0.023, 0.036),
    ("GB200", 4096, 2048, 0.007, 0.014),
    ("H200", 16384, 4096, 0.072, 0.106),
    ("H200", 8192, 8192, 0.071, 0.114),
    ("H200", 4096, 16384, 0.070, 0.118),
    ("H200", 8192, 4096, 0.035, 0.058),
    ("H200", 4096, 2048, 0.010, 0.019),
]


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _attention_s(
    gpu_name: str,
    b: int,
    s: int,
    heads: int,
    dqk: int,
    dvo: int,
    causal: bool,
    window: int,
    backward: bool,
    kernel: str = "auto",
    sinks: bool = False,
) -> float:
    """Model time (sustained clock) of the attention op the layer graph builds for this batch, sequence,
    head shape, mask and window, forward or backward, with the given attention kernel (and learned sinks
    per head: GPT-OSS's)."""
    model = dataclasses.replace(load_model("gpt-oss-20b"), attention_window=window, sinks=sinks)
    kind = LayerKind("window" if window else "full", "dense")
    plan = Plan(seq_len=s, micro_batch=b, global_batch=b, causal=causal, attention_kernel=kernel)
    (op,), _ = core_attention(model, plan, kind, heads, dqk, dvo)
    return op_time_s(load_gpu(gpu_name), op, backward, plan)


def _attention_ratio(figure: tuple, backward: bool) -> float:
    """Model time at boost clock / measured time of one SDPA figure, forward or backward."""
    gpu_name, b, s, heads, dqk, dvo, causal, window, fwd_ms, bwd_ms = figure
    seconds = _attention_s(gpu_name, b, s, heads, dqk, dvo, causal, window, backward)
    return seconds * clock_ratio(load_gpu(gpu_name)) * 1e3 / (bwd_ms if backward else fwd_ms)


def test_attention_matches_cudnn_training_benchmarks():
    """32 cuDNN kernel times (causal, full and windowed; head dims 64-192; Hopper and Blackwell) each
    within 25% at boost clock and within 5% on average (geometric): the FA3-class fractions, the
    key-loop length curve and the head-dim scale were set from the FlashAttention papers, and
    Blackwell's head dim 64 from cuDNN's own earlier GB200 run (cuDNN 9.19, a 1024-token window:
    `BLACKWELL_HEAD_DIM_64`), not from these figures. Before that point the 128-token window's forward on
    GB200 was priced at 0.63-0.64 of its measured time."""
    ratios = [_attention_ratio(f, bwd) for f in SDPA for bwd in (False, True)]
    assert len(ratios) == 32
    assert all(0.75 < r < 1.25 for r in ratios), [round(r, 2) for r in ratios]
    assert _geomean(ratios) == pytest.approx(1.0, abs=0.05)


def test_attention_matches_cudnn_video_dit_benchmarks():
    """Video DiT attention (non-causal, 32-40 heads of 128, 6k-76k tokens) on GB200 and GB300: all 40
    cuDNN times within 25% at boost clock and within 6% on average (geometric). No figure of this set
    was used to set any fraction; it checks the long, unmasked sequences DiT training runs on."""
    ratios = [_attention_ratio(f, bwd) for f in SDPA_VIDEO_DIT for bwd in (False, True)]
    assert len(ratios) == 40
    assert all(0.75 < r < 1.25 for r in ratios), [round(r, 2) for r in ratios]
    assert _geomean(ratios) == pytest.approx(1.0, abs=0.06)


def test_sdpa_flash_attention_2_against_cudnn_on_hopper_as_measured():
    """PyTorch SDPA's default pick, FlashAttention-2 (its fixed backend priority puts flash first),
    against cuDNN on H100 at BF16 training shapes: transformers PR #48163 (2026-08) measured cuDNN
    1.7-2.3x faster for forward + backward. The model's fa2 and cuDNN fractions (set from the
    FlashAttention-2/3 papers) give a ratio inside that range for causal LLM and full DiT shapes."""
    shapes = [(2, 4096, 32, True), (1, 8192, 32, True), (1, 37440, 40, False)]
    for b, s, heads, causal in shapes:
        times = {
            kernel: sum(_attention_s("H100", b, s, heads, 128, 128, causal, 0, bwd, kernel) for bwd in (False, True))
            for kernel in ("fa2", "cudnn")
        }
        assert 1.7 <= times["fa2"] / times["cudnn"] <= 2.3, (b, s, heads, causal, times)


# GPT-OSS's 128-token window on GB300 (cuDNN 9.22, results/gpt_oss/gb300 at 3929da2), forward and backward
SDPA_GB300_SHORT_WINDOW = [
    ("GB300", 2, 4096, 128, 64, 64, True, 128, 0.202, 0.442),
    ("GB300", 2, 16384, 128, 64, 64, True, 128, 0.790, 1.712),
]


@pytest.mark.xfail(strict=True, reason="GB300's faster exponent does not show at head dim 64 and a 128-key loop")
def test_short_window_forward_on_gb300_matches_cudnn():
    """GPT-OSS's 128-token window on GB300: the backward is within 5%, but the forward is priced at 0.68-0.70
    of cuDNN's measured time. The model gives GB300's forward its measured 1.215x over GB200 at head dim 128
    (`attention_fwd_scale`); at this shape cuDNN runs only 4% faster on GB300 than on GB200. Kept as a
    known miss, not tuned away."""
    ratios = [_attention_ratio(f, bwd) for f in SDPA_GB300_SHORT_WINDOW for bwd in (False, True)]
    assert all(0.75 < r < 1.25 for r in ratios), [round(r, 2) for r in ratios]


def test_streaming_ops_match_cudnn_rmsnorm():
    """RMSNorm forward (read x, write y) and backward (read x and dy, write dx; two kernels) at 85% of HBM
    bandwidth plus the per-kernel gap: within 30% of cuDNN's measured device time from 16 to 268 MB
    (forward 0.92-1.02, backward 0.75-0.97) and within 10% on average. The HBM fraction came from
    BabelStream, not from these figures."""
    model = load_model("llama3.1-8b")
    ratios = []
    for gpu_name, rows, width, fwd_ms, bwd_ms in RMSNORM:
        gpu = load_gpu(gpu_name)
        op, _ = norm("rmsnorm", model, rows, width)
        plan = Plan(seq_len=rows, global_batch=1)
        ratios += [op_time_s(gpu, op, False, plan) * 1e3 / fwd_ms, op_time_s(gpu, op, True, plan) * 1e3 / bwd_ms]
    assert all(0.7 < r < 1.3 for r in ratios), [round(r, 2) for r in ratios]
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.1)


# --- GEMMs: NVIDIA aiconfigurator's measured tables (see validation/gemm_measured_aiconfigurator.csv) ---

GEMM_TABLE = Path(__file__).parent.parent / "validation" / "gemm_measured_aiconfigurator.csv"
# The measured FP8 Linear layers quantize their input first (TRT-LLM): per-tensor dynamic scaling reads it
# twice and writes it once in two kernels (amax, then scale and cast; bytes as the `tensorwise` recipe),
# the 1x128 block quantization reads it once and writes it once (3 bytes) in one kernel before DeepGEMM.
# NVFP4 quantizes its input in one kernel: reads the BF16 and writes E2M1 with one E4M3 scale per 16.
GEMM_QUANT = {
    "bfloat16": (0.0, 0),
    "fp8": (CAST_BYTES["tensorwise"], 2),
    "fp8_block": (3.0, 1),
    "nvfp4": (2.0 + 0.5625, 1),
}
GEMM_PRECISION = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
# TRT-LLM's per-tensor FP8 Linear runs its GEMM through cuBLASLt (`cublas_scaled_mm`), as training frameworks do
GEMM_LIBRARY = {"fp8": "cublaslt"}


def _gemm_rows() -> list[dict[str, str]]:
    with GEMM_TABLE.open() as f:
        return list(csv.DictReader(f))


def _gemm_model_ms(row: dict[str, str]) -> float:
    """The GEMM model's time at boost clock for one measured Linear, its input quantization included."""
    gpu = load_gpu(row["gpu"])
    m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
    precision = GEMM_PRECISION[row["dtype"]]
    library = GEMM_LIBRARY.get(row["dtype"], "")
    fraction = gemm_fraction(gpu, m, n, k, precision, library=library)
    rate = gpu.peak_tflops(precision) * 1e12 * fraction / clock_ratio(gpu)
    quant_bytes, quant_kernels = GEMM_QUANT[row["dtype"]]
    seconds = 2.0 * m * n * k / rate + memory_time_s(gpu, quant_bytes * m * k) + (1 + quant_kernels) * KERNEL_GAP_S
    return seconds * 1e3


def test_gemm_fractions_are_the_measured_tables_fit():
    """Per GPU and precision (A100, L40S, H100, H200, B200, GB200, B300, GB300; BF16 (FP16 on the L40S),
    FP8 per-tensor (cuBLASLt) everywhere but the A100, block-scaled FP8 (DeepGEMM) on Blackwell, NVFP4 on B200
    and GB200), the catalog's matmul fractions reproduce 162-243 measured GEMMs (M 4k-16k, N and K 1k-16k)
    within 2% on average, and 90% of them within 20% each: tile and wave quantization and the K depth carry
    the rest of the shape dependence. On Blackwell cuBLASLt's per-tensor FP8 runs at 0.78-0.82 of
    DeepGEMM's block-scaled rate (`fp8_cublaslt_matmul_sustained_fraction`); on Hopper the two agree."""
    groups: dict[tuple[str, str], list[float]] = {}
    for row in _gemm_rows():
        groups.setdefault((row["gpu"], row["dtype"]), []).append(_gemm_model_ms(row) / float(row["latency_ms"]))
    assert len(groups) == 21
    for key, ratios in groups.items():
        assert _geomean(ratios) == pytest.approx(1.0, abs=0.02), key
        within = sum(0.8 < r < 1.2 for r in ratios) / len(ratios)
        # Misses kept: on the L40S (GDDR6, 350 W) the per-tensor FP8 layers of 1k-4k outputs run up to 1.6x
        # faster than their modelled input quantization allows, and the largest ones 25% slower than the
        # one fraction (they throttle): 65% of its shapes within 20%. Blackwell's per-tensor FP8 layers depend
        # less on K than the depth curve fitted on Hopper's (the 16k x 16k x 1k ones 25-37% faster than
        # modelled) and the 4k x 1k ones more on their fixed costs (up to 1.6x slower): 83-86% within 20%.
        floor = {"L40S": 0.6, "B200": 0.8, "GB200": 0.8, "B300": 0.8, "GB300": 0.8} if key[1] == "fp8" else {}
        assert within >= floor.get(key[0], 0.9), (key, round(within, 2))


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8", "fp8_block", "nvfp4"])
def test_gemm_depth_curve_matches_measured(dtype: str):
    """Time per FLOP at K = 1024 and 2048 over K = 8192 (geometric mean over GPUs, M and N): BF16's
    per-tile cost K0 = 64, FP8's K0 = 440 and NVFP4's 1088 each reproduce the measured slow-down (BF16
    1.06 / 0.99, FP8 per-tensor 1.37 / 1.16, block-scaled 1.51 / 1.15, NVFP4 1.82 / 1.38) within 6%. BF16's
    K0 would give FP8 1.05 / 1.02."""
    # (FP8 on the L40S, whose shape dependence the model misses, above, is left out of the FP8 curve)
    rows = [r for r in _gemm_rows() if r["dtype"] == dtype and not (dtype == "fp8" and r["gpu"] == "L40S")]
    by_shape = {(r["gpu"], r["m"], r["n"], int(r["k"])): r for r in rows}

    def per_flop(r: dict[str, str], ms: float) -> float:
        return ms / (int(r["m"]) * int(r["n"]) * int(r["k"]))

    for shallow in (1024, 2048):
        measured, modelled = [], []
        for (gpu, m, n, k), r in by_shape.items():
            deep = by_shape.get((gpu, m, n, 8192))
            if k != shallow or deep is None:
                continue
            measured.append(per_flop(r, float(r["latency_ms"])) / per_flop(deep, float(deep["latency_ms"])))
            modelled.append(per_flop(r, _gemm_model_ms(r)) / per_flop(deep, _gemm_model_ms(deep)))
        assert _geomean(modelled) == pytest.approx(_geomean(measured), rel=0.06), shallow


DECODE_GEMM_TABLE = Path(__file__).parent.parent / "validation" / "gemm_decode_measured_aiconfigurator.csv"


def test_decode_sized_gemms_split_k_as_measured(monkeypatch: pytest.MonkeyPatch):
    """aiconfigurator's CUDA-graph-timed BF16 Linear layers at M 1-512 (N, K 1k-16k; TRT-LLM on A100, H100,
    H200, B200 and GB200, vLLM 0.19 on the four newer ones; `validation/gemm_decode_measured_aiconfigurator.csv`,
    tools/aiconfigurator_gemm.py): with split-K the GEMM model, its kernel gap added, comes to 0.9-1.15 of
    every table on geometric mean and within a third of 70% of the shapes. Unsplit, the few output tiles of a
    decode GEMM leave most SMs idle in the model and it is 1.7x too slow or worse at M <= 64 on every table."""
    import shardscope.costs.compute as compute
    import shardscope.costs.efficiency as efficiency

    with DECODE_GEMM_TABLE.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 * 225

    def ratios(small_only: bool) -> dict[tuple[str, str], list[float]]:
        out: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            if small_only and m > 64:
                continue
            t = compute.gemm_time_s(load_gpu(r["gpu"]), m, n, k) + KERNEL_GAP_S
            out.setdefault((r["gpu"], r["engine"]), []).append(t / (float(r["latency_ms"]) * 1e-3))
        return out

    for key, rs in ratios(False).items():
        assert 0.9 < _geomean(rs) < 1.15, (key, round(_geomean(rs), 3))
        assert sum(0.75 < x < 1.33 for x in rs) / len(rs) >= 0.7, key
    split_ratios = ratios(True)
    for module in (compute, efficiency):
        monkeypatch.setattr(module, "split_k", lambda *args, **kwargs: 1)
    for key, rs in ratios(True).items():
        assert _geomean(rs) > 1.7 * _geomean(split_ratios[key]), key


# --- Attention across GPUs: aiconfigurator's measured context-attention tables ---

ATTENTION_TABLE = Path(__file__).parent.parent / "validation" / "attention_measured_aiconfigurator.csv"


def test_blackwell_ultra_attention_forward_speedup_as_measured():
    """The same TRT-LLM context-attention kernels (BF16, causal, head dim 128; 1-4 x 4k-16k tokens, 32 or
    64 heads, MHA and GQA 8) on B200, GB200, B300 and GB300 (aiconfigurator @095f58a,
    `validation/attention_measured_aiconfigurator.csv`): the model's forward time on B300 / GB300 over
    B200 / GB200 matches the measured ratio of this subset within 3%. The catalog's factor came from the
    full tables (1,356 shapes each); without it the model would give GB300 and GB200 equal times."""
    with ATTENTION_TABLE.open() as f:
        rows = list(csv.DictReader(f))

    def model_ms(r: dict[str, str]) -> float:  # at the boost clock the tables were measured at
        seconds = _attention_s(r["gpu"], int(r["batch"]), int(r["seq_len"]), int(r["heads"]), 128, 128, True, 0, False)
        return seconds * clock_ratio(load_gpu(r["gpu"]))

    by_gpu: dict[str, dict[tuple, dict[str, str]]] = {}
    for r in rows:
        by_gpu.setdefault(r["gpu"], {})[(r["batch"], r["seq_len"], r["heads"], r["kv_heads"])] = r
    for fast, slow in (("GB300", "GB200"), ("B300", "B200")):
        shapes = sorted(by_gpu[fast].keys() & by_gpu[slow].keys())
        assert len(shapes) == 36
        pairs = [(by_gpu[fast][s], by_gpu[slow][s]) for s in shapes]
        measured = _geomean([float(b["latency_ms"]) / float(a["latency_ms"]) for a, b in pairs])
        modelled = _geomean([model_ms(b) / model_ms(a) for a, b in pairs])
        assert measured > 1.1
        assert modelled == pytest.approx(measured, rel=0.03), (fast, slow)


# --- MoE experts: aiconfigurator's measured TRT-LLM fused-MoE forward (validation/moe_measured_aiconfigurator.csv) ---

MOE_TABLE = Path(__file__).parent.parent / "validation" / "moe_measured_aiconfigurator.csv"


def _moe_model_ms(row: dict[str, str]) -> float:
    """The model's forward time at boost clock of the measured part of one MoE block on one GPU holding
    every expert (EP 1): routing top-k, permutation, the grouped expert GEMMs (FP8 quantization
    included), activation and weighted un-permute. The router GEMM and the shared expert are left out:
    the measured op takes the logits as input and has no shared expert."""
    model = load_model(row["model"])
    cluster = make_cluster(row["gpu"], 1)
    # the measured FP8 experts are DeepGEMM's, whose rate the FP8 fraction is: not the cuBLASLt one of training
    gpu = dataclasses.replace(cluster.gpu, fp8_cublaslt_matmul_sustained_fraction=None)
    fp8 = {"precision": "fp8", "fp8_recipe": "blockwise"} if row["dtype"] == "fp8_block" else {}
    # TRT-LLM's fused MoE runs the gated activation as one fused kernel
    plan = make_plan(model, cluster, global_batch=1, seq_len=int(row["num_tokens"]), fused_activation=True, **fp8)
    group, _, _ = moe_group(model, plan, 1.0)
    # TRT-LLM's fused kernel aligns its rows inside its tiles: none of Transformer Engine's pad/unpad copies
    te_copies = ("experts fp8 pad", "experts fp8 unpad")
    measured = [
        op
        for op in group.ops
        if "moe" in op.modules and "shared_experts" not in op.modules and op.name not in te_copies
    ]
    assert measured[0].name == "router" and measured[-1].name == "unpermute + weighted sum"
    seconds = 0.0
    for op in measured[1:]:  # TRT-LLM's fused MoE has no shared expert and takes the router's logits
        t = op_time_s(gpu, op, False, plan)
        seconds += t * clock_ratio(gpu) if op.kind == "gemm" else t
    return seconds * 1e3


def test_moe_expert_compute_matches_measured_fused_moe_kernels():
    """TRT-LLM's fused MoE forward (aiconfigurator @095f58a, TRT-LLM 1.3.0rc20, forced-balance routing,
    every expert on one GPU) at the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and
    Mixtral 8x7B / 8x22B, 4k-16k tokens: BF16 CUTLASS grouped GEMMs on H100, B200 and GB200, and
    DeepGEMM's 1x128 / 128x128 block-scaled FP8 on B200 and GB200 (110 kernels). The model's permute,
    grouped GEMMs (per-expert tiles and waves at the catalog's dense-GEMM fractions), activation and
    un-permute come to 0.97-1.10 of the measured time on geometric mean per GPU and precision (1.02
    overall), every kernel 0.79-1.34. The model is slowest on Qwen3-30B-A3B's small experts in
    block-scaled FP8 at 4k tokens (1.28-1.34) and on GB200 BF16 at Mixtral's large experts (up to 1.29,
    where the CUTLASS grouped kernel runs above the cuBLAS dense fit of 0.687 of peak). So expert
    compute is not where the eager MoE rows' over-prediction comes from."""
    with MOE_TABLE.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 110
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        groups.setdefault((row["gpu"], row["dtype"]), []).append(_moe_model_ms(row) / float(row["latency_ms"]))
    assert len(groups) == 5
    everything = [r for ratios in groups.values() for r in ratios]
    assert _geomean(everything) == pytest.approx(1.0, abs=0.05)
    for key, ratios in groups.items():
        assert _geomean(ratios) == pytest.approx(1.0, abs=0.12), key
        assert all(0.75 < r < 1.4 for r in ratios), (key, [round(r, 2) for r in ratios])


# --- Serving MoE layers: the same measurements with the experts sharded over TP, at decode and chunk sizes ---

MOE_TP_TABLE = Path(__file__).parent.parent / "validation" / "moe_tp_measured_aiconfigurator.csv"


MOE_FP4_TABLE = Path(__file__).parent.parent / "validation" / "moe_fp4_measured_aiconfigurator.csv"
SERVING_PRECISION = {"fp8": "fp8", "nvfp4": "nvfp4"}


def _serving_moe_ratios(extras: bool, table: Path = MOE_TP_TABLE) -> dict[tuple[str, str, str, int], list[float]]:
    """Modelled / measured time of the routed experts of one serving MoE layer, per (GPU, engine, dtype, TP),
    over the measured shapes and token counts; `extras=False` keeps the grouped GEMMs alone."""
    from shardscope.serve import cost as serve_cost
    from shardscope.serve.engine import load_engine

    with table.open() as f:
        rows = list(csv.DictReader(f))
    costs: dict[tuple[str, str, str, int], serve_cost.IterationCost] = {}
    ratios: dict[tuple[str, str, str, int], list[float]] = {}
    for row in rows:
        key = (row["gpu"], row["dtype"], row["model"], int(row["moe_tp"]))
        if key not in costs:
            cluster = make_cluster(row["gpu"], 8)
            precision = SERVING_PRECISION.get(row["dtype"], "bf16")
            d = serve_cost.Deployment(load_model(row["model"]), cluster, key[3], precision)
            costs[key] = serve_cost.IterationCost(d, load_engine("trtllm", cluster.gpu))
        modelled = costs[key].routed_experts_s(int(row["num_tokens"]), with_extras=extras)
        group = (row["gpu"], row["engine"], row["dtype"], key[3])
        ratios.setdefault(group, []).append(modelled * 1e3 / float(row["latency_ms"]))
    return ratios


def test_serving_moe_layer_matches_measured_tp_sharded_fused_moe():
    """Fused MoE forwards measured by aiconfigurator (@095f58a, forced-balance routing) with every expert
    sharded over TP 1-8, at 16-2048 tokens, for Mixtral 8x7B / 8x22B and Qwen3-30B-A3B / 235B-A22B in BF16
    and per-tensor FP8: TRT-LLM 1.3.0rc20's CUTLASS kernels on H100 and H200 (1,088 kernels) and vLLM
    0.19.0's Triton fused_moe on H100 (510). The serving cost's routed experts (grouped GEMMs plus the fused
    MoE's routing, expansion, activation and un-permute over its floor, fitted to the TRT-LLM tables) come
    to 0.98-1.11 of TRT-LLM's measured time and 0.93-1.05 of vLLM's on geometric mean at every GPU,
    precision and TP, with no trend in TP. The grouped GEMMs alone fall from 0.87-0.98 at TP 1 to 0.68-0.81
    at TP 8: the thinner a GPU's slice of the experts, the more of the layer is the work around the GEMMs."""
    with_extras, gemms_only = _serving_moe_ratios(True), _serving_moe_ratios(False)
    assert sum(len(v) for v in with_extras.values()) == 1598
    for key, ratios in with_extras.items():
        assert 0.9 < _geomean(ratios) < 1.15, (key, round(_geomean(ratios), 3))
    for gpu, engine, dtype in {key[:3] for key in with_extras}:
        full = {tp: _geomean(with_extras[gpu, engine, dtype, tp]) for tp in (1, 8)}
        bare = {tp: _geomean(gemms_only[gpu, engine, dtype, tp]) for tp in (1, 8)}
        assert full[8] / full[1] == pytest.approx(1.0, abs=0.12), (gpu, engine, dtype)
        assert bare[8] < 0.85 < bare[1], (gpu, engine, dtype)  # the GEMMs alone miss the TP8 kernels


def test_training_fp8_gemms_run_at_cublaslt_rate_where_it_is_measured_slower():
    """A training plan's FP8 GEMMs take the GPU's cuBLASLt FP8 fraction (Blackwell: 0.78-0.82 of the
    block-scaled DeepGEMM one), its BF16 GEMMs and a GPU without that figure (Hopper) are unchanged."""
    from shardscope.costs.compute import gemm_library
    from shardscope.graph.build import layer_group

    model = load_model("llama3.1-8b")
    for name, slower in (("B200", True), ("H100", False)):
        cluster = make_cluster(name, 8)
        plan = make_plan(model, cluster, precision="fp8", seq_len=8192, global_batch=8)
        gemms = [op for op in layer_group(model, plan, cluster.gpu.arch).ops if op.kind == "gemm"]
        assert {gemm_library(op, plan) for op in gemms} == {"cublaslt"}
        block_rate = dataclasses.replace(cluster.gpu, fp8_cublaslt_matmul_sustained_fraction=None)
        for op in gemms:
            ratio = op_time_s(cluster.gpu, op, True, plan) / op_time_s(block_rate, op, True, plan)
            assert (ratio > 1.15) if slower else ratio == 1.0, (name, op.name, ratio)
        bf16 = make_plan(model, cluster, precision="bf16", seq_len=8192, global_batch=8)
        assert {gemm_library(op, bf16) for op in layer_group(model, bf16, cluster.gpu.arch).ops} == {""}


def test_serving_nvfp4_moe_layer_matches_measured_blackwell_fused_moe():
    """TRT-LLM 1.3.0rc20's NVFP4 fused MoE (CUTLASS) on B200 and GB200, measured by aiconfigurator (@095f58a,
    forced-balance routing, experts sharded over TP 1-8, 16-2048 tokens) at the shapes of Mixtral 8x7B /
    8x22B, Qwen3-30B-A3B / 235B-A22B and Llama 4 Scout (646 kernels). NVFP4 grouped GEMMs run at 0.60 (B200)
    and 0.78 (GB200) of the dense NVFP4 rate (`fp4_grouped_matmul_sustained_fraction`): with it the routed
    experts come to 1.00 of the measured time on geometric mean per GPU and 0.87-1.10 at each TP; at the
    dense rate they came to 0.69 and 0.84. A miss kept: the fused kernels' cost grows less than their FLOPs,
    so the small experts (Qwen3-30B-A3B, Scout on B200) stay 15% fast and Mixtral's large ones up to 17% slow."""
    ratios = _serving_moe_ratios(True, MOE_FP4_TABLE)
    assert sum(len(v) for v in ratios.values()) == 646
    by_gpu: dict[str, list[float]] = {}
    for (gpu, _, _, _), values in ratios.items():
        by_gpu.setdefault(gpu, []).extend(values)
    assert set(by_gpu) == {"B200", "GB200"}
    for gpu, values in by_gpu.items():
        assert _geomean(values) == pytest.approx(1.0, abs=0.03), gpu
    for key, values in ratios.items():
        assert 0.8 < _geomean(values) < 1.2, (key, round(_geomean(values), 3))
