"""Build the op graph of one pipeline stage for one micro-batch on one GPU.

Shapes after sharding (per GPU): T = micro_batch · seq_len / cp tokens enter a layer; TP splits heads,
KV heads and the FFN; with sequence parallel the norms, residual adds and saved layer inputs hold T/tp
tokens (Korthikanti et al. 2022, "Reducing Activation Recomputation", §4.2.2).

Saved activations are the tensors the CUDA kernels of a real run keep (flash attention saves q, k, v,
out and the fp32 log-sum-exp; fused RMSNorm/LayerNorm save their input and fp32 statistics; a linear
saves its input). Policies: "none" keeps all of them; "selective" keeps GEMM and attention outputs and
recomputes the cheap ops (norms, rope, activations, residual adds) — PyTorch op-level selective
checkpointing as torchtitan uses it; "full" keeps only each layer's input.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.graph.fp8 import quantization_bytes
from shardscope.graph.ops import Collective, Op, Saved
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan

ALL = frozenset({"none", "selective", "full"})
NOT_FULL = frozenset({"none", "selective"})
NONE_ONLY = frozenset({"none"})
SELECTIVE_ONLY = frozenset({"selective"})

BF16 = 2  # bytes per activation element in bf16/fp16 mixed precision
FP32 = 4


@dataclass(frozen=True, slots=True)
class OpGroup:
    """Ops, saved tensors and collectives of one unit (a transformer layer, the embedding, the head)."""

    ops: tuple[Op, ...]
    saved: tuple[Saved, ...]
    comms: tuple[Collective, ...]

    def saved_bytes(self, policy: str) -> float:
        return sum(s.bytes for s in self.saved if policy in s.policies)


@dataclass(frozen=True, slots=True)
class StageGraph:
    """A transformer layer (every layer of a dense model is the same), the embedding (first stage) and
    the output layer + loss (last stage), for one micro-batch on one GPU."""

    layer: OpGroup
    embedding: OpGroup
    head: OpGroup
    tokens: int  # tokens per micro-batch per GPU entering a layer (T)
    boundary_bytes: float  # activation sent between pipeline stages per micro-batch


def _norm(name: str, model: ModelSpec, tokens: float) -> tuple[Op, Saved]:
    h = model.hidden
    stats = FP32 * (2 if model.norm == "layernorm" else 1)
    op = Op(name, "memory", bytes=2 * BF16 * tokens * h, bwd_bytes=3 * BF16 * tokens * h, cheap=True)
    return op, Saved(f"{name} stats", stats * tokens, NONE_ONLY)


def _residual(name: str, model: ModelSpec, tokens: float) -> Op:
    size = BF16 * tokens * model.hidden
    return Op(name, "memory", bytes=3 * size, bwd_bytes=3 * size, cheap=True)


def _gemm(name: str, m: float, n: int, k: int, fp8: bool = False) -> Op:
    flops = 2.0 * m * n * k
    io = BF16 * (m * k + k * n + m * n)
    return Op(name, "gemm", flops=flops, bytes=io, bwd_flops=2 * flops, bwd_bytes=2 * io, mnk=(int(m), n, k), fp8=fp8)


def layer_group(model: ModelSpec, plan: Plan, arch: str = "hopper") -> OpGroup:
    """One transformer block on one GPU for one micro-batch."""
    tp = plan.tp
    s = plan.seq_len
    t = plan.micro_batch * s // plan.cp  # tokens in this GPU's sequence chunk
    t_sp = t / tp if plan.sp else t  # tokens held by norms / residual stream
    h = model.hidden
    nh, kvh, hd = model.heads // tp, model.kv_heads // tp, model.head_dim
    q, kv = nh * hd, kvh * hd
    f = model.ffn_hidden // tp

    fp8 = plan.precision == "fp8"
    gemm_in = 1 if fp8 else BF16  # an FP8 GEMM saves its input already quantized
    ops: list[Op] = []
    saved: list[Saved] = [Saved("layer input", BF16 * t_sp * h, ALL)]

    norm1, stats1 = _norm("attn norm", model, t_sp)
    ops.append(norm1)
    saved += [stats1, Saved("attn norm out (qkv input)", gemm_in * t_sp * h, NONE_ONLY)]
    ops.append(_gemm("qkv proj", t, q + 2 * kv, h, fp8))
    if model.qk_norm:
        qk = BF16 * t * (q + kv)
        ops.append(Op("q/k norm", "memory", bytes=2 * qk, bwd_bytes=3 * qk, cheap=True))
        saved += [
            Saved("q/k norm input", qk, NONE_ONLY),
            Saved("q/k norm stats", FP32 * t * (nh + kvh), NONE_ONLY),
        ]
    if model.position == "rope":
        qk = BF16 * t * (q + kv)
        ops.append(Op("rope", "memory", bytes=2 * qk, bwd_bytes=2 * qk, cheap=True))
    saved.append(Saved("q, k, v", BF16 * t * (q + 2 * kv), NOT_FULL))
    if plan.attention_kernel == "unfused":
        ops_, saved_ = _unfused_attention(plan, nh, hd)
        ops += ops_
        saved += saved_
    else:
        # Causal flash attention: each query attends to (s+1)/2 keys on average; CP ranks split it
        # evenly (load-balanced chunking). fwd = 2 matmuls (QK^T, PV) of 2·q·k·d FLOPs each. Kernels that
        # take the causal mask as an additive bias (llm-foundry's triton ALiBi path) visit every block.
        keys = (s + 1) / 2 if plan.causal_block_skip else s
        attn_flops = 4.0 * plan.micro_batch * nh * hd * s * keys / plan.cp
        attn_io = BF16 * t * (2 * q + 2 * kv)
        ops.append(
            Op(
                "attention",
                "attention",
                flops=attn_flops,
                bytes=attn_io,
                bwd_flops=2.5 * attn_flops,
                bwd_bytes=2 * attn_io,
            )
        )
        saved.append(Saved("attention logsumexp", FP32 * t * nh, NOT_FULL))
    saved.append(Saved("attention out", BF16 * t * q, NOT_FULL))
    if fp8:
        saved.append(Saved("attention out (fp8 copy for out proj)", t * q, NONE_ONLY))
    ops.append(_gemm("out proj", t, h, q, fp8))
    ops.append(_residual("attn residual add", model, t_sp))
    saved.append(Saved("attn residual (mlp norm input)", BF16 * t_sp * h, NOT_FULL))

    norm2, stats2 = _norm("mlp norm", model, t_sp)
    ops.append(norm2)
    saved += [stats2, Saved("mlp norm out (mlp input)", gemm_in * t_sp * h, NONE_ONLY)]
    up_width = 2 * f if model.mlp == "swiglu" else f
    if model.mlp == "swiglu":
        ops.append(_gemm("gate/up proj", t, 2 * f, h, fp8))
        ops.append(Op("swiglu", "memory", bytes=3 * BF16 * t * f, bwd_bytes=5 * BF16 * t * f, cheap=True))
        saved += [
            Saved("gate, up", 2 * BF16 * t * f, NOT_FULL),
            Saved("silu(gate)", BF16 * t * f, NONE_ONLY),
            Saved("swiglu out (down input)", gemm_in * t * f, NONE_ONLY),
        ]
    else:
        ops.append(_gemm("up proj", t, f, h, fp8))
        ops.append(Op("gelu", "memory", bytes=2 * BF16 * t * f, bwd_bytes=3 * BF16 * t * f, cheap=True))
        saved += [
            Saved("up", BF16 * t * f, NOT_FULL),
            Saved("gelu out (down input)", gemm_in * t * f, NONE_ONLY),
        ]
    ops.append(_gemm("down proj", t, h, f, fp8))
    if fp8:
        inputs = t * (2 * h + q + f)  # qkv, out, up and down GEMM inputs
        grads = t * ((q + 2 * kv) + h + up_width + h)  # their output gradients
        fwd_b, bwd_b = quantization_bytes(plan, arch, inputs, grads)
        ops.append(Op("fp8 casts", "memory", bytes=fwd_b, bwd_bytes=bwd_b, cheap=True))
    ops.append(_residual("mlp residual add", model, t_sp))
    saved.append(Saved("down proj out", BF16 * t_sp * h, SELECTIVE_ONLY))

    return OpGroup(tuple(ops), tuple(saved), tuple(_layer_comms(model, plan, t, q, kv)))


def _unfused_attention(plan: Plan, nh: int, hd: int) -> tuple[list[Op], list[Saved]]:
    """Attention before FlashAttention (Megatron 2021): batched QK^T and PV GEMMs over the full s x s
    score matrix (masking does not skip work), a fused scale-mask-softmax and attention dropout.
    Saved per layer: softmax output (2 B), dropout mask (1 B) and dropout output (2 B) per score —
    the 5·a·s² term of Korthikanti et al. 2022, Eq. 2; selective recompute drops it."""
    b, s = plan.micro_batch, plan.seq_len
    scores = b * nh * s * s
    ops = [
        _gemm("attention scores (QK^T)", b * nh * s, s, hd),
        Op("softmax + dropout", "memory", bytes=9 * scores, bwd_bytes=11 * scores, cheap=True),
        _gemm("attention values (PV)", b * nh * s, hd, s),
    ]
    saved = [Saved("softmax out, dropout mask and out", 5 * scores, NONE_ONLY)]
    return ops, saved


def _layer_comms(model: ModelSpec, plan: Plan, t: int, q: int, kv: int) -> list[Collective]:
    comms: list[Collective] = []
    act = BF16 * t * model.hidden  # one full activation of this TP group's tokens
    if plan.tp > 1:
        hide = "gemm" if plan.tp_comm_overlap else ""
        if plan.sp:
            for phase in ("fwd", "bwd"):
                for where in ("attn", "mlp"):
                    comms.append(Collective(f"tp all-gather {where}", "all_gather", "tp", act, phase, hide))
                    comms.append(Collective(f"tp reduce-scatter {where}", "reduce_scatter", "tp", act, phase, hide))
            for where in ("attn", "mlp"):  # re-gather of the saved local input for wgrad, under dgrad
                comms.append(Collective(f"tp all-gather {where} input (wgrad)", "all_gather", "tp", act, "bwd", "gemm"))
        else:
            for phase in ("fwd", "bwd"):
                for where in ("attn", "mlp"):
                    comms.append(Collective(f"tp all-reduce {where}", "all_reduce", "tp", act, phase, hide))
    if plan.cp > 1:
        if plan.cp_kind == "ring":
            # Each step passes this rank's K and V chunk to the next rank; backward passes K, V, dK, dV.
            kv_chunk = BF16 * t * 2 * kv
            steps = plan.cp - 1
            comms.append(Collective("cp ring kv", "send_recv", "cp", steps * kv_chunk, "fwd", "attention"))
            comms.append(Collective("cp ring kv+dkv", "send_recv", "cp", 2 * steps * kv_chunk, "bwd", "attention"))
        else:
            # Ulysses: all-to-all q, k, v before attention and the output after (sequence <-> heads).
            a2a = BF16 * t * (2 * q + 2 * kv)
            comms.append(Collective("cp all-to-all qkv/out", "all_to_all", "cp", a2a, "fwd"))
            comms.append(Collective("cp all-to-all qkv/out", "all_to_all", "cp", a2a, "bwd"))
    return comms


def embedding_group(model: ModelSpec, plan: Plan) -> OpGroup:
    t = plan.micro_batch * plan.seq_len // plan.cp
    t_sp = t / plan.tp if plan.sp else t
    out = BF16 * t_sp * model.hidden
    # Backward scatter-adds the incoming gradient into an fp32 embedding gradient.
    ops = [Op("embedding", "memory", bytes=2 * out, bwd_bytes=out + 2 * FP32 / BF16 * out)]
    comms = []
    if plan.tp > 1:  # vocab-parallel embedding: partial lookups are summed (reduce-scatter with SP)
        kind = "reduce_scatter" if plan.sp else "all_reduce"
        comms.append(Collective("tp embedding reduce", kind, "tp", BF16 * t * model.hidden, "fwd"))
    return OpGroup(tuple(ops), (), tuple(comms))


def head_group(model: ModelSpec, plan: Plan) -> OpGroup:
    """Final norm, output projection and cross-entropy (vocab-parallel over TP, logits upcast to fp32)."""
    t = plan.micro_batch * plan.seq_len // plan.cp
    t_sp = t / plan.tp if plan.sp else t
    v = model.vocab / plan.tp
    norm, stats = _norm("final norm", model, t_sp)
    logits = t * v
    ops = [
        norm,
        _gemm("output proj", t, int(v), model.hidden),
        # fwd: read bf16 logits, write fp32 copy, read it for max/logsumexp; bwd: softmax grad (fp32
        # read + write) and the cast of the gradient back to bf16.
        Op("cross-entropy", "memory", bytes=(BF16 + 2 * FP32) * logits, bwd_bytes=(3 * FP32 + BF16) * logits),
    ]
    saved = [
        Saved("final norm input", BF16 * t_sp * model.hidden, ALL),
        Saved(stats.name, stats.bytes, ALL),
        Saved("output proj input", BF16 * t_sp * model.hidden, ALL),
        Saved("fp32 logits (softmax)", FP32 * logits, ALL),
    ]
    comms = []
    if plan.tp > 1:
        if plan.sp:
            comms.append(Collective("tp all-gather head", "all_gather", "tp", BF16 * t * model.hidden, "fwd"))
            comms.append(Collective("tp reduce-scatter head", "reduce_scatter", "tp", BF16 * t * model.hidden, "bwd"))
        else:
            comms.append(Collective("tp all-reduce head", "all_reduce", "tp", BF16 * t * model.hidden, "bwd"))
        comms.append(Collective("tp loss all-reduce", "all_reduce", "tp", 3 * FP32 * t, "fwd"))
    return OpGroup(tuple(ops), tuple(saved), tuple(comms))


def build_stage_graph(model: ModelSpec, plan: Plan, arch: str = "hopper") -> StageGraph:
    t = plan.micro_batch * plan.seq_len // plan.cp
    t_sp = t / plan.tp if plan.sp else t
    return StageGraph(
        layer=layer_group(model, plan, arch),
        embedding=embedding_group(model, plan),
        head=head_group(model, plan),
        tokens=t,
        boundary_bytes=BF16 * t_sp * model.hidden,
    )
