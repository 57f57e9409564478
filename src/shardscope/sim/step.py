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
    all-to-alls hide under another micro-batch's compute with `ep_comm_overlap`. Under DualPipe that
    holds exactly for the chunks of its overlapped forward-backward pairs; its other chunks (warm-up,
    cool-down) run with their all-to-alls exposed.
  * Stragglers: `straggler_fraction` of GPUs run `straggler_slowdown` times slower; every collective
    waits for them, so a stage slows if any of its GPUs is a straggler (probability 1 - (1 - f)^n).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from shardscope.costs.compute import group_times_s
from shardscope.costs.memory import (
    StateBytes,
    layers_saved_bytes,
    model_state_bytes,
    mtp_heads,
    mtp_saved_bytes,
    rank_params_local,
)
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan, chunk_sizes
from shardscope.records import evolve
from shardscope.result import Estimate, TimeBreakdown
from shardscope.sim.engine import Layout, Timed, input_ready_s, run_schedule
from shardscope.sim.schedules import Action, Unit, build_schedule, chunks_of_schedule, dualpipe_units
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
    paired_share,
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
    fwd_exposed_s: float = 0.0  # exposed communication inside fwd_s
    bwd_exposed_s: float = 0.0  # exposed communication inside bwd_s
    # as one half of a DualPipe overlapped forward-backward pair (else the same as fwd_s, bwd_s, ...)
    paired_fwd_s: float = 0.0
    paired_bwd_s: float = 0.0
    paired_fwd_exposed_s: float = 0.0
    paired_bwd_exposed_s: float = 0.0


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


def _paired_hidden_s(sc: StepCosts, counts: Mapping[LayerKind, int]) -> tuple[float, float]:
    """Forward and backward all-to-all time that `counts` blocks hide under another micro-batch's
    compute blocks when paired with it (`ep_comm_overlap`; 0 without it)."""
    fwd = sum(n * sc.layers[k].fwd.paired_hidden_s for k, n in counts.items())
    bwd = sum(n * sc.layers[k].bwd.paired_hidden_s for k, n in counts.items())
    return fwd, bwd


