"""torchtitan 0.2.2's Qwen3 MoE model (flavor "30B-A3B"), re-written compactly for the one-GPU step bench.

Same ops in the same order as `torchtitan/models/qwen3/model/model.py` and `torchtitan/models/moe/moe.py`
(`pip download --no-deps torchtitan==0.2.2`): pre-norm blocks; attention with separate wq/wk/wv/wo, per-head
q/k RMSNorm (qk_norm), RoPE from a real cos|sin cache (rotate-half), SDPA with torchtitan's backend priority;
MoE: `gate` Linear -> softmax in fp32 -> top-8 (`sorted=False`) -> scores renormalised (route_norm) ->
histc counts -> stable argsort by expert -> gather -> grouped GEMMs (`torch._grouped_mm`, w1/w3 then w2,
silu(w1 x) * w3 x) on expert groups padded to multiples of 8 rows (`indices_padding_wrapper`) -> scatter back
-> `bmm` with the scores in fp32 (score_before_experts=False). No shared experts; the load-balance bias buffer
is kept (its optimizer-side update is left out). Output `nn.Linear(dim, vocab)` (not tied).

One difference: torchtitan fills the padded permutation with a Triton kernel (`generate_permute_indices`);
here the same indices come from torch ops (no host sync either way), so the bench needs no Triton.
Compile follows `models/llama4/infra/parallelize.py apply_compile` (which qwen3 uses): for an MoE block each
child module is compiled separately (fullgraph), and inside the MoE every child except `experts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

ALIGN_M = 8  # TOKEN_GROUP_ALIGN_SIZE_M for bf16 (torchtitan/models/moe/utils.py)


@dataclass
class Qwen3Args:
    dim: int = 2048
    n_layers: int = 48
    n_heads: int = 32
    n_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 151936
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_seq_len: int = 8192
    moe_inter_dim: int = 768
    num_experts: int = 128
    top_k: int = 8
    depth_init: bool = True
    sdpa: str = "torchtitan"


def precompute_rope_cache(dim: int, max_seq_len: int, base: float) -> torch.Tensor:
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(max_seq_len, dtype=freqs.dtype)
    idx_theta = torch.outer(t, freqs).float()
    freqs = torch.cat([idx_theta, idx_theta], dim=-1)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, rope_cache: torch.Tensor):
    _, seqlen, _, head_dim = xq.shape
    rope = rope_cache[0:seqlen].view(-1, seqlen, 1, head_dim * 2)
    cos = rope[..., :head_dim].to(dtype=xq.dtype, device=xq.device)
    sin = rope[..., head_dim:].to(dtype=xq.dtype, device=xq.device)
    return ((xq * cos) + (rotate_half(xq) * sin)).type_as(xq), ((xk * cos) + (rotate_half(xk) * sin)).type_as(xk)


def trunc_normal_(w: torch.Tensor, std: float) -> None:
    nn.init.trunc_normal_(w, mean=0.0, std=std, a=-2.0, b=2.0)


class SDPA(nn.Module):
    BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

    def __init__(self, priority: bool):
        super().__init__()
        self.priority = priority

    def forward(self, q, k, v, scale, enable_gqa):
        if not self.priority:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)
        with sdpa_kernel(self.BACKENDS, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)


class Attention(nn.Module):
    def __init__(self, a: Qwen3Args):
        super().__init__()
        self.head_dim, self.scaling = a.head_dim, a.head_dim**-0.5
        self.enable_gqa = a.n_heads > a.n_kv_heads
        self.q_norm = nn.RMSNorm(a.head_dim, eps=a.norm_eps)
        self.k_norm = nn.RMSNorm(a.head_dim, eps=a.norm_eps)
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)
        self.inner_attention = SDPA(a.sdpa == "torchtitan")

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            trunc_normal_(linear.weight, 0.02)
        trunc_normal_(self.wo.weight, init_std)
        self.q_norm.reset_parameters()
        self.k_norm.reset_parameters()

    def forward(self, x: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, rope_cache)
        out = self.inner_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), scale=self.scaling, enable_gqa=self.enable_gqa
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


def expert_counts(selected: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Tokens per expert as torchtitan counts them (`histc`, float); CPU histc takes no int64 (the smoke check)."""
    idx = selected.view(-1)
    return torch.histc(idx if idx.is_cuda else idx.float(), bins=num_experts, min=0, max=num_experts)


