"""Simulate one optimizer step: pipeline schedule × per-layer costs from the op graph → timeline.

The simulator shares every per-layer cost with the analytic path (`step.core.step_costs`): the
two differ only in how the pipeline is scheduled (the analytic path's closed-form bubble versus the
list-scheduled orders here), so where both apply they agree to within the bubble approximation.
Data-parallel ranks, tensor-parallel ranks and context-parallel ranks of a stage do the same work, so one
representative rank per pipeline stage is simulated.

Overlap rules (documented options with defaults):
  * FSDP/ZeRO-3 all-gathers are prefetched one layer ahead and reduce-scatters overlap the next layer's
    backward (`step.core._layer_cost`); a gather longer than the layer it hides under is exposed.
  * DP gradient buckets overlap the last micro-batch's backward; ZeRO-1/2 weight gathers overlap the
    first forward (Megatron overlap_grad_reduce / overlap_param_gather).
  * TP collectives are exposed unless `tp_comm_overlap`; CP ring transfers hide under attention; EP
    all-to-alls hide under another micro-batch's compute with `ep_comm_overlap`.
  * Stragglers: `straggler_fraction` of GPUs run `straggler_slowdown` times slower; every collective
    waits for them, so a stage slows if any of its GPUs is a straggler (probability 1 - (1 - f)^n).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardscope.costs.compute import group_times_s
from shardscope.costs.memory import layers_saved_bytes, mtp_heads, mtp_saved_bytes
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan, chunk_sizes
from shardscope.result import Estimate, TimeBreakdown
from shardscope.sim.engine import Layout, Timed, run_schedule
from shardscope.sim.schedules import build_schedule, chunks_of_schedule
from shardscope.step.core import (
    Stage,
    StepCosts,
    dp_comm,
    host_gib_per_node,
    layers_cost,
    make_estimate,
    memory_breakdown,
    mtp_cost,
    optimizer_time_s,
    rank_memory,
    stage_cost,
    step_costs,
)


@dataclass(frozen=True, slots=True)
class ChunkCost:
    layers: tuple[int, ...]
    fwd_s: float
    bwd_s: float  # backward incl. recompute (without W for split schedules)
    wgrad_s: float  # the W part (0 unless the schedule splits it out)
    activation_bytes: float  # saved by one micro-batch of this chunk


@dataclass(frozen=True, slots=True)
class LayerDetail:
    """One layer's per-micro-batch times (seconds) and the attention share of its compute."""

    fwd_compute_s: float
    fwd_exposed_s: float
    bwd_compute_s: float
    bwd_exposed_s: float
    gather_s: float  # FSDP all-gather (0 without per-micro-batch sharding)
    reduce_s: float  # FSDP reduce-scatter
    attn_share_fwd: float
    attn_share_bwd: float


@dataclass(frozen=True, slots=True)
class SimResult:
    estimate: Estimate
    schedule: str
    timeline: list[list[Timed]]  # per pipeline rank
    chunks: list[ChunkCost]
    chunk_rank: list[int]
    gather_s: float  # exposed weight gather at the start of the step
    grad_tail_s: list[float]  # per rank: exposed gradient reduction after its last backward
    optimizer_s: float
    memory_series: list[list[tuple[float, float]]]  # per rank: (time, allocated bytes)
    slowdown: list[float]  # straggler factor per rank
    layer_detail: dict[int, LayerDetail]  # per layer: times for drawing the trace


def default_schedule(plan: Plan) -> str:
    return "interleaved" if plan.vpp > 1 else "1f1b"


def _layout(name: str, plan: Plan, layers: int) -> tuple[Layout, list[tuple[int, ...]], list[int]]:
    pp = plan.pp
    if name == "dualpipe":
        sizes = chunk_sizes(pp, layers, plan.pp_layout)
        starts = [sum(sizes[:i]) for i in range(pp)]
        stage_layers = [tuple(range(starts[s], starts[s] + sizes[s])) for s in range(pp)]
        chunk_layers = stage_layers + stage_layers  # chunk pp + s is stage s of the upward pipeline
        ranks = list(range(pp)) + [pp - 1 - s for s in range(pp)]

        def prev(c: int) -> int | None:
            return None if c in (0, pp) else c - 1

        def nxt(c: int) -> int | None:
            return None if c in (pp - 1, 2 * pp - 1) else c + 1

        return Layout(ranks.__getitem__, prev, nxt), chunk_layers, ranks
    n = chunks_of_schedule(name, pp, plan.vpp)
    sizes = chunk_sizes(n, layers, plan.pp_layout)
    starts = [sum(sizes[:i]) for i in range(n)]
    chunk_layers = [tuple(range(starts[c], starts[c] + sizes[c])) for c in range(n)]
    ranks = [c % pp for c in range(n)]
    return (
        Layout(ranks.__getitem__, lambda c: c - 1 if c > 0 else None, lambda c: c + 1 if c < n - 1 else None),
        chunk_layers,
        ranks,
    )


