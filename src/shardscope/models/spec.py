"""The typed model spec of a decoder-only transformer (dense or MoE), and its exact parameter counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from shardscope.memo import Memoised

MlpKind = Literal["swiglu", "gelu"]
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "alibi"]
AttentionKind = Literal["full", "window", "chunk"]

# The GPT-2 / GPT-3 / MPT block: LayerNorm with bias, GeLU MLP, biases on every linear.
GPT_BLOCK = dict(mlp="gelu", norm="layernorm", norm_bias=True, qkv_bias=True, out_bias=True, mlp_bias=True)


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv projections with a decoupled
    RoPE part. `q_lora_rank` 0 means q is projected directly (DeepSeek-V2-Lite)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class DiTSpec:
    """A video diffusion transformer's extras around its blocks.

    Wan 2.1 (`family="wan"`): every block has non-causal self-attention with q/k RMSNorm and 3-D RoPE,
    cross-attention to `text_len` text tokens, a GeLU FFN and adaLN modulation (a learned 6·d table plus
    the time projection). HunyuanVideo (`"hunyuan"`): `double_layers` dual-stream blocks (separate video
    and text weights, joint attention) then single-stream blocks over the concatenated tokens; a token
    refiner and time/guidance/pooled-text embedders. The VAE compresses frames by `vae_temporal` and
    pixels by `vae_spatial`; the patch embedding by `patch` (t, h, w).
    """

    family: Literal["wan", "hunyuan"]
    in_channels: int
    out_channels: int
    patch: tuple[int, int, int]
    text_dim: int
    text_len: int
    freq_dim: int = 256
    double_layers: int = 0
    refiner_layers: int = 0
    pooled_dim: int = 0
    guidance: bool = False
    cross_attn_norm: bool = True
    vae_temporal: int = 4
    vae_spatial: int = 8

    def video_tokens(self, frames: int, height: int, width: int) -> int:
        """Latent tokens of a clip: causal video VAEs keep the first frame, (F-1)/4 + 1 latent frames."""
        lf = (frames - 1) // self.vae_temporal + 1
        lh, lw = height // self.vae_spatial, width // self.vae_spatial
        pt, ph, pw = self.patch
        return (lf // pt) * (lh // ph) * (lw // pw)


@dataclass(frozen=True, slots=True)
class MoESpec:
    """Routed experts (each a gated MLP of `expert_ffn`), optional shared experts, and which layers
    are MoE: every `layer_step`-th layer after the first `first_dense_layers` dense ones."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0  # intermediate size of one shared expert
    first_dense_layers: int = 0
    layer_step: int = 1
    router_bias: bool = False  # GPT-OSS router
    expert_bias: bool = False  # GPT-OSS experts
    score_correction_bias: bool = False  # DeepSeek-V3 aux-loss-free balancing bias (a checkpoint tensor)
    groups: int = 1  # group-limited routing (DeepSeek `n_group`): experts form this many contiguous groups
    groups_per_token: int = 1  # ... and a token's top-k come from this many of them (`topk_group`)
    # How the router weighs a token's experts (no cost of its own; the exports name it):
    score: Literal["softmax", "sigmoid"] = "softmax"  # DeepSeek `scoring_func`
    normalize_top_k: bool = True  # the k weights renormalised to sum to 1 (`norm_topk_prob`)
    routed_scaling: float = 1.0  # weights scaled by this (`routed_scaling_factor`)


class LayerKind(NamedTuple):
    """What distinguishes one transformer block from another in the cost model."""

    attention: AttentionKind = "full"
    mlp: Literal["dense", "moe", "dit", "dit-double", "dit-single"] = "dense"


