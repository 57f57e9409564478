"""shardscope: plan and simulate large-model training on GPU clusters.

>>> import shardscope
>>> est = shardscope.estimate("llama3.1-8b", gpu="H100", gpus=8, global_batch=32, seq_len=8192)
>>> est.memory.peak_gib, est.mfu
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
    **plan: object,
) -> Estimate:
    """Estimate one training step of `model` (catalog name or config.json path) on `gpus` GPUs.

    Plan keywords are the fields of `shardscope.plan.Plan` (tp, pp, vpp, cp, dp, zero, fsdp, recompute,
    micro_batch, global_batch, seq_len, ...); dp is derived when left out. `stack` ("megatron", "nemo@25.04",
    "torchtitan", ...; see `shardscope stacks`) sets what the framework decides; a keyword given (not None)
    overrides it. `power_limit_w` caps every GPU's board power (lower clocks). For a video diffusion
    transformer, `video="FRAMESxHEIGHTxWIDTH"` sets seq_len to the clip's latent token count.
    `simulate=True` runs the discrete-event simulator (pipeline `schedule`: gpipe, 1f1b, interleaved,
    zb-h1, dualpipe; stragglers) instead of the closed form; `trace` writes its Chrome-trace JSON.
    """
    from shardscope.analytic.step import estimate_step
    from shardscope.stacks import load_stack

    resolved = load_stack(stack or "")
    spec, cluster, p = setup(
        model, gpu, gpus, gpus_per_node=gpus_per_node, cluster_file=cluster_file, video=video, stack=resolved,
        power_limit_w=power_limit_w, **plan,
    )  # fmt: skip
    if not (simulate or trace or schedule or straggler_fraction):
        return _with_stack(estimate_step(spec, cluster, p), resolved)
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
    if not 0 <= straggler_fraction <= 1 or straggler_slowdown < 1:
        raise ShardscopeError("--straggler-fraction must be in [0, 1] and --straggler-slowdown >= 1")
    result = simulate_step(spec, cluster, p, schedule, straggler_fraction, straggler_slowdown)
    if trace is not None:
        from shardscope.report.trace import write_trace

        write_trace(result, Path(trace))
    return _with_stack(result.estimate, resolved)


def _with_stack(est: Estimate, stack: Stack) -> Estimate:
    from shardscope.records import evolve

    return evolve(est, stack=stack.label, warnings=est.warnings + stack.warnings)


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
