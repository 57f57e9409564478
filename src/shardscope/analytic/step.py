"""The analytic step: a closed-form pipeline time over the shared step costs (`shardscope.step.core`), the
fast path for estimates and the planner. The simulator orders the same costs in time instead.

Step = m·(stage compute + exposed stage comm) + pipeline bubble + exposed DP comm + optimizer, where m is
the number of micro-batches per step and the stage is the slowest pipeline rank. Bubble: (pp-1)/vpp of
one micro-batch's forward+backward on a typical stage (1F1B / interleaved 1F1B, Narayanan et al. 2021).
"""

from __future__ import annotations

from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.result import Estimate, TimeBreakdown
from shardscope.step.core import (
    StepCosts,
    host_gib_per_node,
    make_estimate,
    memory_breakdown,
    pipeline_costs,
    ranks_memory,
    step_costs,
)


def estimate_step(
    model: ModelSpec,
    cluster: Cluster,
    plan: Plan,
    stack: str = "",
    stack_warnings: tuple[str, ...] = (),
    costs: StepCosts | None = None,
) -> Estimate:
    """The analytic fast path: closed-form pipeline time over the same op-graph costs as the simulator.
    `stack` labels the result with the software stack the plan came from, whose `stack_warnings` follow
    the estimate's own. `costs`: the plan's `step_costs(model, cluster, plan)` where the caller has them
    (the planner, which ranks MoE variants by them first)."""
    sc = step_costs(model, cluster, plan) if costs is None else costs
    m = plan.grad_accum
    pipe = pipeline_costs(sc, model, cluster, plan)
    slowest, dp, optimizer_s = pipe.slowest, pipe.dp, pipe.optimizer_s
    s = pipe.stages[slowest]
    bubble = (plan.pp - 1) / plan.vpp * pipe.typical if plan.pp > 1 else 0.0
    compute_mb = s.compute + max(dp.total_s - dp.exposed_s, 0.0) * sc.slowdown / max(m, 1)
    compute_s = m * compute_mb
    exposed_s = m * s.exposed + dp.exposed_s
    step = compute_s + exposed_s + bubble + optimizer_s
    mems = ranks_memory(model, plan, sc.graph, cluster.gpu.arch, sorted({0, plan.pp - 1, slowest, plan.pp // 2}))
    worst = max(mems, key=lambda x: x.allocated + x.overhead)
    time = TimeBreakdown(
        compute_s=compute_s,
        exposed_comm_s=exposed_s,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        recompute_s=m * s.recompute,
        comm_total_s=m * (s.exposed + s.hidden) + dp.total_s,
        host_stall_s=m * s.host_stall,
        detail={
            "dp_exposed_s": dp.exposed_s,
            "slowest_stage": float(slowest),
            "moe_hot_rank_factor": sc.graph.routing.hot_rank_factor,
        },
    )
    host = host_gib_per_node(model, cluster, plan, worst.rank, worst.activations)
    memory = memory_breakdown(worst, cluster.gpu.hbm_gib, host)
    return make_estimate(model, cluster, plan, sc, step, time, memory, stack_warnings, stack)
