"""Time the serving simulator: 10,000 requests over 8 replicas (Llama-3.1-8B, 8x H100 at TP 1, vLLM),
Poisson, offline and closed-loop arrivals, fixed and ShareGPT-like lengths. Target: about 2 s each on
one core (CPU time is printed beside wall time: on a shared machine the wall time includes waiting).

    python bench/serve_bench.py
"""

from __future__ import annotations

import math
import time

from shardscope.serve.estimate import serve_estimate

CASES: list[tuple[str, dict]] = [
    ("poisson 40/s, 1024/256", dict(rate=40.0)),
    ("offline, 1024/256", dict(rate=math.inf)),
    ("concurrency 256, 1024/256", dict(concurrency=256)),
    ("poisson 40/s, sharegpt-like", dict(rate=40.0, dataset="sharegpt-like")),
    ("poisson 40/s, spec-decode mtp:0.7", dict(rate=40.0, spec_decode="mtp:0.7")),
    ("poisson 40/s, disaggregate 1:1", dict(rate=40.0, disaggregate="1:1")),
]


def main() -> None:
    serve_estimate("llama3.1-8b", "H100", 8, num_prompts=10)  # load the catalogs once, outside the timing
    for name, kwargs in CASES:
        start, cpu = time.perf_counter(), time.process_time()
        r = serve_estimate("llama3.1-8b", "H100", 8, tp=1, num_prompts=10_000, input_len=1024, output_len=256, **kwargs)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        rate = r.output_tokens_per_s
        print(f"{name:30s} {took:6.2f} s wall {cpu:6.2f} s CPU {r.iterations:9,d} iterations {rate:8,.0f} tok/s")


if __name__ == "__main__":
    main()
