"""`shardscope rl`: each phase's memory per GPU (colocated steps that do not fit are refused) and `--trace`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.hardware.catalog import make_cluster
from shardscope.rl.loop import rl, rl_step
from shardscope.rl.memory import PHASES, EngineMemory, TrainerState, offloaded_gib, rl_memory
from shardscope.rl.trace import rl_trace_events

MODEL = "llama3.1-70b"
SMALL = dict(prompts=32, samples=8, input_len=512, output_len=2048)
CLI_SMALL = ["--prompts", "32", "--samples", "8", "--input-len", "512", "--output-len", "2048"]
# Fits: TP8 x PP2 shards the update enough on 32 training GPUs; the engines get the other 32.
DISAGG = dict(gpus=64, train="tp8 pp2", rollout="tp8", placement="disaggregated", rollout_gpus=32)


def _one_line_error(res) -> str:  # noqa: ANN001
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


def _cli(*args: str):  # noqa: ANN202
    return CliRunner().invoke(app, ["rl", MODEL, *CLI_SMALL, *args])


# ----- the colocated memory check ----------------------------------------------------------------------------


def test_colocated_70b_on_too_few_gpus_is_refused_in_one_line() -> None:
    # 16 GPUs: the policy update alone (Megatron TP8, ZeRO-1 over dp2) needs more than an H100 holds
    line = _one_line_error(_cli("--gpus", "16", "--train", "tp8", "--rollout", "tp8"))
    assert "colocated" in line and "training phase" in line and "of 79.6" in line
    needed = float(line.split("needs ")[1].split(" GiB")[0])
    assert needed > 79.6
    # 64 GPUs keeping the trainer's state on the GPU while vLLM takes 92% of it: the generation phase overflows
    line = _one_line_error(_cli("--gpus", "64", "--train", "tp8", "--rollout", "tp8", "--trainer-offload", "none"))
    assert "generation phase" in line and "engine KV cache" in line and "policy state" in line


def test_disaggregated_or_larger_colocated_70b_is_accepted_and_fits() -> None:
    runner = CliRunner()
    for args in (
        ["--gpus", "64", "--train", "tp8", "--rollout", "tp8"],  # colocated, trainer offloaded while generating
        ["--gpus", "32", "--train", "tp8 pp2", "--rollout", "tp8"],
        ["--gpus", "64", "--train", "tp8 pp2", "--rollout", "tp8", "--placement", "disaggregated",
         "--rollout-gpus", "32", "--trainer-offload", "none"],
    ):  # fmt: skip
        res = runner.invoke(app, ["rl", MODEL, *CLI_SMALL, *args, "--json"])
        assert res.exit_code == 0, res.output
        mem = json.loads(res.output)["memory"]
        assert mem["fits"] and mem["capacity_gib"] == pytest.approx(79.6)
        for phase in PHASES:
            assert 0 < mem[f"{phase}_gib"] <= mem["capacity_gib"]
            entry = next(p for p in mem["phases"] if p["phase"] == phase)
            assert entry["peak_gib"] == pytest.approx(mem[f"{phase}_gib"])
            assert sum(entry["parts_gib"].values()) == pytest.approx(entry["peak_gib"])
        text = runner.invoke(app, ["rl", MODEL, *CLI_SMALL, *args])
        assert text.exit_code == 0 and "memory/GPU" in text.output and "generation" in text.output
        assert "warning" not in text.output.replace("rollout and training cannot overlap", "")


def test_phases_hold_the_estimators_and_the_engines_numbers() -> None:
    s = rl_step(MODEL, gpus=64, train="tp8", rollout="tp8", **SMALL)
    gen, train, sync = (s.memory.phase(p) for p in PHASES)
    # training: the estimator's required memory for the update, plus the sleeping engine's graphs/context
    assert train.parts["policy update"] == pytest.approx(s.train.peak_gib)
    assert train.peak_gib > s.train.peak_gib
    # generation: vLLM sizes weights + activations + graphs + KV to gpu_memory_utilization x HBM
    engine = gen.parts["engine weights"] + gen.parts["engine KV cache"] + gen.parts["engine runtime"]
    assert engine == pytest.approx(s.memory.gpu_memory_utilization * 79.6)
    assert gen.parts["engine weights"] == pytest.approx(s.rollout.weights_gib_per_gpu)
    assert "policy state" not in gen.parts  # offload all (the default): nothing of the trainer's but its context
    # sync: the trainer's params beside the engine's weights, no KV cache yet (verl resumes it after the update)
    assert sync.parts["policy state"] == pytest.approx(s.train.params_gib)
    assert "engine KV cache" not in sync.parts and sync.parts["sync buffer"] > 0
    # offloading costs PCIe time: every offloaded GiB out and back, inside the hand-over
    pcie = make_cluster("H100", 64).gpu.pcie_gbps * 1e9
    assert s.trainer_offload_s == pytest.approx(2 * s.memory.offloaded_gib * 2**30 / pcie)
    assert s.handover_s == pytest.approx(s.trainer_offload_s) and s.trainer_offload_s > 0


def _trainer(grads_kept: bool = True) -> TrainerState:
    return TrainerState(params_gib=10, grads_gib=20, optimizer_gib=15, update_gib=60, persistent_grads=grads_kept)


ENGINE = EngineMemory(weights_gib=10, kv_cache_gib=30, runtime_gib=2, sleeping_gib=1.5, gpu_memory_utilization=0.5)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_more_offload_never_holds_more(algo: str) -> None:
    peaks = {}
    for offload in ("none", "optimizer", "all"):
        m = rl_memory("colocated", algo, _trainer(), ENGINE, 80.0, offload, 4.0)
        peaks[offload] = {p.phase: p.peak_gib for p in m.phases}
        assert m.offloaded_gib == pytest.approx(offloaded_gib(_trainer(), offload, algo == "ppo"))
    for phase in PHASES:
        assert peaks["none"][phase] >= peaks["optimizer"][phase] >= peaks["all"][phase]
    assert peaks["none"]["generation"] > peaks["all"]["generation"]
    # generation under `all`: the engine awake plus the trainer's CUDA context only
    assert peaks["all"]["generation"] == pytest.approx(10 + 30 + 2 + 1.0)
    # under `none`: the policy's state (params, kept grads, optimizer) and the reference's weights too
    extra = (10 + 20 + 15) + 10 + ((10 + 20 + 15) if algo == "ppo" else 0)
    assert peaks["none"]["generation"] == pytest.approx(10 + 30 + 2 + 1.0 + extra)
    # a stack that frees its gradients (set_to_none) holds and moves less
    freed = rl_memory("colocated", algo, _trainer(grads_kept=False), ENGINE, 80.0, "none", 4.0)
    assert freed.phase("generation").peak_gib == pytest.approx(peaks["none"]["generation"] - 20 * (1 + (algo == "ppo")))
    assert offloaded_gib(_trainer(), "none", algo == "ppo") == 0
    assert offloaded_gib(_trainer(), "all", False) > offloaded_gib(_trainer(), "optimizer", False) > 0


def test_disaggregated_phases_sit_on_their_own_pools() -> None:
    m = rl_memory("disaggregated", "grpo", _trainer(), ENGINE, 80.0, "none", 4.0)
    assert m.phase("generation").pool == "rollout" and m.phase("training").pool == "train"
    assert m.phase("generation").peak_gib == pytest.approx(42.0)  # the engine alone
    assert m.phase("training").peak_gib == pytest.approx(60 + 10)  # the update beside the reference weights
    assert m.offloaded_gib == 0


def test_utilization_and_offload_options() -> None:
    low = rl_step(MODEL, gpus=64, train="tp8", rollout="tp8", gpu_memory_utilization=0.5, **SMALL)
    high = rl_step(MODEL, gpus=64, train="tp8", rollout="tp8", **SMALL)
    assert low.memory.gpu_memory_utilization == 0.5
    assert low.memory.phase("generation").peak_gib < high.memory.phase("generation").peak_gib
    assert any("gpu-memory-utilization" in w for w in low.warnings)
    for args in (
        ["--gpus", "64", "--train", "tp8", "--rollout", "tp8", "--gpu-memory-utilization", "1.5"],
        ["--gpus", "64", "--train", "tp8", "--rollout", "tp8", "--trainer-offload", "sometimes"],
        ["--gpus", "64", "--train", "tp8", "--rollout", "tp8", "--placement", "disaggregated",
         "--trainer-offload", "all"],
        # 0.2 x 80 GiB cannot hold a TP2 shard of 70B weights: no KV cache
        ["--gpus", "64", "--train", "tp8", "--rollout", "tp2", "--gpu-memory-utilization", "0.2"],
    ):  # fmt: skip
        _one_line_error(_cli(*args))


# ----- --trace -----------------------------------------------------------------------------------------------


def _spans(events: list[dict], cat: str, named: str) -> list[dict]:
    """The whole-phase spans of a category (not their parts), e.g. every 'rollout k'."""
    return [e for e in events if e["ph"] == "X" and e.get("cat") == cat and e["name"].startswith(named)]


def _overlap(a: dict, b: dict) -> bool:
    eps = 0.01  # microseconds: the trace rounds to 1 ns
    return a["ts"] < b["ts"] + b["dur"] - eps and b["ts"] < a["ts"] + a["dur"] - eps


def _check_well_formed(events: list[dict]) -> None:
    assert events
    for e in events:
        assert e["ph"] in ("X", "M", "C") and isinstance(e["pid"], int) and "name" in e
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["ts"] >= 0 and e["dur"] >= 0
            assert isinstance(e["args"]["iteration"], int)
        if e["ph"] == "C":
            assert e["ts"] >= 0 and e["args"]["gib"] > 0
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"} <= named  # every thread drawn is named


def _check_in_order(events: list[dict], steps: int) -> None:
    for cat, named in (("generation", "rollout"), ("training", "train"), ("sync", "weight sync")):
        for pid in {e["pid"] for e in _spans(events, cat, named)}:
            spans = sorted((e for e in _spans(events, cat, named) if e["pid"] == pid), key=lambda e: e["ts"])
            its = [e["args"]["iteration"] for e in spans]
            assert its == sorted(its) and len(set(its)) == len(its)
            assert its == list(range(steps)) or cat == "generation"
            for a, b in zip(spans, spans[1:], strict=False):  # one pool does one phase of a kind at a time
                assert a["ts"] + a["dur"] <= b["ts"] + 0.01


@pytest.mark.parametrize("mode", ["sync", "one-step-off", "async"])
@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_trace_is_well_formed_in_order_and_overlaps_only_when_it_may(placement: str, mode: str) -> None:
    kw = DISAGG if placement == "disaggregated" else dict(gpus=64, train="tp8", rollout="tp8")
    s = rl_step(MODEL, mode=mode, staleness=2, **{**kw, "placement": placement}, **SMALL)
    events = rl_trace_events(s, steps=3)
    _check_well_formed(events)
    _check_in_order(events, 3)
    gen, train = _spans(events, "generation", "rollout"), _spans(events, "training", "train")
    overlapping = any(_overlap(g, t) for g in gen for t in train)
    assert overlapping == (placement == "disaggregated" and mode != "sync")
    # overlapped, the rollout of the step after the last runs beside it (the last sync waits for it)
    assert len(train) == 3 and len(gen) == 3 + overlapping
    # the trace keeps the step's time: one weight sync per step, step_s apart, in every mode
    syncs = sorted({e["ts"] for e in _spans(events, "sync", "weight sync")})
    assert len(syncs) == 3
    for a, b in zip(syncs, syncs[1:], strict=False):
        assert (b - a) / 1e6 == pytest.approx(s.step_s, rel=1e-9)
    # the training of step k never starts before its rollout ends (it trains on those samples)
    for t in train:
        g = next(g for g in gen if g["args"]["iteration"] == t["args"]["iteration"])
        assert t["ts"] >= g["ts"] + g["dur"] - 0.01


def test_cli_trace_writes_perfetto_json(tmp_path: Path) -> None:
    out = tmp_path / "rl.json"
    res = _cli("--gpus", "64", "--train", "tp8 pp2", "--rollout", "tp8", "--placement", "disaggregated",
               "--rollout-gpus", "32", "--mode", "one-step-off", "--trace", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["displayTimeUnit"] == "ms" and doc["metadata"]["mode"] == "one-step-off"
    events = doc["traceEvents"]
    _check_well_formed(events)
    pools = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(p.startswith("rollout pool") for p in pools) and any(p.startswith("train pool") for p in pools)
    # --search-split traces the best split; a folder is no file name: one line, exit 2
    found = rl(MODEL, search=True, gpus=64, train="tp8 pp2", rollout="tp8", trace=tmp_path / "s.json", **SMALL)
    assert json.loads((tmp_path / "s.json").read_text())["metadata"]["step_s"] == pytest.approx(found.step.step_s)
    _one_line_error(_cli("--gpus", "64", "--train", "tp8", "--rollout", "tp8", "--trace", str(tmp_path)))