def _exposing(st: Stage, paired: tuple[float, float], more: float) -> Stage:
    """`st` with `more` of a micro-batch's paired all-to-alls (`_paired_hidden_s`) exposed rather than
    hidden (negative: hidden rather than exposed), as `step.core` counts the unpaired share."""
    fwd, bwd = paired
    return replace(
        st,
        exposed=st.exposed + more * (fwd + bwd),
        hidden=st.hidden - more * (fwd + bwd),
        fwd_exposed=st.fwd_exposed + more * fwd,
    )


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
    dualpipe: bool = False,
) -> ChunkCost:
    """One micro-batch's pass through a model chunk. The step's costs count the paired all-to-alls of
    `ep_comm_overlap` exposed in the plan's unpaired share of micro-batches; with `dualpipe` the chunk's
    F and B instead run fully exposed alone and fully paired inside DualPipe's overlapped pairs."""
    n_rec = plan.recomputed_layers(len(rank_layers))
    recomputed = sum(1 for i in layers if i in rank_layers[:n_rec]) if plan.recompute == "full" else len(layers)
    # layers_cost counts the first `recomputed` of the given layers as recomputed
    st: Stage = layers_cost(sc, model, plan, layers, recomputed)
    mtp = mtp_cost(sc, model, plan) if with_mtp else None
    unpaired = 1.0 - paired_share(plan)  # the share both count exposed
    layer_pairs = _paired_hidden_s(sc, model.kind_counts(layers))
    trains_mtp = mtp is not None and plan.mtp and model.mtp_layers
    mtp_pairs = _paired_hidden_s(sc, {model.mtp_kind: model.mtp_layers}) if trains_mtp else (0.0, 0.0)
    heads = 1 + mtp_heads(model, plan)  # the output layer and loss, once more for each MTP module

    def times(alone: float) -> tuple[float, float, float, float]:
        """Forward, backward and their exposed communication with `alone` of the pairs exposed."""
        blocks = _exposing(st, layer_pairs, alone - unpaired)
        fwd, bwd = _forward_backward_s(blocks, sc.slowdown)
        fwd_exp, bwd_exp = blocks.fwd_exposed, blocks.exposed - blocks.fwd_exposed
        if first:
            fwd += sc.embed_fwd.compute_s + sc.embed_fwd.exposed_s + blocks.first_gather
            bwd += sc.embed_bwd.compute_s + sc.embed_bwd.exposed_s
            fwd_exp += sc.embed_fwd.exposed_s + blocks.first_gather
            bwd_exp += sc.embed_bwd.exposed_s
        if mtp is not None:
            own = _exposing(mtp, mtp_pairs, alone - unpaired)
            mtp_fwd, mtp_bwd = _forward_backward_s(own, sc.slowdown)
            fwd += mtp_fwd
            bwd += mtp_bwd
            fwd_exp += own.fwd_exposed
            bwd_exp += own.exposed - own.fwd_exposed
        if last:
            fwd += heads * (sc.head_fwd.compute_s + sc.head_fwd.exposed_s)
            bwd += heads * (sc.head_bwd.compute_s + sc.head_bwd.exposed_s)
            fwd_exp += heads * sc.head_fwd.exposed_s
            bwd_exp += heads * sc.head_bwd.exposed_s
        return fwd, bwd, fwd_exp, bwd_exp

    wgrad = st.wgrad if split_w else 0.0
    policy_act = layers_saved_bytes(model, plan, sc.graph, layers, recomputed if plan.recompute == "full" else 0)
    if first:
        policy_act += sc.graph.embedding.saved_bytes(plan.recompute)
    if with_mtp:
        policy_act += mtp_saved_bytes(model, plan, sc.graph)
    if last:
        policy_act += heads * sc.graph.head.saved_bytes(plan.recompute)
    fwd, bwd, fwd_exp, bwd_exp = times(1.0 if dualpipe else unpaired)
    p_fwd, p_bwd, p_fwd_exp, p_bwd_exp = times(0.0) if dualpipe else (fwd, bwd, fwd_exp, bwd_exp)
    return ChunkCost(
        layers, fwd, bwd - wgrad, wgrad, policy_act, fwd_exp, bwd_exp, p_fwd, p_bwd - wgrad, p_fwd_exp, p_bwd_exp
    )


