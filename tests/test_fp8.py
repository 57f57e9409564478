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


@pytest.mark.parametrize(("recipe", "gpu", "scales"), [("blockwise", "H100", 4 / 128**2), ("mxfp8", "B200", 1 / 32)])
def test_fp8_weight_copies_carry_their_block_scales(recipe: str, gpu: str, scales: float):
    """Row- and column-wise FP8 weight copies with their scales: Transformer Engine's blockwise recipe keeps
    one fp32 scale per 128x128 weight block (`w_block_scaling_dim = 2`), MXFP8 one E8M0 byte per 32."""
    from shardscope.graph.fp8 import weight_copy_bytes_per_param

    plan = make_plan(load_model("llama3.1-8b"), make_cluster(gpu, 8), precision="fp8", fp8_recipe=recipe)
    assert weight_copy_bytes_per_param(plan, "hopper" if gpu == "H100" else "blackwell") == 2 * (1 + scales)


def test_rowwise_quantizes_the_output_gradient_along_both_axes():
    """torchao's rowwise recipe (`matmul_with_hp_or_float8_args`): forward scales the input along its rows;
    backward scales the output gradient along rows for dgrad and along columns for wgrad, and the kept
    high-precision input again along columns. Tensorwise scales each once and transposes the FP8 input."""
    from shardscope.graph.fp8 import CAST_BYTES, TRANSPOSE_BYTES, quantization_bytes

    m, c = load_model("llama3.1-8b"), make_cluster("H100", 8)
    rowwise = make_plan(m, c, precision="fp8", fp8_recipe="rowwise")
    tensorwise = make_plan(m, c, precision="fp8", fp8_recipe="tensorwise")
    inputs, grads = 3.0, 7.0
    cast = CAST_BYTES["rowwise"]
    assert quantization_bytes(rowwise, "hopper", inputs, grads) == (cast * inputs, cast * (inputs + 2 * grads))
    assert quantization_bytes(tensorwise, "hopper", inputs, grads) == (
        cast * inputs, cast * grads + TRANSPOSE_BYTES * inputs,
    )  # fmt: skip


@pytest.mark.parametrize("gpu,recipe,match", [("A100-80GB", "tensorwise", "no FP8"), ("H100", "mxfp8", "Blackwell")])
def test_fp8_needs_hardware(gpu, recipe, match):
    with pytest.raises(ShardscopeError, match=match):
        shardscope.estimate("llama3.1-8b", gpu=gpu, gpus=8, precision="fp8", fp8_recipe=recipe, global_batch=8)


def test_fp8_all_gather_halves_fsdp_traffic():
    kw = dict(gpu="H100", gpus=64, fsdp=True, global_batch=64, seq_len=4096, precision="fp8")
    a = shardscope.estimate("llama3.1-8b", **kw)
    b = shardscope.estimate("llama3.1-8b", fp8_all_gather=True, **kw)
    assert b.time.comm_total_s < a.time.comm_total_s


def test_fp8_parameters_drop_the_bf16_weights():
    """With FP8 parameters (Megatron --fp8-param-gather) the FP8 weights are the parameters: under the
    distributed optimizer the BF16 weights (2 bytes per local parameter) are gone and nothing else moves;
    under ZeRO-3 the shard is kept in FP8 and layers are gathered as their FP8 copies, never in BF16; the
    same with the optimizer offloaded to the host."""
    from shardscope.analytic.step import estimate_step
    from shardscope.costs.memory import rank_params_local, rank_state_bytes

    m = load_model("llama3.1-70b")
    c = make_cluster("GB200", 64)
    for zero, offload in ((1, False), (3, False), (1, True), (3, True)):
        kw = dict(tp=1, pp=4, global_batch=64, seq_len=8192, precision="fp8", zero=zero, recompute="full")
        kw["offload_optimizer"] = offload
        bf16_weights = make_plan(m, c, **kw)
        fp8_weights = make_plan(m, c, fp8_all_gather=True, **kw)
        a, b = (estimate_step(m, c, p) for p in (bf16_weights, fp8_weights))
        sa, sb = (rank_state_bytes(m, p, 0) for p in (bf16_weights, fp8_weights))
        assert sb.grads == sa.grads and sb.optimizer == sa.optimizer
        if zero == 1:
            assert sb.params == 0 and sa.params == 2 * sum(rank_params_local(m, bf16_weights, 0))
            assert a.memory.buffers_gib == b.memory.buffers_gib
        else:
            assert sb.params == sa.params / 2
            assert b.memory.buffers_gib < a.memory.buffers_gib
        assert a.memory.activations_gib == b.memory.activations_gib


@pytest.mark.parametrize(
    ("recipe", "zero", "width"),
    [("tensorwise", 1, 1), ("mxfp8", 1, 2), ("mxfp8", 3, 1), ("blockwise", 1, 1)],
)
def test_fp8_parameter_gather_width(recipe: str, zero: int, width: int):
    """Per-tensor FP8 parameters are all-gathered as FP8 bytes; MXFP8 ones under Megatron's distributed
    optimizer are gathered in BF16 into the reused gradient buffer (`reuse_grad_buf_for_mxfp8_param_ag`)."""
    from shardscope.step.core import step_costs

    m = load_model("llama3.1-8b")
    c = make_cluster("B200", 16)
    plan = make_plan(
        m, c, global_batch=64, seq_len=4096, precision="fp8", fp8_recipe=recipe, zero=zero, fp8_all_gather=True
    )
    assert step_costs(m, c, plan).gather_bytes == width
