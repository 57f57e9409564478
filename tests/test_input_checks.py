"""Inputs checked as the frameworks check them (issue 50, item 4): a model no framework would build, a
misspelt config key, a cluster or a context past any built or trained. Errors are one line on stderr with
exit status 2 and no traceback; warnings are one `warning:` line and the estimate goes on."""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app
from shardscope.errors import ShardscopeError, ShardscopeWarning
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import catalog_config, list_models, load_model
from shardscope.models.hf import READ_KEYS, model_from_hf_config
from shardscope.models.spec import MAX_EXPERTS, MAX_LAYERS, ModelSpec, MoESpec
from shardscope.plan.plan import GPUS_MAX, GPUS_WARN, SEQ_LEN_MAX, SEQ_LEN_WARN, make_plan

runner = CliRunner()


def run(*args: str) -> Any:
    return runner.invoke(app, list(args))


def estimate_config(cfg: dict[str, Any], *flags: str) -> Any:
    """`shardscope estimate <config.json> --gpu H100 --gpus 8 --json` on `cfg` written to a file."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(cfg))
        return run("estimate", str(path), "--gpu", "H100", "--gpus", "8", "--json", *flags)


def assert_one_line_error(r: Any, *needles: str) -> None:
    """Exit status 2, no exception escaped (a traceback), one `error:` line on stderr holding `needles`."""
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output, repr(r.exception)
    lines = [line for line in r.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def assert_estimated_or_refused(r: Any) -> None:
    """Either an estimate (exit 0, JSON on stdout, only warnings on stderr) or a one-line refusal."""
    if r.exit_code != 0:
        assert_one_line_error(r)
        return
    assert math.isfinite(json.loads(r.stdout)["step_time_s"])
    assert all(line.startswith("warning: ") for line in r.stderr.splitlines()), r.stderr


# ----- the model ----------------------------------------------------------------------------------------
def test_topk_above_experts_refused() -> None:
    cfg = catalog_config("mixtral-8x7b") | {"num_experts_per_tok": 16}  # 8 experts: Mixtral routes 2
    r = estimate_config(cfg)
    assert_one_line_error(r, "top-k", "1 to 8", "16")
    with pytest.raises(ShardscopeError, match="top-k"):
        model_from_hf_config(cfg)
    # a spec built from columns (a validation row, the Python API) is checked the same way
    with pytest.raises(ShardscopeError, match="top-k"):
        ModelSpec("m", 64, 2, 4, 4, 16, 128, 100, moe=MoESpec(experts=4, top_k=5, expert_ffn=32))
    assert model_from_hf_config(catalog_config("mixtral-8x7b") | {"num_experts_per_tok": 8}).moe.top_k == 8


def test_kv_heads_not_dividing_heads_refused() -> None:
    cfg = catalog_config("llama3.1-8b") | {"num_key_value_heads": 5}  # 32 query heads
    assert_one_line_error(estimate_config(cfg), "5 KV heads do not divide the 32 attention heads", "1, 2, 4, 8")
    with pytest.raises(ShardscopeError, match="KV heads"):
        ModelSpec("m", 64, 2, heads=6, kv_heads=4, head_dim=16, ffn_hidden=128, vocab=100)


def test_hidden_not_divisible_by_heads_refused_unless_head_dim_given() -> None:
    cfg = catalog_config("llama3.1-8b") | {"hidden_size": 4100}  # 4100 / 32 heads is no whole head
    assert_one_line_error(estimate_config(cfg), "hidden_size 4100 is not divisible by num_attention_heads 32")
    assert model_from_hf_config(cfg | {"head_dim": 128}).head_dim == 128  # Qwen3 / Gemma: any head size
    gpt2 = catalog_config("gpt2") | {"n_head": 7}
    with pytest.raises(ShardscopeError, match="n_embd 768 is not divisible by n_head 7"):
        model_from_hf_config(gpt2)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("vocab_size", 0, "vocab_size must be a positive integer"),
        ("num_local_experts", 0, "num_local_experts must be a positive integer"),
        ("intermediate_size", -4, "intermediate_size must be a positive integer"),
        ("num_key_value_heads", 0, "num_key_value_heads must be a positive integer"),
        ("num_hidden_layers", "32", "num_hidden_layers must be a positive integer, got '32'"),
        ("rope_theta", "big", "rope_theta must be a positive number"),
        ("rope_scaling", [1, 2], "rope_scaling must be a JSON object"),
        ("sliding_window", -1, "sliding_window must be an integer >= 0"),
        ("model_type", ["mixtral"], "unsupported model_type"),
    ],
)
def test_bad_config_values_refused(key: str, value: Any, needle: str) -> None:
    assert_one_line_error(estimate_config(catalog_config("mixtral-8x7b") | {key: value}), needle)


def test_layers_and_experts_beyond_any_model_refused() -> None:
    """Counts the estimate walks one by one are bounded, so an absurd config is refused, not hung on."""
    with pytest.raises(ShardscopeError, match="beyond any trained transformer"):
        model_from_hf_config(catalog_config("gpt-oss-20b") | {"num_hidden_layers": 10**12})
    with pytest.raises(ShardscopeError, match="beyond any trained transformer"):
        ModelSpec("m", 64, MAX_LAYERS + 1, 4, 4, 16, 128, 100)
    assert ModelSpec("m", 64, MAX_LAYERS, 4, 4, 16, 128, 100).layers == MAX_LAYERS
    with pytest.raises(ShardscopeError, match="experts is beyond any trained model"):
        model_from_hf_config(catalog_config("mixtral-8x7b") | {"num_local_experts": MAX_EXPERTS + 1})
    with pytest.raises(ShardscopeError, match="multi-token-prediction"):
        model_from_hf_config(catalog_config("deepseek-v2-lite") | {"num_nextn_predict_layers": 10**9})


def test_group_limited_routing_checked() -> None:
    """DeepSeek's group-limited routing splits the experts into equal groups and takes top-k from
    `topk_group` of them (Megatron-Core: experts % groups == 0, group top-k <= groups)."""
    v3 = catalog_config("deepseek-v3")  # 256 experts, 8 groups, 4 per token, top-8
    with pytest.raises(ShardscopeError, match="7 expert groups do not divide the 256 experts"):
        model_from_hf_config(v3 | {"n_group": 7})
    with pytest.raises(ShardscopeError, match="groups per token must be 1 to 8"):
        model_from_hf_config(v3 | {"topk_group": 9})
    with pytest.raises(ShardscopeError, match="exceeds the 32 experts of the 1 groups"):
        model_from_hf_config(v3 | {"topk_group": 1, "num_experts_per_tok": 33})


def test_misspelt_config_key_warned_did_you_mean() -> None:
    cfg = catalog_config("llama3.1-70b")  # 64 heads, 8 KV heads
    cfg["num_key_value_head"] = cfg.pop("num_key_value_heads")  # read as missing: multi-head attention
    r = estimate_config(cfg)
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == (
        "warning: config.json: unknown key 'num_key_value_head' ignored; did you mean 'num_key_value_heads'?"
    )
    json.loads(r.stdout)  # the JSON on stdout is untouched
    with pytest.warns(ShardscopeWarning, match="did you mean 'num_key_value_heads'"):
        assert model_from_hf_config(cfg).kv_heads == 64
    # an unrelated key (real configs carry many), or a known one the reader does not need, is no typo
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShardscopeWarning)
        model_from_hf_config(catalog_config("llama3.1-8b") | {"my_custom_flag": 1, "use_sliding_window": False})


def test_catalog_configs_pass_every_check_without_warning() -> None:
    """Every published config in the catalog passes the new checks: a real config that tripped one
    would mean the check is wrong."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShardscopeWarning)
        for name in list_models():
            model_from_hf_config(catalog_config(name), name=name)


