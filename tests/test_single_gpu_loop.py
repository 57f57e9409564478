"""Issue 49's loop, closed on one H100 (torch 2.11, CUDA 13.0): torchtitan-style training steps of
Llama-3.1-8B (2 and 4 blocks at 8k tokens; 3 blocks at 2 x 4k) and Qwen3-30B-A3B (1 and 2 blocks at 8k;
3 blocks at 2 x 4k) at full width, eager and compiled (bench/device/torchtitan_llama_step.py, the MoE from
bench/device/torchtitan_qwen3_moe.py), against the estimate under `--stack torchtitan`, from the catalog's
efficiencies and from the profile `shardscope calibrate` measured on the same GPU in the same lease.

The 2 x 4k runs were measured before the FSDP copies, the torchtitan MoE indexing and the clipping cost
were modelled, and first compared after: runs the model never saw. So were the eight steps measured on an
H200 after the model was done (same code; a GPU the loop had not been run on), estimated from the catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardscope
from shardscope.costs.fsdp import fsdp_copy_times_s

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "validation"
CATALOG = ROOT / "src" / "shardscope" / "models" / "catalog"
PROFILE = VALIDATION / "calibrate_h100.sql.gz"
RUNS = {
    "llama3.1-8b": ("torchtitan_llama_step_h100.json", "torchtitan_llama_step_4k_h100.json"),
    "qwen3-30b-a3b": ("torchtitan_qwen3_moe_step_h100.json", "torchtitan_qwen3_moe_step_4k_h100.json"),
}


def _measured(gpu: str = "h100") -> list[tuple[str, dict]]:
    out = []
    for model, files in RUNS.items():
        names = files if gpu == "h100" else [files[0].replace("_h100", f"_{gpu}")]
        for name in names:
            doc = json.loads((VALIDATION / name).read_text())
            out += [(model, r) for r in doc["configs"] if r.get("ok")]
    return out


def _estimate(model: str, run: dict, tmp: Path, profile: Path | None = None, gpu: str = "H100") -> shardscope.Estimate:
    cfg = json.loads((CATALOG / f"{model}.json").read_text()) | {"num_hidden_layers": run["n_layers"]}
    path = tmp / f"{model}-{run['n_layers']}.json"
    path.write_text(json.dumps(cfg))
    kw: dict = {"global_batch": run["batch"], "micro_batch": run["batch"], "seq_len": run["seq_len"]}
    if run["mode"] == "compile":
        kw["compile"] = True
    if profile is not None:
        kw["profile"] = str(profile)
    return shardscope.estimate(path, gpu, 1, stack="torchtitan", **kw)


def _errors(tmp: Path, profile: Path | None, gpu: str = "H100") -> list[tuple[str, float, float]]:
    rows = []
    for model, run in _measured(gpu.lower()):
        est = _estimate(model, run, tmp, profile, gpu)
        label = f"{model} {run['mode']} L{run['n_layers']} {run['batch']}x{run['seq_len']}"
        time_err = est.step_time_s * 1e3 / run["step_ms"] - 1
        rows.append((label, time_err, est.memory.peak_gib / run["peak_mem_gib"] - 1))
    return rows


def test_the_measured_runs_are_all_here() -> None:
    """Twelve runs: the two models, eager and compiled, two depths at 8k and one at 2 x 4k."""
    runs = _measured()
    assert len(runs) == 12
    assert {r["mode"] for _, r in runs} == {"eager", "compile"}
    assert {(m, r["seq_len"]) for m, r in runs} == {(m, s) for m in RUNS for s in (4096, 8192)}


def test_single_gpu_steps_from_the_catalog(tmp_path: Path) -> None:
    """From the catalog's efficiencies: every step within 10% in time and 6% in peak allocated memory,
    11 of 12 within 5% in memory (a compiled one-block Qwen3 step is +5.7%)."""
    rows = _errors(tmp_path, None)
    for label, time_err, mem_err in rows:
        assert abs(time_err) <= 0.10, (label, time_err)
        assert abs(mem_err) <= 0.06, (label, mem_err)
    assert sum(abs(m) <= 0.05 for _, _, m in rows) >= 11


def test_single_gpu_steps_from_the_calibrated_profile(tmp_path: Path) -> None:
    """From the profile calibrated on that H100: 11 of 12 steps within 10% in time (eager Qwen3 at 2 x 4k,
    -10.4%: GEMMs timed alone as CUDA-graph replays run faster than inside the step) and none past 12%."""
    rows = _errors(tmp_path, PROFILE)
    assert all(abs(t) <= 0.12 for _, t, _ in rows), rows
    assert sum(abs(t) <= 0.10 for _, t, _ in rows) >= 11, rows
    assert sum(abs(m) <= 0.05 for _, _, m in rows) >= 11, rows


def test_fsdp_copies_match_the_measured_kernels() -> None:
    """FSDP2's local copies on one GPU (`costs.fsdp`): the casts, copy-outs, `chunk_cat`, reduce copies and
    divides over flat parameters in the traced Qwen3-30B-A3B step (one block: 623 M parameters, embedding and
    output 311 M each) took 20.1 ms of GPU time; the model prices 17.3 ms."""
    doc = json.loads((VALIDATION / "torchtitan_qwen3_moe_step_traced_h100.json").read_text())
    ops = doc["configs"][0]["ops_by_shape_us"]
    flat_params = (311_164_928, 311_166_976, 201_326_592, 623_120_640)  # embedding, output, an expert weight, the block

    def fsdp_copy(name: str, shape: str) -> bool:
        copies = ("aten::copy_", "aten::_chunk_cat", "aten::div")
        return name in copies and any(f"[{n}]" in shape or f"[1, {n}]" in shape for n in flat_params)

    flat = [us for name, shape, us, _ in ops if fsdp_copy(name, shape)]
    measured_s = sum(flat) * 1e-6
    spec, cluster, plan = shardscope.setup("qwen3-30b-a3b", "H100", 1, stack="torchtitan", seq_len=8192)
    gpu = cluster.gpu
    block, embedding = 623_120_640, 311_164_928
    copies = [fsdp_copy_times_s(gpu, plan, n, 0.0, 2) for n in (block, embedding, embedding + 2048)]
    gathers = (2, 2, 1)  # blocks and the embedding are gathered again for backward, the output layer is not
    model_s = sum(g * gather + reduce for (gather, reduce), g in zip(copies, gathers, strict=True))
    assert measured_s == pytest.approx(0.0201, rel=0.01)
    assert model_s == pytest.approx(measured_s, rel=0.20)


def test_single_gpu_steps_on_an_h200(tmp_path: Path) -> None:
    """The same eight 8k-token steps on an H200 (4.8 TB/s HBM3e), measured after the model was done and
    estimated from the catalog's H200: every step within 8% in time and 6% in peak memory."""
    rows = _errors(tmp_path, None, "H200")
    assert len(rows) == 8
    for label, time_err, mem_err in rows:
        assert abs(time_err) <= 0.08, (label, time_err)
        assert abs(mem_err) <= 0.06, (label, mem_err)
