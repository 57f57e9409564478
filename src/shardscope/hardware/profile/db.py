"""The profile database: measured kernel and collective times of one machine, in SQLite (stdlib `sqlite3`).

Schema (`SCHEMA`, version `SCHEMA_VERSION`):

* `meta(key, value)`: `schema_version`, `name` (the profile's name, e.g. "H100"), `gpu` (the catalog GPU it
  describes, `hardware.catalog.load_gpu` name) and free-form `notes`.
* `conditions`: one row per measuring session: the device's marketing name, SM count, SM and memory
  clocks (MHz), board power limit (W), memory (GiB), driver, CUDA, torch, cuDNN and NCCL versions, host
  name, date, and where the numbers came from (`source`: `calibrate` or a file the project holds).
* `measurement`: one row per measured point, tied to its `conditions` row. `op` says what was timed and
  which columns describe it (the others are NULL):
    - `gemm`: `groups` independent (`m`, `n`, `k`) problems (`groups` 1: a dense GEMM; more: a grouped
      GEMM, MoE experts, issued as Transformer Engine issues them), `dtype` bf16 / fp8; `variant` the pass
      it stands for (fwd / dgrad / wgrad; informational: lookups pool them).
    - `attention_fwd` / `attention_bwd`: flash attention over `batch` x `heads` sequences of `seq` queries,
      query-key head dim `head_dim`, value head dim `head_dim_v`, `causal`, a sliding `window` (0: none),
      `sinks` (a learned sink logit per head), `backend` (cudnn / fa2 / ...); `flops` as the estimator
      counts them (2 x (d + dv) per query-key pair and head, backward 2.5x).
    - `elementwise`: a streaming kernel moving `nbytes` (read + write); `variant` contiguous / aten.
    - `all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`, `send_recv`: NCCL over `ranks` GPUs of
      `nbytes` per rank (the full buffer for all-reduce, the gathered output for all-gather, the input
      for reduce-scatter); `variant` intra-node / inter-node.
    - `host_launch`, `host_alloc`: host seconds per kernel launch / `torch.empty` (`variant` names the call).
  `seconds` is the measured GPU time of one call (host time for `host_*`).

A profile is read whole into memory (`Profile`): the files are small (hundreds to a few thousand rows), and
a loaded profile is then immutable, hashable and picklable like the rest of the hardware description.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import asdict, dataclass, fields
from pathlib import Path

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conditions (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    gpu_name TEXT NOT NULL,
    sms INTEGER,
    sm_clock_mhz REAL,
    mem_clock_mhz REAL,
    power_limit_w REAL,
    memory_gib REAL,
    driver TEXT,
    cuda TEXT,
    torch TEXT,
    cudnn TEXT,
    nccl TEXT,
    host TEXT,
    date TEXT
);
CREATE TABLE IF NOT EXISTS measurement (
    id INTEGER PRIMARY KEY,
    conditions_id INTEGER NOT NULL REFERENCES conditions(id),
    op TEXT NOT NULL,
    dtype TEXT,
    variant TEXT,
    m INTEGER, n INTEGER, k INTEGER, groups INTEGER,
    batch INTEGER, heads INTEGER, seq INTEGER, head_dim INTEGER, head_dim_v INTEGER,
    causal INTEGER, window INTEGER, sinks INTEGER, backend TEXT,
    nbytes REAL, ranks INTEGER,
    flops REAL,
    seconds REAL NOT NULL CHECK (seconds > 0)
);
CREATE INDEX IF NOT EXISTS measurement_op ON measurement (op, dtype);
"""

OPS = (
    "gemm",
    "attention_fwd",
    "attention_bwd",
    "elementwise",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "host_launch",
    "host_alloc",
)
COLLECTIVES = OPS[4:9]
# Flash attention's backward does 2.5x the forward's matmul FLOPs (5 matmuls against 2; Dao 2023), as
# `graph.attention` counts them.
ATTENTION_BWD_FLOPS = 2.5


@dataclass(frozen=True, slots=True)
class Conditions:
    """What the measurements were taken under (one measuring session)."""

    source: str
    gpu_name: str
    sms: int | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_limit_w: float | None = None
    memory_gib: float | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    host: str | None = None
    date: str | None = None


