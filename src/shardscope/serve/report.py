"""Rich tables of a serving estimate: deployment and KV capacity, then latency and throughput."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from shardscope.serve.estimate import ServeResult
from shardscope.serve.plan import ServePlanResult


def print_serve(r: ServeResult, console: Console | None = None) -> None:
    out = console or Console()
    m = r.memory
    load = {"poisson": f"Poisson {r.rate:g} req/s", "offline": "offline (all at t=0)"}.get(
        r.arrivals, f"concurrency {r.concurrency}"
    )
    ep = f" (EP {r.ep})" if r.ep > 1 else ""
    title = f"{r.model} on {r.gpus}x {r.gpu}: TP {r.tp}{ep} x PP {r.pp} x DP {r.dp}, {r.engine}, {r.precision}"
    head = Table(title=f"{title}, KV {r.kv_dtype}", title_justify="left", show_header=False)
    head.add_column("what")
    head.add_column("value", justify="right")
    rows = [
        ("workload", f"{r.num_prompts} requests{_groups(r)}, {load}"),
        ("HBM per GPU", f"{m.hbm_gib:.1f} GiB"),
        ("weights per GPU", f"{m.weights_gib:.2f} GiB"),
        ("activation peak (profile run)", f"{m.activation_peak_gib:.2f} GiB"),
        ("non-torch + CUDA-graph pool", f"{m.non_torch_gib + m.cuda_graph_pool_gib:.2f} GiB"),
        ("KV pool per GPU", f"{m.kv_pool_gib:.2f} GiB"),
        ("KV bytes per token per GPU", f"{m.kv_bytes_per_token / 1024:.1f} KiB"),
        ("KV blocks per replica", f"{m.kv_blocks:,} x {m.block_size} = {m.kv_tokens:,} tokens"),
        ("requests that fit at full length", f"{r.max_concurrency_at_full_length:,.1f}"),
        ("prefill of one prompt alone", f"{r.prefill_s * 1e3:.2f} ms"),
        ("decode iteration of one request", f"{r.decode_iteration_s * 1e3:.2f} ms"),
    ]
    if r.prefix_len:
        rows.append(("shared prompt prefix", f"{r.prefix_len:,} tokens"))
    if r.spec_decode:
        rows.append(("speculative decoding", f"{r.spec_decode}: {r.tokens_per_decode_step:.2f} tokens a step"))
    if r.disaggregate:
        rows.append(("prefill:decode replicas", r.disaggregate))
        rows.append(("KV transfer of one request (mean)", f"{r.kv_transfer_s * 1e3:.2f} ms"))
    for row in rows:
        head.add_row(*row)
    out.print(head)

    lat = Table(title="Latency (ms; TPOT excludes the first token, as vLLM's benchmark)", title_justify="left")
    for col in ("metric", "mean", "p50", "p90", "p99"):
        lat.add_column(col, justify="right" if col != "metric" else "left")
    for name, s in (("TTFT", r.ttft), ("TPOT", r.tpot), ("ITL", r.itl), ("E2E", r.e2e)):
        lat.add_row(name, *(f"{v:,.2f}" for v in (s.mean_ms, s.p50_ms, s.p90_ms, s.p99_ms)))
    out.print(lat)

    tput = Table(title="Throughput", title_justify="left", show_header=False)
    tput.add_column("what")
    tput.add_column("value", justify="right")
    tput.add_row("duration", f"{r.duration_s:,.2f} s")
    tput.add_row("requests/s", f"{r.requests_per_s:,.2f}")
    tput.add_row("input tokens/s", f"{r.input_tokens_per_s:,.0f}")
    tput.add_row("output tokens/s", f"{r.output_tokens_per_s:,.0f} ({r.output_tokens_per_s_per_gpu:,.0f} per GPU)")
    if r.goodput_requests_per_s is not None:
        slo = ", ".join(
            f"{name} <= {v:g} ms" for name, v in (("TTFT", r.slo_ttft_ms), ("TPOT", r.slo_tpot_ms)) if v is not None
        )
        tput.add_row(f"goodput ({slo})", f"{r.goodput_requests_per_s:,.2f} req/s")
    tput.add_row("max KV usage", f"{r.max_kv_usage:.1%}")
    tput.add_row("preemptions", f"{r.preemptions:,}")
    out.print(tput)


def print_serve_plan(r: ServePlanResult, console: Console | None = None) -> None:
    """The best deployments of `serve-plan`, ranked by goodput requests/s per GPU."""
    from shardscope.report.console import print_whole

    out = console or Console()
    s = r.searched
    slos = " and ".join(
        f"{name} p90 ≤ {v:g} ms" for name, v in (("TTFT", r.slo_ttft_ms), ("TPOT", r.slo_tpot_ms)) if v is not None
    )
    load = f"{r.input_len}/{r.output_len} tokens" if r.dataset == "fixed" else r.dataset
    requests = f"{r.num_prompts:,} requests" if r.samples == 1 else f"{r.num_prompts:,} prompts"
    out.print(
        f"[bold]{r.model}[/] on ≤{r.max_gpus}× {r.gpu}, {r.engine}, Poisson {r.arrivals} "
        f"({load}, {requests}): {s.deployments:,} deployments, {s.simulated:,} simulated, "
        f"{s.met:,} meet {slos}; best by goodput req/s per GPU:"
    )
    table = Table()
    cols = ("#", "GPUs", "TP", "EP", "replicas", "P:D", "max seqs", "req/s", "req/s/GPU", "TTFT p90", "TPOT p90")
    for col in (*cols, "goodput %"):
        table.add_column(col, justify="right")
    for i, p in enumerate(r.plans, 1):
        tp = f"{p.tp} (PP{p.pp})" if p.pp > 1 else str(p.tp)  # a pipelined replica: TP x PP GPUs
        table.add_row(
            str(i), str(p.gpus), tp, str(p.ep), str(p.replicas), p.disaggregate or "-", str(p.max_num_seqs),
            f"{p.goodput_requests_per_s:,.2f}", f"{p.goodput_requests_per_s_per_gpu:,.3f}",
            f"{p.ttft_p90_ms:,.1f} ms", f"{p.tpot_p90_ms:,.1f} ms", f"{p.goodput_pct:.1f}",
        )  # fmt: skip
    print_whole(out, table)
    out.print(f"req/s: goodput (requests meeting the SLOs). Plan #1 as a simulation: {r.plans[0].serve_command}")


def _groups(r: ServeResult) -> str:
    """How the requests group into prompts, when a prompt is sampled more than once."""
    return f" ({r.num_prompts // r.samples} prompts x {r.samples} samples)" if r.samples > 1 else ""
