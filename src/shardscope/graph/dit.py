"""Blocks of video diffusion transformers (see `models.spec.DiTSpec`).

A Wan block is: adaLN-modulated self-attention (non-causal, q/k RMSNorm, 3-D RoPE), cross-attention
from the video tokens to the text tokens (K/V computed on the text), and an adaLN-modulated GeLU FFN,
each residual branch scaled by a learned gate. HunyuanVideo's blocks are diffusers' eager modules
(`graph.hunyuan`).
"""

from __future__ import annotations

from shardscope.graph.attention import attention_group
from shardscope.graph.common import (
    BF16,
    FP32,
    NONE_ONLY,
    NOT_FULL,
    OpGroup,
    Shapes,
    flash_attention,
    gemm,
    norm,
    qk_norm,
    residual,
    tp_collectives,
)
from shardscope.graph.hunyuan import double_block, single_block
from shardscope.graph.mlp import dense_mlp_group
from shardscope.graph.ops import Op, Saved
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan
from shardscope.records import evolve


def _modulation(model: ModelSpec, tokens: float, branches: int) -> OpGroup:
    """adaLN shift/scale on each branch input and the gate on each branch output (element-wise)."""
    size = BF16 * tokens * model.hidden
    ops = tuple(
        Op(f"adaLN modulate/gate {i}", "memory", bytes=2 * 3 * size, bwd_bytes=2 * 4 * size, cheap=True)
        for i in range(branches)
    )
    saved = tuple(Saved(f"branch {i} output (gate input)", size, NOT_FULL) for i in range(branches))
    return OpGroup(ops, saved, ())


def _cross_attention(model: ModelSpec, plan: Plan) -> tuple[OpGroup, float, float]:
    """Video tokens (queries) attend to the sample's text tokens (keys/values); K/V projections run on
    the text tokens only."""
    assert model.dit is not None
    sh = Shapes.of(plan)
    t, t_sp, d = sh.t, sh.t_sp, model.hidden
    nh, hd = model.heads // plan.tp, model.head_dim
    w = nh * hd
    text = plan.micro_batch * model.dit.text_len
    cn, cs = norm("cross-attn norm", model, t_sp)
    flops = 4.0 * plan.micro_batch * nh * hd * (plan.seq_len / plan.cp) * model.dit.text_len
    io = BF16 * (2 * t * w + 2 * text * w)
    qk_op, qk_saved, qk_comms = qk_norm("cross-attn q/k norm", model, plan, (t, text), (nh, nh))
    ops = [
        cn,
        gemm("cross-attn q proj", t, w, d, sh.fp8),
        gemm("cross-attn kv proj (text)", text, 2 * w, d, sh.fp8),
        qk_op,
        flash_attention("cross-attention", flops, io, head_dim=hd, query_rows=t * nh),
        gemm("cross-attn out proj", t, d, w, sh.fp8),
        residual("cross-attn residual add", model, t_sp),
    ]
    saved = [
        cs,
        Saved("cross-attn norm out (q input)", sh.gemm_in * t_sp * d, NONE_ONLY),
        *qk_saved,
        Saved("cross-attn q, text k, v", BF16 * (t * w + 2 * text * w), NOT_FULL),
        Saved("cross-attn logsumexp", FP32 * t * nh, NOT_FULL),
        Saved("cross-attn out", BF16 * t * w, NOT_FULL),
        Saved("cross-attn residual", BF16 * t_sp * d, NOT_FULL),
    ]
    comms = tp_collectives(plan, "cross-attn", BF16 * t * d) + qk_comms
    return OpGroup(tuple(ops), tuple(saved), tuple(comms)), t * (d + w) + text * d, t * (w + d) + text * 2 * w


# diffusers' WanTransformerBlock (0.32-0.42) runs its norms, adaLN modulation and gated residuals eagerly
# in fp32: `(norm1(x.float()) * (1 + scale) + shift).type_as(x)`, `(x.float() + attn * gate).type_as(x)`,
# `norm2(x.float()).type_as(x)` (affine), the same modulation after norm3 and `(x.float() + ff.float() *
# c_gate).type_as(x)`. Bytes per activation value and kernels, forward and backward, as the ATen ops read
# and write them (test_dit `test_diffusers_wan_chains_match_pytorch`); the op each replaces in the graph.
DIFFUSERS_WAN_CHAINS = {
    "attn norm": ("norm1 + adaLN modulate (fp32, eager)", 36, 6, 52, 7),
    "attn residual add": ("gated residual, attention (fp32, eager)", 30, 4, 40, 6),
    "cross-attn norm": ("norm2 (fp32, eager)", 20, 3, 24, 3),
    "mlp norm": ("norm3 + adaLN modulate (fp32, eager)", 36, 6, 52, 7),
    "mlp residual add": ("gated residual, ffn (fp32, eager)", 38, 5, 42, 6),
}


