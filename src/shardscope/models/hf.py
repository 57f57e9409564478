"""Read a Hugging Face `config.json` (dense decoder families) into a ModelSpec.

Families: Llama 1–3.x, Mistral, Qwen2/2.5/3 (`model_type` llama/mistral/qwen2/qwen3), GPT-2 (`gpt2`),
GPT-NeoX (`gpt_neox`) and MPT (`mpt`). Field names are those of the transformers config classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.models.spec import GPT_BLOCK, ModelSpec

LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "olmo2", "granite"}
SUPPORTED = sorted(LLAMA_LIKE | {"gpt2", "gpt_neox", "mpt"})


def _need(cfg: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise ShardscopeError(f"config.json has no {' / '.join(keys)} (model_type {cfg.get('model_type')!r})")


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShardscopeError(f"config.json: {name} must be a positive integer, got {value!r}")
    return value


def _llama_like(name: str, cfg: dict[str, Any]) -> ModelSpec:
    hidden = _positive("hidden_size", _need(cfg, "hidden_size"))
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    kv_heads = _positive("num_key_value_heads", cfg.get("num_key_value_heads") or heads)
    head_dim = _positive("head_dim", cfg.get("head_dim") or hidden // heads)
    model_type = cfg["model_type"]
    qkv_bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=_positive("num_hidden_layers", _need(cfg, "num_hidden_layers")),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        vocab=_positive("vocab_size", _need(cfg, "vocab_size")),
        mlp="swiglu",
        norm="rmsnorm",
        qkv_bias=qkv_bias,
        out_bias=bool(cfg.get("attention_bias", False)) and model_type != "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type in {"qwen3", "olmo2"},
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        position="rope",
    )


def _gpt2(name: str, cfg: dict[str, Any]) -> ModelSpec:
    hidden = _positive("n_embd", _need(cfg, "n_embd", "hidden_size"))
    heads = _positive("n_head", _need(cfg, "n_head", "num_attention_heads"))
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=_positive("n_layer", _need(cfg, "n_layer", "num_hidden_layers")),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden=_positive("n_inner", cfg.get("n_inner") or 4 * hidden),
        vocab=_positive("vocab_size", _need(cfg, "vocab_size")),
        **GPT_BLOCK,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        position="learned",
        pos_embedding_rows=_positive("n_positions", _need(cfg, "n_positions", "n_ctx")),
    )


def _gpt_neox(name: str, cfg: dict[str, Any]) -> ModelSpec:
    hidden = _positive("hidden_size", _need(cfg, "hidden_size"))
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    bias = bool(cfg.get("attention_bias", True))
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=_positive("num_hidden_layers", _need(cfg, "num_hidden_layers")),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        vocab=_positive("vocab_size", _need(cfg, "vocab_size")),
        mlp="gelu",
        norm="layernorm",
        norm_bias=True,
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        position="rope",
    )


def _mpt(name: str, cfg: dict[str, Any]) -> ModelSpec:
    hidden = _positive("d_model", _need(cfg, "d_model"))
    heads = _positive("n_heads", _need(cfg, "n_heads"))
    attn = cfg.get("attn_config") or {}
    kv_heads = int(attn.get("kv_n_heads") or heads)
    bias = not bool(cfg.get("no_bias", False))
    # The released modeling_mpt.py creates the position table only without ALiBi (`if not self.alibi`).
    learned = bool(cfg.get("learned_pos_emb", True)) and not attn.get("alibi", False)
    ratio = cfg.get("expansion_ratio", 4)
    ffn = cfg.get("ffn_config", {}).get("ffn_hidden_size") or int(ratio * hidden)
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=_positive("n_layers", _need(cfg, "n_layers")),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        ffn_hidden=_positive("ffn_hidden_size", ffn),
        vocab=_positive("vocab_size", _need(cfg, "vocab_size")),
        mlp="gelu",
        norm="layernorm",
        norm_bias=bias,
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bias,
        tied_embeddings=not bool(cfg.get("tie_word_embeddings") is False),
        position="alibi" if attn.get("alibi", False) else "learned",
        pos_embedding_rows=_positive("max_seq_len", _need(cfg, "max_seq_len")) if learned else 0,
    )


_PARSERS = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "mpt": _mpt} | {t: _llama_like for t in LLAMA_LIKE}


def model_from_hf_config(cfg: dict[str, Any], name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from the parsed content of an HF config.json."""
    if not isinstance(cfg, dict):
        raise ShardscopeError("config.json must hold a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in _PARSERS:
        raise ShardscopeError(
            f"unsupported model_type {model_type!r} in config.json (supported: {', '.join(SUPPORTED)})"
        )
    return _PARSERS[model_type](name, cfg)


def load_hf_config_file(path: Path) -> ModelSpec:
    """Read a config.json file from disk; a malformed file is a ShardscopeError."""
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardscopeError(f"config file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShardscopeError(f"malformed config file {path}: {exc}") from None
    return model_from_hf_config(cfg, name=path.parent.name if path.name == "config.json" else path.stem)
