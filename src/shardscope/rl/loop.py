"""`shardscope rl`: one RL post-training step (GRPO or PPO shape) priced from its three jobs.

The step: `prompts` x `samples` rollouts on the inference engines, then on the trainer's GPUs the forward
passes that score them (the frozen reference policy for the KL term; PPO's critic for values), the policy
update (PPO: the critic's update too), and the weight update from the trainer to the engines.

Where each number comes from:
- Rollout: `serve_estimate` (serve's public API), offline, on the rollout layout, each prompt sampled
  `samples` times (vLLM's `n`: a prompt's samples share its KV blocks where the engine caches prefixes,
  and are scheduled together on one engine instance). Response lengths are drawn
  from a seeded log-normal clipped at `--output-len` (the generation cap, so a share of samples hit it):
  median `length_median` x cap, log-spread `length_sigma` (defaults below: a long-tail shape, not fitted to
  a dataset). The serve simulator takes fixed lengths, so a rollout is priced in two parts: the *bulk*, every
  sample generating the mean length (throughput of the whole batch: KV capacity, queueing, preemption), and
  the *tail*, the longest sample's remaining tokens (max - mean) decoded beside the samples still running
  then (those longer than the mean, per instance; an upper bound on that batch), at the tail run's TPOT. In
  sync mode the rollout ends when the longest sample ends: bulk + tail.
- Reference / critic forward: a forward is the forward share of a training step. From the estimator's
  parts: the forward's FLOPs are model_flops / 3 (model FLOPs are 3 x forward), so its share of the step's
  hardware work is (model_flops / 3) / hardware_flops (1/3 with no recompute); that share of the step's
  compute, pipeline bubble and exposed TP/PP/EP communication (not the DP gradient sync, not the optimizer).
- Policy (and critic) update: `shardscope.estimate` with the trainer's stack and TP/PP/EP, a global batch of
  every sample, each a sequence of prompt + mean response tokens (packed sequences, no padding to the cap).
- Weight sync: `rl.sync.predict_sync`, the fastest mechanism for the placement (CUDA-IPC when colocated).

Placements: `colocated` time-slices one pool: rollout -> hand-over -> forwards -> update -> sync. The
hand-over frees the engine's memory for training: `free` discards the KV cache and weights (vLLM sleep
level 2; the sync refills the weights) at no copy cost; `offload` copies the engine's weights to host memory
and back (vLLM sleep level 1), two memory-bound PCIe copies of the weights a GPU holds. The trainer's state
that `--trainer-offload` sends to host memory while the engine generates (`rl.memory`) crosses PCIe out and
back too, inside the hand-over. Every phase must fit the shared GPUs (`rl.memory.rl_memory`: generation,
training, sync), else the step is refused. `disaggregated` runs the engines and the trainer on separate
pools, the sync over the network.

Modes, with `s` the staleness budget (policy versions a sample may lag the trainer):
- `sync` (s = 0): each phase waits for the one before.
- `one-step-off` (s = 1): the rollout of step n+1 runs beside the training of step n (disaggregated only:
  colocated pools share GPUs, so it is sync there); the sync is a barrier both pools wait for.
- `async` (s = `staleness`): as one-step-off, and unfinished samples carry over to the next rollout
  (partial rollouts), so a sample may span s rollout windows: a rollout window lasts
  max(bulk, full rollout / s) instead of the full rollout. s = 0 is sync; s = 1 is one-step-off.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.rl.layout import FSDP, RolloutLayout, TrainLayout, parse_rollout, parse_train, sizes_unstated
from shardscope.rl.memory import (
    TRAINER_OFFLOADS,
    RLMemory,
    TrainerState,
    check_utilization,
    engine_memory,
    overflow_message,
    rl_memory,
)
from shardscope.rl.sync import predict_sync, setup

ALGOS = ("grpo", "ppo")
PLACEMENTS = ("colocated", "disaggregated")
MODES = ("sync", "one-step-off", "async")
HANDOVERS = ("free", "offload")
# Response-length shape (fractions of the cap): a median well under the cap and a log-spread wide enough
# that a few percent of samples reach the cap, the long tail GRPO/DAPO runs report (the longest sample of a
# step usually hits max tokens). An assumption to override, not a fit.
DEFAULT_LENGTH_MEDIAN = 0.3
DEFAULT_LENGTH_SIGMA = 0.7


def sample_lengths(n: int, cap: int, median: float, sigma: float, seed: int) -> list[int]:
    """`n` response lengths, log-normal (median `median` x `cap`, log-spread `sigma`), clipped to [1, cap]."""
    if not 0 < median <= 1:
        raise ShardscopeError(f"--length-median must be in (0, 1] (a fraction of --output-len), got {median:g}")
    if sigma < 0:
        raise ShardscopeError(f"--length-sigma must be non-negative, got {sigma:g}")
    rng = random.Random(seed)
    mu = math.log(median * cap)
    return [min(cap, max(1, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


@dataclass(frozen=True, slots=True)
class RolloutCost:
    gpus: int
    layout: str
    bulk_s: float  # every sample generating the mean length, the whole batch at once
    tail_s: float  # the longest sample's tokens past the mean, beside the samples still running
    mean_len: float
    max_len: int
    tail_batch: int  # samples per instance still running when the bulk ends (longer than the mean)
    weights_gib_per_gpu: float  # what the engine holds per GPU (the offload hand-over copies it)

    @property
    def full_s(self) -> float:
        """Until the longest sample finishes (sync mode)."""
        return self.bulk_s + self.tail_s


@dataclass(frozen=True, slots=True)
class TrainCost:
    gpus: int
    layout: str
    ref_forward_s: float
    critic_forward_s: float  # PPO only
    policy_update_s: float
    critic_update_s: float  # PPO only
    fits: bool
    peak_gib: float  # the update's required memory per GPU
    # the estimate's model state per GPU (for the phases' memory, `rl.memory`)
    params_gib: float = 0.0
    grads_gib: float = 0.0
    optimizer_gib: float = 0.0
    persistent_grads: bool = False
    capacity_gib: float = 0.0

    @property
    def total_s(self) -> float:
        return self.ref_forward_s + self.critic_forward_s + self.policy_update_s + self.critic_update_s

    def state(self) -> TrainerState:
        return TrainerState(
            params_gib=self.params_gib, grads_gib=self.grads_gib, optimizer_gib=self.optimizer_gib,
            update_gib=self.peak_gib, persistent_grads=self.persistent_grads,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    time_s: float


@dataclass(frozen=True, slots=True)
class StepTiming:
    step_s: float
    critical_path: tuple[Phase, ...]  # phases in order; their times add up to step_s
    idle_s: dict[str, float]  # per pool: time its GPUs run no model work (generation, forward, update)


def rollout_window_s(r: RolloutCost, mode: str, staleness: int) -> float:
    """How long one step's rollout occupies the engines under `mode` (see the module doc)."""
    if mode == "sync" or (mode == "async" and staleness == 0):
        return r.full_s
    if mode == "one-step-off":
        return r.full_s
    return max(r.bulk_s, r.full_s / staleness)


