"""The HTML report: self-contained, and it renders in a real headless browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from shardscope.cli import app

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str | None:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    if os.environ.get("SHARDSCOPE_REQUIRE_CHROMIUM"):
        pytest.fail("headless Chromium is required (.ci/run installs it) but was not found")
    return None


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    r = CliRunner().invoke(
        app, ["report", "llama3.1-70b", "--gpus", "64", "--seq-len", "8192", "--global-batch", "64", "-o", str(path)]
    )
    assert r.exit_code == 0, r.output
    return path


def test_report_is_self_contained(report_file):
    page = report_file.read_text()
    assert "<svg" in page and "application/json" in page
    # nothing to fetch: no external scripts, stylesheets or images
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)


def test_report_renders_in_headless_chromium(report_file, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on this machine")
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        report_file.as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    assert 'data-rendered="ok"' in dom  # the plotting script ran to the end
    scatter = dom[dom.index('id="scatter"') : dom.index("</svg>", dom.index('id="scatter"'))]
    assert scatter.count("<circle") > 20 and "<polyline" in scatter  # every feasible plan + the Pareto front
    memory = dom[dom.index('id="memory"') : dom.index("</svg>", dom.index('id="memory"'))]
    assert memory.count('class="bar"') >= 6  # stacked parts of every stage
    times = dom[dom.index('id="times"') : dom.index("</svg>", dom.index('id="times"'))]
    assert times.count('class="bar"') >= 8
    timeline = dom[dom.index('id="timeline"') : dom.index("</svg>", dom.index('id="timeline"'))]
    assert timeline.count('class="action"') >= 2


def test_report_of_an_fp8_moe_search_names_its_precision(tmp_path):
    path = tmp_path / "moe.html"
    args = ["report", "qwen3-30b-a3b", "--gpu", "B200", "--gpus", "16", "--global-batch", "256"]
    r = CliRunner().invoke(app, [*args, "--precision", "fp8", "--fp8-recipe", "mxfp8", "-o", str(path)])
    assert r.exit_code == 0, r.output
    page = path.read_text()
    assert "FP8 (mxfp8), 256 x 4096 tokens a step" in page
    assert '"warnings": ["MoE layers run eagerly' in page  # the best plan's caveats, listed under the summary
    bad = CliRunner().invoke(app, ["report", "llama3.1-8b", "--video", "81x720x1280", "-o", str(tmp_path / "x.html")])
    assert bad.exit_code == 2 and "needs a video diffusion model" in bad.stderr
