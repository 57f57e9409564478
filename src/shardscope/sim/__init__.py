"""Discrete-event simulation of one optimizer step over per-rank streams, with pluggable pipeline
schedules; its timeline exports to Chrome-trace JSON (Perfetto)."""

from shardscope.sim.schedules import SCHEDULES, Action, build_schedule
from shardscope.sim.step import SimResult, simulate_step

__all__ = ["SCHEDULES", "Action", "SimResult", "build_schedule", "simulate_step"]
