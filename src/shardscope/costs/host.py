"""Host (CPU) time to issue a layer's GPU work in eager mode, and the time the GPU waits for it.

In eager PyTorch the host launches every kernel; the GPU runs behind it and only waits when the host
is slower, or when the host stops to read a result back (a synchronisation). MoE layers hit both: a
dropless dispatcher copies the per-expert token counts to the host after the router, and Transformer
Engine's grouped GEMM issues one cuBLASLt GEMM per local expert from a host loop. CUDA graphs replay a
captured scope with one launch, which removes its host time (Megatron-Core `--cuda-graph-modules`, or
the whole step with `full_iteration`).

Per phase of a layer: time = Σ over segments between synchronisations of max(host, GPU); forward
has the MoE dispatcher's one sync, backward none (the host runs ahead across its layers). The GPU side
of the last segment includes the phase's exposed communication (the dispatcher's all-to-alls run after
its sync, while the host issues the experts). The stall is what that adds to the GPU time.
"""

from __future__ import annotations

from shardscope.graph.common import OpGroup
from shardscope.graph.ops import Op
from shardscope.plan.plan import Plan

# Host time per eager kernel launch through PyTorch: 4-6 us (PyTorch issue #82793 on A100; Nsight
# profiles of eager training steps on NVL72). Each op of the graph counts as one launch per phase, a
# lower bound: unfused layers launch several kernels per op.
LAUNCH_S = 5e-6
# Host time of one GEMM call through Transformer Engine's cuBLASLt path (descriptors, heuristic query,
# launch, stream events). Measured in TransformerEngine PR #3134 (SM100): eight per-expert GEMMs of
# 128 x 2048 x 2048 issued by the multi-stream grouped GEMM take 0.267 ms with pre-quantized operands,
# while one CUTLASS grouped kernel does the same math in 0.069 ms: the loop is host-bound at 33 us a GEMM.
GEMM_CALL_S = 33e-6
# Quantization kernels per FP8 GEMM operand cast in a step (TE 2.9): current ("tensorwise") scaling
# zeroes the amax, reduces it, computes the scale and casts; the other recipes cast in one kernel.
QUANT_LAUNCHES = {"tensorwise": 4, "delayed": 1, "blockwise": 1, "mxfp8": 1}


def op_host_s(op: Op, backward: bool, plan: Plan) -> float:
    """Host time to issue `op`'s forward or backward kernels (0 when a CUDA graph captures them).
    A GEMM is one call per expert (`groups`) forward and two (dgrad, wgrad) backward; an FP8 GEMM also
    quantizes one operand per expert per phase (forward its input, backward the output gradient)."""
    if "full_iteration" in plan.cuda_graphs or (op.scope and op.scope in plan.cuda_graphs):
        return 0.0
    if op.kind != "gemm":
        return LAUNCH_S
    calls = op.groups * (2 if backward else 1)
    quant = op.groups * QUANT_LAUNCHES[plan.fp8_recipe] if op.fp8 and plan.precision == "fp8" else 0
    return calls * GEMM_CALL_S + quant * LAUNCH_S


def host_stall_s(
    unit: OpGroup, gpu_times: tuple[float, ...], backward: bool, plan: Plan, exposed_comm_s: float = 0.0
) -> float:
    """Time the GPU waits for the host in one phase of `unit`: per segment between host
    synchronisations (forward only), max(0, host time - GPU time), the exposed communication counted
    as GPU time of the last segment."""
    host = [op_host_s(op, backward, plan) for op in unit.ops]
    cuts = [0]
    if not backward:
        cuts += [i for i, op in enumerate(unit.ops) if op.host_sync and host[i] > 0]
    cuts.append(len(unit.ops))
    stall = 0.0
    for a, b in zip(cuts, cuts[1:], strict=False):
        gpu = sum(gpu_times[a:b]) + (exposed_comm_s if b == len(unit.ops) else 0.0)
        stall += max(0.0, sum(host[a:b]) - gpu)
    return stall
