"""`shardscope rl`: the RL step's invariants (issue 48 item 2), its parts and the CLI."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.rl.layout import parse_rollout
from shardscope.rl.loop import (
    RolloutCost,
    TrainCost,
    compose_step,
    price_rollout,
    rl,
    rl_step,
    sample_lengths,
)

MODEL = "qwen3-30b-a3b"
BASE = dict(gpus=64, prompts=64, samples=8, input_len=512, output_len=2048, train="megatron tp2 ep8")


def _rollout(bulk: float, tail: float) -> RolloutCost:
    return RolloutCost(gpus=8, layout="x", bulk_s=bulk, tail_s=tail, mean_len=1.0, max_len=2, tail_batch=1,
                       weights_gib_per_gpu=1.0)  # fmt: skip


def _train(fwd: float, update: float) -> TrainCost:
    return TrainCost(gpus=8, layout="y", ref_forward_s=fwd, critic_forward_s=0.0, policy_update_s=update,
                     critic_update_s=0.0, fits=True, peak_gib=1.0)  # fmt: skip


def test_lengths_are_seeded_capped_and_long_tailed() -> None:
    a = sample_lengths(2048, 4096, 0.3, 0.7, seed=1)
    assert a == sample_lengths(2048, 4096, 0.3, 0.7, seed=1)
    assert a != sample_lengths(2048, 4096, 0.3, 0.7, seed=2)
    assert min(a) >= 1 and max(a) == 4096  # a few percent reach the cap: the longest sample hits it
    assert sum(a) / len(a) < 0.5 * 4096  # the mean sits far below the longest: a long tail
    assert set(sample_lengths(16, 100, 0.5, 0.0, seed=0)) == {50}  # no spread: every sample the median
    with pytest.raises(ShardscopeError):
        sample_lengths(4, 100, 1.5, 0.5, seed=0)


# Synthetic phases where the rollout's tail, the rollout and the trainer each take the lead in turn.
CASES = [
    (10.0, 30.0, 5.0, 20.0, 2.0),
    (40.0, 5.0, 10.0, 60.0, 3.0),
    (5.0, 50.0, 1.0, 2.0, 0.5),
    (40.0, 5.0, 1.0, 2.0, 0.5),
]


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
@pytest.mark.parametrize(("bulk", "tail", "fwd", "update", "sync"), CASES)
def test_async_never_slower_than_sync_at_equal_staleness(
    placement: str, bulk: float, tail: float, fwd: float, update: float, sync: float
) -> None:
    r, t = _rollout(bulk, tail), _train(fwd, update)
    sync_step = compose_step(placement, "sync", 0, r, t, sync, 1.0).step_s
    off = compose_step(placement, "one-step-off", 1, r, t, sync, 1.0).step_s
    # staleness 0 allows no overlap and no carried-over samples: async is sync; staleness 1 is one-step-off
    assert compose_step(placement, "async", 0, r, t, sync, 1.0).step_s == pytest.approx(sync_step)
    assert compose_step(placement, "async", 1, r, t, sync, 1.0).step_s == pytest.approx(off)
    assert off <= sync_step
    previous = off
    for k in range(2, 8):
        timing = compose_step(placement, "async", k, r, t, sync, 1.0)
        step = timing.step_s
        assert step <= previous + 1e-12 and step <= sync_step  # a larger budget never costs time
        # carrying samples over hides the tail, never the bulk: every sample's mean work is still done
        assert all(p.time_s >= bulk for p in timing.critical_path if p.name == "rollout")
        previous = step
    if placement == "disaggregated":
        assert off < sync_step  # two pools overlap: strictly faster
        # never below what either pool must do: the trainer's work plus the sync, the bulk of the rollout
        assert previous >= max(t.total_s, bulk) + sync - 1e-12


def test_colocated_step_is_sum_of_phases_plus_handover() -> None:
    for mode in ("sync", "one-step-off", "async"):
        s = rl_step(MODEL, placement="colocated", mode=mode, staleness=2, handover="offload", **BASE)
        window = s.rollout.full_s if mode != "async" else max(s.rollout.bulk_s, s.rollout.full_s / 2)
        assert s.handover_s > 0  # offload copies the engine's weights out and back over PCIe
        assert s.step_s == pytest.approx(window + s.handover_s + s.train.total_s + s.sync_s)
        assert s.step_s == pytest.approx(sum(p.time_s for p in s.critical_path))
        assert s.samples_per_s == pytest.approx(64 * 8 / s.step_s)
    free = rl_step(MODEL, placement="colocated", handover="free", **BASE)
    offload = rl_step(MODEL, placement="colocated", handover="offload", **BASE)
    # the hand-over also carries the trainer's offloaded state (rl.memory) out and back; `free` copies no weights
    assert free.handover_s == pytest.approx(free.trainer_offload_s) and free.trainer_offload_s > 0
    assert offload.step_s - free.step_s == pytest.approx(offload.handover_s - free.handover_s)


@pytest.mark.parametrize("tp", [1, 2])
def test_more_rollout_gpus_never_slow_rollouts(tp: int) -> None:
    lengths = sample_lengths(512, 2048, 0.3, 0.7, seed=3)
    prev_full = prev_bulk = math.inf
    for gpus in (4, 8, 16, 32, 64):
        r = price_rollout(MODEL, "H100", parse_rollout(f"vllm tp{tp}", gpus), 512, lengths)
        assert r.full_s <= prev_full + 1e-9 and r.bulk_s <= prev_bulk + 1e-9
        assert r.tail_s > 0 and r.max_len == max(lengths)
        prev_full, prev_bulk = r.full_s, r.bulk_s


def test_a_groups_samples_share_their_prompt_in_the_rollout() -> None:
    """GRPO's samples of one prompt go to the engine together (vLLM's `n`): with prefix caching the prompt
    is prefilled and held once per group, so 64 prompts x 8 samples roll out faster than 512 prompts."""
    lengths = sample_lengths(512, 1024, 0.3, 0.7, seed=3)
    layout = parse_rollout("vllm tp1", 8)
    grouped = price_rollout(MODEL, "H100", layout, 4096, lengths, samples=8)
    distinct = price_rollout(MODEL, "H100", layout, 4096, lengths, samples=1)
    assert grouped.bulk_s < 0.8 * distinct.bulk_s
    with pytest.raises(ShardscopeError, match="groups of 3"):
        price_rollout(MODEL, "H100", layout, 4096, lengths, samples=3)


def test_tail_grows_the_sync_rollout_and_async_hides_it() -> None:
    narrow = rl_step(MODEL, placement="disaggregated", length_sigma=0.0, **BASE)
    assert narrow.rollout.tail_s == 0  # every sample the same length: nothing to wait for
    wide = rl_step(MODEL, placement="disaggregated", **BASE)
    assert wide.rollout.tail_s > 0
    hidden = rl_step(MODEL, placement="disaggregated", mode="async", staleness=4, **BASE)
    assert hidden.step_s < wide.step_s


def test_ppo_adds_critic_forward_and_update() -> None:
    grpo = rl_step(MODEL, placement="disaggregated", algo="grpo", **BASE)
    ppo = rl_step(MODEL, placement="disaggregated", algo="ppo", **BASE)
    assert grpo.train.critic_forward_s == 0 and grpo.train.critic_update_s == 0
    assert ppo.train.critic_update_s == pytest.approx(ppo.train.policy_update_s)
    assert ppo.step_s > grpo.step_s
    # a forward is a fraction of a training step: cheaper than the update, more than a tenth of it
    assert 0.1 * grpo.train.policy_update_s < grpo.train.ref_forward_s < grpo.train.policy_update_s


def test_issue_case_qwen3_30b_grpo_on_64_h100_returns_split_and_step_time() -> None:
    out = rl(MODEL, search=True, gpu="H100", gpus=64, algo="grpo", prompts=256, samples=8, input_len=1024,
             output_len=4096, train="megatron tp2 ep8", rollout="vllm tp1", mode="sync")  # fmt: skip
    best = out.step
    assert best.placement == "disaggregated"
    assert best.rollout.gpus + best.train.gpus == 64 and best.rollout.gpus > 0 and best.train.gpus > 0
    assert len(out.split) >= 2 and best.step_s == min(s.step_s for s in out.split if s.train.fits)
    assert 0 < best.step_s < math.inf and best.samples_per_s > 0
    assert set(best.idle_s) == {"rollout", "train"} and all(v >= 0 for v in best.idle_s.values())


def test_a_stack_named_alone_gets_the_fastest_layout_that_fits() -> None:
    """`--train megatron` states no sizes: the TP x PP x EP layouts are searched and the fastest whose every
    phase fits is taken and named; an explicit layout that fits is never faster. With no sizes searched, the
    plainest layout (no TP or EP) does not fit Qwen3-30B-A3B's update on 80 GB GPUs."""
    kw = dict(gpu="H100", gpus=64, prompts=64, samples=8, input_len=512, output_len=2048)
    with pytest.raises(ShardscopeError, match="does not fit|needs"):
        rl_step(MODEL, train="megatron tp1 pp1 ep1", **kw)
    found = rl(MODEL, train="megatron", **kw).step
    assert found.train.fits and found.memory.fits
    assert found.warnings[0].startswith("--train megatron: the fastest") and found.train.layout in found.warnings[0]
    assert found.step_s <= rl_step(MODEL, train="megatron tp2 ep8", **kw).step_s
    assert rl(MODEL, train="megatron tp2 ep8", **kw).step.train.layout.startswith("megatron tp2 pp1 ep8")


