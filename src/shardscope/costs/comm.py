"""Collective costs over a two-level network (scale-up domain, scale-out fabric).

Latency-bandwidth (alpha-beta) model of NCCL's ring algorithms (Thakur et al. 2005; NCCL's
`busBw` convention, nccl-tests PERFORMANCE.md):
  all-gather / reduce-scatter: (n-1)/n · S / B   + steps · alpha
  all-reduce:                 2(n-1)/n · S / B   + 2 steps · alpha
  all-to-all:                 (n-1)/n · S / B    + alpha (n-1 concurrent messages)
  send/recv:                  S / B_link + alpha
S is the full buffer, B the bus bandwidth of the group. Inside one scale-up domain B is the NVLink
bandwidth per GPU; a group spanning domains with k members per domain drives k NICs in parallel
(NCCL runs one ring per channel, each crossing the fabric on a different rail), so
B = min(NVLink, k · NIC). Achieved fractions of link bandwidth: 0.80 on NVLink (nccl-tests all-reduce
busBw ≈ 360 of 450 GB/s on DGX H100) and 0.90 on InfiniBand (≈ 45 of 50 GB/s per 400 Gb/s NIC).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardscope.graph.ops import TokenFanout
from shardscope.graph.routing import bin_hit_probability
from shardscope.hardware.catalog import Cluster

SCALEUP_EFFICIENCY = 0.80
SCALEOUT_EFFICIENCY = 0.90
# All-to-all traffic over NVLink 5 gets less of the link than ring collectives do, from either dispatcher.
# NCCL's all-to-all (grouped point-to-point sends, a few channels per peer): Megatron-Core MoE report
# (arXiv 2603.07685, Table 7), the flat dispatch and combine of 4096 top-8 tokens of 7168 BF16 values take
# 735-930 us at EP 8-64 on GB200 NVL72, which our permute kernel plus all-to-all matches (within -14..+4%)
# at 72% of NVLink. HybridEP's copy kernels (a few dozen SMs): the same table's HybridEP rows on GB200 are
# then within -6..+11% (at 80%: -14..+1%), and HybridEP's own kernel-only benchmarks on B200 and GB200
# (DeepEP hybrid-ep docs/README_Hybrid-EP.md) within -18..+2% (at 80%: -26..-8%). On 8 H100s (NVLink 4)
# the ring figure already lands within 5% for the flat dispatcher and 14% for HybridEP.
A2A_SCALEUP_EFFICIENCY = {"blackwell": 0.72}
# DeepEP's NVLink kernels serve up to 8 peers (its NVL8 node); a larger NVLink domain (GB200 NVL72) runs
# through a community extension (DeepEP PR #218) that the Megatron-LM DeepSeek-V3 GB200 guide (section
# 2.2.1, read at Megatron-LM 1d9edcf8c7) measured at EP 32: about 400 GB/s dispatch and 190 GB/s combine
# of algorithm bandwidth with 24 SMs, against 900 GB/s of NVLink 5 per direction. The guide's Nsight view of
# a DeepSeek-V3 layer at EP 32 (images/image5.png) shows dispatch ~1.0 ms and combine ~2.1 ms; these give
# 1.03 and 2.08 ms. The guide's DeepEP-to-HybridEP A/B is the test (test_dispatcher_measured.py).
DEEPEP_NVL_PEERS = 8
DEEPEP_MNNVL_GBPS = {"dispatch": 400.0, "combine": 190.0}


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """Where the `size` members of one communication group sit: `per_domain` of them share a
    scale-up domain, over `domains` domains."""

    size: int
    per_domain: int

    @property
    def domains(self) -> int:
        return self.size // self.per_domain

    @property
    def intra(self) -> bool:
        return self.domains == 1


def place_group(cluster: Cluster, size: int, stride: int) -> GroupPlacement:
    """A group of `size` ranks whose members are `stride` ranks apart (Megatron rank order)."""
    if size <= 1:
        return GroupPlacement(1, 1)
    domain = cluster.scaleup_domain
    per_domain = 1 if stride >= domain else max(1, min(size, domain // stride))
    return GroupPlacement(size, per_domain)


def deepep_beyond_nvlink_peers(group: GroupPlacement) -> bool:
    """Whether an EP group puts more GPUs in one NVLink domain than DeepEP's NVLink kernels serve
    (`DEEPEP_NVL_PEERS`): its dispatch and combine then run at `DEEPEP_MNNVL_GBPS`."""
    return group.per_domain > DEEPEP_NVL_PEERS


def bus_bandwidth_gbps(cluster: Cluster, group: GroupPlacement) -> float:
    up = cluster.scaleup_gbps * SCALEUP_EFFICIENCY
    if group.intra:
        return up
    return min(up, group.per_domain * cluster.scaleout_gbps * SCALEOUT_EFFICIENCY)


def _ring_latency_s(cluster: Cluster, group: GroupPlacement) -> float:
    """Hops of one ring pass: (n - domains) NVLink hops and `domains` fabric hops (0 when intra)."""
    n, d = group.size, group.domains
    if d == 1:
        return (n - 1) * cluster.scaleup_latency_s
    return (n - d) * cluster.scaleup_latency_s + d * cluster.scaleout_latency_s


def dispatch_copies(fanout: TokenFanout, group: GroupPlacement) -> tuple[float, float]:
    """Copies of one token a DeepEP/HybridEP-style dispatcher sends (across the fabric, over NVLink):
    one per other node that holds any of its experts, fanned out on arrival to each GPU there that
    does, and one per other GPU of its own node that does. A flat all-to-all sends k copies instead."""
    n, per_domain, nodes = group.size, group.per_domain, group.domains
    gpus_hit = n * bin_hit_probability(fanout, n)
    if nodes == 1:
        return 0.0, gpus_hit * (n - 1) / n  # every GPU hit but the sender itself
    remote = (nodes - 1) * bin_hit_probability(fanout, nodes)
    return remote, gpus_hit * (per_domain - 1) / per_domain  # all but the arrival GPU get an NVLink copy


def collective_time_s(
    cluster: Cluster, kind: str, nbytes: float, group: GroupPlacement, fanout: TokenFanout | None = None
) -> float:
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = bus_bandwidth_gbps(cluster, group) * 1e9
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * nbytes / bw + _ring_latency_s(cluster, group)
    if kind == "all_reduce":
        ring = 2 * (n - 1) / n * nbytes / bw + 2 * _ring_latency_s(cluster, group)
        # NCCL switches to (double binary) trees at scale: log-depth latency, same bandwidth term.
        alpha = cluster.scaleout_latency_s if not group.intra else cluster.scaleup_latency_s
        tree = 2 * (n - 1) / n * nbytes / bw + 2 * math.ceil(math.log2(n)) * alpha
        return min(ring, tree)
    if kind == "all_to_all":
        alpha = cluster.scaleup_latency_s if group.intra else cluster.scaleout_latency_s
        nvlink = cluster.scaleup_gbps * 1e9 * A2A_SCALEUP_EFFICIENCY.get(cluster.gpu.arch, SCALEUP_EFFICIENCY)
        out = cluster.scaleout_gbps * 1e9 * SCALEOUT_EFFICIENCY
        if fanout is not None:  # `nbytes` holds k copies of each token
            remote, local = dispatch_copies(fanout, group)
            token_bytes = nbytes / fanout.top_k
            if fanout.backend == "deepep" and deepep_beyond_nvlink_peers(group):
                nvlink = DEEPEP_MNNVL_GBPS["combine" if fanout.combine else "dispatch"] * 1e9
            return max(remote * token_bytes / out, local * token_bytes / nvlink) + alpha
        if not group.intra:  # only the off-domain share crosses the fabric, one NIC per GPU
            remote = (n - group.per_domain) / n * nbytes
            local = (group.per_domain - 1) / n * nbytes
            return max(remote / out, local / nvlink) + alpha
        return (n - 1) / n * nbytes / nvlink + alpha
    if kind == "send_recv":
        if group.intra:
            return nbytes / (cluster.scaleup_gbps * 1e9 * SCALEUP_EFFICIENCY) + cluster.scaleup_latency_s
        return nbytes / (cluster.scaleout_gbps * 1e9 * SCALEOUT_EFFICIENCY) + cluster.scaleout_latency_s
    raise ValueError(f"unknown collective {kind}")
