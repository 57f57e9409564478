"""A training plan and its validation against a model and a cluster.

Degrees follow Megatron's rank order, innermost first: TP, CP, DP, PP (`tp-cp-dp-pp`), so TP groups are
contiguous GPUs (inside a node when tp <= gpus_per_node) and PP stages are the outermost split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import lru_cache
from operator import attrgetter
from typing import Any, Literal

from shardscope.errors import ShardscopeError, warn
from shardscope.hardware.catalog import GPU, Cluster
from shardscope.models.spec import ModelSpec, divisors_text
from shardscope.plan.layout import read_pp_layout

Recompute = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp8"]
Fp8Recipe = Literal["tensorwise", "rowwise", "delayed", "blockwise", "mxfp8"]
FP8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise", "delayed", "blockwise", "mxfp8")
LINEAR_IMPLS: tuple[str, ...] = ("te", "torch")
AttentionKernel = Literal["auto", "fa2", "fa3", "cudnn", "unfused"]
ATTENTION_KERNELS: tuple[str, ...] = ("auto", "fa2", "fa3", "cudnn", "unfused")
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full")
# Megatron-Core CUDA-graph capture (`--cuda-graph-modules`, per layer) or the whole step (`full_iteration`)
CUDA_GRAPH_SCOPES: tuple[str, ...] = ("attn", "mlp", "moe_router", "moe_preprocess", "moe", "full_iteration")
MOMENT_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}  # each of Adam's m, v per parameter
MAIN_GRAD_BYTES = {"fp32": 4, "bf16": 2}
EP_DISPATCHERS = ("flat", "deepep", "hybridep")
MOE_PERMUTES = ("megatron", "index")
# Megatron-Core `--recompute-modules` (selective granularity): each re-runs its ops in backward instead of
# keeping what they save. layernorm: the input and pre-MLP norms; mla_up_proj: MLA up-projections + RoPE
# (q, k, v are rebuilt from the latents); core_attn: the attention kernel; moe_act / mlp / moe /
# shared_experts: the routed experts' activation, a dense MLP, a whole MoE block, the shared experts.
MEGATRON_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe", "shared_experts")


# The plan's sections: each Plan field belongs to one (`opt(section=...)`), and the CLI, the API, the
# flags a validation row states and the op graph's memo key all come from that one declaration.
SECTIONS = ("parallelism", "sharding", "recompute", "precision", "moe", "kernels", "batch")


def opt(default: Any, section: str, help: str, *, choices: tuple = (), graph: bool = False, flag: str = "",
        cli: bool = True) -> Any:  # fmt: skip
    """One Plan option: its default, section, help text, valid `choices`, whether the op graph reads it
    (`graph`: plans that differ only elsewhere share one graph), its CLI `flag` name if not the field's
    and whether the CLI offers it."""
    meta = {"section": section, "help": help, "choices": choices, "graph": graph, "flag": flag, "cli": cli}
    return field(default=default, metadata=meta)


# Not slotted: a plan keeps its fields in its `__dict__`, so a plan already checked field by field (`make_plan`)
# or copied with changes (`records.evolve`) is filled by one dict update rather than ~55 attribute sets,
# which the planner does about a million times in a large search.
@dataclass(frozen=True)
class Plan:
    """How one training step is laid out on the cluster, in sections (`SECTIONS`).

    Sharding: `zero` 0 = DDP (Megatron-style: bf16 weights, fp32 grads, fp32 master + Adam), 1 = sharded
    optimizer (Megatron distributed optimizer), 2 = + sharded grads, 3 = + sharded weights. `fsdp=True` is
    PyTorch FSDP/FSDP2 FULL_SHARD (fp32 sharded master weights, bf16 all-gather), with `shard_group` < dp
    for HSDP and `reshard_after_forward=False` for SHARD_GRAD_OP / ZeRO-2-like FSDP.
    """

    # parallelism
    tp: int = opt(1, "parallelism", "tensor-parallel degree", graph=True)
    pp: int = opt(1, "parallelism", "pipeline-parallel degree")
    vpp: int = opt(1, "parallelism", "virtual stages per pipeline rank (interleaved 1F1B)")
    cp: int = opt(1, "parallelism", "context-parallel degree", graph=True)
    dp: int = opt(1, "parallelism", "data-parallel degree (default gpus/(tp·pp·cp))")
    sequence_parallel: bool = opt(True, "parallelism", "Megatron sequence parallel with TP", graph=True)
    cp_kind: str = opt("ring", "parallelism", "context parallel", choices=("ring", "a2a"), graph=True)
    ep: int = opt(1, "parallelism", "expert-parallel degree (carved out of dp·cp·tp)", graph=True)
    etp: int = opt(1, "parallelism", "expert tensor-parallel degree", graph=True)
    # decoder layers per model chunk (pp·vpp of them); () = even split
    pp_layout: tuple[int, ...] = opt(
        (), "parallelism", "layers per model chunk: Megatron layout ('Et*4|(t*4|)*14tmL'; MTP in a chunk of its "
        "own: '...|m|L') or counts ('5,4,...,1')",
    )  # fmt: skip
    # model chunk of the MTP modules (their output layers run with the loss, last chunk)
    mtp_chunk: int = opt(-1, "parallelism", "model chunk of the MTP modules", cli=False)
    # sharding
    zero: int = opt(0, "sharding", "ZeRO stage 0-3 (Megatron-style state)", choices=(0, 1, 2, 3))
    fsdp: bool = opt(False, "sharding", "PyTorch FSDP (full shard); see --shard-group, --reshard")
    # FSDP2 (`fully_shard`, per-parameter DTensors) copies each gathered weight out of the all-gather buffer
    # and concatenates the gradients into the reduce buffer; FSDP1's flat parameter is a view (costs.fsdp)
    fsdp2: bool = opt(True, "sharding", "with --fsdp: FSDP2 (fully_shard); off: FSDP1's flat parameters")
    shard_group: int = opt(0, "sharding", "HSDP shard-group size (0 = all of dp)")
    reshard_after_forward: bool = opt(True, "sharding", "FSDP reshard after forward", flag="reshard")
    fsdp_prefetch: int = opt(1, "sharding", "FSDP layers gathered ahead of the one computing (0 = no overlap)")
    overlap_grad_reduce: bool = opt(True, "sharding", "DP gradient buckets reduce under the last backward")
    offload_optimizer: bool = opt(
        False, "sharding", "optimizer states + master weights in host memory, Adam on the CPU"
    )
    # Megatron's precision-aware optimizer: Adam m and v (`exp_avg(_sq)_dtype`) and the gradient buffer
    # that backward accumulates into and DP reduces (`main_grads_dtype`)
    optimizer_moments: str = opt("fp32", "sharding", "Adam m, v dtype (Megatron)", choices=tuple(MOMENT_BYTES))
    main_grads: str = opt("fp32", "sharding", "gradient buffer dtype (Megatron)", choices=tuple(MAIN_GRAD_BYTES))
    # the gradient buffer lives through the step (Megatron's contiguous `main_grad` buffer, DeepSpeed's
    # partitions); False: PyTorch's `zero_grad(set_to_none=True)` frees the grads after each step, so
    # without accumulation they grow in backward only as the activations are freed
    persistent_grads: bool = opt(True, "sharding", "the gradient buffer lives through the step (off: set_to_none)")
    # torch.distributed.pipelining runs every micro-batch's backward of an FSDP stage without gradient sync
    # and without resharding, then reduce-scatters once after the last: the stage's gradients accumulate
    # unsharded in FSDP's reduce dtype (fp32) across the step, and the reduction follows the last backward
    pipeline_defers_grad_sync: bool = opt(
        False, "sharding", "PP with FSDP: gradients stay unsharded (fp32) until the last backward", cli=False
    )
    # recompute
    recompute: str = opt("none", "recompute", "activation recompute", choices=RECOMPUTE_POLICIES)
    recompute_layers: int = opt(0, "recompute", "full recompute for only this many layers per stage")
    # with "selective": Megatron-Core modules recomputed (else op-level)
    recompute_modules: tuple[str, ...] = opt(
        (), "recompute", "with selective: Megatron modules to recompute, e.g. layernorm,moe_act,mla_up_proj"
    )
    offload_activations: float = opt(0.0, "recompute", "fraction of saved activations kept in host memory")
    # torchtitan's op-level selective AC (`selective_ac_option = "op"`) saves the outputs of a block's matmuls
    # except every second one in forward order, and recomputes the rest: with op-level "selective", the
    # 2nd, 4th, ... matmul of each block re-runs in backward too (wk, wo, w3 of a Llama block)
    recompute_alternate_mm: bool = opt(False, "recompute", "op-level selective also recomputes every second matmul")
    # precision
    precision: str = opt("bf16", "precision", "GEMM precision", choices=("bf16", "fp16", "fp8"), graph=True)
    fp8_recipe: str = opt("tensorwise", "precision", "FP8 scaling", choices=FP8_RECIPES, graph=True)
    # FP8 parameters: the weights are held and all-gathered in FP8, with no BF16 copy (Megatron
    # --fp8-param-gather, torchao's FSDP float8 all-gather); the optimizer keeps its fp32 master weights
    fp8_all_gather: bool = opt(False, "precision", "FP8 parameters, gathered in FP8, no BF16 copy (--fp8-param-gather)")
    # DeepSeek-V3's low-precision activation cache (arXiv 2412.19437 §3.3.3): the attention output, which the
    # attention backward and the out projection's wgrad both read, is kept once in a 12-bit E5M6 format, and
    # the MoE SwiGLU input in FP8 with 1x128 scales (its output is recomputed: `--recompute-modules moe_act`)
    fp8_activation_cache: bool = opt(
        False, "precision", "cache the attention output in E5M6 and the MoE SwiGLU input in FP8 (DeepSeek-V3)",
        graph=True,
    )  # fmt: skip
    # moe
    moe_imbalance: float = opt(1.0, "moe", "extra load factor on the hottest EP rank (dropless)", graph=True)
    moe_skew: float = opt(0.0, "moe", "Zipf exponent of expert popularity (0 = balanced)", graph=True)
    capacity_factor: float = opt(
        0.0, "moe", "expert capacity factor: tokens over it dropped (0 = dropless)", graph=True
    )
    # with a capacity factor: pad every expert's rows to its capacity (Megatron-Core
    # `moe_pad_expert_input_to_capacity`: fixed shapes, no host sync); off, experts run the tokens they keep
    pad_to_capacity: bool = opt(
        True, "moe", "with --capacity-factor: pad experts to capacity, no host sync", graph=True
    )
    # FP8 MoE: the router pads each expert's token count to the FP8 GEMM's row alignment (Megatron-Core
    # `moe_router_padding_for_quantization`, default off); off, Transformer Engine pads and un-pads the rows
    moe_router_padding: bool = opt(
        False, "moe", "FP8 MoE: the router pads expert counts to the FP8 alignment", graph=True
    )
    # DeepEP: the received tokens' routing map built by one fused kernel (Megatron-Core
    # `fused_indices_to_multihot`, under `--enable-experimental` with `--moe-permute-fusion`); off (Megatron's
    # default), `_indices_to_multihot` indexes with boolean masks, which synchronise the stream
    deepep_fused_routing_map: bool = opt(
        False, "moe", "DeepEP: fused routing-map kernel (Megatron --enable-experimental)", graph=True
    )
    # Transformer Engine's fused grouped MLP for the experts (Megatron-Core `use_transformer_engine_op_fuser`
    # with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; MXFP8 on Blackwell): gate/up GEMM, GLU, routing weights, biases
    # and down GEMM in fused grouped kernels, without Transformer Engine's FP8 row padding
    fused_expert_mlp: bool = opt(False, "moe", "Transformer Engine's fused grouped expert MLP (MXFP8)", graph=True)
    mtp: bool = opt(False, "moe", "train the model's multi-token-prediction modules (DeepSeek-V3)")
    ep_comm_overlap: bool = opt(False, "moe", "hide EP all-to-alls under another micro-batch's compute", graph=True)
    # MoE token dispatcher: NCCL all-to-all (a copy per token-expert pair), or DeepEP / HybridEP (one copy
    # per destination node, fanned out over NVLink there)
    ep_dispatch: str = opt("flat", "moe", "MoE token dispatcher", choices=EP_DISPATCHERS, graph=True)
    # How routed tokens reach the experts on a GPU: Megatron-Core's permute kernels (a dropless dispatcher
    # copies the token counts to the host first), or plain PyTorch indexing as torchtitan does it
    # (argsort, gather, groups padded by an index kernel, scatter back, fp32 weighted sum; no host sync)
    moe_permute: str = opt("megatron", "moe", "MoE token permutation", choices=MOE_PERMUTES, graph=True)
    # kernels (the stack's; a flag overrides)
    attention_kernel: str = opt("auto", "kernels", "attention kernel", choices=ATTENTION_KERNELS, graph=True)
    causal_block_skip: bool = opt(True, "kernels", "causal flash attention skips the masked blocks", graph=True)
    causal: bool = opt(True, "kernels", "causal LM attention (False for diffusion transformers)", graph=True, cli=False)
    tp_comm_overlap: bool = opt(False, "kernels", "overlap TP collectives with GEMMs", graph=True)
    # torchtitan's (and transformers') model code has one nn.Linear per projection (wq, wk, wv; w1, w3), where
    # Megatron runs one fused GEMM (linear_qkv, linear_fc1): each linear is its own GEMM over the shared input
    # (`Op.splits`), and backward sums their input gradients before the TP reduce-scatter, so PyTorch's async
    # TP, which fuses a reduce-scatter only with the one matmul producing its input (Inductor
    # micro_pipeline_tp.py `fuse_matmul_reduce_scatter`: "no producer matmul found"), leaves those two exposed
    split_projections: bool = opt(
        False, "kernels", "q/k/v and gate/up are separate linears (torchtitan), not one fused GEMM", graph=True,
        cli=False,
    )  # fmt: skip
    # DTensor's parallel styles (torchtitan, NeMo AutoModel) all-gather the sequence-parallel input once and
    # autograd keeps the gathered tensor (tp x the shard's bytes) for the column GEMMs' weight gradients;
    # Megatron keeps its shard and all-gathers it again beside dgrad. Under op-level selective checkpointing
    # the gather is not among the saved ops (torchtitan's `_save_list`: matmuls, attention, reduce-scatter),
    # so backward re-runs it.
    tp_keeps_gathered_input: bool = opt(
        False, "kernels", "autograd keeps the all-gathered TP input (DTensor TP); no re-gather for wgrad", graph=True,
        cli=False,
    )  # fmt: skip
    # CUDA-graphed scopes (CUDA_GRAPH_SCOPES); () = eager, every op launched by the host
    cuda_graphs: tuple[str, ...] = opt(
        (), "kernels", "CUDA-graphed scopes (default eager): attn,mlp,moe_router,moe_preprocess,moe | full_iteration",
        graph=True,
    )  # fmt: skip
    # Megatron-Core's fused bias-activation (`bias_swiglu_fusion`): the SwiGLU, with an MoE layer's routing
    # weights folded in, is one autograd function that keeps only its input (no silu(gate), no expert outputs)
    fused_activation: bool = opt(False, "kernels", "fused SwiGLU keeping only its input (Megatron-Core)", graph=True)
    # A fused cross-entropy kernel (flash-attn's xentropy, as llm-foundry's default `fused_crossentropy`;
    # Megatron's `--cross-entropy-loss-fusion`) takes the softmax of the bf16 logits in registers: it keeps
    # the bf16 logits and the fp32 log-sum-exp, no fp32 copy, and writes a bf16 gradient
    fused_cross_entropy: bool = opt(False, "kernels", "fused cross-entropy: no fp32 copy of the logits", graph=True)
    # Megatron's unfused loss (tensor_parallel/cross_entropy.py `_VocabParallelCrossEntropy`) takes an fp32
    # copy of the logits and runs max, exp and the division on it in place: that softmax is what it keeps,
    # and its backward turns it into the gradient in place (autograd then casts that to bf16)
    vocab_parallel_loss: bool = opt(
        False, "kernels", "Megatron's vocab-parallel cross-entropy (fp32 softmax kept, reused in place)", graph=True,
        cli=False,
    )  # fmt: skip
    # torchtitan's loss over TP-sharded logits runs under DTensor's `loss_parallel` (tensor/parallel/loss.py):
    # log_softmax and nll_loss as decompositions with a vocabulary-wide all-reduce, whose backward builds
    # the gradient from zeros, exp(log-softmax) and their sum (no fused ATen kernel)
    loss_parallel: bool = opt(
        False, "kernels", "the loss over TP-sharded logits through DTensor's loss_parallel (torchtitan)", graph=True,
        cli=False,
    )  # fmt: skip
    # NeMo AutoModel's MaskedCrossEntropy calls `full_tensor()` on the TP-sharded logits (its TP plans shard
    # lm_head's output over the vocabulary): at TP > 1 every rank gathers them in fp32 and runs the loss
    # over the whole vocabulary
    loss_full_vocab: bool = opt(
        False, "kernels", "the loss gathers TP-sharded logits and runs over the whole vocabulary", graph=True,
        cli=False,
    )  # fmt: skip
    # Transformer Engine >= 2.18's fused cross-entropy writes the logits' gradient into an fp32 tensor in its
    # forward and keeps that (not the bf16 logits); autograd casts it to bf16 for the output GEMM
    fused_ce_fp32_grad: bool = opt(
        False, "kernels", "the fused cross-entropy keeps an fp32 logit gradient (TE >= 2.18)", graph=True, cli=False
    )
    # PyTorch's clip_grad_norm_ multiplies every gradient by min(1, max_norm / norm) each step; Megatron-Core
    # and DeepSpeed scale only when the norm exceeds the limit
    clip_scales_always: bool = opt(False, "kernels", "gradient clipping scales every gradient each step")
    # PyTorch-native model code (torchtitan, Hugging Face): norms and RoPE as eager ATen op chains
    # (graph.eager); `compile` (per-block torch.compile) fuses them, and the SwiGLU, into Triton kernels
    eager_elementwise: bool = opt(
        False, "kernels", "norms and RoPE as eager ATen op chains (PyTorch-native code)", graph=True
    )
    compile: bool = opt(
        False, "kernels", "torch.compile per block: norms, RoPE, SwiGLU fused (PyTorch stacks)", graph=True
    )
    # Whether `compile` covers the loss too (torchtitan compiles its loss function with the model from
    # April 2025, v0.1.0 on; its 2024 main branch ran the loss eager)
    compile_loss: bool = opt(True, "kernels", "torch.compile covers the loss as well", graph=True, cli=False)
    # RoPE by complex multiplication (torchtitan): Inductor cannot generate code for complex ops, so it
    # runs as an eager ATen chain even under torch.compile
    complex_rope: bool = opt(False, "kernels", "RoPE by complex multiplication (eager even when compiled)", graph=True)
    linear_impl: str = opt(
        "te", "kernels", "GEMMs through Transformer Engine or plain nn.Linear", choices=LINEAR_IMPLS, graph=True
    )
    # batch
    micro_batch: int = opt(1, "batch", "sequences per micro-batch per GPU", graph=True)
    global_batch: int = opt(1, "batch", "sequences per optimizer step (default: one micro-batch per DP rank)")
    seq_len: int = opt(4096, "batch", "sequence length in tokens", graph=True)

    def __post_init__(self) -> None:
        if type(self.cuda_graphs) is not tuple:  # "attn,moe_router" or a list: checked, as make_plan does
            object.__setattr__(self, "cuda_graphs", cuda_graph_scopes(self.cuda_graphs))

    @property
    def eager_chains(self) -> bool:
        """Norms and RoPE run as eager ATen op chains (not fused by a kernel library or torch.compile)."""
        return self.eager_elementwise and not self.compile

    @property
    def fused_swiglu(self) -> bool:
        """The SwiGLU keeps only its input: Megatron-Core's fused kernel, or torch.compile's partitioner."""
        return self.fused_activation or self.compile

    @property
    def compiled_loss(self) -> bool:
        """The cross-entropy runs as torch.compile's kernels."""
        return self.compile and self.compile_loss

    @property
    def mtp_chunk_index(self) -> int:
        """`mtp_chunk` counted from the first of the pp·vpp model chunks (-1: the last)."""
        return self.mtp_chunk % (self.pp * self.vpp)

    @property
    def mtp_rank(self) -> int:
        """Pipeline rank that runs the MTP modules' blocks (chunk c runs on rank c mod pp)."""
        return self.mtp_chunk_index % self.pp

    def stage_layers(self, layers: int) -> int:
        """Layers on the most-loaded pipeline rank."""
        return max(len(r) for r in self.rank_layers(layers))

    def rank_layers(self, layers: int) -> tuple[tuple[int, ...], ...]:
        """Layer indices held by each pipeline rank (rank r owns chunks r, r + pp, r + 2·pp, ...)."""
        return layers_by_rank(self.pp, self.vpp, layers, self.pp_layout)

    @property
    def moment_bytes(self) -> int:
        """Bytes of each of Adam's two moments per parameter."""
        return MOMENT_BYTES[self.optimizer_moments]

    @property
    def main_grad_bytes(self) -> int:
        return MAIN_GRAD_BYTES[self.main_grads]

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def fp8_params(self) -> bool:
        """The weights live in FP8 (`fp8_all_gather` on an FP8 plan)."""
        return self.precision == "fp8" and self.fp8_all_gather

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step per data-parallel rank."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def deferred_grad_sync(self) -> bool:
        """The stage's FSDP gradients accumulate unsharded until the step's last backward
        (`pipeline_defers_grad_sync` on a pipelined FSDP plan)."""
        return self.pipeline_defers_grad_sync and self.fsdp and self.pp > 1

    @property
    def sp(self) -> bool:
        """Sequence parallel is only meaningful with TP."""
        return self.sequence_parallel and self.tp > 1

    @property
    def shard_size(self) -> int:
        """GPUs over which sharded dense state (ZeRO/FSDP) is split: the data-parallel ranks, which
        include the CP ranks (they hold the same weights), or the HSDP shard group."""
        if self.zero == 0 and not self.fsdp:
            return 1
        return self.shard_group or self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard: tp·cp·dp / (ep·etp) (Megatron MoE parallel folding)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def expert_shard_size(self) -> int:
        if self.zero == 0 and not self.fsdp:
            return 1
        return self.expert_dp

    @property
    def sharding_name(self) -> str:
        if self.fsdp:
            kind = "HSDP" if self.shard_size < self.dp * self.cp else "FSDP"
            return kind + ("" if self.reshard_after_forward else " (no reshard)")
        return {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}[self.zero]

    def recomputed_layers(self, stage_layers: int) -> int:
        """Layers of a stage that run under full recompute (all of them unless `recompute_layers`)."""
        if self.recompute != "full":
            return 0
        return min(self.recompute_layers, stage_layers) if self.recompute_layers else stage_layers


