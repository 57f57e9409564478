"""The step costs both engines read: per layer, per pipeline stage and per micro-batch, from the op
graph's costs; data-parallel communication, the optimizer, memory per rank and the typed result.

The analytic engine (`analytic.step`) sums them in closed form; the simulator (`sim.step`) orders them in
time over per-rank streams.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter

from shardscope.costs.comm import GroupPlacement, collective_time_s, place_group
from shardscope.costs.compute import gemm_library, gemm_passes, gemm_time_s, group_times_s, memory_time_s
from shardscope.costs.efficiency import EP_OVERLAP_FRACTION, overlap_slowdown
from shardscope.costs.fsdp import fsdp_copy_times_s
from shardscope.costs.host import host_stall_s, moe_graphed
from shardscope.costs.memory import (
    CLUSTER_MEMO,
    CONTEXT_BYTES,
    FRAGMENTATION,
    GIB,
    GRAPH_MEMO,
    StateBytes,
    activation_bytes,
    buffer_bytes,
    dense_params_local,
    end_params_local,
    expert_params_local,
    layers_saved_bytes,
    mtp_heads,
    rank_params_fields,
    rank_params_local,
    rank_state_bytes,
    saved_fields,
)
from shardscope.costs.offload import cpu_optimizer_time_s, host_bytes_per_gpu, link_time_s
from shardscope.graph.build import BF16, FP32, OpGroup, StageGraph, build_stage_graph
from shardscope.graph.common import alternate_mm_share
from shardscope.graph.ops import Collective
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import SECTIONS, Plan, section_fields
from shardscope.result import Estimate, MemoryBreakdown, ParamCounts, TimeBreakdown
from shardscope.step.caveats import GRAPH_MEMORY_WARNING, eager_moe_warning

GRAD_REDUCE_BYTES = FP32  # gradients are reduced in fp32 (Megatron bf16 default, FSDP reduce_dtype fp32)
# The plan's fields in declaration order, read in one call (the result's `plan` record, once built from
# `fields()` on every estimate)
PLAN_FIELDS = tuple(f.name for f in fields(Plan))
_plan_values = attrgetter(*PLAN_FIELDS)
# Every plan field but the global batch, which `pipeline_costs` reads only through `_unpaired_key`
_BUT_GLOBAL_BATCH = attrgetter(*(name for name in PLAN_FIELDS if name != "global_batch"))
# The fields of every plan section but recompute and batch, which a rank's model state and buffers do not
# read (`ranks_memory`): a memo key that cannot forget a field of the others
_BUT_RECOMPUTE_AND_BATCH = attrgetter(
    *(name for section in SECTIONS if section not in ("recompute", "batch") for name in section_fields(section))
)


# The recompute section's values in declaration order (`section_values(plan, "recompute")`, in one call)
_RECOMPUTE_SECTION = attrgetter(*section_fields("recompute"))


@dataclass(frozen=True, slots=True)
class Groups:
    tp: GroupPlacement
    cp: GroupPlacement
    dp: GroupPlacement  # data-parallel gradient group: dp·cp ranks (CP ranks hold the same weights)
    pp: GroupPlacement
    shard: GroupPlacement
    replicate: GroupPlacement
    ep: GroupPlacement
    etp: GroupPlacement
    edp: GroupPlacement


def place_groups(cluster: Cluster, plan: Plan) -> Groups:
    """Megatron rank order tp-cp-dp-pp (experts: etp-ep-edp): each group's stride is the product of the
    inner sizes."""
    return _placed(cluster, _degrees(plan))


def _degrees(plan: Plan) -> tuple[int, ...]:
    """The group sizes `_place_groups` places, in its argument order."""
    return plan.tp, plan.cp, plan.dp, plan.pp, plan.shard_size, plan.ep, plan.etp, plan.expert_dp


def _placed(cluster: Cluster, degrees: tuple[int, ...]) -> Groups:
    """`_place_groups` of `degrees` (`_degrees`), memoised on the cluster."""
    memo = CLUSTER_MEMO.of(cluster)  # plans that differ elsewhere share the placement
    groups = memo.get(degrees)
    if groups is None:
        groups = memo[degrees] = _place_groups(cluster, *degrees)
    return groups


def _place_groups(
    cluster: Cluster, tp: int, cp: int, dp: int, pp: int, shard: int, ep: int, etp: int, expert_dp: int
) -> Groups:
    inner = tp
    return Groups(
        tp=place_group(cluster, tp, 1),
        cp=place_group(cluster, cp, inner),
        dp=place_group(cluster, dp * cp, inner),
        pp=place_group(cluster, pp, tp * cp * dp),
        shard=place_group(cluster, shard, inner),
        replicate=place_group(cluster, dp * cp // shard, inner * shard),
        ep=place_group(cluster, ep, etp),
        etp=place_group(cluster, etp, 1),
        edp=place_group(cluster, expert_dp, ep * etp),
    )


@dataclass(slots=True)
class PhaseCost:
    """Compute and exposed communication of one unit (layer/embedding/head) in one phase."""

    compute_s: float = 0.0
    exposed_s: float = 0.0
    hidden_s: float = 0.0  # communication that ran under compute (slows that compute)
    gemm_s: float = 0.0
    attention_s: float = 0.0
    attn_block_s: float = 0.0  # compute of a layer's attention half (OpGroup.attn_ops)
    host_stall_s: float = 0.0  # part of compute_s the GPU waits for the host to issue work (costs.host)
    # each collective of the phase and its exposed part of exposed_s (where it runs: costs.host)
    comms: list[tuple[Collective, float]] = field(default_factory=list)
    paired_hidden_s: float = 0.0  # part of hidden_s under the other micro-batch's blocks (combined 1F1B)


def _compute_cost(cluster: Cluster, plan: Plan, unit: OpGroup, backward: bool) -> PhaseCost:
    """The compute half of a phase cost, on the GPU (communication is added by `_add_comms`, then the
    wait for the host by `_add_host_stall`)."""
    times = group_times_s(cluster.gpu, unit, plan)[backward]
    gemm = sum(t for op, t in zip(unit.ops, times, strict=True) if op.kind == "gemm")
    attention = sum(t for op, t in zip(unit.ops, times, strict=True) if op.kind == "attention")
    return PhaseCost(sum(times), 0.0, 0.0, gemm, attention, sum(times[: unit.attn_ops]))


def _add_host_stall(cluster: Cluster, plan: Plan, unit: OpGroup, backward: bool, cost: PhaseCost) -> PhaseCost:
    """Add the time the GPU waits for the host to issue the phase's work (`costs.host`) to its compute."""
    times = group_times_s(cluster.gpu, unit, plan)[backward]
    cost.host_stall_s = host_stall_s(unit.ops, times, backward, plan, cost.comms)
    cost.compute_s += cost.host_stall_s
    return cost


