"""``tierfs policy check``: errors at file:line, and rules that can never match."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierfs.cli import main


def test_a_shadowed_rule_is_a_warning_with_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rules]]\nmatch = "data/**"\npin = true\n\n[[rules]]\nmatch = "data/x/*"\npromote = "never"\n'
    )
    assert main(["policy", "check", str(policy)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok"
    assert f"{policy}:5: warning: this rule can never match" in err, err
    assert f"{policy}:1" in err


def test_a_broken_policy_file_fails_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nmatch = "data/**"\nevict_afterr = "3d"\n')
    assert main(["policy", "check", str(policy)]) == 1
    _, err = capsys.readouterr()
    assert f"{policy}:3:" in err and "evict_after" in err, err


def test_independent_rules_give_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rules]]\nmatch = "a/**"\npin = true\n\n[[rules]]\nmatch = "b/*"\ncache = false\n'
    )
    assert main(["policy", "check", str(policy)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok" and err == ""
