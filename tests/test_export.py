"""The launchable exports against the frameworks themselves: every Megatron-LM flag and torchtitan key
exists in that framework's own parser or config, the Megatron network matches the Megatron-Core MoE
team's own launch configs, and each torchtitan flavor has the shape of the model that was priced. The
exports name the framework release, carry what a launch needs, and refuse what the release cannot run;
`--export X` searches only the plans X can run. (The frameworks' own loaders: test_export_frameworks.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.plan.plan import chunk_sizes, make_plan
from shardscope.planner.export import (
    FILL_IN,
    TORCHTITAN_FLAVORS,
    export,
    export_target,
    launch_for,
    megatron_launch_args,
    runnable_problems,
    titan_pipeline_split,
    titan_stage_layers,
    to_megatron,
)
from shardscope.planner.export.common import torchrun

VALIDATION = Path(__file__).parent.parent / "validation"
ZOO = yaml.safe_load((VALIDATION / "megatron_moe_model_zoo.yaml").read_text())["models"]
TITAN = yaml.safe_load((VALIDATION / "torchtitan_flavors.yaml").read_text())["flavors"]


def _lines(name: str) -> set[str]:
    return {line for line in (VALIDATION / name).read_text().splitlines() if line and not line.startswith("#")}


MEGATRON_FLAGS = _lines("megatron_lm_flags.txt")
TITAN_KEYS = _lines("torchtitan_job_config_keys.txt")
# torchtitan v0.2.2 register_model_converter names (components/quantization/float8.py:238-239, mx.py:171-172)
TITAN_CONVERTERS = {
    "quantize.linear.float8",
    "quantize.grouped_mm.float8",
    "quantize.linear.mx",
    "quantize.grouped_mm.mx",
}

MODELS = ["llama3.1-70b", "qwen2.5-7b", "gpt2", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "deepseek-v2-lite"]
MODELS += ["gpt-oss-120b", "llama4-maverick", "kimi-k2", "moonlight-16b-a3b", "wan2.1-t2v-14b"]
VARIANTS = [
    dict(tp=4, pp=4, vpp=2, zero=1, recompute="selective", micro_batch=2),
    dict(tp=2, cp=2, fsdp=True, recompute="full", recompute_layers=4, precision="fp8", fp8_recipe="blockwise"),
    dict(tp=1, pp=2, zero=1, precision="fp8", offload_optimizer=True, optimizer_moments="bf16", main_grads="bf16"),
    dict(tp=1, fsdp=True, reshard_after_forward=False, precision="fp8", fp8_recipe="mxfp8", cuda_graphs=("attn",)),
]


def _plan(model_name: str, variant: dict, gpu: str = "H100"):
    m = load_model(model_name)
    kw = dict(variant)
    if kw.get("fp8_recipe") == "mxfp8":
        gpu = "B200"
    if m.moe:  # FP8 variants pad the router's counts and fuse DeepEP's routing map
        fp8 = kw.get("precision") == "fp8"
        kw.update(ep=8, ep_dispatch="deepep", moe_router_padding=fp8, deepep_fused_routing_map=fp8)
    if m.dit:
        kw.update(pp=1, vpp=1)
    return m, make_plan(m, make_cluster(gpu, 256), global_batch=256, seq_len=4096, **kw)


def launch_command(text: str) -> list[str]:
    """The words of an export script's launch command as the shell splits them (placeholders unexpanded)."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#")).replace("\\\n", " ")
    return shlex.split(next(line for line in body.splitlines() if line.startswith("torchrun")))


