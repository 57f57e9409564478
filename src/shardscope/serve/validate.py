"""Predict every row of a measured-serving CSV (the schema of `validation/inference_public.csv`) from its
columns alone and report the errors, as `shardscope validate` does for training runs.

Settings come only from the columns model, gpu, num_gpus, tp, pp, precision, input_len, output_len,
batch_or_concurrency, metric and engine (never from id, source or notes):

- `batch_or_concurrency` says the load: "offline ... num_requests=N" (all requests at t = 0; N requests,
  1000 when not stated), "QPS=x" (Poisson arrivals at x requests/s, "num_requests=N" of them where the cell
  states it, else `ONLINE_REQUESTS`; "QPS=INF" all at once), "static batch_size=B" / "batch_size=B" (B
  prompts run together as one prefill, then decode steps of B sequences: a profile of the kernels, no
  scheduler).
- `engine` names the serving software: a shipped engine file (`trtllm@0.17`); a release that is not shipped
  runs the engine's shipped settings and says so; blank or `fastertransformer` only for static batches,
  priced as eager kernels (no CUDA graph, no host cost per iteration).
- `precision` FP8 → FP8 weights; FP4/NVFP4 → NVFP4 weights (NVIDIA's ModelOpt FP4 checkpoints); FP16/BF16 →
  16-bit. The KV cache's dtype is the engine's rule for that precision (`Engine.kv_dtype`: TensorRT-LLM's
  FP8 and NVFP4 checkpoints carry an FP8 KV cache); static batches 16-bit.

Offline throughput over N requests is the benchmark's output tokens over its duration. Simulating tens of
thousands of requests per row is slow, so the duration is extrapolated linearly from two shorter runs of
n and 2n requests (n at least twice the requests the replica holds at once): once the batch is in steady
state each further request adds the same time, and the ramp and drain are the same in both runs.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shardscope.costs.host import CPP_LAUNCH_S, LAUNCH_S
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.serve.cost import Batch, Deployment, IterationCost, weights_bytes_per_gpu
from shardscope.serve.engine import Engine, engine_names, load_engine
from shardscope.serve.estimate import ServeResult, serve_estimate
from shardscope.serve.simulator import window_keys

INFERENCE_COLUMNS = {
    "id", "model", "gpu", "num_gpus", "tp", "pp", "precision", "input_len", "output_len",
    "batch_or_concurrency", "metric", "value", "engine",
}  # fmt: skip
ONLINE_REQUESTS = 1000  # requests of an online row whose columns do not say (the `serve` default)
OFFLINE_REQUESTS = 1000
GROUPINGS = ("metric", "engine", "gpu", "metric/engine/gpu")

ONLINE_METRICS = {
    "request_throughput_req_per_s": lambda r: r.requests_per_s,
    "output_throughput_tokens_per_s": lambda r: r.output_tokens_per_s,
    "total_token_throughput_tokens_per_s": lambda r: r.input_tokens_per_s + r.output_tokens_per_s,
    "mean_ttft_ms": lambda r: r.ttft.mean_ms,
    "mean_itl_ms": lambda r: r.itl.mean_ms,
    "mean_tpot_ms": lambda r: r.tpot.mean_ms,
    "mean_e2e_latency_ms": lambda r: r.e2e.mean_ms,
}
PREFILL_METRICS = ("prompt_time_ms", "prefill_latency_ms")
DECODE_METRICS = ("token_time_ms_per_token", "decode_latency_ms_per_token")
STATIC_METRICS = (*PREFILL_METRICS, *DECODE_METRICS, "total_latency_ms")


class SkipRow(Exception):
    """A row that cannot be predicted from its columns; the message says why."""


def is_inference_file(columns: set[str] | list[str]) -> bool:
    """Whether a CSV header is the measured-serving schema."""
    return set(columns) >= INFERENCE_COLUMNS


@dataclass(frozen=True, slots=True)
class InfRow:
    id: str
    metric: str
    engine: str
    gpu: str
    model: str
    measured: float
    predicted: float
    error_pct: float
    note: str = ""
    # a prefill measured faster than its GEMMs can run at the GPUs' dense peak: the compute floor it is
    # under (ms), else 0. The row stays in every MAPE; the report names it.
    below_floor_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class InfStats:
    n: int
    mape_pct: float
    bias_pct: float


@dataclass(slots=True)
class InfReport:
    rows: list[InfRow]
    skipped: list[dict[str, str]] = field(default_factory=list)
    overall: InfStats | None = None
    summary: dict[str, dict[str, InfStats]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": asdict(self.overall) if self.overall else None,
            "summary": {g: {k: asdict(s) for k, s in v.items()} for g, v in self.summary.items()},
            "rows": [asdict(r) for r in self.rows],
            "skipped": self.skipped,
        }


def _stats(rows: list[InfRow]) -> InfStats:
    errs = [r.error_pct for r in rows]
    return InfStats(len(errs), sum(map(abs, errs)) / len(errs), sum(errs) / len(errs))


def _model_name(cell: str) -> str:
    """The catalog model a row names ("LLaMA v3.1 70B" reads as llama3.1-70b)."""
    from shardscope.validate.rows import _catalog_name

    name = _catalog_name(re.sub(r"(?i)\bv(?=\d)", "", cell).replace(" ", ""))
    if name is None:
        raise SkipRow(f"model {cell!r} is not in the catalog")
    return name


def _int(row: dict[str, str], key: str) -> int:
    try:
        return int(float(row[key]))
    except (KeyError, ValueError):
        raise SkipRow(f"no {key} in the row") from None


def _engine(cell: str, gpu_name: str, static: bool) -> tuple[Engine | None, str]:
    """The engine a row's `engine` cell names (None: static-batch kernels only) and a note."""
    from shardscope.hardware.catalog import load_gpu

    cell = cell.strip().lower()
    name, _, release = cell.partition("@")
    if not name or name == "fastertransformer":
        if not static:
            raise SkipRow(f"engine {cell or '(blank)'} is simulated only for static batches")
        return None, ""
    if name not in engine_names():
        raise SkipRow(f"engine {name!r} is not shipped (known: {', '.join(engine_names())})")
    gpu = load_gpu(gpu_name)
    try:
        return load_engine(cell, gpu), ""
    except ShardscopeError:
        eng = load_engine(name, gpu)
        return eng, f"release {release} not shipped; ran {eng.label}'s settings"