def chunk_sizes(chunks: int, layers: int, layout: tuple[int, ...] = ()) -> list[int]:
    """Layers per model chunk: a pipeline `layout` with that many chunks (`Plan.pp_layout`), else an even
    split. An uneven split gives the extra layers to the middle chunks, keeping the first (embedding) and
    last (output layer) chunks light, as Megatron's uneven layouts and Llama 3's 126 layers on 16 stages do."""
    if len(layout) == chunks:
        return list(layout)
    base, extra = divmod(layers, chunks)
    sizes = [base] * chunks
    order = list(range(1, chunks - 1)) + [chunks - 1, 0] if chunks > 2 else list(range(chunks))
    for c in order[:extra]:
        sizes[c] += 1
    return sizes


@lru_cache(maxsize=1024)
def layers_by_rank(pp: int, vpp: int, layers: int, layout: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    """Layer indices held by each of `pp` ranks with `vpp` chunks each (`Plan.rank_layers`)."""
    sizes = chunk_sizes(pp * vpp, layers, layout)
    starts = [sum(sizes[:c]) for c in range(len(sizes))]
    chunks_of = [[r + v * pp for v in range(vpp)] for r in range(pp)]
    return tuple(tuple(i for c in chunks_of[r] for i in range(starts[c], starts[c] + sizes[c])) for r in range(pp))


# The plan's counts that must be positive integers, with their flags (spelled once, not per plan)
_POSITIVE_FLAGS = tuple(
    (name, "--" + name.replace("_", "-"))
    for name in ("tp", "pp", "vpp", "cp", "micro_batch", "global_batch", "seq_len")
)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ShardscopeError(f"{name} must be a positive integer, got {value!r}")


# Sizes past anything built or trained. Clusters: the largest public GPU clusters hold ~100k-200k GPUs
# (xAI Colossus, 2024-25: 100k then 200k H100/H200; Meta's Llama 3 405B ran on 16k H100s, its
# clusters are 24k each). Above GPUS_WARN the estimate goes on with a warning (no such cluster exists to
# check the network model against); above GPUS_MAX, ten times the largest cluster built and twice the
# 1M-GPU sites announced, it is refused. Contexts: the longest trained ones are ~1M tokens end to end
# (Qwen2.5-1M, MiniMax-01) and 10M claimed after extension (Llama 4 Scout); the longest announced is
# Magic's 100M-token LTM-2. Above SEQ_LEN_WARN a warning; above SEQ_LEN_MAX (2^27 = 134M, past all of
# them) an error.
GPUS_WARN = 262_144  # 2^18
GPUS_MAX = 2_097_152  # 2^21
SEQ_LEN_WARN = 1_048_576  # 2^20
SEQ_LEN_MAX = 134_217_728  # 2^27


def check_scale(gpus: int, seq_len: int) -> None:
    """Refuse a cluster or a sequence far past any built or trained (an estimate there describes nothing
    real), and warn of one past the largest public one."""
    if gpus > GPUS_MAX:
        raise ShardscopeError(
            f"--gpus {gpus} is beyond any GPU cluster (the largest built hold ~200,000 GPUs); valid: 1 to {GPUS_MAX:,}"
        )
    if seq_len > SEQ_LEN_MAX:
        raise ShardscopeError(
            f"--seq-len {seq_len} is beyond any trained context (the longest are 1M-10M tokens); "
            f"valid: 1 to {SEQ_LEN_MAX:,}"
        )
    if gpus > GPUS_WARN:
        warn(
            f"--gpus {gpus} is more than any public cluster holds (~200,000 GPUs): the network model is untested there"
        )
    if seq_len > SEQ_LEN_WARN:
        warn(f"--seq-len {seq_len} is longer than contexts trained end to end (~1M tokens)")


def comma_list(text: str) -> tuple[str, ...]:
    """ "a, b,c" as ("a", "b", "c")."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


def cuda_graph_scopes(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """`--cuda-graphs` ("attn,moe_router" or a tuple; "none" for eager) as a validated tuple of scopes."""
    scopes = comma_list(value) if isinstance(value, str) else tuple(value)
    if scopes == ("none",):
        return ()
    unknown = sorted(set(scopes) - set(CUDA_GRAPH_SCOPES))
    if unknown:
        raise ShardscopeError(
            f"--cuda-graphs: unknown {', '.join(unknown)}; choose none or from {', '.join(CUDA_GRAPH_SCOPES)}"
        )
    if "full_iteration" in scopes and len(scopes) > 1:
        raise ShardscopeError("--cuda-graphs full_iteration captures the whole step; list no other scope with it")
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        raise ShardscopeError(
            "--cuda-graphs moe_preprocess must be used together with moe_router (as in Megatron-Core)"
        )
    return scopes


def ep_overlap_problem(plan: Plan) -> str | None:
    """Why `plan` cannot run Megatron-Core's combined-1F1B all-to-all overlap (TransformerConfig checks),
    or None: it pairs one micro-batch's forward with another's backward, so it needs EP, no pipeline or an
    interleaved one, and no full-layer recompute."""
    if plan.ep < 2:
        return "--ep-comm-overlap needs expert parallelism (--ep > 1)"
    if plan.pp > 1 and plan.vpp == 1:
        return "--ep-comm-overlap needs --pp 1 or an interleaved pipeline (--vpp > 1)"
    if plan.recompute == "full":
        return "--ep-comm-overlap cannot be combined with --recompute full"
    return None


def cuda_graph_problem(model: ModelSpec, plan: Plan) -> str | None:
    """Why Megatron-Core cannot capture `plan.cuda_graphs` of `model` with its per-layer graphs, or None
    (TransformerConfig.__post_init__, Megatron-LM d98e8a64dd). `moe` captures the whole MoE layer, router
    and preprocess included, and only with drop-and-pad routing; `mlp` the dense MLP layers; full
    recompute needs the full-iteration graph; the `moe` recompute module cannot run inside the router's
    graph. The full-iteration graph captures the step as it is."""
    graphs = plan.cuda_graphs
    if not graphs or graphs == ("full_iteration",):
        return None
    if "moe" in graphs and "moe_router" in graphs:
        return "--cuda-graphs moe captures the whole MoE layer, router and preprocess included: list it alone"
    moe_layers = model.moe_layers  # counted over the layers: read once (the planner asks for every plan)
    if not moe_layers and {"moe", "moe_router"} & set(graphs):
        return f"--cuda-graphs moe and moe_router capture MoE layers; {model.name} has none"
    if "mlp" in graphs and moe_layers == model.layers:
        return f"--cuda-graphs mlp captures dense MLP layers; every layer of {model.name} is MoE"
    if "moe" in graphs and not (plan.capacity_factor > 0 and plan.pad_to_capacity):
        return (
            "--cuda-graphs moe needs drop-and-pad routing (--capacity-factor > 0 with --pad-to-capacity); "
            "dropless MoE layers and unpadded capacities can graph "
            "moe_router,moe_preprocess, or the whole step with full_iteration"
        )
    if plan.recompute == "full":
        return "--recompute full runs only under --cuda-graphs full_iteration, not under per-layer graphs"
    if "moe" in plan.recompute_modules and "moe_router" in graphs:
        return "--recompute-modules moe cannot run inside the moe_router CUDA graph"
    return None


# A Zipf exponent past which routing no longer changes: at 16 the most popular expert takes all but
# ~1e-5 of the tokens. It also keeps (rank)^skew finite over MAX_EXPERTS experts.
MAX_MOE_SKEW = 16.0


def check_routing_knobs(model: ModelSpec, plan: Plan) -> None:
    """The MoE routing knobs within what they describe (each comparison fails for NaN, so NaN is refused):
    the hottest of ep ranks receives at most every routed token, ep times the balanced mean; a capacity of
    experts/top_k times the mean already keeps every token an expert is sent (padded past it, an expert
    would compute more rows than there are tokens)."""
    ep = max(plan.ep, 1)
    if not 1 <= plan.moe_imbalance <= ep:
        raise ShardscopeError(
            f"--moe-imbalance must be 1 to {ep} (the hottest of ep = {ep} ranks gets at most all the tokens), "
            f"got {plan.moe_imbalance}"
        )
    if not 0 <= plan.moe_skew <= MAX_MOE_SKEW:
        raise ShardscopeError(f"--moe-skew (a Zipf exponent) must be 0 to {MAX_MOE_SKEW:g}, got {plan.moe_skew}")
    most = model.moe.experts / model.moe.top_k if model.moe else math.inf
    if not 0 <= plan.capacity_factor <= most or math.isinf(plan.capacity_factor):
        bound = f"0 to {most:g} (experts / top-k: nothing is dropped there)" if model.moe else "a finite number >= 0"
        raise ShardscopeError(f"--capacity-factor must be {bound}, got {plan.capacity_factor}")


def check_precision(precision: str, fp8_recipe: str, gpu: GPU) -> None:
    """`--precision` and `--fp8-recipe` name a known format that `gpu`'s tensor cores run."""
    check_choice("precision", precision)
    check_choice("fp8_recipe", fp8_recipe)
    if precision == "fp8":
        gpu.peak_tflops("fp8")  # raises for GPUs without FP8 tensor cores
        if fp8_recipe == "mxfp8" and gpu.arch != "blackwell":
            raise ShardscopeError(f"--fp8-recipe mxfp8 needs Blackwell tensor cores ({gpu.name} has none)")


def option_flag(f: Any) -> str:
    """The CLI flag of a Plan field (`--reshard` for reshard_after_forward, else the field's name)."""
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


@lru_cache(maxsize=1)
def plan_field_names() -> frozenset[str]:
    return frozenset(f.name for f in fields(Plan))


@lru_cache(maxsize=len(SECTIONS))
def section_fields(section: str) -> tuple[str, ...]:
    """The Plan fields declared in `section`."""
    return tuple(f.name for f in fields(Plan) if f.metadata["section"] == section)


def section_values(plan: Plan, section: str) -> tuple:
    """The values of a plan's `section`, in declaration order: a memo key that cannot forget a field."""
    return tuple(getattr(plan, name) for name in section_fields(section))


@lru_cache(maxsize=1)
def _choice_fields() -> dict[str, tuple[str, tuple]]:
    return {f.name: (option_flag(f), f.metadata["choices"]) for f in fields(Plan) if f.metadata.get("choices")}


def check_choice(name: str, value: Any) -> None:
    """Plan field `name` holds one of its declared `choices` (the error names the flag and the choices)."""
    flag, choices = _choice_fields()[name]
    if value not in choices:
        raise ShardscopeError(f"{flag} must be one of {', '.join(str(c) for c in choices)}, got {value!r}")


@lru_cache(maxsize=1)
def _choice_values() -> Any:
    return attrgetter(*_choice_fields())


# The value tuples of the `choices` fields that passed `check_choices` (a few dozen in a whole search):
# the planner checks the same few combinations for every plan. Membership compares by ==, as `in choices` does.
_VALID_CHOICES: set[tuple] = set()


def check_choices(plan: Plan) -> None:
    """Every field with `choices` holds one of them."""
    values = _choice_values()(plan)
    try:
        if values in _VALID_CHOICES:
            return
    except TypeError:  # an unhashable value (a list): checked below, where it fails
        pass
    for name in _choice_fields():
        check_choice(name, getattr(plan, name))
    if len(_VALID_CHOICES) < 1024:
        _VALID_CHOICES.add(values)


def cli_fields() -> tuple[Any, ...]:
    """The Plan fields a user sets by flag (all but those the plan derives, as `causal`)."""
    return tuple(f for f in fields(Plan) if f.metadata.get("cli", True))


def option_type(f: Any) -> type:
    """The type a flag's value is read as: the field default's (a tuple field is given as "a,b")."""
    return str if isinstance(f.default, tuple) else type(f.default)


@lru_cache(maxsize=1)
def _plan_defaults() -> dict[str, Any]:
    """Every Plan field's default (all plain immutable values: no field has a factory)."""
    return {f.name: f.default for f in fields(Plan)}


def _new_plan(kw: dict[str, Any], dp: int) -> Plan:
    """`Plan(**kw, dp=dp)` for `make_plan`, whose `kw` already holds `cuda_graphs` as checked scopes (all that
    `Plan.__post_init__` converts): the defaults and `kw` filled into the plan's `__dict__` in one update each,
    in field order, without `__init__`'s ~55 attribute sets. An unknown name raises TypeError, as `__init__` does."""
    defaults = _plan_defaults()
    if not defaults.keys() >= kw.keys():
        return Plan(**kw, dp=dp)  # raises the TypeError `__init__` gives for an unknown name
    plan = object.__new__(Plan)
    state = plan.__dict__
    state.update(defaults)
    state.update(kw)
    state["dp"] = dp
    return plan


def make_plan(model: ModelSpec, cluster: Cluster, **kw) -> Plan:
    """Build and validate a plan; `dp` is derived as gpus / (tp·pp·cp) when left out (0/None)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    if isinstance(kw.get("recompute_modules"), str):
        kw["recompute_modules"] = comma_list(kw["recompute_modules"])
    kw["cuda_graphs"] = cuda_graph_scopes(kw.get("cuda_graphs", ()))
    if isinstance(kw.get("pp_layout"), str):
        kw["pp_layout"], mtp_chunk = read_pp_layout(kw["pp_layout"])
        kw.setdefault("mtp_chunk", mtp_chunk)
    dp = kw.pop("dp", 0) or 0
    if model.dit is not None:
        kw["causal"] = False  # diffusion transformers attend over the whole clip
    for name, flag in _POSITIVE_FLAGS:
        _positive(flag, kw.get(name, 1))
    model_par = kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1)
    if cluster.gpus % model_par:
        raise ShardscopeError(f"--gpus {cluster.gpus} is not divisible by tp·pp·cp = {model_par}")
    dp = dp or cluster.gpus // model_par
    # no global batch stated: one micro-batch per data-parallel rank (per pipeline stage when pipelined)
    kw.setdefault("global_batch", kw.get("micro_batch", 1) * max(dp, 1) * kw.get("pp", 1))
    plan = _new_plan(kw, dp)
    check_scale(cluster.gpus, plan.seq_len)
    check_choices(plan)
    dp = plan.dp
    if plan.gpus != cluster.gpus:
        raise ShardscopeError(
            f"tp·pp·cp·dp = {plan.tp}·{plan.pp}·{plan.cp}·{dp} = {plan.gpus} does not equal --gpus {cluster.gpus}"
        )
    if problem := measured_block_problem(model, plan):  # blocks priced from what was measured
        raise ShardscopeError(problem)
    # Megatron-Core shards whole heads and whole query groups over TP (TransformerConfig: heads % tp == 0;
    # query groups a multiple or, from 0.16, a divisor of tp, the KV heads then replicated). Replicated KV
    # heads are not modelled, so the KV heads, like the heads and the FFN, must split evenly.
    for what, size in (("attention heads", model.heads), ("KV heads", model.kv_heads), ("FFN size", model.ffn_hidden)):
        if size % plan.tp:
            raise ShardscopeError(
                f"--tp {plan.tp} does not divide the {what} of {model.name} ({size}); valid --tp: "
                f"{divisors_text(math.gcd(model.heads, model.kv_heads, model.ffn_hidden))}"
            )
    if plan.vpp > 1 and plan.pp == 1:
        raise ShardscopeError("--vpp > 1 (interleaved schedule) needs --pp > 1")
    if plan.fp8_activation_cache and plan.precision != "fp8":
        raise ShardscopeError("--fp8-activation-cache needs --precision fp8")
    stages = plan.pp * plan.vpp
    if plan.pp_layout:
        if len(plan.pp_layout) != stages or sum(plan.pp_layout) != model.layers or min(plan.pp_layout) < 0:
            raise ShardscopeError(
                f"--pp-layout must give pp·vpp = {stages} chunks holding the {model.layers} layers of {model.name}, "
                f"got {len(plan.pp_layout)} chunks holding {sum(plan.pp_layout)}"
            )
    # Megatron can count the embedding and the loss as one pipeline slot each
    # (--account-for-embedding/loss-in-pipeline-split), so up to L + 2 model chunks are valid.
    elif stages > model.layers + 2:
        raise ShardscopeError(f"pp·vpp = {stages} exceeds the {model.layers} layers (+2) of {model.name}")
    if not -stages <= plan.mtp_chunk < stages:
        raise ShardscopeError(f"the MTP chunk {plan.mtp_chunk} is not one of the pp·vpp = {stages} model chunks")
    if plan.seq_len % plan.cp:
        raise ShardscopeError(f"--cp {plan.cp} does not divide --seq-len {plan.seq_len}")
    if plan.global_batch % (plan.micro_batch * dp):
        raise ShardscopeError(
            f"--global-batch {plan.global_batch} is not divisible by micro-batch × dp = "
            f"{plan.micro_batch}×{dp} = {plan.micro_batch * dp}"
        )
    if plan.shard_group and (plan.shard_group <= 0 or (dp * plan.cp) % plan.shard_group):
        raise ShardscopeError(f"--shard-group {plan.shard_group} must divide dp·cp = {dp * plan.cp}")
    if plan.recompute_modules:
        unknown = sorted(set(plan.recompute_modules) - set(MEGATRON_MODULES))
        if unknown:
            raise ShardscopeError(
                f"--recompute-modules: unknown {', '.join(unknown)}; choose from {', '.join(MEGATRON_MODULES)}"
            )
        if plan.recompute != "selective":
            raise ShardscopeError("--recompute-modules needs --recompute selective (Megatron's selective granularity)")
    if plan.recompute_layers < 0:
        raise ShardscopeError(f"--recompute-layers must be >= 0, got {plan.recompute_layers}")
    check_precision(plan.precision, plan.fp8_recipe, cluster.gpu)
    if plan.attention_kernel == "unfused" and plan.cp > 1:
        raise ShardscopeError("context parallelism needs a flash-attention kernel (not --attention-kernel unfused)")
    if plan.ep < 1 or plan.etp < 1:
        raise ShardscopeError("--ep and --etp must be positive")
    if plan.ep > 1 or plan.etp > 1:
        if model.moe is None:
            raise ShardscopeError(f"--ep/--etp need a mixture-of-experts model ({model.name} is dense)")
        if model.moe.experts % plan.ep:
            raise ShardscopeError(f"--ep {plan.ep} does not divide the {model.moe.experts} experts of {model.name}")
        if (plan.tp * plan.cp * dp) % (plan.ep * plan.etp):
            raise ShardscopeError(
                f"ep·etp = {plan.ep * plan.etp} must divide tp·cp·dp = {plan.tp * plan.cp * dp} "
                "(expert parallelism is carved out of the data/context/tensor-parallel ranks)"
            )
        if model.moe.expert_ffn % plan.etp:
            raise ShardscopeError(f"--etp {plan.etp} does not divide the expert FFN size {model.moe.expert_ffn}")
    if plan.ep_comm_overlap and (problem := ep_overlap_problem(plan)):
        raise ShardscopeError(problem)
    if problem := cuda_graph_problem(model, plan):
        raise ShardscopeError(problem)
    if model.moe is not None and plan.tp > 1 and not plan.sequence_parallel:
        raise ShardscopeError("MoE with --tp > 1 needs sequence parallel (as in Megatron-Core)")
    if not 0 <= plan.offload_activations <= 1:  # NaN fails it too
        raise ShardscopeError(f"--offload-activations must be a fraction in [0, 1], got {plan.offload_activations}")
    if plan.fsdp_prefetch < 0:
        raise ShardscopeError(f"--fsdp-prefetch must be >= 0, got {plan.fsdp_prefetch}")
    if plan.moe_router_padding and (model.moe is None or plan.precision != "fp8"):
        raise ShardscopeError("--moe-router-padding pads an MoE router's counts for FP8: it needs --precision fp8")
    if plan.fused_expert_mlp and not (
        model.moe is not None and model.mlp == "swiglu" and plan.precision == "fp8" and plan.fp8_recipe == "mxfp8"
    ):
        raise ShardscopeError(
            "--fused-expert-mlp is Transformer Engine's fused grouped MLP: it needs an MoE model with gated experts "
            "and --precision fp8 --fp8-recipe mxfp8"
        )
    if not plan.pad_to_capacity and plan.capacity_factor <= 0:
        raise ShardscopeError("--no-pad-to-capacity applies to token dropping: it needs --capacity-factor > 0")
    check_routing_knobs(model, plan)
    if plan.fsdp and plan.zero not in (0, 3):
        raise ShardscopeError("--fsdp already means fully sharded; do not combine it with --zero 1/2")
    return plan


def measured_block_problem(model: ModelSpec, plan: Plan) -> str | None:
    """Why `plan` cannot run the blocks priced wholly from their measurement, or None: they are not split
    by tensor, context or expert parallelism (`graph.measured`); data parallel, FSDP and pipeline run them."""
    blocks = model.whole_blocks
    if not blocks:
        return None
    ssm = [b.attention for b in blocks if b.ssm]
    names = ", ".join(ssm or [b.attention for b in blocks])
    if plan.tp > 1:
        why = (
            "a state-space scan's x_proj (to dt, B, C) reads the whole inner width, which a column/row split "
            "does not divide"
            if ssm
            else "how its projections split is not known from the measurement"
        )
        return (
            f"--tp {plan.tp}: {names} blocks (measured, no adapter) are not split over tensor parallelism "
            f"({why}); use --tp 1"
        )
    if plan.cp > 1:
        return f"--cp {plan.cp}: {names} blocks (measured, no adapter) run along the whole sequence; use --cp 1"
    if plan.ep > 1 and any(b.experts for b in blocks):
        experts = ", ".join(b.attention for b in blocks if b.experts)
        return f"--ep {plan.ep}: the experts of {experts} blocks (measured, no adapter) are not split; use --ep 1"
    return None
