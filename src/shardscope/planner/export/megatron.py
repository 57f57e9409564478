"""Megatron-LM export: a launch script running `pretrain_gpt.py` under torchrun with the network's and the
plan's arguments (the option strings of Megatron-LM's own parser, `megatron/training/arguments.py`), the node
and GPU counts, the training iterations, and the data path and learning-rate schedule as placeholders.

What a Megatron-Core release cannot run is refused (`CONSTRAINTS`, each row naming the file of the
megatron-core release that decides it: a TransformerConfig / DDP-config field it lacks).
"""

from __future__ import annotations

from shardscope.models.spec import ModelSpec
from shardscope.plan.layout import format_pp_layout
from shardscope.plan.plan import Plan
from shardscope.planner.export.common import (
    EVERY_NODE,
    FILL_IN,
    Constraint,
    ExportTarget,
    Launch,
    fill_in,
    hf_repo,
    launch_for,
    release_key,
    shell_command,
    torchrun,
)

# The Megatron-Core release an export names when none is asked for (the megatron stack's default)
DEFAULT_RELEASE = "0.16"
_CORE = "megatron-core {} megatron/core/{}"

# What a Megatron-Core release cannot run: a setting written before the release that introduced it (read from
# the megatron-core wheels 0.12.3 .. 0.16.1), or not in any release the export is written for.
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        lambda m, p: p.ep_comm_overlap,
        "the EP all-to-all overlap: Megatron-Core has it from core 0.14",
        _CORE.format("0.14", "transformer/transformer_config.py overlap_moe_expert_parallel_comm"),
        until="0.14",
        uniform=True,
    ),
    Constraint(
        lambda m, p: m.moe is not None and p.ep > 1 and p.ep_dispatch == "hybridep",
        "the HybridEP dispatcher: Megatron-Core has it from core 0.16",
        _CORE.format("0.16", "transformer/transformer_config.py moe_flex_dispatcher_backend"),
        until="0.16",
        uniform=True,
    ),
    Constraint(
        lambda m, p: bool(p.cuda_graphs),
        "CUDA-graph scopes (--cuda-graph-impl): Megatron-Core has them from core 0.15",
        _CORE.format("0.15", "transformer/transformer_config.py cuda_graph_impl"),
        until="0.15",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.precision == "fp8" and p.fp8_recipe == "blockwise",
        "blockwise FP8 scaling: Megatron-Core has it from core 0.13",
        _CORE.format("0.13", "enums.py Fp8Recipe.blockwise"),
        until="0.13",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.fsdp or p.zero == 3,
        "Megatron FSDP (--use-megatron-fsdp): Megatron-Core has it from core 0.14",
        _CORE.format("0.14", "distributed/distributed_data_parallel_config.py use_megatron_fsdp"),
        until="0.14",
    ),
    Constraint(
        lambda m, p: p.zero == 2 and not p.fsdp,
        "ZeRO-2: Megatron's distributed optimizer shards the optimizer state, not the gradient buffer",
        _CORE.format("0.16", "distributed/param_and_grad_buffer.py"),
    ),
    Constraint(
        lambda m, p: p.fused_expert_mlp,
        "the fused grouped expert MLP (--use-transformer-engine-op-fuser): newer than core 0.16",
        _CORE.format("0.16.1", "transformer/transformer_config.py (no use_transformer_engine_op_fuser)"),
    ),
)


def megatron_launch_args(launch: Launch) -> list[str]:
    """What `pretrain_gpt.py` needs to train besides the model and the plan: the iterations (or a placeholder),
    the learning-rate schedule and the data path as placeholders the launch script fills."""
    iters = str(launch.steps) if launch.steps is not None else "$TRAIN_ITERS"
    return [
        "--train-iters", iters,
        "--lr", "$LR", "--min-lr", "$MIN_LR", "--lr-decay-style", "$LR_DECAY_STYLE",
        "--lr-warmup-iters", "$LR_WARMUP_ITERS",
        "--data-path", "$DATA_PATH",
    ]  # fmt: skip


