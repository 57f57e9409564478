"""Per-GPU memory: model state (weights, grads, optimizer), activations and transient buffers.

Model state per parameter (mixed precision with Adam; Rajbhandari et al. 2020, ZeRO §3):
  Megatron-style DDP / ZeRO (`fsdp=False`): bf16 weights (2 B), fp32 gradient buffer (4 B, the
  `main_grad` that backward accumulates into), fp32 master weights + Adam m, v (12 B). ZeRO-1 shards
  the 12 B, ZeRO-2 also the grads, ZeRO-3 also the weights, over the shard group. Megatron's
  precision-aware optimizer keeps m, v in bf16 (2 + 2 B; 8 B of state, "6 + 12/d to 6 + 8/d bytes" per
  parameter in the Megatron-Core MoE report §4.1.6) and the gradient buffer in bf16 (2 B).
  PyTorch FSDP (`fsdp=True`): the sharded fp32 parameters are the master weights (4 B), fp32 sharded
  grads (4 B), Adam m, v (8 B), all over the shard group; bf16 copies of whole layers exist only while
  gathered (buffers).
Dense parameters shard over the data-parallel ranks (dp·cp, or the HSDP shard group); routed experts,
split over ep·etp ranks, shard their state over the expert-data-parallel ranks tp·cp·dp/(ep·etp)
(Megatron MoE parallel folding).

Activations: the in-flight micro-batches of the stage (1F1B holds pp - stage of them; the interleaved
schedule holds (pp - 1)·2 + (vpp - 1)·pp + 1 model chunks on the first rank, Narayanan et al. 2021)
times the saved bytes of their layers under the recompute policy, plus one layer's backward working set.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from shardscope.graph.build import BF16, FP32, LOSS_BACKWARD_BYTES, OpGroup, StageGraph, loss_kind, loss_logits
from shardscope.graph.common import alternate_mm_share
from shardscope.graph.fp8 import weight_copy_bytes_per_param
from shardscope.memo import MemoTable
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan

GIB = 2**30
# Values derived from one op graph (or a graph on a cluster), keyed by the plan fields outside the graph
# that they read: the graph is built for one model and fixes every plan field it reads. Up to 1,024 graphs
# and graphs on a cluster are kept (then the table starts afresh): enough for a search's neighbouring
# structures (DeepSeek-V3's search comes back to ~290 of them with each pipeline degree: four micro-batches,
# nine EP degrees, four MoE dispatcher variants; at 256 it recomputed their costs each time, 6% of the
# search), and it bounds the memory a search adds (~50 MB more than at 256 there).
GRAPH_MEMO = MemoTable(limit=1024)
# ... and from one cluster (the same object across the estimates of a process: `make_cluster` keeps them)
CLUSTER_MEMO = MemoTable(limit=1024)
# Outside torch's allocated count: CUDA context + cuBLAS workspaces (~0.6 GiB on Hopper, nvidia-smi of
# an idle PyTorch process) and NCCL channel buffers (~0.4 GiB for a few communicators).
CONTEXT_BYTES = 1.0 * GIB
# Caching-allocator fragmentation of the dynamic (activation/buffer) part: block rounding and splits
# typically leave reserved 3-10% above allocated; 5% is used.
FRAGMENTATION = 0.05


def layer_params_local(model: ModelSpec, tp: int, kind: LayerKind | None = None, ep: int = 1, etp: int = 1) -> float:
    """Parameters of one block on one GPU: TP-split weights / tp + replicated norms and row-parallel
    biases; routed experts / (ep·etp) (see `expert_params_local` for that part alone)."""
    kind = kind or model.layer_kind(0)
    return dense_params_local(model, tp, kind) + expert_params_local(model, kind, ep, etp)


def dense_params_local(model: ModelSpec, tp: int, kind: LayerKind) -> float:
    """Parameters of one block on one GPU besides its routed experts: the TP-split part / tp plus what every
    TP rank holds whole (norms, row-parallel output biases, MLA down-projections, the router)."""
    if kind.mlp == "measured":  # a block priced from its measurement: not split over TP or EP (graph.measured)
        return float(model.layer_params_of(kind))
    if kind.mlp.startswith("dit"):
        replicated = model.dit_block_replicated_params(kind)
        return (model.dit_block_params(kind) - replicated) / tp + replicated
    h = model.hidden
    replicated = 2 * model.norm_params + model.extra_layer_params  # a measured block's other norms
    if model.mla:
        a = model.mla
        down = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        if a.q_lora_rank:
            down += h * a.q_lora_rank + a.q_lora_rank
        replicated += down  # down-projections are replicated across TP ranks
        sharded = model.attention_params - down
    else:
        q, kv = model.heads * model.head_dim, model.kv_dim
        sharded = h * (q + 2 * kv) + q * h + (q + 2 * kv if model.qkv_bias else 0) + (model.heads if model.sinks else 0)
        replicated += (h if model.out_bias else 0) + (2 * model.head_dim if model.qk_norm else 0)
    if kind.mlp == "moe":
        replicated += model.router_params
        sharded += model.shared_expert_params
    else:
        mats = 3 if model.mlp == "swiglu" else 2
        sharded += mats * h * model.ffn_hidden
        if model.mlp_bias:
            sharded += (mats - 1) * model.ffn_hidden
            replicated += h
    return sharded / tp + replicated


def expert_params_local(model: ModelSpec, kind: LayerKind, ep: int, etp: int) -> float:
    if kind.mlp != "moe" or model.moe is None:
        return 0.0
    return model.moe.experts * model.expert_params / (ep * etp)


def rank_params_local(model: ModelSpec, plan: Plan, rank: int) -> tuple[float, float]:
    """(dense, expert) parameters on one GPU of pipeline rank `rank` (TP/EP-split, before ZeRO/FSDP)."""
    key = ("rank_params", rank, rank_params_fields(plan))
    return model.memoised(key, lambda: _rank_params_local(model, plan, rank))


# The plan fields `_rank_params_local` reads (and `_rank_layer_params`)
rank_params_fields = attrgetter("tp", "ep", "etp", "pp", "vpp", "pp_layout", "mtp", "mtp_chunk")


def end_params_local(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(embedding, output head) parameters on one GPU of the first and of the last pipeline rank. A video DiT
    has no vocabulary: its embedders (patch, time, text; plain modules every TP rank holds whole) and its
    output head (modulation, projection to patches). An LLM's embedding holds a measured model's parameters
    outside the blocks too (embedding norm); a tied output layer on a separate last stage keeps its own copy
    of the embedding."""
    if model.dit is not None:
        return model.dit_embedder_params(), model.dit_head_params()
    vocab_rows = model.vocab * model.hidden / plan.tp
    embedding = vocab_rows + model.pos_embedding_rows * model.hidden + model.extra_params
    head = model.norm_params + (vocab_rows if not model.tied_embeddings or plan.pp > 1 else 0.0)
    return embedding, head


