"""Measured profiles: the SQLite schema, interpolation, the shipped H100 profile, `estimate --profile`,
`profile show|diff` and `calibrate` on a machine without a GPU."""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app
from shardscope.costs.compute import op_time_s
from shardscope.errors import ShardscopeError
from shardscope.graph.build import build_stage_graph
from shardscope.hardware.profile import load_profile
from shardscope.hardware.profile.calibrate import attention_cases, gemm_cases, stream_cases
from shardscope.hardware.profile.db import Conditions, Point, write_profile
from shardscope.hardware.profile.shipped import build_sql

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src/shardscope/hardware/profiles/H100.sql"
SOURCES = [ROOT / "validation/kernels_measured_h100.json", ROOT / "validation/eager_regions_h100.json"]
LLAMA = dict(gpu="H100", gpus=8, global_batch=32, seq_len=8192)


def _sample_points() -> list[Point]:
    return [
        Point("gemm", 1e-3, dtype="bf16", variant="fwd", m=4096, n=4096, k=4096, groups=1),
        Point("gemm", 2e-3, dtype="fp8", variant="wgrad", m=2048, n=7168, k=2064, groups=32),
        Point(
            "attention_fwd",
            3e-4,
            dtype="bf16",
            batch=1,
            heads=32,
            seq=4096,
            head_dim=128,
            head_dim_v=128,
            causal=True,
            window=0,
            sinks=False,
            backend="cudnn",
        ),  # fmt: skip
        Point(
            "attention_bwd",
            9e-4,
            dtype="bf16",
            batch=1,
            heads=64,
            seq=4096,
            head_dim=64,
            head_dim_v=64,
            causal=True,
            window=128,
            sinks=True,
            backend="cudnn",
        ),  # fmt: skip
        Point("elementwise", 3e-5, variant="contiguous", nbytes=7.0e7),
        Point("all_reduce", 4e-4, variant="intra-node", nbytes=2.0**28, ranks=8),
        Point("host_launch", 1e-5, variant="python torch.add"),
    ]


def test_schema_round_trip(tmp_path: Path) -> None:
    cond = Conditions(source="calibrate", gpu_name="NVIDIA H100 80GB HBM3", sms=132, sm_clock_mhz=1980.0,
                      mem_clock_mhz=2619.0, power_limit_w=700.0, memory_gib=79.2, driver="580.1", cuda="13.0",
                      torch="2.13.0", cudnn="91900", nccl="2.27.3", host="node1", date="2026-11-27")  # fmt: skip
    points = _sample_points()
    path = tmp_path / "my.db"
    write_profile(path, "mine", "H100", [(cond, points)]).close()
    prof = load_profile(path)
    assert (prof.name, prof.gpu) == ("mine", "H100")
    assert prof.conditions == {1: cond}
    assert list(prof.points) == points  # bools, None and floats come back as written
    # the same content written as SQL text loads to an equal profile (equality is by content)
    con = sqlite3.connect(path)
    text = "\n".join(con.iterdump())
    con.close()
    (tmp_path / "my.sql").write_text(text)
    assert load_profile(tmp_path / "my.sql") == prof
    # the table rejects what is not a time
    with pytest.raises(sqlite3.IntegrityError):
        write_profile(None, "bad", "H100", [(cond, [Point("gemm", 0.0, m=1, n=1, k=1, groups=1)])])


def test_not_a_profile_is_one_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(ShardscopeError, match="not a shardscope profile"):
        load_profile(junk)
    with pytest.raises(ShardscopeError, match="no profile 'Z999'.*H100"):
        load_profile("Z999")


def test_shipped_profile_is_built_from_the_measurements() -> None:
    """The shipped text is exactly what the builder makes of the JSON the project holds."""
    assert build_sql(SOURCES, "H100", "H100") == SHIPPED.read_text()
    prof = load_profile("h100")  # by name, any case
    assert prof is load_profile("H100")
    kinds = {(p.op, p.dtype) for p in prof.points}
    assert {("gemm", "bf16"), ("gemm", "fp8"), ("attention_fwd", "bf16"), ("attention_bwd", "bf16")} <= kinds
    assert prof.conditions[1].gpu_name == "NVIDIA H100 80GB HBM3"
    # the 8192^3 references, measured, come back exactly
    assert prof.gemm_s(8192, 8192, 8192, "bf16") == pytest.approx(1.4591839909553528e-3)
    assert prof.gemm_s(8192, 8192, 8192, "fp8") == pytest.approx(0.8201760053634644e-3)


def _power_law_profile(points: list[tuple[int, int, int]], tflops: float) -> object:
    pts = [
        Point("gemm", 2.0 * m * n * k / (tflops * 1e12), dtype="bf16", m=m, n=n, k=k, groups=1) for m, n, k in points
    ]
    pts += [Point("elementwise", nb / 2e12, variant="contiguous", nbytes=nb) for nb in (1e6, 1e9)]
    con = write_profile(None, "synthetic", "H100", [(Conditions("test", "x"), pts)])
    from shardscope.hardware.profile import _from_connection

    return _from_connection(con, "synthetic")