def _block_times(fwd: PhaseCost, bwd: PhaseCost) -> dict[str, float]:
    """Compute time of the attention and MLP halves of a layer, forward and backward: the blocks another
    micro-batch's all-to-alls hide under in the combined-1F1B schedule."""
    return {
        "fwd_attn": fwd.attn_block_s,
        "fwd_mlp": fwd.compute_s - fwd.attn_block_s,
        "bwd_attn": bwd.attn_block_s,
        "bwd_mlp": bwd.compute_s - bwd.attn_block_s,
    }


def paired_share(plan: Plan) -> float:
    """Share of a rank's forward (and backward) chunk runs that Megatron-Core's combined-1F1B schedule
    pairs with the other direction: all but its warm-up forwards and cool-down backwards. Without a
    pipeline one forward runs alone first and one backward last; an interleaved pipeline warms up with
    (pp - r - 1)·2 + (vpp - 1)·pp chunk forwards on rank r (taken at the mean rank) of m·vpp."""
    m = plan.grad_accum
    if plan.pp == 1:
        return (m - 1) / m
    warmup = (plan.pp - 1) + (plan.vpp - 1) * plan.pp
    return max(0.0, 1 - warmup / (m * plan.vpp))


def _add_comms(
    cluster: Cluster,
    plan: Plan,
    groups: Groups,
    unit: OpGroup,
    phase: str,
    cost: PhaseCost,
    blocks: dict[str, float],
) -> PhaseCost:
    """Add the unit's collectives of `phase` to `cost`: each hides under what its `hidden_by` names (this
    phase's compute, or one of the other micro-batch's `blocks`) as far as that budget lasts, a TP
    collective split with one GEMM (`gemm_op`) under that GEMM's time alone; an all-to-all paired with
    another micro-batch's block hides only `EP_OVERLAP_FRACTION` of its time (and only in a micro-batch
    that has a partner: `paired_share`)."""
    budget = {"attention": cost.attention_s, "gemm": cost.gemm_s, "compute": cost.compute_s, **blocks}
    per_gemm: dict[str, float] | None = None
    for c in unit.comms:
        if c.phase != phase:
            continue
        t = collective_time_s(cluster, c.kind, c.bytes, getattr(groups, c.group), c.fanout)
        hidden = 0.0
        if c.hidden_by:
            paired = c.hidden_by in blocks
            hidden = min((EP_OVERLAP_FRACTION if paired else 1.0) * t, budget[c.hidden_by])
            if c.gemm_op and c.hidden_by == "gemm":
                if per_gemm is None:
                    per_gemm = _gemm_times(cluster, plan, unit, phase == "bwd")
                # backward: an all-gather feeds (or runs beside) its GEMM's dgrad, a reduce-scatter the rest
                key = (c.gemm_op, "dgrad" if c.kind == "all_gather" else "wgrad") if phase == "bwd" else c.gemm_op
                if key in per_gemm:
                    hidden = min(hidden, per_gemm[key])
                    per_gemm[key] -= hidden
            budget[c.hidden_by] -= hidden
            cost.paired_hidden_s += hidden if paired else 0.0
        cost.hidden_s += hidden
        cost.exposed_s += t - hidden
        cost.comms.append((c, t - hidden))
    return cost


def _gemm_times(cluster: Cluster, plan: Plan, unit: OpGroup, backward: bool) -> dict:
    """Each GEMM op's time in the unit's forward, by op name; backward, by (name, "dgrad" | "wgrad"): its
    time split in the ratio of its dgrad and wgrad GEMMs' rooflines."""
    times = group_times_s(cluster.gpu, unit, plan)[backward]
    gemms = [(op, t) for op, t in zip(unit.ops, times, strict=True) if op.kind == "gemm"]
    if not backward:
        return {op.name: t for op, t in gemms}
    out: dict = {}
    for op, t in gemms:
        precision, g, passes = gemm_passes(op, True, plan)
        library = gemm_library(op, plan)
        parts = [gemm_time_s(cluster.gpu, m, n, k, precision, g, library=library) for m, n, k in passes]
        dgrad = sum(parts[0::2]) / max(sum(parts), 1e-30)
        out[(op.name, "dgrad")], out[(op.name, "wgrad")] = t * dgrad, t * (1 - dgrad)
    return out


