"""Reference PyTorch transformer layers for ground-truth memory tests (CPU, FakeTensorMode).

The layers are written the way a real CUDA run executes them, so what autograd saves matches the
CUDA kernels: RMSNorm is a fused op that saves its input and the fp32 reciprocal RMS (as
`torch._fused_rms_norm` / Apex / TE on CUDA do), attention is `scaled_dot_product_attention` (flash
kernel: saves q, k, v, out and the fp32 log-sum-exp), linears save their inputs.

Documented CPU differences, which the tests measure separately:
  * `F.rms_norm` on CPU decomposes into fp32 ops: it saves the fp32 upcast input and the fp32
    normalised tensor (4 + 4 bytes per element) instead of the bf16 input (2 bytes).
  * CPU SDPA returns its output as (b, heads, s, d) contiguous; the CUDA flash kernel allocates it as
    (b, s, heads, d), so merging heads is a view on CUDA but a copy (saved again by the output
    projection) on CPU. The reference transposes through `.contiguous()` only where CUDA would.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm with the fused CUDA kernel's saved-tensor contract: input + fp32 rstd."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), (grad.float() * xhat).sum(dim=tuple(range(grad.dim() - 1))).to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return FusedRMSNorm.apply(x, self.weight, self.eps)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def swiglu(gate, up):
    return F.silu(gate) * up


class FusedSwiGLU(torch.autograd.Function):
    """Megatron-Core's fused SwiGLU (`fused_bias_swiglu.SwiGLUFunction`): saves only its input (gate and
    up) and recomputes silu(gate) in backward."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate.float())
        silu = gate.float() * sig
        dgate = grad.float() * up.float() * sig * (1 + gate.float() * (1 - sig))
        return dgate.to(gate.dtype), (grad.float() * silu).to(up.dtype)


class FusedCrossEntropy(torch.autograd.Function):
    """flash-attn's xentropy contract (llm-foundry's `fused_crossentropy`): the softmax is taken in
    registers from the bf16 logits, so forward keeps the logits and the fp32 log-sum-exp only."""

    @staticmethod
    def forward(ctx, logits, targets):
        lse = torch.logsumexp(logits.float(), dim=-1)
        ctx.save_for_backward(logits, lse, targets)
        return lse - logits.float().gather(-1, targets[:, None])[:, 0]

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        logits, lse, targets = ctx.saved_tensors
        probs = torch.exp(logits.float() - lse[:, None])
        probs[torch.arange(len(targets)), targets] -= 1
        return (probs * grad[:, None]).to(logits.dtype), None


class LossHead(nn.Module):
    """Final RMSNorm, output projection and cross-entropy: unfused (fp32 upcast, `F.cross_entropy`) or
    through the fused kernel's contract."""

    def __init__(self, hidden, vocab, fused=False):
        super().__init__()
        self.norm, self.proj, self.fused = RMSNorm(hidden), nn.Linear(hidden, vocab, bias=False), fused

    def forward(self, x, targets):
        logits = self.proj(self.norm(x))
        if self.fused:
            return FusedCrossEntropy.apply(logits, targets).mean()
        return F.cross_entropy(logits.float(), targets)


