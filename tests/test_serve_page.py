"""The serving page of `serve-plan --report`: self-contained, the curves of the best deployments run past
their knee, each curve passes through the search's own run at the rate asked, and it renders in a browser."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from test_report import _browser
from typer.testing import CliRunner

from shardscope.cli import app

ARGS = ["serve-plan", "llama3.1-8b", "--gpus", "2", "--rate", "4", "--input-len", "512", "--output-len", "128",
        "--num-prompts", "200", "--slo-tpot-ms", "40"]  # fmt: skip


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "serve.html"
    r = CliRunner().invoke(app, [*ARGS, "--report", str(path), "--json"])
    assert r.exit_code == 0, r.output
    text = path.read_text()
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S).group(1))
    return path, text, data, json.loads(r.stdout)


def test_serve_page_is_self_contained_with_a_curve_per_best_deployment(page):
    _, text, data, result = page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert len(data["curves"]) == min(3, len(result["plans"])) and data["slo_tpot_ms"] == 40
    for curve, plan in zip(data["curves"], result["plans"], strict=False):
        asked = next(p for p in curve["points"] if p["factor"] == 1)
        # where the deployment sits at the rate asked is the search's own simulation of it
        assert asked["ttft_p90_ms"] == plan["ttft_p90_ms"] and asked["tpot_p90_ms"] == plan["tpot_p90_ms"]
        factors = [p["factor"] for p in curve["points"]]
        assert factors == sorted(factors) and factors[0] == 0.25
        first, last = curve["points"][0], curve["points"][-1]
        # run past the knee: the last point queues (p90 TTFT several times the lightly loaded one)
        assert last["ttft_p90_ms"] >= 4 * first["ttft_p90_ms"] or last["factor"] == 64
        assert last["requests_per_s"] > first["requests_per_s"]


def test_serve_page_renders_in_headless_chromium(page, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on this machine")
    path, _, data, _ = page
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri()]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    assert 'data-rendered="ok"' in dom
    curves = len(data["curves"])
    assert dom.count('class="curve"') == 2 * curves and dom.count('class="asked"') == 2 * curves
    assert dom.count('class="slo"') == 1  # only the TPOT SLO was given


def test_serve_page_path_is_checked_before_the_search(tmp_path):
    r = CliRunner().invoke(app, [*ARGS, "--report", str(tmp_path / "missing" / "serve.html")])
    assert r.exit_code == 2 and "does not exist" in r.output and len(r.output.strip().splitlines()) == 1
