"""Step time, throughput, MFU and memory of one optimizer step, summed over the op graph.

Step = m·(stage compute + exposed stage comm) + pipeline bubble + exposed DP comm + optimizer, where m is
the number of micro-batches per step and the stage is the slowest pipeline rank. Bubble: (pp-1)/vpp of
one micro-batch's forward+backward on a typical stage (1F1B / interleaved 1F1B, Narayanan et al. 2021).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields

from shardscope.costs.comm import GroupPlacement, collective_time_s, place_group
from shardscope.costs.compute import memory_time_s, op_time_s
from shardscope.costs.efficiency import overlap_slowdown
from shardscope.costs.memory import (
    CONTEXT_BYTES,
    FRAGMENTATION,
    GIB,
    activation_bytes,
    buffer_bytes,
    dense_params_local,
    expert_params_local,
    rank_params_local,
    rank_state_bytes,
)
from shardscope.graph.build import BF16, FP32, OpGroup, build_stage_graph
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan
from shardscope.result import Estimate, MemoryBreakdown, ParamCounts, TimeBreakdown

# Adam step per local parameter: read fp32 param, grad, m, v (16 B), write param, m, v (12 B), write the
# bf16 copy (2 B), plus the gradient-norm read for clipping (4 B). Memory-bound.
OPTIMIZER_BYTES_PER_PARAM = 34
GRAD_REDUCE_BYTES = FP32  # gradients are reduced in fp32 (Megatron bf16 default, FSDP reduce_dtype fp32)


@dataclass(frozen=True, slots=True)
class Groups:
    tp: GroupPlacement
    cp: GroupPlacement
    dp: GroupPlacement  # data-parallel gradient group: dp·cp ranks (CP ranks hold the same weights)
    pp: GroupPlacement
    shard: GroupPlacement
    replicate: GroupPlacement
    ep: GroupPlacement
    etp: GroupPlacement
    edp: GroupPlacement


def place_groups(cluster: Cluster, plan: Plan) -> Groups:
    """Megatron rank order tp-cp-dp-pp (experts: etp-ep-edp): each group's stride is the product of the
    inner sizes."""
    shard = plan.shard_size
    inner = plan.tp
    return Groups(
        tp=place_group(cluster, plan.tp, 1),
        cp=place_group(cluster, plan.cp, inner),
        dp=place_group(cluster, plan.dp * plan.cp, inner),
        pp=place_group(cluster, plan.pp, plan.tp * plan.cp * plan.dp),
        shard=place_group(cluster, shard, inner),
        replicate=place_group(cluster, plan.dp * plan.cp // shard, inner * shard),
        ep=place_group(cluster, plan.ep, plan.etp),
        etp=place_group(cluster, plan.etp, 1),
        edp=place_group(cluster, plan.expert_dp, plan.ep * plan.etp),
    )


@dataclass(slots=True)
class PhaseCost:
    """Compute and exposed communication of one unit (layer/embedding/head) in one phase."""

    compute_s: float = 0.0
    exposed_s: float = 0.0
    hidden_s: float = 0.0  # communication that ran under compute (slows that compute)
    gemm_s: float = 0.0
    attention_s: float = 0.0


def _phase_cost(cluster: Cluster, plan: Plan, groups: Groups, unit: OpGroup, backward: bool) -> PhaseCost:
    cost = PhaseCost()
    for op in unit.ops:
        t = op_time_s(cluster.gpu, op, backward, plan)
        cost.compute_s += t
        if op.kind == "gemm":
            cost.gemm_s += t
        elif op.kind == "attention":
            cost.attention_s += t
    phase = "bwd" if backward else "fwd"
    budget = {"attention": cost.attention_s, "gemm": cost.gemm_s, "compute": cost.compute_s}
    for c in unit.comms:
        if c.phase != phase:
            continue
        t = collective_time_s(cluster, c.kind, c.bytes, getattr(groups, c.group), c.fanout)
        if c.hidden_by:
            hidden = min(t, budget[c.hidden_by])
            budget[c.hidden_by] -= hidden
            cost.hidden_s += hidden
            cost.exposed_s += t - hidden
        else:
            cost.exposed_s += t
    return cost


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Per micro-batch costs of one layer kind on one GPU."""

    fwd: PhaseCost
    bwd: PhaseCost
    recompute_s: float  # extra forward work in backward (compute only)
    recompute_comm_s: float  # TP/CP communication re-run by full recompute
    fsdp_exposed_s: float
    fsdp_hidden_s: float
    fsdp_gather_s: float  # one all-gather of the layer (the first one of a step is never hidden)


