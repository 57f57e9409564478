"""`serve_plan`: the serving deployment with the most goodput requests/s per GPU that meets TTFT/TPOT SLOs at
a given Poisson traffic, on at most N GPUs of one kind (`shardscope serve-plan`).

The search runs `serve_estimate` (the serving simulator) on each deployment that survives closed forms:

* weights and a KV cache fit a TP group, and the longest request fits its KV cache (as `serve` checks);
* TTFT: one prompt's prefill alone, chunked at the engine's token budget (plus the KV transfer when
  disaggregated), is a lower bound of every request's TTFT;
* TPOT: a decode step of one sequence alone is a lower bound of every step, hence of every request's TPOT;
* capacity: a replica serves at most min(token bound, decode bound) requests/s (below), so the replicas must
  carry the rate; below that the queue grows without end and no finite SLO holds at this traffic.

Goodput per GPU can never exceed n / (last arrival × GPUs) (the benchmark lasts at least until the last
arrival), so deployments are visited by GPU count, fewest first, and the search stops when that bound falls
below the K-th best found. Each survivor is screened with a short run (`SCREEN_PROMPTS` requests) and, if it
comes within `SCREEN_SLACK` of the SLOs, simulated with every request; only full runs are ranked. The
max_num_seqs ladder of one layout stops when a larger limit runs like the one below it (it no longer binds).

"Meets the SLO": the p90 TTFT and the p90 TPOT (vLLM's benchmark definitions) are within the targets given.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.quant import resolve_format
from shardscope.models.spec import ModelSpec
from shardscope.serve.cost import Batch, Deployment, IterationCost, memory_plan
from shardscope.serve.engine import load_engine
from shardscope.serve.estimate import ServeResult, check_dtypes, kv_transfer_s, serve_estimate
from shardscope.serve.metrics import percentile
from shardscope.serve.simulator import simulate_replica
from shardscope.serve.workload import Request, make_requests

MAX_NUM_SEQS_LADDER = (64, 128, 256, 512)  # plus the engine's own default
SCREEN_PROMPTS = 300  # requests of the screening run
SCREEN_SLACK = 1.1  # a screened deployment goes on to the full run if its p90s are within 1.1x the SLOs
PERCENTILE = 90.0  # the SLO percentile


@dataclass(frozen=True, slots=True)
class ServePlan:
    """One deployment and its full simulation at the given traffic."""

    gpus: int
    tp: int
    ep: int
    replicas: int  # all replicas (prefill + decode when disaggregated)
    prefill_replicas: int  # 0: not disaggregated
    decode_replicas: int
    max_num_seqs: int
    requests_per_s: float
    goodput_requests_per_s: float
    goodput_requests_per_s_per_gpu: float
    goodput_pct: float
    ttft_p90_ms: float
    tpot_p90_ms: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    e2e_p90_ms: float
    max_kv_usage: float
    preemptions: int
    serve_command: str  # the `shardscope serve` line that reproduces it
    pp: int = 1  # pipeline stages of a replica

    @property
    def disaggregate(self) -> str | None:
        return f"{self.prefill_replicas}:{self.decode_replicas}" if self.prefill_replicas else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["disaggregate"] = self.disaggregate
        return out


@dataclass(frozen=True, slots=True)
class Searched:
    """How many deployments each stage removed."""

    deployments: int = 0  # (TP, EP, replicas, P:D, max seqs) on <= N GPUs
    pruned_weights: int = 0  # weights (or the longest request's KV) do not fit
    pruned_ttft_bound: int = 0  # one prompt's prefill alone exceeds the TTFT SLO
    pruned_tpot_bound: int = 0  # one decode step alone exceeds the TPOT SLO
    pruned_capacity: int = 0  # the replicas cannot carry the rate
    pruned_goodput_bound: int = 0  # n / (last arrival x GPUs) below the K-th best: never simulated
    screened: int = 0  # short simulations
    simulated: int = 0  # full simulations
    met: int = 0  # full simulations meeting the SLOs


@dataclass(frozen=True, slots=True)
class ServePlanResult:
    model: str
    gpu: str
    max_gpus: int
    engine: str
    precision: str
    kv_dtype: str
    dataset: str
    rate_prompts_per_s: float  # the Poisson rate as given: prompts/s (requests/s where samples == 1)
    input_len: int
    output_len: int
    num_prompts: int
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    slo_percentile: float
    searched: Searched
    search_s: float
    plans: list[ServePlan] = field(default_factory=list)
    seed: int = 0  # of the arrivals and lengths every deployment was simulated with
    prefix_len: int = 0  # prompt tokens every request shares
    samples: int = 1  # sequences per prompt (requests = prompts x samples; the rate counts prompts)

    @property
    def rate_requests_per_s(self) -> float:
        """Requests offered per second: every prompt's samples are requests."""
        return self.rate_prompts_per_s * self.samples

    @property
    def arrivals(self) -> str:
        """The Poisson rate as the user gave it: requests/s, or prompts/s each sampled n times."""
        if self.samples == 1:
            return f"{self.rate_prompts_per_s:g} requests/s"
        return f"{self.rate_prompts_per_s:g} prompts/s x {self.samples} samples"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rate_requests_per_s"] = self.rate_requests_per_s
        out["plans"] = [p.to_dict() for p in self.plans]
        return out


