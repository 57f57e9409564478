"""Video diffusion transformers: exact parameter counts, video token counts, and the FLOPs and saved
activations of a real Wan block under PyTorch's FLOP counter and autograd (FakeTensorMode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardscope
from shardscope.errors import ShardscopeError
from shardscope.graph.build import build_stage_graph
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import catalog_sources, load_model
from shardscope.plan.plan import make_plan

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from torch_reference import (  # noqa: E402
    ElementwiseBytes,
    NormModulate,
    ScaleAdd,
    WanBlock,
    bf16_module,
    saved_activation_bytes,
)

CATALOG = Path(shardscope.__file__).parent / "models" / "catalog"


def test_wan_parameter_counts():
    assert load_model("wan2.1-t2v-1.3b").params_total == catalog_sources()["wan2.1-t2v-1.3b"]["params_total"]
    # Wan2.2-T2V-A14B's experts have exactly the Wan2.1-T2V-14B transformer config
    assert load_model("wan2.1-t2v-14b").params_total == catalog_sources()["wan2.1-t2v-14b"]["params_shape_identical"]


def test_hunyuanvideo_parameter_count():
    """The count diffusers' own module has for the catalog config (SOURCES.json), and Tencent's nominal 13B."""
    assert load_model("hunyuanvideo").params_total == catalog_sources()["hunyuanvideo"]["params_total"]


@pytest.mark.parametrize("name", ["hunyuanvideo", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"])
def test_dit_parameters_match_diffusers(name):
    """diffusers' transformer built from the catalog's config.json (meta device: no memory) has exactly
    the parameters the spec counts."""
    transformers = pytest.importorskip("diffusers.models.transformers")
    config = json.loads((CATALOG / f"{name}.json").read_text())
    cls = getattr(transformers, config["_class_name"])
    with torch.device("meta"):
        module = cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    assert sum(p.numel() for p in module.parameters()) == load_model(name).params_total


@pytest.mark.parametrize("kind", ["dit-double", "dit-single"])
def test_hunyuan_blocks_match_diffusers(kind):
    """A HunyuanVideo block as diffusers runs it, at full width with 4,096 video and its 256 text tokens,
    under FakeTensorMode: what autograd keeps for backward, the bytes its elementwise ATen ops move
    forward and backward, and its GEMM FLOPs equal the graph's (the per-sample adaLN projections, 0.02%
    of the FLOPs and a few kB, are not in the graph). The CPU attention kernel has no FLOP formula; the
    graph's is the non-causal joint attention over video + text tokens."""
    hv = pytest.importorskip("diffusers.models.transformers.transformer_hunyuan_video")
    m = load_model("hunyuanvideo")
    s, text, d, hd = 4096, m.dit.text_len, m.hidden, m.head_dim
    cls, rope = {
        "dit-double": (hv.HunyuanVideoTransformerBlock, "freqs_cis"),
        "dit-single": (hv.HunyuanVideoSingleTransformerBlock, "image_rotary_emb"),
    }[kind]
    with FakeTensorMode():
        block = bf16_module(lambda: cls(m.heads, hd, 4.0, "rms_norm"))
        x, context = (torch.randn(1, n, d, dtype=torch.bfloat16, requires_grad=True) for n in (s, text))
        temb = torch.randn(1, d, dtype=torch.bfloat16, requires_grad=True)
        cos, sin = torch.randn(s, hd), torch.randn(s, hd)
        with ElementwiseBytes() as fwd, FlopCounterMode(display=False) as flops:
            out = block(x, context, temb, None, **{rope: (cos, sin)})
        saved, _ = saved_activation_bytes(out[0].sum() + out[1].sum(), [*block.parameters(), cos, sin])
        grads = [torch.randn_like(o) for o in out]
        with ElementwiseBytes() as bwd:
            torch.autograd.backward(out, grads)
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, seq_len=s)
    layer = next(g for k, g in build_stage_graph(m, plan).layers.items() if k.mlp == kind)
    memory = [op for op in layer.ops if op.kind == "memory"]
    assert layer.saved_bytes("none") == pytest.approx(saved, rel=1e-3)
    assert sum(op.bytes for op in memory) == pytest.approx(fwd.total, rel=1e-3)
    assert sum(op.bwd_bytes for op in memory) == pytest.approx(bwd.total, rel=1e-3)
    gemm_flops = sum(op.flops for op in layer.ops if op.kind == "gemm")
    assert gemm_flops == pytest.approx(flops.get_total_flops(), rel=1e-3)
    (attention,) = [op for op in layer.ops if op.kind == "attention"]
    assert attention.flops == 4 * m.heads * hd * (s + text) ** 2


