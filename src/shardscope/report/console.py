"""Rich tables for estimates and catalogs."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from shardscope.result import Estimate


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.3f} s"


def _dtypes(p: dict) -> str:
    """Optimizer dtypes that differ from fp32 (Megatron's precision-aware optimizer)."""
    parts = [f"Adam m,v {p['optimizer_moments']}"] if p["optimizer_moments"] != "fp32" else []
    parts += [f"grads {p['main_grads']}"] if p["main_grads"] != "fp32" else []
    return f" ({', '.join(parts)})" if parts else ""


def print_estimate(est: Estimate, console: Console | None = None) -> None:
    console = console or Console()
    p = est.plan
    mem, t = est.memory, est.time
    modules = f" ({', '.join(p['recompute_modules'])})" if p.get("recompute_modules") else ""
    ep = f" EP{p['ep']} ({p['ep_dispatch']})" if p["ep"] > 1 else ""
    stack = f" under {est.stack}" if est.stack else ""
    head = (
        f"[bold]{est.model}[/] on {est.gpus}× {est.gpu}{stack} — TP{p['tp']} PP{p['pp']}"
        f"{'×' + str(p['vpp']) if p['vpp'] > 1 else ''} CP{p['cp']}{ep} DP{p['dp']} {p['sharding']}{_dtypes(p)}, "
        f"recompute {p['recompute']}{modules}, "
        f"micro-batch {p['micro_batch']} × {p['grad_accum']} accum, "
        f"global batch {p['global_batch']} × {p['seq_len']} tokens"
    )
    console.print(head)
    perf = Table(title="Throughput", show_header=False, title_justify="left")
    perf.add_row("step time", _fmt_s(est.step_time_s))
    perf.add_row("tokens/s/GPU", f"{est.tokens_per_s_per_gpu:,.0f}")
    perf.add_row("model TFLOP/s/GPU", f"{est.model_tflops_per_gpu:,.1f}")
    peak = f"of the {p['precision'].upper()} peak, {est.peak_tflops_per_gpu:,.0f} TFLOP/s"
    perf.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%} ({peak})")
    perf.add_row("parameters", f"{est.params.total / 1e9:,.3f} B ({est.params.per_gpu / 1e9:,.3f} B per GPU)")
    console.print(perf)
    tt = Table(title="Where the step goes", title_justify="left")
    tt.add_column("part")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    for name, value in (
        ("compute", t.compute_s),
        ("  of which recompute", t.recompute_s),
        ("  of which waiting for the host", t.host_stall_s),
        ("exposed communication", t.exposed_comm_s),
        ("pipeline bubble", t.bubble_s),
        ("optimizer", t.optimizer_s),
    ):
        tt.add_row(name, _fmt_s(value), f"{value / est.step_time_s:.1%}")
    console.print(tt)
    mt = Table(title=f"Memory per GPU (stage {mem.stage}, most loaded)", title_justify="left")
    mt.add_column("part")
    mt.add_column("GiB", justify="right")
    for name, value in (
        ("parameters", mem.params_gib),
        ("gradients", mem.grads_gib),
        ("optimizer states", mem.optimizer_gib),
        ("activations", mem.activations_gib),
        ("buffers", mem.buffers_gib),
        ("peak allocated", mem.peak_gib),
        ("+ context & fragmentation", mem.overhead_gib),
    ):
        mt.add_row(name, f"{value:,.2f}")
    verdict = "[green]fits[/]" if est.fits else "[red]does NOT fit[/]"
    mt.add_row("[bold]required[/]", f"[bold]{mem.required_gib:,.2f}[/] of {mem.capacity_gib:,.1f} — {verdict}")
    console.print(mt)
    if not est.fits:
        console.print(
            f"[yellow]hint:[/] {mem.required_gib - mem.capacity_gib:,.1f} GiB per GPU over capacity; "
            f"`shardscope plan {est.model} --gpu {est.gpu} --gpus {est.gpus} --seq-len {p['seq_len']} "
            f"--global-batch {p['global_batch']}` lists the plans that fit, `shardscope budget` the finer knobs"
        )
    for w in est.warnings:
        console.print(f"[yellow]warning:[/] {w}")


def print_whole(console: Console, table: Table) -> None:
    """Print a catalog table at its natural width, wider than the terminal if need be: names and numbers
    are never cut (a narrow terminal wraps the lines instead)."""
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    narrow = console.width
    console.width = max(narrow, natural)
    console.print(table)
    console.width = narrow


