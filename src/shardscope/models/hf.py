"""Read a Hugging Face `config.json` into a ModelSpec.

Dense: Llama 1–3.x, Mistral, Qwen2/2.5/3 (`model_type` llama/mistral/qwen2/qwen3), GPT-2 (`gpt2`),
GPT-NeoX (`gpt_neox`), MPT (`mpt`). MoE: Mixtral (`mixtral`), Qwen3-MoE (`qwen3_moe`), DeepSeek-V2/V3,
Moonlight and Kimi-K2 (`deepseek_v2`, `deepseek_v3`, `kimi_k2`), GPT-OSS (`gpt_oss`), Llama 4
(`llama4`, `llama4_text`). Field names are those of the transformers config classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.models.spec import GPT_BLOCK, DiTSpec, MLASpec, ModelSpec, MoESpec

LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "olmo2", "granite"}
SUPPORTED = sorted(
    LLAMA_LIKE
    | {"gpt2", "gpt_neox", "mpt", "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss"}
    | {"llama4", "llama4_text"}
)


def _need(cfg: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise ShardscopeError(f"config.json has no {' / '.join(keys)} (model_type {cfg.get('model_type')!r})")


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShardscopeError(f"config.json: {name} must be a positive integer, got {value!r}")
    return value


def _conventions(cfg: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling and the norm epsilon: no cost of their own, but a launch config needs them."""
    scaling = cfg.get("rope_scaling") or {}
    return dict(
        rope_theta=float(cfg.get("rope_theta") or cfg.get("rotary_emb_base") or 10000.0),
        rope_scaling=tuple(sorted((k, v) for k, v in scaling.items() if isinstance(v, (int, float, str)))),
        norm_eps=float(
            next((cfg[k] for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon") if cfg.get(k)), 1e-5)
        ),
    )


def _sliding_window(cfg: dict[str, Any]) -> int:
    """Mistral and Mixtral: a set `sliding_window` bounds the attention of every layer (transformers'
    MistralAttention / MixtralAttention pass it to each layer's kernel; no pattern: `ModelSpec.layer_kind`);
    null means full attention."""
    return int(cfg.get("sliding_window") or 0)


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
        **_conventions(cfg),
        attention_window=_sliding_window(cfg) if model_type == "mistral" else 0,
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
        **_conventions(cfg),
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
        **_conventions(cfg),
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


def _base(name: str, cfg: dict[str, Any], **kw: Any) -> ModelSpec:
    hidden = _positive("hidden_size", _need(cfg, "hidden_size"))
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    fields = dict(
        name=name,
        hidden=hidden,
        layers=_positive("num_hidden_layers", _need(cfg, "num_hidden_layers")),
        heads=heads,
        kv_heads=_positive("num_key_value_heads", cfg.get("num_key_value_heads") or heads),
        head_dim=_positive("head_dim", cfg.get("head_dim") or hidden // heads),
        ffn_hidden=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        vocab=_positive("vocab_size", _need(cfg, "vocab_size")),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        **_conventions(cfg),
    )
    return ModelSpec(**(fields | kw))


def _mixtral(name: str, cfg: dict[str, Any]) -> ModelSpec:
    experts = _positive("num_local_experts", _need(cfg, "num_local_experts"))
    moe = MoESpec(
        experts=experts,
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok")),
        expert_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
    )
    return _base(name, cfg, moe=moe, attention_window=_sliding_window(cfg))


def _qwen3_moe(name: str, cfg: dict[str, Any]) -> ModelSpec:
    if cfg.get("mlp_only_layers"):
        raise ShardscopeError("qwen3_moe configs with mlp_only_layers are not supported")
    moe = MoESpec(
        experts=_positive("num_experts", _need(cfg, "num_experts")),
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok")),
        expert_ffn=_positive("moe_intermediate_size", _need(cfg, "moe_intermediate_size")),
        layer_step=_positive("decoder_sparse_step", cfg.get("decoder_sparse_step") or 1),
        normalize_top_k=bool(cfg.get("norm_topk_prob", False)),
    )
    return _base(name, cfg, moe=moe, qk_norm=True, qkv_bias=bool(cfg.get("attention_bias", False)))


def _deepseek(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """DeepSeek-V2/V3 layout (also Moonlight, Kimi-K2): MLA, shared + routed experts, first dense layers."""
    mla = MLASpec(
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=_positive("kv_lora_rank", _need(cfg, "kv_lora_rank")),
        qk_nope_head_dim=_positive("qk_nope_head_dim", _need(cfg, "qk_nope_head_dim")),
        qk_rope_head_dim=_positive("qk_rope_head_dim", _need(cfg, "qk_rope_head_dim")),
        v_head_dim=_positive("v_head_dim", _need(cfg, "v_head_dim")),
    )
    experts = _positive("n_routed_experts", _need(cfg, "n_routed_experts"))
    moe_ffn = _positive("moe_intermediate_size", _need(cfg, "moe_intermediate_size"))
    moe = MoESpec(
        experts=experts,
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok")),
        expert_ffn=moe_ffn,
        shared_experts=1 if cfg.get("n_shared_experts") else 0,
        shared_ffn=moe_ffn * int(cfg.get("n_shared_experts") or 0),  # one MLP of n_shared x the expert size
        first_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
        layer_step=int(cfg.get("moe_layer_freq") or 1),
        score_correction_bias=cfg.get("topk_method") == "noaux_tc",
        groups=int(cfg.get("n_group") or 1),
        groups_per_token=int(cfg.get("topk_group") or 1),
        score="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
        normalize_top_k=bool(cfg.get("norm_topk_prob", False)),  # DeepseekV2Config's default
        routed_scaling=float(cfg.get("routed_scaling_factor") or 1.0),
    )
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    return _base(
        name,
        cfg,
        kv_heads=heads,
        head_dim=mla.qk_head_dim,
        mla=mla,
        moe=moe,
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
    )


def _gpt_oss(name: str, cfg: dict[str, Any]) -> ModelSpec:
    moe = MoESpec(
        experts=_positive("num_local_experts", _need(cfg, "num_local_experts")),
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok", "experts_per_token")),
        expert_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        router_bias=True,
        expert_bias=True,
    )
    layers = _positive("num_hidden_layers", _need(cfg, "num_hidden_layers"))
    types = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    pattern = tuple("window" if t == "sliding_attention" else "full" for t in types)
    return _base(
        name,
        cfg,
        moe=moe,
        qkv_bias=bool(cfg.get("attention_bias", True)),
        out_bias=bool(cfg.get("attention_bias", True)),
        sinks=True,
        glu_gate="quick_gelu",  # OpenAI's reference: gate·σ(1.702·gate), clamped (swiglu_limit)
        glu_clamp=float(cfg.get("swiglu_limit") or 0.0),
        attention_window=int(cfg.get("sliding_window") or 0),
        attention_pattern=pattern,
    )


def _llama4(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """Llama 4 text model (the vision tower of the checkpoint is not counted)."""
    cfg = cfg.get("text_config", cfg)
    step = int(cfg.get("interleave_moe_layer_step") or 1)
    moe = MoESpec(
        experts=_positive("num_local_experts", _need(cfg, "num_local_experts")),
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok")),
        expert_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        shared_experts=1,
        shared_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        layer_step=step,
        score="sigmoid",  # Llama 4 weighs its top-1 expert by the sigmoid of its logit
    )
    layers = _positive("num_hidden_layers", _need(cfg, "num_hidden_layers"))
    no_rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
    chunk = int(cfg.get("attention_chunk_size") or 0)
    # RoPE layers use chunked attention; the NoPE layers (every 4th) attend globally.
    pattern = tuple("chunk" if (uses_rope and chunk) else "full" for uses_rope in no_rope)
    dense_ffn = int(cfg.get("intermediate_size_mlp") or cfg.get("intermediate_size"))
    return _base(
        name, {**cfg, "intermediate_size": dense_ffn}, moe=moe, attention_window=chunk, attention_pattern=pattern
    )


_PARSERS = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "mpt": _mpt,
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "gpt_oss": _gpt_oss,
    "llama4": _llama4,
    "llama4_text": _llama4,
} | {t: _llama_like for t in LLAMA_LIKE}


def _dit_model(name: str, cfg: dict[str, Any], layers: int, ffn: int | None, dit: DiTSpec) -> ModelSpec:
    """The ModelSpec of a video DiT: MHA over heads x attention_head_dim, q/k norm, RoPE, GeLU MLP."""
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    head_dim = _positive("attention_head_dim", _need(cfg, "attention_head_dim"))
    d = heads * head_dim
    return ModelSpec(
        name=name,
        hidden=d,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=head_dim,
        ffn_hidden=ffn or int(float(cfg.get("mlp_ratio") or 4.0) * d),
        vocab=0,
        mlp="gelu",
        norm="layernorm",
        qk_norm=True,
        qk_norm_across_heads=cfg.get("qk_norm") == "rms_norm_across_heads",
        position="rope",
        dit=dit,
    )


def _wan(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """diffusers WanTransformer3DModel (Wan 2.1 text-to-video). Text: umT5, 512 tokens."""
    dit = DiTSpec(
        family="wan",
        in_channels=int(_need(cfg, "in_channels")),
        out_channels=int(_need(cfg, "out_channels")),
        patch=tuple(cfg.get("patch_size") or (1, 2, 2)),
        text_dim=int(_need(cfg, "text_dim")),
        text_len=512,
        freq_dim=int(cfg.get("freq_dim") or 256),
        cross_attn_norm=bool(cfg.get("cross_attn_norm", True)),
    )
    layers = _positive("num_layers", _need(cfg, "num_layers"))
    return _dit_model(name, cfg, layers, _positive("ffn_dim", _need(cfg, "ffn_dim")), dit)


def _hunyuan_video(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """diffusers HunyuanVideoTransformer3DModel: dual-stream then single-stream blocks. Text: LLaVA-LLaMA
    hidden states (4096-d, 256 tokens) through a token refiner, plus CLIP pooled (768-d)."""
    p = int(cfg.get("patch_size") or 2)
    double = int(_need(cfg, "num_layers"))
    dit = DiTSpec(
        family="hunyuan",
        in_channels=int(_need(cfg, "in_channels")),
        out_channels=int(_need(cfg, "out_channels")),
        patch=(int(cfg.get("patch_size_t") or 1), p, p),
        text_dim=int(_need(cfg, "text_embed_dim")),
        text_len=256,
        double_layers=double,
        refiner_layers=int(cfg.get("num_refiner_layers") or 2),
        pooled_dim=int(cfg.get("pooled_projection_dim") or 768),
        guidance=bool(cfg.get("guidance_embeds")),
    )
    return _dit_model(name, cfg, double + int(_need(cfg, "num_single_layers")), None, dit)


_DIFFUSERS = {"WanTransformer3DModel": _wan, "HunyuanVideoTransformer3DModel": _hunyuan_video}


def model_from_hf_config(cfg: dict[str, Any], name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from the parsed content of an HF config.json (or a diffusers transformer config)."""
    if not isinstance(cfg, dict):
        raise ShardscopeError("config.json must hold a JSON object")
    if "_class_name" in cfg and "model_type" not in cfg:
        cls = cfg["_class_name"]
        if cls not in _DIFFUSERS:
            raise ShardscopeError(f"unsupported diffusers model {cls!r} (supported: {', '.join(sorted(_DIFFUSERS))})")
        return _DIFFUSERS[cls](name, cfg)
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
