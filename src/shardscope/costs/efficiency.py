"""Physical efficiencies of op classes: the fraction of a peak that real kernels reach.

Every figure is a property of a kernel class on a GPU architecture (from published kernel benchmarks),
never of a model or a validation row.
"""

from __future__ import annotations

import itertools
import math

from shardscope.hardware.catalog import GPU

# GEMM tile (M x N) that cuBLAS/CUTLASS pick for large BF16 GEMMs, per architecture: 128x256 warp-
# specialised tiles on Hopper/Blackwell, 128x128 on Ampere and CDNA3 (CUTLASS default configurations).
GEMM_TILE = {"ampere": (128, 128), "hopper": (128, 256), "blackwell": (128, 256), "cdna3": (128, 128)}
# Per-tile fixed cost (prologue/epilogue) expressed as an equivalent K depth: a tile of depth K runs at
# K/(K + K0) of the deep-K rate. The fixed cost is time, and an FP8 main loop walks K twice as fast, so
# FP8's K0 is larger. Fitted to the measured GEMM tables of NVIDIA aiconfigurator (TRT-LLM 1.3.0rc20;
# validation/gemm_measured_aiconfigurator.csv): BF16 on A100-GB300 is fitted by 0-128 (64 also gives the ~3%
# gap between K=2048 and 8192 of mamf-finder scans); FP8 per-tensor (H100/H200, cuBLASLt) and block-scaled
# FP8 (B200-GB300, DeepGEMM) run 1.37 / 1.51x slower per FLOP at K = 1024 and 1.15x at K = 2048 than at
# K = 8192. K0 = 440 minimises the largest miss over the four (0-4%; tests/test_kernels_measured.py).
# NVFP4 on B200 / GB200 (TRT-LLM 1.0.0rc6, aiconfigurator 0.4.0), its input quantization included: 1.82x
# at K = 1024 and 1.38x at 2048, which K0 = 1088 gives (1.82 / 1.35).
GEMM_K0 = {"bf16": 64, "fp8": 440, "fp4": 1088}
GEMM_K_REF = 2048  # the depth at which `matmul_*_fraction` is stated
# Split-K: a GEMM whose output tiles are fewer than the SMs (decode-sized M, a narrow N) is split along K
# by cuBLAS and CUTLASS (split-K, stream-K) so that every SM streams its share of the weights; each split
# keeps at least `SPLIT_K_MIN_DEPTH` of K, and reducing the partial sums costs `SPLIT_K_FIXED_S` a GEMM.
# Grouped GEMMs (MoE experts) are not split: their problems' tiles share the waves instead. Fitted to
# aiconfigurator's measured TRT-LLM 1.3.0rc20 BF16 GEMMs on H100 at M 1-512 (N, K 1k-16k), where without
# it the model was 1.7-2.6x too slow; the same constants give 0.9-1.05 of vLLM 0.19's measured GEMMs on
# H100, H200, B200 and GB200 and of TRT-LLM's on H200, B200, GB200 and A100 (tests/test_kernels_measured.py).
# Applied where measured, up to `SPLIT_K_MAX_ROWS` rows: a training weight gradient that is deep in K with
# few output tiles is left unsplit (no measurement of those shapes).
SPLIT_K_MIN_DEPTH = 256
SPLIT_K_FIXED_S = 1.5e-6
SPLIT_K_MAX_ROWS = 512

