"""Read one of NVIDIA aiconfigurator's measured performance tables at the commit this project's CSVs were
read at. Used by the extraction tools beside it, run inside a clone of github.com/ai-dynamo/aiconfigurator
with `pyarrow` installed."""

from __future__ import annotations

import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

REV = "095f58a"  # the aiconfigurator commit the CSVs were read at
DATA = "aic-core/src/aiconfigurator_core/systems/data"


def read_table(system: str, op: str, engine: str, release: str) -> list[dict]:
    """Rows of `<system>/<op>/<engine>/<release>/<op>_perf.parquet` (op: gemm, moe, ...) at `REV`."""
    blob = subprocess.run(
        ["git", "show", f"{REV}:{DATA}/{system}/{op}/{engine}/{release}/{op}_perf.parquet"],
        capture_output=True,
        check=True,
    ).stdout
    return pq.read_table(pa.BufferReader(blob)).to_pylist()
