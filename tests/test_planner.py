"""The plan search, training cost, and launchable exports."""

from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib

import pytest
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.plan.plan import make_plan
from shardscope.planner.cost import parse_tokens, training_cost
from shardscope.planner.export import export, runnable_problems, to_megatron
from shardscope.planner.search import search

runner = CliRunner()


@pytest.fixture(scope="module")
def llama405b_16k():
    return search(load_model("llama3.1-405b"), make_cluster("H100", 16384), 2048, 8192)


def test_search_beats_the_published_llama3_plan(llama405b_16k):
    """Meta's Llama 3 405B plan on 16,384 H100 (TP8, PP16, FSDP without reshard, Table 4); the search
    must find one at least as fast under the same model — with any virtual-pipeline degree."""
    best = llama405b_16k.candidates[0].estimate
    published = [
        shardscope.estimate(
            "llama3.1-405b",
            gpu="H100",
            gpus=16384,
            tp=8,
            pp=16,
            vpp=v,
            fsdp=True,
            reshard_after_forward=False,
            global_batch=2048,
            seq_len=8192,
        )
        for v in (1, 2, 7)
    ]
    for p in published:
        assert best.tokens_per_s_per_gpu >= p.tokens_per_s_per_gpu
    assert best.fits and llama405b_16k.evaluated > 100


def test_every_candidate_fits_and_is_sorted(llama405b_16k):
    thr = [c.estimate.tokens_per_s_per_gpu for c in llama405b_16k.candidates]
    assert thr == sorted(thr, reverse=True)
    assert all(c.estimate.fits for c in llama405b_16k.candidates)
    assert all(c.plan.gpus == 16384 for c in llama405b_16k.candidates)


def test_pareto_front(llama405b_16k):
    front = llama405b_16k.pareto()
    mems = [c.estimate.memory.required_gib for c in front]
    assert mems == sorted(mems, reverse=True) and len(front) >= 2


def test_memory_objective():
    r = search(load_model("llama3.1-8b"), make_cluster("H100", 64), 256, 8192, objective="memory")
    req = [c.estimate.memory.required_gib for c in r.candidates]
    assert req == sorted(req)


def test_workers_give_the_same_answer():
    m, c = load_model("llama3.1-8b"), make_cluster("H100", 64)
    one = search(m, c, 128, 4096)
    two = search(m, c, 128, 4096, workers=2)
    assert [x.plan for x in one.candidates[:5]] == [x.plan for x in two.candidates[:5]]


def test_workers_default_to_one_per_core_for_large_searches_only():
    """`workers=0` (the CLI's default) pools a search only when it is large enough to repay the pool's
    start-up, with at most one process per core this process may run on."""
    import os

    from shardscope.cli import Workers
    from shardscope.planner.search import MAX_AUTO_WORKERS, POOL_MIN_LAYOUTS, auto_workers

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert auto_workers(POOL_MIN_LAYOUTS - 1) == 1
    assert auto_workers(POOL_MIN_LAYOUTS) == min(cores, MAX_AUTO_WORKERS)
    assert f"{POOL_MIN_LAYOUTS:,}" in Workers.__metadata__[0].help  # the CLI's help states the threshold
    m, c = load_model("llama3.1-8b"), make_cluster("H100", 64)
    assert [x.plan for x in search(m, c, 128, 4096, workers=0).candidates] == [
        x.plan for x in search(m, c, 128, 4096).candidates
    ]
    with pytest.raises(ShardscopeError, match="--workers must be 0"):
        search(m, c, 128, 4096, workers=-1)


@pytest.mark.parametrize("text,value", [("15T", 15e12), ("300B", 3e11), ("2.5e12", 2.5e12), ("1000", 1000)])
def test_parse_tokens(text, value):
    assert parse_tokens(text) == pytest.approx(value)


