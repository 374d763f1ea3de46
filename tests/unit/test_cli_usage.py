"""The CLI's surface, without a mount: every subcommand's ``--help`` says
what it does and names its positional arguments; usage errors are one JSON
document with ``--json``; a path that does not exist is "no such file"."""

from __future__ import annotations

import argparse
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tierfs import cli, mounthelper


def subcommands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)subcommand of ``parser`` by its full name, e.g. "policy check"."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                full = f"{prefix}{name}"
                found[full] = child
                found.update(subcommands(child, f"{full} "))
    return found


ALL = subcommands(cli.build_parser())


def test_the_parser_has_every_command_of_the_contract() -> None:
    for name in (
        "mount",
        "umount",
        "status",
        "where",
        "preload",
        "prefetch",
        "flush",
        "evict",
        "pin",
        "unpin",
        "policy check",
        "policy show",
        "policy plan",
        "policy reload",
        "quota",
    ):
        assert name in ALL


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_subcommand_says_what_it_does_and_names_its_arguments(name: str) -> None:
    parser = ALL[name]
    assert parser.description and len(parser.description) > 40, (
        f"tierfs {name} --help: no description"
    )
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help, f"tierfs {name}: positional {action.dest} has no help"
        # NAME, OTHER: snapshots' names, as the contract spells them.
        assert action.metavar in {"MOUNTPOINT", "PATH", "CONFIG", "FILE", "NAME", "OTHER"}, (
            f"tierfs {name}: positional {action.dest} is shown as {action.metavar!r}"
        )


def run(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierfs.cli", *words], capture_output=True, text=True, timeout=60
    )


def test_help_lists_the_exit_statuses() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "exit status" in done.stdout and "2 bad usage" in done.stdout


@pytest.mark.parametrize(
    "words",
    [
        ("status", "--json"),
        ("where", "--json"),
        ("bogus", "--json"),
        ("preload", "--json", "--tier"),
    ],
)
def test_a_usage_error_with_json_is_one_json_document(words: tuple[str, ...]) -> None:
    done = run(*words)
    assert done.returncode == cli.USAGE_EXIT
    document = json.loads(done.stdout)
    assert document["ok"] is False and document["errno"] == errno.EINVAL
    assert document["error"] and document["usage"].startswith("usage: tierfs")


def test_a_usage_error_without_json_is_usage_and_one_line_on_stderr() -> None:
    done = run("status")
    assert done.returncode == cli.USAGE_EXIT and done.stdout == ""
    assert done.stderr.startswith("usage: tierfs status")
    assert "tierfs status: error: the following arguments are required: MOUNTPOINT" in done.stderr


def test_where_of_a_path_that_does_not_exist_is_no_such_file(tmp_path: Path) -> None:
    missing = tmp_path / "nonexist" / "x"
    done = run("where", str(missing))
    assert done.returncode == 1
    assert done.stderr.strip() == f"tierfs: {missing}: no such file or directory"
    done = run("where", "--json", str(missing))
    assert json.loads(done.stdout) == {
        "ok": False,
        "error": f"{missing}: no such file or directory",
        "errno": errno.ENOENT,
    }
    done = run("where", str(tmp_path))  # it exists, off any mount
    assert done.stderr.strip() == f"tierfs: {tmp_path} is not on a tierfs mount"


def test_every_json_error_has_an_errno(tmp_path: Path) -> None:
    """A config error, an argument the command cannot use, a control error."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tiers]\n")
    for words in (
        ("policy", "check", "--json", str(bad)),
        ("preload", "--json", "--ready-fraction", "2", str(tmp_path)),
        ("status", "--json", str(tmp_path)),
    ):
        done = run(*words)
        assert done.returncode == 1, (words, done.stderr)
        document = json.loads(done.stdout)
        assert document["ok"] is False and isinstance(document["errno"], int), (words, document)


def test_the_mount_helper_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert mounthelper.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: mount.fuse.tierfs CONFIG MOUNTPOINT")
