"""torchtitan exports: a v0.2 job TOML (its last TOML release) or a v0.3 launch script.

torchtitan 0.3 is configured in Python: `--module llama3 --config llama3_70b` picks a `config_registry`
function (its model, converters and MoE backend are fixed there: `Trainer.Config.model_spec` is
`tyro.conf.Suppress`ed), and `--section.key value` overrides set the rest, parsed by its `ConfigManager`
(torchtitan/config/manager.py). What neither can express is refused (`CONSTRAINTS`, each row naming the
torchtitan file that decides it), so the search under `--export torchtitan` leaves those plans out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan, chunk_sizes
from shardscope.planner.export.common import (
    EVERY_NODE,
    FILL_IN,
    Constraint,
    Launch,
    fill_in,
    hf_repo,
    launch_for,
    moments_note,
    shell_command,
    torchrun,
)

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


@dataclass(frozen=True, slots=True)
class TitanConfig:
    """A torchtitan 0.3 `config_registry` function (models/<module>/config_registry.py): the GEMM precision
    and FP8 recipe its converters fix (torchao float8 is rowwise only in 0.3: components/quantization/float8.py
    `recipe_name: Literal["rowwise", "rowwise_with_gw_hp"]`; mx.py MXFP8)."""

    module: str
    function: str
    precision: str = "bf16"
    fp8_recipe: str = ""

    @property
    def label(self) -> str:
        return f"{self.module}.{self.function}" + (f" ({self.fp8_recipe} FP8)" if self.precision == "fp8" else "")


# torchtitan 0.3.0's pretraining config functions of the catalog models (the model shapes are checked against
# the specs in tests/test_export_frameworks.py). Qwen3-8B is there only as an SFT recipe and NVFP4 variant,
# Qwen3-235B-A22B and Llama 4 have none.
TORCHTITAN_CONFIGS: dict[str, tuple[TitanConfig, ...]] = {
    "llama3.1-8b": (TitanConfig("llama3", "llama3_8b"), TitanConfig("llama3", "llama3_8b_mxfp8", "fp8", "mxfp8")),
    "llama3.1-70b": (TitanConfig("llama3", "llama3_70b"),),
    "llama3.1-405b": (TitanConfig("llama3", "llama3_405b", "fp8", "rowwise"),),
    "qwen3-32b": (TitanConfig("qwen3", "qwen3_32b"),),
    "qwen3-30b-a3b": (TitanConfig("qwen3", "qwen3_30b_a3b"),),
    "deepseek-v2-lite": (TitanConfig("deepseek_v3", "deepseek_v3_16b"),),
    "deepseek-v3": (
        TitanConfig("deepseek_v3", "deepseek_v3_671b"),
        TitanConfig("deepseek_v3", "deepseek_v3_671b_float8", "fp8", "rowwise"),
    ),
    "gpt-oss-20b": (TitanConfig("gpt_oss", "gpt_oss_20b"),),
    "gpt-oss-120b": (TitanConfig("gpt_oss", "gpt_oss_120b"),),
}
# The model configs of these functions use FlexAttention, not the SDPA kernel the torchtitan stack prices
FLEX_ATTENTION_CONFIGS = ("deepseek_v3_16b", "deepseek_v3_671b", "deepseek_v3_671b_float8")


def titan_config(model: ModelSpec, plan: Plan) -> TitanConfig | None:
    """The torchtitan 0.3 config function that runs `plan`'s model at its precision (and FP8 recipe)."""
    for c in TORCHTITAN_CONFIGS.get(model.name, ()):
        if c.precision == plan.precision and (plan.precision != "fp8" or c.fp8_recipe == plan.fp8_recipe):
            return c
    return None


def _no_config(model: ModelSpec, plan: Plan) -> str:
    have = TORCHTITAN_CONFIGS.get(model.name, ())
    gemms = f"{plan.fp8_recipe} FP8" if plan.precision == "fp8" else plan.precision
    if not have:
        return f"torchtitan 0.3 has no pretraining config of {model.name} (write one, or export torchtitan@0.2)"
    return f"torchtitan 0.3 configs {model.name} only as {', '.join(c.label for c in have)}, not {gemms} GEMMs"


