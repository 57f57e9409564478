"""A loaded profile and interpolation between its measured shapes.

Times are interpolated in log-log space: each table holds, per measured point, its shape as log sizes and
its log time over a size prior (FLOPs for GEMMs and attention, bytes for streaming kernels and
collectives), so what is interpolated is log seconds-per-FLOP (or per byte): a throughput, which varies
slowly with shape where time varies with size. A query is answered only inside what was measured: within
the measured range on every axis and within `REACH` (a factor of 2) of some measured point on every axis;
elsewhere the answer is None and the caller keeps its roofline (`costs.compute`).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field

from shardscope.hardware.profile.db import COLLECTIVES, Conditions, Point, attention_flops

# A query is covered when a measured point lies within this factor on every axis (log scale) ...
REACH = math.log(2.0)
# ... and is interpolated from this many nearest points by a local plane in log space (`_local_linear`),
# weighted by 1 / (squared log distance + WEIGHT_SOFTENING), slopes held back by RIDGE. Chosen by
# leave-one-out on the shipped H100 profile (tests/test_profile.py): 4 neighbours and inverse-distance
# weights alone miss the trend at the edge of a measured grid (attention's small grids run slower).
NEIGHBOURS = 8
WEIGHT_SOFTENING = 0.05
RIDGE = 0.3
_EPS = 1e-9
# GEMMs whose depth K is not a multiple of this run other kernels (a partial K tile in every output tile,
# no TMA-aligned loads): measured on the H100, FP8 problems of K = 2064 take 12-17% longer than K = 2048
# ones, far more than the 0.8% more FLOPs. Such GEMMs are interpolated only among themselves.
GEMM_K_ALIGN = 128


@dataclass(frozen=True, slots=True)
class Table:
    """Measured points of one kind: log-size coordinates and log(seconds / prior) residuals."""

    coords: tuple[tuple[float, ...], ...]
    resid: tuple[float, ...]

    def lookup(self, q: tuple[float, ...]) -> float | None:
        """Interpolated residual at `q`, or None outside the measured range."""
        if not self.coords:
            return None
        dims = len(q)
        for a in range(dims):
            vals = [c[a] for c in self.coords]
            if not min(vals) - _EPS <= q[a] <= max(vals) + _EPS:
                return None
        if dims == 1:  # piecewise linear in log-log between the bracketing points
            xs = sorted(zip((c[0] for c in self.coords), self.resid, strict=True))
            keys = [x for x, _ in xs]
            i = bisect.bisect_left(keys, q[0] - _EPS)
            if abs(keys[i] - q[0]) <= _EPS:
                return xs[i][1]
            (x0, r0), (x1, r1) = xs[i - 1], xs[i]
            return r0 + (r1 - r0) * (q[0] - x0) / (x1 - x0)
        near = sorted(
            (max(abs(a - b) for a, b in zip(c, q, strict=True)), math.dist(c, q), c, r)
            for c, r in zip(self.coords, self.resid, strict=True)
        )
        if near[0][0] > REACH + _EPS:
            return None
        if near[0][1] <= _EPS:
            return near[0][3]
        return _local_linear(q, [(c, r, 1.0 / (d * d + WEIGHT_SOFTENING)) for _, d, c, r in near[:NEIGHBOURS]])


def _local_linear(q: tuple[float, ...], pts: list[tuple[tuple[float, ...], float, float]]) -> float:
    """Weighted least-squares plane r = a + b·(c - q) through `pts` (coords, residual, weight), its slopes
    held towards 0 by `RIDGE` (few or collinear points then give their weighted mean), evaluated at `q`,
    and kept within the neighbours' own range: a trend is followed, never extrapolated past them."""
    dims = len(q) + 1
    a = [[0.0] * dims for _ in range(dims)]
    b = [0.0] * dims
    for c, r, w in pts:
        x = (1.0, *(ci - qi for ci, qi in zip(c, q, strict=True)))
        for i in range(dims):
            b[i] += w * x[i] * r
            for j in range(dims):
                a[i][j] += w * x[i] * x[j]
    total = sum(w for _, _, w in pts)
    for i in range(1, dims):
        a[i][i] += RIDGE * total
    value = _solve(a, b)[0]
    lo, hi = min(r for _, r, _ in pts), max(r for _, r, _ in pts)
    return min(max(value, lo), hi)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the systems here are at most 5 x 5 and positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _log(*xs: float) -> tuple[float, ...]:
    return tuple(math.log(x) for x in xs)


def gemm_coords(m: int, n: int, k: int, groups: int) -> tuple[float, ...]:
    return _log(m, n, k, groups)


def attention_coords(rows: float, span: float) -> tuple[float, ...]:
    return _log(rows, span)


