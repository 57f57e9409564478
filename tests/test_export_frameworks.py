"""Every export parses in the framework's own loader, and the layout, schedule, recompute, sharding and
overlap settings that were priced read back from the parsed config: torchtitan 0.3's `ConfigManager`,
DeepSpeed's `DeepSpeedConfig`, and for Megatron-LM (whose parser, `megatron/training/arguments.py`, ships in
no wheel) megatron-core's own config dataclasses built from the exported arguments as Megatron-LM builds them.

The frameworks are the `export-check` extra (in `test`); without them these tests skip.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import types
from pathlib import Path

import pytest

from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.plan.plan import chunk_sizes, make_plan
from shardscope.planner.export import (
    FILL_IN,
    TORCHTITAN_CONFIGS,
    export,
    launch_for,
    titan_degrees,
    zero_stage,
)

TOKENS = 2e12
# Values for the placeholders a user fills in (the launch scripts read them from the environment)
FILLED = {
    "$DATA_PATH": "/data/corpus",
    "$LR": "0.0003",
    "$LR_WARMUP_STEPS": "200",
    "$LR_MIN_FACTOR": "0.1",
    "$TRAIN_STEPS": "1000",
    "$MIN_LR": "0.00003",
    "$LR_DECAY_STYLE": "cosine",
    "$LR_WARMUP_ITERS": "200",
    "$TRAIN_ITERS": "1000",
    "$NODE_RANK": "0",
    "$MASTER_ADDR:29500": "node0:29500",
}


def _plan(name: str, gpus: int, **kw):
    m = load_model(name)
    kw.setdefault("seq_len", 4096)
    return m, make_plan(m, make_cluster(kw.pop("gpu", "H100"), gpus), **kw)


def script_argv(text: str) -> list[str]:
    """The launch command of an export script as the shell splits it, placeholders filled; every `$NAME`
    it uses is defined above it by a line that stops the launch unless the user fills it in."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    body = body.replace("\\\n", " ")
    command = next(line for line in body.splitlines() if line.startswith("torchrun"))
    words = shlex.split(command)
    for w in words:
        name = w.lstrip("$").split(":")[0]
        if w.startswith("$") and name not in ("NODE_RANK", "MASTER_ADDR"):
            assert f'{name}="${{{name}:?{FILL_IN}: ' in text, name
    return [FILLED.get(w, w) for w in words]


def _launcher(argv: list[str]) -> tuple[int, int]:
    return int(argv[argv.index("--nnodes") + 1]), int(argv[argv.index("--nproc_per_node") + 1])


# ---------------------------------------------------------------- torchtitan 0.3: ConfigManager

TITAN_CASES = {
    "70b-tp8-pp4-vpp2-fsdp-full": ("llama3.1-70b", 256, dict(tp=8, pp=4, vpp=2, fsdp=True, recompute="full")),
    "8b-hsdp-selective-offload": (
        "llama3.1-8b",
        64,
        dict(fsdp=True, shard_group=8, recompute="selective", offload_optimizer=True, micro_batch=2),
    ),
    "8b-fsdp-noreshard-cp2-asynctp": (
        "llama3.1-8b",
        64,
        dict(tp=2, cp=2, fsdp=True, reshard_after_forward=False, tp_comm_overlap=True, compile=True),
    ),
    "qwen3-30b-a3b-ep8-pp2": ("qwen3-30b-a3b", 64, dict(pp=2, fsdp=True, ep=8, recompute="full")),
    "deepseek-v2-lite-ep4-fused-loss": ("deepseek-v2-lite", 16, dict(fsdp=True, ep=4, fused_cross_entropy=True)),
}