def titan_reshard_policy(plan: Plan) -> str:
    """`parallelism.fsdp_reshard_after_forward` for the plan: torchtitan's "default" reshards without PP
    and keeps the weights gathered with it (`not pp_enabled`), so a pipelined plan priced with resharding
    says "always"."""
    if plan.fsdp and not plan.reshard_after_forward:
        return "never"
    return "always" if plan.fsdp and plan.pp > 1 else "default"


def titan_degrees(plan: Plan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree): torchtitan's world is dp_replicate ·
    dp_shard · cp · tp · pp, FSDP sharding over dp_shard · cp (HSDP: a shard group of `shard_group` ranks)."""
    if plan.fsdp:
        shard = max(plan.shard_size // plan.cp, 1)
        return plan.dp // shard, shard
    return plan.dp, 1


def titan_stage_layers(stages: int, layers: int, first_less: int = 1, last_less: int = 1) -> list[int] | None:
    """Decoder layers per model chunk as torchtitan splits them without an explicit list
    (distributed/pipeline_parallel.py `_generate_llm_fqn_per_model_part`, alike in 0.2 and 0.3): the embedding
    and the output layer count as `first_less` / `last_less` layers, the effective layers split evenly with
    the remainder to the first chunks. None where torchtitan refuses the split or leaves layers out."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    base, extra = divmod(effective, stages)
    if base == 0 or first_less > base or last_less > base:
        return None
    sizes, placed = [], 0
    for s in range(stages):
        n = base + (s < extra) - (first_less if s == 0 else last_less if s == stages - 1 else 0)
        n = max(0, min(n, layers - placed))
        sizes.append(n)
        placed += n
    return sizes if placed == layers else None


