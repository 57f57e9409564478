"""Memory-budget planners for the finer knobs, given a per-GPU budget:

* Selective activation checkpointing: which modules of which layers to recompute so that the most
  loaded GPU fits the budget at the least recompute time. Items are the modules of a block (norms,
  q/k/v projections, attention core, MLP up-projection and activation, ...): each frees its saved
  tensors for every in-flight micro-batch and costs its forward time again in every backward.
* FSDP selective unsharding: which modules keep their gathered weights from forward to backward, so
  backward skips their all-gather, within the memory left under the budget.
* Megatron recompute modules: see `planner.modules`.

Each has a greedy planner (whole layers in reverse order — the last layers' activations live longest
in 1F1B — split into modules when a whole layer is more than needed; unsharding by time saved per byte)
and an exact one (bounded knapsack by dynamic programming over discretised memory) to show how far
greedy is from optimal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardscope.analytic.step import estimate_step
from shardscope.costs.comm import collective_time_s
from shardscope.costs.compute import group_times_s
from shardscope.costs.memory import GIB, inflight_chunks
from shardscope.errors import ShardscopeError
from shardscope.graph.common import BF16
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.step.core import step_costs

# Saved tensors grouped by the module whose forward must re-run to rebuild them, with that module's ops.
SAC_MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "attn norm": (("attn norm stats", "attn norm out (qkv input)"), ("attn norm",)),
    "mla latents": (
        (
            "q latent norm stats",
            "q latent (norm input)",
            "q latent normed (q up input)",
            "kv latent norm stats",
            "kv latent (norm input)",
            "kv latent normed (kv up input)",
        ),
        ("q down proj", "q latent norm", "kv down proj", "kv latent norm"),
    ),
    "q/k norm": (("q/k norm input", "q/k norm stats"), ("q/k norm",)),
    "qkv proj + rope": (("q, k, v",), ("qkv proj", "q up proj", "kv up proj", "rope")),
    "attention core": (
        ("attention out", "attention logsumexp", "attention out (fp8 copy for out proj)"),
        ("attention",),
    ),
    "out proj + residual": (("attn residual (mlp norm input)",), ("out proj", "attn residual add")),
    "mlp norm": (("mlp norm stats", "mlp norm out (mlp input)"), ("mlp norm",)),
    **{
        f"{part}up + activation": (
            tuple(
                f"{pre}{t}"
                for t in ("gate, up", "clamped gate, up", "silu(gate)", "swiglu out (down input)", "up")
                + ("gelu out (down input)",)
            ),
            tuple(f"{pre}{o}" for o in ("gate/up proj", "gate, up clamp", "swiglu", "up proj", "gelu")),
        )
        for part, pre in (("mlp ", ""), ("experts ", "experts "), ("shared expert ", "shared expert "))
    },
}


@dataclass(frozen=True, slots=True)
class Item:
    name: str
    bytes_per_layer: float  # activation bytes freed per layer (all in-flight micro-batches)
    seconds_per_layer: float  # extra time per layer per step
    layers: int  # how many layers can take it


@dataclass(frozen=True, slots=True)
class Choice:
    items: dict[str, int]  # item name -> number of layers it is applied to
    freed_gib: float
    cost_s: float  # recompute time added (SAC) or time saved (unsharding) per step


@dataclass(frozen=True, slots=True)
class BudgetResult:
    kind: str  # "sac" or "fsdp-unshard"
    budget_gib: float
    start_gib: float  # required memory of the plan before the knob (as `shardscope estimate` gives it)
    start_step_s: float  # step time of that plan (as `shardscope estimate` gives it)
    need_gib: float  # memory to free (SAC) or slack to spend (unsharding)
    greedy: Choice
    exact: Choice
    items: list[Item]


def _plan_without_recompute(plan: Plan) -> Plan:
    return replace(plan, recompute="none", recompute_layers=0, recompute_modules=())


def sac_items(model: ModelSpec, cluster: Cluster, plan: Plan) -> list[Item]:
    """Per-module recompute items of the first stage (the most loaded rank), on its most common layer
    kind (DeepSeek-V3's MoE layers, not its three dense ones)."""
    sc = step_costs(model, cluster, plan)
    layers = plan.rank_layers(model.layers)[0]
    kinds = [sc.graph.kinds[i] for i in layers] or [sc.graph.kinds[0]]
    kind = max(dict.fromkeys(kinds), key=kinds.count)
    group = sc.graph.layers[kind]
    inflight = inflight_chunks(plan, 0) * (1 if plan.pp == 1 else len(layers) / plan.vpp) / max(len(layers), 1)
    saved = {s.name: s.bytes for s in group.saved}
    times = {op.name: t for op, t in zip(group.ops, group_times_s(cluster.gpu, group, plan)[0], strict=True)}
    items = []
    for name, (tensors, ops) in SAC_MODULES.items():
        nbytes = sum(saved.get(t, 0.0) for t in tensors)
        if nbytes <= 0:
            continue
        seconds = sum(times.get(o, 0.0) for o in ops) * plan.grad_accum
        items.append(Item(name, nbytes * max(inflight, 1.0), seconds, len(layers)))
    return items


def _greedy_sac(items: list[Item], need: float) -> Choice:
    """Whole layers (every item) in reverse layer order until the rest of the need is smaller than a
    layer's saving; then the cheapest items per byte for the remainder."""
    per_layer = sum(i.bytes_per_layer for i in items)
    n_layers = items[0].layers if items else 0
    whole = min(int(need // per_layer), n_layers) if per_layer else 0
    chosen = {i.name: whole for i in items}
    freed = whole * per_layer
    cost = whole * sum(i.seconds_per_layer for i in items)
    if freed < need and whole < n_layers:
        for it in sorted(items, key=lambda i: i.seconds_per_layer / i.bytes_per_layer):
            if freed >= need:
                break
            chosen[it.name] += 1
            freed += it.bytes_per_layer
            cost += it.seconds_per_layer
    return Choice({k: v for k, v in chosen.items() if v}, freed / GIB, cost)


def _knapsack(items: list[Item], target: float, minimise: bool, units: int = 4000) -> Choice:
    """Bounded knapsack by DP over memory discretised into `units` steps (rounded up for the items,
    so the result is feasible). minimise=True: least time freeing at least `target` bytes; False: most
    time saved spending at most `target` bytes."""
    if target <= 0 or not items:
        return Choice({}, 0.0, 0.0)
    unit = target / units
    parts: list[tuple[str, int, int, float]] = []  # (item, multiplicity, weight units, value)
    for it in items:
        w = max(1, int(-(-it.bytes_per_layer // unit)))
        k, left = 1, it.layers
        while left > 0:
            take = min(k, left)
            parts.append((it.name, take, w * take, it.seconds_per_layer * take))
            left -= take
            k *= 2
    inf = float("inf")
    if minimise:  # cost[c] = least time to free >= c units (capped at units)
        best = [0.0] + [inf] * units
        pick: list[list] = [[] for _ in range(units + 1)]
        for name, mult, w, v in parts:
            for c in range(units, -1, -1):
                src = max(c - w, 0)
                if best[src] + v < best[c]:
                    best[c] = best[src] + v
                    pick[c] = [*pick[src], (name, mult)]
        if best[units] == inf:
            raise ShardscopeError("even recomputing everything does not fit the budget")
        chosen = pick[units]
    else:  # value[c] = most time saved within c units
        best = [0.0] * (units + 1)
        pick = [[] for _ in range(units + 1)]
        for name, mult, w, v in parts:
            for c in range(units, w - 1, -1):
                if best[c - w] + v > best[c]:
                    best[c] = best[c - w] + v
                    pick[c] = [*pick[c - w], (name, mult)]
        chosen = pick[units]
    counts: dict[str, int] = {}
    for name, mult in chosen:
        counts[name] = counts.get(name, 0) + mult
    by_name = {i.name: i for i in items}
    return Choice(
        counts,
        sum(by_name[n].bytes_per_layer * c for n, c in counts.items()) / GIB,
        sum(by_name[n].seconds_per_layer * c for n, c in counts.items()),
    )


def _exact(items: list[Item], target: float, minimise: bool) -> Choice:
    """Exact optimum: enumerate every combination of per-item layer counts when there are few (FSDP
    unsharding has two items), else the knapsack DP at 20,000 memory steps (within 0.01% of target)."""
    space = 1
    for it in items:
        space *= it.layers + 1
    if space > 200_000:
        return _knapsack(items, target, minimise, units=20_000)
    from itertools import product

    best: tuple[float, dict[str, int], float] | None = None
    for counts in product(*(range(it.layers + 1) for it in items)):
        nbytes = sum(c * it.bytes_per_layer for c, it in zip(counts, items, strict=True))
        value = sum(c * it.seconds_per_layer for c, it in zip(counts, items, strict=True))
        if (minimise and nbytes < target) or (not minimise and nbytes > target):
            continue
        score = value if minimise else -value
        if best is None or score < best[0]:
            best = (score, {it.name: c for c, it in zip(counts, items, strict=True) if c}, nbytes)
    if best is None:
        raise ShardscopeError("no combination of modules meets the budget")
    return Choice(best[1], best[2] / GIB, abs(best[0]))


def plan_sac(model: ModelSpec, cluster: Cluster, plan: Plan, budget_gib: float) -> BudgetResult:
    """Selective activation checkpointing that fits `budget_gib` at the least recompute time."""
    base = _plan_without_recompute(plan)
    est = estimate_step(model, cluster, base)
    start = est.memory.required_gib
    need = (start - budget_gib) * GIB
    items = sac_items(model, cluster, base)
    if need <= 0:
        empty = Choice({}, 0.0, 0.0)
        return BudgetResult("sac", budget_gib, start, est.step_time_s, 0.0, empty, empty, items)
    if sum(i.bytes_per_layer * i.layers for i in items) < need:
        raise ShardscopeError(
            f"recomputing every module frees {sum(i.bytes_per_layer * i.layers for i in items) / GIB:.1f} GiB; "
            f"{need / GIB:.1f} GiB are needed to reach --budget-gib {budget_gib:g}"
        )
    return BudgetResult(
        "sac", budget_gib, start, est.step_time_s, need / GIB, _greedy_sac(items, need),
        _exact(items, need, minimise=True), items,
    )  # fmt: skip


def unshard_items(model: ModelSpec, cluster: Cluster, plan: Plan) -> list[Item]:
    """Attention and MLP weights of a layer kept gathered after forward: bf16 bytes held for the step,
    the backward all-gather they save (per micro-batch), on the first stage's layer kind."""
    sc = step_costs(model, cluster, plan)
    layers = plan.rank_layers(model.layers)[0]
    layer = sc.layers[sc.graph.kinds[layers[0]]]
    # Share of a layer's gather traffic that is exposed in backward; the rest only costs the SMs NCCL
    # takes from the compute it overlaps.
    bwd_comm = layer.fsdp_gather_s + layer.fsdp_reduce_s
    bwd_window = layer.bwd.compute_s + (layer.recompute_s if plan.recompute != "none" else 0.0)
    exposed = max(0.0, bwd_comm - plan.fsdp_prefetch * bwd_window) / bwd_comm if bwd_comm else 0.0
    attn = model.attention_params / plan.tp
    mlp = (model.layer_params_of(sc.graph.kinds[layers[0]]) - model.attention_params - 2 * model.norm_params) / plan.tp
    items = []
    for name, params in (("attention weights", attn), ("mlp weights", mlp)):
        gathered = BF16 * params * (1 - 1 / plan.shard_size)
        gather = collective_time_s(cluster, "all_gather", BF16 * params, sc.groups.shard)
        saved = gather * (exposed + (1 - exposed) * sc.slowdown) * plan.grad_accum
        items.append(Item(name, gathered, saved, len(layers)))
    return items


def plan_unshard(model: ModelSpec, cluster: Cluster, plan: Plan, budget_gib: float) -> BudgetResult:
    """FSDP modules to keep unsharded after forward, within the memory left under `budget_gib`."""
    if not (plan.fsdp or plan.zero == 3) or not plan.reshard_after_forward or plan.shard_size == 1:
        raise ShardscopeError("FSDP selective unsharding needs a fully sharded plan (--fsdp or --zero 3, resharding)")
    est = estimate_step(model, cluster, plan)
    start = est.memory.required_gib
    slack = (budget_gib - start) * GIB
    items = unshard_items(model, cluster, plan)
    if slack <= 0:
        raise ShardscopeError(f"the plan needs {start:.1f} GiB, over --budget-gib {budget_gib:g}: nothing to spend")
    greedy_counts: dict[str, int] = {}
    left, saved, spent = slack, 0.0, 0.0
    for it in sorted(items, key=lambda i: -i.seconds_per_layer / i.bytes_per_layer):
        n = min(it.layers, int(left // it.bytes_per_layer))
        if n:
            greedy_counts[it.name] = n
            left -= n * it.bytes_per_layer
            spent += n * it.bytes_per_layer
            saved += n * it.seconds_per_layer
    greedy = Choice(greedy_counts, spent / GIB, saved)
    return BudgetResult(
        "fsdp-unshard", budget_gib, start, est.step_time_s, slack / GIB, greedy,
        _exact(items, slack, minimise=False), items,
    )  # fmt: skip
