"""Link bandwidths a weight update runs over, from the cluster and the collective model (`costs.comm`):
NVLink inside a scale-up domain, one NIC per GPU across domains, PCIe to host memory."""

from __future__ import annotations

import math

from shardscope.costs.comm import SCALEOUT_EFFICIENCY, GroupPlacement, bus_bandwidth_gbps, collective_time_s
from shardscope.hardware.catalog import Cluster


def spread(cluster: Cluster, size: int, offset: int = 0) -> GroupPlacement:
    """`size` consecutive ranks starting at rank `offset`: how many share a scale-up domain."""
    if size <= 1:
        return GroupPlacement(1, 1)
    domain = cluster.scaleup_domain
    first, last = offset // domain, (offset + size - 1) // domain
    domains = last - first + 1
    if domains == 1:
        return GroupPlacement(size=size, per_domain=size)
    # Members per domain, evened out over the domains touched: the NICs a ring drives in parallel.
    return GroupPlacement(size=size, per_domain=max(1, math.ceil(size / domains)))


def link_name(group: GroupPlacement) -> str:
    return "NVLink" if group.intra else f"NIC x{group.per_domain} rails"


def ring_gbps(cluster: Cluster, group: GroupPlacement) -> float:
    """Achieved bandwidth of a pipelined ring (broadcast, all-gather) over `group`: NVLink inside a
    domain, `per_domain` NICs in parallel across domains (`costs.comm.bus_bandwidth_gbps`)."""
    return bus_bandwidth_gbps(cluster, group)


def nic_gbps(cluster: Cluster) -> float:
    """One GPU's NIC, achieved (`costs.comm.SCALEOUT_EFFICIENCY`)."""
    return cluster.scaleout_gbps * SCALEOUT_EFFICIENCY


def broadcast_time_s(cluster: Cluster, nbytes: float, group: GroupPlacement) -> float:
    """NCCL's pipelined ring broadcast: every member receives `nbytes` once, at the ring's bandwidth,
    plus one pass of hop latencies."""
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    return nbytes / (ring_gbps(cluster, group) * 1e9) + latency_s(cluster, group)


def latency_s(cluster: Cluster, group: GroupPlacement) -> float:
    """One small collective (a barrier, a bucket's launch) over `group`: its hop latencies."""
    return collective_time_s(cluster, "all_gather", 1.0, group)
