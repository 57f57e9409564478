"""The ops of one layer / stage / micro-batch after sharding by the plan: the single source of truth."""

from shardscope.graph.build import StageGraph, build_stage_graph
from shardscope.graph.ops import Collective, Op, Saved

__all__ = ["Collective", "Op", "Saved", "StageGraph", "build_stage_graph"]
