"""Measure, on one CUDA GPU, a training step of torchtitan's Llama 3 (8B dims, few layers) as torchtitan runs it.

How it is run (device machine, not CI): `python bench/device/torchtitan_llama_step.py OUT_DIR`. Writes
`OUT_DIR/torchtitan_llama_step.json` (rewritten after every configuration, so a cut-off run keeps what it
measured) and prints a summary table. `--cpu-smoke` runs the same code at toy sizes on the CPU (seconds, no
OUT_DIR needed); `--help` lists the knobs (layers, modes, routes, seq len, steps, time budget).

Model: our own compact re-write of torchtitan 0.2.2 (`pip download --no-deps torchtitan==0.2.2`),
`torchtitan/models/llama3/model/model.py` + `model/args.py` (flavor "8B", attn_type "sdpa", mask "causal"),
same ops in the same order: `nn.RMSNorm(eps=1e-5)` pre-norms; separate wq/wk/wv/wo (no bias); RoPE with complex
`freqs_cis` (complex64, Llama-3.1 frequency scaling: factor 8, low 1, high 4, original 8192, theta 500000), applied
as `view_as_complex(x.float()...) * freqs_cis` then `.type_as(x)`; SDPA `is_causal=True, enable_gqa=True` inside
`sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True)` (torchtitan's
`ScaledDotProductAttentionWrapper`, `torchtitan/models/attention.py`); FeedForward `w2(silu(w1 x) * w3 x)` with
hidden 14336 (int(2*4*4096/3) * 1.3 rounded up to 1024); output `nn.Linear(4096, 128256)`. Dims: dim 4096,
32 heads, 8 KV heads, vocab 128256. Weights as `init_weights` (depth init). Loss as
`torchtitan/components/loss.py`: `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1),
reduction="sum", ignore_index=-100)` divided by the global valid-token count; `del pred` before backward.
Step as `torchtitan/train.py` `train_step`: `zero_grad()`, forward+loss, backward, `clip_grad_norm_(max_norm=1.0,
foreach=True)` (`torchtitan/distributed/utils.py`), `optimizers.step()` (the LR scheduler step is left out).
Optimizer (`torchtitan/config/job_config.py` + `components/optimizer.py`): AdamW lr 8e-4, betas (0.9, 0.95),
eps 1e-8, weight decay 0.1, implementation "fused" (`fused=True, foreach=False`), one group over all params.
Compile (`models/llama3/infra/parallelize.py` `apply_compile`): each TransformerBlock
`torch.compile(block, fullgraph=True)` (inductor), applied before FSDP; with compile on, the loss function is
compiled too (`compile.components` defaults to ["model", "loss"]); embedding, final norm and output stay eager.
Activation checkpointing is off here (torchtitan's default is selective, every 2nd layer).

Mixed precision, "routes" (`--routes`):
  * `fsdp`: FSDP2 as `apply_fsdp` does it: `fully_shard` with `MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)` on tok_embeddings, on each block (reshard_after_forward=True), on [norm, output]
    (reshard_after_forward=False) and on the root, gradient divide factor 1.0, on a 1-rank NCCL group and mesh.
    fp32 master params (DTensors), bf16 compute. This is what each rank runs under FSDP (dp_shard > 1).
  * `bf16copy`: fp32 master model for the optimizer, forward/backward on a bf16 copy (grads cast to fp32 into
    the master, params copied back after the step). Used automatically when the `fsdp` route fails.
  * `autocast`: what torchtitan itself does on ONE GPU: with dp_shard == 1 FSDP is not applied
    (`ParallelDims.fsdp_enabled` is False) and `maybe_enable_amp` wraps forward+loss in
    `torch.autocast("cuda", dtype=bf16)` over fp32 parameters.

Note: the newest torchtitan release (0.3.0) rewrote the model: fused wqkv projection, attention "flex" with
block-causal (per-document) masks by default ("sdpa" is refused for language models), a chunked loss
(`ChunkedLossWrapper`, lm_head applied per chunk inside the loss) and lr 3e-4 for 8B; this script follows 0.2.2.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import inspect
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchtitan_qwen3_moe as qwen3  # noqa: E402  (the MoE model, `--model qwen3-30b-a3b`)

IGNORE_INDEX = -100
TORCHTITAN_REF = {
    "version": "torchtitan 0.2.2 (PyPI wheel; newest on PyPI is 0.3.0, see docstring)",
    "model": "torchtitan/models/llama3/model/model.py, model/args.py (flavor 8B, attn_type sdpa, causal)",
    "attention": "torchtitan/models/attention.py ScaledDotProductAttentionWrapper: sdpa_kernel("
    "[CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True), is_causal=True, enable_gqa",
    "loss": "torchtitan/components/loss.py cross_entropy_loss: F.cross_entropy(pred.flatten(0,1).float(), "
    "labels.flatten(0,1), reduction='sum', ignore_index=-100) / global_valid_tokens",
    "optimizer": "AdamW lr 8e-4 betas (0.9,0.95) eps 1e-8 wd 0.1 implementation fused (job_config.Optimizer)",
    "grad_clip": "torchtitan/distributed/utils.py clip_grad_norm_ max_norm 1.0 foreach",
    "compile": "models/llama3/infra/parallelize.py apply_compile: torch.compile(block, fullgraph=True) per "
    "TransformerBlock before FSDP; loss compiled when compile.components has 'loss' (default)",
    "fsdp": "apply_fsdp: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); tok_embeddings, each block "
    "(reshard_after_forward=True), [norm, output] (False), root; set_gradient_divide_factor(1.0)",
    "single_gpu": "dp_shard==1 -> fsdp_enabled False -> torch.autocast(cuda, bf16) over fp32 params "
    "(distributed/utils.py maybe_enable_amp)",
}
_SDPA_HAS_PRIORITY = "set_priority" in inspect.signature(sdpa_kernel).parameters
TORCHTITAN_SDPA_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def log(*a) -> None:
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------- model


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    vocab_size: int = 128256
    multiple_of: int = 1024
    ffn_dim_multiplier: float | None = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192  # torchtitan sets it to training.seq_len (update_from_config)
    depth_init: bool = True
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_pos: int = 8192
    sdpa: str = "torchtitan"  # "torchtitan": its sdpa_kernel priority list; "default": no context


def ffn_hidden_dim(a: ModelArgs) -> int:
    hidden = int(2 * (4 * a.dim) / 3)
    if a.ffn_dim_multiplier is not None:
        hidden = int(a.ffn_dim_multiplier * hidden)
    return a.multiple_of * ((hidden + a.multiple_of - 1) // a.multiple_of)


def precompute_freqs_cis(a: ModelArgs) -> torch.Tensor:
    dim, end, theta = a.dim // a.n_heads, a.max_seq_len, a.rope_theta
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    sf, lo, hi, orig = a.rope_scaling_factor, a.rope_low_freq_factor, a.rope_high_freq_factor, a.rope_original_max_pos
    wavelen = 2 * math.pi / freqs
    high_freq_wavelen, low_freq_wavelen = orig / hi, orig / lo
    freqs = torch.where(wavelen > low_freq_wavelen, freqs / sf, freqs)
    smooth = (orig / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * freqs / sf + smooth * freqs
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    freqs = torch.where(is_medium, smoothed, freqs)
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    seqlen = xq_.shape[1]
    fc = freqs_cis[0:seqlen]
    fc = fc.view(*[d if i in (1, xq_.ndim - 1) else 1 for i, d in enumerate(xq_.shape)])
    xq_out = torch.view_as_real(xq_ * fc).flatten(3)
    xk_out = torch.view_as_real(xk_ * fc).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = a.n_heads, a.n_kv_heads
        self.head_dim = a.dim // a.n_heads
        self.enable_gqa = self.n_heads > self.n_kv_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)
        self.sdpa_backends = TORCHTITAN_SDPA_BACKENDS if a.sdpa == "torchtitan" else None

    def init_weights(self, init_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        if self.sdpa_backends is None:
            out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, enable_gqa=self.enable_gqa)
        else:
            ctx = (
                sdpa_kernel(self.sdpa_backends, set_priority=True)
                if _SDPA_HAS_PRIORITY
                else sdpa_kernel(self.sdpa_backends)
            )
            with ctx:
                out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, enable_gqa=self.enable_gqa)
        out = out.transpose(1, 2).contiguous().view(bs, seqlen, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for lin in (self.w2, self.w3):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, a: ModelArgs):
        super().__init__()
        self.attention = Attention(a)
        self.feed_forward = FeedForward(a.dim, ffn_hidden_dim(a))
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        n = layer_id + 1 if a.depth_init else a.n_layers
        self.weight_init_std = 0.02 / (2 * n) ** 0.5

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(a), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device) -> None:
        with torch.device(buffer_device):
            self.freqs_cis = precompute_freqs_cis(self.args)
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()  # an OptimizedModule forwards the attribute to the block
        self.norm.reset_parameters()
        std = self.args.dim**-0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h)
        return self.output(h)


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=IGNORE_INDEX)


@torch.no_grad()
def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torchtitan's clip_grad_norm_ without PP/EP: total norm (DTensor -> full_tensor), then scale."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, False, True)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, True)
    return total


def flops_per_step(a: ModelArgs, model: nn.Module, batch: int, seq: int) -> int:
    """torchtitan's get_dense_model_nparams_and_flops (6N per token + attention, causal not halved)."""
    n = sum(p.numel() for p in model.parameters())
    n_emb = sum(p.numel() for p in model.tok_embeddings.parameters())
    per_token = 6 * (n - n_emb) + 6 * a.n_layers * a.n_heads * 2 * (a.dim // a.n_heads) * seq
    return per_token * batch * seq


# --------------------------------------------------------------------------------------- set-ups (routes)


class Setup:
    """A model made ready for one route: `forward_model`, the fp32 `params` the optimizer owns, hooks."""

    def __init__(self, route: str, model: nn.Module, forward_model: nn.Module, params: list[torch.Tensor], amp):
        self.route, self.model, self.forward_model, self.params, self.amp = route, model, forward_model, params, amp
        self.work_params: list[torch.Tensor] = []  # bf16copy only

    def after_backward(self) -> None:
        if self.work_params:  # bf16 grads -> fp32 master grads (FSDP: reduce_dtype fp32 sharded grad)
            for m, w in zip(self.params, self.work_params, strict=True):
                m.grad = None if w.grad is None else w.grad.float()
                w.grad = None

    @torch.no_grad()
    def after_step(self) -> None:
        if self.work_params:
            torch._foreach_copy_(self.work_params, self.params)


def apply_compile(model: Transformer) -> None:
    for layer_id, block in list(model.layers.named_children()):
        model.layers.register_module(layer_id, torch.compile(block, fullgraph=True))


def apply_op_sac(model: Transformer) -> None:
    """torchtitan's selective op activation checkpointing (distributed/activation_checkpoint.py, 0.2.2): per
    block, save the outputs of matmuls (all but every second one), SDPA and max; recompute the rest."""
    from collections import defaultdict

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten.max.default}
    for name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_cudnn_attention"):  # fmt: skip
        save.add(getattr(aten, name).default)

    def policy_for(meta):
        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == aten.mm.default:
                meta[mode] += 1
            keep = func in save and not (func == aten.mm.default and meta[mode] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return policy

    def context_fn():
        return create_selective_checkpoint_contexts(policy_for(defaultdict(int)))

    for layer_id, block in list(model.layers.named_children()):
        model.layers.register_module(
            layer_id, checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)
        )


