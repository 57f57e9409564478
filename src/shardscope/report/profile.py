"""Rich tables of a measured profile (`shardscope profile show`) and of two profiles' differences (`diff`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from shardscope.hardware.profile import Profile
from shardscope.hardware.profile.compare import ProfileDiff, summary
from shardscope.hardware.profile.db import conditions_dict
from shardscope.report.console import print_whole


def print_profile(profile: Profile, console: Console | None = None) -> None:
    """The profile's conditions (one row per measuring session) and what it measured, per family."""
    console = console or Console()
    gpu = profile.gpu or "GPU not named"
    console.print(f"[bold]profile {profile.name}[/bold]: {gpu}, {len(profile.points)} points ({profile.source})")
    cond = Table(title="conditions")
    fields = list(dict.fromkeys(k for c in profile.conditions.values() for k in conditions_dict(c)))
    for f in fields:
        cond.add_column(f)
    for c in profile.conditions.values():
        d = conditions_dict(c)
        cond.add_row(*(str(d.get(f, "")) for f in fields))
    console.print(cond)
    table = Table(title="measured")
    for col, justify in (("op", "left"), ("points", "right"), ("unit", "left"), ("low", "right"),
                         ("median", "right"), ("high", "right"), ("times", "right")):  # fmt: skip
        table.add_column(col, justify=justify)
    for s in summary(profile):
        table.add_row(
            s.family, str(s.points), s.unit, f"{s.low:,.1f}", f"{s.median:,.1f}", f"{s.high:,.1f}",
            f"{_time(s.smallest_s)} - {_time(s.largest_s)}",
        )  # fmt: skip
    print_whole(console, table)


def print_diff(d: ProfileDiff, console: Console | None = None) -> None:
    """Time ratios B / A per family at shapes both cover, and differing conditions."""
    console = console or Console()
    if d.conditions:
        cond = Table(title="conditions that differ")
        for col in ("", d.a, d.b):
            cond.add_column(col)
        for row in d.conditions:
            cond.add_row(*row)
        console.print(cond)
    table = Table(title=f"time of {d.b} / time of {d.a} at the same shapes")
    for col in ("op", "compared", "median", "low", "high"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for f in d.families:
        table.add_row(f.family, str(f.compared), f"{f.median_ratio:.3f}", f"{f.low_ratio:.3f}", f"{f.high_ratio:.3f}")
    print_whole(console, table)
    if d.only_a:
        console.print(f"only in {d.a}: {', '.join(d.only_a)}")
    if d.only_b:
        console.print(f"only in {d.b}: {', '.join(d.only_b)}")


def _time(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"