def run_units(
    units: list[list[Unit]],
    layout: Layout,
    duration_s: Callable[[int, Action, bool], float],
    transfer_s: float,
) -> list[list[Timed]]:
    """Start and end times of every action of per-rank unit orders (`schedules.dualpipe_units`): each
    rank runs its units in order, a unit once all its inputs are in; a pair's actions run one after the
    other (their times from `duration_s(rank, action, overlapped)`) and hand both outputs on at the
    pair's end, as DualPipe's `_forward_backward_chunk` sends after computing both. Raises if the
    orders deadlock (a schedule bug)."""
    n = len(units)
    pos, free = [0] * n, [0.0] * n
    done: dict[tuple[str, int, int], float] = {}
    out: list[list[Timed]] = [[] for _ in range(n)]

    def ready_time(a: Action, rank: int) -> float | None:
        return input_ready_s(a, rank, done, layout, transfer_s)

    while any(pos[r] < len(units[r]) for r in range(n)):
        progressed = False
        for r in range(n):
            while pos[r] < len(units[r]):
                unit = units[r][pos[r]]
                inputs = [ready_time(a, r) for a in unit.actions]
                if any(t is None for t in inputs):
                    break
                clock = max([free[r], *(t for t in inputs if t is not None)])
                for a in unit.actions:
                    end = clock + duration_s(r, a, unit.overlapped)
                    out[r].append(Timed(a, r, clock, end))
                    clock = end
                for a in unit.actions:
                    done[(a.kind, a.mb, a.chunk)] = clock
                free[r] = clock
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = {r: units[r][pos[r]].actions for r in range(n) if pos[r] < len(units[r])}
            raise RuntimeError(f"pipeline schedule deadlocks at {stuck}")
    return out


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
    dualpipe = name == "dualpipe"
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
            dualpipe,
        )
        for c in range(n_chunks)
    ]
    # stragglers: a stage's GPUs all wait for its slowest one
    gpus_per_stage = plan.gpus // plan.pp
    p_slow = 1 - (1 - straggler_fraction) ** gpus_per_stage if straggler_fraction > 0 else 0.0
    slowdown = [1 + (straggler_slowdown - 1) * p_slow] * plan.pp

    def duration(rank: int, a: Action) -> float:
        c = chunks[a.chunk]
        base = {"F": c.fwd_s, "B": c.bwd_s, "W": c.wgrad_s}[a.kind]
        return base * slowdown[rank]

    # DualPipe splits only some backwards zero-bubble style: those with a W action in its order
    split: set[tuple[int, int]] = set()
    overlapped: set[Action] = set()  # the actions DualPipe runs inside an overlapped F&B pair
    if dualpipe:
        units = dualpipe_units(plan.pp, plan.grad_accum)
        split = {(a.mb, a.chunk) for rank in units for u in rank for a in u.actions if a.kind == "W"}
        overlapped = {a for rank in units for u in rank if u.overlapped for a in u.actions}

        def dual_duration(rank: int, a: Action, in_pair: bool) -> float:
            c = chunks[a.chunk]
            if a.kind == "F":
                base = c.paired_fwd_s if in_pair else c.fwd_s
            elif a.kind == "B":
                base = (c.paired_bwd_s if in_pair else c.bwd_s) + (0.0 if (a.mb, a.chunk) in split else c.wgrad_s)
            else:
                base = c.wgrad_s
            return base * slowdown[rank]

        timeline = run_units(units, layout, dual_duration, sc.p2p_s)
    else:
        lanes = build_schedule(name, plan.pp, plan.vpp, plan.grad_accum)
        # ZB-H1: rank r defers at most r weight-gradient actions — it holds pp - r in-flight micro-batches,
        # so activations never exceed 1F1B's peak (Qi et al. 2024, §3.1)
        cap = (lambda r: r) if name == "zb-h1" else None
        timeline = run_schedule(lanes, layout, duration, sc.p2p_s, split_w=split_w, max_pending_w=cap)

    def frees(a: Action) -> bool:
        """Whether `a` frees its micro-batch's activations: a W, or a B that computes its weight gradient."""
        return a.kind == "W" or (a.kind == "B" and not (split_w and (not dualpipe or (a.mb, a.chunk) in split)))

    # once-per-step DP traffic and the optimizer, per rank; a DualPipe rank holds stage r and stage
    # pp-1-r (one per direction) and reduces and gathers the weights of both
    pp = plan.pp
    held = [(r, pp - 1 - r) if dualpipe else (r,) for r in range(pp)]
    stages = [stage_cost(sc, model, plan, r) for r in range(pp)]
    dps = [dp_comm(sc, model, cluster, plan, r, stages[r]) for r in range(pp)]
    gather = max(sum(dps[s].gather_exposed_s for s in held[r]) for r in range(pp))
    # the optimizer state of a stage is split over the data-parallel ranks of both its DualPipe copies
    # (their gradients are summed), so a rank steps half of each of its two stages
    optimizer_s = max(sum(optimizer_time_s(model, cluster, plan, s) for s in held[r]) / len(held[r]) for r in range(pp))
    ends = [max((t.end_s for t in tl), default=0.0) for tl in timeline]
    grad_tail = [sum(dps[s].grad_exposed_s for s in held[r]) for r in range(pp)]
    pipeline_end = max(e + g for e, g in zip(ends, grad_tail, strict=True))
    step = gather + pipeline_end + optimizer_s
    # shift the pipeline after the exposed weight gather
    timeline = [[replace(t, start_s=t.start_s + gather, end_s=t.end_s + gather) for t in tl] for tl in timeline]

    # memory over time per rank: static + buffers + in-flight activations (+ backward working set)
    series, peaks = [], []
    for r in range(pp):
        base = rank_memory(model, plan, sc.graph, cluster.gpu.arch, r)
        state, workspace = base.state, base.workspace
        buffers = base.buffers - workspace
        if dualpipe:
            # two copies of the model, one per direction (DualPipe README: "Parameter 2×"): the weights,
            # gradients and FP8 weight copies of both stages; the optimizer state as `optimizer_s` splits it
            mirror = rank_memory(model, plan, sc.graph, cluster.gpu.arch, pp - 1 - r)
            shared = StateBytes(0.0, 0.0, 0.0)
            if plan.mtp and model.mtp_layers and plan.mtp_rank > 0 and {0, plan.mtp_rank} <= set(held[r]):
                # the MTP modules' embedding copy: with the first stage on the same rank they share its
                # embedding (DeepSeek-V3 report §3.2.3, "Shared Embedding and Output Head for MTP")
                shared = model_state_bytes(model.vocab * model.hidden / plan.tp, plan)
            state = StateBytes(
                state.params + mirror.state.params - shared.params,
                state.grads + mirror.state.grads - shared.grads,
                (state.optimizer + mirror.state.optimizer - shared.optimizer) / 2,
            )
            buffers += mirror.buffers - mirror.workspace
            workspace = max(workspace, mirror.workspace)
        static = state.params + state.grads + state.optimizer
        fixed = static + buffers
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
            if frees(t.action):
                live -= c.activation_bytes
                inflight -= 1
            points.append((t.end_s, fixed + live))
            if fixed + live > peak[0]:
                peak = (fixed + live, live, 0.0, inflight)
        points.append((step, fixed + live))
        series.append(points)
        peaks.append((peak, base, state, buffers))
    worst = max(range(pp), key=lambda r: peaks[r][0][0])
    (peak_bytes, live_at_peak, ws_at_peak, inflight_at_peak), base, state, buffers = peaks[worst]
    mem = replace(base, state=state, activations=live_at_peak, buffers=buffers + ws_at_peak, inflight=inflight_at_peak)
    host = host_gib_per_node(model, cluster, plan, worst, live_at_peak)
    memory = memory_breakdown(mem, cluster.gpu.hbm_gib, host)

    # time breakdown on the critical rank: busy compute, exposed comm, idle (bubble), optimizer
    crit = max(range(pp), key=lambda r: ends[r] + grad_tail[r])
    busy = sum(t.end_s - t.start_s for t in timeline[crit])
    m = plan.grad_accum
    # the critical rank's stages and the micro-batches each of them runs
    runs = [(stages[s], m / len(held[crit])) for s in held[crit]]
    if dualpipe:  # exposed communication as each action ran it (alone, or inside an overlapped pair)
        comm_busy = 0.0
        for t in timeline[crit]:
            c, a = chunks[t.action.chunk], t.action
            if a.kind == "F":
                comm_busy += c.paired_fwd_exposed_s if a in overlapped else c.fwd_exposed_s
            elif a.kind == "B":
                comm_busy += c.paired_bwd_exposed_s if a in overlapped else c.bwd_exposed_s
        comm_busy *= slowdown[crit]
    else:
        comm_busy = m * stages[crit].exposed * slowdown[crit]
    compute_s = busy - comm_busy
    exposed = comm_busy + gather + grad_tail[crit]
    bubble = step - compute_s - exposed - optimizer_s
    time = TimeBreakdown(
        compute_s=compute_s,
        exposed_comm_s=exposed,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        recompute_s=sum(n * st.recompute for st, n in runs) * slowdown[crit],
        comm_total_s=sum(n * (st.exposed + st.hidden) for st, n in runs) + sum(dps[s].total_s for s in held[crit]),
        host_stall_s=sum(n * st.host_stall for st, n in runs) * slowdown[crit],
        detail={
            "schedule": float(["gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe"].index(name)),
            "straggler_stage_slowdown": slowdown[0],
            "critical_stage": float(crit),
        },
    )
    extra = (f"simulated with the {name} schedule",)
    est = make_estimate(model, cluster, plan, sc, step, time, memory, extra)
    if dualpipe:  # a rank holds the weights of its two stages (less the embedding the MTP module shares)
        mtp_shares = plan.mtp and model.mtp_layers and plan.mtp_rank > 0
        embedding = model.vocab * model.hidden / plan.tp

        def held_params(r: int) -> float:
            both = sum(p for s in held[r] for p in rank_params_local(model, plan, s))
            return both - (embedding if mtp_shares and {0, plan.mtp_rank} <= set(held[r]) else 0.0)

        per_gpu = max(held_params(r) for r in range(pp))
        est = evolve(est, params=replace(est.params, per_gpu=int(round(per_gpu))))
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