# ----- the plan ----------------------------------------------------------------------------------------
def test_gpus_beyond_any_cluster_refused() -> None:
    r = run("estimate", "llama3.1-8b", "--gpus", "1000000000")
    assert_one_line_error(r, "--gpus 1000000000 is beyond any GPU cluster", f"valid: 1 to {GPUS_MAX:,}")
    with pytest.raises(ShardscopeError, match="beyond any GPU cluster"):
        shardscope.estimate("llama3.1-8b", gpus=GPUS_MAX * 2)
    spec = load_model("llama3.1-8b")
    with pytest.warns(ShardscopeWarning, match="more than any public cluster"):
        make_plan(spec, make_cluster("H100", GPUS_WARN * 2), tp=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShardscopeWarning)
        make_plan(spec, make_cluster("H100", GPUS_WARN), tp=8)  # at the limit: no warning


def test_seq_len_beyond_any_context_refused() -> None:
    r = run("estimate", "llama3.1-8b", "--seq-len", "1000000000000")
    assert_one_line_error(r, "--seq-len 1000000000000 is beyond any trained context", f"1 to {SEQ_LEN_MAX:,}")
    with pytest.raises(ShardscopeError, match="beyond any trained context"):
        shardscope.estimate("llama3.1-8b", seq_len=SEQ_LEN_MAX + 1)
    r = run("estimate", "llama3.1-8b", "--seq-len", str(2 * SEQ_LEN_WARN), "--cp", "8", "--json")
    assert r.exit_code == 0, r.output
    assert (
        r.stderr.strip()
        == f"warning: --seq-len {2 * SEQ_LEN_WARN} is longer than contexts trained end to end (~1M tokens)"
    )


