"""What the model is known to leave out or get wrong, for an estimate's warnings to say.

Each error figure is `shardscope validate ../shared/validation/training_public.csv` over one group of rows
(`tests/test_validate.py` recomputes them, so a change to the model that moves them must update them).
Error is (predicted - measured) / measured of each row's throughput metric: positive means the model is
optimistic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True, slots=True)
class MeasuredError:
    """Error of the model over one group of validation rows, and the range of measured / predicted
    throughput over them (lowest, median, highest)."""

    rows: int
    mape_pct: float
    bias_pct: float
    ratio: tuple[float, float, float]

    def describe(self) -> str:
        low, median, high = self.ratio
        return f"{low:.2f}-{high:.2f}x the predicted (median {median:.2f}x, MAPE {self.mape_pct:.0f}%)"


# MoE runs whose experts ran eagerly (no CUDA graph of the whole MoE layer), by dispatcher: Megatron's
# all-to-all one (`flat`) or its flex one (DeepEP / HybridEP); and the runs graphed whole.
EAGER_FLAT_MOE = MeasuredError(rows=28, mape_pct=26.0, bias_pct=22.8, ratio=(0.43, 0.89, 1.23))
EAGER_FLEX_MOE = MeasuredError(rows=18, mape_pct=11.7, bias_pct=6.8, ratio=(0.70, 0.99, 1.16))
GRAPHED_MOE = MeasuredError(rows=8, mape_pct=8.6, bias_pct=-8.6, ratio=(1.00, 1.11, 1.18))


# What the memory model leaves out of a graphed plan (Megatron-Bridge skills/nemo-mbridge-perf-cuda-graphs,
# "Memory overhead", at 067f987df).
GRAPH_MEMORY_WARNING = (
    "the memory CUDA graphs pin is not counted (Megatron-Bridge: a few GB for Transformer Engine's scoped "
    "graphs, up to 1.5-2x the peak for the full iteration)"
)


@cache
def eager_moe_warning(dispatcher: str) -> str:
    """The caveat of an estimate whose MoE layers run eagerly under `dispatcher` (the plan's
    `ep_dispatch`): the host and GPU time of eager MoE layers (the dispatcher's preprocessing, Python
    between modules, the per-expert calls) is only partly modelled, the more so with the all-to-all
    dispatcher."""
    flat = dispatcher == "flat"
    eager = EAGER_FLAT_MOE if flat else EAGER_FLEX_MOE
    kind = "the all-to-all (flat)" if flat else "a DeepEP/HybridEP"
    return (
        f"MoE layers run eagerly (no `moe` or `full_iteration` CUDA graph): over the {eager.rows} published "
        f"eager MoE runs with {kind} dispatcher in the README's validation the measured throughput was "
        f"{eager.describe()}, over the {GRAPHED_MOE.rows} graphed ones {GRAPHED_MOE.describe()}: read this "
        "estimate as optimistic"
    )