def test_cli_json_and_text() -> None:
    runner = CliRunner()
    args = ["rl", MODEL, "--gpus", "64", "--prompts", "64", "--input-len", "512", "--output-len", "2048",
            "--train", "megatron tp2 ep8", "--rollout", "vllm tp1", "--placement", "disaggregated",
            "--mode", "one-step-off", "--search-split"]  # fmt: skip
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["split"] and data["step_s"] == data["split"][0]["step_s"]
    assert sum(p["time_s"] for p in data["critical_path"]) == pytest.approx(data["step_s"])
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and "critical path" in text.output and "GPU idle" in text.output


@pytest.mark.parametrize(
    "extra",
    [
        ["--mode", "bogus"],
        ["--algo", "dpo"],
        ["--rollout", "vllm tp8 ep8"],  # the serving simulator has no expert parallelism
        ["--placement", "disaggregated", "--rollout-gpus", "64"],
        ["--length-median", "2"],
        ["--train", "megatron tp3"],  # 64 GPUs are not a multiple of tp3
    ],
)
def test_bad_input_is_one_line_exit_2(extra: list[str]) -> None:
    res = CliRunner().invoke(app, ["rl", MODEL, "--gpus", "64", *extra])
    assert res.exit_code == 2
    assert res.output.strip().startswith("error:") and len(res.output.strip().splitlines()) == 1
