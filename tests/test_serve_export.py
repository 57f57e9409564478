"""`serve-plan --export ENGINE[@RELEASE]`: the launch commands of the best plan. Every option written is in
the engine release's option list (`validation/<engine>_serve_flags.txt`, read from its wheel by
`tools/serve_engine_flags.py`, since the engines are far too heavy to install here), every value is one the
release accepts, the plan's settings come back out of the text, a disaggregated plan launches both pools,
and what a release cannot run (or was never checked) is refused in one line with exit status 2."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import zipfile
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.serve.export import RELEASES, export_release, serve_export, serve_launch
from shardscope.serve.plan import Searched, ServePlan, ServePlanResult

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
LAUNCHERS = {"vllm": ("vllm", "serve"), "sglang": ("python", "-m", "sglang.launch_server")}
# The settings of a plan and the option each engine writes it with
TP = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size"}
SEQS = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}
FP8_KV = {"vllm": "fp8", "sglang": "fp8_e4m3"}
# A small search (as tests/test_serve_plan.py's): Llama-3.1-8B on at most 4 H100s
SMALL = ["llama3.1-8b", "--gpus", "4", "--rate", "10", "--num-prompts", "300", "--slo-ttft-ms", "500"]
SMALL += ["--slo-tpot-ms", "20"]


@cache
def option_list(engine: str) -> tuple[str, frozenset[str], dict[str, frozenset[str]]]:
    """(release named in the header, options, accepted values by key) of validation/<engine>_serve_flags.txt."""
    text = (ROOT / "validation" / f"{engine}_serve_flags.txt").read_text()
    release = re.match(r"# \S+ (\S+) `", text).group(1)
    flags = frozenset(line for line in text.splitlines() if line.startswith("--"))
    values = {}
    for line in text.splitlines():
        if line.startswith("values "):
            key, _, rest = line[len("values ") :].partition(": ")
            values[key] = frozenset(rest.split())
    return release, flags, values


def commands(script: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, argv) of each engine server the script starts, as the shell would split it."""
    body = re.sub(r"\\\n\s*", " ", script)
    out = []
    for line in body.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line.removesuffix("&"))
        env = {}
        while words and re.match(r"^[A-Z_]+=", words[0]):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        if any(tuple(words[: len(lx)]) == lx for lx in LAUNCHERS.values()):
            out.append((env, words))
    return out


