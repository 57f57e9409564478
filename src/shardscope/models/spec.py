"""The typed model spec of a dense decoder-only transformer, and its exact parameter counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MlpKind = Literal["swiglu", "gelu"]
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "alibi"]

# The GPT-2 / GPT-3 / MPT block: LayerNorm with bias, GeLU MLP, biases on every linear.
GPT_BLOCK = dict(mlp="gelu", norm="layernorm", norm_bias=True, qkv_bias=True, out_bias=True, mlp_bias=True)


@dataclass(frozen=True, slots=True)
class ModelSpec:
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
    ffn_hidden: int
    vocab: int
    mlp: MlpKind = "swiglu"
    norm: NormKind = "rmsnorm"
    norm_bias: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    position: PositionKind = "rope"
    pos_embedding_rows: int = 0
    lm_head_bias: bool = False
    source: str = ""

    # ----- parameter counts -----------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm_bias else 1)

    @property
    def attention_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        n = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            n += q + 2 * kv
        if self.out_bias:
            n += h
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def mlp_params(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        mats = 3 if self.mlp == "swiglu" else 2
        n = mats * h * f
        if self.mlp_bias:
            n += (mats - 1) * f + h
        return n

    @property
    def layer_params(self) -> int:
        """One transformer block: attention, MLP and its two norms."""
        return self.attention_params + self.mlp_params + 2 * self.norm_params

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
        return self.embedding_params + self.layers * self.layer_params + self.norm_params + self.lm_head_params

    @property
    def params_matmul_per_token(self) -> int:
        """Weights that multiply each token (layers + output layer; not the embedding lookups)."""
        head = self.vocab * self.hidden
        return self.layers * self.layer_params + head
