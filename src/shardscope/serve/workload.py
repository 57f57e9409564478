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
    group: int = -1  # the prompt it samples (>= 0: requests of one group share their whole prompt)


def make_requests(
    num: int,
    mode: str,
    rate: float = math.inf,
    input_len: int = 1024,
    output_len: int = 256,
    dataset: str = "fixed",
    seed: int = 0,
    samples: int = 1,
) -> list[Request]:
    """`num` prompts in arrival order, each sampled `samples` times (vLLM's `n`, the group of GRPO): a
    prompt's samples arrive together, share its prompt (`Request.group`) and each draws its own output
    length."""
    if num < 1:
        raise ShardscopeError(f"--num-prompts must be at least 1, got {num}")
    if samples < 1:
        raise ShardscopeError(f"--samples must be at least 1, got {samples}")
    if samples > 1 and mode == "concurrency":
        raise ShardscopeError("--samples runs Poisson or offline arrivals (not --concurrency)")
    if dataset not in DATASETS:
        raise ShardscopeError(f"unknown dataset {dataset!r} (valid: {', '.join(DATASETS)})")
    if dataset == "fixed" and (input_len < 1 or output_len < 1):
        raise ShardscopeError("--input-len and --output-len must be at least 1")
    rng = random.Random(seed)
    lengths: list[tuple[int, list[int]]] = []  # per prompt: its length and its samples' output lengths
    for _ in range(num):
        if dataset == "fixed":
            lengths.append((input_len, [output_len] * samples))
            continue
        i = min(SHAREGPT_MAX_INPUT, max(SHAREGPT_MIN, round(rng.lognormvariate(*SHAREGPT_INPUT))))
        outs = [max(SHAREGPT_MIN, round(rng.lognormvariate(*SHAREGPT_OUTPUT))) for _ in range(samples)]
        lengths.append((i, [min(o, SHAREGPT_MAX_TOTAL - i) for o in outs]))
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
    grouped = samples > 1
    return [
        Request(a, i, o, g if grouped else -1)
        for g, (a, (i, outs)) in enumerate(zip(times, lengths, strict=True))
        for o in outs
    ]
