"""Measure: architectures without an adapter, built by transformers on the meta device and read from the
module tree (exact parameters), and the agreement of measured and adapted families."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.costs.memory import rank_params_local
from shardscope.errors import ShardscopeError, ShardscopeWarning
from shardscope.measure import measurement, trusting_remote_code
from shardscope.measure.cache import ENV_DIR, cache_path
from shardscope.measure.spec import flops_per_token, spec_from_measurement
from shardscope.models.catalog import catalog_config, load_model
from shardscope.models.hf import model_from_hf_config
from shardscope.plan.plan import Plan

CONFIGS = Path(__file__).parent / "data" / "configs"
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
    reason="the 'measure' extra (torch, transformers) is not installed",
)

# Parameter counts of the published checkpoints (unique tensors: a tied output layer counted once), as the
# model cards and the safetensors indexes give them.
PUBLISHED = {
    "bloom-560m": 559_214_592,
    "opt-125m": 125_239_296,
    "falcon-7b": 6_921_720_704,  # tied: the safetensors file stores lm_head again (7.22 B)
    "gemma-2-2b": 2_614_341_888,
    "phi-3-mini-4k-instruct": 3_821_079_552,
}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test measures into its own cache folder."""
    folder = tmp_path / "measured"
    monkeypatch.setenv(ENV_DIR, str(folder))
    return folder


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without transformers the error names the extra that installs it (simulated: the import fails)."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "shardscope.measure.meta", raising=False)
    with pytest.raises(ShardscopeError, match=r"unsupported model_type 'falcon'.*pip install 'shardscope\[measure\]'"):
        model_from_hf_config(_config("falcon-7b"), "falcon")


def test_cli_start_imports_neither_torch_nor_transformers() -> None:
    code = "import sys, shardscope.cli; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@needs_transformers
@pytest.mark.parametrize("name", sorted(set(PUBLISHED) - {"bloom-560m"}))  # BLOOM has an adapter
def test_unadapted_families_give_exact_parameter_counts(name: str) -> None:
    with pytest.warns(ShardscopeWarning, match="structure measured from transformers"):
        spec = load_model(str(CONFIGS / f"{name}.json"))
    assert spec.params_total == PUBLISHED[name]
    assert spec.measured.startswith("transformers ")
    # The per-GPU parameter counts of the memory model add up to the exact count (two pipeline stages; a
    # tied output layer on the last stage keeps its own copy of the embedding).
    plan = Plan(pp=2, micro_batch=1, global_batch=8, seq_len=1024)
    copy = spec.vocab * spec.hidden if spec.tied_embeddings else 0
    assert sum(sum(rank_params_local(spec, plan, r)) for r in range(2)) == spec.params_total + copy


@needs_transformers
def test_structure_read_from_the_module_tree() -> None:
    """Fields an adapter would read from config keys, here read from the modules transformers built."""
    falcon = spec_from_measurement(measurement(_config("falcon-7b")), "falcon")
    assert (falcon.heads, falcon.kv_heads, falcon.head_dim) == (71, 1, 64)  # multi-query attention
    assert falcon.parallel_block and falcon.mlp == "gelu" and falcon.ffn_hidden == 4 * 4544
    assert falcon.extra_layer_params == -2 * 4544  # one LayerNorm per block where two are assumed
    bloom = spec_from_measurement(measurement(_config("bloom-560m")), "bloom")
    assert bloom.position == "alibi" and bloom.norm == "layernorm" and bloom.qkv_bias and bloom.tied_embeddings
    assert not bloom.parallel_block and bloom.extra_params == 2 * 1024  # the embedding LayerNorm
    opt = spec_from_measurement(measurement(_config("opt-125m")), "opt")
    assert opt.position == "learned" and opt.pos_embedding_rows == 2048 + 2  # OPT's offset of 2 rows
    gemma = spec_from_measurement(measurement(_config("gemma-2-2b")), "gemma")
    assert gemma.attention_window == 4096 and gemma.attention_pattern[:2] == ("window", "full")
    assert gemma.extra_layer_params == 2 * 2304 and gemma.kv_heads == 4 and gemma.head_dim == 256
    phi = spec_from_measurement(measurement(_config("phi-3-mini-4k-instruct")), "phi3")
    assert phi.mlp == "swiglu" and phi.ffn_hidden == 8192 and not phi.tied_embeddings  # fused gate_up read