def apply_fsdp(model: Transformer, mesh) -> None:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    cfg = {"mesh": mesh, "mp_policy": mp}
    fully_shard(model.tok_embeddings, **cfg, reshard_after_forward=True)
    for block in model.layers.values():
        fully_shard(block, **cfg, reshard_after_forward=True)
    fully_shard([model.norm, model.output], **cfg, reshard_after_forward=False)
    fully_shard(model, **cfg)
    for m in model.modules():
        if isinstance(m, FSDPModule) and hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)


_MESH = {}


def get_mesh(device: torch.device):
    if "mesh" not in _MESH:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
        _MESH["mesh"] = init_device_mesh(device.type, (1,))
    return _MESH["mesh"]


def is_moe(a) -> bool:
    return isinstance(a, qwen3.Qwen3Args)


def compile_blocks(model: nn.Module) -> None:
    (qwen3.apply_compile if isinstance(model, qwen3.Qwen3MoE) else apply_compile)(model)


def build(route: str, mode: str, a, device: torch.device, ac: str = "none") -> Setup:
    """Meta-device model -> AC -> compile -> (FSDP) -> to_empty -> init_weights, in torchtitan's order."""
    with torch.device("meta"):
        model = qwen3.Qwen3MoE(a) if is_moe(a) else Transformer(a)
    if ac == "op":
        apply_op_sac(model)
    if route == "bf16copy":
        model.to_empty(device=device)
        model.init_weights(device)
        work = copy.deepcopy(model)
        with torch.no_grad():
            for prm in work.parameters():  # params only: Module.to(bf16) would also cast the complex freqs_cis
                prm.data = prm.data.to(torch.bfloat16)
        if mode == "compile":
            compile_blocks(work)
        s = Setup(route, model, work, list(model.parameters()), contextlib.nullcontext())
        s.work_params = list(work.parameters())
        return s
    if mode == "compile":
        compile_blocks(model)
    if route == "fsdp":
        apply_fsdp(model, get_mesh(device))
    model.to_empty(device=device)
    model.init_weights(device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if route == "autocast" else contextlib.nullcontext()
    return Setup(route, model, model, list(model.parameters()), amp)


# ------------------------------------------------------------------------------------------- timing


class Clock:
    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def kernel_table(step, clock: Clock, top: int = 150, trace: Path | None = None) -> dict:
    """One more step under torch.profiler: per op and per kernel, GPU time (us, total and self) and calls,
    the `top` largest by self GPU time, to hold against the estimate op by op. With `trace`, also the ops
    grouped by input shapes and the step's Chrome trace (gzipped: which stream ran what, and when)."""
    try:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, record_shapes=trace is not None) as prof:
            step()
            clock.sync()
        out: dict = {}
        if trace is not None:
            import gzip
            import tempfile

            with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                prof.export_chrome_trace(tmp.name)
                trace.write_bytes(gzip.compress(Path(tmp.name).read_bytes()))
            shaped = []
            for e in prof.key_averages(group_by_input_shape=True):
                own = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                if own > 0 and e.key.startswith("aten::"):
                    shaped.append([e.key, str(e.input_shapes)[:300], round(own, 1), e.count])
            shaped.sort(key=lambda r: -r[2])
            out["ops_by_shape_us"] = shaped[:250]
        rows = []
        for e in prof.key_averages():
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            own = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if total > 0:
                rows.append([e.key[:200], round(own, 1), round(total, 1), e.count])
        rows.sort(key=lambda r: -r[1])
        return out | {"kernels_us": rows[:top], "kernels_columns": ["name", "self_gpu_us", "gpu_us", "calls"]}
    except Exception as e:  # noqa: BLE001
        return {"kernels_error": f"{type(e).__name__}: {e}"[:1000]}


