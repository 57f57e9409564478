"""Step time, throughput, MFU and memory of one optimizer step, summed over the op graph.

Step = m·(stage compute + exposed stage comm) + pipeline bubble + exposed DP comm + optimizer, where m is
the number of micro-batches per step on the slowest pipeline stage. Bubble: (pp-1)/vpp of one
micro-batch's forward+backward on a middle stage (1F1B / interleaved 1F1B, Narayanan et al. 2021 §2.2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shardscope.costs.comm import GroupPlacement, collective_time_s, place_group
from shardscope.costs.compute import memory_time_s, op_time_s
from shardscope.costs.efficiency import overlap_slowdown
from shardscope.costs.memory import (
    CONTEXT_BYTES,
    FRAGMENTATION,
    GIB,
    activation_bytes,
    buffer_bytes,
    layer_params_local,
    model_state_bytes,
    stage_params_local,
)
from shardscope.graph.build import BF16, FP32, OpGroup, build_stage_graph
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
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
    dp: GroupPlacement
    pp: GroupPlacement
    shard: GroupPlacement
    replicate: GroupPlacement


def place_groups(cluster: Cluster, plan: Plan) -> Groups:
    """Megatron rank order tp-cp-dp-pp: each group's stride is the product of the inner sizes."""
    shard = plan.shard_size
    return Groups(
        tp=place_group(cluster, plan.tp, 1),
        cp=place_group(cluster, plan.cp, plan.tp),
        dp=place_group(cluster, plan.dp, plan.tp * plan.cp),
        pp=place_group(cluster, plan.pp, plan.tp * plan.cp * plan.dp),
        shard=place_group(cluster, shard, plan.tp * plan.cp),
        replicate=place_group(cluster, plan.dp // shard, plan.tp * plan.cp * shard),
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
    gpu = cluster.gpu
    cost = PhaseCost()
    for op in unit.ops:
        t = op_time_s(gpu, op, backward, plan)
        cost.compute_s += t
        if op.kind == "gemm":
            cost.gemm_s += t
        elif op.kind == "attention":
            cost.attention_s += t
    phase = "bwd" if backward else "fwd"
    budget = {"attention": cost.attention_s, "gemm": cost.gemm_s}
    for c in unit.comms:
        if c.phase != phase:
            continue
        t = collective_time_s(cluster, c.kind, c.bytes, getattr(groups, c.group))
        if c.hidden_by:
            hidden = min(t, budget[c.hidden_by])
            budget[c.hidden_by] -= hidden
            cost.hidden_s += hidden
            cost.exposed_s += t - hidden
        else:
            cost.exposed_s += t
    return cost


def _recompute_s(cluster: Cluster, plan: Plan, groups: Groups, unit: OpGroup, fwd: PhaseCost) -> float:
    """Extra forward work in backward: the whole forward (full) or its cheap ops (selective)."""
    if plan.recompute == "full":
        return fwd.compute_s + fwd.exposed_s
    if plan.recompute == "selective":
        return sum(op_time_s(cluster.gpu, op, False, plan) for op in unit.ops if op.cheap)
    return 0.0


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs per token (forward + backward = 3x forward, no recompute): every weight multiply
    (2 FLOPs per weight per token, output layer included, embedding lookups excluded) and causal
    attention (QK^T and PV over (s+1)/2 keys on average: 2·2·q_dim·(s+1)/2 per layer)."""
    layer_weights = model.hidden * (model.q_dim + 2 * model.kv_dim) + model.q_dim * model.hidden
    layer_weights += (3 if model.mlp == "swiglu" else 2) * model.hidden * model.ffn_hidden
    fwd = 2.0 * (model.layers * layer_weights + model.vocab * model.hidden)
    fwd += model.layers * 2.0 * model.q_dim * (seq_len + 1)
    return 3.0 * fwd


def _fwd_flops(unit: OpGroup) -> float:
    return sum(op.flops for op in unit.ops)


def estimate_step(model: ModelSpec, cluster: Cluster, plan: Plan) -> Estimate:
    gpu = cluster.gpu
    graph = build_stage_graph(model, plan, gpu.arch)
    groups = place_groups(cluster, plan)
    slow = overlap_slowdown(gpu)
    m = plan.grad_accum
    stage_layers = plan.stage_layers(model.layers)

    # ---- one layer, one micro-batch --------------------------------------------------------------
    lf = _phase_cost(cluster, plan, groups, graph.layer, backward=False)
    lb = _phase_cost(cluster, plan, groups, graph.layer, backward=True)
    l_rec = _recompute_s(cluster, plan, groups, graph.layer, lf)
    rec_layers = (
        plan.recomputed_layers(stage_layers)
        if plan.recompute == "full"
        else (stage_layers if plan.recompute == "selective" else 0)
    )

    # FSDP / ZeRO-3 (reshard after forward): every micro-batch all-gathers each layer in forward and
    # again in backward and reduce-scatters its gradient, prefetched under the neighbouring layer's
    # compute. Without resharding (ZeRO-2-like FSDP) weights stay gathered across the step's
    # micro-batches: one gather and one reduce-scatter per step, handled with the DP traffic below.
    per_microbatch_sharding = (plan.fsdp or plan.zero == 3) and plan.reshard_after_forward
    # Weights travel in bf16, or in FP8 where the framework all-gathers FP8 weights (torchao / Megatron-FSDP).
    gather_bytes = 1 if (plan.precision == "fp8" and plan.fp8_all_gather) else BF16
    fsdp_exposed_mb = fsdp_hidden_mb = 0.0
    if per_microbatch_sharding and plan.shard_size > 1:
        layer_local = layer_params_local(model, plan.tp)
        ag = collective_time_s(cluster, "all_gather", gather_bytes * layer_local, groups.shard)
        rs = collective_time_s(cluster, "reduce_scatter", GRAD_REDUCE_BYTES * layer_local, groups.shard)
        bwd_comm = rs + ag
        per_layer_exposed = max(0.0, ag - lf.compute_s) + max(0.0, bwd_comm - (lb.compute_s + l_rec))
        fsdp_exposed_mb = stage_layers * per_layer_exposed + ag  # the first gather has nothing to hide under
        fsdp_hidden_mb = stage_layers * (ag + bwd_comm) - fsdp_exposed_mb + ag

    # ---- stages ----------------------------------------------------------------------------------
    ef = _phase_cost(cluster, plan, groups, graph.embedding, backward=False)
    eb = _phase_cost(cluster, plan, groups, graph.embedding, backward=True)
    hf = _phase_cost(cluster, plan, groups, graph.head, backward=False)
    hb = _phase_cost(cluster, plan, groups, graph.head, backward=True)

    def stage_cost(stage: int) -> tuple[float, float, float, float]:
        """(compute, exposed comm, hidden comm, recompute) per micro-batch on `stage`."""
        compute = stage_layers * (lf.compute_s + lb.compute_s) + rec_layers * l_rec
        exposed = stage_layers * (lf.exposed_s + lb.exposed_s)
        hidden = stage_layers * (lf.hidden_s + lb.hidden_s)
        if plan.recompute == "full":  # the recomputed forward re-runs its TP/CP communication
            compute -= rec_layers * lf.exposed_s
            exposed += rec_layers * lf.exposed_s
        recompute = rec_layers * l_rec - (rec_layers * lf.exposed_s if plan.recompute == "full" else 0.0)
        if stage == 0:
            compute += ef.compute_s + eb.compute_s
            exposed += ef.exposed_s + eb.exposed_s
        if stage == plan.pp - 1:
            compute += hf.compute_s + hb.compute_s
            exposed += hf.exposed_s + hb.exposed_s
        if plan.pp > 1:  # activations / gradients to and from the neighbouring stages, per model chunk
            p2p = collective_time_s(cluster, "send_recv", graph.boundary_bytes, groups.pp)
            exposed += 2 * plan.vpp * p2p
        exposed += fsdp_exposed_mb
        hidden += fsdp_hidden_mb
        compute += hidden * slow
        return compute, exposed, hidden, recompute

    stages = {s: stage_cost(s) for s in sorted({0, plan.pp - 1, min(1, plan.pp - 1)})}
    slowest = max(stages, key=lambda s: stages[s][0] + stages[s][1])
    compute_mb, exposed_mb, hidden_mb, recompute_mb = stages[slowest]
    mid = stages[min(1, plan.pp - 1)] if plan.pp > 2 else stages[slowest]
    bubble = (plan.pp - 1) / plan.vpp * (mid[0] + mid[1]) if plan.pp > 1 else 0.0

    # ---- data-parallel gradient reduction and parameter gather (non-FSDP) ------------------------
    params_stage = max(stage_params_local(model, plan, s) for s in stages)
    dp_exposed = dp_total = 0.0
    if not per_microbatch_sharding and plan.dp > 1:
        # Once per step: gradients reduced (all-reduce for DDP, reduce-scatter when sharded) under the
        # last micro-batch's backward (bucketed, Megatron overlap_grad_reduce), and sharded weights
        # gathered back under the next step's first forward (overlap_param_gather).
        sharded = plan.zero >= 1 or plan.fsdp
        group = groups.shard if sharded else groups.dp
        kind = "reduce_scatter" if sharded else "all_reduce"
        grad = collective_time_s(cluster, kind, GRAD_REDUCE_BYTES * params_stage, group)
        last_bucket = grad / max(stage_layers, 1)
        bwd_window = stage_layers * lb.compute_s + rec_layers * l_rec
        dp_exposed += max(0.0, grad - bwd_window) + last_bucket
        dp_total += grad
        if sharded:
            gather = collective_time_s(cluster, "all_gather", gather_bytes * params_stage, group)
            dp_exposed += max(0.0, gather - stage_layers * lf.compute_s) + gather / max(stage_layers, 1)
            dp_total += gather
        compute_mb += max(dp_total - dp_exposed, 0.0) * slow / max(m, 1)
    if (plan.fsdp or plan.zero == 3) and plan.shard_size < plan.dp:  # HSDP: all-reduce across replicas
        rep = collective_time_s(
            cluster, "all_reduce", GRAD_REDUCE_BYTES * params_stage / plan.shard_size, groups.replicate
        )
        dp_exposed += rep
        dp_total += rep

    state = model_state_bytes(params_stage, plan)
    optimizer_s = memory_time_s(
        gpu,
        OPTIMIZER_BYTES_PER_PARAM * params_stage / max(plan.shard_size, 1)
        if (plan.zero >= 1 or plan.fsdp)
        else OPTIMIZER_BYTES_PER_PARAM * params_stage,
    )

    compute_s = m * compute_mb
    exposed_s = m * exposed_mb + dp_exposed
    step = compute_s + exposed_s + bubble + optimizer_s

    # ---- FLOPs -----------------------------------------------------------------------------------
    tokens = plan.global_batch * plan.seq_len
    model_flops = tokens * model_flops_per_token(model, plan.seq_len)
    recompute_flops = 0.0
    if plan.recompute == "full":
        layer_fwd = _fwd_flops(graph.layer) * plan.tp * plan.cp  # as executed (a layer's whole TP/CP group)
        mb_per_step = plan.global_batch // plan.micro_batch
        recompute_flops = layer_fwd * plan.recomputed_layers(stage_layers) * plan.pp * mb_per_step
    hardware_flops = model_flops + recompute_flops
    peak = gpu.peak_tflops(plan.precision) * 1e12

    mtflops = model_flops / step / plan.gpus / 1e12

    # ---- memory ----------------------------------------------------------------------------------
    mems = []
    for s in stages:
        st = model_state_bytes(stage_params_local(model, plan, s), plan)
        act, workspace, inflight = activation_bytes(model, plan, graph, s)
        buf = buffer_bytes(model, plan, graph, s, gpu.arch) + workspace
        allocated = st.params + st.grads + st.optimizer + act + buf
        overhead = CONTEXT_BYTES + FRAGMENTATION * (act + buf)
        mems.append((allocated + overhead, s, st, act, buf, overhead, inflight))
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
    tp_hidden = stages[slowest][2]
    time = TimeBreakdown(
        compute_s=compute_s,
        exposed_comm_s=exposed_s,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        recompute_s=m * recompute_mb,
        comm_total_s=m * (exposed_mb + tp_hidden) + dp_total,
        detail={
            "layer_fwd_s": lf.compute_s,
            "layer_bwd_s": lb.compute_s,
            "layer_tp_cp_exposed_s": lf.exposed_s + lb.exposed_s,
            "fsdp_exposed_per_microbatch_s": fsdp_exposed_mb,
            "dp_exposed_s": dp_exposed,
            "slowest_stage": float(slowest),
        },
    )
    return Estimate(
        model=model.name,
        gpu=gpu.name,
        gpus=plan.gpus,
        plan=asdict(plan) | {"grad_accum": m, "sharding": plan.sharding_name},
        params=ParamCounts(
            total=model.params_total,
            per_gpu=int(round(params_stage)),
            per_gpu_sharded=state.params / (4 if plan.fsdp else 2),
        ),
        step_time_s=step,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / plan.gpus,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hardware_flops,
        model_tflops_per_gpu=mtflops,
        hardware_tflops_per_gpu=hardware_flops / step / plan.gpus / 1e12,
        mfu=model_flops / step / plan.gpus / peak,
        hfu=hardware_flops / step / plan.gpus / peak,
        fits=memory.required_gib <= gpu.hbm_gib,
        memory=memory,
        time=time,
        warnings=tuple(warnings),
    )
