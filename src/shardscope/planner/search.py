"""Search every valid plan: prune by memory first, then rank by throughput, memory or cost.

For each parallel structure (see `space.structures`) the recompute levels are tried from cheapest to
most memory-saving and the first that fits is timed: more recompute only costs time, so the others
are dominated. Past op-level selective, Megatron's module sets and full recompute of some layers are
not ordered by cost, so the first fit of each is timed (`evaluate_structure`). Memory is checked
before time: a floor that no recompute level or offload choice can go below (the smaller model state
plus the buffers of the first and last stage) drops a structure before any level is tried, and op
graphs are shared between structures that differ only in pipeline/data parallelism, sharding or
recompute.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from shardscope.analytic.step import estimate_step
from shardscope.costs.comm import deepep_beyond_nvlink_peers
from shardscope.costs.memory import GIB, StateBytes, activation_bytes
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan, cuda_graph_problem, ep_overlap_problem, make_plan, section_fields
from shardscope.planner.modules import layers_forward_s, memory_ranks, module_frontier
from shardscope.planner.space import AUTO_EP_DISPATCHES, RECOMPUTE_LEVELS, SearchSpace, structures
from shardscope.records import evolve
from shardscope.result import Estimate
from shardscope.step.core import (
    StepCosts,
    allocated_bytes,
    fixed_rank_memory,
    overhead_bytes,
    place_groups,
    rank_stage,
    step_costs,
)

if TYPE_CHECKING:
    from shardscope.graph.build import StageGraph

OBJECTIVES = ("throughput", "memory", "cost")


@dataclass(frozen=True, slots=True)
class Candidate:
    plan: Plan
    estimate: Estimate

    def key(self, objective: str) -> tuple:
        e = self.estimate
        if objective == "memory":
            return (e.memory.required_gib, -e.tokens_per_s_per_gpu)
        return (-e.tokens_per_s_per_gpu, e.memory.required_gib)  # cost per token ∝ 1 / throughput


@dataclass(frozen=True, slots=True)
class SearchResult:
    candidates: list[Candidate]  # feasible plans, best first
    structures: int  # parallel structures considered
    evaluated: int  # plans timed
    objective: str

    def pareto(self) -> list[Candidate]:
        """Plans no other plan beats on both throughput and memory."""
        front, best_mem = [], math.inf
        for c in sorted(
            self.candidates, key=lambda c: (-c.estimate.tokens_per_s_per_gpu, c.estimate.memory.required_gib)
        ):
            if c.estimate.memory.required_gib < best_mem:
                front.append(c)
                best_mem = c.estimate.memory.required_gib
        return front


# Plans the search returns leave this much of the GPU free: memory estimates are not exact to the last
# GiB, and a plan at 99.9% of HBM fails on the first allocator hiccup.
HEADROOM_GIB = 2.0


def _parts_footprint_gib(state: StateBytes, activations: float, buffers: float, freed: bool = False) -> float:
    """What the `RankMemory` of these parts (`rank_memory`) allocates, with the overhead outside the allocator,
    in GiB: the footprint checked against HBM, without building the record."""
    return (allocated_bytes(state, activations, buffers, freed) + overhead_bytes(activations, buffers)) / GIB


def _fits_memory(model: ModelSpec, cluster: Cluster, plan: Plan, fixed: dict | None = None) -> bool:
    """The ranks whose memory can be the largest (`memory_ranks`) within HBM less the headroom. `fixed`
    keeps, across the plans of one structure, its op graph and checked ranks (`_structure_parts`), each
    rank's model state and buffers (`_fixed_parts`) and activations (`_activations`)."""
    arch = cluster.gpu.arch
    if fixed is None:
        fixed = {}
    graph, ranks = _structure_parts(model, plan, arch, fixed)
    limit = cluster.gpu.hbm_gib - HEADROOM_GIB
    freed = not plan.persistent_grads and plan.grad_accum == 1  # as `rank_memory` reads the plan
    for rank in ranks:
        state, buffers = _fixed_parts(model, plan, graph, arch, rank, fixed)
        act, workspace, _ = _activations(model, plan, graph, rank, fixed)
        if _parts_footprint_gib(state, act, buffers + workspace, freed) > limit:
            return False
    return True


def _structure_parts(model: ModelSpec, plan: Plan, arch: str, fixed: dict) -> tuple[StageGraph, tuple[int, ...]]:
    """The op graph and the ranks the fit check reads (`memory_ranks`), kept in `fixed` for the plans of one
    structure: they differ only in recompute and optimizer offload, which neither reads (no recompute or
    sharding field is a graph field: `Plan`'s `opt(graph=...)`)."""
    parts = fixed.get("structure")
    if parts is None:
        from shardscope.graph.build import build_stage_graph

        ranks = memory_ranks(model, plan.pp, plan.vpp, plan.pp_layout)
        parts = fixed["structure"] = build_stage_graph(model, plan, arch), ranks
    return parts