@dataclass(frozen=True, slots=True)
class Profile:
    """A measured profile: its name, the catalog GPU it describes, measuring sessions and points.

    Equal (and hashed) by name and content digest, so a GPU carrying it stays a valid memo key."""

    name: str
    gpu: str
    digest: str
    meta: dict[str, str] = field(compare=False, hash=False)
    conditions: dict[int, Conditions] = field(compare=False, hash=False)
    points: tuple[Point, ...] = field(compare=False, hash=False)
    source: str = field(default="", compare=False, hash=False)
    _tables: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    # --- tables, built once per kind -------------------------------------------------------------
    def _table(self, key: Hashable) -> Table:
        if not self._tables:
            self._tables.update(self._build_tables())
        return self._tables.get(key, Table((), ()))

    def _build_tables(self) -> dict[Hashable, Table]:
        rows: dict[Hashable, dict[tuple[float, ...], list[float]]] = defaultdict(lambda: defaultdict(list))
        for p in self.points:
            entry = self.entry(p)
            if entry is not None:
                key, coords, resid = entry
                rows[key][coords].append(resid)
        # repeated measurements of one shape: their mean log time
        return {key: Table(tuple(pts), tuple(sum(v) / len(v) for v in pts.values())) for key, pts in rows.items()}

    @staticmethod
    def entry(p: Point) -> tuple[Hashable, tuple[float, ...], float] | None:
        """The table a point belongs to, its coordinates and residual (None: not interpolated)."""
        if p.op == "gemm":
            flops = 2.0 * p.m * p.n * p.k * p.groups
            return (
                ("gemm", p.dtype, p.k % GEMM_K_ALIGN == 0),
                gemm_coords(p.m, p.n, p.k, p.groups),
                math.log(p.seconds / flops),
            )
        if p.op in ("attention_fwd", "attention_bwd"):
            bwd = p.op == "attention_bwd"
            window = p.window or 0
            flops = p.flops or attention_flops(
                p.batch, p.heads, p.seq, p.head_dim, p.head_dim_v or p.head_dim, bool(p.causal), window, bwd
            )
            span = window if window and window < p.seq else p.seq
            hd = (p.head_dim + (p.head_dim_v or p.head_dim)) / 2
            key = ("attention", bwd, p.backend, bool(p.causal), bool(window), bool(p.sinks), round(hd))
            return key, attention_coords(p.batch * p.heads * p.seq, span), math.log(p.seconds / flops)
        if p.op == "elementwise":
            return ("elementwise", p.variant or "contiguous"), _log(p.nbytes), math.log(p.seconds / p.nbytes)
        if p.op in COLLECTIVES:
            return (p.op, p.ranks, p.variant or ""), _log(p.nbytes), math.log(p.seconds / p.nbytes)
        return None

    # --- queries ---------------------------------------------------------------------------------
    def gemm_s(self, m: int, n: int, k: int, dtype: str = "bf16", groups: int = 1) -> float | None:
        """Seconds of `groups` (M, N, K) GEMMs of `dtype`, or None outside the measured shapes."""
        if min(m, n, k, groups) <= 0:
            return None
        r = self._table(("gemm", dtype, k % GEMM_K_ALIGN == 0)).lookup(gemm_coords(m, n, k, groups))
        return None if r is None else 2.0 * m * n * k * groups * math.exp(r)

    def attention_s(
        self,
        flops: float,
        rows: float,
        span: float,
        head_dim: float,
        *,
        backward: bool,
        causal: bool,
        windowed: bool = False,
        sinks: bool = False,
        backend: str = "cudnn",
    ) -> float | None:
        """Seconds of flash attention of `flops` over `rows` (sequence x head x query) rows, each query's loop
        over `span` keys, at mean head dim `head_dim`; None outside the measured shapes. Head dims are
        matched, not interpolated: each is its own kernel instantiation (64, 128, 192, ...)."""
        if min(flops, rows, span, head_dim) <= 0:
            return None
        key = ("attention", backward, backend, causal, windowed, sinks, round(head_dim))
        r = self._table(key).lookup(attention_coords(rows, span))
        return None if r is None else flops * math.exp(r)

    def elementwise_s(self, nbytes: float, variant: str = "contiguous") -> float | None:
        """Seconds of a streaming kernel moving `nbytes`, or None outside the measured sizes."""
        if nbytes <= 0:
            return None
        r = self._table(("elementwise", variant)).lookup(_log(nbytes))
        return None if r is None else nbytes * math.exp(r)

    def collective_s(self, kind: str, nbytes: float, ranks: int, variant: str = "") -> float | None:
        """Seconds of an NCCL collective of `nbytes` over `ranks` GPUs, or None where not measured."""
        if nbytes <= 0:
            return None
        r = self._table((kind, ranks, variant)).lookup(_log(nbytes))
        return None if r is None else nbytes * math.exp(r)

    def held_out(self, point: Point) -> Profile:
        """This profile without `point` (and its repeats): for checking interpolation on measured points."""
        mine = self.entry(point)
        if mine is None:
            return self
        rest = tuple(p for p in self.points if (e := self.entry(p)) is None or e[:2] != mine[:2])
        return Profile(self.name, self.gpu, self.digest + "-", self.meta, self.conditions, rest, self.source)

    def predict(self, p: Point) -> float | None:
        """This profile's time for a point's shape (None where it is not covered)."""
        entry = self.entry(p)
        if entry is None:
            return None
        key, coords, resid = entry
        r = self._table(key).lookup(coords)
        return None if r is None else p.seconds * math.exp(r - resid)
