"""Megatron-Core's selective recompute by module (`--recompute-modules`): layernorm, core_attn,
mla_up_proj, mlp, moe_act, moe, shared_experts, each re-run in every layer that has it.

`plan_modules` answers "which set fits my memory budget fastest" exactly: every subset of the modules
the model's layers have (at most 2^7) is estimated whole. `module_frontier` gives the search the sets
worth trying, least recompute first: a set is kept when it frees more activation memory than every set
that re-runs less forward time, both summed over the stage's layers from the op graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import TYPE_CHECKING

from shardscope.analytic.step import estimate_step
from shardscope.costs.compute import group_times_s
from shardscope.errors import ShardscopeError
from shardscope.graph.common import OpGroup
from shardscope.graph.ops import Saved
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import MEGATRON_MODULES, Plan, layers_by_rank
from shardscope.records import evolve

if TYPE_CHECKING:
    from shardscope.graph.build import StageGraph


@dataclass(frozen=True, slots=True)
class ModuleSet:
    modules: tuple[str, ...]  # Megatron recompute modules (empty: no recompute)
    required_gib: float
    step_time_s: float


@dataclass(frozen=True, slots=True)
class ModulesResult:
    kind: str  # "modules"
    budget_gib: float
    available: tuple[str, ...]  # the modules this model's layers have
    best: ModuleSet  # the fastest set that fits the budget
    frontier: list[ModuleSet]  # the sets no other set beats on both memory and time, fastest first


def recompute_modules_of(model: ModelSpec, cluster: Cluster, plan: Plan) -> tuple[str, ...]:
    """The Megatron recompute modules that drop some saved tensor of this plan's layers."""
    from shardscope.graph.build import build_stage_graph

    graph = build_stage_graph(model, plan, cluster.gpu.arch)
    tags = frozenset().union(*(s.modules for group in graph.layers.values() for s in _droppable(group)))
    return tuple(m for m in MEGATRON_MODULES if m in tags)


def _droppable(group: OpGroup) -> list[Saved]:
    """The tensors a layer keeps without recompute: those a recompute module can drop."""
    return [s for s in group.saved if "none" in s.policies]


def module_sets(model: ModelSpec, cluster: Cluster, plan: Plan) -> list[ModuleSet]:
    """Every subset of `recompute_modules_of`, each estimated as Megatron-Core's selective recompute."""
    available = recompute_modules_of(model, cluster, plan)
    out = []
    for combo in [(), *_subsets(available)]:
        p = evolve(plan, recompute="selective" if combo else "none", recompute_layers=0, recompute_modules=combo)
        est = estimate_step(model, cluster, p)
        out.append(ModuleSet(combo, est.memory.required_gib, est.step_time_s))
    return out


def pareto_sets(sets: list[ModuleSet]) -> list[ModuleSet]:
    """The sets that need less memory than every faster set, fastest first (ties: fewer modules)."""
    frontier: list[ModuleSet] = []
    for s in sorted(sets, key=lambda s: (s.step_time_s, s.required_gib, len(s.modules))):
        if not frontier or s.required_gib < frontier[-1].required_gib:
            frontier.append(s)
    return frontier


def plan_modules(model: ModelSpec, cluster: Cluster, plan: Plan, budget_gib: float) -> ModulesResult:
    """The Megatron `--recompute-modules` set that fits `budget_gib` at the shortest step time."""
    sets = module_sets(model, cluster, plan)
    available = max(sets, key=lambda s: len(s.modules)).modules  # the set of every module
    frontier = pareto_sets(sets)
    fitting = [s for s in frontier if s.required_gib <= budget_gib]
    if not fitting:
        least = frontier[-1]
        raise ShardscopeError(
            f"no set of Megatron recompute modules ({', '.join(available) or 'none here'}) fits --budget-gib "
            f"{budget_gib:g}: the least memory is {least.required_gib:.1f} GiB "
            f"({', '.join(least.modules) or 'no recompute'}); try --recompute full, more GPUs or --knob sac"
        )
    return ModulesResult("modules", budget_gib, available, fitting[0], frontier)


