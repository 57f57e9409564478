"""DeepSpeed export: the JSON config `deepspeed.initialize` reads (its schema: deepspeed/runtime/config.py), with
the launch (nodes, GPUs per node, steps, the `deepspeed` launcher command) under `_shardscope`, and the
learning-rate schedule and data path as FILL IN placeholders.

What the config sets: ZeRO stage, overlap and offload, AutoTP, batch sizes, precision, activation checkpointing.
Pipeline stages, experts and Ulysses sequence parallelism are built in the model code; the export says so. What
a DeepSpeed release cannot run is refused (`CONSTRAINTS`, each row naming the DeepSpeed file that decides it).
"""

from __future__ import annotations

import json

from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.planner.export.common import (
    FILL_IN,
    Constraint,
    ExportTarget,
    Launch,
    launch_for,
    moments_note,
    release_key,
)

DEFAULT_RELEASE = "0.16"


def zero_stage(plan: Plan) -> int:
    """The ZeRO stage of a plan: FSDP that reshards after forward is ZeRO-3, without resharding ZeRO-2."""
    if (plan.fsdp and plan.reshard_after_forward) or plan.zero == 3:
        return 3
    return 2 if plan.fsdp else plan.zero


# What DeepSpeed cannot run, by release ("until X": the releases before X).
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        lambda m, p: p.tp > 1,
        "AutoTP training (tensor_parallel.autotp_size): DeepSpeed has it from 0.16.4",
        "DeepSpeed 0.16.4 deepspeed/runtime/tensor_parallel/config.py TPTrainingConfig.autotp_size",
        until="0.16",
    ),
    Constraint(
        lambda m, p: p.tp > 1 and zero_stage(p) == 3,
        "ZeRO-3 with AutoTP: DeepSpeed's AutoTP training runs ZeRO stages 0-2 (search it with ZeRO-1/2 or TP 1)",
        "DeepSpeed 0.16.4-0.19.3 deepspeed/runtime/engine.py _configure_tensor_parallel_states "
        "(assert zero_optimization_stage() <= 2)",
        until="0.19.4",
    ),
    Constraint(
        lambda m, p: p.pp > 1 and zero_stage(p) >= 2,
        lambda m, p: f"ZeRO-{zero_stage(p)} with pipeline parallelism: DeepSpeed's pipeline engine runs ZeRO 0-1",
        "DeepSpeed deepspeed/runtime/pipe/engine.py PipelineEngine.__init__ "
        "('ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism')",
    ),
    Constraint(
        lambda m, p: p.cp > 1 and p.cp_kind != "a2a",
        "ring context parallelism: DeepSpeed splits sequences with Ulysses all-to-alls",
        "DeepSpeed deepspeed/sequence/layer.py DistributedAttention",
    ),
    Constraint(
        lambda m, p: m.moe is not None and p.ep > 1 and p.ep_dispatch != "flat",
        lambda m, p: f"the {p.ep_dispatch} dispatcher: DeepSpeed MoE dispatches tokens with an NCCL all-to-all",
        "DeepSpeed deepspeed/moe/sharded_moe.py MOELayer (_AllToAll)",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.ep_comm_overlap,
        "the EP all-to-all overlap: DeepSpeed MoE has no setting for it",
        "DeepSpeed deepspeed/moe/sharded_moe.py MOELayer",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.fused_expert_mlp,
        "Transformer Engine's fused grouped expert MLP: DeepSpeed MoE experts are the model's own modules",
        "DeepSpeed deepspeed/moe/experts.py",
    ),
    Constraint(
        lambda m, p: p.precision == "fp8",
        "FP8 GEMMs: the DeepSpeed config has bf16 and fp16 sections only",
        "DeepSpeed deepspeed/runtime/config.py DeepSpeedConfig._initialize_params",
        uniform=True,
    ),
    Constraint(
        lambda m, p: bool(p.cuda_graphs),
        "CUDA graphs: the DeepSpeed training config has no graph capture",
        "DeepSpeed deepspeed/runtime/config.py DeepSpeedConfig._initialize_params",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.tp_comm_overlap and p.tp > 1,
        "TP communication overlap (tensor_parallel.tp_overlap_comm): DeepSpeed has it from 0.17",
        "DeepSpeed 0.17 deepspeed/runtime/tensor_parallel/config.py TPTrainingConfig.tp_overlap_comm",
        until="0.17",
    ),
    Constraint(
        lambda m, p: p.recompute == "selective",
        "selective recompute: DeepSpeed's activation checkpointing re-runs whole checkpointed functions",
        "DeepSpeed deepspeed/runtime/activation_checkpointing/checkpointing.py",
    ),
    Constraint(
        lambda m, p: p.offload_activations > 0,
        "a fraction of activations in host memory: DeepSpeed's cpu_checkpointing moves checkpoint inputs only",
        "DeepSpeed deepspeed/runtime/activation_checkpointing/config.py cpu_checkpointing",
    ),
    Constraint(
        lambda m, p: p.fsdp and p.shard_group > 0 and not p.reshard_after_forward,
        "HSDP without resharding: DeepSpeed's hierarchical sharding (MiCS) is a ZeRO-3 mode",
        "DeepSpeed deepspeed/runtime/zero/config.py mics_shard_size",
    ),
)