# the recompute section's values (`_activations`' key: every field of the section, none forgotten)
_RECOMPUTE_SECTION = attrgetter(*section_fields("recompute"))


def _activations(model: ModelSpec, plan: Plan, graph: StageGraph, rank: int, fixed: dict) -> tuple[float, float, int]:
    """A rank's `activation_bytes`, kept in `fixed` for the plans of one structure: they differ only in
    recompute and optimizer offload, and offload does not change activations."""
    key = ("activations", rank, _RECOMPUTE_SECTION(plan))
    acts = fixed.get(key)
    if acts is None:
        acts = fixed[key] = activation_bytes(model, plan, graph, rank)
    return acts


def _fixed_parts(
    model: ModelSpec, plan: Plan, graph: StageGraph, arch: str, rank: int, fixed: dict
) -> tuple[StateBytes, float]:
    """A rank's model state and buffers (`fixed_rank_memory`), kept in `fixed` for the plans of one
    structure: they differ only in recompute and optimizer offload, and only offload changes these."""
    key = (rank, plan.offload_optimizer)
    parts = fixed.get(key)
    if parts is None:
        parts = fixed[key] = fixed_rank_memory(model, plan, graph, arch, rank)
    return parts


def _runnable(model: ModelSpec, plan: Plan, space: SearchSpace) -> bool:
    """Whether the framework release the plans are exported to (`SearchSpace.runnable_by`) can run `plan`."""
    if not space.runnable_by:
        return True
    from shardscope.planner.export import runnable_problems

    return not runnable_problems(space.runnable_by, model, plan)


def moe_variants(plan: Plan, space: SearchSpace, cluster: Cluster, model: ModelSpec | None = None) -> Iterator[Plan]:
    """`plan` under each token dispatcher and EP overlap setting the space allows (the overlap only where
    Megatron-Core can run it: `ep_overlap_problem`). Left to choose, an EP group wider than DeepEP's
    NVLink peers inside one NVLink domain (GB200 NVL72) tries HybridEP in DeepEP's place: DeepEP runs
    well under it there (`costs.comm.DEEPEP_MNNVL_GBPS`), as NVIDIA's DeepSeek-V3 GB200 guide found. DeepEP
    builds its routing map fused (Megatron's `--enable-experimental`, which the export then sets): unfused
    it synchronises the stream for nothing. Under MXFP8 the experts run Transformer Engine's fused grouped
    MLP (`Plan.fused_expert_mlp`), which only saves work, where the exported-to framework runs it (with `model`
    given, variants it cannot run are left out: `SearchSpace.runnable_by`)."""
    if plan.ep == 1:
        yield plan
        return
    overlap_ok = ep_overlap_problem(plan) is None
    dispatchers = space.ep_dispatches
    if dispatchers == AUTO_EP_DISPATCHES and deepep_beyond_nvlink_peers(place_groups(cluster, plan).ep):
        dispatchers = tuple("hybridep" if d == "deepep" else d for d in dispatchers)
    for dispatch in dispatchers:
        for overlap in space.ep_overlaps:
            if overlap and not overlap_ok:
                continue
            variant = evolve(
                plan,
                ep_dispatch=dispatch,
                ep_comm_overlap=overlap,
                deepep_fused_routing_map=True,
                fused_expert_mlp=plan.precision == "fp8" and plan.fp8_recipe == "mxfp8",
            )
            if model is not None and not _runnable(model, variant, space):
                # the fused expert MLP is Transformer Engine's: a framework without it runs the experts unfused
                variant = evolve(variant, fused_expert_mlp=False)
                if not _runnable(model, variant, space):
                    continue
            yield variant


