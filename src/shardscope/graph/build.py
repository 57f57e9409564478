"""Build the op graph of a model for one micro-batch on one GPU: one OpGroup per distinct layer kind
(dense / MoE, full / window / chunk attention), the embedding (first stage) and the output layer +
loss (last stage).

Shapes after sharding (per GPU): T = micro_batch · seq_len / cp tokens enter a layer; TP splits heads,
KV heads and the FFN; with sequence parallel the norms, residual adds and saved layer inputs hold T/tp
tokens (Korthikanti et al. 2022, "Reducing Activation Recomputation", §4.2.2).

Recompute policies: "none" keeps every saved tensor; "selective" keeps GEMM and attention outputs and
recomputes the cheap ops (norms, rope, activations, residual adds) — PyTorch op-level selective
checkpointing as torchtitan uses it; "full" keeps only each layer's input.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

from shardscope.graph.attention import attention_group
from shardscope.graph.common import ALL, BF16, FP32, NOT_FULL, OpGroup, Shapes, gemm, norm, scoped
from shardscope.graph.dit import dit_block_group, dit_embedding_group, dit_head_group
from shardscope.graph.eager import as_the_stack_runs
from shardscope.graph.fp8 import quantization_bytes
from shardscope.graph.measured import reconcile, whole_block_group
from shardscope.graph.mlp import dense_mlp_group, moe_group
from shardscope.graph.ops import Collective, Op, Saved
from shardscope.graph.routing import RoutingLoad, routing_load
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan
from shardscope.records import evolve

__all__ = ["BF16", "FP32", "OpGroup", "StageGraph", "build_stage_graph", "layer_group"]


@dataclass(frozen=True, slots=True)
class StageGraph:
    layers: dict[LayerKind, OpGroup]  # one op group per distinct layer kind
    kinds: tuple[LayerKind, ...]  # the kind of each layer, in model order
    embedding: OpGroup
    head: OpGroup
    mtp: OpGroup  # an MTP module's own ops; its block is `layers[model.mtp_kind]`, its output layer `head`
    tokens: int  # tokens per micro-batch per GPU entering a layer (T)
    boundary_bytes: float  # activation sent between pipeline stages per micro-batch
    routing: RoutingLoad

    @property
    def layer(self) -> OpGroup:
        """The first layer's group (every layer of a uniform dense model)."""
        return self.layers[self.kinds[0]]


def layer_group(
    model: ModelSpec, plan: Plan, arch: str = "hopper", kind: LayerKind | None = None, load: float = 1.0
) -> OpGroup:
    """One transformer block of `kind` on one GPU for one micro-batch."""
    kind = kind or model.layer_kind(0)
    if kind.mlp == "measured":  # a block the standard fields do not describe (Mamba): priced as measured
        group, ai, ag = whole_block_group(model, plan, kind)
        mi = mg = 0.0
    elif kind.mlp.startswith("dit"):
        group, ai, ag = dit_block_group(model, plan, kind)
        mi = mg = 0.0
    else:
        attn, ai, ag = attention_group(model, plan, kind)
        mlp, mi, mg = moe_group(model, plan, load) if kind.mlp == "moe" else dense_mlp_group(model, plan)
        attn = evolve(attn, ops=tuple(scoped(attn.ops, "attn")))
        group = evolve(attn + mlp, attn_ops=len(attn.ops))
        if model.measured_blocks and kind.mlp == "dense":  # measured, no adapter: what the fields miss
            group = reconcile(group, model, plan, kind)
    group = as_the_stack_runs(group, plan, model.norm == "rmsnorm")
    if plan.precision == "fp8":
        fwd_b, bwd_b = quantization_bytes(plan, arch, ai + mi, ag + mg)
        # its kernels are launched per GEMM call (costs.host counts them there)
        casts = Op("fp8 casts", "memory", bytes=fwd_b, bwd_bytes=bwd_b, cheap=True, launches=0)
        group = group + OpGroup((casts,), (), ())
    return group


def embedding_group(model: ModelSpec, plan: Plan) -> OpGroup:
    sh = Shapes.of(plan)
    out = BF16 * sh.t_sp * model.hidden
    # Backward scatter-adds the incoming gradient into an fp32 embedding gradient.
    ops = [Op("embedding", "memory", bytes=2 * out, bwd_bytes=out + 2 * FP32 / BF16 * out)]
    comms = []
    if plan.tp > 1:  # vocab-parallel embedding: partial lookups are summed (reduce-scatter with SP)
        kind = "reduce_scatter" if plan.sp else "all_reduce"
        comms.append(Collective("tp embedding reduce", kind, "tp", BF16 * sh.t * model.hidden, "fwd"))
    return OpGroup(tuple(ops), (), tuple(comms))