@dataclass(frozen=True, slots=True)
class _Shape:
    """Closed forms of one TP group under one engine limit."""

    tp: int
    ep: int
    max_num_seqs: int
    fits: bool
    weights_gib: float
    ttft_min_s: float  # one prompt (p90 length) alone, chunked
    decode_min_s: float  # one decode step of one sequence at the shortest prompt
    replica_rps: float  # a colocated replica's capacity bound, requests/s
    prefill_rps: float  # a prefill-only replica's
    decode_rps: float  # a decode-only replica's
    transfer_s: float  # KV of one p90-length prompt from a prefill to a decode replica
    pp: int = 1


class NoPlan(ShardscopeError):
    """No deployment meets the SLOs; the message names the bound."""


def tp_sizes(heads: int, max_gpus: int, domain: int) -> list[int]:
    """Powers of two that divide the attention heads and fit one NVLink domain and the GPU budget."""
    out, t = [], 1
    while t <= min(max_gpus, domain):
        if heads % t == 0:
            out.append(t)
        t *= 2
    return out


def gpu_counts(max_gpus: int, per_node: int) -> list[int]:
    """Cluster sizes `make_cluster` builds: up to a node, then whole nodes."""
    return [g for g in range(1, max_gpus + 1) if g <= per_node or g % per_node == 0]


