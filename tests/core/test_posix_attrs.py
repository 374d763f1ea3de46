"""POSIX attributes of TierFS over a real S3 server, without a mount (issue
14, section 2 and part of section 3): atime, directory nlink, nlink 0 of
removed inodes still held, setuid/setgid clearing, setgid directories, ctime
on xattr changes."""

from __future__ import annotations

import os
import stat
import time
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, put
from tierfs.config import NamespaceConfig
from tierfs.core.names.posix_attrs import RELATIME_WINDOW_NS, Caller, Privileges
from tierfs.errors import NotFound
from tierfs.meta import ROOT_INO

DAY = RELATIME_WINDOW_NS
OTHER = Caller(uid=2000, gid=2000, _privileges=Privileges(fsetid=False, groups=frozenset({2000})))
ROOT = Caller(uid=0, gid=0, _privileges=Privileges(fsetid=True, groups=frozenset({0})))


async def new_file(mount: CoreMount, name: str, data: bytes = b"", parent: int = ROOT_INO) -> int:
    opened, attrs = await mount.fs.create(parent, name.encode(), 0o644, os.O_WRONLY, 0, 0)
    if data:
        await mount.fs.write(opened.fh, 0, data)
    await mount.fs.release(opened.fh)
    return attrs.ino


async def mode_of(mount: CoreMount, ino: int) -> int:
    return stat.S_IMODE((await mount.fs.getattr(ino)).mode)


# --- atime ---------------------------------------------------------------------------------


async def test_atime_is_set_apart_from_mtime_and_kept_across_a_remount(make_fs: Any) -> None:
    mount = await make_fs()
    ino = await new_file(mount, "f", b"data")
    before = await mount.fs.getattr(ino)
    await mount.fs.setattr(ino, atime_ns=1_000_000_000_123)
    attrs = await mount.fs.getattr(ino)
    assert attrs.atime_ns == 1_000_000_000_123
    assert attrs.mtime_ns == before.mtime_ns  # touch -a leaves mtime alone
    await mount.fs.setattr(ino, mtime_ns=2_000_000_000_000)
    assert (await mount.fs.getattr(ino)).atime_ns == 1_000_000_000_123  # and the reverse
    mount = await mount.remount()
    attrs = await mount.fs.getattr(ino)
    assert (attrs.atime_ns, attrs.mtime_ns) == (1_000_000_000_123, 2_000_000_000_000)