def test_tp_error_names_valid_choices() -> None:
    r = run("estimate", "llama3.1-8b", "--gpus", "16", "--tp", "16")  # 8 KV heads
    assert_one_line_error(r, "--tp 16 does not divide the KV heads of llama3.1-8b (8)", "valid --tp: 1, 2, 4, 8")


@pytest.mark.parametrize("flag", ["--moe-skew", "--moe-imbalance", "--capacity-factor"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_moe_flags_refused(flag: str, value: str) -> None:
    assert_one_line_error(run("estimate", "mixtral-8x7b", flag, value), flag)


def test_routing_knobs_bounded_by_what_they_describe() -> None:
    """The hottest of ep ranks gets at most all the tokens (ep times the mean); past experts/top-k a
    capacity factor drops nothing; past a Zipf exponent of 16 one expert takes all the tokens."""
    assert_one_line_error(run("estimate", "mixtral-8x7b", "--moe-imbalance", "2"), "must be 1 to 1")
    assert run("estimate", "mixtral-8x7b", "--ep", "8", "--moe-imbalance", "2", "--json").exit_code == 0
    assert_one_line_error(run("estimate", "mixtral-8x7b", "--capacity-factor", "4.5"), "0 to 4 (experts / top-k")
    assert_one_line_error(run("estimate", "mixtral-8x7b", "--moe-skew", "1e308"), "must be 0 to 16")


# ----- never a traceback -------------------------------------------------------------------------------
BASES = ("llama3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b", "llama4-scout",
         "gpt2", "gpt-neox-20b", "mpt-7b", "wan2.1-t2v-1.3b", "hunyuanvideo")  # fmt: skip

# Values a size or a flag must not take, and random JSON around them
bad_scalar = st.sampled_from([0, -1, -4096, "8", "", 8.5, 1e-9, None, True, False, [], {}, [8], {"a": 1}, 10**30,
                              math.nan, math.inf, -math.inf])  # fmt: skip
junk = bad_scalar | st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.integers(-(10**6), 10**6)
    | st.sampled_from([2**31, 10**12, 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _misspell(key: str, data: st.DataObject) -> str:
    """`key` with one character dropped, doubled or swapped for another."""
    i = data.draw(st.integers(0, max(len(key) - 1, 0)))
    edit = data.draw(st.sampled_from(["drop", "double", "swap"]))
    if edit == "drop":
        return key[:i] + key[i + 1 :]
    if edit == "double":
        return key[: i + 1] + key[i:]
    return key[:i] + data.draw(st.sampled_from("aesx_")) + key[i + 1 :]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), data=st.data())
def test_malformed_configs_never_traceback(base: str, data: st.DataObject) -> None:
    """Random deletions, misspellings, wrong types, zero/negative/huge numbers and nested junk: the CLI
    either estimates (exit 0) or refuses with one line (exit 2), never a traceback."""
    cfg: dict[str, Any] = catalog_config(base)
    target = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg  # Llama 4's sizes
    for _ in range(data.draw(st.integers(1, 4))):
        # mostly the keys the reader reads (given or not: optional ones are junk too), sometimes any
        given_read = sorted(set(target) & READ_KEYS)
        pools = [given_read, given_read, sorted(READ_KEYS), sorted(target)]
        key = data.draw(st.sampled_from(data.draw(st.sampled_from([p for p in pools if p]))))
        action = data.draw(st.sampled_from(["delete", "misspell", "junk", "junk", "add"]))
        if action == "delete":
            target.pop(key, None)
        elif action == "misspell" and key in target:
            target[_misspell(key, data)] = target.pop(key)
        elif action == "junk":
            target[key] = data.draw(junk)
        else:
            target[data.draw(st.text(min_size=1, max_size=8))] = data.draw(junk)
    assert_estimated_or_refused(estimate_config(cfg))


INT_FLAGS = ("--gpus", "--tp", "--pp", "--vpp", "--cp", "--ep", "--etp", "--dp", "--micro-batch",
             "--global-batch", "--seq-len", "--zero", "--shard-group", "--recompute-layers", "--fsdp-prefetch",
             "--gpus-per-node")  # fmt: skip
FLOAT_FLAGS = ("--moe-imbalance", "--moe-skew", "--capacity-factor", "--offload-activations", "--power-limit")
bad_int = st.sampled_from([0, -1, -8, 3, 7, 10**6 + 1, 2**31, 10**12]) | st.integers(-(2**40), 2**40)
bad_float = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e308", "0.5", "2"])


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(["llama3.1-8b", "mixtral-8x7b"]),
    ints=st.lists(st.tuples(st.sampled_from(INT_FLAGS), bad_int), max_size=2),
    floats=st.lists(st.tuples(st.sampled_from(FLOAT_FLAGS), bad_float), max_size=2),
)
def test_bad_flag_values_never_traceback(
    model: str, ints: list[tuple[str, int]], floats: list[tuple[str, str]]
) -> None:
    """Well-typed but senseless flag values (zero, negative, not dividing, astronomically large, NaN):
    exit 0 or one error line with exit 2. (A value of the wrong type is Click's usage error.)"""
    args = [a for flag, value in [*ints, *floats] for a in (flag, str(value))]
    assert_estimated_or_refused(run("estimate", model, "--json", *args))


def test_input_warnings_travel_with_the_estimate() -> None:
    """A warned input is in the JSON's `warnings` (and on stderr), and the tables say it once."""
    cfg = catalog_config("llama3.1-70b")
    cfg["num_key_value_head"] = cfg.pop("num_key_value_heads")
    said = "config.json: unknown key 'num_key_value_head' ignored; did you mean 'num_key_value_heads'?"
    r = estimate_config(cfg)
    assert said in json.loads(r.stdout)["warnings"] and said in r.stderr
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(cfg))
        r = runner.invoke(app, ["estimate", str(path), "--gpus", "8"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert r.output.count("did you mean 'num_key_value_heads'") == 1
    big = shardscope.estimate("llama3.1-8b", seq_len=2 * SEQ_LEN_WARN, cp=8)
    assert any("longer than contexts trained" in w for w in big.warnings)
