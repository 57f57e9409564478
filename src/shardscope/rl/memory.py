"""What one GPU holds in each phase of an RL step: generation, training, weight sync (`shardscope rl`).

Colocated, the trainer and the rollout engine share every GPU and hand memory to each other between phases
(verl's hybrid engine, OpenRLHF `--colocate_all_models`, NeMo-RL colocated generation). Each phase must fit:

- generation: the engine awake (its weights, the KV pool it sized from its `gpu_memory_utilization`, its
  activation budget, CUDA-graph pool and non-torch memory), beside whatever the trainer kept on the GPU;
- training: the update's peak from the training estimator (`Estimate.memory.required_gib`: params, grads,
  optimizer shards, activations, buffers, CUDA context and fragmentation) beside the sleeping engine's
  CUDA-graph pool and non-torch memory (vLLM's sleep mode releases only the memory under its `weights` and
  `kv_cache` tags; verl's rollout.yaml: "cudagraph in inference engine can not be offloaded during update
  policy");
- sync: the engine's weights woken, its KV cache not yet (verl `rollout_mode`, verl/workers/fsdp_workers.py
  and megatron_workers.py: `rollout.resume(tags=["weights"])`, `update_weights`, trainer params offloaded,
  then `rollout.resume(tags=["kv_cache"])`), the trainer's params that the sync reads, and the bucket the
  weights travel in (checkpoint-engine double-buffers it).

What the trainer keeps on the GPU while it is not training differs between frameworks, so it is an option,
`--trainer-offload` (`TRAINER_OFFLOADS`):
- `all` (the colocated default): params, gradient buffers and optimizer state go to host memory after the
  sync and come back before the update. NeMo-RL does this in every colocated run
  (nemo_rl/models/policy/dtensor_policy_worker.py and megatron_policy_worker.py: `offload_before_refit`
  moves the optimizer state and grad buffers, `offload_after_refit` the model); OpenRLHF's hybrid-engine
  recipe (`--colocate_all_models --vllm_enable_sleep --deepspeed_enable_sleep`) and verl's large-model
  scripts (`param_offload=True optimizer_offload=True`) do the same.
- `optimizer`: only the optimizer state and gradient buffers go (NeMo-RL's `offload_before_refit` alone,
  verl `optimizer_offload=True` with `grad_offload=True`); params stay.
- `none`: everything stays: verl's defaults (verl/trainer/config/engine/fsdp.yaml and engine/megatron.yaml:
  `param_offload: false`, `optimizer_offload: false`) and OpenRLHF without `--deepspeed_enable_sleep`.
  Disaggregated trainers have their GPUs to themselves and keep everything (`none`).
Each offloaded byte crosses PCIe twice a step (out, then back), which the step's hand-over time counts.

The engine's memory is serve's (`serve.cost.memory_plan`): its `gpu_memory_utilization` is the engine
file's unless `--gpu-memory-utilization` sets it (verl's colocated rollout default is 0.5,
verl/trainer/config/rollout/rollout.yaml); SGLang's static fraction (`mem_fraction_static`) is read from the
same option. The reference policy (the KL term's frozen copy) holds the policy's params; PPO's critic holds
the policy's whole state (the same backbone). Both follow `--trainer-offload`. Two CUDA contexts are counted
when colocated (trainer and engine as separate processes, as OpenRLHF and NeMo-RL run them; verl's
same-process hybrid engine shares one: 1 GiB less).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from shardscope.costs.memory import CONTEXT_BYTES, GIB
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.rl.layout import RolloutLayout

TRAINER_OFFLOADS = ("all", "optimizer", "none")
PHASES = ("generation", "training", "sync")
CONTEXT_GIB = CONTEXT_BYTES / GIB


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """One rollout GPU's engine memory, GiB (serve's `Memory`, at the utilization used)."""

    weights_gib: float
    kv_cache_gib: float
    runtime_gib: float  # activation budget + CUDA-graph pool + non-torch (context, NCCL)
    sleeping_gib: float  # what sleep mode leaves: CUDA-graph pool + non-torch
    gpu_memory_utilization: float  # the setting the pool was sized from (SGLang: its static fraction)

    @property
    def awake_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib + self.runtime_gib


@dataclass(frozen=True, slots=True)
class TrainerState:
    """One trainer GPU's model state and the update's peak, GiB (from the training estimate)."""

    params_gib: float
    grads_gib: float  # the gradient buffer; 0 between steps when the stack frees it (set_to_none)
    optimizer_gib: float
    update_gib: float  # the update's required memory: state + activations + buffers + context
    persistent_grads: bool

    @property
    def state_gib(self) -> float:
        """Model state that outlives a step."""
        return self.params_gib + (self.grads_gib if self.persistent_grads else 0.0) + self.optimizer_gib


@dataclass(frozen=True, slots=True)
class PhaseMemory:
    phase: str  # one of PHASES
    pool: str  # the GPUs holding the peak: shared (colocated), rollout or train
    peak_gib: float
    parts: dict[str, float]  # GiB by holder; they add up to peak_gib


@dataclass(frozen=True, slots=True)
class RLMemory:
    capacity_gib: float
    trainer_offload: str
    gpu_memory_utilization: float
    sync_buffer_gib: float
    offloaded_gib: float  # trainer state per GPU that goes to host and back each step
    phases: tuple[PhaseMemory, ...]

    def phase(self, name: str) -> PhaseMemory:
        return next(p for p in self.phases if p.phase == name)

    @property
    def fits(self) -> bool:
        return all(p.peak_gib <= self.capacity_gib for p in self.phases)

    def first_overflow(self) -> PhaseMemory | None:
        return next((p for p in self.phases if p.peak_gib > self.capacity_gib), None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "capacity_gib": self.capacity_gib, "trainer_offload": self.trainer_offload,
            "gpu_memory_utilization": self.gpu_memory_utilization, "sync_buffer_gib": self.sync_buffer_gib,
            "offloaded_gib": self.offloaded_gib, "fits": self.fits,
        }  # fmt: skip
        for p in self.phases:
            out[f"{p.phase}_gib"] = p.peak_gib
        out["phases"] = [
            {"phase": p.phase, "pool": p.pool, "peak_gib": p.peak_gib, "parts_gib": dict(p.parts)} for p in self.phases
        ]
        return out


def check_utilization(utilization: float | None) -> None:
    if utilization is not None and not 0 < utilization <= 1:
        raise ShardscopeError(f"--gpu-memory-utilization must be in (0, 1], got {utilization:g}")


@cache
def engine_memory(model: str, gpu: str, layout: RolloutLayout, utilization: float | None = None) -> EngineMemory:
    """The engine's memory on one rollout GPU, as serve sizes it; `utilization` overrides the engine file's
    `gpu_memory_utilization` (vLLM) or static fraction (SGLang)."""
    from shardscope.serve.cost import Deployment, memory_plan
    from shardscope.serve.engine import load_engine

    cluster = make_cluster(gpu, layout.tp)
    hbm = cluster.gpu.hbm_gib
    eng = load_engine(layout.engine, cluster.gpu)
    check_utilization(utilization)
    if utilization is not None:
        if eng.memory_rule == "utilization":
            eng = replace(eng, gpu_memory_utilization=utilization)
        elif eng.memory_rule == "static_fraction":
            eng = replace(eng, reserved_gib=hbm * (1 - utilization))
    spec = load_model(model)
    mem = memory_plan(Deployment(spec, cluster, layout.tp), eng)
    util = eng.gpu_memory_utilization if eng.memory_rule == "utilization" else 1 - eng.reserved_gib / hbm
    if mem.kv_blocks < 1:
        raise ShardscopeError(
            f"{spec.name} leaves the {eng.name} engine no KV cache on {layout.tp}x {cluster.gpu.name} at "
            f"gpu_memory_utilization {util:.2f}: {mem.weights_gib:.1f} GiB of weights per GPU "
            f"(raise the rollout tp or --gpu-memory-utilization)"
        )
    sleeping = mem.non_torch_gib + mem.cuda_graph_pool_gib
    return EngineMemory(
        weights_gib=mem.weights_gib, kv_cache_gib=mem.kv_pool_gib, runtime_gib=mem.activation_peak_gib + sleeping,
        sleeping_gib=sleeping, gpu_memory_utilization=util,
    )  # fmt: skip


def _others(t: TrainerState, offload: str, ppo: bool) -> dict[str, float]:
    """What the reference policy and PPO's critic keep on a GPU outside their own forward/update."""
    out: dict[str, float] = {}
    if offload != "all":
        out["reference weights"] = t.params_gib
        if ppo:
            out["critic state"] = t.params_gib if offload == "optimizer" else t.state_gib
    return out


