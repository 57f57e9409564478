"""A measured block (`shardscope.measure`: no adapter, the model built by transformers on the meta device)
priced from what was measured rather than only from the standard fields it was read into.

The standard op graph (`graph.attention`, `graph.mlp`) is built from the spec's fields first; this module
reconciles it with the measurement (`ModelSpec.measured_blocks`):

- GEMMs: the measured forward GEMMs (eager transformers runs q, k, v or gate and up as separate calls) are
  matched to the standard graph's fused projections by input width K and summed output width N. A GEMM the
  standard graph has no match for becomes a GEMM of its measured shape, split over TP as Megatron splits a
  projection of that side (input width = hidden: column-parallel, its N split; output width = hidden:
  row-parallel, its K split; otherwise replicated), with its input saved. A standard GEMM nothing measured
  matches is dropped.
- Norms: a block's norm parameters beyond the standard two (Gemma-2's post-attention and post-MLP norms) are
  extra norms of the block's width, priced as the standard norm op (fused or an eager chain, as the stack
  runs them) with its saved input and statistics; a block with one norm fewer (Falcon's parallel attention +
  MLP, one shared norm) loses the MLP norm, and, being parallel, the MLP reads the attention norm's output:
  nothing of the attention's output is saved for it.
- Attention: priced by kind (causal, window, chunk) by the standard flash kernel, which computes soft-capping
  or an ALiBi bias in registers and saves only q, k, v, out and the log-sum-exp. Where the plan runs
  attention unfused (eager scores), the score matrices are saved as measured: the measured s² bytes
  (Gemma-2's soft-capped scores, BLOOM's ALiBi-biased ones) replace the standard unfused accounting.
- Eager elementwise work is priced by bytes, as the standard graph prices it.

Blocks the standard fields do not describe (`MeasuredBlock.whole`: a Mamba/SSM mixer, Jamba's Mamba + MLP
or MoE, Nemotron-H's attention or MLP alone) are priced wholly from the measurement (`whole_block_group`):

- each measured GEMM at its shape (the experts' top-k products as one grouped GEMM over the experts), at
  the GPU's dense GEMM rate with the estimator's GEMM efficiency, its input saved;
- the FLOPs of an attention in the block (the eager products over the s x s scores, measured) as a causal
  flash-attention kernel of the config's head size, its output and log-sum-exp saved;
- everything else (the Mamba selective scan, its causal convolution, gates, norms, residual adds) as one
  memory-bound op at streaming HBM bandwidth, its bytes the measured activation traffic around the GEMMs:
  every tensor a GEMM writes read once and every tensor a GEMM reads written once, plus the block's input
  read and output written (backward twice that). This is what a fused selective-scan kernel moves (Mamba's
  `selective_scan_cuda` reads u, Δ, B, C, z and writes y, keeping the state h in SRAM; Gu & Dao 2023, §3.3):
  the scan is a recurrence of elementwise multiply-adds over d_inner x d_state per token, far below any
  GEMM's arithmetic intensity, so its time is its bytes, not its FLOPs at the GEMM rate. Its FLOPs (the
  measured ones beyond the GEMMs') are carried on the op for the hardware-FLOPs count only. The GEMMs'
  outputs are saved for the backward (the scan's inputs), as the fused kernel saves them.

Such blocks are not split by tensor, context or expert parallelism (`plan.make_plan` refuses those plans
in one line): a scan's projections to Δ, B and C (x_proj) read the whole inner width and the recurrence
runs along the whole sequence, which Megatron's column/row split and a sequence shard do not divide.

The linear part of the measured saved bytes is what transformers' eager code keeps (fp32 copies in its
norms, the rotated q and k), not what a training stack keeps; it is not added as such: what the standard
graph misses is added structurally above, so that a family with an adapter prices the same either way
(tests/test_measure.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from shardscope.errors import ShardscopeError
from shardscope.graph.common import (
    ALL,
    BF16,
    FP32,
    NONE_ONLY,
    NOT_FULL,
    OpGroup,
    Shapes,
    flash_attention,
    gemm,
    norm,
    scoped,
    tagged,
)
from shardscope.graph.ops import Op, Saved
from shardscope.models.spec import LayerKind, MeasuredBlock, ModelSpec
from shardscope.plan.plan import Plan, measured_block_problem

__all__ = ["measured_block", "reconcile", "whole_block_group"]

# The standard graph's unfused core attention keeps its score matrices under this name (graph.attention).
_UNFUSED_SCORES = "softmax out, dropout mask and out"
# More measured GEMMs than this per block are not matched by subsets (2^n tries); all become measured GEMMs.
_MAX_MATCHED = 16


def measured_block(model: ModelSpec, kind: LayerKind) -> MeasuredBlock | None:
    """The measurement of `kind`'s attention kind, or None (an adapted model, or a kind not measured)."""
    return next((b for b in model.measured_blocks if b.attention == kind.attention), None)


