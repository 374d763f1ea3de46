"""``tierfs.torch.PrefetchSampler`` off a tierfs mount: the epochs run
without prefetch, with one warning, and nothing is left for the garbage
collector to complain about (no mount needed)."""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from tierfs.client import PrefetchSession
from tierfs.errors import NotATierfsMount
from tierfs.torch import PrefetchSampler


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``__del__`` methods raised ("Exception ignored in ...")."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_a_session_off_a_mount_raises_and_leaves_nothing_behind(
    tmp_path: Path, unraisable: list[Any]
) -> None:
    with pytest.raises(NotATierfsMount):
        PrefetchSession(tmp_path)
    gc.collect()
    assert unraisable == []


def test_a_sampler_off_a_mount_runs_each_epoch_without_prefetch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, unraisable: list[Any]
) -> None:
    with caplog.at_level(logging.WARNING, logger="tierfs.torch"):
        sampler = PrefetchSampler([2, 0, 1], ["a", "b", "c"], mountpoint=tmp_path)
    assert sampler.session is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "tierfs.torch"]
    assert len(warnings) == 1 and "without prefetch" in warnings[0], warnings
    caplog.clear()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert list(sampler) == [2, 0, 1]
        assert sampler.last_order is None
    assert not caplog.records  # said once, at construction
    sampler.close()
    del sampler
    gc.collect()
    assert unraisable == []
