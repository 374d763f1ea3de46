"""SpaceManager over a real MetaDB and real tier directories: placement with
``prefer``/``avoid`` (fills into a chosen tier, relocates), ``reserve_on``,
and ``drop_clean``, the one place that drops local copies; plus
``Tier.punch_hole``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierfs.config import TierConfig
from tierfs.core.state.space import SpaceManager
from tierfs.meta import BlockRecord, MetaDB
from tierfs.tiers import Tier

MiB = 1024 * 1024


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[MetaDB, list[Tier], SpaceManager]]:
    meta = MetaDB(tmp_path / "meta", "s3://b")
    tiers = []
    for index, name in enumerate(("nvme", "hdd")):
        (tmp_path / name).mkdir()
        tiers.append(Tier(index, TierConfig(name, tmp_path / name, 4 * MiB, 0.9, 0.5)))
    busy: set[int] = set()
    yield meta, tiers, SpaceManager(tiers, meta, is_busy=busy.__contains__)
    meta.close()
    for tier in tiers:
        tier.close()


def test_reserve_prefers_and_avoids(parts: tuple[MetaDB, list[Tier], SpaceManager]) -> None:
    _meta, _tiers, space = parts
    assert space.reserve(MiB) == 0
    assert space.reserve(MiB, prefer=1) == 1
    assert space.reserve(MiB, avoid=0) == 1
    assert space.reserve(MiB, prefer=0, avoid=0) == 1  # avoid wins
    assert space.used(0) == MiB and space.used(1) == 3 * MiB
    assert not space.reserve_on(1, 2 * MiB)  # 3 of 4 MiB reserved
    assert space.used(1) == 3 * MiB
    assert space.reserve(2 * MiB, prefer=1) == 0  # no room there: the usual order
    assert space.reserve_on(1, MiB)
    assert space.used(1) == 4 * MiB


def test_drop_clean_keeps_dirty_blocks(parts: tuple[MetaDB, list[Tier], SpaceManager]) -> None:
    meta, tiers, space = parts
    ino = 42
    for tier in tiers:
        fd = tier.open_file(ino, create=True)
        assert fd is not None
        os.close(fd)
    meta.add_block(ino, 0, BlockRecord(tier=0, digest=1, nbytes=MiB))
    meta.add_block(ino, 1, BlockRecord(tier=0, digest=2, nbytes=MiB, dirty=True, sealed=True))
    meta.add_block(ino, 2, BlockRecord(tier=1, digest=3, nbytes=1000))

    assert space.drop_clean(ino, 1) == 1000
    assert meta.residency(ino) == {0: 2 * MiB}
    assert not (tiers[1].path / "data" / f"{ino % 256:02x}" / str(ino)).exists()

    assert space.drop_clean(ino) == MiB  # the dirty block stays, and its file
    assert sorted(meta.get_blocks(ino)) == [1]
    assert meta.residency(ino) == {0: MiB}
    assert meta.tier_usage(0).bytes == MiB and meta.tier_usage(0).files == 1
    assert meta.tier_usage(1).bytes == 0 and meta.tier_usage(1).files == 0
    assert (tiers[0].path / "data" / f"{ino % 256:02x}" / str(ino)).exists()
    assert space.drop_clean(ino) == 0
    assert (space.evicted_files, space.evicted_bytes) == (2, MiB + 1000)


def test_punch_hole_frees_the_range(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (2 * MiB))
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
        before = os.fstat(fd).st_blocks
        if not Tier.punch_hole(fd, 0, MiB):
            pytest.skip("this filesystem cannot punch holes")
        assert os.fstat(fd).st_size == 2 * MiB
        assert os.fstat(fd).st_blocks < before
        assert os.pread(fd, MiB, 0) == bytes(MiB)
        assert os.pread(fd, MiB, MiB) == b"x" * MiB
    finally:
        os.close(fd)


def test_demote_first_makes_a_read_file_the_first_victim(
    parts: tuple[MetaDB, list[Tier], SpaceManager],
) -> None:
    """Order-aware prefetch's hint: a file read in this epoch leaves the first
    tier before files opened more often and before newer ones, and counts as
    not re-accessed; other tiers' ranking is not touched."""
    _meta, _tiers, space = parts
    first, second = space.trackers
    for ino in (11, 12, 13):
        first.on_insert(ino, 100)
        second.on_insert(ino, 100)
    for _ in range(3):
        for ino in (11, 12, 13):
            space.opened(ino)
    space.demote_first(13)
    assert first.queue_of(13) == "first"
    assert list(first.victims(100)) == [13]
    # Not re-accessed: the others (opened three times each) stay, 13 went alone.
    assert sorted(first.inodes()) == [11, 12]
    # The second tier ranks as before: 13 is not its first victim.
    assert second.queue_of(13) != "first"
    assert next(second.victims(100)) == 11
    # A file not on the first tier is ignored (no entry is created).
    space.demote_first(99)
    assert 99 not in first


def test_a_block_added_ahead_of_its_open_makes_the_open_its_first_use(
    parts: tuple[MetaDB, list[Tier], SpaceManager],
) -> None:
    """``block_added(used=False)`` (a fetch nobody asked for yet): the next
    open is the file's first use; ``used=True`` (the file is open): the next
    open is its second, and it is worth keeping."""
    _meta, _tiers, space = parts
    first = space.trackers[0]
    space.block_added(21, 0, MiB, used=False)
    space.block_added(22, 0, MiB, used=True)
    space.block_added(23, 0, MiB, used=False)
    for ino in (21, 22, 23):
        space.opened(ino)
    space.settle([2 * MiB, 0])  # what giving up 2 MiB would do: 21 and 23 go
    assert [first.queue_of(ino) for ino in (21, 22, 23)] == ["first", "main", "first"]
    assert space.ranking_later()() == [21, 23, 22]


def test_files_resident_at_mount_count_their_first_open_as_their_first_use(
    parts: tuple[MetaDB, list[Tier], SpaceManager],
) -> None:
    """A remount rebuilds the trackers from the residency: a pass over files
    that were resident before is one use each, not a re-access."""
    meta, tiers, _space = parts
    for ino in (31, 32):
        meta.add_block(ino, 0, BlockRecord(tier=0, digest=ino, nbytes=MiB))
    meta.commit()
    space = SpaceManager(tiers, meta, is_busy=lambda ino: False)
    first = space.trackers[0]
    space.opened(31)
    space.opened(32)
    space.opened(32)
    assert (first.freq_of(31), first.freq_of(32)) == (0, 1)