# Bytes per logit (forward, backward) the loss kernels move. Unfused, ATen's log_softmax + nll_loss over an
# fp32 copy: forward the cast (read 2, write 4) and log_softmax, whose rows of a large vocabulary exceed a
# block's shared memory, so it reads them three times (max, sum, output) and writes once (16); backward
# nll's gradient (write 4), log_softmax's (read the gradient twice and the output once, write: 16) and the
# cast back (6). torch.compile's loss kernels (Inductor splits the reduction): measured 4 and 10 bytes'
# worth. A fused cross-entropy kernel: read the bf16 logits once forward; backward reads them and writes
# the bf16 gradient. Measured on one H100 at 8192 x 128256 (validation/loss_regions_h100.json): eager
# 8.9 ms forward, 11.2 backward (these counts give 8.1 and 9.6); compiled 1.5 and 3.7. Transformer Engine
# >= 2.18 (`Plan.fused_ce_fp32_grad`): forward reads the bf16 logits twice (an online-softmax pass, then the
# gradient pass) and writes the fp32 gradient; backward scales it by the per-token loss weights in place
# and autograd casts it to bf16. Megatron's vocab-parallel loss (`Plan.vocab_parallel_loss`), one kernel a
# step over the fp32 copy: forward the cast (read 2, write 4), max (4), subtract, exp and divide in place
# (8 each) and the sum (4); backward scales the softmax in place (8) and autograd casts it to bf16 (6).
# DTensor's loss_parallel (`Plan.loss_parallel`, TP > 1): forward the cast (6), amax (4), the shift (8),
# exp (8), its sum (4) and the log-softmax (8); backward zeros (4), exp (8), the sum (12), the product with
# the loss's gradient (8) and the cast to bf16 (6).
LOSS_BYTES = {
    "unfused": (BF16 + 5 * FP32, 6 * FP32 + BF16),
    "megatron": (BF16 + 9 * FP32, 3 * FP32 + BF16),
    "dtensor": (BF16 + 9 * FP32, BF16 + 9 * FP32),
    "compiled": (4.0, 10.0),
    "fused": (BF16, 2 * BF16),
    "fused, fp32 gradient": (2 * BF16 + FP32, 3 * FP32 + BF16),
}


# Bytes per logit a loss's backward allocates beside what it keeps (`loss_saved`), at its peak. Unfused,
# log_softmax's backward holds its incoming fp32 gradient (nll_loss's) and writes an fp32 one beside the
# kept output (measured against PyTorch; the bf16 cast for the output GEMM comes after those two are
# freed). Megatron's turns the kept softmax into the gradient in place; autograd's bf16 cast of it is new
# (measured against Megatron-Core). DTensor's loss_parallel holds its zeros-built gradient, exp(log-softmax)
# and their sum at once, then their product (measured against PyTorch). The fused kernels write, or cast to,
# one bf16 gradient.
LOSS_BACKWARD_BYTES = {
    "unfused": 2 * FP32,
    "megatron": BF16,
    "dtensor": 3 * FP32,
    "compiled": BF16,
    "fused": BF16,
    "fused, fp32 gradient": BF16,
}


def loss_kind(plan: Plan) -> str:
    if plan.fused_cross_entropy:
        return "fused, fp32 gradient" if plan.fused_ce_fp32_grad else "fused"
    if plan.compiled_loss:
        return "compiled"
    if plan.vocab_parallel_loss:
        return "megatron"
    return "dtensor" if plan.loss_parallel and plan.tp > 1 else "unfused"


def loss_saved(kind: str, logits: float, tokens: int) -> list[Saved]:
    """What a loss of `kind` (`loss_kind`) keeps for its backward."""
    if kind in ("unfused", "megatron", "dtensor"):
        return [Saved("fp32 logits (softmax)", FP32 * logits, ALL)]
    if kind == "fused, fp32 gradient":
        return [Saved("fp32 logit gradient", FP32 * logits, ALL)]
    return [Saved("bf16 logits", BF16 * logits, ALL), Saved("log-sum-exp", FP32 * tokens, ALL)]


def loss_logits(model: ModelSpec, plan: Plan, tokens: float) -> float:
    """Logits one GPU's loss runs over: its vocabulary shard, or the whole vocabulary where the loss gathers
    the TP-sharded logits first (`Plan.loss_full_vocab`)."""
    return tokens * model.vocab / (1 if plan.loss_full_vocab else plan.tp)


def loss_op(plan: Plan, logits: float) -> Op:
    kind = loss_kind(plan)
    fwd, bwd = LOSS_BYTES[kind]
    return Op("cross-entropy", "memory", bytes=fwd * logits, bwd_bytes=bwd * logits)


