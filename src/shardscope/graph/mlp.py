"""The MLP half of a transformer block: a dense MLP (SwiGLU / GeLU) or a mixture of experts.

MoE (Megatron-Core token dispatcher; Fedus et al. 2021 for capacity): each GPU routes its t/tp tokens
(sequence parallel), permutes them by expert, all-to-alls them to the EP ranks that own the experts
(each rank holds experts/ep of them, split `etp` ways), runs the local experts as one grouped GEMM,
all-to-alls the outputs back and un-permutes them with the routing weights. Shared experts run as a
dense TP-parallel MLP beside it. The hottest EP rank receives `load` times the mean number of tokens;
it sets the layer's time and activation peak (see `graph.routing`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from shardscope.graph.common import (
    BF16,
    FP8_BLOCK_SCALED,
    FP32,
    NONE_ONLY,
    NOT_FULL,
    SELECTIVE_ONLY,
    OpGroup,
    Shapes,
    gemm,
    norm,
    residual,
    scoped,
    tagged,
    tp_collectives,
)
from shardscope.graph.ops import Collective, CollectiveKind, HiddenBy, Op, Phase, Saved, TokenFanout
from shardscope.graph.routing import bin_hit_probability, expected_pad_rows
from shardscope.models.spec import ModelSpec, MoESpec
from shardscope.plan.plan import Plan

# Kernels of Megatron-Core's router per phase with `moe_router_fusion` (gating, score function, top-k,
# auxiliary loss): 31, down from 72 unfused (Megatron-LM DeepSeek-V3 GB200 optimisation guide).
ROUTER_KERNELS = 31
INT64 = 8


def _glu_clamp(name: str, values: float) -> Op:
    """GPT-OSS clamps the gate to (-inf, limit] and the up half to [-limit, limit] before its GLU, in
    eager PyTorch ahead of Megatron-Core's fused one (`weighted_bias_quick_geglu_impl`, core_v0.16.0): two
    clamps and a concatenation forward (3 kernels); backward masks both gradients (ge, le, and, where;
    le, where) and concatenates them (7 kernels). Bytes per gate/up pair, in bf16 values: 8 forward, 15
    backward (what the ATen ops read and write, test_moe)."""
    return Op(
        name,
        "memory",
        bytes=8 * BF16 * values,
        bwd_bytes=15 * BF16 * values,
        cheap=True,
        launches=3,
        bwd_launches=7,
        aten=True,
    )


def _ffn(
    model: ModelSpec,
    name: str,
    tokens: float,
    ffn: int,
    fp8: bool,
    gemm_in: int,
    groups: int = 1,
    modules: tuple[str, ...] = ("mlp",),
    act_module: str = "",
    fused: bool = False,
    fused_mlp: bool = False,
    glu_input_bytes: float = BF16,
    split: bool = False,
):
    """Gate/up GEMM, activation, down GEMM on `tokens` rows of width `ffn` (already TP/ETP-split), all
    tagged with the Megatron recompute `modules` that re-run them (and the activation with `act_module`).
    `fused`: Megatron's SwiGLUFunction keeps only its input and recomputes silu(gate) in backward. Its
    weighted quick-GEGLU (GPT-OSS experts) makes its linear offset a GPU tensor with `torch.tensor(offset,
    device=...)` first (`weighted_bias_quick_geglu_impl`, core_v0.15-0.19): a pageable host-to-device copy,
    which synchronises the whole stream (PyTorch issue #120996: `memcpy_and_sync`), so the host waits
    before the activation with the queue empty, even beside another micro-batch's queued backward.
    `fused_mlp`: Transformer Engine's fused grouped MLP computes the GLU (its clamp included) and the routing
    weights in the gate/up GEMM's epilogue and its gradient in the dgrad's (TE 2.14-2.16
    `ops/fused/{forward,backward}_grouped_mlp.py`, one `grouped_mlp.py` from 2.17): no activation kernel and
    no clamp of its own; what backward needs stays saved. `glu_input_bytes`: bytes per element of the saved
    GLU input (gate, up). `split`: gate and up are separate linears (`Plan.split_projections`)."""
    h = model.hidden
    # weighted (experts), unless Transformer Engine's fused MLP computes it
    quick_geglu_copy = fused and bool(act_module) and model.glu_gate == "quick_gelu" and not fused_mlp
    ops: list[Op] = []
    saved: list[Saved] = []
    pre = f"{name} " if name else ""
    if model.mlp == "swiglu":
        ops.append(gemm(f"{pre}gate/up proj", tokens, 2 * ffn, h, fp8, groups, splits=(ffn, ffn) if split else ()))
        if not fused_mlp:  # the fused MLP runs the GLU in the GEMMs' epilogues
            # fused: read gate and up, write the product; backward reads the gradient, gate and up and
            # writes both gradients. Unfused (`silu(gate) * up` in eager PyTorch): silu (read, write), then
            # mul (read two, write) forward; backward the mul's two gradients (read two, write, each) and
            # silu's (read two, write): 10 and 18 bytes per element in bf16, in 2 and 3 kernels
            # (measured on one H100, validation/eager_regions_h100.json: 0.41 ms forward at 8192 x 14336).
            fwd_b, bwd_b, kernels = (3, 5, (1, 1)) if fused else (5, 9, (2, 3))
            ops.append(
                Op(
                    f"{pre}swiglu",
                    "memory",
                    bytes=fwd_b * BF16 * tokens * ffn,
                    bwd_bytes=bwd_b * BF16 * tokens * ffn,
                    cheap=True,
                    host_sync=quick_geglu_copy,
                    stream_sync=quick_geglu_copy,
                    launches=kernels[0],
                    bwd_launches=kernels[1],
                )
            )
        saved += [
            Saved(f"{pre}gate, up", 2 * glu_input_bytes * tokens * ffn, NOT_FULL, gemm=f"{pre}gate/up proj"),
            *([] if fused else [Saved(f"{pre}silu(gate)", BF16 * tokens * ffn, NONE_ONLY)]),
            Saved(f"{pre}swiglu out (down input)", gemm_in * tokens * ffn, NONE_ONLY),
        ]
        if model.glu_clamp and not fused_mlp:
            ops.insert(1, _glu_clamp(f"{pre}gate, up clamp", tokens * ffn))
            # the clamps keep their input (gate, up); the GLU keeps the clamped copy
            saved.insert(1, Saved(f"{pre}clamped gate, up", 2 * BF16 * tokens * ffn, NONE_ONLY))
        up_width = 2 * ffn
    else:
        ops.append(gemm(f"{pre}up proj", tokens, ffn, h, fp8, groups))
        ops.append(
            Op(f"{pre}gelu", "memory", bytes=2 * BF16 * tokens * ffn, bwd_bytes=3 * BF16 * tokens * ffn, cheap=True)
        )
        saved += [
            Saved(f"{pre}up", BF16 * tokens * ffn, NOT_FULL, gemm=f"{pre}up proj"),
            Saved(f"{pre}gelu out (down input)", gemm_in * tokens * ffn, NONE_ONLY),
        ]
        up_width = ffn
    act_ops = len(ops) - 1  # the activation, and a clamp before it
    ops.append(gemm(f"{pre}down proj", tokens, h, ffn, fp8, groups))
    fp8_inputs = tokens * (h + ffn)
    fp8_grads = tokens * (up_width + h)
    if act_module:  # the activation's ops and the tensors after the GEMM's output
        ops[1 : 1 + act_ops] = tagged(ops[1 : 1 + act_ops], act_module)
        saved[1:] = tagged(saved[1:], act_module)
    return tagged(ops, *modules), tagged(saved, *modules), fp8_inputs, fp8_grads


def dense_mlp_group(model: ModelSpec, plan: Plan) -> tuple[OpGroup, float, float]:
    sh = Shapes.of(plan)
    t, t_sp, h = sh.t, sh.t_sp, model.hidden
    norm2, stats2 = norm("mlp norm", model, t_sp)
    ops: list[Op] = tagged([norm2], "layernorm")
    saved: list[Saved] = [
        stats2,
        *tagged([Saved("mlp norm out (mlp input)", sh.gemm_in * sh.t_kept * h, NONE_ONLY)], "layernorm"),
    ]
    f_ops, f_saved, fi, fg = _ffn(
        model, "", t, model.ffn_hidden // plan.tp, sh.fp8, sh.gemm_in, fused=plan.fused_swiglu,
        split=plan.split_projections,
    )  # fmt: skip
    ops += f_ops + [residual("mlp residual add", model, t_sp)]
    saved += f_saved + [Saved("down proj out", BF16 * t_sp * h, SELECTIVE_ONLY, gemm="down proj")]
    up = "gate/up proj" if model.mlp == "swiglu" else "up proj"
    comms = tp_collectives(plan, "mlp", BF16 * t * h, up, "down proj")
    return OpGroup(tuple(scoped(ops, "mlp")), tuple(saved), tuple(comms)), fi, fg


def _deepep_routing_map(moe: MoESpec, plan: Plan, tokens: float) -> Op:
    """DeepEP hands each GPU its received tokens with their top-k expert indices (-1 where the expert
    lives elsewhere); unfused, Megatron-Core's `_indices_to_multihot` (core_v0.15-0.19 token_dispatcher.py)
    turns them into a routing map and weights with `indices[mask]`, `repeat_interleave(mask.sum(1))` and
    `probs[mask]`: a `nonzero` or a size read back each, which synchronise the stream, and backward's
    boolean-mask index of the weights' gradient synchronises again (PyTorch `index_put_`). Its kernels
    (compare, two index, sum, arange, repeat, two zeros, two index-puts, cast) write a long and a float map
    of received tokens x local experts and read it back as bool. It runs after the dispatch, outside the
    preprocess that a CUDA graph can capture."""
    fanout = TokenFanout(moe.experts, moe.top_k, moe.groups, moe.groups_per_token, "deepep")
    received = tokens * plan.ep * bin_hit_probability(fanout, plan.ep)
    cells = received * (moe.experts // plan.ep)
    return Op(
        "deepep routing map (unfused)",
        "memory",
        bytes=(INT64 + FP32 + INT64 + 1) * cells,
        bwd_bytes=2 * FP32 * cells,
        host_sync=True,
        stream_sync=True,
        bwd_stream_sync=True,
        launches=11,
        bwd_launches=3,
        aten=True,
    )


def moe_group(model: ModelSpec, plan: Plan, load: float) -> tuple[OpGroup, float, float]:
    """One MoE block on the hottest EP rank (`load` = its tokens / the mean)."""
    assert model.moe is not None
    moe = model.moe
    sh = Shapes.of(plan)
    t, t_sp, h = sh.t, sh.t_sp, model.hidden
    tm = t / plan.tp  # tokens this GPU routes (sequence-parallel share)
    # FP8 GEMMs take each expert's rows in multiples of `align` (TE `get_align_size_for_quantization`)
    align = 32 if plan.fp8_recipe == "mxfp8" else 16
    pairs = tm * moe.top_k  # token-expert pairs this GPU sends
    if sh.fp8 and plan.moe_router_padding:
        # Megatron-Core's router padding routes each expert a multiple of `align` of this GPU's tokens by
        # adding tokens at zero weight (`pad_routing_map`, core_v0.15-0.18): they are dispatched and
        # computed like the others
        pairs += moe.experts * expected_pad_rows(round(tm), moe.top_k / moe.experts, align)
    routed = load * pairs  # token-expert pairs the hottest rank computes
    local_experts = moe.experts // plan.ep
    fe = moe.expert_ffn // plan.etp

    norm2, stats2 = norm("mlp norm", model, t_sp)
    ops: list[Op] = tagged([norm2], "layernorm")
    saved: list[Saved] = [stats2, *tagged([Saved("mlp norm out (mlp input)", BF16 * t_sp * h, NONE_ONLY)], "layernorm")]
    comms: list[Collective] = []
    si = sg = 0.0
    if moe.shared_experts:
        # Megatron-Core (0.15 on) runs the shared experts first, on the layer's input, before the router
        # (`MoELayer.forward` -> `shared_experts_compute`), and graphs them with the router unless they
        # overlap the EP all-to-alls.
        s_ops, s_saved, si, sg = _ffn(
            model,
            "shared expert",
            t,
            moe.shared_experts * moe.shared_ffn // plan.tp,
            sh.fp8,
            sh.gemm_in,
            modules=("moe", "shared_experts"),
            fused=plan.fused_swiglu,
            split=plan.split_projections,
        )
        ops += scoped(s_ops, "moe" if plan.ep_comm_overlap else "moe_router")
        saved += s_saved
        comms += tp_collectives(plan, "shared expert", BF16 * t * h)
    # Everything from the router to the un-permute belongs to Megatron's "moe" recompute module.
    moe_start = len(ops), len(saved)
    # Router: a small GEMM to expert logits (plain PyTorch in Megatron-Core), fp32 softmax/sigmoid + top-k
    # and the load-balancing terms, launched as Megatron-Core's fused router's kernels.
    ops.append(gemm("router", tm, moe.experts, h, te_module=False))
    ops.append(
        Op(
            "router top-k",
            "memory",
            bytes=3 * FP32 * tm * moe.experts,
            bwd_bytes=3 * FP32 * tm * moe.experts,
            cheap=True,
            launches=ROUTER_KERNELS,
        )
    )
    saved.append(Saved("router probabilities", FP32 * tm * moe.experts, NOT_FULL))
    ops = scoped(ops, "moe_router")
    perm = BF16 * pairs * h
    # A dropless dispatcher sizes its all-to-all splits (or, with EP 1, its expert loop) from the token
    # counts, which it copies to the host: the host waits for the GPU there (`host_sync`), then issues the
    # dispatch. Megatron-Core's all-to-all dispatcher permutes its tokens first and waits "before_ep_alltoall"
    # ("before_finish" with EP 1: before the experts); DeepEP and HybridEP wait inside the dispatch call,
    # once the counts are exchanged, and permute the received tokens after it (core_v0.15-0.18
    # token_dispatcher.py). Each collective names the op it is issued `after`.
    # With `moe_router_padding`, or a capacity that drops tokens without padding, the counts set the
    # all-to-all dispatcher's permute output size too: it waits before the permute ("before_permutation_1").
    # Only drop-and-pad (`pad_to_capacity`) has fixed shapes and never waits.
    padded = plan.capacity_factor > 0 and plan.pad_to_capacity
    flex = plan.ep_dispatch != "flat"
    sized = plan.capacity_factor > 0 or (sh.fp8 and plan.moe_router_padding)
    # torchtitan's indexing pads the groups on the GPU (`generate_permute_indices`): it never waits
    index = plan.moe_permute == "index"
    waits_to_permute = not padded and sized and not flex and not index
    waits_to_dispatch = not padded and not waits_to_permute and not index
    moved = BF16 * tm * h + perm
    rows = BF16 * routed * h  # one pass over the rows the experts compute
    if index:
        # torchtitan 0.2 (models/moe/moe.py, utils.py): gather x[order // top_k], append a zero row
        # (vstack) and gather the rows into groups padded to 8 (`indices_padding_wrapper`), each a read and
        # a write; backward writes zeros and scatter-adds the gradients back through both gathers
        moved = 2 * perm + 4 * rows
    if plan.ep > 1 and plan.ep_dispatch == "deepep" and not plan.deepep_fused_routing_map:
        ops.append(_deepep_routing_map(moe, plan, tm * load))
    # Megatron-Core's all-to-all dispatcher is Python whose host time is measured per stage, not per kernel
    # (costs.host.A2A_DISPATCHER_S): its preprocess before the sync (a host-only op here, its kernels few
    # and small), the dispatch call after it, the combine with its backward.
    a2a_calls = plan.ep > 1 and not flex
    if a2a_calls:
        ops.append(
            Op("all-to-all dispatcher preprocess", "memory", launches=0, scope="moe_preprocess", call="a2a_preprocess")
        )
    in_call = "a2a_in_call" if a2a_calls else ""
    permute = Op(
        "permute",
        "memory",
        bytes=moved,
        bwd_bytes=2 * rows + BF16 * tm * h if index else moved,
        scope="moe_preprocess",
        host_sync=waits_to_permute,
        call=in_call,
    )
    ops.append(permute)
    if index:
        ops.append(Op("permute grad scatter-add", "memory", bwd_bytes=2 * perm + 2 * rows, scatter=True))
    dispatch = load * perm
    sent_after = "router top-k" if flex else permute.name

    # Megatron's combined-1F1B schedule (overlap_moe_expert_parallel_comm) runs one micro-batch's forward
    # beside another's backward and pairs each all-to-all with one compute block of the other: forward
    # dispatch under backward MLP, forward combine under backward attention, the backward all-to-alls
    # under forward attention (combine) and forward MLP (dispatch) (DeepSeek-V3 report, Fig. 4).
    def a2a(name: str, phase: Phase, pair: HiddenBy, after: str = "", sync: bool = False) -> Collective:
        hide: HiddenBy = pair if plan.ep_comm_overlap else ""
        # a dispatch's backward runs the combine kernel, a combine's backward the dispatch kernel
        combine = (name == "combine") == (phase == "fwd")
        fanout = (
            TokenFanout(moe.experts, moe.top_k, moe.groups, moe.groups_per_token, plan.ep_dispatch, combine)
            if flex
            else None
        )
        call = ("flex_dispatch" if flex else "a2a_dispatch") if (name, phase) == ("dispatch", "fwd") else ""
        return Collective(f"ep {name} all-to-all", "all_to_all", "ep", dispatch, phase, hide, fanout, after, sync, call)

    def beside_dispatch(name: str, kind: CollectiveKind, nbytes: float, phase: Phase, after: str = "") -> Collective:
        hide: HiddenBy = ("bwd_mlp" if phase == "fwd" else "fwd_mlp") if plan.ep_comm_overlap else ""
        return Collective(name, kind, "ep", nbytes, phase, hide, after=after)

    if plan.ep > 1:
        comms += [
            a2a("dispatch", "fwd", "bwd_mlp", sent_after, sync=waits_to_dispatch),
            a2a("dispatch", "bwd", "fwd_mlp"),
        ]
        if plan.ep_dispatch == "flat":
            # Megatron-Core's all-to-all dispatcher first all-gathers every rank's per-expert token counts
            # (int64) for the splits, and sends the routing weights (fp32) by their own all-to-all after the
            # tokens' (backward: their gradients) (`MoEAlltoAllTokenDispatcher.preprocess`/`token_dispatch`).
            weights = FP32 * load * pairs
            comms += [
                beside_dispatch(
                    "ep token-count all-gather", "all_gather", INT64 * moe.experts * plan.ep, "fwd", "router top-k"
                ),
                beside_dispatch("ep routing-weight all-to-all", "all_to_all", weights, "fwd", sent_after),
                beside_dispatch("ep routing-weight all-to-all", "all_to_all", weights, "bwd"),
            ]
        elif plan.ep_dispatch == "hybridep":
            # HybridEP's metadata preprocessing all-gathers the whole boolean routing map (tokens x experts)
            # over the EP group: NCCL across NVLink domains, its own NVLink kernel inside one (DeepEP
            # hybrid-ep branch, csrc/hybrid_ep/executor/executor.cu `allgather_routing_map`).
            routing_map = tm * moe.experts * plan.ep
            comms.append(beside_dispatch("ep routing-map all-gather", "all_gather", routing_map, "fwd", "router top-k"))
    if plan.etp > 1:
        gather_sync = waits_to_dispatch and plan.ep == 1
        comms += [
            Collective(
                "etp all-gather tokens",
                "all_gather",
                "etp",
                dispatch * plan.etp,
                "fwd",
                after=sent_after,
                host_sync=gather_sync,
            ),
            Collective("etp reduce-scatter tokens", "reduce_scatter", "etp", dispatch * plan.etp, "bwd"),
        ]
    # Megatron-Core's all-to-all dispatcher sorts the received chunks (source rank-major) by local expert
    # after the dispatch and restores their order before the combine (`sort_chunks_by_idxs`, fused with
    # `moe_permute_fusion`, core_v0.16.0 token_dispatcher.py): each a read and a write of every routed
    # row, the routing weights too on the way in; backward sorts the gradients the same way.
    sort_chunks = plan.ep > 1 and plan.ep_dispatch == "flat" and local_experts > 1
    sort_bytes = 2 * BF16 * routed * h  # read and write every routed row
    if sort_chunks:
        ops.append(
            Op(
                "sort chunks by expert",
                "memory",
                bytes=sort_bytes + 2 * FP32 * routed,
                bwd_bytes=sort_bytes,
                call=in_call,
            )
        )
    saved.append(Saved("permuted tokens (expert input)", sh.gemm_in * routed * h, NOT_FULL))
    e_ops, e_saved, fi, fg = _ffn(
        model,
        "experts",
        routed,
        fe,
        sh.fp8,
        sh.gemm_in,
        local_experts,
        modules=(),
        act_module="moe_act",
        fused=plan.fused_swiglu,
        fused_mlp=plan.fused_expert_mlp,
        glu_input_bytes=FP8_BLOCK_SCALED if sh.fp8 and plan.fp8_activation_cache else BF16,
        split=plan.split_projections,
    )
    # Counts not aligned to the FP8 GEMM's rows (TE `get_align_size_for_quantization`: 32 for MXFP8, else
    # 16), by the router's padding, HybridEP's padded dispatch (`pad_multiple`, core_v0.16-0.18
    # `_HybridEPManager.dispatch`) or a drop-and-pad capacity (capacity x etp x ep rows per local expert,
    # `get_capacity`): Transformer Engine's Fp8Padding copies the expert input (and the routing weights)
    # into rows padded per expert, and Fp8Unpadding copies the output back (Megatron-Core
    # TEGroupedMLP.forward, core_v0.15-0.18; TE module/fp8_padding.py): a read and a write of every routed
    # row each, and the reverse copies of the gradients in backward.
    capacity_rows = math.ceil(tm * moe.top_k / moe.experts * plan.capacity_factor) * plan.etp * plan.ep
    aligned = plan.moe_router_padding or plan.ep_dispatch == "hybridep" or (padded and capacity_rows % align == 0)
    te_pads = sh.fp8 and not aligned and not plan.fused_expert_mlp  # the fused MLP takes ragged groups
    pad = 2 * BF16 * routed * h  # a read and a write of every routed row
    if te_pads:
        e_ops.insert(
            0,
            Op(
                "experts fp8 pad",
                "memory",
                bytes=pad + 2 * FP32 * routed,
                bwd_bytes=pad + 2 * FP32 * routed,
                launches=2,
            ),
        )
    if waits_to_dispatch and plan.ep == 1 and plan.etp == 1:  # no collective to wait before: the expert loop waits
        e_ops[0] = replace(e_ops[0], host_sync=True)
    ops += e_ops
    saved += e_saved
    fi, fg = fi + si, fg + sg
    if moe.expert_bias and not plan.fused_expert_mlp:  # the fused MLP adds the biases in its epilogues
        # Megatron-Core's TEGroupedMLP adds the down projection's bias outside the GEMM, per expert and
        # weighted by the routing probability, in fp32 (`_apply_bias`, core_v0.15.0): b * p, t + b * p,
        # a concatenation and a cast back to bf16 read and write 28 bytes per routed value forward; backward
        # casts the gradient to fp32 and back, reduces it against b and p and concatenates the split
        # gradient, 40 bytes. Per expert its ops are a multiply and an add forward; backward, two
        # multiplies, two sums and two casts.
        bias_values = routed * h
        ops.append(
            Op(
                "experts down proj bias (fp32)",
                "memory",
                bytes=28 * bias_values,
                bwd_bytes=40 * bias_values,
                launches=2 * local_experts + 2,
                bwd_launches=6 * local_experts + 3,
                aten=True,
            )
        )
    if te_pads:
        ops.append(Op("experts fp8 unpad", "memory", bytes=pad, bwd_bytes=pad))
    if plan.fused_swiglu:  # Megatron-Core weights each row inside the activation (it keeps the weights)
        saved.append(Saved("expert routing weights", FP32 * routed, NOT_FULL))
    else:  # the weighted sum after the un-permute keeps the expert outputs for the weights' gradient
        saved.append(Saved("expert outputs", (FP32 if index else BF16) * routed * h, NOT_FULL))
    if sort_chunks:
        ops.append(Op("unsort chunks", "memory", bytes=sort_bytes, bwd_bytes=sort_bytes, call=in_call))
    # the all-to-all dispatcher combines before its un-permute, DeepEP and HybridEP after theirs
    unpermute = "unpermute + weighted sum"
    experts_done = ops[-1].name
    combined_after = unpermute if flex else experts_done
    if plan.etp > 1:
        comms += [
            Collective(
                "etp reduce-scatter outputs", "reduce_scatter", "etp", dispatch * plan.etp, "fwd", after=experts_done
            ),
            Collective("etp all-gather grads", "all_gather", "etp", dispatch * plan.etp, "bwd"),
        ]
    if plan.ep > 1:
        comms += [a2a("combine", "fwd", "bwd_attn", combined_after), a2a("combine", "bwd", "fwd_attn")]
    # backward scatters the output gradient to the rows; unfused, it also reads the expert outputs
    unpermute_bwd = (1 if plan.fused_swiglu else 2) * perm + BF16 * tm * h
    combine_call = "a2a_combine" if a2a_calls else ""
    if index:
        # torchtitan: scatter the expert rows out of their padded groups and into a zero-filled (tokens x
        # top_k) buffer (`index_put_`), cast it to fp32 (saved for the weights' gradient) and `bmm` it with
        # the routing weights in fp32, cast back. Backward: the weights' fp32 outer product (a scatter-class
        # write), the scores' gemv, the cast back, gathers of the gradient through both scatters, and the sum
        # of the gate and up projections' input gradients (separate grouped GEMMs)
        th = BF16 * tm * h
        ops.append(Op("unpermute scatter", "memory", bytes=2 * rows + 2 * perm, bwd_bytes=2 * perm, scatter=True))
        ops.append(Op("expert outputs to fp32", "memory", bytes=3 * perm, bwd_bytes=3 * perm, aten=True))
        ops.append(Op(unpermute, "memory", bytes=3 * perm + 5 * th, bwd_bytes=4 * perm + 5 * rows + th))
    else:
        ops.append(Op(unpermute, "memory", bytes=perm + BF16 * tm * h, bwd_bytes=unpermute_bwd, call=combine_call))
    ops[moe_start[0] :] = tagged(ops[moe_start[0] :], "moe")
    saved[moe_start[1] :] = tagged(saved[moe_start[1] :], "moe")
    ops.append(residual("mlp residual add", model, t_sp))
    saved.append(Saved("moe output", BF16 * t_sp * h, SELECTIVE_ONLY))
    return OpGroup(tuple(scoped(ops, "moe")), tuple(saved), tuple(comms)), fi, fg
