"""The measured runs with stated settings (`validation/published_moe_runs.csv`, and the dense GB300 runs of
`validation/published_dense_runs.csv`), as the tests load them."""

from __future__ import annotations

from pathlib import Path

from shardscope.validate.rows import RowCase, case_from_row
from shardscope.validate.runner import read_rows

PUBLISHED_MOE_RUNS = Path(__file__).resolve().parents[1] / "validation" / "published_moe_runs.csv"
PUBLISHED_DENSE_RUNS = PUBLISHED_MOE_RUNS.with_name("published_dense_runs.csv")


def published_case(row_id: str) -> RowCase:
    """The case (model, cluster, plan) of one measured run."""
    path = PUBLISHED_DENSE_RUNS if row_id.startswith("MD-") else PUBLISHED_MOE_RUNS
    return case_from_row(next(r for r in read_rows(path) if r["id"] == row_id))
