"""Serving simulator against closed forms that must hold: one request alone, Little's law, vLLM's KV
capacity worked by hand, throughput against batch size, and the `serve` command."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.serve.cost import (
    Batch,
    Deployment,
    IterationCost,
    expected_experts_hit,
    kv_bytes_per_token,
    memory_plan,
    weights_bytes_per_gpu,
)
from shardscope.serve.engine import load_engine
from shardscope.serve.estimate import serve_estimate
from shardscope.serve.metrics import percentile, weighted_percentile
from shardscope.serve.simulator import simulate_replica, window_keys
from shardscope.serve.workload import Request, make_requests


def _setup(model: str, gpu: str = "H100", tp: int = 1, engine: str = "vllm"):
    cluster = make_cluster(gpu, tp)
    eng = load_engine(engine, cluster.gpu)
    d = Deployment(load_model(model), cluster, tp)
    return d, eng, IterationCost(d, eng), memory_plan(d, eng)


def test_a_graphed_decode_step_pays_its_kernel_gaps_and_an_eager_one_its_launches() -> None:
    """A CUDA graph removes the host's launches, not the GPU's gap between dependent kernels: a decode step
    of Llama-3.1-8B over TP8 in a graph costs its GEMMs, attention, all-reduces and the streaming kernels plus
    a gap per kernel. Outside a graph vLLM's host issues each kernel from Python, and with 1 GB of weights a
    GPU the step waits for those launches."""
    from shardscope.costs.efficiency import KERNEL_GAP_S
    from shardscope.serve.cost import KERNELS_PER_LAYER

    d, eng, cost, _ = _setup("llama3.1-8b", tp=8)
    b = Batch(decode_seqs=4, decode_kv=4 * 1000, decode_kv_window=4 * 1000, sampled=4)
    work = cost._linear_s(4, 4) + cost.attention_s(b)
    kernels = d.model.layers * KERNELS_PER_LAYER
    graphed = cost.time_s(b) - eng.host_s_per_iteration
    assert graphed > work + kernels * KERNEL_GAP_S
    assert graphed == pytest.approx(work + kernels * KERNEL_GAP_S, rel=0.02)  # 4 tokens stream little
    eager = IterationCost(d, replace(eng, cuda_graph_max_batch=0)).time_s(b) - eng.host_s_per_iteration
    assert eager == pytest.approx(kernels * eng.host_s_per_kernel) and eager > graphed


@pytest.mark.parametrize(("model", "prompt", "out"), [("llama3.1-8b", 1000, 50), ("mistral-7b", 4000, 200)])
def test_single_request_is_prefill_plus_decode_iterations(model: str, prompt: int, out: int) -> None:
    """Alone, a request takes one prefill iteration (which samples the first token) and then n−1 decode
    iterations, the j-th reading prompt + j keys (mistral-7b: crossing its 4096-token sliding window)."""
    d, eng, cost, mem = _setup(model)
    w = d.model.attention_window
    run = simulate_replica([Request(0.0, prompt, out)], cost, eng, mem.kv_blocks)
    pairs = prompt * (prompt + 1) / 2
    prefill = cost.time_s(Batch(prompt, pairs, window_keys(0, prompt, w), sampled=1))
    decode = sum(cost.decode_time_s(1, prompt + j, min(prompt + j, w) if w else prompt + j) for j in range(1, out))
    assert run.first_token_s[0] == pytest.approx(prefill, rel=1e-12)
    assert run.finish_s[0] == pytest.approx(prefill + decode, rel=1e-12)
    assert sum(c for _, c in run.itl) == out - 1
    assert run.preemptions == 0


def test_chunked_prefill_splits_long_prompt_at_the_token_budget() -> None:
    d, eng, cost, mem = _setup("llama3.1-8b")
    budget = eng.max_num_batched_tokens
    run = simulate_replica([Request(0.0, 2 * budget + 10, 2)], cost, eng, mem.kv_blocks)
    chunks = [(0, budget), (budget, budget), (2 * budget, 10)]
    expected = sum(
        cost.time_s(Batch(n, window_keys(c, n, 0), window_keys(c, n, 0), sampled=int(c + n == 2 * budget + 10)))
        for c, n in chunks
    )
    assert run.first_token_s[0] == pytest.approx(expected, rel=1e-12)


def test_littles_law_on_the_simulated_queue() -> None:
    """Time-average requests in the system (integrated by the event loop) = arrival rate × mean E2E."""
    rate = 12.0
    r = serve_estimate("llama3.1-8b", "H100", 1, rate=rate, num_prompts=6000, input_len=512, output_len=128)
    assert r.preemptions == 0 and r.mean_in_system > 5  # a real queue, not an empty system
    assert r.mean_in_system == pytest.approx(rate * r.e2e.mean_ms / 1e3, rel=0.04)


def test_kv_capacity_matches_vllm_formula_by_hand() -> None:
    """Llama-3.1-8B on one H100 under vLLM 0.33 defaults (H100 tier: 8192 tokens, 1024 sequences):
    blocks = (0.92 × HBM − weights − profile peak − non-torch − graph pool) / (16 tokens × KV bytes)."""
    d, eng, _, mem = _setup("llama3.1-8b")
    assert (eng.max_num_batched_tokens, eng.max_num_seqs, eng.block_size) == (8192, 1024, 16)
    gib = 2**30
    weights = 8_030_261_248 * 2  # bf16 checkpoint (published parameter count)
    # gate/up output (2 x 14336) and SiLU·up output (14336), residual and normed input, 1024 rows of fp32 logits
    peak = 8192 * 3 * 14336 * 2 + 2 * 8192 * 4096 * 2 + 1024 * 128256 * 4
    pool = 0.92 * 79.6 * gib - weights - peak - 0.5 * gib - 1.0 * gib
    kv_per_token = 32 * 2 * 8 * 128 * 2  # layers × (K, V) × kv heads × head dim × bf16 = 128 KiB
    assert mem.kv_bytes_per_token == kv_per_token
    assert mem.kv_blocks == math.floor(pool / (16 * kv_per_token))


def test_kv_per_token_shards_over_tp_and_mla_replicates() -> None:
    _, _, _, one = _setup("llama3.1-70b", tp=4)
    _, _, _, eight = _setup("llama3.1-70b", tp=8)
    assert one.kv_bytes_per_token == 2 * eight.kv_bytes_per_token  # 8 KV heads: 2 per GPU at TP 4, 1 at TP 8
    d = Deployment(load_model("deepseek-v3"), make_cluster("H200", 8), 8, "fp8")
    from shardscope.serve.cost import kv_bytes_per_token

    assert kv_bytes_per_token(d) == 61 * (512 + 64) * 2  # latent + RoPE key, every rank


def test_offline_throughput_rises_with_batch_until_memory_bound() -> None:
    """More concurrent sequences raise offline throughput while the KV cache holds them; past that, the
    batch cannot grow (the cache is full, requests are preempted) and neither does throughput."""
    tput, usage = [], []
    for seqs in (1, 4, 16, 64, 256, 1024):  # Llama-3.1-8B on one H100 holds ~177 requests of 2560 tokens
        r = serve_estimate("llama3.1-8b", "H100", 1, num_prompts=600, input_len=2048, output_len=512,
                           max_num_seqs=seqs)  # fmt: skip
        tput.append(r.output_tokens_per_s)
        usage.append(r.max_kv_usage)
    fits = [u < 0.9 for u in usage]
    assert fits[:4] == [True] * 4 and not fits[-1], usage
    for i in range(1, len(tput)):
        if fits[i]:  # the batch grew and still fits: throughput rises
            assert tput[i] > 1.2 * tput[i - 1], tput
        elif not fits[i - 1]:  # both memory-bound: no gain
            assert tput[i] < 1.1 * tput[i - 1], tput


def test_decode_iteration_is_memory_bound_at_small_batch() -> None:
    """Decode at batch 1 and 8 streams the same weights: time grows far less than the batch."""
    _, _, cost, _ = _setup("llama3.1-8b")
    one = cost.decode_time_s(1, 1000, 1000)
    eight = cost.decode_time_s(8, 8000, 8000)
    assert eight < 1.3 * one


def test_block_phases_count_new_blocks_exactly() -> None:
    """The stretch's block count (O(block size)) equals the per-sequence ceiling arithmetic."""
    import random

    from shardscope.serve.simulator import _block_phases, _new_blocks

    rng = random.Random(1)
    for _ in range(500):
        bs = rng.choice([1, 16, 32])
        contexts = [rng.randrange(0, 300) for _ in range(rng.randrange(1, 20))]
        k = rng.randrange(0, 100)
        brute = sum(-(-(c + k) // bs) - -(-c // bs) for c in contexts)
        assert _new_blocks(_block_phases(contexts, bs), k, bs) == brute


def test_expected_experts_hit() -> None:
    assert expected_experts_hit(128, 8, 1) == pytest.approx(8)
    assert expected_experts_hit(128, 8, 10_000) == pytest.approx(128)
    assert 8 < expected_experts_hit(128, 8, 4) < 32


def test_percentiles_match_numpy_definition() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.0 + 0.6 * 6.0)
    expanded = sorted([1.0] * 3 + [2.0] * 5 + [7.0] * 2)
    for q in (50, 90, 99):
        assert weighted_percentile([(2.0, 5), (1.0, 3), (7.0, 2)], q) == pytest.approx(percentile(expanded, q))


def test_sharegpt_like_is_seeded_and_bounded() -> None:
    a = make_requests(2000, "poisson", 5.0, dataset="sharegpt-like", seed=3)
    assert a == make_requests(2000, "poisson", 5.0, dataset="sharegpt-like", seed=3)
    assert all(4 <= r.input_len <= 1024 and r.output_len >= 4 and r.input_len + r.output_len <= 2048 for r in a)
    mean_in = sum(r.input_len for r in a) / len(a)
    assert 150 < mean_in < 250


def test_tpot_excludes_first_token_and_concurrency_mode_runs() -> None:
    r = serve_estimate("llama3.1-8b", "H100", 2, concurrency=8, num_prompts=64, input_len=256, output_len=64)
    assert r.dp == 2 and r.arrivals == "concurrency"
    assert r.e2e.mean_ms == pytest.approx(r.ttft.mean_ms + 63 * r.tpot.mean_ms, rel=1e-9)


def test_trtllm_reserves_whole_requests_and_never_preempts() -> None:
    """Under GUARANTEED_NO_EVICT the same overloaded offline run that makes vLLM preempt makes TRT-LLM
    wait instead; an FP8 KV cache holds twice the tokens."""
    kw = dict(num_prompts=300, input_len=4000, output_len=1000)
    vllm = serve_estimate("llama3.1-8b", "H100", 1, engine="vllm", **kw)
    trt = serve_estimate("llama3.1-8b", "H100", 1, engine="trtllm", **kw)
    assert vllm.preemptions > 0 and trt.preemptions == 0
    fp8 = serve_estimate("llama3.1-8b", "H100", 1, engine="trtllm", kv_dtype="fp8", **kw)
    assert fp8.memory.kv_bytes_per_token * 2 == trt.memory.kv_bytes_per_token
    assert fp8.memory.kv_blocks == pytest.approx(2 * trt.memory.kv_blocks, abs=1)


runner = CliRunner()


def test_cli_serve_json() -> None:
    res = runner.invoke(app, ["serve", "llama3.1-70b", "--gpu", "H100", "--gpus", "8", "--tp", "4", "--engine",
                              "vllm", "--rate", "4", "--input-len", "1024", "--output-len", "256",
                              "--num-prompts", "100", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["dp"] == 2 and out["memory"]["kv_blocks"] > 0 and out["rate"] == 4
    assert out["ttft"]["p99_ms"] >= out["ttft"]["p50_ms"] > 0


def test_cli_serve_table() -> None:
    res = runner.invoke(app, ["serve", "llama3.1-8b", "--gpus", "1", "--num-prompts", "20", "--engine", "sglang"])
    assert res.exit_code == 0, res.output
    assert "KV blocks per replica" in res.stdout and "TTFT" in res.stdout


@pytest.mark.parametrize(
    ("model", "args", "needle"),
    [
        ("llama3.1-8b", ["--engine", "vlm"], "valid: sglang, trtllm, vllm"),
        ("llama3.1-405b", ["--tp", "1", "--gpus", "1"], "does not fit"),
        ("llama3.1-8b", ["--gpus", "6", "--tp", "4"], "not a multiple"),
        ("llama3.1-8b", ["--spec-decode", "mtp:2"], "acceptance within 0..1"),
        ("llama3.1-70b", ["--tp", "4", "--spec-decode", "draft:llama3.1-405b:2:0.5"], "use a smaller draft"),
        ("llama3.1-8b", ["--disaggregate", "2:1"], "do not split"),
        ("llama3.1-8b", ["--slo-tpot-ms", "-1"], "must be positive"),
    ],
)
def test_cli_serve_bad_input_exits_2(model: str, args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["serve", model, *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


# ---- validation against the public serving file -------------------------------------------------------------
PUBLIC_INFERENCE = Path(__file__).resolve().parents[1] / "validation" / "inference_public.csv"

# MAPE (%) per metric / engine / GPU on the public file, without the TRT-LLM 0.17 offline rows other than
# Llama-3.1-8B (the full file takes a minute: `shardscope validate validation/inference_public.csv`).
# Recomputed, not tuned: a change of the cost model or the simulator shows here. The online rows run the
# 500 requests their table states (the project copy's load cells say so; the shared file leaves it out).
PINNED_MAPE = {
    "mean_itl_ms / trtllm@0.14 / H100": 16.27,
    "mean_ttft_ms / trtllm@0.14 / H100": 22.68,
    "output_throughput_tokens_per_s / trtllm@0.14 / H100": 11.2,
    "prompt_time_ms / (blank) / A100-80GB": 38.87,
    "prompt_time_ms / (blank) / H100": 45.99,
    "request_throughput_req_per_s / trtllm@0.14 / H100": 12.23,
    "throughput_tokens_per_s / trtllm@0.17 / A100-80GB": 3.49,
    "throughput_tokens_per_s / trtllm@0.17 / GH200": 6.7,
    "throughput_tokens_per_s / trtllm@0.17 / H100": 7.48,
    "throughput_tokens_per_s / trtllm@0.17 / H200": 6.99,
    "throughput_tokens_per_s / trtllm@0.17 / L40S": 5.71,
    "token_time_ms_per_token / (blank) / A100-80GB": 22.42,
    "token_time_ms_per_token / (blank) / H100": 44.54,
    "total_token_throughput_tokens_per_s / trtllm@0.14 / H100": 11.18,
}


def _public_rows_csv(path: Path, keep) -> Path:
    """The public inference rows for which `keep(row)` holds, written to `path`."""
    with PUBLIC_INFERENCE.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if keep(r)]
        fields = reader.fieldnames
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def _public_subset(tmp_path: Path) -> Path:
    return _public_rows_csv(
        tmp_path / "inference_subset.csv", lambda r: not r["id"].startswith("trt017") or r["model"] == "LLaMA v3.1 8B"
    )


def test_public_inference_mape_is_pinned(tmp_path: Path) -> None:
    from shardscope.serve.validate import run_inference_validation

    report = run_inference_validation(_public_subset(tmp_path))
    got = {k: round(s.mape_pct, 2) for k, s in report.summary["metric/engine/gpu"].items()}
    assert got == pytest.approx(PINNED_MAPE, abs=0.02)
    reasons = {s["reason"] for s in report.skipped}
    assert reasons == {"model '13B GPT-style (llm-analysis test-13b config)' is not in the catalog"}
    assert all(r.note == "release 0.14 not shipped; ran trtllm@0.17's settings" for r in report.rows
               if r.engine == "trtllm@0.14")  # fmt: skip


def test_validation_reads_settings_from_columns_only(tmp_path: Path) -> None:
    """Changing id, source and notes changes no prediction; the static batch rows are the closed form."""
    from shardscope.serve.validate import run_inference_validation

    with PUBLIC_INFERENCE.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if r["id"] in ("splitwise-0001", "splitwise-0002", "trt017-tput-0002")]
        fields = reader.fieldnames
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for path, scramble in ((a, False), (b, True)):
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for r in rows:
                w.writerow(r | ({"id": "x" + r["id"], "source": "?", "notes": "batch 999, fp4"} if scramble else {}))
    pa, pb = run_inference_validation(a), run_inference_validation(b)
    assert [r.predicted for r in pa.rows] == [r.predicted for r in pb.rows]
    d, eng, cost, mem = _setup("llama2-70b", "A100-80GB", tp=2)
    prompt = cost.time_s(Batch(512, 512 * 513 / 2, 512 * 513 / 2, sampled=1))
    row = next(r for r in pa.rows if r.id == "splitwise-0001")
    assert row.metric == "prompt_time_ms"
    # the static batch runs eager kernels without host cost; the engine's adds its host time per iteration
    assert row.predicted == pytest.approx((prompt - eng.host_s_per_iteration) * 1e3, rel=1e-9)


def test_a_prefill_measured_under_the_compute_floor_is_named_and_kept(tmp_path: Path) -> None:
    """A prompt batch measured faster than its GEMMs run at the GPUs' dense peak cannot be what the row says:
    the report names it (the floor worked by hand: 2 FLOPs per weight and token over TP x peak) and keeps it
    in the MAPE; a plausible row is not named."""
    from shardscope.serve.validate import run_inference_validation

    path = _public_rows_csv(tmp_path / "floor.csv", lambda r: r["id"] in ("splitwise-0001", "splitwise-0025"))
    report = run_inference_validation(path)
    spec = load_model("llama2-70b")
    weights = spec.params_active - spec.embedding_params - spec.lm_head_params
    floor_ms = 2 * weights * 64 * 512 / (2 * make_cluster("A100-80GB", 1).gpu.bf16_tflops * 1e12) * 1e3
    by_id = {r.id: r for r in report.rows}
    assert by_id["splitwise-0025"].measured < floor_ms  # 64 prompts of 512 tokens on two A100s in 0.8 s
    assert by_id["splitwise-0025"].below_floor_ms == pytest.approx(floor_ms, rel=1e-9)
    assert by_id["splitwise-0001"].below_floor_ms == 0.0
    assert report.overall.n == 2  # kept in the MAPE


def test_cli_validate_dispatches_inference_file(tmp_path: Path) -> None:
    with PUBLIC_INFERENCE.open(newline="") as fh:
        lines = fh.readlines()
    small = tmp_path / "small.csv"
    small.write_text("".join(lines[:2] + [ln for ln in lines if ln.startswith("splitwise-00")][:4]))
    res = CliRunner().invoke(app, ["validate", str(small), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["rows"]) == 5 and data["summary"]["metric"]
    res = CliRunner().invoke(app, ["validate", str(small), "--no-rows"])
    assert res.exit_code == 0 and "MAPE by metric" in res.output


# ---- SLOs and goodput, trace, speculative decoding, disaggregation ------------------------------------------
def test_goodput_counts_requests_meeting_both_slos() -> None:
    kw = dict(gpus=2, tp=1, rate=20.0, num_prompts=300, input_len=512, output_len=64)
    free = serve_estimate("llama3.1-8b", **kw)
    assert free.goodput_requests_per_s is None
    loose = serve_estimate("llama3.1-8b", slo_ttft_ms=1e9, slo_tpot_ms=1e9, **kw)
    assert loose.goodput_requests_per_s == pytest.approx(loose.requests_per_s, rel=1e-12)
    tight = serve_estimate("llama3.1-8b", slo_ttft_ms=free.ttft.p50_ms, slo_tpot_ms=free.tpot.p90_ms, **kw)
    assert 0 < tight.goodput_requests_per_s < tight.requests_per_s
    # at most the requests under the TTFT median: half of them
    assert tight.goodput_requests_per_s <= 0.5 * tight.requests_per_s + 1 / tight.duration_s
    never = serve_estimate("llama3.1-8b", slo_ttft_ms=1e-6, **kw)
    assert never.goodput_requests_per_s == 0.0
    assert json.loads(json.dumps(tight.to_dict()))["goodput_requests_per_s"] == tight.goodput_requests_per_s


def test_trace_is_chrome_json_with_a_slice_per_iteration(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    r = serve_estimate("llama3.1-8b", gpus=2, rate=10.0, num_prompts=50, input_len=300, output_len=40, trace_file=out)
    events = json.loads(out.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == r.iterations
    assert {e["pid"] for e in slices} == {0, 1}
    assert sum(e["args"]["prefill_tokens"] for e in slices) == 50 * 300
    assert sum(e["args"]["decode_seqs"] for e in slices) == 50 * 39
    assert any(e["ph"] == "C" and e["name"] == "KV usage" for e in events)
    assert sum(1 for e in events if e["ph"] == "M") == 2


@pytest.mark.parametrize("path", ["/nonexistent-dir/t.json", "."])
def test_trace_to_a_bad_path_is_one_line_exit_2(path: str) -> None:
    res = CliRunner().invoke(app, ["serve", "llama3.1-8b", "--trace", path, "--num-prompts", "5"])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("error:")


def test_spec_decode_tokens_per_step_closed_form() -> None:
    from shardscope.serve.cost import parse_spec_decode

    assert parse_spec_decode("mtp:0.7").tokens_per_step == pytest.approx(1.7)
    assert parse_spec_decode("draft:llama3.2-1b:3:0.5").tokens_per_step == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert parse_spec_decode("mtp:2:1").tokens_per_step == 3.0
    assert parse_spec_decode("mtp:4:0").tokens_per_step == 1.0
    for bad in ("mtp", "mtp:1.5", "draft:x:0:0.5", "eagle:0.5", "draft::2:0.5"):
        with pytest.raises(ShardscopeError):
            parse_spec_decode(bad)


def test_spec_decode_at_zero_acceptance_is_decode_plus_verify_overhead() -> None:
    """a = 0: every step emits one token, so a lone request takes prefill + (n−1) verify steps, each the
    (k+1)-token verify pass plus the proposals: slower than plain decode, by exactly that overhead."""
    from shardscope.serve.cost import SpecIterationCost, parse_spec_decode

    prompt, out = 800, 30
    d, eng, cost, mem = _setup("llama3.1-8b")
    spec = SpecIterationCost(d, eng, spec=parse_spec_decode("mtp:2:0"))
    plain = serve_estimate("llama3.1-8b", gpus=1, num_prompts=1, input_len=prompt, output_len=out)
    sd = serve_estimate("llama3.1-8b", gpus=1, num_prompts=1, input_len=prompt, output_len=out, spec_decode="mtp:2:0")
    steps = [spec.decode_time_s(1, prompt + j, prompt + j) for j in range(1, out)]
    assert sd.ttft.mean_ms == pytest.approx(plain.ttft.mean_ms, rel=1e-12)
    assert sd.e2e.mean_ms == pytest.approx(sd.ttft.mean_ms + sum(steps) * 1e3, rel=1e-9)
    for j in (1, out - 1):
        base = cost.decode_time_s(1, prompt + j, prompt + j)
        overhead = spec.decode_time_s(1, prompt + j, prompt + j) - base
        assert overhead >= spec.propose_s(1, prompt + j, prompt + j) > 0
    # with acceptance the same request needs fewer steps, and TPOT falls
    fast = serve_estimate(
        "llama3.1-8b", gpus=1, num_prompts=1, input_len=prompt, output_len=out, spec_decode="mtp:2:0.8"
    )
    assert fast.tpot.mean_ms < plain.tpot.mean_ms < sd.tpot.mean_ms


def test_draft_model_shares_the_kv_pool() -> None:
    plain = serve_estimate("llama3.1-70b", gpus=4, tp=4, num_prompts=4, input_len=100, output_len=20)
    sd = serve_estimate("llama3.1-70b", gpus=4, tp=4, num_prompts=4, input_len=100, output_len=20,
                        spec_decode="draft:llama3.1-8b:4:0.7")  # fmt: skip
    assert sd.memory.kv_blocks < plain.memory.kv_blocks
    assert sd.spec_decode == "draft:llama3.1-8b:4:0.7"


def test_disaggregated_single_request_ttft_is_prefill_plus_transfer() -> None:
    from shardscope.serve.estimate import kv_transfer_s

    prompt, out = 1500, 40
    kw = dict(gpus=8, tp=4, num_prompts=1, input_len=prompt, output_len=out)
    colo = serve_estimate("llama3.1-70b", **kw)
    dis = serve_estimate("llama3.1-70b", disaggregate="1:1", **kw)
    d, *_ = _setup("llama3.1-70b", tp=4)
    transfer = kv_transfer_s(d, prompt)
    assert dis.kv_transfer_s == pytest.approx(transfer)
    assert transfer > 0
    assert dis.ttft.mean_ms == pytest.approx(colo.prefill_s * 1e3 + transfer * 1e3, rel=1e-9)
    # the decode replica then decodes as a colocated one would
    assert dis.e2e.mean_ms - dis.ttft.mean_ms == pytest.approx(colo.e2e.mean_ms - colo.ttft.mean_ms, rel=1e-9)
    assert dis.disaggregate == "1:1"


def test_disaggregation_under_load_completes_every_request() -> None:
    r = serve_estimate("llama3.1-8b", gpus=8, tp=1, rate=30.0, num_prompts=600, input_len=700, output_len=90,
                       disaggregate="3:1", slo_ttft_ms=500, slo_tpot_ms=100)  # fmt: skip
    assert r.requests_per_s > 0 and r.disaggregate == "6:2"
    assert r.goodput_requests_per_s <= r.requests_per_s
    with pytest.raises(ShardscopeError, match="do not split"):
        serve_estimate("llama3.1-8b", gpus=8, disaggregate="2:1", num_prompts=5)


def test_kv_cache_dtype_follows_the_engine_unless_asked() -> None:
    """`--kv-dtype auto`: TensorRT-LLM runs an FP8 checkpoint with an FP8 KV cache (ModelOpt checkpoints carry
    it), vLLM keeps the model dtype; an explicit dtype wins. An FP8 KV cache holds twice the tokens."""
    gpu = make_cluster("H100", 1).gpu
    assert load_engine("trtllm", gpu).kv_dtype("auto", "fp8") == "fp8"
    assert load_engine("trtllm", gpu).kv_dtype("auto", "bf16") == "bf16"
    assert load_engine("vllm", gpu).kv_dtype("auto", "fp8") == "bf16"
    assert load_engine("trtllm", gpu).kv_dtype("bf16", "fp8") == "bf16"
    kw = dict(gpus=1, engine="trtllm", precision="fp8", num_prompts=50, input_len=128, output_len=64)
    auto = serve_estimate("llama3.1-8b", **kw)
    half = serve_estimate("llama3.1-8b", kv_dtype="bf16", **kw)
    assert (auto.kv_dtype, half.kv_dtype) == ("fp8", "bf16")
    assert auto.memory.kv_tokens == pytest.approx(2 * half.memory.kv_tokens, rel=0.01)
    with pytest.raises(ShardscopeError, match="valid: auto, bf16, fp8"):
        serve_estimate("llama3.1-8b", kv_dtype="int4", **kw)


def test_serve_prices_gemms_from_a_measured_profile() -> None:
    """`--profile`: GEMMs the profile covers are its measured times; the calibrated H100 (measured on a lent
    H100 with `shardscope calibrate`) runs decode-sized GEMMs at the weights' read rate, as the split-K GEMM
    model does: the decode steps agree within 10% without being the same numbers. A profile of another GPU is
    refused."""
    calibrated = Path(__file__).resolve().parents[1] / "validation" / "calibrate_h100.sql.gz"
    kw = dict(gpus=1, engine="trtllm", precision="fp8", num_prompts=200, input_len=128, output_len=512)
    plain = serve_estimate("llama3.1-8b", **kw)
    measured = serve_estimate("llama3.1-8b", profile=calibrated, **kw)
    assert measured.decode_iteration_s == pytest.approx(plain.decode_iteration_s, rel=0.1)
    assert measured.decode_iteration_s != plain.decode_iteration_s
    with pytest.raises(ShardscopeError, match="measured on H100, not H200"):
        serve_estimate("llama3.1-8b", gpu="H200", profile=calibrated, **kw)


def test_trtllm_leaves_a_configs_uniform_sliding_window_off() -> None:
    """TensorRT-LLM's KvCacheConfig.max_attention_window defaults to None, so Mistral-7B's `sliding_window`
    (4096, every layer) is not applied unless set: its layers attend over the whole context, and a decode
    at 20k tokens costs more than under vLLM, which applies it. GPT-OSS's windowed layer kinds run as built."""
    gpu = make_cluster("H100", 1).gpu
    trt, vllm = load_engine("trtllm", gpu), load_engine("vllm", gpu)
    mistral, oss = load_model("mistral-7b"), load_model("gpt-oss-20b")
    assert mistral.attention_window == 4096 and trt.serving_model(mistral).attention_window == 0
    assert vllm.serving_model(mistral) is mistral and trt.serving_model(oss) is oss
    cluster = make_cluster("H100", 1)
    full = IterationCost(Deployment(trt.serving_model(mistral), cluster, 1, "bf16"), trt)
    windowed = IterationCost(Deployment(mistral, cluster, 1, "bf16"), trt)
    assert full.window_layers == 0 and windowed.window_layers == 32
    # 64 sequences at 20k tokens: the KV reads dominate, over 20k keys instead of 4096
    assert full.decode_time_s(64, 64 * 20001, 64 * 20001) > 2 * windowed.decode_time_s(64, 64 * 20001, 64 * 4096)
    kw = dict(gpu="H100", gpus=1, rate=math.inf, num_prompts=8, input_len=20000, output_len=64)
    assert (
        serve_estimate("mistral-7b", engine="trtllm", **kw).prefill_s
        > 1.2 * serve_estimate("mistral-7b", engine="vllm", **kw).prefill_s
    )


def test_vllm_frees_the_blocks_windowed_layers_no_longer_read() -> None:
    """vLLM's hybrid KV cache manager shares one block pool among the layers and frees, per sliding-window
    layer, the blocks before its window (GPT-OSS: every other layer, 128 keys): a request holding c tokens
    takes a block of every full layer per 16 tokens and at most 9 of each windowed layer. With 4k-token
    prompts and 1k outputs the cache then holds all 256 requests at once, and the offline throughput rises."""

    from shardscope.serve.simulator import kv_block_units

    gpu = make_cluster("H100", 1).gpu
    vllm = load_engine("vllm", gpu)
    d = Deployment(load_model("gpt-oss-20b"), make_cluster("H100", 1), 1, "bf16")
    units, per_block = kv_block_units(IterationCost(d, vllm), vllm)
    layers = d.model.layers
    assert per_block == layers
    assert units(100) == layers * 7  # inside the window: every layer holds all its blocks
    assert units(8192) == layers // 2 * 512 + layers // 2 * (512 - (8192 - 128 + 1) // 16)
    kept = replace(vllm, kv_window_freed=False)
    assert kv_block_units(IterationCost(d, kept), kept)[1] == 1
    kw = dict(gpu="H100", gpus=1, rate=math.inf, num_prompts=256, input_len=4096, output_len=1024)
    freed = serve_estimate("gpt-oss-20b", engine="vllm", **kw)
    assert freed.max_kv_usage <= 1.0 and freed.output_tokens_per_s > 0
    # the same deployment with every layer holding the whole context
    import shardscope.serve.estimate as est

    original = est.load_engine
    est.load_engine = lambda spec, g: replace(original(spec, g), kv_window_freed=False)
    try:
        whole = serve_estimate("gpt-oss-20b", engine="vllm", **kw)
    finally:
        est.load_engine = original
    assert freed.preemptions == 0 < whole.preemptions
    assert freed.max_concurrency_at_full_length > 1.8 * whole.max_concurrency_at_full_length
    # with the checkpoint's MXFP4 experts the weights leave room for most requests either way
    assert freed.precision == "mxfp4" and freed.output_tokens_per_s > whole.output_tokens_per_s


def test_a_shared_prefix_is_computed_once_where_the_engine_caches_prefixes() -> None:
    """vLLM reuses the full KV blocks of a prompt prefix another request computed: a second request arriving
    after the first has finished prefills only the rest of its prompt, over keys that include the cached
    prefix (one iteration of that batch), and holds the prefix blocks shared. TensorRT-LLM's block reuse is
    off by default: both prefill the whole prompt."""
    cluster = make_cluster("H100", 1)
    d = Deployment(load_model("llama3.1-8b"), cluster, 1, "bf16")
    reqs = [Request(0.0, 1024, 4), Request(10.0, 1024, 4)]
    for name in ("vllm", "trtllm"):
        eng = load_engine(name, cluster.gpu)
        cost = IterationCost(d, eng)
        run = simulate_replica(reqs, cost, eng, memory_plan(d, eng).kv_blocks, prefix=700)
        ttft = [f - a for f, a in zip(run.first_token_s, run.arrival_s, strict=True)]
        whole = cost.time_s(Batch(1024, window_keys(0, 1024, 0), window_keys(0, 1024, 0), sampled=1))
        assert ttft[0] == pytest.approx(whole)
        if name == "vllm":
            cached = 700 // eng.block_size * eng.block_size  # full blocks only
            rest = 1024 - cached
            part = cost.time_s(Batch(rest, window_keys(cached, rest, 0), window_keys(cached, rest, 0), sampled=1))
            assert ttft[1] == pytest.approx(part) and part < 0.7 * whole
        else:
            assert ttft[1] == pytest.approx(whole)
    offline = dict(gpu="H100", gpus=1, rate=math.inf, num_prompts=400, input_len=4096, output_len=256)
    shared = serve_estimate("llama3.1-8b", prefix_len=3072, **offline)
    assert (
        shared.prefix_len == 3072
        and shared.output_tokens_per_s > 1.3 * serve_estimate("llama3.1-8b", **offline).output_tokens_per_s
    )
    with pytest.raises(ShardscopeError, match="--prefix-len"):
        serve_estimate("llama3.1-8b", prefix_len=4096, **offline)


def test_the_samples_of_a_prompt_share_its_kv_where_the_engine_caches_prefixes() -> None:
    """Eight samples of one 1,000-token prompt, offline. vLLM caches the full blocks a step will compute when
    it schedules them, so the first sample prefills the prompt and the seven scheduled after it in the same
    step only what lies past the cached full blocks; all eight get their first token from that one
    iteration. SGLang inserts a prefix after the forward that computed it: the same batch prefills the
    prompt eight times. The shared copy goes back to the pool when the group's last sample finishes."""
    cluster = make_cluster("H100", 1)
    d = Deployment(load_model("llama3.1-8b"), cluster, 1, "bf16")
    prompt, n = 1000, 8
    reqs = [Request(0.0, prompt, 5 + k, group=0) for k in range(n)]
    for name in ("vllm", "sglang"):
        eng = load_engine(name, cluster.gpu)
        run = simulate_replica(reqs, IterationCost(d, eng), eng, memory_plan(d, eng).kv_blocks, trace=True)
        first_prefill = run.timeline[0][2]
        tail = prompt - (prompt - 1) // eng.block_size * eng.block_size
        assert first_prefill == (prompt + (n - 1) * tail if name == "vllm" else n * prompt), name
        assert len(set(run.first_token_s)) == 1
        assert run.kv_usage[-1][1] == 0.0  # nothing held once every sample finished
    # KV: the shared prompt is held once, so a pool that holds one copy and the samples' own blocks runs
    # them all at once, where eight private copies must wait for each other
    eng = load_engine("vllm", cluster.gpu)
    bs = eng.block_size
    blocks = prompt // bs + n * (2 + 64 // bs)
    many = [Request(0.0, prompt, 64, group=0) for _ in range(n)]
    shared = simulate_replica(many, IterationCost(d, eng), eng, blocks)
    private = simulate_replica([Request(0.0, prompt, 64) for _ in range(n)], IterationCost(d, eng), eng, blocks)
    assert len(set(shared.first_token_s)) == 1 and shared.preemptions == 0
    assert len(set(private.first_token_s)) > 1 and private.end_s > shared.end_s


def test_serve_samples_groups_arrive_together_at_one_replica() -> None:
    reqs = make_requests(3, "poisson", rate=2.0, input_len=512, output_len=64, dataset="sharegpt-like", samples=4)
    assert len(reqs) == 12 and [r.group for r in reqs] == [g for g in range(3) for _ in range(4)]
    for g in range(3):
        group = reqs[4 * g : 4 * g + 4]
        assert len({(r.arrival_s, r.input_len) for r in group}) == 1  # one prompt, sent once
    assert len({r.output_len for r in reqs}) > 3  # each sample its own length
    from shardscope.serve.estimate import route

    assert route(reqs, 2) == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7]]
    kw = dict(gpu="H100", gpus=2, rate=math.inf, input_len=2048, output_len=256)
    grouped = serve_estimate("llama3.1-8b", num_prompts=32, samples=8, **kw)
    distinct = serve_estimate("llama3.1-8b", num_prompts=256, **kw)
    assert grouped.num_prompts == distinct.num_prompts == 256 and grouped.samples == 8
    assert grouped.duration_s < 0.8 * distinct.duration_s
    with pytest.raises(ShardscopeError, match="--samples"):
        serve_estimate("llama3.1-8b", num_prompts=4, samples=4, concurrency=8, gpus=1)


def test_cli_serve_states_its_sample_groups() -> None:
    args = ["serve", "llama3.1-8b", "--gpus", "1", "--num-prompts", "16", "--samples", "4", "--input-len", "1024",
            "--output-len", "32"]  # fmt: skip
    table = CliRunner().invoke(app, args, env={"COLUMNS": "140"})
    assert table.exit_code == 0 and "64 requests (16 prompts x 4 samples)" in table.stdout
    assert json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)["samples"] == 4
    bad = CliRunner().invoke(app, [a if a != "4" else "0" for a in args])
    assert bad.exit_code == 2 and "--samples" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_cli_serve_states_the_shared_prefix() -> None:
    args = ["serve", "llama3.1-8b", "--gpus", "1", "--rate", "2", "--num-prompts", "40", "--input-len", "1024",
            "--output-len", "32", "--prefix-len", "800"]  # fmt: skip
    table = CliRunner().invoke(app, args, env={"COLUMNS": "140"})
    assert table.exit_code == 0 and "shared prompt prefix" in table.stdout and "800 tokens" in table.stdout
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert doc["prefix_len"] == 800
    bad = CliRunner().invoke(app, [*args[:-1], "1024"])
    assert bad.exit_code == 2 and "--prefix-len" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_a_pipelined_replica_splits_weights_and_kv_over_its_stages() -> None:
    """TP8 x PP2: each GPU holds half the layers' weights and KV (plus the embedding or LM head at the
    ends), so the KV pool per replica more than doubles; one request's pass goes through both stages, its
    hidden states crossing the stage boundary once per pass."""
    spec = load_model("llama3.1-70b")
    cluster = make_cluster("H100", 16)
    one, two = Deployment(spec, cluster, 8, "bf16"), Deployment(spec, cluster, 8, "bf16", pp=2)
    ends = spec.embedding_params + spec.lm_head_params
    body = spec.params_total - ends
    assert weights_bytes_per_gpu(two) == pytest.approx((body / 2 + spec.lm_head_params) * 2 / 8)
    assert kv_bytes_per_token(two) == kv_bytes_per_token(one) / 2
    eng = load_engine("vllm", cluster.gpu)
    assert memory_plan(two, eng).kv_blocks > 2 * memory_plan(one, eng).kv_blocks
    hop = IterationCost(two, eng).time_s(Batch(decode_seqs=1, decode_kv=100, decode_kv_window=100, sampled=1))
    flat = IterationCost(one, eng).time_s(Batch(decode_seqs=1, decode_kv=100, decode_kv_window=100, sampled=1))
    assert hop > flat  # the same layers, and the inter-node hop


def test_pipeline_stages_keep_a_batch_in_flight_each() -> None:
    """Offline, a TP8 x PP2 replica on 16 GPUs runs two batches in flight: about twice the throughput of one
    TP8 replica on 8 GPUs, as much as two TP8 replicas on 16 (less the hop and the split KV pool)."""
    kw = dict(rate=math.inf, num_prompts=600, input_len=1024, output_len=256)
    one = serve_estimate("llama3.1-70b", gpus=8, tp=8, **kw)
    piped = serve_estimate("llama3.1-70b", gpus=16, tp=8, pp=2, **kw)
    replicas = serve_estimate("llama3.1-70b", gpus=16, tp=8, **kw)
    assert piped.pp == 2 and piped.dp == 1
    assert 1.6 < piped.output_tokens_per_s / one.output_tokens_per_s < 2.2
    assert piped.output_tokens_per_s == pytest.approx(replicas.output_tokens_per_s, rel=0.15)
    with pytest.raises(ShardscopeError, match="--disaggregate"):
        serve_estimate("llama3.1-70b", gpus=16, tp=4, pp=2, disaggregate="1:1", **kw)


def test_wide_ep_spreads_the_experts_over_data_parallel_attention_replicas() -> None:
    """DeepSeek-V3 in FP8 on 16 H100 as one TP1 replica per GPU, the MoE layers expert-parallel over all
    16 (vLLM's --data-parallel-size 16 --enable-expert-parallel): each GPU holds 16 of the 256 routed
    experts and its own copy of the rest; each MoE layer moves k copies of a replica's tokens to the
    experts' GPUs and back (all-to-all over two nodes)."""
    spec = load_model("deepseek-v3")
    cluster = make_cluster("H100", 16)
    d = Deployment(spec, cluster, 1, "fp8", ep=16)
    routed = spec.moe_layers * spec.moe.experts * spec.expert_params
    embed = spec.embedding_params + spec.lm_head_params
    assert weights_bytes_per_gpu(d) == pytest.approx(routed / 16 + (spec.params_total - routed - embed) + 2 * embed)
    eng = load_engine("vllm", cluster.gpu)
    batch = Batch(decode_seqs=64, decode_kv=64 * 1024, decode_kv_window=64 * 1024, sampled=64)
    two_nodes = IterationCost(d, eng).time_s(batch)
    fabric = replace(cluster, scaleout_gbps=1e6)  # a network that costs nothing
    assert IterationCost(replace(d, cluster=fabric), eng).time_s(batch) < 0.95 * two_nodes
    r = serve_estimate("deepseek-v3", gpu="H100", gpus=16, tp=1, ep=16, num_prompts=64, input_len=512, output_len=32)
    assert (r.dp, r.ep, r.precision) == (16, 16, "fp8") and r.output_tokens_per_s > 0
    for tp, ep in ((2, 3), (1, 32)):
        with pytest.raises(ShardscopeError, match="--ep"):
            serve_estimate("deepseek-v3", gpu="H100", gpus=16, tp=tp, ep=ep, num_prompts=8)


def test_online_rows_run_the_request_count_their_load_cell_states(tmp_path: Path) -> None:
    """An online row's "num_requests=N" sets how many requests the simulated benchmark sends; all sent at
    once (QPS=INF), half as many requests wait about half as long for their first token."""
    from shardscope.serve.validate import run_inference_validation

    def load(cell: str) -> float:
        path = _public_rows_csv(tmp_path / "online.csv", lambda r: r["id"] == "trt014-online-0147")
        text = path.read_text().replace("QPS=INF; num_requests=500", cell)
        assert cell in text
        path.write_text(text)
        (row,) = run_inference_validation(path).rows
        assert row.metric == "mean_ttft_ms"
        return row.predicted

    assert load("QPS=INF; num_requests=250") < 0.7 * load("QPS=INF; num_requests=500")


def test_held_out_serving_rows_are_all_predicted() -> None:
    """The held-out serving rows (`validation/inference_heldout.csv`: TensorRT-LLM's online table on H200 and
    its v1.0 offline tables on Hopper, Blackwell and the RTX PRO 6000, none in the public file) are read like
    the public file: every row predicted, none skipped; docs/accuracy.md reports their MAPE."""
    from shardscope.serve.validate import run_inference_validation

    held_out = PUBLIC_INFERENCE.with_name("inference_heldout.csv")
    report = run_inference_validation(held_out)
    assert report.skipped == [] and len(report.rows) == 340
    assert {r.engine for r in report.rows} == {"trtllm@0.14", "trtllm@1.0"}
    assert {r.gpu for r in report.rows} == {"H100", "H200", "B200", "GB200", "RTX-PRO-6000"}


def test_trtllm_fp8_linears_run_in_cublaslt_as_measured_on_blackwell():
    """TRT-LLM's per-tensor FP8 Linear runs cuBLASLt (`Engine.fp8_gemm_library`), measured on Blackwell at
    0.78-0.82 of the DeepGEMM rate the catalog's FP8 fraction is: an FP8 Llama decode step on a B200 is
    slower under TRT-LLM than under vLLM's CUTLASS GEMMs, by less than the GEMMs' own ratio; on an H100,
    whose per-tensor table is the FP8 fit, and in BF16 the two price the GEMMs alike."""
    from shardscope.serve import cost as serve_cost
    from shardscope.serve.engine import load_engine

    model = load_model("llama3.1-70b")

    def decode_s(gpu: str, engine: str, precision: str) -> float:
        cluster = make_cluster(gpu, 8)
        d = serve_cost.Deployment(model, cluster, 8, precision)
        return serve_cost.IterationCost(d, load_engine(engine, cluster.gpu)).decode_time_s(256, 2048, 0)

    b200 = decode_s("B200", "trtllm", "fp8") / decode_s("B200", "vllm", "fp8")
    assert 1.02 < b200 < 1.0 / 0.8
    for gpu, precision in (("H100", "fp8"), ("B200", "bf16")):
        # same GEMMs: the engines differ only in their other per-iteration costs, the same for both dtypes
        ratio = decode_s(gpu, "trtllm", precision) / decode_s(gpu, "vllm", precision)
        assert ratio == pytest.approx(decode_s(gpu, "trtllm", "bf16") / decode_s(gpu, "vllm", "bf16"), rel=0.02)
