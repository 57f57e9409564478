"""FSDP's local copies around its collectives: HBM traffic that runs whatever the network does.

PyTorch's FSDP2 (`torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`, torch 2.4-2.11):
  * all-gather copy-in (`foreach_all_gather`): each local shard cast from the fp32 master into the
    all-gather buffer in the gather dtype (fp32 read, gather-dtype write per local parameter);
  * all-gather copy-out (`foreach_all_gather_copy_out`, `split_with_sizes_copy` on the compute stream):
    the gathered buffer copied into the unsharded parameters (a read and a write per gathered value);
  * reduce-scatter copy-in (`foreach_reduce_scatter_copy_in`, `torch._chunk_cat`): the bf16 unsharded
    gradients concatenated into the fp32 (`reduce_dtype`) reduce-scatter buffer;
  * over a shard group of one GPU the reduce-scatter is a local copy of that buffer into the sharded
    gradient, and the gradient divide one more pass over it (read and write each).
FSDP1's flat parameter (`FlatParameter`) is gathered in place and reduced from the flat gradient: its
copy-in cast and its gradient cast to the reduce dtype are FSDP2's, with no copy-out.

Measured on one H100 (validation/torchtitan_{llama,qwen3_moe}_step_h100.json, kernel tables by input
shape and traces): the casts, copy-outs and `chunk_cat` run on the compute stream at 1.9-3.1 TB/s; the
one-GPU reduce copy and divide run on the reduce-scatter stream beside other memory-bound kernels, which
they take bandwidth from. All of it is priced as serial streaming traffic.
"""

from __future__ import annotations

from shardscope.costs.compute import memory_time_s
from shardscope.graph.build import BF16, FP32
from shardscope.hardware.catalog import GPU
from shardscope.plan.plan import Plan


def gather_copy_bytes(plan: Plan, unsharded: float, shard: float, gather_bytes: float) -> float:
    """HBM bytes of one all-gather's local copies: the shard's cast in, FSDP2's copy out of the buffer."""
    return (FP32 + gather_bytes) * shard + (2 * gather_bytes * unsharded if plan.fsdp2 else 0.0)


def reduce_copy_bytes(plan: Plan, unsharded: float, alone: float) -> float:
    """HBM bytes of one gradient reduce-scatter's local copies: the bf16 gradients into the fp32 buffer;
    for the `alone` parameters (sharded over one GPU) FSDP2's copy into the sharded gradient and the divide."""
    return (BF16 + FP32) * unsharded + (4 * FP32 * alone if plan.fsdp2 else 0.0)


def fsdp_copy_times_s(gpu: GPU, plan: Plan, dense: float, expert: float, gather_bytes: float) -> tuple[float, float]:
    """(one all-gather's, one reduce-scatter's) local copies of `dense` parameters (sharded over the
    data-parallel shard group) and `expert` ones (over the expert data-parallel group), in seconds; (0, 0)
    unless the plan shards with PyTorch FSDP."""
    if not plan.fsdp or dense + expert <= 0:
        return 0.0, 0.0
    shard = dense / plan.shard_size + expert / plan.expert_shard_size
    alone = (dense if plan.shard_size == 1 else 0.0) + (expert if plan.expert_shard_size == 1 else 0.0)
    unsharded = dense + expert
    gather = memory_time_s(gpu, gather_copy_bytes(plan, unsharded, shard, gather_bytes))
    return gather, memory_time_s(gpu, reduce_copy_bytes(plan, unsharded, alone))
