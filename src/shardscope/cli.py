"""The `shardscope` command: a thin Typer layer over the Python API.

User errors (ShardscopeError) print one line on stderr and exit with status 2. Heavy modules load
inside the commands, so `shardscope estimate --json` starts fast. The plan's options are not declared
here: each comes from its one declaration in `shardscope.plan.plan.Plan` (`plan_option`).
"""

from __future__ import annotations

import inspect
import json
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from shardscope.cli_profile import calibrate, profile_app
from shardscope.errors import ShardscopeError, ShardscopeWarning, warnings_to_stderr
from shardscope.plan.plan import cli_fields, option_flag, option_type

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan and simulate large-model training on GPU clusters: memory, step time, MFU. "
    "The software stack that runs the plan is --stack (default megatron; see `shardscope stacks`).",
)


@app.callback()
def _input_warnings(ctx: typer.Context) -> None:
    # Input warnings (a misspelt config key, a cluster past any built) print as one line `warning: ...` on
    # stderr while the command runs, as errors do; the command's own output is left alone.
    ctx.with_resource(warnings_to_stderr())


def _plan_option(f: Any) -> Any:
    """The Typer option of a Plan field: its flag, help and choices from the field's declaration; None
    (not given) lets the stack, then the Plan default, decide."""
    kind = option_type(f)
    flag = option_flag(f)
    meta = f.metadata
    choices = " | ".join(str(c) for c in meta.get("choices", ()))
    default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
    text = meta["help"] + (f": {choices}" if choices else "") + f" (unset: the stack's, else {default or 'none'})"
    decls = (f"{flag}/--no-{flag[2:]}",) if kind is bool else (flag,)
    return Annotated[kind | None, typer.Option(*decls, help=text, rich_help_panel=f"Plan: {meta['section']}")]


# Each Plan field's option, by field name: commands that take a few of them name them from here
PlanOpt = {f.name: _plan_option(f) for f in cli_fields()}
_SEARCHED = (
    "seq_len",
    "global_batch",
    "precision",
    "fp8_recipe",
    "cuda_graphs",
    "fused_activation",
    "fused_cross_entropy",
)
SeqLen, GlobalBatch, PrecisionOpt, Fp8Recipe, CudaGraphs, FusedActivation, FusedCrossEntropy = (
    PlanOpt[n] for n in _SEARCHED
)


def _with_options(func: Any, extra: list[inspect.Parameter]) -> Any:
    """`func` also taking the `extra` options (as keyword arguments in its `**kwargs`), after its own."""
    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    names = {p.name for p in own}
    more = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in extra if p.name not in names]
    func.__signature__ = sig.replace(parameters=own + more)
    return func


