"""The search space: every plan that could run a model on a cluster, as plan keyword sets.

Axes: tp (divisors of the heads, within the scale-up domain), cp (sequence splits leaving at least
1,024 tokens per rank), pp (powers of two up to the layer count), vpp (interleaving when pp > 1),
dp (derived), ep (MoE: divisors of the experts carved out of dp·cp·tp), sharding (DDP, distributed
optimizer, ZeRO-3, FSDP, FSDP without reshard, HSDP within a node) and micro-batch. Resolved per
structure by the search: recompute (none, selective, Megatron module sets, full with 1/4..all layers),
optimizer offload and, with expert parallelism, the token dispatcher and the EP all-to-all overlap
(`ep_dispatches`, `ep_overlaps`): they change time, not memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import Cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import EP_DISPATCHERS, cuda_graph_scopes

SHARDINGS: dict[str, dict] = {
    "ddp": {"zero": 0},
    "zero1": {"zero": 1},
    "zero3": {"zero": 3},
    "fsdp": {"fsdp": True},
    "fsdp-noreshard": {"fsdp": True, "reshard_after_forward": False},
    "hsdp": {"fsdp": True},  # shard_group set per plan: one node's data-parallel ranks
}
# Token dispatchers a MoE plan tries unless one is asked for (`SearchSpace.ep_dispatches`)
AUTO_EP_DISPATCHES = ("flat", "deepep")
# Recompute levels tried from cheapest to most memory-saving; the search keeps the first that fits.
RECOMPUTE_LEVELS: tuple[tuple[str, float], ...] = (
    ("none", 0.0),
    ("selective", 0.0),
    ("full", 0.25),
    ("full", 0.5),
    ("full", 0.75),
    ("full", 1.0),
)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    vpps: tuple[int, ...] = (1, 2, 4, 8)
    shardings: tuple[str, ...] = tuple(SHARDINGS)
    offload: bool = True  # also try optimizer offload at each recompute level
    max_tp: int = 8
    max_cp: int = 32
    min_tokens_per_cp_rank: int = 1024
    cuda_graphs: tuple[str, ...] | str = ()  # CUDA-graphed scopes of every plan (() = eager), "attn,moe" or a tuple
    fused_activation: bool = False  # every plan runs Megatron-Core's fused SwiGLU
    fused_cross_entropy: bool = False  # every plan runs a fused cross-entropy kernel
    precision: str = "bf16"  # every plan's GEMM precision: recompute, fit and dispatcher are chosen under it
    fp8_recipe: str = "tensorwise"
    # the stack's kernel settings every plan runs with (Plan fields: attention kernel, eager chains, ...)
    kernels: tuple[tuple[str, object], ...] = ()
    # MoE plans with EP > 1 try each dispatcher and overlap setting and keep the fastest. HybridEP is
    # priced as DeepEP plus its routing-map all-gather, so it is searched only when asked for, or where
    # DeepEP runs past its NVLink peers (an NVL72 domain: `search.moe_variants` puts it in DeepEP's place).
    ep_dispatches: tuple[str, ...] = AUTO_EP_DISPATCHES
    ep_overlaps: tuple[bool, ...] = (False, True)
    # Megatron-Core's selective recompute by module (`planner.modules`) between op-level selective and
    # full recompute
    recompute_modules: bool = True
    # `--export X@RELEASE`: the framework release that will run the plan; plans it cannot run (the exporter's
    # constraints, `planner.export.runnable_problems`) are left out of the search ("" = every plan)
    runnable_by: str = ""

    def __post_init__(self) -> None:
        # "attn,moe_router" as `--cuda-graphs` gives it, or a tuple: checked here, so that a bad scope is
        # an error before the search rather than a search with no plan (as `Plan` does)
        object.__setattr__(self, "cuda_graphs", cuda_graph_scopes(self.cuda_graphs))
        bad = [d for d in self.ep_dispatches if d not in EP_DISPATCHERS]
        if bad or not self.ep_dispatches or not self.ep_overlaps:
            raise ShardscopeError(
                f"--ep-dispatch must be one of {', '.join(EP_DISPATCHERS)} or auto, got {', '.join(bad)!r}"
            )


def moe_choices(ep_dispatch: str = "auto", ep_comm_overlap: bool | None = None) -> dict:
    """`SearchSpace` fields from the CLI's MoE options: "auto" / None search the choices, a value fixes it."""
    return {
        "ep_dispatches": AUTO_EP_DISPATCHES if ep_dispatch == "auto" else (ep_dispatch,),
        "ep_overlaps": (False, True) if ep_comm_overlap is None else (ep_comm_overlap,),
    }


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def structures(
    model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, space: SearchSpace | None = None
) -> Iterator[dict]:
    """Plan keyword sets without recompute (the search picks it)."""
    space = space or SearchSpace()
    gpus = cluster.gpus
    tps = [
        t
        for t in _pow2_upto(min(space.max_tp, cluster.scaleup_domain))
        if model.heads % t == 0 and model.kv_heads % t == 0 and model.ffn_hidden % t == 0
    ]
    cps = [c for c in _pow2_upto(space.max_cp) if seq_len % c == 0 and seq_len // c >= space.min_tokens_per_cp_rank]
    pps = [p for p in _pow2_upto(model.layers) if p <= model.layers]
    for tp in tps:
        for cp in cps:
            for pp in pps:
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                eps = [1]
                if model.moe:
                    eps = [
                        e
                        for e in _pow2_upto(model.moe.experts)
                        if model.moe.experts % e == 0 and (tp * cp * dp) % e == 0
                    ]
                for mb in space.micro_batches:
                    if global_batch % (mb * dp):
                        continue
                    accum = global_batch // (mb * dp)
                    for vpp in space.vpps:
                        if vpp > 1 and (pp == 1 or model.layers < pp * vpp or accum % pp):
                            continue
                        for ep in eps:
                            for sharding in space.shardings:
                                kw = dict(SHARDINGS[sharding])
                                if sharding == "hsdp":
                                    group = max(cluster.gpus_per_node // (tp * cp), 1)
                                    if group >= dp * cp or (dp * cp) % group:
                                        continue
                                    kw["shard_group"] = group
                                if sharding != "ddp" and dp * cp == 1:
                                    continue
                                yield dict(
                                    space.kernels,
                                    tp=tp,
                                    cp=cp,
                                    pp=pp,
                                    vpp=vpp,
                                    dp=dp,
                                    ep=ep,
                                    micro_batch=mb,
                                    global_batch=global_batch,
                                    seq_len=seq_len,
                                    cuda_graphs=space.cuda_graphs,
                                    fused_activation=space.fused_activation,
                                    fused_cross_entropy=space.fused_cross_entropy,
                                    precision=space.precision,
                                    fp8_recipe=space.fp8_recipe,
                                    ep_dispatch=space.ep_dispatches[0],
                                    ep_comm_overlap=False,  # the search tries the overlap per plan
                                    **kw,
                                )