def test_training_cost():
    e = shardscope.estimate("llama3.1-8b", gpus=64, global_batch=256, seq_len=8192, zero=1)
    tc = training_cost(e, 15e12, 2.0)
    assert isinstance(tc.steps, int) and tc.steps == -(-15e12 // e.tokens_per_step)  # whole steps, rounded up
    assert tc.days == pytest.approx(tc.steps * e.step_time_s / 86400)
    assert tc.gpu_hours == pytest.approx(tc.days * 24 * 64)
    assert tc.cost_usd == pytest.approx(2.0 * tc.gpu_hours)


PLANS = [
    dict(tp=8, pp=4, vpp=2, cp=2, zero=1, recompute="selective"),
    dict(tp=2, pp=1, fsdp=True, recompute="full", recompute_layers=8),
    dict(tp=4, pp=2, fsdp=True, reshard_after_forward=False, offload_optimizer=True),
]


@pytest.mark.parametrize("kw", PLANS)
def test_exports_parse_and_match(kw):
    m = load_model("llama3.1-70b")
    plan = make_plan(m, make_cluster("H100", 256), global_batch=256, seq_len=8192, **kw)
    # each framework exports the plan where it can run it, else refuses it (runnable_problems says why)
    for fmt in ("torchtitan@0.2", "deepspeed"):
        if runnable_problems(fmt, m, plan):
            with pytest.raises(ShardscopeError, match="cannot run this plan"):
                export(fmt, m, plan)
    titan_plan = dataclasses.replace(plan, zero=0, fsdp=True, recompute_layers=0)
    titan = tomllib.loads(export("torchtitan@0.2", m, titan_plan))
    par = titan["parallelism"]
    degrees = (
        par["data_parallel_replicate_degree"]
        * par["data_parallel_shard_degree"]
        * par["tensor_parallel_degree"]
        * par["pipeline_parallel_degree"]
        * par["context_parallel_degree"]
    )
    assert degrees == 256
    assert par["tensor_parallel_degree"] == plan.tp and par["pipeline_parallel_degree"] == plan.pp
    assert titan["training"]["global_batch_size"] == 256 and titan["activation_checkpoint"]["mode"] == plan.recompute
    args = shlex.split(export("megatron", m, plan).replace("\\\n", " "))
    val = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}
    tp, pp, cp = (
        int(val["--tensor-model-parallel-size"]),
        int(val["--pipeline-model-parallel-size"]),
        int(val["--context-parallel-size"]),
    )
    assert tp * pp * cp * plan.dp == 256 and (tp, pp, cp) == (plan.tp, plan.pp, plan.cp)
    assert int(val["--global-batch-size"]) == 256 and int(val["--micro-batch-size"]) == plan.micro_batch
    if plan.recompute == "selective":  # op-level selective has no Megatron module list: the export says so
        assert "--recompute-modules" not in args and "core_attn only" in export("megatron", m, plan)
    if runnable_problems("deepspeed", m, plan):
        return
    ds = json.loads(export("deepspeed", m, plan))
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * plan.dp
    s = ds["_shardscope"]
    assert s["tp"] * s["pp"] * s["cp"] * s["dp"] == 256 and ds["tensor_parallel"]["autotp_size"] == plan.tp
    assert ("offload_optimizer" in ds["zero_optimization"]) == plan.offload_optimizer