def _titan_parse(args: list[str], monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("triton")  # torchtitan 0.3 imports it (its minimal_async_ep kernels), on CPU too
    manager = pytest.importorskip("torchtitan.config.manager")
    # the float8 converters refuse to build without an SM89+ GPU; the configs are what is checked here
    float8 = pytest.importorskip("torchtitan.components.quantization.float8")
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    return manager.ConfigManager().parse_args(args)


def _titan_stage_layers(cfg) -> list[int]:
    """Decoder layers of each model chunk torchtitan builds from the parsed config (its own functions)."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata

    par = cfg.parallelism
    pp = types.SimpleNamespace(pp=par.pipeline_parallel_degree)
    stages, layers, first, last = _get_pipeline_metadata(pp, par, cfg.model_spec.model)
    parts = par.module_fqns_per_model_part or _generate_llm_fqn_per_model_part(stages, layers, first, last)
    return [sum(name.startswith("layers.") for name in part) for part in parts]


def _check_titan(cfg, argv: list[str], m, plan, launch) -> None:
    """Every priced setting read back from torchtitan's parsed config."""
    par, training = cfg.parallelism, cfg.training
    replicate, shard = par.data_parallel_replicate_degree, par.data_parallel_shard_degree
    # layout: the launcher's world is torchtitan's mesh
    nodes, per_node = _launcher(argv)
    assert nodes * per_node == replicate * shard * par.context_parallel_degree * par.tensor_parallel_degree * (
        par.pipeline_parallel_degree
    )
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (plan.tp, plan.pp)
    assert (par.context_parallel_degree, par.expert_parallel_degree) == (plan.cp, plan.ep)
    assert replicate * shard == plan.dp and par.enable_sequence_parallel == plan.sequence_parallel
    # schedule: the model chunks torchtitan builds are those priced
    if plan.pp > 1:
        from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

        looped = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleMulti)
        assert looped == (plan.vpp > 1)
        assert _titan_stage_layers(cfg) == chunk_sizes(plan.pp * plan.vpp, m.layers, plan.pp_layout)
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch
    # batch: local / global as train.py splits them
    accumulation = training.global_batch_size // (training.local_batch_size * replicate * shard)
    if plan.pp > 1:
        assert training.local_batch_size // par.pipeline_parallel_microbatch_size == plan.grad_accum
    else:
        assert (training.local_batch_size, accumulation) == (plan.micro_batch, plan.grad_accum)
    assert (training.global_batch_size, training.seq_len) == (plan.global_batch, plan.seq_len)
    # recompute
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    ac = {"none": type(None), "selective": SelectiveAC.Config, "full": FullAC.Config}[plan.recompute]
    assert type(cfg.activation_checkpoint) is ac
    # sharding
    assert titan_degrees(plan) == (replicate, shard) and (shard > 1) == (plan.fsdp and plan.shard_size > plan.cp)
    reshard = "never" if plan.fsdp and not plan.reshard_after_forward else "default"
    reshard = "always" if reshard == "default" and plan.fsdp and plan.pp > 1 else reshard  # (default: not pp)
    assert par.fsdp_reshard_after_forward == reshard and training.enable_cpu_offload == plan.offload_optimizer
    # overlap and compile: async TP, the compiled blocks / loss; no CUDA graphs the plan did not price
    compiled = cfg.compile
    assert compiled.enable_async_tensor_parallel == (plan.tp_comm_overlap and plan.tp > 1)
    assert compiled.enable == (plan.compile or plan.fused_cross_entropy)
    assert ("model" in compiled.components and compiled.enable) == plan.compile
    assert training.disable_cuda_graphs
    if m.moe is not None:  # the standard all-to-all dispatcher, no EP overlap
        from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher, LocalTokenDispatcher

        kinds = {type(d) for _, d, _, _ in cfg.model_spec.model.traverse(LocalTokenDispatcher.Config)}
        assert kinds == {AllToAllTokenDispatcher.Config}
    # launch: steps for the tokens, the schedule and data placeholders filled
    assert training.steps == launch.steps
    assert cfg.optimizer.param_groups[0].optimizer_kwargs["lr"] == float(FILLED["$LR"])
    assert cfg.lr_scheduler.warmup_steps == int(FILLED["$LR_WARMUP_STEPS"])
    assert cfg.dataloader.dataset_path == FILLED["$DATA_PATH"]
    assert len(cfg.model_spec.model.layers) == m.layers


@pytest.mark.parametrize("case", sorted(TITAN_CASES))
def test_torchtitan_03_export_parses_in_config_manager(case, monkeypatch):
    name, gpus, kw = TITAN_CASES[case]
    m, plan = _plan(name, gpus, global_batch=256, **kw)
    launch = launch_for(plan, 8, TOKENS)
    argv = script_argv(export("torchtitan@0.3", m, plan, launch))
    assert argv[argv.index("-m") + 1] == "torchtitan.train"
    cfg = _titan_parse(argv[argv.index("-m") + 2 :], monkeypatch)
    _check_titan(cfg, argv, m, plan, launch)


