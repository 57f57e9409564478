"""Time and cost to train a token budget with a plan."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from shardscope.errors import ShardscopeError
from shardscope.result import Estimate

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text: str) -> float:
    """'15T', '2.5e12', '300B' → tokens."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise ShardscopeError(f"--tokens must be a positive count like 15T, 300B or 2.5e12, got {text!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


@dataclass(frozen=True, slots=True)
class TrainingCost:
    tokens: float  # the budget asked for
    steps: int  # whole optimizer steps that cover it (the last one may pass the budget)
    days: float
    gpu_hours: float
    cost_usd: float | None  # at the given US dollars per GPU-hour


def training_cost(est: Estimate, tokens: float, usd_per_gpu_hour: float | None = None) -> TrainingCost:
    steps = math.ceil(tokens / est.tokens_per_step)
    seconds = steps * est.step_time_s
    gpu_hours = seconds * est.gpus / 3600
    return TrainingCost(
        tokens=tokens,
        steps=steps,
        days=seconds / 86400,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * usd_per_gpu_hour if usd_per_gpu_hour is not None else None,
    )
