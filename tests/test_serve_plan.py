"""`serve-plan`: the deployment search over the serving simulator. Its plans must hold up when `serve`
simulates them again, its closed-form prunes must be bounds of what the simulator does, a tighter SLO must
never buy more goodput, and a search that finds nothing names the constraint that bound."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import load_gpu
from shardscope.models.catalog import load_model
from shardscope.serve.engine import load_engine
from shardscope.serve.estimate import serve_estimate
from shardscope.serve.export import serve_launch
from shardscope.serve.page import curve
from shardscope.serve.plan import NoPlan, _shape, ep_sizes, gpu_counts, serve_plan, tp_sizes
from shardscope.serve.workload import make_requests

runner = CliRunner()
# Small searches: Llama-3.1-8B on at most 4 H100s, 300 requests a run (a few seconds each)
SMALL = dict(model="llama3.1-8b", gpu="H100", gpus=4, rate=10.0, num_prompts=300, slo_ttft_ms=500.0)


@pytest.fixture(scope="module")
def loose():
    return serve_plan(**SMALL, slo_tpot_ms=20.0)


def _resimulate(p, plan_kwargs: dict):
    return serve_estimate(
        plan_kwargs["model"], gpu=plan_kwargs["gpu"], gpus=p.gpus, tp=p.tp, pp=p.pp, ep=p.ep, rate=plan_kwargs["rate"],
        num_prompts=plan_kwargs["num_prompts"], max_num_seqs=p.max_num_seqs, disaggregate=p.disaggregate,
        slo_ttft_ms=plan_kwargs["slo_ttft_ms"], slo_tpot_ms=plan_kwargs["slo_tpot_ms"],
    )  # fmt: skip


def test_every_plan_meets_the_slos_when_serve_simulates_it_again(loose) -> None:
    """Each plan, run again through `serve_estimate` with its own settings, gives the same numbers and is
    within both p90 targets; the plans are ranked by goodput per GPU and use at most --gpus."""
    assert loose.plans
    kw = dict(SMALL, slo_tpot_ms=20.0)
    for p in loose.plans:
        r = _resimulate(p, kw)
        assert r.ttft.p90_ms <= kw["slo_ttft_ms"] and r.tpot.p90_ms <= kw["slo_tpot_ms"]
        assert r.ttft.p90_ms == pytest.approx(p.ttft_p90_ms, rel=1e-12)
        assert r.tpot.p90_ms == pytest.approx(p.tpot_p90_ms, rel=1e-12)
        assert r.goodput_requests_per_s / p.gpus == pytest.approx(p.goodput_requests_per_s_per_gpu, rel=1e-12)
        assert p.gpus <= SMALL["gpus"] and p.gpus == p.tp * p.replicas
    per_gpu = [p.goodput_requests_per_s_per_gpu for p in loose.plans]
    assert per_gpu == sorted(per_gpu, reverse=True)


def test_the_best_plan_is_reproduced_by_the_serve_command_it_prints(loose) -> None:
    best = loose.plans[0]
    args = best.serve_command.split()[1:] + ["--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["goodput_requests_per_s"] / out["gpus"] == pytest.approx(best.goodput_requests_per_s_per_gpu)
    assert out["tpot"]["p90_ms"] <= 20.0 and out["ttft"]["p90_ms"] <= SMALL["slo_ttft_ms"]


@pytest.mark.parametrize("tight_ms", [12.0, 9.0])
def test_a_tighter_tpot_never_buys_more_goodput_per_gpu(loose, tight_ms: float) -> None:
    try:
        tight = serve_plan(**SMALL, slo_tpot_ms=tight_ms)
    except NoPlan:
        return  # nothing meets it: trivially not more
    best_tight = tight.plans[0].goodput_requests_per_s_per_gpu
    assert best_tight <= loose.plans[0].goodput_requests_per_s_per_gpu + 1e-12
    assert all(p.tpot_p90_ms <= tight_ms for p in tight.plans)


def test_the_search_does_not_skip_a_better_deployment_it_could_have_simulated() -> None:
    """Brute force over the same small space (every TP, replica count, P:D and max seqs, each fully
    simulated): nothing meeting the SLOs beats the search's best."""
    kw = dict(SMALL, slo_tpot_ms=15.0)
    best = serve_plan(**kw).plans[0].goodput_requests_per_s_per_gpu
    eng = load_engine("vllm", load_gpu("H100"))
    ladder = sorted({64, 128, 256, 512, eng.max_num_seqs})
    for g in gpu_counts(4, 8):
        for tp in tp_sizes(32, 4, 8):
            if g % tp:
                continue
            r = g // tp
            for p in range(r):
                for s in ladder:
                    res = serve_estimate(
                        "llama3.1-8b", gpus=g, tp=tp, rate=kw["rate"], num_prompts=kw["num_prompts"], max_num_seqs=s,
                        disaggregate=f"{p}:{r - p}" if p else None, slo_ttft_ms=kw["slo_ttft_ms"],
                        slo_tpot_ms=kw["slo_tpot_ms"],
                    )  # fmt: skip
                    if res.ttft.p90_ms <= kw["slo_ttft_ms"] and res.tpot.p90_ms <= kw["slo_tpot_ms"]:
                        assert res.goodput_requests_per_s / g <= best + 1e-12, (g, tp, p, s)