def print_models(console: Console | None = None) -> None:
    from shardscope.models.catalog import list_models, load_model

    console = console or Console()
    table = Table(
        title="Model catalog (B = billions of parameters; experts: routed+shared; weights: the checkpoint's format)"
    )
    columns = (
        "name",
        "params B",
        "active B",
        "layers",
        "hidden",
        "heads/kv",
        "ffn",
        "experts",
        "expert ffn",
        "top-k",
        "vocab",
        "mlp",
        "weights",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("name", "mlp", "weights") else "right", no_wrap=True)
    for name in list_models():
        m = load_model(name)
        moe = m.moe
        table.add_row(
            name,
            f"{m.params_total / 1e9:,.2f}",
            f"{m.params_active / 1e9:,.2f}",
            str(m.layers),
            str(m.hidden),
            f"{m.heads}/{m.kv_heads}",
            str(m.ffn_hidden),
            f"{moe.experts}" + (f"+{moe.shared_experts}" if moe.shared_experts else "") if moe else "-",
            str(moe.expert_ffn) if moe else "-",
            str(moe.top_k) if moe else "-",
            str(m.vocab),
            m.mlp,
            (m.weight_format or "bf16") + (" (experts)" if m.quantized_experts_only else ""),
        )
    print_whole(console, table)