def value(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    i = argv.index(flag) + 1
    return argv[i] if i < len(argv) and not argv[i].startswith("--") else ""


def fake_result(model, engine, gpus, tp, ep=1, replicas=1, prefill=0, seqs=256, precision="bf16", kv="bf16"):
    """A serve-plan result holding one plan of this layout (the export reads only the layout and settings)."""
    plan = ServePlan(
        gpus=gpus, tp=tp, ep=ep, replicas=replicas, prefill_replicas=prefill,
        decode_replicas=replicas - prefill, max_num_seqs=seqs, requests_per_s=10.0, goodput_requests_per_s=9.0,
        goodput_requests_per_s_per_gpu=9.0 / gpus, goodput_pct=90.0, ttft_p90_ms=100.0, tpot_p90_ms=20.0,
        ttft_p99_ms=150.0, tpot_p99_ms=25.0, e2e_p90_ms=5000.0, max_kv_usage=0.5, preemptions=0,
        serve_command="shardscope serve ...",
    )  # fmt: skip
    return ServePlanResult(
        model=model, gpu="H100", max_gpus=gpus, engine=engine, precision=precision, kv_dtype=kv, dataset="fixed",
        rate_prompts_per_s=10.0, input_len=1024, output_len=256, num_prompts=1000, slo_ttft_ms=500.0,
        slo_tpot_ms=30.0, slo_percentile=90.0, searched=Searched(), search_s=0.0, plans=[plan],
    )  # fmt: skip


ENGINES = [f"{e}@{r}" for e, rels in RELEASES.items() for r in rels]
# (model, GPUs, TP, EP, replicas, prefill replicas, precision, KV dtype): each way the export lays plans out
LAYOUTS = [
    ("llama3.1-8b", 1, 1, 1, 1, 0, "bf16", "bf16"),  # one server
    ("llama3.1-70b", 8, 2, 1, 4, 0, "bf16", "bf16"),  # dense replicas on one node
    ("llama3.1-70b", 32, 4, 1, 8, 0, "fp8", "fp8"),  # dense replicas on four nodes
    ("qwen3-30b-a3b", 16, 4, 4, 4, 0, "fp8", "bf16"),  # MoE with EP, two nodes
    ("llama3.1-70b", 8, 2, 1, 4, 1, "bf16", "fp8"),  # P:D 1:3 on one node
    ("qwen3-30b-a3b", 16, 2, 2, 8, 3, "fp8", "fp8"),  # P:D 3:5 with EP on two nodes
    ("gpt-oss-120b", 8, 1, 1, 8, 0, "mxfp4", "bf16"),  # the checkpoint's own MXFP4, read as stored
]


def _export(engine: str, layout) -> tuple:
    model, gpus, tp, ep, replicas, prefill, precision, kv = layout
    res = fake_result(model, engine, gpus, tp, ep, replicas, prefill, 192, precision, kv)
    return res, serve_export(res, engine.split("@")[0], model)


def test_the_option_lists_are_of_the_releases_exported() -> None:
    for engine, rels in RELEASES.items():
        release, flags, _ = option_list(engine)
        assert list(rels) == [release], f"{engine}: the export writes {list(rels)}, the list is of {release}"
        assert len(flags) > 200  # the whole parser, not a hand-picked few


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[1]}gpu-tp{x[2]}-ep{x[3]}-r{x[4]}-p{x[5]}")
@pytest.mark.parametrize("engine", ENGINES)
def test_every_option_and_value_written_is_the_releases(engine: str, layout) -> None:
    name = engine.split("@")[0]
    _, flags, values = option_list(name)
    res, script = _export(engine, layout)
    servers = commands(script)
    assert servers
    for _, argv in servers:
        for arg in argv:
            if arg.startswith("--"):
                assert arg in flags, f"{engine} has no option {arg}"
        for flag, v in zip(argv, argv[1:], strict=False):
            if flag in values and flag.startswith("--") and not v.startswith("--"):
                assert v in values[flag], f"{engine}: {flag} {v} is not one of its values"
        cfg = value(argv, "--kv-transfer-config")
        if cfg:
            d = json.loads(cfg)
            assert set(d) <= values["kv_transfer_config"]
            assert d["kv_connector"] in values["kv_connector"] and d["kv_role"] in values["kv_role"]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[1]}gpu-tp{x[2]}-ep{x[3]}-r{x[4]}-p{x[5]}")
@pytest.mark.parametrize("engine", ENGINES)
def test_the_plan_comes_back_out_of_the_commands(engine: str, layout) -> None:
    """TP, EP, max seqs, quantization and the KV dtype of each server are the plan's; the servers take every GPU
    of the plan once, and serve its replicas (DP within a server counted)."""
    name = engine.split("@")[0]
    res, script = _export(engine, layout)
    p = res.plans[0]
    launch = serve_launch(res, layout[0])
    servers = commands(script)
    assert [argv for _, argv in servers] == [list(s.argv) for s in launch.servers]
    replicas = 0
    for env, argv in servers:
        assert value(argv, TP[name]) == str(p.tp)
        assert value(argv, SEQS[name]) == str(p.max_num_seqs)
        assert value(argv, "--quantization") == ("fp8" if res.precision == "fp8" else None)
        assert value(argv, "--kv-cache-dtype") == (FP8_KV[name] if res.kv_dtype == "fp8" else None)
        if p.ep > 1:
            assert value(argv, "--enable-expert-parallel" if name == "vllm" else "--ep-size") in ("", str(p.ep))
        else:
            assert "--enable-expert-parallel" not in argv and "--ep-size" not in argv
        dp = int(value(argv, "--data-parallel-size") or 1)
        replicas += dp
        if "CUDA_VISIBLE_DEVICES" in env:
            assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == p.tp * dp
    assert replicas == p.replicas
    assert sum(len(s.devices) for s in launch.servers) == p.gpus
    placed = {(s.node, d) for s in launch.servers for d in s.devices}
    assert len(placed) == p.gpus  # no GPU twice
    ports = [(s.node, s.port) for s in launch.servers]
    assert len(set(ports)) == len(ports)
    assert ("NODE_RANK" in script) == (launch.nodes > 1)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_disaggregated_plan_exports_both_roles(engine: str) -> None:
    name = engine.split("@")[0]
    res, script = _export(engine, ("llama3.1-70b", 8, 2, 1, 4, 1, "bf16", "bf16"))
    launch = serve_launch(res, "llama3.1-70b")
    roles = [s.role for s in launch.servers]
    assert roles == ["prefill", "decode", "decode", "decode"]
    argvs = [argv for _, argv in commands(script)]
    if name == "vllm":
        configs = [json.loads(value(a, "--kv-transfer-config")) for a in argvs]
        assert all(c == {"kv_connector": "NixlConnector", "kv_role": "kv_both"} for c in configs)
        sides = [s_env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s_env, _ in commands(script)]
        assert len(set(sides)) == len(sides)  # one NIXL side channel per server on the node
    else:
        assert [value(a, "--disaggregation-mode") for a in argvs] == roles
        boot = [
            value(a, "--disaggregation-bootstrap-port") for a in argvs if value(a, "--disaggregation-mode") == "prefill"
        ]
        assert boot == ["8998"]
    assert "prefill" in script and "decode" in script and "FILL IN" in script  # the proxy/router is the user's


