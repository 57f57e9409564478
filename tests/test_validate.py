"""Validation against the public measured runs: schema, conversions, and honest accuracy bounds."""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import replace

import pytest
from published_runs import PUBLISHED_DENSE_RUNS, PUBLISHED_MOE_RUNS, published_case  # tests/ is on the path (conftest)
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.graph.build import build_stage_graph
from shardscope.step.caveats import EAGER_FLAT_MOE, EAGER_FLEX_MOE, GRAPHED_MOE
from shardscope.validate.runner import read_rows, run_validation, spearman


@pytest.fixture(scope="module")
def public_report(public_csv):
    """The public rows predicted once for every test of this module that only reads the report."""
    return run_validation(public_csv)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None


def test_every_row_is_predicted_or_skipped_with_reason(public_csv, public_report):
    report = public_report
    with open(public_csv, newline="") as fh:
        n_rows = len(list(csv.DictReader(fh)))
    assert len(report.rows) + len(report.skipped) == n_rows
    assert all(s["reason"] for s in report.skipped)
    assert {r.source for r in report.rows} >= {"MOSAICML_LLMFOUNDRY", "NARAYANAN2021", "LLAMA3_PAPER"}


def test_dense_accuracy_bounds(public_report):
    """Issue target: MAPE <= 15% over the public dense rows (tokens/s, TFLOP/s, MFU). The bound is the
    target itself, not the current figure, so a regression beyond it fails."""
    report = public_report
    dense = [r for r in report.rows if r.arch == "dense"]
    mape = sum(abs(r.error_pct) for r in dense) / len(dense)
    assert mape <= 15.0, mape
    assert report.summary["source"]["NARAYANAN2021"].spearman > 0.8


def test_the_eager_moe_caveat_quotes_the_validation(public_report):
    """The estimate's warning for eager MoE layers quotes the error the model makes on the public MoE
    rows, split by whether a CUDA graph captured the whole MoE layer and, if not, by dispatcher:
    recomputed here, so a model change that moves the figures must move the warning too."""
    groups = public_report.summary["moe_layers"]
    quoted = {"eager flat": EAGER_FLAT_MOE, "eager deepep/hybridep": EAGER_FLEX_MOE, "graphed": GRAPHED_MOE}
    for name, figure in quoted.items():
        assert groups[name].n == figure.rows
        assert groups[name].mape_pct == pytest.approx(figure.mape_pct, abs=0.05)
        assert groups[name].bias_pct == pytest.approx(figure.bias_pct, abs=0.05)
        ratios = [r.measured / r.predicted for r in public_report.rows if r.moe_layers == name]
        low, median, high = figure.ratio
        assert (min(ratios), statistics.median(ratios), max(ratios)) == pytest.approx((low, median, high), abs=0.005)
    assert groups[""].n + sum(groups[name].n for name in quoted) == len(public_report.rows)


