"""One plan, one answer: `estimate`, `estimate --trace`, `budget` and `plan` price the same plan the same."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app

runner = CliRunner()

PLAN = dict(gpus=64, tp=8, pp=4, global_batch=128, seq_len=8192)
PLAN_ARGS = ["--gpus", "64", "--tp", "8", "--pp", "4", "--global-batch", "128", "--seq-len", "8192"]


def _estimate_json(*extra: str) -> dict:
    r = runner.invoke(app, ["estimate", "llama3.1-70b", *PLAN_ARGS, "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_api_and_cli_derive_the_same_global_batch():
    est = shardscope.estimate("llama3.1-8b", gpus=8, tp=2)
    d = json.loads(runner.invoke(app, ["estimate", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--json"]).stdout)
    assert est.plan["global_batch"] == d["plan"]["global_batch"] == 4  # one micro-batch per DP rank
    assert est.step_time_s == pytest.approx(d["step_time_s"], rel=1e-12)


def test_budget_starts_from_the_estimate_of_the_same_plan():
    est = shardscope.estimate("llama3.1-70b", **PLAN)
    r = runner.invoke(app, ["budget", "llama3.1-70b", *PLAN_ARGS, "--budget-gib", "40", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["start_gib"] == pytest.approx(est.memory.required_gib, rel=1e-12)
    assert d["start_step_s"] == pytest.approx(est.step_time_s, rel=1e-12)


def test_plan_prices_its_plans_as_estimate_does():
    r = runner.invoke(app, ["plan", "mixtral-8x7b", "--gpus", "32", "--global-batch", "256", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    for found in json.loads(r.stdout)["plans"]:
        plan = {k: v for k, v in found["plan"].items() if k not in ("grad_accum", "sharding")}
        plan = {k: tuple(v) if isinstance(v, list) else v for k, v in plan.items()}
        est = shardscope.estimate("mixtral-8x7b", gpus=32, **plan)
        assert est.step_time_s == pytest.approx(found["step_time_s"], rel=1e-12)
        assert est.memory.required_gib == pytest.approx(found["memory"]["required_gib"], rel=1e-12)


@pytest.mark.parametrize("extra", [[], ["--vpp", "5"]])
def test_trace_is_drawn_from_the_estimate_not_the_simulator(tmp_path, extra):
    path = tmp_path / "step.json"
    plain = _estimate_json(*extra)
    traced = _estimate_json(*extra, "--trace", str(path))
    assert traced["step_time_s"] == plain["step_time_s"] and traced["time"] == plain["time"]
    assert not any("simulated" in w for w in traced["warnings"])
    doc = json.loads(path.read_text())
    assert doc["metadata"]["schedule"].endswith("(closed form)")
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) / 1e6 == pytest.approx(plain["step_time_s"], abs=2e-6)
    work = [e for e in spans if e["pid"] == 0 and e["tid"] in (1, 2) and e["name"] != "optimizer step"]
    busy = sum(e["dur"] for e in work) / 1e6  # compute and exposed TP/CP/EP comm of its micro-batches
    t = plain["time"]
    # rank 0 computes m micro-batches of the slowest stage: the step less the bubble, DP tail and optimizer
    assert busy == pytest.approx(t["compute_s"] + t["exposed_comm_s"] - t["detail"]["dp_exposed_s"], rel=1e-3)


def test_simulate_stays_an_explicit_choice(tmp_path):
    path = tmp_path / "step.json"
    simulated = _estimate_json("--simulate", "--trace", str(path))
    assert any("simulated with the 1f1b schedule" in w for w in simulated["warnings"])
    assert json.loads(path.read_text())["metadata"]["step_time_s"] == simulated["step_time_s"]