def _forward_backward_s(st: Stage, slowdown: float) -> tuple[float, float]:
    """A stage cost's forward and backward time: each its compute and exposed communication, and the
    slowdown of its hidden communication split by their compute shares."""
    slow = st.hidden * slowdown
    share = st.fwd / (st.compute or 1.0)
    fwd = st.fwd + st.fwd_exposed + share * slow
    bwd = st.compute - st.fwd + (st.exposed - st.fwd_exposed) + (1 - share) * slow
    return fwd, bwd


def _chunk_cost(
    sc: StepCosts,
    model: ModelSpec,
    plan: Plan,
    layers: tuple[int, ...],
    rank_layers: tuple[int, ...],
    first: bool,
    last: bool,
    with_mtp: bool,
    split_w: bool,
) -> ChunkCost:
    n_rec = plan.recomputed_layers(len(rank_layers))
    recomputed = sum(1 for i in layers if i in rank_layers[:n_rec]) if plan.recompute == "full" else len(layers)
    # layers_cost counts the first `recomputed` of the given layers as recomputed
    st: Stage = layers_cost(sc, model, plan, layers, recomputed)
    fwd, bwd = _forward_backward_s(st, sc.slowdown)
    if first:
        fwd += sc.embed_fwd.compute_s + sc.embed_fwd.exposed_s + st.first_gather
        bwd += sc.embed_bwd.compute_s + sc.embed_bwd.exposed_s
    if with_mtp:
        mtp_fwd, mtp_bwd = _forward_backward_s(mtp_cost(sc, model, plan), sc.slowdown)
        fwd += mtp_fwd
        bwd += mtp_bwd
    heads = 1 + mtp_heads(model, plan)  # the output layer and loss, once more for each MTP module
    if last:
        fwd += heads * (sc.head_fwd.compute_s + sc.head_fwd.exposed_s)
        bwd += heads * (sc.head_bwd.compute_s + sc.head_bwd.exposed_s)
    wgrad = st.wgrad if split_w else 0.0
    policy_act = layers_saved_bytes(model, plan, sc.graph, layers, recomputed if plan.recompute == "full" else 0)
    if first:
        policy_act += sc.graph.embedding.saved_bytes(plan.recompute)
    if with_mtp:
        policy_act += mtp_saved_bytes(model, plan, sc.graph)
    if last:
        policy_act += heads * sc.graph.head.saved_bytes(plan.recompute)
    return ChunkCost(layers, fwd, bwd - wgrad, wgrad, policy_act)