@dataclass(frozen=True, slots=True)
class Point:
    """One measured point (see the module docstring for which fields each `op` uses)."""

    op: str
    seconds: float
    dtype: str | None = None
    variant: str | None = None
    m: int | None = None
    n: int | None = None
    k: int | None = None
    groups: int | None = None
    batch: int | None = None
    heads: int | None = None
    seq: int | None = None
    head_dim: int | None = None
    head_dim_v: int | None = None
    causal: bool | None = None
    window: int | None = None
    sinks: bool | None = None
    backend: str | None = None
    nbytes: float | None = None
    ranks: int | None = None
    flops: float | None = None
    conditions_id: int = 1

    def key(self) -> tuple:
        """The point's shape, all but its time and session: two points of one key measured the same thing."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name not in ("seconds", "conditions_id"))


def attention_keys_per_query(seq: int, causal: bool, window: int) -> float:
    """Mean keys a query attends to: all `seq`, (seq + 1) / 2 under a causal mask, and a causal window of w
    keys w - w(w - 1) / (2 seq) (the first w queries see fewer)."""
    if window and window < seq:
        return window - window * (window - 1) / (2 * seq)
    return (seq + 1) / 2 if causal else float(seq)


def attention_flops(batch: int, heads: int, seq: int, d: int, dv: int, causal: bool, window: int, bwd: bool) -> float:
    """FLOPs of flash attention as the estimator counts them (`graph.attention.core_attention`)."""
    fwd = 2.0 * batch * heads * (d + dv) * seq * attention_keys_per_query(seq, causal, window)
    return fwd * ATTENTION_BWD_FLOPS if bwd else fwd


_POINT_COLUMNS = [f.name for f in fields(Point)]
_COND_COLUMNS = [f.name for f in fields(Conditions)]


def write_profile(
    path: str | Path | None,
    name: str,
    gpu: str,
    sessions: list[tuple[Conditions, list[Point]]],
    notes: str = "",
) -> sqlite3.Connection:
    """Write a profile (one `conditions` row per session, its points under it) to `path` (replaced if it
    exists; None: in memory) and return the open connection."""
    if path is not None:
        Path(path).unlink(missing_ok=True)
    con = sqlite3.connect(":memory:" if path is None else str(path))
    con.executescript(SCHEMA)
    meta = {"schema_version": str(SCHEMA_VERSION), "name": name, "gpu": gpu, "notes": notes}
    con.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
    for cid, (cond, points) in enumerate(sessions, start=1):
        con.execute(
            f"INSERT INTO conditions (id, {', '.join(_COND_COLUMNS)}) VALUES ({', '.join('?' * (1 + len(_COND_COLUMNS)))})",  # noqa: E501
            (cid, *(getattr(cond, c) for c in _COND_COLUMNS)),
        )
        cols = [c for c in _POINT_COLUMNS if c != "conditions_id"]
        con.executemany(
            f"INSERT INTO measurement (conditions_id, {', '.join(cols)}) VALUES ({', '.join('?' * (1 + len(cols)))})",
            [(cid, *(_sql(getattr(p, c)) for c in cols)) for p in points],
        )
    con.commit()
    return con


def _sql(v: object) -> object:
    return int(v) if isinstance(v, bool) else v


def dump_sql(con: sqlite3.Connection) -> str:
    """The database as SQL text (`sqlite3`'s `iterdump`): the form the shipped profiles are kept in."""
    return "\n".join(con.iterdump()) + "\n"


def read_rows(con: sqlite3.Connection) -> tuple[dict[str, str], dict[int, Conditions], tuple[Point, ...]]:
    """Meta, conditions by id, and every point of an open profile database."""
    meta = dict(con.execute("SELECT key, value FROM meta"))
    version = int(meta.get("schema_version", "0"))
    if version != SCHEMA_VERSION:
        raise ValueError(f"profile schema version {version}, this shardscope reads {SCHEMA_VERSION}")
    conds = {
        row[0]: Conditions(*row[1:])
        for row in con.execute(f"SELECT id, {', '.join(_COND_COLUMNS)} FROM conditions ORDER BY id")
    }
    points = []
    for row in con.execute(f"SELECT {', '.join(_POINT_COLUMNS)} FROM measurement ORDER BY id"):
        d = dict(zip(_POINT_COLUMNS, row, strict=True))
        for flag in ("causal", "sinks"):
            if d[flag] is not None:
                d[flag] = bool(d[flag])
        points.append(Point(**d))
    return meta, conds, tuple(points)


def digest(meta: dict[str, str], conds: dict[int, Conditions], points: tuple[Point, ...]) -> str:
    """A content hash: two profiles with the same measurements compare equal wherever they were loaded from."""
    h = hashlib.sha256(repr((sorted(meta.items()), sorted(conds.items()), points)).encode())
    return h.hexdigest()[:16]


def conditions_dict(cond: Conditions) -> dict[str, object]:
    return {k: v for k, v in asdict(cond).items() if v is not None}