def with_plan_options(func: Any) -> Any:
    """`func` taking every Plan option (in its `**plan`), after its own parameters."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return _with_options(func, [inspect.Parameter(n, keyword, default=None, annotation=a) for n, a in PlanOpt.items()])


# Options that are not Plan fields: one declaration each.
Gpu = Annotated[str, typer.Option(help="GPU kind (see `shardscope gpus`)")]
Gpus = Annotated[int, typer.Option(help="total GPUs")]
GpusPerNode = Annotated[int | None, typer.Option(help="GPUs per node (default: the GPU's system)")]
ClusterFile = Annotated[Path | None, typer.Option(help="cluster description file (YAML/JSON)")]
Video = Annotated[str | None, typer.Option(help="video DiT clip FRAMESxHEIGHTxWIDTH (sets the token count)")]
AsyncTp = Annotated[bool, typer.Option(help="torchtitan async tensor parallel (TP collectives under the GEMMs)")]
Stack = Annotated[
    str | None,
    typer.Option(help="software stack NAME or NAME@RELEASE that runs it (see `shardscope stacks`; default megatron)"),
]
PowerLimit = Annotated[float | None, typer.Option(help="GPU board power cap in watts (lower clocks), e.g. 500")]
AsJson = Annotated[bool, typer.Option("--json", help="print one JSON object")]
ProfileOption = Annotated[
    str | None,
    typer.Option(help="measured profile: a shipped GPU name (H100) or a file from `shardscope calibrate`"),
]
Workers = Annotated[
    int, typer.Option(help="local worker processes (0: one per core, up to 8, for searches of 2,000+ layouts)")
]
# The planner's MoE choices: searched unless fixed
EpDispatchChoice = Annotated[
    str, typer.Option(help="MoE token dispatcher: auto (try flat and deepep) | flat | deepep | hybridep")
]
EpCommOverlapChoice = Annotated[
    bool | None,
    typer.Option("--ep-comm-overlap/--no-ep-comm-overlap", help="EP all-to-all overlap (default: try both)"),
]


def _plan_kwargs(plan: dict, async_tp: bool) -> dict:
    """The plan keywords given (the plan derives the rest, e.g. the global batch)."""
    kw = {k: v for k, v in plan.items() if v is not None}
    if async_tp:
        kw["async_tp"] = True
    return kw


def _fail(msg: str) -> None:
    sys.stderr.write(f"error: {msg}\n")
    raise typer.Exit(2)


def _answer(compute: Callable[[], Any], as_json: bool, show: Callable[[Any], None]) -> None:
    """A command's answer: `compute()`'s result as JSON (its `to_dict()`) or shown by `show`; bad input
    (a ShardscopeError) is one line and exit status 2."""
    try:
        result = compute()
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    show(result)


@app.command()
@with_plan_options
def estimate(
    model: Annotated[str, typer.Argument(help="catalog name (see `shardscope models`) or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    gpus_per_node: GpusPerNode = None,
    cluster: ClusterFile = None,
    stack: Stack = None,
    power_limit: PowerLimit = None,
    video: Video = None,
    async_tp: AsyncTp = False,
    simulate: Annotated[bool, typer.Option(help="use the discrete-event simulator for the numbers")] = False,
    schedule: Annotated[
        str | None, typer.Option(help="pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 | dualpipe")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="write the step as Chrome-trace JSON (Perfetto), from the engine that gave the numbers"),
    ] = None,
    straggler_fraction: Annotated[float, typer.Option(help="fraction of GPUs that run slow")] = 0.0,
    straggler_slowdown: Annotated[float, typer.Option(help="how much slower those GPUs run")] = 1.0,
    trust_remote_code: Annotated[
        bool,
        typer.Option(help="let a config.json whose architecture ships as code with the checkpoint run that code"),
    ] = False,
    profile: ProfileOption = None,
    as_json: AsJson = False,
    **plan: Any,
) -> None:
    """Predict step time, throughput, MFU and per-GPU memory of one training plan."""
    from shardscope import estimate as run_estimate
    from shardscope.measure import trusting_remote_code

    def compute() -> Any:
        if trace is not None:
            _check_output_path(trace)
        with warnings.catch_warnings(), trusting_remote_code(trust_remote_code):
            if not as_json:  # the tables end with the estimate's warnings, these among them: say them once
                warnings.simplefilter("ignore", ShardscopeWarning)
            return run_estimate(
                model,
                gpu=gpu,
                gpus=gpus,
                gpus_per_node=gpus_per_node,
                cluster_file=cluster,
                video=video,
                simulate=simulate,
                schedule=schedule,
                trace=trace,
                straggler_fraction=straggler_fraction,
                straggler_slowdown=straggler_slowdown,
                stack=stack,
                power_limit_w=power_limit,
                profile=profile,
                **_plan_kwargs(plan, async_tp),
            )

    def show(result: Any) -> None:
        from shardscope.report.console import print_estimate

        print_estimate(result)

    _answer(compute, as_json, show)


def _search_options(
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    gpus_per_node: GpusPerNode = None,
    seq_len: SeqLen = 4096,
    global_batch: GlobalBatch = 256,
    video: Video = None,
    precision: PrecisionOpt = "bf16",
    fp8_recipe: Fp8Recipe = None,
    stack: Stack = None,
    power_limit: PowerLimit = None,
    objective: Annotated[str, typer.Option(help="throughput | memory | cost")] = "throughput",
    cuda_graphs: CudaGraphs = None,
    fused_activation: FusedActivation = None,
    fused_cross_entropy: FusedCrossEntropy = None,
    ep_dispatch: EpDispatchChoice = "auto",
    ep_comm_overlap: EpCommOverlapChoice = None,
    workers: Workers = 0,
    profile: ProfileOption = None,
) -> None:
    """The options `plan` and `report` share (their one declaration; `with_search_options`)."""


def with_search_options(func: Any) -> Any:
    """`func` taking the search options (in its `**search`), after its own parameters."""
    return _with_options(func, list(inspect.signature(_search_options, eval_str=True).parameters.values()))


@app.command()
@with_search_options
def plan(
    model: Annotated[str, typer.Argument(help="catalog name or path to a config.json")],
    top: Annotated[int, typer.Option(help="plans to show")] = 10,
    tokens: Annotated[str | None, typer.Option(help="token budget to train, e.g. 15T")] = None,
    usd_per_gpu_hour: Annotated[
        float | None,
        typer.Option("--usd-per-gpu-hour", "--price-per-gpu-hour", help="price of one GPU-hour in US dollars"),
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(
            help="write the best plan that this framework release runs, priced under its stack: "
            "torchtitan[@0.3|0.2] (default 0.3) | megatron[@0.12..0.16] | deepspeed[@0.14..0.17]"
        ),
    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="file for --export (default: stdout)")] = None,
    executor: Annotated[str, typer.Option(help="local | ray")] = "local",
    as_json: AsJson = False,
    **search: Any,
) -> None:
    """Search every valid plan, prune by memory, rank by throughput (or memory / cost). With --stack or --export
    naming torchtitan, Megatron-LM or DeepSpeed, only the plans that framework runs are searched."""
    from shardscope.planner.runner import plan_document, plan_search

    options = dict(search, model=model, top=top, tokens=tokens, export=export, executor=executor)
    gpus, gpu, objective = search["gpus"], search["gpu"], search["objective"]

    try:
        if output is not None:
            _check_output_path(output)
        if as_json:
            outcome = plan_search(**options)
        else:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"searching plans for {model} on {gpus}× {gpu}", total=None)
                outcome = plan_search(**options, progress=lambda n, total: bar.update(task, completed=n, total=total))
        if outcome.export_text is not None and output is not None:
            output.write_text(outcome.export_text)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        sys.stdout.write(json.dumps(plan_document(outcome, objective, usd_per_gpu_hour), indent=2) + "\n")
    elif outcome.export_text is not None and output is None:
        sys.stdout.write(outcome.export_text)
    else:
        from shardscope.report.console import print_plans

        best = outcome.best
        print_plans(outcome.spec.name, outcome.cluster, outcome.result, best, outcome.tokens, usd_per_gpu_hour)


def _check_output_path(path: Path) -> None:
    """An output file must be writable before any work starts: its folder exists and it is no folder."""
    if path.is_dir():
        raise ShardscopeError(f"{path} is a folder; give a file name")
    if not path.parent.exists():
        raise ShardscopeError(f"{path.parent} does not exist; create it or write elsewhere")


@app.command()
@with_plan_options
def budget(
    model: Annotated[str, typer.Argument(help="catalog name or path to a config.json")],
    budget_gib: Annotated[float, typer.Option(help="per-GPU memory budget, GiB")],
    knob: Annotated[
        str,
        typer.Option(
            help="modules (Megatron --recompute-modules) | sac (per-layer selective checkpointing) | fsdp-unshard"
        ),
    ] = "sac",
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    gpus_per_node: GpusPerNode = None,
    cluster: ClusterFile = None,
    stack: Stack = None,
    power_limit: PowerLimit = None,
    video: Video = None,
    async_tp: AsyncTp = False,
    as_json: AsJson = False,
    **plan: Any,
) -> None:
    """Fit a memory budget with finer knobs: Megatron recompute modules, per-layer selective
    checkpointing (greedy and exact) or FSDP unsharding (greedy and exact)."""
    import dataclasses

    from shardscope import setup
    from shardscope.planner.budget import plan_sac, plan_unshard
    from shardscope.planner.modules import plan_modules

    planners = {"modules": plan_modules, "sac": plan_sac, "fsdp-unshard": plan_unshard}
    try:
        if knob not in planners:
            raise ShardscopeError(f"--knob must be one of {', '.join(planners)}, got {knob!r}")
        if budget_gib <= 0:
            raise ShardscopeError(f"--budget-gib must be positive, got {budget_gib}")
        spec, cl, p = setup(
            model, gpu, gpus, gpus_per_node=gpus_per_node, cluster_file=cluster, video=video, stack=stack,
            power_limit_w=power_limit, **_plan_kwargs(plan, async_tp),
        )  # fmt: skip
        result = planners[knob](spec, cl, p, budget_gib)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        sys.stdout.write(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
        return
    from shardscope.report.console import print_budget, print_modules

    if knob == "modules":
        print_modules(result)
    else:
        print_budget(result)


@app.command()
@with_search_options
def report(
    model: Annotated[str, typer.Argument(help="catalog name or path to a config.json")],
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write")] = Path("report.html"),
    **search: Any,
) -> None:
    """Search the plans and write a self-contained interactive HTML report."""
    from shardscope.planner.runner import SEARCH_OPTIONS, search_setup
    from shardscope.planner.search import search as run_search
    from shardscope.report.html import write_report
    from shardscope.sim import simulate_step

    try:
        _check_output_path(output)
        options = dict(search, model=model)
        spec, cluster, seq_len, space = search_setup(**{k: v for k, v in options.items() if k in SEARCH_OPTIONS})
        result = run_search(
            spec, cluster, search["global_batch"], seq_len, search["objective"], space, workers=search["workers"]
        )
        if not result.candidates:
            raise ShardscopeError(f"no plan of {spec.name} fits {search['gpus']}x {cluster.gpu.name} at this batch")
        best = result.candidates[0].plan
        try:
            sim = simulate_step(spec, cluster, best)
        except RuntimeError:
            sim = None
        write_report(output, spec, cluster, result, sim)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    sys.stdout.write(f"wrote {output} ({result.evaluated} feasible plans)\n")


@app.command()
def models() -> None:
    """List the catalog models."""
    from shardscope.report.console import print_models

    print_models()


@app.command()
def gpus() -> None:
    """List the GPU catalog."""
    from shardscope.report.console import print_gpus

    print_gpus()


@app.command()
def stacks(
    name: Annotated[str | None, typer.Argument(help="a stack NAME[@RELEASE] to show in full, with sources")] = None,
    as_json: AsJson = False,
) -> None:
    """List the software stacks and what each sets (default: megatron)."""
    from shardscope.stacks import list_stacks, load_stack

    try:
        chosen = [load_stack(name)] if name else list_stacks()
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        sys.stdout.write(json.dumps([s.to_dict() for s in chosen], indent=2) + "\n")
        return
    from shardscope.report.console import print_stacks

    print_stacks(chosen, sources=name is not None)


def _is_rl_sync_csv(file: Path) -> bool:
    """Whether `file` has the RL weight-sync columns (validation/rl_weight_sync_public.csv)."""
    from shardscope.rl.validate import is_rl_sync_file

    try:
        with file.open(newline="") as f:
            header = f.readline()
    except OSError:
        return False  # the training runner reports the unreadable file
    return is_rl_sync_file({c.strip() for c in header.split(",")})


def _is_inference_csv(file: Path) -> bool:
    """Whether `file` has the measured-serving columns (validation/inference_public.csv)."""
    from shardscope.serve.validate import is_inference_file

    try:
        with file.open(newline="") as f:
            header = f.readline()
    except OSError:
        return False
    return is_inference_file({c.strip() for c in header.split(",")})


def _validate_inference(file: Path, as_json: bool, rows: bool) -> None:
    from shardscope.serve.validate import print_inference_validation, run_inference_validation

    _answer(lambda: run_inference_validation(file), as_json, lambda r: print_inference_validation(r, show_rows=rows))


def _validate_rl_sync(file: Path, as_json: bool) -> None:
    from shardscope.rl.report import print_rl_validation
    from shardscope.rl.validate import run_rl_validation

    _answer(lambda: run_rl_validation(file), as_json, print_rl_validation)


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="CSV with the schema of shared/validation/training_public.csv")],
    as_json: AsJson = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the summary as a Markdown table")] = False,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="print every row")] = True,
) -> None:
    """Predict every row of a validation CSV and report the errors (an RL weight-sync file: `rl-sync`'s; a
    measured-serving file: `serve`'s)."""
    from shardscope.validate.runner import run_validation

    if _is_rl_sync_csv(file):
        _validate_rl_sync(file, as_json)
        return
    if _is_inference_csv(file):
        _validate_inference(file, as_json, rows)
        return
    try:
        report = run_validation(file)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    from shardscope.report.validation import print_markdown, print_report

    if markdown:
        print_markdown(report)
    else:
        print_report(report, show_rows=rows)


@app.command()
def serve(
    model: Annotated[str, typer.Argument(help="catalog name (see `shardscope models`) or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    tp: Annotated[int, typer.Option(help="tensor-parallel size of one replica")] = 1,
    pp: Annotated[int, typer.Option(help="pipeline stages of one replica (a batch in flight per stage)")] = 1,
    ep: Annotated[
        int, typer.Option(help="MoE: expert-parallel size: 1, --tp, or a multiple spanning replicas (wide EP)")
    ] = 1,
    engine: Annotated[str, typer.Option(help="serving engine: vllm | sglang | trtllm (NAME[@RELEASE])")] = "vllm",
    precision: Annotated[
        str, typer.Option(help="weight format: auto (the checkpoint's) | bf16 | fp8 | nvfp4 | mxfp4 | w4a16")
    ] = "auto",
    kv_dtype: Annotated[str, typer.Option(help="KV-cache dtype: auto (the engine's rule) | bf16 | fp8")] = "auto",
    rate: Annotated[float, typer.Option(help="Poisson arrivals, requests/s (inf: offline, all at once)")] = math.inf,
    concurrency: Annotated[int, typer.Option(help="keep this many requests outstanding (closed loop)")] = 0,
    num_prompts: Annotated[int, typer.Option(help="requests in the benchmark")] = 1000,
    input_len: Annotated[int, typer.Option(help="prompt tokens (dataset fixed)")] = 1024,
    output_len: Annotated[int, typer.Option(help="output tokens (dataset fixed)")] = 256,
    prefix_len: Annotated[
        int, typer.Option(help="prompt tokens every request shares (a system prompt; cached where the engine caches)")
    ] = 0,
    samples: Annotated[
        int, typer.Option(help="sequences per prompt (vLLM's n, a GRPO group): they share the prompt's KV")
    ] = 1,
    dataset: Annotated[str, typer.Option(help="fixed | sharegpt-like (seeded log-normal lengths)")] = "fixed",
    seed: Annotated[int, typer.Option(help="random seed of arrivals and lengths")] = 0,
    max_num_seqs: Annotated[int | None, typer.Option(help="engine limit on running requests")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="engine token budget per iteration")] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT target, ms (for goodput)")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT target, ms (for goodput)")] = None,
    trace: Annotated[Path | None, typer.Option(help="write the simulated timeline as Chrome-trace JSON")] = None,
    spec_decode: Annotated[
        str | None, typer.Option(help="speculative decoding: mtp:ACCEPT, mtp:K:ACCEPT or draft:MODEL:K:ACCEPT")
    ] = None,
    disaggregate: Annotated[
        str | None, typer.Option(help="prefill:decode replica ratio P:D (KV sent over the cluster network)")
    ] = None,
    profile: ProfileOption = None,
    as_json: AsJson = False,
) -> None:
    """Simulate serving a model: KV capacity, TTFT/TPOT/ITL/E2E percentiles, throughput (DP = gpus/(tp*pp))."""
    from shardscope.serve.estimate import serve_estimate
    from shardscope.serve.report import print_serve

    _answer(
        lambda: serve_estimate(
            model, gpu=gpu, gpus=gpus, tp=tp, pp=pp, engine=engine, precision=precision, kv_dtype=kv_dtype, rate=rate,
            concurrency=concurrency, num_prompts=num_prompts, input_len=input_len, output_len=output_len,
            dataset=dataset, seed=seed, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, trace_file=trace, spec_decode=spec_decode,
            disaggregate=disaggregate, ep=ep, profile=profile, prefix_len=prefix_len, samples=samples,
        ),
        as_json,
        print_serve,
    )  # fmt: skip