# Flash-attention kernels' fraction of dense BF16 peak at long sequence and head dim 128, forward and
# backward, from the kernels' papers (boost-clock microbenchmarks, hence scaled by the GPU's
# sustained/burst matmul ratio below):
#  fa2 on A100: fwd up to 73%, bwd ~63% (Dao 2023, FlashAttention-2, Fig. 4-6).
#  fa2 on H100: ~35% (Shah et al. 2024, FlashAttention-3, §1: "FA2 achieves only 35% utilization").
#  fa3 / cuDNN on H100: fwd 648 TFLOPS at 16k, non-causal = 65.5% (FlashAttention-3 v1, Fig. 5; its
#  headline 740 TFLOPS = 75% is head dim 256); bwd 1.5-1.75x FA2 ≈ 50% (Fig. 7).
#  Blackwell cuDNN: at the Hopper FA3 fractions, which give B200 ~1200 TFLOPS forward at hd 128, as
#  FlashAttention-4 measures cuDNN 9.13 there (FA4 reaches 1613 = 1.3x cuDNN). Newer cuDNN is faster: the
#  Megatron-Core MoE report (Table 9) has 1324 / 1698 TFLOPS forward at 4k / 16k for MLA (test_plan_and_costs).
#  CDNA3 CK flash attention: ~35% fwd, 25% bwd (ROCm blog figures, ~450 TFLOPS fwd on MI300X).
ATTENTION_FRACTION: dict[tuple[str, str], tuple[float, float]] = {
    ("ampere", "fa2"): (0.72, 0.62),
    ("hopper", "fa2"): (0.35, 0.30),
    ("hopper", "fa3"): (0.655, 0.50),
    ("blackwell", "fa2"): (0.30, 0.25),
    ("blackwell", "fa3"): (0.655, 0.50),
    ("cdna3", "fa2"): (0.35, 0.25),
}
# FA3's forward throughput by head dimension relative to 128, at 16k tokens without a causal mask on
# H100: 497, 648 and 740 TFLOPS at head dim 64, 128 and 256 (FlashAttention-3 v1, Fig. 5). A smaller
# head does fewer FLOPs per byte of Q/K/V tile and per softmax. Interpolated in log2(head dim), held
# outside [64, 256]; applied to fa3-class kernels, forward and backward.
FA3_HEAD_DIM_SCALE = ((64, 497 / 648), (128, 1.0), (256, 740 / 648))
# Blackwell's cuDNN loses more at head dim 64, forward most. cuDNN's own GB200 runs (cudnn-frontend v1.19.0,
# benchmark/sdpa_benchmark_training/results/gb200_919_only_cudnn, cuDNN 9.19, 2026-02) at the same ~1k-key
# loop: head dim 64 (GPT-OSS shape, 64/8 heads, 1024-token window, 32k tokens) 632 TFLOPS forward and
# 660 backward; head dim 128 (Llama 3.1, 64/8 heads, causal 2k) 1042 and 836. Forward, backward.
BLACKWELL_HEAD_DIM_64 = (632 / 1042, 660 / 836)
DEFAULT_ATTENTION_KERNEL = {"ampere": "fa2", "hopper": "fa3", "blackwell": "fa3", "cdna3": "fa2"}
# Flash attention's thread blocks each loop over the keys of one query block; a short loop spends more
# of its time in the prologue and epilogue. The FA2/FA3 figures hold batch x sequence at 16k tokens, so
# their throughput vs sequence length is this loop length alone: s/(s + S0) with S0 ≈ 512, normalised to
# the 16k-sequence figures above. A sliding window or chunk bounds the loop at its size.
ATTENTION_S0 = 512
ATTENTION_S_REF = 16384
# Flash attention's grid is one thread block per 128-query tile of each (sequence, head); under a causal
# mask the tiles differ in length, and a small grid's last waves leave SMs idle. Measured
# (validation/kernels_measured_h100.json `sdpa_heads`, `sdpa_grid`: cuDNN 9.19 through PyTorch SDPA on one
# H100, 4096 causal queries, head dim 128, batch x heads 8 to 256, i.e. 256 to 8192 tiles): forward 285 to
# 601 TFLOPS, backward 218 to 455, which tiles / (tiles + 2 x SMs) follows within 7%; at 8192 queries the
# same form holds (512 to 4096 tiles, within 13%). Without a mask the tiles are alike and the loss is small
# (8 heads of 4096 queries: 446 TFLOPS forward against 626 at 64 x 2), so the fill is applied to causal
# (and windowed) attention only. The fractions above hold at the FlashAttention-3 benchmark's grid (16k
# tokens x 16 heads of 128 = 2048 tiles): a smaller grid runs at the fill relative to it. A larger one is
# held at the fractions: cuDNN's published H200 and GB200 timings of 4k to 33k tiles
# (tests/test_kernels_measured.py) do not rise with the grid as this H100 did (+10%).
ATTENTION_QUERY_TILE = 128
ATTENTION_TAIL_WAVES = 2
ATTENTION_TILES_REF = 2048