def _static_engine(cell: str) -> Engine:
    """A static batch run by kernels alone: no CUDA graph, no per-iteration host cost; each kernel issued from
    C++ by FasterTransformer, from Python by an engine the row does not name (eager PyTorch, as research
    profiles of the time ran)."""
    launch = CPP_LAUNCH_S if cell.strip().lower() == "fastertransformer" else LAUNCH_S
    return Engine(
        name="static", release="-", title="static batch (kernels only)", policy="fcfs", chunked_prefill=False,
        kv_admission="reserve_full", max_num_batched_tokens=1 << 30, max_num_seqs=1 << 30, block_size=1,
        memory_rule="free_fraction", gpu_memory_utilization=1.0, reserved_gib=0.0, kv_free_fraction=1.0,
        cuda_graph_max_batch=0, cuda_graph_pool_gib=0.0, non_torch_gib=0.0, host_s_per_iteration=0.0,
        host_s_per_kernel=launch, sources=(),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Case:
    """The settings of one row, minus its metric (rows that differ only in metric share a simulation)."""

    model: str
    gpu: str
    gpus: int
    tp: int
    precision: str
    isl: int
    osl: int
    load: str  # "offline" | "poisson" | "static"
    rate: float
    requests: int  # offline / online: requests in the benchmark; static: the batch size
    engine: str


# A row's `precision` cell -> the weight format it runs (`models.quant.WEIGHT_FORMATS`)
ROW_WEIGHT_FORMATS = {"fp8": "fp8", "fp4": "nvfp4", "nvfp4": "nvfp4", "fp16": "bf16", "bf16": "bf16"}


def _requests(load: str, default: int) -> int:
    """The benchmark's request count a load cell states ("num_requests=N"), else `default`."""
    m = re.search(r"num_requests\s*=\s*(\d+)", load)
    return int(m.group(1)) if m else default


def _case(row: dict[str, str]) -> tuple[_Case, str]:
    load = row["batch_or_concurrency"].strip().lower()
    if _int(row, "pp") != 1:
        raise SkipRow("pipeline-parallel serving is not modelled")
    if m := re.search(r"batch_size\s*=\s*(\d+)", load):
        kind, rate, n = "static", math.inf, int(m.group(1))
    elif m := re.search(r"qps\s*=\s*([0-9.]+|inf)", load):
        rate = float(m.group(1))
        kind, n = ("offline" if math.isinf(rate) else "poisson"), _requests(load, ONLINE_REQUESTS)
    elif "offline" in load or "infinite" in load:
        kind, rate, n = "offline", math.inf, _requests(load, OFFLINE_REQUESTS)
    else:
        raise SkipRow(f"load {row['batch_or_concurrency']!r} not understood")
    precision = row["precision"].strip().lower()
    if precision not in ROW_WEIGHT_FORMATS:
        raise SkipRow(f"precision {precision!r} not modelled")
    from shardscope.hardware.catalog import load_gpu

    try:
        gpu = load_gpu(row["gpu"]).name
    except ShardscopeError:
        raise SkipRow(f"GPU {row['gpu']!r} is not in the catalog") from None
    _, note = _engine(row.get("engine", ""), gpu, kind == "static")
    case = _Case(
        _model_name(row["model"]), gpu, _int(row, "num_gpus"), _int(row, "tp"),
        ROW_WEIGHT_FORMATS[precision], _int(row, "input_len"), _int(row, "output_len"),
        kind, rate, n, row.get("engine", "").strip().lower(),
    )  # fmt: skip
    return case, note


def _serve(case: _Case, requests: int) -> ServeResult:
    try:
        return serve_estimate(
            case.model, case.gpu, case.gpus, tp=case.tp, engine=_engine_spec(case.engine), precision=case.precision,
            rate=case.rate, num_prompts=requests, input_len=case.isl, output_len=case.osl,
        )  # fmt: skip
    except ShardscopeError as exc:
        raise SkipRow(str(exc)) from None


def _engine_spec(cell: str) -> str:
    """The engine spec serve_estimate takes: the cell, or its name alone when the release is not shipped."""
    name = cell.partition("@")[0]
    try:
        load_engine(cell, make_cluster("H100", 1).gpu)
        return cell
    except ShardscopeError:
        return name


def _offline_throughput(case: _Case) -> float:
    """Output tokens/s of `case.requests` requests all sent at t = 0, extrapolated from n and 2n."""
    probe = _serve(case, 1)
    eng = load_engine(_engine_spec(case.engine), make_cluster(case.gpu, 1).gpu)
    held = min(eng.max_num_seqs, max(1, math.floor(probe.max_concurrency_at_full_length)))
    n = max(64, 2 * held)
    if case.requests <= 2 * n:
        return _serve(case, case.requests).output_tokens_per_s
    t1 = _serve(case, n).duration_s
    t2 = _serve(case, 2 * n).duration_s
    duration = t2 + (case.requests - 2 * n) * (t2 - t1) / n
    return case.requests * case.osl / duration


def _static(case: _Case) -> tuple[float, float, float, float]:
    """(prefill s, mean decode step s, total s, prefill floor s) of a static batch: B prompts in one forward
    pass, then output_len − 1 decode steps of B sequences (the first token comes from the prefill); the floor
    is `prefill_floor_s`."""
    from shardscope.models.catalog import load_model

    cluster = make_cluster(case.gpu, case.gpus)
    d = Deployment(load_model(case.model), cluster, case.tp, case.precision)
    if weights_bytes_per_gpu(d) > cluster.gpu.hbm_gib * (1 << 30):
        raise SkipRow(f"{case.model} weights do not fit {case.tp}x {case.gpu}")
    cost = IterationCost(d, _static_engine(case.engine))
    b, isl, w = case.requests, case.isl, d.model.attention_window if cost.window_layers else 0
    pairs = isl * (isl + 1) / 2
    prefill = cost.time_s(Batch(b * isl, b * pairs, b * window_keys(0, isl, w), sampled=b))
    steps = [cost.decode_time_s(b, b * (isl + j), b * (min(isl + j, w) if w else isl + j)) for j in range(1, case.osl)]
    decode = sum(steps) / len(steps) if steps else math.nan
    return prefill, decode, prefill + sum(steps), prefill_floor_s(d, case)


def prefill_floor_s(d: Deployment, case: _Case) -> float:
    """The least time a static batch's prompts can take: the weight GEMMs' FLOPs (2 per parameter and token,
    embedding and LM head left out, attention not counted) at the dense peak of the TP group's GPUs in the
    fastest precision the deployment's GEMMs run (`Deployment.gemm`)."""
    spec, gpu = d.model, d.cluster.gpu
    params = spec.params_active - spec.embedding_params - spec.lm_head_params
    peak = max(gpu.peak_tflops(d.gemm(experts)[0]) for experts in (False, True))
    return 2.0 * params * case.requests * case.isl / (case.tp * peak * 1e12)


def run_inference_validation(path: Path) -> InfReport:
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except FileNotFoundError:
        raise ShardscopeError(f"validation file not found: {path}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ShardscopeError(f"malformed CSV {path}: {exc}") from None
    cache: dict[tuple[_Case, str], Any] = {}
    results: list[InfRow] = []
    skipped: list[dict[str, str]] = []
    for row in rows:
        try:
            case, note = _case(row)
            metric = row["metric"].strip()
            key = (case, "static" if case.load == "static" else ("offline" if metric.startswith("throughput") else ""))
            if key not in cache:
                try:
                    if case.load == "static":
                        cache[key] = _static(case)
                    elif key[1] == "offline":
                        cache[key] = _offline_throughput(case)
                    else:
                        cache[key] = _serve(case, case.requests)
                except SkipRow as exc:
                    cache[key] = exc
            got = cache[key]
            if isinstance(got, SkipRow):
                raise got
            floor_ms = 0.0  # a prompt's compute floor, where the row measures one
            if case.load == "static":
                if metric not in STATIC_METRICS:
                    raise SkipRow(f"metric {metric!r} is not predicted for a static batch")
                prefill, decode, total, floor = got
                value = (prefill if metric in PREFILL_METRICS else decode if metric in DECODE_METRICS else total) * 1e3
                floor_ms = floor * 1e3 if metric in PREFILL_METRICS else 0.0
            elif key[1] == "offline":
                if metric != "throughput_tokens_per_s":
                    raise SkipRow(f"metric {metric!r} is not predicted")
                value = got
            else:
                if metric not in ONLINE_METRICS:
                    raise SkipRow(f"metric {metric!r} is not predicted")
                value = ONLINE_METRICS[metric](got)
            measured = float(row["value"])
        except SkipRow as exc:
            skipped.append({"id": row.get("id", ""), "reason": str(exc)})
            continue
        except (ValueError, KeyError) as exc:
            skipped.append({"id": row.get("id", ""), "reason": f"invalid row: {exc}"})
            continue
        results.append(
            InfRow(
                id=row["id"],
                metric=metric,
                engine=case.engine or "(blank)",
                gpu=case.gpu,
                model=case.model,
                measured=measured,
                predicted=value,
                error_pct=100.0 * (value - measured) / measured,
                note=note,
                below_floor_ms=floor_ms if measured < floor_ms else 0.0,
            )  # fmt: skip
        )
    report = InfReport(rows=results, skipped=skipped)
    if results:
        report.overall = _stats(results)
        for g in GROUPINGS:
            groups: dict[str, list[InfRow]] = {}
            for r in results:
                k = f"{r.metric} / {r.engine} / {r.gpu}" if g == "metric/engine/gpu" else getattr(r, g)
                groups.setdefault(k, []).append(r)
            report.summary[g] = {k: _stats(v) for k, v in sorted(groups.items())}
    return report


def print_inference_validation(report: InfReport, show_rows: bool = True) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console()
    if show_rows:
        t = Table(title="Measured serving rows", title_justify="left")
        for c in ("id", "metric", "engine", "gpu", "model", "measured", "predicted", "error"):
            t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
        for r in report.rows:
            t.add_row(r.id, r.metric, r.engine, r.gpu, r.model, f"{r.measured:,.4g}", f"{r.predicted:,.4g}",
                      f"{r.error_pct:+.1f}%")  # fmt: skip
        out.print(t)
    for g, groups in report.summary.items():
        t = Table(title=f"MAPE by {g}", title_justify="left")
        for c in (g, "rows", "MAPE", "mean error"):
            t.add_column(c, justify="left" if c == g else "right")
        for k, s in groups.items():
            t.add_row(k, str(s.n), f"{s.mape_pct:.1f}%", f"{s.bias_pct:+.1f}%")
        out.print(t)
    if report.overall:
        o = report.overall
        out.print(f"all predicted rows: {o.n}, MAPE {o.mape_pct:.1f}%, mean error {o.bias_pct:+.1f}%")
    under = [r for r in report.rows if r.below_floor_ms]
    if under:
        listed = ", ".join(f"{r.id} ({r.measured:,.0f} < {r.below_floor_ms:,.0f} ms)" for r in under)
        out.print(
            f"measured faster than the GPUs' dense peak allows (prompt GEMMs alone; kept in every MAPE): {listed}"
        )
    notes = sorted({r.note for r in report.rows if r.note})
    for n in notes:
        out.print(f"note: {n}")
    reasons: dict[str, int] = {}
    for s in report.skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    out.print(f"skipped rows: {len(report.skipped)}")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        out.print(f"  {count:4d}  {reason}")