def gib(x: int) -> float:
    return round(x / 2**30, 3)


def run_config(route: str, mode: str, n_layers: int, opts, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    clock = Clock(cuda)
    a = replace(opts.model_args, n_layers=n_layers)
    rec: dict = {
        "route": route,
        "mode": mode,
        "n_layers": n_layers,
        "batch": opts.batch,
        "seq_len": opts.seq_len,
        "ac": opts.ac,
    }
    setup = optimizer = loss_fn = tokens = labels = None
    t0 = time.perf_counter()
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        setup = build(route, mode, a, device, opts.ac)
        rec["n_params"] = sum(p.numel() for p in setup.params)
        if is_moe(a):
            rec["flops_per_step"] = qwen3.flops_per_step(a, setup.model, opts.batch, opts.seq_len)
            rec["n_active_params"] = qwen3.active_params(setup.model, a)
        else:
            fc = setup.forward_model.freqs_cis
            assert fc.dtype == torch.complex64 and fc.shape == (opts.seq_len, a.dim // a.n_heads // 2), fc.dtype
            rec["flops_per_step"] = flops_per_step(a, setup.model, opts.batch, opts.seq_len)
        optimizer = torch.optim.AdamW(
            setup.params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=cuda, foreach=not cuda
        )
        rec["optimizer"] = f"AdamW fused={cuda} foreach={not cuda}"
        loss_fn = torch.compile(cross_entropy_loss) if mode == "compile" else cross_entropy_loss
        g = torch.Generator(device="cpu").manual_seed(0)
        tokens = torch.randint(0, a.vocab_size, (opts.batch, opts.seq_len), generator=g).to(device)
        labels = torch.randint(0, a.vocab_size, (opts.batch, opts.seq_len), generator=g).to(device)
        global_valid_tokens = (labels != IGNORE_INDEX).sum().float()
        rec["build_s"] = round(time.perf_counter() - t0, 2)
        log(f"  built in {rec['build_s']} s, {rec['n_params'] / 1e9:.3f} B params")

        def step():
            m0 = clock.mark()
            optimizer.zero_grad()
            with setup.amp:
                pred = setup.forward_model(tokens)
                loss = loss_fn(pred, labels) / global_valid_tokens
            del pred
            m1 = clock.mark()
            loss.backward()
            setup.after_backward()
            m2 = clock.mark()
            clip_grad_norm_(setup.params, 1.0)
            m3 = clock.mark()
            optimizer.step()
            setup.after_step()
            m4 = clock.mark()
            return loss.detach(), (m0, m1, m2, m3, m4)

        warm = []
        for i in range(opts.warmup):
            tw = time.perf_counter()
            loss, _ = step()
            clock.sync()
            warm.append(round(time.perf_counter() - tw, 3))
            log(f"  warmup {i}: {warm[-1]} s, loss {loss.item():.4f}")
        rec["warmup_wall_s"] = warm
        if cuda:
            rec["mem_allocated_before_steps_gib"] = gib(torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        marks, losses = [], []
        tw = time.perf_counter()
        for _ in range(opts.steps):
            loss, m = step()
            marks.append(m)
            losses.append(loss)
        clock.sync()
        rec["wall_step_ms_mean"] = round((time.perf_counter() - tw) * 1e3 / opts.steps, 2)
        if cuda:
            rec["peak_mem_gib"] = gib(torch.cuda.max_memory_allocated())
            rec["peak_reserved_gib"] = gib(torch.cuda.max_memory_reserved())
        parts = {
            "step_ms": [clock.ms(m[0], m[4]) for m in marks],
            "fwd_ms": [clock.ms(m[0], m[1]) for m in marks],  # zero_grad + forward + loss
            "bwd_ms": [clock.ms(m[1], m[2]) for m in marks],
            "fwd_bwd_ms": [clock.ms(m[0], m[2]) for m in marks],
            "clip_ms": [clock.ms(m[2], m[3]) for m in marks],
            "opt_ms": [clock.ms(m[3], m[4]) for m in marks],
            "clip_opt_ms": [clock.ms(m[2], m[4]) for m in marks],
        }
        for k, v in parts.items():
            rec[k] = round(statistics.median(v), 3)
            rec[k + "_all"] = [round(x, 3) for x in v]
        rec["losses"] = [round(x.item(), 4) for x in losses]
        rec["tflops"] = round(rec["flops_per_step"] / (rec["step_ms"] * 1e-3) / 1e12, 1)
        rec["ok"] = True
        if mode == "compile":
            with contextlib.suppress(Exception):
                stats = torch._dynamo.utils.counters["stats"]
                rec["dynamo_unique_graphs_cumulative"] = stats["unique_graphs"]
        log(
            f"  step {rec['step_ms']:.1f} ms (fwd+bwd {rec['fwd_bwd_ms']:.1f}, clip {rec['clip_ms']:.1f}, "
            f"opt {rec['opt_ms']:.1f}), peak {rec.get('peak_mem_gib')} GiB"
        )
        if cuda and (opts.kernel_table or opts.trace_step):
            trace = None
            if opts.trace_step and opts.out_dir:
                trace = Path(opts.out_dir) / f"trace_{opts.model}_{mode}_L{n_layers}.json.gz"
            rec.update(kernel_table(step, clock, trace=trace))
        # forward only (grad enabled, same graphs as training; the autograd graph is dropped unused)
        try:
            optimizer.zero_grad()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            fwd = []
            for _ in range(opts.fwd_reps + 1):
                m0 = clock.mark()
                with setup.amp:
                    pred = setup.forward_model(tokens)
                    loss = loss_fn(pred, labels) / global_valid_tokens
                m1 = clock.mark()
                clock.sync()
                fwd.append(clock.ms(m0, m1))
                del pred, loss
            rec["fwd_only_ms"] = round(statistics.median(fwd[1:]), 3)
            rec["fwd_only_ms_all"] = [round(x, 3) for x in fwd]
            if cuda:
                rec["fwd_only_peak_mem_gib"] = gib(torch.cuda.max_memory_allocated())
        except Exception as e:  # noqa: BLE001
            rec["fwd_only_error"] = f"{type(e).__name__}: {e}"[:2000]
    except Exception as e:  # noqa: BLE001
        rec["ok"] = False
        rec["error"] = f"{type(e).__name__}: {e}"[:4000]
        rec["traceback"] = traceback.format_exc()[-6000:]
        log(f"  FAILED: {rec['error'][:500]}")
    finally:
        setup = optimizer = loss_fn = tokens = labels = None  # (not `del`: the step closure refers to them)
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    rec["config_wall_s"] = round(time.perf_counter() - t0, 2)
    return rec


# -------------------------------------------------------------------------------------- environment


def probe_sdpa(a, seq: int, device: torch.device) -> dict:
    """Which SDPA kernel runs (aten op names seen by the profiler), torchtitan priority vs default, + timing."""
    hd = a.head_dim if is_moe(a) else a.dim // a.n_heads
    out = {}
    for name, backends in (("torchtitan_priority", TORCHTITAN_SDPA_BACKENDS), ("default_priority", None)):
        try:
            q = torch.randn(1, a.n_heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(1, a.n_kv_heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(1, a.n_kv_heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)

            def fb(q=q, k=k, v=v, backends=backends):
                ctx = contextlib.nullcontext()
                if backends is not None:
                    ctx = sdpa_kernel(backends, set_priority=True) if _SDPA_HAS_PRIORITY else sdpa_kernel(backends)
                with ctx:
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=a.n_heads > a.n_kv_heads)
                o.backward(torch.ones_like(o))

            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                fb()
            ops = sorted({e.name for e in prof.events() if "attention" in e.name.lower()})
            clock = Clock(device.type == "cuda")
            times = []
            for _ in range(4):
                m0 = clock.mark()
                fb()
                m1 = clock.mark()
                clock.sync()
                times.append(clock.ms(m0, m1))
            out[name] = {"aten_ops": ops, "fwd_bwd_ms_median": round(statistics.median(times[1:]), 3)}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    return out


def environment(device: torch.device) -> dict:
    env: dict = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
        "alloc_conf": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")},
        "sdpa_flags": {
            f: getattr(torch.backends.cuda, f)()
            for f in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled")
            if hasattr(torch.backends.cuda, f)
        },
        "sdpa_kernel_set_priority_supported": _SDPA_HAS_PRIORITY,
    }
    with contextlib.suppress(Exception):
        import triton

        env["triton"] = triton.__version__
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(
            gpu=p.name,
            capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            gpu_mem_gib=gib(p.total_memory),
        )
        try:
            q = "name,clocks.max.sm,clocks.sm,power.limit,power.max_limit,memory.total"
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except Exception as e:  # noqa: BLE001
            env["nvidia_smi"] = f"error: {e}"
    return env


# ------------------------------------------------------------------------------------------------ main


def summary(configs: list[dict]) -> str:
    cols = ["route", "mode", "L", "step_ms", "fwd", "bwd", "fwd+bwd", "clip", "opt", "fwd_only", "peak_GiB", "TF/s"]
    rows = [cols]
    for r in configs:
        route = r["route"] + (f"({r['route_requested']})" if r.get("route_requested") else "")
        if not r.get("ok"):
            rows.append([route, r["mode"], str(r["n_layers"]), "FAILED" if "error" in r else "skipped"])
            continue
        rows.append(
            [route, r["mode"], str(r["n_layers"])]
            + [
                f"{r[k]:.1f}" if isinstance(r.get(k), float) else str(r.get(k, "-"))
                for k in (
                    "step_ms",
                    "fwd_ms",
                    "bwd_ms",
                    "fwd_bwd_ms",
                    "clip_ms",
                    "opt_ms",
                    "fwd_only_ms",
                    "peak_mem_gib",
                    "tflops",
                )
            ]
        )
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)) for row in rows)


