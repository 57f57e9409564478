"""One self-contained HTML page (no network needed to open it) with interactive plots of a plan search:
memory per pipeline stage of the best plan, every feasible plan as throughput vs memory with the Pareto
front, the time breakdown of the best plans, and the best plan's simulated timeline.

The page embeds its data as JSON and draws SVG with a few lines of vanilla JavaScript (hover for
details, click a plan to highlight it); nothing is fetched.
"""

from __future__ import annotations

from pathlib import Path

from shardscope.costs.memory import GIB
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.planner.search import Candidate, SearchResult
from shardscope.report.page import fill_page
from shardscope.sim.step import SimResult
from shardscope.step.core import rank_memory, step_costs


def _label(c: Candidate) -> str:
    p = c.plan
    parts = [f"TP{p.tp}", f"PP{p.pp}" + (f"x{p.vpp}" if p.vpp > 1 else ""), f"CP{p.cp}", f"DP{p.dp}"]
    if p.ep > 1:
        parts.append(f"EP{p.ep}")
    rec = p.recompute + (f"({p.recompute_layers})" if p.recompute_layers else "")
    rec = f"selective({','.join(p.recompute_modules)})" if p.recompute_modules else rec
    return " ".join(parts) + f" {p.sharding_name} {rec} mb{p.micro_batch}" + (" offload" if p.offload_optimizer else "")


def _precision(p) -> str:
    return f"FP8 ({p.fp8_recipe})" if p.precision == "fp8" else p.precision.upper()


def report_data(model: ModelSpec, cluster: Cluster, result: SearchResult, sim: SimResult | None, top: int = 10) -> dict:
    best = result.candidates[0]
    sc = step_costs(model, cluster, best.plan)
    stages = []
    for r in range(best.plan.pp):
        m = rank_memory(model, best.plan, sc.graph, cluster.gpu.arch, r)
        stages.append(
            {
                "stage": r,
                "params": m.state.params / GIB,
                "grads": m.state.grads / GIB,
                "optimizer": m.state.optimizer / GIB,
                "activations": m.activations / GIB,
                "buffers": m.buffers / GIB,
                "overhead": m.overhead / GIB,
            }
        )
    pareto = {id(c) for c in result.pareto()}
    plans = [
        {
            "label": _label(c),
            "tokens_per_s_per_gpu": c.estimate.tokens_per_s_per_gpu,
            "mfu": c.estimate.mfu,
            "memory_gib": c.estimate.memory.required_gib,
            "pareto": id(c) in pareto,
        }
        for c in result.candidates
    ]
    times = [
        {
            "label": _label(c),
            "compute": c.estimate.time.compute_s - c.estimate.time.host_stall_s,
            "host": c.estimate.time.host_stall_s,
            "comm": c.estimate.time.exposed_comm_s,
            "bubble": c.estimate.time.bubble_s,
            "optimizer": c.estimate.time.optimizer_s,
        }
        for c in result.candidates[:top]
    ]
    timeline = []
    if sim is not None:
        for r, tl in enumerate(sim.timeline):
            for t in tl:
                timeline.append(
                    {
                        "rank": r,
                        "kind": t.action.kind,
                        "mb": t.action.mb,
                        "chunk": t.action.chunk,
                        "start": t.start_s,
                        "end": t.end_s,
                    }
                )
    return {
        "title": f"{model.name} on {cluster.gpus}x {cluster.gpu.name}, {_precision(best.plan)}, "
        f"{best.plan.global_batch} x {best.plan.seq_len} tokens a step",
        "capacity_gib": cluster.gpu.hbm_gib,
        "best": _label(best),
        "best_estimate": {
            "step_time_s": best.estimate.step_time_s,
            "mfu": best.estimate.mfu,
            "tokens_per_s_per_gpu": best.estimate.tokens_per_s_per_gpu,
            "memory_gib": best.estimate.memory.required_gib,
        },
        "warnings": list(best.estimate.warnings),
        "searched": result.structures,
        "feasible": result.evaluated,
        "stages": stages,
        "plans": plans,
        "times": times,
        "timeline": timeline,
        "step_time_s": sim.estimate.step_time_s if sim else best.estimate.step_time_s,
    }


_TEMPLATE = "template.html"  # the page: HTML, CSS and the plotting JavaScript


def write_report(path: Path, model: ModelSpec, cluster: Cluster, result: SearchResult, sim: SimResult | None) -> None:
    from importlib import resources

    data = report_data(model, cluster, result, sim)
    template = (resources.files("shardscope.report") / _TEMPLATE).read_text()
    Path(path).write_text(fill_page(template, data["title"], data))