@pytest.mark.parametrize(
    "video,tokens", [("81x720x1280", 21 * 45 * 80), ("81x480x832", 21 * 30 * 52), ("1x480x832", 30 * 52)]
)
def test_video_tokens(video, tokens):
    e = shardscope.estimate("wan2.1-t2v-1.3b", gpus=8, fsdp=True, global_batch=8, video=video)
    assert e.plan["seq_len"] == tokens


@pytest.mark.parametrize("video", ["81x720", "0x720x1280", "axbxc"])
def test_bad_video(video):
    with pytest.raises(ShardscopeError):
        shardscope.estimate("wan2.1-t2v-1.3b", gpus=8, global_batch=8, video=video)


def test_dit_attention_is_not_causal():
    m = load_model("wan2.1-t2v-1.3b")
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, seq_len=8192)
    assert plan.causal is False
    attn = next(op for op in build_stage_graph(m, plan).layer.ops if op.name == "attention")
    assert attn.flops == pytest.approx(4 * m.heads * m.head_dim * 8192 * 8192)


def test_wan_block_flops_match_pytorch():
    """A Wan block's GEMMs and attention matmuls (self-attention over the clip, cross-attention to 512
    text tokens) counted by FlopCounterMode with the attention written as plain matmuls."""
    m = load_model("wan2.1-t2v-1.3b")
    s, d, f, text = 2048, m.hidden, m.ffn_hidden, 512
    nh, hd = m.heads, m.head_dim
    with FakeTensorMode():
        x = torch.randn(s, d, dtype=torch.bfloat16)
        ctx = torch.randn(text, d, dtype=torch.bfloat16)
        w = lambda i, o: torch.randn(i, o, dtype=torch.bfloat16)  # noqa: E731
        with FlopCounterMode(display=False) as counter:
            q, k, v = (x @ w(d, d)).view(s, nh, hd), (x @ w(d, d)).view(s, nh, hd), (x @ w(d, d)).view(s, nh, hd)
            scores = torch.einsum("qhd,khd->hqk", q, k)
            out = torch.einsum("hqk,khd->qhd", scores, v).reshape(s, d) @ w(d, d)
            cq = (out @ w(d, d)).view(s, nh, hd)
            ck, cv = (ctx @ w(d, d)).view(text, nh, hd), (ctx @ w(d, d)).view(text, nh, hd)
            cross = torch.einsum("hqk,khd->qhd", torch.einsum("qhd,khd->hqk", cq, ck), cv).reshape(s, d) @ w(d, d)
            _ = (cross @ w(d, f)) @ w(f, d)
        measured = counter.get_total_flops()
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, seq_len=s)
    layer = build_stage_graph(m, plan).layer
    predicted = sum(op.flops for op in layer.ops if op.kind in ("gemm", "attention"))
    assert predicted == pytest.approx(measured, rel=1e-9)


def test_wan_14b_plan_from_the_issue():
    e = shardscope.estimate(
        "wan2.1-t2v-14b", gpu="H100", gpus=64, cp=4, fsdp=True, global_batch=16, recompute="full", video="81x720x1280"
    )
    assert e.params.total == 14288491584
    assert e.fits and 0 < e.mfu < 1


