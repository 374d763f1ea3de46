"""POSIX attributes through a real mount (and files replaced under an
open descriptor, setgid directories, setuid and
setgid clearing, ctime on xattr changes).  The logic and its unit tests live
in tierfs.core.names.posix_attrs (tests/core/test_posix_attrs.py); these check
what a process sees through the kernel."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fuse.conftest import Mount, MountFactory, run_as_user, wait_until

DAY_NS = 24 * 3600 * 10**9


def as_user(m: Mount, uid: int, fn: Callable[[int], object]) -> object:
    """``fn(root_fd)`` in a forked child running as ``uid`` (its own group
    only), with ``root_fd`` the mount's root opened before the switch (the
    test's 0700 temp directories above the mount point stay closed to it).
    Returns what ``fn`` returned (JSON), or the errno it failed with."""
    root_fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)

    def child() -> str:
        try:
            return json.dumps({"ok": fn(root_fd)})
        except OSError as exc:
            return json.dumps({"errno": exc.errno})

    try:
        text = run_as_user(uid, child)
    finally:
        os.close(root_fd)
    result = json.loads(text)
    assert "ok" in result, f"failed with {errno.errorcode.get(result['errno'])}"
    return result["ok"]


def perm(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- atime ---------------------------------------------------------------------------------


def test_atime_is_stored_apart_from_mtime_set_by_touch_a_and_kept_across_remounts(
    mount: MountFactory,
) -> None:
    m = mount()
    f = m.path / "f"
    f.write_bytes(b"data")
    mtime = os.stat(f).st_mtime_ns
    subprocess.run(["touch", "-a", "-d", "@1000000000", str(f)], check=True)
    st = os.stat(f)
    assert st.st_atime_ns == 1_000_000_000 * 10**9
    assert st.st_mtime_ns == mtime
    os.utime(f, ns=(1_100_000_000 * 10**9, 1_200_000_000 * 10**9))
    m.remount()
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_100_000_000 * 10**9, 1_200_000_000 * 10**9)


def test_reads_update_atime_in_the_relatime_way_and_it_survives_a_remount(
    mount: MountFactory,
) -> None:
    m = mount()
    f = m.path / "f"
    f.write_bytes(b"x" * 8192)
    now = time.time_ns()
    os.utime(f, ns=(now - 3 * DAY_NS, now - 4 * DAY_NS))  # atime 3 days old, after mtime
    assert os.stat(f).st_atime_ns == now - 3 * DAY_NS
    started = time.time_ns()
    assert f.read_bytes() == b"x" * 8192
    atime = os.stat(f).st_atime_ns
    assert atime >= started, "a read did not move an atime older than its ctime"
    # Read again at once: relatime leaves it.
    with open(f, "rb", buffering=0) as reader:
        os.posix_fadvise(reader.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert reader.read(10) == b"x" * 10
    assert os.stat(f).st_atime_ns == atime
    m.remount()  # the batch reaches LMDB at the latest at unmount
    assert os.stat(f).st_atime_ns == atime


# --- directory nlink ----------------------------------------------------------------------


def test_directory_nlink_is_two_plus_subdirectories(mount: MountFactory) -> None:
    m = mount({"bucket/x/1": b"1", "bucket/y/2": b"2", "bucket/f": b"3"})
    a = m.path / "a"
    a.mkdir()
    assert os.stat(a).st_nlink == 2
    (a / "b").mkdir()
    (a / "c").mkdir()
    (a / "file").write_bytes(b"")
    assert os.stat(a).st_nlink == 4
    (a / "c").rmdir()
    assert os.stat(a).st_nlink == 3
    root_links = os.stat(m.path).st_nlink
    os.rename(a / "b", m.path / "b")
    assert os.stat(a).st_nlink == 2
    assert os.stat(m.path).st_nlink == root_links + 1
    # A directory known from the bucket counts once listed.
    names = os.listdir(m.path / "bucket")
    assert sorted(names) == ["f", "x", "y"]
    assert wait_until(lambda: os.stat(m.path / "bucket").st_nlink == 4, 3 * m.list_ttl + 5)
    m.remount()
    assert os.stat(a).st_nlink == 2
    assert os.stat(m.path).st_nlink == root_links + 1


# --- removed inodes still held ------------------------------------------------------------------


def test_unlinked_open_file_shows_nlink_0(mount: MountFactory) -> None:
    m = mount()
    f = m.path / "f"
    f.write_bytes(b"contents")
    fd = os.open(f, os.O_RDONLY)
    try:
        assert os.fstat(fd).st_nlink == 1
        f.unlink()
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 100, 0) == b"contents"
    finally:
        os.close(fd)


def test_file_replaced_by_rename_while_open_shows_nlink_0_and_old_contents(
    mount: MountFactory,
) -> None:
    m = mount()
    old, new = m.path / "old", m.path / "new"
    old.write_bytes(b"old contents")
    new.write_bytes(b"new contents")
    fd = os.open(old, os.O_RDONLY)
    try:
        os.rename(new, old)
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 100, 0) == b"old contents"
    finally:
        os.close(fd)
    assert old.read_bytes() == b"new contents"
    assert os.stat(old).st_nlink == 1


def test_empty_directory_replaced_by_rename_while_open_stats_with_nlink_0(
    mount: MountFactory,
) -> None:
    m = mount()
    target, src = m.path / "target", m.path / "src"
    target.mkdir()
    src.mkdir()
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(src, target)
        st = os.fstat(fd)
        assert st.st_nlink == 0 and stat.S_ISDIR(st.st_mode)
    finally:
        os.close(fd)
    gone = m.path / "gone"
    gone.mkdir()
    fd = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
    try:
        gone.rmdir()
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)


# --- setuid / setgid -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [os.O_WRONLY, os.O_WRONLY | os.O_APPEND, os.O_RDWR],
    ids=["wronly", "append", "rdwr"],
)
def test_a_write_by_another_user_clears_setuid_and_setgid(
    mount: MountFactory, other_uid: int, flags: int
) -> None:
    m = mount(options="allow_other")
    tool = m.path / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    os.chmod(tool, 0o6777)
    with open(tool, "r+b") as f:  # root (CAP_FSETID) writes: the bits stay
        f.write(b"#")
    assert perm(tool) == 0o6777

    def write(root_fd: int) -> int:
        fd = os.open("tool", flags, dir_fd=root_fd)
        try:
            return os.write(fd, b"echo\n")
        finally:
            os.close(fd)

    assert as_user(m, other_uid, write) == 5
    assert perm(tool) == 0o777
    m.remount()
    assert perm(tool) == 0o777


@pytest.mark.parametrize("how", ["ftruncate", "o_trunc"])
def test_truncation_by_another_user_clears_setuid_and_setgid(
    mount: MountFactory, other_uid: int, how: str
) -> None:
    m = mount(options="allow_other")
    tool = m.path / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    os.chmod(tool, 0o6777)

    def truncate(root_fd: int) -> str:
        if how == "o_trunc":
            os.close(os.open("tool", os.O_WRONLY | os.O_TRUNC, dir_fd=root_fd))
        else:
            fd = os.open("tool", os.O_WRONLY, dir_fd=root_fd)
            try:
                os.ftruncate(fd, 2)
            finally:
                os.close(fd)
        return "done"

    assert as_user(m, other_uid, truncate) == "done"
    assert perm(tool) == 0o777


def test_chown_clears_setuid_and_group_executable_setgid(mount: MountFactory) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    m = mount()
    tool = m.path / "tool"
    tool.write_bytes(b"x")
    os.chmod(tool, 0o6755)
    os.chown(tool, 1000, 1000)
    assert perm(tool) == 0o755
    os.chmod(tool, 0o6744)  # setgid without group execute is not an executable's
    os.chown(tool, 1000, 1001)
    assert perm(tool) == 0o2744
    d = m.path / "d"
    d.mkdir()
    os.chmod(d, 0o6755)
    os.chown(d, 1000, 1000)  # directories keep theirs
    assert perm(d) == 0o6755


def test_setgid_directory_gives_its_group_and_its_bit(mount: MountFactory) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    m = mount()
    shared = m.path / "shared"
    shared.mkdir()
    os.chown(shared, 0, 50)
    os.chmod(shared, 0o2775)
    (shared / "f").write_bytes(b"x")
    (shared / "sub").mkdir()
    assert os.stat(shared / "f").st_gid == 50
    sub = os.stat(shared / "sub")
    assert sub.st_gid == 50
    assert sub.st_mode & stat.S_ISGID
    m.remount()
    assert os.stat(shared / "f").st_gid == 50
    assert os.stat(shared / "sub").st_mode & stat.S_ISGID
    (m.path / "plain").mkdir()
    assert os.stat(m.path / "plain").st_gid == os.getegid()


# --- ctime on xattr changes ------------------------------------------------------------------------


def test_setxattr_and_removexattr_change_ctime(mount: MountFactory) -> None:
    m = mount()
    f = m.path / "f"
    f.write_bytes(b"x")
    before = os.stat(f).st_ctime_ns
    time.sleep(0.01)
    os.setxattr(f, "user.k", b"v")
    after_set = os.stat(f).st_ctime_ns
    assert after_set > before
    time.sleep(0.01)
    os.removexattr(f, "user.k")
    assert os.stat(f).st_ctime_ns > after_set
