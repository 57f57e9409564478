"""Time of one serving iteration (a prefill chunk and a decode batch run as one forward pass) on one GPU of
a tensor-parallel group, from the training cost model: GEMMs through `gemm_time_s` (weights streamed once
an iteration, so decode is memory-bound and prefill compute-bound by the same roofline), attention over the
KV cache through `attention_fraction` / `memory_time_s`, TP all-reduces through `collective_time_s`. A
pipelined replica's iteration is a pass through all its stages: every layer's time and a send of the hidden
states across each stage boundary.

A GEMM of the attention block is costed as one (tokens x hidden) x (hidden x attention_params/hidden)
product: it keeps the weights' bytes and FLOPs exact; its tile shape is an approximation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shardscope.costs.comm import collective_time_s, place_group
from shardscope.costs.compute import OPERAND_BYTES, gemm_time_s, memory_time_s
from shardscope.costs.efficiency import KERNEL_GAP_S, attention_fraction
from shardscope.hardware.catalog import GPU, Cluster
from shardscope.models.quant import WEIGHT_FORMATS, WeightFormat
from shardscope.models.spec import ModelSpec
from shardscope.serve.engine import Engine

# Kernels of one layer's forward: two norms, QKV GEMM, RoPE, KV-cache write, attention, output GEMM,
# gate/up GEMM, activation, down GEMM, two all-reduces (vLLM's Llama layer). Each pays the GPU-side gap
# between dependent kernels (`KERNEL_GAP_S`) inside a CUDA graph too: a graph removes the host's launches,
# not the drain and ramp between kernels. aiconfigurator's GEMM timings are CUDA-graph replays (collector
# helper.py `benchmark_with_power`, distinct weight copies past L2), and a decode-sized GEMM of 2 MB of
# weights measures 4 us there, where streaming its weights takes 0.7.
KERNELS_PER_LAYER = 12
ACT_BYTES = 2  # activations and all-reduce payloads in BF16
LOGIT_BYTES = 4  # vLLM's sampler upcasts logits to FP32
# A fused MoE layer (TRT-LLM's CUTLASS MoE, vLLM/SGLang's fused_moe) runs, besides its two grouped GEMMs,
# top-k routing, the expansion of each token into its k expert rows, the gated activation and the weighted
# un-permute, and sets up one problem per local expert: a floor that small batches and thin TP slices of
# the experts do not shrink. NVIDIA aiconfigurator's measured TRT-LLM 1.3 fused MoE (H100/H200, BF16 and
# FP8, TP 1-8, 16-2048 tokens; validation/moe_tp_measured_aiconfigurator.csv) levels off at 23-30 us at 8
# experts and 36-61 us at 128 as the weight slice shrinks; 24 us plus 0.1 us a local expert, with the
# streaming of those kernels' rows, brings the modelled layer to 0.98-1.11 of the measured time at every
# GPU, precision and TP (geometric mean; the grouped GEMMs alone fall from 0.93-0.98 at TP 1 to 0.68-0.74
# at TP 8). vLLM 0.19's Triton fused_moe in the same tables, not used for the fit, comes to 0.93-1.05.
FUSED_MOE_FLOOR_S = 24e-6
FUSED_MOE_PER_EXPERT_S = 0.1e-6


@dataclass(frozen=True, slots=True)
class Batch:
    """What one iteration computes, summed over its sequences (the simulator keeps these aggregates).

    `*_pairs` are (query, key) pairs of the prefill chunks, `*_kv` the keys read by decode sequences; the
    `_window` variants are the same, capped at the model's sliding window, for windowed layers."""

    prefill_tokens: int = 0
    prefill_pairs: float = 0.0
    prefill_pairs_window: float = 0.0
    decode_seqs: int = 0
    decode_kv: int = 0
    decode_kv_window: int = 0
    sampled: int = 0  # sequences sampling a token: decodes plus prefills that finish this iteration


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model on one TP group of a cluster, with weight and KV-cache precisions. `ep` = `tp` runs the MoE
    layers expert-parallel over the same GPUs (vLLM's `--enable-expert-parallel` with one data-parallel
    rank): each GPU holds experts/ep whole experts instead of a 1/tp slice of every expert; attention stays
    TP-sharded and the MoE output is still all-reduced, so weights and communication are unchanged.
    `ep` a larger multiple of `tp` is wide EP over data-parallel attention (vLLM's `--data-parallel-size`
    with `--enable-expert-parallel`, SGLang's `--enable-dp-attention`): ep/tp replicas, each with its own
    requests and KV, run the MoE layers together, each GPU holding experts/ep experts; a replica's tokens
    go to the experts' GPUs and back by all-to-all. The replicas are taken to run batches of one size."""

    model: ModelSpec
    cluster: Cluster
    tp: int
    precision: str = "bf16"  # the weights' format (`models.quant.WEIGHT_FORMATS`)
    kv_dtype_bytes: int = 2
    ep: int = 1  # 1, tp, or a multiple of tp (wide EP over ep/tp replicas)
    pp: int = 1  # pipeline stages of a replica, each `stage_layers` consecutive layers

    @property
    def stage_layers(self) -> int:
        """Layers of the most loaded pipeline stage (the engines split layers as evenly as they divide)."""
        return -(-self.model.layers // self.pp)

    @property
    def weight_format(self) -> WeightFormat:
        return WEIGHT_FORMATS[self.precision]

    @property
    def experts_only(self) -> bool:
        """Only the routed experts are in `precision`, the rest in BF16: the checkpoint's own format where
        it quantizes the experts alone (GPT-OSS's MXFP4)."""
        return self.precision == self.model.weight_format and self.model.quantized_experts_only

    def gemm(self, experts: bool) -> tuple[str, float]:
        """(GEMM precision, bytes a weight) of the routed experts' GEMMs or of the others'."""
        if self.experts_only and not experts:
            return "bf16", 2.0
        fmt = self.weight_format
        p = fmt.blackwell_gemm if self.cluster.gpu.fp4_tflops else fmt.gemm
        return ("bf16" if p == "fp8" and self.cluster.gpu.fp8_tflops is None else p), fmt.bytes


@dataclass(frozen=True, slots=True)
class Memory:
    """Per-GPU memory and the KV pool of one replica, as the engine sizes it."""

    hbm_gib: float
    weights_gib: float
    activation_peak_gib: float
    non_torch_gib: float
    cuda_graph_pool_gib: float
    kv_pool_gib: float
    kv_bytes_per_token: float  # per GPU, all layers
    block_size: int
    kv_blocks: int

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size


def weights_bytes_per_gpu(d: Deployment) -> float:
    """Checkpoint weights on one TP rank: linear layers in the weight format (only the routed experts where
    the checkpoint quantizes them alone), embeddings and LM head in BF16 (quantized checkpoints keep them
    so), all split over TP (vLLM shards the vocabulary too)."""
    m = d.model
    embed = m.embedding_params + m.lm_head_params
    routed = m.moe_layers * m.moe.experts * m.expert_params if m.moe else 0
    fmt = d.weight_format.bytes
    # routed experts split over max(tp, ep) GPUs, the rest over TP
    body = (
        routed * fmt / max(d.tp, d.ep)
        + (m.params_total - routed - embed) * (ACT_BYTES if d.experts_only else fmt) / d.tp
    )
    if d.pp == 1:
        return body + embed * ACT_BYTES / d.tp
    # Pipelined: a stage holds its layers, the first the embedding, the last the LM head (its own copy of
    # a tied embedding); the most loaded is a stage of `stage_layers` with the larger end
    ends = max(m.embedding_params, m.lm_head_params or m.embedding_params) * ACT_BYTES
    return body * d.stage_layers / m.layers + ends / d.tp


def kv_bytes_per_token(d: Deployment) -> float:
    """KV-cache bytes one token takes on one GPU over all layers. GQA: each rank holds kv_heads/tp heads, at
    least one (vLLM replicates KV heads when TP exceeds them); MLA: the compressed latent and the RoPE key,
    replicated on every rank (vLLM's MLA backends)."""
    m = d.model
    if m.mla:
        per_layer = (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * d.kv_dtype_bytes
    else:
        per_layer = 2 * max(1, m.kv_heads // d.tp) * m.head_dim * d.kv_dtype_bytes
    return float(per_layer * d.stage_layers)


def activation_peak_bytes(d: Deployment, tokens: int, sampled: int) -> float:
    """Torch memory peak of a forward over `tokens` tokens (vLLM's profile run at max_num_batched_tokens):
    the residual, the normed input and the MLP's gate/up output and activation at the widest MLP, plus
    `sampled` rows of FP32 logits. An estimate of the live tensors, not a measured allocator peak."""
    m, tp = d.model, d.tp
    mats = 3 if m.mlp == "swiglu" else 2
    widest = m.ffn_hidden
    rows = tokens
    if m.moe is not None:  # routed tokens are k copies each through the expert MLP
        widest = max(m.ffn_hidden if m.moe.first_dense_layers else 0, m.moe.expert_ffn)
        rows = tokens * m.moe.top_k
    mlp = rows * (mats - 1 + 1) * widest / tp * ACT_BYTES  # gate/up output + activation output
    residual = 2 * tokens * m.hidden * ACT_BYTES
    logits = sampled * m.vocab / tp * LOGIT_BYTES
    return mlp + residual + logits


def memory_plan(d: Deployment, engine: Engine) -> Memory:
    """The KV pool the engine allocates on each GPU (see the engine file's `memory_rule`)."""
    gib = float(1 << 30)
    hbm = d.cluster.gpu.hbm_gib * gib
    weights = weights_bytes_per_gpu(d)
    act = activation_peak_bytes(d, engine.max_num_batched_tokens, engine.max_num_seqs)
    non_torch = engine.non_torch_gib * gib
    graphs = engine.cuda_graph_pool_gib * gib
    if engine.memory_rule == "utilization":  # vLLM: util x total - weights - profile peak - non-torch - graphs
        pool = engine.gpu_memory_utilization * hbm - weights - act - non_torch - graphs
    elif engine.memory_rule == "static_fraction":  # SGLang: (total - reserved) holds weights + KV
        act = 0.0  # inside reserved
        pool = hbm - engine.reserved_gib * gib - weights
    else:  # TRT-LLM: a fraction of what is free after weights and activations
        pool = engine.kv_free_fraction * (hbm - weights - act - non_torch - graphs)
    per_token = kv_bytes_per_token(d)
    blocks = max(0, math.floor(pool / (per_token * engine.block_size))) if pool > 0 else 0
    return Memory(
        hbm_gib=d.cluster.gpu.hbm_gib,
        weights_gib=weights / gib,
        activation_peak_gib=act / gib,
        non_torch_gib=engine.non_torch_gib if engine.memory_rule != "static_fraction" else 0.0,
        cuda_graph_pool_gib=engine.cuda_graph_pool_gib,
        kv_pool_gib=max(0.0, pool) / gib,
        kv_bytes_per_token=per_token,
        block_size=engine.block_size,
        kv_blocks=blocks,
    )


def expected_experts_hit(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts that `tokens` tokens touch, each routing to `top_k` distinct experts chosen
    uniformly: E·(1 − (1 − k/E)^T) (balanced routing, as a trained router's load-balancing loss aims for)."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def gemm_s(
    gpu: GPU,
    m: int,
    n: int,
    k: int,
    precision: str = "bf16",
    groups: int = 1,
    weight_bytes: float | None = None,
    library: str = "",
) -> float:
    """One GEMM's time: measured (interpolated) where the GPU carries a profile that covers the shape and the
    weights are in the GEMM's own precision (`--profile`; decode-sized GEMMs run at the weights' read rate
    there), else the roofline model; `weight_bytes`: a weight's bytes where the kernel dequantizes them;
    `library`: the kernel library (`Engine.fp8_gemm_library`)."""
    own = weight_bytes is None or weight_bytes == OPERAND_BYTES.get(precision, 2.0)
    if own and gpu.profile is not None and (t := gpu.profile.gemm_s(m, n, k, precision, groups)) is not None:
        return t
    return gemm_time_s(gpu, m, n, k, precision, groups, weight_bytes, library)


def fused_moe_extras_s(gpu: GPU, tokens: int, pairs: int, hidden: int, act_width: int, local_experts: int) -> float:
    """A fused MoE layer's work besides its GEMMs on one GPU: `tokens` rows expanded into `pairs` expert
    rows, the activation reading and writing `act_width` values a row (gate/up in, its product out), the
    weighted un-permute back into `tokens` rows, all in BF16, over the kernels' floor (see
    `FUSED_MOE_FLOOR_S`)."""
    rows = 2 * (tokens + pairs) * hidden + pairs * act_width
    return memory_time_s(gpu, rows * ACT_BYTES) + FUSED_MOE_FLOOR_S + FUSED_MOE_PER_EXPERT_S * local_experts


@dataclass
class IterationCost:
    """Iteration time of a deployment under an engine; GEMM and communication parts memoised by token count
    (the simulator asks for the same few hundred batch sizes many times)."""

    d: Deployment
    engine: Engine
    _linear: dict[tuple[int, int], float] = field(default_factory=dict)
    _frac: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m = self.d.model
        self._kinds = m.layer_kinds()
        self.full_layers = sum(1 for k in self._kinds if k.attention == "full")
        self.window_layers = m.layers - self.full_layers
        self.moe_layers = sum(1 for k in self._kinds if k.mlp == "moe")
        self.dense_layers = m.layers - self.moe_layers
        tp = self.d.tp
        # Attention FLOPs per (query, key) pair on one rank: QK^T and PV, 2 FLOPs a multiply-add. MLA decode
        # runs absorbed: scores over the latent + RoPE key, values over the latent.
        if m.mla:
            a = m.mla
            self.pair_flops = 2.0 * m.heads / tp * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
        else:
            self.pair_flops = 2.0 * m.heads / tp * (m.qk_head_dim + m.v_head_dim)
        self.kv_layer_bytes = kv_bytes_per_token(self.d) / self.d.stage_layers
        self.attn_cols = max(1, round(m.attention_params / m.hidden / tp))
        self.dense_gemm, self.expert_gemm = self.d.gemm(experts=False), self.d.gemm(experts=True)
        self.elementwise_bytes_per_token = self._elementwise_bytes_per_token()
        self.tp_group = place_group(self.d.cluster, tp, 1)
        self.pp_group = place_group(self.d.cluster, self.d.pp, tp)
        self.ep_group = place_group(self.d.cluster, self.d.ep, 1)

    def _elementwise_bytes_per_token(self) -> float:
        """Bytes the streaming kernels of all layers move a token on one GPU: the residual add fused with
        RMSNorm before attention and before the MLP (reads the hidden state and the residual, writes both:
        4 hidden-wide rows each, every TP rank holding them whole), RoPE with the KV-cache write (reads and
        writes this rank's q, k and v rows) and a dense MLP's activation (a gated one reads gate and up and
        writes their product: 3 ffn/tp rows; a fused MoE layer's activation is in `fused_moe_extras_s`)."""
        m, tp = self.d.model, self.d.tp
        per_layer = 8 * m.hidden + 2 * (m.q_dim + 2 * m.kv_dim) / tp
        act = (3 if m.mlp == "swiglu" else 2) * m.ffn_hidden / tp
        return ACT_BYTES * (m.layers * per_layer + self.dense_layers * act)

    def with_overheads_s(self, work_s: float, tokens: int, graphed: bool) -> float:
        """Wall time of an iteration of `tokens` tokens whose GEMMs, attention and communication take `work_s`:
        plus the streaming kernels' traffic and every kernel's gap; outside a CUDA graph the host issues each
        kernel (`Engine.host_s_per_kernel`) and the GPU waits where the host is slower; plus the engine's
        per-iteration host work."""
        kernels = self.d.model.layers * KERNELS_PER_LAYER
        gpu = work_s + memory_time_s(self.d.cluster.gpu, tokens * self.elementwise_bytes_per_token)
        gpu += kernels * KERNEL_GAP_S
        host = 0.0 if graphed else kernels * self.engine.host_s_per_kernel
        return max(gpu, host) + self.engine.host_s_per_iteration

    def _linear_s(self, tokens: int, sampled: int) -> float:
        """GEMMs, MoE experts, LM head and TP all-reduces of one forward over `tokens` tokens."""
        key = (tokens, sampled)
        if (t := self._linear.get(key)) is not None:
            return t
        m, gpu, tp = self.d.model, self.d.cluster.gpu, self.d.tp
        p, w = self.dense_gemm
        lib = self.engine.fp8_gemm_library if p == "fp8" else ""
        h, mats = m.hidden, (3 if m.mlp == "swiglu" else 2)
        t = m.layers * gemm_s(gpu, tokens, self.attn_cols, h, p, 1, w, lib)
        if self.dense_layers:
            f = max(1, m.ffn_hidden // tp)
            t += self.dense_layers * (
                gemm_s(gpu, tokens, (mats - 1) * f, h, p, 1, w, lib) + gemm_s(gpu, tokens, h, f, p, 1, w, lib)
            )
        if self.moe_layers and m.moe is not None:
            moe = m.moe
            layer = gemm_s(gpu, tokens, moe.experts, h, "bf16")  # router
            if self.d.ep > tp:  # dispatch and combine: k copies of each token to the experts' GPUs and back
                copies = tokens * moe.top_k * h * ACT_BYTES
                layer += 2 * collective_time_s(self.d.cluster, "all_to_all", copies, self.ep_group)
            layer += self.routed_experts_s(tokens)
            if moe.shared_experts:
                fs = max(1, moe.shared_experts * moe.shared_ffn // tp)
                layer += gemm_s(gpu, tokens, (mats - 1) * fs, h, p, 1, w, lib)
                layer += gemm_s(gpu, tokens, h, fs, p, 1, w, lib)
            t += self.moe_layers * layer
        if sampled:
            t += gemm_s(gpu, sampled, max(1, m.vocab // tp), h, "bf16")
        # two all-reduces a layer (attention output, MLP output) of the tokens' hidden states
        t += 2 * m.layers * collective_time_s(self.d.cluster, "all_reduce", tokens * h * ACT_BYTES, self.tp_group)
        if self.d.pp > 1:  # the hidden states cross each stage boundary once (the pass goes through all stages)
            hop = collective_time_s(self.d.cluster, "send_recv", tokens * h * ACT_BYTES, self.pp_group)
            t += (self.d.pp - 1) * hop
        self._linear[key] = t
        return t

    def routed_experts_s(self, tokens: int, with_extras: bool = True) -> float:
        """One MoE layer's routed experts on the busiest GPU for `tokens` tokens of this replica: the grouped
        gate/up and down GEMMs over the experts the tokens touch and (`with_extras`) the fused MoE's other
        work (`fused_moe_extras_s`); the router, the EP all-to-alls and the shared experts are not included."""
        m, gpu, tp, ep = self.d.model, self.d.cluster.gpu, self.d.tp, self.d.ep
        assert m.moe is not None
        moe, h, mats = m.moe, m.hidden, (3 if m.mlp == "swiglu" else 2)
        pe, we = self.expert_gemm
        # wide EP: the experts see the tokens of every replica of the EP group
        routed = tokens * max(1, ep // tp)
        hit = expected_experts_hit(moe.experts, moe.top_k, routed)
        rows = max(1, math.ceil(routed * moe.top_k / max(1, round(hit))))  # tokens per touched expert
        groups = max(1, round(hit))
        if ep > 1:
            # EP: each GPU runs the touched experts among its experts/ep, whole; the busiest GPU sets the
            # time: its count ~ Binomial(E/ep, hit/E), the maximum of ep of them taken as the mean plus
            # sqrt(2 ln ep) standard deviations (Gaussian extreme), at most E/ep
            n, q = moe.experts / ep, hit / moe.experts
            groups = max(1, round(min(n, n * q + math.sqrt(n * q * (1 - q) * 2 * math.log(ep)))))
        fe = moe.expert_ffn if ep >= tp else max(1, moe.expert_ffn // (tp // ep))
        gemms = gemm_s(gpu, rows, (mats - 1) * fe, h, pe, groups, we) + gemm_s(gpu, rows, h, fe, pe, groups, we)
        if not with_extras:
            return gemms
        return gemms + fused_moe_extras_s(gpu, tokens, rows * groups, h, mats * fe, moe.experts // ep)

    def attention_frac(self, span: int) -> float:
        """Flash attention's fraction of peak at `span` keys a query (memoised: decode asks per step)."""
        if (f := self._frac.get(span)) is None:
            f = self._frac[span] = attention_fraction(self.d.cluster.gpu, "auto", span, False, self.d.model.qk_head_dim)
        return f

    def attention_s(self, b: Batch) -> float:
        """Attention of the prefill chunks (compute-bound: flash attention's fraction at the chunk's span)
        and of the decode sequences (reading their KV cache)."""
        gpu = self.d.cluster.gpu
        t = 0.0
        pairs = self.full_layers * b.prefill_pairs + self.window_layers * b.prefill_pairs_window
        if pairs:
            span = max(1, round(b.prefill_pairs / max(1, b.prefill_tokens)))  # mean keys per query
            frac = self.attention_frac(span)
            t += pairs * self.pair_flops / (gpu.bf16_tflops * 1e12 * frac)
        keys = self.full_layers * b.decode_kv + self.window_layers * b.decode_kv_window
        if keys:
            span = max(1, b.decode_kv // max(1, b.decode_seqs))
            frac = self.attention_frac(span)
            flops_s = keys * self.pair_flops / (gpu.bf16_tflops * 1e12 * frac)
            t += max(flops_s, memory_time_s(gpu, keys * self.kv_layer_bytes))
        return t

    def decode_time_s(self, seqs: int, kv: int, kv_window: int) -> float:
        """`time_s` of a decode-only batch (the simulator's fast path, no Batch built)."""
        return self.time_s(Batch(decode_seqs=seqs, decode_kv=kv, decode_kv_window=kv_window, sampled=seqs))

    def time_s(self, b: Batch) -> float:
        """Wall time of one iteration: GPU work, kernel gaps unless a decode CUDA graph replays, host cost."""
        tokens = b.prefill_tokens + b.decode_seqs
        if tokens <= 0:
            return 0.0
        t = self._linear_s(tokens, b.sampled) + self.attention_s(b)
        graphed = b.prefill_tokens == 0 and b.decode_seqs <= self.engine.cuda_graph_max_batch
        return self.with_overheads_s(t, tokens, graphed)


@dataclass(frozen=True, slots=True)
class SpecDecode:
    """Speculative decoding: `k` proposals a step, each accepted with probability `acceptance` (independent,
    as the usual analysis assumes), from MTP heads of the target model or from a draft model."""

    kind: str  # "mtp" | "draft"
    k: int
    acceptance: float
    draft_model: str = ""

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a verify step emits: accepted proposals plus the target's own token,
        Σ_{i=0..k} a^i = (1 − a^(k+1)) / (1 − a)."""
        a = self.acceptance
        return float(self.k + 1) if a >= 1.0 else (1.0 - a ** (self.k + 1)) / (1.0 - a)

    @property
    def label(self) -> str:
        draft = f"{self.draft_model}:" if self.kind == "draft" else ""
        return f"{self.kind}:{draft}{self.k}:{self.acceptance:g}"


def parse_spec_decode(text: str) -> SpecDecode:
    """`mtp:A`, `mtp:K:A` (K MTP proposals, default 1) or `draft:MODEL:K:A`."""
    from shardscope.errors import ShardscopeError

    parts = text.strip().split(":")
    try:
        if parts[0] == "mtp" and len(parts) in (2, 3):
            k, a = (1, float(parts[1])) if len(parts) == 2 else (int(parts[1]), float(parts[2]))
            spec = SpecDecode("mtp", k, a)
        elif parts[0] == "draft" and len(parts) == 4 and parts[1]:
            spec = SpecDecode("draft", int(parts[2]), float(parts[3]), parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ShardscopeError(
            f"--spec-decode {text!r}: expected mtp:ACCEPTANCE, mtp:K:ACCEPTANCE or draft:MODEL:K:ACCEPTANCE"
        ) from None
    if spec.k < 1 or not 0.0 <= spec.acceptance <= 1.0:
        raise ShardscopeError(f"--spec-decode {text!r}: K must be at least 1 and the acceptance within 0..1")
    return spec


@dataclass
class SpecIterationCost(IterationCost):
    """An iteration under speculative decoding: each decode sequence is verified as a (k+1)-token pass
    (k+1 query rows through every GEMM and the LM head, k+1 queries over its KV cache, read once), after
    the proposer ran k steps: a draft model's decode (its own `IterationCost`) or one MTP module (a
    one-layer model of the target's shape plus the LM head) per proposal."""

    spec: SpecDecode | None = None
    draft: IterationCost | None = None

    def __post_init__(self) -> None:
        IterationCost.__post_init__(self)
        if self.draft is None and self.spec is not None:
            from dataclasses import replace

            one_layer = replace(self.d.model, layers=1, mtp_layers=0)
            host_free = replace(self.engine, host_s_per_iteration=0.0)
            self.draft = IterationCost(replace(self.d, model=one_layer), host_free)

    def propose_s(self, seqs: int, kv: int, kv_window: int) -> float:
        """The proposer's k steps for `seqs` sequences holding `kv` keys in all."""
        assert self.spec is not None and self.draft is not None
        return sum(self.draft.decode_time_s(seqs, kv + seqs * j, kv_window + seqs * j) for j in range(self.spec.k))

    def time_s(self, b: Batch) -> float:
        if self.spec is None or b.decode_seqs == 0:
            return IterationCost.time_s(self, b)
        q = self.spec.k + 1
        gpu = self.d.cluster.gpu
        tokens = b.prefill_tokens + b.decode_seqs * q
        t = self._linear_s(tokens, b.sampled + b.decode_seqs * (q - 1))
        t += self.attention_s(replace_decode(b))  # prefill part only
        keys = self.full_layers * b.decode_kv + self.window_layers * b.decode_kv_window
        span = max(1, b.decode_kv // max(1, b.decode_seqs))
        frac = self.attention_frac(span)
        flops_s = q * keys * self.pair_flops / (gpu.bf16_tflops * 1e12 * frac)
        t += max(flops_s, memory_time_s(gpu, keys * self.kv_layer_bytes))
        graphed = b.prefill_tokens == 0 and tokens <= self.engine.cuda_graph_max_batch
        propose = self.propose_s(b.decode_seqs, b.decode_kv, b.decode_kv_window)
        return self.with_overheads_s(t, tokens, graphed) + propose


def replace_decode(b: Batch) -> Batch:
    """`b` without its decode sequences (the prefill chunks alone)."""
    return Batch(b.prefill_tokens, b.prefill_pairs, b.prefill_pairs_window)