def test_a_model_without_a_hugging_face_id_is_a_fill_in(tmp_path: Path) -> None:
    config = json.loads((ROOT / "src/shardscope/models/catalog/llama3.1-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    res = fake_result("custom", "vllm@0.33.0", 1, 1)
    script = serve_export(res, "vllm", str(path))
    assert 'MODEL="${MODEL:?FILL IN:' in script
    assert commands(script)[0][1][:3] == ["vllm", "serve", "$MODEL"] or '"$MODEL"' in script


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_best_plan_of_a_search_round_trips(engine: str, tmp_path: Path) -> None:
    """The export of a real search writes plan #1's TP, max seqs, FP8 weights and KV cache, as --json says;
    -o writes the file and leaves the table on stdout."""
    args = ["serve-plan", *SMALL, "--engine", engine, "--precision", "fp8", "--kv-dtype", "fp8"]
    plans = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    best = plans["plans"][0]
    out = tmp_path / "launch.sh"
    res = runner.invoke(app, [*args, "--export", engine, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "best by goodput" in res.stdout
    script = out.read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    servers = commands(script)
    assert servers
    for _, argv in servers:
        assert value(argv, TP[engine]) == str(best["tp"])
        assert value(argv, SEQS[engine]) == str(best["max_num_seqs"])
        assert value(argv, "--quantization") == "fp8"
        assert value(argv, "--kv-cache-dtype") == FP8_KV[engine]
    assert best["serve_command"] in script
    stdout = runner.invoke(app, [*args, "--export", engine]).stdout  # no -o: the script alone on stdout
    assert stdout == script


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--export", "trtllm"], "pypi.nvidia.com"),
        (["--engine", "trtllm", "--export", "trtllm@0.17"], "no trtllm-serve command is written"),
        (["--export", "vllm@0.32.0"], "written for release 0.33.0"),
        (["--engine", "sglang", "--export", "vllm"], "search with --engine vllm"),
        (["--export", "tgi"], "--export must be one of vllm, sglang, trtllm"),
    ],
)
def test_what_cannot_be_exported_exits_2_with_one_line(args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["serve-plan", *SMALL, *args])
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --export") and needle in lines[0], res.stderr


def test_a_replica_across_nodes_is_refused_in_one_line() -> None:
    res = fake_result("llama3.1-405b", "vllm@0.33.0", 16, 16)
    with pytest.raises(ShardscopeError) as e:
        serve_launch(res, "llama3.1-405b")
    assert "spans nodes of 8 GPUs" in str(e.value) and "\n" not in str(e.value)


def test_export_release_needs_the_engine_priced() -> None:
    assert export_release("vllm", "vllm@0.33.0").release == "0.33.0"
    assert export_release("SGLang@0.5.23", "sglang@0.5.23").command[-1] == "sglang.launch_server"
    with pytest.raises(ShardscopeError, match="priced under"):
        export_release("sglang", "vllm@0.33.0")


def _tool():
    spec = importlib.util.spec_from_file_location("serve_engine_flags", ROOT / "tools" / "serve_engine_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_list_tool_reads_sglang_fields_as_its_parser_registers_them(tmp_path: Path) -> None:
    """The rules of `add_cli_args_from_dataclass`: `A[T, help]` and `A[T, Arg(...)]` fields become
    `--field-name` (or `cli_name`) plus aliases, `no_cli` and plain fields do not; choices and Literals are
    values."""
    fields = """
class Parallel(msgspec.Struct):
    tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
    nnodes: A[int, "The number of nodes."] = 1
    hidden: A[int, Arg(no_cli=True)] = 0
    renamed: A[int, Arg(help="x", cli_name="--other-name")] = 0
    mode: A[Literal["null", "prefill", "decode"], "mode"] = "null"
    backend: A[str, Arg(help="b", choices=BACKENDS)] = "a"
    plain: int = 0
"""
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/srt/arg_groups/fields/parallel.py", fields)
        z.writestr("sglang/srt/server_args.py", 'def f(parser):\n    parser.add_argument("--config", type=str)\n')
        z.writestr("sglang/srt/arg_groups/choices.py", 'BACKENDS = ["a", "b"]\n')
    with zipfile.ZipFile(wheel) as z:
        flags, values, read = _tool().sglang_lists(z)
    assert flags == sorted(["--config", "--tp-size", "--tensor-parallel-size", "--nnodes", "--other-name", "--mode",
                            "--backend"])  # fmt: skip
    assert values == {"--mode": ["null", "prefill", "decode"], "--backend": ["a", "b"]}
    assert "sglang/srt/arg_groups/fields/parallel.py" in read


def test_export_refuses_a_4bit_format_the_checkpoint_is_not_stored_in():
    """No engine quantizes to NVFP4 / MXFP4 / W4A16 while loading: a plan priced so for a BF16 checkpoint
    is refused in one line (an FP8 plan of a BF16 checkpoint gets the engine's load-time FP8)."""
    res = fake_result("llama3.1-8b", ENGINES[0], 1, 1, precision="nvfp4")
    with pytest.raises(ShardscopeError, match="nvfp4 weights load from a checkpoint stored so"):
        serve_launch(res, "llama3.1-8b")


def test_a_wide_ep_plan_is_one_data_parallel_server_over_its_nodes() -> None:
    """vLLM: EP16 over 16 TP1 replicas on two nodes is one server of --data-parallel-size 16 with
    --enable-expert-parallel, 8 ranks a node; node 1 joins node 0 headless from rank 8. Every option is in
    the release's list. SGLang's export does not write it and says so in one line."""
    res = fake_result("qwen3-30b-a3b", "vllm@0.33.0", 16, 1, ep=16, replicas=16)
    script = serve_export(res, "vllm", "qwen3-30b-a3b")
    _, flags, _ = option_list("vllm")
    servers = [argv for _, argv in commands(script)]
    assert len(servers) == 2
    for node, argv in enumerate(servers):
        assert all(a in flags for a in argv if a.startswith("--"))
        assert value(argv, "--data-parallel-size") == "16" and value(argv, "--enable-expert-parallel") == ""
        assert value(argv, "--data-parallel-size-local") == "8" and value(argv, "--tensor-parallel-size") == "1"
        assert value(argv, "--data-parallel-address") == "$HEAD_ADDR"
        assert (value(argv, "--headless") is not None) == (node == 1)
    assert value(servers[1], "--data-parallel-start-rank") == "8" and "HEAD_ADDR=" in script
    launch = serve_launch(res, "qwen3-30b-a3b")
    assert sum(len(s.devices) for s in launch.servers) == 16 and "load balancer" not in script
    sglang = fake_result("qwen3-30b-a3b", "sglang@0.5.23", 16, 1, ep=16, replicas=16)
    with pytest.raises(ShardscopeError, match="wide-EP plan"):
        serve_launch(sglang, "qwen3-30b-a3b")
