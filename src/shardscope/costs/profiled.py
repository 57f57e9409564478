"""Measured op times from a GPU's profile (`hardware.profile`), where the profile covers the op.

`costs.compute.op_time_s` asks `profiled_time_s` first when the GPU carries a profile: a GEMM, attention or
streaming op whose every kernel the profile covers (inside its measured shapes) takes the interpolated
measured time; any other op keeps the roofline and shipped efficiencies. The op graph and the plan are
the same either way: only the price of an op changes.
"""

from __future__ import annotations

from shardscope.costs.compute import gemm_passes
from shardscope.costs.efficiency import DEFAULT_ATTENTION_KERNEL
from shardscope.graph.ops import Op
from shardscope.hardware.profile import Profile
from shardscope.plan.plan import Plan

# The kernels a plan's `attention_kernel` runs, by the backend name the profile records: FA3-class kernels
# are measured through cuDNN (as `costs.efficiency.attention_fraction` prices "cudnn" as fa3).
_ATTENTION_BACKEND = {"fa3": "cudnn", "cudnn": "cudnn", "fa2": "fa2"}


def attention_backend(plan: Plan, arch: str) -> str | None:
    """The profile backend that stands for the plan's attention kernel (None: unfused, never measured)."""
    kernel = DEFAULT_ATTENTION_KERNEL.get(arch, "fa2") if plan.attention_kernel == "auto" else plan.attention_kernel
    return _ATTENTION_BACKEND.get(kernel)


def profiled_time_s(profile: Profile, arch: str, op: Op, backward: bool, plan: Plan) -> float | None:
    """Measured (interpolated) GPU time of one phase of `op`, kernel gaps excluded; None where the profile
    does not cover every kernel of it."""
    if op.kind == "gemm":
        precision, groups, passes = gemm_passes(op, backward, plan)
        times = [profile.gemm_s(m, n, k, precision, groups) for m, n, k in passes]
        return None if any(t is None for t in times) else sum(times)
    if op.kind == "attention":
        backend = attention_backend(plan, arch)
        if backend is None or op.query_rows <= 0:
            return None
        return profile.attention_s(
            op.bwd_flops if backward else op.flops,
            op.query_rows,
            op.kv_span or plan.seq_len // plan.cp,
            op.head_dim,
            backward=backward,
            causal=plan.causal,
            windowed=op.kv_span > 0,
            sinks=op.sinks,
            backend=backend,
        )
    nbytes = op.bwd_bytes if backward else op.bytes
    launches = op.bwd_launches if backward and op.bwd_launches is not None else op.launches
    if nbytes <= 0 or launches <= 0:
        return None
    # a chain of `launches` kernels, each streaming its share of the bytes
    one = profile.elementwise_s(nbytes / launches, "aten" if op.aten else "contiguous")
    return None if one is None else one * launches


def ops_measured(profile: Profile, arch: str, ops: list[Op], plan: Plan) -> tuple[list[str], list[str]]:
    """Names of `ops` priced from the profile (in forward or backward), and of those that are not."""
    measured: dict[str, None] = {}
    roofline: dict[str, None] = {}
    for op in ops:
        hit = any(profiled_time_s(profile, arch, op, bwd, plan) is not None for bwd in (False, True))
        (measured if hit else roofline)[op.name] = None
    return list(measured), [name for name in roofline if name not in measured]
