"""Host (CPU) time to issue a layer's GPU work in eager mode, and the time the GPU waits for it.

In eager PyTorch the host launches every kernel; the GPU runs behind it and only waits when the host
is slower, or when the host stops to read a result back (a synchronisation). MoE layers hit both: a
dropless dispatcher copies the per-expert token counts to the host after the router, and Transformer
Engine's grouped GEMM issues one cuBLASLt GEMM per local expert from a host loop. CUDA graphs replay a
captured scope with one launch, which removes its host time (Megatron-Core `--cuda-graph-modules`, or
the whole step with `full_iteration`).

Per phase of a layer: time = Σ over segments between synchronisations of max(host, GPU); forward
has the MoE dispatcher's one sync, backward none (the host runs ahead across its layers). Exposed
communication keeps the GPU busy too: the dispatcher's all-to-alls after its sync, while the host issues
the experts; TP and CP collectives before it. The stall is what that adds to the GPU time.
"""

from __future__ import annotations

from itertools import pairwise

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
        return op.launches * LAUNCH_S
    calls = op.groups * (2 if backward else 1)
    quant = op.groups * QUANT_LAUNCHES[plan.fp8_recipe] if op.fp8 and plan.precision == "fp8" else 0
    return calls * GEMM_CALL_S + quant * LAUNCH_S


def syncs(plan: Plan) -> bool:
    """Whether the host waits at the ops marked `host_sync`: yes unless the MoE layer is captured whole
    (`moe` or `full_iteration`), which Megatron-Core allows only with sync-free dispatch. Graphing the
    router and the dispatcher's preprocess keeps the wait: the token counts are read after them."""
    return not ({"moe", "full_iteration"} & set(plan.cuda_graphs))


def host_stall_s(
    ops: tuple[Op, ...],
    gpu_times: tuple[float, ...],
    backward: bool,
    plan: Plan,
    exposed_comm_s: float = 0.0,
    dispatch_comm_s: float = 0.0,
) -> float:
    """Time the GPU waits for the host in one phase of `ops`: per segment between host synchronisations
    (forward only), max(0, host time - GPU time). Exposed communication is GPU time too: the MoE
    dispatch (`dispatch_comm_s`, part of `exposed_comm_s`) of the segment after the last sync, the rest
    of the first segment."""
    host = [op_host_s(op, backward, plan) for op in ops]
    cuts = [0]
    if not backward and syncs(plan):
        cuts += [i for i, op in enumerate(ops) if op.host_sync and i > 0]
    cuts.append(len(ops))
    segments = list(pairwise(cuts))
    comm = [0.0] * len(segments)
    comm[0] += exposed_comm_s - dispatch_comm_s
    comm[-1] += dispatch_comm_s
    return sum(max(0.0, sum(host[a:b]) - sum(gpu_times[a:b]) - c) for (a, b), c in zip(segments, comm, strict=True))
