"""Latency and throughput summaries as vLLM's `benchmark_serving` (vllm/benchmarks/serve.py
`calculate_metrics`) defines them: TTFT from send to first token; TPOT = (E2E − TTFT) / (output − 1) per
request with more than one output token (the first token excluded); ITL the gaps between successive tokens
of every request, pooled; E2E from send to last token; percentiles as `numpy.percentile` (linear
interpolation between order statistics); throughputs over the benchmark's duration (t = 0 to the last
completion)."""

from __future__ import annotations

import math
from dataclasses import dataclass

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True, slots=True)
class Stat:
    """Mean and percentiles of one metric, in milliseconds."""

    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


def percentile(sorted_values: list[float], q: float) -> float:
    """`numpy.percentile(values, q)` (linear method) of values already sorted."""
    if not sorted_values:
        return math.nan
    rank = q / 100.0 * (len(sorted_values) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def weighted_percentile(pairs: list[tuple[float, int]], q: float) -> float:
    """`percentile` of the multiset in which each value appears `count` times, without expanding it."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(c for _, c in pairs)
    if not total:
        return math.nan
    rank = q / 100.0 * (total - 1)

    def at(r: int) -> float:  # the r-th order statistic (0-based)
        seen = 0
        for value, count in pairs:
            seen += count
            if r < seen:
                return value
        return pairs[-1][0]

    lo = math.floor(rank)
    a, b = at(lo), at(min(lo + 1, total - 1))
    return a + (b - a) * (rank - lo)


def stat_s(values_s: list[float]) -> Stat:
    """Stat of values in seconds (nan when there are none)."""
    v = sorted(values_s)
    mean = sum(v) / len(v) if v else math.nan
    p50, p90, p99 = (percentile(v, q) for q in PERCENTILES)
    return Stat(mean * 1e3, p50 * 1e3, p90 * 1e3, p99 * 1e3)


def weighted_stat_s(pairs: list[tuple[float, int]]) -> Stat:
    total = sum(c for _, c in pairs)
    mean = sum(v * c for v, c in pairs) / total if total else math.nan
    p50, p90, p99 = (weighted_percentile(pairs, q) for q in PERCENTILES)
    return Stat(mean * 1e3, p50 * 1e3, p90 * 1e3, p99 * 1e3)
