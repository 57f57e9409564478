"""Per-GPU memory: model state (weights, grads, optimizer), activations and transient buffers.

Model state per parameter (mixed precision with Adam; Rajbhandari et al. 2020, ZeRO §3):
  Megatron-style DDP / ZeRO (`fsdp=False`): bf16 weights (2 B), fp32 gradient buffer (4 B, the
  `main_grad` that backward accumulates into), fp32 master weights + Adam m, v (12 B). ZeRO-1 shards
  the 12 B, ZeRO-2 also the grads, ZeRO-3 also the weights, over the shard group.
  PyTorch FSDP (`fsdp=True`): the sharded fp32 parameters are the master weights (4 B), fp32 sharded
  grads (4 B), Adam m, v (8 B), all over the shard group; bf16 copies of whole layers exist only while
  gathered (buffers).

Activations: the in-flight micro-batches of the stage (1F1B holds pp - stage of them; the interleaved
schedule holds (pp - 1)·2 + (vpp - 1)·pp + 1 model chunks on the first rank, Narayanan et al. 2021)
times the saved bytes per layer of the recompute policy, plus one layer's backward working set.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.graph.build import BF16, FP32, StageGraph
from shardscope.graph.fp8 import weight_copy_bytes_per_param
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan

GIB = 2**30
# Outside torch's allocated count: CUDA context + cuBLAS workspaces (~0.6 GiB on Hopper, nvidia-smi of
# an idle PyTorch process) and NCCL channel buffers (~0.4 GiB for a few communicators).
CONTEXT_BYTES = 1.0 * GIB
# Caching-allocator fragmentation of the dynamic (activation/buffer) part: block rounding and splits
# typically leave reserved 3-10% above allocated; 5% is used.
FRAGMENTATION = 0.05


def layer_params_local(model: ModelSpec, tp: int) -> float:
    """Parameters of one transformer block on one TP rank (norms and row-parallel biases replicated)."""
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    sharded = h * (q + 2 * kv) + q * h
    sharded += (3 if model.mlp == "swiglu" else 2) * h * model.ffn_hidden
    replicated = 2 * model.norm_params
    if model.qkv_bias:
        sharded += q + 2 * kv
    if model.out_bias:
        replicated += h
    if model.qk_norm:
        replicated += 2 * model.head_dim
    if model.mlp_bias:
        sharded += model.ffn_hidden if model.mlp == "gelu" else 2 * model.ffn_hidden
        replicated += h
    return sharded / tp + replicated


def stage_params_local(model: ModelSpec, plan: Plan, stage: int) -> float:
    """Parameters held by one GPU of pipeline stage `stage` (TP-sharded, before ZeRO/FSDP)."""
    n = plan.stage_layers(model.layers) * layer_params_local(model, plan.tp)
    vocab_rows = model.vocab * model.hidden / plan.tp
    if stage == 0:
        n += vocab_rows + model.pos_embedding_rows * model.hidden
    if stage == plan.pp - 1:
        n += model.norm_params
        # A tied output layer on a separate last stage keeps its own copy of the embedding.
        if not model.tied_embeddings or plan.pp > 1:
            n += vocab_rows
    return n


@dataclass(frozen=True, slots=True)
class StateBytes:
    params: float
    grads: float
    optimizer: float


def model_state_bytes(n_params: float, plan: Plan) -> StateBytes:
    shard = plan.shard_size
    if plan.fsdp:
        return StateBytes(4 * n_params / shard, 4 * n_params / shard, 8 * n_params / shard)
    z = plan.zero
    return StateBytes(
        params=2 * n_params / (shard if z >= 3 else 1),
        grads=4 * n_params / (shard if z >= 2 else 1),
        optimizer=12 * n_params / (shard if z >= 1 else 1),
    )


def inflight_chunks(plan: Plan, stage: int) -> tuple[int, float]:
    """(micro-batches in flight, layers-worth of activations per in-flight micro-batch) on `stage`."""
    m = plan.grad_accum
    layers_fraction = 1.0 / plan.pp
    if plan.pp == 1:
        return 1, 1.0
    if plan.vpp == 1:
        return min(plan.pp - stage, m), layers_fraction
    chunks = min((plan.pp - stage - 1) * 2 + (plan.vpp - 1) * plan.pp + 1, m * plan.vpp)
    return chunks, layers_fraction / plan.vpp


def activation_bytes(model: ModelSpec, plan: Plan, graph: StageGraph, stage: int) -> tuple[float, float, int]:
    """(saved activations at the peak, backward working set, in-flight micro-batches) on `stage`."""
    chunks, layer_frac = inflight_chunks(plan, stage)
    stage_layers = plan.stage_layers(model.layers)
    chunk_layers = stage_layers / plan.vpp if plan.pp > 1 else stage_layers
    per_layer = {p: graph.layer.saved_bytes(p) for p in ("none", "selective", "full")}
    if plan.recompute == "full":
        full_layers = plan.recomputed_layers(stage_layers)
        share_full = full_layers / stage_layers
        per_chunk = chunk_layers * (share_full * per_layer["full"] + (1 - share_full) * per_layer["none"])
    else:
        per_chunk = chunk_layers * per_layer[plan.recompute]
    saved = chunks * per_chunk
    if stage == 0:
        saved += graph.embedding.saved_bytes(plan.recompute) * chunks
    if stage == plan.pp - 1:
        saved += graph.head.saved_bytes(plan.recompute)  # the last stage runs each micro-batch's backward at once
    # Backward of one layer: a recomputed layer re-materialises its "none" activations; every layer's
    # backward holds the gradients of its largest intermediates (input grads of the MLP and attention).
    t = graph.tokens
    grad_ws = BF16 * t * (2 * model.ffn_hidden / plan.tp + model.hidden)
    recompute_ws = per_layer["none"] - per_layer["full"] if plan.recompute == "full" else 0.0
    if plan.recompute == "selective":
        recompute_ws = per_layer["none"] - per_layer["selective"]
    return saved, max(recompute_ws, 0.0) + grad_ws, chunks


def buffer_bytes(model: ModelSpec, plan: Plan, graph: StageGraph, stage: int, arch: str = "hopper") -> float:
    """Transient buffers alive at the peak besides activations (and the step-long FP8 weight copies)."""
    buf = 0.0
    layer_local = layer_params_local(model, plan.tp)
    gathered_layers = plan.stage_layers(model.layers)
    if (plan.fsdp or plan.zero == 3) and plan.shard_size > 1:
        # Current + prefetched gathered layer (bf16) and an unsharded fp32 gradient being reduce-scattered.
        buf += 2 * BF16 * layer_local + FP32 * layer_local
        if plan.reshard_after_forward:
            gathered_layers = 2
        else:
            buf += BF16 * stage_params_local(model, plan, stage)
    if plan.precision == "fp8":
        buf += weight_copy_bytes_per_param(plan, arch) * layer_local * gathered_layers
    if stage == plan.pp - 1:
        # Loss backward: fp32 gradient of the logits and its bf16 cast for the output GEMM.
        logits = graph.tokens * model.vocab / plan.tp
        buf += (FP32 + BF16) * logits
    if plan.pp > 1:
        buf += 2 * 2 * graph.boundary_bytes  # send/recv buffers, forward and backward
    return buf