def _stage_time_s(model: ModelSpec, cluster: Cluster, plan: Plan, sc: StepCosts) -> float:
    """A middle pipeline rank's time per micro-batch (`sc`: the plan's `step_costs`): enough to rank plans
    that differ only in the MoE dispatcher and overlap (they change every MoE layer alike), at a fraction of
    a whole estimate. The stage is kept (`rank_stage`) for the estimate of the variant that wins, and for
    plans of other structures that share it."""
    st = rank_stage(sc, model, plan, plan.pp // 2)
    return st.compute + st.exposed


def evaluate_structure(
    model: ModelSpec, cluster: Cluster, kw: dict, offload_ok: bool = True, space: SearchSpace | None = None
) -> Candidate | None:
    """The fastest plan of one parallel structure that fits in memory, or None: no recompute, then
    op-level selective, then the cheaper of the least Megatron module set (`module_frontier`) and the
    fewest fully recomputed layers that fit, by the forward time each re-runs."""
    space = space or SearchSpace()
    try:
        base = make_plan(model, cluster, **kw)
    except ShardscopeError:
        return None
    offload = (False, True) if (offload_ok and (base.fsdp or base.zero >= 1)) else (False,)
    # each rank's model state and buffers by optimizer offload (`_fixed_parts`), activations by recompute
    # (`_activations`)
    fixed: dict = {}
    if _below_memory_floor(model, cluster, base, offload, fixed):
        return None
    stage_layers = base.stage_layers(model.layers)

    # Optimizer offload only adds time (a CPU Adam step at host bandwidth, weights back over the host
    # link), so at a recompute level it is the fallback when the plan does not fit without it.
    def fitting(levels: Iterable[dict]) -> Iterator[Plan]:
        for level in levels:
            for off in offload:
                plan = evolve(base, offload_optimizer=off, **level)
                runs = cuda_graph_problem(model, plan) is None and _runnable(model, plan, space)
                if runs and _fits_memory(model, cluster, plan, fixed):
                    yield plan

    for plan in fitting({"recompute": p, "recompute_layers": 0} for p, _ in RECOMPUTE_LEVELS if p != "full"):
        if found := _timed(model, cluster, plan, space):
            return found
    # Past them, Megatron's module sets (least recompute first) and full recompute (fewest layers first):
    # of the next fitting plan of each, the one re-running less forward time is timed first.
    frontier = module_frontier(model, cluster, base) if space.recompute_modules else []
    seconds = dict(frontier)
    sets = [{"recompute": "selective", "recompute_modules": m} for m, _ in frontier]
    # Along the frontier each set frees more than the one before: if the last fits, bisect for the first.
    lo = hi = len(sets)
    if sets and next(fitting(sets[-1:]), None):
        lo = 0
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if next(fitting([sets[mid]]), None) else (mid + 1, hi)
    full_levels = []
    for policy, share in RECOMPUTE_LEVELS:
        layers = max(1, round(share * stage_layers))
        if policy == "full" and not (share < 1 and layers >= stage_layers):
            full_levels.append({"recompute": "full", "recompute_layers": layers if share < 1 else 0})
    forward = layers_forward_s(model, cluster, base)

    def rerun_s(plan: Plan) -> float:
        if plan.recompute_modules:
            return seconds[plan.recompute_modules]
        return forward * (plan.recompute_layers or stage_layers) / stage_layers

    queues = [fitting(sets[lo:]), fitting(full_levels)]
    heads = [next(q, None) for q in queues]
    while any(heads):
        i = min((i for i, h in enumerate(heads) if h), key=lambda i: rerun_s(heads[i]))
        if found := _timed(model, cluster, heads[i], space):
            return found
        heads[i] = next(queues[i], None)
    return None


def _timed(model: ModelSpec, cluster: Cluster, plan: Plan, space: SearchSpace) -> Candidate | None:
    """`plan` under the fastest MoE dispatcher and overlap (they do not change memory), estimated; None
    when no variant can run or the whole estimate does not fit with the search's headroom."""
    variants = list(moe_variants(plan, space, cluster, model))
    if not variants:  # the overlap was asked for and this plan cannot run it, or the exported-to framework cannot
        return None
    costs = None
    if len(variants) > 1:
        # each variant's step costs, kept for the estimate of the fastest (the first of equals, as `min`)
        priced = [(p, step_costs(model, cluster, p)) for p in variants]
        plan, costs = min(priced, key=lambda pc: _stage_time_s(model, cluster, *pc))
    else:
        plan = variants[0]
    est = estimate_step(model, cluster, plan, costs=costs)
    if est.fits and est.memory.required_gib <= cluster.gpu.hbm_gib - HEADROOM_GIB:
        return Candidate(plan, est)
    return None


def _below_memory_floor(model: ModelSpec, cluster: Cluster, base: Plan, offload: tuple[bool, ...], fixed: dict) -> bool:
    """Whether no plan of `base`'s structure can fit: the first or the last stage is over HBM less the
    headroom under every offload choice even with no activations and no backward working set (the model
    state, the buffers, which recompute does not change, and the CUDA context). Activations and the working
    set only add to that floor. A rank's offload choices are priced in turn until one is under the limit
    (the rest cannot change the answer); the parts priced stay in `fixed` for the fit checks of the
    structure's plans."""
    arch = cluster.gpu.arch
    graph, _ = _structure_parts(model, base, arch, fixed)
    limit = cluster.gpu.hbm_gib - HEADROOM_GIB

    plans = {off: evolve(base, offload_optimizer=off) for off in offload}

    def floor_gib(rank: int, off: bool) -> float:
        state, buffers = _fixed_parts(model, plans[off], graph, arch, rank, fixed)
        return _parts_footprint_gib(state, 0.0, buffers)  # `RankMemory(rank, state, 0.0, buffers, 0)`'s

    return any(all(floor_gib(rank, off) > limit for off in offload) for rank in (0, base.pp - 1))


# `workers=0` (the CLI's default) runs a search of this many layouts or more on a pool of one process per
# core, at most `MAX_AUTO_WORKERS` (each holds its own op graphs: ~280 MB for DeepSeek-V3); below it a
# pool's start-up (each process imports the package) costs more than it shares out.
POOL_MIN_LAYOUTS = 2000
MAX_AUTO_WORKERS = 8


def auto_workers(layouts: int) -> int:
    """Worker processes for a search of `layouts` when none are asked for: one per core this process may
    run on (at most `MAX_AUTO_WORKERS`) from `POOL_MIN_LAYOUTS` layouts up, else one."""
    if layouts < POOL_MIN_LAYOUTS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, MAX_AUTO_WORKERS))


