"""The data-movement API (``tierfs.core.tiering.movement``) over a real bucket (moto),
no mount: check, fill, relocate and evict, with the per-tier accounting
checked exactly after each, and the crash states of a relocate (copy done
but not switched; switched but the old copy not deleted) taken through a
remount and its orphan cleanup."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, MiB, put
from tierfs.config import WriteConfig
from tierfs.core.tiering.movement import BlockCopier, DataMovement
from tierfs.errors import Busy, NoSpace
from tierfs.meta import SyncState

NVME, HDD = 0, 1


def pattern(size: int, seed: int = 7) -> bytes:
    """Bytes that differ per block, so that a block read from the wrong
    place cannot pass for the right one."""
    return bytes((i * seed + i // MiB) % 251 for i in range(size))


def cache_file(mount: CoreMount, tier: int, ino: int) -> Path:
    return mount.config.tiers[tier].path / "data" / f"{ino % 256:02x}" / str(ino)


def usage(mount: CoreMount) -> list[tuple[int, int]]:
    """(bytes, files) per tier, as LMDB accounts them."""
    out = []
    for tier in (NVME, HDD):
        u = mount.fs.meta.tier_usage(tier)
        out.append((u.bytes, u.files))
    return out


def one_record_per_block(mount: CoreMount, ino: int, nblocks: int) -> dict[int, int]:
    """blockno -> tier from LMDB; each block number appears once by construction
    of the key, so also check that residency agrees with the records."""
    records = mount.fs.meta.get_blocks(ino)
    assert sorted(records) == list(range(nblocks))
    per_tier: dict[int, int] = {}
    for rec in records.values():
        per_tier[rec.tier] = per_tier.get(rec.tier, 0) + rec.nbytes
    assert mount.fs.meta.residency(ino) == per_tier
    return {b: rec.tier for b, rec in records.items()}


async def wait_until_gone(path: Path, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while path.exists():
            await trio.sleep(0.02)


async def clean_file(mount: CoreMount, s3_store: Any, key: str, data: bytes) -> int:
    put(s3_store, key, data)
    return (await mount.fs.namespace.resolve(key)).ino


async def test_check_and_fill_into_a_chosen_tier(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(5 * MiB + 1000)
    ino = await clean_file(mount, s3_store, "a.bin", data)
    movement: DataMovement = mount.fs.movement

    before = movement.check(ino)
    assert (before.size, before.blocks_total, before.blocks) == (len(data), 6, [])
    assert before.bytes_per_tier == {} and before.dirty_bytes == 0

    assert await movement.fill(ino, HDD, blocks=range(1, 3)) == 2 * MiB
    assert [(p.blockno, p.tier) for p in movement.check(ino).blocks] == [(1, HDD), (2, HDD)]
    assert usage(mount) == [(0, 0), (2 * MiB, 1)]

    assert await movement.fill(ino, HDD) == len(data) - 2 * MiB
    assert await movement.fill(ino, HDD) == 0  # nothing absent any more
    residency = movement.check(ino)
    assert residency.bytes_per_tier == {HDD: len(data)}
    assert {p.tier for p in residency.blocks} == {HDD}
    assert usage(mount) == [(0, 0), (len(data), 1)]
    gets = len(mount.store.gets)
    assert await mount.read_file("a.bin") == data
    assert len(mount.store.gets) == gets  # all served from the tier


async def test_fill_shares_the_fetch_of_a_demand_read(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(4 * MiB)
    ino = await clean_file(mount, s3_store, "shared.bin", data)
    got: list[bytes] = []

    async def reader() -> None:
        got.append(await mount.read_file("shared.bin"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(mount.fs.movement.fill, ino)
    assert got == [data]
    fetched = [g for g in mount.store.gets if g[0].endswith("shared.bin")]
    assert sum(length for _key, _start, length in fetched) == len(data)  # each byte once
    assert sum(b for b, _f in usage(mount)) == len(data)


async def test_relocate_moves_every_block_and_reads_back_equal(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(3 * MiB + 4096)
    ino = await clean_file(mount, s3_store, "m.bin", data)
    movement: DataMovement = mount.fs.movement
    await movement.fill(ino, NVME)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    assert cache_file(mount, NVME, ino).exists()

    throttled: list[int] = []

    async def throttle(nbytes: int) -> None:
        throttled.append(nbytes)

    movement.copy_chunk = 2 * MiB
    assert await movement.relocate(ino, NVME, HDD, throttle=throttle) == len(data)
    assert throttled == [2 * MiB, MiB + 4096]  # one call per chunk of whole blocks
    assert one_record_per_block(mount, ino, 4) == dict.fromkeys(range(4), HDD)
    assert usage(mount) == [(0, 0), (len(data), 1)]
    # The old copy is deleted in the background, soon after the switch.
    # The unlink task holds a reference to the file until it is done.
    with trio.fail_after(5):
        while cache_file(mount, NVME, ino).exists() or ino in mount.fs.open_files.files:
            await trio.sleep(0.01)
    gets = len(mount.store.gets)
    assert await mount.read_file("m.bin") == data
    assert len(mount.store.gets) == gets

    # And back up, then through a remount (first reads verify on the new tier).
    assert await movement.relocate(ino, HDD, NVME) == len(data)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    mount = await mount.remount()
    assert await mount.read_file("m.bin") == data
    assert len(mount.store.gets) == gets
    assert mount.fs.status()["counters"]["verify_failures"] == 0  # type: ignore[index]


async def test_relocate_right_after_a_relocate_waits_for_the_old_copy_unlink(
    make_fs: Any, s3_store: Any
) -> None:
    """A promotion asked for by the first read after a demotion comes while
    the demotion's old copy still waits for the group commit (its tier is
    fenced): it waits for the unlink instead of being refused as busy."""
    mount = await make_fs()
    data = pattern(2 * MiB + 512)
    ino = await clean_file(mount, s3_store, "back.bin", data)
    movement: DataMovement = mount.fs.movement
    await movement.fill(ino, NVME)
    assert await movement.relocate(ino, NVME, HDD) == len(data)
    cf = mount.fs.open_files.files.get(ino)
    assert cf is not None and cf.fenced_tier == NVME  # the old copy's unlink is pending
    assert await movement.relocate(ino, HDD, NVME) == len(data)
    assert one_record_per_block(mount, ino, 3) == dict.fromkeys(range(3), NVME)
    with trio.fail_after(5):
        while cache_file(mount, HDD, ino).exists() or ino in mount.fs.open_files.files:
            await trio.sleep(0.01)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    gets = len(mount.store.gets)
    assert await mount.read_file("back.bin") == data
    assert len(mount.store.gets) == gets


async def test_relocate_while_a_reader_has_the_file_open(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(2 * MiB)
    ino = await clean_file(mount, s3_store, "r.bin", data)
    await mount.fs.movement.fill(ino, NVME)
    opened = await mount.fs.open(ino, os.O_RDONLY)
    try:
        assert await mount.fs.read(opened.fh, 0, 1000) == data[:1000]
        assert await mount.fs.movement.relocate(ino, NVME, HDD) == len(data)
        assert bytes(await mount.fs.read(opened.fh, MiB - 10, 20)) == data[MiB - 10 : MiB + 10]
    finally:
        await mount.fs.release(opened.fh)
    assert usage(mount) == [(0, 0), (len(data), 1)]
    assert await mount.read_file("r.bin") == data
    # The reader had the old cache file open: its moved blocks were punched
    # out instead; with no record on that tier, the next mount deletes it.
    old_copy = cache_file(mount, NVME, ino)
    assert old_copy.stat().st_blocks == 0
    mount = await mount.remount()
    await wait_until_gone(old_copy)
    assert await mount.read_file("r.bin") == data


async def test_relocate_refuses_a_file_open_for_writing(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(2 * MiB)
    ino = await clean_file(mount, s3_store, "w.bin", data)
    await mount.fs.movement.fill(ino, NVME)
    opened = await mount.fs.open(ino, os.O_RDWR)
    try:
        with pytest.raises(Busy):
            await mount.fs.movement.relocate(ino, NVME, HDD)
    finally:
        await mount.fs.release(opened.fh)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    assert not cache_file(mount, HDD, ino).exists()
    assert one_record_per_block(mount, ino, 2) == {0: NVME, 1: NVME}


async def test_relocate_refuses_a_file_changed_during_the_copy(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(3 * MiB)
    ino = await clean_file(mount, s3_store, "c.bin", data)
    await mount.fs.movement.fill(ino, NVME)
    mount.fs.movement.copy_chunk = MiB
    changed = False

    async def write_during_copy(nbytes: int) -> None:
        nonlocal changed
        if not changed:  # after the first chunk: a writer comes and goes
            changed = True
            opened = await mount.fs.open(ino, os.O_RDWR)
            await mount.fs.write(opened.fh, 2 * MiB, b"new bytes")
            await mount.fs.release(opened.fh)

    with pytest.raises(Busy, match="changed"):
        await mount.fs.movement.relocate(ino, NVME, HDD, throttle=write_during_copy)
    assert not cache_file(mount, HDD, ino).exists()  # the copy was discarded
    assert one_record_per_block(mount, ino, 3) == dict.fromkeys(range(3), NVME)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    expected = data[: 2 * MiB] + b"new bytes" + data[2 * MiB + 9 :]
    assert await mount.read_file("c.bin") == expected


async def test_relocate_without_room_raises_no_space(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs(capacities=(8 * MiB, 2 * MiB))
    data = pattern(3 * MiB)
    ino = await clean_file(mount, s3_store, "big.bin", data)
    await mount.fs.movement.fill(ino, NVME)
    with pytest.raises(NoSpace):
        await mount.fs.movement.relocate(ino, NVME, HDD)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    assert not cache_file(mount, HDD, ino).exists()
    assert await mount.read_file("big.bin") == data


async def test_dirty_blocks_move_with_their_digests_and_are_never_evicted(
    make_fs: Any,
) -> None:
    mount = await make_fs(write=WriteConfig(mode="back", upload_delay=3600, part_size=8 * MiB))
    data = pattern(2 * MiB + 500, seed=11)
    ino = await mount.write_file("dirty.bin", data)
    movement: DataMovement = mount.fs.movement
    before = mount.fs.meta.get_blocks(ino)
    assert all(rec.dirty and rec.sealed for rec in before.values())
    src = next(iter(before.values())).tier
    dst = HDD if src == NVME else NVME

    with pytest.raises(Busy):
        movement.evict(ino)
    assert movement.check(ino).dirty_bytes == len(data)

    assert await movement.relocate(ino, src, dst) == len(data)
    after = mount.fs.meta.get_blocks(ino)
    for blockno, rec in after.items():
        assert rec.tier == dst and rec.dirty and rec.sealed
        assert rec.digest == before[blockno].digest
    assert usage(mount)[dst] == (len(data), 1) and usage(mount)[src] == (0, 0)

    with pytest.raises(Busy):
        movement.evict(ino, dst)
    assert mount.fs.meta.residency(ino) == {dst: len(data)}
    await mount.flush("dirty.bin")  # the upload reads (and checks) the moved blocks
    assert mount.fs.meta.get_inode(ino).state == SyncState.CLEAN  # type: ignore[union-attr]
    assert mount.store.inner.get_range("dirty.bin", 0, len(data)) == data


async def test_evict_drops_clean_copies_only_from_the_tier_asked(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs()
    data = pattern(4 * MiB)
    ino = await clean_file(mount, s3_store, "e.bin", data)
    movement: DataMovement = mount.fs.movement
    await movement.fill(ino, NVME, blocks=range(0, 2))
    await movement.fill(ino, HDD, blocks=range(2, 4))
    assert usage(mount) == [(2 * MiB, 1), (2 * MiB, 1)]

    assert movement.evict(ino, HDD) == 2 * MiB
    assert usage(mount) == [(2 * MiB, 1), (0, 0)]
    assert not cache_file(mount, HDD, ino).exists()
    assert cache_file(mount, NVME, ino).exists()

    opened = await mount.fs.open(ino, os.O_RDONLY)
    with pytest.raises(Busy):
        movement.evict(ino)
    await mount.fs.release(opened.fh)

    assert movement.evict(ino) == 2 * MiB
    assert usage(mount) == [(0, 0), (0, 0)]
    assert movement.evict(ino) == 0
    assert await mount.read_file("e.bin") == data  # fetched again


async def copy_without_switch(mount: CoreMount, ino: int, src: int, dst: int) -> None:
    """Run a relocate's copy (and verify) step only, as a kill -9 right
    before the switch would leave it."""
    movement: DataMovement = mount.fs.movement
    inode = mount.fs.meta.get_inode(ino)
    assert inode is not None
    cf = mount.fs.open_files.acquire(inode)
    try:
        plan = sorted((b, rec) for b, rec in cf.blocks.items() if rec.tier == src)
        tiers = mount.fs.tiers
        copier = BlockCopier(
            lambda: tiers[src].open_file(ino, create=False),
            lambda: tiers[dst].open_file(ino, create=True) or -1,
        )
        try:
            moved = await movement._copy_and_verify(cf, plan, copier, None)
        finally:
            copier.close()
        assert len(moved) == len(plan)
        mount._moved = moved  # type: ignore[attr-defined]
    finally:
        mount.fs.open_files.release(cf)


async def test_crash_between_copy_and_switch(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = pattern(3 * MiB)
    ino = await clean_file(mount, s3_store, "k.bin", data)
    await mount.fs.movement.fill(ino, NVME)
    await copy_without_switch(mount, ino, NVME, HDD)
    half_copy = cache_file(mount, HDD, ino)
    assert half_copy.exists() and half_copy.stat().st_size == len(data)
    mount.close()  # the daemon dies: no further step runs

    mount = await mount.remount()
    await wait_until_gone(half_copy)  # the orphan cleanup of the mount removed it
    assert one_record_per_block(mount, ino, 3) == dict.fromkeys(range(3), NVME)
    assert usage(mount) == [(len(data), 1), (0, 0)]
    gets = len(mount.store.gets)
    assert await mount.read_file("k.bin") == data
    assert len(mount.store.gets) == gets


async def test_crash_between_copy_and_switch_keeps_a_dst_file_with_blocks(
    make_fs: Any, s3_store: Any
) -> None:
    """The file already had a block on dst: its dst cache file must survive
    the orphan cleanup, and the copied bytes stay unindexed."""
    mount = await make_fs()
    data = pattern(3 * MiB)
    ino = await clean_file(mount, s3_store, "p.bin", data)
    await mount.fs.movement.fill(ino, HDD, blocks=range(0, 1))
    await mount.fs.movement.fill(ino, NVME)
    assert one_record_per_block(mount, ino, 3) == {0: HDD, 1: NVME, 2: NVME}
    await copy_without_switch(mount, ino, NVME, HDD)
    mount.close()

    mount = await mount.remount()
    await trio.sleep(0.3)  # give the orphan cleanup its chance
    assert cache_file(mount, HDD, ino).exists()
    assert one_record_per_block(mount, ino, 3) == {0: HDD, 1: NVME, 2: NVME}
    assert usage(mount) == [(2 * MiB, 1), (MiB, 1)]
    gets = len(mount.store.gets)
    assert await mount.read_file("p.bin") == data
    assert len(mount.store.gets) == gets


async def test_crash_between_switch_and_delete(make_fs: Any, s3_store: Any) -> None:
    """Switched but the old copy not deleted: the src file holds no indexed
    block, so the next mount's orphan cleanup removes it; dst is kept."""
    mount = await make_fs()
    data = pattern(2 * MiB + 77)
    ino = await clean_file(mount, s3_store, "s.bin", data)
    await mount.fs.movement.fill(ino, NVME)
    await copy_without_switch(mount, ino, NVME, HDD)
    inode = mount.fs.meta.get_inode(ino)
    assert inode is not None
    cf = mount.fs.open_files.acquire(inode)
    try:
        mount.fs.movement._switch(cf, mount._moved, HDD)  # type: ignore[attr-defined]
    finally:
        mount.fs.open_files.release(cf)
    old_copy = cache_file(mount, NVME, ino)
    assert old_copy.exists()
    mount.close()

    mount = await mount.remount()
    await wait_until_gone(old_copy)
    assert cache_file(mount, HDD, ino).exists()
    assert one_record_per_block(mount, ino, 3) == dict.fromkeys(range(3), HDD)
    assert usage(mount) == [(0, 0), (len(data), 1)]
    gets = len(mount.store.gets)
    assert await mount.read_file("s.bin") == data
    assert len(mount.store.gets) == gets