def test_megatron_flags_for_moe_and_fp8():
    m = load_model("deepseek-v3")
    plan = make_plan(
        m,
        make_cluster("H100", 1024),
        ep=64,
        pp=16,
        global_batch=1024,
        seq_len=4096,
        zero=1,
        precision="fp8",
        fp8_recipe="blockwise",
    )
    args = to_megatron(m, plan)
    assert "--expert-model-parallel-size" in args and args[args.index("--expert-model-parallel-size") + 1] == "64"
    assert args[args.index("--fp8-recipe") + 1] == "blockwise" and "--use-distributed-optimizer" in args
    assert "--fp8-param-gather" not in args
    assert "--fp8-param-gather" in to_megatron(m, dataclasses.replace(plan, fp8_all_gather=True))
    assert "--cuda-graph-impl" not in args  # eager
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    hybridep = to_megatron(m, dataclasses.replace(plan, ep_dispatch="hybridep"))
    assert hybridep[hybridep.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    graphed = to_megatron(m, dataclasses.replace(plan, cuda_graphs=("attn", "moe_router")))
    assert graphed[graphed.index("--cuda-graph-impl") :][:4] == [
        "--cuda-graph-impl",
        "transformer_engine",
        "--cuda-graph-modules",
        "attn",
    ]
    full = to_megatron(m, dataclasses.replace(plan, cuda_graphs=("full_iteration",)))
    assert full[full.index("--cuda-graph-impl") + 1] == "full_iteration" and "--cuda-graph-modules" not in full
    # Megatron fuses the SwiGLU by default: an unfused plan turns it off so the run keeps what was priced
    assert "--no-bias-swiglu-fusion" in args
    assert "--no-bias-swiglu-fusion" not in to_megatron(m, dataclasses.replace(plan, fused_activation=True))


def test_plan_cli_json_and_export(tmp_path):
    out = tmp_path / "job.toml"
    r = runner.invoke(
        app,
        [
            "plan",
            "llama3.1-8b",
            "--gpus",
            "64",
            "--seq-len",
            "4096",
            "--global-batch",
            "128",
            "--top",
            "3",
            "--json",
            "--tokens",
            "1T",
            "--price-per-gpu-hour",
            "2",
            "--export",
            "torchtitan@0.2",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["plans"]) == 3
    first = d["plans"][0]
    for key in ("plan", "fits", "step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "memory"):
        assert key in first
    assert first["training"]["cost_usd"] == pytest.approx(2 * first["training"]["gpu_hours"])
    assert tomllib.loads(out.read_text())["parallelism"]["tensor_parallel_degree"] == first["plan"]["tp"]
    assert first["warnings"] == []  # a dense model's plans carry no MoE caveat


def test_plan_shows_the_caveats_of_the_plans_it_ranks():
    """The ranked plans of an MoE model run their experts eagerly (the search does not choose CUDA-graph
    scopes), so the table says how far off such runs were, as `estimate` does; the JSON carries it per plan."""
    args = ["plan", "qwen3-30b-a3b", "--gpus", "16", "--seq-len", "4096", "--global-batch", "512", "--top", "3"]
    r = runner.invoke(app, args, terminal_width=400)
    assert r.exit_code == 0, r.output
    assert "warning (all plans): MoE layers run eagerly" in r.output
    d = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert all(any(w.startswith("MoE layers run eagerly") for w in p["warnings"]) for p in d["plans"])


@pytest.mark.parametrize(
    "args,needle",
    [
        (["plan", "llama3.1-8b", "--objective", "speed"], "--objective"),
        (["plan", "llama3.1-8b", "--export", "jax"], "--export"),
        (["plan", "llama3.1-405b", "--gpus", "8", "--global-batch", "8"], "no plan"),
        (["plan", "llama3.1-8b", "--tokens", "lots"], "--tokens"),
        (["plan", "llama3.1-8b", "--precision", "fp8", "--fp8-recipe", "mxfp8"], "Blackwell"),
        (["plan", "llama3.1-8b", "--precision", "fp8", "--fp8-recipe", "int4"], "--fp8-recipe"),
    ],
)
def test_plan_cli_errors(args, needle):
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and needle in r.stderr


def test_search_errors():
    with pytest.raises(ShardscopeError):
        search(load_model("llama3.1-8b"), make_cluster("H100", 8), 7, 4096, objective="speed")


def test_ray_executor_matches_local():
    pytest.importorskip("ray")
    m, c = load_model("llama3.1-8b"), make_cluster("H100", 64)
    local = search(m, c, 128, 4096)
    remote = search(m, c, 128, 4096, workers=2, executor="ray")
    assert [x.plan for x in local.candidates[:5]] == [x.plan for x in remote.candidates[:5]]
    assert remote.evaluated == local.evaluated


def test_budget_planners():
    from shardscope.planner.budget import plan_sac, plan_unshard

    m, c = load_model("llama3.1-70b"), make_cluster("H100", 64)
    plan = make_plan(m, c, tp=8, pp=4, global_batch=64, seq_len=8192)
    sac = plan_sac(m, c, plan, budget_gib=60)
    assert sac.need_gib > 0
    for choice in (sac.greedy, sac.exact):
        assert choice.freed_gib >= sac.need_gib - 1e-9  # fits the budget
    assert sac.exact.cost_s <= sac.greedy.cost_s + 1e-12  # exact is never worse than greedy
    fsdp = make_plan(m, c, fsdp=True, tp=2, global_batch=64, seq_len=4096, recompute="full")
    un = plan_unshard(m, c, fsdp, budget_gib=75)
    for choice in (un.greedy, un.exact):
        assert choice.freed_gib <= un.need_gib + 1e-9  # spends no more than the slack
    assert un.exact.cost_s >= un.greedy.cost_s - 1e-12
    with pytest.raises(ShardscopeError):
        plan_unshard(m, c, plan, budget_gib=75)  # not an FSDP plan
    # DeepSeek-V3's first stage is mostly MoE layers: its items are those of an MLA + MoE block
    m, c, moe_plan = shardscope.setup("deepseek-v3", "H100", 1024, tp=2, pp=8, ep=64, global_batch=4096, zero=1)
    items = {i.name: i for i in plan_sac(m, c, moe_plan, budget_gib=50).items}
    assert {"mla latents", "qkv proj + rope", "experts up + activation", "shared expert up + activation"} <= set(items)
    assert "mlp up + activation" not in items
    assert items["experts up + activation"].bytes_per_layer > items["shared expert up + activation"].bytes_per_layer


def test_budget_cli():
    r = runner.invoke(
        app,
        [
            "budget",
            "llama3.1-70b",
            "--budget-gib",
            "60",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--pp",
            "4",
            "--global-batch",
            "64",
            "--seq-len",
            "8192",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "sac" and d["exact"]["cost_s"] <= d["greedy"]["cost_s"]


def test_megatron_recompute_modules_fit_the_budget_fastest():
    """DeepSeek-V3's layers carry every Megatron module (MLA up-projection, MoE activation, shared experts,
    the dense layers' MLP); the chosen set fits, every faster set does not, recomputing one more module
    never keeps more memory, and the set estimates the same through the public API."""
    from shardscope.planner.modules import module_sets, plan_modules

    kw = dict(tp=2, pp=8, vpp=4, ep=64, zero=1, precision="fp8", global_batch=4096, seq_len=4096)
    m, c, plan = shardscope.setup("deepseek-v3", "H100", 1024, **kw)
    result = plan_modules(m, c, plan, budget_gib=78)
    assert set(result.available) == {"core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe", "shared_experts"}
    assert result.best.modules and result.best.required_gib <= 78
    sets = module_sets(m, c, plan)
    assert len(sets) == 2 ** len(result.available)
    assert all(s.required_gib > 78 for s in sets if s.step_time_s < result.best.step_time_s)
    by_modules = {frozenset(s.modules): s for s in sets}
    for mods, s in by_modules.items():
        for extra in set(result.available) - mods:
            assert by_modules[mods | {extra}].required_gib <= s.required_gib + 1e-9
    again = shardscope.estimate(
        "deepseek-v3", "H100", 1024, recompute="selective", recompute_modules=",".join(result.best.modules), **kw
    )
    assert again.memory.required_gib == pytest.approx(result.best.required_gib)
    with pytest.raises(ShardscopeError, match="no set of Megatron recompute modules"):
        plan_modules(m, c, plan, budget_gib=20)


def test_search_tries_megatron_module_sets_before_full_recompute():
    """DeepSeek-V3 on 1,024 H100 at PP16 VP2 CP2 EP16 fits with neither no recompute nor op-level
    selective. The search takes the least Megatron module set on the frontier that fits, which here beats
    recomputing whole layers (what it could offer before); without module sets it falls back to full."""
    from dataclasses import replace

    from shardscope.planner.modules import module_frontier
    from shardscope.planner.search import _fits_memory, evaluate_structure
    from shardscope.planner.space import SearchSpace, structures

    m, c = load_model("deepseek-v3"), make_cluster("H100", 1024)
    want = {"tp": 1, "pp": 16, "vpp": 2, "cp": 2, "ep": 16, "zero": 1, "micro_batch": 1}
    kw = next(k for k in structures(m, c, 4096, 4096) if all(k.get(f) == v for f, v in want.items()))
    kw = {**kw, "precision": "fp8"}
    with_modules = evaluate_structure(m, c, kw, space=SearchSpace(precision="fp8"))
    without = evaluate_structure(m, c, kw, space=SearchSpace(precision="fp8", recompute_modules=False))
    assert with_modules.plan.recompute == "selective" and with_modules.plan.recompute_modules
    assert without.plan.recompute == "full"
    assert with_modules.estimate.tokens_per_s_per_gpu > without.estimate.tokens_per_s_per_gpu
    frontier = [mods for mods, _ in module_frontier(m, c, with_modules.plan)]
    chosen = frontier.index(with_modules.plan.recompute_modules)
    for mods in frontier[:chosen]:  # every set recomputing less does not fit, with or without offload
        for off in (False, True):
            less = replace(with_modules.plan, recompute_modules=mods, offload_optimizer=off)
            assert not _fits_memory(m, c, less)


def test_the_fit_check_agrees_with_the_whole_estimate_on_deepseek_v3():
    """The search's memory check reads three ranks (first, last, and the middle one with the most layer
    parameters); on DeepSeek-V3, whose first ranks hold the three dense layers, a plan it passes must fit
    on every rank of the whole estimate."""
    from dataclasses import replace

    from shardscope.analytic.step import estimate_step
    from shardscope.planner.search import HEADROOM_GIB, _fits_memory
    from shardscope.planner.space import structures

    m, c = load_model("deepseek-v3"), make_cluster("H100", 256)
    passed = 0
    for i, kw in enumerate(structures(m, c, 1024, 4096)):
        if i % 97 or kw["pp"] < 4:
            continue
        try:
            base = make_plan(m, c, **kw)
        except ShardscopeError:
            continue
        for level in ({}, {"recompute": "selective", "recompute_modules": ("moe",)}, {"recompute": "full"}):
            plan = replace(base, **level)
            if _fits_memory(m, c, plan):
                passed += 1
                assert estimate_step(m, c, plan).memory.required_gib <= c.gpu.hbm_gib - HEADROOM_GIB
    assert passed >= 10


def test_budget_cli_takes_the_moe_plan_options():
    base = ["budget", "qwen3-30b-a3b", "--gpus", "16", "--zero", "1", "--global-batch", "1024"]
    args = [*base, "--ep", "16", "--knob", "modules"]
    r = runner.invoke(app, [*args, "--budget-gib", "75", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "modules" and d["best"]["required_gib"] <= 75 and "moe_act" in d["available"]
    table = runner.invoke(app, [*args, "--budget-gib", "75"])
    assert table.exit_code == 0 and "--recompute-modules" in table.stdout
    for bad, needle in (
        ([*base, "--knob", "nope", "--budget-gib", "75"], "--knob must be one of modules, sac"),
        ([*args, "--budget-gib", "10"], "no set of Megatron recompute modules"),
        ([*base, "--ep", "3", "--budget-gib", "75"], "--ep 3"),
    ):
        r = runner.invoke(app, bad)
        assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


def test_low_precision_optimizer_dtypes_in_torchtitan_and_deepspeed_exports():
    """bf16 main grads map to DeepSpeed's grad_accum_dtype; torchtitan v0.2.2 reduces only in float32
    (`mixed_precision_reduce: Literal["float32"]`), so its export says so. bf16 Adam moments have no
    field in either config, so the export says how much state the run will add."""
    m = load_model("llama3.1-8b")
    cluster = make_cluster("H100", 64)
    base = make_plan(m, cluster, zero=1, global_batch=64, seq_len=4096)
    lean = make_plan(m, cluster, zero=1, global_batch=64, seq_len=4096, optimizer_moments="bf16", main_grads="bf16")
    fsdp = dict(zero=0, fsdp=True)  # torchtitan shards with FSDP2 only
    titan_base = export("torchtitan@0.2", m, dataclasses.replace(base, **fsdp))
    titan_lean = export("torchtitan@0.2", m, dataclasses.replace(lean, **fsdp))
    assert tomllib.loads(titan_base)["training"]["mixed_precision_reduce"] == "float32"
    assert tomllib.loads(titan_lean)["training"]["mixed_precision_reduce"] == "float32"
    assert "reduces gradients in float32" in titan_lean and "reduces gradients" not in titan_base
    assert "Adam moments" not in titan_base
    assert "# note: bf16 Adam moments have no torchtitan config option" in titan_lean and "+4 B/param" in titan_lean
    ds_base, ds_lean = json.loads(export("deepspeed", m, base)), json.loads(export("deepspeed", m, lean))
    assert (ds_base["data_types"]["grad_accum_dtype"], ds_lean["data_types"]["grad_accum_dtype"]) == ("fp32", "bf16")
    assert not ds_base["_shardscope"]["notes"]
    assert any("bf16 Adam moments have no DeepSpeed config option" in n for n in ds_lean["_shardscope"]["notes"])


def test_memoised_costs_equal_a_cold_computation():
    """The planner memoises op times, layer costs and parameter counts on the shared op graph and model
    spec; plans that share a graph but differ elsewhere (sharding, recompute, GPU) must still get exactly
    the estimate a cold computation gives."""
    import dataclasses

    from shardscope.analytic.step import estimate_step
    from shardscope.costs.memory import CLUSTER_MEMO, GRAPH_MEMO
    from shardscope.graph import build

    model = load_model("deepseek-v3")
    base = dict(tp=2, pp=8, ep=16, micro_batch=1, global_batch=512, seq_len=4096)
    variants = [
        ("H100", dict(zero=1)),
        ("H100", dict(fsdp=True)),
        ("H100", dict(fsdp=True, reshard_after_forward=False)),
        ("H100", dict(zero=3, fsdp_prefetch=2)),
        ("H100", dict(zero=1, recompute="full")),
        ("H100", dict(zero=1, recompute="selective", recompute_modules="moe_act,mla_up_proj")),
        ("H100", dict(zero=1, offload_optimizer=True)),
        ("H200", dict(zero=1)),  # same architecture: the same op graph, other op times
        ("H100", dict(zero=1, pp=4)),
    ]

    def run(gpu: str, kw: dict):
        return estimate_step(model, make_cluster(gpu, 256), make_plan(model, make_cluster(gpu, 256), **(base | kw)))

    warm = [run(gpu, kw) for gpu, kw in variants]
    cold = []
    for gpu, kw in variants:
        build._GRAPH_CACHE.clear()
        model.memo.clear()
        GRAPH_MEMO.clear()
        CLUSTER_MEMO.clear()  # the FSDP copy times and ends live here
        cold.append(run(gpu, kw))
    for w, c in zip(warm, cold, strict=True):
        assert dataclasses.asdict(w) == dataclasses.asdict(c)


def test_search_finds_plans_that_fit_only_with_optimizer_offload():
    """Qwen3-30B-A3B in two pipeline stages without expert parallelism holds 15B parameters per GPU:
    ~96 GB of model state with the distributed optimizer, above an H100's 80 GB, but it fits once the
    optimizer state moves to the host. The search must not drop such a structure on its state alone."""
    from shardscope.costs.memory import GIB, rank_state_bytes
    from shardscope.planner.search import evaluate_structure

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster("H100", 64)
    kw = dict(tp=1, pp=2, vpp=4, dp=32, ep=1, zero=1, micro_batch=2, global_batch=512, seq_len=4096)
    state = rank_state_bytes(model, make_plan(model, cluster, **kw), 0)
    assert (state.params + state.grads + state.optimizer) / GIB > cluster.gpu.hbm_gib
    found = evaluate_structure(model, cluster, kw)
    assert found is not None and found.plan.offload_optimizer
    assert found.estimate.memory.required_gib <= cluster.gpu.hbm_gib
    assert evaluate_structure(model, cluster, kw, offload_ok=False) is None


def test_fp8_search_chooses_each_structure_under_fp8():
    """An FP8 search picks every structure's recompute and fit under FP8 (its extra weight copies, its
    FP8 saved inputs), not BF16's choice re-timed: it keeps the structures whose BF16 choice no longer
    fits but deeper recompute does, and a plan recomputes only where it would not fit at FP8 without it."""
    from shardscope.analytic.step import estimate_step
    from shardscope.planner.search import _fits_memory
    from shardscope.planner.space import SearchSpace

    m, c = load_model("llama3.1-8b"), make_cluster("H100", 8)
    fp8 = search(m, c, 64, 8192, space=SearchSpace(precision="fp8"))
    assert fp8.candidates and all(x.plan.precision == "fp8" for x in fp8.candidates)
    bf16_retimed = {
        dataclasses.replace(x.plan, precision="fp8")
        for x in search(m, c, 64, 8192).candidates
        if estimate_step(m, c, dataclasses.replace(x.plan, precision="fp8")).fits
    }
    found = {x.plan for x in fp8.candidates}
    assert len(found) > len(bf16_retimed)
    for x in fp8.candidates:  # a plan with recompute would not fit at FP8 without it
        if x.plan.recompute != "none":
            assert not _fits_memory(m, c, dataclasses.replace(x.plan, recompute="none", recompute_layers=0))
    r = runner.invoke(
        app,
        [
            "plan",
            "llama3.1-8b",
            "--gpus",
            "8",
            "--global-batch",
            "64",
            "--seq-len",
            "8192",
            "--precision",
            "fp8",
            "--json",
            "--top",
            "1",
        ],
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["plans"][0]["plan"]["precision"] == "fp8"


def test_search_with_cuda_graphs():
    """Every plan of a graphed search carries the scopes, and capturing the whole step removes the host
    wait, so the best MoE plan gets faster; a bad scope is an error, not an empty search."""
    from shardscope.planner.space import SearchSpace

    m, c = load_model("qwen3-30b-a3b"), make_cluster("B200", 8)
    eager = search(m, c, 64, 4096)
    graphed = search(m, c, 64, 4096, space=SearchSpace(cuda_graphs=("full_iteration",)))
    assert all(x.plan.cuda_graphs == ("full_iteration",) for x in graphed.candidates)
    assert all(x.estimate.time.host_stall_s == 0 for x in graphed.candidates)
    assert graphed.candidates[0].estimate.step_time_s < eager.candidates[0].estimate.step_time_s
    r = runner.invoke(app, ["plan", "qwen3-30b-a3b", "--gpus", "8", "--cuda-graphs", "layer"])
    assert r.exit_code == 2 and "unknown layer" in r.stderr
    # the search routes dropless, which Megatron-Core's graph of the whole MoE layer cannot capture
    r = runner.invoke(app, ["plan", "qwen3-30b-a3b", "--gpus", "8", "--cuda-graphs", "moe"])
    assert r.exit_code == 2 and "drop-and-pad" in r.stderr


def test_a_search_under_per_layer_graphs_skips_full_recompute():
    """Transformer Engine's per-layer graphs refuse full recompute (Megatron-Core), so a search under
    them falls back on what they allow: its plans recompute selectively or not at all."""
    from shardscope.planner.space import SearchSpace

    m, c = load_model("qwen3-30b-a3b"), make_cluster("H100", 8)
    eager = search(m, c, 64, 8192)
    assert any(x.plan.recompute == "full" for x in eager.candidates)
    graphed = search(m, c, 64, 8192, space=SearchSpace(cuda_graphs=("attn", "moe_router", "moe_preprocess")))
    assert graphed.candidates and all(x.plan.recompute != "full" for x in graphed.candidates)


@pytest.mark.parametrize(("stack", "saved_bytes"), [("megatron", 2), ("hf", 8)])
def test_fused_cross_entropy_keeps_less_and_exports(stack: str, saved_bytes: int):
    """A fused cross-entropy keeps the bf16 logits, not an fp32 copy, and writes a bf16 gradient: with
    Llama 3's 128k vocabulary the last stage needs less, by 2 bytes a logit against Megatron's unfused loss
    (an fp32 softmax turned into the gradient in place, then cast) and by 8 against PyTorch's (which holds
    nll_loss's and log_softmax's fp32 gradients beside it). The CLI flag reaches the estimate and the
    Megatron arguments carry it."""
    args = ["estimate", "llama3.1-8b", "--gpus", "8", "--seq-len", "8192", "--global-batch", "16", "--json"]
    args += ["--stack", stack]
    unfused = json.loads(runner.invoke(app, args).stdout)["memory"]["peak_gib"]
    r = runner.invoke(app, [*args, "--fused-cross-entropy"])
    assert r.exit_code == 0
    fused = json.loads(r.stdout)["memory"]["peak_gib"]
    logits_gib = 8192 * 128256 / 2**30  # one micro-batch's logits
    assert unfused - fused == pytest.approx(saved_bytes * logits_gib, rel=0.01)
    plan = make_plan(load_model("llama3.1-8b"), make_cluster("H100", 8), global_batch=16, fused_cross_entropy=True)
    assert "--cross-entropy-loss-fusion" in to_megatron(load_model("llama3.1-8b"), plan)


def test_search_with_fused_activation():
    """A fused-activation search prices every plan with Megatron's SwiGLU, which keeps less, so the plan that
    fits with the least memory needs less than the unfused one; the CLI flag reaches the plans."""
    from shardscope.planner.space import SearchSpace

    m, c = load_model("llama3.1-8b"), make_cluster("H100", 8)
    unfused = search(m, c, 64, 8192, objective="memory")
    fused = search(m, c, 64, 8192, objective="memory", space=SearchSpace(fused_activation=True))
    assert all(x.plan.fused_activation for x in fused.candidates)
    assert not any(x.plan.fused_activation for x in unfused.candidates)
    assert fused.candidates[0].estimate.memory.required_gib <= unfused.candidates[0].estimate.memory.required_gib
    r = runner.invoke(app, ["plan", "llama3.1-8b", "--gpus", "8", "--fused-activation", "--json", "--top", "1"])
    assert r.exit_code == 0 and json.loads(r.stdout)["plans"][0]["plan"]["fused_activation"] is True


def test_search_picks_the_moe_dispatcher_and_overlap():
    """With EP > 1 each structure is timed under the NCCL all-to-all and DeepEP dispatchers, with and
    without the EP overlap where Megatron-Core allows it, and keeps the fastest: no other setting of the
    chosen plan's layout estimates faster. Qwen3-30B-A3B on 16 H100 across two nodes: DeepEP's one copy
    per node wins over the flat all-to-all's eight, with its routing map fused (unfused, it synchronises).
    Asking for one setting restricts the search to it."""
    from shardscope.analytic.step import estimate_step
    from shardscope.planner.space import SearchSpace

    m, c = load_model("qwen3-30b-a3b"), make_cluster("H100", 16)
    best = search(m, c, 256, 4096).candidates[0]
    assert best.plan.ep > 1 and best.plan.ep_dispatch == "deepep"
    assert best.plan.deepep_fused_routing_map  # no stream syncs to build its routing map
    allowed = best.plan.recompute != "full" and (best.plan.pp == 1 or best.plan.vpp > 1)
    assert allowed or not best.plan.ep_comm_overlap
    for dispatch in ("flat", "deepep"):
        for overlap in (False, True) if allowed else (False,):
            other = dataclasses.replace(best.plan, ep_dispatch=dispatch, ep_comm_overlap=overlap)
            assert estimate_step(m, c, other).step_time_s >= best.estimate.step_time_s * (1 - 1e-9)
    flat = search(m, c, 256, 4096, space=SearchSpace(ep_dispatches=("flat",), ep_overlaps=(False,)))
    assert all(x.plan.ep_dispatch == "flat" and not x.plan.ep_comm_overlap for x in flat.candidates)
    assert flat.candidates[0].estimate.step_time_s > best.estimate.step_time_s
    r = runner.invoke(
        app, ["plan", "qwen3-30b-a3b", "--gpus", "16", "--ep-dispatch", "hybridep", "--json", "--top", "1"]
    )
    assert r.exit_code == 0, r.stderr
    chosen = json.loads(r.stdout)["plans"][0]["plan"]
    assert chosen["ep"] == 1 or chosen["ep_dispatch"] == "hybridep"
    r = runner.invoke(app, ["plan", "qwen3-30b-a3b", "--gpus", "16", "--ep-dispatch", "nccl"])
    assert r.exit_code == 2 and "--ep-dispatch" in r.stderr


def test_module_frontier_weighs_the_ranks_the_fit_check_reads():
    """The module frontier and the full-recompute proxy weigh the ranks the fit check reads
    (`memory_ranks`: first, last and the middle rank with the most layer parameters), so the set the
    search's bisection settles on is judged where the plan is checked. On DeepSeek-V3 over PP 16 the
    middle rank holds only MoE layers: the forward time they re-run counts its layers besides the end
    ranks', and a set that recomputes every MoE block re-runs no more than all those layers do."""
    from shardscope.costs.compute import group_times_s
    from shardscope.graph.build import build_stage_graph
    from shardscope.planner.modules import layers_forward_s, memory_ranks, module_frontier

    m, c = load_model("deepseek-v3"), make_cluster("H100", 1024)
    plan = make_plan(m, c, tp=2, pp=16, ep=64, global_batch=4096, seq_len=4096)
    ranks = memory_ranks(m, plan.pp, plan.vpp, plan.pp_layout)
    assert len(ranks) == 3 and ranks[:2] == (0, 15) and 0 < ranks[2] < 15
    graph = build_stage_graph(m, plan, c.gpu.arch)
    by_rank = plan.rank_layers(m.layers)

    def forward_s(rank_ids: tuple[int, ...]) -> float:
        return sum(
            sum(group_times_s(c.gpu, graph.layers[graph.kinds[i]], plan)[0]) for r in rank_ids for i in by_rank[r]
        )

    forward = layers_forward_s(m, c, plan)
    assert forward == pytest.approx(forward_s(ranks))
    assert forward > 1.2 * forward_s((0, 15))
    frontier = dict(module_frontier(m, c, plan))
    assert ("moe",) in frontier or any("moe" in s for s in frontier)
    assert max(frontier.values()) <= forward


def test_evolve_copies_a_record_as_dataclasses_replace_does():
    """The planner's fast copy (`records.evolve`) gives what `dataclasses.replace` gives: equal plans with
    equal hashes, `__post_init__` run (a CUDA-graph scope string normalised), a fresh memo for a memoised
    op group (never the original's cached answers), and an error for a name that is no field."""
    import dataclasses

    from shardscope.graph.build import build_stage_graph
    from shardscope.records import evolve

    model = load_model("qwen3-30b-a3b")
    cluster = make_cluster("H100", 16)
    plan = make_plan(model, cluster, ep=8, global_batch=64, seq_len=4096)
    changes = dict(recompute="selective", recompute_modules=("moe_act",), offload_optimizer=True, cuda_graphs="attn")
    fast, slow = evolve(plan, **changes), dataclasses.replace(plan, **changes)
    assert fast == slow and hash(fast) == hash(slow) and fast.cuda_graphs == ("attn",)
    group = next(iter(build_stage_graph(model, plan).layers.values()))
    group.saved_bytes("none")
    copy = evolve(group, attn_ops=group.attn_ops)
    assert copy == group and group.memo and not copy.memo
    with pytest.raises(AttributeError):
        evolve(plan, tensor_parallel=2)


def test_search_tries_hybridep_where_deepep_runs_past_its_nvlink_peers():
    """Left to choose, a MoE plan tries the flat dispatcher and DeepEP; where the EP group puts more than
    DeepEP's 8 NVLink peers in one NVLink domain (GB200 NVL72 at EP 32) HybridEP takes DeepEP's place
    (the guide's DeepEP-to-HybridEP A/B, `test_hybridep_over_deepep_across_an_nvl72_domain`). Across
    8-GPU H100 nodes, or at EP 8, DeepEP stays; a dispatcher the user names is kept as named."""
    from shardscope.planner.search import moe_variants
    from shardscope.planner.space import SearchSpace

    model = load_model("qwen3-30b-a3b")

    def dispatchers(gpu: str, ep: int, space: SearchSpace) -> set[str]:
        cluster = make_cluster(gpu, 64)
        plan = make_plan(model, cluster, ep=ep, global_batch=512, seq_len=4096)
        return {p.ep_dispatch for p in moe_variants(plan, space, cluster)}

    auto = SearchSpace()
    assert dispatchers("GB200", 32, auto) == {"flat", "hybridep"}
    assert dispatchers("GB200", 8, auto) == {"flat", "deepep"}
    assert dispatchers("H100", 32, auto) == {"flat", "deepep"}
    assert dispatchers("GB200", 32, SearchSpace(ep_dispatches=("deepep",))) == {"deepep"}


def test_search_runs_mxfp8_experts_as_transformer_engines_fused_grouped_mlp():
    """Under MXFP8 (Blackwell) the search prices MoE experts as Transformer Engine's fused grouped MLP,
    which Megatron-Core runs with `--use-transformer-engine-op-fuser`: it only drops kernels, so no plan
    is slower for it. Under per-tensor FP8 it stays off (the fused MLP is MXFP8-only)."""
    from shardscope.planner.space import SearchSpace

    m, c = load_model("qwen3-30b-a3b"), make_cluster("B200", 16)
    mx = search(m, c, 256, 4096, space=SearchSpace(precision="fp8", fp8_recipe="mxfp8")).candidates[0]
    assert mx.plan.ep > 1 and mx.plan.fused_expert_mlp
    unfused = dataclasses.replace(mx.plan, fused_expert_mlp=False)
    from shardscope.analytic.step import estimate_step

    assert estimate_step(m, c, unfused).step_time_s > mx.estimate.step_time_s
    cs = search(m, c, 256, 4096, space=SearchSpace(precision="fp8")).candidates[0]
    assert cs.plan.ep > 1 and not cs.plan.fused_expert_mlp