def test_compiled_adaln_regions_keep_what_the_partitioner_keeps():
    """Megatron-DFM runs Wan's adaLN `normalize_modulate` and gated residual under torch.compile
    (Megatron-Core `jit_fuser`). What they keep for backward is what AOTAutograd's min-cut partitioner,
    with Inductor's decompositions, saves from the forward graph: the input, the scale and the fp32
    LayerNorm statistics (the normalised tensor is recomputed), and the branch output with the gate.
    The reference block's `NormModulate` and `ScaleAdd` keep exactly those."""
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def norm_modulate(x, shift, scale):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale) + shift

    def scale_add(residual, x, gate):
        return residual + gate * x

    def partitioner_keeps(fn, *args) -> list[tuple[tuple[int, ...], torch.dtype]]:
        kept = []

        def forward_compiler(gm, _):
            outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
            kept.extend((tuple(v.meta["val"].shape), v.meta["val"].dtype) for v in outputs[1:])
            return make_boxed_func(gm.forward)

        compiled = aot_function(
            fn,
            fw_compiler=forward_compiler,
            bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
            partition_fn=min_cut_rematerialization_partition,
            decompositions=select_decomp_table(),
        )
        compiled(*args)
        return kept

    def function_keeps(fn, *args) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [(tuple(t.shape), t.dtype) for t in fn.apply(*args).grad_fn.saved_tensors]

    s, d = 64, 32
    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    x, residual, branch = (torch.randn(s, 1, d, **bf16) for _ in range(3))
    shift, scale, gate = (torch.randn(1, 1, d, **bf16) for _ in range(3))
    assert sorted(partitioner_keeps(norm_modulate, x, shift, scale), key=str) == sorted(
        function_keeps(NormModulate, x, shift, scale), key=str
    )
    assert partitioner_keeps(scale_add, residual, branch, gate) == function_keeps(ScaleAdd, residual, branch, gate)


@pytest.mark.parametrize("name", ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b"])
def test_wan_block_saved_activations_match_pytorch(name):
    """What a real Wan block, built as Megatron-DFM builds it (`torch_reference.WanBlock`), keeps for
    backward at full size under FakeTensorMode equals the graph's saved tensors (to 0.1%; the rest is the
    adaLN vectors and the CPU LayerNorm's statistics): among them the cross-attention's q/k RMSNorm
    inputs, the q projection's output and the text keys, which the graph once left out (3.8% short).
    The graph runs the block as Megatron-DFM does under `--fused-activation` (else as diffusers does:
    test_state_whole `test_wan_block_memory_matches_fake_tensor`)."""
    m = load_model(name)
    s, text = 4096, m.dit.text_len
    with FakeTensorMode():
        block = bf16_module(lambda: WanBlock(m.hidden, m.heads, m.ffn_hidden))
        x, context = (torch.randn(1, n, m.hidden, dtype=torch.bfloat16, requires_grad=True) for n in (s, text))
        time_embedding = torch.randn(1, 6, m.hidden, dtype=torch.bfloat16, requires_grad=True)
        cos, sin = (torch.randn(s, m.head_dim, dtype=torch.bfloat16) for _ in range(2))
        out = block(x, context, time_embedding, cos, sin)
        # the text context is one tensor every block reads: not this block's activation
        measured, _ = saved_activation_bytes(out, [*block.parameters(), context, cos, sin])
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, seq_len=s, fused_activation=True)
    assert build_stage_graph(m, plan).layer.saved_bytes("none") == pytest.approx(measured, rel=1e-3)


def test_qk_norm_across_heads_gathers_under_tp():
    """Wan normalises q and k over all heads at once (`rms_norm_across_heads`): under TP each rank gathers
    the heads, keeps the gathered input and has one statistic per token, where a per-head norm (Qwen3)
    keeps its own heads and one statistic per head."""
    for name, across in (("wan2.1-t2v-14b", True), ("qwen3-8b", False)):
        m = load_model(name)
        assert m.qk_norm and m.qk_norm_across_heads is across
        saved = {}
        for tp in (1, 2):
            plan = make_plan(m, make_cluster("H100", tp), tp=tp, global_batch=1, seq_len=4096)
            layer = build_stage_graph(m, plan).layer
            saved[tp] = {x.name: x.bytes for x in layer.saved if x.name.startswith("q/k norm")}
            gathers = [c for c in layer.comms if c.name == "tp all-gather q/k norm"]
            assert len(gathers) == (2 if across and tp > 1 else 0)
        if across:
            assert saved[2]["q/k norm input"] == saved[1]["q/k norm input"]
            assert saved[1]["q/k norm stats"] == 4 * 2 * 4096
        else:
            assert saved[2]["q/k norm input"] == saved[1]["q/k norm input"] / 2
            assert saved[1]["q/k norm stats"] == 4 * 4096 * (m.heads + m.kv_heads)


