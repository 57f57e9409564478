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

from shardscope.hardware.catalog import Cluster

SCALEUP_EFFICIENCY = 0.80
SCALEOUT_EFFICIENCY = 0.90


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


def hierarchical_remote_copies(top_k: int, nodes: int) -> float:
    """Copies of a token that cross the fabric when an MoE dispatcher sends one copy per destination
    node and fans out over NVLink there (DeepEP / HybridEP): with top-k experts spread uniformly over
    N nodes, the expected number of other nodes hit is (N-1)·(1 - (1 - 1/N)^k), against k·(N-1)/N
    copies for a flat all-to-all."""
    return (nodes - 1) * (1 - (1 - 1 / nodes) ** top_k)


def collective_time_s(cluster: Cluster, kind: str, nbytes: float, group: GroupPlacement, fanout: int = 0) -> float:
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
        if not group.intra:  # only the off-domain share crosses the fabric, one NIC per GPU
            remote = (n - group.per_domain) / n * nbytes
            local = (group.per_domain - 1) / n * nbytes
            if fanout:  # one copy per remote node, fanned out over NVLink on arrival
                remote = nbytes / fanout * hierarchical_remote_copies(fanout, group.domains)
                local = nbytes * (group.per_domain - 1) / group.per_domain
            return (
                max(
                    remote / (cluster.scaleout_gbps * 1e9 * SCALEOUT_EFFICIENCY),
                    local / (cluster.scaleup_gbps * 1e9 * SCALEUP_EFFICIENCY),
                )
                + alpha
            )
        return (n - 1) / n * nbytes / bw + alpha
    if kind == "send_recv":
        if group.intra:
            return nbytes / (cluster.scaleup_gbps * 1e9 * SCALEUP_EFFICIENCY) + cluster.scaleup_latency_s
        return nbytes / (cluster.scaleout_gbps * 1e9 * SCALEOUT_EFFICIENCY) + cluster.scaleout_latency_s
    raise ValueError(f"unknown collective {kind}")
