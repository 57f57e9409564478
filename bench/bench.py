"""Speed benchmarks: in-process estimates per second and the CLI's cold start for `estimate --json`.

python bench/bench.py            # prints the figures quoted in the README
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import shardscope


def estimates_per_second(seconds: float = 3.0) -> float:
    plans = [
        dict(model="llama3.1-405b", gpus=16384, tp=8, pp=16, vpp=4, global_batch=2048, seq_len=8192),
        dict(model="llama3.1-70b", gpus=1024, tp=8, pp=4, global_batch=1024, seq_len=8192, recompute="full"),
        dict(model="llama3.1-8b", gpus=64, fsdp=True, global_batch=256, micro_batch=2, seq_len=8192),
    ]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        p = dict(plans[n % len(plans)])
        shardscope.estimate(p.pop("model"), gpu="H100", **p)
        n += 1
    return n / (time.perf_counter() - start)


def simulate_405b_16k_s(runs: int = 5) -> tuple[float, float]:
    """Seconds to simulate one step of Llama-3.1-405B on 16,384 H100 (TP8, PP16, interleaved x4, 128
    micro-batches), without and with writing the Chrome trace."""
    kw = dict(gpu="H100", gpus=16384, tp=8, pp=16, vpp=4, global_batch=16384, seq_len=8192)
    best = best_trace = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        shardscope.estimate("llama3.1-405b", simulate=True, **kw)
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        shardscope.estimate("llama3.1-405b", trace="/tmp/shardscope-bench-trace.json", **kw)
        best_trace = min(best_trace, time.perf_counter() - t0)
    return best, best_trace


def search_s(model: str, gpus: int, global_batch: int, seq_len: int) -> tuple[float, int]:
    """Seconds to search every plan of `model` on `gpus` H100 on one core, and the layouts searched."""
    from shardscope.hardware.catalog import make_cluster
    from shardscope.models.catalog import load_model
    from shardscope.planner.search import search

    t0 = time.perf_counter()
    result = search(load_model(model), make_cluster("H100", gpus), global_batch, seq_len)
    return time.perf_counter() - t0, result.structures


def cold_start_s(runs: int = 7) -> float:
    cmd = [sys.executable, "-m", "shardscope", "estimate", "llama3.1-70b", "--gpus", "64", "--tp", "8", "--json"]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    print(f"in-process estimates/s: {estimates_per_second():,.0f}")
    print(f"CLI cold start (estimate --json, median of 7): {cold_start_s():.3f} s")
    took, layouts = search_s("llama3.1-405b", 16384, 2048, 8192)
    print(f"search every plan of Llama-3.1-405B on 16,384 H100 (one core): {took:.2f} s for {layouts:,} layouts")
    took, layouts = search_s("deepseek-v3", 1024, 4096, 4096)
    print(f"search every plan of DeepSeek-V3 on 1,024 H100 (one core): {took:.2f} s for {layouts:,} layouts")
    sim, sim_trace = simulate_405b_16k_s()
    print(f"simulate Llama-3.1-405B on 16,384 GPUs (128 micro-batches): {sim:.2f} s, with trace: {sim_trace:.2f} s")
