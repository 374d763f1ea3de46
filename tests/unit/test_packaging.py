"""Packaging and CI wiring: console scripts, README commands, .ci/run."""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def commands(text: str) -> list[str]:
    """Non-empty, non-comment lines of a shell snippet, comments stripped."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def readme_top_commands() -> list[str]:
    """The commands of the README's first two fenced code blocks (demo, tests)."""
    blocks = FENCE.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 2, "README.md must start with two fenced code blocks"
    return [cmd for block in blocks[:2] for cmd in commands(block)]


def readme_test_command() -> str:
    found = [c for c in readme_top_commands() if "test" in c]
    assert len(found) == 1, f"expected one test command near the top of README.md, got {found}"
    return found[0]


def test_console_scripts_declared():
    scripts = pyproject()["project"]["scripts"]
    assert scripts["tierfs"] == "tierfs.cli:main"
    assert scripts["tierfsd"] == "tierfsd.main:main"


def test_daemon_dir_is_packaged():
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    assert "daemon" in find["where"]
    assert "tierfsd*" in find["include"]
    assert "daemon" in pyproject()["tool"]["pytest"]["ini_options"]["pythonpath"]


def test_readme_top_commands_are_single_lines_that_exist():
    cmds = readme_top_commands()
    assert len(cmds) == 2, cmds
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[0] == "bash", cmd
        assert (REPO / argv[1]).is_file(), f"{cmd}: {argv[1]} does not exist"
    assert any("scripts/demo.sh" in c for c in cmds)


def test_ci_runs_the_readme_test_command():
    ci = REPO / ".ci" / "run"
    text = ci.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert readme_test_command() in commands(text), (
        f".ci/run must run the README's test command {readme_test_command()!r}"
    )
    assert os.access(ci, os.X_OK), ".ci/run must be executable"


def test_command_parsers():
    readme = "# x\n\n```sh\nbash a.sh\n```\ntext\n```\n# note\nbash b.sh  # tests\n```\n"
    assert [commands(b) for b in FENCE.findall(readme)] == [["bash a.sh"], ["bash b.sh"]]
