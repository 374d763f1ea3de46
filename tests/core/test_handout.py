"""Handing tier files to readers (``tierfs.core.read.handout``, ``leases``)
and the reader connections' lines (``tierfs.control.readers``), no mount.

Only a warm, clean file on one tier is handed out; the descriptor reads
its bytes; and what a reader holds is never changed in place: a relocate
that would punch the moved ranges leaves them, a local write replaces the
tier file with a copy first.  The bounds refuse a hand-out (the reader
goes through the mount), and a malformed line changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.core.conftest import CoreMount, MiB, put
from tierfs.control.readers import ReaderSession, _parse
from tierfs.core.names.access import Caller
from tierfs.core.read.handout import Handed, NotHanded
from tierfs.core.state import leases as leases_module
from tierfs.errors import InvalidArgument, PermissionDenied

NVME, HDD = 0, 1
ROOT = Caller(0, frozenset({0}))
USER = Caller(4242, frozenset({4242}))


def read_fd(fd: int, size: int) -> bytes:
    data = os.pread(fd, size, 0)
    return data + bytes(size - len(data))


async def warm_file(
    mount: CoreMount, s3_store: Any, key: str, data: bytes, tier: int = NVME
) -> int:
    put(s3_store, key, data)
    ino = (await mount.fs.namespace.resolve(key)).ino
    await mount.fs.movement.fill(ino, tier)
    return ino


async def test_only_a_warm_clean_file_on_one_tier_is_handed_out(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs()
    fs = mount.fs
    data = os.urandom(3 * MiB + 5)
    put(s3_store, "cold.bin", b"cold" * 100)
    put(s3_store, "empty.bin", b"")
    put(s3_store, "split.bin", os.urandom(2 * MiB))
    ino = await warm_file(mount, s3_store, "warm.bin", data)

    got = await fs.handout.hand_out("warm.bin", ROOT, connection=1)
    assert isinstance(got, Handed) and got.size == len(data) and got.ino == ino
    try:
        assert read_fd(got.fd, len(data)) == data
        with pytest.raises(OSError):
            os.pwrite(got.fd, b"x", 0)  # read-only
    finally:
        os.close(got.fd)
    assert fs.leases.status()["leases"] == 1

    cold = await fs.handout.hand_out("cold.bin", ROOT, connection=1)
    assert cold == NotHanded("not all of it is on a local tier")
    assert isinstance(await fs.handout.hand_out("empty.bin", ROOT, connection=1), NotHanded)

    # On two tiers: not handed out.
    split = (await fs.namespace.resolve("split.bin")).ino
    await fs.movement.fill(split, HDD, blocks=range(1, 2))
    await fs.movement.fill(split, NVME)
    assert await fs.handout.hand_out("split.bin", ROOT, connection=1) == NotHanded(
        "its blocks are on two tiers"
    )

    # Open for writing, then dirty: not handed out.
    opened = await fs.open(ino, os.O_RDWR, ROOT)
    try:
        assert await fs.handout.hand_out("warm.bin", ROOT, connection=1) == NotHanded(
            "it is open for writing"
        )
        await fs.write(opened.fh, 0, b"new")
    finally:
        await fs.release(opened.fh)
    assert await fs.handout.hand_out("warm.bin", ROOT, connection=1) == NotHanded(
        "it has changes not in the bucket yet"
    )
    assert fs.leases.end_connection(1) == 1
    assert fs.leases.status()["leases"] == 0


async def test_a_user_may_not_get_a_file_they_may_not_read(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    ino = await warm_file(mount, s3_store, "private/x.bin", b"secret" * 1000)
    inode = mount.fs.namespace.get(ino)
    inode.mode = (inode.mode & ~0o777) | 0o600
    mount.fs.meta.put_inode(inode)
    with pytest.raises(PermissionDenied):
        await mount.fs.handout.hand_out("private/x.bin", USER, connection=2)
    assert mount.fs.leases.status()["handed_out"] == 0


async def test_a_write_replaces_a_handed_out_tier_file_first(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    data = os.urandom(2 * MiB)
    ino = await warm_file(mount, s3_store, "w.bin", data)
    got = await fs.handout.hand_out("w.bin", ROOT, connection=3)
    assert isinstance(got, Handed)
    try:
        opened = await fs.open(ino, os.O_RDWR, ROOT)
        try:
            await fs.write(opened.fh, MiB - 2, b"ABCD")
            assert await fs.read(opened.fh, MiB - 2, 4) == b"ABCD"
        finally:
            await fs.release(opened.fh)
        assert fs.leases.unshared == 1
        assert read_fd(got.fd, len(data)) == data  # the reader's bytes, whole
        # The tier file at the path is the copy, with the write in it.
        path = fs.tiers[NVME].path / "data" / f"{ino % 256:02x}" / str(ino)
        assert path.read_bytes()[MiB - 2 : MiB + 2] == b"ABCD"
        assert os.fstat(got.fd).st_nlink == 0
    finally:
        os.close(got.fd)


async def test_a_relocate_does_not_punch_what_a_reader_holds(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    data = os.urandom(3 * MiB)
    ino = await warm_file(mount, s3_store, "m.bin", data)
    got = await fs.handout.hand_out("m.bin", ROOT, connection=4)
    assert isinstance(got, Handed)
    try:
        # Open through the mount meanwhile: the relocate then punches the
        # moved ranges out of the source file instead of unlinking it; not
        # while a reader holds that file.
        opened = await fs.open(ino, os.O_RDONLY, ROOT)
        try:
            assert await fs.movement.relocate(ino, NVME, HDD) == len(data)
            assert await fs.read(opened.fh, 0, 10) == data[:10]
        finally:
            await fs.release(opened.fh)
        assert read_fd(got.fd, len(data)) == data
        path = fs.tiers[NVME].path / "data" / f"{ino % 256:02x}" / str(ino)
        assert os.stat(path).st_blocks * 512 >= len(data)  # not punched
    finally:
        os.close(got.fd)
        fs.leases.end(got.lease, 4)


async def test_bounds_refuse_a_hand_out_not_the_read(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = await make_fs()
    fs = mount.fs
    put(s3_store, "b.bin", b"b" * 5000)
    await warm_file(mount, s3_store, "a.bin", b"a" * 5000)
    await fs.movement.fill((await fs.namespace.resolve("b.bin")).ino, NVME)
    monkeypatch.setattr(leases_module, "PER_CONNECTION", 1)
    first = await fs.handout.hand_out("a.bin", ROOT, connection=5)
    assert isinstance(first, Handed)
    os.close(first.fd)
    second = await fs.handout.hand_out("b.bin", ROOT, connection=5)
    assert isinstance(second, NotHanded) and "connection holds 1" in second.why
    other = await fs.handout.hand_out("b.bin", ROOT, connection=6)
    assert isinstance(other, Handed)
    os.close(other.fd)
    assert fs.leases.refused == 1
    # A lease of another connection is not ended by this one.
    assert not fs.leases.end(other.lease, 5)
    assert fs.leases.end(other.lease, 6)


@pytest.mark.parametrize(
    "message",
    [
        {"open": "a.bin"},
        {"open": [1]},
        {"open": ["../etc/passwd"]},
        {"open": ["a\x00b"]},
        {"open": ["/elsewhere/a.bin"]},
        {"open": ["a.bin"] * 129},
        {"open": ["a.bin"], "ahead": [[1]]},
        {"open": ["a.bin"], "ahead": [[1, -1]]},
        {"open": ["a.bin"], "ahead": [[1 << 30, 2]]},
        {"open": ["a.bin"], "ahead": "far"},
        {"close": ["x"]},
        {"close": [True]},
    ],
)
def test_malformed_reader_lines_are_refused(message: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        _parse(message, "/mnt/data")


async def test_a_malformed_line_is_answered_and_changes_nothing(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs()
    await warm_file(mount, s3_store, "a.bin", b"a" * 5000)
    session = ReaderSession(
        mount.fs, ROOT, pid=1, gid=0, connection=7, mountpoint="/mnt", prefetcher=None, audit=None
    )
    reply, fds = await session.answer({"open": ["a.bin", "../x"]})
    assert "error" in reply and fds == []
    assert mount.fs.leases.status()["leases"] == 0
    reply, fds = await session.answer({"open": ["a.bin", "missing.bin"]})
    try:
        assert [("fd" in f) for f in reply["files"]] == [True, False]
        assert reply["files"][1]["via"] == "mount"
        assert len(fds) == 1
    finally:
        for fd in fds:
            os.close(fd)
    assert mount.fs.leases.end_connection(7) == 1


async def test_a_changed_object_never_truncates_what_a_reader_holds(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs()
    fs = mount.fs
    old, new = os.urandom(2 * MiB), os.urandom(2 * MiB)
    ino = await warm_file(mount, s3_store, "c.bin", old)
    got = await fs.handout.hand_out("c.bin", ROOT, connection=8)
    assert isinstance(got, Handed)
    try:
        # Open meanwhile (busy): a changed object used to empty the file in place.
        opened = await fs.open(ino, os.O_RDONLY, ROOT)
        try:
            assert await fs.read(opened.fh, 0, 8) == old[:8]
            put(s3_store, "c.bin", new)
            assert await fs.namespace.revalidate_now(ino) is not None
        finally:
            await fs.release(opened.fh)
        assert read_fd(got.fd, len(old)) == old
    finally:
        os.close(got.fd)
