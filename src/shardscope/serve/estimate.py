"""`serve_estimate`: a model deployed as DP replicas of a TP group under an engine, driven by a request
workload; the typed result of `shardscope serve`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.serve.cost import Batch, Deployment, IterationCost, Memory, memory_plan
from shardscope.serve.engine import Engine, load_engine
from shardscope.serve.metrics import Stat, stat_s, weighted_stat_s
from shardscope.serve.simulator import ReplicaRun, simulate_replica, window_keys
from shardscope.serve.workload import Request, make_requests

PRECISIONS = ("bf16", "fp8")


@dataclass(frozen=True, slots=True)
class ServeResult:
    model: str
    gpu: str
    gpus: int
    tp: int
    pp: int
    dp: int
    engine: str
    precision: str
    kv_dtype: str
    arrivals: str
    rate: float
    concurrency: int
    num_prompts: int
    memory: Memory
    max_concurrency_at_full_length: float  # KV capacity / mean tokens a request holds at its end
    prefill_s: float  # one request's prefill alone
    decode_iteration_s: float  # one request's first decode iteration alone
    duration_s: float
    requests_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    ttft: Stat
    tpot: Stat
    itl: Stat
    e2e: Stat
    max_kv_usage: float  # peak fraction of KV blocks in use, over the replicas
    mean_in_system: float  # time-average requests in the system (arrived, not finished), all replicas
    preemptions: int
    iterations: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["memory"]["kv_tokens"] = self.memory.kv_tokens
        out["rate"] = None if math.isinf(self.rate) else self.rate  # JSON has no infinity
        return out


def serve_estimate(
    model: str,
    gpu: str = "H100",
    gpus: int = 8,
    tp: int = 1,
    pp: int = 1,
    engine: str = "vllm",
    precision: str = "bf16",
    kv_dtype: str = "bf16",
    rate: float = math.inf,
    concurrency: int = 0,
    num_prompts: int = 1000,
    input_len: int = 1024,
    output_len: int = 256,
    dataset: str = "fixed",
    seed: int = 0,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> ServeResult:
    """Simulate the benchmark. `rate` inf with `concurrency` 0 is offline (all requests at once);
    `concurrency` > 0 keeps that many outstanding over the whole deployment."""
    if precision not in PRECISIONS:
        raise ShardscopeError(f"unknown precision {precision!r} (valid: {', '.join(PRECISIONS)})")
    if kv_dtype not in PRECISIONS:
        raise ShardscopeError(f"unknown KV-cache dtype {kv_dtype!r} (valid: {', '.join(PRECISIONS)})")
    if tp < 1 or pp < 1:
        raise ShardscopeError("--tp and --pp must be at least 1")
    if pp != 1:
        raise ShardscopeError("pipeline-parallel serving is not modelled yet (valid: --pp 1)")
    if gpus % (tp * pp):
        raise ShardscopeError(f"--gpus {gpus} is not a multiple of tp x pp = {tp * pp}")
    spec = load_model(model)
    if spec.dit is not None:
        raise ShardscopeError(f"{spec.name} is a diffusion transformer; serving simulates language models")
    cluster = make_cluster(gpu, gpus)
    eng = load_engine(engine, cluster.gpu)
    if max_num_seqs is not None or max_num_batched_tokens is not None:
        from dataclasses import replace

        eng = replace(
            eng,
            max_num_seqs=max_num_seqs or eng.max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or eng.max_num_batched_tokens,
        )
    if tp > cluster.scaleup_domain:
        raise ShardscopeError(f"--tp {tp} spans more GPUs than one NVLink domain ({cluster.scaleup_domain})")
    d = Deployment(spec, cluster, tp, precision, 1 if kv_dtype == "fp8" else 2)
    mem = memory_plan(d, eng)
    if mem.kv_blocks < 1:
        raise ShardscopeError(
            f"{spec.name} does not fit {tp}x {cluster.gpu.name} under {eng.name}: {mem.weights_gib:.1f} GiB of weights "
            f"per GPU leave no room for a KV cache in {mem.hbm_gib:.1f} GiB (raise --tp or use --precision fp8)"
        )
    dp = gpus // (tp * pp)
    mode = "concurrency" if concurrency > 0 else ("offline" if math.isinf(rate) else "poisson")
    reqs = make_requests(num_prompts, mode, rate, input_len, output_len, dataset, seed)
    longest = max(r.input_len + r.output_len for r in reqs)
    if longest > mem.kv_tokens:
        raise ShardscopeError(
            f"a request of {longest} tokens exceeds the KV cache of one replica ({mem.kv_tokens} tokens)"
        )
    cost = IterationCost(d, eng)
    # Round-robin routing: request i goes to replica i mod dp; a closed loop splits its clients evenly.
    shares = [reqs[r::dp] for r in range(dp)]
    runs: list[tuple[ReplicaRun, list[Request]]] = []
    for r in range(dp):
        clients = concurrency // dp + (1 if r < concurrency % dp else 0) if concurrency else 0
        if concurrency and clients == 0:
            continue
        runs.append((simulate_replica(shares[r], cost, eng, mem.kv_blocks, clients), shares[r]))
    return _summarise(spec.name, cluster.gpu.name, gpus, tp, pp, dp, eng, precision, mode, rate, concurrency,
                      reqs, runs, mem, cost)  # fmt: skip


Runs = list[tuple[ReplicaRun, list[Request]]]  # each replica's run with its share of the requests


def _summarise(
    model: str, gpu: str, gpus: int, tp: int, pp: int, dp: int, eng: Engine, precision: str, mode: str,
    rate: float, concurrency: int, reqs: list[Request], runs: Runs, mem: Memory, cost: IterationCost,
) -> ServeResult:  # fmt: skip
    ttft, tpot, e2e, itl = [], [], [], []
    tokens_in = tokens_out = 0
    for run, share in runs:
        for i, req in enumerate(share):
            if math.isnan(run.finish_s[i]):
                continue
            first = run.first_token_s[i] - run.arrival_s[i]
            total = run.finish_s[i] - run.arrival_s[i]
            ttft.append(first)
            e2e.append(total)
            if req.output_len > 1:
                tpot.append((total - first) / (req.output_len - 1))
            tokens_in += req.input_len
            tokens_out += req.output_len
        itl.extend(run.itl)
    duration = max(run.end_s for run, _ in runs)
    mean_len = sum(r.input_len + r.output_len for r in reqs) / len(reqs)
    # The first request alone: its prefill iteration and its first decode iteration.
    prompt = reqs[0].input_len
    pairs = prompt * (prompt + 1) / 2
    prefill = cost.time_s(Batch(prompt, pairs, window_keys(0, prompt, cost.d.model.attention_window), sampled=1))
    window = cost.d.model.attention_window
    decode = cost.decode_time_s(1, prompt + 1, min(prompt + 1, window) if window else prompt + 1)
    return ServeResult(
        model=model, gpu=gpu, gpus=gpus, tp=tp, pp=pp, dp=dp, engine=eng.label, precision=precision,
        kv_dtype="fp8" if cost.d.kv_dtype_bytes == 1 else "bf16", arrivals=mode,
        rate=rate, concurrency=concurrency, num_prompts=len(reqs), memory=mem,
        max_concurrency_at_full_length=mem.kv_tokens / mean_len,
        prefill_s=prefill, decode_iteration_s=decode, duration_s=duration,
        requests_per_s=len(e2e) / duration, input_tokens_per_s=tokens_in / duration,
        output_tokens_per_s=tokens_out / duration, output_tokens_per_s_per_gpu=tokens_out / duration / gpus,
        ttft=stat_s(ttft), tpot=stat_s(tpot), itl=weighted_stat_s(itl), e2e=stat_s(e2e),
        max_kv_usage=max(run.max_kv_blocks for run, _ in runs) / mem.kv_blocks,
        mean_in_system=sum(run.occupancy_s for run, _ in runs) / duration,
        preemptions=sum(run.preemptions for run, _ in runs), iterations=sum(run.iterations for run, _ in runs),
    )  # fmt: skip