def _policy_resident(t: TrainerState, offload: str) -> float:
    """The policy's state on the GPU between the sync and the next update."""
    return {"all": 0.0, "optimizer": t.params_gib, "none": t.state_gib}[offload]


def offloaded_gib(t: TrainerState, offload: str, ppo: bool) -> float:
    """Trainer state per GPU sent to host and back each step under `offload`."""
    movable = t.state_gib - t.params_gib  # grad buffers (when kept) and optimizer state
    if offload == "none":
        return 0.0
    if offload == "optimizer":
        return movable * (2 if ppo else 1)
    return t.state_gib + t.params_gib + (t.state_gib if ppo else 0.0)  # policy, reference, critic


def _phase(phase: str, pool: str, parts: dict[str, float]) -> PhaseMemory:
    parts = {k: v for k, v in parts.items() if v > 0}
    return PhaseMemory(phase, pool, sum(parts.values()), parts)


def rl_memory(
    placement: str,
    algo: str,
    trainer: TrainerState,
    engine: EngineMemory,
    capacity_gib: float,
    offload: str,
    sync_buffer_gib: float,
) -> RLMemory:
    """Each phase's peak per GPU (colocated: the shared GPUs; disaggregated: the busier pool)."""
    ppo = algo == "ppo"
    others = _others(trainer, offload, ppo)
    engine_awake = {
        "engine weights": engine.weights_gib, "engine KV cache": engine.kv_cache_gib,
        "engine runtime": engine.runtime_gib,
    }  # fmt: skip
    # The sync reads the policy's params; under `none` the rest of its state is there too.
    policy_sync = trainer.params_gib if offload != "none" else trainer.state_gib
    trainer_sync = {
        "trainer context": CONTEXT_GIB,
        "policy state": policy_sync,
        **others,
        "sync buffer": sync_buffer_gib,
    }
    if placement == "colocated":
        generation = {
            **engine_awake, "trainer context": CONTEXT_GIB, "policy state": _policy_resident(trainer, offload),
            **others,
        }  # fmt: skip
        training = {"policy update": trainer.update_gib, **others, "engine asleep": engine.sleeping_gib}
        sync = {"engine weights": engine.weights_gib, "engine asleep": engine.sleeping_gib, **trainer_sync}
        phases = (
            _phase("generation", "shared", generation),
            _phase("training", "shared", training),
            _phase("sync", "shared", sync),
        )
    else:
        roll_sync = _phase("sync", "rollout", {**engine_awake, "sync buffer": sync_buffer_gib})
        train_sync = _phase("sync", "train", trainer_sync)
        phases = (
            _phase("generation", "rollout", engine_awake),
            _phase("training", "train", {"policy update": trainer.update_gib, **others}),
            max(roll_sync, train_sync, key=lambda p: p.peak_gib),
        )
    return RLMemory(
        capacity_gib=capacity_gib, trainer_offload=offload, gpu_memory_utilization=engine.gpu_memory_utilization,
        sync_buffer_gib=sync_buffer_gib, offloaded_gib=offloaded_gib(trainer, offload, ppo) if placement ==
        "colocated" else 0.0, phases=phases,
    )  # fmt: skip


def overflow_message(mem: RLMemory, what: str) -> str | None:
    """One line naming the first phase that does not fit and its numbers (None: every phase fits)."""
    p = mem.first_overflow()
    if p is None:
        return None
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(p.parts.items(), key=lambda kv: -kv[1]))
    return (
        f"{what}: the {p.phase} phase needs {p.peak_gib:.1f} GiB per GPU of {mem.capacity_gib:.1f} "
        f"({parts}; trainer offload {mem.trainer_offload})"
    )