def titan_pipeline_split(model: ModelSpec, plan: Plan, output: str = "lm_head") -> dict[str, int | list[list[str]]]:
    """The torchtitan pipeline settings that build exactly the model chunks the plan priced (`chunk_sizes`:
    the pp·vpp chunks, extra layers to the middle ones): `pipeline_parallel_layers_per_stage` with the first
    and last stages' layer allowances where torchtitan's own split reproduces them (Llama 3.1 405B's 126
    layers on 32 chunks: 4 per chunk, embedding and output counted as one layer each), else the modules of
    each chunk by name (`module_fqns_per_model_part`). Without layers per stage torchtitan falls back to two
    chunks per rank for looped schedules, so it is always written. `output`: the output layer's module name
    (`output` in 0.2, `lm_head` in 0.3)."""
    stages = plan.pp * plan.vpp
    want = chunk_sizes(stages, model.layers, plan.pp_layout)
    # the embedding and output counted as one layer each (torchtitan's defaults) first, then other allowances
    allowances = sorted(((f, la) for f in range(4) for la in range(4)), key=lambda fl: fl != (1, 1))
    for first, last in allowances:
        if titan_stage_layers(stages, model.layers, first, last) != want:
            continue
        effective = model.layers + first + last
        per_stage = next((n for n in range(1, effective + 1) if -(-effective // n) == stages), None)
        if per_stage is not None:
            return {
                "pipeline_parallel_first_stage_less_layers": first,
                "pipeline_parallel_last_stage_less_layers": last,
                "pipeline_parallel_layers_per_stage": per_stage,
            }
    return {"module_fqns_per_model_part": _fqns(want, output)}


def _fqns(sizes: list[int], output: str = "lm_head") -> list[list[str]]:
    """Each chunk's module names: the embedding with the first, the final norm and output layer with the last."""
    parts, start = [], 0
    for c, n in enumerate(sizes):
        names = [f"layers.{i}" for i in range(start, start + n)]
        names = (["tok_embeddings"] if c == 0 else []) + names + (["norm", output] if c == len(sizes) - 1 else [])
        parts.append(names)
        start += n
    return parts


def _ep_overlap_schedule_ok(plan: Plan) -> bool:
    """torchtitan 0.2 overlaps EP all-to-alls with the DualPipeV schedule only: PP with two stages per rank, EP,
    no activation checkpointing (distributed/dual_pipe_v.py `get_dual_pipe_v_flag`)."""
    return plan.pp > 1 and plan.vpp == 2 and plan.ep > 1 and plan.recompute == "none"


def _ep_mesh_ok(plan: Plan, etp: int) -> bool:
    """EP borrows ranks from FSDP and TP: ep · etp divides dp_shard · cp · tp (parallel_dims.py efsdp)."""
    return (titan_degrees(plan)[1] * plan.cp * plan.tp) % (plan.ep * etp) == 0


_V02 = "torchtitan v0.2.2"
_V03 = "torchtitan 0.3.0"
# What torchtitan cannot run, by release ("until 0.3": 0.2 only; "since 0.3": 0.3 on).
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        lambda m, p: m.name not in TORCHTITAN_FLAVORS,
        lambda m, p: f"torchtitan 0.2 has no model flavor of {m.name} (its ModelArgs would be written in code)",
        f"{_V02} torchtitan/models/*/__init__.py flavors",
        until="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: titan_config(m, p) is None,
        _no_config,
        f"{_V03} torchtitan/models/*/config_registry.py; trainer.py Trainer.Config.model_spec is tyro.conf.Suppress",
        since="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.zero > 0 and not p.fsdp,
        lambda m, p: f"ZeRO-{p.zero}: torchtitan shards model state with FSDP2 only (search it with FSDP)",
        "torchtitan models/llama3/infra/parallelize.py apply_fsdp (0.2), models/llama3/parallelize.py (0.3)",
    ),
    Constraint(
        lambda m, p: p.zero == 0 and not p.fsdp and p.dp > 1 and p.tp * p.pp * p.cp * p.ep > 1,
        "DDP with TP/PP/CP/EP: torchtitan 0.2 replicates with DDP only as the sole parallelism",
        f"{_V02} torchtitan/models/llama3/infra/parallelize.py ('DDP has not supported > 1D parallelism')",
        until="0.3",
    ),
    Constraint(
        lambda m, p: bool(p.recompute_modules),
        "Megatron-Core recompute modules: torchtitan recomputes op-level selectively or whole blocks",
        "torchtitan torchtitan/distributed/activation_checkpoint.py",
    ),
    Constraint(
        lambda m, p: p.recompute == "full" and 0 < p.recompute_layers < p.stage_layers(m.layers),
        "full recompute of some layers per stage: torchtitan's full AC wraps every block",
        "torchtitan torchtitan/distributed/activation_checkpoint.py (FullAC / mode full)",
    ),
    Constraint(
        lambda m, p: p.offload_activations > 0,
        "activation offload to host memory: torchtitan has no setting for it",
        "torchtitan torchtitan/distributed/activation_checkpoint.py",
    ),
    Constraint(
        lambda m, p: p.cp > 1 and p.cp_kind != "ring",
        "all-to-all (Ulysses) context parallelism: torchtitan exchanges K/V shards (ring / all-gather)",
        "torchtitan config/job_config.py context_parallel_rotate_method (0.2), distributed/context_parallel/api.py "
        "(0.3)",
    ),
    Constraint(
        lambda m, p: p.tp > 1 and not p.sequence_parallel,
        "TP without sequence parallelism: torchtitan 0.2 always shards the norms' sequence",
        f"{_V02} torchtitan/models/llama3/infra/parallelize.py apply_tp (no switch)",
        until="0.3",
    ),
    Constraint(
        lambda m, p: m.moe is not None and p.capacity_factor > 0,
        "token dropping (capacity factor): torchtitan's MoE is dropless",
        "torchtitan torchtitan/models/moe (0.2), models/common/moe (0.3)",
    ),
    Constraint(
        lambda m, p: p.mtp and m.mtp_layers > 0,
        "MTP modules: torchtitan 0.2 has none; 0.3 sets num_mtp_layers in the model registry, not by override",
        "torchtitan models/deepseek_v3/__init__.py model_registry(num_mtp_layers)",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.precision == "fp16",
        "fp16: torchtitan trains in bfloat16 or float32",
        "torchtitan config training.mixed_precision_param: Literal['bfloat16', 'float32']",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.precision == "fp8" and p.fp8_recipe in ("delayed", "blockwise"),
        lambda m, p: f"{p.fp8_recipe} FP8 scaling: torchtitan's torchao float8 recipes are tensorwise and rowwise",
        f"{_V02} torchtitan/config/job_config.py Float8Linear.recipe_name",
        until="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.fp8_params and p.fp8_recipe != "tensorwise",
        "FP8 all-gather of weights: torchao does it for tensorwise scaling only",
        f"{_V02} torchtitan/config/job_config.py enable_fsdp_float8_all_gather",
        until="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.fp8_params,
        "FP8 all-gather of weights: set in the converters of the model registry, not by override",
        f"{_V03} torchtitan/components/quantization/float8.py",
        since="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.fused_expert_mlp,
        "Transformer Engine's fused grouped expert MLP: torchtitan runs no Transformer Engine",
        "torchtitan torchtitan/models/moe (0.2), models/common/moe (0.3)",
    ),
    Constraint(
        lambda m, p: p.tp_comm_overlap and p.tp > 1 and not p.compile,
        "async TP without torch.compile: torchtitan overlaps TP collectives only in compiled blocks",
        "torchtitan config/job_config.py enable_async_tensor_parallel (0.2), config/configs.py CompileConfig "
        "(0.3: raises)",
    ),
    Constraint(
        lambda m, p: bool(p.cuda_graphs) and p.cuda_graphs != ("full_iteration",),
        "per-layer CUDA graphs (Megatron-Core scopes): torchtitan captures the whole step or nothing",
        f"{_V03} torchtitan/trainer.py training.disable_cuda_graphs",
        uniform=True,
    ),
    Constraint(
        lambda m, p: bool(p.cuda_graphs),
        "CUDA graphs: torchtitan 0.2 trains eagerly",
        f"{_V02} torchtitan/train.py",
        until="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.cuda_graphs == ("full_iteration",) and (p.pp > 1 or p.ep > 1),
        "CUDA graphs with PP, or with EP over an all-to-all that syncs the host: torchtitan 0.3 refuses them",
        f"{_V03} torchtitan/trainer.py Trainer.Config._validate_cuda_graphs",
        since="0.3",
    ),
    Constraint(
        lambda m, p: p.offload_optimizer and not p.fsdp,
        "optimizer offload without FSDP: torchtitan offloads through FSDP2's CPUOffloadPolicy",
        "torchtitan training.enable_cpu_offload, applied in apply_fsdp (models/llama3 parallelize.py)",
    ),
    Constraint(
        lambda m, p: p.fsdp and (not p.overlap_grad_reduce or p.fsdp_prefetch != 1),
        "FSDP without overlapped reduce-scatters or with a prefetch depth other than one: FSDP2's are fixed",
        "torchtitan torchtitan/distributed (fully_shard, implicit prefetch)",
    ),
    Constraint(
        lambda m, p: m.moe is not None and p.ep > 1 and p.ep_dispatch == "hybridep",
        "the HybridEP dispatcher: torchtitan 0.2 has the standard all-to-all and DeepEP",
        f"{_V02} torchtitan/config/job_config.py expert_parallel_comm_backend: Literal['standard', 'deepep']",
        until="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: m.moe is not None and p.ep > 1 and p.ep_dispatch != "flat",
        lambda m, p: f"the {p.ep_dispatch} dispatcher: torchtitan 0.3 sets moe_comm_backend in the model registry",
        f"{_V03} torchtitan/models/*/__init__.py model_registry(moe_comm_backend); no CLI override",
        since="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.ep_comm_overlap and not _ep_overlap_schedule_ok(p),
        "EP all-to-all overlap: torchtitan 0.2 has it only in DualPipeV (PP, 2 stages per rank, EP, no AC)",
        f"{_V02} torchtitan/distributed/dual_pipe_v.py get_dual_pipe_v_flag",
        until="0.3",
    ),
    Constraint(
        lambda m, p: p.ep_comm_overlap,
        "EP all-to-all overlap: torchtitan 0.3 has no setting for it (DualPipeV's overlap is gone)",
        f"{_V03} torchtitan/config/configs.py ParallelismConfig",
        since="0.3",
        uniform=True,
    ),
    Constraint(
        lambda m, p: p.ep > 1 and p.etp not in (1, p.tp),
        "expert TP other than 1 or TP: torchtitan 0.2 supports ETP = TP or ETP = 1",
        f"{_V02} torchtitan/distributed/parallel_dims.py ParallelDims._validate",
        until="0.3",
    ),
    Constraint(
        lambda m, p: p.etp > 1,
        "expert tensor parallelism: torchtitan 0.3 has expert_parallel_degree only",
        f"{_V03} torchtitan/config/configs.py ParallelismConfig",
        since="0.3",
    ),
    Constraint(
        lambda m, p: p.ep > 1 and not _ep_mesh_ok(p, p.etp),
        "EP not carved out of the FSDP-shard x CP x TP ranks (it cannot take replicate ranks in torchtitan)",
        "torchtitan torchtitan/distributed/parallel_dims.py efsdp = dp_shard * cp * tp / (etp * ep)",
    ),
)


def _notes(model: ModelSpec, plan: Plan, release: str) -> list[str]:
    """What the run does differently from the plan but close enough to price alike, said in the export."""
    notes = moments_note(plan, "torchtitan")
    if plan.main_grads == "bf16":
        notes.append("torchtitan reduces gradients in float32 (`mixed_precision_reduce`); the plan priced bf16")
    if plan.recompute == "selective":
        notes.append(
            "torchtitan's selective AC is op-level (its policy keeps some matmul outputs), not the Megatron-style "
            "selective recompute priced: check its activation memory"
        )
    if plan.ep_comm_overlap:
        notes.append("EP all-to-alls overlap under the DualPipeV schedule, which the plan prices as interleaved 1F1B")
    if release == "0.3" and (c := titan_config(model, plan)) and c.function in FLEX_ATTENTION_CONFIGS:
        notes.append(f"{c.function} runs FlexAttention, not the SDPA kernel priced")
    return notes


def _titan_quantize(model: ModelSpec, plan: Plan) -> tuple[list[str], list[str]]:
    """torchao converters (registered names, torchtitan 0.2 `components/quantization`) and their sections:
    per-tensor or per-row FP8, or MXFP8, on the linears, and on the experts' grouped GEMMs for MoE."""
    if plan.precision != "fp8":
        return [], []
    if plan.fp8_recipe == "mxfp8":
        converters = ["quantize.linear.mx"] + (["quantize.grouped_mm.mx"] if model.moe else [])
        lines = ["[quantize.linear.mx]", 'recipe_name = "mxfp8_cublas"']
        lines += ["", "[quantize.grouped_mm.mx]", 'fqns = ["experts"]'] if model.moe else []
        return converters, lines
    converters = ["quantize.linear.float8"] + (["quantize.grouped_mm.float8"] if model.moe else [])
    lines = [
        "[quantize.linear.float8]",
        f'recipe_name = "{plan.fp8_recipe}"',
        f"enable_fsdp_float8_all_gather = {'true' if plan.fp8_params else 'false'}",
        'filter_fqns = ["output"]',
    ]
    lines += ["", "[quantize.grouped_mm.float8]", 'fqns = ["experts"]'] if model.moe else []
    return converters, lines


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def to_torchtitan_toml(model: ModelSpec, plan: Plan, launch: Launch | None = None) -> str:
    """torchtitan v0.2.2 job TOML. Batches follow its train.py: without PP `local_batch_size` is one
    forward's batch and gradient accumulation is global / (local x DP); with PP it is the batch one
    pipeline schedule runs, split into micro-batches of `pipeline_parallel_microbatch_size`. The launch
    (nodes, processes per node) is the comment above; steps, the learning-rate schedule and the data path
    are set, or FILL IN placeholders that stop torchtitan until they are filled."""
    launch = launch or launch_for(plan)
    replicate, shard = titan_degrees(plan)
    name, flavor = TORCHTITAN_FLAVORS[model.name]
    repo = hf_repo(model)
    converters, quantize = _titan_quantize(model, plan)
    reshard = titan_reshard_policy(plan)
    local_batch = plan.micro_batch * plan.grad_accum if plan.pp > 1 else plan.micro_batch
    pipeline: dict[str, object] = {}
    if plan.pp > 1:
        schedule = "Interleaved1F1B" if plan.vpp > 1 else "1F1B"
        if plan.ep_comm_overlap:
            schedule = "DualPipeV"
        pipeline = {"pipeline_parallel_schedule": schedule, "pipeline_parallel_microbatch_size": plan.micro_batch}
        pipeline |= titan_pipeline_split(model, plan, output="output")
    compile_on = plan.compile or plan.fused_cross_entropy
    components = ["model", "loss"] if plan.compile else ["loss"]
    steps = launch.steps if launch.steps is not None else f"{FILL_IN}: training steps"
    command = [*torchrun(launch), "-m", "torchtitan.train", "--job.config_file", "job.toml"]
    lines = [
        "# torchtitan (v0.2.2) job config written by shardscope",
        *[f"# note: {n}" for n in _notes(model, plan, "0.2")],
        *([f"# tokenizer: python scripts/download_hf_assets.py --repo_id {repo} --assets tokenizer"] if repo else []),
        f"# launch ({launch.nodes} x {launch.gpus_per_node} GPUs; NODE_RANK, MASTER_ADDR set on each node): "
        + " ".join(command),
        f"# {FILL_IN}: lr schedule (optimizer.lr, lr_scheduler) and data path (training.dataset_path) below",
        "[job]",
        'dump_folder = "./outputs"',
        f'description = "{model.name}: shardscope plan"',
        "",
        "[model]",
        f'name = "{name}"',
        f'flavor = "{flavor}"',
        *([f'hf_assets_path = "./assets/hf/{repo.split("/")[-1]}"'] if repo else []),
        *([f"converters = {json.dumps(converters)}"] if converters else []),
        "",
        "[optimizer]",
        f'lr = "{FILL_IN}: lr schedule: peak learning rate"',
        "",
        "[lr_scheduler]",
        f'warmup_steps = "{FILL_IN}: lr schedule: warmup steps"',
        f'min_lr_factor = "{FILL_IN}: lr schedule: final learning rate / peak"',
        "",
        "[training]",
        f"local_batch_size = {local_batch}",
        f"global_batch_size = {plan.global_batch}",
        f"seq_len = {plan.seq_len}",
        f"steps = {_toml_value(steps)}",
        f'dataset_path = "{FILL_IN}: data path"',
        'mixed_precision_param = "bfloat16"',
        'mixed_precision_reduce = "float32"',
        f"enable_cpu_offload = {_toml_value(plan.offload_optimizer)}",
        "",
        "[compile]",
        f"enable = {_toml_value(compile_on)}",
        f"components = {json.dumps(components)}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{reshard}"',
        f"tensor_parallel_degree = {plan.tp}",
        f"enable_async_tensor_parallel = {_toml_value(plan.tp_comm_overlap and plan.tp > 1)}",
        f"pipeline_parallel_degree = {plan.pp}",
        *[f"{k} = {_toml_value(v)}" for k, v in pipeline.items()],
        *(["pipeline_parallel_expert_parallel_overlap = true"] if plan.ep_comm_overlap else []),
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


def _flag(name: str, on: bool) -> str:
    """A tyro boolean flag: `--section.key` or `--section.no-key` (torchtitan's ConfigManager parses with tyro)."""
    section, _, key = name.rpartition(".")
    return f"--{name}" if on else f"--{section}.no-{key.replace('_', '-')}"


def torchtitan_args(model: ModelSpec, plan: Plan, launch: Launch | None = None) -> tuple[list[str], list[str]]:
    """torchtitan 0.3's arguments for `plan` (what `ConfigManager.parse_args` reads), and the notes on what
    the run does differently. `$NAME` arguments are the placeholders the launch script fills (`$TRAIN_STEPS`
    only where the launch has no step count)."""
    launch = launch or launch_for(plan)
    config = titan_config(model, plan)
    assert config is not None, "refused by CONSTRAINTS"
    replicate, shard = titan_degrees(plan)
    reshard = titan_reshard_policy(plan)
    local_batch = plan.micro_batch * plan.grad_accum if plan.pp > 1 else plan.micro_batch
    args = ["--module", config.module, "--config", config.function]
    repo = hf_repo(model)
    if repo:
        args += ["--hf_assets_path", f"./assets/hf/{repo.split('/')[-1]}"]
    args += [
        "--training.local_batch_size", str(local_batch),
        "--training.global_batch_size", str(plan.global_batch),
        "--training.seq_len", str(plan.seq_len),
        "--training.steps", str(launch.steps) if launch.steps is not None else "$TRAIN_STEPS",
        "--training.mixed_precision_param", "bfloat16",
        _flag("training.enable_cpu_offload", plan.offload_optimizer),
        # the whole step runs CUDA-graphed unless disabled (trainer.py): only where the plan priced that
        _flag("training.disable_cuda_graphs", plan.cuda_graphs != ("full_iteration",)),
        "--dataloader.dataset_path", "$DATA_PATH",
        "--optimizer.param_groups.0.optimizer_kwargs.lr", "$LR",
        "--lr_scheduler.warmup_steps", "$LR_WARMUP_STEPS",
        "--lr_scheduler.min_lr_factor", "$LR_MIN_FACTOR",
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.fsdp_reshard_after_forward", reshard,
        "--parallelism.tensor_parallel_degree", str(plan.tp),
        _flag("parallelism.enable_sequence_parallel", plan.sequence_parallel),
        "--parallelism.context_parallel_degree", str(plan.cp),
        "--parallelism.expert_parallel_degree", str(plan.ep),
        "--parallelism.pipeline_parallel_degree", str(plan.pp),
    ]  # fmt: skip
    if plan.pp > 1:
        args += ["--parallelism.pipeline_parallel_schedule", "Interleaved1F1B" if plan.vpp > 1 else "1F1B"]
        args += ["--parallelism.pipeline_parallel_microbatch_size", str(plan.micro_batch)]
        for key, value in titan_pipeline_split(model, plan).items():
            args.append(f"--parallelism.{key}")
            args += [",".join(part) for part in value] if isinstance(value, list) else [str(value)]
    # per-block torch.compile of model and loss; the loss alone compiled is what stands for a fused cross-entropy
    if plan.compile or plan.fused_cross_entropy:
        args += ["--compile.enable", "--compile.components", "model,loss" if plan.compile else "loss"]
    else:
        args.append(_flag("compile.enable", False))
    args.append(_flag("compile.enable_async_tensor_parallel", plan.tp_comm_overlap and plan.tp > 1))
    # the activation-checkpointing policy is a tyro subcommand, after every option
    args.append(f"activation-checkpoint:{plan.recompute}")
    return args, _notes(model, plan, "0.3")


def to_torchtitan_script(model: ModelSpec, plan: Plan, launch: Launch | None = None) -> str:
    """torchtitan 0.3 launch script: torchrun on every node, `-m torchtitan.train` with the config function and
    the overrides of `torchtitan_args`; the data path and the learning-rate schedule (and the steps, where no
    token budget was given) are shell placeholders that stop the launch until filled."""
    launch = launch or launch_for(plan)
    args, notes = torchtitan_args(model, plan, launch)
    repo = hf_repo(model)
    lines = [
        "#!/usr/bin/env bash",
        f"# torchtitan 0.3 launch written by shardscope: {model.name} on {launch.nodes} x {launch.gpus_per_node} GPUs",
        *[f"# note: {n}" for n in notes],
        *([f"# tokenizer: python scripts/download_hf_assets.py --repo_id {repo} --assets tokenizer"] if repo else []),
        *([EVERY_NODE] if launch.nodes > 1 else []),
        "set -euo pipefail",
        f"# {FILL_IN}: data path",
        fill_in("DATA_PATH", "data path (a local copy of the dataset of the config)"),
        f"# {FILL_IN}: lr schedule",
        fill_in("LR", "lr schedule: peak learning rate"),
        fill_in("LR_WARMUP_STEPS", "lr schedule: warmup steps"),
        fill_in("LR_MIN_FACTOR", "lr schedule: final learning rate / peak"),
        *([fill_in("TRAIN_STEPS", "training steps (shardscope plan --tokens computes them)")]
          if launch.steps is None else []),
        shell_command(torchrun(launch), ["-m", "torchtitan.train"], args[:-1], args[-1:]),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"