def compose_step(
    placement: str, mode: str, staleness: int, r: RolloutCost, t: TrainCost, sync_s: float, handover_s: float
) -> StepTiming:
    """The step's time, its critical path and each pool's idle time, from the priced phases."""
    window = rollout_window_s(r, mode, staleness)
    train_phases = [Phase("reference forward", t.ref_forward_s)]
    if t.critic_forward_s:
        train_phases.append(Phase("critic forward", t.critic_forward_s))
    train_phases.append(Phase("policy update", t.policy_update_s))
    if t.critic_update_s:
        train_phases.append(Phase("critic update", t.critic_update_s))
    if placement == "colocated":
        # One pool, time-sliced: nothing overlaps, whatever the mode (async shortens the window only).
        path = (Phase("rollout", window), Phase("hand-over", handover_s), *train_phases, Phase("sync", sync_s))
        step = sum(p.time_s for p in path)
        return StepTiming(step, path, {"shared": handover_s + sync_s})
    overlap = mode == "one-step-off" or (mode == "async" and staleness >= 1)
    if overlap:
        # Rollout n+1 beside training n; the weight sync is a barrier both pools wait for.
        longer = (Phase("rollout", window),) if window >= t.total_s else tuple(train_phases)
        path = (*longer, Phase("sync", sync_s))
        step = max(window, t.total_s) + sync_s
    else:
        path = (Phase("rollout", window), *train_phases, Phase("sync", sync_s))
        step = window + t.total_s + sync_s
    return StepTiming(step, path, {"rollout": step - window, "train": step - t.total_s})