def test_interpolation_inside_and_fallback_outside() -> None:
    grid = [(m, n, k) for m in (2048, 4096) for n in (2048, 4096) for k in (2048, 4096)]
    prof = _power_law_profile(grid, 500.0)
    # a constant throughput is reproduced anywhere inside the measured box
    t = prof.gemm_s(3000, 2500, 3584, "bf16")
    assert t == pytest.approx(2.0 * 3000 * 2500 * 3584 / 500e12, rel=1e-9)
    # a depth that is not a multiple of 128 runs other kernels: only such measurements price it
    assert prof.gemm_s(3000, 2500, 3500, "bf16") is None
    # outside the measured range on any axis, or for an unmeasured dtype: None (the roofline is kept)
    assert prof.gemm_s(8192, 4096, 4096, "bf16") is None
    assert prof.gemm_s(3000, 3000, 3000, "fp8") is None
    # streaming: log-log between the two sizes (2 TB/s), nothing past them
    assert prof.elementwise_s(3e7) == pytest.approx(3e7 / 2e12)
    assert prof.elementwise_s(2e9) is None


def _held_out_errors() -> dict[tuple[str, str | None], list[float]]:
    """Leave-one-out on the shipped profile: each measured GEMM / attention point (with its repeats) held
    back and predicted from the rest, where the rest covers it."""
    prof = load_profile("H100")
    errors: dict[tuple[str, str | None], list[float]] = {}
    for p in prof.points:
        if p.op not in ("gemm", "attention_fwd", "attention_bwd"):
            continue
        t = prof.held_out(p).predict(p)
        if t is not None:
            errors.setdefault((p.op, p.dtype), []).append(abs(t / p.seconds - 1))
    return errors


def test_held_back_points_are_reproduced() -> None:
    """Held-back measured points of the shipped H100 profile: medians well within 10% per kind, 3 in 4
    within 10% overall. Not every point: shapes 1% apart differ by up to 17% in the measurements themselves
    (an FP8 GEMM of K = 2064 against K = 2048), which no interpolation in size can follow."""
    errors = _held_out_errors()
    assert len(errors[("gemm", "fp8")]) >= 140 and len(errors[("gemm", "bf16")]) >= 50
    assert len(errors[("attention_fwd", "bf16")]) >= 20 and len(errors[("attention_bwd", "bf16")]) >= 20
    for kind, errs in errors.items():
        assert statistics.median(errs) <= 0.10, kind
        assert max(errs) <= 0.35, kind
    every = [e for errs in errors.values() for e in errs]
    assert sum(e <= 0.10 for e in every) / len(every) >= 0.75


def _profiled(cluster_gpu: object) -> object:
    return replace(cluster_gpu, profile=load_profile("H100"))


def test_estimate_profile_changes_only_the_measured_ops() -> None:
    before = shardscope.estimate("llama3.1-8b", **LLAMA).to_dict()
    est = shardscope.estimate("llama3.1-8b", profile="H100", **LLAMA)
    after = shardscope.estimate("llama3.1-8b", **LLAMA).to_dict()
    assert before == after and "profile" not in before  # no profile: the estimate is untouched
    measured = set(est.profile["ops_measured"])
    assert {"qkv proj", "gate/up proj", "down proj", "attention"} <= measured
    assert est.profile["name"] == "H100" and est.step_time_s != before["step_time_s"]
    assert est.memory == shardscope.estimate("llama3.1-8b", **LLAMA).memory  # times only
    # op by op: a profiled GPU prices exactly the ops it names differently, every other op the same
    spec, cluster, plan = shardscope.setup("llama3.1-8b", **LLAMA)
    gpu = cluster.gpu
    graph = build_stage_graph(spec, plan, gpu.arch)
    ops = [op for g in (*graph.layers.values(), graph.embedding, graph.head) for op in g.ops]
    changed = set()
    for op in ops:
        for bwd in (False, True):
            bare, prof = op_time_s(gpu, op, bwd, plan), op_time_s(_profiled(gpu), op, bwd, plan)
            if not math.isclose(bare, prof, rel_tol=1e-12):
                changed.add(op.name)
    assert changed <= measured
    assert {"qkv proj", "gate/up proj", "down proj", "attention"} <= changed
    assert set(est.profile["ops_roofline"]).isdisjoint(changed)


