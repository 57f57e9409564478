"""Predict every row of an RL weight-sync validation CSV (the schema of
`validation/rl_weight_sync_public.csv`) from its columns alone, and score it by the range rule: a prediction
inside [value_low_s, value_high_s] has zero error, outside it the error is to the nearer end.

Settings come only from the columns model, precision, gpu, train_gpus, train_layout, rollout_gpus,
rollout_layout, placement and mechanism (never from id, source or notes). A blank train layout with a stated
GPU count reads as the weights sharded evenly over those GPUs (checkpoint-engine's host shards). A row whose
layouts are not stated, or whose model or GPU the catalogs lack, is skipped with the reason.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shardscope.errors import ShardscopeError
from shardscope.models.catalog import load_model
from shardscope.rl.layout import FSDP, TrainLayout, parse_rollout, parse_train
from shardscope.rl.sync import predict_sync, setup

RL_COLUMNS = {
    "id", "model", "precision", "gpu", "train_gpus", "train_layout", "rollout_gpus", "rollout_layout",
    "placement", "mechanism", "value_low_s", "value_high_s",
}  # fmt: skip


def is_rl_sync_file(columns: set[str] | list[str]) -> bool:
    """Whether a CSV header is the RL weight-sync schema."""
    return set(columns) >= RL_COLUMNS


def mechanism_from_text(text: str) -> tuple[str, bool]:
    """The mechanism a row's `mechanism` cell names, and whether experts are destination-local
    (False where it says every rollout rank receives full experts)."""
    t = text.lower()
    local = "full experts" not in t
    if "nixl" in t or "rdma" in t or "one-sided" in t:
        return "rdma", local
    if "checkpoint-engine" in t or "checkpoint engine" in t:
        return ("ckpt-p2p" if "p2p" in t else "ckpt-broadcast"), local
    if "reshard" in t:
        return "reshard", local
    if "ipc" in t:
        return "ipc", local
    if "broadcast" in t:
        return "broadcast", local
    raise ShardscopeError(f"cannot tell the mechanism from {text!r}")


def range_error_pct(predicted: float, low: float, high: float) -> float:
    """Signed error to the nearer end of [low, high]; 0 inside."""
    if low <= predicted <= high:
        return 0.0
    end = low if predicted < low else high
    return (predicted - end) / end * 100.0


@dataclass(frozen=True, slots=True)
class RLRow:
    id: str
    model: str
    gpu: str
    mechanism: str
    local_experts: bool
    train: str
    rollout: str
    placement: str
    low_s: float
    high_s: float
    predicted_s: float
    error_pct: float
    bottleneck: str


@dataclass(slots=True)
class RLReport:
    rows: list[RLRow]
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def mape_pct(self) -> float:
        return sum(abs(r.error_pct) for r in self.rows) / len(self.rows) if self.rows else float("nan")

    def to_dict(self) -> dict:
        return {"rows": [asdict(r) for r in self.rows], "skipped": self.skipped, "mape_pct": self.mape_pct}


def _int(cell: str) -> int | None:
    cell = cell.strip()
    return int(cell) if cell else None


def predict_row(row: dict[str, str]) -> RLRow:
    mechanism, local = mechanism_from_text(row["mechanism"])
    if not row["rollout_layout"].strip():
        raise ShardscopeError("rollout layout not stated")
    rollout = parse_rollout(row["rollout_layout"], _int(row["rollout_gpus"]))
    train_gpus = _int(row["train_gpus"])
    if row["train_layout"].strip():
        train = parse_train(row["train_layout"], train_gpus)
    elif train_gpus:
        train = TrainLayout(FSDP, fsdp=train_gpus)
    else:
        raise ShardscopeError("train layout not stated")
    model = load_model(row["model"])
    s = setup(
        model, row["gpu"], train, rollout, row["placement"].strip().lower(),
        precision=row["precision"].strip().lower() or "bf16", local_experts=local,
    )  # fmt: skip
    (estimate,) = predict_sync(s, mechanism)
    low, high = float(row["value_low_s"]), float(row["value_high_s"])
    return RLRow(
        id=row["id"], model=model.name, gpu=s.gpu.name, mechanism=mechanism, local_experts=local,
        train=train.label(), rollout=rollout.label(), placement=s.placement, low_s=low, high_s=high,
        predicted_s=estimate.total_s, error_pct=range_error_pct(estimate.total_s, low, high),
        bottleneck=estimate.bottleneck,
    )  # fmt: skip


def run_rl_validation(path: Path) -> RLReport:
    try:
        with Path(path).open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = reader.fieldnames or []
    except OSError as exc:
        raise ShardscopeError(f"cannot read {path}: {exc.strerror}") from None
    if not is_rl_sync_file(columns):
        missing = sorted(RL_COLUMNS - set(columns))
        raise ShardscopeError(f"{path} is not an RL weight-sync file (missing columns {', '.join(missing)})")
    report = RLReport(rows=[])
    for row in rows:
        try:
            report.rows.append(predict_row(row))
        except ShardscopeError as exc:
            # The first clause is the reason; the catalog listing that may follow it is noise here.
            report.skipped.append({"id": row["id"], "reason": str(exc).split(" (valid:")[0]})
    return report