# Streaming kernels (norms, activations, adds, casts) reach ~85% of datasheet HBM bandwidth
# (BabelStream triad on A100/H100 measures 0.85-0.9 of peak).
HBM_FRACTION = 0.85
# Eager PyTorch elementwise kernels (ATen's TensorIterator) over strided views (`chunk` halves), broadcast
# operands or mixed bf16/fp32 inputs load without wide vectors and stream slower. Measured with the host
# ahead on one H100 (validation/kernels_measured_h100.json `eager_elementwise`): GPT-OSS's expert bias in
# fp32, gate/up clamp and unfused YaRN RoPE, written as Megatron-Core runs them, at 1 and 4 sequences of
# 4096 tokens: 0.49-0.66 of HBM bandwidth after 2 us a kernel, geometric mean 0.56, where a contiguous add
# of the same run streams at 0.78-0.88. Ops marked `aten` take it.
ATEN_HBM_FRACTION = 0.56
# Index scatters: `index_put_` into rows picked by an index (a permutation's inverse), its accumulating
# backward (sort-based, `indexing_backward_kernel`) and the fp32 outer product of a routing-weight bmm's
# backward write rows scattered over memory. Measured on one H100 in torchtitan's MoE (trace of
# validation/torchtitan_qwen3_moe_step_h100.json, 65,536 rows of 2,048): `index_put_` 0.82-0.84 TB/s, the
# outer product 0.67, accumulating scatters 0.39 (into rows many padding rows share) and 1.77: together
# 0.72 TB/s, 0.22 of the 3.35 TB/s datasheet figure; the `index_put_` rate (0.25) is taken. Ops marked
# `scatter` take it.
SCATTER_HBM_FRACTION = 0.25
# GPU-side gap between dependent kernels (launch latency + tail drain), ~2 us per kernel on current
# NVIDIA GPUs when the CPU runs ahead (Nsight traces of eager PyTorch training steps).
KERNEL_GAP_S = 2e-6

# NCCL kernels occupy SMs while they overlap compute: NCCL's default of up to 16-32 channels on NVLink
# / IB systems (one thread block per channel), plus HBM traffic. The compute that runs alongside an
# overlapped collective is slowed by channels / SMs.
NCCL_CHANNELS = 16

# Megatron-Core's combined-1F1B schedule (overlap_moe_expert_parallel_comm) runs each all-to-all of one
# micro-batch beside a compute block of another, but the two streams meet at every block boundary and
# the all-to-all kernels contend with the compute for SMs, so only part of each all-to-all's time runs
# under compute. Measured: a rank-0 Nsight profile of Qwen3-30B-A3B on 16 H100 with HybridEP and the
# overlap on has 36.55% of its communication time concurrent with GEMMs and attention (Megatron-Bridge
# skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md @067f987df, "Communication time hidden by compute").
EP_OVERLAP_FRACTION = 0.3655


def clock_ratio(gpu: GPU) -> float:
    """Sustained (power-capped) over boost clock: scales burst kernel benchmarks to training."""
    return gpu.matmul_sustained_fraction / gpu.matmul_burst_fraction