def test_405b_vpp4_exports_layers_per_stage(monkeypatch):
    """Llama 3.1 405B's 126 layers on 8 ranks x 4 virtual stages: the priced chunks (3, 4 x 30, 3) are what
    torchtitan builds from `pipeline_parallel_layers_per_stage = 4`; left out, torchtitan would build two chunks
    per rank. torchtitan 0.3 ships 405B only as float8 rowwise (its llama3_405b config)."""
    import tomllib

    m, plan = _plan("llama3.1-405b", 512, tp=8, pp=8, vpp=4, fsdp=True, precision="fp8", fp8_recipe="rowwise")
    assert chunk_sizes(32, 126) == [3] + [4] * 30 + [3]
    toml = tomllib.loads(export("torchtitan@0.2", m, plan).split("\n", 1)[1])["parallelism"]
    assert toml["pipeline_parallel_layers_per_stage"] == 4
    assert toml["pipeline_parallel_first_stage_less_layers"] == toml["pipeline_parallel_last_stage_less_layers"] == 1
    launch = launch_for(plan, 8, TOKENS)
    argv = script_argv(export("torchtitan", m, plan, launch))
    assert argv[argv.index("--parallelism.pipeline_parallel_layers_per_stage") + 1] == "4"
    assert argv[argv.index("--config") + 1] == "llama3_405b"
    pytest.importorskip("torchao")  # the float8 converter of llama3_405b
    cfg = _titan_parse(argv[argv.index("-m") + 2 :], monkeypatch)
    assert _titan_stage_layers(cfg) == chunk_sizes(32, 126)
    _check_titan(cfg, argv, m, plan, launch)
    from torchtitan.components.quantization.float8 import Float8Linear

    float8 = [c for _, c, _, _ in cfg.model_spec.model.traverse(Float8Linear.Config)]
    assert len(float8) == 5 * 126  # every linear of every block (fused wqkv, wo, w1, w2, w3); lm_head stays bf16


