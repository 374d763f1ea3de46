"""The lifecycle clock and its test offset file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tierfs.core.state import clock as clock_module
from tierfs.core.state.clock import Clock


def test_without_a_file_the_clock_is_the_real_one() -> None:
    before = time.time()
    now = Clock(offset_file="").now()
    assert before <= now <= time.time()


def test_the_offset_file_moves_the_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock_module, "_RECHECK", 0.0)
    offset_file = tmp_path / "offset"
    clock = Clock(offset_file=str(offset_file))
    assert abs(clock.now() - time.time()) < 1.0  # no file yet: offset 0
    offset_file.write_text("259200\n")  # three days
    assert abs(clock.now() - time.time() - 259200) < 1.0
    offset_file.write_text("not a number")
    assert abs(clock.now() - time.time() - 259200) < 1.0  # a bad file keeps the offset
    offset_file.unlink()
    assert abs(clock.now() - time.time()) < 1.0
