"""The serving page of a deployment search: one self-contained HTML file (nothing fetched) with the
latency–throughput curves of the best deployments and where each sits at the traffic asked for.

Each curve is the deployment simulated as `serve` simulates it, at Poisson rates from a quarter of the one
searched up (`RATE_FACTORS`, then doubling until queueing shows: p90 TTFT `KNEE_TTFT` times its value at
the lowest rate, at most `MAX_FACTOR`x), with the search's requests (count, lengths, seed): p90 TTFT and p90
TPOT against the requests/s it completes. The point at 1x is the search's own run of that deployment.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from shardscope.report.page import fill_page
from shardscope.serve.estimate import serve_estimate
from shardscope.serve.plan import ServePlan, ServePlanResult

RATE_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # of the searched rate, one curve point each
KNEE_TTFT = 4.0  # p90 TTFT over its value at the lowest rate past which the requests queue: past the knee
MAX_FACTOR = 64.0  # the highest rate factor tried
CURVES = 3  # deployments drawn (the best ones)


def deployment_label(p: ServePlan) -> str:
    parts = [f"{p.gpus} GPUs", f"TP{p.tp}"] + ([f"EP{p.ep}"] if p.ep > 1 else [])
    pools = f"P:D {p.disaggregate}" if p.disaggregate else f"{p.replicas} replica" + ("s" if p.replicas > 1 else "")
    return " ".join(parts) + f", {pools}, max {p.max_num_seqs} seqs"


def curve(result: ServePlanResult, plan: ServePlan) -> list[dict]:
    """`plan` simulated at rising rates of the search's traffic, one point per rate, past the knee."""
    points: list[dict] = []
    factors = list(RATE_FACTORS)
    while factors:
        f = factors.pop(0)
        r = serve_estimate(
            result.model, gpu=result.gpu, gpus=plan.gpus, tp=plan.tp, pp=plan.pp, ep=plan.ep, engine=result.engine,
            precision=result.precision, kv_dtype=result.kv_dtype, rate=result.rate_prompts_per_s * f,
            num_prompts=result.num_prompts, input_len=result.input_len, output_len=result.output_len,
            dataset=result.dataset, seed=result.seed, max_num_seqs=plan.max_num_seqs,
            slo_ttft_ms=result.slo_ttft_ms, slo_tpot_ms=result.slo_tpot_ms, disaggregate=plan.disaggregate,
            prefix_len=result.prefix_len, samples=result.samples,
        )  # fmt: skip
        points.append(
            {
                "factor": f,
                "offered_requests_per_s": result.rate_requests_per_s * f,
                "requests_per_s": r.requests_per_s,
                "goodput_requests_per_s": r.goodput_requests_per_s or 0.0,
                "output_tokens_per_s_per_gpu": r.output_tokens_per_s_per_gpu,
                "ttft_p90_ms": r.ttft.p90_ms,
                "tpot_p90_ms": r.tpot.p90_ms,
            }
        )
        queueing = r.ttft.p90_ms >= KNEE_TTFT * points[0]["ttft_p90_ms"]
        if not factors and not queueing and 2 * f <= MAX_FACTOR:
            factors.append(2 * f)  # not yet past the knee
    return points


def page_data(result: ServePlanResult, curves: int = CURVES) -> dict:
    """What the page draws: the search's traffic and SLOs, its best deployments and their curves."""
    slos = [f"p{result.slo_percentile:g} {n} ≤ {v:g} ms" for n, v in (("TTFT", result.slo_ttft_ms),
            ("TPOT", result.slo_tpot_ms)) if v is not None]  # fmt: skip
    return {
        "title": f"{result.model} on up to {result.max_gpus}x {result.gpu}, {result.engine}, Poisson "
        f"{result.arrivals}, {result.dataset} {result.input_len}/{result.output_len} tokens",
        "slos": ", ".join(slos),
        "slo_ttft_ms": result.slo_ttft_ms,
        "slo_tpot_ms": result.slo_tpot_ms,
        "rate_requests_per_s": result.rate_requests_per_s,
        "plans": [{"label": deployment_label(p), **p.to_dict()} for p in result.plans],
        "curves": [{"label": deployment_label(p), "points": curve(result, p)} for p in result.plans[:curves]],
    }


def write_serve_page(path: Path, result: ServePlanResult) -> None:
    data = page_data(result)
    template = (resources.files("shardscope.serve") / "page.html").read_text()
    Path(path).write_text(fill_page(template, data["title"], data))
