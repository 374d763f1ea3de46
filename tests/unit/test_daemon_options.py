"""The daemon's ``-o`` options: flags, and ``snapshot=NAME`` (read-only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tierfsd.main import StartupError, first_missing, parse_options


def test_a_snapshot_mount_is_read_only_and_named() -> None:
    options = parse_options("allow_other,snapshot=run-42")
    assert options.snapshot == "run-42"
    assert options.flags == {"allow_other", "ro"}
    assert parse_options("allow_other").snapshot is None


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("snapshot", "unknown mount option 'snapshot'"),
        ("snapshot=", "snapshot="),
        ("snapshot=../x", "snapshot=../x"),
        ("snapshot=a,snapshot=b", "given twice"),
        ("ro=1", "unknown mount option 'ro=1'"),
        ("cache_size=1G", "unknown mount option 'cache_size=1G'"),
    ],
)
def test_a_bad_option_is_named(raw: str, says: str) -> None:
    with pytest.raises(StartupError, match=says.replace(".", r"\.")):
        parse_options(raw)


def test_the_outermost_missing_directory_is_what_a_failed_mount_removes(tmp_path: Path) -> None:
    assert first_missing(tmp_path) is None
    assert first_missing(tmp_path / "a" / "b" / "c") == tmp_path / "a"