class Router(nn.Module):
    """TokenChoiceTopKRouter with softmax scores, route_norm, route_scale 1, no groups, no gate bias."""

    def __init__(self, dim: int, num_experts: int, top_k: int):
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.num_experts, self.top_k = num_experts, top_k

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None):
        scores = F.softmax(self.gate(x).to(torch.float32), dim=1)
        choice = scores if expert_bias is None else scores + expert_bias
        _, selected = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)
        top_scores = scores.gather(dim=1, index=selected)
        top_scores = top_scores / (top_scores.sum(dim=-1, keepdim=True) + 1e-20)
        return top_scores, selected, expert_counts(selected, self.num_experts)


class Reorderer(nn.Module):
    def __init__(self, num_experts: int):
        super().__init__()
        self.num_experts = num_experts

    def forward(self, top_scores: torch.Tensor, selected: torch.Tensor):
        counts = expert_counts(selected, self.num_experts)
        order = torch.argsort(selected.view(-1), stable=True)
        return top_scores.view(-1)[order], order, counts


def padded_permutation(counts: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """generate_permute_indices for one rank: each expert's group padded to a multiple of ALIGN_M (at least
    ALIGN_M); returns (indices into the rows + one zero row, padded group sizes, the padded length)."""
    experts = counts.numel()
    counts = counts.to(torch.int64)
    padded = (torch.clamp_min(counts, ALIGN_M) + ALIGN_M - 1) // ALIGN_M * ALIGN_M
    max_len = (rows + experts * ALIGN_M + ALIGN_M - 1) // ALIGN_M * ALIGN_M
    start = torch.cumsum(counts, 0) - counts
    write = torch.cumsum(padded, 0) - padded
    expert_of_row = torch.repeat_interleave(torch.arange(experts, device=counts.device), counts, output_size=rows)
    row = torch.arange(rows, device=counts.device)
    dest = write[expert_of_row] + (row - start[expert_of_row])
    perm = torch.full((max_len,), -1, dtype=torch.int64, device=counts.device)  # -1: the appended zero row
    perm[dest] = row
    return perm, padded.to(torch.int32), max_len


class GroupedExperts(nn.Module):
    def __init__(self, dim: int, hidden: int, num_experts: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))

    def init_weights(self, init_std: float) -> None:
        trunc_normal_(self.w1, 0.02)
        trunc_normal_(self.w2, init_std)
        trunc_normal_(self.w3, init_std)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (w.to_local() if hasattr(w, "to_local") else w for w in (self.w1, self.w2, self.w3))
        with torch.no_grad():
            perm, sizes, _ = padded_permutation(counts, x.shape[0])
        x_padded = torch.vstack((x, x.new_zeros((x.shape[-1],))))
        shape = x_padded.shape
        xp = x_padded[perm, :]
        offsets = torch.cumsum(sizes, dim=0, dtype=torch.int32)
        if xp.is_cuda:
            h = F.silu(torch._grouped_mm(xp.bfloat16(), w1.bfloat16().transpose(-2, -1), offs=offsets))
            h = h * torch._grouped_mm(xp.bfloat16(), w3.bfloat16().transpose(-2, -1), offs=offsets)
            out = torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offsets).type_as(x)
        else:  # the CPU smoke check: the same function as a loop over the groups
            outs, begin = [], 0
            for e, n in enumerate(sizes.tolist()):
                xe = xp[begin : begin + n]
                outs.append((F.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T)
                begin += n
            out = torch.cat(outs + [xp.new_zeros((xp.shape[0] - begin, xp.shape[1]))]).type_as(x)
        unpermuted = out.new_empty(shape)
        unpermuted[perm, :] = out
        return unpermuted[:-1]


class MoE(nn.Module):
    def __init__(self, a: Qwen3Args):
        super().__init__()
        self.experts = GroupedExperts(a.dim, a.moe_inter_dim, a.num_experts)
        self.router = Router(a.dim, a.num_experts, a.top_k)
        self.reorderer = Reorderer(a.num_experts)
        self.register_buffer("expert_bias", torch.zeros(a.num_experts, dtype=torch.float32), persistent=True)
        self.register_buffer("tokens_per_expert", torch.zeros(a.num_experts, dtype=torch.float32), persistent=False)

    def init_weights(self, init_std: float, buffer_device: torch.device) -> None:
        self.experts.init_weights(init_std)
        trunc_normal_(self.router.gate.weight, init_std)
        with torch.device(buffer_device):
            self.tokens_per_expert = torch.zeros(self.experts.num_experts, dtype=torch.float32)
            self.expert_bias = torch.zeros(self.experts.num_experts, dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, slen, dim = x.shape
        x = x.view(-1, dim)
        top_scores, selected, counts = self.router(x, self.expert_bias)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        _, order, counts = self.reorderer(top_scores, selected)
        top_k = self.router.top_k
        routed_output = self.experts(x[order // top_k], counts)
        unsorted = torch.zeros((bs * slen * top_k, dim), dtype=routed_output.dtype, device=routed_output.device)
        unsorted[order] = routed_output
        unsorted = unsorted.reshape(-1, top_k, dim)
        out = torch.bmm(top_scores.reshape(-1, 1, top_k), unsorted.float()).to(x.dtype).squeeze(1)
        return out.reshape(bs, slen, dim)


class TransformerBlock(nn.Module):
    moe_enabled = True

    def __init__(self, layer_id: int, a: Qwen3Args):
        super().__init__()
        self.attention = Attention(a)
        self.moe = MoE(a)
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        n = layer_id + 1 if a.depth_init else a.n_layers
        self.weight_init_std = 0.02 / (2 * n) ** 0.5

    def init_weights(self, buffer_device: torch.device) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.moe.init_weights(self.weight_init_std, buffer_device)

    def forward(self, x: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope_cache)
        return x + self.moe(self.ffn_norm(x))


class Qwen3MoE(nn.Module):
    def __init__(self, a: Qwen3Args):
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.register_buffer("rope_cache", precompute_rope_cache(a.head_dim, a.max_seq_len, a.rope_theta), False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device) -> None:
        with torch.device(buffer_device):
            self.rope_cache = precompute_rope_cache(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta)
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            (getattr(layer, "_orig_mod", layer)).init_weights(buffer_device)
        self.norm.reset_parameters()
        std = self.args.dim**-0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope_cache)
        return self.output(self.norm(h))


def apply_compile(model: Qwen3MoE) -> None:
    """llama4 apply_compile for MoE blocks: each child compiled (fullgraph); in the MoE all but the experts."""
    torch._dynamo.config.capture_scalar_outputs = True
    for block in model.layers.values():
        block = getattr(block, "_checkpoint_wrapped_module", block)
        for name, sub in list(block.named_children()):
            if isinstance(sub, MoE):
                for moe_name, moe_sub in list(sub.named_children()):
                    if moe_name != "experts":
                        setattr(sub, moe_name, torch.compile(moe_sub, fullgraph=True))
            else:
                setattr(block, name, torch.compile(sub, fullgraph=True))


def active_params(model: nn.Module, a: Qwen3Args) -> int:
    """Parameters a token passes through, embedding excluded: total minus the unrouted experts' share."""
    n = sum(p.numel() for p in model.parameters())
    n_emb = sum(p.numel() for p in model.tok_embeddings.parameters())
    expert = 3 * a.dim * a.moe_inter_dim
    return n - n_emb - len(model.layers) * expert * (a.num_experts - a.top_k)


def flops_per_step(a: Qwen3Args, model: nn.Module, batch: int, seq: int) -> int:
    """torchtitan's get_moe_model_nparams_and_flops: 6 x active params per token + attention (not halved)."""
    per_token = 6 * active_params(model, a) + 6 * len(model.layers) * a.n_heads * 2 * a.head_dim * seq
    return per_token * batch * seq
