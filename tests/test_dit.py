"""Video diffusion transformers: exact parameter counts, video token counts, and the FLOPs of a real
Wan block under PyTorch's FLOP counter."""

from __future__ import annotations

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


def test_wan_parameter_counts():
    assert load_model("wan2.1-t2v-1.3b").params_total == catalog_sources()["wan2.1-t2v-1.3b"]["params_total"]
    # Wan2.2-T2V-A14B's experts have exactly the Wan2.1-T2V-14B transformer config
    assert load_model("wan2.1-t2v-14b").params_total == catalog_sources()["wan2.1-t2v-14b"]["params_shape_identical"]


def test_hunyuanvideo_is_about_13b():
    assert 12.5e9 < load_model("hunyuanvideo").params_total < 13.5e9  # "over 13 billion" (nominal)


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
