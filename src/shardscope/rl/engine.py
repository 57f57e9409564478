"""Loading received weights into an inference engine: a per-tensor host cost plus a memory-bound copy.

vLLM (and SGLang, whose model files follow vLLM's) load an update through the model's `load_weights`: for
every checkpoint tensor, Python maps the name and calls the parameter's `weight_loader`, which narrows the
tensor to this rank's shard and `copy_`s it into the (fused) parameter. MoE models add, for every expert
tensor, a linear scan of `expert_params_mapping` (3 x experts entries; the scan stops at the match, half of
it on average) before the loader is called (vllm/model_executor/models/deepseek_v2.py, qwen3_moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.costs.compute import memory_time_s
from shardscope.costs.host import HOST_PYTHON_SPEED
from shardscope.hardware.catalog import GPU

# One mapping entry of vLLM's expert scan (tuple unpack + substring test), timed on the benches' CPU by
# bench/vllm_expert_scan.py (117-126 ns), put on the H100 hosts' clock by HOST_PYTHON_SPEED.
EXPERT_SCAN_ENTRY_S = 0.12e-6 * HOST_PYTHON_SPEED
# One eager op from Python under no_grad (engines load in inference mode; refits run without autograd):
# 8.9-12.9 us, mean 11.1 us, on the project's H100 hosts (validation/kernels_measured_h100.json
# `host_autograd_runs` no_grad_op_us; `LAUNCH_S` is the same op with autograd).
NO_GRAD_OP_S = 11.1e-6
# Per tensor outside the scan: the loader's `copy_`, one such op. The narrow views and dict look-ups around
# it are not counted, so this is a lower bound.
LOAD_TENSOR_S = NO_GRAD_OP_S


@dataclass(frozen=True, slots=True)
class LoadCost:
    """Time one rollout rank spends installing what it received."""

    host_s: float  # Python per tensor (name mapping, expert scan, loader call)
    copy_s: float  # the memory-bound copy into the engine's parameters

    @property
    def total_s(self) -> float:
        return self.host_s + self.copy_s


def load_cost(
    gpu: GPU, tensors: float, expert_tensors: float, experts_per_layer: int, installed_bytes: float
) -> LoadCost:
    """`tensors` checkpoint tensors handed to `load_weights`, `expert_tensors` of them routed-expert
    tensors (each scans the expert map), `installed_bytes` written into this rank's parameters (a copy
    reads and writes each byte)."""
    scan = expert_tensors * (3 * experts_per_layer / 2) * EXPERT_SCAN_ENTRY_S
    return LoadCost(host_s=tensors * LOAD_TENSOR_S + scan, copy_s=memory_time_s(gpu, 2 * installed_bytes))
