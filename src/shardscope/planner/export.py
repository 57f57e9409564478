"""Write a plan as a launchable config: torchtitan job TOML, Megatron-LM arguments, DeepSpeed JSON.

Field names are the frameworks' own (torchtitan `JobConfig` sections, Megatron-LM `arguments.py`, the
DeepSpeed config schema). Where a framework cannot express part of a plan (torchtitan has no ZeRO-1,
DeepSpeed no context parallelism) the export says so in a comment / `_shardscope_notes`.
"""

from __future__ import annotations

import json

from shardscope.models.spec import ModelSpec
from shardscope.plan.layout import format_pp_layout
from shardscope.plan.plan import MOMENT_BYTES, Plan

FORMATS = ("torchtitan", "megatron", "deepspeed")


def _moments_note(plan: Plan, framework: str) -> list[str]:
    """Adam moments below fp32 are a Megatron-Core option (precision-aware optimizer) that `framework`
    cannot set from its config: say so rather than export a plan whose state the run would exceed."""
    if plan.optimizer_moments == "fp32":
        return []
    extra = 2 * (MOMENT_BYTES["fp32"] - plan.moment_bytes)  # two moments, m and v
    return [
        f"{plan.optimizer_moments} Adam moments have no {framework} config option: the run keeps fp32 moments "
        f"(+{extra} B/param of optimizer state over this plan) unless the optimizer is swapped in code"
    ]


def _pp_schedule_titan(plan: Plan) -> str:
    return "Interleaved1F1B" if plan.vpp > 1 else "1F1B"


def to_torchtitan(model: ModelSpec, plan: Plan) -> str:
    # torchtitan: world = dp_replicate · dp_shard · cp · tp · pp, FSDP sharding over dp_shard · cp
    if plan.fsdp or plan.zero >= 1:
        shard = max(plan.shard_size // plan.cp, 1)
        replicate = plan.dp // shard
    else:
        shard, replicate = 1, plan.dp
    notes = []
    if plan.zero in (1, 2) and not plan.fsdp:
        notes.append(f"ZeRO-{plan.zero} has no torchtitan equivalent: FSDP2 full sharding over the same ranks")
    notes += _moments_note(plan, "torchtitan")
    reduce_dtype = "bfloat16" if plan.main_grads == "bf16" else "float32"
    reshard = "never" if (plan.fsdp and not plan.reshard_after_forward) else "default"
    lines = [
        "# torchtitan job config written by shardscope",
        *[f"# note: {n}" for n in notes],
        "[job]",
        'dump_folder = "./outputs"',
        f'description = "{model.name}: shardscope plan"',
        "",
        "[model]",
        f'name = "{model.name}"',
        "",
        "[training]",
        f"local_batch_size = {plan.micro_batch * plan.grad_accum}",
        f"global_batch_size = {plan.global_batch}",
        f"seq_len = {plan.seq_len}",
        'mixed_precision_param = "bfloat16"',
        f'mixed_precision_reduce = "{reduce_dtype}"',
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{reshard}"',
        f"tensor_parallel_degree = {plan.tp}",
        f"enable_async_tensor_parallel = {'true' if plan.tp_comm_overlap else 'false'}",
        f"pipeline_parallel_degree = {plan.pp}",
        f'pipeline_parallel_schedule = "{_pp_schedule_titan(plan)}"',
        f"pipeline_parallel_microbatch_size = {plan.micro_batch}",
        f"context_parallel_degree = {plan.cp}",
        f"expert_parallel_degree = {plan.ep}",
        f"expert_tensor_parallel_degree = {plan.etp}",
        "",
        "[activation_checkpoint]",
        f'mode = "{plan.recompute}"',
        'selective_ac_option = "op"',
    ]
    if plan.precision == "fp8":
        lines += [
            "",
            "[quantize.linear.float8]",
            f'recipe_name = "{"rowwise" if plan.fp8_recipe != "tensorwise" else "tensorwise"}"',
            f"enable_fsdp_float8_all_gather = {'true' if plan.fp8_all_gather else 'false'}",
        ]
    return "\n".join(lines) + "\n"


def to_megatron(model: ModelSpec, plan: Plan) -> list[str]:
    """Megatron-LM (pretrain_gpt.py) command-line arguments."""
    args = [
        "--num-layers",
        str(model.layers),
        "--hidden-size",
        str(model.hidden),
        "--num-attention-heads",
        str(model.heads),
        "--seq-length",
        str(plan.seq_len),
        "--micro-batch-size",
        str(plan.micro_batch),
        "--global-batch-size",
        str(plan.global_batch),
        "--tensor-model-parallel-size",
        str(plan.tp),
        "--pipeline-model-parallel-size",
        str(plan.pp),
        "--context-parallel-size",
        str(plan.cp),
    ]
    if model.kv_heads != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if plan.vpp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
    mtp_layers = model.mtp_layers if plan.mtp else 0
    if plan.pp_layout:
        args += ["--pipeline-model-parallel-layout", format_pp_layout(plan.pp_layout, mtp_layers, plan.mtp_chunk)]
    if mtp_layers:
        args += ["--mtp-num-layers", str(mtp_layers)]
    if plan.cp > 1:
        args += ["--cp-comm-type", "p2p" if plan.cp_kind == "ring" else "a2a"]
    if plan.ep > 1 or plan.etp > 1:
        args += ["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", str(plan.etp)]
    if model.moe is not None:  # the dispatcher the estimate priced
        flex = plan.ep_dispatch != "flat"
        args += ["--moe-token-dispatcher-type", "flex" if flex else "alltoall"]
        args += ["--moe-flex-dispatcher-backend", plan.ep_dispatch] if flex else []
    if plan.sp:
        args.append("--sequence-parallel")
    if plan.fsdp or plan.zero == 3:
        args += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            "optim_grads_params" if plan.reshard_after_forward else "optim_grads",
        ]
    elif plan.zero >= 1:
        args.append("--use-distributed-optimizer")
    args += ["--overlap-grad-reduce"] if plan.overlap_grad_reduce else []
    if plan.zero >= 1 and not plan.fsdp:
        args.append("--overlap-param-gather")
    if plan.recompute == "full":
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "block" if plan.recompute_layers else "uniform",
            "--recompute-num-layers",
            str(plan.recompute_layers or 1),
        ]
    elif plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if plan.recompute_modules:
            args += ["--recompute-modules", *plan.recompute_modules]
    args.append("--bf16")
    if plan.precision == "fp8":
        args += ["--fp8-format", "hybrid", "--fp8-recipe", plan.fp8_recipe]
        if plan.fp8_params:  # FP8 parameters, all-gathered in FP8
            args.append("--fp8-param-gather")
    if plan.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if model.mlp == "swiglu" and not plan.fused_activation:  # Megatron fuses by default; match the estimate
        args.append("--no-bias-swiglu-fusion")
    if plan.fused_cross_entropy:
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    if plan.offload_optimizer:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"]
    if plan.optimizer_moments != "fp32" or plan.main_grads != "fp32":
        args.append("--use-precision-aware-optimizer")
        m = plan.optimizer_moments
        args += ["--exp-avg-dtype", m, "--exp-avg-sq-dtype", m, "--main-grads-dtype", plan.main_grads]
    if plan.ep_comm_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    if plan.cuda_graphs == ("full_iteration",):
        args += ["--cuda-graph-impl", "full_iteration"]
    elif plan.cuda_graphs:
        args += ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", *plan.cuda_graphs]
    return args