@app.command("serve-plan")
def serve_plan(
    model: Annotated[str, typer.Argument(help="catalog name (see `shardscope models`) or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Annotated[int, typer.Option(help="use at most this many GPUs")] = 8,
    engine: Annotated[
        str | None,
        typer.Option(help="serving engine: vllm | sglang | trtllm (NAME[@RELEASE]; default: --export's, else vllm)"),
    ] = None,
    rate: Annotated[float | None, typer.Option(help="Poisson arrivals, requests/s (required)")] = None,
    input_len: Annotated[int, typer.Option(help="prompt tokens (dataset fixed)")] = 1024,
    output_len: Annotated[int, typer.Option(help="output tokens (dataset fixed)")] = 256,
    prefix_len: Annotated[
        int, typer.Option(help="prompt tokens every request shares (a system prompt; cached where the engine caches)")
    ] = 0,
    dataset: Annotated[str, typer.Option(help="fixed | sharegpt-like (seeded log-normal lengths)")] = "fixed",
    samples: Annotated[
        int, typer.Option(help="sequences per prompt (vLLM's n, a GRPO group); --rate counts prompts")
    ] = 1,
    num_prompts: Annotated[int, typer.Option(help="requests in each deployment's simulation")] = 1000,
    seed: Annotated[int, typer.Option(help="random seed of arrivals and lengths")] = 0,
    precision: Annotated[
        str, typer.Option(help="weight format: auto (the checkpoint's) | bf16 | fp8 | nvfp4 | mxfp4 | w4a16")
    ] = "auto",
    kv_dtype: Annotated[str, typer.Option(help="KV-cache dtype: auto (the engine's rule) | bf16 | fp8")] = "auto",
    slo_ttft_ms: Annotated[float | None, typer.Option(help="p90 TTFT target, ms")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="p90 TPOT target, ms")] = None,
    disaggregate: Annotated[
        bool, typer.Option("--disaggregate/--no-disaggregate", help="also search prefill:decode pools P:D")
    ] = True,
    top: Annotated[int, typer.Option(help="how many deployments to show")] = 5,
    export: Annotated[
        str | None,
        typer.Option(help="write plan #1's launch commands for this engine release: vllm[@0.33.0] | sglang[@0.5.23]"),
    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="file for --export (default: stdout)")] = None,
    report: Annotated[
        Path | None, typer.Option(help="write an HTML page: latency-throughput curves of the best deployments")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Search serving deployments (TP, EP, replicas, P:D, max seqs) on at most --gpus GPUs for the most goodput
    requests/s per GPU that meets p90 TTFT/TPOT SLOs at the given Poisson rate."""
    from shardscope.hardware.catalog import load_gpu
    from shardscope.serve.engine import load_engine
    from shardscope.serve.export import export_engine, export_release, serve_export
    from shardscope.serve.plan import serve_plan as search
    from shardscope.serve.report import print_serve_plan

    try:
        if output is not None:
            if export is None:
                raise ShardscopeError("-o/--output names the file of --export; give --export ENGINE")
            _check_output_path(output)
        if report is not None:
            _check_output_path(report)
        engine = engine or (export_engine(export) if export is not None else "vllm")
        if export is not None:  # refuse before the search what the export can never write
            export_release(export, load_engine(engine, load_gpu(gpu)).label)
        result = search(
            model, gpu=gpu, gpus=gpus, engine=engine, rate=rate, input_len=input_len, output_len=output_len,
            dataset=dataset, num_prompts=num_prompts, seed=seed, precision=precision, kv_dtype=kv_dtype,
            slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, top=top, disaggregate=disaggregate,
            prefix_len=prefix_len, samples=samples,
        )  # fmt: skip
        text = serve_export(result, export, model) if export is not None else None
        if text is not None and output is not None:
            output.write_text(text)
        if report is not None:
            from shardscope.serve.page import write_serve_page

            write_serve_page(report, result)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        doc = result.to_dict()
        if text is not None:
            doc["export"] = text
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif text is not None and output is None:
        sys.stdout.write(text)
    else:
        print_serve_plan(result)


app.add_typer(profile_app, name="profile")
app.command()(calibrate)


@app.command("rl-sync")
def rl_sync(
    model: Annotated[str, typer.Argument(help="catalog name (see `shardscope models`) or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Annotated[int | None, typer.Option(help="total GPUs (default: what the layouts use)")] = None,
    train: Annotated[str, typer.Option(help='trainer layout: "megatron tp1 pp16 ep16" or "fsdp 64"')] = "megatron",
    rollout: Annotated[str, typer.Option(help='rollout layout: "vllm tp32 dp8" (engine, TP, instances)')] = "vllm",
    placement: Annotated[str, typer.Option(help="colocated | disaggregated")] = "disaggregated",
    mechanism: Annotated[
        str | None,
        typer.Option(help="broadcast | reshard | ipc | ckpt-broadcast | ckpt-p2p | rdma (default: compare all)"),
    ] = None,
    precision: Annotated[str, typer.Option(help="weights the trainer holds: bf16 | fp8")] = "bf16",
    quantize: Annotated[str | None, typer.Option(help="re-quantize for the engine: fp8 (BF16->FP8 blockwise)")] = None,
    bucket_gib: Annotated[float, typer.Option(help="bucket size of bucketed transfers, GiB")] = 4.0,
    full_experts: Annotated[
        bool, typer.Option("--full-experts", help="every rollout rank receives every expert (not only its own)")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Predict an RL weight update (trainer -> rollout engines): time and parts per mechanism."""
    from shardscope.rl.command import rl_sync as run
    from shardscope.rl.report import print_rl_sync

    _answer(
        lambda: run(
            model, gpu=gpu, train=train, rollout=rollout, placement=placement, gpus=gpus, mechanism=mechanism,
            precision=precision, quantize=quantize, bucket_gib=bucket_gib, local_experts=not full_experts,
        ),
        as_json,
        print_rl_sync,
    )  # fmt: skip


@app.command("rl")
def rl(
    model: Annotated[str, typer.Argument(help="catalog name (see `shardscope models`) or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    algo: Annotated[str, typer.Option(help="grpo | ppo (PPO adds a critic forward and update)")] = "grpo",
    prompts: Annotated[int, typer.Option(help="prompts per step")] = 256,
    samples: Annotated[int, typer.Option(help="samples (responses) per prompt")] = 8,
    input_len: Annotated[int, typer.Option(help="prompt tokens")] = 1024,
    output_len: Annotated[int, typer.Option(help="response cap (max tokens); lengths are drawn below it")] = 4096,
    train: Annotated[
        str, typer.Option(help='trainer layout: "megatron tp2 ep8" or "fsdp"; a stack alone: the fastest that fits')
    ] = "megatron",
    rollout: Annotated[str, typer.Option(help='rollout layout: "vllm tp1" (TP only; instances fill the pool)')] = (
        "vllm tp1"
    ),
    placement: Annotated[str, typer.Option(help="colocated | disaggregated")] = "colocated",
    mode: Annotated[str, typer.Option(help="sync | one-step-off | async")] = "sync",
    staleness: Annotated[int, typer.Option(help="async: policy versions a sample may lag")] = 2,
    handover: Annotated[str, typer.Option(help="colocated: free | offload the engine's memory")] = "free",
    rollout_gpus: Annotated[int | None, typer.Option(help="disaggregated: GPUs of the rollout pool")] = None,
    search_split: Annotated[
        bool, typer.Option("--search-split", help="disaggregated: try every split of --gpus, report the best")
    ] = False,
    length_median: Annotated[float, typer.Option(help="median response length, fraction of --output-len")] = 0.3,
    length_sigma: Annotated[float, typer.Option(help="log-normal spread of response lengths")] = 0.7,
    seed: Annotated[int, typer.Option(help="seed of the response lengths")] = 0,
    trainer_offload: Annotated[
        str | None,
        typer.Option(
            help="colocated: trainer state sent to host while the engine runs: all | optimizer | none "
            "(default all, as NeMo-RL colocated; verl's default config: none)"
        ),
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(help="engine's fraction of GPU memory for the memory check (default: the engine's own)"),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option(help="write a few steps as Chrome-trace JSON (Perfetto): pools as processes")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Predict one RL step (GRPO/PPO): rollout, reference/critic forwards, policy update, weight sync, and
    each phase's memory per GPU (a colocated step that does not fit is refused)."""
    from shardscope.rl.loop import rl as run
    from shardscope.rl.loop_report import print_rl

    _answer(
        lambda: run(
            model, search=search_split, gpu=gpu, gpus=gpus, algo=algo, prompts=prompts, samples=samples,
            input_len=input_len, output_len=output_len, train=train, rollout=rollout, placement=placement,
            mode=mode, staleness=staleness, handover=handover, rollout_gpus=rollout_gpus,
            length_median=length_median, length_sigma=length_sigma, seed=seed, trainer_offload=trainer_offload,
            gpu_memory_utilization=gpu_memory_utilization, trace=trace,
        ),
        as_json,
        print_rl,
    )  # fmt: skip


def main() -> None:
    """The `shardscope` command: as `app`, but a usage error (a flag's value of the wrong type, an unknown
    option, a missing argument) is one line `error: ...` on stderr with exit status 2, like every other
    bad input, instead of Click's usage box."""
    # Click's UsageError, whichever Click Typer runs on (its own copy since 0.2x, else click itself)
    usage_error = typer.BadParameter.__bases__[0]
    try:
        code = app(standalone_mode=False)
    except usage_error as exc:
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        sys.stderr.write(f"error: {where}{' '.join(exc.format_message().split())}\n")
        sys.exit(2)
    except typer.Abort:
        sys.stderr.write("error: aborted\n")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
