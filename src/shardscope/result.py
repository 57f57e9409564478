"""Typed results of an estimate. Field names are the stable JSON schema (see README, "JSON output")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ParamCounts:
    total: int  # exact parameter count of the model
    per_gpu: int  # parameters held by the most-loaded GPU before ZeRO/FSDP sharding (after TP/PP)
    per_gpu_sharded: float  # ... after ZeRO/FSDP sharding of the weights
    active: int = 0  # parameters a token passes through (MoE: routed experts only for the top-k)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Peak memory of the most-loaded GPU, GiB (2^30 bytes)."""

    peak_gib: float  # allocated at the peak (what torch.cuda.max_memory_allocated reports)
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float  # transient: FSDP gather buffers, fp32 logits/loss grads, PP/comm buffers
    overhead_gib: float  # outside the allocator's count: CUDA context, NCCL, fragmentation
    required_gib: float  # peak + overhead: what must fit in HBM
    capacity_gib: float
    stage: int  # pipeline stage of the most-loaded rank
    inflight_microbatches: int
    host_gib: float = 0.0  # host memory per node used by CPU offload


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """Seconds per optimizer step; the four parts add up to `step_time_s`."""

    compute_s: float  # compute on the critical path (incl. recompute and overlap slowdown)
    exposed_comm_s: float  # communication not hidden behind compute (TP, CP, PP, DP/FSDP)
    bubble_s: float  # pipeline fill/drain idle time
    optimizer_s: float  # optimizer step (+ gradient clipping)
    recompute_s: float = 0.0  # part of compute_s spent re-running forward ops
    comm_total_s: float = 0.0  # all communication, hidden or not
    host_stall_s: float = 0.0  # part of compute_s the GPU waits for the host to launch work (eager mode);
    # with pipeline stages the bubble, a multiple of a stage's time, grows with it too
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Estimate:
    model: str
    gpu: str
    gpus: int
    plan: dict[str, Any]
    params: ParamCounts
    step_time_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_step: float  # 3 x forward FLOPs of GEMMs + causal attention (no recompute)
    hardware_flops_per_step: float  # model FLOPs + recompute
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float  # fraction of `peak_tflops_per_gpu`: the GPU's dense peak at the plan's GEMM precision
    hfu: float
    peak_tflops_per_gpu: float  # the peak MFU is quoted against (FP8's for an FP8 plan)
    fits: bool
    memory: MemoryBreakdown
    time: TimeBreakdown
    warnings: tuple[str, ...] = ()
    stack: str = ""  # the software stack the plan's kernels and overlaps come from (NAME@RELEASE)
    # with a measured profile: its name, source, and the ops priced from it / from rooflines (None: no profile)
    profile: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        if self.profile is None:
            del d["profile"]
        return d