def _capacity(
    cost: IterationCost, budget: int, seqs: int, mean_in: float, mean_out: float
) -> tuple[float, float, float]:
    """Upper bounds of a replica's request rate: (colocated, prefill-only, decode-only).

    Tokens: an iteration of T tokens takes at least the time of T tokens with no attention and no sampling
    (as a prefill chunk, or as a CUDA-graphed decode batch where T is small enough), and that time per token
    is least at some T up to the token budget (powers of two and the budget tried); a request needs
    input + output − 1 tokens. Decode: a request takes output − 1 iterations, each with at most B decoding
    sequences, and an iteration with B of them takes at least the decode-only step of B sequences at the
    shortest KV; B is at most max_num_seqs and what the KV cache holds at input + 1 tokens each."""
    per_token = math.inf
    t = 1
    while True:
        t = min(t, budget)
        alone = min(cost.time_s(Batch(prefill_tokens=t)), cost.time_s(Batch(decode_seqs=t)))
        per_token = min(per_token, alone / t)
        if t == budget:
            break
        t *= 2
    kv0 = max(1, round(mean_in) + 1)
    window = cost.d.model.attention_window
    kvw0 = min(kv0, window) if window else kv0
    b_max = max(1, min(seqs, cost_kv_tokens(cost) // kv0))
    best, b = 0.0, 1
    while True:
        b = min(b, b_max)
        best = max(best, b / cost.decode_time_s(b, b * kv0, b * kvw0))
        if b == b_max:
            break
        b *= 2
    dec_tokens = max(0.0, mean_out - 1)
    decode_bound = best / dec_tokens if dec_tokens else math.inf
    colocated = min(1.0 / ((mean_in + dec_tokens) * per_token), decode_bound)
    prefill = 1.0 / (mean_in * per_token)
    decode = min(decode_bound, 1.0 / (dec_tokens * per_token)) if dec_tokens else math.inf
    return colocated, prefill, decode


def cost_kv_tokens(cost: IterationCost) -> int:
    return memory_plan(cost.d, cost.engine).kv_tokens


def _shape(
    spec: ModelSpec, gpu: str, tp: int, ep: int, eng, seqs: int, precision: str, kv_bytes: int, reqs: list[Request],
    cached: int = 0, pp: int = 1, shared_samples: int = 1,
) -> _Shape:  # fmt: skip
    """A deployment shape's closed-form bounds (TTFT, decode step, request rate). With a cached shared prefix
    (`cached` tokens) the bounds count only what a request computes and holds of its own: still bounds. With
    `shared_samples` > 1 (that many samples of a prompt reuse its cached KV) a group computes its prompt once
    and each other sample at least its last token, and a sample's first token may need only that one token. A pipelined
    replica's rate is bounded by PP of its passes at once, each with the whole KV pool and limit (its batches
    in flight share them: looser, still a bound)."""
    cluster = make_cluster(gpu, max(tp * pp, ep))  # wide EP: the experts spread over ep/tp replicas
    e = replace(eng, max_num_seqs=seqs)
    d = Deployment(spec, cluster, tp, precision, kv_bytes, ep, pp)
    mem = memory_plan(d, e)
    longest = max(r.input_len + r.output_len for r in reqs)
    fits = mem.kv_blocks >= 1 and longest * pp <= mem.kv_tokens
    if not fits:
        return _Shape(tp, ep, seqs, False, mem.weights_gib, math.inf, math.inf, 0.0, 0.0, 0.0, math.inf, pp)
    cost = IterationCost(d, e)
    p90_in = math.ceil(percentile(sorted(r.input_len for r in reqs), PERCENTILE))
    first = 1 if shared_samples > 1 else max(1, p90_in - cached)
    alone = simulate_replica([Request(0.0, first, 1)], cost, e, mem.kv_blocks)
    min_in = max(1, min(r.input_len for r in reqs) - cached)
    window = spec.attention_window
    kvw = min(min_in + 1, window) if window else min_in + 1
    decode = cost.decode_time_s(1, min_in + 1, kvw)
    mean_in = max(1.0, sum(r.input_len for r in reqs) / len(reqs) - cached)
    # per group: the prompt once, then one token per further sample
    mean_in = (mean_in + shared_samples - 1) / shared_samples
    mean_out = sum(r.output_len for r in reqs) / len(reqs)
    colocated, prefill, dec = _capacity(cost, e.max_num_batched_tokens, seqs, mean_in, mean_out)
    return _Shape(
        tp, ep, seqs, True, mem.weights_gib, alone.first_token_s[0], decode, pp * colocated, pp * prefill,
        pp * dec, kv_transfer_s(d, p90_in), pp,
    )  # fmt: skip


def _meets(r: ServeResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None, slack: float = 1.0) -> bool:
    ok = slo_ttft_ms is None or r.ttft.p90_ms <= slo_ttft_ms * slack
    tpot = r.tpot.p90_ms
    return ok and (slo_tpot_ms is None or math.isnan(tpot) or tpot <= slo_tpot_ms * slack)


def _excess(r: ServeResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> float:
    """How far past the SLOs a run is: the larger ratio of p90 to target."""
    ratios = [0.0]
    if slo_ttft_ms is not None:
        ratios.append(r.ttft.p90_ms / slo_ttft_ms)
    if slo_tpot_ms is not None and not math.isnan(r.tpot.p90_ms):
        ratios.append(r.tpot.p90_ms / slo_tpot_ms)
    return max(ratios)


def serve_plan(
    model: str,
    gpu: str = "H100",
    gpus: int = 8,
    engine: str = "vllm",
    rate: float | None = None,
    input_len: int = 1024,
    output_len: int = 256,
    dataset: str = "fixed",
    num_prompts: int = 1000,
    seed: int = 0,
    precision: str = "auto",
    kv_dtype: str = "auto",
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    top: int = 5,
    disaggregate: bool = True,
    screen_prompts: int = SCREEN_PROMPTS,
    prefix_len: int = 0,
    samples: int = 1,
) -> ServePlanResult:
    """Search TP, EP, replicas, P:D disaggregation and max_num_seqs for the deployments on at most `gpus`
    GPUs with the most goodput requests/s per GPU that meet the SLOs at Poisson `rate` (prompts/s, each
    sampled `samples` times, as GRPO rollouts are: the SLOs and goodput count requests); the best `top`.
    Raises `NoPlan` (a ShardscopeError) naming the binding constraint when none does."""
    start = time.perf_counter()
    if rate is None or not rate > 0 or math.isinf(rate):
        what = "none given" if rate is None else f"got {rate:g}"
        raise ShardscopeError(f"serve-plan needs --rate, Poisson requests/s, positive and finite ({what})")
    if slo_ttft_ms is None and slo_tpot_ms is None:
        raise ShardscopeError("serve-plan needs an SLO: --slo-ttft-ms, --slo-tpot-ms or both")
    for name, slo in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms)):
        if slo is not None and not slo > 0:
            raise ShardscopeError(f"{name} must be positive, got {slo}")
    if top < 1:
        raise ShardscopeError(f"--top must be at least 1, got {top}")
    if gpus < 1:
        raise ShardscopeError(f"--gpus must be positive, got {gpus}")
    check_dtypes(precision, kv_dtype)
    spec = load_model(model)
    if spec.dit is not None:
        raise ShardscopeError(f"{spec.name} is a diffusion transformer; serving simulates language models")
    precision = resolve_format(precision, spec.weight_format)
    cluster = make_cluster(gpu, gpus)
    eng = load_engine(engine, cluster.gpu)
    kv_dtype = eng.kv_dtype(kv_dtype, precision)
    spec = eng.serving_model(spec)
    reqs = make_requests(num_prompts, "poisson", rate, input_len, output_len, dataset, seed, samples)
    if prefix_len < 0 or (dataset == "fixed" and prefix_len >= input_len):
        raise ShardscopeError(f"--prefix-len must be at least 0 and below --input-len {input_len}, got {prefix_len}")
    # the shared prefix's tokens a request need not compute once cached (the bounds below start from them)
    cached = prefix_len // eng.block_size * eng.block_size if eng.prefix_caching else 0
    shared = samples if eng.prefix_caching else 1  # a prompt's samples that reuse its cached KV
    goodput_bound = len(reqs) / reqs[-1].arrival_s  # requests/s: the run lasts at least to the last arrival
    multi_token = any(r.output_len > 1 for r in reqs)  # TPOT counts only requests of two tokens or more
    kv_bytes = 1 if kv_dtype == "fp8" else 2
    ladder = sorted(set(MAX_NUM_SEQS_LADDER) | {eng.max_num_seqs})
    tps = tp_sizes(spec.heads, gpus, cluster.scaleup_domain)
    if not tps:
        raise ShardscopeError(f"{spec.name}: no TP size up to {gpus} divides its {spec.heads} attention heads")
    shapes: dict[tuple[int, int, int, int], _Shape] = {}

    def shape(tp: int, ep: int, s: int, pp: int = 1) -> _Shape:
        if (key := (tp, ep, s, pp)) not in shapes:
            shapes[key] = _shape(spec, gpu, tp, ep, eng, s, precision, kv_bytes, reqs, cached, pp, shared)
        return shapes[key]

    for tp in tps:  # every replica shape within a TP group (wide EP's come with the GPU counts that hold them)
        for ep in ep_sizes(spec, tp):
            for s in ladder:
                shape(tp, ep, s)
    # Pipeline stages only where no TP group within a node holds the model (a pass then crosses stages)
    pps = [1]
    if not any(sh.fits for sh in shapes.values()):
        pps += [q for q in (2, 4, 8) if q <= spec.layers and tps[-1] * q <= gpus]
    counts = gpu_counts(gpus, cluster.gpus_per_node)
    common = dict(
        gpu=gpu, engine=engine, num_prompts=num_prompts, precision=precision, kv_dtype=kv_dtype, rate=rate,
        input_len=input_len, output_len=output_len, dataset=dataset, seed=seed, slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms, prefix_len=prefix_len, samples=samples,
    )  # fmt: skip
    n_screen = min(num_prompts, screen_prompts)
    st: dict[str, int] = dict.fromkeys(Searched.__slots__, 0)
    found: list[ServePlan] = []
    closest: tuple[float, str] | None = None  # (excess, description) of the nearest miss simulated

    def kth() -> float:
        return found[top - 1].goodput_requests_per_s_per_gpu if len(found) >= top else -math.inf

    for g in counts:
        layouts = [
            (tp, pp, r, p)
            for pp in pps
            for tp in tps
            if g % (tp * pp) == 0
            for r in [g // (tp * pp)]
            for p in range(r if disaggregate and pp == 1 else 1)
        ]
        stop = goodput_bound / g < kth()
        for tp, pp, r, p in layouts:
            for ep in ep_sizes(spec, tp, 1 if p or pp > 1 else r):
                prev: ServeResult | None = None
                st["deployments"] += len(ladder)
                for s in ladder:
                    sh = shape(tp, ep, s, pp)
                    if stop:
                        st["pruned_goodput_bound"] += 1
                        continue
                    if not sh.fits:
                        st["pruned_weights"] += 1
                        continue
                    dis = f"{p}:{r - p}" if p else None
                    ttft_min = sh.ttft_min_s + (sh.transfer_s if p else 0.0)
                    if slo_ttft_ms is not None and ttft_min * 1e3 > slo_ttft_ms:
                        st["pruned_ttft_bound"] += 1
                        continue
                    if slo_tpot_ms is not None and multi_token and sh.decode_min_s * 1e3 > slo_tpot_ms:
                        st["pruned_tpot_bound"] += 1
                        continue
                    cap = min(p * sh.prefill_rps, (r - p) * sh.decode_rps) if p else r * sh.replica_rps
                    if cap < rate * samples:  # requests/s
                        st["pruned_capacity"] += 1
                        continue
                    if goodput_bound / g < kth():
                        st["pruned_goodput_bound"] += 1
                        continue
                    kw = dict(common, gpus=g, tp=tp, pp=pp, ep=ep, max_num_seqs=s, disaggregate=dis)
                    if n_screen < num_prompts:
                        st["screened"] += 1
                        quick = serve_estimate(model, **{**kw, "num_prompts": n_screen})
                        if not _meets(quick, slo_ttft_ms, slo_tpot_ms, SCREEN_SLACK):
                            closest = _nearer(closest, quick, slo_ttft_ms, slo_tpot_ms, tp, ep, r, dis, s, pp)
                            continue
                    res = serve_estimate(model, **kw)
                    st["simulated"] += 1
                    if prev is not None and _same(prev, res):
                        break  # the limit no longer binds: larger ones run the same
                    prev = res
                    if not _meets(res, slo_ttft_ms, slo_tpot_ms):
                        closest = _nearer(closest, res, slo_ttft_ms, slo_tpot_ms, tp, ep, r, dis, s, pp)
                        continue
                    st["met"] += 1
                    found.append(_plan(res, g, tp, ep, r, p, s, model, common, pp))
                    found.sort(key=_rank)
    searched = Searched(**st)
    if not found:
        raise NoPlan(_why_none(spec.name, cluster.gpu.name, gpus, shapes, rate, slo_ttft_ms, slo_tpot_ms,
                               multi_token, closest))  # fmt: skip
    return ServePlanResult(
        model=spec.name, gpu=cluster.gpu.name, max_gpus=gpus, engine=eng.label, precision=precision,
        kv_dtype=kv_dtype, dataset=dataset, rate_prompts_per_s=rate, input_len=input_len, output_len=output_len,
        num_prompts=num_prompts, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_percentile=PERCENTILE,
        searched=searched, search_s=time.perf_counter() - start, plans=found[:top], seed=seed,
        prefix_len=prefix_len, samples=samples,
    )  # fmt: skip


def ep_sizes(spec: ModelSpec, tp: int, replicas: int = 1) -> tuple[int, ...]:
    """Expert-parallel sizes `serve` simulates at this TP for a MoE model whose experts split evenly
    (`check_ep`): 1 (every expert TP-sharded), EP = TP within the replica, and with several replicas EP
    over all of them (wide EP over data-parallel attention)."""
    if spec.moe is None:
        return (1,)
    sizes = [1] + [ep for ep in (tp, tp * replicas) if ep > 1 and spec.moe.experts % ep == 0]
    return tuple(dict.fromkeys(sizes))


def _same(a: ServeResult, b: ServeResult, rel: float = 2e-3) -> bool:
    """Two runs alike within `rel` in goodput and p90 latencies: a larger max_num_seqs no longer binds (the
    KV pool shrinks a little with it, as the profile run samples more rows, so runs differ by a hair)."""

    def close(x: float | None, y: float | None) -> bool:
        if x is None or y is None or math.isnan(x) or math.isnan(y):
            return x is y or (x is not None and y is not None and math.isnan(x) and math.isnan(y))
        return abs(x - y) <= rel * max(abs(x), abs(y), 1e-12)

    pairs = (
        (a.goodput_requests_per_s, b.goodput_requests_per_s),
        (a.ttft.p90_ms, b.ttft.p90_ms),
        (a.tpot.p90_ms, b.tpot.p90_ms),
    )
    return all(close(x, y) for x, y in pairs)


def _rank(p: ServePlan) -> tuple:
    return (-p.goodput_requests_per_s_per_gpu, p.gpus, p.tpot_p90_ms, p.ttft_p90_ms, p.max_num_seqs)


def _label(tp: int, ep: int, r: int, dis: str | None, s: int, pp: int = 1) -> str:
    layout = f"P:D {dis}" if dis else f"{r} replica{'s' if r > 1 else ''}"
    return f"TP{tp}{f' PP{pp}' if pp > 1 else ''}{f' EP{ep}' if ep > 1 else ''} x {layout}, max seqs {s}"


def _nearer(
    closest: tuple[float, str] | None, res: ServeResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None,
    tp: int, ep: int, r: int, dis: str | None, s: int, pp: int = 1,
) -> tuple[float, str]:  # fmt: skip
    ex = _excess(res, slo_ttft_ms, slo_tpot_ms)
    if closest is not None and closest[0] <= ex:
        return closest
    parts = []
    if slo_ttft_ms is not None:
        parts.append(f"TTFT p90 {res.ttft.p90_ms:,.1f} ms")
    if slo_tpot_ms is not None:
        parts.append(f"TPOT p90 {res.tpot.p90_ms:,.1f} ms")
    return ex, f"the closest, {_label(tp, ep, r, dis, s, pp)} on {res.gpus} GPUs, runs {' and '.join(parts)}"


def _plan(
    res: ServeResult, g: int, tp: int, ep: int, r: int, p: int, s: int, model: str, common: dict, pp: int = 1
) -> ServePlan:
    goodput = res.goodput_requests_per_s or 0.0
    cmd = (
        f"shardscope serve {model} --gpu {common['gpu']} --gpus {g} --tp {tp} --engine {common['engine']} "
        f"--rate {common['rate']:g} --max-num-seqs {s}"
    )
    if pp > 1:
        cmd += f" --pp {pp}"
    if ep > 1:
        cmd += f" --ep {ep}"
    if common["num_prompts"] != 1000:
        cmd += f" --num-prompts {common['num_prompts']}"
    if common["seed"]:
        cmd += f" --seed {common['seed']}"
    if common["dataset"] != "fixed":
        cmd += f" --dataset {common['dataset']}"
    else:
        cmd += f" --input-len {common['input_len']} --output-len {common['output_len']}"
    if common["precision"] != "bf16":
        cmd += f" --precision {common['precision']}"
    if common["kv_dtype"] != "bf16":
        cmd += f" --kv-dtype {common['kv_dtype']}"
    if common["prefix_len"]:
        cmd += f" --prefix-len {common['prefix_len']}"
    if common["samples"] > 1:
        cmd += f" --samples {common['samples']}"
    if p:
        cmd += f" --disaggregate {p}:{r - p}"
    for flag, v in (("--slo-ttft-ms", common["slo_ttft_ms"]), ("--slo-tpot-ms", common["slo_tpot_ms"])):
        if v is not None:
            cmd += f" {flag} {v:g}"
    return ServePlan(
        gpus=g, tp=tp, ep=ep, replicas=r, prefill_replicas=p, decode_replicas=r - p if p else r, max_num_seqs=s,
        requests_per_s=res.requests_per_s, goodput_requests_per_s=goodput,
        goodput_requests_per_s_per_gpu=goodput / g,
        goodput_pct=100.0 * goodput / res.requests_per_s if res.requests_per_s else 0.0,
        ttft_p90_ms=res.ttft.p90_ms, tpot_p90_ms=res.tpot.p90_ms, ttft_p99_ms=res.ttft.p99_ms,
        tpot_p99_ms=res.tpot.p99_ms, e2e_p90_ms=res.e2e.p90_ms, max_kv_usage=res.max_kv_usage,
        preemptions=res.preemptions, serve_command=cmd, pp=pp,
    )  # fmt: skip


def _why_none(
    model: str, gpu: str, gpus: int, shapes: dict, rate: float, slo_ttft_ms: float | None,
    slo_tpot_ms: float | None, multi_token: bool, closest: tuple[float, str] | None,
) -> str:  # fmt: skip
    """One line: which constraint bound, with the value that comes closest."""
    slos = []
    if slo_ttft_ms is not None:
        slos.append(f"TTFT ≤ {slo_ttft_ms:g} ms")
    if slo_tpot_ms is not None:
        slos.append(f"TPOT ≤ {slo_tpot_ms:g} ms")
    head = f"no deployment of {model} on ≤{gpus} {gpu}"
    fit = [sh for sh in shapes.values() if sh.fits]
    if not fit:
        sh = min(shapes.values(), key=lambda x: x.weights_gib)
        return (
            f"{head} fits: at TP{sh.tp} the weights take {sh.weights_gib:.1f} GiB per GPU and leave no room for "
            "the KV cache of the longest request (use --precision fp8 or a larger --gpus)"
        )
    if slo_tpot_ms is not None and multi_token:
        fastest = min(fit, key=lambda x: x.decode_min_s)
        if fastest.decode_min_s * 1e3 > slo_tpot_ms:
            return (
                f"{head} meets TPOT ≤ {slo_tpot_ms:g} ms: the fastest decode step is "
                f"{fastest.decode_min_s * 1e3:.1f} ms at TP{fastest.tp}"
            )
    if slo_ttft_ms is not None:
        fastest = min(fit, key=lambda x: x.ttft_min_s)
        if fastest.ttft_min_s * 1e3 > slo_ttft_ms:
            return (
                f"{head} meets TTFT ≤ {slo_ttft_ms:g} ms: the fastest prefill of one prompt alone is "
                f"{fastest.ttft_min_s * 1e3:.1f} ms at TP{fastest.tp}"
            )
    if closest is None:  # every deployment that passed the latency bounds was short of capacity
        ok = [
            sh for sh in fit
            if (slo_tpot_ms is None or not multi_token or sh.decode_min_s * 1e3 <= slo_tpot_ms)
            and (slo_ttft_ms is None or sh.ttft_min_s * 1e3 <= slo_ttft_ms)
        ]  # fmt: skip
        best = max(ok or fit, key=lambda x: (gpus // x.tp) * x.replica_rps)
        cap = (gpus // best.tp) * best.replica_rps
        return (
            f"{head} carries {rate:g} requests/s within {' and '.join(slos)}: at most {cap:,.2f} requests/s fit "
            f"on {gpus // best.tp * best.tp} GPUs (TP{best.tp}, max seqs {best.max_num_seqs}: the token and "
            "decode-batch bounds)"
        )
    return f"{head} meets {' and '.join(slos)} at {rate:g} requests/s: {closest[1]}"
