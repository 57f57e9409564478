"""The per-weight host cost of an eager backward (`costs.host.PARAM_BWD_S`) and the bench that measured it.

`bench/host_param_hooks.py` rebuilds, on CPU, the path each weight of a Transformer Engine GEMM takes through
autograd under Megatron-Core's DDP; these tests check that it is that path (not a timing), and that the
constant is the measured one (validation/host_param_hooks_cpu.json) with the dummy gradient's allocation
taken at the H100 machines' CUDA cost.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from shardscope.costs.host import GEMM_CALL_S, PARAM_BWD_S, op_host_s  # noqa: E402
from shardscope.graph.common import gemm  # noqa: E402
from shardscope.plan.plan import Plan  # noqa: E402

ROOT = Path(__file__).parent.parent
MEASURED = json.loads((ROOT / "validation" / "host_param_hooks_cpu.json").read_text())
H100_HOST = json.loads((ROOT / "validation" / "kernels_measured_h100.json").read_text())["host_runs"]


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


def test_param_bwd_cost_is_the_measured_one():
    """PARAM_BWD_S = the bench's per-weight backward cost on CPU, with the dummy's CPU allocation swapped for
    the CUDA one the H100 machines measured (4.4-4.9 us)."""
    runs = MEASURED["runs"]
    per_weight_us = statistics.fmean(r["backward_per_weight_us"] for r in runs)
    cpu_empty_us = statistics.median(r["torch_empty_us"] for r in runs)
    cuda_empty_us = statistics.fmean(r["torch_empty_us"] for r in H100_HOST)
    assert all(6.0 < r["backward_per_weight_us"] < 8.0 for r in runs)  # the runs agree
    derived_s = (per_weight_us - cpu_empty_us + cuda_empty_us) * 1e-6
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
