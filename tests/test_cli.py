"""The command line: JSON schema, one-line errors with exit status 2, validation output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from shardscope.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_estimate_json_schema():
    r = run(
        "estimate",
        "llama3.1-70b",
        "--gpu",
        "H100",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "2",
        "--global-batch",
        "64",
        "--seq-len",
        "8192",
        "--recompute",
        "selective",
        "--json",
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["params"]["total"] == 70553706496 and isinstance(d["params"]["total"], int)
    for key in ("per_gpu",):
        assert key in d["params"]
    for key in ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "fits"):
        assert key in d
    assert set(d["memory"]) >= {
        "peak_gib",
        "params_gib",
        "grads_gib",
        "optimizer_gib",
        "activations_gib",
        "buffers_gib",
    }
    assert set(d["time"]) >= {"compute_s", "exposed_comm_s", "bubble_s", "optimizer_s"}
    assert d["plan"]["dp"] == 4


def test_estimate_table_output():
    r = run("estimate", "qwen3-8b", "--gpus", "8", "--fsdp", "--global-batch", "16")
    assert r.exit_code == 0
    assert "MFU" in r.stdout and "required" in r.stdout


def test_estimate_that_does_not_fit_points_to_the_plan_search():
    r = run("estimate", "llama3.1-70b", "--gpus", "8", "--global-batch", "8")
    assert r.exit_code == 0
    assert "does NOT fit" in r.stdout
    assert "shardscope plan llama3.1-70b --gpu H100 --gpus 8 --seq-len" in " ".join(r.stdout.split())
    assert "hint" not in run("estimate", "qwen3-8b", "--gpus", "8", "--fsdp", "--global-batch", "16").stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (("estimate", "llama-9000"), "unknown model"),
        (("estimate", "llama3.1-8b", "--gpu", "H1000"), "unknown GPU"),
        (("estimate", "llama3.1-8b", "--tp", "3"), "not divisible"),
        (("estimate", "llama3.1-8b", "--gpus", "16", "--global-batch", "20", "--micro-batch", "2"), "not divisible"),
        (("estimate", "llama3.1-8b", "--micro-batch", "0"), "positive"),
        (("estimate", "llama3.1-8b", "--gpus", "-8"), "positive"),
        (("estimate", "/nonexistent/config.json"), "not found"),
        (("validate", "/nonexistent.csv"), "not found"),
        (("estimate", "llama3.1-8b", "--main-grads", "fp8"), "--main-grads must be one of fp32, bf16"),
        (("estimate", "llama3.1-8b", "--cuda-graphs", "attn,layers"), "unknown layers; choose none or from attn, mlp"),
        (("estimate", "qwen3-30b-a3b", "--ep", "8", "--no-pad-to-capacity"), "needs --capacity-factor > 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run(*args)
    assert r.exit_code == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.output


def test_malformed_config_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    r = run("estimate", str(bad))
    assert r.exit_code == 2 and "malformed" in r.stderr


def test_models_and_gpus_lists():
    assert "llama3.1-405b" in run("models").stdout
    out = run("gpus").stdout
    assert "H100" in out and "MI300X" in out


def test_console_script_starts_without_torch():
    """`estimate --json` must not import torch or plotting libraries."""
    code = (
        "import sys; from shardscope.cli import app; "
        "sys.argv=['shardscope','estimate','llama3.1-8b','--json']; "
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: app()\n"
        "    except SystemExit: pass\n"
        "print(any(m.split('.')[0] in ('torch','matplotlib','plotly','numpy') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_bad_pipeline_layout_is_one_line_and_exit_2():
    result = runner.invoke(
        app,
        ["estimate", "deepseek-v3", "--gpus", "256", "--pp", "4", "--vpp", "4", "--ep", "64", "--pp-layout", "Et*4|L"],
    )
    assert result.exit_code == 2
    assert "--pp-layout" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ("report", "llama3.1-8b", "-o", "/nonexistent-folder/r.html"),
        ("estimate", "llama3.1-8b", "--trace", "/nonexistent-folder/t.json"),
        ("estimate", "llama3.1-8b", "--trace", "/tmp"),
        ("plan", "llama3.1-8b", "--export", "megatron", "-o", "/nonexistent-folder/x.sh"),
    ],
)
def test_output_paths_are_checked_before_any_work(args):
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,needle",
    [
        (["estimate", "llama3.1-8b", "--gpus", "abc"], "Invalid value for '--gpus'"),
        (["estimate", "llama3.1-8b", "--bogus", "1"], "No such option: --bogus"),
        (["estimate"], "Missing argument"),
        (["nosuch"], "No such command"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, needle):
    """A flag of the wrong type, an unknown option or command, a missing argument: one line, exit 2 (the
    installed `shardscope` command is `cli.main`)."""
    code = "import sys; from shardscope.cli import main; sys.argv = ['shardscope', *sys.argv[1:]]; main()"
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
