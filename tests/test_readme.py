"""The README's examples print what the commands print: every line shown under a `$ shardscope ...` line of
a fenced block appears, in order, in that command's output (spacing and line wrapping aside)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def _examples() -> list[tuple[str, list[str]]]:
    """(command, lines shown after it) for every `$ shardscope` line of the README's fenced blocks."""
    out: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), flags=re.S):
        current: list[str] | None = None
        for line in block.splitlines():
            if line.startswith("$ shardscope "):
                current = []
                out.append((line[2:].split("  #")[0].strip(), current))
            elif current is not None and line.strip():
                current.append(line)
    return [(cmd, shown) for cmd, shown in out if shown]


def _collapse(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command,shown", _examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_readme_examples_match_what_the_commands_print(command, shown):
    r = CliRunner().invoke(app, shlex.split(command)[1:], env={"COLUMNS": "140"})
    assert r.exit_code == 0, r.output
    printed, at = _collapse(r.stdout), 0
    for line in shown:
        found = printed.find(_collapse(line), at)
        assert found >= 0, f"README line not printed (in order) by `{command}`:\n{line}\n--- printed:\n{r.stdout}"
        at = found


def test_readme_has_examples():
    assert len(_examples()) >= 3
