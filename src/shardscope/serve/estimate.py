"""`serve_estimate`: a model deployed as DP replicas of a TP group under an engine, driven by a request
workload; the typed result of `shardscope serve`."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.quant import resolve_format
from shardscope.models.spec import ModelSpec
from shardscope.serve.cost import (
    Batch,
    Deployment,
    IterationCost,
    Memory,
    SpecIterationCost,
    kv_bytes_per_token,
    memory_plan,
    parse_spec_decode,
    weights_bytes_per_gpu,
)
from shardscope.serve.engine import Engine, load_engine
from shardscope.serve.metrics import Stat, stat_s, weighted_stat_s
from shardscope.serve.simulator import ReplicaRun, kv_block_units, simulate_replica, window_keys
from shardscope.serve.workload import Request, make_requests

KV_DTYPES = ("bf16", "fp8")


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
    num_prompts: int  # requests: prompts x samples
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
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    goodput_requests_per_s: float | None = None  # requests/s meeting every SLO given (None: no SLO)
    spec_decode: str = ""  # "" or SpecDecode.label
    tokens_per_decode_step: float = 1.0
    disaggregate: str = ""  # "" or "P:D" (prefill:decode replicas)
    kv_transfer_s: float = 0.0  # one request's KV from a prefill to a decode replica (mean)
    ep: int = 1  # expert-parallel size of the MoE layers: 1, tp, or a multiple of tp over replicas (wide EP)
    prefix_len: int = 0  # prompt tokens every request shares (cached where the engine caches prefixes)
    samples: int = 1  # sequences per prompt (each a request in the counts and latencies above)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["memory"]["kv_tokens"] = self.memory.kv_tokens
        out["rate"] = None if math.isinf(self.rate) else self.rate  # JSON has no infinity
        return out


def check_dtypes(precision: str, kv_dtype: str) -> None:
    """One line for a weight format or KV-cache dtype serving does not know (`auto`: the checkpoint's format;
    the engine's rule for the KV cache)."""
    resolve_format(precision, "")
    if kv_dtype not in ("auto", *KV_DTYPES):
        raise ShardscopeError(f"unknown KV-cache dtype {kv_dtype!r} (valid: auto, {', '.join(KV_DTYPES)})")


def serve_estimate(
    model: str,
    gpu: str = "H100",
    gpus: int = 8,
    tp: int = 1,
    pp: int = 1,
    engine: str = "vllm",
    precision: str = "auto",
    kv_dtype: str = "auto",
    rate: float = math.inf,
    concurrency: int = 0,
    num_prompts: int = 1000,
    input_len: int = 1024,
    output_len: int = 256,
    dataset: str = "fixed",
    seed: int = 0,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    trace_file: str | Path | None = None,
    spec_decode: str | None = None,
    disaggregate: str | None = None,
    ep: int = 1,
    profile: str | Path | None = None,
    prefix_len: int = 0,
    samples: int = 1,
) -> ServeResult:
    """Simulate the benchmark. `rate` inf with `concurrency` 0 is offline (all requests at once);
    `concurrency` > 0 keeps that many outstanding over the whole deployment. `slo_*_ms`: goodput counts the
    requests meeting them. `trace_file`: write the timeline as Chrome-trace JSON. `spec_decode`: see
    `parse_spec_decode`. `disaggregate` "P:D": the replicas split into prefill and decode pools. `ep` = `tp`:
    the MoE layers run expert-parallel over the replica's GPUs (see `Deployment`). `prefix_len`: prompt
    tokens every request shares (a system prompt), cached where the engine caches prefixes. `samples`:
    sequences per prompt (vLLM's `n`, a GRPO group): `num_prompts` x `samples` requests, a prompt's samples
    arriving together at one replica and sharing its prompt's KV where the engine caches prefixes."""
    check_dtypes(precision, kv_dtype)
    if prefix_len < 0 or (dataset == "fixed" and prefix_len >= input_len):
        raise ShardscopeError(f"--prefix-len must be at least 0 and below --input-len {input_len}, got {prefix_len}")
    if tp < 1 or pp < 1:
        raise ShardscopeError("--tp and --pp must be at least 1")
    if pp > 1 and disaggregate:
        raise ShardscopeError("--disaggregate runs replicas of one pipeline stage (--pp 1)")
    if gpus % (tp * pp):
        raise ShardscopeError(f"--gpus {gpus} is not a multiple of tp x pp = {tp * pp}")
    for name, slo in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms)):
        if slo is not None and not slo > 0:
            raise ShardscopeError(f"{name} must be positive, got {slo}")
    if trace_file is not None:
        check_writable(Path(trace_file))
    spec_dec = parse_spec_decode(spec_decode) if spec_decode else None
    pools = parse_disaggregate(disaggregate, gpus // (tp * pp)) if disaggregate else None
    spec = load_model(model)
    if spec.dit is not None:
        raise ShardscopeError(f"{spec.name} is a diffusion transformer; serving simulates language models")
    asked, precision = precision, resolve_format(precision, spec.weight_format)
    cluster = make_cluster(gpu, gpus)
    if profile is not None:  # measured GEMM times where the profile covers them (`cost.gemm_s`)
        from shardscope import with_profile

        cluster = with_profile(cluster, profile)
    eng = load_engine(engine, cluster.gpu)
    if max_num_seqs is not None or max_num_batched_tokens is not None:
        eng = replace(
            eng,
            max_num_seqs=max_num_seqs or eng.max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or eng.max_num_batched_tokens,
        )
    if tp > cluster.scaleup_domain:
        raise ShardscopeError(f"--tp {tp} spans more GPUs than one NVLink domain ({cluster.scaleup_domain})")
    check_ep(spec, tp, ep, gpus // (tp * pp))
    if ep > tp and disaggregate:
        raise ShardscopeError("--disaggregate runs EP within a replica (--ep 1 or --tp)")
    kv_dtype = eng.kv_dtype(kv_dtype, precision)
    spec = eng.serving_model(spec)
    d = Deployment(spec, cluster, tp, precision, 1 if kv_dtype == "fp8" else 2, ep, pp)
    mem = memory_plan(d, eng)
    draft_cost = None
    if spec_dec is not None and spec_dec.kind == "draft":  # the draft's weights and KV share the pool
        draft = load_model(spec_dec.draft_model)
        dd = Deployment(draft, cluster, tp, resolve_format(asked, draft.weight_format), d.kv_dtype_bytes)
        per_token = mem.kv_bytes_per_token + kv_bytes_per_token(dd)
        pool = mem.kv_pool_gib * (1 << 30) - weights_bytes_per_gpu(dd)
        blocks = max(0, math.floor(pool / (per_token * mem.block_size)))
        mem = replace(mem, kv_pool_gib=max(0.0, pool) / (1 << 30), kv_bytes_per_token=per_token, kv_blocks=blocks)
        draft_cost = IterationCost(dd, replace(eng, host_s_per_iteration=0.0))
        if blocks < 1:
            raise ShardscopeError(
                f"draft model {dd.model.name} ({weights_bytes_per_gpu(dd) / (1 << 30):.1f} GiB per GPU) leaves no "
                f"room for a KV cache next to {spec.name} on {tp}x {cluster.gpu.name}; use a smaller draft"
            )
    if mem.kv_blocks < 1:
        raise ShardscopeError(
            f"{spec.name} does not fit {tp}x {cluster.gpu.name} under {eng.name}: {mem.weights_gib:.1f} GiB of weights "
            f"per GPU leave no room for a KV cache in {mem.hbm_gib:.1f} GiB (raise --tp or use --precision fp8)"
        )
    dp = gpus // (tp * pp)
    mode = "concurrency" if concurrency > 0 else ("offline" if math.isinf(rate) else "poisson")
    reqs = make_requests(num_prompts, mode, rate, input_len, output_len, dataset, seed, samples)
    # Pipeline parallelism: a replica keeps a batch in flight per stage (vLLM's max_concurrent_batches = pp),
    # simulated as `pp` schedulers over its requests, each with its share of the KV blocks and of
    # max_num_seqs, their iterations passing through every stage
    sub_blocks = mem.kv_blocks // pp
    sub_eng = eng if pp == 1 else replace(eng, max_num_seqs=max(1, eng.max_num_seqs // pp))
    longest = max(r.input_len + r.output_len for r in reqs)
    if longest > sub_blocks * mem.block_size:
        where = "one replica" if pp == 1 else f"a batch in flight ({pp} share one replica's)"
        raise ShardscopeError(
            f"a request of {longest} tokens exceeds the KV cache of {where} ({sub_blocks * mem.block_size} tokens)"
        )
    cost = SpecIterationCost(d, eng, spec=spec_dec, draft=draft_cost) if spec_dec else IterationCost(d, eng)
    # Speculative decoding: a request's output takes ceil((n − 1) / E) verify steps after its first token,
    # E the expected tokens a step emits; the simulator runs those steps (the KV it holds and reads grows one
    # token a step, not E: an undercount while the request decodes).
    sim_reqs = reqs
    if spec_dec is not None:
        e = spec_dec.tokens_per_step
        sim_reqs = [replace(r, output_len=1 + math.ceil((r.output_len - 1) / e - 1e-9)) for r in reqs]
    trace = trace_file is not None
    runs: list[tuple[ReplicaRun, list[Request]]] = []
    transfer = 0.0
    if pools is not None:
        if concurrency:
            raise ShardscopeError("--disaggregate runs Poisson or offline arrivals (not --concurrency)")
        runs, transfer = _disaggregated(sim_reqs, reqs, pools, cost, eng, mem, d, trace, prefix_len)
    else:
        # Round-robin routing (`route`) to the replicas, and within one to its batches in flight; a closed
        # loop splits its clients evenly.
        for idx in _schedulers(reqs, dp * pp):
            clients = concurrency // (dp * pp) + (1 if len(runs) < concurrency % (dp * pp) else 0)
            if concurrency and clients == 0:
                continue
            run = simulate_replica(
                [sim_reqs[i] for i in idx], cost, sub_eng, sub_blocks, clients if concurrency else 0, trace=trace,
                prefix=prefix_len,
            )  # fmt: skip
            runs.append((run, [reqs[i] for i in idx]))
    result = _summarise(spec.name, cluster.gpu.name, gpus, tp, pp, dp, eng, precision, mode, rate, concurrency,
                        reqs, runs, mem, cost, slo_ttft_ms, slo_tpot_ms)  # fmt: skip
    if spec_dec is not None:
        result = replace(result, spec_decode=spec_dec.label, tokens_per_decode_step=spec_dec.tokens_per_step)
    if prefix_len:
        result = replace(result, prefix_len=prefix_len)
    if samples > 1:
        result = replace(result, samples=samples)
    if pools is not None:
        result = replace(result, disaggregate=f"{pools[0]}:{pools[1]}", kv_transfer_s=transfer)
    if ep != 1:
        result = replace(result, ep=ep)
    if trace_file is not None:
        write_trace(Path(trace_file), [run for run, _ in runs], pools)
    return result


def route(reqs: list[Request], replicas: int) -> list[list[int]]:
    """Round-robin routing: request i (a prompt's samples: prompt g, together) goes to replica i (g) mod
    `replicas`. The indices of each replica's requests, in arrival order."""
    shares: list[list[int]] = [[] for _ in range(replicas)]
    for i, r in enumerate(reqs):
        shares[(r.group if r.group >= 0 else i) % replicas].append(i)
    return shares


def _schedulers(reqs: list[Request], n: int) -> list[list[int]]:
    """The requests of each of `n` schedulers (replica-major: replica r's batches in flight follow one
    another), those that get any."""
    return [idx for idx in route(reqs, n) if idx]


def check_ep(spec: ModelSpec, tp: int, ep: int, replicas: int = 1) -> None:
    """EP on a MoE model whose experts split evenly: within a replica (EP = TP, vLLM's
    `--enable-expert-parallel` at one data-parallel rank) or wide, over ep/tp of the `replicas` (a multiple
    of TP that divides tp x replicas)."""
    if ep == 1:
        return
    if spec.moe is None:
        raise ShardscopeError(f"--ep {ep}: {spec.name} has no experts (EP applies to MoE models)")
    if ep % tp or (tp * replicas) % ep:
        raise ShardscopeError(
            f"--ep {ep}: expert parallelism spans the TP group of a replica or of several (valid: a multiple of "
            f"--tp {tp} dividing the {tp * replicas} GPUs of the replicas)"
        )
    if spec.moe.experts % ep:
        raise ShardscopeError(f"--ep {ep} does not divide the {spec.moe.experts} experts of {spec.name}")


def check_writable(path: Path) -> None:
    """An output file must be writable before the simulation starts."""
    if path.is_dir():
        raise ShardscopeError(f"{path} is a folder; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ShardscopeError(f"{parent} does not exist; create it or write elsewhere")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ShardscopeError(f"{path} is not writable")


def parse_disaggregate(text: str, replicas: int) -> tuple[int, int]:
    """`P:D` with P + D dividing the replicas: the pools take replicas in that ratio."""
    try:
        p, dd = (int(x) for x in text.strip().split(":"))
    except ValueError:
        raise ShardscopeError(f"--disaggregate {text!r}: expected P:D, e.g. 1:1") from None
    if p < 1 or dd < 1:
        raise ShardscopeError(f"--disaggregate {text!r}: both pools need at least one replica")
    if replicas % (p + dd):
        raise ShardscopeError(
            f"--disaggregate {text}: {replicas} replicas (gpus / (tp x pp)) do not split {p}:{dd}; "
            f"give --gpus a multiple of {(p + dd)} x tp x pp"
        )
    scale = replicas // (p + dd)
    return p * scale, dd * scale


def kv_transfer_s(d: Deployment, tokens: int) -> float:
    """A prompt's KV from a prefill replica to a decode replica over the cluster network: each of the TP
    ranks sends its shard (`kv_bytes_per_token` per token) through its own NIC, in parallel."""
    c = d.cluster
    return c.scaleout_latency_s + tokens * kv_bytes_per_token(d) / (c.scaleout_gbps * 1e9)


def _disaggregated(
    sim_reqs: list[Request], reqs: list[Request], pools: tuple[int, int], cost: IterationCost, eng: Engine,
    mem: Memory, d: Deployment, trace: bool, prefix: int = 0,
) -> tuple[Runs, float]:  # fmt: skip
    """Prefill replicas run each prompt and sample its first token; its KV then crosses the network to a
    decode replica (round-robin in hand-off order), which decodes the rest. TTFT = first token on the
    prefill replica + the transfer."""
    n_p, n_d = pools
    first = [math.nan] * len(reqs)
    runs: Runs = []
    for idx in route(reqs, n_p):
        share = [replace(sim_reqs[i], output_len=1) for i in idx]
        run = simulate_replica(share, cost, eng, mem.kv_blocks, trace=trace, prefix=prefix)
        for j, i in enumerate(idx):
            first[i] = run.first_token_s[j] + kv_transfer_s(d, reqs[i].input_len)
        # the prefill pool's run, counted for its iterations and occupancy; its requests finish elsewhere
        run.finish_s = [math.nan] * len(idx)
        runs.append((run, [reqs[i] for i in idx]))
    transfer = sum(kv_transfer_s(d, r.input_len) for r in reqs) / len(reqs)
    order = sorted(range(len(reqs)), key=lambda i: first[i])
    for r in range(n_d):
        idx = order[r::n_d]
        share = [Request(first[i], sim_reqs[i].input_len, sim_reqs[i].output_len) for i in idx]
        todo = [j for j, q in enumerate(share) if q.output_len > 1]
        run = simulate_replica([share[j] for j in todo], cost, eng, mem.kv_blocks, trace=trace, prefilled=True)
        finish = [first[i] for i in idx]  # one-token requests end at their first token
        for k, j in enumerate(todo):
            finish[j] = run.finish_s[k]
        run.arrival_s = [reqs[i].arrival_s for i in idx]
        run.first_token_s = [first[i] for i in idx]
        run.finish_s = finish
        runs.append((run, [reqs[i] for i in idx]))
    return runs, transfer


def write_trace(path: Path, runs: list[ReplicaRun], pools: tuple[int, int] | None) -> None:
    """Chrome-trace JSON (chrome://tracing, Perfetto): a process per replica, an iteration a slice with its
    prefill tokens and decode sequences, and the replica's KV usage as a counter."""
    events: list[dict] = []
    for pid, run in enumerate(runs):
        role = "" if pools is None else (" (prefill)" if pid < pools[0] else " (decode)")
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"replica {pid}{role}"}})
        for start, dur, prefill, decode in run.timeline or ():
            name = "decode" if not prefill else ("prefill" if not decode else "prefill+decode")
            events.append({"ph": "X", "name": name, "pid": pid, "tid": 0, "ts": start * 1e6, "dur": dur * 1e6,
                           "args": {"prefill_tokens": prefill, "decode_seqs": decode}})  # fmt: skip
        for t, used in run.kv_usage:
            events.append({"ph": "C", "name": "KV usage", "pid": pid, "ts": t * 1e6, "args": {"used": round(used, 6)}})
    try:
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    except OSError as exc:
        raise ShardscopeError(f"cannot write {path}: {exc.strerror}") from None


Runs = list[tuple[ReplicaRun, list[Request]]]  # each replica's run with its share of the requests


def _summarise(
    model: str, gpu: str, gpus: int, tp: int, pp: int, dp: int, eng: Engine, precision: str, mode: str,
    rate: float, concurrency: int, reqs: list[Request], runs: Runs, mem: Memory, cost: IterationCost,
    slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
) -> ServeResult:  # fmt: skip
    ttft, tpot, e2e, itl = [], [], [], []
    tokens_in = tokens_out = good = 0
    for run, share in runs:
        for i, req in enumerate(share):
            if math.isnan(run.finish_s[i]):
                continue
            first = run.first_token_s[i] - run.arrival_s[i]
            total = run.finish_s[i] - run.arrival_s[i]
            ttft.append(first)
            e2e.append(total)
            per_token = (total - first) / (req.output_len - 1) if req.output_len > 1 else 0.0
            if req.output_len > 1:
                tpot.append(per_token)
            # vLLM's benchmark goodput: a request counts when it meets every SLO given (TPOT 0 for one token)
            if (slo_ttft_ms is None or first * 1e3 <= slo_ttft_ms) and (
                slo_tpot_ms is None or per_token * 1e3 <= slo_tpot_ms
            ):
                good += 1
            tokens_in += req.input_len
            tokens_out += req.output_len
        itl.extend(run.itl)
    finishes = [f for run, _ in runs for f in run.finish_s if not math.isnan(f)]
    duration = max(max(run.end_s for run, _ in runs), max(finishes, default=0.0))
    mean_len = sum(r.input_len + r.output_len for r in reqs) / len(reqs)
    units, per_block = kv_block_units(cost, eng)
    if per_block > 1:  # windowed layers hold only their window: the tokens' worth a request takes at its end
        mean_len = sum(units(r.input_len + r.output_len) for r in reqs) / len(reqs) * eng.block_size / per_block
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
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
        goodput_requests_per_s=None if slo_ttft_ms is None and slo_tpot_ms is None else good / duration,
    )  # fmt: skip