def _standard_gemms(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """The standard dense block's GEMMs before TP, by the op names the standard graph gives them: (N, K)."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    up = ("gate/up proj", 2 * f) if model.mlp == "swiglu" else ("up proj", f)
    return {"qkv proj": (q + 2 * kv, h), "out proj": (h, q), up[0]: (up[1], h), "down proj": (h, f)}


def match_gemms(
    standard: dict[str, tuple[int, int]], measured: Sequence[tuple[float, int, int, int]]
) -> tuple[list[str], list[tuple[float, int, int]]]:
    """Match each standard (N, K) to measured one-row-per-token GEMMs of the same K whose N sum to N (q, k and
    v for the fused qkv projection). Returns the standard GEMMs left unmatched and the measured GEMMs left
    over, as (rows per token, N, K), one per call."""
    calls = [(m, n, k) for m, n, k, c in measured for _ in range(c)]
    missing: list[str] = []
    for name, (n_std, k_std) in standard.items():
        candidates = [i for i, (m, _, k) in enumerate(calls) if m == 1.0 and k == k_std]
        found: tuple[int, ...] | None = None
        if len(candidates) <= _MAX_MATCHED:
            for size in range(len(candidates), 0, -1):  # the most calls first: eager code splits projections
                found = next((c for c in combinations(candidates, size) if sum(calls[i][1] for i in c) == n_std), None)
                if found:
                    break
        if found is None:
            missing.append(name)
            continue
        calls = [g for i, g in enumerate(calls) if i not in found]
    return missing, calls


def _tp_split(model: ModelSpec, plan: Plan, n: int, k: int) -> tuple[int, int]:
    """(N, K) on one TP rank: a projection reading the residual stream is column-parallel (N split), one
    writing it row-parallel (K split), any other replicated; a width TP does not divide stays whole."""
    tp, h = plan.tp, model.hidden
    if k == h and n % tp == 0:
        return n // tp, k
    if n == h and k % tp == 0:
        return n, k // tp
    return n, k


def reconcile(group: OpGroup, model: ModelSpec, plan: Plan, kind: LayerKind) -> OpGroup:
    """The standard dense block `group` of `kind`, reconciled with its measurement (module docstring)."""
    block = measured_block(model, kind)
    if block is None:
        return group
    sh = Shapes.of(plan)
    t, t_sp, h = sh.t, sh.t_sp, model.hidden
    ops, saved = list(group.ops), list(group.saved)
    attn_ops = group.attn_ops

    def drop_op(name: str) -> None:
        nonlocal attn_ops
        for i, op in enumerate(ops):
            if op.name == name:
                attn_ops -= i < attn_ops
                del ops[i]
                return

    # GEMMs: the standard ones nothing measured matches go; measured ones the standard lacks come in.
    missing, extra = match_gemms(_standard_gemms(model), block.gemms)
    for name in missing:
        drop_op(name)
    tail: list[Op] = []
    # Split as a projection of its side is, inside the TP region of the block's collectives (none of its own).
    for i, (rows, n, k) in enumerate(extra):
        n_local, k_local = _tp_split(model, plan, n, k)
        tail.append(gemm(f"measured gemm {i} ({n}x{k})", rows * t, n_local, k_local, sh.fp8))
        saved.append(Saved(f"measured gemm {i} input", sh.gemm_in * rows * t * k_local, NONE_ONLY))

    # Norms beyond (or short of) the standard two, from the block's parameters the fields do not cover.
    extra_norms, rest = divmod(model.extra_layer_params, model.norm_params)
    if not rest and extra_norms > 0:
        for i in range(extra_norms):
            op, stats = norm(f"measured extra norm {i}", model, t_sp)
            tail += scoped(tagged([op], "layernorm"), "mlp")  # recomputed and captured as the standard norms
            saved += [Saved(f"measured extra norm {i} input", BF16 * t_sp * h, NONE_ONLY), stats]
    gone: set[str] = set()
    if model.parallel_block:  # the MLP's norm reads the block input (saved already), not the attention's sum
        gone.add("attn residual (mlp norm input)")
    if not rest and extra_norms == -1:  # one shared norm (Falcon): the MLP's goes, with what it kept
        drop_op("mlp norm")
        gone |= {"mlp norm stats", "mlp norm out (mlp input)"}
    saved = [s for s in saved if s.name not in gone]

    # Unfused attention keeps the score matrices eager code keeps: the measured s² bytes per sequence.
    if plan.attention_kernel == "unfused":
        scores = plan.micro_batch * block.saved_bytes[1] * plan.seq_len**2 / (plan.tp * plan.cp)
        saved = [Saved(s.name, scores, s.policies, s.modules) if s.name == _UNFUSED_SCORES else s for s in saved]

    return OpGroup(tuple(ops + tail), tuple(saved), group.comms, attn_ops)


def whole_block_group(model: ModelSpec, plan: Plan, kind: LayerKind) -> tuple[OpGroup, float, float]:
    """A block priced wholly from its measurement (module docstring), and the elements its FP8 GEMMs
    quantize (inputs, output gradients)."""
    if problem := measured_block_problem(model, plan):
        raise ShardscopeError(problem)
    block = model.whole_block(kind)
    name = block.attention
    sh = Shapes.of(plan)
    t, h, s = sh.t, model.hidden, plan.seq_len
    ops: list[Op] = []
    saved: list[Saved] = [Saved("layer input", BF16 * t * h, ALL)]
    fp8_in = fp8_grad = gemm_flops = 0.0
    shapes = [(g, 1) for g in block.gemms] + [(g, block.experts) for g in block.expert_gemms]
    for (rows, n, k, calls), groups in shapes:
        what = "experts " if groups > 1 else ""
        for c in range(calls):
            label = f"{name} {what}gemm {n}x{k}" + (f" #{c + 1}" if calls > 1 else "")
            ops.append(gemm(label, rows * t, n, k, sh.fp8, groups=groups))
            # its input for the weight gradient, its output for the scan / elementwise code after it
            saved += [
                Saved(f"{label} input", sh.gemm_in * rows * t * k, NOT_FULL),
                Saved(f"{label} output", BF16 * rows * t * n, NOT_FULL),
            ]
            fp8_in, fp8_grad = fp8_in + rows * t * k, fp8_grad + rows * t * n
            gemm_flops += 2.0 * rows * t * n * k
    if block.attention_flops:  # the score matmuls eager code ran over the s x s square, as a causal flash kernel
        head_dim = block.head_dim or 128
        heads = block.attention_flops / (4 * head_dim)  # QK^T and PV: 2 x 2·heads·head_dim per query per key
        keys = (s + 1) / 2 if plan.causal else float(s)
        flops = plan.micro_batch * block.attention_flops * s * keys
        ops.append(flash_attention(f"{name} attention", flops, 4 * BF16 * t * heads * head_dim, head_dim,
                                   query_rows=int(plan.micro_batch * heads * s)))  # fmt: skip
        saved += [
            Saved(f"{name} attention out", BF16 * t * heads * head_dim, NOT_FULL),
            Saved(f"{name} log-sum-exp", FP32 * t * heads, NOT_FULL),
        ]
    # The rest: the scan and the elementwise code around the GEMMs, by the bytes it moves (module docstring).
    io = t * block.io_bytes[0] + plan.micro_batch * max(block.io_bytes[1], 0.0) * s * s
    per_seq_fwd, per_seq_bwd = (plan.micro_batch * c for c in block.flops_per_sequence)
    rest_fwd = max(block.flops_fwd[0] * t + per_seq_fwd - gemm_flops, 0.0)
    rest_bwd = max(block.flops_bwd[0] * t + per_seq_bwd - 2 * gemm_flops, 0.0)
    what = "selective scan + elementwise" if block.ssm else "elementwise"
    # a fused kernel between consecutive GEMMs (the scan, gates, norms, residual adds)
    kernels = max(1, len(block.gemms))
    ops.append(Op(f"{name} {what} (by bytes)", "memory", flops=rest_fwd, bytes=io, bwd_flops=rest_bwd,
                  bwd_bytes=2 * io, launches=kernels))  # fmt: skip
    return OpGroup(tuple(ops), tuple(saved), (), len(ops)), fp8_in, fp8_grad
