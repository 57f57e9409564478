"""Text output of `shardscope rl`: the step, its critical path, each pool's idle time, the split search."""

from __future__ import annotations

from shardscope.rl.loop import RLResult


def print_rl(result: RLResult) -> None:
    s = result.step
    r, t = s.rollout, s.train
    stale = f", staleness {s.staleness}" if s.mode == "async" else ""
    print(f"{s.model} {s.algo.upper()} on {s.gpus}x {s.gpu}: {s.placement}, {s.mode}{stale}")
    print(
        f"  {s.prompts} prompts x {s.samples} samples, prompt {s.input_len} tokens, responses mean "
        f"{r.mean_len:.0f} / longest {r.max_len} (cap {s.output_len})"
    )
    print(f"step time        {s.step_s:9.2f} s   ({s.samples_per_s:.1f} samples/s)")
    print("critical path    " + " -> ".join(f"{p.name} {p.time_s:.2f} s" for p in s.critical_path))
    print(
        f"rollout          {r.layout} on {r.gpus} GPUs: bulk {r.bulk_s:.2f} s + tail {r.tail_s:.2f} s "
        f"(longest sample beside {r.tail_batch} per instance) = {r.full_s:.2f} s"
    )
    parts = [f"reference forward {t.ref_forward_s:.2f} s"]
    if t.critic_forward_s:
        parts.append(f"critic forward {t.critic_forward_s:.2f} s")
    parts.append(f"policy update {t.policy_update_s:.2f} s")
    if t.critic_update_s:
        parts.append(f"critic update {t.critic_update_s:.2f} s")
    print(f"train            {t.layout} on {t.gpus} GPUs: " + ", ".join(parts) + f" ({t.peak_gib:.1f} GiB/GPU)")
    print(f"weight sync      {s.sync_s:.2f} s ({s.sync_mechanism})")
    if s.placement == "colocated":
        trainer = f" + trainer state {s.trainer_offload_s:.2f} s" if s.trainer_offload_s else ""
        print(f"hand-over        {s.handover_s:.2f} s ({s.handover} engine{trainer})")
    m = s.memory
    peaks = ", ".join(f"{p.phase} {p.peak_gib:.1f}" + ("" if p.pool == "shared" else f" ({p.pool})") for p in m.phases)
    print(
        f"memory/GPU       {peaks} of {m.capacity_gib:.1f} GiB (trainer offload {m.trainer_offload}, "
        f"engine utilization {m.gpu_memory_utilization:.2f})"
    )
    idle = ", ".join(f"{pool} {sec:.2f} s ({sec / s.step_s:.0%})" for pool, sec in s.idle_s.items())
    print(f"GPU idle         {idle}")
    if result.split:
        print("split (rollout + train GPUs, fastest first):")
        for step in result.split[:8]:
            print(
                f"  {step.rollout.gpus:4d} + {step.train.gpus:<4d} step {step.step_s:9.2f} s  "
                f"{step.samples_per_s:8.1f} samples/s" + ("" if step.memory.fits else "  (does not fit)")
            )
    for w in s.warnings:
        print(f"warning: {w}")
