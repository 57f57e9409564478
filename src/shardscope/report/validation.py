"""Tables of a validation report: per row, and per metric / source / GPU / architecture."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from shardscope.validate.runner import Stats, ValidationReport


def _rho(s: Stats) -> str:
    return f"{s.spearman:.2f}" if s.spearman is not None else "-"


def print_report(report: ValidationReport, show_rows: bool = True, console: Console | None = None) -> None:
    console = console or Console()
    if show_rows:
        t = Table(title="Predicted vs measured")
        for col in ("id", "model", "gpu", "GPUs", "metric", "measured", "predicted", "error"):
            t.add_column(col, justify="right" if col in ("GPUs", "measured", "predicted", "error") else "left")
        for r in report.rows:
            color = "green" if abs(r.error_pct) <= 10 else ("yellow" if abs(r.error_pct) <= 20 else "red")
            t.add_row(
                r.id,
                r.model,
                r.gpu,
                str(r.num_gpus),
                r.metric,
                f"{r.measured:,.4g}",
                f"{r.predicted:,.4g}",
                f"[{color}]{r.error_pct:+.1f}%[/]",
            )
        console.print(t)
    for key, groups in report.summary.items():
        t = Table(title=f"By {key}", title_justify="left")
        for col in (key, "rows", "MAPE", "bias", "Spearman"):
            t.add_column(col, justify="left" if col == key else "right")
        for name, s in groups.items():
            t.add_row(name or "-", str(s.n), f"{s.mape_pct:.1f}%", f"{s.bias_pct:+.1f}%", _rho(s))
        console.print(t)
    if report.overall:
        o = report.overall
        console.print(
            f"[bold]All predicted rows[/]: {o.n} rows, MAPE {o.mape_pct:.1f}%, bias {o.bias_pct:+.1f}%, "
            f"Spearman {_rho(o)}"
        )
    if report.rows:
        console.print(f"[bold]Memory[/]: {_fit_line(report)}")
    if report.skipped:
        reasons = Counter(s["reason"] for s in report.skipped)
        console.print(f"[bold]Skipped[/] {len(report.skipped)} rows:")
        for reason, n in reasons.most_common():
            ids = [s["id"] for s in report.skipped if s["reason"] == reason]
            console.print(f"  {n:3d} × {reason} ({', '.join(ids[:6])}{', …' if len(ids) > 6 else ''})")


def _fit_line(report: ValidationReport) -> str:
    """Every measured run fit on its GPUs: the rows the memory model puts over capacity."""
    over = report.not_fitting()
    if not over:
        return f"all {len(report.rows)} rows are predicted to fit, as the measured runs did."
    listed = ", ".join(f"{r.id} ({r.required_gib:.0f}/{r.capacity_gib:.0f} GiB)" for r in over)
    return f"{len(over)} of {len(report.rows)} rows of measured runs are predicted not to fit: {listed}."


def print_markdown(report: ValidationReport) -> None:
    """The summary as Markdown tables (for the README)."""
    lines = []
    for key, groups in report.summary.items():
        lines += [f"| {key} | rows | MAPE | bias | Spearman |", "|---|---:|---:|---:|---:|"]
        for name, s in groups.items():
            lines.append(f"| {name or '-'} | {s.n} | {s.mape_pct:.1f}% | {s.bias_pct:+.1f}% | {_rho(s)} |")
        lines.append("")
    if report.overall:
        o = report.overall
        lines.append(f"All predicted rows: {o.n}, MAPE {o.mape_pct:.1f}%, bias {o.bias_pct:+.1f}%, Spearman {_rho(o)}.")
        lines += ["", f"Memory: {_fit_line(report)}"]
    reasons = Counter(s["reason"] for s in report.skipped)
    if reasons:
        lines.append("")
        listed = "; ".join(f"{n} × {r}" for r, n in reasons.most_common())
        lines.append(f"Skipped {len(report.skipped)} rows: {listed}.")
    print("\n".join(lines))