def _layer_cost(
    cluster: Cluster, plan: Plan, groups: Groups, model: ModelSpec, kind: LayerKind, unit: OpGroup, gather_bytes: float
) -> LayerCost:
    fwd = _phase_cost(cluster, plan, groups, unit, backward=False)
    bwd = _phase_cost(cluster, plan, groups, unit, backward=True)
    if plan.recompute == "full":
        rec, rec_comm = fwd.compute_s, fwd.exposed_s
    elif plan.recompute == "selective":
        rec, rec_comm = sum(op_time_s(cluster.gpu, op, False, plan) for op in unit.ops if op.cheap), 0.0
    else:
        rec, rec_comm = 0.0, 0.0
    exposed = hidden = ag = 0.0
    if (plan.fsdp or plan.zero == 3) and plan.reshard_after_forward:
        # FSDP / ZeRO-3 (reshard after forward): every micro-batch all-gathers the layer in forward and
        # again in backward and reduce-scatters its gradient, prefetched under the neighbour's compute.
        dense = dense_params_local(model, plan.tp, kind)
        expert = expert_params_local(model, kind, plan.ep, plan.etp)
        ag = collective_time_s(cluster, "all_gather", gather_bytes * dense, groups.shard) + collective_time_s(
            cluster, "all_gather", gather_bytes * expert, groups.edp
        )
        rs = collective_time_s(cluster, "reduce_scatter", GRAD_REDUCE_BYTES * dense, groups.shard) + (
            collective_time_s(cluster, "reduce_scatter", GRAD_REDUCE_BYTES * expert, groups.edp)
        )
        exposed = max(0.0, ag - fwd.compute_s) + max(0.0, ag + rs - (bwd.compute_s + rec))
        hidden = 2 * ag + rs - exposed
    return LayerCost(fwd, bwd, rec, rec_comm, exposed, hidden, ag)


