"""Closed-form step model: sums over the op graph (fast path for estimates and the planner)."""

from shardscope.analytic.step import estimate_step

__all__ = ["estimate_step"]