# What diffusers' fp32 chains keep for backward, replacing Megatron-DFM's bf16 tensors (`jit_fuser` keeps
# the bf16 input of each region): FP32LayerNorm keeps its fp32 input copy (`x.float()`), the adaLN
# `norm(x) * (1 + scale)` the fp32 normalised tensor (the scale's gradient), and the FFN's gate multiplies
# `ff_output.float()`, an fp32 copy. The block's bf16 input and residuals are then kept by nothing unless
# a recompute re-runs these chains from them. Graph tensor -> (its policies here, the fp32 tensors that
# replace it under "none": name, copies of an fp32 [tokens, d] tensor). test_state_whole
# `test_wan_block_memory_matches_fake_tensor` counts them in diffusers' block under FakeTensorMode.
DIFFUSERS_WAN_SAVED = {
    "layer input": (frozenset({"selective", "full"}), (("norm1 fp32 input and normalised output", 2),)),
    "attn residual (mlp norm input)": (frozenset({"selective"}), (("norm2 fp32 input", 1),)),
    "cross-attn residual": (frozenset({"selective"}), (("norm3 fp32 input and normalised output", 2),)),
    "branch 1 output (gate input)": (frozenset({"selective"}), (("ffn output fp32 copy (gate input)", 1),)),
}


def _diffusers_wan(block: OpGroup, values: float, cross_attn_norm: bool) -> OpGroup:
    """The block as diffusers runs it: its norms and residuals as the eager fp32 chains above (ATen's
    streaming rate, `Op.aten`), with the adaLN modulation inside them, and what those chains keep for
    backward (`DIFFUSERS_WAN_SAVED`; without `cross_attn_norm` norm2 is an identity that keeps nothing)."""
    ops = []
    for op in block.ops:
        if op.name.startswith("adaLN modulate/gate"):
            continue
        if op.name in DIFFUSERS_WAN_CHAINS:
            name, fwd, fk, bwd, bk = DIFFUSERS_WAN_CHAINS[op.name]
            # cheap: op-level selective checkpointing re-runs it
            op = evolve(
                op, name=name, bytes=fwd * values, bwd_bytes=bwd * values, launches=fk, bwd_launches=bk, aten=True,
                cheap=True,
            )  # fmt: skip
        ops.append(op)
    saved: list[Saved] = []
    for x in block.saved:
        if x.name not in DIFFUSERS_WAN_SAVED:
            saved.append(x)
            continue
        policies, fp32 = DIFFUSERS_WAN_SAVED[x.name]
        saved.append(evolve(x, policies=policies))
        for name, copies in fp32:
            if cross_attn_norm or not name.startswith("norm2"):
                saved.append(Saved(name, copies * FP32 * values, NONE_ONLY))
    return OpGroup(tuple(ops), tuple(saved), block.comms, block.attn_ops)


def dit_block_group(model: ModelSpec, plan: Plan, kind: LayerKind) -> tuple[OpGroup, float, float]:
    """One DiT block on one GPU for one micro-batch (+ the elements its FP8 GEMMs quantize). A Wan block
    runs as Megatron-DFM builds it (its elementwise steps `jit_fuser`-fused) under `--fused-activation`,
    else as diffusers runs it (`_diffusers_wan`: its eager fp32 chains and the fp32 tensors they keep)."""
    assert model.dit is not None
    if model.dit.family == "hunyuan":
        return (double_block if kind.mlp == "dit-double" else single_block)(model, plan, kind)
    attn, ai, ag = attention_group(model, plan, kind)
    cross, ci, cg = _cross_attention(model, plan)
    mlp, mi, mg = dense_mlp_group(model, plan)
    t_sp = Shapes.of(plan).t_sp
    block = attn + cross + mlp + _modulation(model, t_sp, 2)
    if not plan.fused_swiglu:
        block = _diffusers_wan(block, t_sp * model.hidden, model.dit.cross_attn_norm)
    return block, ai + ci + mi, ag + cg + mg


def dit_embedding_group(model: ModelSpec, plan: Plan) -> OpGroup:
    """Patch embedding (a Conv3d with stride = kernel: one GEMM over the patches) and conditioning."""
    assert model.dit is not None
    sh = Shapes.of(plan)
    x = model.dit
    patch = x.patch[0] * x.patch[1] * x.patch[2]
    text = plan.micro_batch * x.text_len
    ops = (
        gemm("patch embedding", sh.t_sp, model.hidden, x.in_channels * patch),
        gemm("text embedding", text, model.hidden, x.text_dim),
        gemm("text embedding 2", text, model.hidden, model.hidden),
    )
    return OpGroup(ops, (), ())


def dit_head_group(model: ModelSpec, plan: Plan) -> OpGroup:
    """Final adaLN + projection back to latent patches, and the flow-matching / denoising MSE loss."""
    assert model.dit is not None
    sh = Shapes.of(plan)
    x = model.dit
    out = x.out_channels * x.patch[0] * x.patch[1] * x.patch[2]
    fnorm, stats = norm("final norm", model, sh.t_sp)
    ops = (
        fnorm,
        gemm("output proj", sh.t_sp, out, model.hidden),
        Op("mse loss", "memory", bytes=3 * FP32 * sh.t_sp * out, bwd_bytes=3 * FP32 * sh.t_sp * out),
    )
    saved = (stats, Saved("output proj input", BF16 * sh.t_sp * model.hidden, frozenset({"none", "selective", "full"})))
    return OpGroup(ops, saved, ())
