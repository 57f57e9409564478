"""The per-weight host cost of an eager backward (`costs.host.PARAM_BWD_S`) and the bench that measured it.

`bench/host_param_hooks.py` rebuilds, on CPU, the path each weight of a Transformer Engine GEMM takes through
autograd under Megatron-Core's DDP; these tests check that it is that path (not a timing), and that the
constant is the measured one (validation/host_param_hooks_cpu.json) with the dummy gradient's allocation
taken at the H100 machines' CUDA cost.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from test_host import _moe_layer  # tests/ is on the path (conftest)

torch = pytest.importorskip("torch")

from shardscope.costs.host import (  # noqa: E402
    A2A_DISPATCHER_S,
    CPP_ALLOC_S,
    CPP_LAUNCH_S,
    GEMM_CALL_S,
    HOST_PYTHON_SPEED,
    PARAM_BWD_S,
    call_host_s,
    op_host_s,
)
from shardscope.graph.common import gemm  # noqa: E402
from shardscope.plan.plan import Plan  # noqa: E402

ROOT = Path(__file__).parent.parent
MEASURED = json.loads((ROOT / "validation" / "host_param_hooks_cpu.json").read_text())
DISPATCHER = json.loads((ROOT / "validation" / "megatron_dispatcher_host_cpu.json").read_text())["runs"]
H100_MEASURED = json.loads((ROOT / "validation" / "kernels_measured_h100.json").read_text())
H100_HOST, H100_AUTOGRAD = H100_MEASURED["host_runs"], H100_MEASURED["host_autograd_runs"]
# The dispatcher's stages as the bench times them (forward stages nest the permute and sort calls whose
# kernels it counts apart), and the reference op each is measured in.
STAGES = {
    "preprocess": (("dispatch_preprocess",), ("dispatch_preprocess", "permute"), "fwd_autograd_op_us"),
    "dispatch": (
        ("token_dispatch", "dispatch_postprocess"),
        ("token_dispatch", "dispatch_postprocess", "sort_chunks_by_idxs"),
        "fwd_autograd_op_us",
    ),
    "combine": (
        ("combine_preprocess", "token_combine", "combine_postprocess"),
        ("combine_preprocess", "token_combine", "unpermute", "combine_postprocess"),
        "fwd_autograd_op_us",
    ),
    "backward": (("backward",), ("backward",), "bwd_engine_op_us"),
}


def _bench():
    spec = importlib.util.spec_from_file_location("host_param_hooks", ROOT / "bench" / "host_param_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_runs_megatrons_hook_path():
    """Each weight hands autograd TE's dummy gradient (flagged `grad_added_to_main_grad`), DDP's hook drops
    it without touching `main_grad`, and on the last micro-batch marks the weight ready in its bucket."""
    bench = _bench()
    module = bench.Grouped(4, dummies=True)
    keep = bench.ddp_wrap(module, backward_hooks=True, forward_hooks=True)
    x = torch.ones(8, requires_grad=True)
    module(x).sum().backward()
    weights = list(module.parameters())
    assert all(w.grad is None and w.grad_added_to_main_grad for w in weights)
    assert all(float(w.main_grad.abs().sum()) == 0.0 for w in weights)
    assert len(keep) == 4 + 1  # one AccumulateGrad node per weight, one forward pre-hook handle
    assert x.grad is not None and float(x.grad.sum()) == 8.0


def test_last_micro_batch_registers_every_weight():
    """On the last micro-batch each weight's hook registers it with its bucket group, once."""
    bench = _bench()
    module = bench.Grouped(3, dummies=True)
    groups = {}
    original = bench.BucketGroup

    class Recording(original):
        def __init__(self) -> None:
            super().__init__()
            self.is_last_microbatch = True
            groups[id(self)] = self

    bench.BucketGroup = Recording
    try:
        keep = bench.ddp_wrap(module, backward_hooks=True, forward_hooks=False)
        module(torch.ones(8, requires_grad=True)).sum().backward()
    finally:
        bench.BucketGroup = original
    assert len(keep) == 3
    assert sorted(len(g.params_with_grad) for g in groups.values()) == [1, 1, 1]


def test_host_python_speed_is_the_measured_ratio():
    """The H100 hosts' Python and ATen dispatch over the benches' CPU's: one `torch.add(out=)` timed on
    both, the H100 hosts' C++ launch taken off theirs."""
    h100_us = statistics.fmean(r["launch_add_us"] for r in H100_HOST) - CPP_LAUNCH_S * 1e6
    cpu_us = statistics.fmean(r["add_out_us"] for r in DISPATCHER)
    assert all(3.5 < r["add_out_us"] < 4.0 for r in DISPATCHER)  # the bench CPU's runs agree
    assert h100_us / cpu_us == pytest.approx(HOST_PYTHON_SPEED, rel=0.01)
    # the autograd op chain, timed on both hosts, agrees within 15% once the H100 side's C++ launch and
    # CUDA allocation are taken off
    h100_chain = statistics.fmean(r["fwd_autograd_op_us"] for r in H100_AUTOGRAD)
    cpu_chain = statistics.fmean(r["fwd_autograd_op_us"] for r in DISPATCHER)
    chain_speed = (h100_chain - (CPP_LAUNCH_S + CPP_ALLOC_S) * 1e6) / cpu_chain
    assert 0.85 * HOST_PYTHON_SPEED < chain_speed < HOST_PYTHON_SPEED