@dataclass(frozen=True, slots=True)
class ModelSpec(Memoised):
    """A decoder-only transformer as the checkpoint defines it (sizes before any sharding).

    Parameter counts are sums over the real tensors (weights and biases), so they equal the count of a
    checkpoint's tensors (tests check them against published safetensors totals).
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int  # dense MLP intermediate size
    vocab: int
    mlp: MlpKind = "swiglu"
    glu_gate: Literal["silu", "quick_gelu"] = "silu"  # gate of a gated MLP: x·σ(x), or x·σ(1.702x) (GPT-OSS)
    glu_clamp: float = 0.0  # gate and up clamped to this bound before the GLU (GPT-OSS `swiglu_limit`); 0: none
    norm: NormKind = "rmsnorm"
    norm_bias: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    qk_norm_across_heads: bool = False  # one RMSNorm over all heads' q (and k), as Wan's `rms_norm_across_heads`
    tied_embeddings: bool = False
    position: PositionKind = "rope"
    pos_embedding_rows: int = 0
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, str | float], ...] = ()  # the config's `rope_scaling`, sorted items
    norm_eps: float = 1e-5
    lm_head_bias: bool = False
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    attention_window: int = 0  # sliding-window or chunk size for "window"/"chunk" layers
    attention_pattern: tuple[str, ...] = ()  # per-layer AttentionKind; empty = all "window" with a window, else "full"
    sinks: bool = False  # one learned sink logit per head (GPT-OSS)
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3), not part of params_total
    dit: DiTSpec | None = None
    source: str = ""
    # Derived figures of this immutable spec (layer kinds, per-rank parameter counts), kept for the
    # planner, which asks them for thousands of plans.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    # ----- layer structure ------------------------------------------------------------------------
    def is_moe_layer(self, i: int) -> bool:
        m = self.moe
        if m is None or i < m.first_dense_layers:
            return False
        return (i - m.first_dense_layers) % m.layer_step == m.layer_step - 1

    def layer_kind(self, i: int) -> LayerKind:
        if self.dit:
            if self.dit.family == "hunyuan":
                return LayerKind("full", "dit-double" if i < self.dit.double_layers else "dit-single")
            return LayerKind("full", "dit")
        attn = self.attention_pattern[i] if self.attention_pattern else ("window" if self.attention_window else "full")
        return LayerKind(attention=attn, mlp="moe" if self.is_moe_layer(i) else "dense")  # type: ignore[arg-type]

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return self.memoised("layer_kinds", lambda: tuple(self.layer_kind(i) for i in range(self.layers)))

    def kind_counts(self, indices: Iterable[int]) -> Counter[LayerKind]:
        """How many layers of each kind are among `indices`."""
        idx = tuple(indices)
        return self.memoised(("kind_counts", idx), lambda: Counter(self.layer_kinds()[i] for i in idx))

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    # ----- attention ------------------------------------------------------------------------------
    @property
    def rope_type(self) -> str:
        """The config's RoPE scaling kind ("llama3", "yarn"; "" for plain RoPE or none)."""
        scaling = dict(self.rope_scaling)
        return str(scaling.get("rope_type", scaling.get("type", "")))

    @property
    def q_dim(self) -> int:
        """Width of the attention output (heads x value head dim)."""
        return self.heads * (self.mla.v_head_dim if self.mla else self.head_dim)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.mla.qk_head_dim if self.mla else self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm_bias else 1)

    @property
    def attention_params(self) -> int:
        h = self.hidden
        if self.mla:
            a, nh = self.mla, self.heads
            q = (
                (h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * nh * a.qk_head_dim)
                if a.q_lora_rank
                else (h * nh * a.qk_head_dim)
            )
            kv = (
                h * (a.kv_lora_rank + a.qk_rope_head_dim)
                + a.kv_lora_rank
                + a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim)
            )
            return q + kv + nh * a.v_head_dim * h + (self.heads if self.sinks else 0)
        q, kv = self.heads * self.head_dim, self.kv_dim
        n = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            n += q + 2 * kv
        if self.out_bias:
            n += h
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.sinks:
            n += self.heads
        return n

    # ----- MLP / MoE ------------------------------------------------------------------------------
    def mlp_params_of(self, ffn: int, bias: bool) -> int:
        mats = 3 if self.mlp == "swiglu" else 2
        n = mats * self.hidden * ffn
        if bias:
            n += (mats - 1) * ffn + self.hidden
        return n

    @property
    def mlp_params(self) -> int:
        """The dense MLP."""
        return self.mlp_params_of(self.ffn_hidden, self.mlp_bias)

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        assert self.moe is not None
        return self.mlp_params_of(self.moe.expert_ffn, self.moe.expert_bias)

    @property
    def shared_expert_params(self) -> int:
        m = self.moe
        if m is None or not m.shared_experts:
            return 0
        return m.shared_experts * self.mlp_params_of(m.shared_ffn, False)

    @property
    def router_params(self) -> int:
        m = self.moe
        if m is None:
            return 0
        return (
            self.hidden * m.experts
            + (m.experts if m.router_bias else 0)
            + (m.experts if m.score_correction_bias else 0)
        )

    @property
    def moe_block_params(self) -> int:
        assert self.moe is not None
        return self.router_params + self.moe.experts * self.expert_params + self.shared_expert_params

    def dit_block_params(self, kind: LayerKind) -> int:
        """Wan block: self- and cross-attention (q, k, v, out with biases; q/k RMSNorm over d), a
        LayerNorm with affine before cross-attention, GeLU FFN with biases, 6·d modulation table.
        Hunyuan double block: two streams each with adaLN-Zero (d→6d), q/k/v/out (+biases), q/k
        RMSNorm over the head dim and a 4·d GeLU FFN. Single block: adaLN (d→3d), fused qkv + MLP-in
        (d→3d+4d), q/k RMSNorm, output (5d→d)."""
        d, f, hd = self.hidden, self.ffn_hidden, self.head_dim
        if kind.mlp == "dit":
            attn = 4 * (d * d + d) + 2 * d
            return 2 * attn + (2 * d if self.dit and self.dit.cross_attn_norm else 0) + 2 * d * f + f + d + 6 * d
        if kind.mlp == "dit-double":
            return 2 * (6 * d * d + 6 * d) + 8 * (d * d + d) + 4 * hd + 2 * (2 * d * f + f + d)
        return (3 * d * d + 3 * d) + (3 * d * d + 3 * d) + (d * f + f) + 2 * hd + ((d + f) * d + d)

    def dit_extra_params(self) -> int:
        """Patch embedding, conditioning embedders (time, text, guidance, pooled text, token refiner)
        and the output head."""
        assert self.dit is not None
        x, d = self.dit, self.hidden
        patch = x.patch[0] * x.patch[1] * x.patch[2]
        n = x.in_channels * patch * d + d  # patch embedding (Conv3d)
        n += x.out_channels * patch * d + x.out_channels * patch  # proj_out
        timestep = x.freq_dim * d + d + d * d + d
        if x.family == "wan":
            n += timestep + (6 * d * d + 6 * d)  # time embedding + time projection to 6 modulations
            n += x.text_dim * d + d + d * d + d  # text embedding MLP
            n += 2 * d  # output modulation table
            return n
        n += timestep * (2 if x.guidance else 1) + x.pooled_dim * d + d + d * d + d
        n += 2 * d * d + 2 * d  # output adaLN
        refiner_block = 4 * (d * d + d) + 4 * d + (2 * d * self.ffn_hidden + self.ffn_hidden + d) + 2 * d * d + 2 * d
        n += timestep + x.text_dim * d + d + d * d + d + x.text_dim * d + d + x.refiner_layers * refiner_block
        return n

    def layer_params_of(self, kind: LayerKind) -> int:
        if kind.mlp.startswith("dit"):
            return self.dit_block_params(kind)
        mlp = self.moe_block_params if kind.mlp == "moe" else self.mlp_params
        return self.attention_params + mlp + 2 * self.norm_params

    @property
    def layer_params(self) -> int:
        """The first transformer block (all blocks of a dense model)."""
        return self.layer_params_of(self.layer_kind(0))

    # ----- whole model ----------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Token embedding plus learned position embedding (if any)."""
        return (self.vocab + self.pos_embedding_rows) * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Output projection (0 when tied to the input embedding), with the final norm excluded."""
        if self.tied_embeddings:
            return 0
        return self.vocab * self.hidden + (self.vocab if self.lm_head_bias else 0)

    @property
    def params_total(self) -> int:
        return self.memoised("params_total", self._params_total)

    def _params_total(self) -> int:
        if self.dit:
            return sum(n * self.layer_params_of(k) for k, n in self.kind_counts(range(self.layers)).items()) + (
                self.dit_extra_params()
            )
        layers = sum(n * self.layer_params_of(k) for k, n in self.kind_counts(range(self.layers)).items())
        return self.embedding_params + layers + self.norm_params + self.lm_head_params

    @property
    def params_active(self) -> int:
        """Parameters a token passes through: all but the routed experts it is not sent to."""
        if self.moe is None:
            return self.params_total
        idle = (self.moe.experts - self.moe.top_k) * self.expert_params
        return self.params_total - self.moe_layers * idle

    @property
    def mtp_kind(self) -> LayerKind:
        """The kind of block an MTP module adds (a MoE block in a MoE model)."""
        return LayerKind("full", "moe" if self.moe else "dense")

    @property
    def params_mtp(self) -> int:
        """DeepSeek-V3 multi-token-prediction modules: two norms, a 2h→h projection and one more block
        each (the embedding and output head are shared with the main model)."""
        if not self.mtp_layers:
            return 0
        block = self.layer_params_of(self.mtp_kind)
        return self.mtp_layers * (2 * self.norm_params + 2 * self.hidden * self.hidden + block + self.norm_params)

    def matmul_params_per_token(self, kind: LayerKind) -> int:
        """Weights one token multiplies in a block (routed: top-k experts + shared + router; DiT: the
        block's weights, but cross-attention K/V are counted on the text tokens, see `cross_kv`)."""
        if kind.mlp.startswith("dit"):
            d = self.hidden
            if kind.mlp == "dit":  # self-attn 4d², cross q/out 2d², FFN 2df
                return 6 * d * d + 2 * d * self.ffn_hidden
            if kind.mlp == "dit-double":  # one stream's weights per token (+ its adaLN runs per sample)
                return 4 * d * d + 2 * d * self.ffn_hidden
            return 3 * d * d + d * self.ffn_hidden + (d + self.ffn_hidden) * d
        if self.mla:
            attn = self.attention_params - (self.heads if self.sinks else 0)
        else:
            attn = (
                self.hidden * (self.heads * self.head_dim + 2 * self.kv_dim) + self.heads * self.head_dim * self.hidden
            )
        if kind.mlp == "moe":
            assert self.moe is not None
            mats = 3 if self.mlp == "swiglu" else 2
            mlp = self.moe.top_k * mats * self.hidden * self.moe.expert_ffn + self.hidden * self.moe.experts
            if self.moe.shared_experts:
                mlp += self.moe.shared_experts * mats * self.hidden * self.moe.shared_ffn
        else:
            mlp = (3 if self.mlp == "swiglu" else 2) * self.hidden * self.ffn_hidden
        return attn + mlp

    def keys_per_query(self, kind: LayerKind, seq_len: int, causal: bool = True) -> float:
        """Average keys each query attends to: (s+1)/2 causal; a sliding window of w keeps
        (w·s − w(w−1)/2)/s; chunked attention of c keeps (c+1)/2."""
        s, w = seq_len, self.attention_window
        if kind.attention == "window" and w and w < s:
            return (w * s - w * (w - 1) / 2) / s if causal else float(min(2 * w, s))
        if kind.attention == "chunk" and w and w < s:
            return (w + 1) / 2 if causal else float(w)
        return (s + 1) / 2 if causal else float(s)