@pytest.mark.parametrize(
    ("model", "tp", "seqs"),
    [
        ("llama3.1-8b", 1, 256),
        ("llama3.1-70b", 4, 64),
        ("qwen3-30b-a3b", 2, 512),
        ("gpt-oss-20b", 2, 1024),  # sliding-window layers
        ("mistral-7b", 1, 128),
    ],
)
def test_closed_form_prunes_are_bounds_of_the_simulation(model: str, tp: int, seqs: int) -> None:
    """What the search prunes on is never beaten by the simulator: one prompt's prefill alone is at most
    every TTFT, one decode step alone at most every TPOT, and the capacity bound at least the offline
    (saturated) throughput of a replica, colocated and as a prefill or decode pool."""
    spec = load_model(model)
    eng = load_engine("vllm", load_gpu("H100"))
    reqs = make_requests(400, "poisson", 5.0, 1024, 256)
    for ep in ep_sizes(spec, tp):
        sh = _shape(spec, "H100", tp, ep, eng, seqs, "bf16", 2, reqs)
        assert sh.fits
        loaded = serve_estimate(model, gpus=tp, tp=tp, ep=ep, rate=5.0, num_prompts=400, max_num_seqs=seqs)
        assert sh.ttft_min_s * 1e3 <= loaded.ttft.p50_ms * (1 + 1e-9)
        assert sh.decode_min_s * 1e3 <= loaded.tpot.p50_ms * (1 + 1e-9)
        offline = serve_estimate(model, gpus=tp, tp=tp, ep=ep, num_prompts=400, max_num_seqs=seqs)
        assert sh.ttft_min_s * 1e3 <= offline.ttft.mean_ms and sh.decode_min_s * 1e3 <= offline.tpot.p50_ms
        assert sh.replica_rps >= offline.requests_per_s
        split = serve_estimate(model, gpus=2 * tp, tp=tp, ep=ep, num_prompts=400, max_num_seqs=seqs, disaggregate="1:1")
        assert min(sh.prefill_rps, sh.decode_rps) >= split.requests_per_s


