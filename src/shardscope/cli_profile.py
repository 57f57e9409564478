"""`shardscope profile show|diff` and `shardscope calibrate`: measured profiles on the command line.

Kept apart from `cli` so that the command's start-up loads none of it but Typer: the profile code loads
inside each command, and torch only inside `calibrate`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from shardscope.errors import ShardscopeError

profile_app = typer.Typer(
    no_args_is_help=True,
    help="Measured profiles: the shipped ones (by GPU name) and files written by `shardscope calibrate`.",
)

ProfileRef = Annotated[str, typer.Argument(help="a shipped profile's name (e.g. H100) or a profile file")]


def _fail(msg: str) -> None:
    sys.stderr.write(f"error: {msg}\n")
    raise typer.Exit(2)


@profile_app.command("show")
def show(profile: ProfileRef) -> None:
    """Print what a profile measured: its conditions and, per kind of op, the points and their rates."""
    from shardscope.hardware.profile import load_profile
    from shardscope.report.profile import print_profile

    try:
        prof = load_profile(profile)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    print_profile(prof)


@profile_app.command("diff")
def diff(a: ProfileRef, b: ProfileRef) -> None:
    """How two profiles differ: B's time over A's at the shapes both cover, per kind of op, and conditions."""
    from shardscope.hardware.profile import load_profile
    from shardscope.hardware.profile.compare import diff as profile_diff
    from shardscope.report.profile import print_diff

    try:
        pa, pb = load_profile(a), load_profile(b)
    except ShardscopeError as exc:
        _fail(str(exc))
        return
    print_diff(profile_diff(pa, pb))


def calibrate(
    out: Annotated[Path, typer.Option(help="profile file to write (SQLite)")],
    budget_min: Annotated[float, typer.Option(help="time budget in minutes (measuring stops when it is spent)")] = 15.0,
    name: Annotated[str | None, typer.Option(help="the profile's name (default: the GPU's catalog name)")] = None,
) -> None:
    """Measure this machine's GPU (GEMMs, attention, bandwidth, launch cost; NCCL collectives under torchrun
    with 2+ GPUs) and write a profile for `estimate --profile FILE`."""
    from shardscope.hardware.profile.calibrate import no_gpu_reason, run_calibration

    reason = no_gpu_reason()
    if reason is not None:
        _fail(reason)
        return
    if budget_min <= 0:
        _fail("--budget-min must be positive")
        return
    try:
        run_calibration(out, budget_s=budget_min * 60, name=name)
    except ShardscopeError as exc:
        _fail(str(exc))