@pytest.mark.parametrize("name", sorted(TORCHTITAN_CONFIGS))
def test_torchtitan_03_configs_have_the_shape_of_the_model(name, monkeypatch):
    """The config functions the 0.3 export names build the model priced (layers, width, heads, vocabulary)."""
    pytest.importorskip("triton")
    pytest.importorskip("torchtitan.config.manager")
    import importlib

    float8 = pytest.importorskip("torchtitan.components.quantization.float8")
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    m = load_model(name)
    for c in TORCHTITAN_CONFIGS[name]:
        if c.precision == "fp8":
            pytest.importorskip("torchao")
        if c.fp8_recipe == "mxfp8":  # MXFP8 needs SM100 as well
            mx = importlib.import_module("torchtitan.components.quantization.mx")
            monkeypatch.setattr(mx, "has_cuda_capability", lambda major, minor: True)
        spec = getattr(importlib.import_module(f"torchtitan.models.{c.module}.config_registry"), c.function)()
        model = spec.model_spec.model
        assert len(model.layers) == m.layers, c
        assert model.vocab_size in (m.vocab, -(-m.vocab // 64) * 64), c  # gpt-oss pads its vocabulary
        assert getattr(model, "dim", None) in (m.hidden, None), c


# ---------------------------------------------------------------- DeepSpeed: DeepSpeedConfig

DS_CASES = {
    "70b-zero1-tp8-pp4": ("llama3.1-70b", 256, dict(tp=8, pp=4, zero=1, recompute="full", recompute_layers=4)),
    "8b-zero3-offload": ("llama3.1-8b", 64, dict(fsdp=True, offload_optimizer=True, micro_batch=2)),
    "8b-zero2-tp2": ("llama3.1-8b", 64, dict(tp=2, fsdp=True, reshard_after_forward=False, main_grads="bf16")),
    "8b-hsdp-mics": ("llama3.1-8b", 64, dict(fsdp=True, shard_group=8)),
    "8b-zero1-no-overlap": ("llama3.1-8b", 64, dict(zero=1, overlap_grad_reduce=False)),
    "mixtral-ep8-zero1-ulysses": ("mixtral-8x7b", 64, dict(zero=1, ep=8, cp=2, cp_kind="a2a")),
}


def _ds_config(cfg: dict, dp: int, monkeypatch: pytest.MonkeyPatch):
    """DeepSpeed's own config class on the exported JSON, for `dp` data-parallel ranks: its world size comes
    from an mpu once a process group answers `get_rank`, so rank 0 stands in for one."""
    config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(config.dist, "get_rank", lambda *args, **kwargs: 0)
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: dp)
    return config.DeepSpeedConfig(cfg, mpu=mpu)


@pytest.mark.parametrize("case", sorted(DS_CASES))
def test_deepspeed_export_parses_in_deepspeed_config(case, monkeypatch):
    name, gpus, kw = DS_CASES[case]
    m, plan = _plan(name, gpus, global_batch=256, **kw)
    launch = launch_for(plan, 8, TOKENS)
    exported = json.loads(export("deepspeed", m, plan, launch))
    ds = _ds_config(exported, plan.dp, monkeypatch)
    # batch over the data-parallel ranks (DeepSpeed asserts train = micro x accumulation x dp)
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu) == (plan.global_batch, plan.micro_batch)
    assert ds.gradient_accumulation_steps == plan.grad_accum and ds.world_size == plan.dp
    # sharding and its overlap, offload, hierarchical (MiCS) groups
    assert ds.zero_optimization_stage == {"8b-zero3-offload": 3, "8b-hsdp-mics": 3, "8b-zero2-tp2": 2}.get(case, 1)
    assert ds.zero_optimization_stage == zero_stage(plan)
    assert ds.zero_config.overlap_comm == plan.overlap_grad_reduce
    assert (ds.zero_config.offload_optimizer is not None) == plan.offload_optimizer
    assert ds.zero_config.mics_shard_size == (plan.shard_group if plan.shard_group else -1)
    # layout: AutoTP; PP, EP and Ulysses are model code (the export says so)
    assert ds.tensor_parallel_config.autotp_size == plan.tp
    assert ds.tensor_parallel_config.tp_overlap_comm == (plan.tp_comm_overlap and plan.tp > 1)
    notes = " ".join(exported["_shardscope"]["notes"])
    assert (f"PipelineModule(num_stages={plan.pp})" in notes) == (plan.pp > 1)
    assert (f"MoE(ep_size={plan.ep})" in notes) == (plan.ep > 1)
    assert ("Ulysses" in notes) == (plan.cp > 1)
    # precision, gradient buffer, recompute
    assert ds.bfloat16_config.enabled if hasattr(ds, "bfloat16_config") else ds.bfloat16_enabled
    assert ds.grad_accum_dtype == plan.main_grads
    assert ds.activation_checkpointing_config.partition_activations == (plan.recompute != "none" and plan.tp > 1)
    assert ("deepspeed.checkpointing.checkpoint" in notes) == (plan.recompute == "full")
    # launch: steps for the token budget, the placeholders
    assert ds.scheduler_params["total_num_steps"] == launch.steps
    assert FILL_IN in str(ds.optimizer_params["lr"]) and FILL_IN in str(ds.scheduler_params["warmup_num_steps"])


def test_deepspeed_refuses_zero3_with_autotp():
    """DeepSpeed's AutoTP training asserts ZeRO stage <= 2 (engine.py `_configure_tensor_parallel_states`,
    0.16.4-0.19.3): FSDP-style ZeRO-3 with TP is refused, ZeRO-2 (no reshard) with TP exported."""
    from shardscope.errors import ShardscopeError

    m, zero3 = _plan("llama3.1-8b", 64, tp=2, fsdp=True, global_batch=64)
    with pytest.raises(ShardscopeError, match=r"ZeRO-3 with AutoTP.*engine.py"):
        export("deepspeed", m, zero3)
    zero2 = dataclasses.replace(zero3, reshard_after_forward=False)
    assert json.loads(export("deepspeed", m, zero2))["zero_optimization"]["stage"] == 2
    assert (
        json.loads(export("deepspeed", m, dataclasses.replace(zero3, tp=1, dp=64)))["zero_optimization"]["stage"] == 3
    )
    engine = pytest.importorskip("deepspeed.runtime.engine")
    import inspect

    source = inspect.getsource(engine.DeepSpeedEngine._configure_tensor_parallel_states)
    assert "zero_stage = 3" in source  # the installed release (the extra pins 0.17) asserts it