def parse(argv: list[str]):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", help="where torchtitan_llama_step.json (or _qwen3_moe_) goes")
    ap.add_argument("--model", choices=["llama3-8b", "qwen3-30b-a3b"], default="llama3-8b")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU (dim 64, 2 layers, seq 32)")
    ap.add_argument("--smoke-compile", action="store_true", help="with --cpu-smoke: also the compile mode")
    ap.add_argument("--layers", default="2,4")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--routes", default="fsdp,autocast", help="fsdp, bf16copy, autocast")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--fwd-reps", type=int, default=3)
    ap.add_argument(
        "--sdpa",
        choices=["torchtitan", "default"],
        default="torchtitan",
        help="torchtitan: its sdpa_kernel([cuDNN, flash, math], set_priority=True); default: none",
    )
    ap.add_argument("--kernel-table", action="store_true", help="profile one more step: GPU time per op/kernel")
    ap.add_argument("--trace-step", action="store_true", help="also ops by input shape and a gzipped Chrome trace")
    ap.add_argument("--budget-s", type=float, default=225.0, help="configurations not started by then are skipped")
    ap.add_argument("--ac", choices=["none", "op"], default="none", help="op: torchtitan's selective op AC per block")
    opts = ap.parse_args(argv)
    if opts.cpu_smoke and opts.model == "qwen3-30b-a3b":
        opts.model_args = qwen3.Qwen3Args(
            dim=64, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=256, moe_inter_dim=32, num_experts=8, top_k=2,
            max_seq_len=32, sdpa=opts.sdpa,
        )  # fmt: skip
    elif opts.cpu_smoke:
        opts.model_args = ModelArgs(
            dim=64, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=32, max_seq_len=32, sdpa=opts.sdpa
        )
    if opts.cpu_smoke:
        opts.layers, opts.seq_len, opts.batch = "2", 32, 1
        opts.modes = "eager,compile" if opts.smoke_compile else "eager"
        opts.routes = "fsdp,bf16copy,autocast"
        opts.warmup, opts.steps, opts.fwd_reps = 1, 2, 1
    elif opts.model == "qwen3-30b-a3b":
        opts.model_args = qwen3.Qwen3Args(max_seq_len=opts.seq_len, sdpa=opts.sdpa)
    else:
        opts.model_args = ModelArgs(max_seq_len=opts.seq_len, sdpa=opts.sdpa)
    return opts