def test_estimate_profile_cli_json_and_wrong_gpu() -> None:
    runner = CliRunner()
    args = ["estimate", "llama3.1-8b", "--gpus", "8", "--global-batch", "32", "--seq-len", "8192", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    res = runner.invoke(app, [*args, "--profile", "H100"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert "gate/up proj" in d["profile"]["ops_measured"]
    assert {k for k in d if d[k] != plain.get(k)} <= {"profile", "step_time_s", "tokens_per_s",
        "tokens_per_s_per_gpu", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu", "time"}  # fmt: skip
    bad = runner.invoke(app, ["estimate", "llama3.1-8b", "--gpu", "B200", "--profile", "H100"])
    assert bad.exit_code == 2 and "measured on H100, not B200" in bad.output


def test_profile_show_and_diff(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"COLUMNS": "200"}
    shown = runner.invoke(app, ["profile", "show", "H100"], env=env)
    assert shown.exit_code == 0, shown.output
    for text in ("NVIDIA H100 80GB HBM3", "gemm fp8 grouped", "attention_bwd cudnn hd128", "elementwise contiguous"):
        assert text in shown.output
    # a machine whose GEMMs take 25% longer, the rest alike
    h100 = load_profile("H100")
    slower = [replace(p, seconds=p.seconds * 1.25) if p.op == "gemm" else p for p in h100.points]
    cond = replace(h100.conditions[1], power_limit_w=500.0)
    write_profile(tmp_path / "slow.db", "H100-500W", "H100", [(cond, slower)]).close()
    out = runner.invoke(app, ["profile", "diff", "H100", str(tmp_path / "slow.db")], env=env)
    assert out.exit_code == 0, out.output
    rows = {line.split("│")[1].strip(): line for line in out.output.splitlines() if line.count("│") >= 5}
    assert "1.250" in rows["gemm fp8 grouped"] and "1.000" in rows["attention_fwd cudnn hd128"]
    assert "power_limit_w" in out.output and "500.0" in out.output
    missing = runner.invoke(app, ["profile", "show", str(tmp_path / "nope.db")])
    assert missing.exit_code == 2


def test_calibrate_without_gpu_is_one_line_exit_2(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: calibrate would measure it")
    out = tmp_path / "my.db"
    res = subprocess.run([sys.executable, "-m", "shardscope", "calibrate", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2
    assert res.stdout == "" and res.stderr.count("\n") == 1 and "no GPU" in res.stderr
    assert not out.exists()


def test_calibrate_plan_covers_each_kind_coarse_first() -> None:
    """The measuring plan (built without torch: the cases only measure when run): a coarse pass of every
    kind, then a finer one, every case within the FLOP caps and none repeated."""
    coarse = [label for label, _ in (*gemm_cases(None, True, True), *attention_cases(None, ["cudnn"], True))]
    fine = [label for label, _ in (*gemm_cases(None, True, False), *attention_cases(None, ["cudnn", "fa2"], False))]
    assert any(lb.startswith("gemm fp8 16x") for lb in coarse) and any(lb.startswith("attention") for lb in coarse)
    assert len(set(fine)) == len(fine) and len(fine) > 3 * len(coarse)
    assert any("x2064" in lb for lb in fine)  # unaligned depths, interpolated among themselves
    streams = [label for label, _ in (*stream_cases(None, True), *stream_cases(None, False))]
    assert len(set(streams)) == len(streams) == 26


def test_plan_searches_with_a_profile_as_estimate_prices() -> None:
    """`plan --profile`: the search prices its plans from the profile, and its best plan's step time is what
    `estimate --profile` gives for that plan."""
    from typer.testing import CliRunner

    from shardscope.cli import app

    args = ["llama3.1-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "32", "--stack", "torchtitan"]
    runner = CliRunner()
    plain = json.loads(runner.invoke(app, ["plan", *args, "--top", "1", "--json"]).output)
    measured = json.loads(runner.invoke(app, ["plan", *args, "--top", "1", "--json", "--profile", "H100"]).output)
    best = measured["plans"][0] if "plans" in measured else measured["candidates"][0]
    before = plain["plans"][0] if "plans" in plain else plain["candidates"][0]
    assert best["step_time_s"] != before["step_time_s"]
    p = best["plan"]
    est = shardscope.estimate(
        "llama3.1-8b", "H100", 8, stack="torchtitan", profile="H100", seq_len=4096, global_batch=32,
        **{k: p[k] for k in ("tp", "pp", "cp", "micro_batch", "fsdp", "zero", "reshard_after_forward", "recompute")},
    )  # fmt: skip
    assert est.step_time_s == pytest.approx(best["step_time_s"], rel=1e-9)


def test_shipped_h200_profile_is_a_calibrate_run() -> None:
    """`--profile H200` is what `shardscope calibrate` measured on a lent H200 (2.2 min, 2026-11-27), shipped as
    written; held-back points of it (a fixed sample) are interpolated with medians within 10% per kind, and
    `profile diff` sets it beside the H100 profile."""
    import random

    from typer.testing import CliRunner

    from shardscope.cli import app

    prof = load_profile("H200")
    assert (prof.name, prof.gpu) == ("H200", "H200") and len(prof.points) >= 4800
    assert {c.source for c in prof.conditions.values()} == {"calibrate"}
    sample = [p for p in prof.points if p.op in ("gemm", "attention_fwd", "attention_bwd")]
    random.Random(0).shuffle(sample)
    errors: dict[tuple, list[float]] = {}
    for p in sample[:300]:
        t = prof.held_out(p).predict(p)
        if t is not None:
            errors.setdefault((p.op, p.dtype), []).append(abs(t / p.seconds - 1))
    assert len(errors) >= 4
    for kind, errs in errors.items():
        assert statistics.median(errs) <= 0.10, kind
    diff = CliRunner().invoke(app, ["profile", "diff", "H100", "H200"], env={"COLUMNS": "200"})
    assert diff.exit_code == 0 and "H200" in diff.output
