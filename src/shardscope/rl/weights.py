"""What a weight update moves: the model's checkpoint tensors split into routed experts, dense FFN and the
rest, with their bytes in the transfer precision and their tensor counts (engines pay per tensor).

Counts come from the model spec (`ModelSpec`: exact parameters, experts, layers). MTP modules are left
out: rollout engines without speculative decoding skip them on load (vLLM's DeepSeek loader drops the
layers past `num_hidden_layers`). FP8 is DeepSeek's blockwise format (the one vLLM and NeMo-RL refit):
every linear weight of attention and FFN in float8 with one float32 scale per 128 x 128 block, stored as a
sibling `weight_scale_inv` tensor; embeddings, the output head, norms and the router stay BF16.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.errors import ShardscopeError
from shardscope.models.spec import ModelSpec

PRECISIONS = ("bf16", "fp8")
FP8_BLOCK = 128 * 128  # weights per float32 scale in blockwise FP8 (DeepSeek-V3 `weight_block_size`)
FP8_BYTES_PER_PARAM = 1.0 + 4.0 / FP8_BLOCK
BF16_BYTES = 2.0


@dataclass(frozen=True, slots=True)
class WeightGroup:
    """One class of checkpoint tensors: `params` weights in `tensors` tensors, `bytes` in the transfer
    precision, `quantized`: whether a BF16->FP8 pass converts them."""

    params: int
    tensors: int
    bytes: float
    quantized: bool


@dataclass(frozen=True, slots=True)
class WeightInventory:
    """The update's payload by class: routed experts, dense FFN (dense MLPs and shared experts), the rest
    (attention, embeddings, output head, norms, routers)."""

    precision: str
    experts: WeightGroup
    dense_ffn: WeightGroup
    other: WeightGroup
    expert_count: int  # routed experts per MoE layer (0 for a dense model)
    moe_layers: int

    @property
    def groups(self) -> tuple[WeightGroup, ...]:
        return (self.experts, self.dense_ffn, self.other)

    @property
    def bytes(self) -> float:
        return sum(g.bytes for g in self.groups)

    @property
    def tensors(self) -> int:
        return sum(g.tensors for g in self.groups)

    @property
    def quantizable_params(self) -> int:
        return sum(g.params for g in self.groups if g.quantized)


def _group(params: int, matrices: int, small: int, precision: str, quantized: bool) -> WeightGroup:
    """`matrices` linear weights holding `params` (FP8 adds one scale tensor each) plus `small` BF16
    tensors (norms, biases) whose size is negligible next to them."""
    fp8 = precision == "fp8" and quantized
    nbytes = params * (FP8_BYTES_PER_PARAM if fp8 else BF16_BYTES)
    tensors = matrices * (2 if fp8 else 1) + small
    return WeightGroup(params=params, tensors=tensors, bytes=nbytes, quantized=quantized)


def inventory(model: ModelSpec, precision: str = "bf16") -> WeightInventory:
    """The checkpoint of `model` (MTP excluded) as an update moves it in `precision`."""
    if precision not in PRECISIONS:
        raise ShardscopeError(f"unknown weight precision {precision!r} (valid: {', '.join(PRECISIONS)})")
    if model.dit is not None:
        raise ShardscopeError(f"{model.name} is a diffusion transformer; rl-sync plans language-model policies")
    moe = model.moe
    moe_layers = model.moe_layers if moe else 0
    dense_layers = model.layers - moe_layers
    mats = 3 if model.mlp == "swiglu" else 2
    expert_params = moe_layers * moe.experts * model.expert_params if moe else 0
    shared = moe_layers * model.shared_expert_params if moe else 0
    dense_params = dense_layers * model.mlp_params + shared
    dense_mats = dense_layers * mats + (moe_layers * mats * moe.shared_experts if moe else 0)
    other_params = model.params_total - expert_params - dense_params
    # Attention: MLA stores five projections (q_a, q_b, kv_a, kv_b, o) and two low-rank norms; GQA/MHA
    # four (q, k, v, o) plus optional q/k norms. Each layer has two block norms; MoE layers a router
    # (and its bias); the model an embedding, a final norm and (untied) an output head.
    attn_mats = 5 if model.mla else 4
    attn_small = 2 if model.mla else (2 if model.qk_norm else 0)
    router = (2 if moe and (moe.score_correction_bias or moe.router_bias) else 1) if moe else 0
    # Embedding and output head are BF16 in either precision: count them as small tensors.
    small = model.layers * (2 + attn_small) + moe_layers * router + 2 + (0 if model.tied_embeddings else 1)
    head = model.embedding_params + model.lm_head_params
    other_matrix_params = other_params - head
    other = _group(other_matrix_params, model.layers * attn_mats, 0, precision, True)
    other = WeightGroup(
        params=other_params,
        tensors=other.tensors + small,
        bytes=other.bytes + head * BF16_BYTES,
        quantized=True,
    )
    experts = _group(expert_params, moe_layers * moe.experts * mats if moe else 0, 0, precision, True)
    dense = _group(dense_params, dense_mats, 0, precision, True)
    return WeightInventory(
        precision=precision,
        experts=experts,
        dense_ffn=dense,
        other=other,
        expert_count=moe.experts if moe else 0,
        moe_layers=moe_layers,
    )
