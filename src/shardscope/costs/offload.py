"""CPU offload: optimizer states to host memory (ZeRO-Offload, Ren et al. 2021) and saved activations
to host memory (activation offloading), with the PCIe / C2C link and host memory modelled.

Optimizer offload keeps the fp32 master weights, fp32 gradients and Adam moments on the host (16 B per
parameter of the GPU's shard); the GPU keeps bf16 weights and a bf16 gradient buffer. Each step the
gradients go down (2 B/param), the CPU runs Adam streaming 28 B/param through host memory at
`HOST_STREAM_FRACTION` of its bandwidth (shared by the node's GPUs), and the updated bf16 weights come
back (2 B/param). Activation offload moves a fraction of each micro-batch's saved activations to the
host during forward and back during backward, overlapped with compute.
"""

from __future__ import annotations

from shardscope.hardware.catalog import Cluster

HOST_STREAM_FRACTION = 0.6  # achieved / peak DDR bandwidth for a streaming optimizer (STREAM-like)
CPU_ADAM_BYTES_PER_PARAM = 28  # read fp32 param, grad, m, v; write param, m, v
HOST_BYTES_PER_PARAM = 16  # fp32 master + grad + m + v


def link_time_s(cluster: Cluster, nbytes: float) -> float:
    return nbytes / (cluster.gpu.pcie_gbps * 1e9)


def cpu_optimizer_time_s(cluster: Cluster, params_local: float) -> float:
    per_gpu_bw = cluster.gpu.host_memory_gbps * 1e9 * HOST_STREAM_FRACTION / cluster.gpus_per_node
    return CPU_ADAM_BYTES_PER_PARAM * params_local / per_gpu_bw


def host_bytes_per_gpu(params_local: float) -> float:
    return HOST_BYTES_PER_PARAM * params_local