def test_diffusers_wan_chains_match_pytorch():
    """diffusers' WanTransformerBlock runs its norms, adaLN modulation and gated residuals as eager fp32
    chains (its forward holds these expressions, checked here against the installed diffusers): each
    chain's bytes per activation value and kernels, forward and backward, are what the ATen ops read,
    write and launch at full size under FakeTensorMode. Without `--fused-activation` (Megatron-DFM's
    `jit_fuser`) the block's graph carries them in place of the fused norms, residuals and modulation."""
    import inspect

    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    from shardscope.graph.dit import DIFFUSERS_WAN_CHAINS

    source = inspect.getsource(WanTransformerBlock.forward)
    for line in (
        "(self.norm1(hidden_states.float()) * (1 + scale_msa) + shift_msa).type_as(hidden_states)",
        "(hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)",
        "self.norm2(hidden_states.float()).type_as(hidden_states)",
        "(hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)",
    ):
        assert line in source, line
    t, h = 4096, 5120

    def modulate(x, out, shift, scale, gate, weight, bias):
        return (F.layer_norm(x.float(), (h,), None, None, 1e-6) * (1 + scale) + shift).type_as(x)

    chains = {
        "attn norm": modulate,
        "attn residual add": lambda x, out, shift, scale, gate, w, b: (x.float() + out * gate).type_as(x),
        "cross-attn norm": lambda x, o, sh, sc, g, w, b: F.layer_norm(x.float(), (h,), w.float(), b.float()).type_as(x),
        "mlp norm": modulate,
        "mlp residual add": lambda x, out, shift, scale, gate, w, b: (x.float() + out.float() * gate).type_as(x),
    }
    with FakeTensorMode():
        for replaced, chain in chains.items():
            x = torch.empty(1, t, h, dtype=torch.bfloat16, requires_grad=True)
            out = torch.empty(1, t, h, dtype=torch.bfloat16, requires_grad=True)  # a sub-block's output
            shift, scale, gate = (torch.empty(1, 1, h, requires_grad=True) for _ in range(3))  # fp32 adaLN
            weight, bias = torch.empty(h, requires_grad=True), torch.empty(h, requires_grad=True)
            fwd, bwd = ElementwiseBytes(), ElementwiseBytes()
            with fwd:
                y = chain(x, out, shift, scale, gate, weight, bias)
            grad = torch.empty_like(y)
            with bwd:
                y.backward(grad)
            _, fwd_bytes, fwd_kernels, bwd_bytes, bwd_kernels = DIFFUSERS_WAN_CHAINS[replaced]
            assert (fwd.total / (t * h), fwd.kernels) == (pytest.approx(fwd_bytes, abs=0.05), fwd_kernels)
            assert (bwd.total / (t * h), bwd.kernels) == (pytest.approx(bwd_bytes, abs=0.05), bwd_kernels)
    m = load_model("wan2.1-t2v-14b")
    for fused in (False, True):
        plan = make_plan(m, make_cluster("H100", 8), global_batch=8, seq_len=4096, fused_activation=fused)
        names = {op.name for op in build_stage_graph(m, plan).layer.ops}
        eager = {chain[0] for chain in DIFFUSERS_WAN_CHAINS.values()}
        assert (eager <= names) is not fused and bool(eager & names) is not fused
        assert any(n.startswith("adaLN modulate") for n in names) is fused


def test_hunyuan_eager_regions_stream_at_the_aten_rate():
    """HunyuanVideo's blocks are diffusers' eager modules: the regions over broadcast or mixed-precision
    operands (norm + modulate, q/k RMSNorm with fp32 statistics, fp32 RoPE, gated residuals) stream at
    the measured eager-ATen rate, the plain copies, gradient sums and GELU at the fused kernels' rate."""
    m = load_model("hunyuanvideo")
    plan = make_plan(m, make_cluster("H100", 8), global_batch=8, seq_len=4096)
    ops = [op for g in build_stage_graph(m, plan).layers.values() for op in g.ops if op.kind == "memory"]
    aten = {op.name for op in ops if op.aten}
    assert any("rope" in n for n in aten) and any("gated residual" in n for n in aten)
    assert not any("gelu" in op.name or "concat" in op.name for op in ops if op.aten)