def _subsets(modules: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [c for k in range(1, len(modules) + 1) for c in combinations(modules, k)]


def _group_set_costs(cluster: Cluster, group: OpGroup, plan: Plan) -> dict[tuple[str, ...], tuple[float, float]]:
    """Per non-empty module set: forward time it re-runs and activation bytes it frees in one layer of
    `group` (a tensor is freed when any of its modules is recomputed), memoised on the group."""

    def costs() -> dict[tuple[str, ...], tuple[float, float]]:
        fwd = group_times_s(cluster.gpu, group, plan)[0]
        seconds: Counter[frozenset[str]] = Counter()  # by the set of modules that re-run an op
        for op, t in zip(group.ops, fwd, strict=True):
            seconds[op.modules] += t
        freed: Counter[frozenset[str]] = Counter()
        for saved in _droppable(group):
            freed[saved.modules] += saved.bytes
        available = tuple(m for m in MEGATRON_MODULES if any(m in tags for tags in freed))
        return {
            combo: (
                sum(t for tags, t in seconds.items() if tags.intersection(combo)),
                sum(b for tags, b in freed.items() if tags.intersection(combo)),
            )
            for combo in _subsets(available)
        }

    return group.memoised(("module set costs", cluster.gpu.name, plan.precision, plan.fp8_recipe), costs)


@lru_cache(maxsize=4096)
def memory_ranks(model: ModelSpec, pp: int, vpp: int, layout: tuple[int, ...]) -> tuple[int, ...]:
    """The pipeline ranks whose memory can be the largest: the first (most micro-batches in flight, the
    embedding), the last (the loss) and the middle rank holding the most layer parameters, the first of
    them on a tie (a MoE model's expert weights can peak there, past DeepSeek-V3's dense layers)."""
    if pp <= 2:
        return tuple(range(pp))
    kinds = model.layer_kinds()
    ranks = layers_by_rank(pp, vpp, model.layers, layout)
    middle = max(range(1, pp - 1), key=lambda r: (sum(model.layer_params_of(kinds[i]) for i in ranks[r]), -r))
    return (0, pp - 1, middle)


def _checked_stage_kinds(model: ModelSpec, cluster: Cluster, plan: Plan) -> tuple[StageGraph, Counter[LayerKind]]:
    """The op graph, and how many layers of each kind the ranks the search's fit check reads
    (`memory_ranks`) hold."""
    from shardscope.graph.build import build_stage_graph

    graph = build_stage_graph(model, plan, cluster.gpu.arch)

    def counts() -> Counter[LayerKind]:
        ranks = plan.rank_layers(model.layers)
        checked = memory_ranks(model, plan.pp, plan.vpp, plan.pp_layout)
        return Counter(graph.kinds[i] for r in checked for i in ranks[r])

    # memoised on the model by the layout that fixes them (the graph's kinds are the model's layers')
    return graph, model.memoised(("checked stage kinds", plan.pp, plan.vpp, plan.pp_layout), counts)


def module_frontier(model: ModelSpec, cluster: Cluster, plan: Plan) -> list[tuple[tuple[str, ...], float]]:
    """Module sets that free more activation memory on the ranks the search's fit check reads
    (`memory_ranks`) than every set re-running less forward time there, least recompute first, each with
    that forward time (s per micro-batch, summed over those ranks' layers). Memoised on the op graph."""
    graph, counts = _checked_stage_kinds(model, cluster, plan)

    def frontier() -> list[tuple[tuple[str, ...], float]]:
        totals: dict[tuple[str, ...], list[float]] = {}
        for kind, n in counts.items():
            for combo, (seconds, freed) in _group_set_costs(cluster, graph.layers[kind], plan).items():
                acc = totals.setdefault(combo, [0.0, 0.0])
                acc[0] += n * seconds
                acc[1] += n * freed
        out: list[tuple[tuple[str, ...], float]] = []
        most = 0.0
        for combo, (seconds, freed) in sorted(totals.items(), key=lambda kv: (kv[1][0], -kv[1][1], len(kv[0]))):
            if freed > most:
                out.append((combo, seconds))
                most = freed
        return out

    key = ("module frontier", cluster.gpu.name, plan.precision, plan.fp8_recipe, tuple(sorted(counts.items(), key=str)))
    return graph.layer.memoised(key, frontier)


def layers_forward_s(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """Forward time of every layer of the ranks `memory_ranks` names (s per micro-batch): what full
    recompute of all of them re-runs, on the scale of `module_frontier`'s times."""
    graph, counts = _checked_stage_kinds(model, cluster, plan)
    return sum(n * sum(group_times_s(cluster.gpu, graph.layers[k], plan)[0]) for k, n in counts.items())