# ---------------------------------------------------------------- Megatron: megatron-core's config classes

# Megatron-LM's argument destinations where they are not the option's name (megatron/training/arguments.py at
# the commit of validation/megatron_lm_flags.txt): (dest, value of the bare flag)
MEGATRON_DESTS = {
    "--fp8-format": ("fp8", None),
    "--num-experts": ("num_moe_experts", None),
    "--norm-epsilon": ("layernorm_epsilon", None),
    "--disable-bias-linear": ("add_bias_linear", False),
    "--no-bias-swiglu-fusion": ("bias_activation_fusion", False),
    "--num-virtual-stages-per-pipeline-rank": ("virtual_pipeline_model_parallel_size", None),
    "--cuda-graph-modules": ("cuda_graph_scope", None),
}
MEGATRON_LISTS = ("--recompute-modules", "--cuda-graph-modules")


def megatron_namespace(args: list[str]) -> dict[str, object]:
    """The exported arguments as Megatron-LM's parser leaves them: each option's destination and typed value
    (store_true flags True; `--moe-layer-freq` evaluated as its `moe_freq_type` does)."""
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), flag
        values = []
        while i + 1 < len(args) and not args[i + 1].startswith("--"):
            values.append(args[i + 1])
            i += 1
        dest, bare = MEGATRON_DESTS.get(flag, (flag[2:].replace("-", "_"), True))
        if flag in MEGATRON_LISTS:
            value: object = values
        elif not values:
            value = bare
        else:
            value = _typed(values[0])
        if flag == "--moe-layer-freq":
            value = eval(str(values[0]), {"__builtins__": {}})
        out[dest] = value
        i += 1
    return out


def _typed(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


MEGATRON_CASES = {
    "70b-tp8-pp4-vpp2-zero1-modules": (
        "llama3.1-70b",
        256,
        dict(tp=8, pp=4, vpp=2, zero=1, recompute="selective", recompute_modules=("core_attn", "mlp")),
    ),
    "70b-hsdp-fsdp-full": ("llama3.1-70b", 256, dict(tp=4, fsdp=True, shard_group=16, recompute="full")),
    "8b-tp2-overlap-offload": (
        "llama3.1-8b",
        64,
        dict(tp=2, zero=1, tp_comm_overlap=True, offload_optimizer=True, optimizer_moments="bf16"),
    ),
    "dsv3-ep64-deepep-overlap-fp8": (
        "deepseek-v3",
        1024,
        dict(
            pp=16,
            vpp=2,
            ep=64,
            zero=1,
            ep_dispatch="deepep",
            ep_comm_overlap=True,
            precision="fp8",
            fp8_recipe="blockwise",
            global_batch=1024,
        ),
    ),  # fmt: skip
}


def _megatron_configs(ns: dict[str, object], monkeypatch: pytest.MonkeyPatch):
    """megatron-core's TransformerConfig (MLA's where asked), DDP and optimizer configs of the namespace, built
    as Megatron-LM builds them (`core_transformer_config_from_args`: every field named like an argument)."""
    import torch

    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    from megatron.core import utils
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from packaging.version import Version

    # Transformer Engine is GPU-only: its version checks read a recent release (the cached version)
    monkeypatch.setattr(utils, "_te_version", Version("2.8.0"))

    config_class = tc.MLATransformerConfig if ns.get("multi_latent_attention") else tc.TransformerConfig
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.uint8}

    def kwargs(cls) -> dict:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in ns.items() if k in names}
        for key in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype"):
            if key in kw:
                kw[key] = dtypes[kw[key]]
        return kw

    kw = kwargs(config_class)
    kw["pipeline_dtype"] = torch.bfloat16  # args.params_dtype under --bf16
    kw["num_query_groups"] = ns.get("num_query_groups") if ns.get("group_query_attention") else None
    if ns.get("swiglu"):
        kw |= {"gated_linear_unit": True, "activation_func": torch.nn.functional.silu}
    for key in ("window_size", "no_rope_freq", "tokenizer_model"):
        kw.pop(key, None)
    return (
        config_class(**kw),
        DistributedDataParallelConfig(**kwargs(DistributedDataParallelConfig)),
        OptimizerConfig(**kwargs(OptimizerConfig)),
    )