@cache
def _serve(  # noqa: ANN202
    model: str, gpu: str, gpus: int, tp: int, engine: str, prompts: int, input_len: int, output_len: int,
    samples: int = 1,
):  # fmt: skip
    from shardscope.serve.estimate import serve_estimate

    return serve_estimate(
        model, gpu=gpu, gpus=gpus, tp=tp, engine=engine, num_prompts=prompts, input_len=input_len,
        output_len=output_len, samples=samples,
    )  # fmt: skip


def price_rollout(
    model: str, gpu: str, layout: RolloutLayout, input_len: int, lengths: list[int], samples: int = 1
) -> RolloutCost:
    """The rollout of `len(lengths)` samples, `samples` of each prompt (see the module doc)."""
    if layout.ep > 1:
        raise ShardscopeError(
            "the serving simulator prices MoE experts TP-sharded only; give a TP-only --rollout (no ep)"
        )
    n = len(lengths)
    mean = sum(lengths) / n
    bulk_len = max(1, round(mean))
    longest = max(lengths)
    if n % samples:
        raise ShardscopeError(f"{n} samples do not split into groups of {samples}")
    bulk = _serve(model, gpu, layout.gpus, layout.tp, layout.engine, n // samples, input_len, bulk_len, samples)
    tail_tokens = longest - bulk_len
    tail_batch = max(1, math.ceil(sum(1 for x in lengths if x > bulk_len) / layout.instances))
    tail_s = 0.0
    if tail_tokens > 0:
        # One instance, its share of the long samples, their KV already at prompt + mean tokens.
        run = _serve(model, gpu, layout.tp, layout.tp, layout.engine, tail_batch, input_len + bulk_len, tail_tokens)
        tail_s = tail_tokens * run.tpot.mean_ms / 1e3 if tail_tokens > 1 else run.decode_iteration_s
    return RolloutCost(
        gpus=layout.gpus, layout=layout.label(), bulk_s=bulk.duration_s, tail_s=tail_s, mean_len=mean,
        max_len=longest, tail_batch=tail_batch, weights_gib_per_gpu=bulk.memory.weights_gib,
    )  # fmt: skip


def _update(model: str, gpu: str, layout: TrainLayout, n: int, seq_len: int):  # noqa: ANN202
    import shardscope

    if layout.stack == FSDP:
        return shardscope.estimate(
            model, gpu=gpu, gpus=layout.gpus, stack="torchtitan", tp=layout.tp, fsdp=True, global_batch=n,
            seq_len=seq_len,
        )  # fmt: skip
    return shardscope.estimate(
        model, gpu=gpu, gpus=layout.gpus, stack=layout.stack, tp=layout.tp, pp=layout.pp, ep=layout.ep,
        global_batch=n, seq_len=seq_len,
    )  # fmt: skip


def forward_s(est: Any) -> float:
    """A forward pass over the same batch, from a training estimate's parts (see the module doc)."""
    share = (est.model_flops_per_step / 3) / est.hardware_flops_per_step
    comm = est.time.exposed_comm_s - est.time.detail.get("dp_exposed_s", 0.0)
    return share * (est.time.compute_s + est.time.bubble_s + max(0.0, comm))


def price_train(model: str, gpu: str, layout: TrainLayout, algo: str, n: int, seq_len: int) -> TrainCost:
    est = _update(model, gpu, layout, n, seq_len)
    fwd = forward_s(est)
    ppo = algo == "ppo"
    # PPO's critic is the policy's backbone with a value head: the same forward and update cost.
    return TrainCost(
        gpus=layout.gpus, layout=layout.label(), ref_forward_s=fwd, critic_forward_s=fwd if ppo else 0.0,
        policy_update_s=est.step_time_s, critic_update_s=est.step_time_s if ppo else 0.0, fits=est.fits,
        peak_gib=est.memory.required_gib, params_gib=est.memory.params_gib, grads_gib=est.memory.grads_gib,
        optimizer_gib=est.memory.optimizer_gib, persistent_grads=bool(est.plan.get("persistent_grads", True)),
        capacity_gib=est.memory.capacity_gib,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RLStep:
    model: str
    gpu: str
    gpus: int
    algo: str
    placement: str
    mode: str
    staleness: int
    handover: str
    prompts: int
    samples: int
    input_len: int
    output_len: int
    rollout: RolloutCost
    train: TrainCost
    sync_s: float
    sync_mechanism: str
    handover_s: float
    step_s: float
    critical_path: tuple[Phase, ...]
    idle_s: dict[str, float]
    samples_per_s: float
    memory: RLMemory
    trainer_offload_s: float = 0.0  # part of handover_s: the trainer's offloaded state out and back over PCIe
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rollout"]["full_s"] = self.rollout.full_s
        out["train"]["total_s"] = self.train.total_s
        out["memory"] = self.memory.to_dict()
        out["critical_path"] = [asdict(p) for p in self.critical_path]
        out["warnings"] = list(self.warnings)
        return out


@dataclass(frozen=True, slots=True)
class RLResult:
    step: RLStep
    split: tuple[RLStep, ...] = ()  # --search-split: every feasible split, best first

    def to_dict(self) -> dict[str, Any]:
        out = self.step.to_dict()
        if self.split:
            out["split"] = [
                {"rollout_gpus": s.rollout.gpus, "train_gpus": s.train.gpus, "step_s": s.step_s,
                 "samples_per_s": s.samples_per_s, "fits": s.memory.fits,
                 **{f"{p.phase}_gib": p.peak_gib for p in s.memory.phases}} for s in self.split
            ]  # fmt: skip
        return out


def rl_step(
    model: str,
    gpu: str = "H100",
    gpus: int = 8,
    algo: str = "grpo",
    prompts: int = 256,
    samples: int = 8,
    input_len: int = 1024,
    output_len: int = 4096,
    train: str = "megatron",
    rollout: str = "vllm tp1",
    placement: str = "colocated",
    mode: str = "sync",
    staleness: int = 1,
    handover: str = "free",
    rollout_gpus: int | None = None,
    length_median: float = DEFAULT_LENGTH_MEDIAN,
    length_sigma: float = DEFAULT_LENGTH_SIGMA,
    seed: int = 0,
    trainer_offload: str | None = None,
    gpu_memory_utilization: float | None = None,
) -> RLStep:
    """One RL step. Disaggregated: `rollout_gpus` of the `gpus` run the engines (default half), the rest
    train; colocated: both layouts span all `gpus`. `trainer_offload` (colocated: all | optimizer | none,
    default all; see `rl.memory`) and `gpu_memory_utilization` (default: the engine file's) set what each
    phase holds; a colocated step whose phase does not fit the GPU is refused."""
    algo, placement, mode, handover = algo.lower(), placement.lower(), mode.lower(), handover.lower()
    for value, valid, what in ((algo, ALGOS, "--algo"), (placement, PLACEMENTS, "--placement"),
                               (mode, MODES, "--mode"), (handover, HANDOVERS, "--handover")):  # fmt: skip
        if value not in valid:
            raise ShardscopeError(f"unknown {what} {value!r} (valid: {', '.join(valid)})")
    if prompts < 1 or samples < 1 or input_len < 1 or output_len < 1:
        raise ShardscopeError("--prompts, --samples, --input-len and --output-len must be at least 1")
    if staleness < 0:
        raise ShardscopeError(f"--staleness must be non-negative, got {staleness}")
    if gpus < 2 and placement == "disaggregated":
        raise ShardscopeError("disaggregated needs at least 2 GPUs (one per pool)")
    if trainer_offload is not None and trainer_offload.lower() not in TRAINER_OFFLOADS:
        raise ShardscopeError(f"unknown --trainer-offload {trainer_offload!r} (valid: {', '.join(TRAINER_OFFLOADS)})")
    if placement == "colocated":
        offload = (trainer_offload or "all").lower()
    elif (trainer_offload or "none").lower() != "none":
        raise ShardscopeError(
            "--trainer-offload applies to colocated placements (a disaggregated trainer keeps its GPUs)"
        )
    else:
        offload = "none"
    spec = load_model(model)
    train_gpus, roll_gpus = pool_gpus(gpus, placement, rollout_gpus)
    train_layout = parse_train(train, train_gpus)
    roll_layout = parse_rollout(rollout, roll_gpus)
    n = prompts * samples
    lengths = sample_lengths(n, output_len, length_median, length_sigma, seed)
    r = price_rollout(spec.name, gpu, roll_layout, input_len, lengths, samples)
    t = price_train(spec.name, gpu, train_layout, algo, n, input_len + max(1, round(r.mean_len)))
    s = setup(spec, gpu, train_layout, roll_layout, placement)
    fastest = min(predict_sync(s), key=lambda e: e.total_s)
    # The bucket the weights travel in (checkpoint-engine double-buffers it), at most the whole payload.
    buffer_gib = min(s.bucket_bytes, s.payload.bytes) * (2 if fastest.mechanism.startswith("ckpt") else 1) / 2**30
    engine = engine_memory(spec.name, gpu, roll_layout, gpu_memory_utilization)
    memory = rl_memory(placement, algo, t.state(), engine, t.capacity_gib, offload, buffer_gib)
    if placement == "colocated" and (line := overflow_message(memory, f"colocated on {gpus}x {gpu}")):
        raise ShardscopeError(f"{line}; {_remedy(memory)}")
    pcie_bps = make_cluster(gpu, gpus).gpu.pcie_gbps * 1e9
    handover_s = trainer_offload_s = 0.0
    if placement == "colocated":
        # Each offloaded byte of trainer state goes to host and comes back once a step.
        trainer_offload_s = 2 * memory.offloaded_gib * 2**30 / pcie_bps
        handover_s = trainer_offload_s
        if handover == "offload":
            # Out to host after the rollout, back before the next one: the engine's weights each way over PCIe.
            handover_s += 2 * r.weights_gib_per_gpu * 2**30 / pcie_bps
    timing = compose_step(placement, mode, staleness, r, t, fastest.total_s, handover_s)
    warns = []
    if not memory.fits and (line := overflow_message(memory, f"the {memory.first_overflow().pool} pool")):
        warns.append(f"{line}: more than the GPU holds ({train_layout.label()}, {roll_layout.label()})")
    if placement == "colocated" and mode != "sync":
        warns.append("colocated pools share GPUs: rollout and training cannot overlap (async only shortens the window)")
    if gpu_memory_utilization is not None:
        warns.append(
            f"--gpu-memory-utilization {gpu_memory_utilization:g} sizes the memory check only: the rollout is "
            "priced with the engine file's KV pool"
        )
    return RLStep(
        model=spec.name, gpu=gpu, gpus=gpus, algo=algo, placement=placement, mode=mode,
        staleness={"sync": 0, "one-step-off": 1}.get(mode, staleness), handover=handover, prompts=prompts,
        samples=samples, input_len=input_len, output_len=output_len, rollout=r, train=t, sync_s=fastest.total_s,
        sync_mechanism=fastest.mechanism, handover_s=handover_s, step_s=timing.step_s,
        critical_path=timing.critical_path, idle_s=timing.idle_s, samples_per_s=n / timing.step_s, memory=memory,
        trainer_offload_s=trainer_offload_s, warnings=tuple(warns),
    )  # fmt: skip


def pool_gpus(gpus: int, placement: str, rollout_gpus: int | None) -> tuple[int, int]:
    """(trainer GPUs, rollout GPUs): colocated, both all `gpus`; disaggregated, `rollout_gpus` (default half)
    run the engines and the rest train."""
    if placement == "colocated":
        return gpus, gpus
    roll_gpus = rollout_gpus if rollout_gpus is not None else gpus // 2
    if not 0 < roll_gpus < gpus:
        raise ShardscopeError(f"--rollout-gpus must be between 1 and {gpus - 1}, got {roll_gpus}")
    return gpus - roll_gpus, roll_gpus


def _remedy(memory: RLMemory) -> str:
    """What would shrink the colocated phase that does not fit."""
    phase = memory.first_overflow()
    tried = memory.trainer_offload == "all"
    offload = [] if tried else ["--trainer-offload all"]
    if phase is not None and phase.phase == "generation":
        fixes = [*offload, "a lower --gpu-memory-utilization", "more GPUs"]
    elif phase is not None and phase.phase == "training":
        fixes = [*offload, "more GPUs", "a layout that shards the update more"]
    else:
        fixes = [*offload, "more GPUs", "a larger rollout tp"]
    return "try " + ", ".join(fixes) + ", or --placement disaggregated"


def _unit(layout_text: str, parse: Any) -> int:
    """The fewest GPUs a layout can take: its model-parallel group (x EP for Megatron, whose EP lives in DP)."""
    layout = parse(layout_text)
    if isinstance(layout, RolloutLayout):
        return layout.tp
    if layout.stack == FSDP:
        return layout.tp
    return layout.tp * layout.pp * layout.ep


def search_split(model: str, gpus: int, train: str, rollout: str, **kw: Any) -> tuple[RLStep, ...]:
    """Every split of `gpus` between disaggregated rollout and training pools that the layouts and the
    batch allow, fastest step first (those whose update fits memory before those that do not). Splits the
    layouts cannot take (GPU counts off their group sizes, a batch the trainer's DP does not divide, a model
    that does not fit an engine) are skipped."""
    # Layouts that fix their DP size would pin the split; search over the sizes without it.
    train_free = " ".join(t for t in train.split() if not t.lower().startswith(("dp", "fsdp")) or t.lower() == FSDP)
    roll_free = " ".join(t for t in rollout.split() if not t.lower().startswith("dp"))
    tu, ru = _unit(train_free, parse_train), _unit(roll_free, parse_rollout)
    if train_free.split()[0].lower() == FSDP:
        train_free = f"{FSDP} tp{tu}"
    steps = []
    for r in range(ru, gpus, ru):
        if (gpus - r) % tu:
            continue
        try:
            steps.append(rl_step(model, gpus=gpus, train=train_free, rollout=roll_free,
                                 placement="disaggregated", rollout_gpus=r, **kw))  # fmt: skip
        except ShardscopeError:
            continue
    if not steps:
        raise ShardscopeError(f"no split of {gpus} GPUs fits --train {train!r} and --rollout {rollout!r}")
    # A split with a phase that does not fit its GPUs ranks after every one that fits.
    return tuple(sorted(steps, key=lambda s: (not (s.train.fits and s.memory.fits), s.step_s)))


# Sizes a trainer layout is searched over when the user names only its stack (`fastest_layout_step`)
TRAIN_TP = (1, 2, 4, 8)
TRAIN_PP = (1, 2, 4, 8)
TRAIN_EP = (1, 2, 4, 8, 16, 32, 64)


def fastest_layout_step(model: str, stack: str, **kw: Any) -> RLStep:
    """The fastest `rl_step` over the TP x PP x EP layouts of `stack` (TP within a node, EP for MoE models
    only) that the model and the GPU count take and whose every phase fits the GPUs; it says which layout it
    took and how many it tried. If none fits, the error of the plainest layout (no TP, PP or EP) is raised."""
    spec = load_model(model)
    gpus = kw.get("gpus", 8)
    train_gpus, _ = pool_gpus(gpus, kw.get("placement", "colocated").lower(), kw.get("rollout_gpus"))
    eps = TRAIN_EP if spec.moe is not None else (1,)
    fits: list[RLStep] = []
    tried = 0
    for tp in TRAIN_TP:
        for pp in TRAIN_PP:
            if train_gpus % (tp * pp):
                continue
            for ep in eps:
                if (train_gpus // (tp * pp)) % ep or (spec.moe is not None and spec.moe.experts % ep):
                    continue
                try:
                    step = rl_step(model, train=f"{stack} tp{tp} pp{pp} ep{ep}", **kw)
                except ShardscopeError:
                    continue  # a layout the model, the plan's checks or the GPUs' memory refuse
                tried += 1
                if step.train.fits and step.memory.fits:
                    fits.append(step)
    if not fits:
        rl_step(model, train=stack, **kw)  # raises the plainest layout's error
        raise ShardscopeError(f"no {stack} layout (tp <= 8, pp <= 8, ep <= 64) fits {model} on {gpus} GPUs")
    best = min(fits, key=lambda s: s.step_s)
    note = f"--train {stack}: the fastest of the {len(fits)} layouts that fit (of {tried} it runs): {best.train.layout}"
    return replace(best, warnings=(note, *best.warnings))


def rl(model: str, search: bool = False, trace: str | Path | None = None, **kw: Any) -> RLResult:
    """`shardscope rl`: one step, or with `search` the best disaggregated split and every split tried.
    `trace`: write a few steps of the result as Chrome-trace JSON (`rl.trace`)."""
    if trace is not None:
        from shardscope.serve.estimate import check_writable

        check_writable(Path(trace))
    check_utilization(kw.get("gpu_memory_utilization"))
    if not search:
        train = kw.pop("train", "megatron")
        if sizes_unstated(train):
            result = RLResult(fastest_layout_step(model, train, **kw))
        else:
            result = RLResult(rl_step(model, train=train, **kw))
    else:
        kw = {k: v for k, v in kw.items() if k not in ("placement", "rollout_gpus", "trainer_offload")}
        gpus, train, rollout = kw.pop("gpus", 8), kw.pop("train", "megatron"), kw.pop("rollout", "vllm tp1")
        split = search_split(model, gpus, train, rollout, **kw)
        result = RLResult(split[0], split)
    if trace is not None:
        from shardscope.rl.trace import write_rl_trace

        write_rl_trace(result.step, trace)
    return result
