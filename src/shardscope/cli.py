"""The `shardscope` command: a thin Typer layer over the Python API.

User errors (ShardscopeError) print one line on stderr and exit with status 2. Heavy modules load
inside the commands, so `shardscope estimate --json` starts fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from shardscope.errors import ShardscopeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan and simulate large-model training on GPU clusters: memory, step time, MFU.",
)

# Options shared by several commands: one declaration each.
Gpu = Annotated[str, typer.Option(help="GPU kind (see `shardscope gpus`)")]
Gpus = Annotated[int, typer.Option(help="total GPUs")]
GpusPerNode = Annotated[int | None, typer.Option(help="GPUs per node (default: the GPU's system)")]
ClusterFile = Annotated[Path | None, typer.Option(help="cluster description file (YAML/JSON)")]
Tp = Annotated[int, typer.Option(help="tensor-parallel degree")]
Pp = Annotated[int, typer.Option(help="pipeline-parallel degree")]
Vpp = Annotated[int, typer.Option(help="virtual stages per pipeline rank (interleaved 1F1B)")]
PpLayout = Annotated[
    str | None,
    typer.Option(
        help="layers per model chunk: Megatron layout ('Et*4|(t*4|)*14tmL'; MTP in a chunk of its own: "
        "'...|m|L') or counts ('5,4,...,1')"
    ),
]
Cp = Annotated[int, typer.Option(help="context-parallel degree")]
CpKind = Annotated[str, typer.Option(help="context parallel: ring | a2a")]
SequenceParallel = Annotated[bool, typer.Option(help="Megatron sequence parallel with TP")]
Zero = Annotated[int | None, typer.Option(help="ZeRO stage 0-3 (Megatron-style state; default: the stack's)")]
Fsdp = Annotated[
    bool | None, typer.Option("--fsdp/--no-fsdp", help="PyTorch FSDP (full shard); see --shard-group, --reshard")
]
ShardGroup = Annotated[int, typer.Option(help="HSDP shard-group size (0 = all of dp)")]
Reshard = Annotated[bool | None, typer.Option("--reshard/--no-reshard", help="FSDP reshard after forward")]
Recompute = Annotated[str, typer.Option(help="activation recompute: none | selective | full")]
RecomputeLayers = Annotated[int, typer.Option(help="full recompute for only this many layers per stage")]
RecomputeModules = Annotated[
    str | None,
    typer.Option(help="with selective: Megatron modules to recompute, e.g. layernorm,moe_act,mla_up_proj"),
]
MicroBatch = Annotated[int, typer.Option(help="sequences per micro-batch per GPU")]
GlobalBatch = Annotated[int | None, typer.Option(help="sequences per optimizer step")]
SeqLen = Annotated[int, typer.Option(help="sequence length in tokens")]
Video = Annotated[str | None, typer.Option(help="video DiT clip FRAMESxHEIGHTxWIDTH (sets the token count)")]
Precision = Annotated[str, typer.Option(help="bf16 | fp16 | fp8")]
Fp8Recipe = Annotated[
    str | None, typer.Option(help="tensorwise | rowwise (torchao) | delayed | blockwise | mxfp8 (default: the stack's)")
]
Fp8AllGather = Annotated[
    bool, typer.Option(help="FP8 parameters, gathered in FP8, no BF16 copy (Megatron --fp8-param-gather)")
]
AttentionKernel = Annotated[str | None, typer.Option(help="auto | fa2 | fa3 | cudnn | unfused (default: the stack's)")]
TpCommOverlap = Annotated[
    bool | None, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="overlap TP collectives with GEMMs")
]
AsyncTp = Annotated[bool, typer.Option(help="torchtitan async tensor parallel (TP collectives under the GEMMs)")]
Compile = Annotated[
    bool | None,
    typer.Option("--compile/--no-compile", help="torch.compile per block: norms, RoPE, SwiGLU fused (PyTorch stacks)"),
]
Stack = Annotated[
    str | None,
    typer.Option(help="software stack NAME[@RELEASE] that runs the plan (see `shardscope stacks`; default megatron)"),
]
PowerLimit = Annotated[float | None, typer.Option(help="GPU board power cap in watts (lower clocks), e.g. 500")]
Ep = Annotated[int, typer.Option(help="expert-parallel degree (carved out of dp·cp·tp)")]
Etp = Annotated[int, typer.Option(help="expert tensor-parallel degree")]
MoeSkew = Annotated[float, typer.Option(help="Zipf exponent of expert popularity (0 = balanced)")]
MoeImbalance = Annotated[float, typer.Option(help="extra load factor on the hottest EP rank (dropless)")]
CapacityFactor = Annotated[float, typer.Option(help="expert capacity factor: tokens over it dropped (0 = dropless)")]
PadToCapacity = Annotated[
    bool,
    typer.Option(help="with --capacity-factor: pad experts to capacity, no host sync (Megatron drop-and-pad)"),
]
Mtp = Annotated[bool, typer.Option(help="train the multi-token-prediction modules (DeepSeek-V3)")]
EpCommOverlap = Annotated[
    bool | None,
    typer.Option("--ep-comm-overlap/--no-ep-comm-overlap", help="hide EP all-to-alls under another micro-batch"),
]
EpDispatch = Annotated[str | None, typer.Option(help="flat (NCCL all-to-all) | deepep | hybridep (one copy per node)")]
FsdpPrefetch = Annotated[int | None, typer.Option(help="FSDP layers gathered ahead (0 = no overlap)")]
CudaGraphs = Annotated[
    str | None,
    typer.Option(help="CUDA-graphed scopes (default eager): attn,mlp,moe_router,moe_preprocess,moe | full_iteration"),
]
FusedActivation = Annotated[
    bool | None,
    typer.Option(
        "--fused-activation/--no-fused-activation",
        help="Megatron-Core fused elementwise kernels: SwiGLU keeps only its input, a Wan block's norms, adaLN "
        "modulation and gated residuals are jit-fused (default: unfused, as torchtitan / HF / diffusers)",
    ),
]
MoeRouterPadding = Annotated[
    bool,
    typer.Option(help="FP8 MoE: the router pads expert counts to the FP8 alignment (Megatron default: TE pads rows)"),
]
DeepepFusedRoutingMap = Annotated[
    bool,
    typer.Option(help="DeepEP: fused routing-map kernel (Megatron --enable-experimental); off, it syncs"),
]
FusedExpertMlp = Annotated[
    bool,
    typer.Option(
        help="Transformer Engine's fused grouped MLP for the experts (Megatron --use-transformer-engine-op-fuser "
        "with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; MXFP8 on Blackwell)"
    ),
]
FusedCrossEntropy = Annotated[
    bool | None,
    typer.Option(
        "--fused-cross-entropy/--no-fused-cross-entropy",
        help="fused cross-entropy kernel: no fp32 copy of the logits (default: the stack's)",
    ),
]
OffloadOptimizer = Annotated[bool, typer.Option(help="optimizer states in host memory, Adam on the CPU")]
OffloadActivations = Annotated[float, typer.Option(help="fraction of saved activations offloaded")]
OptimizerMoments = Annotated[str | None, typer.Option(help="Adam m, v dtype: fp32 | bf16 | fp8 (Megatron)")]
MainGrads = Annotated[str | None, typer.Option(help="gradient buffer dtype: fp32 | bf16 (Megatron)")]
OverlapGradReduce = Annotated[
    bool | None,
    typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="DP gradient reduction under the backward"),
]
MicroBatchOpt = Annotated[
    int | None, typer.Option("--micro-batch", help="sequences per micro-batch per GPU (default: the stack's, else 1)")
]
AsJson = Annotated[bool, typer.Option("--json", help="print one JSON object")]
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

# The `Plan` fields that estimate and budget take as options of the same name
PLAN_OPTIONS = (
    "tp", "pp", "vpp", "pp_layout", "cp", "cp_kind", "sequence_parallel", "zero", "fsdp", "shard_group",
    "recompute", "recompute_layers", "recompute_modules", "micro_batch", "global_batch", "seq_len",
    "precision", "fp8_recipe", "fp8_all_gather", "attention_kernel", "tp_comm_overlap", "ep", "etp",
    "moe_skew", "moe_imbalance", "capacity_factor", "pad_to_capacity", "mtp", "ep_comm_overlap", "ep_dispatch",
    "fsdp_prefetch", "cuda_graphs", "fused_activation", "fused_cross_entropy", "offload_optimizer",
    "offload_activations", "optimizer_moments", "main_grads", "overlap_grad_reduce", "moe_router_padding",
    "deepep_fused_routing_map", "fused_expert_mlp", "compile", "async_tp",
)  # fmt: skip


def _plan_options(values: dict, dp: int | None = None) -> dict:
    """The plan keywords among a command's option `values`; the global batch defaults to one micro-batch
    per data-parallel rank (per pipeline stage under pipelining)."""
    kw = {k: values[k] for k in PLAN_OPTIONS}
    kw["reshard_after_forward"] = values["reshard"]
    if kw["global_batch"] is None:
        derived_dp = dp or max(values["gpus"] // (kw["tp"] * kw["pp"] * kw["cp"]), 1)
        kw["global_batch"] = (kw["micro_batch"] or 1) * derived_dp * max(kw["pp"], 1)
    return kw


def _fail(msg: str) -> None:
    sys.stderr.write(f"error: {msg}\n")
    raise typer.Exit(2)


@app.command()
def estimate(
    model: Annotated[str, typer.Argument(help="catalog name (see `shardscope models`) or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    gpus_per_node: GpusPerNode = None,
    cluster: ClusterFile = None,
    stack: Stack = None,
    power_limit: PowerLimit = None,
    tp: Tp = 1,
    pp: Pp = 1,
    vpp: Vpp = 1,
    pp_layout: PpLayout = None,
    cp: Cp = 1,
    cp_kind: CpKind = "ring",
    dp: Annotated[int | None, typer.Option(help="data-parallel degree (default gpus/(tp·pp·cp))")] = None,
    sequence_parallel: SequenceParallel = True,
    zero: Zero = None,
    fsdp: Fsdp = None,
    shard_group: ShardGroup = 0,
    reshard: Reshard = None,
    recompute: Recompute = "none",
    recompute_layers: RecomputeLayers = 0,
    recompute_modules: RecomputeModules = None,
    micro_batch: MicroBatchOpt = None,
    global_batch: GlobalBatch = None,
    seq_len: SeqLen = 4096,
    video: Video = None,
    precision: Precision = "bf16",
    fp8_recipe: Fp8Recipe = None,
    fp8_all_gather: Fp8AllGather = False,
    attention_kernel: AttentionKernel = None,
    tp_comm_overlap: TpCommOverlap = None,
    async_tp: AsyncTp = False,
    compile: Compile = None,
    ep: Ep = 1,
    etp: Etp = 1,
    moe_skew: MoeSkew = 0.0,
    moe_imbalance: MoeImbalance = 1.0,
    capacity_factor: CapacityFactor = 0.0,
    pad_to_capacity: PadToCapacity = True,
    moe_router_padding: MoeRouterPadding = False,
    deepep_fused_routing_map: DeepepFusedRoutingMap = False,
    fused_expert_mlp: FusedExpertMlp = False,
    mtp: Mtp = False,
    ep_comm_overlap: EpCommOverlap = None,
    ep_dispatch: EpDispatch = None,
    fsdp_prefetch: FsdpPrefetch = None,
    cuda_graphs: CudaGraphs = None,
    fused_activation: FusedActivation = None,
    fused_cross_entropy: FusedCrossEntropy = None,
    offload_optimizer: OffloadOptimizer = False,
    offload_activations: OffloadActivations = 0.0,
    optimizer_moments: OptimizerMoments = None,
    main_grads: MainGrads = None,
    overlap_grad_reduce: OverlapGradReduce = None,
    simulate: Annotated[bool, typer.Option(help="use the discrete-event simulator for the numbers")] = False,
    schedule: Annotated[
        str | None, typer.Option(help="pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 | dualpipe")
    ] = None,
    trace: Annotated[Path | None, typer.Option(help="write the simulated step as Chrome-trace JSON")] = None,
    straggler_fraction: Annotated[float, typer.Option(help="fraction of GPUs that run slow")] = 0.0,
    straggler_slowdown: Annotated[float, typer.Option(help="how much slower those GPUs run")] = 1.0,
    as_json: AsJson = False,
) -> None:
    """Predict step time, throughput, MFU and per-GPU memory of one training plan."""
    from shardscope import estimate as run_estimate

    try:
        result = run_estimate(
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
            dp=dp,
            **_plan_options(locals(), dp),
        )
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    from shardscope.report.console import print_estimate

    print_estimate(result)


@app.command()
def plan(
    model: Annotated[str, typer.Argument(help="catalog name or path to a config.json")],
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node")] = None,
    seq_len: Annotated[int, typer.Option(help="sequence length in tokens")] = 4096,
    global_batch: Annotated[int, typer.Option(help="sequences per optimizer step")] = 256,
    video: Annotated[str | None, typer.Option(help="video DiT clip FRAMESxHEIGHTxWIDTH")] = None,
    precision: Annotated[str, typer.Option(help="bf16 | fp8")] = "bf16",
    fp8_recipe: Fp8Recipe = None,
    stack: Stack = None,
    power_limit: PowerLimit = None,
    objective: Annotated[str, typer.Option(help="throughput | memory | cost")] = "throughput",
    top: Annotated[int, typer.Option(help="plans to show")] = 10,
    tokens: Annotated[str | None, typer.Option(help="token budget to train, e.g. 15T")] = None,
    price_per_gpu_hour: Annotated[float | None, typer.Option(help="price of one GPU-hour")] = None,
    export: Annotated[str | None, typer.Option(help="write the best plan as torchtitan | megatron | deepspeed")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="file for --export (default: stdout)")] = None,
    cuda_graphs: CudaGraphs = None,
    fused_activation: FusedActivation = None,
    fused_cross_entropy: FusedCrossEntropy = None,
    ep_dispatch: EpDispatchChoice = "auto",
    ep_comm_overlap: EpCommOverlapChoice = None,
    workers: Workers = 0,
    executor: Annotated[str, typer.Option(help="local | ray")] = "local",
    as_json: AsJson = False,
) -> None:
    """Search every valid plan, prune by memory, rank by throughput (or memory / cost)."""
    from shardscope.planner.runner import run_plan_command

    try:
        run_plan_command(
            model=model,
            gpu=gpu,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            seq_len=seq_len,
            global_batch=global_batch,
            video=video,
            precision=precision,
            objective=objective,
            top=top,
            tokens=tokens,
            price_per_gpu_hour=price_per_gpu_hour,
            export=export,
            output=output,
            workers=workers,
            executor=executor,
            as_json=as_json,
            cuda_graphs=cuda_graphs,
            fused_activation=fused_activation,
            fused_cross_entropy=fused_cross_entropy,
            ep_dispatch=ep_dispatch,
            ep_comm_overlap=ep_comm_overlap,
            fp8_recipe=fp8_recipe,
            stack=stack,
            power_limit=power_limit,
        )
    except ShardscopeError as exc:
        _fail(str(exc))


@app.command()
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
    tp: Tp = 1,
    pp: Pp = 1,
    vpp: Vpp = 1,
    pp_layout: PpLayout = None,
    cp: Cp = 1,
    cp_kind: CpKind = "ring",
    sequence_parallel: SequenceParallel = True,
    zero: Zero = None,
    fsdp: Fsdp = None,
    shard_group: ShardGroup = 0,
    reshard: Reshard = None,
    recompute: Annotated[str, typer.Option(help="recompute policy of the plan (fsdp-unshard)")] = "none",
    recompute_layers: RecomputeLayers = 0,
    recompute_modules: RecomputeModules = None,
    micro_batch: MicroBatchOpt = None,
    global_batch: GlobalBatch = None,
    seq_len: SeqLen = 4096,
    video: Video = None,
    precision: Precision = "bf16",
    fp8_recipe: Fp8Recipe = None,
    fp8_all_gather: Fp8AllGather = False,
    attention_kernel: AttentionKernel = None,
    tp_comm_overlap: TpCommOverlap = None,
    async_tp: AsyncTp = False,
    compile: Compile = None,
    ep: Ep = 1,
    etp: Etp = 1,
    moe_skew: MoeSkew = 0.0,
    moe_imbalance: MoeImbalance = 1.0,
    capacity_factor: CapacityFactor = 0.0,
    pad_to_capacity: PadToCapacity = True,
    moe_router_padding: MoeRouterPadding = False,
    deepep_fused_routing_map: DeepepFusedRoutingMap = False,
    fused_expert_mlp: FusedExpertMlp = False,
    mtp: Mtp = False,
    ep_comm_overlap: EpCommOverlap = None,
    ep_dispatch: EpDispatch = None,
    fsdp_prefetch: FsdpPrefetch = None,
    cuda_graphs: CudaGraphs = None,
    fused_activation: FusedActivation = None,
    fused_cross_entropy: FusedCrossEntropy = None,
    offload_optimizer: OffloadOptimizer = False,
    offload_activations: OffloadActivations = 0.0,
    optimizer_moments: OptimizerMoments = None,
    main_grads: MainGrads = None,
    overlap_grad_reduce: OverlapGradReduce = None,
    as_json: AsJson = False,
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
            power_limit_w=power_limit, **_plan_options(locals()),
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
def report(
    model: Annotated[str, typer.Argument(help="catalog name or path to a config.json")],
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write")] = Path("report.html"),
    gpu: Gpu = "H100",
    gpus: Gpus = 8,
    gpus_per_node: GpusPerNode = None,
    seq_len: SeqLen = 4096,
    global_batch: Annotated[int, typer.Option(help="sequences per optimizer step")] = 256,
    video: Video = None,
    precision: Annotated[str, typer.Option(help="bf16 | fp8")] = "bf16",
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
) -> None:
    """Search the plans and write a self-contained interactive HTML report."""
    from shardscope.planner.runner import SEARCH_OPTIONS, search_setup
    from shardscope.planner.search import search
    from shardscope.report.html import write_report
    from shardscope.sim import simulate_step

    try:
        spec, cluster, seq_len, space = search_setup(**{k: v for k, v in locals().items() if k in SEARCH_OPTIONS})
        result = search(spec, cluster, global_batch, seq_len, objective, space, workers=workers)
        if not result.candidates:
            raise ShardscopeError(f"no plan of {spec.name} fits {gpus}x {cluster.gpu.name} at this batch")
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


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="CSV with the schema of shared/validation/training_public.csv")],
    as_json: AsJson = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the summary as a Markdown table")] = False,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="print every row")] = True,
) -> None:
    """Predict every row of a validation CSV and report the errors."""
    from shardscope.validate.runner import run_validation

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


def main() -> None:  # pragma: no cover - entry point
    app()
