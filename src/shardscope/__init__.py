"""shardscope: plan and simulate large-model training on GPU clusters.

>>> import shardscope
>>> est = shardscope.estimate("llama3.1-8b", gpu="H100", gpus=8, global_batch=32, seq_len=8192)
>>> est.memory.peak_gib, est.mfu
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from shardscope.errors import ShardscopeWarning
from shardscope.result import Estimate

if TYPE_CHECKING:
    from shardscope.hardware.catalog import Cluster
    from shardscope.models.spec import ModelSpec
    from shardscope.plan.plan import Plan
    from shardscope.stacks import Stack

__version__ = "0.1.0"
__all__ = ["Estimate", "estimate", "setup"]


def estimate(
    model: str | Path,
    gpu: str = "H100",
    gpus: int = 8,
    *,
    gpus_per_node: int | None = None,
    cluster_file: str | Path | None = None,
    video: str | None = None,
    stack: str | None = None,
    power_limit_w: float | None = None,
    simulate: bool = False,
    schedule: str | None = None,
    straggler_fraction: float = 0.0,
    straggler_slowdown: float = 1.0,
    trace: str | Path | None = None,
    profile: str | Path | None = None,
    **plan: object,
) -> Estimate:
    """Estimate one training step of `model` (catalog name or config.json path) on `gpus` GPUs.

    Plan keywords are the fields of `shardscope.plan.Plan` (tp, pp, vpp, cp, dp, zero, fsdp, recompute,
    micro_batch, global_batch, seq_len, ...); dp is derived when left out. `stack` ("megatron", "nemo@25.04",
    "torchtitan", ...; see `shardscope stacks`) sets what the framework decides; a keyword given (not None)
    overrides it. `power_limit_w` caps every GPU's board power (lower clocks). For a video diffusion
    transformer, `video="FRAMESxHEIGHTxWIDTH"` sets seq_len to the clip's latent token count.
    `simulate=True` runs the discrete-event simulator (pipeline `schedule`: gpipe, 1f1b, interleaved,
    zb-h1, dualpipe; stragglers) instead of the closed form. `trace` writes the step as Chrome-trace JSON,
    drawn from the engine that gave the numbers (the closed form laid out in time, or the simulation).
    `profile` (a shipped profile's name, e.g. "H100", or a file written by `shardscope calibrate`) prices
    the ops it covers from measured times; the result's `profile` names them.
    """
    from shardscope.analytic.step import estimate_step
    from shardscope.stacks import load_stack

    resolved = load_stack(stack or "")
    # DualPipe runs a forward chunk of one micro-batch beside a backward chunk of another by its own order
    # (DeepSeek-V3 report §3.2.1), so the EP all-to-all overlap is not bound by Megatron's rule (no pipeline
    # or an interleaved one): the plan is made without it and given it after, its other conditions checked
    dualpipe_overlap = schedule == "dualpipe" and bool(plan.get("ep_comm_overlap"))
    if dualpipe_overlap:
        plan = {**plan, "ep_comm_overlap": False}
    # input warnings (a misspelt config key, a cluster past any built) travel with the estimate
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ShardscopeWarning)
        spec, cluster, p = setup(
            model, gpu, gpus, gpus_per_node=gpus_per_node, cluster_file=cluster_file, video=video, stack=resolved,
            power_limit_w=power_limit_w, **plan,
        )  # fmt: skip
    said = resolved.warnings + _input_warnings(caught)
    if dualpipe_overlap:
        from shardscope.errors import ShardscopeError
        from shardscope.plan.plan import ep_overlap_problem
        from shardscope.records import evolve

        p = evolve(p, ep_comm_overlap=True)
        if problem := ep_overlap_problem(evolve(p, pp=1)):  # EP, no full recompute
            raise ShardscopeError(problem)
    if profile is not None:
        cluster = with_profile(cluster, profile)
    if not (simulate or schedule or straggler_fraction):
        est = _with_profile_report(estimate_step(spec, cluster, p, resolved.label, said), spec, cluster, p)
        if trace is not None:  # the estimate laid out in time, not another engine's numbers
            from shardscope.report.closed_form import closed_form_timeline
            from shardscope.report.trace import write_trace

            write_trace(closed_form_timeline(spec, cluster, p, est), Path(trace))
        return est
    from shardscope.errors import ShardscopeError
    from shardscope.sim import SCHEDULES, simulate_step

    if schedule is not None and schedule not in SCHEDULES:
        raise ShardscopeError(f"unknown schedule {schedule!r} (valid: {', '.join(SCHEDULES)})")
    if p.vpp > 1 and p.grad_accum % p.pp:
        raise ShardscopeError(
            f"the interleaved schedule needs micro-batches per step ({p.grad_accum}) to be a multiple of pp ({p.pp})"
        )
    if schedule == "interleaved" and p.vpp == 1:
        raise ShardscopeError("the interleaved schedule needs --vpp > 1")
    if schedule in ("gpipe", "1f1b", "zb-h1", "dualpipe") and p.vpp > 1:
        raise ShardscopeError(f"the {schedule} schedule has one model chunk per rank: use --vpp 1")
    if schedule == "dualpipe" and p.grad_accum % 2:
        raise ShardscopeError("dualpipe splits the micro-batches between its two directions: use an even count")
    if schedule == "dualpipe" and (p.pp % 2 or p.grad_accum < 2 * p.pp):
        # deepseek-ai/DualPipe asserts an even rank count and num_chunks >= 2·ranks
        raise ShardscopeError(
            f"dualpipe needs an even --pp and at least 2·pp micro-batches per step (pp {p.pp}, {p.grad_accum})"
        )
    if not 0 <= straggler_fraction <= 1 or straggler_slowdown < 1:
        raise ShardscopeError("--straggler-fraction must be in [0, 1] and --straggler-slowdown >= 1")
    result = simulate_step(spec, cluster, p, schedule, straggler_fraction, straggler_slowdown)
    if trace is not None:
        from shardscope.report.trace import write_trace

        write_trace(result, Path(trace))
    return _with_profile_report(_with_stack(result.estimate, resolved, said), spec, cluster, p)


def with_profile(cluster: Cluster, profile: str | Path) -> Cluster:
    """`cluster` whose GPUs carry the measured `profile` (name or file); the profile must be of that GPU."""
    from dataclasses import replace

    from shardscope.errors import ShardscopeError
    from shardscope.hardware.catalog import load_gpu
    from shardscope.hardware.profile import load_profile

    prof = load_profile(profile)
    try:
        measured_on = load_gpu(prof.gpu).name if prof.gpu else None
    except ShardscopeError:
        measured_on = None  # a GPU the catalog does not know: only a cluster file can describe it
    if measured_on is not None and measured_on != cluster.gpu.name:
        raise ShardscopeError(f"profile {prof.name} was measured on {measured_on}, not {cluster.gpu.name}")
    return replace(cluster, gpu=replace(cluster.gpu, profile=prof))


def _with_profile_report(est: Estimate, spec: ModelSpec, cluster: Cluster, plan: Plan) -> Estimate:
    """`est` with the ops its profile priced named (unchanged without a profile)."""
    prof = cluster.gpu.profile
    if prof is None:
        return est
    from shardscope.costs.profiled import ops_measured
    from shardscope.graph.build import build_stage_graph
    from shardscope.records import evolve

    graph = build_stage_graph(spec, plan, cluster.gpu.arch)
    groups = [*graph.layers.values(), graph.embedding, graph.head, *([graph.mtp] if spec.mtp_layers else [])]
    measured, roofline = ops_measured(prof, cluster.gpu.arch, [op for g in groups for op in g.ops], plan)
    report = {"name": prof.name, "source": prof.source, "ops_measured": measured, "ops_roofline": roofline}
    return evolve(est, profile=report)


def _with_stack(est: Estimate, stack: Stack, said: tuple[str, ...]) -> Estimate:
    from shardscope.records import evolve

    return evolve(est, stack=stack.label, warnings=est.warnings + said)


def _input_warnings(caught: list[warnings.WarningMessage]) -> tuple[str, ...]:
    """The ShardscopeWarnings among `caught`, each once, for the estimate to carry; every caught warning
    is issued again as it was (the CLI prints a ShardscopeWarning as one line on stderr)."""
    said: dict[str, None] = {}
    for w in caught:
        if issubclass(w.category, ShardscopeWarning):
            said[str(w.message)] = None
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return tuple(said)


def setup(
    model: str | Path,
    gpu: str = "H100",
    gpus: int = 8,
    *,
    gpus_per_node: int | None = None,
    cluster_file: str | Path | None = None,
    video: str | None = None,
    stack: Stack | str | None = None,
    power_limit_w: float | None = None,
    **plan: object,
) -> tuple[ModelSpec, Cluster, Plan]:
    """The model spec, cluster and validated plan that `estimate` takes the same arguments for."""
    from shardscope.hardware.catalog import load_cluster_file, make_cluster
    from shardscope.models.catalog import load_model
    from shardscope.plan.resolve import stack_plan

    spec = load_model(model)
    if video is not None:
        plan["seq_len"] = video_seq_len(spec, video)
    if cluster_file is not None:
        cluster = load_cluster_file(Path(cluster_file), gpus=gpus)
    else:
        cluster = make_cluster(gpu, gpus, gpus_per_node, power_limit_w=power_limit_w)
    return spec, cluster, stack_plan(spec, cluster, stack, **plan)


def video_seq_len(spec, video: str) -> int:
    """Latent tokens of a FRAMESxHEIGHTxWIDTH clip for a video DiT (VAE and patch compression)."""
    from shardscope.errors import ShardscopeError

    if spec.dit is None:
        raise ShardscopeError(f"--video needs a video diffusion model ({spec.name} is not one)")
    try:
        frames, height, width = (int(v) for v in video.lower().split("x"))
    except ValueError:
        raise ShardscopeError(f"--video must be FRAMESxHEIGHTxWIDTH (e.g. 81x720x1280), got {video!r}") from None
    if min(frames, height, width) <= 0:
        raise ShardscopeError(f"--video sizes must be positive, got {video!r}")
    tokens = spec.dit.video_tokens(frames, height, width)
    if tokens <= 0:
        raise ShardscopeError(f"--video {video} is smaller than one latent patch")
    return tokens