async def test_reads_move_atime_in_the_relatime_way_batched_never_a_write_per_read(
    make_fs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = await make_fs()
    ino = await new_file(mount, "f", b"x" * 4096)
    mtime = (await mount.fs.getattr(ino)).mtime_ns
    # atime newer than mtime, but older than ctime (the setattr): relatime moves it.
    await mount.fs.setattr(ino, mtime_ns=mtime - 2 * DAY, atime_ns=mtime - DAY)
    fs = mount.fs
    writes = 0
    real_write = fs.meta.write

    def counting_write() -> Any:
        nonlocal writes
        writes += 1
        return real_write()

    monkeypatch.setattr(fs.meta, "write", counting_write)
    opened = await fs.open(ino, os.O_RDONLY)
    started = time.time_ns()
    for _ in range(50):
        assert await fs.read(opened.fh, 0, 4096) == b"x" * 4096
    await fs.release(opened.fh)
    assert writes == 0, "a read wrote to LMDB"
    atime = (await fs.getattr(ino)).atime_ns
    assert atime >= started  # older than 24 h: the first read moved it
    assert fs.meta.get_inode(ino).atime_ns == mtime - DAY  # type: ignore[union-attr]
    # A second epoch within 24 h leaves it where it is.
    opened = await fs.open(ino, os.O_RDONLY)
    await fs.read(opened.fh, 0, 10)
    await fs.release(opened.fh)
    assert (await fs.getattr(ino)).atime_ns == atime
    assert fs.access_times.flush() == 1
    assert writes == 1  # one write block for the batch
    assert fs.meta.get_inode(ino).atime_ns == atime  # type: ignore[union-attr]
    mount = await mount.remount()
    assert (await mount.fs.getattr(ino)).atime_ns == atime


async def test_a_read_after_a_write_moves_atime(make_fs: Any) -> None:
    mount = await make_fs()
    ino = await new_file(mount, "f", b"abc")
    await mount.fs.setattr(ino, atime_ns=time.time_ns() - 5_000_000_000)
    opened = await mount.fs.open(ino, os.O_RDWR)
    await mount.fs.write(opened.fh, 0, b"z")  # mtime now newer than atime
    await mount.fs.read(opened.fh, 0, 3)
    attrs = await mount.fs.getattr(ino)
    await mount.fs.release(opened.fh)
    assert attrs.atime_ns >= attrs.mtime_ns


# --- directory nlink ----------------------------------------------------------------------


async def test_directory_nlink_counts_subdirectories_across_mkdir_rmdir_rename(
    make_fs: Any,
) -> None:
    mount = await make_fs()
    fs = mount.fs
    root_links = (await fs.getattr(ROOT_INO)).nlink
    a = (await fs.mkdir(ROOT_INO, b"a", 0o755, 0, 0)).ino
    assert (await fs.getattr(a)).nlink == 2
    assert (await fs.getattr(ROOT_INO)).nlink == root_links + 1
    b = (await fs.mkdir(a, b"b", 0o755, 0, 0)).ino
    await fs.mkdir(a, b"c", 0o755, 0, 0)
    await new_file(mount, "file", parent=a)  # files do not count
    assert (await fs.getattr(a)).nlink == 4
    await fs.rmdir(a, b"c")
    assert (await fs.getattr(a)).nlink == 3
    await fs.rename(a, b"b", ROOT_INO, b"b2", 0)  # moves out of a into the root
    assert (await fs.getattr(a)).nlink == 2
    assert (await fs.getattr(ROOT_INO)).nlink == root_links + 2
    await fs.rename(ROOT_INO, b"b2", ROOT_INO, b"b3", 0)  # same parent: no change
    assert (await fs.getattr(ROOT_INO)).nlink == root_links + 2
    await fs.mkdir(ROOT_INO, b"empty", 0o755, 0, 0)
    await fs.rename(ROOT_INO, b"b3", ROOT_INO, b"empty", 0)  # replaces a directory
    assert (await fs.getattr(ROOT_INO)).nlink == root_links + 2
    assert (await fs.getattr(b)).nlink == 2
    mount = await mount.remount()
    assert (await mount.fs.getattr(ROOT_INO)).nlink == root_links + 2


async def test_directory_nlink_of_listed_directories_follows_the_bucket(
    make_fs: Any, s3_store: Any
) -> None:
    for key in ("d/x/1", "d/y/2", "d/z/3", "d/f"):
        put(s3_store, key, b"1")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0, revalidate_ttl=60))
    fs = mount.fs
    d = await fs.lookup(ROOT_INO, b"d")
    assert d.nlink == 2  # never listed: knows no subdirectory yet
    await fs.opendir(d.ino)
    assert (await fs.getattr(d.ino)).nlink == 5
    s3_store.delete("d/y/2")
    await fs.opendir(d.ino)
    await fs.listings.wait_listing(d.ino)
    with trio.fail_after(10):
        while (await fs.getattr(d.ino)).nlink != 4:
            await fs.opendir(d.ino)
            await fs.listings.wait_listing(d.ino)
            await trio.sleep(0.05)


# --- removed inodes still held ------------------------------------------------------------------


