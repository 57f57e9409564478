"""What a profile measured (`summary`) and how two profiles differ (`diff`), as data for the report."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from shardscope.hardware.profile.db import COLLECTIVES, Point, attention_flops, conditions_dict
from shardscope.hardware.profile.interp import Profile


def family(p: Point) -> str:
    """The row a point is summarised under: op and its dtype / backend / variant."""
    if p.op == "gemm":
        return f"gemm {p.dtype}" + (" grouped" if (p.groups or 1) > 1 else "")
    if p.op.startswith("attention"):
        extra = "".join((" window" if p.window else "", " sinks" if p.sinks else "", "" if p.causal else " full"))
        return f"{p.op} {p.backend} hd{p.head_dim}{extra}"
    if p.op in COLLECTIVES:
        return f"{p.op} x{p.ranks}" + (f" {p.variant}" if p.variant else "")
    return f"{p.op} {p.variant}" if p.variant else p.op


def work(p: Point) -> tuple[float, str] | None:
    """The size a point's rate is quoted over: (FLOPs, "TFLOPS") or (bytes, "GB/s"); None for host times."""
    if p.op == "gemm":
        return 2.0 * p.m * p.n * p.k * (p.groups or 1), "TFLOPS"
    if p.op.startswith("attention"):
        dv = p.head_dim_v or p.head_dim
        bwd = p.op == "attention_bwd"
        fl = p.flops or attention_flops(p.batch, p.heads, p.seq, p.head_dim, dv, bool(p.causal), p.window or 0, bwd)
        return fl, "TFLOPS"
    if p.nbytes:
        return p.nbytes, "GB/s"
    return None


def rate(p: Point) -> float | None:
    """TFLOPS or GB/s of a point (None for host times)."""
    w = work(p)
    if w is None:
        return None
    return w[0] / p.seconds / (1e12 if w[1] == "TFLOPS" else 1e9)


@dataclass(frozen=True, slots=True)
class FamilySummary:
    family: str
    points: int
    unit: str  # TFLOPS, GB/s, or us (host times)
    low: float  # lowest rate (or time)
    median: float
    high: float
    smallest_s: float
    largest_s: float


def summary(profile: Profile) -> list[FamilySummary]:
    """One row per family of measured points: how many, and the spread of their rates."""
    groups: dict[str, list[Point]] = defaultdict(list)
    for p in profile.points:
        groups[family(p)].append(p)
    out = []
    for fam, pts in groups.items():
        rates = [rate(p) for p in pts]
        if any(r is None for r in rates):
            unit, values = "us", [p.seconds * 1e6 for p in pts]
        else:
            unit, values = work(pts[0])[1], rates
        secs = [p.seconds for p in pts]
        out.append(
            FamilySummary(
                fam, len(pts), unit, min(values), statistics.median(values), max(values), min(secs), max(secs)
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class FamilyDiff:
    family: str
    compared: int  # points of either profile that the other covers
    median_ratio: float  # B's time over A's, at the same shapes
    low_ratio: float
    high_ratio: float


@dataclass(frozen=True, slots=True)
class ProfileDiff:
    a: str
    b: str
    conditions: list[tuple[str, str, str]]  # (field, A's, B's) where the first sessions differ
    families: list[FamilyDiff]
    only_a: list[str]  # families measured in A that B does not cover anywhere
    only_b: list[str]


def diff(a: Profile, b: Profile) -> ProfileDiff:
    """Time ratios B / A at every point of one profile that the other covers (its measured shapes against the
    other's interpolation), per family; and how their measuring conditions differ."""
    ratios: dict[str, list[float]] = defaultdict(list)
    fams_a = {family(p) for p in a.points}
    fams_b = {family(p) for p in b.points}
    for p in a.points:
        t = b.predict(p)
        if t is not None:
            ratios[family(p)].append(t / p.seconds)
    for p in b.points:
        t = a.predict(p)
        if t is not None:
            ratios[family(p)].append(p.seconds / t)
    fams = [FamilyDiff(f, len(r), statistics.median(r), min(r), max(r)) for f, r in sorted(ratios.items()) if r]
    ca = conditions_dict(a.conditions[min(a.conditions)]) if a.conditions else {}
    cb = conditions_dict(b.conditions[min(b.conditions)]) if b.conditions else {}
    conds = [(k, str(ca.get(k, "")), str(cb.get(k, ""))) for k in dict.fromkeys([*ca, *cb]) if ca.get(k) != cb.get(k)]
    return ProfileDiff(
        a.name, b.name, conds, fams, sorted(fams_a - fams_b - set(ratios)), sorted(fams_b - fams_a - set(ratios))
    )