def head_group(model: ModelSpec, plan: Plan) -> OpGroup:
    """Final norm, output projection and cross-entropy (vocab-parallel over TP): unfused, the logits are
    upcast to fp32 and the fp32 copy kept for the softmax gradient; a fused kernel keeps the bf16 logits
    and the fp32 log-sum-exp (`Plan.fused_cross_entropy`), or the fp32 gradient it wrote (`loss_saved`)."""
    sh = Shapes.of(plan)
    t, t_sp = sh.t, sh.t_sp
    v = model.vocab / plan.tp
    fnorm, stats = norm("final norm", model, t_sp)
    logits = loss_logits(model, plan, t)
    ops = [
        fnorm,
        gemm("output proj", t, int(v), model.hidden),
        loss_op(plan, logits),
    ]
    saved = [
        Saved("final norm input", BF16 * t_sp * model.hidden, ALL),
        Saved(stats.name, stats.bytes, ALL),
        Saved("output proj input", BF16 * t_sp * model.hidden, ALL),
        *loss_saved(loss_kind(plan), logits, t),
    ]
    comms = []
    act = BF16 * t * model.hidden
    if plan.tp > 1:
        if plan.sp:
            comms.append(Collective("tp all-gather head", "all_gather", "tp", act, "fwd"))
            comms.append(Collective("tp reduce-scatter head", "reduce_scatter", "tp", act, "bwd"))
        else:
            comms.append(Collective("tp all-reduce head", "all_reduce", "tp", act, "bwd"))
        if plan.loss_full_vocab:  # the fp32 logits gathered; the gradient's shard is sliced back, no collective
            comms.append(Collective("tp logits all-gather", "all_gather", "tp", FP32 * logits, "fwd"))
        else:
            comms.append(Collective("tp loss all-reduce", "all_reduce", "tp", 3 * FP32 * t, "fwd"))
    return OpGroup(tuple(ops), tuple(saved), tuple(comms))


def mtp_group(model: ModelSpec, plan: Plan) -> OpGroup:
    """An MTP module's own ops (DeepSeek-V3 §2.2): the next token's embedding lookup, RMSNorm of it and of
    the main model's hidden state, and the 2h→h projection of their concatenation (TP column-parallel)."""
    sh = Shapes.of(plan)
    h = model.hidden
    lookup = BF16 * sh.t_sp * h
    enorm, estats = norm("mtp embedding norm", model, sh.t_sp)
    hnorm, hstats = norm("mtp hidden norm", model, sh.t_sp)
    ops = (
        Op("mtp embedding", "memory", bytes=2 * lookup, bwd_bytes=lookup + 2 * FP32 / BF16 * lookup),
        enorm,
        hnorm,
        gemm("mtp projection", sh.t, h // plan.tp, 2 * h, fp8=sh.fp8),
    )
    saved = (
        Saved("mtp norm inputs", 2 * BF16 * sh.t_sp * h, ALL),
        estats,
        hstats,
        Saved("mtp projection input", sh.gemm_in * sh.t * 2 * h, NOT_FULL),
    )
    return OpGroup(ops, saved, ())


# The plan fields the op graph reads (declared with `graph=True` in `Plan`): plans that differ only
# elsewhere (pipeline, data parallel, sharding, recompute, batch accumulation) share one graph, which the
# planner exploits.
GRAPH_FIELDS = tuple(f.name for f in fields(Plan) if f.metadata.get("graph"))
_GRAPH_CACHE: dict[tuple, StageGraph] = {}
_graph_fields = attrgetter(*GRAPH_FIELDS)


def build_stage_graph(model: ModelSpec, plan: Plan, arch: str = "hopper") -> StageGraph:
    key = (model, arch, _graph_fields(plan))
    graph = _GRAPH_CACHE.get(key)
    if graph is None:
        if len(_GRAPH_CACHE) > 4096:
            _GRAPH_CACHE.clear()
        graph = _GRAPH_CACHE[key] = _build_stage_graph(model, plan, arch)
    return graph


def _build_stage_graph(model: ModelSpec, plan: Plan, arch: str) -> StageGraph:
    sh = Shapes.of(plan)
    routing = routing_load(model, plan)
    kinds = model.layer_kinds()
    blocks = kinds + ((model.mtp_kind,) if model.mtp_layers else ())  # an MTP module adds a block of its kind
    layers = {k: layer_group(model, plan, arch, k, routing.hot_rank_factor) for k in dict.fromkeys(blocks)}
    rms = model.norm == "rmsnorm"
    return StageGraph(
        layers=layers,
        kinds=kinds,
        embedding=dit_embedding_group(model, plan) if model.dit else embedding_group(model, plan),
        head=dit_head_group(model, plan) if model.dit else as_the_stack_runs(head_group(model, plan), plan, rms),
        mtp=mtp_group(model, plan),
        tokens=sh.t,
        boundary_bytes=BF16 * sh.t_sp * model.hidden,
        routing=routing,
    )
