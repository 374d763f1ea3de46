"""Dirty blocks carry an xxh3 digest from their commit on (BlockWrites
"Dirty-block digests"): it is recorded without extra I/O for sequential
writes, by one read-back otherwise, verified before a read serves the block
and while an upload reads it; damage gives EIO, a ``failed`` file and no
upload of the wrong bytes.  TierFS over a real S3 server, no mount."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import trio

import tierfs.core.read.blockcache as blockcache
import tierfs.core.state.digests as digests
import tierfs.core.write.blockwrites as blockwrites
from tests.core.conftest import CoreMount, MiB, put
from tierfs.config import WriteConfig
from tierfs.errors import ObjectNotFound, StoreError, TierfsError
from tierfs.meta import BlockRecord

#: The unit a filesystem may tear two overlapping O_DIRECT writes at.
SECTOR = 512

#: No upload on its own during a test: dirty blocks stay dirty.
HELD = WriteConfig(mode="back", upload_delay=3600, part_size=8 * MiB)


def cache_file(mount: CoreMount, ino: int, tier: int = 0) -> Path:
    return mount.fs.tiers[tier].path / "data" / f"{ino % 256:02x}" / str(ino)


def flip(path: Path, offset: int, count: int = 8) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0x55 for b in old))


def blocks(mount: CoreMount, ino: int) -> dict[int, BlockRecord]:
    return mount.fs.meta.get_blocks(ino)


def count_readbacks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = blockcache.read_and_hash

    def counting(fd: int, offset: int, nbytes: int) -> int:
        calls.append(offset)
        return real(fd, offset, nbytes)

    monkeypatch.setattr(blockcache, "read_and_hash", counting)
    monkeypatch.setattr(blockwrites, "read_and_hash", counting)
    return calls


def tier_used(mount: CoreMount) -> int:
    return sum(t["used"] for t in mount.fs.status()["tiers"])  # type: ignore[attr-defined]


async def test_sequential_write_is_sealed_from_the_bytes_it_wrote(
    make_fs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = await make_fs(write=HELD)
    readbacks = count_readbacks(monkeypatch)
    data = os.urandom(2 * MiB + 12345)
    ino = await mount.write_file("seq.bin", data)
    recs = blocks(mount, ino)
    assert sorted(recs) == [0, 1, 2]
    for blockno, rec in recs.items():
        assert rec.dirty and rec.sealed, rec
        block = data[blockno * MiB : (blockno + 1) * MiB]
        assert rec.nbytes == len(block)
        assert rec.digest == digests.block_digest(block)
    assert readbacks == [], "a sequential writer's blocks were read back to be hashed"
    assert await mount.read_file("seq.bin") == data


async def test_rewrites_and_truncates_are_sealed_by_reading_back(
    make_fs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = await make_fs(write=HELD)
    readbacks = count_readbacks(monkeypatch)
    data = bytearray(os.urandom(3 * MiB))
    ino = await mount.write_file("rw.bin", bytes(data))
    opened = await mount.fs.open(ino, os.O_RDWR)
    patch = os.urandom(5000)
    await mount.fs.write(opened.fh, MiB - 100, patch)  # inside blocks 0 and 1
    data[MiB - 100 : MiB - 100 + len(patch)] = patch
    await mount.fs.setattr(ino, size=2 * MiB + 77)  # cuts block 2
    del data[2 * MiB + 77 :]
    await mount.fs.fsync(opened.fh, False)
    await mount.fs.release(opened.fh)
    recs = blocks(mount, ino)
    assert sorted(recs) == [0, 1, 2]
    for blockno, rec in recs.items():
        assert rec.dirty and rec.sealed
        assert rec.digest == digests.block_digest(data[blockno * MiB : (blockno + 1) * MiB])
    assert sorted(set(readbacks)) == [0, MiB, 2 * MiB]
    mount = await mount.remount()
    assert await mount.read_file("rw.bin") == bytes(data)  # verified after the remount


async def test_damaged_dirty_block_gives_eio_fails_the_file_and_is_never_uploaded(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs(write=HELD)
    data = os.urandom(3 * MiB)
    ino = await mount.write_file("ckpt.bin", data)
    used = tier_used(mount)
    assert used == len(data)
    flip(cache_file(mount, ino), MiB + 4096)

    with pytest.raises(TierfsError) as raised:
        await mount.read_file("ckpt.bin", MiB, 4096)
    assert raised.value.errno == errno.EIO
    assert await mount.read_file("ckpt.bin", 0, MiB) == data[:MiB]  # the rest still reads
    assert await mount.read_file("ckpt.bin", 2 * MiB, MiB) == data[2 * MiB :]
    where = await mount.fs.where("ckpt.bin")
    assert where["state"] == "failed" and where["damaged_blocks"] == [1], where
    status = mount.fs.status()
    assert status["failed_files"] == 1
    assert status["counters"]["damaged_dirty_blocks"] == 1  # type: ignore[index]
    assert tier_used(mount) == used, "the damaged dirty block must stay accounted (kept)"

    with pytest.raises(StoreError, match=r"ckpt\.bin"):
        await mount.flush()
    with pytest.raises(ObjectNotFound):
        s3_store.head("ckpt.bin")
    # Refused, not retried in a loop: the entry is kept and waits.
    assert mount.fs.status()["pending_uploads"] == 1

    mount = await mount.remount()  # the failed state survives a remount
    assert (await mount.fs.where("ckpt.bin"))["state"] == "failed"
    with pytest.raises(StoreError, match=r"ckpt\.bin"):
        await mount.flush()
    with pytest.raises(ObjectNotFound):
        s3_store.head("ckpt.bin")

    # What an operator does: rewrite the file from a good copy.
    await mount.write_file("ckpt.bin", data)
    await mount.flush()
    assert s3_store.get_range("ckpt.bin", 0, len(data)) == data
    where = await mount.fs.where("ckpt.bin")
    assert where["state"] == "clean" and where["damaged_blocks"] == [], where
    assert mount.fs.status()["failed_files"] == 0


async def test_damage_found_by_the_upload_aborts_it(make_fs: Any, s3_store: Any) -> None:
    """Bits flipped after the commit, never read: the upload's own check
    catches them, and not one byte of the file reaches the bucket (a
    multipart upload is aborted)."""
    mount = await make_fs(write=HELD, capacities=(64 * MiB, 64 * MiB))
    data = os.urandom(20 * MiB)  # 8 MiB parts: a multipart upload
    ino = await mount.write_file("big.bin", data)
    flip(cache_file(mount, ino), 17 * MiB + 3)
    with pytest.raises(StoreError, match=r"big\.bin"):
        await mount.flush()
    with pytest.raises(ObjectNotFound):
        s3_store.head("big.bin")
    assert s3_store.list_uploads() == [], "the multipart upload was left open"
    where = await mount.fs.where("big.bin")
    assert where["state"] == "failed" and where["damaged_blocks"] == [17], where
    assert tier_used(mount) == len(data)


async def test_damaged_clean_block_is_dropped_with_its_accounting(
    make_fs: Any, s3_store: Any
) -> None:
    data = os.urandom(3 * MiB)
    put(s3_store, "clean.bin", data)
    mount = await make_fs()
    assert await mount.read_file("clean.bin") == data
    ino = (await mount.fs.namespace.resolve("clean.bin")).ino
    assert tier_used(mount) == len(data)
    mount = await mount.remount()
    flip(cache_file(mount, ino), 2 * MiB + 10)
    assert await mount.read_file("clean.bin") == data  # refetched, never served damaged
    assert mount.fs.status()["counters"]["verify_failures"] == 1  # type: ignore[index]
    assert tier_used(mount) == len(data), "the accounting was not re-derived"
    assert (await mount.fs.where("clean.bin"))["state"] == "clean"


async def test_overlapping_writes_of_a_block_are_sealed_from_what_landed(
    make_fs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writes of one block in flight at once (large aligned writes go
    to a worker thread): which one lands last is unknown, so neither's
    running digest is kept; the seal reads the block back, and the block
    verifies after a remount (no false EIO)."""
    mount = await make_fs(write=HELD)
    readbacks = count_readbacks(monkeypatch)
    ino = await mount.write_file("race.bin", os.urandom(MiB), fsync=False)
    opened = await mount.fs.open(ino, os.O_WRONLY)
    first, second = os.urandom(MiB), os.urandom(MiB)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mount.fs.write, opened.fh, 0, first)
        nursery.start_soon(mount.fs.write, opened.fh, 0, second)
    cf = mount.fs.open_files.files[ino]
    if cf.direct_fds.get(0) is None:
        pytest.skip("the tier has no O_DIRECT: writes run inline and never overlap")
    assert not cf.writing and not cf.contended and 0 not in cf.hashers
    await mount.fs.fsync(opened.fh, False)
    await mount.fs.release(opened.fh)
    assert readbacks == [0]
    landed = cache_file(mount, ino).read_bytes()
    # Linux does not make two overlapping O_DIRECT writes atomic with respect
    # to each other (ext4 overwrites under a shared inode lock), so the block
    # may hold sectors of both; each sector is one write's, never anything
    # else.  The digest must describe whatever landed.
    assert len(landed) == MiB
    for at in range(0, MiB, SECTOR):
        assert landed[at : at + SECTOR] in (first[at : at + SECTOR], second[at : at + SECTOR])
    rec = blocks(mount, ino)[0]
    assert rec.sealed and rec.digest == digests.block_digest(landed)
    mount = await mount.remount()
    assert await mount.read_file("race.bin") == landed


async def test_partial_write_into_a_damaged_block_fails_and_does_not_launder_it(
    make_fs: Any, s3_store: Any
) -> None:
    """A write that keeps some bytes of a damaged dirty block would give the
    damage a valid digest at the next seal: it gets EIO and changes nothing;
    a write of the whole block replaces the damage."""
    mount = await make_fs(write=HELD)
    data = os.urandom(2 * MiB)
    ino = await mount.write_file("w.bin", data)
    mount = await mount.remount()  # nothing verified in this mount yet
    flip(cache_file(mount, ino), MiB + 10)
    opened = await mount.fs.open(ino, os.O_WRONLY)
    try:
        with pytest.raises(TierfsError) as raised:
            await mount.fs.write(opened.fh, MiB + 100, b"patch")
        assert raised.value.errno == errno.EIO
        assert (await mount.fs.where("w.bin"))["state"] == "failed"
        await mount.fs.write(opened.fh, MiB, data[MiB:])  # the whole block, from a good copy
    finally:
        await mount.fs.release(opened.fh)
    await mount.flush()
    assert s3_store.get_range("w.bin", 0, len(data)) == data
    assert (await mount.fs.where("w.bin"))["state"] == "clean"