def _notes(model: ModelSpec, plan: Plan) -> list[str]:
    """What the model code must set up (DeepSpeed builds it there, not from the config)."""
    notes = []
    if plan.cp > 1:
        notes.append(
            f"context parallel {plan.cp} ({plan.cp_kind}): DeepSpeed-Ulysses sequence parallelism "
            "is set up in code (sequence_parallel_size)"
        )
    if plan.pp > 1:
        notes.append(f"pipeline parallel {plan.pp}: DeepSpeed PipelineModule(num_stages={plan.pp}) in code")
    if model.moe and plan.ep > 1:
        notes.append(f"expert parallel {plan.ep}: deepspeed.moe.layer.MoE(ep_size={plan.ep}) layers in code")
    if plan.recompute == "full":
        layers = f"{plan.recompute_layers} layers per stage" if plan.recompute_layers else "every layer"
        notes.append(f"full recompute: wrap {layers} in deepspeed.checkpointing.checkpoint in code")
    if plan.fsdp and plan.shard_group:
        notes.append(f"HSDP over groups of {plan.shard_group}: build the model under deepspeed.zero.MiCS_Init")
    notes += moments_note(plan, "DeepSpeed")
    return notes


def to_deepspeed(model: ModelSpec, plan: Plan, target: ExportTarget | None = None, launch: Launch | None = None) -> str:
    """The DeepSpeed JSON config of `plan` for `target`'s release (default 0.16), with the launch under
    `_shardscope.launch`."""
    release = target.release if target else DEFAULT_RELEASE
    launch = launch or launch_for(plan)
    stage = zero_stage(plan)
    zero: dict = {"stage": stage, "overlap_comm": plan.overlap_grad_reduce, "contiguous_gradients": True}
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if stage == 3 and plan.fsdp and plan.shard_group:
        zero["mics_shard_size"] = plan.shard_group
    steps = launch.steps if launch.steps is not None else f"{FILL_IN}: training steps"
    cfg: dict = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": plan.precision != "fp16"},
        "fp16": {"enabled": plan.precision == "fp16"},
        "data_types": {"grad_accum_dtype": plan.main_grads},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": f"{FILL_IN}: lr schedule: peak learning rate"}},
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": steps,
                "warmup_num_steps": f"{FILL_IN}: lr schedule: warmup steps",
                "cos_min_ratio": f"{FILL_IN}: lr schedule: final learning rate / peak",
            },
        },
        "activation_checkpointing": {
            "partition_activations": plan.recompute != "none" and plan.tp > 1,
            "contiguous_memory_optimization": False,
            "number_checkpoints": plan.recompute_layers or None,
        },
    }
    if release_key(release) >= release_key("0.16"):  # AutoTP training (0.16.4 on)
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
        if release_key(release) >= release_key("0.17"):
            cfg["tensor_parallel"]["tp_overlap_comm"] = plan.tp_comm_overlap and plan.tp > 1
    command = (
        f"deepspeed --num_nodes {launch.nodes} --num_gpus {launch.gpus_per_node}"
        + (" --hostfile FILL_IN_HOSTFILE" if launch.nodes > 1 else "")
        + " YOUR_TRAINING_SCRIPT.py --deepspeed --deepspeed_config ds_config.json"
    )
    cfg["_shardscope"] = {
        "model": model.name,
        "release": f"deepspeed@{release}",
        "tp": plan.tp,
        "pp": plan.pp,
        "cp": plan.cp,
        "dp": plan.dp,
        "ep": plan.ep,
        "recompute": plan.recompute,
        "launch": {
            "nodes": launch.nodes,
            "gpus_per_node": launch.gpus_per_node,
            "train_steps": steps,
            "data_path": f"{FILL_IN}: data path",
            "command": command,
        },
        "notes": _notes(model, plan),
    }
    return json.dumps(cfg, indent=2) + "\n"