def test_param_bwd_cost_is_the_measured_one():
    """PARAM_BWD_S = the bench's per-weight backward cost on CPU on the H100 hosts' clock, with the dummy's
    CPU allocation swapped for the CUDA one the H100 machines measured (4.4-4.9 us)."""
    runs = MEASURED["runs"]
    per_weight_us = statistics.fmean(r["backward_per_weight_us"] for r in runs)
    cpu_empty_us = statistics.median(r["torch_empty_us"] for r in runs)
    cuda_empty_us = statistics.fmean(r["torch_empty_us"] for r in H100_HOST)
    assert all(6.0 < r["backward_per_weight_us"] < 8.0 for r in runs)  # the runs agree
    derived_s = (HOST_PYTHON_SPEED * (per_weight_us - cpu_empty_us) + cuda_empty_us) * 1e-6
    assert derived_s == pytest.approx(PARAM_BWD_S, rel=0.02)


def test_each_expert_weight_pays_its_backward_hook():
    """Backward host time of a TE grouped GEMM grows by PARAM_BWD_S per expert beyond its GEMM calls; a
    plain PyTorch GEMM (no TE dummy gradient) pays its two calls only."""
    plan = Plan()
    one, sixteen = gemm("experts", 4096, 1536, 2048, groups=1), gemm("experts", 4096, 1536, 2048, groups=16)
    assert op_host_s(sixteen, True, plan) - op_host_s(one, True, plan) == pytest.approx(
        30 * GEMM_CALL_S + 15 * PARAM_BWD_S
    )
    assert op_host_s(sixteen, False, plan) - op_host_s(one, False, plan) == pytest.approx(15 * GEMM_CALL_S)
    router = gemm("router", 4096, 128, 2048, te_module=False)
    assert op_host_s(router, True, plan) == pytest.approx(2 * op_host_s(router, False, plan))


def test_a2a_dispatcher_host_is_the_measured_fit():
    """A2A_DISPATCHER_S is, per stage, the least-squares line over EP of the bench's runs on the H100 hosts'
    clock: the bench's CPU time x (H100 `torch.add(out=)` less its C++ launch) / (the bench CPU's), plus a C++
    launch per kernel-launching ATen call. The line holds each run within 5%."""
    python_speed = HOST_PYTHON_SPEED
    assert {r["ep"] for r in DISPATCHER} == {8, 16, 32, 64}
    assert {r["megatron_core"] for r in DISPATCHER} == {"0.15.0", "0.16.1"}
    for stage, (timed, counted, reference) in STAGES.items():
        eps, host_s = [], []
        for r in DISPATCHER:
            cpu_us = sum(r["stages_ops"][name] for name in timed) * r[reference]
            kernels = sum(r["stage_kernels"].get(name, 0) for name in counted)
            eps.append(r["ep"])
            host_s.append((python_speed * cpu_us + kernels * CPP_LAUNCH_S * 1e6) * 1e-6)
        per_rank, fixed = statistics.linear_regression(eps, host_s)
        assert A2A_DISPATCHER_S[stage] == pytest.approx((fixed, per_rank), rel=0.02), stage
        assert all(abs(y - (fixed + per_rank * x)) < 0.05 * y for x, y in zip(eps, host_s, strict=True)), stage


def test_flat_dispatcher_ops_carry_its_measured_host_time():
    """With EP, the all-to-all dispatcher's preprocess is a host-only op before the permute, its dispatch
    call is the forward dispatch all-to-all's, and the un-permute carries the combine and all the backward;
    the permutes and sorts inside those calls add nothing. DeepEP and HybridEP, and EP 1, keep per-kernel
    launches."""
    plan, layer = _moe_layer()
    names = [op.name for op in layer.ops]
    pre = layer.ops[names.index("all-to-all dispatcher preprocess")]
    assert names.index("all-to-all dispatcher preprocess") + 1 == names.index("permute")
    assert pre.bytes == 0 and pre.launches == 0 and pre.scope == "moe_preprocess"
    assert op_host_s(pre, False, plan) == pytest.approx(
        A2A_DISPATCHER_S["preprocess"][0] + 8 * A2A_DISPATCHER_S["preprocess"][1]
    )
    unpermute = layer.ops[names.index("unpermute + weighted sum")]
    assert op_host_s(unpermute, False, plan) == pytest.approx(call_host_s("a2a_combine", False, 8))
    assert op_host_s(unpermute, True, plan) == pytest.approx(call_host_s("a2a_combine", True, 8))
    for name in ("permute", "sort chunks by expert", "unsort chunks"):
        assert op_host_s(layer.ops[names.index(name)], False, plan) == 0.0
    calls = {(c.name, c.phase): c.call for c in layer.comms if c.call}
    assert calls == {("ep dispatch all-to-all", "fwd"): "a2a_dispatch"}
    _, deepep = _moe_layer(ep_dispatch="deepep")
    assert "all-to-all dispatcher preprocess" not in {op.name for op in deepep.ops}
    assert {c.call for c in deepep.comms if c.call} == {"flex_dispatch"}
    assert not any(op.call for op in deepep.ops)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_dispatcher_bench_runs_megatron():
    """The bench runs Megatron-Core's dispatcher end to end on CPU (`pip install --no-deps megatron-core`):
    its fused path issues 13 kernel-launching calls in the preprocess and 17 in backward."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "megatron_dispatcher_host.py"), "--ep", "4", "--experts", "32"]
        + ["--topk", "4", "--tokens", "8", "--steps", "2", "--rounds", "1"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    ).stdout
    run = json.loads(out[out.index("{") :])
    assert run["stage_kernels"]["dispatch_preprocess"] == 13 and run["stage_kernels"]["backward"] == 17
    assert run["stages_ops"]["dispatch_preprocess"] > run["stages_ops"]["permute"] > 0
