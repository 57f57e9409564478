"""Read a Hugging Face `config.json` into a ModelSpec.

Dense: Llama 1–3.x, Mistral, Qwen2/2.5/3 (`model_type` llama/mistral/qwen2/qwen3), GPT-2 (`gpt2`),
GPT-NeoX (`gpt_neox`), MPT (`mpt`), BLOOM (`bloom`). MoE: Mixtral (`mixtral`), Qwen3-MoE (`qwen3_moe`), DeepSeek-V2/V3,
Moonlight and Kimi-K2 (`deepseek_v2`, `deepseek_v3`, `kimi_k2`), GLM-4.5/4.6 (`glm4_moe`), GPT-OSS
(`gpt_oss`), Llama 4 (`llama4`, `llama4_text`). Field names are those of the transformers config classes.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError, warn
from shardscope.models.quant import checkpoint_format
from shardscope.models.spec import GPT_BLOCK, MAX_LAYERS, DiTSpec, MLASpec, ModelSpec, MoESpec, divisors_text

LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "olmo2", "granite"}
SUPPORTED = sorted(
    LLAMA_LIKE
    | {"gpt2", "gpt_neox", "mpt", "bloom", "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss"}
    | {"glm4_moe", "llama4", "llama4_text"}
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


# Optional fields, typed as the transformers config classes type them: null or absent gives the default,
# anything else must be of the field's kind (a string or a list where a size goes is refused, not cast).
def _positive_or(cfg: dict[str, Any], key: str, default: int) -> int:
    """An optional positive integer."""
    value = cfg.get(key)
    return default if value is None else _positive(key, value)


def _count(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    """An optional integer >= 0 (a count that may be zero: shared experts, first dense layers, a window)."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ShardscopeError(f"config.json: {key} must be an integer >= 0, got {value!r}")
    return value


