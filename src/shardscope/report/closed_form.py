"""The analytic estimate laid out in time, for `estimate --trace` without `--simulate`.

The closed form prices a step as m micro-batches of the slowest stage, plus the pipeline bubble, the
exposed data-parallel traffic and the optimizer (`analytic.step`). This draws exactly that: every
rank runs its 1F1B (or interleaved) order of forward and backward chunks back to back, each the slowest
stage's time split by its forward share; the bubble is idle time (the fill before a rank's first
forward in proportion to its depth, the drain after its last backward); the exposed weight gather opens
the step and the gradient tail and the optimizer close it. So the trace ends at the estimate's step
time, and its parts are the estimate's parts. The simulator's own schedule is `--simulate --trace`.
"""

from __future__ import annotations

from dataclasses import replace

from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.result import Estimate
from shardscope.sim.engine import Timed
from shardscope.sim.schedules import build_schedule
from shardscope.sim.step import SimResult, _chunk_cost, _layer_detail, _layout, default_schedule
from shardscope.step.core import dp_comm, rank_memory, stage_cost, step_costs


def closed_form_timeline(model: ModelSpec, cluster: Cluster, plan: Plan, est: Estimate) -> SimResult:
    """The timeline of the analytic estimate `est` of `plan` (see the module docstring)."""
    name = default_schedule(plan)
    sc = step_costs(model, cluster, plan)
    m, pp, vpp = plan.grad_accum, plan.pp, plan.vpp
    t = est.time
    slowest = int(t.detail.get("slowest_stage", 0.0))
    st = stage_cost(sc, model, plan, slowest)
    dp = dp_comm(sc, model, cluster, plan, slowest, st)
    per_mb = (t.compute_s + t.exposed_comm_s - dp.exposed_s) / m  # the slowest stage's micro-batch
    fwd_share = (st.fwd + st.fwd_exposed) / ((st.compute + st.exposed) or 1.0)
    fwd_s, bwd_s = fwd_share * per_mb / vpp, (1 - fwd_share) * per_mb / vpp

    layout, chunk_layers, chunk_rank = _layout(name, plan, model.layers)
    rank_layers = plan.rank_layers(model.layers)
    n = len(chunk_layers)
    chunks = [
        replace(
            _chunk_cost(
                sc, model, plan, chunk_layers[c], rank_layers[chunk_rank[c]],
                layout.prev(c) is None, layout.next(c) is None, c == plan.mtp_chunk_index, False,
            ),
            fwd_s=fwd_s,
            bwd_s=bwd_s,
        )
        for c in range(n)
    ]  # fmt: skip
    lanes = build_schedule(name, pp, vpp, m)
    timeline: list[list[Timed]] = []
    series: list[list[tuple[float, float]]] = []
    for r in range(pp):
        fill = r / (pp - 1) * fwd_share * t.bubble_s if pp > 1 else 0.0
        clock = dp.gather_exposed_s + fill
        base = rank_memory(model, plan, sc.graph, cluster.gpu.arch, r)
        fixed = base.state.params + base.state.grads + base.state.optimizer + base.buffers
        live, points, rank_line = 0.0, [(0.0, fixed)], []
        for action in (a for lane in lanes[r] for a in lane):
            end = clock + (fwd_s if action.kind == "F" else bwd_s)
            rank_line.append(Timed(action, r, clock, end))
            live += chunks[action.chunk].activation_bytes * (1 if action.kind == "F" else -1)
            points.append((end, fixed + live))
            clock = end
        points.append((est.step_time_s, fixed + live))
        timeline.append(rank_line)
        series.append(points)
    # gather + m micro-batches + the bubble (fill before, drain after) + gradient tail + optimizer = the step
    grad_tail = [dp.grad_exposed_s] * pp
    return SimResult(
        est,
        f"{name} (closed form)",
        timeline,
        chunks,
        chunk_rank,
        dp.gather_exposed_s,
        grad_tail,
        t.optimizer_s,
        series,
        [1.0] * pp,
        _layer_detail(model, cluster, plan, sc),
    )