def simulate_step(
    model: ModelSpec,
    cluster: Cluster,
    plan: Plan,
    schedule: str | None = None,
    straggler_fraction: float = 0.0,
    straggler_slowdown: float = 1.0,
) -> SimResult:
    name = schedule or default_schedule(plan)
    sc = step_costs(model, cluster, plan)
    layout, chunk_layers, chunk_rank = _layout(name, plan, model.layers)
    rank_layers = plan.rank_layers(model.layers)
    split_w = name in ("zb-h1", "dualpipe")
    n_chunks = len(chunk_layers)
    firsts = {c for c in range(n_chunks) if layout.prev(c) is None}
    lasts = {c for c in range(n_chunks) if layout.next(c) is None}
    # the MTP modules' chunk: the plan's when the schedule keeps Megatron's pp·vpp chunks, else the loss's
    mtps = {plan.mtp_chunk_index} if n_chunks == plan.pp * plan.vpp else lasts
    chunks = [
        _chunk_cost(
            sc,
            model,
            plan,
            chunk_layers[c],
            rank_layers[chunk_rank[c]] if name != "dualpipe" else chunk_layers[c],
            c in firsts,
            c in lasts,
            c in mtps,
            split_w,
        )
        for c in range(n_chunks)
    ]
    # stragglers: a stage's GPUs all wait for its slowest one
    gpus_per_stage = plan.gpus // plan.pp
    p_slow = 1 - (1 - straggler_fraction) ** gpus_per_stage if straggler_fraction > 0 else 0.0
    slowdown = [1 + (straggler_slowdown - 1) * p_slow] * plan.pp

    def duration(rank: int, a) -> float:
        c = chunks[a.chunk]
        base = {"F": c.fwd_s, "B": c.bwd_s, "W": c.wgrad_s}[a.kind]
        return base * slowdown[rank]

    lanes = build_schedule(name, plan.pp, plan.vpp, plan.grad_accum)
    # ZB-H1: rank r defers at most r weight-gradient actions — it holds pp - r in-flight micro-batches,
    # so activations never exceed 1F1B's peak (Qi et al. 2024, §3.1)
    cap = (lambda r: r) if name == "zb-h1" else None
    timeline = run_schedule(lanes, layout, duration, sc.p2p_s, split_w=split_w, max_pending_w=cap)

    # once-per-step DP traffic and the optimizer, per rank
    stages = [stage_cost(sc, model, plan, r) for r in range(plan.pp)]
    dps = [dp_comm(sc, model, cluster, plan, r, stages[r]) for r in range(plan.pp)]
    gather = max(d.gather_exposed_s for d in dps)
    optimizer_s = max(optimizer_time_s(model, cluster, plan, r) for r in range(plan.pp))
    ends = [max((t.end_s for t in tl), default=0.0) for tl in timeline]
    grad_tail = [d.grad_exposed_s for d in dps]
    pipeline_end = max(e + g for e, g in zip(ends, grad_tail, strict=True))
    step = gather + pipeline_end + optimizer_s
    # shift the pipeline after the exposed weight gather
    timeline = [[replace(t, start_s=t.start_s + gather, end_s=t.end_s + gather) for t in tl] for tl in timeline]

    # memory over time per rank: static + buffers + in-flight activations (+ backward working set)
    series, peaks = [], []
    for r in range(plan.pp):
        base = rank_memory(model, plan, sc.graph, cluster.gpu.arch, r)
        static = base.state.params + base.state.grads + base.state.optimizer
        if name == "dualpipe":  # two copies of the weights (one per direction) and their gradients
            static += base.state.params + base.state.grads
        workspace = base.workspace
        fixed = static + base.buffers - workspace
        live, points, peak = 0.0, [(0.0, fixed)], (fixed, 0.0, 0.0, 0)
        inflight = 0
        for t in timeline[r]:
            c = chunks[t.action.chunk]
            if t.action.kind == "F":
                live += c.activation_bytes
                inflight += 1
            if t.action.kind == "B":
                points.append((t.start_s, fixed + live + workspace))
                if (fixed + live + workspace) > peak[0]:
                    peak = (fixed + live + workspace, live, workspace, inflight)
            free_now = (t.action.kind == "B" and not split_w) or t.action.kind == "W"
            if free_now:
                live -= c.activation_bytes
                inflight -= 1
            points.append((t.end_s, fixed + live))
            if fixed + live > peak[0]:
                peak = (fixed + live, live, 0.0, inflight)
        points.append((step, fixed + live))
        series.append(points)
        peaks.append((peak, base, static, workspace))
    worst = max(range(plan.pp), key=lambda r: peaks[r][0][0])
    (peak_bytes, live_at_peak, ws_at_peak, inflight_at_peak), base, static, workspace = peaks[worst]
    state = base.state
    if name == "dualpipe":
        state = replace(state, params=2 * state.params, grads=2 * state.grads)
    mem = replace(
        base,
        state=state,
        activations=live_at_peak,
        buffers=base.buffers - workspace + ws_at_peak,
        inflight=inflight_at_peak,
    )
    host = host_gib_per_node(model, cluster, plan, worst, live_at_peak)
    memory = memory_breakdown(mem, cluster.gpu.hbm_gib, host)

    # time breakdown on the critical rank: busy compute, exposed comm, idle (bubble), optimizer
    crit = max(range(plan.pp), key=lambda r: ends[r] + grad_tail[r])
    busy = sum(t.end_s - t.start_s for t in timeline[crit])
    st = stages[crit]
    m = plan.grad_accum
    comm_busy = m * st.exposed * slowdown[crit]
    compute_s = busy - comm_busy
    exposed = comm_busy + gather + grad_tail[crit]
    bubble = step - compute_s - exposed - optimizer_s
    crit_dp = dps[crit]
    time = TimeBreakdown(
        compute_s=compute_s,
        exposed_comm_s=exposed,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        recompute_s=m * st.recompute * slowdown[crit],
        comm_total_s=m * (st.exposed + st.hidden) + crit_dp.total_s,
        host_stall_s=m * st.host_stall * slowdown[crit],
        detail={
            "schedule": float(["gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe"].index(name)),
            "straggler_stage_slowdown": slowdown[0],
            "critical_stage": float(crit),
        },
    )
    extra = (f"simulated with the {name} schedule",)
    est = make_estimate(model, cluster, plan, sc, step, time, memory, extra)
    return SimResult(
        est,
        name,
        timeline,
        chunks,
        chunk_rank,
        gather,
        grad_tail,
        optimizer_s,
        series,
        slowdown,
        _layer_detail(model, cluster, plan, sc),
    )


def _layer_detail(model: ModelSpec, cluster: Cluster, plan: Plan, sc: StepCosts) -> dict[int, LayerDetail]:
    """Per-layer times and the share of each layer's compute in its attention half (the ops before
    the MLP norm), for drawing layers as "attn" and "mlp" slices."""
    per_kind = {}
    for kind, group in sc.graph.layers.items():
        names = [op.name for op in group.ops]
        cut = names.index("mlp norm") if "mlp norm" in names else len(names)
        shares = [sum(times[:cut]) / (sum(times) or 1.0) for times in group_times_s(cluster.gpu, group, plan)]
        c = sc.layers[kind]
        rec = c.recompute_s if plan.recompute != "none" else 0.0
        per_kind[kind] = LayerDetail(
            c.fwd.compute_s,
            c.fwd.exposed_s,
            c.bwd.compute_s + rec,
            c.bwd.exposed_s + c.recompute_comm_s,
            c.fsdp_gather_s,
            c.fsdp_reduce_s,
            shares[0],
            shares[1],
        )
    kinds = model.layer_kinds()
    return {i: per_kind[kinds[i]] for i in range(model.layers)}