def test_too_tight_tpot_exits_2_with_one_line_naming_the_decode_step() -> None:
    res = runner.invoke(
        app, ["serve-plan", "llama3.1-70b", "--gpus", "8", "--rate", "2", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "5"]
    )
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith("error: no deployment of llama3.1-70b on ≤8 H100 meets TPOT ≤ 5 ms")
    assert "the fastest decode step is" in lines[0] and "at TP8" in lines[0]
    step = float(lines[0].split("the fastest decode step is ")[1].split(" ms")[0])
    alone = serve_estimate("llama3.1-70b", gpus=8, tp=8, num_prompts=1, rate=1.0)  # one request: its decode step
    assert step == pytest.approx(alone.decode_iteration_s * 1e3, abs=0.05)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--slo-ttft-ms", "10"], "TTFT ≤ 10 ms: the fastest prefill of one prompt alone is"),
        (["--rate", "500"], "carries 500 requests/s"),
        (["--gpus", "1"], "on ≤1 H100 fits"),
    ],
)
def test_other_bounds_are_named_in_one_line(args: list[str], needle: str) -> None:
    base = {"--gpus": "8", "--rate": "2", "--slo-ttft-ms": "2000", "--slo-tpot-ms": "60"}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    res = runner.invoke(app, ["serve-plan", "llama3.1-70b", *(x for kv in base.items() for x in kv)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--engine", "nosuch"], "unknown engine 'nosuch'"),
        (["--gpu", "H1000"], "unknown GPU 'H1000'"),
        (["--precision", "fp4"], "unknown precision"),
        (["--rate", "0"], "needs --rate"),
        (["--slo-tpot-ms", "-1"], "--slo-tpot-ms must be positive"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    base = ["serve-plan", "llama3.1-8b", "--rate", "1", "--slo-tpot-ms", "50", *args]
    res = runner.invoke(app, base)
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(app, ["serve-plan", "nosuch-model", "--rate", "1", "--slo-tpot-ms", "50"])
    assert res.exit_code == 2 and "unknown model 'nosuch-model'" in res.stderr
    res = runner.invoke(app, ["serve-plan", "llama3.1-8b", "--slo-tpot-ms", "50"])
    assert res.exit_code == 2 and "needs --rate" in res.stderr


def test_moe_model_gets_expert_parallel_plans() -> None:
    """qwen3-30b-a3b (128 experts): EP = TP is searched at every TP > 1 and EP over all the replicas (wide
    EP) wherever there are several; EP plans meet the SLOs when re-simulated, and EP changes the simulated
    step (whole experts per GPU, not slices)."""
    kw = dict(model="qwen3-30b-a3b", gpu="H100", gpus=8, rate=20.0, num_prompts=300, slo_ttft_ms=500.0,
              slo_tpot_ms=15.0, top=10)  # fmt: skip
    result = serve_plan(**kw)
    ep_plans = [p for p in result.plans if p.ep > 1]
    assert ep_plans, [(p.tp, p.ep) for p in result.plans]
    assert any(p.ep > p.tp for p in ep_plans)
    for p in ep_plans:
        assert p.ep in (p.tp, p.tp * p.replicas)
        r = _resimulate(p, kw)
        assert r.ep == p.ep and r.tpot.p90_ms <= 15.0 and r.ttft.p90_ms <= 500.0
        assert r.tpot.p90_ms == pytest.approx(p.tpot_p90_ms, rel=1e-12)
    tp_only = serve_estimate("qwen3-30b-a3b", gpus=4, tp=4, rate=20.0, num_prompts=300)
    with_ep = serve_estimate("qwen3-30b-a3b", gpus=4, tp=4, ep=4, rate=20.0, num_prompts=300)
    assert with_ep.tpot.p90_ms != tp_only.tpot.p90_ms
    assert with_ep.memory.kv_blocks == tp_only.memory.kv_blocks  # same weights per GPU
    assert ep_sizes(load_model("llama3.1-70b"), 8) == (1,)
    assert ep_sizes(load_model("qwen3-30b-a3b"), 2, 4) == (1, 2, 8)


def test_ep_in_serve_is_checked() -> None:
    with pytest.raises(ShardscopeError, match="has no experts"):
        serve_estimate("llama3.1-8b", gpus=2, tp=2, ep=2, num_prompts=1)
    with pytest.raises(ShardscopeError, match="valid: a multiple of --tp 4"):
        serve_estimate("qwen3-30b-a3b", gpus=4, tp=4, ep=2, num_prompts=1)
    res = runner.invoke(app, ["serve", "qwen3-30b-a3b", "--gpus", "2", "--tp", "2", "--ep", "2", "--num-prompts", "5"])
    assert res.exit_code == 0 and "TP 2 (EP 2)" in res.stdout


def test_json_has_typed_fields_with_units() -> None:
    res = runner.invoke(
        app,
        ["serve-plan", "llama3.1-8b", "--gpus", "2", "--rate", "5", "--num-prompts", "200", "--slo-ttft-ms", "500",
         "--slo-tpot-ms", "20", "--top", "3", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["model"] == "llama3.1-8b" and out["max_gpus"] == 2 and out["rate_requests_per_s"] == 5.0
    assert out["slo_ttft_ms"] == 500.0 and out["slo_tpot_ms"] == 20.0 and out["slo_percentile"] == 90.0
    assert isinstance(out["search_s"], float) and out["search_s"] > 0
    assert out["searched"]["simulated"] >= out["searched"]["met"] >= len(out["plans"]) >= 1
    assert 1 <= len(out["plans"]) <= 3
    types = {
        "gpus": int, "tp": int, "ep": int, "replicas": int, "prefill_replicas": int, "decode_replicas": int,
        "max_num_seqs": int, "requests_per_s": float, "goodput_requests_per_s": float,
        "goodput_requests_per_s_per_gpu": float, "goodput_pct": float, "ttft_p90_ms": float, "tpot_p90_ms": float,
        "ttft_p99_ms": float, "tpot_p99_ms": float, "e2e_p90_ms": float, "serve_command": str,
    }  # fmt: skip
    for p in out["plans"]:
        for key, kind in types.items():
            assert isinstance(p[key], kind), (key, p[key])
        assert p["disaggregate"] is None or p["disaggregate"] == f"{p['prefill_replicas']}:{p['decode_replicas']}"
        assert p["goodput_requests_per_s_per_gpu"] == pytest.approx(p["goodput_requests_per_s"] / p["gpus"])
        assert 0.0 <= p["goodput_pct"] <= 100.0 and math.isfinite(p["ttft_p90_ms"])


def test_table_has_the_columns() -> None:
    res = runner.invoke(
        app,
        ["serve-plan", "llama3.1-8b", "--gpus", "2", "--rate", "5", "--num-prompts", "200", "--slo-tpot-ms", "20"],
        env={"COLUMNS": "140"},
    )
    assert res.exit_code == 0, res.output
    for col in ("GPUs", "TP", "EP", "replicas", "P:D", "max seqs", "req/s", "req/s/GPU", "TTFT p90", "TPOT p90"):
        assert col in res.stdout
    assert "goodput" in res.stdout and "shardscope serve llama3.1-8b" in res.stdout


def test_serve_plan_searches_with_a_cached_shared_prefix() -> None:
    """A prompt prefix every request shares, cached by vLLM, makes a TTFT target reachable that no
    deployment meets without it; the plan's command carries it and reproduces the plan."""
    kw = dict(gpu="H100", gpus=1, rate=2, input_len=2048, output_len=64, num_prompts=200, slo_ttft_ms=60, top=2)
    with pytest.raises(ShardscopeError, match="no deployment"):
        serve_plan("llama3.1-8b", **kw)
    best = serve_plan("llama3.1-8b", prefix_len=1536, **kw).plans[0]
    assert "--prefix-len 1536" in best.serve_command and best.ttft_p90_ms <= 60
    again = serve_estimate(
        "llama3.1-8b", gpu="H100", gpus=best.gpus, tp=best.tp, rate=2, input_len=2048, output_len=64,
        num_prompts=200, max_num_seqs=best.max_num_seqs, prefix_len=1536,
    )  # fmt: skip
    assert again.ttft.p90_ms == pytest.approx(best.ttft_p90_ms)


def test_a_model_no_node_holds_gets_pipelined_plans() -> None:
    """Llama-3.1-405B in BF16 fits no TP group of one 8-GPU H100 node: the search adds pipeline stages and
    finds TP8 x PP2 on 16 GPUs, whose plan re-simulates to the same numbers; its export is refused in one line."""
    kw = dict(model="llama3.1-405b", gpu="H100", gpus=16, rate=1.0, num_prompts=200, slo_ttft_ms=3000.0,
              slo_tpot_ms=100.0, top=3)  # fmt: skip
    result = serve_plan(**kw)
    best = result.plans[0]
    assert (best.tp, best.pp, best.gpus) == (8, 2, 16) and "--pp 2" in best.serve_command
    again = _resimulate(best, kw)
    assert again.tpot.p90_ms == pytest.approx(best.tpot_p90_ms, rel=1e-12)
    # the report page's curve runs the pipelined replica too: at the searched rate, the plan's numbers
    at_rate = next(pt for pt in curve(result, best) if pt["factor"] == 1.0)
    assert at_rate["tpot_p90_ms"] == pytest.approx(best.tpot_p90_ms, rel=1e-12)
    with pytest.raises(ShardscopeError, match="pipelined plan"):
        serve_launch(result, "llama3.1-405b")


def test_sampled_prompts_bounds_hold_and_the_plan_resimulates() -> None:
    """GRPO-style rollouts (8 samples a prompt, the rate counting prompts): the closed forms the search prunes
    on stay bounds of the simulation when the samples share their prompt's cached KV, the plan re-simulates
    to its numbers through the command it prints, and the table says what the rate counts."""
    spec = load_model("llama3.1-8b")
    eng = load_engine("vllm", load_gpu("H100"))
    reqs = make_requests(100, "poisson", 1.0, 2048, 128, samples=8)
    sh = _shape(spec, "H100", 1, 1, eng, 256, "bf16", 2, reqs, shared_samples=8)
    plain = _shape(spec, "H100", 1, 1, eng, 256, "bf16", 2, reqs)
    assert sh.replica_rps > plain.replica_rps and sh.ttft_min_s < plain.ttft_min_s
    offline = serve_estimate("llama3.1-8b", gpus=1, tp=1, num_prompts=100, input_len=2048, output_len=128,
                             max_num_seqs=256, samples=8)  # fmt: skip
    assert sh.replica_rps >= offline.requests_per_s
    assert sh.ttft_min_s * 1e3 <= offline.ttft.p50_ms * (1 + 1e-9)
    kw = dict(gpu="H100", gpus=2, rate=1.0, input_len=2048, output_len=128, num_prompts=60, slo_tpot_ms=30.0,
              top=2, samples=8)  # fmt: skip
    result = serve_plan("llama3.1-8b", **kw)
    best = result.plans[0]
    assert "--samples 8" in best.serve_command and result.samples == 8
    # the rate counts prompts; the JSON states both, each under its own unit
    assert result.to_dict()["rate_prompts_per_s"] == 1.0 and result.to_dict()["rate_requests_per_s"] == 8.0
    res = runner.invoke(app, best.serve_command.split()[1:] + ["--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["num_prompts"] == 60 * 8 and out["tpot"]["p90_ms"] == pytest.approx(best.tpot_p90_ms)
    table = runner.invoke(app, ["serve-plan", "llama3.1-8b", *[f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]])
    assert table.exit_code == 0, table.output
    assert "1 prompts/s x 8 samples" in table.stdout
