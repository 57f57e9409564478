"""Rich tables for `shardscope rl-sync`: mechanisms x parts with the bottleneck, and the validation rows."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from shardscope.report.console import print_whole
from shardscope.rl.command import RLSyncResult
from shardscope.rl.sync import PARTS
from shardscope.rl.validate import RLReport


def print_rl_sync(result: RLSyncResult, console: Console | None = None) -> None:
    console = console or Console()
    experts = "destination-local experts" if result.local_experts else "full experts on every rank"
    title = (
        f"{result.model} weight update, {result.gpus} x {result.gpu}, {result.placement}: "
        f"{result.train} -> {result.rollout} ({result.payload_gib:.1f} GiB {result.payload_precision}, {experts})"
    )
    table = Table(title=title)
    table.add_column("mechanism", no_wrap=True)
    for part in PARTS:
        table.add_column(part, justify="right")
    table.add_column("total", justify="right", style="bold")
    table.add_column("GiB in/rank", justify="right")
    table.add_column("buckets", justify="right")
    table.add_column("bottleneck")
    for e in result.estimates:
        cells = [f"{e.part(p).time_s:.3f}" for p in PARTS]
        table.add_row(
            e.mechanism, *cells, f"{e.total_s:.2f}", f"{e.network_bytes_per_rank / 2**30:.1f}", str(e.buckets),
            e.bottleneck,
        )  # fmt: skip
    print_whole(console, table)
    console.print("times in seconds; GiB in/rank: what the busiest rollout rank receives over NVLink or NICs")
    if len(result.estimates) > 1:
        console.print(f"fastest: {result.fastest.mechanism} ({result.fastest.total_s:.2f} s)")


def print_rl_validation(report: RLReport, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="RL weight-sync validation (range rule)")
    for col in ("id", "model", "gpu", "mechanism", "measured s", "predicted s", "error %", "bottleneck"):
        table.add_column(col, justify="right" if col.endswith(("s", "%")) else "left")
    for r in report.rows:
        measured = f"{r.low_s:g}" if r.low_s == r.high_s else f"{r.low_s:g}-{r.high_s:g}"
        mech = r.mechanism + ("" if r.local_experts else " (full experts)")
        table.add_row(r.id, r.model, r.gpu, mech, measured, f"{r.predicted_s:.2f}", f"{r.error_pct:+.1f}", r.bottleneck)
    print_whole(console, table)
    console.print(f"MAPE {report.mape_pct:.1f}% over {len(report.rows)} rows; {len(report.skipped)} skipped")
    for s in report.skipped:
        console.print(f"  skipped {s['id']}: {s['reason']}")