@dataclass(slots=True)
class Stage:
    compute: float = 0.0  # per micro-batch
    exposed: float = 0.0
    hidden: float = 0.0
    recompute: float = 0.0
    fwd: float = 0.0  # forward compute only (window for gathers)
    bwd: float = 0.0  # backward compute incl. recompute (window for gradient reduction)
    first_gather: float = 0.0


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Model FLOPs per token (forward + backward = 3x forward, no recompute): every weight multiply
    (2 FLOPs per weight per token, routed experts only for the top-k, output layer included, embedding
    lookups excluded) and attention (QK^T and PV over the keys each query sees: causal (s+1)/2, window,
    chunk)."""
    fwd = 2.0 * model.vocab * model.hidden
    for kind, n in Counter(model.layer_kinds()).items():
        attn = 2.0 * model.heads * (model.qk_head_dim + model.v_head_dim) * model.keys_per_query(kind, seq_len, causal)
        fwd += n * (2.0 * model.matmul_params_per_token(kind) + attn)
        if kind.mlp == "dit" and model.dit is not None:  # cross-attention to the text tokens
            text, d = model.dit.text_len, model.hidden
            fwd += n * (4.0 * d * text + 2.0 * 2 * d * d * text / seq_len)
    return 3.0 * fwd


def estimate_step(model: ModelSpec, cluster: Cluster, plan: Plan) -> Estimate:
    gpu = cluster.gpu
    graph = build_stage_graph(model, plan, gpu.arch)
    groups = place_groups(cluster, plan)
    slow = overlap_slowdown(gpu)
    m = plan.grad_accum
    per_microbatch_sharding = (plan.fsdp or plan.zero == 3) and plan.reshard_after_forward
    # Weights travel in bf16, or in FP8 where the framework all-gathers FP8 weights (torchao / Megatron-FSDP).
    gather_bytes = 1 if (plan.precision == "fp8" and plan.fp8_all_gather) else BF16
    costs = {k: _layer_cost(cluster, plan, groups, model, k, g, gather_bytes) for k, g in graph.layers.items()}
    ef = _phase_cost(cluster, plan, groups, graph.embedding, backward=False)
    eb = _phase_cost(cluster, plan, groups, graph.embedding, backward=True)
    hf = _phase_cost(cluster, plan, groups, graph.head, backward=False)
    hb = _phase_cost(cluster, plan, groups, graph.head, backward=True)
    p2p = collective_time_s(cluster, "send_recv", graph.boundary_bytes, groups.pp) if plan.pp > 1 else 0.0
    rank_layers = plan.rank_layers(model.layers)

    def stage_cost(rank: int) -> Stage:
        st = Stage()
        layers = rank_layers[rank]
        n_rec = plan.recomputed_layers(len(layers)) if plan.recompute == "full" else len(layers)
        for part, recomputed in ((layers[:n_rec], plan.recompute != "none"), (layers[n_rec:], False)):
            for kind, n in model.kind_counts(part).items():
                c = costs[kind]
                rec = c.recompute_s if recomputed else 0.0
                rec_comm = c.recompute_comm_s if recomputed else 0.0
                st.compute += n * (c.fwd.compute_s + c.bwd.compute_s + rec)
                st.recompute += n * rec
                st.exposed += n * (c.fwd.exposed_s + c.bwd.exposed_s + rec_comm + c.fsdp_exposed_s)
                st.hidden += n * (c.fwd.hidden_s + c.bwd.hidden_s + c.fsdp_hidden_s)
                st.fwd += n * c.fwd.compute_s
                st.bwd += n * (c.bwd.compute_s + rec)
        if layers:
            st.first_gather = costs[graph.kinds[layers[0]]].fsdp_gather_s
        st.exposed += st.first_gather  # the first gather of each micro-batch has nothing to hide under
        if rank == 0:
            st.compute += ef.compute_s + eb.compute_s
            st.exposed += ef.exposed_s + eb.exposed_s
        if rank == plan.pp - 1:
            st.compute += hf.compute_s + hb.compute_s
            st.exposed += hf.exposed_s + hb.exposed_s
        st.exposed += 2 * plan.vpp * p2p  # activations / gradients to and from the neighbouring stages
        st.compute += st.hidden * slow
        return st

    stages = [stage_cost(r) for r in range(plan.pp)]
    slowest = max(range(plan.pp), key=lambda r: stages[r].compute + stages[r].exposed)
    s = stages[slowest]
    typical = sorted(st.compute + st.exposed for st in stages)[plan.pp // 2]
    bubble = (plan.pp - 1) / plan.vpp * typical if plan.pp > 1 else 0.0

    # ---- data-parallel gradient reduction and parameter gather (once per step) -------------------
    dense_s, expert_s = rank_params_local(model, plan, slowest)
    dp_exposed = dp_total = 0.0
    if not per_microbatch_sharding:
        # Gradients reduced (all-reduce for DDP, reduce-scatter when sharded) under the last
        # micro-batch's backward (bucketed, Megatron overlap_grad_reduce); sharded weights gathered
        # back under the next step's first forward (overlap_param_gather).
        sharded = plan.zero >= 1 or plan.fsdp
        kind = "reduce_scatter" if sharded else "all_reduce"
        grad = collective_time_s(cluster, kind, GRAD_REDUCE_BYTES * dense_s, groups.shard if sharded else groups.dp)
        grad += collective_time_s(cluster, kind, GRAD_REDUCE_BYTES * expert_s, groups.edp)
        n_layers = max(len(rank_layers[slowest]), 1)
        dp_exposed += max(0.0, grad - s.bwd) + grad / n_layers
        dp_total += grad
        if sharded:
            gather = collective_time_s(cluster, "all_gather", gather_bytes * dense_s, groups.shard)
            gather += collective_time_s(cluster, "all_gather", gather_bytes * expert_s, groups.edp)
            dp_exposed += max(0.0, gather - s.fwd) + gather / n_layers
            dp_total += gather
    if (plan.fsdp or plan.zero == 3) and plan.shard_size < plan.dp * plan.cp:  # HSDP: all-reduce across replicas
        rep = collective_time_s(cluster, "all_reduce", GRAD_REDUCE_BYTES * dense_s / plan.shard_size, groups.replicate)
        dp_exposed += rep
        dp_total += rep
    compute_mb = s.compute + max(dp_total - dp_exposed, 0.0) * slow / max(m, 1)

    sharded_opt = plan.zero >= 1 or plan.fsdp
    opt_params = (dense_s / plan.shard_size + expert_s / plan.expert_shard_size) if sharded_opt else dense_s + expert_s
    optimizer_s = memory_time_s(gpu, OPTIMIZER_BYTES_PER_PARAM * opt_params)

    compute_s = m * compute_mb
    exposed_s = m * s.exposed + dp_exposed
    step = compute_s + exposed_s + bubble + optimizer_s

    # ---- FLOPs -----------------------------------------------------------------------------------
    tokens = plan.global_batch * plan.seq_len
    model_flops = tokens * model_flops_per_token(model, plan.seq_len, plan.causal)
    if plan.mtp and model.mtp_layers:  # each MTP module: one more block and output-layer pass per token
        kind = LayerKind("full", "moe" if model.moe else "dense")
        mtp_fwd = 2.0 * (model.matmul_params_per_token(kind) + model.vocab * model.hidden + 2 * model.hidden**2)
        model_flops += tokens * 3.0 * model.mtp_layers * mtp_fwd
    recompute_flops = 0.0
    if plan.recompute == "full":
        mb_per_step = plan.global_batch // plan.micro_batch
        for layers in rank_layers:
            for kind, n in model.kind_counts(layers[: plan.recomputed_layers(len(layers))]).items():
                unit_flops = sum(op.flops for op in graph.layers[kind].ops)
                recompute_flops += n * unit_flops * plan.tp * plan.cp * mb_per_step
    hardware_flops = model_flops + recompute_flops
    peak = gpu.peak_tflops(plan.precision) * 1e12

    # ---- memory ----------------------------------------------------------------------------------
    mems = []
    for r in sorted({0, plan.pp - 1, slowest, plan.pp // 2}):
        st = rank_state_bytes(model, plan, r)
        act, workspace, inflight = activation_bytes(model, plan, graph, r)
        buf = buffer_bytes(model, plan, graph, r, gpu.arch) + workspace
        allocated = st.params + st.grads + st.optimizer + act + buf
        overhead = CONTEXT_BYTES + FRAGMENTATION * (act + buf)
        mems.append((allocated + overhead, r, st, act, buf, overhead, inflight))
    required, mstage, st, act, buf, overhead, inflight = max(mems, key=lambda x: x[0])
    memory = MemoryBreakdown(
        peak_gib=(required - overhead) / GIB,
        params_gib=st.params / GIB,
        grads_gib=st.grads / GIB,
        optimizer_gib=st.optimizer / GIB,
        activations_gib=act / GIB,
        buffers_gib=buf / GIB,
        overhead_gib=overhead / GIB,
        required_gib=required / GIB,
        capacity_gib=gpu.hbm_gib,
        stage=mstage,
        inflight_microbatches=inflight,
    )

    warnings = []
    if plan.vpp > 1 and m % plan.pp:
        warnings.append(f"interleaved schedule: micro-batches per step ({m}) not a multiple of pp ({plan.pp})")
    if plan.pp > 1 and m < plan.pp:
        warnings.append(f"only {m} micro-batches for {plan.pp} pipeline stages: the bubble dominates")
    if graph.routing.dropped_fraction > 0:
        warnings.append(f"capacity factor drops {graph.routing.dropped_fraction:.1%} of token-expert assignments")
    max_params = max(sum(rank_params_local(model, plan, r)) for r in {0, plan.pp - 1, slowest, plan.pp // 2})
    state_w = st.params / (4 if plan.fsdp else 2)
    time = TimeBreakdown(
        compute_s=compute_s,
        exposed_comm_s=exposed_s,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        recompute_s=m * s.recompute,
        comm_total_s=m * (s.exposed + s.hidden) + dp_total,
        detail={
            "dp_exposed_s": dp_exposed,
            "slowest_stage": float(slowest),
            "moe_hot_rank_factor": graph.routing.hot_rank_factor,
        },
    )
    return Estimate(
        model=model.name,
        gpu=gpu.name,
        gpus=plan.gpus,
        plan={f.name: getattr(plan, f.name) for f in fields(plan)} | {"grad_accum": m, "sharding": plan.sharding_name},
        params=ParamCounts(
            total=model.params_total,
            per_gpu=int(round(max_params)),
            per_gpu_sharded=state_w,
            active=model.params_active,
        ),
        step_time_s=step,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / plan.gpus,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hardware_flops,
        model_tflops_per_gpu=model_flops / step / plan.gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / step / plan.gpus / 1e12,
        mfu=model_flops / step / plan.gpus / peak,
        hfu=hardware_flops / step / plan.gpus / peak,
        fits=memory.required_gib <= gpu.hbm_gib,
        memory=memory,
        time=time,
        warnings=tuple(warnings),
    )
