"""Tier.usable_bytes reuses a recent statvfs answer, less what was placed since,
and asks again when it is old or the filesystem is nearly full
(``tierfs.tiers``, module docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierfs import tiers as tier_module
from tierfs.config import TierConfig
from tierfs.tiers import STATFS_REUSE, STATFS_REUSE_ABOVE, FsStats, Tier

MiB = 1 << 20
GiB = 1 << 30


class FakeFilesystem:
    """What statvfs answers, and how often it was asked."""

    def __init__(self, free: int) -> None:
        self.total = 100 * GiB
        self.free = free
        self.asked = 0

    def stats(self) -> FsStats:
        self.asked += 1
        return FsStats(total=self.total, free=self.free)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(tier_module.time, "monotonic", lambda: now[0])
    return now


def make_tier(tmp_path: Path, fake: FakeFilesystem, monkeypatch: pytest.MonkeyPatch) -> Tier:
    (tmp_path / "nvme").mkdir()
    tier = Tier(0, TierConfig("nvme", tmp_path / "nvme", None, 0.9, 0.5))
    monkeypatch.setattr(tier, "fs_stats", fake.stats)
    return tier


def test_a_recent_answer_is_reused_less_what_was_placed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    fake = FakeFilesystem(free=50 * GiB)
    tier = make_tier(tmp_path, fake, monkeypatch)
    assert tier.usable_bytes(0) == 50 * GiB
    clock[0] += STATFS_REUSE / 2
    assert tier.usable_bytes(10 * MiB) == 50 * GiB - 10 * MiB
    assert fake.asked == 1
    # Bytes given back are not counted back until the filesystem is asked.
    assert tier.usable_bytes(0) == 50 * GiB
    assert fake.asked == 1


def test_an_old_answer_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    fake = FakeFilesystem(free=50 * GiB)
    tier = make_tier(tmp_path, fake, monkeypatch)
    tier.usable_bytes(0)
    fake.free = 20 * GiB  # another process filled the filesystem
    clock[0] += STATFS_REUSE
    assert tier.usable_bytes(0) == 20 * GiB
    assert fake.asked == 2


def test_near_full_every_placement_asks_the_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    fake = FakeFilesystem(free=STATFS_REUSE_ABOVE + 64 * MiB)
    tier = make_tier(tmp_path, fake, monkeypatch)
    tier.usable_bytes(0)
    assert tier.usable_bytes(32 * MiB) == STATFS_REUSE_ABOVE + 32 * MiB
    assert fake.asked == 1
    # What the answer would leave free is no longer above the floor: ask.
    fake.free = 8 * MiB
    assert tier.usable_bytes(64 * MiB) == 8 * MiB
    assert tier.usable_bytes(64 * MiB) == 8 * MiB
    assert fake.asked == 3


def test_the_real_filesystem_answers(tmp_path: Path) -> None:
    (tmp_path / "nvme").mkdir()
    tier = Tier(0, TierConfig("nvme", tmp_path / "nvme", 64 * MiB, 0.9, 0.5))
    assert 0 < tier.usable_bytes(0) <= 64 * MiB
    assert tier.usable_bytes(64 * MiB) == 0