def _phase_cost(cluster: Cluster, plan: Plan, groups: Groups, unit: OpGroup, backward: bool) -> PhaseCost:
    """Compute and communication of a unit that pairs with no other micro-batch (embedding, head).
    Memoised on the unit: its op graph fixes every plan field this reads (its collectives run in the
    tp/cp/ep groups, whose placement the graph's degrees fix)."""
    phase = "bwd" if backward else "fwd"

    def cost() -> PhaseCost:
        comms = _add_comms(cluster, plan, groups, unit, phase, _compute_cost(cluster, plan, unit, backward), {})
        return _add_host_stall(cluster, plan, unit, backward, comms)

    return unit.memoised(("phase", cluster, backward), cost)


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Per micro-batch costs of one layer kind on one GPU."""

    fwd: PhaseCost
    bwd: PhaseCost
    recompute_s: float  # extra forward work in backward (compute only)
    recompute_comm_s: float  # communication re-run by recompute (full: TP/CP/EP; a recomputed MoE block: EP)
    fsdp_exposed_s: float
    fsdp_hidden_s: float
    fsdp_gather_s: float  # one all-gather of the layer (the first one of a step is never hidden)
    wgrad_s: float = 0.0  # the weight-gradient half of the layer's GEMM backward
    fsdp_reduce_s: float = 0.0  # one gradient reduce-scatter of the layer
    recompute_stall_s: float = 0.0  # host stall inside `recompute_s` (full recompute re-runs the forward)


def regathers_per_micro_batch(plan: Plan) -> bool:
    """FSDP / ZeRO-3 that reshards after forward: every micro-batch all-gathers each layer's weights (and
    reduce-scatters its gradient) inside the layer, rather than once a step."""
    return (plan.fsdp or plan.zero == 3) and plan.reshard_after_forward


def _layer_costs(
    cluster: Cluster, plan: Plan, groups: Groups, model: ModelSpec, graph: StageGraph, gather_bytes: float
) -> dict[LayerKind, LayerCost]:
    """Per micro-batch cost of each layer kind of `graph`, memoised per graph on the cluster and the plan
    fields outside the op graph that they read: the recompute policy (`_LAYER_RECOMPUTE`), and (when it
    `regathers_per_micro_batch`) the sharded-data-parallel groups it gathers over (`_regather_key`). Their
    forward and backward costs depend on neither (as `_phase_cost`'s) and are kept on each unit alone, so
    plans that differ only in data parallelism, sharding or recompute share them."""
    key = ("layers", _LAYER_RECOMPUTE(plan), _regather_key(plan, gather_bytes))
    memo = GRAPH_MEMO.of(graph, cluster)
    costs = memo.get(key)
    if costs is None:
        costs = memo[key] = {
            kind: _layer_cost(cluster, plan, groups, model, kind, unit, gather_bytes)
            for kind, unit in graph.layers.items()
        }
    return costs


# The recompute fields `_layer_cost_of` reads (not the count of fully recomputed layers nor activation
# offload, which only `stage_cost` and memory read: the search's full-recompute levels share layer costs)
_LAYER_RECOMPUTE = attrgetter("recompute", "recompute_modules", "recompute_alternate_mm")


def _regather_key(plan: Plan, gather_bytes: float) -> tuple | None:
    """What `_layer_cost_of` reads of the sharded data parallelism where each micro-batch regathers the
    weights (`regathers_per_micro_batch`), else None (it reads none of it)."""
    if not regathers_per_micro_batch(plan):
        return None
    return plan.shard_size, plan.expert_dp, plan.fsdp_prefetch, gather_bytes


def _layer_cost(
    cluster: Cluster, plan: Plan, groups: Groups, model: ModelSpec, kind: LayerKind, unit: OpGroup, gather_bytes: float
) -> LayerCost:
    """One layer kind's cost (`_layer_costs`), over its forward and backward costs kept on its unit."""
    phases = unit.memoised(("phases", cluster), lambda: _phase_costs(cluster, plan, groups, unit))
    return _layer_cost_of(cluster, plan, groups, model, kind, unit, gather_bytes, phases)


def _phase_costs(cluster: Cluster, plan: Plan, groups: Groups, unit: OpGroup) -> tuple[PhaseCost, PhaseCost]:
    """A layer's forward and backward cost: compute, its communication, the wait for the host."""
    fwd, bwd = _compute_cost(cluster, plan, unit, False), _compute_cost(cluster, plan, unit, True)
    blocks = _block_times(fwd, bwd)
    for phase, cost in (("fwd", fwd), ("bwd", bwd)):
        _add_comms(cluster, plan, groups, unit, phase, cost, blocks)
        _add_host_stall(cluster, plan, unit, phase == "bwd", cost)
    return fwd, bwd


def _layer_cost_of(
    cluster: Cluster,
    plan: Plan,
    groups: Groups,
    model: ModelSpec,
    kind: LayerKind,
    unit: OpGroup,
    gather_bytes: float,
    phases: tuple[PhaseCost, PhaseCost],
) -> LayerCost:
    fwd, bwd = phases
    key = ("recompute", cluster, _LAYER_RECOMPUTE(plan))
    rec, rec_comm, rec_stall = unit.memoised(key, lambda: _recompute_cost(cluster, plan, model, unit, fwd))
    exposed = hidden = ag = rs = 0.0
    if regathers_per_micro_batch(plan):
        # FSDP / ZeRO-3 (reshard after forward): every micro-batch all-gathers the layer in forward and
        # again in backward and reduce-scatters its gradient, prefetched under the neighbour's compute.
        dense = dense_params_local(model, plan.tp, kind)
        expert = expert_params_local(model, kind, plan.ep, plan.etp)
        ag = collective_time_s(cluster, "all_gather", gather_bytes * dense, groups.shard) + collective_time_s(
            cluster, "all_gather", gather_bytes * expert, groups.edp
        )
        rs = collective_time_s(cluster, "reduce_scatter", GRAD_REDUCE_BYTES * dense, groups.shard) + (
            collective_time_s(cluster, "reduce_scatter", GRAD_REDUCE_BYTES * expert, groups.edp)
        )
        # prefetching d layers ahead hides a gather under up to d layers of compute (0: no overlap)
        d = plan.fsdp_prefetch
        exposed = max(0.0, ag - d * fwd.compute_s) + max(0.0, ag + rs - d * (bwd.compute_s + rec))
        hidden = 2 * ag + rs - exposed
    wgrad = bwd.gemm_s / 2  # a GEMM's backward is its dgrad and its wgrad, of equal FLOPs
    return LayerCost(fwd, bwd, rec, rec_comm, exposed, hidden, ag, wgrad, rs, rec_stall)


def _recompute_cost(
    cluster: Cluster, plan: Plan, model: ModelSpec, unit: OpGroup, fwd: PhaseCost
) -> tuple[float, float, float]:
    """(recompute_s, recompute_comm_s, recompute_stall_s) of one layer kind under the plan's recompute
    (`LayerCost`), from its forward cost `fwd`. `_layer_cost_of` keeps it on the unit by the cluster and the
    recompute fields (`_LAYER_RECOMPUTE`): the unit's op graph fixes every other plan field this reads (the
    TP degree, precision, attention kernel and sequence split of the op times; the CUDA-graph scopes and EP
    settings of the host stall), so plans that differ only in sharding share it."""
    rec_stall = 0.0
    if plan.recompute == "full":
        rec, rec_comm, rec_stall = fwd.compute_s, fwd.exposed_s, fwd.host_stall_s
    elif plan.recompute == "selective":
        rerun = unit.recomputed_ops(plan.recompute_modules)
        rerun_ids = {id(op) for op in rerun}
        fwd_times = group_times_s(cluster.gpu, unit, plan)[0]
        rerun_times = tuple(t for op, t in zip(unit.ops, fwd_times, strict=True) if id(op) in rerun_ids)
        # the re-run forward ops are issued by the host too (a recomputed MoE block re-runs its expert loop),
        # and the collectives issued after them (a recomputed MoE block re-runs its dispatch and combine)
        names = {op.name for op in rerun}
        regathers = plan.tp_keeps_gathered_input and not plan.recompute_modules  # op-level: TP gathers re-run
        rerun_comms = [
            (c, t) for c, t in fwd.comms
            if c.after in names or (regathers and c.group == "tp" and c.kind == "all_gather")
        ]  # fmt: skip
        rec_stall = host_stall_s(tuple(rerun), rerun_times, False, plan, rerun_comms)
        rec, rec_comm = sum(rerun_times) + rec_stall, sum(t for _, t in rerun_comms)
        if plan.recompute_alternate_mm and not plan.recompute_modules:
            share = alternate_mm_share(model, plan, unit)
            rec += sum(share.get(op.name, 0.0) * t for op, t in zip(unit.ops, fwd_times, strict=True))
    else:
        rec, rec_comm = 0.0, 0.0
    return rec, rec_comm, rec_stall


@dataclass(slots=True)
class Stage:
    compute: float = 0.0  # per micro-batch
    exposed: float = 0.0
    hidden: float = 0.0
    recompute: float = 0.0
    fwd: float = 0.0  # forward compute only (window for gathers)
    bwd: float = 0.0  # backward compute incl. recompute (window for gradient reduction)
    first_gather: float = 0.0
    fwd_exposed: float = 0.0  # exposed communication of the forward pass alone
    wgrad: float = 0.0  # weight-gradient GEMM time (zero-bubble schedules run it separately)
    host_stall: float = 0.0  # part of `compute` the GPU waits for the host


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Model FLOPs per token (forward + backward = 3x forward, no recompute): every weight multiply
    (2 FLOPs per weight per token, routed experts only for the top-k, output layer included, embedding
    lookups excluded) and attention (QK^T and PV over the keys each query sees: causal (s+1)/2, window,
    chunk)."""
    fwd = 2.0 * model.vocab * model.hidden
    for kind, n in Counter(model.layer_kinds()).items():
        attn = 2.0 * model.heads * (model.qk_head_dim + model.v_head_dim) * model.keys_per_query(kind, seq_len, causal)
        fwd += n * (2.0 * model.matmul_params_per_token(kind) + attn)
        if kind.mlp == "dit" and model.dit is not None:  # cross-attention to the text tokens
            text, d = model.dit.text_len, model.hidden
            fwd += n * (4.0 * d * text + 2.0 * 2 * d * d * text / seq_len)
    return 3.0 * fwd


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Everything the analytic path and the simulator share: the op graph and its per-unit costs."""

    graph: StageGraph
    groups: Groups
    layers: dict[LayerKind, LayerCost]
    embed_fwd: PhaseCost
    embed_bwd: PhaseCost
    head_fwd: PhaseCost
    head_bwd: PhaseCost
    mtp_fwd: PhaseCost  # an MTP module's own ops (`graph.mtp`), without its block and output layer
    mtp_bwd: PhaseCost
    p2p_s: float  # one send/recv of a stage boundary activation
    slowdown: float  # compute slowdown while a collective overlaps it
    gather_bytes: int  # bytes per weight all-gathered (bf16, or FP8 with fp8_all_gather)
    cluster: Cluster


def step_costs(model: ModelSpec, cluster: Cluster, plan: Plan) -> StepCosts:
    """The plan's `StepCosts`, shared (never to be changed): memoised per graph and cluster on what they read
    of the plan outside the graph (the groups' degrees, the bytes per gathered weight, `_layer_costs`' key),
    so plans that differ only elsewhere (global batch, recompute layers, offload) share them."""
    graph = build_stage_graph(model, plan, cluster.gpu.arch)
    # Weights travel in bf16, or in FP8 where the framework all-gathers FP8 weights (torchao / Megatron-FSDP,
    # Megatron's distributed optimizer with per-tensor FP8). MXFP8 parameters under the distributed optimizer
    # are gathered in BF16 into the reused gradient buffer and quantized locally (Megatron-Core
    # `reuse_grad_buf_for_mxfp8_param_ag`, set by Megatron-Bridge's `bf16_with_mxfp8_mixed`).
    bf16_gather = plan.fp8_recipe == "mxfp8" and not (plan.fsdp or plan.zero >= 3)
    gather_bytes = 1 if plan.fp8_params and not bf16_gather else BF16
    degrees = _degrees(plan)
    memo = GRAPH_MEMO.of(graph, cluster)
    key = ("step costs", degrees, gather_bytes, _LAYER_RECOMPUTE(plan), _regather_key(plan, gather_bytes))
    sc = memo.get(key)
    if sc is None:
        sc = memo[key] = _step_costs(model, cluster, plan, graph, _placed(cluster, degrees), gather_bytes, memo)
    return sc


def _step_costs(
    model: ModelSpec, cluster: Cluster, plan: Plan, graph: StageGraph, groups: Groups, gather_bytes: int, memo: dict
) -> StepCosts:
    gpu = cluster.gpu
    # the embedding's, the head's and an MTP module's own costs, kept per graph and cluster (`_phase_cost`)
    ends = memo.get("ends")
    if ends is None:
        ends = memo["ends"] = tuple(
            _phase_cost(cluster, plan, groups, unit, backward)
            for unit in (graph.embedding, graph.head, graph.mtp)
            for backward in (False, True)
        )
    embed_fwd, embed_bwd, head_fwd, head_bwd, mtp_fwd, mtp_bwd = ends
    return StepCosts(
        graph=graph,
        groups=groups,
        layers=_layer_costs(cluster, plan, groups, model, graph, gather_bytes),
        embed_fwd=embed_fwd,
        embed_bwd=embed_bwd,
        head_fwd=head_fwd,
        head_bwd=head_bwd,
        mtp_fwd=mtp_fwd,
        mtp_bwd=mtp_bwd,
        p2p_s=collective_time_s(cluster, "send_recv", graph.boundary_bytes, groups.pp) if plan.pp > 1 else 0.0,
        slowdown=overlap_slowdown(gpu),
        gather_bytes=gather_bytes,
        cluster=cluster,
    )


def layers_cost(sc: StepCosts, model: ModelSpec, plan: Plan, layers: tuple[int, ...], recomputed: int) -> Stage:
    """Per-micro-batch cost of running `layers` (the first `recomputed` of them under full recompute)."""
    st = Stage()
    n_rec = recomputed if plan.recompute == "full" else len(layers)
    alone = 1.0 - paired_share(plan)
    _add_blocks(st, sc, model.kind_counts(layers[:n_rec]), plan.recompute != "none", alone)
    _add_blocks(st, sc, model.kind_counts(layers[n_rec:]), False, alone)
    if layers:
        st.first_gather = sc.layers[sc.graph.kinds[layers[0]]].fsdp_gather_s
    if plan.fsdp:
        copies = _layer_copy_times_s(sc, model, plan)
        for kind, n in model.kind_counts(layers).items():
            c = sc.layers[kind]
            _add_copy_times(st, plan, copies[kind], 2, n, c.fwd.host_stall_s + c.bwd.host_stall_s)
    return st


def _layer_copy_times_s(sc: StepCosts, model: ModelSpec, plan: Plan) -> dict[LayerKind, tuple[float, float]]:
    """FSDP's local copies (`costs.fsdp.fsdp_copy_times_s`) of one layer of each kind of the graph (its kinds are
    the model's), memoised per cluster and model on what they read of the plan: the degrees that split a
    layer's parameters, `_fsdp_copy_key` and the bytes per gathered weight. Op graphs that differ elsewhere
    (micro-batch, MoE dispatcher) share them."""
    key = ("fsdp copies", plan.tp, plan.ep, plan.etp, _fsdp_copy_key(plan), sc.gather_bytes)
    memo = CLUSTER_MEMO.of(sc.cluster, model)
    copies = memo.get(key)
    if copies is None:
        gpu = sc.cluster.gpu
        copies = memo[key] = {
            kind: fsdp_copy_times_s(
                gpu,
                plan,
                dense_params_local(model, plan.tp, kind),
                expert_params_local(model, kind, plan.ep, plan.etp),
                sc.gather_bytes,
            )
            for kind in sc.layers
        }
    return copies


def _add_copy_times(
    st: Stage, plan: Plan, copies: tuple[float, float], gathers: int, n: int, stall: float = 0.0
) -> None:
    """Add FSDP's local copies of `n` units to one micro-batch, `copies` being one unit's (one all-gather's,
    one reduce-scatter's; `costs.fsdp.fsdp_copy_times_s`): a unit resharded after forward is gathered
    `gathers` times (forward, and again in backward when 2; else once a step, `dp_comm`); its gradients are
    reduced each micro-batch. Their few large kernels keep the GPU busy while the host issues the unit's
    other work: they absorb up to `stall` of its host wait."""
    gather, reduce = copies
    regather = regathers_per_micro_batch(plan)
    fwd = gather if regather else 0.0
    bwd = reduce + (gather if gathers > 1 and regather else 0.0)
    absorbed = min(stall, fwd + bwd)
    st.compute += n * (fwd + bwd - absorbed)
    st.host_stall -= n * absorbed
    st.fwd += n * fwd
    st.bwd += n * bwd


def _add_blocks(
    st: Stage, sc: StepCosts, counts: Mapping[LayerKind, int], recomputed: bool, alone: float = 0.0
) -> None:
    """Add `counts` blocks of each kind to `st` (with their recompute when `recomputed`); in the `alone`
    share of micro-batches (no partner in the combined-1F1B overlap) the paired all-to-alls are exposed."""
    for kind, n in counts.items():
        c = sc.layers[kind]
        rec = c.recompute_s if recomputed else 0.0
        rec_comm = c.recompute_comm_s if recomputed else 0.0
        unpaired_fwd, unpaired_bwd = alone * c.fwd.paired_hidden_s, alone * c.bwd.paired_hidden_s
        st.compute += n * (c.fwd.compute_s + c.bwd.compute_s + rec)
        st.recompute += n * rec
        st.exposed += n * (
            c.fwd.exposed_s + c.bwd.exposed_s + rec_comm + c.fsdp_exposed_s + unpaired_fwd + unpaired_bwd
        )
        st.hidden += n * (c.fwd.hidden_s + c.bwd.hidden_s + c.fsdp_hidden_s - unpaired_fwd - unpaired_bwd)
        st.fwd += n * c.fwd.compute_s
        st.bwd += n * (c.bwd.compute_s + rec)
        st.fwd_exposed += n * (c.fwd.exposed_s + unpaired_fwd + (c.fsdp_exposed_s / 2))
        st.wgrad += n * c.wgrad_s
        st.host_stall += n * (c.fwd.host_stall_s + c.bwd.host_stall_s + (c.recompute_stall_s if recomputed else 0.0))


def _add_unit(st: Stage, fwd: PhaseCost, bwd: PhaseCost, n: int = 1) -> None:
    """Add `n` forward and backward runs of a unit that pairs with no other micro-batch (embedding, head,
    an MTP module's own ops) to the stage's compute, exposed communication and host wait."""
    st.compute += n * (fwd.compute_s + bwd.compute_s)
    st.exposed += n * (fwd.exposed_s + bwd.exposed_s)
    st.host_stall += n * (fwd.host_stall_s + bwd.host_stall_s)


def mtp_cost(sc: StepCosts, model: ModelSpec, plan: Plan) -> Stage:
    """Per-micro-batch cost of the MTP modules on their pipeline rank (`Plan.mtp_rank`; DeepSeek-V3 §2.2):
    each runs its embedding lookup, two norms and the 2h→h projection (`graph.mtp`) and one more block of
    the model's kind under the plan's recompute. Their output layers run with the loss (`mtp_heads`)."""
    st = Stage()
    if not (plan.mtp and model.mtp_layers):
        return st
    n = model.mtp_layers
    _add_blocks(st, sc, {model.mtp_kind: n}, plan.recompute != "none", 1.0 - paired_share(plan))
    _add_unit(st, sc.mtp_fwd, sc.mtp_bwd, n)
    st.fwd += n * sc.mtp_fwd.compute_s
    st.bwd += n * sc.mtp_bwd.compute_s
    st.fwd_exposed += n * sc.mtp_fwd.exposed_s
    return st


def stage_cost(sc: StepCosts, model: ModelSpec, plan: Plan, rank: int) -> Stage:
    """Per-micro-batch compute and exposed communication of pipeline rank `rank` (all its chunks)."""
    layers = plan.rank_layers(model.layers)[rank]
    st = layers_cost(sc, model, plan, layers, plan.recomputed_layers(len(layers)))
    st.exposed += st.first_gather  # the first gather of each micro-batch has nothing to hide under
    ends = ((sc.embed_fwd, sc.embed_bwd),) if rank == 0 else ()
    if rank == plan.pp - 1:  # the output layer and loss, once more for each MTP module
        ends += ((sc.head_fwd, sc.head_bwd),) * (1 + mtp_heads(model, plan))
    if rank == plan.mtp_rank:
        mtp = mtp_cost(sc, model, plan)
        st.compute += mtp.compute
        st.exposed += mtp.exposed
        st.hidden += mtp.hidden
        st.recompute += mtp.recompute
        st.host_stall += mtp.host_stall
    for fwd, bwd in ends:
        _add_unit(st, fwd, bwd)
    if plan.fsdp:  # the embedding (regathered for its backward) and the output layer, FSDP units of their own
        embedding, head = end_params_local(model, plan)
        gpu, gather_bytes = sc.cluster.gpu, sc.gather_bytes
        if rank == 0:
            _add_copy_times(st, plan, fsdp_copy_times_s(gpu, plan, embedding, 0.0, gather_bytes), 2, 1)
        if rank == plan.pp - 1:
            _add_copy_times(st, plan, fsdp_copy_times_s(gpu, plan, head, 0.0, gather_bytes), 1, 1)
    st.exposed += 2 * plan.vpp * sc.p2p_s  # activations / gradients to and from the neighbouring stages
    if plan.offload_activations:  # copies to the host under forward and back under backward
        saved = layers_saved_bytes(model, plan, sc.graph, layers, plan.recomputed_layers(len(layers)))
        moved = plan.offload_activations * saved
        copy = link_time_s(sc.cluster, moved)
        st.exposed += max(0.0, copy - st.fwd) + max(0.0, copy - st.bwd)
    st.compute += st.hidden * sc.slowdown
    return st


def rank_classes(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """For each pipeline rank, the first rank whose layers are of the same kinds in the same order (memoised
    on the model by the layout's fields, which fix every rank's layers)."""

    def classes() -> tuple[int, ...]:
        kinds = model.layer_kinds()
        first: dict[tuple[LayerKind, ...], int] = {}  # each order of kinds -> the first rank holding it
        ranks = enumerate(plan.rank_layers(model.layers))
        return tuple(first.setdefault(tuple(kinds[i] for i in layers), r) for r, layers in ranks)

    return model.memoised(("rank_classes", plan.pp, plan.vpp, plan.pp_layout), classes)


def stage_costs(sc: StepCosts, model: ModelSpec, plan: Plan) -> tuple[Stage, ...]:
    """`stage_cost` of every pipeline rank, shared (never to be changed). Ranks whose layers are of the same
    kinds in the same order (`rank_classes`) and that agree on holding the embedding, the output layer and
    the MTP modules run the same work, so each such class is costed once. Memoised per graph and cluster on
    what `stage_cost` reads outside the graph: the recompute section, `_regather_key`, the layout and MTP
    fields, the boundary send's time and `_unpaired_key`; plans that differ elsewhere share their stages."""
    key = _stages_key(sc, plan)
    memo = GRAPH_MEMO.of(sc.graph, sc.cluster)
    stages = memo.get(key)
    if stages is None:
        stages = memo[key] = _stage_costs(sc, model, plan, memo.get(("stage", plan.pp // 2, key)))
    return stages


def _stages_key(sc: StepCosts, plan: Plan) -> tuple:
    """The memo key of a plan's stages (`stage_costs`): what `stage_cost` reads outside the graph."""
    layout = (plan.pp, plan.vpp, plan.pp_layout, plan.mtp, plan.mtp_chunk)
    recompute = _RECOMPUTE_SECTION(plan)
    regather = _regather_key(plan, sc.gather_bytes)
    return ("stages", recompute, regather, layout, sc.p2p_s, _unpaired_key(sc, plan), _fsdp_copy_key(plan))


def rank_stage(sc: StepCosts, model: ModelSpec, plan: Plan, rank: int) -> Stage:
    """`stage_cost` of one pipeline rank, shared (never to be changed): the plan's `stage_costs` where they
    are kept, else memoised as they are (the planner ranks MoE variants by the middle rank's stage alone;
    `stage_costs` of the variant it estimates then starts from that rank's)."""
    key = _stages_key(sc, plan)
    memo = GRAPH_MEMO.of(sc.graph, sc.cluster)
    stages = memo.get(key)
    if stages is not None:
        return stages[rank]
    one = ("stage", rank, key)
    st = memo.get(one)
    if st is None:
        st = memo[one] = stage_cost(sc, model, plan, rank)
    return st


def _fsdp_copy_key(plan: Plan) -> tuple | None:
    """What `_add_fsdp_copies` reads of the plan besides the graph (None without FSDP: it adds nothing)."""
    if not plan.fsdp:
        return None
    return plan.fsdp2, plan.shard_size, plan.expert_shard_size, plan.reshard_after_forward


def _unpaired_key(sc: StepCosts, plan: Plan) -> float | None:
    """What a stage's cost reads of the micro-batches per step: the combined-1F1B share of them without a
    partner (1 - `paired_share`), which only scales the all-to-all time some layer hides under the other
    micro-batch (`PhaseCost.paired_hidden_s`); None where no layer hides any (the share then changes
    nothing)."""
    paired = any(c.fwd.paired_hidden_s or c.bwd.paired_hidden_s for c in sc.layers.values())
    return paired_share(plan) if paired else None


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The pipeline as the closed form reads it, for any number of micro-batches per step: each rank's
    stage (shared, never to be changed), the slowest rank, the stage time the bubble is counted in (the
    median rank's), and the slowest rank's once-per-step data-parallel traffic and optimizer step."""

    stages: tuple[Stage, ...]
    slowest: int
    typical: float
    dp: DPComm
    optimizer_s: float


def pipeline_costs(sc: StepCosts, model: ModelSpec, cluster: Cluster, plan: Plan) -> Pipeline:
    """The plan's `Pipeline`, memoised per graph and cluster on every plan field but the global batch (and
    `_unpaired_key`), so plans that differ only in global batch share it."""
    key = ("pipeline", _BUT_GLOBAL_BATCH(plan), _unpaired_key(sc, plan))
    memo = GRAPH_MEMO.of(sc.graph, cluster)
    pipe = memo.get(key)
    if pipe is None:
        stages = stage_costs(sc, model, plan)
        slowest = max(range(plan.pp), key=lambda r: stages[r].compute + stages[r].exposed)
        typical = sorted(st.compute + st.exposed for st in stages)[plan.pp // 2]
        dp = dp_comm(sc, model, cluster, plan, slowest, stages[slowest])
        optimizer_s = optimizer_time_s(model, cluster, plan, slowest)
        pipe = memo[key] = Pipeline(stages, slowest, typical, dp, optimizer_s)
    return pipe


def _stage_costs(sc: StepCosts, model: ModelSpec, plan: Plan, middle: Stage | None = None) -> tuple[Stage, ...]:
    """Each rank's `stage_cost`, costed once per class of ranks that run the same work (`stage_costs`);
    `middle`: the middle rank's (`pp // 2`), where `rank_stage` already costed it (as its class's)."""
    classes = rank_classes(model, plan)
    last, mtp_rank = plan.pp - 1, plan.mtp_rank
    costed: dict[tuple[int, bool, bool, bool], Stage] = {}
    if middle is not None:
        mid = plan.pp // 2
        costed[(classes[mid], mid == 0, mid == last, mid == mtp_rank)] = middle
    stages = []
    for rank, cls in enumerate(classes):
        key = (cls, rank == 0, rank == last, rank == mtp_rank)
        st = costed.get(key)
        if st is None:
            st = costed[key] = stage_cost(sc, model, plan, rank)
        stages.append(st)
    return tuple(stages)


@dataclass(frozen=True, slots=True)
class DPComm:
    """Once-per-step data-parallel traffic of one rank and how much of it is exposed."""

    grad_exposed_s: float  # gradient reduction left after the last backward
    gather_exposed_s: float  # weight gather not hidden by the first forward
    total_s: float

    @property
    def exposed_s(self) -> float:
        return self.grad_exposed_s + self.gather_exposed_s


def dp_comm(sc: StepCosts, model: ModelSpec, cluster: Cluster, plan: Plan, rank: int, st: Stage) -> DPComm:
    """Gradients reduced (all-reduce for DDP, reduce-scatter when sharded) under the last micro-batch's
    backward (bucketed, Megatron overlap_grad_reduce); sharded weights gathered back under the next
    step's first forward (overlap_param_gather); HSDP adds an all-reduce across replicas. FSDP that
    reshards after forward moves its traffic per micro-batch instead (see `_layer_cost_of`)."""
    groups = sc.groups
    dense, expert = rank_params_local(model, plan, rank)
    n_layers = max(len(plan.rank_layers(model.layers)[rank]), 1)
    grad_exp = gather_exp = total = 0.0
    if not regathers_per_micro_batch(plan):
        sharded = plan.zero >= 1 or plan.fsdp
        kind = "reduce_scatter" if sharded else "all_reduce"
        per_param = GRAD_REDUCE_BYTES if plan.fsdp else plan.main_grad_bytes  # Megatron reduces its main_grad
        grad = collective_time_s(cluster, kind, per_param * dense, groups.shard if sharded else groups.dp)
        grad += collective_time_s(cluster, kind, per_param * expert, groups.edp)
        if plan.deferred_grad_sync:  # the stage reduces once its last backward is done: nothing left to hide it
            grad_exp = grad
        elif plan.overlap_grad_reduce:
            grad_exp = max(0.0, grad - st.bwd) + grad / n_layers
        else:
            grad_exp = grad
        total += grad
        if sharded:
            gather = collective_time_s(cluster, "all_gather", sc.gather_bytes * dense, groups.shard)
            gather += collective_time_s(cluster, "all_gather", sc.gather_bytes * expert, groups.edp)
            gather_exp = max(0.0, gather - st.fwd) + gather / n_layers
            total += gather
            # FSDP that keeps the weights gathered casts and copies them once a step (`costs.fsdp`)
            copies = fsdp_copy_times_s(cluster.gpu, plan, dense, expert, sc.gather_bytes)[0]
            gather_exp += copies
            total += copies
    if plan.offload_optimizer:  # gradient shard down to the host, under the last backward
        down = link_time_s(cluster, 2 * (dense / plan.shard_size + expert / plan.expert_shard_size))
        grad_exp += max(0.0, down - st.bwd)
        total += down
    if (plan.fsdp or plan.zero == 3) and plan.shard_size < plan.dp * plan.cp:
        rep = collective_time_s(cluster, "all_reduce", GRAD_REDUCE_BYTES * dense / plan.shard_size, groups.replicate)
        grad_exp += rep
        total += rep
    return DPComm(grad_exp, gather_exp, total)


def optimizer_bytes_per_param(plan: Plan) -> int:
    """HBM traffic of Adam per local parameter (memory-bound): read and write the fp32 master (8 B), read
    the gradient for the norm and the step (2·g), read and write m and v (4·m), write the bf16 copy (2 B;
    FSDP keeps none: it casts as it gathers, `costs.fsdp`): 34 B with fp32 gradients and moments. Clipping
    that scales every gradient (`clip_scales_always`) reads and writes them once more."""
    g = plan.main_grad_bytes
    return 8 + 2 * g + 4 * plan.moment_bytes + (0 if plan.fsdp else 2) + (2 * g if plan.clip_scales_always else 0)


def optimizer_params_local(model: ModelSpec, plan: Plan, rank: int) -> float:
    """Parameters whose optimizer update this GPU runs (its shard when the optimizer is sharded)."""
    dense, expert = rank_params_local(model, plan, rank)
    sharded = plan.zero >= 1 or plan.fsdp
    return dense / plan.shard_size + expert / plan.expert_shard_size if sharded else dense + expert


def optimizer_time_s(model: ModelSpec, cluster: Cluster, plan: Plan, rank: int) -> float:
    """Adam on the GPU (memory-bound), or with optimizer offload: the CPU step plus the bf16 weights
    coming back over the host link (the gradients go down under the backward)."""
    local = optimizer_params_local(model, plan, rank)
    if plan.offload_optimizer:
        return cpu_optimizer_time_s(cluster, local) + link_time_s(cluster, 2 * local)
    return memory_time_s(cluster.gpu, optimizer_bytes_per_param(plan) * local)


def step_flops(model: ModelSpec, plan: Plan, graph: StageGraph) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs incl. recompute) of one optimizer step over all GPUs."""
    tokens = plan.global_batch * plan.seq_len
    per_token = model.memoised(
        ("flops_per_token", plan.seq_len, plan.causal), lambda: model_flops_per_token(model, plan.seq_len, plan.causal)
    )
    model_flops = tokens * per_token
    if plan.mtp and model.mtp_layers:  # each MTP module: one more block and output-layer pass per token
        kind = model.mtp_kind
        mtp_fwd = 2.0 * (model.matmul_params_per_token(kind) + model.vocab * model.hidden + 2 * model.hidden**2)
        model_flops += tokens * 3.0 * model.mtp_layers * mtp_fwd
    recompute_flops = 0.0
    if plan.recompute == "full":
        mb_per_step = plan.global_batch // plan.micro_batch
        for kind, n in _recomputed_kinds(model, plan):
            recompute_flops += n * _unit_flops(graph.layers[kind]) * plan.tp * plan.cp * mb_per_step
    return model_flops, model_flops + recompute_flops


def _unit_flops(unit: OpGroup) -> float:
    """Forward FLOPs of one unit's ops, kept on the unit."""
    return unit.memoised("flops", lambda: sum(op.flops for op in unit.ops))


def _recomputed_kinds(model: ModelSpec, plan: Plan) -> tuple[tuple[LayerKind, int], ...]:
    """(kind, count) of the fully recomputed layers of each pipeline rank in turn, memoised on the model by
    the layout and recompute fields that fix them."""

    def kinds() -> tuple[tuple[LayerKind, int], ...]:
        return tuple(
            (kind, n)
            for layers in plan.rank_layers(model.layers)
            for kind, n in model.kind_counts(layers[: plan.recomputed_layers(len(layers))]).items()
        )

    key = ("recomputed_kinds", plan.pp, plan.vpp, plan.pp_layout, plan.recompute, plan.recompute_layers)
    return model.memoised(key, kinds)


@dataclass(frozen=True, slots=True)
class RankMemory:
    """Memory parts of one pipeline rank, bytes."""

    rank: int
    state: StateBytes
    activations: float  # saved activations at the peak (in-flight micro-batches)
    buffers: float  # transient buffers incl. one layer's backward working set
    inflight: int
    workspace: float = 0.0  # the backward working set inside `buffers` (alive only during a backward)
    # grads freed after each step and one micro-batch per step: backward frees a layer's activations as
    # it makes its grads, so the peak holds the larger of the two (both grow linearly over the layers)
    grads_replace_activations: bool = False

    @property
    def allocated(self) -> float:
        return allocated_bytes(self.state, self.activations, self.buffers, self.grads_replace_activations)

    @property
    def overhead(self) -> float:
        return overhead_bytes(self.activations, self.buffers)


def allocated_bytes(st: StateBytes, activations: float, buffers: float, grads_replace_activations: bool) -> float:
    """`RankMemory.allocated` of its parts (the planner's fit check reads them without building the record)."""
    if grads_replace_activations:
        return st.params + st.optimizer + max(st.grads, activations) + buffers
    return st.params + st.grads + st.optimizer + activations + buffers


def overhead_bytes(activations: float, buffers: float) -> float:
    """`RankMemory.overhead` of its parts."""
    return CONTEXT_BYTES + FRAGMENTATION * (activations + buffers)


def rank_memory(
    model: ModelSpec,
    plan: Plan,
    graph: StageGraph,
    arch: str,
    rank: int,
    fixed: tuple[StateBytes, float] | None = None,
    activations: tuple[float, float, int] | None = None,
) -> RankMemory:
    """Memory of pipeline rank `rank`. `fixed` is its model state and transient buffers when already known
    (`fixed_rank_memory`: they do not depend on recompute), `activations` its `activation_bytes` (they do
    not depend on optimizer offload)."""
    state, buffers = fixed or fixed_rank_memory(model, plan, graph, arch, rank)
    act, workspace, inflight = activations or activation_bytes(model, plan, graph, rank)
    freed = not plan.persistent_grads and plan.grad_accum == 1
    return RankMemory(rank, state, act, buffers + workspace, inflight, workspace, freed)


def ranks_memory(model: ModelSpec, plan: Plan, graph: StageGraph, arch: str, ranks: Iterable[int]) -> list[RankMemory]:
    """`rank_memory` of each of `ranks`. Their model state and buffers are memoised per graph on `arch`, the
    rank and the plan sections they read (all but recompute and batch), so plans that differ only in
    recompute or global batch share them."""
    # one dict of ranks per key: the ~45-field key is built and hashed once per call, not once per rank
    memo = GRAPH_MEMO.of(graph)
    key = ("fixed", arch, _BUT_RECOMPUTE_AND_BATCH(plan))
    by_rank = memo.get(key)
    if by_rank is None:
        by_rank = memo[key] = {}
    freed = not plan.persistent_grads and plan.grad_accum == 1
    saved = saved_fields(plan)  # (`activation_bytes`' key, built once)
    out = []
    for rank in ranks:
        fixed = by_rank.get(rank)
        if fixed is None:
            fixed = by_rank[rank] = fixed_rank_memory(model, plan, graph, arch, rank)
        state, buffers = fixed
        act, workspace, inflight = activation_bytes(model, plan, graph, rank, memo, saved)
        out.append(RankMemory(rank, state, act, buffers + workspace, inflight, workspace, freed))
    return out


def fixed_rank_memory(
    model: ModelSpec, plan: Plan, graph: StageGraph, arch: str, rank: int
) -> tuple[StateBytes, float]:
    """The part of a rank's memory that recompute does not change: model state and transient buffers."""
    return rank_state_bytes(model, plan, rank), buffer_bytes(model, plan, graph, rank, arch)


def host_gib_per_node(model: ModelSpec, cluster: Cluster, plan: Plan, rank: int, activations: float) -> float:
    """Host memory the node's GPUs use for offloaded optimizer state and activations."""
    per_gpu = host_bytes_per_gpu(optimizer_params_local(model, plan, rank)) if plan.offload_optimizer else 0.0
    if plan.offload_activations:
        per_gpu += activations * plan.offload_activations / (1 - plan.offload_activations or 1.0)
    return per_gpu * cluster.gpus_per_node / GIB


def memory_breakdown(m: RankMemory, capacity_gib: float, host_gib: float = 0.0) -> MemoryBreakdown:
    st = m.state
    allocated, overhead = m.allocated, m.overhead
    return MemoryBreakdown(
        peak_gib=allocated / GIB,
        params_gib=st.params / GIB,
        grads_gib=st.grads / GIB,
        optimizer_gib=st.optimizer / GIB,
        activations_gib=m.activations / GIB,
        buffers_gib=m.buffers / GIB,
        overhead_gib=overhead / GIB,
        required_gib=(allocated + overhead) / GIB,
        capacity_gib=capacity_gib,
        stage=m.rank,
        inflight_microbatches=m.inflight,
        host_gib=host_gib,
    )


def plan_warnings(plan: Plan, graph: StageGraph) -> tuple[str, ...]:
    m = plan.grad_accum
    warnings = []
    if plan.vpp > 1 and m % plan.pp:
        warnings.append(f"interleaved schedule: micro-batches per step ({m}) not a multiple of pp ({plan.pp})")
    if plan.pp > 1 and m < plan.pp:
        warnings.append(f"only {m} micro-batches for {plan.pp} pipeline stages: the bubble dominates")
    if graph.routing.dropped_fraction > 0:
        warnings.append(f"capacity factor drops {graph.routing.dropped_fraction:.1%} of token-expert assignments")
    if not moe_graphed(plan) and any(kind.mlp == "moe" for kind in graph.layers):
        warnings.append(eager_moe_warning(plan.ep_dispatch))
    if plan.cuda_graphs:
        warnings.append(GRAPH_MEMORY_WARNING)
    return tuple(warnings)


def make_estimate(
    model: ModelSpec,
    cluster: Cluster,
    plan: Plan,
    sc: StepCosts,
    step_s: float,
    time: TimeBreakdown,
    memory: MemoryBreakdown,
    extra_warnings: tuple[str, ...] = (),
    stack: str = "",
) -> Estimate:
    """Assemble the typed result (shared by the analytic path and the simulator), labelled with the
    software `stack` the plan came from."""
    gpu = cluster.gpu
    model_flops, hardware_flops = step_flops(model, plan, sc.graph)
    peak = gpu.peak_tflops(plan.precision) * 1e12
    tokens = plan.global_batch * plan.seq_len
    gpus = plan.gpus
    max_params = _max_rank_params(model, plan, memory.stage)
    return Estimate(
        model=model.name,
        gpu=gpu.name,
        gpus=gpus,
        plan=plan_record(plan),
        params=ParamCounts(
            total=model.params_total,
            per_gpu=int(round(max_params)),
            per_gpu_sharded=memory.params_gib * GIB / (4 if plan.fsdp else 2),
            active=model.memoised("params_active", lambda: model.params_active),  # counted over the layers
        ),
        step_time_s=step_s,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step_s,
        tokens_per_s_per_gpu=tokens / step_s / gpus,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hardware_flops,
        model_tflops_per_gpu=model_flops / step_s / gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / step_s / gpus / 1e12,
        mfu=model_flops / step_s / gpus / peak,
        hfu=hardware_flops / step_s / gpus / peak,
        peak_tflops_per_gpu=peak / 1e12,
        fits=memory.required_gib <= gpu.hbm_gib and memory.host_gib <= gpu.host_memory_gib,
        memory=memory,
        time=time,
        warnings=plan_warnings(plan, sc.graph)
        + bubble_warning(plan, time, step_s)
        + extra_warnings
        + ((gpu.caveat,) if gpu.caveat else ()),
        stack=stack,
    )


def _max_rank_params(model: ModelSpec, plan: Plan, stage: int) -> float:
    """Parameters on the most-loaded GPU of the first, middle and last pipeline ranks and `stage`, memoised on
    the model by the fields `rank_params_local` reads."""
    ranks = tuple(sorted({0, plan.pp - 1, plan.pp // 2, stage}))
    return model.memoised(
        ("max_rank_params", ranks, rank_params_fields(plan)),
        lambda: max(sum(rank_params_local(model, plan, r)) for r in ranks),
    )


def plan_record(plan: Plan) -> dict[str, object]:
    """The plan as the result states it: every field, the micro-batches per step and the sharding's name."""
    record = dict(plan.__dict__)  # a plan keeps exactly its fields there, in declaration order (`Plan`)
    if tuple(record) != PLAN_FIELDS:  # not expected: then field by field, as the record must list them
        record = dict(zip(PLAN_FIELDS, _plan_values(plan), strict=True))
    record["grad_accum"] = plan.grad_accum
    record["sharding"] = plan.sharding_name
    return record


def bubble_warning(plan: Plan, time: TimeBreakdown, step_s: float) -> tuple[str, ...]:
    """Say so when a non-interleaved pipeline idles for a quarter of the step or more: Megatron runs
    1F1B without interleaving unless `--num-layers-per-virtual-pipeline-stage` is set, and the large
    published pipeline runs (NeMo's PP recipes, Llama 3 405B) all interleave."""
    share = time.bubble_s / step_s if step_s > 0 else 0.0
    if plan.pp == 1 or plan.vpp > 1 or share < 0.25:
        return ()
    return (
        f"the pipeline bubble is {share:.0%} of the step: PP{plan.pp} with {plan.grad_accum} micro-batches runs "
        "non-interleaved 1F1B unless --vpp is given (interleaved runs divide the bubble by the vpp)",
    )
