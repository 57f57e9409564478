"""Requests of a serving benchmark: arrival process and prompt/output lengths, seeded.

Arrival modes, as vLLM's `benchmark_serving` drives a server: `poisson` (exponential gaps at `rate`
requests/s), `offline` (all at t = 0, `--rate inf`), `concurrency` (a closed loop: a new request is sent
when one finishes, keeping `concurrency` outstanding; the simulator releases them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from shardscope.errors import ShardscopeError

DATASETS = ("fixed", "sharegpt-like")
# `sharegpt-like`: log-normal prompt and output lengths, shaped to the means that ShareGPT conversations
# give under vLLM's benchmark filter (about 200 prompt and 200 output tokens); medians and spreads are a
# plausible heavy tail, not fitted to the dataset's histogram. Bounds are vLLM's `sample_sharegpt_requests`
# filter: prompt and output at least 4 tokens, prompt at most 1024, prompt + output at most 2048.
SHAREGPT_INPUT = (math.log(120.0), 1.0)  # (mu, sigma) of ln(tokens): mean 120·e^0.5 ≈ 198
SHAREGPT_OUTPUT = (math.log(130.0), 0.9)  # mean 130·e^0.405 ≈ 195
SHAREGPT_MIN, SHAREGPT_MAX_INPUT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float  # nan in concurrency mode until the client sends it
    input_len: int
    output_len: int


def make_requests(
    num: int,
    mode: str,
    rate: float = math.inf,
    input_len: int = 1024,
    output_len: int = 256,
    dataset: str = "fixed",
    seed: int = 0,
) -> list[Request]:
    """`num` requests in arrival order."""
    if num < 1:
        raise ShardscopeError(f"--num-prompts must be at least 1, got {num}")
    if dataset not in DATASETS:
        raise ShardscopeError(f"unknown dataset {dataset!r} (valid: {', '.join(DATASETS)})")
    if dataset == "fixed" and (input_len < 1 or output_len < 1):
        raise ShardscopeError("--input-len and --output-len must be at least 1")
    rng = random.Random(seed)
    lengths = []
    for _ in range(num):
        if dataset == "fixed":
            lengths.append((input_len, output_len))
            continue
        i = min(SHAREGPT_MAX_INPUT, max(SHAREGPT_MIN, round(rng.lognormvariate(*SHAREGPT_INPUT))))
        o = max(SHAREGPT_MIN, round(rng.lognormvariate(*SHAREGPT_OUTPUT)))
        lengths.append((i, min(o, SHAREGPT_MAX_TOTAL - i)))
    if mode == "poisson":
        if not rate > 0 or math.isinf(rate):
            raise ShardscopeError(f"--rate must be a positive finite number for Poisson arrivals, got {rate}")
        t, times = 0.0, []
        for _ in range(num):
            t += rng.expovariate(rate)
            times.append(t)
    elif mode == "offline":
        times = [0.0] * num
    elif mode == "concurrency":
        times = [math.nan] * num
    else:
        raise ShardscopeError(f"unknown arrival mode {mode!r} (valid: poisson, offline, concurrency)")
    return [Request(a, i, o) for a, (i, o) in zip(times, lengths, strict=True)]