@needs_transformers
@pytest.mark.parametrize("name", ["bloom-560m", "falcon-7b", "gemma-2-2b", "phi-3-mini-4k-instruct"])
def test_measured_flops_are_what_the_spec_prices(name: str) -> None:
    """The GEMM FLOPs the estimator derives from the measured spec are the measured ones (within 1%)."""
    record = measurement(_config(name))
    spec = spec_from_measurement(record, name)
    for kind, part in record["kinds"].items():
        measured = part["flops_fwd"][0] + part["flops_bwd"][0]
        priced = 6 * spec.matmul_params_per_token(spec.layer_kinds()[spec.layer_kinds().index(
            next(k for k in spec.layer_kinds() if k.attention == kind))])  # fmt: skip
        assert measured == pytest.approx(priced, rel=0.01), kind


# Families with an adapter: the measured spec equals the adapted one, and the FLOPs agree.
ADAPTED = ["llama3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b", "gpt-neox-20b"]
FIELDS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "mlp", "norm", "norm_bias",
          "qkv_bias", "out_bias", "mlp_bias", "qk_norm", "tied_embeddings", "position", "pos_embedding_rows",
          "attention_window", "attention_pattern")  # fmt: skip


@needs_transformers
@pytest.mark.parametrize("name", ADAPTED)
def test_measured_and_adapted_agree(name: str) -> None:
    adapted = load_model(name)
    record = measurement(catalog_config(name))
    measured = spec_from_measurement(record, name)
    assert record["params_total"] == measured.params_total == adapted.params_total
    assert {f: getattr(measured, f) for f in FIELDS} == {f: getattr(adapted, f) for f in FIELDS}
    assert measured.extra_layer_params == measured.extra_params == 0
    assert measured.parallel_block == (name == "gpt-neox-20b")  # GPT-NeoX's use_parallel_residual
    ((kind, part),) = record["kinds"].items()
    layer = adapted.layer_kinds()[0]
    # Per token: 2 FLOPs per weight forward, 4 backward; the eager attention's two score matmuls cover the
    # s x s square: 4·heads·head_dim per token per key forward, twice that backward.
    assert part["flops_fwd"][0] + part["flops_bwd"][0] == pytest.approx(6 * adapted.matmul_params_per_token(layer),
                                                                        rel=0.01)  # fmt: skip
    assert part["flops_fwd"][1] == pytest.approx(4 * adapted.heads * adapted.head_dim, rel=0.01)
    assert part["flops_bwd"][1] == pytest.approx(8 * adapted.heads * adapted.head_dim, rel=0.01)
    seq = 4096
    whole = adapted.layers * (6 * adapted.matmul_params_per_token(layer) + 12 * adapted.heads * adapted.head_dim * seq)
    whole += 6 * adapted.vocab * adapted.hidden  # the output layer
    assert flops_per_token(record, seq) == pytest.approx(whole, rel=0.01)
    # GEMM shapes: one row per token, the weights' sizes as N and K.
    shapes = {(n, k) for _, n, k, _ in part["gemms"]}
    assert (adapted.q_dim, adapted.hidden) in shapes or (adapted.q_dim + 2 * adapted.kv_dim, adapted.hidden) in shapes
    assert all(rows == 1.0 for rows, *_ in part["gemms"])


@needs_transformers
def test_bloom_adapter_is_the_module_transformers_builds() -> None:
    """BLOOM's adapter (what the catalog's bloom-176b goes through without the extra) reads the block
    transformers builds: ALiBi, biases, the embedding LayerNorm, the tied output layer."""
    cfg = _config("bloom-560m")
    adapted = model_from_hf_config(cfg, "bloom")
    measured = spec_from_measurement(measurement(cfg), "bloom")
    assert adapted.params_total == measured.params_total == PUBLISHED["bloom-560m"]
    assert {f: getattr(measured, f) for f in FIELDS} == {f: getattr(adapted, f) for f in FIELDS}
    assert adapted.extra_params == measured.extra_params


