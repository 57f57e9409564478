import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardscope
from shardscope.errors import ShardscopeError

LLAMA8 = dict(gpu="H100", seq_len=4096, stack="megatron@2021")  # DDP, the paper-era Megatron-LM


def test_estimate_result_fields():
    e = shardscope.estimate("llama3.1-8b", gpus=8, global_batch=32, **LLAMA8)
    d = e.to_dict()
    assert isinstance(d["params"]["total"], int) and d["params"]["total"] == 8030261248
    for key in ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "fits"):
        assert key in d
    for key in ("peak_gib", "params_gib", "grads_gib", "optimizer_gib", "activations_gib", "buffers_gib"):
        assert d["memory"][key] >= 0
    t = e.time
    assert t.compute_s + t.exposed_comm_s + t.bubble_s + t.optimizer_s == pytest.approx(e.step_time_s)
    assert 0 < e.mfu <= e.hfu < 1


def test_zero_state_numbers():
    """Llama-3.1-8B on 8 GPUs, DDP: 18 bytes per parameter of model state."""
    e = shardscope.estimate("llama3.1-8b", gpus=8, global_batch=8, **LLAMA8)
    n = 8030261248
    assert e.memory.params_gib == pytest.approx(2 * n / 2**30)
    assert e.memory.grads_gib == pytest.approx(4 * n / 2**30)
    assert e.memory.optimizer_gib == pytest.approx(12 * n / 2**30)


def test_pipeline_bubble_matches_schedule():
    common = dict(gpus=64, tp=8, pp=8, global_batch=64, seq_len=4096)
    plain = shardscope.estimate("llama3.1-70b", **common)
    inter = shardscope.estimate("llama3.1-70b", vpp=5, **common)
    # bubble = (pp-1)/vpp micro-batch times: interleaving by 5 shrinks it ~5x
    assert inter.time.bubble_s == pytest.approx(plain.time.bubble_s / 5, rel=0.15)
    m = plain.plan["grad_accum"]
    per_mb = plain.time.compute_s / m
    assert plain.time.bubble_s / per_mb == pytest.approx(7, rel=0.25)


def test_recompute_trades_memory_for_time():
    r = {
        p: shardscope.estimate("llama3.1-8b", gpus=8, global_batch=16, micro_batch=2, recompute=p, **LLAMA8)
        for p in ("none", "selective", "full")
    }
    assert r["none"].memory.activations_gib > r["selective"].memory.activations_gib > r["full"].memory.activations_gib
    assert r["none"].step_time_s < r["selective"].step_time_s < r["full"].step_time_s
    assert r["full"].hfu > r["full"].mfu


def test_fsdp_shards_state():
    ddp = shardscope.estimate("llama3.1-8b", gpus=64, global_batch=64, **LLAMA8)
    fsdp = shardscope.estimate("llama3.1-8b", gpus=64, global_batch=64, fsdp=True, **LLAMA8)
    hsdp = shardscope.estimate("llama3.1-8b", gpus=64, global_batch=64, fsdp=True, shard_group=8, **LLAMA8)
    assert fsdp.memory.optimizer_gib == pytest.approx(ddp.memory.optimizer_gib * 8 / 12 / 64)
    assert fsdp.memory.peak_gib < hsdp.memory.peak_gib < ddp.memory.peak_gib


def test_uneven_pipeline_layers():
    e = shardscope.estimate("llama3.1-405b", gpus=2048, tp=8, pp=16, global_batch=256, seq_len=8192)
    assert e.params.per_gpu > 8 * 3.1e9 / 8  # the most-loaded stage holds ceil(126/16) = 8 layers


def test_errors_are_user_errors():
    with pytest.raises(ShardscopeError):
        shardscope.estimate("llama3.1-8b", gpu="H100", gpus=8, tp=3)


@st.composite
def plans(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    mb = draw(st.sampled_from([1, 2]))
    accum = draw(st.sampled_from([1, 2, 8]))
    return dict(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vpp=vpp,
        micro_batch=mb,
        global_batch=mb * dp * accum,
        seq_len=draw(st.sampled_from([2048, 8192])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        model=draw(st.sampled_from(["llama3.1-8b", "qwen3-8b", "mpt-7b", "llama2-13b"])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_invariants_over_random_plans(p):
    model = p.pop("model")
    gpus = p["tp"] * p["pp"] * p["cp"] * p["dp"]
    try:
        base = shardscope.estimate(model, gpu="H100", gpus=gpus, **p)
    except ShardscopeError:
        return  # e.g. tp does not divide the heads: rejected with a message, never a crash
    assert base.plan["tp"] * base.plan["pp"] * base.plan["cp"] * base.plan["dp"] == gpus
    assert math.isfinite(base.step_time_s) and base.step_time_s > 0
    # memory falls (never rises) as the ZeRO stage rises
    peaks = [shardscope.estimate(model, gpu="H100", gpus=gpus, zero=z, **p).memory.peak_gib for z in range(4)]
    assert all(a >= b - 1e-9 for a, b in zip(peaks, peaks[1:], strict=False))
    # more recompute never raises activation memory
    acts = [
        shardscope.estimate(model, gpu="H100", gpus=gpus, **(p | {"recompute": r})).memory.activations_gib
        for r in ("none", "selective", "full")
    ]
    assert acts[0] >= acts[1] >= acts[2]