def main(argv: list[str]) -> int:
    t_start = time.perf_counter()
    opts = parse(argv)
    if not opts.cpu_smoke and not torch.cuda.is_available():
        log("no CUDA device; use --cpu-smoke for the CPU check")
        return 2
    if not opts.cpu_smoke and not opts.out_dir:
        log("usage: torchtitan_llama_step.py OUT_DIR")
        return 2
    device = torch.device("cpu") if opts.cpu_smoke else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    name = "torchtitan_qwen3_moe_step.json" if opts.model == "qwen3-30b-a3b" else "torchtitan_llama_step.json"
    out_path = Path(opts.out_dir) / name if opts.out_dir else None
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    a = opts.model_args
    result: dict = {
        "script": "bench/device/torchtitan_llama_step.py",
        "argv": argv,
        "torchtitan_reference": TORCHTITAN_REF,
        "model": opts.model,
        "model_args": asdict(a) if is_moe(a) else {**asdict(a), "ffn_hidden_dim": ffn_hidden_dim(a)},
        "env": environment(device),
        "configs": [],
    }
    log(json.dumps(result["env"], indent=1))

    def save() -> None:
        result["total_wall_s"] = round(time.perf_counter() - t_start, 1)
        if out_path:
            out_path.write_text(json.dumps(result, indent=1))

    log("probing SDPA backends ...")
    result["sdpa_probe"] = probe_sdpa(a, opts.seq_len, device)
    log(json.dumps(result["sdpa_probe"]))
    save()
    plan = [
        (mode, route, int(n))
        for mode in opts.modes.split(",")
        for route in opts.routes.split(",")
        for n in opts.layers.split(",")
    ]
    for mode, route, n_layers in plan:
        elapsed = time.perf_counter() - t_start
        if not opts.cpu_smoke and elapsed > opts.budget_s:
            log(f"[skip] {route} {mode} L={n_layers}: {elapsed:.0f} s > budget {opts.budget_s:.0f} s")
            result["configs"].append(
                {
                    "route": route,
                    "mode": mode,
                    "n_layers": n_layers,
                    "ok": False,
                    "skipped": f"time budget ({elapsed:.0f} s elapsed)",
                }
            )
            continue
        log(f"[{elapsed:6.1f} s] {route} {mode} n_layers={n_layers} seq={opts.seq_len} batch={opts.batch}")
        rec = run_config(route, mode, n_layers, opts, device)
        result["configs"].append(rec)
        save()
        if route == "fsdp" and not rec.get("ok"):
            log("  fully_shard route failed -> bf16copy fallback")
            fb = run_config("bf16copy", mode, n_layers, opts, device)
            fb["route_requested"] = "fsdp"
            fb["fsdp_error"] = rec.get("error")
            result["configs"].append(fb)
            save()
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    save()
    log(summary(result["configs"]))
    log(f"total {time.perf_counter() - t_start:.1f} s" + (f"; wrote {out_path}" if out_path else ""))
    return 0 if any(c.get("ok") for c in result["configs"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