def to_deepspeed(model: ModelSpec, plan: Plan) -> str:
    stage = 3 if (plan.fsdp and plan.reshard_after_forward) or plan.zero == 3 else (2 if plan.fsdp else plan.zero)
    zero: dict = {"stage": stage, "overlap_comm": plan.overlap_grad_reduce, "contiguous_gradients": True}
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if stage == 3 and plan.shard_group:
        zero["zero_hpz_partition_size"] = plan.shard_group
    notes = []
    if plan.cp > 1:
        notes.append(
            f"context parallel {plan.cp} ({plan.cp_kind}): DeepSpeed-Ulysses sequence parallelism "
            "is set up in code (sequence_parallel_size)"
        )
    if plan.pp > 1:
        notes.append(f"pipeline parallel {plan.pp}: DeepSpeed PipelineModule(num_stages={plan.pp}) in code")
    notes += _moments_note(plan, "DeepSpeed")
    cfg = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": plan.main_grads},
        "zero_optimization": zero,
        "tensor_parallel": {"autotp_size": plan.tp},
        "activation_checkpointing": {
            "partition_activations": plan.recompute != "none" and plan.tp > 1,
            "contiguous_memory_optimization": False,
            "number_checkpoints": plan.recompute_layers or None,
        },
        "_shardscope": {
            "model": model.name,
            "tp": plan.tp,
            "pp": plan.pp,
            "cp": plan.cp,
            "dp": plan.dp,
            "ep": plan.ep,
            "recompute": plan.recompute,
            "notes": notes,
        },
    }
    return json.dumps(cfg, indent=2) + "\n"


def export(fmt: str, model: ModelSpec, plan: Plan) -> str:
    if fmt == "torchtitan":
        return to_torchtitan(model, plan)
    if fmt == "megatron":
        return " \\\n  ".join(["torchrun pretrain_gpt.py", *_pairs(to_megatron(model, plan))]) + "\n"
    if fmt == "deepspeed":
        return to_deepspeed(model, plan)
    raise ValueError(fmt)


def _pairs(args: list[str]) -> list[str]:
    out: list[str] = []
    for a in args:
        if a.startswith("--") or not out:
            out.append(a)
        else:
            out[-1] += f" {a}"
    return out