@pytest.mark.parametrize("case", sorted(MEGATRON_CASES))
def test_megatron_export_parses_in_argument_parser(case, monkeypatch):
    """Megatron-LM's parser is not installable (no wheel ships megatron/training): the flags are checked against
    its option list (validation/megatron_lm_flags.txt) and the values built into megatron-core 0.16's own
    TransformerConfig / DistributedDataParallelConfig / OptimizerConfig, whose checks run on them."""
    name, gpus, kw = MEGATRON_CASES[case]
    kw = {"global_batch": 256, **kw}
    m, plan = _plan(name, gpus, **kw)
    launch = launch_for(plan, 8, TOKENS)
    argv = script_argv(export("megatron", m, plan, launch))
    args = argv[argv.index("pretrain_gpt.py") + 1 :]
    flags = {a for a in args if a.startswith("--")}
    known = Path(__file__).parent.parent / "validation" / "megatron_lm_flags.txt"
    assert flags <= set(known.read_text().split()), sorted(flags - set(known.read_text().split()))
    ns = megatron_namespace(args)
    config, ddp, optimizer = _megatron_configs(ns, monkeypatch)
    # layout: the launcher's world is Megatron's tp·pp·cp·dp
    nodes, per_node = _launcher(argv)
    tp, pp, cp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size
    assert (tp, pp, cp) == (plan.tp, plan.pp, plan.cp) and nodes * per_node // (tp * pp * cp) == plan.dp
    if m.moe is not None:  # expert TP unset is the TP in Megatron-Core
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (plan.ep, plan.etp)
    assert config.sequence_parallel == plan.sp
    # schedule: interleaved with the priced virtual stages
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.vpp
    # recompute
    granularity = {"none": None, "selective": "selective", "full": "full"}[plan.recompute]
    assert config.recompute_granularity == granularity
    if plan.recompute_modules:
        assert tuple(config.recompute_modules) == plan.recompute_modules
    # sharding
    megatron_fsdp = plan.fsdp or plan.zero == 3
    assert ddp.use_distributed_optimizer == (plan.zero >= 1 and not megatron_fsdp)
    assert bool(ns.get("use_megatron_fsdp")) == megatron_fsdp
    hsdp = plan.shard_group and plan.shard_size < plan.dp * plan.cp
    assert ddp.num_distributed_optimizer_instances == (plan.dp * plan.cp // plan.shard_size if hsdp else 1)
    assert optimizer.optimizer_cpu_offload == plan.offload_optimizer
    assert optimizer.use_precision_aware_optimizer == (plan.optimizer_moments != "fp32" or plan.main_grads != "fp32")
    # overlaps: DP gradient/parameter, TP, EP all-to-all
    assert ddp.overlap_grad_reduce == plan.overlap_grad_reduce
    assert ddp.overlap_param_gather == (plan.zero >= 1 and not plan.fsdp)
    assert config.tp_comm_overlap == plan.tp_comm_overlap
    assert config.overlap_moe_expert_parallel_comm == plan.ep_comm_overlap
    if m.moe is not None:
        flex = plan.ep_dispatch != "flat"
        assert config.moe_token_dispatcher_type == ("flex" if flex else "alltoall")
        assert not flex or config.moe_flex_dispatcher_backend == plan.ep_dispatch
    # precision
    assert (config.fp8 == "hybrid") == (plan.precision == "fp8") and config.bf16
    if plan.precision == "fp8":
        assert config.fp8_recipe == plan.fp8_recipe
    # batch and launch
    assert (ns["micro_batch_size"], ns["global_batch_size"], ns["seq_length"]) == (
        plan.micro_batch,
        plan.global_batch,
        plan.seq_len,
    )
    assert ns["train_iters"] == launch.steps and ns["data_path"] == FILLED["$DATA_PATH"]
    assert ns["lr"] == float(FILLED["$LR"]) and ns["lr_decay_style"] == "cosine"
