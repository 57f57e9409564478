"""The attention half of a transformer block: norm, projections (GQA/MHA or MLA), rope, the attention
kernel (causal flash, sliding-window or chunked; unfused for pre-FlashAttention runs), output
projection and residual, with their TP/CP communication.

Saved tensors are those of a real run's CUDA kernels: fused norms keep their input and fp32 stats,
linears their input, flash attention q, k, v, out and the fp32 log-sum-exp.
"""

from __future__ import annotations

from shardscope.graph.common import (
    ALL,
    BF16,
    E5M6,
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
    tagged,
    tp_collectives,
)
from shardscope.graph.ops import Collective, Op, Saved
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan


def _unfused_rope(t: int, plan: Plan, width: int, head_dim: int) -> Op:
    """YaRN RoPE on q and k in eager PyTorch: Megatron-Bridge turns RoPE fusion off for any position
    embedding but plain "rope" (utils/fusions.py `validate_rope_fusion_compatibility`, v0.2-0.6), so
    Megatron-Core's `_apply_rotary_pos_emb_bshd` runs per tensor: cos and sin of the frequencies scaled by
    mscale and cast (6 kernels on seq x head_dim fp32 values, 44 bytes each), t * cos + rotate_half(t) *
    sin and the concatenation with the unrotated part (6 kernels, 24 bytes per bf16 value). Backward: 28
    bytes per value in 8 kernels (the slice's backward fills zeros first). Measured against the ATen ops
    (`test_unfused_yarn_rope_matches_pytorch`)."""
    values = t * width
    freqs = 2 * 44 * (t // plan.micro_batch) * head_dim  # q and k each take cos and sin anew
    return Op(
        "rope (unfused, YaRN)",
        "memory",
        bytes=24 * values + freqs,
        bwd_bytes=28 * values,
        cheap=True,
        launches=2 * 12,
        bwd_launches=2 * 8,
        aten=True,
    )


def core_attention(model: ModelSpec, plan: Plan, kind: LayerKind, nh: int, qk_hd: int, v_hd: int) -> tuple[list, list]:
    """Flash attention over this GPU's queries: QK^T (2·qk_hd) and PV (2·v_hd) FLOPs per query-key
    pair and head, over the keys each query sees (causal, window or chunk; CP ranks split the work
    evenly with load-balanced chunks). Kernels that take the mask as an additive bias (llm-foundry's
    triton ALiBi path) visit every block. Backward is 2.5x forward (Dao 2023)."""
    s = plan.seq_len
    t = plan.micro_batch * s // plan.cp
    if plan.attention_kernel == "unfused":
        return _unfused_attention(plan, nh, qk_hd)
    keys = model.keys_per_query(kind, s, causal=plan.causal_block_skip and plan.causal)
    flops = 2.0 * plan.micro_batch * nh * (qk_hd + v_hd) * s * keys / plan.cp
    io = BF16 * t * nh * (2 * qk_hd + 2 * v_hd)
    w = model.attention_window
    span = w if kind.attention in ("window", "chunk") and w and w < s else 0
    op = flash_attention(
        "attention", flops, io, head_dim=(qk_hd + v_hd) / 2, kv_span=span, query_rows=t * nh, sinks=model.sinks
    )
    return [op], [Saved("attention logsumexp", FP32 * t * nh, NOT_FULL)]


def _unfused_attention(plan: Plan, nh: int, hd: int) -> tuple[list[Op], list[Saved]]:
    """Attention before FlashAttention (Megatron 2021): batched QK^T and PV GEMMs over the full s x s
    score matrix (masking does not skip work), a fused scale-mask-softmax and attention dropout.
    Saved per layer: softmax output (2 B), dropout mask (1 B) and dropout output (2 B) per score —
    the 5·a·s² term of Korthikanti et al. 2022, Eq. 2; selective recompute drops it."""
    b, s = plan.micro_batch, plan.seq_len
    scores = b * nh * s * s
    ops = [
        gemm("attention scores (QK^T)", b * nh * s, s, hd, te_module=False),
        Op("softmax + dropout", "memory", bytes=9 * scores, bwd_bytes=11 * scores, cheap=True),
        gemm("attention values (PV)", b * nh * s, hd, s, te_module=False),
    ]
    return ops, [Saved("softmax out, dropout mask and out", 5 * scores, NONE_ONLY)]


def cp_collectives(plan: Plan, t: int, kv_width: int, a2a_width: int) -> list[Collective]:
    if plan.cp == 1:
        return []
    if plan.cp_kind == "ring":
        # Each step passes this rank's K and V chunk on; backward passes K, V, dK, dV. Hidden by attention.
        chunk = BF16 * t * kv_width
        steps = plan.cp - 1
        return [
            Collective("cp ring kv", "send_recv", "cp", steps * chunk, "fwd", "attention"),
            Collective("cp ring kv+dkv", "send_recv", "cp", 2 * steps * chunk, "bwd", "attention"),
        ]
    # Ulysses: all-to-all q, k, v before attention and the output after (sequence <-> heads).
    a2a = BF16 * t * a2a_width
    return [Collective("cp all-to-all qkv/out", "all_to_all", "cp", a2a, ph) for ph in ("fwd", "bwd")]


def attention_group(model: ModelSpec, plan: Plan, kind: LayerKind) -> tuple[OpGroup, float, float]:
    """The attention half, and the elements its FP8 GEMMs quantize (inputs, output gradients)."""
    sh = Shapes.of(plan)
    t, t_sp, h = sh.t, sh.t_sp, model.hidden
    tp = plan.tp
    nh = model.heads // tp
    ops: list[Op] = []
    qk_comms: list[Collective] = []
    saved: list[Saved] = [Saved("layer input", BF16 * t_sp * h, ALL)]
    norm1, stats1 = norm("attn norm", model, t_sp)
    ops += tagged([norm1], "layernorm")
    saved += [stats1, *tagged([Saved("attn norm out (qkv input)", sh.gemm_in * sh.t_kept * h, NONE_ONLY)], "layernorm")]

    if model.mla:
        a = model.mla
        qk_hd, v_hd = a.qk_head_dim, a.v_head_dim
        # Down-projections are replicated across TP ranks; up-projections split the heads.
        if a.q_lora_rank:
            ops.append(gemm("q down proj", t, a.q_lora_rank, h, sh.fp8))
            qn, qs = norm("q latent norm", model, t, a.q_lora_rank)
            ops += [qn, *tagged([gemm("q up proj", t, nh * qk_hd, a.q_lora_rank, sh.fp8)], "mla_up_proj")]
            saved += [
                qs,
                Saved("q latent (norm input)", BF16 * t * a.q_lora_rank, NONE_ONLY),
                Saved("q latent normed (q up input)", sh.gemm_in * t * a.q_lora_rank, NONE_ONLY),
            ]
        else:
            ops.append(gemm("q proj", t, nh * qk_hd, h, sh.fp8))
        ops.append(gemm("kv down proj", t, a.kv_lora_rank + a.qk_rope_head_dim, h, sh.fp8))
        kn, ks = norm("kv latent norm", model, t, a.kv_lora_rank)
        ops += [
            kn,
            *tagged([gemm("kv up proj", t, nh * (a.qk_nope_head_dim + v_hd), a.kv_lora_rank, sh.fp8)], "mla_up_proj"),
        ]
        saved += [
            ks,
            # the latent is a slice of the down-projection's output beside the RoPE key; Transformer
            # Engine's norm keeps a contiguous copy of it (`ops/basic/rmsnorm.py`), so the slice is freed
            Saved("kv latent (norm input)", BF16 * t * a.kv_lora_rank, NONE_ONLY),
            Saved("kv latent normed (kv up input)", sh.gemm_in * t * a.kv_lora_rank, NONE_ONLY),
        ]
        rope_width = nh * a.qk_rope_head_dim + a.qk_rope_head_dim
        rope = Op("rope", "memory", bytes=2 * BF16 * t * rope_width, bwd_bytes=2 * BF16 * t * rope_width, cheap=True)
        ops += tagged([rope], "mla_up_proj")
        q_w, k_w, v_w = nh * qk_hd, nh * qk_hd, nh * v_hd
        fp8_inputs = t * (h + (a.q_lora_rank or 0) + a.kv_lora_rank + nh * v_hd) + (t * h if a.q_lora_rank else 0)
        fp8_grads = t * (
            (a.q_lora_rank or 0)
            + nh * qk_hd
            + a.kv_lora_rank
            + a.qk_rope_head_dim
            + nh * (a.qk_nope_head_dim + v_hd)
            + h
        )
        kv_ring, a2a_w = k_w + v_w, q_w + k_w + v_w + nh * v_hd
    else:
        kvh, hd = model.kv_heads // tp, model.head_dim
        qk_hd = v_hd = hd
        q_w, k_w, v_w = nh * hd, kvh * hd, kvh * hd
        splits = (q_w, k_w, v_w) if plan.split_projections else ()
        ops.append(gemm("qkv proj", t, q_w + k_w + v_w, h, sh.fp8, splits=splits))
        if model.qk_norm:
            qk_op, qk_saved, qk_comms = qk_norm("q/k norm", model, plan, (t, t), (nh, kvh))
            ops.append(qk_op)
            saved += qk_saved
        if model.position == "rope":
            qk = BF16 * t * (q_w + k_w)
            fused = Op("rope", "memory", bytes=2 * qk, bwd_bytes=2 * qk, cheap=True, role="rope")
            ops.append(_unfused_rope(t, plan, q_w + k_w, hd) if model.rope_type == "yarn" else fused)
        fp8_inputs = t * (h + q_w)
        fp8_grads = t * (q_w + k_w + v_w + h)
        kv_ring, a2a_w = k_w + v_w, 2 * q_w + k_w + v_w

    # MLA's q, k, v are rebuilt from the latents by the mla_up_proj recompute module
    qkv = Saved("q, k, v", BF16 * t * (q_w + k_w + v_w), NOT_FULL, gemm="qkv proj")
    saved += tagged([qkv], "mla_up_proj") if model.mla else [qkv]
    core_ops, core_saved = core_attention(model, plan, kind, nh, qk_hd, v_hd)
    ops += tagged(core_ops, "core_attn")
    saved += tagged(core_saved, "core_attn")
    out_w = nh * v_hd
    # the attention output is also the out-projection's saved input, unless that keeps an FP8 copy
    if sh.fp8 and plan.fp8_activation_cache:  # one E5M6 copy (12 bits) serves both backward readers
        saved.append(Saved("attention out (E5M6, attention and out proj backward)", E5M6 * t * out_w, NOT_FULL))
    else:
        out = Saved("attention out", BF16 * t * out_w, NOT_FULL)
        saved += tagged([out], "core_attn") if sh.fp8 else [out]
        if sh.fp8:
            saved.append(Saved("attention out (fp8 copy for out proj)", t * out_w, NONE_ONLY))
    ops.append(gemm("out proj", t, h, out_w, sh.fp8))
    ops.append(residual("attn residual add", model, t_sp))
    saved.append(Saved("attn residual (mlp norm input)", BF16 * t_sp * h, NOT_FULL, gemm="out proj"))
    column = "" if model.mla else "qkv proj"  # (MLA's down-projections are not split over TP)
    comms = tp_collectives(plan, "attn", BF16 * t * h, column, "out proj") + qk_comms
    comms += cp_collectives(plan, t, kv_ring, a2a_w)
    group = OpGroup(tuple(ops), tuple(saved), tuple(comms))
    return group, fp8_inputs, fp8_grads
