"""The typed model spec of a decoder-only transformer (dense or MoE), and its exact parameter counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from shardscope.errors import ShardscopeError
from shardscope.memo import Memoised

MlpKind = Literal["swiglu", "gelu"]
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "alibi"]
AttentionKind = Literal["full", "window", "chunk"]

# Counts past any trained model, refused: the estimate walks the layers and the experts one by one (ten
# million layers take a minute and gigabytes), so an absurd config would hang it. The deepest trained
# transformer has 1,000 layers (DeepNet, Wang et al. 2022; LLMs stay under ~130); the most experts any
# published model routes over is PEER's million (He et al. 2024; LLMs: 384, Kimi K2).
MAX_LAYERS = 10_000
MAX_EXPERTS = 1 << 20

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


@dataclass(frozen=True, slots=True)
class MeasuredBlock:
    """What `shardscope.measure` measured of one decoder block of an attention kind, run by transformers'
    eager code on the meta device (batch 1, bf16, no TP), per sequence of s tokens: each pair (a, b) is
    a·s + b·s², the s² part being the eager attention's score matrices. `gemms`: the forward GEMMs as (rows per token,
    N, K, calls): a projection has one row per token, N its output width and K its input width."""

    attention: AttentionKind
    flops_fwd: tuple[float, float]
    flops_bwd: tuple[float, float]
    saved_bytes: tuple[float, float]
    gemms: tuple[tuple[float, int, int, int], ...]
    # A block the standard fields do not describe (a Mamba/SSM mixer, an attention or an MLP alone, Jamba's
    # Mamba + MoE), priced wholly from this measurement (`graph.measured.whole_block_group`); `attention` is
    # then its name (`JambaMambaMixer+JambaMLP`) and the layers of the pattern that name it are its kind.
    whole: bool = False
    ssm: bool = False  # it holds a state-space scan
    params: int = 0  # its exact parameters
    io_bytes: tuple[float, float] = (0.0, 0.0)  # forward activation bytes the GEMMs read and write, a·s + b·s²
    expert_gemms: tuple[tuple[float, int, int, int], ...] = ()  # (rows per token = top-k, N, K, calls)
    experts: int = 0
    expert_params: int = 0  # its routed experts' weights (all of them)
    head_dim: int = 0  # of its attention, where its s² FLOPs show one
    # forward and backward FLOPs per sequence besides the per-token ones (a block without attention is
    # measured as a·s + c: a scan's start, its decay's exponential); flops_fwd/bwd then hold (a, 0)
    flops_per_sequence: tuple[float, float] = (0.0, 0.0)

    @property
    def gemm_flops_per_token(self) -> float:
        """Forward FLOPs per token of its GEMMs (projections and the experts' top-k products)."""
        return sum(2.0 * m * n * k * c for m, n, k, c in self.gemms + self.expert_gemms)

    # forward FLOPs per query per key of its attention's score matmuls (QK^T and PV; 0: no attention)
    attention_flops: float = 0.0


class LayerKind(NamedTuple):
    """What distinguishes one transformer block from another in the cost model."""

    attention: AttentionKind = "full"  # or, with mlp "measured", the name of a measured block
    mlp: Literal["dense", "moe", "dit", "dit-double", "dit-single", "measured"] = "dense"


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
    # A model read by `shardscope.measure` from the module tree transformers builds (no adapter): what
    # measured it (e.g. "transformers 5.24.0 BloomForCausalLM"; "" for an adapted model), whether attention
    # and MLP read the same block input (Falcon, GPT-J: the parallel block), and the parameters the fields
    # above do not describe, per block (extra or missing norms: Gemma-2 has four, Falcon one) and outside
    # the blocks (BLOOM's embedding LayerNorm), so that `params_total` is the module's exact count.
    measured: str = ""
    parallel_block: bool = False
    extra_layer_params: int = 0
    extra_params: int = 0
    # Per attention kind, the block as measured (`graph.measured` prices what the fields above miss).
    measured_blocks: tuple[MeasuredBlock, ...] = ()
    # The checkpoint's weight format (`models.quant`: "" = the model dtype, "fp8", "mxfp4", "nvfp4", "w4a16")
    # and whether it quantizes only the routed experts (GPT-OSS keeps attention in BF16); serving reads it.
    weight_format: str = ""
    quantized_experts_only: bool = False
    # Derived figures of this immutable spec (layer kinds, per-rank parameter counts), kept for the
    # planner, which asks them for thousands of plans.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # A model the frameworks would refuse to build is refused here, whoever builds the spec (an HF
        # config, the catalog, a validation row's columns): the estimate of an impossible model means nothing.
        if problem := self.problem():
            raise ShardscopeError(f"model {self.name}: {problem}")

    def problem(self) -> str | None:
        """Why no framework would build this model (sizes that are not positive, KV heads that do not
        divide the query heads, more experts per token than experts, ...), or None."""
        sizes = dict(hidden=self.hidden, layers=self.layers, heads=self.heads, kv_heads=self.kv_heads,
                     head_dim=self.head_dim, ffn_hidden=self.ffn_hidden)  # fmt: skip
        for what, value in sizes.items():
            if not _is_int(value) or value < 1:
                return f"{what} must be a positive integer, got {value!r}"
        if self.layers > MAX_LAYERS:
            return (
                f"{self.layers} layers is beyond any trained transformer (deepest: 1,000); valid: 1 to {MAX_LAYERS:,}"
            )
        # Language models need a vocabulary; a diffusion transformer has none (vocab 0).
        if not _is_int(self.vocab) or self.vocab < (0 if self.dit else 1):
            return f"vocab must be a positive integer, got {self.vocab!r}"
        counts = dict(pos_embedding_rows=self.pos_embedding_rows, attention_window=self.attention_window,
                      mtp_layers=self.mtp_layers)  # fmt: skip
        for what, value in counts.items():
            if not _is_int(value) or value < 0:
                return f"{what} must be an integer >= 0, got {value!r}"
        if self.mtp_layers > self.layers:  # DeepSeek-V3 has one; each is a whole block the estimate builds
            return f"{self.mtp_layers} multi-token-prediction modules: valid 0 to {self.layers} (the layers)"
        # Grouped-query attention shares each KV head among heads/kv_heads query heads (transformers'
        # `repeat_kv`, Megatron-Core's query groups): the KV heads must divide the query heads.
        if self.heads % self.kv_heads:
            return (
                f"{self.kv_heads} KV heads do not divide the {self.heads} attention heads "
                f"(valid KV heads: {divisors_text(self.heads)})"
            )
        if self.attention_pattern:
            if len(self.attention_pattern) != self.layers:
                return f"the attention pattern names {len(self.attention_pattern)} layers, the model has {self.layers}"
            known = {"full", "window", "chunk"} | {b.attention for b in self.measured_blocks if b.whole}
            if unknown := sorted(set(self.attention_pattern) - known):
                return f"unknown attention kinds {', '.join(map(repr, unknown))} (valid: full, window, chunk)"
        return _moe_problem(self.moe, self.layers) or _mla_problem(self.mla) or _dit_problem(self.dit, self.layers)

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
        if attn not in ("full", "window", "chunk"):  # a block priced wholly from its measurement
            return LayerKind(attention=attn, mlp="measured")  # type: ignore[arg-type]
        return LayerKind(attention=attn, mlp="moe" if self.is_moe_layer(i) else "dense")  # type: ignore[arg-type]

    def whole_block(self, kind: LayerKind) -> MeasuredBlock:
        """The measurement of a kind priced wholly from it (`kind.mlp == "measured"`)."""
        return next(b for b in self.measured_blocks if b.whole and b.attention == kind.attention)

    @property
    def whole_blocks(self) -> tuple[MeasuredBlock, ...]:
        """The measured blocks priced wholly from their measurement (none for an adapted model)."""
        return tuple(b for b in self.measured_blocks if b.whole)

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

    def dit_block_replicated_params(self, kind: LayerKind) -> int:
        """The part of a DiT block's parameters every TP rank holds whole (the rest, the q/k/v, output, FFN
        and adaLN projections with the biases of their split outputs, splits over TP): row-parallel
        output biases, the q/k RMSNorm weights (per head: `head_dim` wide; Wan's across heads: `d` wide, the
        norm runs on the gathered heads, `graph.common.qk_norm`), Wan's affine cross-attention LayerNorm and
        its 6·d modulation table. The adaLN projections (d→k·d, per sample) are column-parallel, as
        Megatron-Core's DiT `AdaLN` builds them (`ColumnParallelLinear`, gathered output)."""
        d, hd = self.hidden, self.head_dim
        if kind.mlp == "dit":
            qk = 2 * d if self.qk_norm_across_heads else 2 * hd
            norm = 2 * d if self.dit and self.dit.cross_attn_norm else 0
            return 2 * (d + qk) + norm + d + 6 * d  # 2 attentions (out bias, q/k norms), FFN out bias, table
        if kind.mlp == "dit-double":
            return 4 * hd + 2 * d + 2 * d  # video and text q/k norms, both out biases, both FFN out biases
        return 2 * hd + d  # q/k norms, the output projection's bias

    def dit_embedder_params(self) -> int:
        """What runs before the first block (the first pipeline stage holds it): the patch embedding
        (Conv3d), the time embedding and the conditioning embedders (Wan: text MLP and the time projection
        to the blocks' 6 modulations; HunyuanVideo: time, guidance and pooled-text embedders and the token
        refiner over the text)."""
        assert self.dit is not None
        x, d = self.dit, self.hidden
        patch = x.patch[0] * x.patch[1] * x.patch[2]
        n = x.in_channels * patch * d + d  # patch embedding (Conv3d)
        timestep = x.freq_dim * d + d + d * d + d
        if x.family == "wan":
            n += timestep + (6 * d * d + 6 * d)  # time embedding + time projection to 6 modulations
            return n + x.text_dim * d + d + d * d + d  # text embedding MLP
        n += timestep * (2 if x.guidance else 1) + x.pooled_dim * d + d + d * d + d
        refiner_block = 4 * (d * d + d) + 4 * d + (2 * d * self.ffn_hidden + self.ffn_hidden + d) + 2 * d * d + 2 * d
        return n + timestep + x.text_dim * d + d + d * d + d + x.text_dim * d + d + x.refiner_layers * refiner_block

    def dit_head_params(self) -> int:
        """What runs after the last block (the last pipeline stage holds it): the output modulation (Wan: a
        2·d table; HunyuanVideo: an adaLN d→2d) and the projection back to latent patches."""
        assert self.dit is not None
        x, d = self.dit, self.hidden
        patch = x.patch[0] * x.patch[1] * x.patch[2]
        modulation = 2 * d if x.family == "wan" else 2 * d * d + 2 * d
        return modulation + x.out_channels * patch * d + x.out_channels * patch

    def dit_extra_params(self) -> int:
        """Everything outside the blocks: the embedders and the output head."""
        return self.dit_embedder_params() + self.dit_head_params()

    def layer_params_of(self, kind: LayerKind) -> int:
        if kind.mlp == "measured":
            return self.whole_block(kind).params
        if kind.mlp.startswith("dit"):
            return self.dit_block_params(kind)
        mlp = self.moe_block_params if kind.mlp == "moe" else self.mlp_params
        return self.attention_params + mlp + 2 * self.norm_params + self.extra_layer_params

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
        return self.embedding_params + layers + self.norm_params + self.lm_head_params + self.extra_params

    @property
    def params_active(self) -> int:
        """Parameters a token passes through: all but the routed experts it is not sent to."""
        idle = 0.0
        for kind, n in self.kind_counts(range(self.layers)).items():  # measured blocks' routed experts
            if kind.mlp == "measured" and (b := self.whole_block(kind)).experts:
                top_k = sum(m * c for m, _, _, c in b.expert_gemms) / max(len(b.expert_gemms), 1)
                idle += n * b.expert_params * (1 - top_k / b.experts)
        if self.moe is None:
            return self.params_total - round(idle)
        idle += self.moe_layers * (self.moe.experts - self.moe.top_k) * self.expert_params
        return self.params_total - round(idle)

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
        if kind.mlp == "measured":  # the measured forward FLOPs per token linear in s, halved (the attention's
            return round(self.whole_block(kind).flops_fwd[0] / 2)  # are `keys_per_query`'s; a scan's are here)
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
        if kind.mlp == "measured":  # its score FLOPs as keys of this spec's heads: 0 without an attention
            keys = (s + 1) / 2 if causal else float(s)
            per_key = 2 * self.heads * (self.qk_head_dim + self.v_head_dim)
            return self.whole_block(kind).attention_flops * keys / per_key
        if kind.attention == "window" and w and w < s:
            return (w * s - w * (w - 1) / 2) / s if causal else float(min(2 * w, s))
        if kind.attention == "chunk" and w and w < s:
            return (w + 1) / 2 if causal else float(w)
        return (s + 1) / 2 if causal else float(s)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def divisors_text(n: int) -> str:
    """The divisors of `n` as a list for an error's valid choices ("a divisor of n" when n is too large to
    list them: a malformed config can hold any number)."""
    if n > 100_000:
        return f"a divisor of {n}"
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _moe_problem(m: MoESpec | None, layers: int) -> str | None:
    """Why the routed experts cannot be built, or None (the router's `torch.topk` needs k <= experts;
    group-limited routing splits the experts into equal groups, Megatron-Core TransformerConfig)."""
    if m is None:
        return None
    for what, value in (("experts", m.experts), ("expert FFN size", m.expert_ffn), ("MoE layer step", m.layer_step),
                        ("expert groups", m.groups)):  # fmt: skip
        if not _is_int(value) or value < 1:
            return f"{what} must be a positive integer, got {value!r}"
    if m.experts > MAX_EXPERTS:
        return f"{m.experts} experts is beyond any trained model (at most ~1M, PEER); valid: 1 to {MAX_EXPERTS:,}"
    if not _is_int(m.top_k) or not 1 <= m.top_k <= m.experts:
        return f"experts per token (top-k) must be 1 to {m.experts} (the experts), got {m.top_k!r}"
    if not _is_int(m.shared_experts) or m.shared_experts < 0 or (m.shared_experts and m.shared_ffn < 1):
        return f"{m.shared_experts!r} shared experts of FFN size {m.shared_ffn!r}: need >= 0 experts of size >= 1"
    if not _is_int(m.first_dense_layers) or not 0 <= m.first_dense_layers <= layers:
        return f"first dense layers must be 0 to {layers} (the layers), got {m.first_dense_layers!r}"
    if m.experts % m.groups:
        return f"{m.groups} expert groups do not divide the {m.experts} experts"
    if not _is_int(m.groups_per_token) or not 1 <= m.groups_per_token <= m.groups:
        return f"groups per token must be 1 to {m.groups} (the expert groups), got {m.groups_per_token!r}"
    reachable = m.groups_per_token * (m.experts // m.groups)
    if m.top_k > reachable:
        return f"top-k {m.top_k} exceeds the {reachable} experts of the {m.groups_per_token} groups a token may use"
    return None


def _mla_problem(a: MLASpec | None) -> str | None:
    if a is None:
        return None
    dims = dict(kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.qk_nope_head_dim,
                qk_rope_head_dim=a.qk_rope_head_dim, v_head_dim=a.v_head_dim)  # fmt: skip
    for what, value in dims.items():
        if not _is_int(value) or value < 1:
            return f"MLA {what} must be a positive integer, got {value!r}"
    if not _is_int(a.q_lora_rank) or a.q_lora_rank < 0:  # 0: q projected directly (DeepSeek-V2-Lite)
        return f"MLA q_lora_rank must be an integer >= 0, got {a.q_lora_rank!r}"
    return None


def _dit_problem(d: DiTSpec | None, layers: int) -> str | None:
    if d is None:
        return None
    sizes = dict(in_channels=d.in_channels, out_channels=d.out_channels, text_dim=d.text_dim, text_len=d.text_len,
                 freq_dim=d.freq_dim, vae_temporal=d.vae_temporal, vae_spatial=d.vae_spatial)  # fmt: skip
    for what, value in sizes.items():
        if not _is_int(value) or value < 1:
            return f"DiT {what} must be a positive integer, got {value!r}"
    if len(d.patch) != 3 or not all(_is_int(p) and p >= 1 for p in d.patch):
        return f"DiT patch must be three positive integers (t, h, w), got {d.patch!r}"
    if not _is_int(d.double_layers) or not 0 <= d.double_layers <= layers:
        return f"DiT dual-stream layers must be 0 to {layers} (the layers), got {d.double_layers!r}"
    if not _is_int(d.refiner_layers) or d.refiner_layers < 0 or not _is_int(d.pooled_dim) or d.pooled_dim < 0:
        return f"DiT refiner layers and pooled dim must be integers >= 0, got {d.refiner_layers!r}, {d.pooled_dim!r}"
    return None
