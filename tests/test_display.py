"""What the commands print: the cases a user tripped on (issue 50's display list), each named after it."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app
from shardscope.planner.cost import training_cost
from shardscope.planner.runner import distinct_plans
from shardscope.planner.search import Candidate

runner = CliRunner()


def run(*args: str, columns: int = 80):
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)})


def test_estimate_header_names_ep_and_dispatcher():
    r = run("estimate", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--tp", "2", "--global-batch", "64", columns=200)
    assert r.exit_code == 0, r.output
    head = r.stdout.splitlines()[0]
    assert "EP8 (" in head and re.search(r"EP8 \((flat|deepep|hybridep|allgather)\)", head), head


@pytest.mark.parametrize("command,name", [("models", "deepseek-v2-lite"), ("gpus", "H100-96GB")])
def test_catalog_names_not_truncated_at_80_columns(command, name):
    r = run(command, columns=80)
    assert r.exit_code == 0, r.output
    assert name in r.stdout
    assert "…" not in r.stdout


def test_model_catalog_shows_experts_top_k_and_active_params():
    r = run("models", columns=80)
    row = next(line for line in r.stdout.splitlines() if "deepseek-v3 " in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    spec = shardscope.models.catalog.load_model("deepseek-v3")
    assert f"{spec.params_active / 1e9:,.2f}" in cells  # active parameters
    assert "256+1" in cells and "8" in cells  # routed+shared experts, top-k
    assert "expert ffn" in r.stdout and "top-k" in r.stdout
    assert cells[-1] == "fp8"  # the checkpoint's weight format, which serving runs by default
    oss = next(line for line in r.stdout.splitlines() if "gpt-oss-120b " in line)
    assert "mxfp4 (experts)" in oss


def test_training_steps_are_whole_and_cost_is_in_usd():
    e = shardscope.estimate("llama3.1-8b", gpus=8, global_batch=16, seq_len=4096)
    tc = training_cost(e, 1e9 + 1, 2.5)
    assert isinstance(tc.steps, int) and tc.steps * e.tokens_per_step >= 1e9 + 1 > (tc.steps - 1) * e.tokens_per_step
    r = run(
        "plan", "llama3.1-8b", "--gpus", "8", "--global-batch", "16", "--seq-len", "4096", "--top", "2",
        "--tokens", "1B", "--usd-per-gpu-hour", "2.5", columns=200,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    line = next(line for line in r.stdout.splitlines() if line.startswith("Training"))
    assert re.search(r" [\d,]+ steps,", line) and "US$" in line, line
    r = run("plan", "llama3.1-8b", "--gpus", "8", "--global-batch", "16", "--top", "1", "--tokens", "1B", "--json")
    training = json.loads(r.stdout)["plans"][0]["training"]
    assert isinstance(training["steps"], int) and "cost_usd" in training


def test_top_plans_do_not_repeat_one_layout_under_two_sharding_names():
    r = run("plan", "llama3.1-70b", "--gpus", "16", "--global-batch", "64", "--top", "12", "--json")
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)["plans"]
    keys = [
        (
            tuple(p["plan"][k] for k in ("tp", "pp", "vpp", "cp", "dp", "ep", "recompute", "micro_batch")),
            round(p["step_time_s"], 9),
            round(p["memory"]["required_gib"], 6),
        )
        for p in plans
    ]
    assert len(keys) == len(set(keys))


def test_distinct_plans_keeps_the_first_of_equal_plans():
    e = shardscope.estimate("llama3.1-8b", gpus=8, global_batch=8, zero=3)
    f = shardscope.estimate("llama3.1-8b", gpus=8, global_batch=8, fsdp=True)
    _, _, zero3 = shardscope.setup("llama3.1-8b", gpus=8, global_batch=8, zero=3)
    _, _, fsdp = shardscope.setup("llama3.1-8b", gpus=8, global_batch=8, fsdp=True)
    same = [Candidate(zero3, e), Candidate(fsdp, shardscope.records.evolve(e))]
    assert distinct_plans(same, 5) == same[:1]
    if f.step_time_s != e.step_time_s:  # priced differently: both kept
        assert len(distinct_plans([Candidate(zero3, e), Candidate(fsdp, f)], 5)) == 2


def test_fp8_mfu_says_which_peak():
    r = run("estimate", "llama3.1-8b", "--gpus", "8", "--precision", "fp8", columns=200)
    assert r.exit_code == 0, r.output
    assert "of the FP8 peak, 1,979 TFLOP/s" in r.stdout
    est = shardscope.estimate("llama3.1-8b", gpus=8, precision="fp8")
    assert est.peak_tflops_per_gpu == pytest.approx(1979, rel=0.01)
    assert est.mfu == pytest.approx(est.model_tflops_per_gpu / est.peak_tflops_per_gpu)


def test_validate_refuses_a_csv_of_the_wrong_kind(tmp_path):
    bad = tmp_path / "serving.csv"
    bad.write_text("model,gpu,ttft_ms\nllama3.1-8b,H100,40\n")
    r = run("validate", str(bad))
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and "column" in r.output
