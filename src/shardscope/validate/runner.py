"""Predict every row of a validation CSV and summarise the errors by metric, source, GPU and arch."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shardscope.analytic.step import estimate_step
from shardscope.costs.host import moe_graphed
from shardscope.errors import ShardscopeError
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.validate.metrics import predicted_metric
from shardscope.validate.rows import SkipRow, case_from_row

REQUIRED_COLUMNS = {"id", "model", "gpu", "num_gpus", "seq_len", "metric", "value"}  # a training-run file
GROUPINGS = ("metric", "stack", "source", "gpu", "arch", "precision", "moe_layers")


@dataclass(frozen=True, slots=True)
class RowResult:
    id: str
    metric: str
    measured: float
    predicted: float
    error_pct: float  # (predicted - measured) / measured x 100
    stack: str  # the stack name the row states (releases grouped under it)
    source: str
    gpu: str
    arch: str
    precision: str
    model: str
    num_gpus: int
    moe_layers: str  # "graphed", "eager flat" or "eager deepep/hybridep" (`_moe_layers`); "" without MoE layers
    # The run was measured, so it fit: a row predicted not to fit (over the GPU's or the host's memory)
    # is a memory-model miss.
    fits: bool
    required_gib: float
    capacity_gib: float
    warnings: tuple[str, ...] = ()  # a model built from the columns, a nearest release, flags ignored


@dataclass(frozen=True, slots=True)
class Stats:
    n: int
    mape_pct: float
    bias_pct: float  # signed mean error
    spearman: float | None  # rank correlation of predicted vs measured (None for n < 3)


@dataclass(slots=True)
class ValidationReport:
    rows: list[RowResult]
    skipped: list[dict[str, str]]
    summary: dict[str, dict[str, Stats]] = field(default_factory=dict)
    overall: Stats | None = None

    def not_fitting(self) -> list[RowResult]:
        """Rows of measured runs that the memory model says would not fit."""
        return [r for r in self.rows if not r.fits]

    def to_dict(self) -> dict:
        return {
            "rows": [asdict(r) for r in self.rows],
            "skipped": self.skipped,
            "summary": {
                "overall": asdict(self.overall) if self.overall else None,
                **{g: {k: asdict(s) for k, s in groups.items()} for g, groups in self.summary.items()},
            },
        }


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman rank correlation (Pearson on average ranks); None when undefined."""
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (vx * vy) if vx and vy else None


def stats(rows: list[RowResult]) -> Stats:
    errs = [r.error_pct for r in rows]
    return Stats(
        n=len(rows),
        mape_pct=sum(abs(e) for e in errs) / len(errs),
        bias_pct=sum(errs) / len(errs),
        spearman=spearman([r.predicted for r in rows], [r.measured for r in rows]),
    )


def read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = REQUIRED_COLUMNS - set(reader.fieldnames or ())
            if missing:
                raise ShardscopeError(
                    f"{path}: missing columns {', '.join(sorted(missing))} (validate reads measured training runs "
                    "with the columns of shared/validation/training_public.csv)"
                )
            return list(reader)
    except FileNotFoundError:
        raise ShardscopeError(f"validation file not found: {path}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ShardscopeError(f"malformed CSV {path}: {exc}") from None


def _moe_layers(model: ModelSpec, plan: Plan) -> str:
    """How a row's MoE layers ran: "graphed" (a CUDA graph captures the whole MoE layer), else "eager flat"
    (Megatron's all-to-all dispatcher) or "eager deepep/hybridep" (its flex dispatcher); "" without any."""
    if not model.moe_layers:
        return ""
    if moe_graphed(plan):
        return "graphed"
    return "eager flat" if plan.ep_dispatch == "flat" else "eager deepep/hybridep"


def predict_row(row: dict[str, str]) -> RowResult:
    """Predict one row; raises SkipRow with the reason when it cannot."""
    case = case_from_row(row)
    est = estimate_step(case.model, case.cluster, case.plan)
    metric = row["metric"]
    value = predicted_metric(metric, row.get("flops_def", ""), case.model, est, row, case.stack)
    if value is None:
        raise SkipRow(f"unknown metric {metric!r}")
    measured = float(row["value"])
    return RowResult(
        id=row["id"],
        metric=metric,
        measured=measured,
        predicted=value,
        error_pct=100.0 * (value - measured) / measured,
        stack=case.stack.name,
        source=row.get("source", ""),
        gpu=row["gpu"],
        arch=row.get("arch", ""),
        precision=(row.get("precision") or "bf16").strip().lower(),
        model=row["model"],
        num_gpus=int(row["num_gpus"]),
        moe_layers=_moe_layers(case.model, case.plan),
        fits=est.fits,
        required_gib=est.memory.required_gib,
        capacity_gib=est.memory.capacity_gib,
        warnings=case.warnings,
    )


def run_validation(path: Path) -> ValidationReport:
    results: list[RowResult] = []
    skipped: list[dict[str, str]] = []
    for row in read_rows(Path(path)):
        try:
            results.append(predict_row(row))
        except SkipRow as exc:
            skipped.append({"id": row["id"], "reason": str(exc)})
        except (ShardscopeError, ValueError) as exc:
            skipped.append({"id": row["id"], "reason": f"invalid row: {exc}"})
    report = ValidationReport(rows=results, skipped=skipped)
    if results:
        report.overall = stats(results)
        for key in GROUPINGS:
            groups: dict[str, list[RowResult]] = {}
            for r in results:
                groups.setdefault(getattr(r, key), []).append(r)
            report.summary[key] = {k: stats(v) for k, v in sorted(groups.items())}
    return report