def print_gpus(console: Console | None = None) -> None:
    from shardscope.hardware.catalog import list_gpus

    console = console or Console()
    table = Table(title="GPU catalog (dense TFLOP/s; GB/s per GPU per direction)")
    for col in ("name", "BF16", "FP8", "HBM GiB", "HBM GB/s", "NVLink GB/s", "domain", "NIC GB/s", "sustained"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for g in list_gpus():
        table.add_row(
            g.name,
            f"{g.bf16_tflops:g}",
            f"{g.fp8_tflops:g}" if g.fp8_tflops else "-",
            f"{g.hbm_gib:g}",
            f"{g.hbm_gbps:g}",
            f"{g.scaleup_gbps:g}",
            str(g.scaleup_domain),
            f"{g.scaleout_gbps:g}",
            f"{g.matmul_sustained_fraction:.0%}",
        )
    print_whole(console, table)


def print_plans(
    model: str, cluster, result, best, tokens: float | None, price: float | None, console: Console | None = None
) -> None:
    from shardscope.planner.cost import training_cost

    console = console or Console()
    console.print(
        f"[bold]{model}[/] on {cluster.gpus}× {cluster.gpu.name}: {result.structures:,} parallel layouts "
        f"searched, {result.evaluated:,} fit; best by {result.objective}:"
    )
    table = Table()
    for col in ("#", "layout", "sharding", "recompute", "mb", "tok/s/GPU", "MFU", "step", "GiB"):
        table.add_column(col, justify="left" if col in ("layout", "sharding", "recompute") else "right")
    for i, c in enumerate(best, 1):
        p, e = c.plan, c.estimate
        layout = f"TP{p.tp} PP{p.pp}" + (f"×{p.vpp}" if p.vpp > 1 else "") + f" CP{p.cp} DP{p.dp}"
        layout += f" EP{p.ep} {p.ep_dispatch}" + (" +overlap" if p.ep_comm_overlap else "") if p.ep > 1 else ""
        rec = p.recompute + (f" {p.recompute_layers}/stage" if p.recompute == "full" and p.recompute_layers else "")
        rec = " ".join(p.recompute_modules) if p.recompute_modules else rec  # Megatron's selective modules
        shard = p.sharding_name.replace(" (no reshard)", "-noreshard") + (" +offload" if p.offload_optimizer else "")
        table.add_row(
            str(i),
            layout,
            shard,
            rec,
            str(p.micro_batch),
            f"{e.tokens_per_s_per_gpu:,.0f}",
            f"{e.mfu:.1%}",
            _fmt_s(e.step_time_s),
            f"{e.memory.required_gib:,.1f}",
        )
    console.print(table)
    peaks = {(c.plan.precision, c.estimate.peak_tflops_per_gpu) for c in best}
    console.print(
        "MFU is against the dense peak of each plan's GEMM precision: "
        + ", ".join(f"{prec.upper()} {peak:,.0f} TFLOP/s" for prec, peak in sorted(peaks))
    )
    plans_by_warning: dict[str, list[str]] = {}
    for i, c in enumerate(best, 1):
        for w in c.estimate.warnings:
            plans_by_warning.setdefault(w, []).append(f"#{i}")
    for w, plans in plans_by_warning.items():
        which = "all plans" if len(plans) == len(best) else "plans " + ", ".join(plans)
        console.print(f"[yellow]warning[/] ({which}): {w}")
    if tokens:
        tc = training_cost(best[0].estimate, tokens, price)
        money = f", US${tc.cost_usd:,.0f}" if tc.cost_usd is not None else ""
        console.print(
            f"Training {tokens:,.3g} tokens with plan #1: {tc.steps:,} steps, {tc.days:,.1f} days, "
            f"{tc.gpu_hours:,.0f} GPU-hours{money}"
        )


def print_budget(result, console: Console | None = None) -> None:
    console = console or Console()
    if result.kind == "sac":
        console.print(
            f"Plan needs {result.start_gib:.1f} GiB without recompute (step {_fmt_s(result.start_step_s)}); "
            f"budget {result.budget_gib:g} GiB: free {result.need_gib:.1f} GiB at the least recompute time."
        )
        value = "recompute time added"
    else:
        console.print(
            f"Plan needs {result.start_gib:.1f} GiB (step {_fmt_s(result.start_step_s)}); budget "
            f"{result.budget_gib:g} GiB leaves {result.need_gib:.1f} GiB to keep weights unsharded after forward."
        )
        value = "time saved"
    table = Table()
    table.add_column("module")
    table.add_column("GiB per layer", justify="right")
    table.add_column("s per layer", justify="right")
    table.add_column("greedy: layers", justify="right")
    table.add_column("exact: layers", justify="right")
    for it in result.items:
        table.add_row(
            it.name,
            f"{it.bytes_per_layer / 2**30:.3f}",
            f"{it.seconds_per_layer:.4f}",
            str(result.greedy.items.get(it.name, 0)),
            str(result.exact.items.get(it.name, 0)),
        )
    console.print(table)
    for label, c in (("greedy", result.greedy), ("exact", result.exact)):
        sign = 1 if result.kind == "sac" else -1
        console.print(
            f"{label}: {c.freed_gib:.2f} GiB, {value} {c.cost_s * 1e3:.1f} ms per step "
            f"(step ≈ {_fmt_s(result.start_step_s + sign * c.cost_s)})"
        )


def print_modules(result, console: Console | None = None) -> None:
    """The Megatron recompute-module sets on the memory/time frontier, and the fastest that fits."""
    console = console or Console()
    none = next((s for s in result.frontier if not s.modules), None)
    table = Table(title=f"Megatron recompute modules (this model has: {', '.join(result.available) or 'none'})")
    table.add_column("--recompute-modules")
    table.add_column("required GiB", justify="right")
    table.add_column("step s", justify="right")
    table.add_column("vs none", justify="right")
    table.add_column("fits", justify="center")
    for s in result.frontier:
        extra = f"{(s.step_time_s / none.step_time_s - 1) * 100:+.1f}%" if none else ""
        table.add_row(
            " ".join(s.modules) or "(none)",
            f"{s.required_gib:.2f}",
            f"{s.step_time_s:.3f}",
            extra,
            "✓" if s.required_gib <= result.budget_gib else "",
            style="bold" if s == result.best else None,
        )
    console.print(table)
    best = result.best
    if best.modules:
        flags = f"--recompute-granularity selective --recompute-modules {' '.join(best.modules)}"
        console.print(f"fastest under {result.budget_gib:g} GiB: {best.required_gib:.1f} GiB, {best.step_time_s:.3f} s")
        console.print(f"Megatron-LM: {flags}")
    else:
        console.print(f"fits {result.budget_gib:g} GiB without recompute ({best.required_gib:.1f} GiB)")


def print_stacks(stacks: list, sources: bool = False) -> None:
    """Several stacks: one row each, the settings that differ most between frameworks. One stack
    (`sources`): every setting with the release it came in and its source."""
    from shardscope.stacks.registry import known_releases

    out = Console()
    if not sources:
        cols = ("sharding", "attention_kernel", "fused_activation", "fused_cross_entropy", "eager_elementwise",
                "linear_impl", "tp_comm_overlap", "persistent_grads")  # fmt: skip
        heads = ("stack", "sharding", "attention", "fused SwiGLU", "fused loss", "eager norms", "GEMMs",
                 "TP overlap", "grad buffer")  # fmt: skip
        table = Table(title="Stacks (default: megatron; `shardscope stacks NAME` for every setting and its source)")
        for h in heads:
            table.add_column(h)
        for st in stacks:
            values = [str(st.value(c, "")) for c in cols]
            values[-1] = "kept" if st.value("persistent_grads", True) else "freed"
            table.add_row(st.label, *values)
        out.print(table)
        return
    for st in stacks:
        table = Table(title=f"{st.label} — {st.title}", title_justify="left")
        for col in ("setting", "value", "since"):
            table.add_column(col)
        table.add_column("source", overflow="fold")
        for key, setting in st.settings.items():
            value = "eager" if key == "cuda_graphs" and not setting.value else str(setting.value)
            table.add_row(key, value, setting.since or "all", setting.source)
        out.print(table)
        releases = known_releases(st.name)
        if releases:
            out.print(f"  releases: {', '.join(releases)}")
        for w in st.warnings:
            out.print(f"  [yellow]warning:[/] {w}")