def to_megatron_script(model: ModelSpec, plan: Plan, target: ExportTarget, launch: Launch | None = None) -> str:
    """The launch script: torchrun over the nodes, `pretrain_gpt.py` with the network, the plan and the launch
    arguments."""
    launch = launch or launch_for(plan)
    args, notes = _megatron(model, plan, target.release)
    lines = [
        "#!/usr/bin/env bash",
        f"# Megatron-LM (core {target.release}) launch written by shardscope: {model.name} on {launch.nodes} x "
        f"{launch.gpus_per_node} GPUs, from a Megatron-LM checkout",
        *[f"# note: {n}" for n in notes],
        *([EVERY_NODE] if launch.nodes > 1 else []),
        "set -euo pipefail",
        f"# {FILL_IN}: data path",
        fill_in("DATA_PATH", "data path (a Megatron indexed dataset prefix)"),
        f"# {FILL_IN}: lr schedule",
        fill_in("LR", "lr schedule: peak learning rate"),
        fill_in("MIN_LR", "lr schedule: final learning rate"),
        fill_in("LR_DECAY_STYLE", "lr schedule: constant, linear, cosine or WSD"),
        fill_in("LR_WARMUP_ITERS", "lr schedule: warmup iterations"),
        *([fill_in("TRAIN_ITERS", "training iterations (shardscope plan --tokens computes them)")]
          if launch.steps is None else []),
        shell_command(torchrun(launch), ["pretrain_gpt.py"], args, megatron_launch_args(launch)),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def layer_pattern(flags: list[int]) -> str:
    """A per-layer 0/1 list as the Python expression Megatron-LM evaluates (`--moe-layer-freq`,
    `--window-attn-skip-freq`): runs (`([0]*3+[1]*58)`) or a repeated period (`([0,1]*24)`)."""
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    if len(runs) <= 3:
        return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"
    for period in range(2, len(flags) // 2 + 1):
        if len(flags) % period == 0 and flags == flags[:period] * (len(flags) // period):
            return f"([{','.join(map(str, flags[:period]))}]*{len(flags) // period})"
    return f"[{','.join(map(str, flags))}]"


def _megatron_router(model: ModelSpec) -> tuple[list[str], list[str]]:
    """MoE layers as Megatron-Core builds them (TransformerConfig `moe_*` fields; `--moe-layer-freq` is a
    per-layer list, 1 = MoE). Softmax routers that renormalise the top k are top-k-then-softmax (the
    default); without renormalisation, softmax over all experts first (`--moe-router-pre-softmax`)."""
    moe = model.moe
    assert moe is not None
    args = ["--num-experts", str(moe.experts), "--moe-router-topk", str(moe.top_k)]
    args += ["--moe-ffn-hidden-size", str(moe.expert_ffn), "--moe-grouped-gemm"]
    args += ["--moe-layer-freq", layer_pattern([int(model.is_moe_layer(i)) for i in range(model.layers)])]
    if moe.shared_experts:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_ffn)]
    notes = []
    if moe.score == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
        if moe.top_k > 1 and not moe.normalize_top_k:
            notes.append(
                "the sigmoid router's top-k weights are not renormalised in the checkpoint; Megatron-Core does"
            )
    elif not moe.normalize_top_k:
        args.append("--moe-router-pre-softmax")
    if moe.routed_scaling != 1.0:
        args += ["--moe-router-topk-scaling-factor", f"{moe.routed_scaling:g}"]
    if moe.groups > 1:
        args += ["--moe-router-num-groups", str(moe.groups), "--moe-router-group-topk", str(moe.groups_per_token)]
    if moe.score_correction_bias:
        args.append("--moe-router-enable-expert-bias")
    return args, notes


def _megatron_attention(model: ModelSpec) -> tuple[list[str], list[str]]:
    """Attention as Megatron-Core builds it: GQA, MLA (its latent norms are `--qk-layernorm`), TE-style
    windows `(left, 0)` that count the query itself, so an HF `sliding_window` of W is `(W-1, 0)` (as
    Megatron-Bridge's GPT-OSS bridge sets it), learned softmax sinks."""
    args: list[str] = []
    notes: list[str] = []
    if model.mla:
        a = model.mla
        args.append("--multi-latent-attention")
        args += ["--q-lora-rank", str(a.q_lora_rank)] if a.q_lora_rank else []
        args += ["--kv-lora-rank", str(a.kv_lora_rank), "--qk-head-dim", str(a.qk_nope_head_dim)]
        args += ["--qk-pos-emb-head-dim", str(a.qk_rope_head_dim), "--v-head-dim", str(a.v_head_dim)]
    else:
        args += ["--kv-channels", str(model.head_dim)]
        if model.kv_heads != model.heads:
            args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.qk_norm or model.mla:
        args.append("--qk-layernorm")
    windowed = [kind.attention == "window" for kind in model.layer_kinds()]
    if any(windowed):
        args += ["--window-size", f"({model.attention_window - 1},0)"]
        if not all(windowed):
            args += ["--window-attn-skip-freq", layer_pattern([int(w) for w in windowed])]
    if "chunk" in model.attention_pattern:  # Llama 4: the global-attention layers are the NoPE ones
        args += ["--no-rope-freq", layer_pattern([int(k == "full") for k in model.attention_pattern])]
        notes.append(f"chunked attention ({model.attention_window} tokens) has no Megatron-LM argument")
    if model.sinks:
        args += ["--softmax-type", "learnable"]
    return args, notes


def _megatron_position(model: ModelSpec) -> list[str]:
    """RoPE base and scaling: Llama 3.1's (`--use-rope-scaling`), YaRN (MLA's own arguments, otherwise
    `--position-embedding-type yarn`)."""
    if model.position == "learned":
        return ["--position-embedding-type", "learned_absolute"]
    if model.position != "rope":
        return ["--position-embedding-type", "none"]
    scaling, kind = dict(model.rope_scaling), model.rope_type
    yarn_rope = kind == "yarn" and not model.mla  # MLA keeps rope: its attention applies YaRN itself
    args = ["--position-embedding-type", "yarn" if yarn_rope else "rope"]
    args += ["--rotary-base", str(round(model.rope_theta))]  # an int flag
    if kind == "llama3":
        args += ["--use-rope-scaling", "--rope-scaling-factor", f"{float(scaling['factor']):g}"]
    elif kind == "yarn":
        args += ["--rotary-scaling-factor", f"{float(scaling['factor']):g}"]
        for key, flag in (("mscale", "--mscale"), ("mscale_all_dim", "--mscale-all-dim")):
            args += [flag, f"{float(scaling[key]):g}"] if key in scaling else []
        if yarn_rope:
            for key, flag in (
                ("original_max_position_embeddings", "--yarn-original-max-position-embeddings"),
                ("beta_fast", "--yarn-beta-fast"),
                ("beta_slow", "--yarn-beta-slow"),
            ):
                args += [flag, f"{scaling[key]:g}"] if key in scaling else []
            args += ["--no-yarn-correction-range-round-to-int"] if scaling.get("truncate") is False else []
    return args


def megatron_model_args(model: ModelSpec, plan: Plan) -> tuple[list[str], list[str]]:
    """The network as Megatron-LM's `pretrain_gpt.py` arguments, and what they cannot express."""
    notes: list[str] = []
    args = ["--num-layers", str(model.layers), "--hidden-size", str(model.hidden)]
    args += ["--ffn-hidden-size", str(model.ffn_hidden), "--num-attention-heads", str(model.heads)]
    args += ["--max-position-embeddings", str(max(plan.seq_len, model.pos_embedding_rows))]
    args += ["--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"]
    args += ["--norm-epsilon", f"{model.norm_eps:g}"]
    if model.mlp == "swiglu" and model.glu_gate == "silu":
        args.append("--swiglu")
    elif model.mlp == "swiglu":  # GPT-OSS: (up + 1) * gate * sigmoid(1.702 gate), clamped
        args += ["--quick-geglu", "--glu-linear-offset", "1.0"]
        args += ["--activation-func-clamp-value", f"{model.glu_clamp:g}"] if model.glu_clamp else []
    if not (model.qkv_bias or model.out_bias or model.mlp_bias):
        args.append("--disable-bias-linear")
    elif model.qkv_bias and not (model.out_bias or model.mlp_bias):
        args += ["--disable-bias-linear", "--add-qkv-bias"]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args += _megatron_position(model)
    attn, attn_notes = _megatron_attention(model)
    args += attn
    notes += attn_notes
    if model.moe:
        router, router_notes = _megatron_router(model)
        args += router
        notes += router_notes
    if model.dit is not None:  # no tokenizer or vocabulary: the text encoder is frozen and outside
        notes.append("a video DiT is not a pretrain_gpt.py model: launch it with Megatron-Bridge / DFM's DiT recipes")
        return args, notes
    repo = hf_repo(model)
    if repo:
        args += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", repo]
    if model.vocab % plan.tp:
        notes.append(f"vocabulary {model.vocab} does not split over TP {plan.tp}: Megatron-LM pads it")
    else:
        args += ["--padded-vocab-size", str(model.vocab)]
    return args, notes


def to_megatron(model: ModelSpec, plan: Plan, release: str = DEFAULT_RELEASE) -> list[str]:
    """Megatron-LM (pretrain_gpt.py) command-line arguments of the network and the plan."""
    return _megatron(model, plan, release)[0]


def _megatron(model: ModelSpec, plan: Plan, release: str = DEFAULT_RELEASE) -> tuple[list[str], list[str]]:
    """The network's arguments, then the plan's, as Megatron-Core `release` spells them; and the notes on what
    they cannot express."""
    args, notes = megatron_model_args(model, plan)
    args += [
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
    if plan.vpp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
    mtp_layers = model.mtp_layers if plan.mtp else 0
    if plan.pp_layout:
        args += ["--pipeline-model-parallel-layout", format_pp_layout(plan.pp_layout, mtp_layers, plan.mtp_chunk)]
    if mtp_layers:
        args += ["--mtp-num-layers", str(mtp_layers)]
    if plan.cp > 1:
        args += ["--cp-comm-type", "p2p" if plan.cp_kind == "ring" else "a2a"]
    if plan.ep > 1 or plan.etp > 1 or (model.moe is not None and plan.tp > 1):  # unset, Megatron's ETP is the TP
        args += ["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", str(plan.etp)]
    if model.moe is not None and plan.capacity_factor > 0:  # token dropping, padded to capacity as priced
        args += ["--moe-expert-capacity-factor", f"{plan.capacity_factor:g}"]
        args += ["--moe-pad-expert-input-to-capacity"] if plan.pad_to_capacity else []
    if model.moe is not None:  # the dispatcher the estimate priced
        flex = plan.ep_dispatch != "flat"
        args += ["--moe-token-dispatcher-type", "flex" if flex else "alltoall"]
        if flex and release_key(release) < release_key("0.16"):  # before core 0.16 the flex backend was DeepEP
            args.append("--moe-enable-deepep")
        elif flex:
            args += ["--moe-flex-dispatcher-backend", plan.ep_dispatch]
        args += ["--moe-router-padding-for-quantization"] if plan.moe_router_padding else []
        args += ["--enable-experimental"] if plan.ep_dispatch == "deepep" and plan.deepep_fused_routing_map else []
        if plan.fused_expert_mlp:
            args.append("--use-transformer-engine-op-fuser")
            notes.append("set NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in the environment: the fused expert MLP needs it")
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
    if plan.shard_group and plan.shard_size < plan.dp * plan.cp:  # HSDP: state sharded in groups, replicated across
        args += ["--num-distributed-optimizer-instances", str(plan.dp * plan.cp // plan.shard_size)]
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
        else:
            notes.append(
                "the plan priced op-level selective recompute (norms, activations, RoPE); by default Megatron-LM "
                "recomputes core_attn only: choose the modules with: shardscope budget --knob modules"
            )
    args.append("--fp16" if plan.precision == "fp16" else "--bf16")
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
    return args, notes