def _number(key: str, value: Any, *, positive: bool = True) -> float:
    """A finite number (> 0 when `positive`, else >= 0)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        number = float(value) if ok else math.nan
    except OverflowError:  # an integer past the float range
        number = math.inf
    if not (math.isfinite(number) and (number > 0 if positive else number >= 0)):
        kind = "a positive number" if positive else "a number >= 0"
        raise ShardscopeError(f"config.json: {key} must be {kind}, got {value!r}")
    return number


def _number_or(cfg: dict[str, Any], key: str, default: float, *, positive: bool = True) -> float:
    value = cfg.get(key)
    return default if value is None else _number(key, value, positive=positive)


def _object(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    """An optional nested JSON object (`rope_scaling`, MPT's `attn_config`)."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ShardscopeError(f"config.json: {key} must be a JSON object, got {value!r}")
    return value


def _list(cfg: dict[str, Any], key: str, length: int, kinds: tuple[type, ...]) -> list[Any] | None:
    """An optional per-layer list (`layer_types`, `no_rope_layers`): one entry of `kinds` per layer."""
    value = cfg.get(key)
    if value is None or value == []:
        return None
    if not isinstance(value, list) or len(value) != length or not all(isinstance(v, kinds) for v in value):
        raise ShardscopeError(f"config.json: {key} must list one entry per layer ({length}), got {value!r}")
    return value


def _layer_count(cfg: dict[str, Any]) -> int:
    """`num_hidden_layers` of a config whose per-layer lists are built here: bounded first (ModelSpec's
    MAX_LAYERS), so that an absurd count is refused before a list of that many entries is made."""
    layers = _positive("num_hidden_layers", _need(cfg, "num_hidden_layers"))
    if layers > MAX_LAYERS:
        raise ShardscopeError(f"config.json: num_hidden_layers {layers} is beyond any trained transformer; "
                              f"valid: 1 to {MAX_LAYERS:,}")  # fmt: skip
    return layers


def _split_heads(hidden: int, heads: int, names: tuple[str, str]) -> int:
    """hidden / heads, the head size of a config that gives none: the transformers attention classes
    (GPT-2, GPT-NeoX, Llama before `head_dim`) and MPT raise on an uneven split, so it must divide."""
    if hidden % heads:
        raise ShardscopeError(
            f"config.json: {names[0]} {hidden} is not divisible by {names[1]} {heads} and no head_dim is given "
            f"(valid {names[1]}: {divisors_text(hidden)})"
        )
    return hidden // heads


def _head_dim(cfg: dict[str, Any], hidden: int, heads: int) -> int:
    """`head_dim` when the config gives it (Qwen3, Gemma: any size), else hidden / heads."""
    if cfg.get("head_dim") is not None:
        return _positive("head_dim", cfg["head_dim"])
    return _split_heads(hidden, heads, ("hidden_size", "num_attention_heads"))


def _patch(cfg: dict[str, Any]) -> tuple[int, int, int]:
    """Wan's `patch_size`: (t, h, w), three positive integers."""
    value = cfg.get("patch_size")
    if value is None:
        return (1, 2, 2)
    if not isinstance(value, list) or len(value) != 3:
        raise ShardscopeError(f"config.json: patch_size must list three positive integers (t, h, w), got {value!r}")
    t, h, w = (_positive("patch_size", v) for v in value)
    return (t, h, w)


def _conventions(cfg: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling and the norm epsilon: no cost of their own, but a launch config needs them."""
    scaling = _object(cfg, "rope_scaling")
    theta_key = next((k for k in ("rope_theta", "rotary_emb_base") if cfg.get(k)), None)
    eps_key = next((k for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon") if cfg.get(k)), None)
    return dict(
        rope_theta=_number(theta_key, cfg[theta_key]) if theta_key else 10000.0,
        rope_scaling=tuple(sorted((k, v) for k, v in scaling.items() if isinstance(v, (int, float, str)))),
        norm_eps=_number(eps_key, cfg[eps_key]) if eps_key else 1e-5,
    )


def _sliding_window(cfg: dict[str, Any]) -> int:
    """Mistral and Mixtral: a set `sliding_window` bounds the attention of every layer (transformers'
    MistralAttention / MixtralAttention pass it to each layer's kernel; no pattern: `ModelSpec.layer_kind`);
    null means full attention."""
    return _count(cfg, "sliding_window")


def _llama_like(name: str, cfg: dict[str, Any]) -> ModelSpec:
    hidden = _positive("hidden_size", _need(cfg, "hidden_size"))
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    kv_heads = _positive_or(cfg, "num_key_value_heads", heads)
    head_dim = _head_dim(cfg, hidden, heads)
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


def _gpt_block_fields(cfg: dict[str, Any], hidden_keys: tuple[str, ...]) -> dict[str, Any]:
    """The fields GPT-2 and BLOOM configs share: GPT blocks with multi-head attention, sizes under the
    `n_head`/`n_layer` names or transformers' own, the hidden size under `hidden_keys` (first: its name)."""
    hidden = _positive(hidden_keys[0], _need(cfg, *hidden_keys))
    heads = _positive("n_head", _need(cfg, "n_head", "num_attention_heads"))
    return dict(
        hidden=hidden,
        layers=_positive("n_layer", _need(cfg, "n_layer", "num_hidden_layers")),
        heads=heads,
        kv_heads=heads,
        head_dim=_split_heads(hidden, heads, (hidden_keys[0], "n_head")),
        vocab=_positive("vocab_size", _need(cfg, "vocab_size")),
        **GPT_BLOCK,
        **_conventions(cfg),
    )


def _gpt2(name: str, cfg: dict[str, Any]) -> ModelSpec:
    block = _gpt_block_fields(cfg, ("n_embd", "hidden_size"))
    return ModelSpec(
        name=name,
        **block,
        ffn_hidden=_positive_or(cfg, "n_inner", 4 * block["hidden"]),
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
        head_dim=_split_heads(hidden, heads, ("hidden_size", "num_attention_heads")),
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
    attn = _object(cfg, "attn_config")
    kv_heads = _positive_or(attn, "kv_n_heads", heads)
    bias = not bool(cfg.get("no_bias", False))
    # The released modeling_mpt.py creates the position table only without ALiBi (`if not self.alibi`).
    learned = bool(cfg.get("learned_pos_emb", True)) and not attn.get("alibi", False)
    ratio = _number_or(cfg, "expansion_ratio", 4)
    ffn = _object(cfg, "ffn_config").get("ffn_hidden_size") or int(ratio * hidden)
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=_positive("n_layers", _need(cfg, "n_layers")),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=_split_heads(hidden, heads, ("d_model", "n_heads")),
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


def _bloom(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """BLOOM (transformers `BloomConfig`, modeling_bloom.py): GPT blocks (LayerNorm, biases, 4h GELU MLP) with
    ALiBi and no position table, a LayerNorm after the word embedding, the output layer tied to it."""
    block = _gpt_block_fields(cfg, ("hidden_size", "n_embed"))
    hidden = block["hidden"]
    return ModelSpec(
        name=name,
        **block,
        ffn_hidden=4 * hidden,  # BloomMLP: dense_h_to_4h, not configurable
        tied_embeddings=True,  # BloomForCausalLM ties lm_head to word_embeddings
        position="alibi",
        extra_params=2 * hidden,  # word_embeddings_layernorm (weight and bias)
    )


def _base(name: str, cfg: dict[str, Any], **kw: Any) -> ModelSpec:
    hidden = _positive("hidden_size", _need(cfg, "hidden_size"))
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    fields = dict(
        name=name,
        hidden=hidden,
        layers=_positive("num_hidden_layers", _need(cfg, "num_hidden_layers")),
        heads=heads,
        kv_heads=_positive_or(cfg, "num_key_value_heads", heads),
        head_dim=_head_dim(cfg, hidden, heads),
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
        layer_step=_positive_or(cfg, "decoder_sparse_step", 1),
        normalize_top_k=bool(cfg.get("norm_topk_prob", False)),
    )
    return _base(name, cfg, moe=moe, qk_norm=True, qkv_bias=bool(cfg.get("attention_bias", False)))


def _deepseek_moe(cfg: dict[str, Any], *, score_correction_bias: bool, score: str) -> MoESpec:
    """DeepSeek-V2/V3's MoE as its config keys give it (also GLM-4.5's): routed experts, one shared MLP of
    `n_shared_experts` times the expert size, first dense layers, group-limited top-k."""
    moe_ffn = _positive("moe_intermediate_size", _need(cfg, "moe_intermediate_size"))
    shared = _count(cfg, "n_shared_experts")
    return MoESpec(
        experts=_positive("n_routed_experts", _need(cfg, "n_routed_experts")),
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok")),
        expert_ffn=moe_ffn,
        shared_experts=1 if shared else 0,
        shared_ffn=moe_ffn * shared,  # one MLP of n_shared x the expert size
        first_dense_layers=_count(cfg, "first_k_dense_replace"),
        layer_step=_positive_or(cfg, "moe_layer_freq", 1),
        score_correction_bias=score_correction_bias,
        groups=_positive_or(cfg, "n_group", 1),
        groups_per_token=_positive_or(cfg, "topk_group", 1),
        score=score,
        normalize_top_k=bool(cfg.get("norm_topk_prob", False)),  # DeepseekV2Config's default
        routed_scaling=_number_or(cfg, "routed_scaling_factor", 1.0),
    )


def _deepseek(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """DeepSeek-V2/V3 layout (also Moonlight, Kimi-K2): MLA, shared + routed experts, first dense layers."""
    mla = MLASpec(
        q_lora_rank=_count(cfg, "q_lora_rank"),
        kv_lora_rank=_positive("kv_lora_rank", _need(cfg, "kv_lora_rank")),
        qk_nope_head_dim=_positive("qk_nope_head_dim", _need(cfg, "qk_nope_head_dim")),
        qk_rope_head_dim=_positive("qk_rope_head_dim", _need(cfg, "qk_rope_head_dim")),
        v_head_dim=_positive("v_head_dim", _need(cfg, "v_head_dim")),
    )
    moe = _deepseek_moe(
        cfg,
        score_correction_bias=cfg.get("topk_method") == "noaux_tc",
        score="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
    )
    heads = _positive("num_attention_heads", _need(cfg, "num_attention_heads"))
    return _base(
        name,
        cfg,
        kv_heads=heads,
        head_dim=mla.qk_head_dim,
        mla=mla,
        moe=moe,
        mtp_layers=_count(cfg, "num_nextn_predict_layers"),
    )


def _glm4_moe(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """GLM-4.5 / 4.6 (`glm4_moe`, transformers' modeling_glm4_moe.py): grouped-query attention with q/k/v
    biases (`attention_bias`; no output bias), q/k norms where `use_qk_norm`, RoPE on a share of each head;
    DeepSeek-V3's MoE (sigmoid router with a score-correction bias, group-limited top-k, shared experts,
    first dense layers) and its MTP modules (`num_nextn_predict_layers`)."""
    # Glm4MoeTopkRouter: sigmoid scores, and it always holds e_score_correction_bias
    moe = _deepseek_moe(cfg, score_correction_bias=True, score="sigmoid")
    return _base(
        name,
        cfg,
        moe=moe,
        qkv_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=bool(cfg.get("use_qk_norm", False)),
        mtp_layers=_count(cfg, "num_nextn_predict_layers"),
    )


def _gpt_oss(name: str, cfg: dict[str, Any]) -> ModelSpec:
    moe = MoESpec(
        experts=_positive("num_local_experts", _need(cfg, "num_local_experts")),
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok", "experts_per_token")),
        expert_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        router_bias=True,
        expert_bias=True,
    )
    layers = _layer_count(cfg)
    types = _list(cfg, "layer_types", layers, (str,)) or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
    ]
    pattern = tuple("window" if t == "sliding_attention" else "full" for t in types)
    return _base(
        name,
        cfg,
        moe=moe,
        qkv_bias=bool(cfg.get("attention_bias", True)),
        out_bias=bool(cfg.get("attention_bias", True)),
        sinks=True,
        glu_gate="quick_gelu",  # OpenAI's reference: gate·σ(1.702·gate), clamped (swiglu_limit)
        glu_clamp=_number_or(cfg, "swiglu_limit", 0.0, positive=False),
        attention_window=_count(cfg, "sliding_window"),
        attention_pattern=pattern,
    )


def _llama4(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """Llama 4 text model (the vision tower of the checkpoint is not counted)."""
    cfg = _object(cfg, "text_config") or cfg
    step = _positive_or(cfg, "interleave_moe_layer_step", 1)
    moe = MoESpec(
        experts=_positive("num_local_experts", _need(cfg, "num_local_experts")),
        top_k=_positive("num_experts_per_tok", _need(cfg, "num_experts_per_tok")),
        expert_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        shared_experts=1,
        shared_ffn=_positive("intermediate_size", _need(cfg, "intermediate_size")),
        layer_step=step,
        score="sigmoid",  # Llama 4 weighs its top-1 expert by the sigmoid of its logit
    )
    layers = _layer_count(cfg)
    no_rope = _list(cfg, "no_rope_layers", layers, (int,)) or [int((i + 1) % 4 != 0) for i in range(layers)]
    chunk = _count(cfg, "attention_chunk_size")
    # RoPE layers use chunked attention; the NoPE layers (every 4th) attend globally.
    pattern = tuple("chunk" if (uses_rope and chunk) else "full" for uses_rope in no_rope)
    expert_ffn = _positive("intermediate_size", _need(cfg, "intermediate_size"))
    dense_ffn = _positive_or(cfg, "intermediate_size_mlp", expert_ffn)
    return _base(
        name, {**cfg, "intermediate_size": dense_ffn}, moe=moe, attention_window=chunk, attention_pattern=pattern
    )


_PARSERS = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "mpt": _mpt,
    "bloom": _bloom,
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "glm4_moe": _glm4_moe,
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
        ffn_hidden=ffn or _positive("mlp_ratio x hidden", int(_number_or(cfg, "mlp_ratio", 4.0) * d)),
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
        in_channels=_positive("in_channels", _need(cfg, "in_channels")),
        out_channels=_positive("out_channels", _need(cfg, "out_channels")),
        patch=_patch(cfg),
        text_dim=_positive("text_dim", _need(cfg, "text_dim")),
        text_len=512,
        freq_dim=_positive_or(cfg, "freq_dim", 256),
        cross_attn_norm=bool(cfg.get("cross_attn_norm", True)),
    )
    layers = _positive("num_layers", _need(cfg, "num_layers"))
    return _dit_model(name, cfg, layers, _positive("ffn_dim", _need(cfg, "ffn_dim")), dit)


def _hunyuan_video(name: str, cfg: dict[str, Any]) -> ModelSpec:
    """diffusers HunyuanVideoTransformer3DModel: dual-stream then single-stream blocks. Text: LLaVA-LLaMA
    hidden states (4096-d, 256 tokens) through a token refiner, plus CLIP pooled (768-d)."""
    p = _positive_or(cfg, "patch_size", 2)
    double = _count(cfg, "num_layers", _need(cfg, "num_layers"))  # dual-stream blocks (required)
    dit = DiTSpec(
        family="hunyuan",
        in_channels=_positive("in_channels", _need(cfg, "in_channels")),
        out_channels=_positive("out_channels", _need(cfg, "out_channels")),
        patch=(_positive_or(cfg, "patch_size_t", 1), p, p),
        text_dim=_positive("text_embed_dim", _need(cfg, "text_embed_dim")),
        text_len=256,
        double_layers=double,
        refiner_layers=_count(cfg, "num_refiner_layers", 2),
        pooled_dim=_positive_or(cfg, "pooled_projection_dim", 768),
        guidance=bool(cfg.get("guidance_embeds")),
    )
    single = _count(cfg, "num_single_layers", _need(cfg, "num_single_layers"))
    return _dit_model(name, cfg, double + single, None, dit)


_DIFFUSERS = {"WanTransformer3DModel": _wan, "HunyuanVideoTransformer3DModel": _hunyuan_video}

# Every key the parsers above read (top level, Llama 4's `text_config`, MPT's `attn_config`/`ffn_config`).
READ_KEYS = frozenset({
    "model_type", "_class_name", "text_config", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "num_hidden_layers", "intermediate_size", "vocab_size", "attention_bias", "mlp_bias",
    "tie_word_embeddings", "rope_theta", "rotary_emb_base", "rope_scaling", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "sliding_window", "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "n_ctx",
    "n_embed", "d_model", "n_heads", "n_layers", "attn_config", "kv_n_heads", "alibi", "no_bias", "learned_pos_emb",
    "expansion_ratio", "ffn_config", "ffn_hidden_size", "max_seq_len", "num_local_experts", "num_experts_per_tok",
    "experts_per_token", "num_experts", "moe_intermediate_size", "decoder_sparse_step", "norm_topk_prob",
    "mlp_only_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "topk_method", "n_group",
    "topk_group", "scoring_func", "routed_scaling_factor", "num_nextn_predict_layers", "layer_types",
    "swiglu_limit", "interleave_moe_layer_step", "no_rope_layers", "attention_chunk_size", "intermediate_size_mlp",
    # diffusers transformers (Wan, HunyuanVideo)
    "attention_head_dim", "mlp_ratio", "qk_norm", "in_channels", "out_channels", "patch_size", "patch_size_t",
    "text_dim", "freq_dim", "cross_attn_norm", "num_layers", "ffn_dim", "text_embed_dim", "num_refiner_layers",
    "pooled_projection_dim", "guidance_embeds", "num_single_layers",
})  # fmt: skip
# Keys of published configs that cost nothing the estimate counts (dropout, initialisation, token ids,
# generation defaults, bookkeeping) and that resemble a read key: known, so never taken for a misspelling
# (`use_sliding_window` is not a misspelt `sliding_window`).
IGNORED_KEYS = frozenset({
    "use_sliding_window", "max_window_layers", "rope_max_seq_len", "max_position_embeddings", "hidden_act",
    "hidden_dropout", "hidden_dropout_prob", "attention_dropout", "attention_probs_dropout_prob", "attn_pdrop",
    "resid_pdrop", "embd_pdrop", "emb_pdrop", "initializer_range", "initial_context_length", "use_cache",
    "torch_dtype", "dtype", "transformers_version", "architectures", "auto_map", "bos_token_id", "eos_token_id",
    "pad_token_id", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "aux_loss_alpha",
    "seq_aux", "ep_size", "pretraining_tp", "rotary_pct", "partial_rotary_factor", "use_parallel_residual",
    "qk_ln", "clip_qkv", "alibi_bias_max", "attn_impl", "attn_type", "attn_uses_sequence_id", "prefix_lm",
    "softmax_scale", "norm_type", "embedding_fraction", "logit_scale", "activation_function", "use_qk_norm",
    "use_mrope", "rope_axes_dim", "added_kv_proj_dim", "image_dim", "eps", "quantization_config",
    "attn_temperature_tuning", "floor_scale", "attn_scale", "moe_layers", "shared_expert_intermediate_size",
    "rope_interleave", "apply_residual_connection_post_layernorm", "attention_softmax_in_fp32",
    "masked_softmax_fusion", "bias_dropout_fusion", "skip_bias_add", "skip_bias_add_qkv", "offset_alibi",
    "slow_but_exact", "unk_token_id",
})  # fmt: skip


def _warn_unknown_keys(cfg: dict[str, Any]) -> None:
    """Warn of each key the reader does not know that looks like a misspelling of one it reads: the reader
    takes a missing optional key's default (no `num_key_value_heads`: multi-head attention), so a typo
    would change the model silently. Keys close to no read key are left alone: real configs carry many
    (dropout, token ids, generation settings) that cost nothing."""
    nested = [cfg.get(k) for k in ("text_config", "attn_config", "ffn_config")]
    for obj in [cfg, *(n for n in nested if isinstance(n, dict))]:
        for key in obj:
            if not isinstance(key, str) or key in READ_KEYS or key in IGNORED_KEYS:
                continue
            close = difflib.get_close_matches(key, READ_KEYS | IGNORED_KEYS, n=3, cutoff=0.8)
            read = [k for k in close if k in READ_KEYS and k not in obj]
            # only when the nearest known key is one the reader reads and the config does not already give
            if read and close[0] == read[0]:
                hint = " or ".join(repr(k) for k in read)
                warn(f"config.json: unknown key {key!r} ignored; did you mean {hint}?")


def model_from_hf_config(cfg: dict[str, Any], name: str = "custom", source_dir: Path | None = None) -> ModelSpec:
    """Build a ModelSpec from the parsed content of an HF config.json (or a diffusers transformer config).
    A `model_type` without an adapter here is measured from the model transformers builds
    (`shardscope.measure`; `source_dir`: the checkpoint folder, for code that ships with it)."""
    if not isinstance(cfg, dict):
        raise ShardscopeError("config.json must hold a JSON object")
    model_type = cfg.get("model_type")
    if not (isinstance(model_type, str) and model_type and model_type not in _PARSERS):
        _warn_unknown_keys(cfg)  # a measured model's keys are read by transformers, not here
    if "_class_name" in cfg and "model_type" not in cfg:
        cls = cfg["_class_name"]
        if not isinstance(cls, str) or cls not in _DIFFUSERS:
            raise ShardscopeError(f"unsupported diffusers model {cls!r} (supported: {', '.join(sorted(_DIFFUSERS))})")
        return _DIFFUSERS[cls](name, cfg)
    if not isinstance(model_type, str) or not model_type:
        raise ShardscopeError(
            f"unsupported model_type {model_type!r} in config.json (supported: {', '.join(SUPPORTED)})"
        )
    if model_type not in _PARSERS:
        from shardscope.measure import measured_model

        try:
            spec = measured_model(cfg, name, source_dir)
        except ShardscopeError as exc:
            raise ShardscopeError(f"unsupported model_type {model_type!r} in config.json: {exc}") from None
    else:
        spec = _PARSERS[model_type](name, cfg)
    fmt, experts_only = checkpoint_format(cfg)
    if fmt:
        spec = replace(spec, weight_format=fmt, quantized_experts_only=experts_only and spec.moe is not None)
    return spec


def load_hf_config_file(path: Path) -> ModelSpec:
    """Read a config.json file from disk; a malformed file is a ShardscopeError."""
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardscopeError(f"config file not found: {path}") from None
    except OSError as exc:  # a folder, no permission
        raise ShardscopeError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ShardscopeError(f"malformed config file {path}: {exc}") from None
    name = path.parent.name if path.name == "config.json" else path.stem
    return model_from_hf_config(cfg, name=name, source_dir=path.parent)