def test_json_output(public_csv):
    r = CliRunner().invoke(app, ["validate", str(public_csv), "--json"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert set(d) == {"rows", "skipped", "summary"}
    row = d["rows"][0]
    assert set(row) >= {"id", "metric", "measured", "predicted", "error_pct", "fits", "required_gib", "capacity_gib"}
    assert isinstance(row["fits"], bool) and row["required_gib"] > 0 and row["capacity_gib"] > 0
    assert {"id", "reason"} == set(d["skipped"][0])
    assert "metric" in d["summary"] and "source" in d["summary"] and "gpu" in d["summary"]


def test_any_file_with_the_schema(tmp_path):
    csv_text = (
        "id,source,model,params_b,arch,layers,hidden,ffn_hidden,heads,kv_heads,vocab,experts,topk,seq_len,gpu,"
        "num_gpus,tp,pp,vpp,cp,ep,dp,zero_or_fsdp,recompute,micro_batch,global_batch,precision,metric,value,"
        "flops_def,notes\n"
        "X-1,MINE,llama3_8b,8,dense,32,4096,14336,32,8,128256,,,8192,H100,8,1,1,,1,,8,fsdp(FULL_SHARD),none,1,8,"
        "bf16,tokens_per_sec_per_gpu,8000,,\n"
        "X-2,MINE,llama3_8b,8,dense,32,4096,14336,32,8,128256,,,8192,TPU9,8,1,1,,1,,8,,,1,8,bf16,"
        "tokens_per_sec_per_gpu,8000,,\n"
    )
    path = tmp_path / "mine.csv"
    path.write_text(csv_text)
    report = run_validation(path)
    assert [r.id for r in report.rows] == ["X-1"]
    assert report.skipped[0]["id"] == "X-2" and "unknown GPU" in report.skipped[0]["reason"]


def test_wan_rows_run_their_framework(public_csv):
    """The Wan table's Megatron-Core rows run TE's cuDNN attention and fused activations; its NeMo
    AutoModel rows run diffusers' model code under FSDP2: torch SDPA (FlashAttention-2, its first
    backend), unfused activations, and FSDP sharding instead of Megatron's distributed optimizer."""
    from shardscope.validate.rows import case_from_row

    wan = [r for r in read_rows(public_csv) if r["model"].lower().startswith("wan")]
    auto = [r for r in wan if r["stack"] == "nemo-automodel"]
    assert len(wan) == 5 and len(auto) == 2
    for row in wan:
        plan = case_from_row(row).plan
        if row["stack"] == "nemo-automodel":
            assert (plan.attention_kernel, plan.fused_activation, plan.fsdp) == ("fa2", False, True), row["id"]
        else:
            assert (plan.attention_kernel, plan.fused_activation) == ("auto", True), row["id"]


def test_megatron_bridge_flop_definition_reproduces_published_ratios(public_csv):
    """Each Megatron-Bridge table row gives tokens/s/GPU and Model TFLOP/s/GPU of one run: their ratio is
    the source's own FLOPs per token. Our rendering of its definition (per container release) must
    reproduce it for every model: dense, Qwen3 MoE, DeepSeek-V3 (MLA, MTP) and GPT-OSS (whose count
    changed in 26.06)."""
    from shardscope.analytic.step import estimate_step
    from shardscope.validate.metrics import flops_per_step
    from shardscope.validate.rows import SkipRow, case_from_row

    with open(public_csv, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["source"] in ("MBRIDGE_PERF", "NEMO_2407_PERF")]
    by_config: dict[tuple, dict[str, dict[str, str]]] = {}
    for r in rows:
        key = tuple(v for k, v in r.items() if k not in ("id", "metric", "value", "flops_def", "notes"))
        by_config.setdefault(key + (r["notes"].split(";")[0],), {})[r["metric"]] = r
    checked, errors = set(), []
    for pair in by_config.values():
        if {"tokens_per_sec_per_gpu", "tflops_per_gpu"} - set(pair):
            continue
        row = pair["tflops_per_gpu"]
        try:
            case = case_from_row(row)
        except SkipRow:  # blank architecture cells
            continue
        est = estimate_step(case.model, case.cluster, case.plan)
        ours = flops_per_step(row["flops_def"], case.model, est, case.stack) / est.tokens_per_step
        published = float(row["value"]) * 1e12 / float(pair["tokens_per_sec_per_gpu"]["value"])
        # the published figures are rounded to 3-4 significant digits; MB-012 is 2.3% off its pair
        assert ours == pytest.approx(published, rel=0.025), (row["id"], ours, published)
        errors.append(abs(ours / published - 1))
        checked.add(row["model"])
    assert sorted(errors)[-2] < 0.01  # all but one within 1%
    assert {"gpt_oss_120b", "qwen3_30b_a3b", "deepseek_v3", "llama3_70b"} <= checked


# Measured runs the memory model still puts over capacity, and why (closing notes, README "Memory check").
KNOWN_MEMORY_MISSES = {
    # Llama 3 70B GB200 Megatron-FSDP, no recompute, 40 of 80 layers' activations offloaded (the recipe):
    # 184.7 GiB against 184.0, 0.4% over
    "MB-069",
    "MB-070",
}


def test_measured_runs_fit(public_report):
    """Ground truth for memory: every row is a run that was measured, so it fit on its GPUs. Only the
    documented misses may be predicted over capacity; a memory regression adds rows and fails."""
    over = {r.id for r in public_report.not_fitting()}
    assert over <= KNOWN_MEMORY_MISSES, sorted(over - KNOWN_MEMORY_MISSES)
    assert {"MB-035", "MB-045", "MB-051", "MB-057", "MB-083"}.isdisjoint(over)  # fit once the SwiGLU is fused


def test_runs_recompute_at_least_their_stated_policy_and_as_much_as_they_must_to_fit(public_csv):
    """A row whose recompute column is blank recomputes at least what its flags state (the recipe's) and
    more where that does not fit its layout: a measured run fit. GPT-OSS-120B at MBS 4 on 64 H100 (its
    recipe has MBS 1) needs 144 GiB of 80 without recompute and runs with full recompute; at EP 8 on 64
    B200 (the preset has EP 64), 201 of 179 GiB, it runs with selective recompute. Where the stated policy
    fits it stays (DeepSeek-V3 on GB200 keeps its MLA up-projection recompute); one less does not fit."""
    from shardscope.analytic.step import estimate_step
    from shardscope.errors import ShardscopeError
    from shardscope.validate.rows import _least_recompute_that_fits, case_from_row

    rows = {r["id"]: r for r in read_rows(public_csv)}
    expected = {"MB-001": "full", "MB-031": "selective", "MB-053": "selective"}
    below = {"full": "selective", "selective": "none"}
    for row_id, recompute in expected.items():
        case = case_from_row(rows[row_id])
        assert case.plan.recompute == recompute, row_id
        assert estimate_step(case.model, case.cluster, case.plan).fits, row_id
        if row_id != "MB-053":  # the least that fits: one policy less does not
            less = replace(case.plan, recompute=below[recompute], recompute_modules=())
            assert not estimate_step(case.model, case.cluster, less).fits, row_id
    mb001 = case_from_row(rows["MB-001"])
    with pytest.raises(ShardscopeError, match="recompute floor"):
        _least_recompute_that_fits(mb001.model, mb001.cluster, mb001.plan, floor="most")  # type: ignore[arg-type]
    assert case_from_row(rows["MB-053"]).plan.recompute_modules == ("mla_up_proj",)


def test_published_moe_runs_carry_their_stated_settings():
    """The measured MoE runs of `validation/published_moe_runs.csv` take the settings their sources state
    (`published_runs.yaml`): every row is predicted, and each plan has its run's dispatcher, overlap, CUDA
    graphs, recompute modules and pipeline layout (MR-003's puts the MTP module in a chunk of its own)."""
    report = run_validation(PUBLISHED_MOE_RUNS)
    assert report.skipped == []
    assert len(report.rows) == len(read_rows(PUBLISHED_MOE_RUNS))
    mr3 = published_case("MR-003").plan
    assert (mr3.pp, mr3.vpp, mr3.mtp, mr3.mtp_chunk, mr3.mtp_rank) == (8, 4, True, 30, 6)
    assert mr3.pp_layout[-2:] == (0, 0) and sum(mr3.pp_layout) == 61
    dsv3 = published_case("MR-001").plan
    assert (dsv3.fp8_recipe, dsv3.ep_dispatch, dsv3.ep_comm_overlap) == ("mxfp8", "hybridep", False)
    assert dsv3.cuda_graphs == ("attn", "moe_router", "moe_preprocess") and dsv3.offload_optimizer
    assert dsv3.recompute_modules == ("mlp",) and len(dsv3.pp_layout) == 16
    off, on = (published_case(i).plan for i in ("QA-001", "QA-002"))
    assert (off.ep_comm_overlap, on.ep_comm_overlap) == (False, True)
    assert off.cuda_graphs == ("moe_router", "moe_preprocess") and off.zero == 1
    eager, graphed = (published_case(i).plan for i in ("QB-001", "QB-002"))
    assert (eager.ep_dispatch, eager.ep_comm_overlap, eager.cuda_graphs) == ("flat", False, ())
    assert graphed.cuda_graphs == ("attn", "moe_router", "moe_preprocess") and graphed.main_grads == "bf16"
    h100 = published_case("MC-001").plan
    assert (h100.tp, h100.pp, h100.vpp, h100.ep, h100.global_batch) == (2, 8, 4, 64, 16384)
    assert h100.recompute_modules == ("mla_up_proj", "mlp") and not h100.overlap_grad_reduce and h100.mtp
    assert len(h100.pp_layout) == 32 and h100.optimizer_moments == "bf16"
    for rid, chunks in (("MC-002", 16), ("MC-003", 24), ("MS-001", 16), ("MS-004", 48)):
        card = published_case(rid).plan  # full-iteration graphs, 1F1B overlap, MXFP8
        assert (card.cuda_graphs, card.ep_comm_overlap, card.fp8_recipe) == (("full_iteration",), True, "mxfp8")
        assert len(card.pp_layout) == chunks
    # GB300 / B300 rows of the perf summaries take their recipes from megatron_bridge_recipes.yaml
    qwen235 = published_case("MS-004")
    assert qwen235.cluster.gpu.name == "GB300" and sum(qwen235.plan.pp_layout) == 94
    b300 = published_case("MS-005")
    assert b300.cluster.gpu.name == "B300" and (b300.plan.pp, b300.plan.ep, b300.plan.micro_batch) == (8, 8, 2)
    assert b300.plan.recompute_modules == ("mla_up_proj",) and b300.plan.ep_dispatch == "hybridep"
    assert b300.plan.pp_layout == (8, 8, 8, 8, 8, 8, 8, 5) and b300.plan.mtp


def test_dense_gb300_runs():
    """Megatron-Bridge's dense GB300 rows (`validation/published_dense_runs.csv`) with their recipes'
    settings: FP8 parameters gathered in FP8, the 405B recipe's pipeline layout (embedding and loss as
    slots), Megatron-FSDP with a quarter of the 70B's layers' activations offloaded, the 8B's full-iteration
    graph. Every run whose table layout is its recipe's fits, and those runs are within 10% each (they
    check the GB300 catalog entry on dense GEMM-bound work: FP8 GEMMs at cuBLASLt's measured rate, at the
    maximum clock the GB300 holds at its rated 1,400 W). MD-008, whose table layout (MBS 2, no
    interleaving) is not its recipe's and would not fit without recompute, recomputes as much as it must."""
    report = run_validation(PUBLISHED_DENSE_RUNS)
    assert report.skipped == [] and {r.gpu for r in report.rows} == {"GB300"}
    assert report.not_fitting() == []
    assert published_case("MD-008").plan.recompute != "none"
    as_recipe = [r for r in report.rows if r.id not in ("MD-004", "MD-008", "MD-010", "MD-011")]
    assert all(abs(r.error_pct) < 10 for r in as_recipe), [(r.id, round(r.error_pct, 1)) for r in as_recipe]
    big = published_case("MD-001").plan
    assert big.fp8_params and big.pp_layout == (3,) + (4,) * 30 + (3,)
    fsdp = published_case("MD-005").plan
    assert (fsdp.zero, fsdp.offload_activations, fsdp.fp8_recipe) == (3, 0.25, "tensorwise")
    assert published_case("MD-011").plan.cuda_graphs == ("full_iteration",)
    assert published_case("MD-011").plan.fp8_recipe == "mxfp8"


def test_kernels_per_step_match_the_nsight_count_of_the_qwen3_ab():
    """The rank-0 Nsight profile of one step of the Qwen3-30B-A3B A/B (QA-001: 16 H100, EP 16, 64 micro-
    batches of 4,096 tokens, 48 layers) ran 463,348 kernels (Megatron-Bridge
    skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md @067f987df). The op graph's kernels per phase
    (`op_kernels`: the router's 31, one GEMM per expert forward and two backward, flash attention's 1 + 3),
    with one per collective, add up to within 10% of it: the kernel gaps `op_time_s` charges are the
    measured step's."""
    from shardscope.costs.compute import op_kernels
    from shardscope.graph.build import build_stage_graph

    case = published_case("QA-001")
    plan = case.plan
    graph = build_stage_graph(case.model, plan, case.cluster.gpu.arch)

    def kernels(group) -> int:
        return sum(op_kernels(op, bwd, plan) for op in group.ops for bwd in (False, True)) + len(group.comms)

    micro_batches = plan.global_batch // (plan.dp * plan.micro_batch)
    per_micro_batch = sum(kernels(graph.layers[k]) for k in graph.kinds) + kernels(graph.embedding)
    per_micro_batch += kernels(graph.head)
    assert micro_batches == 64 and len(graph.kinds) == 48
    assert micro_batches * per_micro_batch == pytest.approx(463_348, rel=0.10)


def test_qwen3_ab_reduces_gradients_in_bf16():
    """QA-003 is the perf recipe `qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config`, whose `_benchmark_common`
    reduces gradients in BF16 (Megatron-Bridge @067f987df): FP32 main gradients would hold 6.2 GiB more."""
    from shardscope.analytic.step import estimate_step

    case = published_case("QA-003")
    assert case.plan.main_grads == "bf16"
    bf16 = estimate_step(case.model, case.cluster, case.plan).memory.peak_gib
    fp32 = estimate_step(case.model, case.cluster, replace(case.plan, main_grads="fp32")).memory.peak_gib
    assert fp32 - bf16 == pytest.approx(6.2, abs=0.1)


@pytest.mark.xfail(
    strict=True,
    reason="known miss: -5.9%; with TE 2.18's fused loss counted as its code keeps it (an fp32 gradient, "
    "6 bytes a logit at its peak) some 3.6 GiB of the measured peak are not accounted for",
)
def test_peak_memory_of_the_qwen3_ab_as_measured():
    """QA-003: rank-0 peak allocated memory of the Qwen3-30B-A3B A/B with the overlap on was 62.166 GiB
    (Megatron-Bridge SKILL.md and card.yaml @067f987df)."""
    from shardscope.analytic.step import estimate_step

    case = published_case("QA-003")
    assert estimate_step(case.model, case.cluster, case.plan).memory.peak_gib == pytest.approx(62.166, rel=0.05)


def test_in_place_cross_entropy_frees_the_fp32_logits():
    """On Qwen3-30B-A3B's last stage (4096 tokens x 151,936 vocab = 0.58 Gi logits): PyTorch's unfused loss
    keeps the fp32 log-softmax and holds two fp32 gradients at its backward (12 bytes a logit); Megatron's
    keeps its fp32 softmax and turns it into the gradient in place before the cast (6 bytes); Transformer
    Engine <= 2.16 keeps the bf16 logits, into which it wrote the gradient (4 bytes with the bf16 gradient);
    TE 2.18 (the 26.08 container of QA-003) keeps an fp32 gradient and casts it (6 bytes)."""
    from shardscope.analytic.step import estimate_step

    case = published_case("QA-003")
    assert case.plan.fused_cross_entropy and case.plan.fused_ce_fp32_grad
    logits_gib = 4096 * 151_936 / 2**30

    def peak(**kw: bool) -> float:
        return estimate_step(case.model, case.cluster, replace(case.plan, **kw)).memory.peak_gib

    te_2_16 = peak(fused_ce_fp32_grad=False)
    assert case.plan.vocab_parallel_loss
    assert peak(fused_cross_entropy=False) - te_2_16 == pytest.approx(2 * logits_gib, rel=0.02)
    pytorch_loss = peak(fused_cross_entropy=False, vocab_parallel_loss=False)
    assert pytorch_loss - te_2_16 == pytest.approx(8 * logits_gib, rel=0.02)
    assert peak() - te_2_16 == pytest.approx(2 * logits_gib, rel=0.02)


def test_token_drop_runs_carry_their_settings():
    """The 25.09 Megatron-Bridge rows (MT-*) pad every expert to capacity 1.0, so no dispatcher waits for
    the token counts; `cuda_graphs: true` graphs whole layers; DeepSeek-V3 on H100 is the one dropless,
    DeepEP run; the H100 blockwise run keeps BF16 weights; Qwen3-235B counts embedding and loss as layers."""
    drop = published_case("MT-008").plan
    assert drop.capacity_factor == 1.0 and drop.fp8_recipe == "tensorwise" and drop.fp8_all_gather
    assert set(drop.cuda_graphs) == {"attn", "moe"}
    case = published_case("MT-009")
    graph = build_stage_graph(case.model, case.plan, case.cluster.gpu.arch)
    assert not any(op.host_sync for unit in graph.layers.values() for op in unit.ops)
    dropless = published_case("MT-004").plan
    assert (dropless.capacity_factor, dropless.ep_dispatch, dropless.tp_comm_overlap) == (0.0, "deepep", False)
    blockwise = published_case("MT-005").plan
    assert (blockwise.fp8_recipe, blockwise.fp8_all_gather) == ("blockwise", False)
    for rid, chunks in (("MT-012", 16), ("MT-014", 32)):
        plan = published_case(rid).plan
        assert len(plan.pp_layout) == chunks and sum(plan.pp_layout) == 94


def _published_moe_errors(prefix: str) -> dict[str, float]:
    """Error (%) of each measured MoE run whose id starts with `prefix`."""
    report = run_validation(PUBLISHED_MOE_RUNS)
    return {r.id: r.error_pct for r in report.rows if r.id.startswith(prefix)}


def test_token_drop_runs_on_h100_as_measured():
    """The 25.09 H100 rows (token drop on Qwen3, dropless DeepEP on DeepSeek-V3) are within 20%."""
    errors = _published_moe_errors("MT-")
    assert all(abs(errors[i]) < 20 for i in ("MT-004", "MT-005", "MT-009", "MT-014")), errors


@pytest.mark.xfail(strict=True, reason="25.09 MoE runs on Blackwell are 18-50% slower than modelled, graphed or not")
def test_token_drop_runs_on_blackwell_as_measured():
    """The 25.09 GB200/B200 rows: token drop with padded experts, so no host synchronisation, and the Qwen3
    runs graph whole layers, so no host time at all; the model still puts them 33-50% faster than
    measured (DeepSeek-V3 on GB200 18%). The miss is on the GPU side; fails until it is found."""
    errors = _published_moe_errors("MT-")
    blackwell = ("MT-001", "MT-002", "MT-003", "MT-006", "MT-007", "MT-008", "MT-010", "MT-011", "MT-012", "MT-013")
    assert all(abs(errors[i]) < 25 for i in blackwell), errors


def test_dsv3_gb200_guide_final_state_as_measured():
    """The DeepSeek-V3 GB200 guide's HybridEP rows (graphed attention and router, 256 GPUs) are within 15%,
    predicted slow: the FP8 GEMMs at cuBLASLt's measured rate on a GB200 whose 1,200 W sustained clock is
    taken at B200's ratio (the GB300 runs' miss, smaller)."""
    errors = _published_moe_errors("MG-")
    assert set(errors) == {"MG-002", "MG-003", "MG-004", "MG-005", "MG-010", "MG-012"}
    assert all(-15 < errors[i] < 0 for i in ("MG-010", "MG-012")), errors


@pytest.mark.xfail(strict=True, reason="eager MoE host overhead is under-modelled: +19..+65% on the guide's rows")
def test_dsv3_gb200_guide_eager_rows_as_measured():
    """The same layout before HybridEP (NCCL all-to-all or DeepEP, eager or partly graphed) measured 540-663
    TFLOP/s. The model prices DeepEP's slower dispatch and combine across the NVL72 domain (MG-003..005 at
    +39, +30 and +19%) but puts the eager all-to-all row (MG-002) near the final state's time (+65%), and
    gives the dropped up-projection recompute and the CUDA graphs almost nothing (measured +8% and +9%).
    Fails until the eager overhead is found."""
    errors = _published_moe_errors("MG-")
    assert all(abs(errors[i]) < 25 for i in ("MG-002", "MG-003", "MG-004", "MG-005"))


def test_moonlight_recompute_study_peak_memory():
    """Megatron-Bridge's matched study of recompute modules (QR-001..QR-006 of `validation/published_moe_runs.csv`,
    skills/nemo-mbridge-perf-activation-recompute): Moonlight-16B-A3B on 8 H100, TP2 EP8, one micro-batch,
    only `recompute_modules` changing. Each module set's rank-0 peak allocated memory is predicted within 3%,
    and the savings rank as measured: `core_attn` frees nothing under fused attention (< 0.05 GiB), while
    `mla_up_proj` (q, k, v) and `moe_act` (the experts' activation output) each free 0.5 to 1 GiB."""
    from shardscope.analytic.step import estimate_step

    rows = {r["id"]: r for r in read_rows(PUBLISHED_MOE_RUNS)}
    peaks = {}
    for rid in ("QR-001", "QR-002", "QR-003", "QR-005"):
        case = published_case(rid)
        peak = estimate_step(case.model, case.cluster, case.plan).memory.peak_gib
        assert peak == pytest.approx(float(rows[rid]["value"]), rel=0.03), rid
        peaks[case.plan.recompute_modules] = peak
    control = published_case("QR-001").plan
    assert (control.recompute, control.tp, control.ep, control.grad_accum) == ("none", 2, 8, 1)
    assert not control.tp_comm_overlap and control.ep_dispatch == "flat"
    assert peaks[()] - peaks[("core_attn",)] < 0.05
    for modules in (("mla_up_proj",), ("moe_act",)):
        assert 0.5 < peaks[()] - peaks[modules] < 1.0, modules


@pytest.mark.xfail(
    strict=True, reason="known miss: the study measured no saving from layernorm recompute on top of moe_act"
)
def test_moonlight_layernorm_recompute_saves_what_the_study_measured():
    """QR-006 against QR-005: adding `layernorm` to `moe_act` left Moonlight's peak where it was (35.949 GB against
    35.941). The model drops the two norm outputs of every layer (0.4 GiB over 27 layers). The likelier reading:
    the study's peak is the maximum allocated after iteration 2's optimizer step, so it also covers iteration 1
    and both optimizer steps, and `mla_up_proj`, `mla_up_proj mlp`, `moe_act` and `layernorm moe_act` all sit
    within 0.05 GB of one another (35.90-35.95): a floor set outside the activations, which the model does not
    price. The same study on Nemotron 3 Nano measured `layernorm` freeing 1.01 GB on top of `moe`."""
    from shardscope.analytic.step import estimate_step

    act, both = (published_case(i) for i in ("QR-005", "QR-006"))
    saved = (
        estimate_step(act.model, act.cluster, act.plan).memory.peak_gib
        - estimate_step(both.model, both.cluster, both.plan).memory.peak_gib
    )
    assert saved < 0.05


def test_held_out_runs_are_all_predicted():
    """The held-out measured runs (`validation/heldout_runs.csv`, sources never used to build the model)
    are read like any other file: every row predicted, none skipped; docs/accuracy.md reports their errors."""
    from pathlib import Path

    heldout = Path(__file__).resolve().parents[1] / "validation" / "heldout_runs.csv"
    report = run_validation(heldout)
    assert report.skipped == [] and len(report.rows) == 98
    assert {r.stack for r in report.rows} == {"torchtitan", "nemo", "nemo-automodel"}


def test_the_mi300x_caveat_holds_against_its_measured_runs():
    """The MI300X's catalog caveat ("about half as fast as this model estimates") is said with every
    training estimate on it and quoted from the held-out MI300X runs: a model change that moves them past
    it must move the caveat too."""
    from pathlib import Path

    import shardscope
    from shardscope.hardware.catalog import load_gpu

    heldout = Path(__file__).resolve().parents[1] / "validation" / "heldout_runs.csv"
    rows = [r for r in run_validation(heldout).rows if r.gpu == "MI300X" and r.metric == "tokens_per_sec_per_gpu"]
    ratios = [r.measured / r.predicted for r in rows]
    assert len(rows) == 3 and all(0.4 < x < 0.6 for x in ratios)
    caveat = load_gpu("MI300X").caveat
    assert "about half as fast" in caveat
    assert caveat in shardscope.estimate("llama3.1-8b", "MI300X", 8).warnings
    assert not any("MI300X" in w for w in shardscope.estimate("llama3.1-8b", "H100", 8).warnings)


def test_a_row_whose_model_a_framework_would_refuse_is_skipped_with_its_reason(tmp_path):
    header = (
        "id,source,model,params_b,arch,layers,hidden,ffn_hidden,heads,kv_heads,vocab,experts,topk,seq_len,gpu,"
        "num_gpus,tp,pp,vpp,cp,ep,dp,zero_or_fsdp,recompute,micro_batch,global_batch,precision,metric,value,"
        "flops_def,notes\n"
    )
    row = (
        "X-3,MINE,mymodel,8,dense,32,4096,14336,32,{kv},128256,,,8192,H100,8,1,1,,1,,8,,none,1,8,bf16,"
        "tokens_per_sec_per_gpu,8000,,\n"
    )
    path = tmp_path / "mine.csv"
    path.write_text(header + row.format(kv=8) + row.format(kv=7).replace("X-3", "X-4"))
    report = run_validation(path)
    assert [r.id for r in report.rows] == ["X-3"]
    assert report.skipped[0]["id"] == "X-4" and "KV heads" in report.skipped[0]["reason"]