@needs_transformers
def test_measurement_cached_by_config_hash(_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config("opt-125m")
    first = measurement(cfg)
    path = cache_path(cfg)
    assert path.parent == _cache and path.is_file()
    import shardscope.measure.meta as meta

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(meta, "measure_config", fail)
    assert measurement(cfg) == first  # from the cache
    assert cache_path(cfg | {"ffn_dim": 1024}) != path  # another config: another key
    with pytest.raises(AssertionError, match="measured again"):
        measurement(cfg | {"ffn_dim": 1024})


@needs_transformers
def test_remote_code_needs_the_users_consent(tmp_path: Path) -> None:
    """A model_type transformers does not ship is never built from the checkpoint's code unasked."""
    cfg = {"model_type": "acme_lm", "auto_map": {"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ShardscopeError, match="pass --trust-remote-code") as err:
        load_model(str(tmp_path))
    assert "\n" not in str(err.value)
    with trusting_remote_code(), pytest.raises(ShardscopeError, match="unsupported model_type 'acme_lm'"):
        load_model(str(tmp_path))  # allowed, but the folder ships no code: an error, not a crash
    # A family transformers ships is built from its own code even when the config names remote code.
    assert "auto_map" in _config("phi-3-mini-4k-instruct")


@needs_transformers
def test_not_a_causal_lm_is_one_line() -> None:
    with pytest.raises(ShardscopeError, match="unsupported model_type 't5'.*causal LM"):
        model_from_hf_config({"model_type": "t5"})


@needs_transformers
def test_cli_estimate_states_the_measurement() -> None:
    r = CliRunner().invoke(app, ["estimate", str(CONFIGS / "falcon-7b.json"), "--gpus", "8", "--json",
                                 "--trust-remote-code"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["params"]["total"] == PUBLISHED["falcon-7b"]
    assert any("structure measured" in w for w in out["warnings"])


@needs_transformers
def test_blocks_the_fields_cannot_describe_are_priced_from_the_measurement() -> None:
    """Dense and MoE blocks mixed (Qwen2-MoE's mlp_only_layers) were refused; they are priced wholly from
    what was measured now, said in one warning, their parameters exact (Mamba/SSM hybrids:
    tests/test_measure_hybrid.py)."""
    cfg = {"model_type": "qwen2_moe", "num_hidden_layers": 2, "mlp_only_layers": [0]}
    with pytest.warns(ShardscopeWarning, match="dense and mixture-of-experts blocks mixed: its blocks are priced"):
        spec = model_from_hf_config(cfg, "qwen2-moe-mixed")
    assert [k.mlp for k in spec.layer_kinds()] == ["measured", "measured"]
    assert spec.params_total == measurement(cfg)["params_total"] and spec.params_active < spec.params_total


@needs_transformers
def test_cached_measurement_is_read_without_torch(_cache: Path) -> None:
    """Once measured, a config loads from the cache without importing torch or transformers."""
    path = CONFIGS / "gemma-2-2b.json"
    measured = load_model(str(path))
    code = (
        "import sys, warnings; warnings.simplefilter('ignore'); from shardscope.models.catalog import load_model; "
        f"m = load_model({str(path)!r}); "
        "print(m.params_total, sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    env = {**os.environ, ENV_DIR: str(_cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == [str(measured.params_total), "[]"]


# The measured path prices the same as the adapted one for families with an adapter: a Megatron-style plan
# (TP with sequence parallel, flash attention, fused kernels) and a PyTorch-native eager one.
PLANS = {
    "megatron": dict(tp=2, seq_len=4096, micro_batch=1, global_batch=16),
    "eager": dict(seq_len=2048, micro_batch=2, global_batch=16, eager_elementwise=True, linear_impl="torch"),
}


@needs_transformers
@pytest.mark.parametrize("plan_name", sorted(PLANS))
@pytest.mark.parametrize("name", ["llama3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b"])
def test_measured_path_prices_as_the_adapter(name: str, plan_name: str) -> None:
    from shardscope import setup
    from shardscope.analytic.step import estimate_step

    adapted, cluster, plan = setup(name, "H100", 8, **PLANS[plan_name])
    measured = spec_from_measurement(measurement(catalog_config(name)), name)
    assert measured.measured_blocks and not adapted.measured_blocks  # the measured path is the one taken
    a, m = estimate_step(adapted, cluster, plan), estimate_step(measured, cluster, plan)
    assert m.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    assert m.memory.peak_gib == pytest.approx(a.memory.peak_gib, rel=0.01)
    assert m.memory.activations_gib == pytest.approx(a.memory.activations_gib, rel=0.01)


# Transformers' eager code as the plan: unfused attention, eager norms and RoPE, nn.Linear GEMMs.
HF_EAGER = dict(micro_batch=1, global_batch=1, seq_len=4096, attention_kernel="unfused", eager_elementwise=True,
                linear_impl="torch")  # fmt: skip


@needs_transformers
@pytest.mark.parametrize("name", ["gemma-2-2b", "falcon-7b", "bloom-560m"])
def test_measured_saved_bytes_are_the_graphs(name: str) -> None:
    """Per block, at the plan's sequence length, the saved bytes of the reconciled graph under an HF-eager
    plan are the measured ones within 5%; the standard graph of the same fields misses them by more (Gemma-2's
    extra norms and soft-capped scores, Falcon's one shared norm and its scores kept once in bf16)."""
    from dataclasses import replace

    from shardscope.graph.build import layer_group

    record = measurement(_config(name))
    spec = spec_from_measurement(record, name)
    plan = Plan(**HF_EAGER)
    s = plan.seq_len
    for kind in dict.fromkeys(spec.layer_kinds()):
        a, b = record["kinds"][kind.attention]["saved_bytes"]
        measured = a * s + b * s * s
        graph = layer_group(spec, plan, kind=kind).saved_bytes("none")
        standard = layer_group(replace(spec, measured_blocks=()), plan, kind=kind).saved_bytes("none")
        assert graph == pytest.approx(measured, rel=0.05), kind
        if name != "bloom-560m":
            assert standard != pytest.approx(measured, rel=0.05), kind
    ops = {op.name for op in layer_group(spec, Plan(seq_len=4096)).ops}
    if name == "gemma-2-2b":  # two norms beyond the standard two, as norm ops
        assert {"measured extra norm 0", "measured extra norm 1"} <= ops
    if name == "falcon-7b":  # one norm shared by the parallel attention and MLP
        assert "mlp norm" not in ops and "attn norm" in ops


def test_measured_gemms_matched_to_the_standard_ones() -> None:
    """Separate q, k, v calls make the fused qkv projection; a GEMM the standard block lacks is left over,
    and a standard one nothing measured matches is reported missing."""
    from shardscope.graph.measured import match_gemms

    standard = {"qkv proj": (96, 64), "out proj": (64, 64), "gate/up proj": (256, 64), "down proj": (64, 128)}
    measured = [(1.0, 16, 64, 2), (1.0, 64, 64, 2), (1.0, 128, 64, 2), (1.0, 64, 128, 1), (1.0, 32, 64, 1)]
    missing, extra = match_gemms(standard, measured)
    assert missing == [] and extra == [(1.0, 32, 64)]
    missing, extra = match_gemms(standard, [(1.0, 96, 64, 1), (1.0, 64, 64, 1), (1.0, 64, 128, 1)])
    assert missing == ["gate/up proj"] and extra == []


@needs_transformers
@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_measured_moe_agrees_with_the_adapter(name: str) -> None:
    """MoE blocks measured on the meta device (transformers' batched experts, no data-dependent shapes):
    the MoE fields, exact parameters, and FLOPs per token within 1% of the adapted model's."""
    adapted = load_model(name)
    record = measurement(catalog_config(name))
    measured = spec_from_measurement(record, name)
    assert record["params_total"] == measured.params_total == adapted.params_total
    assert measured.moe == adapted.moe and measured.extra_layer_params == 0
    # every block is MoE: the dense FFN size a config may state (Qwen3-MoE's intermediate_size) sizes nothing
    same = [f for f in FIELDS if f != "ffn_hidden"]
    assert {f: getattr(measured, f) for f in same} == {f: getattr(adapted, f) for f in same}
    ((kind, part),) = record["kinds"].items()
    moe = adapted.moe
    assert moe is not None
    # each token runs top-k experts: top-k rows per token of the experts' gate/up and down products
    up = 2 * moe.expert_ffn if adapted.mlp == "swiglu" else moe.expert_ffn
    expected = [[moe.top_k, adapted.hidden, moe.expert_ffn, 1], [moe.top_k, up, adapted.hidden, 1]]
    assert part["expert_gemms"] == sorted(expected)
    layer = adapted.layer_kinds()[0]
    seq = 4096
    whole = adapted.layers * (6 * adapted.matmul_params_per_token(layer) + 12 * adapted.heads * adapted.head_dim * seq)
    whole += 6 * adapted.vocab * adapted.hidden
    assert flops_per_token(record, seq) == pytest.approx(whole, rel=0.01)
    # the gathered expert weights are not activations: saved bytes per token stay of the block's width
    assert part["saved_bytes"][0] < 200 * adapted.hidden


@needs_transformers
def test_moe_without_adapter_is_measured() -> None:
    """Qwen2-MoE (no adapter): routed experts and a shared expert read from the weights; its sigmoid gate
    on the shared expert is the block's one parameter vector the fields do not describe."""
    cfg = {"model_type": "qwen2_moe", "num_hidden_layers": 2}
    with pytest.warns(ShardscopeWarning, match="structure measured"):
        spec = model_from_hf_config(cfg, "qwen2-moe")
    moe = spec.moe
    assert moe is not None and (moe.experts, moe.top_k, moe.expert_ffn) == (60, 4, 1408)
    assert (moe.shared_experts, moe.shared_ffn) == (1, 5632) and spec.extra_layer_params == spec.hidden
    record = measurement(cfg)
    assert spec.params_total == record["params_total"]
    seq = 2048
    layer = spec.layer_kinds()[0]
    whole = spec.layers * (6 * spec.matmul_params_per_token(layer) + 12 * spec.heads * spec.head_dim * seq)
    assert flops_per_token(record, seq) == pytest.approx(whole + 6 * spec.vocab * spec.hidden, rel=0.01)
