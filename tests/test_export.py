"""The launchable exports against the frameworks themselves: every Megatron-LM flag and torchtitan key
exists in that framework's own parser or config, the Megatron network matches the Megatron-Core MoE
team's own launch configs, and each torchtitan flavor has the shape of the model that was priced."""

from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.plan.plan import make_plan
from shardscope.planner.export import TORCHTITAN_FLAVORS, export, to_megatron

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
    flags = {a for a in to_megatron(m, plan) if a.startswith("--")}
    assert flags <= MEGATRON_FLAGS, sorted(flags - MEGATRON_FLAGS)
    # and the shell command is exactly those arguments (patterns such as ([0]*3+[1]*58) are quoted)
    text = export("megatron", m, plan)
    command = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert shlex.split(command.replace("\\\n", " ")) == ["torchrun", "pretrain_gpt.py", *to_megatron(m, plan)]


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


@pytest.mark.parametrize("variant", VARIANTS, ids=range(len(VARIANTS)))
@pytest.mark.parametrize("name", MODELS)
def test_every_torchtitan_key_is_in_its_job_config(name, variant):
    """validation/torchtitan_job_config_keys.txt: the fields of torchtitan v0.2.2's JobConfig. The
    batch follows its train.py: gradient accumulation = global / (local x batch degree) without PP, the
    pipeline's micro-batches = local / microbatch size with it."""
    m, plan = _plan(name, variant)
    titan = tomllib.loads(export("torchtitan", m, plan))
    keys = _toml_keys(titan)
    assert keys <= TITAN_KEYS, sorted(keys - TITAN_KEYS)
    converters = titan["model"].get("converters", [])
    assert set(converters) <= TITAN_CONVERTERS and all(
        c.split(".")[-1] in titan["quantize"][c.split(".")[1]] for c in converters
    )
    assert bool(converters) == (plan.precision == "fp8")
    assert ("selective AC is op-level" in export("torchtitan", m, plan)) == (plan.recompute == "selective")
    par, train = titan["parallelism"], titan["training"]
    batch_degree = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert batch_degree == plan.dp
    local = train["local_batch_size"]
    assert train["global_batch_size"] % (local * batch_degree) == 0
    accumulation = train["global_batch_size"] // (local * batch_degree)
    if plan.pp > 1:
        assert accumulation == 1 and local // par["pipeline_parallel_microbatch_size"] == plan.grad_accum
    else:
        assert local == plan.micro_batch and accumulation == plan.grad_accum


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


def test_torchtitan_without_a_flavor_and_deepspeed_with_experts_say_so():
    m, plan = _plan("kimi-k2", dict(tp=1, pp=4, zero=1))
    assert "no flavor of kimi-k2" in export("torchtitan", m, plan)
    notes = " ".join(json.loads(export("deepspeed", m, plan))["_shardscope"]["notes"])
    assert "MoE(ep_size=8)" in notes


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
