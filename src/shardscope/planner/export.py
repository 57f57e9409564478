"""Write a plan as a launchable config: torchtitan job TOML, Megatron-LM arguments, DeepSpeed JSON.

Field names are the frameworks' own (torchtitan `JobConfig` sections, Megatron-LM `arguments.py`, the
DeepSpeed config schema). Where a framework cannot express part of a plan (torchtitan has no ZeRO-1,
DeepSpeed no context parallelism) the export says so in a comment / `_shardscope_notes`.
"""

from __future__ import annotations

import json
import shlex

from shardscope.models.catalog import catalog_sources
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


# torchtitan v0.2.2 (the last release configured by TOML): the model directory and ModelArgs flavor
# of a catalog model, where torchtitan ships one of the same shape (validation/torchtitan_flavors.yaml).
TORCHTITAN_FLAVORS = {
    "llama3.1-8b": ("llama3", "8B"),
    "llama3.1-70b": ("llama3", "70B"),
    "llama3.1-405b": ("llama3", "405B"),
    "qwen3-8b": ("qwen3", "8B"),
    "qwen3-32b": ("qwen3", "32B"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
    "deepseek-v2-lite": ("deepseek_v3", "16B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
    "gpt-oss-20b": ("gpt_oss", "20b"),
    "gpt-oss-120b": ("gpt_oss", "120b"),
    "llama4-scout": ("llama4", "17bx16e_irope"),
    "llama4-maverick": ("llama4", "17bx128e_irope"),
}


def _titan_quantize(model: ModelSpec, plan: Plan) -> tuple[list[str], list[str], list[str]]:
    """torchao converters (registered names, torchtitan `components/quantization`) and their sections:
    per-tensor FP8 or MXFP8 on the linears, and on the experts' grouped GEMMs for MoE."""
    if plan.precision != "fp8":
        return [], [], []
    notes = []
    if plan.fp8_recipe == "mxfp8":
        converters = ["quantize.linear.mx"] + (["quantize.grouped_mm.mx"] if model.moe else [])
        lines = ["[quantize.linear.mx]", 'recipe_name = "mxfp8_cublas"']
        lines += ["", "[quantize.grouped_mm.mx]", 'fqns = ["experts"]'] if model.moe else []
        return converters, lines, notes
    if plan.fp8_recipe in ("delayed", "blockwise"):
        notes.append(f"torchao has no {plan.fp8_recipe} FP8 recipe in torchtitan: rowwise scaling stands in")
    recipe = "tensorwise" if plan.fp8_recipe == "tensorwise" else "rowwise"
    converters = ["quantize.linear.float8"] + (["quantize.grouped_mm.float8"] if model.moe else [])
    lines = [
        "[quantize.linear.float8]",
        f'recipe_name = "{recipe}"',
        f"enable_fsdp_float8_all_gather = {'true' if plan.fp8_all_gather and recipe == 'tensorwise' else 'false'}",
        'filter_fqns = ["output"]',
    ]
    lines += ["", "[quantize.grouped_mm.float8]", 'fqns = ["experts"]'] if model.moe else []
    return converters, lines, notes


def to_torchtitan(model: ModelSpec, plan: Plan) -> str:
    """torchtitan v0.2.2 job TOML. Batches follow its train.py: without PP `local_batch_size` is one
    forward's batch and gradient accumulation is global / (local x DP); with PP it is the batch one
    pipeline schedule runs, split into micro-batches of `pipeline_parallel_microbatch_size`."""
    # world = dp_replicate · dp_shard · cp · tp · pp, FSDP sharding over dp_shard · cp
    if plan.fsdp or plan.zero >= 1:
        shard = max(plan.shard_size // plan.cp, 1)
        replicate = plan.dp // shard
    else:
        shard, replicate = 1, plan.dp
    notes = []
    if plan.zero in (1, 2) and not plan.fsdp:
        notes.append(f"ZeRO-{plan.zero} has no torchtitan equivalent: FSDP2 full sharding over the same ranks")
    notes += _moments_note(plan, "torchtitan")
    if plan.main_grads == "bf16":
        notes.append("torchtitan reduces gradients in float32 (`mixed_precision_reduce`); the plan priced bf16")
    name, flavor = TORCHTITAN_FLAVORS.get(model.name, (model.name, ""))
    if not flavor:
        notes.append(f"torchtitan v0.2.2 has no flavor of {model.name}: register its ModelArgs under this name")
    repo = hf_repo(model)
    converters, quantize, quantize_notes = _titan_quantize(model, plan)
    notes += quantize_notes
    if model.moe and plan.ep_dispatch == "hybridep":
        notes.append(
            "torchtitan has no HybridEP backend: DeepEP stands in, slower than the plan priced where its EP "
            "group holds more than 8 GPUs of one NVLink domain (DeepEP past its NVLink peers)"
        )
    if plan.recompute == "selective":
        notes.append(
            "torchtitan's selective AC is op-level (its policy keeps some matmul outputs), not the Megatron-style "
            "selective recompute priced: check its activation memory"
        )
    reshard = "never" if (plan.fsdp and not plan.reshard_after_forward) else "default"
    local_batch = plan.micro_batch * plan.grad_accum if plan.pp > 1 else plan.micro_batch
    lines = [
        "# torchtitan (v0.2.2) job config written by shardscope",
        *[f"# note: {n}" for n in notes],
        *([f"# tokenizer: python scripts/download_hf_assets.py --repo_id {repo} --assets tokenizer"] if repo else []),
        "[job]",
        'dump_folder = "./outputs"',
        f'description = "{model.name}: shardscope plan"',
        "",
        "[model]",
        f'name = "{name}"',
        *([f'flavor = "{flavor}"'] if flavor else []),
        *([f'hf_assets_path = "./assets/hf/{repo.split("/")[-1]}"'] if repo else []),
        *([f"converters = {json.dumps(converters)}"] if converters else []),
        "",
        "[training]",
        f"local_batch_size = {local_batch}",
        f"global_batch_size = {plan.global_batch}",
        f"seq_len = {plan.seq_len}",
        'mixed_precision_param = "bfloat16"',
        'mixed_precision_reduce = "float32"',
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{reshard}"',
        f"tensor_parallel_degree = {plan.tp}",
        f"enable_async_tensor_parallel = {'true' if plan.tp_comm_overlap and plan.tp > 1 else 'false'}",
        f"pipeline_parallel_degree = {plan.pp}",
        f'pipeline_parallel_schedule = "{"Interleaved1F1B" if plan.vpp > 1 else "1F1B"}"',
        f"pipeline_parallel_microbatch_size = {plan.micro_batch}",
        *(
            [f"pipeline_parallel_layers_per_stage = {model.layers // (plan.pp * plan.vpp)}"]
            if plan.pp > 1 and model.layers % (plan.pp * plan.vpp) == 0
            else []
        ),
        f"context_parallel_degree = {plan.cp}",
        f"expert_parallel_degree = {plan.ep}",
        f"expert_tensor_parallel_degree = {plan.etp}",
        *(
            [f'expert_parallel_comm_backend = "{"standard" if plan.ep_dispatch == "flat" else "deepep"}"']
            if model.moe and plan.ep > 1
            else []
        ),
        "",
        "[activation_checkpoint]",
        f'mode = "{plan.recompute}"',
        'selective_ac_option = "op"',
    ]
    if quantize:
        lines += ["", *quantize]
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


def hf_repo(model: ModelSpec) -> str | None:
    """The Hugging Face repository of a catalog model (its tokenizer), if it has one."""
    repo = catalog_sources().get(model.name, {}).get("hf_repo")
    return repo if repo and repo != "None" else None


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


def to_megatron(model: ModelSpec, plan: Plan) -> list[str]:
    """Megatron-LM (pretrain_gpt.py) command-line arguments."""
    return _megatron(model, plan)[0]


def _megatron(model: ModelSpec, plan: Plan) -> tuple[list[str], list[str]]:
    """The network's arguments, then the plan's; and the notes on what they cannot express."""
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
    if plan.ep > 1 or plan.etp > 1:
        args += ["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", str(plan.etp)]
    if model.moe is not None and plan.capacity_factor > 0:  # token dropping, padded to capacity as priced
        args += ["--moe-expert-capacity-factor", f"{plan.capacity_factor:g}"]
        args += ["--moe-pad-expert-input-to-capacity"] if plan.pad_to_capacity else []
    if model.moe is not None:  # the dispatcher the estimate priced
        flex = plan.ep_dispatch != "flat"
        args += ["--moe-token-dispatcher-type", "flex" if flex else "alltoall"]
        args += ["--moe-flex-dispatcher-backend", plan.ep_dispatch] if flex else []
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
    return args, notes


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
    if model.moe and plan.ep > 1:
        notes.append(f"expert parallel {plan.ep}: deepspeed.moe.layer.MoE(ep_size={plan.ep}) layers in code")
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
        args, notes = _megatron(model, plan)
        command = " \\\n  ".join(["torchrun pretrain_gpt.py", *_pairs([shlex.quote(a) for a in args])])
        return "".join(f"# note: {n}\n" for n in notes) + command + "\n"
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
