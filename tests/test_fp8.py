import pytest

import shardscope
from shardscope.errors import ShardscopeError
from shardscope.graph.build import build_stage_graph
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.plan.plan import make_plan

COMMON = dict(gpu="H100", gpus=64, tp=4, pp=2, global_batch=64, seq_len=8192)


def test_fp8_is_faster_but_not_2x():
    bf16 = shardscope.estimate("llama3.1-70b", **COMMON)
    fp8 = shardscope.estimate("llama3.1-70b", precision="fp8", **COMMON)
    speedup = bf16.step_time_s / fp8.step_time_s
    assert 1.1 < speedup < 2.0  # attention, output layer, casts and comm stay at BF16 speed
    assert fp8.mfu < bf16.mfu  # MFU is against the FP8 peak


def test_fp8_gemms_are_the_block_linears_only():
    m = load_model("llama3.1-8b")
    plan = make_plan(m, make_cluster("H100", 8), precision="fp8", global_batch=8, seq_len=4096)
    g = build_stage_graph(m, plan)
    assert {op.name for op in g.layer.ops if op.fp8} == {"qkv proj", "out proj", "gate/up proj", "down proj"}
    assert not any(op.fp8 for op in g.head.ops)  # the output layer stays in BF16
    assert any(op.name == "fp8 casts" for op in g.layer.ops)


def test_fp8_saves_quantized_gemm_inputs():
    m = load_model("llama3.1-8b")
    c = make_cluster("H100", 8)
    kw = dict(global_batch=8, seq_len=4096)
    bf16 = build_stage_graph(m, make_plan(m, c, **kw)).layer.saved_bytes("none")
    fp8 = build_stage_graph(m, make_plan(m, c, precision="fp8", **kw)).layer.saved_bytes("none")
    t = 4096
    # norm outputs (2 x h) and swiglu output (f) drop from 2 to 1 byte; attention out gains an FP8 copy
    assert bf16 - fp8 == t * (2 * m.hidden + m.ffn_hidden) - t * m.q_dim


def test_fp8_weight_copies_in_memory():
    bf16 = shardscope.estimate("llama3.1-70b", **COMMON)
    fp8 = shardscope.estimate("llama3.1-70b", precision="fp8", **COMMON)
    per_gpu_layers_params = fp8.params.per_gpu  # includes embedding: an upper bound
    extra = (fp8.memory.buffers_gib - bf16.memory.buffers_gib) * 2**30
    assert 1.5 * 0.9 * per_gpu_layers_params < extra < 2.0 * per_gpu_layers_params  # FP8 + transpose


@pytest.mark.parametrize("gpu,recipe,match", [("A100-80GB", "tensorwise", "no FP8"), ("H100", "mxfp8", "Blackwell")])
def test_fp8_needs_hardware(gpu, recipe, match):
    with pytest.raises(ShardscopeError, match=match):
        shardscope.estimate("llama3.1-8b", gpu=gpu, gpus=8, precision="fp8", fp8_recipe=recipe, global_batch=8)


def test_fp8_all_gather_halves_fsdp_traffic():
    kw = dict(gpu="H100", gpus=64, fsdp=True, global_batch=64, seq_len=4096, precision="fp8")
    a = shardscope.estimate("llama3.1-8b", **kw)
    b = shardscope.estimate("llama3.1-8b", fp8_all_gather=True, **kw)
    assert b.time.comm_total_s < a.time.comm_total_s
