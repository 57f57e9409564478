"""`shardscope rl --trace`: a few RL steps as Chrome-trace JSON (Perfetto), written with the step trace's
writer (`report.trace`).

Each GPU pool is a process (colocated: one shared pool; disaggregated: the rollout pool and the train pool),
with a thread per job: generation, training (reference/critic forwards and the updates inside one span),
weight sync and, colocated, the memory hand-over. Every span carries its iteration; a counter track per pool
gives each phase's peak memory per GPU (`rl.memory`). The layout is `compose_step`'s: sync and colocated steps
run their phases one after another; one-step-off and async steps (disaggregated) run the rollout of step k+1
beside the training of step k, after a first rollout with nothing to train beside it, and the weight sync is
a barrier both pools wait for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardscope.report.trace import complete_event, counter_event, name_events, write_chrome_trace
from shardscope.rl.loop import RLStep, rollout_window_s

GENERATION, TRAINING, SYNC, HANDOVER = 1, 2, 3, 4
THREADS = {GENERATION: "generation", TRAINING: "training", SYNC: "weight sync", HANDOVER: "hand-over"}
TRACE_STEPS = 3  # steps drawn


def overlaps(step: RLStep) -> bool:
    """Whether the rollout of step k+1 runs beside the training of step k (`compose_step`'s rule)."""
    return step.placement == "disaggregated" and (
        step.mode == "one-step-off" or (step.mode == "async" and step.staleness >= 1)
    )


def _train_parts(step: RLStep) -> list[tuple[str, float]]:
    t = step.train
    parts = [("reference forward", t.ref_forward_s), ("critic forward", t.critic_forward_s),
             ("policy update", t.policy_update_s), ("critic update", t.critic_update_s)]  # fmt: skip
    return [(name, sec) for name, sec in parts if sec > 0 or name in ("reference forward", "policy update")]


def _rollout(ev: list, pid: int, start: float, window: float, step: RLStep, k: int) -> None:
    r = step.rollout
    ev.append(complete_event(pid, GENERATION, start, window, f"rollout {k}", cat="generation", iteration=k,
                             bulk_s=r.bulk_s, tail_s=r.tail_s, samples=step.prompts * step.samples))  # fmt: skip
    bulk = min(r.bulk_s, window)
    ev.append(complete_event(pid, GENERATION, start, bulk, "bulk (every sample to the mean length)",
                             cat="generation", iteration=k))  # fmt: skip
    if window > bulk:
        tail = "tail (longest sample)" if window >= r.full_s - 1e-12 else "tail (the rest carries over)"
        ev.append(complete_event(pid, GENERATION, start + bulk, window - bulk, tail, cat="generation", iteration=k))


def _train(ev: list, pid: int, start: float, step: RLStep, k: int) -> float:
    total = step.train.total_s
    ev.append(complete_event(pid, TRAINING, start, total, f"train {k}", cat="training", iteration=k))
    at = start
    for name, sec in _train_parts(step):
        ev.append(complete_event(pid, TRAINING, at, sec, name, cat="training", iteration=k))
        at += sec
    return start + total


def _sync(ev: list, pids: tuple[int, ...], start: float, step: RLStep, k: int) -> None:
    for pid in pids:
        ev.append(complete_event(pid, SYNC, start, step.sync_s, f"weight sync {k}", cat="sync", iteration=k,
                                 mechanism=step.sync_mechanism))  # fmt: skip
    if len(pids) == 2:  # disaggregated: the pool holding the sync's peak shows it, then its own phase again
        pid = pids[0] if step.memory.phase("sync").pool == "rollout" else pids[1]
        _memory(ev, pid, start, step, "sync")
        _memory(ev, pid, start + step.sync_s, step, "generation" if pid == pids[0] else "training")


def _memory(ev: list, pid: int, start: float, step: RLStep, phase: str) -> None:
    """The phase's peak memory per GPU, from its start until the next phase's."""
    ev.append(counter_event(pid, "memory per GPU, phase peak", start, gib=round(step.memory.phase(phase).peak_gib, 3)))


def rl_trace_events(step: RLStep, steps: int = TRACE_STEPS) -> list[dict[str, Any]]:
    """The trace's events: `steps` RL steps in a row."""
    window = rollout_window_s(step.rollout, step.mode, step.staleness)
    ev: list[dict[str, Any]] = []
    if step.placement == "colocated":
        ev += name_events(0, f"shared pool: {step.gpus} GPUs ({step.rollout.layout}; {step.train.layout})", THREADS)
        at = 0.0
        for k in range(steps):
            _memory(ev, 0, at, step, "generation")
            _rollout(ev, 0, at, window, step, k)
            at += window
            if step.handover_s > 0:
                ev.append(complete_event(0, HANDOVER, at, step.handover_s, f"hand-over {k}", cat="handover",
                                         iteration=k, engine=step.handover,
                                         trainer_offload_s=step.trainer_offload_s))  # fmt: skip
                at += step.handover_s
            _memory(ev, 0, at, step, "training")
            at = _train(ev, 0, at, step, k)
            _memory(ev, 0, at, step, "sync")
            _sync(ev, (0,), at, step, k)
            at += step.sync_s
        return ev
    roll, train = 0, 1
    ev += name_events(roll, f"rollout pool: {step.rollout.gpus} GPUs ({step.rollout.layout})",
                      {GENERATION: THREADS[GENERATION], SYNC: THREADS[SYNC]})  # fmt: skip
    ev += name_events(train, f"train pool: {step.train.gpus} GPUs ({step.train.layout})",
                      {TRAINING: THREADS[TRAINING], SYNC: THREADS[SYNC]})  # fmt: skip
    _memory(ev, roll, 0.0, step, "generation")
    if not overlaps(step):
        at = 0.0
        for k in range(steps):
            _rollout(ev, roll, at, window, step, k)
            at += window
            _memory(ev, train, at, step, "training")
            at = _train(ev, train, at, step, k)
            _sync(ev, (roll, train), at, step, k)
            at += step.sync_s
        return ev
    # Rollout k+1 beside training k; the first rollout has nothing beside it.
    _rollout(ev, roll, 0.0, window, step, 0)
    at = window
    for k in range(steps):
        _memory(ev, train, at, step, "training")
        _train(ev, train, at, step, k)
        _rollout(ev, roll, at, window, step, k + 1)  # the last one too: the barrier waits for it
        barrier = at + max(window, step.train.total_s)
        _sync(ev, (roll, train), barrier, step, k)
        at = barrier + step.sync_s
    return ev


def write_rl_trace(step: RLStep, path: str | Path, steps: int = TRACE_STEPS) -> None:
    metadata = {
        "model": step.model, "gpu": step.gpu, "gpus": step.gpus, "algo": step.algo, "placement": step.placement,
        "mode": step.mode, "staleness": step.staleness, "step_s": step.step_s, "steps": steps,
        "memory_gib": {p.phase: p.peak_gib for p in step.memory.phases},
        "capacity_gib": step.memory.capacity_gib,
    }  # fmt: skip
    write_chrome_trace(Path(path), rl_trace_events(step, steps), metadata)
