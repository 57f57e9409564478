import json

import pytest

from shardscope.errors import ShardscopeError
from shardscope.models.catalog import catalog_sources, list_models, load_model
from shardscope.models.hf import model_from_hf_config

REQUIRED = [
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.1-405b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-32b",
    "mistral-7b",
    "mpt-7b",
    "mpt-30b",
    "gpt3-175b",
]


def test_catalog_has_required_models():
    assert set(REQUIRED) <= set(list_models())
    assert sum(n.startswith("megatron-gpt-") for n in list_models()) == 10


@pytest.mark.parametrize(
    "name", [n for n, s in catalog_sources().items() if s.get("params_total") and n in list_models()]
)
def test_exact_parameter_count_matches_checkpoint(name):
    """Counts of the real checkpoints' tensors (safetensors totals / model cards; see SOURCES.json)."""
    assert load_model(name).params_total == catalog_sources()[name]["params_total"]


@pytest.mark.parametrize(
    "name,billions",
    [
        ("1.7b", 1.7),
        ("3.6b", 3.6),
        ("7.5b", 7.5),
        ("18.4b", 18.4),
        ("39.1b", 39.1),
        ("76.1b", 76.1),
        ("145.6b", 145.6),
        ("310.1b", 310.1),
        ("529.6b", 529.6),
        ("1t", 1008.0),
    ],
)
def test_megatron_table1_sizes(name, billions):
    """Narayanan et al. 2021 Table 1 prints each size to 0.1 B."""
    assert round(load_model(f"megatron-gpt-{name}").params_total / 1e9, 1) == pytest.approx(billions, abs=0.051)


@pytest.mark.parametrize("alias", ["Llama-3.1-70B", "meta-llama/Llama-3.1-70B", "llama3.1_70b", "LLAMA3.1-70B"])
def test_aliases_resolve(alias):
    assert load_model(alias).name == "llama3.1-70b"


@pytest.mark.parametrize(
    "alias,name",
    [
        ("wan2.1-14b", "wan2.1-t2v-14b"),
        ("Wan2.1-1.3B", "wan2.1-t2v-1.3b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("Kimi-K2-Instruct", "kimi-k2"),
    ],
)
def test_short_names(alias, name):
    assert load_model(alias).name == name


def test_unknown_model_suggests_close_names():
    with pytest.raises(ShardscopeError, match="did you mean.*llama3.1-70b"):
        load_model("llama3.1-71b")


def test_config_file_path(tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    attn = 256 * (256 + 2 * 128) + 256 * 256
    assert m.params_total == 1000 * 256 + 2 * (attn + 3 * 256 * 512 + 2 * 256) + 256


@pytest.mark.parametrize(
    "content,match",
    [
        ("{not json", "malformed"),
        ("[1, 2]", "JSON object"),
        ('{"model_type": "t5"}', "unsupported model_type"),
        ('{"model_type": "llama"}', "hidden_size"),
        ('{"model_type": "llama", "hidden_size": -4}', "positive"),
    ],
)
def test_malformed_configs(tmp_path, content, match):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ShardscopeError, match=match):
        load_model(str(path))


def test_qwen2_has_qkv_bias_and_untied_head():
    m = model_from_hf_config(
        {
            "model_type": "qwen2",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 10,
            "tie_word_embeddings": False,
        }
    )
    assert m.qkv_bias and not m.out_bias and not m.tied_embeddings


def test_deepseek_v3_reconciles_with_the_checkpoint():
    """HF total 684,531,386,000 = main model + MTP layer (with its own embedding and head copies) +
    FP32 scale_inv tensors (the F32 count minus the 59 x 256 e_score_correction_bias values)."""
    m = load_model("deepseek-v3")
    src = catalog_sources()["deepseek-v3"]
    scale_inv = src["params_hf_safetensors_breakdown"]["F32"] - (m.moe_layers + m.mtp_layers) * m.moe.experts
    hf_main_and_mtp = src["params_hf_safetensors_total"] - scale_inv
    assert m.params_total + m.params_mtp + 2 * m.vocab * m.hidden == hf_main_and_mtp
    assert m.params_total == src["params_main_model_shape_identical"]  # BF16 re-save without MTP
    assert 37e9 < m.params_active < 38e9  # "37B activated" (DeepSeek-V3 report)


def test_llama4_text_counts_share_one_vision_tower():
    """Scout and Maverick checkpoints carry the same vision encoder: the text-model counts must differ
    from the HF totals by the same amount."""
    src = catalog_sources()
    gaps = {
        n: src[n]["params_hf_total_with_vision"] - load_model(n).params_total
        for n in ("llama4-scout", "llama4-maverick")
    }
    assert gaps["llama4-scout"] == gaps["llama4-maverick"] > 0


@pytest.mark.parametrize(
    "name,active_b",
    [
        ("mixtral-8x7b", 12.9),
        ("qwen3-30b-a3b", 3.3),
        ("qwen3-235b-a22b", 22.2),
        ("gpt-oss-120b", 5.1),
        ("gpt-oss-20b", 3.6),
    ],
)
def test_active_parameters_match_published(name, active_b):
    """Model cards: Mixtral 12.9B active, Qwen3 A3B / A22B, gpt-oss 5.1B / 3.6B active (gpt-oss counts
    exclude embeddings: the card's figures are for the transformer blocks + unembedding)."""
    m = load_model(name)
    active = m.params_active
    if name.startswith("gpt-oss"):
        active -= m.vocab * m.hidden  # the card excludes the embedding table
    assert active / 1e9 == pytest.approx(active_b, rel=0.03)


def test_glm4_moe_config_is_read_as_transformers_builds_it():
    """GLM-4.5-Air (`glm4_moe`): q/k/v biases without an output bias, DeepSeek-V3's MoE (sigmoid router with a
    correction bias, one shared expert, the first layer dense) and one MTP module; an MoE block holds the
    2,341,492,736 parameters transformers' Glm4MoeDecoderLayer has (meta-device count) and the router's
    128 score-correction biases, a buffer there but a tensor of the checkpoint (as DeepSeek-V3's)."""
    from shardscope.costs.memory import layer_params_local

    m = load_model("glm-4.5-air")
    assert (m.qkv_bias, m.out_bias, m.qk_norm, m.mtp_layers) == (True, False, False, 1)
    assert (m.moe.experts, m.moe.top_k, m.moe.shared_ffn, m.moe.first_dense_layers) == (128, 8, 1408, 1)
    assert m.moe.score == "sigmoid" and m.moe.score_correction_bias
    moe_kind = m.layer_kind(1)
    assert moe_kind.mlp == "moe" and m.layer_kind(0).mlp != "moe"
    assert layer_params_local(m, 1, moe_kind) == 2_341_492_736 + 128
