"""Typed nodes of the op graph: compute ops, saved activations, and the collectives a plan inserts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OpKind = Literal["gemm", "attention", "memory"]
CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
Group = Literal["tp", "cp", "dp", "pp", "ep", "etp"]
Phase = Literal["fwd", "bwd"]
# What a collective hides under: nothing (""), this phase's attention / GEMMs / any compute, or one block
# (attention or MLP half of the layer) of another micro-batch's forward or backward — Megatron-Core's
# combined-1F1B EP overlap pairs each all-to-all with one such block (DeepSeek-V3 report §3.2.1, Fig. 4).
HiddenBy = Literal["", "attention", "gemm", "compute", "fwd_attn", "fwd_mlp", "bwd_attn", "bwd_mlp"]


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel of the forward pass on one GPU for one micro-batch, and what its backward costs.

    `gemm`: `mnk` is the forward (M, N, K); backward is two GEMMs of the same FLOPs (dgrad, wgrad).
    `attention`: flash attention; backward FLOPs are 2.5x forward (5 matmuls vs 2, Dao 2023).
    `memory`: bandwidth-bound (norms, activations, rope, residual adds, casts, loss); `aten` marks a chain
    of eager PyTorch (ATen) kernels over strided, broadcast or mixed-precision operands, which stream slower
    than fused or contiguous kernels (`costs.efficiency.ATEN_HBM_FRACTION`).
    `cheap` ops are the ones the "selective" recompute policy recomputes instead of saving.
    `scope` is the Megatron-Core CUDA-graph module that captures the op (`--cuda-graph-modules`: attn,
    mlp, moe_router, moe_preprocess, moe); `host_sync` marks an op the host issues only after waiting for
    the GPU (a dropless MoE dispatcher copies the per-expert token counts to the host first). Such a wait
    is for one event unless `stream_sync`: a synchronisation of the whole compute stream (a copy from
    pageable host memory, `.item()`, `nonzero`, PyTorch's `memcpy_and_sync`), which empties the queue even
    where another micro-batch's work was queued behind the event. `bwd_stream_sync`: its backward waits so.
    """

    name: str
    kind: OpKind
    flops: float = 0.0
    bytes: float = 0.0
    bwd_flops: float = 0.0
    bwd_bytes: float = 0.0
    mnk: tuple[int, int, int] = (0, 0, 0)
    cheap: bool = False
    fp8: bool = False  # a GEMM that an FP8 recipe runs in FP8 (fwd, dgrad and wgrad)
    groups: int = 1  # grouped GEMM: `groups` problems of M/groups rows each (MoE experts)
    # gemm: the N widths of the separate linears this op stands for (model code with one nn.Linear per
    # projection on a shared input: q, k, v or gate, up), each its own GEMM; () = one GEMM of N
    splits: tuple[int, ...] = ()
    modules: frozenset[str] = frozenset()  # Megatron recompute modules that re-run it (see MEGATRON_MODULES)
    scope: str = ""
    host_sync: bool = False
    stream_sync: bool = False
    bwd_stream_sync: bool = False
    launches: int = 1  # kernels it runs per phase, each launched by the host (GEMMs: costs.compute.serial_kernels)
    bwd_launches: int | None = None  # backward's kernels where they differ from forward's
    te_module: bool = True  # a GEMM issued through a Transformer Engine module, not plain PyTorch
    head_dim: float = 128  # attention: the mean of the query-key and value head dimensions
    kv_span: int = 0  # attention: keys a query's kernel loop covers when a window or chunk bounds it (0: all)
    query_rows: int = 0  # attention: (sequence, head, query) rows this GPU's kernel runs (0: not stated)
    sinks: bool = False  # attention: a learned sink logit per head (its gradient costs the backward a pass)
    aten: bool = False  # memory: eager PyTorch kernels over strided, broadcast or mixed-precision operands
    scatter: bool = False  # memory: index scatters (`costs.efficiency.SCATTER_HBM_FRACTION`)
    call: str = ""  # a framework call whose measured host time replaces its launches' (costs.host.CALLS)
    role: str = ""  # "norm" / "rope": an elementwise region a stack may run fused or as eager ATen ops


@dataclass(frozen=True, slots=True)
class Saved:
    """An activation tensor kept from forward to backward, and the recompute policies that keep it."""

    name: str
    bytes: float
    policies: frozenset[str]
    modules: frozenset[str] = frozenset()  # Megatron recompute modules that drop it (see MEGATRON_MODULES)
    # the GEMM whose output it is, or whose output it is rebuilt from by ops op-level selective checkpointing
    # re-runs (the residual sum after the out projection): dropped where that GEMM is recomputed too
    gemm: str = ""


@dataclass(frozen=True, slots=True)
class TokenFanout:
    """How a token's top-k experts are drawn, for a dispatcher that sends one copy per destination GPU
    and node rather than per expert (DeepEP / HybridEP): `top_k` of `experts`, limited to
    `groups_per_token` of `groups` contiguous expert groups (DeepSeek-V3 group-limited routing).
    `backend` names the dispatcher's kernels; `combine` is true for the combine kernel (the forward
    combine and the dispatch's backward), false for the dispatch kernel."""

    experts: int
    top_k: int
    groups: int = 1
    groups_per_token: int = 1
    backend: str = "hybridep"
    combine: bool = False


@dataclass(frozen=True, slots=True)
class Collective:
    """A communication op on one GPU for one micro-batch.

    `bytes` is the full buffer: the output of an all-gather, the input of a reduce-scatter, the buffer
    of an all-reduce, the per-rank send of an all-to-all or send/recv. `hidden_by` names the compute
    that can overlap it (see `HiddenBy`; "" = exposed on the critical path). A forward collective names
    the op it is issued `after` ("" = before the unit's first op), and `host_sync` marks one the host
    issues only after waiting for the GPU (as `Op.host_sync`): where its exposed time runs while the host
    issues the ops that follow (`costs.host.host_stall_s`). `call` names the framework call that issues it
    where that call's host time is measured (`costs.host.collective_call_s`).
    """

    name: str
    kind: CollectiveKind
    group: Group
    bytes: float
    phase: Phase
    hidden_by: HiddenBy = ""
    fanout: TokenFanout | None = None  # MoE dispatch sent once per destination GPU / node; None = per expert
    after: str = ""
    host_sync: bool = False
    call: str = ""  # the framework call that issues it, where its host time is measured (costs.host.CALLS)
    # a TP collective overlapped by splitting one GEMM (Transformer Engine's userbuffer overlap, PyTorch's
    # micro-pipelined async TP) hides under that GEMM alone: its op name ("" = under the unit's GEMMs)
    gemm_op: str = ""
