"""MoE, MLA and attention-variant modelling: ground truth from PyTorch FLOP counting and from first
principles (brute-force counts), plus memory invariants."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardscope
from shardscope.graph.build import build_stage_graph
from shardscope.graph.ops import TokenFanout
from shardscope.graph.routing import (
    bin_hit_probability,
    expected_max_normal,
    expected_pad_rows,
    expert_popularity,
    routing_load,
    sampling_excess,
)
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.spec import LayerKind
from shardscope.plan.plan import make_plan

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from torch_reference import AtenBytes, ElementwiseBytes, MLAAttention, bf16_module, saved_activation_bytes  # noqa: E402


def _graph(name, gpus=8, **kw):
    m = load_model(name)
    plan = make_plan(m, make_cluster("H100", gpus), **({"global_batch": gpus, "seq_len": 4096} | kw))
    return m, plan, build_stage_graph(m, plan)


def _gemm_flops(group, prefix=""):
    return sum(op.flops for op in group.ops if op.kind == "gemm" and op.name.startswith(prefix))


def test_moe_layer_flops_match_pytorch():
    """A real MoE block (router, balanced top-k dispatch, experts as a batched GEMM, shared expert) under
    FakeTensorMode: FlopCounterMode's count equals the graph's GEMM FLOPs for that block."""
    m, plan, g = _graph("deepseek-v2-lite", gpus=1)
    moe = m.moe
    t, h, e, k, f = 4096, m.hidden, moe.experts, moe.top_k, moe.expert_ffn
    with FakeTensorMode():
        x = torch.randn(t, h, dtype=torch.bfloat16)
        router = torch.randn(h, e, dtype=torch.bfloat16)
        w_gate_up = torch.randn(e, h, 2 * f, dtype=torch.bfloat16)
        w_down = torch.randn(e, f, h, dtype=torch.bfloat16)
        s_gate_up = torch.randn(h, 2 * moe.shared_ffn, dtype=torch.bfloat16)
        s_down = torch.randn(moe.shared_ffn, h, dtype=torch.bfloat16)
        with FlopCounterMode(display=False) as counter:
            _ = x @ router
            # force-balanced routing (as the benchmarks force): every expert gets t·k/e tokens
            routed = x.repeat_interleave(k, dim=0).view(e, t * k // e, h)
            gu = torch.bmm(routed, w_gate_up)
            act = torch.nn.functional.silu(gu[..., :f]) * gu[..., f:]
            _ = torch.bmm(act, w_down)
            sgu = x @ s_gate_up
            _ = (torch.nn.functional.silu(sgu[:, : moe.shared_ffn]) * sgu[:, moe.shared_ffn :]) @ s_down
        measured = counter.get_total_flops()
    moe_layer = g.layers[LayerKind("full", "moe")]
    predicted = sum(
        op.flops for op in moe_layer.ops if op.kind == "gemm" and op.name.split()[0] in ("router", "experts", "shared")
    )
    assert predicted == pytest.approx(measured, rel=1e-9)


class _WeightedSwiGLU(torch.autograd.Function):
    """Megatron-Core's fused SwiGLU with the routing weights folded in (`WeightedSwiGLUFunction`): saves
    its input and the weights."""

    @staticmethod
    def forward(ctx, gate_up, weights):
        ctx.save_for_backward(gate_up, weights)
        gate, up = gate_up.chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up * weights).to(gate_up.dtype)

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - memory tests never run backward
        raise NotImplementedError


@pytest.mark.parametrize("fused", [False, True])
def test_moe_saved_activations_match_pytorch(fused):
    """What a real MoE block (router, top-k, permute, experts as batched GEMMs, un-permute) keeps for
    backward under FakeTensorMode equals the graph's saved tensors from the router on. Unfused: the
    weighted sum after the experts keeps their outputs. Fused (Megatron-Core): the activation keeps its
    input and the routing weights instead. Index tensors (int64, 8 bytes per token-expert pair) and the
    unfused path's bf16 copy of the weights are all the graph leaves out."""
    m, plan, g = _graph("qwen3-30b-a3b", gpus=1, fused_activation=fused)
    moe = m.moe
    t, h, e, k, f = 4096, m.hidden, moe.experts, moe.top_k, moe.expert_ffn
    with FakeTensorMode():
        x = torch.randn(t, h, dtype=torch.bfloat16, requires_grad=True)  # the MLP norm's output
        router = torch.randn(e, h, dtype=torch.bfloat16, requires_grad=True)
        w_gate_up = torch.randn(e, h, 2 * f, dtype=torch.bfloat16, requires_grad=True)
        w_down = torch.randn(e, f, h, dtype=torch.bfloat16, requires_grad=True)
        probs = torch.softmax(torch.nn.functional.linear(x, router).float(), dim=-1)
        top_p, top_i = torch.topk(probs, k, dim=-1)
        order = torch.argsort(top_i.flatten())  # token-expert pairs grouped by expert (balanced)
        rows = torch.div(order, k, rounding_mode="floor")
        routed = x.index_select(0, rows).view(e, t * k // e, h)
        weights = top_p.flatten().index_select(0, order).view(e, t * k // e, 1)
        gate_up = torch.bmm(routed, w_gate_up)
        if fused:
            out = torch.bmm(_WeightedSwiGLU.apply(gate_up, weights), w_down)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            out = torch.bmm(torch.nn.functional.silu(gate) * up, w_down) * weights.to(x.dtype)
        y = torch.zeros_like(x).scatter_add(0, rows.unsqueeze(1).expand(-1, h), out.view(t * k, h))
        measured, _ = saved_activation_bytes(y, [x, router, w_gate_up, w_down])
    saved = g.layers[LayerKind("full", "moe")].saved
    start = next(i for i, s in enumerate(saved) if s.name == "router probabilities")
    predicted = sum(s.bytes for s in saved[start:] if "none" in s.policies and s.name != "moe output")
    uncounted = 3 * 8 * t * k + (0 if fused else 2 * t * k)  # top-k indices, sort order, rows; bf16 weights
    assert predicted == measured - uncounted, (measured, predicted)


def test_expert_bias_traffic_matches_pytorch():
    """GPT-OSS's expert down-projection bias, added as Megatron-Core's TEGroupedMLP adds it (per expert,
    weighted by the fp32 routing probability, concatenated, cast back): the graph's bytes equal what the
    eager ATen ops read and write, forward and backward, at full size under FakeTensorMode, and its
    launches what they run (2 per expert and 2 forward; 6 per expert and 3 backward)."""
    model = load_model("gpt-oss-120b")
    plan = make_plan(model, make_cluster("B200", 64), ep=8, global_batch=64, micro_batch=1, seq_len=4096)
    graph = build_stage_graph(model, plan)
    layer = next(g for k, g in graph.layers.items() if k.mlp == "moe")
    bias_op = next(op for op in layer.ops if op.name == "experts down proj bias (fp32)")
    experts, h = model.moe.experts // plan.ep, model.hidden
    rows = plan.seq_len * model.moe.top_k // experts  # rows per local expert at the mean load
    load = graph.routing.hot_rank_factor  # the busiest rank's rows / the mean
    with FakeTensorMode():
        out = torch.empty(experts * rows, h, dtype=torch.bfloat16, requires_grad=True)
        biases = [torch.empty(h, dtype=torch.bfloat16, requires_grad=True) for _ in range(experts)]
        probs = torch.empty(experts * rows, 1, requires_grad=True)
        with AtenBytes() as fwd:
            chunks = zip(torch.split(out, rows), biases, torch.split(probs, rows), strict=True)
            y = torch.cat([t + b * p for t, b, p in chunks]).to(torch.bfloat16)
        grad = torch.empty_like(y)
        with AtenBytes() as bwd:
            y.backward(grad)
    assert bias_op.bytes == pytest.approx(load * fwd.total, rel=0.01)
    assert bias_op.bwd_bytes == pytest.approx(load * bwd.total, rel=0.01)
    assert (bias_op.launches, bias_op.bwd_launches) == (fwd.kernels, bwd.kernels)


def _fp8_moe_layer(**kw):
    model = load_model("qwen3-30b-a3b")
    plan = make_plan(model, make_cluster("H100", 16), ep=16, global_batch=64, seq_len=4096, precision="fp8", **kw)
    graph = build_stage_graph(model, plan)
    return model, plan, graph, next(g for k, g in graph.layers.items() if k.mlp == "moe")


def test_fp8_expert_padding_copies_match_pytorch():
    """Unpadded expert counts in FP8: Transformer Engine's Fp8Padding copies the experts' input rows and
    routing weights into a buffer padded per expert, Fp8Unpadding copies the output back, and backward
    copies the gradients the other way. The graph's pad and unpad ops move the bytes of those copies (an
    index-select of each row into, and out of, the padded buffer) at full size under FakeTensorMode."""
    model, plan, graph, layer = _fp8_moe_layer()
    pad, unpad = (next(op for op in layer.ops if op.name == name) for name in ("experts fp8 pad", "experts fp8 unpad"))
    experts, h = model.moe.experts // plan.ep, model.hidden
    rows = experts * (plan.seq_len * model.moe.top_k // experts)  # routed rows a rank computes at the mean load
    load = graph.routing.hot_rank_factor
    with FakeTensorMode():
        tokens = torch.empty(rows, h, dtype=torch.bfloat16)
        probs = torch.empty(rows, 1)
        where = torch.arange(rows)  # each row's source (the few rows of padding aside)
        with AtenBytes() as pad_fwd:
            tokens.index_select(0, where), probs.index_select(0, where)
        with AtenBytes() as unpad_fwd:
            tokens.index_select(0, where)
    index_bytes = 8 * rows  # the emulation's int64 row indices; TE's kernels take per-expert splits
    assert pad.bytes == pytest.approx(load * (pad_fwd.total - 2 * index_bytes), rel=0.01)
    assert unpad.bytes == pytest.approx(load * (unpad_fwd.total - index_bytes), rel=0.01)
    assert (pad.bwd_bytes, unpad.bwd_bytes) == (pad.bytes, unpad.bytes)  # the same copies, reversed


def test_fp8_expert_padding_is_skipped_where_the_counts_come_padded():
    """The router's padding (`moe_router_padding_for_quantization`) or HybridEP's padded dispatch leave
    Transformer Engine nothing to copy; the router's padding moves the dispatcher's wait before the
    permute ("before_permutation_1"), since the counts now size it. BF16 never pads."""

    def padded(layer) -> bool:
        return any(op.name in ("experts fp8 pad", "experts fp8 unpad") for op in layer.ops)

    assert padded(_fp8_moe_layer()[3])
    router = _fp8_moe_layer(moe_router_padding=True)[3]
    assert not padded(router)
    assert [op.name for op in router.ops if op.host_sync] == ["permute"]
    assert not any(c.host_sync for c in router.comms)
    assert not padded(_fp8_moe_layer(ep_dispatch="hybridep")[3])
    model = load_model("qwen3-30b-a3b")
    bf16 = make_plan(model, make_cluster("H100", 16), ep=16, global_batch=64, seq_len=4096)
    assert not padded(next(g for k, g in build_stage_graph(model, bf16).layers.items() if k.mlp == "moe"))
    est = {
        pad: shardscope.estimate(
            "qwen3-30b-a3b", gpu="H100", gpus=16, ep=16, global_batch=64, precision="fp8", moe_router_padding=pad
        )
        for pad in (False, True)
    }
    assert est[False].step_time_s > est[True].step_time_s


def test_router_padding_rows_match_megatron_padding_of_random_routing():
    """Megatron-Core's router padding (`pad_routing_map`, core_v0.16 moe_utils.py) turns the first zeros of
    each expert's routing-map row into ones until its count is a multiple of the FP8 alignment. Run on
    force-balanced routing (top-k of random normal logits, as `RandomSTE`), the rows it adds match
    `expected_pad_rows` for every expert; the graph dispatches and computes them."""
    tokens, experts, k, align = 4096, 256, 8, 32  # DeepSeek-V3, one GPU's micro-batch, MXFP8
    gen = torch.Generator().manual_seed(0)
    added = []
    for _ in range(24):
        top = torch.randn(tokens, experts, generator=gen).topk(k, dim=1).indices
        routing = torch.zeros(tokens, experts, dtype=torch.int64).scatter_(1, top, 1).T  # [experts, tokens]
        to_pad = (-routing.sum(1)) % align
        mask = torch.cumsum((routing == 0).int(), dim=1) <= to_pad.unsqueeze(1)
        padded = routing.clone()
        padded[mask & (routing == 0)] = 1
        assert bool((padded.sum(1) % align == 0).all())
        added.append(float(padded.sum() - routing.sum()))
    expected = experts * expected_pad_rows(tokens, k / experts, align)
    assert sum(added) / len(added) == pytest.approx(expected, rel=0.02)
    model = load_model("deepseek-v3")
    rows = {}
    for pad in (False, True):
        plan = make_plan(
            model, make_cluster("GB200", 256), ep=64, pp=4, global_batch=256, seq_len=tokens, precision="fp8",
            fp8_recipe="mxfp8", moe_router_padding=pad,
        )  # fmt: skip
        graph = build_stage_graph(model, plan, "blackwell")
        layer = next(g for kind, g in graph.layers.items() if kind.mlp == "moe")
        up = next(op for op in layer.ops if op.name == "experts gate/up proj")
        dispatch = next(c for c in layer.comms if c.name == "ep dispatch all-to-all")
        rows[pad] = (up.mnk[0], dispatch.bytes)
    extra = (tokens * k + expected) / (tokens * k)  # the pairs each GPU sends, padded over unpadded
    assert rows[True][0] == pytest.approx(extra * rows[False][0], rel=1e-3)
    assert rows[True][1] == pytest.approx(extra * rows[False][1], rel=1e-9)


def _megatron_rope(t: torch.Tensor, freqs: torch.Tensor, mscale: float) -> torch.Tensor:
    """Megatron-Core's unfused RoPE (`_apply_rotary_pos_emb_bshd`, core_v0.16.0), written out."""
    rot = freqs.shape[-1]
    t, t_pass = t[..., :rot], t[..., rot:]
    cos, sin = ((f(freqs) * mscale).to(t.dtype) for f in (torch.cos, torch.sin))
    x1, x2 = torch.chunk(t, 2, dim=-1)
    return torch.cat(((t * cos) + (torch.cat((-x2, x1), dim=-1) * sin), t_pass), dim=-1)


def test_unfused_yarn_rope_matches_pytorch():
    """GPT-OSS's YaRN RoPE runs unfused (Megatron-Bridge fuses plain "rope" only): the graph's rope op
    moves the bytes and runs the kernels of Megatron-Core's eager path on q and k, forward and backward,
    at full size under FakeTensorMode. Plain RoPE stays one fused kernel."""
    model = load_model("gpt-oss-120b")
    plan = make_plan(model, make_cluster("B200", 64), ep=8, global_batch=128, micro_batch=2, seq_len=4096)
    layer = next(iter(build_stage_graph(model, plan).layers.values()))
    rope = next(op for op in layer.ops if op.name.startswith("rope"))
    fwd, bwd = ElementwiseBytes(), ElementwiseBytes()
    s, b, hd = plan.seq_len, plan.micro_batch, model.head_dim
    with FakeTensorMode():
        freqs = torch.empty(s, 1, 1, hd)
        for heads in (model.heads, model.kv_heads):
            x = torch.empty(s, b, heads, hd, dtype=torch.bfloat16, requires_grad=True)
            with fwd:
                y = _megatron_rope(x, freqs, 1.35)
            grad = torch.empty_like(y)
            with bwd:
                y.backward(grad)
    assert rope.bytes == pytest.approx(fwd.total, rel=0.01)
    assert rope.bwd_bytes == pytest.approx(bwd.total, rel=0.01)
    assert (rope.launches, rope.bwd_launches) == (fwd.kernels, bwd.kernels)
    llama = load_model("llama3-8b")
    dense = build_stage_graph(llama, make_plan(llama, make_cluster("H100", 8), global_batch=8))
    assert [op.launches for op in next(iter(dense.layers.values())).ops if op.name.startswith("rope")] == [1]


def test_gpt_oss_glu_clamp_matches_pytorch():
    """GPT-OSS clamps gate and up (`swiglu_limit` 7) in eager PyTorch before Megatron-Core's fused GLU:
    the graph's clamp op has the bytes and kernels of those ATen ops forward and backward, and the copy
    it adds to the saved activations is the clamped tensor the GLU keeps (the clamps keep their input,
    the gate/up output already saved)."""
    model = load_model("gpt-oss-120b")
    assert model.glu_clamp == 7.0
    plan = make_plan(model, make_cluster("B200", 64), ep=8, global_batch=64, micro_batch=1, seq_len=4096)
    graph = build_stage_graph(model, plan)
    layer = next(g for k, g in graph.layers.items() if k.mlp == "moe")
    clamp = next(op for op in layer.ops if op.name == "experts gate, up clamp")
    clamped = next(s for s in layer.saved if s.name == "experts clamped gate, up")
    rows = plan.seq_len * model.moe.top_k  # token-expert pairs a rank computes at the mean load
    load = graph.routing.hot_rank_factor  # the busiest rank's pairs / the mean
    ffn = model.moe.expert_ffn
    with FakeTensorMode():
        y = torch.empty(rows, 2 * ffn, dtype=torch.bfloat16, requires_grad=True)
        with AtenBytes() as fwd:
            gate, up = y.chunk(2, -1)
            out = torch.cat((gate.clamp(max=model.glu_clamp), up.clamp(-model.glu_clamp, model.glu_clamp)), -1)
        grad = torch.empty_like(out)
        with AtenBytes() as bwd:
            out.backward(grad)
    assert clamp.bytes == pytest.approx(load * fwd.total, rel=1e-6)
    assert clamp.bwd_bytes == pytest.approx(load * bwd.total, rel=1e-6)
    assert (clamp.launches, clamp.bwd_launches) == (3, 7)
    assert clamped.bytes == pytest.approx(load * out.numel() * out.element_size(), rel=1e-9)
    qwen = load_model("qwen3-30b-a3b")
    graph = build_stage_graph(qwen, make_plan(qwen, make_cluster("B200", 8), ep=8, global_batch=8))
    assert qwen.glu_clamp == 0 and not any("clamp" in op.name for g in graph.layers.values() for op in g.ops)


def test_all_to_all_dispatcher_sorts_chunks_by_local_expert():
    """Megatron-Core's all-to-all dispatcher receives rows grouped by source rank and sorts them by local
    expert (`sort_chunks_by_idxs`), restoring the order before the combine. Its unfused form, a split and
    a concatenation in a new order, moves what the graph's ops move (the routing weights aside); the
    dispatchers that permute on arrival (DeepEP/HybridEP), a single local expert and no EP do not sort."""
    model = load_model("qwen3-30b-a3b")
    plan = make_plan(model, make_cluster("H100", 8), ep=8, global_batch=8, seq_len=4096, ep_dispatch="flat")
    graph = build_stage_graph(model, plan)
    layer = next(g for k, g in graph.layers.items() if k.mlp == "moe")
    ops = {op.name: op for op in layer.ops}
    local, rows = model.moe.experts // plan.ep, plan.seq_len * model.moe.top_k  # at the mean load
    load = graph.routing.hot_rank_factor
    with FakeTensorMode():
        received = torch.empty(rows, model.hidden, dtype=torch.bfloat16)
        chunks = torch.split(received, rows // (plan.ep * local))  # one chunk per (source rank, expert)
        order = [r * local + e for e in range(local) for r in range(plan.ep)]
        with AtenBytes() as moved:
            torch.cat([chunks[i] for i in order])
    assert ops["sort chunks by expert"].bwd_bytes == pytest.approx(load * moved.total, rel=1e-9)
    assert ops["unsort chunks"].bytes == ops["unsort chunks"].bwd_bytes == pytest.approx(load * moved.total, rel=1e-9)
    # and the fp32 weights
    assert ops["sort chunks by expert"].bytes == pytest.approx(load * (moved.total + 2 * 4 * rows), rel=1e-9)
    one_per_rank = dataclasses.replace(model, moe=dataclasses.replace(model.moe, experts=8))
    for m, kw in ((model, dict(ep_dispatch="deepep")), (model, dict(ep=1)), (one_per_rank, {})):
        other = make_plan(m, make_cluster("H100", 8), **(dict(ep=8, global_batch=8, ep_dispatch="flat") | kw))
        graph = build_stage_graph(m, other)
        assert not any("chunks" in op.name for g in graph.layers.values() for op in g.ops), kw


def test_mla_projection_flops_match_pytorch():
    """DeepSeek-V3 MLA projections (q down/up, kv down/up, out) counted by FlopCounterMode."""
    m, plan, g = _graph("deepseek-v3", gpus=1)
    a, nh, t, h = m.mla, m.heads, 4096, m.hidden
    with FakeTensorMode():
        x = torch.randn(t, h, dtype=torch.bfloat16)
        mats = [
            (h, a.q_lora_rank),
            (a.q_lora_rank, nh * a.qk_head_dim),
            (h, a.kv_lora_rank + a.qk_rope_head_dim),
            (a.kv_lora_rank, nh * (a.qk_nope_head_dim + a.v_head_dim)),
            (nh * a.v_head_dim, h),
        ]
        ws = [torch.randn(i, o, dtype=torch.bfloat16) for i, o in mats]
        with FlopCounterMode(display=False) as counter:
            q = (x @ ws[0]) @ ws[1]
            kv = x @ ws[2]
            _ = kv[:, : a.kv_lora_rank] @ ws[3]
            _ = torch.randn(t, nh * a.v_head_dim, dtype=torch.bfloat16) @ ws[4]
        measured = counter.get_total_flops()
    layer = g.layers[LayerKind("full", "dense")]
    names = ("q down proj", "q up proj", "kv down proj", "kv up proj", "out proj")
    predicted = sum(op.flops for op in layer.ops if op.name in names)
    assert q.shape[-1] == nh * a.qk_head_dim
    assert predicted == pytest.approx(measured, rel=1e-9)


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2-lite", "kimi-k2"])
def test_mla_saved_activations_match_pytorch(name):
    """What a real MLA attention block (`torch_reference.MLAAttention`: Megatron-Core's latent norms and
    up-projections, the RoPE key shared by every head, flash attention over q/k of 192 and v of 128
    per head) keeps for backward at full size under FakeTensorMode equals the graph's attention half,
    to the byte: its latents, q, k, v and output, the residual the MLP's norm keeps. The kv latent is
    kept as the norm's contiguous copy, without the RoPE key beside it in the down-projection's output."""
    m = load_model(name)
    a, s = m.mla, 4096
    with FakeTensorMode():
        dims = (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim)
        block = bf16_module(lambda: MLAAttention(m.hidden, m.heads, *dims))
        x = torch.randn(1, s, m.hidden, dtype=torch.bfloat16, requires_grad=True)
        cos, sin = (torch.randn(s, 1, a.qk_rope_head_dim, dtype=torch.bfloat16) for _ in range(2))
        measured, _ = saved_activation_bytes(block(x, cos, sin), [*block.parameters(), cos, sin])
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, seq_len=s)
    saved = build_stage_graph(m, plan).layers[LayerKind("full", "dense")].saved
    end = next(i for i, x in enumerate(saved) if x.name == "attn residual (mlp norm input)")
    predicted = sum(x.bytes for x in saved[: end + 1] if "none" in x.policies)
    predicted += next(x.bytes for x in saved if x.name == "mlp norm stats")
    assert predicted == measured


@pytest.mark.parametrize("kind,window,s", [("window", 128, 4096), ("chunk", 8192, 32768), ("full", 0, 1024)])
def test_keys_per_query_brute_force(kind, window, s):
    m = load_model("gpt-oss-20b")
    m = dataclasses.replace(m, attention_window=window)
    if kind == "window":
        brute = sum(min(i + 1, window) for i in range(s)) / s
    elif kind == "chunk":
        brute = sum((i % window) + 1 for i in range(s)) / s
    else:
        brute = sum(i + 1 for i in range(s)) / s
    assert m.keys_per_query(LayerKind(kind, "dense"), s) == pytest.approx(brute)


def test_all_to_all_volume_for_balanced_routing():
    """Flat dispatch sends every token-expert pair's bf16 row; the busiest rank receives the mean times
    its load factor (`graph.routing`); with a capacity cap there is no sampling excess and the volume is
    exactly the mean."""
    for kw, load in ((dict(), None), (dict(capacity_factor=1.0), 1.0)):
        m, plan, g = _graph("qwen3-30b-a3b", gpus=8, ep=8, **kw)
        layer = g.layers[LayerKind("full", "moe")]
        dispatch = [c for c in layer.comms if c.name == "ep dispatch all-to-all"]
        tokens = plan.micro_batch * plan.seq_len  # tp = cp = 1
        load = load or g.routing.hot_rank_factor
        assert len(dispatch) == 2
        assert all(c.bytes == pytest.approx(load * tokens * m.moe.top_k * m.hidden * 2, rel=1e-12) for c in dispatch)


def test_capacity_pads_every_expert():
    """Token dropping pads each expert to its capacity (static shapes, no host sync): at c = 1.25 every rank
    runs and exchanges 1.25x the balanced rows whatever the skew, and the skew only sets what is dropped."""
    for skew in (0.0, 1.0):
        m, plan, g = _graph("qwen3-30b-a3b", gpus=8, ep=8, capacity_factor=1.25, moe_skew=skew)
        layer = g.layers[LayerKind("full", "moe")]
        up = next(op for op in layer.ops if op.name == "experts gate/up proj")
        tokens = plan.micro_batch * plan.seq_len
        assert up.mnk[0] == pytest.approx(1.25 * tokens * m.moe.top_k, rel=1e-3)
        dispatch = next(c for c in layer.comms if c.name == "ep dispatch all-to-all")
        assert dispatch.bytes == pytest.approx(1.25 * tokens * m.moe.top_k * m.hidden * 2, rel=1e-12)
        assert (g.routing.dropped_fraction > 0) == (skew > 0)


def test_unpadded_capacity_runs_the_kept_tokens_and_waits():
    """Without `moe_pad_expert_input_to_capacity` Megatron-Core drops the tokens over capacity but runs
    only those kept: its all-to-all dispatcher sums the kept counts on the host first, waiting before the
    permute ("before_permutation_1", core_v0.15 token_dispatcher.py). The busiest rank runs what its
    experts keep: the dropless load with each expert capped; the drops are those of drop-and-pad; the
    Megatron export omits the pad."""
    from shardscope.planner.export import to_megatron

    for skew in (0.0, 1.0):
        kw = dict(gpus=8, ep=8, capacity_factor=1.25, moe_skew=skew)
        m, padded_plan, padded = _graph("qwen3-30b-a3b", **kw)
        _, plan, g = _graph("qwen3-30b-a3b", pad_to_capacity=False, **kw)
        _, _, dropless = _graph("qwen3-30b-a3b", gpus=8, ep=8, moe_skew=skew)
        hot, dropped = g.routing.hot_rank_factor, g.routing.dropped_fraction
        assert dropped == pytest.approx(padded.routing.dropped_fraction)
        assert 1 - dropped <= hot <= min(dropless.routing.hot_rank_factor, 1.25)  # the mean kept, the caps
        if skew == 0:  # balanced: no expert reaches its capacity, nothing dropped
            assert hot == pytest.approx(dropless.routing.hot_rank_factor) and dropped == 0
        layer, padded_layer = g.layers[LayerKind("full", "moe")], padded.layers[LayerKind("full", "moe")]
        assert [op.name for op in layer.ops if op.host_sync] == ["permute"]
        assert not any(op.host_sync for op in padded_layer.ops) and not any(c.host_sync for c in padded_layer.comms)
        up = next(op for op in layer.ops if op.name == "experts gate/up proj")
        tokens = plan.micro_batch * plan.seq_len
        assert up.mnk[0] == pytest.approx(g.routing.hot_rank_factor * tokens * m.moe.top_k, rel=1e-3)
    args = to_megatron(m, plan)
    assert "--moe-expert-capacity-factor" in args and "--moe-pad-expert-input-to-capacity" not in args
    assert "--moe-pad-expert-input-to-capacity" in to_megatron(m, padded_plan)


def _brute_bin_hit(experts: int, k: int, groups: int, per_token: int, bins: int) -> float:
    """Enumerate every group choice and every k-subset of their experts: the fraction hitting bin 0."""
    from itertools import combinations

    size = experts // groups
    hits = total = 0
    for chosen in combinations(range(groups), per_token):
        pool = [e for g in chosen for e in range(g * size, (g + 1) * size)]
        for picked in combinations(pool, k):
            total += 1
            hits += any(e < experts // bins for e in picked)
    return hits / total


@pytest.mark.parametrize(
    ("experts", "k", "groups", "per_token", "bins"),
    [(2, 1, 1, 1, 2), (16, 4, 1, 1, 4), (16, 3, 4, 2, 4), (16, 3, 4, 2, 8), (16, 3, 4, 2, 2), (24, 4, 6, 3, 3)],
)
def test_dispatch_destinations_match_enumeration(experts, k, groups, per_token, bins):
    """The chance that a token needs a given GPU (or node) equals brute-force enumeration of its expert
    choices, with and without group-limited routing (bins inside a group, equal to it, spanning several)."""
    p = bin_hit_probability(TokenFanout(experts, k, groups, per_token), bins)
    assert p == pytest.approx(_brute_bin_hit(experts, k, groups, per_token, bins))


def test_hierarchical_dispatch_sends_fewer_copies():
    """DeepEP/HybridEP send one copy per destination node (and GPU), never more than the flat all-to-all's
    k·(n-1)/n; DeepSeek-V3's group limit (4 of 8 groups) cuts the nodes a token reaches further."""
    from shardscope.costs.comm import GroupPlacement, dispatch_copies

    ep64 = GroupPlacement(64, 8)  # 8 nodes of 8 GPUs
    free = dispatch_copies(TokenFanout(256, 8), ep64)
    limited = dispatch_copies(TokenFanout(256, 8, 8, 4), ep64)
    assert free[0] < 8 * 56 / 64
    assert limited[0] < free[0]
    # a node's group is among the token's 4 of 8 with probability 1/2, then holds one of its 8 experts
    assert limited[0] == pytest.approx(7 * 0.5 * (1 - math.comb(96, 8) / math.comb(128, 8)))


def test_routing_skew_and_capacity():
    m = load_model("qwen3-30b-a3b")
    c = make_cluster("H100", 64)
    base = dict(global_batch=64, seq_len=4096, ep=64)
    balanced = routing_load(m, make_plan(m, c, **base))
    skewed = routing_load(m, make_plan(m, c, moe_skew=1.0, **base))
    capped = routing_load(m, make_plan(m, c, moe_skew=1.0, capacity_factor=1.25, **base))
    # balanced on average: 4096 tokens a rank at top-8 of 128 leave the busiest of 64 ranks ~1.2% over
    excess = sampling_excess(128, 8, 2, 64, 64 * 4096)
    assert balanced.hot_rank_factor == pytest.approx(1 + excess) and 0.01 < excess < 0.015
    assert balanced.dropped_fraction == 0
    assert skewed.hot_rank_factor > 1.5
    assert 1.0 < capped.hot_rank_factor < skewed.hot_rank_factor and capped.dropped_fraction > 0
    assert sum(expert_popularity(128, 1.0)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("experts", "top_k", "ep", "tokens"), [(64, 6, 16, 1024), (128, 8, 8, 1024), (32, 4, 4, 512), (16, 2, 2, 512)]
)
def test_forced_balance_busiest_rank_matches_random_logit_routing(experts, top_k, ep, tokens):
    """Megatron-Core's force-balanced benchmarks route on random normal logits (`RandomSTE`): the busiest
    EP rank's load over the mean, averaged over draws of exactly that routing (normal logits, top-k,
    counts per rank), matches 1 + σ·E[max of ep normals]/sqrt(1 − 1/ep) within 15% of the excess."""
    gen = torch.Generator().manual_seed(0)
    per_rank, excess = experts // ep, []
    for _ in range(200):
        picked = torch.randn(ep * tokens, experts, generator=gen).topk(top_k, dim=1).indices
        load = torch.bincount(picked.flatten(), minlength=experts).view(ep, per_rank).sum(1).double()
        excess.append((load.max() / load.mean()).item() - 1)
    measured = sum(excess) / len(excess)
    assert sampling_excess(experts, top_k, per_rank, ep, ep * tokens) == pytest.approx(measured, rel=0.15)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)  # E[max of 2] = 1/√π


def test_skew_slows_the_step():
    kw = dict(gpu="H100", gpus=64, ep=64, global_batch=64, seq_len=4096)
    assert (
        shardscope.estimate("qwen3-30b-a3b", moe_skew=1.0, **kw).step_time_s
        > shardscope.estimate("qwen3-30b-a3b", **kw).step_time_s
    )


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from(["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"])
)
def test_more_ep_never_raises_expert_memory(ep, name):
    m = load_model(name)
    if m.moe.experts % ep or 64 % ep:
        return
    kw = dict(gpu="H100", gpus=64, global_batch=64, seq_len=2048, zero=1)
    low = shardscope.estimate(name, ep=ep, **kw)
    if 2 * ep <= min(64, m.moe.experts) and m.moe.experts % (2 * ep) == 0:
        high = shardscope.estimate(name, ep=2 * ep, **kw)
        assert high.memory.params_gib <= low.memory.params_gib + 1e-9
        assert high.memory.grads_gib <= low.memory.grads_gib + 1e-9


def test_ep_errors():
    from shardscope.errors import ShardscopeError

    with pytest.raises(ShardscopeError, match="dense"):
        shardscope.estimate("llama3.1-8b", gpus=8, ep=2, global_batch=8)
    with pytest.raises(ShardscopeError, match="does not divide the 8 experts"):
        shardscope.estimate("mixtral-8x7b", gpus=16, ep=16, global_batch=16)


def test_deepseek_v3_plan_from_the_issue():
    e = shardscope.estimate(
        "deepseek-v3",
        gpu="H100",
        gpus=1024,
        ep=64,
        pp=16,
        global_batch=1024,
        seq_len=4096,
        precision="fp8",
        fp8_recipe="blockwise",
        zero=1,
        mtp=True,
    )
    assert e.params.total == 671026419200 and 37e9 < e.params.active < 38e9
    assert e.step_time_s > 0 and 0 < e.mfu < 1


def test_ep_overlap_follows_megatron_rules():
    """Megatron-Core's combined-1F1B all-to-all overlap needs EP, pp 1 or an interleaved pipeline, and no
    full recompute (TransformerConfig's checks): other plans are rejected with one clear line."""
    from shardscope.errors import ShardscopeError

    kw = dict(gpus=16, ep=8, global_batch=64, seq_len=4096, ep_comm_overlap=True)
    with pytest.raises(ShardscopeError, match="interleaved pipeline"):
        shardscope.estimate("qwen3-30b-a3b", pp=2, **kw)
    with pytest.raises(ShardscopeError, match="recompute full"):
        shardscope.estimate("qwen3-30b-a3b", recompute="full", **kw)
    with pytest.raises(ShardscopeError, match="expert parallelism"):
        shardscope.estimate("qwen3-30b-a3b", **(kw | {"ep": 1}))
    assert shardscope.estimate("qwen3-30b-a3b", pp=2, vpp=2, **kw).step_time_s > 0


def test_ep_overlap_pairs_each_all_to_all_with_one_block():
    """Under the combined-1F1B overlap each all-to-all hides only under its paired block of the other
    micro-batch (forward dispatch under backward MLP, ...), and only the measured share of its time
    (`EP_OVERLAP_FRACTION`): what exceeds either stays exposed."""
    from shardscope.costs.comm import collective_time_s
    from shardscope.costs.efficiency import EP_OVERLAP_FRACTION
    from shardscope.step.core import _block_times, _compute_cost, paired_share, place_groups

    m = load_model("qwen3-30b-a3b")
    cluster = make_cluster("H100", 128)  # EP 128 over 16 nodes: the all-to-alls cross InfiniBand
    kw = dict(global_batch=1024, seq_len=4096, ep=128)  # 8 micro-batches: 7 of each direction paired
    plan = make_plan(m, cluster, ep_comm_overlap=True, **kw)
    graph = build_stage_graph(m, plan)
    layer = graph.layers[graph.kinds[0]]
    blocks = _block_times(_compute_cost(cluster, plan, layer, False), _compute_cost(cluster, plan, layer, True))
    groups = place_groups(cluster, plan)
    exposed = {"fwd": 0.0, "bwd": 0.0}
    capped = 0
    share = EP_OVERLAP_FRACTION  # a micro-batch with a partner (`paired_share` of them)
    assert paired_share(plan) == pytest.approx(7 / 8)
    budget = {"fwd": dict(blocks), "bwd": dict(blocks)}  # each phase's blocks, spent by the comms in turn
    for c in layer.comms:
        t = collective_time_s(cluster, c.kind, c.bytes, groups.ep, c.fanout)
        hidden = min(share * t, budget[c.phase][c.hidden_by])
        budget[c.phase][c.hidden_by] -= hidden
        exposed[c.phase] += t - hidden
        capped += hidden < share * t
    assert capped > 0  # this case is communication-bound: some blocks are too short to hide their share
    from shardscope.step.core import step_costs

    sc = step_costs(m, cluster, plan)
    cost = sc.layers[graph.kinds[0]]
    assert cost.fwd.exposed_s == pytest.approx(exposed["fwd"])
    assert cost.bwd.exposed_s == pytest.approx(exposed["bwd"])
    no_overlap = shardscope.estimate("qwen3-30b-a3b", gpu="H100", gpus=128, **kw)
    overlap = shardscope.estimate("qwen3-30b-a3b", gpu="H100", gpus=128, ep_comm_overlap=True, **kw)
    assert overlap.step_time_s < no_overlap.step_time_s


def test_ep_overlap_leaves_the_unpaired_micro_batches_exposed():
    """The combined-1F1B schedule pairs a forward with another micro-batch's backward: without a pipeline
    the first forward and the last backward run alone, so with 5 micro-batches a fifth of the all-to-alls
    has nothing to hide under; an interleaved pipeline's warm-up forwards (and cool-down backwards) are
    alone too. More micro-batches per step leave fewer alone, so less of the all-to-all is exposed."""
    from shardscope.step.core import paired_share, stage_cost, step_costs

    m = load_model("qwen3-30b-a3b")
    cluster = make_cluster("H100", 16)
    kw = dict(ep=16, seq_len=4096, ep_comm_overlap=True)
    assert paired_share(make_plan(m, cluster, global_batch=80, **kw)) == pytest.approx(4 / 5)
    interleaved = make_plan(m, cluster, pp=2, vpp=4, global_batch=1024, **(kw | {"ep": 8}))
    assert paired_share(interleaved) == pytest.approx(1 - (1 + 3 * 2) / (128 * 4))

    def exposed_per_micro_batch(global_batch: int) -> float:
        plan = make_plan(m, cluster, global_batch=global_batch, **kw)
        return stage_cost(step_costs(m, cluster, plan), m, plan, 0).exposed

    # a partner hides EP_OVERLAP_FRACTION of each all-to-all (its paired block is long enough here)
    few, many = exposed_per_micro_batch(32), exposed_per_micro_batch(1024)
    assert few > many > 0
    plan = make_plan(m, cluster, global_batch=32, **kw)
    layer = step_costs(m, cluster, plan).layers[m.layer_kinds()[0]]
    hidden = layer.fwd.paired_hidden_s + layer.bwd.paired_hidden_s
    assert few - many == pytest.approx(
        m.layers * hidden * (paired_share(make_plan(m, cluster, global_batch=1024, **kw)) - 0.5)
    )


def test_grouped_gemm_pads_each_expert_to_whole_tiles():
    """A grouped GEMM tiles every expert's rows separately: 16 experts of 100 rows fill 100/128 of their
    128-row tiles, so they run at 100/128 of the rate of 16 experts of 128 rows (same tiles, same waves)."""
    from shardscope.costs.compute import gemm_time_s
    from shardscope.costs.efficiency import gemm_fraction

    gpu = make_cluster("H100", 8).gpu
    per_expert = gemm_fraction(gpu, 100, 4096, 4096, groups=16)
    assert per_expert == pytest.approx(gemm_fraction(gpu, 128, 4096, 4096, groups=16) * 100 / 128)
    # whole tiles and compute-bound (each expert's own weights are a small share of the traffic): the same
    big = gemm_time_s(gpu, 8192, 4096, 4096, groups=16)
    assert big == pytest.approx(gemm_time_s(gpu, 16 * 8192, 4096, 4096), rel=0.01)


def test_mtp_modules_shard_their_experts_over_ep_and_cost_the_last_stage():
    """DeepSeek-V3's MTP module is one more MoE block: its routed experts split over EP like any other
    layer's, its parameters add up to `params_mtp`, and its block + output layer run on the last stage."""
    from shardscope.costs.memory import mtp_params_local, rank_params_local
    from shardscope.step.core import stage_cost, step_costs

    m = load_model("deepseek-v3")
    cluster = make_cluster("H100", 1024)
    kw = dict(pp=16, global_batch=1024, seq_len=4096, zero=1)
    for ep in (8, 64):
        plan = make_plan(m, cluster, ep=ep, mtp=True, **kw)
        dense, expert = mtp_params_local(m, plan)
        assert dense + expert * ep == m.params_mtp
    p8, p64 = (make_plan(m, cluster, ep=ep, mtp=True, **kw) for ep in (8, 64))
    assert mtp_params_local(m, p64)[1] * 8 == mtp_params_local(m, p8)[1]
    # the last stage also keeps a copy of the embedding the MTP module looks up
    off = make_plan(m, cluster, ep=64, **kw)
    extra = sum(rank_params_local(m, p64, 15)) - sum(rank_params_local(m, off, 15))
    assert extra == pytest.approx(sum(mtp_params_local(m, p64)) + m.vocab * m.hidden)
    # time: the last stage gains at least one MoE block's forward + backward and one output layer
    sc_on, sc_off = step_costs(m, cluster, p64), step_costs(m, cluster, off)
    gained = stage_cost(sc_on, m, p64, 15).compute - stage_cost(sc_off, m, off, 15).compute
    block = sc_on.layers[LayerKind("full", "moe")]
    head = sc_on.head_fwd.compute_s + sc_on.head_bwd.compute_s
    assert gained > block.fwd.compute_s + block.bwd.compute_s + head
    assert stage_cost(sc_on, m, p64, 0).compute == stage_cost(sc_off, m, off, 0).compute


def test_mtp_module_in_a_chunk_of_its_own():
    """Megatron-Core can give the MTP module a model chunk of its own ahead of the loss (`...|m|L`, the
    MoE report's DeepSeek-V3 H100 layout): its block, projection and embedding copy move to that chunk's
    rank, while its output layer stays with the loss; nothing is lost or counted twice."""
    from dataclasses import replace

    from shardscope.costs.memory import mtp_params_local, rank_params_local
    from shardscope.plan.layout import format_pp_layout, read_pp_layout
    from shardscope.planner.export import to_megatron
    from shardscope.sim.step import simulate_step
    from shardscope.step.core import stage_cost, step_costs

    layout = "Et*3|(tt|)*29m|L"
    assert read_pp_layout(layout) == ((3,) + (2,) * 29 + (0, 0), 30)
    assert read_pp_layout("Et*4|(t*4|)*14tmL")[1] == 15 and read_pp_layout("5,4,3")[1] == -1
    m = load_model("deepseek-v3")
    cluster = make_cluster("H100", 1024)
    kw = dict(tp=2, pp=8, vpp=4, ep=64, global_batch=8192, seq_len=4096, zero=1, mtp=True, recompute="selective")
    own = make_plan(m, cluster, pp_layout=layout, **kw)
    assert (own.mtp_chunk, own.mtp_rank) == (30, 6)
    with_loss = replace(own, mtp_chunk=-1)
    assert with_loss.mtp_rank == 7
    sc = step_costs(m, cluster, own)
    stages = {p: [stage_cost(sc, m, p, r) for r in range(8)] for p in (own, with_loss)}
    block = sc.layers[m.mtp_kind]
    mtp_block = block.fwd.compute_s + block.bwd.compute_s + block.recompute_s
    moved = stages[own][6].compute - stages[with_loss][6].compute
    assert moved == pytest.approx(stages[with_loss][7].compute - stages[own][7].compute)
    assert moved > mtp_block  # the block and the module's own ops
    assert sum(s.compute for s in stages[own]) == pytest.approx(sum(s.compute for s in stages[with_loss]))
    # parameters: the module and a copy of the embedding it looks up move to rank 6; the output layer stays
    gained = sum(rank_params_local(m, own, 6)) - sum(rank_params_local(m, with_loss, 6))
    assert gained == pytest.approx(sum(mtp_params_local(m, own)) + m.vocab * m.hidden / 2)
    assert sum(rank_params_local(m, with_loss, 7)) - sum(rank_params_local(m, own, 7)) == pytest.approx(gained)
    # the simulator places the module's chunk on rank 6 too, and the layout exports as given
    sims = {p: simulate_step(m, cluster, p).chunks for p in (own, with_loss)}
    assert sims[with_loss][30].fwd_s == 0.0 < sims[own][30].fwd_s
    assert sims[own][30].activation_bytes > 0.0 == sims[with_loss][30].activation_bytes
    assert sims[with_loss][31].fwd_s - sims[own][31].fwd_s == pytest.approx(sims[own][30].fwd_s)
    written = to_megatron(m, own)
    assert written[written.index("--pipeline-model-parallel-layout") + 1] == format_pp_layout(own.pp_layout, 1, 30)
    assert format_pp_layout(own.pp_layout, 1, 30).endswith("|m|L")


def test_megatron_pipeline_layout():
    from shardscope.errors import ShardscopeError
    from shardscope.plan.layout import read_pp_layout

    assert read_pp_layout("Et*4|(t*4|)*14tmL")[0] == (4,) * 15 + (1,)
    assert read_pp_layout("Et|(tt|)*30mL")[0] == (1,) + (2,) * 30 + (0,)
    assert read_pp_layout("5, 4,3")[0] == (5, 4, 3)
    for bad, why in (
        ("t|Et", "embedding"),
        ("tL|t", "last chunk"),
        ("Ex*4", "unknown symbol"),
        ("(t|*2", "paren"),
        ("Et|m|tL", "after the last transformer layer"),
        ("Et|tm|mL", "share one chunk"),
    ):
        with pytest.raises(ShardscopeError, match=why):
            read_pp_layout(bad)
    m = load_model("deepseek-v3")
    cluster = make_cluster("GB200", 256)
    plan = make_plan(m, cluster, pp=4, vpp=4, ep=64, global_batch=256, pp_layout="Et*4|(t*4|)*14tmL")
    ranks = plan.rank_layers(m.layers)
    # rank r runs chunks r, r+4, r+8, r+12: the last rank holds the one-layer chunk
    assert [len(r) for r in ranks] == [16, 16, 16, 13]
    assert ranks[0][:5] == (0, 1, 2, 3, 16) and ranks[3][-1] == 60
    with pytest.raises(ShardscopeError, match="16 chunks holding the 61 layers"):
        make_plan(m, cluster, pp=4, vpp=4, ep=64, global_batch=256, pp_layout="Et*4|(t*4|)*13tmL")


def test_layout_and_mtp_export_to_megatron_arguments():
    from shardscope.plan.layout import read_pp_layout
    from shardscope.planner.export import to_megatron

    m = load_model("deepseek-v3")
    layout = "Et*4|(t*4|)*14tmL"
    plan = make_plan(m, make_cluster("GB200", 256), pp=4, vpp=4, ep=64, global_batch=256, pp_layout=layout, mtp=True)
    args = to_megatron(m, plan)
    written = args[args.index("--pipeline-model-parallel-layout") + 1]
    assert read_pp_layout(written) == read_pp_layout(layout) and written.endswith("tmL")
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    plan = make_plan(
        m,
        make_cluster("GB200", 256),
        pp=4,
        ep=64,
        global_batch=256,
        recompute="selective",
        recompute_modules="mla_up_proj,moe_act",
    )
    args = to_megatron(m, plan)
    assert args[args.index("--recompute-modules") + 1 :][:2] == ["mla_up_proj", "moe_act"]


def test_megatron_recompute_modules_drop_what_they_rebuild():
    """`--recompute-modules` keeps what "none" keeps minus each module's tensors: mla_up_proj rebuilds MLA's
    q, k, v from the latents, layernorm the two norm outputs, moe_act the expert activation's outputs."""
    from shardscope.errors import ShardscopeError
    from shardscope.step.core import step_costs

    m = load_model("deepseek-v3")
    cluster = make_cluster("B200", 256)
    kw = dict(pp=16, ep=8, global_batch=256, seq_len=4096, recompute="selective")
    g = build_stage_graph(m, make_plan(m, cluster, **kw), "blackwell").layers[LayerKind("full", "moe")]
    t, nh, a = 4096, m.heads, m.mla
    none = g.saved_bytes("none")
    qkv = 2 * t * nh * (2 * a.qk_head_dim + a.v_head_dim)
    assert none - g.saved_bytes("selective", ("mla_up_proj",)) == pytest.approx(qkv, rel=1e-12)
    assert none - g.saved_bytes("selective", ("layernorm",)) == pytest.approx(2 * 2 * t * m.hidden, rel=1e-12)
    load = build_stage_graph(m, make_plan(m, cluster, **kw), "blackwell").routing.hot_rank_factor
    act = 2 * t * m.moe.top_k * m.moe.expert_ffn * (1 + 1)  # silu(gate) and swiglu out, bf16, at the mean
    assert none - g.saved_bytes("selective", ("moe_act",)) == pytest.approx(load * act, rel=1e-12)
    assert g.saved_bytes("selective", ("moe",)) < g.saved_bytes("selective", ("moe_act",))
    # recompute time: the re-run modules' forward, less than a full-layer recompute
    lite = step_costs(m, cluster, make_plan(m, cluster, recompute_modules="mla_up_proj", **kw))
    full = step_costs(m, cluster, make_plan(m, cluster, **(kw | {"recompute": "full"})))
    rec = lite.layers[LayerKind("full", "moe")].recompute_s
    assert 0 < rec < full.layers[LayerKind("full", "moe")].recompute_s
    with pytest.raises(ShardscopeError, match="unknown attn"):
        make_plan(m, cluster, recompute_modules="attn", **kw)
    with pytest.raises(ShardscopeError, match="needs --recompute selective"):
        make_plan(m, cluster, recompute_modules="moe_act", **(kw | {"recompute": "none"}))


def test_sliding_window_attention_runs_at_the_window_loop_efficiency():
    """A window of 128 keys bounds each query block's loop, so the kernel runs at the efficiency of a
    128-key loop: per FLOP, GPT-OSS's window layers cost what full attention over 128 tokens costs, and
    several times what its full layers cost at 4096."""
    from shardscope.costs.compute import op_time_s
    from shardscope.costs.efficiency import attention_fraction

    m, plan, g = _graph("gpt-oss-120b", gpus=8, ep=8)
    gpu = make_cluster("H100", 8).gpu
    attn = {kind.attention: next(op for op in u.ops if op.kind == "attention") for kind, u in g.layers.items()}
    window, full = attn["window"], attn["full"]
    assert window.kv_span == m.attention_window == 128 and full.kv_span == 0
    per_flop = {k: op_time_s(gpu, op, False, plan) / op.flops for k, op in attn.items()}
    ratio = attention_fraction(gpu, "auto", plan.seq_len, False, 64) / attention_fraction(gpu, "auto", 128, False, 64)
    assert per_flop["window"] / per_flop["full"] == pytest.approx(ratio, rel=0.05)
    assert ratio > 3


def test_fused_expert_mlp_drops_the_eager_kernels_it_fuses():
    """Transformer Engine's fused grouped MLP (Megatron-Core `use_transformer_engine_op_fuser` with
    NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, TE `ops/fused/grouped_mlp.py`) computes GPT-OSS's clamped GLU, routing
    weights and expert biases in its grouped GEMMs' epilogues and takes ragged expert groups: the graph
    keeps the GEMMs and drops the clamp, the activation kernel, the fp32 bias chain and TE's FP8 row
    padding, and the clamp's saved copy. It is MXFP8-only (so Blackwell) and needs gated MoE experts."""
    from shardscope.errors import ShardscopeError

    model = load_model("gpt-oss-120b")
    cluster = make_cluster("GB200", 64)
    kw = dict(ep=64, global_batch=256, micro_batch=4, seq_len=4096, precision="fp8", fp8_recipe="mxfp8")
    eager = make_plan(model, cluster, **kw)
    fused = make_plan(model, cluster, fused_expert_mlp=True, **kw)

    def moe_layer(plan):
        return next(g for k, g in build_stage_graph(model, plan).layers.items() if k.mlp == "moe")

    before, after = moe_layer(eager), moe_layer(fused)
    names = {op.name for op in before.ops} - {op.name for op in after.ops}
    assert names == {"experts gate, up clamp", "experts swiglu", "experts down proj bias (fp32)", "experts fp8 pad",
                     "experts fp8 unpad"}  # fmt: skip
    assert {op.name for op in after.ops if op.kind == "gemm"} == {op.name for op in before.ops if op.kind == "gemm"}
    saved = {s.name for s in before.saved} - {s.name for s in after.saved}
    assert saved == {"experts clamped gate, up"}
    assert shardscope.estimate("gpt-oss-120b", gpu="GB200", gpus=64, fused_expert_mlp=True, **kw).step_time_s < (
        shardscope.estimate("gpt-oss-120b", gpu="GB200", gpus=64, **kw).step_time_s
    )
    with pytest.raises(ShardscopeError, match="mxfp8"):
        make_plan(model, cluster, fused_expert_mlp=True, **{**kw, "fp8_recipe": "tensorwise"})
    with pytest.raises(ShardscopeError, match="gated experts"):
        make_plan(load_model("llama3-8b"), make_cluster("GB200", 8), fused_expert_mlp=True, global_batch=8,
                  precision="fp8", fp8_recipe="mxfp8")  # fmt: skip
