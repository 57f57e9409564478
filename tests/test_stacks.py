"""Stacks: a run described as its user describes it (framework, release, stated flags), and nothing of
where a validation row came from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.plan.flags import parse_flags
from shardscope.plan.plan import plan_field_names
from shardscope.stacks import STACK_ONLY_KEYS, list_stacks, load_stack
from shardscope.validate.rows import case_from_row, recompute_of

SRC = Path(__file__).resolve().parents[1] / "src" / "shardscope"
MEASURED = Path(__file__).resolve().parents[1] / "validation" / "torchtitan_llama_step_h100.json"
NAMES = {"megatron", "nemo", "torchtitan", "nemo-automodel", "llm-foundry", "deepspeed", "hf"}


def test_every_stack_named_in_the_issue_loads_with_a_source_per_setting():
    stacks = {s.name: s for s in list_stacks()}
    assert set(stacks) >= NAMES
    for st in stacks.values():
        assert st.settings and set(st.settings) <= plan_field_names() | set(STACK_ONLY_KEYS)
        for key, setting in st.settings.items():
            assert len(setting.source) > 15, (st.name, key)
    assert load_stack("megatron@2021").value("attention_kernel") == "unfused"
    assert load_stack("megatron@2021").value("sharding") == "ddp"
    assert load_stack("megatron").value("sharding") == "zero1"


def test_releases_change_what_they_changed():
    assert load_stack("nemo@24.07").value("fp8_recipe") == "delayed"
    assert load_stack("nemo@24.07").value("flops_attention") == "full"
    assert load_stack("nemo@25.11").value("fp8_recipe") == "tensorwise"
    assert load_stack("nemo@25.11").value("fused_cross_entropy") is True
    assert load_stack("nemo@26.08").value("fused_ce_fp32_grad") is True  # TE 2.18
    assert not load_stack("nemo@25.11").value("fused_ce_fp32_grad", False)
    assert load_stack("nemo@26.08").value("cuda_graphs") == "full_iteration"


def test_torchtitan_compiles_its_loss_from_release_0_1():
    """torchtitan's 2024 main branch ran the loss eager under --compile (fp32 log-softmax kept, two fp32
    gradients at its backward); from v0.1.0 the loss is compiled with the model."""
    kw = dict(global_batch=8, seq_len=8192, compile=True)
    eager = shardscope.estimate("llama3.1-8b", "H100", 8, stack="torchtitan@0.0", **kw)
    compiled = shardscope.estimate("llama3.1-8b", "H100", 8, stack="torchtitan@0.1", **kw)
    assert eager.plan["compile"] and not eager.plan["compile_loss"] and compiled.plan["compile_loss"]
    logits_gib = 8192 * 128256 / 2**30
    # 8 bytes a logit more (2 kept, 6 in the backward), less where the compiled loss's peak is the output
    # layer's gathered weight and gradient instead
    assert 6 * logits_gib < eager.memory.peak_gib - compiled.memory.peak_gib <= 8 * logits_gib
    assert eager.step_time_s > compiled.step_time_s


def test_an_unknown_release_uses_the_nearest_known_one_and_says_so():
    st = load_stack("nemo@25.05")
    assert st.release == "25.04" and st.warnings and "nearest" in st.warnings[0]
    assert load_stack("nemo@30.01").release == "26.08"
    est = shardscope.estimate("llama3.1-8b", "H100", 8, global_batch=8, seq_len=4096, stack="nemo@25.05")
    assert any("nearest" in w for w in est.warnings) and est.stack == "nemo@25.04"


def test_unknown_stack_is_one_line_and_exit_2():
    with pytest.raises(ShardscopeError, match="choose one of"):
        load_stack("megatorn")
    r = CliRunner().invoke(app, ["estimate", "llama3.1-8b", "--stack", "megatorn"])
    assert r.exit_code == 2 and "unknown stack" in r.output and "Traceback" not in r.output


def test_stack_sets_the_plan_and_explicit_flags_override_it():
    kw = dict(gpu="H100", gpus=8, global_batch=8, seq_len=8192)
    tt = shardscope.estimate("llama3.1-8b", stack="torchtitan", **kw)
    assert tt.plan["fsdp"] and tt.plan["linear_impl"] == "torch" and not tt.plan["persistent_grads"]
    assert tt.plan["attention_kernel"] == "cudnn" and not tt.plan["fused_activation"]
    nemo = shardscope.estimate("llama3.1-8b", stack="nemo", **kw)
    assert nemo.plan["zero"] == 1 and nemo.plan["tp_comm_overlap"] and nemo.plan["fused_cross_entropy"]
    over = shardscope.estimate("llama3.1-8b", stack="torchtitan", fsdp=False, zero=1, attention_kernel="fa2", **kw)
    assert (over.plan["fsdp"], over.plan["zero"], over.plan["attention_kernel"]) == (False, 1, "fa2")
    compiled = shardscope.estimate("llama3.1-8b", stack="torchtitan", compile=True, **kw)
    assert compiled.memory.peak_gib < tt.memory.peak_gib  # the compiled loss keeps no fp32 logits
    asynctp = shardscope.estimate("llama3.1-8b", stack="torchtitan", tp=2, async_tp=True, compile=True, **kw)
    assert asynctp.plan["tp_comm_overlap"]


def test_json_carries_the_stack_and_its_resolved_settings():
    r = CliRunner().invoke(app, ["estimate", "llama3.1-8b", "--stack", "torchtitan", "--compile", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["stack"] == "torchtitan@0.2" and doc["plan"]["compile"] is True and doc["plan"]["fsdp"] is True
    r = CliRunner().invoke(app, ["stacks", "--json"])
    assert {d["stack"].split("@")[0] for d in json.loads(r.output)} >= NAMES
    r = CliRunner().invoke(app, ["stacks", "nemo@24.07"])
    assert r.exit_code == 0 and "delayed" in r.output


def test_power_limit_slows_compute_as_measured():
    """Capped GEMMs as measured: an H100 at 500 W runs BF16 GEMMs of 8k-64k rows at 546-585 TFLOP/s (FBGEMM
    PR #2546), a GB300 at 500 W at 0.28-0.39 of its 1,400 W rate (facebookexperimental/triton PR #2023; the
    model's 0.40 is a miss of 5% at most);
    a step slows by at most the clock's ratio (HBM-bound work keeps its speed); a cap above the TDP is none."""
    from shardscope.costs.compute import gemm_time_s
    from shardscope.hardware.catalog import load_gpu, power_capped

    h100 = power_capped(load_gpu("H100"), 500)
    fbgemm = {(8192, 8192, 8192): 585.23, (65536, 7168, 8192): 575.12, (65536, 8192, 3584): 546.31}
    for (m, n, k), measured in fbgemm.items():
        assert 2 * m * n * k / gemm_time_s(h100, m, n, k) / 1e12 == pytest.approx(measured, rel=0.05)
    gb300 = load_gpu("GB300")  # at its rated 1,400 W it holds its maximum clock: ~1,600-2,174 TFLOP/s
    shape = (16384, 16384, 16384)
    assert 1600 < 2 * 16384**3 / gemm_time_s(gb300, *shape) / 1e12 < 2174
    ratio = gemm_time_s(gb300, *shape) / gemm_time_s(power_capped(gb300, 500), *shape)
    assert 0.28 < ratio < 0.39 * 1.05
    kw = dict(gpu="H100", gpus=8, global_batch=8, seq_len=8192, stack="nemo")
    full = shardscope.estimate("llama3.1-8b", **kw)
    capped = shardscope.estimate("llama3.1-8b", power_limit_w=500, **kw)
    ratio = capped.step_time_s / full.step_time_s
    clock = h100.matmul_sustained_fraction / load_gpu("H100").matmul_sustained_fraction
    assert 1.0 < ratio <= 1 / clock + 1e-9
    assert shardscope.estimate("llama3.1-8b", power_limit_w=900, **kw).step_time_s == pytest.approx(full.step_time_s)
    r = CliRunner().invoke(app, ["estimate", "llama3.1-8b", "--power-limit", "-5"])
    assert r.exit_code == 2 and "power-limit" in r.output


def test_flags_read_as_the_cli_spells_them():
    flags = parse_flags("--compile --async-tp --fp8-recipe rowwise --power-limit 500 --no-tp-comm-overlap "
                        "--recompute-modules=mlp,moe_act --pp-layout 'Et*3|(tt|)*29m|L'")  # fmt: skip
    assert flags == {
        "compile": True, "async_tp": True, "fp8_recipe": "rowwise", "power_limit_w": 500.0,
        "tp_comm_overlap": False, "recompute_modules": "mlp,moe_act", "pp_layout": "Et*3|(tt|)*29m|L",
    }  # fmt: skip
    with pytest.raises(ShardscopeError, match="unknown --compiel"):
        parse_flags("--compiel")
    with pytest.raises(ShardscopeError, match="needs a value"):
        parse_flags("--tp")


ROW = dict(
    id="X-1", source="anything", model="llama3_8b", arch="dense", layers="32", hidden="4096", ffn_hidden="14336",
    heads="32", kv_heads="8", vocab="128256", seq_len="8192", gpu="H100", num_gpus="8", tp="1", pp="1", cp="1",
    zero_or_fsdp="", recompute="", micro_batch="", global_batch="", precision="bf16", metric="step_time_s",
    value="1.0", notes="", stack="torchtitan", flags="--compile",
)  # fmt: skip


def test_a_row_is_read_from_its_layout_stack_and_flags_only():
    case = case_from_row(ROW)
    assert case.plan.global_batch == 8 and case.plan.micro_batch == 1  # blank: dp x micro-batch, no accumulation
    assert case.plan.fsdp and case.plan.compile and case.stack.name == "torchtitan"
    other = case_from_row(ROW | {"source": "MBRIDGE_PERF", "notes": "NeMo container 24.07", "id": "MB-001"})
    assert other.plan == case.plan  # where the row came from changes nothing


def test_recompute_cells_as_sources_write_them():
    assert recompute_of("none (selective, empty module list)") == ("none", 0, None)
    assert recompute_of("selective(core_attn, mlp)") == ("selective", 0, "core_attn,mlp")
    assert recompute_of("full(block,8)") == ("full", 8, None)
    assert case_from_row(ROW | {"recompute": "selective(mlp)", "stack": "megatron"}).plan.recompute_modules == ("mlp",)


def test_an_moe_model_outside_the_catalog_is_built_from_its_columns():
    grok = ROW | dict(model="grok_1", arch="moe", layers="64", hidden="6144", ffn_hidden="32768", heads="48",
                      kv_heads="8", vocab="131072", experts="8", topk="2", num_gpus="64", tp="8", ep="8",
                      stack="megatron", flags="")  # fmt: skip
    case = case_from_row(grok)
    assert case.model.moe and case.model.moe.experts == 8 and case.warnings
    assert 300e9 < case.model.params_total < 330e9  # Grok-1: 314 B


def test_no_source_names_or_row_ids_in_src():
    """Nothing in the package keys on where a validation row came from."""
    sources = ("MBRIDGE", "MOSAICML", "NARAYANAN", "NEMO_2407", "LLAMA3_PAPER", "WAN_DIT", "MCORE_")
    row_id = re.compile(r"\b(MB|MR|MD|MC|MG|MS|MT|NM|WN|QA|QB|QR|ML|MA|L3)-\d{3}\b")
    for path in SRC.rglob("*"):
        if path.suffix not in (".py", ".yaml", ".json", ".html"):
            continue
        text = path.read_text()
        assert not any(s in text for s in sources), path
        assert not row_id.search(text), (path, row_id.search(text))
    rows_py = (SRC / "validate" / "rows.py").read_text() + (SRC / "validate" / "metrics.py").read_text()
    assert not re.search(r"""row(\.get\(|\[)["'](source|notes|id)["']""", rows_py)


def test_torchtitan_stack_against_a_measured_step_on_one_h100():
    """torchtitan's Llama-3.1-8B blocks (full width, 2 and 4 layers, seq 8192, FSDP2 on one H100, torch
    2.11; bench/device/torchtitan_llama_step.py): per block, the estimate's forward+backward time is within
    15% of the measured (7% fast: PyTorch's fused RMSNorm backward runs slower than its bytes), and
    its peak-memory growth within 5%: params + Adam + the larger of grads and activations, since
    `zero_grad(set_to_none=True)` frees the grads; a persistent grad buffer would be 16% over."""
    import dataclasses
    import tempfile

    from shardscope.analytic.step import estimate_step

    doc = json.loads(MEASURED.read_text())
    runs = {(r["n_layers"], r["mode"]): r for r in doc["configs"] if r.get("route") == "fsdp" and r.get("ok")}
    cfg = json.loads((SRC / "models" / "catalog" / "llama3.1-8b.json").read_text())
    est = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (2, 4):
            path = Path(tmp) / f"l{layers}.json"
            path.write_text(json.dumps(cfg | {"num_hidden_layers": layers}))
            spec, cluster, plan = shardscope.setup(path, "H100", 1, global_batch=1, seq_len=8192, stack="torchtitan")
            est[layers] = (estimate_step(spec, cluster, plan), spec, cluster, plan)
    measured_layer_ms = (runs[(4, "eager")]["fwd_bwd_ms"] - runs[(2, "eager")]["fwd_bwd_ms"]) / 2
    model_layer_ms = (est[4][0].time.compute_s - est[2][0].time.compute_s) / 2 * 1e3
    assert model_layer_ms == pytest.approx(measured_layer_ms, rel=0.15)
    measured_layer_gib = (runs[(4, "eager")]["peak_mem_gib"] - runs[(2, "eager")]["peak_mem_gib"]) / 2
    model_layer_gib = (est[4][0].memory.peak_gib - est[2][0].memory.peak_gib) / 2
    assert model_layer_gib == pytest.approx(measured_layer_gib, rel=0.05)
    kept = [estimate_step(s, c, dataclasses.replace(p, persistent_grads=True)) for _, s, c, p in est.values()]
    assert (kept[1].memory.peak_gib - kept[0].memory.peak_gib) / 2 > 1.1 * measured_layer_gib


def test_every_plan_option_is_declared_once():
    """The plan's options come from their one declaration in `Plan` (section, help, choices): the CLI
    declares none of them itself (the search's tri-state MoE choices aside), estimate and budget offer
    them all, the flags cell reads them all, and the op graph's memo key is the fields declared `graph`."""
    from dataclasses import fields

    from shardscope.graph.build import GRAPH_FIELDS
    from shardscope.plan.flags import plan_flag_types
    from shardscope.plan.plan import SECTIONS, Plan, option_flag

    cli_src = (SRC / "cli.py").read_text()
    searched = {"--ep-comm-overlap", "--ep-dispatch"}  # `plan`'s "try both" / "auto" choices, not plan fields
    offered = [f for f in fields(Plan) if f.metadata.get("cli", True)]
    for f in offered:
        assert f.metadata["section"] in SECTIONS and f.metadata["help"], f.name
        flag = option_flag(f)
        if flag not in searched:
            assert not re.search(rf'"{flag}[/"]', cli_src), f"{flag} is declared in cli.py"
    helps = {c: CliRunner().invoke(app, [c, "--help"], env={"COLUMNS": "300"}).output for c in ("estimate", "budget")}
    for f in offered:
        for cmd, text in helps.items():
            assert option_flag(f) in text, (cmd, f.name)
    assert set(plan_flag_types()) == {option_flag(f)[2:] for f in offered}
    assert set(GRAPH_FIELDS) == {f.name for f in fields(Plan) if f.metadata.get("graph")}
    api = shardscope.estimate("llama3.1-8b", "H100", 8, global_batch=8)
    cli = json.loads(CliRunner().invoke(app, ["estimate", "llama3.1-8b", "--global-batch", "8", "--json"]).output)
    assert json.loads(json.dumps(api.to_dict()))["plan"] == cli["plan"]  # the same defaults from API and CLI


def test_rows_name_stacks_and_models_as_users_write_them():
    """Case, separators and common aliases of stacks and models are read; flags this version does not
    model are ignored with a warning rather than dropping the row; an unknown stack is a skip with reason."""
    import pytest as _pytest

    from shardscope.validate.rows import SkipRow

    case = case_from_row(ROW | {"stack": "TorchTitan@v0.2.0", "model": "Llama-3.1-8B", "flags": "--compile --float8"})
    assert case.stack.label == "torchtitan@0.2" and case.plan.compile
    bare = ROW | {"model": "Llama-3.1-8B", "layers": "", "hidden": "", "heads": ""}  # no columns: the catalog's
    assert case_from_row(bare).model.name == "llama3.1-8b"
    assert any("--float8" in w for w in case.warnings)
    assert case_from_row(ROW | {"stack": "Megatron-LM"}).stack.name == "megatron"
    with _pytest.raises(SkipRow, match="unknown stack"):
        case_from_row(ROW | {"stack": "jax"})


def test_torchtitan_op_sac_recomputes_every_second_matmul():
    """torchtitan's op-level selective AC saves every matmul output but each block's 2nd, 4th, ...: of a
    Llama block's wq, wk, wv, wo, w1, w3, w2 it re-runs wk, wo and w3 in backward."""
    from shardscope.graph.build import build_stage_graph
    from shardscope.graph.common import alternate_mm_share

    spec, _, plan = shardscope.setup("llama3.1-8b", "H100", 8, global_batch=8, stack="torchtitan")
    share = alternate_mm_share(spec, plan, build_stage_graph(spec, plan).layer)
    assert share == {"qkv proj": pytest.approx(1024 / 6144), "out proj": 1.0, "gate/up proj": 0.5, "down proj": 0.0}
    kw = dict(gpu="H100", gpus=8, global_batch=8, seq_len=8192, recompute="selective")
    tt = shardscope.estimate("llama3.1-8b", stack="torchtitan", **kw)
    plain = shardscope.estimate("llama3.1-8b", stack="torchtitan", recompute_alternate_mm=False, **kw)
    assert tt.time.recompute_s > 2 * plain.time.recompute_s


def test_dtensor_tp_keeps_the_gathered_input_and_op_sac_gathers_it_again():
    """Megatron keeps the sequence-parallel shard of a column GEMM's input and re-gathers it beside dgrad;
    DTensor's styles (torchtitan) keep the gathered tensor, and torchtitan's op-level SAC, whose save list
    has no all-gather, re-runs each block's two TP all-gathers in backward, exposed without async TP."""
    from shardscope.graph.build import build_stage_graph
    from shardscope.step.core import step_costs

    kw = dict(tp=8, global_batch=8, seq_len=8192, recompute="selective")
    spec, cluster, tt = shardscope.setup("llama3.1-8b", "H100", 8, stack="torchtitan", **kw)
    _, _, mg = shardscope.setup("llama3.1-8b", "H100", 8, stack="megatron", recompute_modules="layernorm", **kw)
    names = {p: {c.name for c in build_stage_graph(spec, p).layer.comms} for p in (tt, mg)}
    assert "tp all-gather attn input (wgrad)" in names[mg] - names[tt]
    layer = next(iter(step_costs(spec, cluster, tt).layers.values()))
    gathers = sum(e for c, e in layer.fwd.comms if c.group == "tp" and c.kind == "all_gather")
    assert gathers > 0 and layer.recompute_comm_s == pytest.approx(gathers)
    no_regather = step_costs(spec, cluster, shardscope.records.evolve(tt, tp_keeps_gathered_input=False))
    assert next(iter(no_regather.layers.values())).recompute_comm_s == 0
    # without recompute, what the column GEMMs keep for wgrad: the gathered input (DTensor), the shard (Megatron)
    kept = {}
    for p in (tt, mg):
        saved = {s.name: s.bytes for s in build_stage_graph(spec, p).layer.saved}
        kept[p.tp_keeps_gathered_input] = saved["attn norm out (qkv input)"] + saved["mlp norm out (mlp input)"]
    assert kept[True] == 8 * kept[False] == 2 * 2 * 8192 * spec.hidden


def test_async_tp_leaves_the_reduce_scatter_of_split_projections_exposed():
    """PyTorch's async TP fuses a reduce-scatter only with the one matmul producing its input; torchtitan's
    separate wq/wk/wv and w1/w3 sum their input gradients first, so those two backward reduce-scatters
    stay exposed, where Megatron's fused linear_qkv / linear_fc1 hide theirs under the split GEMM."""
    from shardscope.graph.build import build_stage_graph

    kw = dict(tp=8, global_batch=8, seq_len=8192, tp_comm_overlap=True)
    spec, _, tt = shardscope.setup("llama3.1-8b", "H100", 8, stack="torchtitan", compile=True, **kw)
    _, _, mg = shardscope.setup("llama3.1-8b", "H100", 8, stack="megatron", **kw)
    for plan, exposed in ((tt, {"tp reduce-scatter attn", "tp reduce-scatter mlp"}), (mg, set())):
        comms = build_stage_graph(spec, plan).layer.comms
        assert {c.name for c in comms if c.group == "tp" and c.phase == "bwd" and not c.hidden_by} == exposed
        assert all(c.hidden_by for c in comms if c.group == "tp" and c.phase == "fwd")


def test_split_projections_run_one_gemm_per_linear():
    """torchtitan's wq/wk/wv and w1/w3 are separate linears: each reads the shared input and runs its own
    GEMM (the K/V ones 128 columns wide a rank at TP8), where Megatron runs one fused GEMM."""
    from shardscope.costs.compute import gemm_passes, op_kernels, op_time_s
    from shardscope.graph.build import build_stage_graph

    kw = dict(tp=8, global_batch=8, seq_len=8192)
    spec, cluster, tt = shardscope.setup("llama3.1-8b", "H100", 8, stack="torchtitan", **kw)
    _, _, mg = shardscope.setup("llama3.1-8b", "H100", 8, stack="megatron", **kw)
    ops = {p: {op.name: op for op in build_stage_graph(spec, p).layer.ops} for p in (tt, mg)}
    assert ops[tt]["qkv proj"].splits == (512, 128, 128) and ops[tt]["gate/up proj"].splits == (1792, 1792)
    assert not ops[mg]["qkv proj"].splits
    assert [n for _, n, _ in gemm_passes(ops[tt]["qkv proj"], False, tt)[2]] == [512, 128, 128]
    assert op_kernels(ops[tt]["qkv proj"], True, tt) == 3 * op_kernels(ops[mg]["qkv proj"], True, mg)
    split, fused = (op_time_s(cluster.gpu, ops[p]["qkv proj"], False, p) for p in (tt, mg))
    assert split > 1.5 * fused


def test_gpu_marketing_names_are_read_by_part_and_memory():
    from shardscope.hardware.catalog import load_gpu

    names = {"H100 80GB HBM3": "H100", "NVIDIA A100-SXM4-40GB (DGX-A100)": "A100-40GB", "H100 96GB HBM2e": "H100-96GB",
             "H200 141GB HBM3": "H200", "H100 SXM": "H100"}  # fmt: skip
    assert {n: load_gpu(n).name for n in names} == names
    with pytest.raises(ShardscopeError, match="unknown GPU"):
        load_gpu("H100 40GB")  # no such part


def test_torchtitan_pipelined_fsdp_keeps_weights_gathered_and_gradients_unsharded():
    """torchtitan's default reshard policy is `not pp_enabled`, and torch.distributed.pipelining runs an FSDP
    stage's backwards without gradient sync, reducing once after the last: the stage's weights stay gathered
    (bf16) and its gradients accumulate whole in fp32 through the step, and that reduction has no backward
    left to hide under."""
    from shardscope.costs.memory import buffer_bytes, stage_params_local
    from shardscope.graph.build import build_stage_graph
    from shardscope.records import evolve
    from shardscope.step.core import dp_comm, pipeline_costs, step_costs

    layout = dict(tp=8, pp=8, micro_batch=4, global_batch=256, seq_len=8192, recompute="full")
    spec, cluster, plan = shardscope.setup("llama3.1-405b", "H100", 512, stack="torchtitan", **layout)
    assert plan.fsdp and not plan.reshard_after_forward and plan.deferred_grad_sync
    flat = shardscope.setup("llama3.1-405b", "H100", 512, stack="torchtitan", **dict(layout, tp=8, pp=1))[2]
    assert flat.reshard_after_forward and not flat.deferred_grad_sync
    stated = shardscope.setup("llama3.1-405b", "H100", 512, stack="torchtitan", reshard_after_forward=True,
                              **layout)[2]  # fmt: skip
    assert stated.reshard_after_forward  # a policy the user states wins
    megatron = shardscope.setup("llama3.1-405b", "H100", 512, stack="megatron", fsdp=True, **layout)[2]
    assert not megatron.deferred_grad_sync

    graph = build_stage_graph(spec, plan, cluster.gpu.arch)
    synced = evolve(plan, pipeline_defers_grad_sync=False)
    for stage in (0, 3):
        whole = stage_params_local(spec, plan, stage)
        added = buffer_bytes(spec, plan, graph, stage) - buffer_bytes(spec, synced, graph, stage)
        # the stage's fp32 gradients, less the one layer's reduce buffer a synced backward holds
        assert 0.9 * 4 * whole < added <= 4 * whole
    sc = step_costs(spec, cluster, plan)
    st = pipeline_costs(sc, spec, cluster, plan).stages[0]
    deferred, overlapped = (dp_comm(sc, spec, cluster, p, 0, st) for p in (plan, synced))
    assert overlapped.grad_exposed_s < deferred.grad_exposed_s < deferred.total_s


def test_automodel_runs_moe_models_on_its_own_model_code():
    """NeMo AutoModel builds MoE architectures from its own model code (BackendConfig: Transformer Engine
    attention and linears, fused RMSNorm and RoPE) and dense ones from Hugging Face's: an MoE plan gets the
    former, a dense plan the latter, a stated flag overrides either, and the plan search prices the same."""
    from shardscope.planner.runner import search_setup

    moe = shardscope.setup("qwen3-30b-a3b", "H100", 8, stack="nemo-automodel@25.09", ep=8)[2]
    dense = shardscope.setup("llama3.1-8b", "H100", 8, stack="nemo-automodel@25.09")[2]
    assert (moe.linear_impl, moe.eager_elementwise) == ("te", False)
    assert (dense.linear_impl, dense.eager_elementwise) == ("torch", True)
    stated = shardscope.setup("qwen3-30b-a3b", "H100", 8, stack="nemo-automodel@25.09", ep=8, linear_impl="torch")
    assert stated[2].linear_impl == "torch"
    titan = load_stack("torchtitan")
    assert titan.plan_defaults(moe=True) == titan.plan_defaults()  # its MoE models run its one model code
    space = search_setup(
        model="qwen3-30b-a3b", gpu="H100", gpus=8, gpus_per_node=None, seq_len=4096, video=None, precision="bf16",
        fp8_recipe=None, cuda_graphs=None, fused_activation=None, fused_cross_entropy=None, ep_dispatch="flat",
        ep_comm_overlap=None, stack="nemo-automodel@25.09",
    )[3]  # fmt: skip
    assert dict(space.kernels)["linear_impl"] == "te"


def test_each_stack_runs_its_own_loss_over_tp_sharded_logits():
    """Llama-3.1-8B at TP8: Megatron's vocab-parallel loss and torchtitan's DTensor loss_parallel run over
    each rank's vocabulary shard; NeMo AutoModel's MaskedCrossEntropy gathers the fp32 logits
    (`full_tensor()`) and runs over the whole vocabulary on every rank, so its last stage keeps and holds 8x
    the logits, after an fp32 all-gather of them."""
    from shardscope.graph.build import build_stage_graph
    from shardscope.models.catalog import load_model

    m = load_model("llama3.1-8b")
    kw = dict(gpus=8, tp=8, seq_len=8192, global_batch=1, micro_batch=1)
    kept = {}
    for stack in ("megatron", "torchtitan", "nemo-automodel"):
        spec, _, plan = shardscope.setup(m.name, stack=stack, **kw)
        head = build_stage_graph(spec, plan).head
        kept[stack] = next(s.bytes for s in head.saved if s.name == "fp32 logits (softmax)")
        gathers = [c for c in head.comms if c.name == "tp logits all-gather"]
        assert bool(gathers) == (stack == "nemo-automodel")
    shard = 4 * 8192 * m.vocab / 8
    assert kept["megatron"] == kept["torchtitan"] == pytest.approx(shard)
    assert kept["nemo-automodel"] == pytest.approx(8 * shard)


def test_torchtitan_gathers_fp8_weights_only_under_tensorwise():
    """torchao's FSDP float8 all-gather is a tensorwise option: torchtitan refuses it with the rowwise
    recipe, and so does the estimate (one line, exit 2); under tensorwise it gathers FP8 weights."""
    args = ["estimate", "llama3.1-8b", "--gpus", "8", "--stack", "torchtitan", "--precision", "fp8", "--fp8-all-gather"]
    r = CliRunner().invoke(app, [*args, "--fp8-recipe", "rowwise"])
    assert r.exit_code == 2 and "tensorwise" in r.output and "Traceback" not in r.output
    est = shardscope.estimate("llama3.1-8b", gpus=8, stack="torchtitan", precision="fp8", fp8_all_gather=True)
    assert est.plan["fp8_all_gather"] and est.plan["fp8_recipe"] == "tensorwise"
