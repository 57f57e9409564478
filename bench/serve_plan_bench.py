"""Time `serve-plan`: Llama-3.1-70B on at most 64 H100 under vLLM, Poisson traffic of 1024/256-token requests,
p90 TTFT <= 1 s and TPOT <= 40 ms, 1,000 requests a simulation. Target: each search within 30 s on one core
(CPU time beside wall time: on a shared machine the wall time includes waiting). Exits 1 past the target.

    python bench/serve_plan_bench.py
"""

from __future__ import annotations

import sys
import time

from shardscope.serve.estimate import serve_estimate
from shardscope.serve.plan import serve_plan

TARGET_S = 30.0
RATES = (10.0, 40.0, 80.0)  # requests/s: a few replicas, half the GPUs, all of them


def main() -> int:
    serve_estimate("llama3.1-70b", "H100", 8, tp=8, num_prompts=10)  # load the catalogs outside the timing
    slowest = 0.0
    for rate in RATES:
        start, cpu = time.perf_counter(), time.process_time()
        r = serve_plan("llama3.1-70b", "H100", 64, "vllm", rate=rate, slo_ttft_ms=1000.0, slo_tpot_ms=40.0)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        s, best = r.searched, r.plans[0]
        layout = f"TP{best.tp} x {best.disaggregate or best.replicas}"
        print(
            f"rate {rate:4g}/s: {took:6.2f} s wall {cpu:6.2f} s CPU; {s.deployments:,} deployments, "
            f"{s.screened} screened, {s.simulated} simulated; best {best.gpus} GPUs {layout}, "
            f"{best.goodput_requests_per_s_per_gpu:.3f} req/s/GPU"
        )
        slowest = max(slowest, cpu)
    print(f"slowest {slowest:.2f} s CPU (target {TARGET_S:g} s)")
    return 0 if slowest <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