def _megatron_values(args: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            out[a] = True if nxt.startswith("--") else nxt
    return out


@pytest.mark.parametrize("variant", VARIANTS, ids=range(len(VARIANTS)))
@pytest.mark.parametrize("name", MODELS)
def test_every_megatron_flag_is_one_megatron_lm_parses(name, variant):
    """validation/megatron_lm_flags.txt: the option strings of Megatron-LM's own parser (built by
    tools/megatron_lm_flags.py from megatron/training/arguments.py at a pinned commit)."""
    m, plan = _plan(name, variant)
    launch = launch_for(plan)
    flags = {a for a in [*to_megatron(m, plan), *megatron_launch_args(launch)] if a.startswith("--")}
    assert flags <= MEGATRON_FLAGS, sorted(flags - MEGATRON_FLAGS)
    # and the shell command is exactly those arguments (patterns such as ([0]*3+[1]*58) are quoted)
    text = export("megatron", m, plan)
    words = [*torchrun(launch), "pretrain_gpt.py", *to_megatron(m, plan), *megatron_launch_args(launch)]
    assert launch_command(text) == words


# Megatron-LM's defaults for the network arguments a launch config may leave out (TransformerConfig
# and arguments.py at the pinned commit): absent flags mean these values.
MEGATRON_DEFAULTS = {
    "--moe-router-pre-softmax": False,
    "--moe-router-topk-scaling-factor": 1.0,
    "--moe-router-num-groups": 1,
    "--moe-router-group-topk": 1,
    "--moe-router-enable-expert-bias": False,
    "--moe-shared-expert-intermediate-size": 0,
    "--moe-layer-freq": "1",
    "--qk-layernorm": False,
    "--group-query-attention": False,
    "--moe-grouped-gemm": False,
}


def _effective(flag: str, value, layers: int):
    if flag == "--moe-layer-freq":
        freq = eval(str(value), {"__builtins__": {}})  # as Megatron-LM's moe_freq_type does
        return [1] * layers if freq == 1 else list(freq)
    if isinstance(value, bool):
        return value
    try:
        return float(value)
    except ValueError:
        return value


@pytest.mark.parametrize("name", sorted(ZOO))
def test_megatron_network_matches_the_megatron_moe_model_zoo(name):
    """The Megatron-Core MoE team's benchmarking configs (validation/megatron_moe_model_zoo.yaml):
    every network argument they state means the same value in our export (MLA ignores `--kv-channels`)."""
    m, plan = _plan(name, dict(tp=1, pp=1))
    ours = _megatron_values(to_megatron(m, plan))
    for flag, theirs in ZOO[name]["args"].items():
        if flag == "--kv-channels" and m.mla:
            continue
        mine = ours.get(flag, MEGATRON_DEFAULTS.get(flag, "<absent>"))
        assert _effective(flag, mine, m.layers) == _effective(flag, theirs, m.layers), flag
    if "--moe-ffn-hidden-size" not in ZOO[name]["args"]:  # Megatron-LM defaults it to --ffn-hidden-size
        assert float(ours["--moe-ffn-hidden-size"]) == float(ZOO[name]["args"]["--ffn-hidden-size"])


def test_megatron_vocabulary_and_tokenizer():
    m, plan = _plan("deepseek-v3", dict(tp=8))
    v = _megatron_values(to_megatron(m, plan))
    assert v["--padded-vocab-size"] == str(m.vocab) and v["--tokenizer-model"] == "deepseek-ai/DeepSeek-V3"
    odd = dataclasses.replace(m, vocab=m.vocab + 1)
    assert "--padded-vocab-size" not in to_megatron(odd, plan)
    assert "does not split over TP 8" in export("megatron", odd, plan)
    wan, dit_plan = _plan("wan2.1-t2v-14b", dict(tp=2))
    text = export("megatron", wan, dit_plan)
    assert "not a pretrain_gpt.py model" in text and "--tokenizer-model" not in text and "--padded-vocab" not in text


def _toml_keys(table: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for k, v in table.items():
        keys |= _toml_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return keys


# Plans torchtitan runs (FSDP2 sharding, op-level selective or whole-block recompute, torchao FP8 recipes)
TITAN_VARIANTS = [
    dict(tp=4, pp=4, vpp=2, fsdp=True, recompute="selective", micro_batch=2),
    dict(tp=2, cp=2, fsdp=True, recompute="full", precision="fp8", fp8_recipe="rowwise"),
    dict(tp=1, pp=2, fsdp=True, offload_optimizer=True, precision="fp8", fp8_all_gather=True),
    dict(tp=1, fsdp=True, reshard_after_forward=False, precision="fp8", fp8_recipe="mxfp8"),
]


@pytest.mark.parametrize("variant", TITAN_VARIANTS, ids=range(len(TITAN_VARIANTS)))
@pytest.mark.parametrize("name", MODELS)
def test_every_torchtitan_key_is_in_its_job_config(name, variant):
    """validation/torchtitan_job_config_keys.txt: the fields of torchtitan v0.2.2's JobConfig. The
    batch follows its train.py: gradient accumulation = global / (local x batch degree) without PP, the
    pipeline's micro-batches = local / microbatch size with it. A model torchtitan 0.2 has no flavor of is
    refused, saying so."""
    m, plan = _plan(name, variant)
    if name not in TORCHTITAN_FLAVORS:
        with pytest.raises(ShardscopeError, match=f"no model flavor of {name}"):
            export("torchtitan@0.2", m, plan)
        return
    text = export("torchtitan@0.2", m, plan)
    titan = tomllib.loads(text)
    keys = _toml_keys(titan)
    assert keys <= TITAN_KEYS, sorted(keys - TITAN_KEYS)
    converters = titan["model"].get("converters", [])
    assert set(converters) <= TITAN_CONVERTERS and all(
        c.split(".")[-1] in titan["quantize"][c.split(".")[1]] for c in converters
    )
    assert bool(converters) == (plan.precision == "fp8")
    if "quantize.linear.float8" in converters:
        float8 = titan["quantize"]["linear"]["float8"]
        assert float8["recipe_name"] == plan.fp8_recipe and float8["enable_fsdp_float8_all_gather"] == plan.fp8_params
    assert ("selective AC is op-level" in text) == (plan.recompute == "selective")
    par, train = titan["parallelism"], titan["training"]
    batch_degree = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert batch_degree == plan.dp and train["enable_cpu_offload"] == plan.offload_optimizer
    local = train["local_batch_size"]
    assert train["global_batch_size"] % (local * batch_degree) == 0
    accumulation = train["global_batch_size"] // (local * batch_degree)
    if plan.pp > 1:
        assert accumulation == 1 and local // par["pipeline_parallel_microbatch_size"] == plan.grad_accum
        if "module_fqns_per_model_part" in par:  # torchtitan's own split cannot give the priced chunks
            parts = par["module_fqns_per_model_part"]
            split = [sum(n.startswith("layers.") for n in part) for part in parts]
            assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        else:
            first, last = (par[f"pipeline_parallel_{s}_stage_less_layers"] for s in ("first", "last"))
            split = titan_stage_layers(plan.pp * plan.vpp, m.layers, first, last)
            assert -(-(m.layers + first + last) // par["pipeline_parallel_layers_per_stage"]) == plan.pp * plan.vpp
        assert split == chunk_sizes(plan.pp * plan.vpp, m.layers)
    else:
        assert local == plan.micro_batch and accumulation == plan.grad_accum


@pytest.mark.parametrize(
    "release,kw,needle",
    [
        ("0.2", dict(zero=1), "ZeRO-1: torchtitan shards model state with FSDP2 only"),
        ("0.3", dict(zero=1), "ZeRO-1: torchtitan shards model state with FSDP2 only"),
        ("0.2", dict(fsdp=True, recompute="full", recompute_layers=4), "full AC wraps every block"),
        ("0.2", dict(fsdp=True, precision="fp8", fp8_recipe="blockwise"), "blockwise FP8 scaling"),
        ("0.3", dict(fsdp=True, precision="fp8", fp8_recipe="tensorwise"), "llama3.llama3_405b (rowwise FP8)"),
        ("0.3", dict(fsdp=True), "only as llama3.llama3_405b (rowwise FP8), not bf16 GEMMs"),
        ("0.2", dict(fsdp=True, cp=2, cp_kind="a2a"), "all-to-all (Ulysses) context parallelism"),
        ("0.2", dict(fsdp=True, cuda_graphs="attn"), "per-layer CUDA graphs"),
        ("0.2", dict(fsdp=True, tp=8, tp_comm_overlap=True), "async TP without torch.compile"),
        ("0.2", dict(zero=0, tp=8), "DDP with TP/PP/CP/EP"),
    ],
)
def test_torchtitan_refuses_what_it_cannot_express(release, kw, needle):
    """What torchtitan cannot run is refused with the reason and the torchtitan file that decides it, rather
    than exported as something else (ZeRO-1 as FSDP, partial recompute as full, blockwise FP8 as rowwise)."""
    m = load_model("llama3.1-405b")
    plan = make_plan(m, make_cluster("H100", 512), global_batch=512, seq_len=4096, **kw)
    with pytest.raises(ShardscopeError, match=r"torchtitan@" + release + r" cannot run") as err:
        export(f"torchtitan@{release}", m, plan)
    assert needle in str(err.value) and "torchtitan" in str(err.value).split(needle)[1]


def test_ep_overlap_is_expressed_or_refused():
    """The EP all-to-all overlap the plan priced: Megatron's flag; torchtitan 0.2's DualPipeV overlap (PP with two
    stages per rank, no activation checkpointing); refused by torchtitan 0.3 and DeepSpeed, which have none."""
    m = load_model("deepseek-v2-lite")
    kw = dict(pp=2, vpp=2, ep=8, fsdp=True, ep_comm_overlap=True, global_batch=256, seq_len=4096)
    plan = make_plan(m, make_cluster("H100", 64), **kw)
    assert "--overlap-moe-expert-parallel-comm" in launch_command(export("megatron", m, plan))
    par = tomllib.loads(export("torchtitan@0.2", m, plan))["parallelism"]
    assert par["pipeline_parallel_schedule"] == "DualPipeV" and par["pipeline_parallel_expert_parallel_overlap"]
    with pytest.raises(ShardscopeError, match="DualPipeV"):
        export("torchtitan@0.2", m, dataclasses.replace(plan, recompute="selective"))
    for target in ("torchtitan@0.3", "deepspeed"):
        with pytest.raises(ShardscopeError, match="EP all-to-all overlap"):
            export(target, m, plan)
    without = dataclasses.replace(plan, ep_comm_overlap=False)
    assert "--overlap-moe-expert-parallel-comm" not in launch_command(export("megatron", m, without))
    assert "pipeline_parallel_expert_parallel_overlap" not in export("torchtitan@0.2", m, without)


@pytest.mark.parametrize("name", sorted(TITAN))
def test_torchtitan_flavor_has_the_shape_of_the_model(name):
    """The flavor we name builds the model we priced: torchtitan's ModelArgs (v0.2.2) against the spec."""
    want = TITAN[name]
    assert TORCHTITAN_FLAVORS[name] == (want["name"], want["flavor"])
    m = load_model(name)
    moe = m.moe
    ours = {
        "dim": m.hidden,
        "n_layers": m.layers,
        "n_heads": m.heads,
        "n_kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab,
        "hidden_dim": m.ffn_hidden,
        "num_experts": moe.experts if moe else 0,
        "top_k": moe.top_k if moe else 0,
        "moe_inter_dim": moe.expert_ffn if moe else 0,
        "num_shared_experts": (moe.shared_ffn // moe.expert_ffn if moe.shared_experts else 0) if moe else 0,
        "n_dense_layers": moe.first_dense_layers if moe else 0,
        "q_lora_rank": m.mla.q_lora_rank if m.mla else 0,
        "kv_lora_rank": m.mla.kv_lora_rank if m.mla else 0,
        "interleave_moe_layer_step": moe.layer_step if moe else 0,
        "every_n_layers_nope": 4 if "chunk" in m.attention_pattern and m.attention_pattern[3] == "full" else 0,
    }
    for key, value in want.items():
        if key not in ("name", "flavor"):
            assert ours[key] == value, key


def test_every_torchtitan_flavor_we_name_is_checked():
    assert set(TORCHTITAN_FLAVORS) == set(TITAN)


def test_torchtitan_without_a_config_and_deepspeed_with_experts_say_so():
    m, plan = _plan("kimi-k2", dict(tp=1, pp=4, fsdp=True))
    with pytest.raises(ShardscopeError, match="no model flavor of kimi-k2"):
        export("torchtitan@0.2", m, plan)
    with pytest.raises(ShardscopeError, match="no pretraining config of kimi-k2"):
        export("torchtitan", m, plan)
    flat = dataclasses.replace(plan, fsdp=False, zero=1, ep_dispatch="flat")
    notes = " ".join(json.loads(export("deepspeed", m, flat))["_shardscope"]["notes"])
    assert "MoE(ep_size=8)" in notes
    with pytest.raises(ShardscopeError, match="deepep dispatcher: DeepSpeed MoE dispatches"):
        export("deepspeed", m, dataclasses.replace(flat, ep_dispatch="deepep"))


@pytest.mark.parametrize("name,window", [("mistral-7b", 4096), ("mixtral-8x7b", 0)])
def test_sliding_window_is_priced_and_exported_alike(name, window):
    """Mistral's `sliding_window` bounds every layer (transformers' MistralAttention); a null one (Mixtral
    8x7B) is full attention. The spec prices each layer's attention over the keys it sees, and the Megatron
    export windows exactly the layers the spec prices as windowed."""
    model = load_model(name)
    plan = make_plan(model, make_cluster("H100", 8), tp=8, global_batch=1, seq_len=4 * 4096)
    windowed = {model.layer_kind(i).attention == "window" for i in range(model.layers)}
    assert windowed == {bool(window)}
    keys = model.keys_per_query(model.layer_kind(0), plan.seq_len, causal=True)
    assert keys < plan.seq_len / 2 if window else keys == pytest.approx((plan.seq_len + 1) / 2)
    args = _megatron_values(to_megatron(model, plan))
    assert args.get("--window-size") == (f"({window - 1},0)" if window else None)


def test_fused_expert_mlp_exports_the_op_fuser_and_its_environment():
    """The fused grouped MLP is Megatron's `--use-transformer-engine-op-fuser` plus an environment variable,
    which the export names in its notes."""
    from shardscope.planner.export import _megatron

    m, plan = _plan("qwen3-30b-a3b", dict(tp=1, precision="fp8", fp8_recipe="mxfp8"))
    assert not plan.fused_expert_mlp and "--use-transformer-engine-op-fuser" not in to_megatron(m, plan)
    fused = dataclasses.replace(plan, fused_expert_mlp=True)
    args, notes = _megatron(m, fused)
    assert "--use-transformer-engine-op-fuser" in args
    assert any("NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in n for n in notes)
    flags = (Path(__file__).parent.parent / "validation" / "megatron_lm_flags.txt").read_text().split()
    assert "--use-transformer-engine-op-fuser" in flags


def test_deepeps_fused_routing_map_is_megatrons_experimental_switch():
    """Megatron-Core builds DeepEP's routing map with its fused kernel only under `--enable-experimental`
    (token_dispatcher.py, core_v0.15-0.19): the export turns it on exactly when the plan priced that."""
    m, plan = _plan("qwen3-30b-a3b", dict(tp=1, precision="fp8"))
    assert plan.deepep_fused_routing_map and "--enable-experimental" in to_megatron(m, plan)
    assert "--enable-experimental" not in to_megatron(m, dataclasses.replace(plan, deepep_fused_routing_map=False))
    assert "--enable-experimental" not in to_megatron(m, dataclasses.replace(plan, ep_dispatch="hybridep"))


@pytest.mark.parametrize(
    "spec,label",
    [
        ("torchtitan", "torchtitan@0.3"),
        ("torchtitan@0.2", "torchtitan@0.2"),
        ("torchtitan@v0.2.2", "torchtitan@0.2"),
        ("megatron", "megatron@0.16"),
        ("megatron-lm@core_r0.14", "megatron@0.14"),
        ("deepspeed", "deepspeed@0.16"),
        ("deepspeed@0.17.6", "deepspeed@0.17"),
    ],
)
def test_export_target_is_a_stack_release(spec, label):
    """`--export NAME[@RELEASE]` is parsed as `--stack` is (aliases, release spellings); torchtitan defaults to
    its current release, 0.3, the others to the release their stack prices by default."""
    target = export_target(spec)
    assert target.label == label and target.stack.label == label


@pytest.mark.parametrize(
    "spec,needle",
    [("jax", "--export jax"), ("nemo", "--export must be one of"), ("torchtitan@0.1", "0.2, 0.3"),
     ("megatron@2021", "0.12, 0.13")],
)  # fmt: skip
def test_export_target_refuses_what_no_exporter_writes(spec, needle):
    with pytest.raises(ShardscopeError, match=re_escape(needle)):
        export_target(spec)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("fmt", ["torchtitan@0.3", "torchtitan@0.2", "megatron", "deepspeed"])
def test_export_carries_launch_settings(fmt):
    """Each export carries the nodes, GPUs per node, global and micro batch, the whole steps that train the
    token budget (rounded up) and the FILL IN placeholders of the learning-rate schedule and the data path;
    without a budget the steps are a placeholder too."""
    m = load_model("llama3.1-70b")
    plan = make_plan(
        m, make_cluster("H100", 256), tp=8, fsdp=True, reshard_after_forward=False, global_batch=512, seq_len=8192
    )  # one plan every framework runs (DeepSpeed: ZeRO-2 with AutoTP)
    tokens = 1.5e12
    steps = math.ceil(tokens / (512 * 8192))
    launch = launch_for(plan, 8, tokens)
    assert (launch.nodes, launch.gpus_per_node, launch.steps) == (32, 8, steps)
    text = export(fmt, m, plan, launch)
    assert f"{FILL_IN}: lr schedule" in text and f"{FILL_IN}: data path" in text
    if fmt == "deepspeed":
        cfg = json.loads(text)
        run = cfg["_shardscope"]["launch"]
        assert (run["nodes"], run["gpus_per_node"], run["train_steps"]) == (32, 8, steps)
        assert "--num_nodes 32 --num_gpus 8" in run["command"] and FILL_IN in run["data_path"]
        assert cfg["scheduler"]["params"]["total_num_steps"] == steps
        assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"]) == (512, plan.micro_batch)
        assert FILL_IN in cfg["optimizer"]["params"]["lr"]
    elif fmt == "torchtitan@0.2":
        job = tomllib.loads(text)
        assert "--nnodes 32 --nproc_per_node 8" in text
        assert job["training"]["steps"] == steps and job["training"]["global_batch_size"] == 512
        assert FILL_IN in job["optimizer"]["lr"] and FILL_IN in job["training"]["dataset_path"]
    else:
        words = launch_command(text)
        assert words[words.index("--nnodes") + 1] == "32" and words[words.index("--nproc_per_node") + 1] == "8"
        value = {w: words[i + 1] for i, w in enumerate(words[:-1])}
        if fmt == "megatron":
            assert value["--train-iters"] == str(steps) and value["--global-batch-size"] == "512"
            assert value["--micro-batch-size"] == str(plan.micro_batch) and value["--lr"] == "$LR"
            assert value["--data-path"] == "$DATA_PATH"
        else:
            assert value["--training.steps"] == str(steps) and value["--training.global_batch_size"] == "512"
            assert value["--dataloader.dataset_path"] == "$DATA_PATH"
        assert 'LR="${LR:?FILL IN: lr schedule' in text and 'DATA_PATH="${DATA_PATH:?FILL IN: data path' in text
    unbudgeted = export(fmt, m, plan)
    assert f"{FILL_IN}: training steps" in unbudgeted or f"{FILL_IN}: training iterations" in unbudgeted


def test_405b_layers_per_stage_reproduce_the_priced_chunks():
    """The pipeline split torchtitan builds (its `_generate_llm_fqn_per_model_part`, replicated) is the priced
    one: 126 layers on 32 chunks with the embedding and output as a layer each; where no allowance gives it
    (27 layers, 8 chunks: extra layers to the middle chunks), each chunk's modules are listed."""
    m = load_model("llama3.1-405b")
    plan = make_plan(m, make_cluster("H100", 512), tp=8, pp=8, vpp=4, fsdp=True, global_batch=512, seq_len=4096)
    split = titan_pipeline_split(m, plan)
    assert split == {
        "pipeline_parallel_first_stage_less_layers": 1,
        "pipeline_parallel_last_stage_less_layers": 1,
        "pipeline_parallel_layers_per_stage": 4,
    }
    assert titan_stage_layers(32, 126, 1, 1) == chunk_sizes(32, 126)
    lite = load_model("deepseek-v2-lite")
    plan = make_plan(lite, make_cluster("H100", 64), pp=4, vpp=2, fsdp=True, global_batch=256, seq_len=4096)
    parts = titan_pipeline_split(lite, plan)["module_fqns_per_model_part"]
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == chunk_sizes(8, 27) == [3, 4, 4, 4, 3, 3, 3, 3]
    assert [n for p in parts for n in p if n.startswith("layers.")] == [f"layers.{i}" for i in range(27)]


def test_megatron_releases_refuse_what_came_later():
    """A Megatron-Core release before a setting's field (read from the megatron-core wheels) refuses it; DeepEP
    before core 0.16 is `--moe-enable-deepep`."""
    m = load_model("deepseek-v2-lite")
    plan = make_plan(m, make_cluster("H100", 64), ep=8, zero=1, global_batch=256, seq_len=4096)
    overlap = dataclasses.replace(plan, ep_comm_overlap=True)
    assert export("megatron@0.14", m, overlap)
    with pytest.raises(ShardscopeError, match="EP all-to-all overlap: Megatron-Core has it from core 0.14"):
        export("megatron@0.13", m, overlap)
    deepep = dataclasses.replace(plan, ep_dispatch="deepep")
    assert "--moe-enable-deepep" in launch_command(export("megatron@0.15", m, deepep))
    assert "--moe-flex-dispatcher-backend" in launch_command(export("megatron@0.16", m, deepep))
    with pytest.raises(ShardscopeError, match="HybridEP dispatcher"):
        export("megatron@0.15", m, dataclasses.replace(plan, ep_dispatch="hybridep"))
    assert runnable_problems("megatron@0.13", m, dataclasses.replace(plan, zero=0, fsdp=True))


def test_export_searches_only_runnable_plans():
    """`--export X` searches only plans X can run, under X's stack: every plan of the DeepSpeed search runs
    under DeepSpeed (no ZeRO-3 with AutoTP, no ZeRO-2/3 with PP), while a search naming no framework ranks
    plans DeepSpeed cannot run; the exported plan is the best of the runnable ones. `--stack X` alone keeps
    to what X runs as well, ranked as the export ranks them."""
    from shardscope.planner.runner import plan_search

    options = dict(
        model="llama3.1-8b", gpu="H100", gpus=16, gpus_per_node=None, seq_len=4096, global_batch=64,
        video=None, precision="bf16", objective="throughput", top=400, tokens="100B", workers=1,
        executor="local",
    )  # fmt: skip
    m = load_model("llama3.1-8b")
    free = plan_search(**options, export=None, stack=None)
    assert any(runnable_problems("deepspeed", m, c.plan) for c in free.best)
    named = plan_search(**options, export=None, stack="deepspeed")
    assert named.best and not any(runnable_problems("deepspeed", m, c.plan) for c in named.best)
    runnable = plan_search(**options, export="deepspeed")
    assert runnable.best and not any(runnable_problems("deepspeed", m, c.plan) for c in runnable.best)
    best, fastest = runnable.best[0], free.best[0]
    assert best.estimate.tokens_per_s_per_gpu <= fastest.estimate.tokens_per_s_per_gpu
    assert all(c.plan.linear_impl == "torch" for c in runnable.best)  # priced under the DeepSpeed stack
    assert runnable.export_text == export("deepspeed", m, best.plan, launch_for(best.plan, 8, 100e9))
    assert [c.plan for c in named.best] == [c.plan for c in runnable.best]
    titan = plan_search(**options, export="torchtitan")
    assert titan.best and not any(runnable_problems("torchtitan@0.3", m, c.plan) for c in titan.best)
    assert all(c.plan.fsdp or (c.plan.zero == 0) for c in titan.best)
    # an older torchtitan (no exporter) keeps to the first exported release's constraints: no Megatron module lists
    old = plan_search(**options, export=None, stack="torchtitan@0.0")
    assert old.best and not any(c.plan.recompute_modules for c in old.best)
    assert not any(runnable_problems("torchtitan@0.2", m, c.plan) for c in old.best)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["llama3.1-405b", "--gpus", "512", "--export", "torchtitan"], "llama3.llama3_405b (rowwise FP8)"),
        (["llama3.1-8b", "--precision", "fp8", "--export", "deepspeed"], "FP8 GEMMs"),
        (["qwen3-30b-a3b", "--ep-dispatch", "deepep", "--export", "torchtitan@0.3"], "deepep dispatcher"),
        (["llama3.1-8b", "--export", "megatron@2021"], "written for releases"),
        (["llama3.1-8b", "--stack", "megatron", "--export", "deepspeed"], "--stack megatron@0.16"),
    ],
)
def test_plan_export_refuses_what_the_framework_cannot_run(args, needle):
    """What every plan of the search shares (precision, a fixed dispatcher, the model) and the framework release
    cannot run: one line on stderr and exit 2, before any search."""
    from typer.testing import CliRunner

    from shardscope.cli import app

    r = CliRunner().invoke(app, ["plan", *args, "--global-batch", "64"])
    assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


def test_export_and_stack_name_one_release():
    """`--stack` with `--export` must name the same framework; a release named by one only is the other's too."""
    from shardscope.planner.runner import runnable_export

    assert runnable_export("torchtitan", None).label == "torchtitan@0.3"
    assert runnable_export("torchtitan", "torchtitan").label == "torchtitan@0.3"
    assert runnable_export("torchtitan", "torchtitan@0.2").label == "torchtitan@0.2"
    assert runnable_export("megatron@0.14", "megatron").label == "megatron@0.14"
    with pytest.raises(ShardscopeError, match="different releases"):
        runnable_export("torchtitan@0.3", "torchtitan@0.2")
    with pytest.raises(ShardscopeError, match="another framework"):
        runnable_export("deepspeed", "megatron")


def test_torchtitan_reshard_policy_is_the_priced_one_with_pp():
    """torchtitan's "default" reshard policy is `not pp_enabled`: a pipelined FSDP plan priced with
    resharding exports "always", one priced without "never", an unpipelined one "default"."""
    m = load_model("llama3.1-70b")
    cluster = make_cluster("H100", 256)
    base = dict(tp=8, fsdp=True, global_batch=256, seq_len=4096)
    for kw, policy in (
        (dict(pp=4), "always"),
        (dict(pp=4, reshard_after_forward=False), "never"),
        (dict(pp=1), "default"),
    ):
        plan = make_plan(m, cluster, **base, **kw)
        assert f'fsdp_reshard_after_forward = "{policy}"' in export("torchtitan@0.2", m, plan)
        assert f"--parallelism.fsdp_reshard_after_forward {policy} " in export("torchtitan@0.3", m, plan)
