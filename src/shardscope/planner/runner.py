"""The `shardscope plan` and `report` searches: set-up, search, cost and export, returned as data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import Cluster, make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import check_precision, check_scale
from shardscope.planner.cost import parse_tokens, training_cost
from shardscope.planner.export import ExportTarget, constraints_target, export_target, launch_for, search_problems
from shardscope.planner.export import export as export_plan
from shardscope.planner.search import Candidate, SearchResult, search
from shardscope.planner.space import SHARDINGS, SearchSpace, moe_choices
from shardscope.result import Estimate


def plan_dict(c: Candidate) -> dict:
    p = c.plan
    return {f.name: getattr(p, f.name) for f in fields(p)} | {"grad_accum": p.grad_accum, "sharding": p.sharding_name}


def candidate_json(c: Candidate, tokens: float | None = None, price: float | None = None) -> dict:
    e: Estimate = c.estimate
    out = {
        "plan": plan_dict(c),
        "fits": e.fits,
        "step_time_s": e.step_time_s,
        "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
        "model_tflops_per_gpu": e.model_tflops_per_gpu,
        "mfu": e.mfu,
        "memory": asdict(e.memory),
        "time": {k: v for k, v in asdict(e.time).items() if k != "detail"},
        "warnings": list(e.warnings),
    }
    if tokens:
        out["training"] = asdict(training_cost(e, tokens, price))
    return out


# The options of `plan` and `report` that `search_setup` takes
SEARCH_OPTIONS = (
    "model", "gpu", "gpus", "gpus_per_node", "seq_len", "video", "precision", "fp8_recipe", "cuda_graphs",
    "fused_activation", "fused_cross_entropy", "ep_dispatch", "ep_comm_overlap", "stack", "power_limit", "profile",
)  # fmt: skip


def search_setup(
    *,
    model: str,
    gpu: str,
    gpus: int,
    gpus_per_node: int | None,
    seq_len: int,
    video: str | None,
    precision: str,
    fp8_recipe: str | None,
    cuda_graphs: str | None,
    fused_activation: bool | None,
    fused_cross_entropy: bool | None,
    ep_dispatch: str,
    ep_comm_overlap: bool | None,
    stack: str | None = None,
    power_limit: float | None = None,
    profile: str | None = None,
) -> tuple[ModelSpec, Cluster, int, SearchSpace]:
    """The model, cluster, sequence length (a video clip's tokens) and search space of `plan`/`report`:
    every plan runs the stack's kernels, fusions and overlaps; options given (not None) override them."""
    from shardscope import video_seq_len
    from shardscope.stacks import load_stack

    framework = load_stack(stack or "")
    spec = load_model(model)
    kernels = framework.plan_defaults(spec.moe is not None)
    given = {"fp8_recipe": fp8_recipe, "cuda_graphs": cuda_graphs, "fused_activation": fused_activation,
             "fused_cross_entropy": fused_cross_entropy}  # fmt: skip
    # each of these: as given, else the stack's, else the search space's default; the rest are searched
    chosen = {k: kernels[k] for k in given if k in kernels} | {k: v for k, v in given.items() if v is not None}
    for decided in (*given, "micro_batch", "ep_dispatch", "ep_comm_overlap"):
        kernels.pop(decided, None)
    cluster = make_cluster(gpu, gpus, gpus_per_node, power_limit_w=power_limit)
    if profile is not None:  # ops the measured profile covers are priced from it (`costs.profiled`)
        from shardscope import with_profile

        cluster = with_profile(cluster, profile)
    if video:
        seq_len = video_seq_len(spec, video)
    check_scale(gpus, seq_len)  # before the search, as `estimate` checks before pricing
    if precision not in ("bf16", "fp8"):
        raise ShardscopeError(f"--precision must be bf16 or fp8, got {precision!r}")
    offered = framework.value("shardings")  # what the framework can run, where its stack says
    if offered and not set(offered) <= set(SHARDINGS):
        raise ShardscopeError(f"stack {framework.label}: shardings must be among {', '.join(SHARDINGS)}")
    space = SearchSpace(
        precision=precision,
        kernels=tuple(sorted(kernels.items())),
        **chosen,
        **moe_choices(ep_dispatch, ep_comm_overlap),
        **({"shardings": tuple(offered)} if offered else {}),
    )
    check_precision(precision, space.fp8_recipe, cluster.gpu)
    return spec, cluster, seq_len, space


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """What `shardscope plan` found: the best `top` plans, and the best one exported where asked."""

    spec: ModelSpec
    cluster: Cluster
    result: SearchResult
    best: list[Candidate]
    tokens: float | None  # the token budget to train, for time and cost
    export_text: str | None


def plan_search(
    *,
    model: str,
    gpu: str,
    gpus: int,
    gpus_per_node: int | None,
    seq_len: int,
    global_batch: int,
    video: str | None,
    precision: str,
    objective: str,
    top: int,
    tokens: str | None,
    export: str | None,
    workers: int,
    executor: str,
    progress: Callable[[int, int], None] | None = None,
    cuda_graphs: str | None = None,
    fused_activation: bool | None = None,
    fused_cross_entropy: bool | None = None,
    ep_dispatch: str = "auto",
    ep_comm_overlap: bool | None = None,
    fp8_recipe: str | None = None,
    stack: str | None = None,
    power_limit: float | None = None,
    profile: str | None = None,
) -> PlanOutcome:
    """Search the plans of `plan`/`--export`: data only, the CLI shows it. With `--export X[@RELEASE]` the plans
    are priced under X's stack at that release and only those X can run are searched (`runnable_export`)."""
    target = runnable_export(export, stack) if export is not None else None
    if target is not None:
        stack = target.stack.label  # the plans are priced as the framework release that will run them runs them
    spec, cluster, seq_len, space = search_setup(**{k: v for k, v in locals().items() if k in SEARCH_OPTIONS})
    if top <= 0 or global_batch <= 0 or seq_len <= 0:
        raise ShardscopeError("--top, --global-batch and --seq-len must be positive")
    n_tokens = parse_tokens(tokens) if tokens else None
    framework = target or (_stack_framework(stack) if stack is not None else None)
    if framework is not None:
        asked = "" if target is not None else f"--stack {stack}"
        space = _exportable_space(framework, spec, space, seq_len, global_batch, asked=asked)
    result = search(spec, cluster, global_batch, seq_len, objective, space, workers, executor, progress=progress)
    if not result.candidates:
        runnable = f" that {framework.label} can run" if framework else ""
        raise ShardscopeError(
            f"no plan of {spec.name}{runnable} fits {gpus}× {cluster.gpu.name} ({cluster.gpu.hbm_gib:g} GiB) at "
            f"global batch {global_batch} × {seq_len} tokens; try more GPUs or a smaller batch"
        )
    best = distinct_plans(result.candidates, top)
    text = None
    if target is not None:
        launch = launch_for(best[0].plan, cluster.gpus_per_node, n_tokens)
        text = export_plan(target, spec, best[0].plan, launch)
    return PlanOutcome(spec, cluster, result, best, n_tokens, text)


def runnable_export(export: str, stack: str | None) -> ExportTarget:
    """The framework release of `--export`, whose stack prices the plans. A `--stack` given must name the same
    framework (another would price what the export does not run); its release is the export's where the
    export names none, and must be the same where both do."""
    target = export_target(export)
    if stack is None:
        return target
    from shardscope.stacks import load_stack

    given = load_stack(stack)
    if given.name != target.framework:
        raise ShardscopeError(
            f"--stack {given.label} prices plans as another framework than --export {target.label} runs them: "
            "leave --stack out, or name the same framework"
        )
    if "@" not in stack:
        return target
    if "@" not in export:
        return export_target(f"{target.framework}@{given.release}")
    if given.release != target.release:
        raise ShardscopeError(f"--stack {given.label} and --export {target.label} name different releases")
    return target


def _stack_framework(stack: str) -> ExportTarget | None:
    """The framework release whose constraints a search under `--stack` alone keeps to (`constraints_target`):
    a plan offered under torchtitan's stack is one torchtitan can run, as with `--export torchtitan`."""
    from shardscope.stacks import load_stack

    return constraints_target(load_stack(stack))


def _exportable_space(
    target: ExportTarget, spec: ModelSpec, space: SearchSpace, seq_len: int, global_batch: int, asked: str = ""
) -> SearchSpace:
    """`space` searching only what `target` can run (`SearchSpace.runnable_by`); refused before the search where
    the settings every plan shares (precision, FP8 recipe, kernels, a fixed dispatcher or EP overlap) are
    what the framework release cannot run. `asked`: the option that chose `target` (default `--export`)."""
    from dataclasses import replace

    from shardscope.plan.plan import Plan

    moe = spec.moe is not None
    shared = {
        "precision": space.precision,
        "fp8_recipe": space.fp8_recipe,
        "cuda_graphs": space.cuda_graphs,
        "fused_activation": space.fused_activation,
        "fused_cross_entropy": space.fused_cross_entropy,
        "ep": 2 if moe else 1,  # a fixed dispatcher or overlap applies where experts are parallel
        "ep_dispatch": space.ep_dispatches[0] if len(space.ep_dispatches) == 1 else "flat",
        "ep_comm_overlap": moe and space.ep_overlaps == (True,),
        "seq_len": seq_len,
        "global_batch": global_batch,
    }
    probe = Plan(**(dict(space.kernels) | shared))
    if problems := search_problems(target, spec, probe):
        raise ShardscopeError(f"{asked or '--export ' + target.label} cannot run {spec.name} as asked: {problems[0]}")
    return replace(space, runnable_by=target.label)


def distinct_plans(candidates: list[Candidate], top: int) -> list[Candidate]:
    """The first `top` candidates that differ in layout, recompute, micro-batch or priced outcome: a plan
    offered under two sharding names that price the same (ZeRO-3 and FSDP under one stack) shows once."""
    seen: set[tuple] = set()
    out: list[Candidate] = []
    for c in candidates:
        p, e = c.plan, c.estimate
        key = (
            p.tp, p.pp, p.vpp, p.cp, p.dp, p.ep, p.recompute, p.recompute_modules, p.recompute_layers,
            p.micro_batch, p.offload_optimizer, round(e.step_time_s, 9), round(e.memory.required_gib, 6),
        )  # fmt: skip
        if key not in seen:
            seen.add(key)
            out.append(c)
            if len(out) == top:
                break
    return out


def plan_document(outcome: PlanOutcome, objective: str, price: float | None) -> dict:
    """The `plan --json` document."""
    return {
        "model": outcome.spec.name,
        "gpu": outcome.cluster.gpu.name,
        "gpus": outcome.cluster.gpus,
        "objective": objective,
        "structures_searched": outcome.result.structures,
        "feasible": outcome.result.evaluated,
        "plans": [candidate_json(c, outcome.tokens, price) for c in outcome.best],
    }