async def test_unlinked_open_file_has_nlink_0_and_keeps_its_data(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    ino = await new_file(mount, "f", b"contents")
    opened = await fs.open(ino, os.O_RDONLY)
    await fs.unlink(ROOT_INO, b"f")
    assert (await fs.getattr(ino)).nlink == 0
    assert await fs.read(opened.fh, 0, 100) == b"contents"
    await fs.release(opened.fh)
    assert (await fs.getattr(ino)).nlink == 0  # until the kernel forgets it
    fs.forget([ino])
    with pytest.raises(NotFound):
        await fs.getattr(ino)


async def test_file_replaced_by_rename_while_open_has_nlink_0_and_old_contents(
    make_fs: Any,
) -> None:
    mount = await make_fs()
    fs = mount.fs
    old = await new_file(mount, "old", b"old contents")
    await new_file(mount, "new", b"new contents")
    opened = await fs.open(old, os.O_RDONLY)
    await fs.rename(ROOT_INO, b"new", ROOT_INO, b"old", 0)
    assert (await fs.getattr(old)).nlink == 0
    assert await fs.read(opened.fh, 0, 100) == b"old contents"
    await fs.release(opened.fh)
    assert await mount.read_file("old") == b"new contents"
    assert (await fs.lookup(ROOT_INO, b"old")).nlink == 1


async def test_directory_replaced_by_rename_while_open_stats_with_nlink_0(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    target = (await fs.mkdir(ROOT_INO, b"target", 0o755, 0, 0)).ino
    await fs.mkdir(ROOT_INO, b"src", 0o755, 0, 0)
    await fs.opendir(target)
    await fs.rename(ROOT_INO, b"src", ROOT_INO, b"target", 0)
    attrs = await fs.getattr(target)
    assert attrs.nlink == 0 and stat.S_ISDIR(attrs.mode)
    gone = (await fs.mkdir(ROOT_INO, b"gone", 0o755, 0, 0)).ino
    await fs.opendir(gone)
    await fs.rmdir(ROOT_INO, b"gone")  # rmdir of an open directory too
    assert (await fs.getattr(gone)).nlink == 0
    fs.forget([target, gone])
    with pytest.raises(NotFound):
        await fs.getattr(gone)


# --- setuid / setgid -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags", [os.O_WRONLY, os.O_WRONLY | os.O_APPEND, os.O_RDWR], ids=["wronly", "append", "rdwr"]
)
async def test_every_write_path_of_another_user_clears_setuid_and_setgid(
    make_fs: Any, flags: int
) -> None:
    mount = await make_fs()
    fs = mount.fs
    ino = await new_file(mount, "tool", b"#!/bin/sh\n")
    await fs.setattr(ino, mode=0o6755)
    opened = await fs.open(ino, flags, ROOT)  # root (CAP_FSETID) keeps them
    await fs.write(opened.fh, 0, b"#")
    await fs.release(opened.fh)
    assert await mode_of(mount, ino) == 0o6755
    opened = await fs.open(ino, flags, OTHER)
    await fs.write(opened.fh, 0, b"#")
    assert await mode_of(mount, ino) == 0o755
    await fs.release(opened.fh)
    mount = await mount.remount()
    assert await mode_of(mount, ino) == 0o755


async def test_truncation_by_another_user_clears_setuid_and_setgid(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    ino = await new_file(mount, "tool", b"#!/bin/sh\n")
    await fs.setattr(ino, mode=0o6755)
    await fs.setattr(ino, size=3, caller=OTHER)
    assert await mode_of(mount, ino) == 0o755
    await fs.setattr(ino, mode=0o6755)
    opened = await fs.open(ino, os.O_WRONLY | os.O_TRUNC, OTHER)
    assert await mode_of(mount, ino) == 0o755
    await fs.release(opened.fh)
    await fs.setattr(ino, mode=0o6755)
    await fs.setattr(ino, size=0, caller=ROOT)
    assert await mode_of(mount, ino) == 0o6755


async def test_chown_clears_setuid_and_group_executable_setgid(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    ino = await new_file(mount, "tool", b"x")
    await fs.setattr(ino, mode=0o6755)
    await fs.setattr(ino, uid=1000, gid=1000, caller=ROOT)
    assert await mode_of(mount, ino) == 0o755
    await fs.setattr(ino, mode=0o6744)  # setgid without group execute: kept
    await fs.setattr(ino, gid=50, caller=ROOT)
    assert await mode_of(mount, ino) == 0o2744
    d = (await fs.mkdir(ROOT_INO, b"d", 0o6755, 0, 0)).ino
    await fs.setattr(d, mode=0o6755)
    await fs.setattr(d, uid=1000, caller=ROOT)  # directories keep theirs
    assert await mode_of(mount, d) == 0o6755


async def test_setgid_directory_gives_its_group_and_bit(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    shared = (await fs.mkdir(ROOT_INO, b"shared", 0o775, 0, 0)).ino
    await fs.setattr(shared, mode=0o2775, gid=50)
    opened, f = await fs.create(shared, b"f", 0o644, os.O_WRONLY, 1000, 1000)
    await fs.release(opened.fh)
    assert (f.uid, f.gid) == (1000, 50)
    sub = await fs.mkdir(shared, b"sub", 0o755, 1000, 1000)
    assert sub.gid == 50 and stat.S_IMODE(sub.mode) == 0o2755
    link = await fs.symlink(shared, b"l", b"f", 1000, 1000)
    assert link.gid == 50
    plain = await fs.mkdir(ROOT_INO, b"plain", 0o755, 1000, 1000)
    assert plain.gid == 1000 and stat.S_IMODE(plain.mode) == 0o755


# --- ctime on xattr changes ------------------------------------------------------------------------


async def test_setxattr_and_removexattr_change_ctime(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    ino = await new_file(mount, "f", b"x")
    before = (await fs.getattr(ino)).ctime_ns
    await trio.sleep(0.01)
    await fs.setxattr(ino, b"user.k", b"v")
    after_set = (await fs.getattr(ino)).ctime_ns
    assert after_set > before
    await trio.sleep(0.01)
    await fs.removexattr(ino, b"user.k")
    assert (await fs.getattr(ino)).ctime_ns > after_set
    mount = await mount.remount()
    assert (await mount.fs.getattr(ino)).ctime_ns > after_set


async def test_a_write_through_the_creating_handle_clears_setuid(make_fs: Any) -> None:
    mount = await make_fs()
    opened, attrs = await mount.fs.create(
        ROOT_INO, b"made", 0o4755, os.O_WRONLY, 2000, 2000, caller=OTHER
    )
    assert await mode_of(mount, attrs.ino) == 0o4755
    await mount.fs.write(opened.fh, 0, b"x")
    await mount.fs.release(opened.fh)
    assert await mode_of(mount, attrs.ino) == 0o755