def _rank_params_local(model: ModelSpec, plan: Plan, rank: int) -> tuple[float, float]:
    counts = model.kind_counts(plan.rank_layers(model.layers)[rank])
    dense = sum(n * dense_params_local(model, plan.tp, k) for k, n in counts.items())
    expert = sum(n * expert_params_local(model, k, plan.ep, plan.etp) for k, n in counts.items())
    embedding, head = end_params_local(model, plan)
    if rank == 0:
        dense += embedding
    if rank == plan.pp - 1:
        dense += head
    if model.dit is None and rank == plan.mtp_rank and plan.mtp and model.mtp_layers:
        mtp_dense, mtp_expert = mtp_params_local(model, plan)
        dense += mtp_dense + (model.vocab * model.hidden / plan.tp if rank > 0 else 0.0)
        expert += mtp_expert
    return dense, expert


def mtp_params_local(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(dense, expert) parameters of the MTP modules on one GPU of their pipeline rank: three norms, the
    2h→h projection (TP-split) and a block whose routed experts split over EP like any MoE layer's. The
    embedding they look up is shared with the main model, but a rank other than the first keeps a copy,
    as Megatron-Core's MTP stage does (`rank_params_local` adds it)."""
    kind = model.mtp_kind
    dense = 3 * model.norm_params + 2 * model.hidden * model.hidden / plan.tp + dense_params_local(model, plan.tp, kind)
    return model.mtp_layers * dense, model.mtp_layers * expert_params_local(model, kind, plan.ep, plan.etp)


def mtp_heads(model: ModelSpec, plan: Plan) -> int:
    """Output layers + cross-entropies the loss chunk runs per micro-batch beyond the main one: one per
    trained MTP module (Megatron-Core's `process_mtp_loss` runs them all where the loss is)."""
    return model.mtp_layers if plan.mtp else 0


def mtp_saved_bytes(model: ModelSpec, plan: Plan, graph: StageGraph) -> float:
    """Activations one micro-batch's MTP modules save on their rank: their own ops and their block under
    the plan's recompute (their output layers save with the loss's)."""
    if not (plan.mtp and model.mtp_layers):
        return 0.0
    policy = plan.recompute, plan.recompute_modules
    per = graph.mtp.saved_bytes(*policy) + graph.layers[model.mtp_kind].saved_bytes(*policy)
    return model.mtp_layers * per


def chunk_inflight(plan: Plan, stage: int, virtual: int) -> int:
    """Micro-batches whose activations of virtual chunk `virtual` of rank `stage` are alive at the peak
    (interleaved 1F1B: the warm-up forwards run `pp` micro-batches per chunk in turn, then one more)."""
    total = inflight_chunks(plan, stage)
    if plan.vpp == 1:
        return total
    return sum(1 for k in range(total) if (k // plan.pp) % plan.vpp == virtual)


def stage_params_local(model: ModelSpec, plan: Plan, stage: int) -> float:
    return sum(rank_params_local(model, plan, stage))


@dataclass(frozen=True, slots=True)
class StateBytes:
    params: float
    grads: float
    optimizer: float


def model_state_bytes(n_params: float, plan: Plan, shard: int | None = None) -> StateBytes:
    """Weights, gradients and optimizer state of `n_params` parameters sharded over `shard` ranks."""
    shard = plan.shard_size if shard is None else shard
    z = plan.zero
    # FP8 parameters: the FP8 weights are the parameters (sharded here under ZeRO-3, else counted with the
    # step's FP8 weight copies in `buffer_bytes`); no BF16 copy exists
    weight_bytes = (1 if z >= 3 else 0) if plan.fp8_params else 2
    if plan.offload_optimizer:  # the weights and a bf16 gradient buffer stay; the rest lives on the host
        sharded_weights = plan.fsdp or z >= 3
        weights = (1 if plan.fp8_params else 2) / shard if sharded_weights else weight_bytes
        return StateBytes(weights * n_params, 2 * n_params / (shard if (plan.fsdp or z >= 2) else 1), 0.0)
    moments = 2 * plan.moment_bytes
    if plan.fsdp:  # FSDP2 keeps gradients in the sharded fp32 parameters' dtype
        return StateBytes(4 * n_params / shard, 4 * n_params / shard, moments * n_params / shard)
    return StateBytes(
        params=weight_bytes * n_params / (shard if z >= 3 else 1),
        grads=plan.main_grad_bytes * n_params / (shard if z >= 2 else 1),
        optimizer=(4 + moments) * n_params / (shard if z >= 1 else 1),
    )


def rank_state_bytes(model: ModelSpec, plan: Plan, rank: int) -> StateBytes:
    dense, expert = rank_params_local(model, plan, rank)
    d = model_state_bytes(dense, plan)
    e = model_state_bytes(expert, plan, plan.expert_shard_size)
    return StateBytes(d.params + e.params, d.grads + e.grads, d.optimizer + e.optimizer)


def inflight_chunks(plan: Plan, stage: int) -> int:
    """Model chunks whose activations are alive at once on pipeline rank `stage`."""
    m = plan.grad_accum
    if plan.pp == 1:
        return 1
    if plan.vpp == 1:
        return min(plan.pp - stage, m)
    return min((plan.pp - stage - 1) * 2 + (plan.vpp - 1) * plan.pp + 1, m * plan.vpp)


def layers_saved_bytes(model: ModelSpec, plan: Plan, graph: StageGraph, layers: tuple[int, ...], full: int) -> float:
    """Activations one micro-batch saves in `layers` when the first `full` of them run under full
    recompute and the rest under the plan's policy ("none" for the rest of a partially recomputed stage)."""
    rest = "none" if plan.recompute == "full" else plan.recompute
    total = sum(n * graph.layers[k].saved_bytes("full") for k, n in model.kind_counts(layers[:full]).items())
    return total + sum(
        n * kept_bytes(model, plan, graph.layers[k], rest) for k, n in model.kind_counts(layers[full:]).items()
    )


def kept_bytes(model: ModelSpec, plan: Plan, unit: OpGroup, policy: str) -> float:
    """What one layer keeps for backward under `policy` (with the plan's Megatron recompute modules). Op-level
    selective checkpointing that also re-runs every second matmul (torchtitan's, `recompute_alternate_mm`)
    keeps none of those matmuls' outputs, nor what is rebuilt from them (`Saved.gemm`)."""
    kept = unit.saved_bytes(policy, plan.recompute_modules)
    if policy == "selective" and plan.recompute_alternate_mm and not plan.recompute_modules:
        share = alternate_mm_share(model, plan, unit)
        kept -= sum(s.bytes * share.get(s.gemm, 0.0) for s in unit.saved if s.gemm and "selective" in s.policies)
    return kept


def activation_bytes(
    model: ModelSpec, plan: Plan, graph: StageGraph, stage: int, memo: dict | None = None, saved: tuple | None = None
) -> tuple[float, float, int]:
    """(saved activations at the peak, backward working set, in-flight chunks) on pipeline rank `stage`.
    What the rank saves per micro-batch (`_saved_parts`) is memoised per graph on the plan fields it reads
    (`_saved_fields`), so plans that differ only in data parallelism, sharding or global batch share it;
    the micro-batches in flight are counted each time. `memo` and `saved`: the graph's memo
    (`GRAPH_MEMO.of(graph)`) and `saved_fields(plan)`, where the caller asks for several ranks."""
    key = ("saved", stage, _saved_fields(plan) if saved is None else saved)
    if memo is None:
        memo = GRAPH_MEMO.of(graph)
    parts = memo.get(key)
    if parts is None:
        parts = memo[key] = _saved_parts(model, plan, graph, stage)
    return _activation_bytes(plan, stage, parts)


def _activation_bytes(plan: Plan, stage: int, parts: tuple) -> tuple[float, float, int]:
    """`activation_bytes` from what the rank saves per micro-batch (`_saved_parts`)."""
    chunk_layers, per_layer_mean, embedding, head, mtp, workspace = parts
    chunks = inflight_chunks(plan, stage)
    saved = chunks * chunk_layers * per_layer_mean * (1 - plan.offload_activations)
    if embedding is not None:
        saved += embedding * chunks
    if head is not None:
        saved += head
    if mtp is not None:
        chunk = plan.mtp_chunk_index
        alive = 1 if chunk == plan.pp * plan.vpp - 1 else chunk_inflight(plan, stage, chunk // plan.pp)
        saved += alive * mtp
    return saved, workspace, chunks


# The plan fields `_saved_parts` reads (the op graph, built for one model, fixes the rest of what it reads)
_saved_fields = attrgetter("pp", "vpp", "pp_layout", "recompute", "recompute_layers", "recompute_modules", "mtp",
                           "mtp_chunk", "tp", "recompute_alternate_mm")  # fmt: skip
saved_fields = _saved_fields  # (for a caller that builds `activation_bytes`' key once for several ranks)


def _saved_parts(
    model: ModelSpec, plan: Plan, graph: StageGraph, stage: int
) -> tuple[float, float, float | None, float | None, float | None, float]:
    """What `stage` saves per micro-batch: (layers per chunk, mean saved bytes per layer, saved bytes of the
    embedding, of the head and the MTP output layers, of the MTP modules (None where the rank holds none),
    backward working set)."""
    layers = plan.rank_layers(model.layers)[stage]
    if not layers:
        per_layer_mean, worst_ws = 0.0, 0.0
    else:
        full = plan.recomputed_layers(len(layers))
        per_layer_mean = layers_saved_bytes(model, plan, graph, layers, full) / len(layers)
        # Backward of one layer: a recomputed layer re-materialises its "none" activations; every
        # layer's backward holds the gradients of its largest intermediates.
        worst_ws = 0.0
        for kind in model.kind_counts(layers):
            g = graph.layers[kind]
            kept = kept_bytes(model, plan, g, plan.recompute)
            worst_ws = max(worst_ws, g.saved_bytes("none") - kept if plan.recompute != "none" else 0.0)
    chunk_layers = len(layers) / plan.vpp
    embedding = graph.embedding.saved_bytes(plan.recompute) if stage == 0 else None
    # the last stage runs each micro-batch's backward at once
    head = (1 + mtp_heads(model, plan)) * graph.head.saved_bytes(plan.recompute) if stage == plan.pp - 1 else None
    mtp = mtp_saved_bytes(model, plan, graph) if stage == plan.mtp_rank else None
    ffn = max(model.ffn_hidden, model.moe.expert_ffn * model.moe.top_k if model.moe else 0)
    grad_ws = BF16 * graph.tokens * (2 * ffn / plan.tp + model.hidden)
    return chunk_layers, per_layer_mean, embedding, head, mtp, worst_ws + grad_ws


def _rank_layer_params(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, float]:
    """(parameters of the largest layer, of all the layers and MTP modules) on one GPU of pipeline rank
    `stage`, memoised on the model by the plan fields they read (as `rank_params_local`)."""

    def params() -> tuple[float, float]:
        counts = model.kind_counts(plan.rank_layers(model.layers)[stage])
        per_kind = {k: layer_params_local(model, plan.tp, k, plan.ep, plan.etp) for k in counts}
        biggest = max(per_kind.values(), default=0.0)
        gathered = sum(n * per_kind[k] for k, n in counts.items())
        if stage == plan.mtp_rank:
            gathered += sum(mtp_params_local(model, plan)) if plan.mtp else 0.0
        return biggest, gathered

    return model.memoised(("rank_layer_params", stage, rank_params_fields(plan)), params)


def buffer_bytes(model: ModelSpec, plan: Plan, graph: StageGraph, stage: int, arch: str = "hopper") -> float:
    """Transient buffers alive at the peak besides activations (and the step-long FP8 weight copies)."""
    buf = 0.0
    biggest, gathered = _rank_layer_params(model, plan, stage)
    copy = weight_copy_bytes_per_param(plan, arch) if plan.precision == "fp8" else 0.0
    # PyTorch FSDP gathers into and reduces out of buffers over a shard group of one GPU too (`costs.fsdp`)
    sharded = plan.fsdp or (plan.zero == 3 and plan.shard_size > 1)
    gather = copy if plan.fp8_params else BF16
    in_layer = at_loss = 0.0  # the two moments the peak can fall on (a layer's backward, the loss's)
    deferred = plan.deferred_grad_sync
    if sharded:
        stage_params = stage_params_local(model, plan, stage)
        # Gathered weights (bf16, or the FP8 copies themselves with FP8 parameters): resharded after
        # forward, the layer computing and those prefetched; else the stage's all, gathered once a step.
        if plan.reshard_after_forward:
            gathered = (1 + plan.fsdp_prefetch) * biggest
            in_layer = gather * gathered
        else:
            buf += gather * stage_params
        # Unsharded fp32 gradients: a layer's, reduce-scattered after its backward; with the reduction
        # deferred to the step's last backward, the stage's all, from its first backward on.
        if deferred:
            buf += FP32 * stage_params
        else:
            in_layer += FP32 * biggest
    if copy and not (sharded and plan.fp8_params):
        buf += copy * gathered
    if stage == plan.pp - 1:
        # Loss backward: the gradient buffers of its kind beside what it keeps (`LOSS_BACKWARD_BYTES`).
        # Under FSDP the last layer is still gathered (torchtitan and FSDP2 keep it for the backward that
        # follows), and so is the output layer; once its backward has consumed the logits' gradient, its
        # bf16 weight gradient is copied into the fp32 reduce buffer.
        logits = loss_logits(model, plan, graph.tokens)
        at_loss = LOSS_BACKWARD_BYTES[loss_kind(plan)] * logits
        if plan.fsdp:  # (ZeRO-3 reduces its gradients in buckets, not an FSDP unit at a time)
            head = end_params_local(model, plan)[1]
            kept = gather * (biggest + head) if plan.reshard_after_forward else 0.0  # (else counted above)
            at_loss = kept + max(at_loss, (BF16 + (0 if deferred else FP32)) * head)
    buf += max(in_layer, at_loss)
    if plan.pp > 1:
        buf += 2 * 2 * graph.boundary_bytes  # send/recv buffers, forward and backward
    return buf