# Set inside `_unscanned`: each chunk of structures then freezes what earlier chunks left alive (a worker
# process forked from the search inherits it)
_freezing = False


@contextmanager
def _unscanned() -> Iterator[None]:
    """Run with the objects alive at each chunk's start left out of the cyclic garbage collector's scans
    (`gc.freeze`), then put them back (`gc.unfreeze`). A search builds up hundreds of thousands of memoised
    results (op graphs, per-plan costs) that hold no reference cycles (reference counting frees them), and the
    collector's default thresholds had it scan them again and again for nothing: a fifth of DeepSeek-V3's
    search on 1,024 GPUs. Garbage made within a chunk is collected as before, and no result depends on when
    garbage is collected. A process that keeps objects frozen itself is left as it is."""
    global _freezing
    if _freezing or gc.get_freeze_count():
        yield
        return
    _freezing = True
    try:
        yield
    finally:
        _freezing = False
        gc.unfreeze()


def _evaluate_chunk(args: tuple) -> list[Candidate]:
    model, cluster, chunk, space = args
    if _freezing:
        gc.freeze()  # what earlier chunks left alive (`_unscanned`)
    return [c for kw in chunk if (c := evaluate_structure(model, cluster, kw, space=space)) is not None]


def search(
    model: ModelSpec,
    cluster: Cluster,
    global_batch: int,
    seq_len: int,
    objective: str = "throughput",
    space: SearchSpace | None = None,
    workers: int = 1,
    executor: str = "local",
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Every valid plan of `model` on `cluster` for this batch, feasible ones ranked by `objective`, over
    `workers` processes (0: `auto_workers`)."""
    if objective not in OBJECTIVES:
        raise ShardscopeError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if workers < 0:
        raise ShardscopeError(f"--workers must be 0 (one per core) or more, got {workers}")
    space = space or SearchSpace()
    # the graph rules that hold for every plan of the search (its plans route dropless, recompute varies)
    if problem := cuda_graph_problem(model, Plan(cuda_graphs=space.cuda_graphs)):
        raise ShardscopeError(problem)
    todo = list(structures(model, cluster, global_batch, seq_len, space))
    if not todo:
        raise ShardscopeError(
            f"no parallel layout of {cluster.gpus} GPUs divides global batch {global_batch} and seq {seq_len}"
        )
    workers = workers or auto_workers(len(todo))
    found: list[Candidate] = []
    chunk_size = max(16, len(todo) // (64 * workers))
    chunks = [todo[i : i + chunk_size] for i in range(0, len(todo), chunk_size)]
    with _unscanned():
        for done, batch in enumerate(_run(chunks, model, cluster, space, workers, executor), start=1):
            found += batch
            if progress:
                progress(done, len(chunks))
    found.sort(key=lambda c: c.key(objective))
    return SearchResult(found, len(todo), len(found), objective)


def _run(
    chunks: list[list[dict]], model: ModelSpec, cluster: Cluster, space: SearchSpace, workers: int, executor: str
) -> Iterable:
    args = [(model, cluster, c, space) for c in chunks]
    if executor == "ray":
        try:
            import ray
        except ImportError:
            raise ShardscopeError("--executor ray needs Ray: pip install 'shardscope[ray]'") from None
        if not ray.is_initialized():
            ray.init(num_cpus=max(workers, 1), include_dashboard=False, log_to_driver=False)
        remote = ray.remote(_evaluate_chunk)
        pending = [remote.remote(a) for a in args]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
        return
    if executor != "local":
        raise ShardscopeError(f"--executor must be local or ray, got {executor!r}")
    if workers <= 1:
        for a in args:
            yield _evaluate_chunk(a)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        for fut in as_completed([pool.submit(_evaluate_chunk, a) for a in args]):
            yield fut.result()