class LlamaLayer(nn.Module):
    """A Llama/Qwen/Mistral block: pre-RMSNorm, GQA attention with RoPE, SwiGLU MLP."""

    def __init__(self, hidden, heads, kv_heads, head_dim, ffn, qk_norm=False, policy="none", fused_act=False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.policy = policy
        self.act = FusedSwiGLU.apply if fused_act else swiglu
        self.attn_norm = RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.mlp_norm = RMSNorm(hidden)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def _cheap(self, fn, *args):
        """Selective recompute: cheap ops are recomputed in backward (only their inputs are kept)."""
        if self.policy == "selective":
            return checkpoint(fn, *args, use_reentrant=True)
        return fn(*args)

    def _block(self, x, cos, sin):
        b, s, _ = x.shape
        h = self._cheap(self.attn_norm, x)
        q = self.q(h).view(b, s, self.heads, self.head_dim)
        k = self.k(h).view(b, s, self.kv_heads, self.head_dim)
        v = self.v(h).view(b, s, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self._cheap(apply_rope, q.transpose(1, 2), cos, sin)
        k = self._cheap(apply_rope, k.transpose(1, 2), cos, sin)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = self._cheap(torch.add, x, self.o(out.transpose(1, 2).reshape(b, s, -1)))
        h = self._cheap(self.mlp_norm, x)
        return x + self.down(self._cheap(self.act, self.gate(h), self.up(h)))

    def forward(self, x, cos, sin):
        if self.policy == "full":
            return checkpoint(self._block, x, cos, sin, use_reentrant=True)
        return self._block(x, cos, sin)


class GPTLayer(nn.Module):
    """A GPT-2/MPT block: pre-LayerNorm with bias, MHA, GeLU MLP, biases on every linear."""

    def __init__(self, hidden, heads, ffn, policy="none"):
        super().__init__()
        self.heads, self.head_dim, self.policy = heads, hidden // heads, policy
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def _cheap(self, fn, *args):
        if self.policy == "selective":
            return checkpoint(fn, *args, use_reentrant=True)
        return fn(*args)

    def _block(self, x):
        b, s, hid = x.shape
        q, k, v = self.qkv(self._cheap(self.ln1, x)).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = self._cheap(torch.add, x, self.o(out.transpose(1, 2).reshape(b, s, hid)))
        return x + self.fc2(self._cheap(F.gelu, self.fc1(self._cheap(self.ln2, x))))

    def forward(self, x):
        if self.policy == "full":
            return checkpoint(self._block, x, use_reentrant=True)
        return self._block(x)


def bf16_module(factory):
    """`factory()` with bf16 as the default dtype, so its parameters are bf16 as in a mixed-precision run."""
    torch.set_default_dtype(torch.bfloat16)
    try:
        return factory()
    finally:
        torch.set_default_dtype(torch.float32)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def saved_activation_bytes(output: torch.Tensor, exclude: list[torch.Tensor]) -> tuple[int, dict[str, int]]:
    """Bytes of the unique storages that autograd keeps for backward, found by walking the graph from
    `output`; storages of `exclude` (parameters, rope tables) are not activations."""
    skip = {_storage_key(t) for t in exclude}
    seen: dict[int, tuple[str, int]] = {}
    stack, visited = [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        tensors = []
        for attr in dir(node):
            if attr.startswith("_saved_"):
                value = getattr(node, attr)
                if isinstance(value, torch.Tensor):
                    tensors.append(value)
                elif isinstance(value, (tuple, list)):
                    tensors += [v for v in value if isinstance(v, torch.Tensor)]
        if hasattr(node, "saved_tensors"):  # custom autograd.Function / reentrant checkpoint
            tensors += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
        for t in tensors:
            key = _storage_key(t)
            if key not in skip and key not in seen:
                seen[key] = (node.name(), t.untyped_storage().nbytes())
        stack += [fn for fn, _ in node.next_functions]
    by_node: dict[str, int] = {}
    for name, nbytes in seen.values():
        by_node[name] = by_node.get(name, 0) + nbytes
    return sum(by_node.values()), by_node


class AtenBytes(TorchDispatchMode):
    """Bytes each ATen op reads and writes (its tensor inputs and outputs), summed: the HBM traffic of
    an unfused eager op sequence; and `kernels`, the eager kernel launches they make (`slice_backward`
    two: zeros, then the copy). Views and metadata queries move nothing and are not counted."""

    FREE = frozenset(
        {"view", "_unsafe_view", "split", "split_with_sizes", "unsqueeze", "squeeze", "slice", "expand", "t"}
        | {"detach", "alias", "as_strided", "select", "permute", "transpose", "device"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in self.FREE:
            tensors = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
            self.total += sum(x.numel() * x.element_size() for x in tensors)
            self.kernels += 1 + (func.overloadpacket.__name__ == "slice_backward")
        return out


class ElementwiseBytes(AtenBytes):
    """`AtenBytes` of the ops outside the GEMMs and the attention kernel, counting what they touch: a
    broadcast operand (stride 0 along a dimension) once, and views (`unbind`, `unflatten`) as nothing."""

    FREE = AtenBytes.FREE | {"unbind", "unflatten", "flatten"}
    KERNELS = frozenset({"addmm", "mm", "bmm"})

    @staticmethod
    def touched(x: torch.Tensor) -> int:
        return x.element_size() * math.prod(n for n, st in zip(x.shape, x.stride(), strict=True) if st)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in self.FREE and name not in self.KERNELS and "scaled_dot_product" not in name:
            tensors = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
            self.total += sum(self.touched(x) for x in tensors)
            self.kernels += 1 + (name == "slice_backward")
        return out


class NormModulate(torch.autograd.Function):
    """Megatron-DFM's adaLN `normalize_modulate`: LayerNorm (no affine) then `x * (1 + scale) + shift`,
    under Megatron's `jit_fuser` (torch.compile). The compiled region keeps its input, the scale and the
    fp32 mean and rstd, and recomputes the normalised tensor in backward (AOTAutograd's min-cut
    partitioner decides so; `test_compiled_adaln_regions_keep_what_the_partitioner_keeps` checks it)."""

    @staticmethod
    def forward(ctx, x, shift, scale, eps=1e-6):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, scale, mean, rstd)
        return (((xf - mean) * rstd) * (1 + scale) + shift).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        raise NotImplementedError


class ScaleAdd(torch.autograd.Function):
    """Megatron-DFM's gated residual `residual + gate * x` (torch.compile): keeps the branch output and the
    gate."""

    @staticmethod
    def forward(ctx, residual, x, gate):
        ctx.save_for_backward(x, gate)
        return residual + gate * x

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        raise NotImplementedError


class WanBlock(nn.Module):
    """A Wan 2.1 block as Megatron-DFM builds it (`WanLayerWithAdaLN`, DFM @7cb7634): adaLN-modulated
    self-attention (fused qkv with biases, q/k RMSNorm across heads on contiguous copies, RoPE,
    non-causal flash attention), gated residual; LayerNorm (affine) then cross-attention to the text
    (q from the video tokens, k/v from the text, q/k RMSNorm), plain residual; adaLN-modulated GeLU
    (tanh) FFN, gated residual. Transformer Engine's attention takes non-contiguous q/k/v as copies."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.modulation = nn.Parameter(torch.zeros(1, 6, hidden))
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.q_norm, self.k_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.o = nn.Linear(hidden, hidden)
        self.norm3 = nn.LayerNorm(hidden)
        self.cq, self.ckv, self.co = nn.Linear(hidden, hidden), nn.Linear(hidden, 2 * hidden), nn.Linear(hidden, hidden)
        self.cq_norm, self.ck_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def _heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def _attend(self, q, k, v):
        b, s = q.shape[0], q.shape[1]
        out = F.scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v))
        return out.transpose(1, 2).reshape(b, s, -1)

    def forward(self, x, context, temb, cos, sin):
        b, s, d = x.shape
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = (self.modulation + temb).unbind(1)
        qkv = self.qkv(NormModulate.apply(x, shift[:, None], scale[:, None])).view(b, s, self.heads, 3, -1)
        q, k, v = (qkv[..., i, :].contiguous().view(b, s, d) for i in range(3))
        q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(self._heads(q), cos, sin).transpose(1, 2).reshape(b, s, d)
        k = apply_rope(self._heads(k), cos, sin).transpose(1, 2).reshape(b, s, d)
        x = ScaleAdd.apply(x, self.o(self._attend(q, k, v)), gate[:, None])
        ck, cv = self.ckv(context).chunk(2, dim=-1)
        cq = self.cq_norm(self.cq(self.norm3(x)))
        x = x + self.co(self._attend(cq, self.ck_norm(ck.contiguous()), cv.contiguous()))
        h = NormModulate.apply(x, shift_mlp[:, None], scale_mlp[:, None])
        return ScaleAdd.apply(x, self.fc2(F.gelu(self.fc1(h), approximate="tanh")), gate_mlp[:, None])


class FlashAttention(torch.autograd.Function):
    """The flash-attention kernels' contract (FlashAttention-2/3, cuDNN): keep q, k, v, the output and the
    fp32 log-sum-exp per query and head; the output is allocated (batch, seq, heads, dim), so merging
    heads after it is a view. For head dims the CPU flash kernel does not take (MLA: q/k 192, v 128)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=True):
        scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            s = q.shape[-2]
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        raise NotImplementedError


class MLAAttention(nn.Module):
    """DeepSeek-V3 multi-latent attention as Megatron-Core runs it (`MLASelfAttention`, TP 1): RMSNorm,
    q down-projection, q latent RMSNorm, q up-projection (or one q projection without a q latent); kv
    down-projection to the latent and the shared
    RoPE key, kv latent RMSNorm (Transformer Engine's norm takes a contiguous copy of its input,
    `ops/basic/rmsnorm.py`), kv up-projection to the per-head keys and values; RoPE on the rope parts,
    q = [q_nope, q_pe], k = [k_nope, k_pe broadcast to every head], flash attention, output projection,
    residual; then the MLP's norm, which keeps the residual."""

    def __init__(self, hidden, heads, q_lora, kv_lora, nope, rope, v_dim):
        super().__init__()
        self.heads, self.dims = heads, (q_lora, kv_lora, nope, rope, v_dim)
        self.norm, self.kv_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(kv_lora), RMSNorm(hidden)
        if q_lora:  # else q is projected directly (DeepSeek-V2-Lite)
            self.q_down, self.q_norm = nn.Linear(hidden, q_lora, bias=False), RMSNorm(q_lora)
        self.q_up = nn.Linear(q_lora or hidden, heads * (nope + rope), bias=False)
        self.kv_down = nn.Linear(hidden, kv_lora + rope, bias=False)
        self.kv_up = nn.Linear(kv_lora, heads * (nope + v_dim), bias=False)
        self.o = nn.Linear(heads * v_dim, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q_lora, kv_lora, nope, rope, v_dim = self.dims
        h = self.norm(x)
        q = self.q_up(self.q_norm(self.q_down(h)) if q_lora else h).view(b, s, self.heads, nope + rope)
        latent, k_pe = self.kv_down(h).split([kv_lora, rope], dim=-1)
        kv = self.kv_up(self.kv_norm(latent.contiguous())).view(b, s, self.heads, nope + v_dim)
        q_nope, q_pe = q.split([nope, rope], dim=-1)
        k_nope, value = kv.split([nope, v_dim], dim=-1)
        query = torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), cos, sin).expand(-1, -1, self.heads, -1)
        key = torch.cat([k_nope, k_pe], dim=-1)
        out = FlashAttention.apply(query.transpose(1, 2), key.transpose(1, 2), value.contiguous().transpose(1, 2))
        return self.mlp_norm(x + self.o(out.transpose(1, 2).reshape(b, s, -1)))


class LiveBytes(TorchDispatchMode):
    """The bytes of the storages ops create that are alive, and their peak (a storage leaves when PyTorch
    drops it). A DTensor counts as its local tensor; `inner()` counts into the same tally from inside a
    DTensor op's own implementation, where this mode is not on the stack."""

    def __init__(self, tally: LiveBytes | None = None):
        super().__init__()
        self.tally = tally or self
        self.live: dict[int, int] = {}  # storage -> bytes
        self.now = self.peak = 0

    def inner(self) -> LiveBytes:
        return LiveBytes(self.tally)

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def _track(self, t: torch.Tensor) -> None:
        t = getattr(t, "_local_tensor", t)  # a DTensor's bytes are its local shard's
        try:
            storage, key = t.untyped_storage(), _storage_key(t)
        except RuntimeError:  # a wrapper without storage of its own (a collective's pending result)
            return
        if key not in self.live:
            self.live[key] = storage.nbytes()
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._free, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.tally._track(t)
        return out