def split_k(gpu: GPU, m: int, n: int, k: int, groups: int = 1) -> int:
    """Pieces K is split into (1: not split) for a GEMM whose output tiles leave SMs idle (`SPLIT_K_MIN_DEPTH`)."""
    if groups > 1 or min(m, n, k) <= 0 or m > SPLIT_K_MAX_ROWS:
        return 1
    tm, tn = GEMM_TILE.get(gpu.arch, (128, 128))
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    if tiles >= gpu.sms:
        return 1
    return max(1, min(gpu.sms // tiles, k // SPLIT_K_MIN_DEPTH))


def gemm_fraction(
    gpu: GPU, m: int, n: int, k: int, precision: str = "bf16", groups: int = 1, library: str = ""
) -> float:
    """Fraction of peak a GEMM of (M, N, K) reaches: sustained large-GEMM fraction x tile and wave
    quantization x K-depth efficiency. Large, aligned GEMMs of depth `GEMM_K_REF` get the GPU's sustained
    fraction; deeper ones up to (K_REF + K0)/K_REF of it (FP8 +16%, BF16 +3%). A GEMM split along K
    (`split_k`) fills the waves with its pieces, each of depth K / pieces.
    `groups` > 1: one grouped kernel over that many (M, N, K) problems (MoE experts): each problem is
    tiled on its own and all their tiles share the waves. `library`: the kernel library where it sets the
    sustained fraction (`GPU.matmul_fraction`)."""
    sustained = gpu.matmul_fraction(precision, library, groups > 1)
    if m <= 0 or n <= 0 or k <= 0:
        return sustained
    tm, tn = GEMM_TILE.get(gpu.arch, (128, 128))
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tiles = tiles_m * tiles_n * groups
    tile_fill = (groups * m * n) / (tiles * tm * tn)
    pieces = split_k(gpu, m, n, k, groups)
    waves = math.ceil(tiles * pieces / gpu.sms)
    wave_fill = tiles * pieces / (waves * gpu.sms)
    k0 = GEMM_K0.get(precision, GEMM_K0["bf16"])
    depth = (k / pieces / (k / pieces + k0)) / (GEMM_K_REF / (GEMM_K_REF + k0))
    return sustained * tile_fill * wave_fill * depth


def head_dim_scale(head_dim: float, arch: str = "hopper", backward: bool = False) -> float:
    """FA3-class throughput at this head dimension relative to head dim 128 (`FA3_HEAD_DIM_SCALE`; on
    Blackwell, head dim 64 at cuDNN's measured `BLACKWELL_HEAD_DIM_64`)."""
    table = FA3_HEAD_DIM_SCALE
    if arch == "blackwell":
        table = ((64, BLACKWELL_HEAD_DIM_64[backward]), *FA3_HEAD_DIM_SCALE[1:])
    x = math.log2(head_dim)
    points = [(math.log2(d), f) for d, f in table]
    if x <= points[0][0]:
        return points[0][1]
    for (x0, f0), (x1, f1) in itertools.pairwise(points):
        if x <= x1:
            return f0 + (f1 - f0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def attention_fraction(gpu: GPU, kernel: str, seq_len: int, backward: bool, head_dim: float = 128) -> float:
    """Fraction of dense peak a flash-attention kernel sustains at this sequence length and head dim. The
    forward takes the GPU's `attention_fwd_scale` (Blackwell Ultra's faster softmax exponent)."""
    if kernel in ("auto", "cudnn", "unfused"):
        kernel = DEFAULT_ATTENTION_KERNEL.get(gpu.arch, "fa2") if kernel == "auto" else "fa3"
    fwd, bwd = ATTENTION_FRACTION.get((gpu.arch, kernel), ATTENTION_FRACTION.get((gpu.arch, "fa2"), (0.35, 0.25)))
    length = (seq_len / (seq_len + ATTENTION_S0)) / (ATTENTION_S_REF / (ATTENTION_S_REF + ATTENTION_S0))
    fa3_class = (gpu.arch, kernel) in ATTENTION_FRACTION and kernel == "fa3"
    heads = head_dim_scale(head_dim, gpu.arch, backward) if fa3_class else 1.0
    return (bwd if backward else fwd * gpu.attention_fwd_scale) * clock_ratio(gpu) * length * heads


def attention_grid_fill(gpu: GPU, query_rows: int) -> float:
    """Flash attention's throughput on a grid of `query_rows` / 128 tiles, relative to the 2048-tile grid
    at which `ATTENTION_FRACTION` holds: T / (T + 2 SMs), normalised, at most 1 (1 where not stated)."""
    if query_rows <= 0:
        return 1.0
    tail = ATTENTION_TAIL_WAVES * gpu.sms
    tiles = query_rows / ATTENTION_QUERY_TILE
    return min(1.0, (tiles / (tiles + tail)) / (ATTENTION_TILES_REF / (ATTENTION_TILES_REF + tail)))


def overlap_slowdown(gpu: GPU) -> float:
    """Fractional slowdown of compute while a collective overlaps it."""
    return NCCL_CHANNELS / gpu.sms
