"""Host (CPU) time to issue a layer's GPU work in eager mode, and the time the GPU waits for it.

In eager PyTorch the host launches every kernel; the GPU runs behind it and only waits when the host
is slower, or when the host stops to read a result back (a synchronisation). MoE layers hit both: a
dropless dispatcher copies the per-expert token counts to the host after the router, and Transformer
Engine's grouped GEMM issues one cuBLASLt GEMM per local expert from a host loop. CUDA graphs replay a
captured scope with one launch, which removes its host time (Megatron-Core `--cuda-graph-modules`, or
the whole step with `full_iteration`).

Without a synchronisation the host runs ahead across layers and the GPU waits max(0, host - GPU) per
layer. A synchronisation drains the GPU's queue: from there to the next one (the next layer's sync) the
GPU starts empty and waits whenever the host has not yet issued the next kernel (`queue_idle_s`). Forward
has the MoE dispatcher's one sync per layer, backward none (and a DeepEP/HybridEP dispatch call's own host
time right after it); under the combined-1F1B all-to-all overlap the other micro-batch's queued work keeps
the GPU busy through the sync. Exposed communication keeps the GPU busy too, from where it is issued
(`Collective.after`): the dispatch all-to-alls right after the sync, while the host issues the experts;
the combine only after the experts; the token-count exchange before the sync; TP and CP collectives at
the layer's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from shardscope.costs.compute import op_kernels
from shardscope.graph.fp8 import QUANT_KERNELS
from shardscope.graph.ops import Collective, Op
from shardscope.plan.plan import Plan

# Host costs of eager calls, measured on the H100 machines lent to this project (PyTorch 2.11 on a
# virtualised 16-core Xeon, four fresh machines; validation/kernels_measured_h100.json `host_runs`,
# `host_autograd_runs`, `cpp_launch_runs`; bench/device/h100_kernels.py). An elementwise op as a training
# step runs it, from Python: 11.3-14.2 us in forward (recorded by autograd), 11.8-17.6 us when autograd's
# engine launches its backward (9.9-10.2 us with no autograd); mean 13.7 us. It replaces the 5 us taken
# before (PyTorch issue #82793, 4-6 us on an A100 system, PyTorch 1.12). Each memory op of the graph counts
# its `launches` at this cost. Transformer Engine's quantize calls (`split_quantize`) run in C++: a kernel
# launch there costs 3.6-4.5 us (mean 4.1), a caching-allocator allocation 1.6-2.9 us (mean 2.3), and each
# quantized tensor is handed back as a Python tensor subclass (`_make_wrapper_subclass`), 3.0 us. Training
# steps spend more host time than any such microbenchmark: the CUDA-graph A/B of test_host gains 22% where
# these give 9%, and the DeepSeek-V3 GB200 guide's eager MXFP8 experts take 2.5-3x the host time priced.
LAUNCH_S = 13.7e-6
CPP_LAUNCH_S = 4.1e-6
CPP_ALLOC_S = 2.3e-6
WRAPPER_S = 3.0e-6
# Host time of one Transformer Engine module call (Linear, LayerNormLinear, GroupedLinear,
# DotProductAttention) in one phase, its Python set-up and first kernel included. Measured: te.Linear BF16
# forward 99.7 us of CPU time on GB200 and 90.5 us on GH200 (TransformerEngine issue #2053, 2025); Megatron's
# TEColumnParallelLinear forward 140 us, 115 us after TransformerEngine PR #1191 (2024, x86). Backward runs
# the same kind of set-up (quantizers, saved tensors, main-grad hooks) before its GEMMs: taken equal.
TE_MODULE_S = 100e-6
# Host time of each further GEMM a module call issues (backward's wgrad, a grouped GEMM's next expert)
# through Transformer Engine's cuBLASLt path. Measured in TransformerEngine PR #3134 (SM100): eight
# per-expert GEMMs of 128 x 2048 x 2048 issued by the multi-stream grouped GEMM take 0.267 ms with
# pre-quantized operands, while one CUTLASS grouped kernel does the same math in 0.069 ms: the loop is
# host-bound at 33 us a GEMM.
GEMM_CALL_S = 33e-6
# A GEMM issued by plain PyTorch (`F.linear`, Megatron's router): 24.4, 20.8 and 22.6 us on the machines
# above; TransformerEngine issue #2053 measured 13.5 us for a torch-backend Linear forward on an H100 DGX, so
# a bare DGX host may be quicker per call than these virtualised ones.
TORCH_GEMM_S = 22.6e-6
# Framework Python that needs no GPU is timed on a CPU (bench/host_param_hooks.py,
# bench/megatron_dispatcher_host.py) and put on the H100 hosts' clock: Python and ATen dispatch run there at
# HOST_PYTHON_SPEED x the benches' CPU time, from one call timed on both, `torch.add(x, 1, out=y)`: 10.05 us
# through CUDA on the H100 hosts (`host_runs` launch_add_us) less its C++ launch (4.1 us, `CPP_LAUNCH_S`),
# over 3.68 us on the benches' CPU (validation/megatron_dispatcher_host_cpu.json add_out_us). What only the
# GPU path does is added at its own measured cost: a kernel launch, a CUDA allocation. Cross-check: the
# autograd op chain timed on both hosts (`host_autograd_runs`; the benches' fwd_autograd_op_us and
# bwd_engine_op_us) gives 1.39 with the H100 side's C++ launch and allocation taken off; at 1.39 the MoE
# rows' MAPE would be 19.5% rather than 19.1%.
HOST_PYTHON_SPEED = 1.61
# Host time per weight tensor of a Transformer Engine GEMM in backward, under Megatron-Core's DDP: TE adds
# the weight gradient into `main_grad` inside its wgrad GEMM and hands autograd a dummy gradient instead
# (`torch.empty` of the weight's shape, TE v2.9 `handle_custom_ddp_from_mcore`); autograd's AccumulateGrad
# node stores it and runs the hook DDP registers on that node, which drops it and marks the bucket ready
# (core_v0.15.0 `_make_backward_post_hook`). A grouped GEMM pays it once per expert. Timed on CPU with the
# same code (bench/host_param_hooks.py, validation/host_param_hooks_cpu.json): 6.9-7.0 us per weight, of
# which the dummy's allocation is 2.0 us there and 4.7 us through CUDA's caching allocator on the H100
# machines (`host_runs` torch_empty_us): 1.61 x (7.0 - 2.0) + 4.7 = 12.7 us. DDP's forward pre-hook (with
# `overlap_param_gather`) costs ~1 us per weight on the same bench: left out.
PARAM_BWD_S = 12.7e-6
# Per FP8 GEMM operand quantized in a phase, per expert: its kernels (`graph.fp8.QUANT_KERNELS`) and the
# tensors allocated for the result (block-scaled recipes: data and scales, row- and column-wise = 4;
# per-tensor: data and its transpose = 2; Megatron-LM DeepSeek-V3 GB200 guide, MXFP8), each a call of
# `CPP_LAUNCH_S` or `CPP_ALLOC_S` (Transformer Engine issues them from C++), and the quantized tensor's
# Python wrapper (`WRAPPER_S`).
# Known inconsistency, kept: Transformer Engine's grouped (split) quantize allocates its block-scaled
# experts' tensors in bulk since PR #1934 (July 2025), so per expert these calls overstate it; yet the
# DeepSeek-V3 GB200 guide's Nsight view of eager MXFP8 routed experts shows 2.7-3.3 ms of host time
# where this module's total is 1.1 ms, so the missing host time is elsewhere and larger.
QUANT_ALLOCS = {"tensorwise": 2, "rowwise": 2, "delayed": 2, "blockwise": 4, "mxfp8": 4}
# Host time of a DeepEP/HybridEP dispatch call once the token counts are known (its Python set-up,
# buffer allocations and the dispatch + permute launches), before its first kernel runs. Measured: the
# NVTX ranges of Megatron-Bridge's Qwen3-30B-A3B Nsight A/B on H100 (skills/nemo-mbridge-perf-moe-comm-
# overlap/SKILL.md @067f987df): dispatch-with-permute minus its metadata preprocess, (4.253 - 3.109) s and
# (1.767 - 0.670) s over 3,072 forward calls = 0.372 and 0.357 ms, with and without the overlap.
EP_DISPATCH_CALL_S = 0.365e-3
# Host time of Megatron-Core's all-to-all token dispatcher (`MoEAlltoAllTokenDispatcher`, `--ep-dispatch
# flat`) per MoE layer and micro-batch, on the H100 hosts, as a + b x EP seconds per stage. Its Python runs
# on a CPU as released (bench/megatron_dispatcher_host.py: one EP rank on torch.distributed's fake backend,
# force-balanced counts, TE's fused permutes stood in for by one autograd call each; Megatron-Core 0.15.0
# and 0.16.1 alike), EP 8 to 64 with 128 experts top-8 (validation/megatron_dispatcher_host_cpu.json).
# The bench's times are put on the H100 hosts' clock (`HOST_PYTHON_SPEED`), and each kernel-launching ATen
# call adds a C++ launch (`CPP_LAUNCH_S`). Per stage: before the dispatcher's sync, counting the tokens per
# expert, all-gathering the counts, copying them to the host and permuting (0.53 ms at EP 8); after it, the
# token and routing-weight all-to-alls and the sort by local expert (0.39 ms); the combine: unsort,
# all-to-all, un-permute (0.34 ms); and the backward of all of it (0.81 ms). Cross-check: HybridEP's dispatch
# call, measured in an Nsight profile on H100 hosts (`EP_DISPATCH_CALL_S`), takes 0.365 ms. Before this, the
# model counted one launch per permute or sort (0.05 ms a phase).
A2A_DISPATCHER_S = {
    "preprocess": (503.4e-6, 2.75e-6),
    "dispatch": (340.2e-6, 6.65e-6),
    "combine": (310.4e-6, 3.54e-6),
    "backward": (750.1e-6, 7.20e-6),
}
# The stage whose host time an op or collective of the dispatcher carries (forward, backward; "": none,
# a call inside a stage measured whole). Each is issued where its stage runs in Megatron-Core: the
# preprocess before the sync, the dispatch call right after it, the combine after the experts.
CALLS = {
    "a2a_preprocess": ("preprocess", ""),
    "a2a_dispatch": ("dispatch", ""),
    "a2a_combine": ("combine", "backward"),
    "a2a_in_call": ("", ""),
}


# Scopes inside the MoE layer: a CUDA graph of `moe` (the whole MoE layer) captures them too.
WITHIN_MOE = ("moe_router", "moe_preprocess")


def graphed(op: Op, plan: Plan) -> bool:
    """Whether a CUDA graph of the plan captures `op` (Megatron-Core's CudaGraphModule scopes)."""
    graphs = plan.cuda_graphs
    if not graphs:
        return False
    return "full_iteration" in graphs or op.scope in graphs or ("moe" in graphs and op.scope in WITHIN_MOE)


def call_host_s(call: str, backward: bool, ep: int) -> float:
    """Host time of one phase of a framework call whose time is measured whole (`CALLS`)."""
    stage = CALLS[call][backward]
    if not stage:
        return 0.0
    fixed, per_rank = A2A_DISPATCHER_S[stage]
    return fixed + per_rank * ep


def op_host_s(op: Op, backward: bool, plan: Plan) -> float:
    """Host time to issue `op`'s forward or backward kernels (0 when a CUDA graph captures them).
    A GEMM issues one call per expert (`groups`) forward and two (dgrad, wgrad) backward: a Transformer
    Engine module pays its set-up once and `GEMM_CALL_S` per further GEMM, and in backward `PARAM_BWD_S`
    per weight (one per expert); a PyTorch GEMM pays per call. An FP8 GEMM also quantizes one operand per
    expert per phase (forward its input, backward the output gradient). Flash attention is one Transformer
    Engine module call per phase. An op issued by a call measured whole (`Op.call`) takes its share of it."""
    if graphed(op, plan):
        return 0.0
    if op.call:
        return call_host_s(op.call, backward, plan.ep)
    if op.kind == "attention":
        return TE_MODULE_S
    if op.kind != "gemm":
        return op_kernels(op, backward, plan) * LAUNCH_S
    calls = op.groups * (2 if backward else 1)
    issue = TE_MODULE_S + (calls - 1) * GEMM_CALL_S if op.te_module else calls * TORCH_GEMM_S
    if backward and op.te_module:  # its weights' dummy gradients and DDP hooks
        issue += op.groups * PARAM_BWD_S
    if not (op.fp8 and plan.precision == "fp8"):
        return issue
    recipe = plan.fp8_recipe
    quantize = QUANT_KERNELS[recipe] * CPP_LAUNCH_S + QUANT_ALLOCS[recipe] * CPP_ALLOC_S + WRAPPER_S
    return issue + op.groups * quantize


def moe_graphed(plan: Plan) -> bool:
    """Whether a CUDA graph captures the whole MoE layer (`moe` or `full_iteration`); otherwise its
    experts run eagerly, whatever else is graphed."""
    return "moe" in plan.cuda_graphs or "full_iteration" in plan.cuda_graphs


def syncs(plan: Plan) -> bool:
    """Whether the host waits at the ops marked `host_sync`: yes unless the MoE layer is captured whole,
    which Megatron-Core allows only with sync-free dispatch. Graphing the router and the dispatcher's
    preprocess keeps the wait: the token counts are read after them."""
    return not moe_graphed(plan)


def drains(plan: Plan) -> bool:
    """Whether the host's wait for an event (the dispatcher's token counts) leaves the GPU without work.
    Not under the combined-1F1B all-to-all overlap: the GPU still runs the other micro-batch's queued
    backward (the overlap-on Nsight profile of the Qwen3-30B-A3B A/B has no idle GPU time; overlap off,
    1.9 s per step). A wait for the whole stream (`Op.stream_sync`) drains it either way."""
    return syncs(plan) and not plan.ep_comm_overlap


def waits(op: Op, backward: bool, plan: Plan) -> bool:
    """Whether the host issues `op` in this phase only once the GPU's queue has emptied."""
    if not syncs(plan):
        return False
    if backward:
        return op.bwd_stream_sync
    return op.host_sync and (op.stream_sync or not plan.ep_comm_overlap)


def collective_call_s(c: Collective, plan: Plan) -> float:
    """Host time of the call that issues the forward collective `c` in an eager MoE layer: a DeepEP/HybridEP
    dispatch that waits for the token counts (`EP_DISPATCH_CALL_S`), or Megatron-Core's all-to-all
    dispatcher's dispatch call (`A2A_DISPATCHER_S`); 0 where a CUDA graph captures the MoE layer."""
    if not c.call or not syncs(plan):
        return 0.0
    if c.call == "flex_dispatch":
        return EP_DISPATCH_CALL_S if c.host_sync else 0.0
    return call_host_s(c.call, False, plan.ep)


def queue_idle_s(host: list[float], gpu: list[float]) -> float:
    """GPU idle while the host issues ops in order into an empty stream. Op i is issued once the host has
    spent host[0] + ... + host[i], and runs after op i-1: the GPU finishes at max over i of (issue_i +
    gpu[i] + ... + gpu[n-1]), so it idles max(0, max_i (host[0..i] - gpu[0..i-1]))."""
    idle = issued = ran = 0.0
    for h, g in zip(host, gpu, strict=True):
        issued += h
        idle = max(idle, issued - ran)
        ran += g
    return idle


def _issue_order(
    ops: tuple[Op, ...],
    gpu_times: tuple[float, ...],
    backward: bool,
    plan: Plan,
    comms: Sequence[tuple[Collective, float]],
) -> list[tuple[float, float, bool]]:
    """The phase as the host issues it: (host time, GPU time, issued on an empty queue) per op, with each
    collective's exposed time as GPU work where it is issued (forward: after the op it names, or before
    the first op; backward, which issues the ops in reverse, at its start). A collective's issuing call
    costs its host time (`collective_call_s`)."""
    timed = zip(ops, gpu_times, strict=True)
    items = [(op_host_s(op, backward, plan), t, waits(op, backward, plan)) for op, t in timed]
    if backward:
        return [(0.0, exposed_s, False) for _, exposed_s in comms] + items[::-1]
    at = {op.name: i for i, op in reversed(list(enumerate(ops)))}
    placed: dict[int, list[tuple[float, float, bool]]] = {}
    # after one op, the collectives that wait go last: they wait for what the others exchange (the counts)
    for c, exposed_s in sorted(comms, key=lambda item: item[0].host_sync):
        call = collective_call_s(c, plan)
        placed.setdefault(at[c.after] if c.after else -1, []).append((call, exposed_s, c.host_sync and drains(plan)))
    order = placed.get(-1, [])
    for i, item in enumerate(items):
        order += [item, *placed.get(i, [])]
    return order


def host_stall_s(
    ops: tuple[Op, ...],
    gpu_times: tuple[float, ...],
    backward: bool,
    plan: Plan,
    comms: Sequence[tuple[Collective, float]] = (),
) -> float:
    """Time the GPU waits for the host in one phase of `ops` (one layer), whose collectives `comms` are
    exposed for the seconds given: GPU time where they are issued (`_issue_order`). With no sync
    (backward, graphed MoE layers, dense layers) the host runs ahead across layers: max(0, host - GPU).
    With syncs, each stretch from one sync to the next (wrapping into the next layer, taken to be this
    one) starts with an empty GPU queue."""
    order = _issue_order(ops, gpu_times, backward, plan, comms)
    host, gpu = [h for h, _, _ in order], [g for _, g, _ in order]
    cuts = [i for i, (_, _, empty) in enumerate(order) if empty]
    if not cuts:
        return max(0.0, sum(host) - sum(gpu))
    n = len(order)

    def stretch(a: int, b: int) -> float:
        return queue_idle_s([host[i % n] for i in range(a, b)], [gpu[i % n] for i in range(a, b)])

    return sum(stretch(a, b) for a, b in pairwise([*cuts, cuts[0] + n]))
