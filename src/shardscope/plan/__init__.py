"""Training plans: parallel degrees, sharding, recompute, batch, precision — validated here."""

from shardscope.plan.plan import Plan, make_plan

__all__ = ["Plan", "make_plan"]
