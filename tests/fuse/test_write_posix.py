"""Real mount: POSIX semantics of the write path, with exact errnos.

Each test mounts a fresh bucket (1 MiB blocks), changes it through plain
file I/O and checks what a reader sees: through the same fd, through a new
fd after the kernel page cache was dropped (so the bytes come from the
daemon), and, where it matters, in the bucket after ``tierfs flush``.
docs/guarantees.md, "Writes and durability", is the reference for what is promised.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, drop_page_cache, run_tierfs

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
LONG_DELAY = "600s"  # nothing uploads by itself during a test


# --- helpers --------------------------------------------------------------------------------


def flush(m: Mount, *names: str) -> None:
    """``tierfs flush`` (the mount root if no name is given)."""
    paths = [str(m.path / n) for n in names] or [str(m.path)]
    done = run_tierfs("flush", *paths)
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr.strip()}\n{m.log_tail()}"


def bucket_bytes(m: Mount, name: str) -> bytes:
    body: bytes = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))["Body"].read()
    return body


def read_from_daemon(path: Path) -> bytes:
    """The file's bytes as the daemon serves them (page cache dropped first)."""
    drop_page_cache()
    return path.read_bytes()


def errno_of(fn: Callable[[], Any]) -> int | None:
    """The errno ``fn()`` fails with; None if it succeeds."""
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


def expect_errno(expected: int, fn: Callable[[], Any]) -> None:
    got = errno_of(fn)
    assert got == expected, (
        f"expected {errno.errorcode[expected]}, got "
        f"{'success' if got is None else errno.errorcode.get(got, got)}"
    )


class Model:
    """A bytearray with pwrite/truncate semantics, to compare files against."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = bytearray(data)

    def pwrite(self, buf: bytes, offset: int) -> None:
        if offset > len(self.data):
            self.data += bytes(offset - len(self.data))
        self.data[offset : offset + len(buf)] = buf

    def truncate(self, size: int) -> None:
        if size < len(self.data):
            del self.data[size:]
        else:
            self.data += bytes(size - len(self.data))

    def __bytes__(self) -> bytes:
        return bytes(self.data)


# --- 1: create, open flags, writes at any offset, truncate ----------------------------------


def test_writes_at_any_offset_read_back_exactly(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    path = m.path / "f.bin"
    model = Model()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        # sequential, crossing block boundaries
        for i in range(5):
            chunk = os.urandom(600 * 1024)
            assert os.write(fd, chunk) == len(chunk)
            model.pwrite(chunk, i * 600 * 1024)
        # random offsets, inside and across blocks
        for offset, size in ((10, 100), (MiB - 7, 20), (2 * MiB + 3, MiB), (123_456, 4096)):
            chunk = os.urandom(size)
            assert os.pwrite(fd, chunk, offset) == size
            model.pwrite(chunk, offset)
        # past EOF: a hole of zeros, two blocks away
        tail_at = len(model.data) + 2 * MiB + 5
        assert os.pwrite(fd, b"tail", tail_at) == 4
        model.pwrite(b"tail", tail_at)
        # read-your-writes through the same fd
        assert os.fstat(fd).st_size == len(model.data)
        assert os.pread(fd, len(model.data) + 10, 0) == bytes(model)
    finally:
        os.close(fd)
    assert path.stat().st_size == len(model.data)
    assert path.read_bytes() == bytes(model)
    assert read_from_daemon(path) == bytes(model)
    hole = bytes(model)[tail_at - 2 * MiB : tail_at]
    assert hole == bytes(2 * MiB)

    flush(m, "f.bin")
    assert bucket_bytes(m, "f.bin") == bytes(model)


def test_open_flags_excl_trunc_append(mount: MountFactory) -> None:
    m = mount({"bucket.txt": b"from the bucket\n", "other.txt": b"x" * 5000})
    new = m.path / "new.txt"

    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    os.write(fd, b"hello\n")
    os.close(fd)
    assert stat.S_IMODE(new.stat().st_mode) == 0o640
    expect_errno(errno.EEXIST, lambda: os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    expect_errno(
        errno.EEXIST,
        lambda: os.open(m.path / "bucket.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644),
    )

    # O_APPEND on a file written here and on one that is only in the bucket
    for name, before in (("new.txt", b"hello\n"), ("bucket.txt", b"from the bucket\n")):
        fd = os.open(m.path / name, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"more\n")
        os.pwrite(fd, b"again\n", 0)  # O_APPEND: the offset is ignored on Linux
        os.close(fd)
        expected = before + b"more\nagain\n"
        assert (m.path / name).read_bytes() == expected, name
        assert read_from_daemon(m.path / name) == expected, name

    # O_TRUNC of a bucket-only file: empty at once, then new content
    fd = os.open(m.path / "other.txt", os.O_WRONLY | os.O_TRUNC)
    assert os.fstat(fd).st_size == 0
    os.write(fd, b"short")
    os.close(fd)
    assert (m.path / "other.txt").stat().st_size == 5
    assert read_from_daemon(m.path / "other.txt") == b"short"

    flush(m)
    assert bucket_bytes(m, "other.txt") == b"short"
    assert bucket_bytes(m, "bucket.txt") == b"from the bucket\nmore\nagain\n"
    assert bucket_bytes(m, "new.txt") == b"hello\nmore\nagain\n"


def test_truncate_and_ftruncate_grow_and_shrink(mount: MountFactory) -> None:
    body = os.urandom(3 * MiB + 100)
    m = mount({"t.bin": body}, upload_delay=LONG_DELAY)
    path = m.path / "t.bin"
    model = Model(body)

    # shrink into the middle of a block, then grow: the cut-off bytes are zeros
    os.truncate(path, MiB + MiB // 2)
    model.truncate(MiB + MiB // 2)
    assert path.stat().st_size == len(model.data)
    os.truncate(path, 4 * MiB)
    model.truncate(4 * MiB)
    assert path.read_bytes() == bytes(model)
    assert bytes(model)[MiB + MiB // 2 :] == bytes(4 * MiB - (MiB + MiB // 2))

    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 1000)
        model.truncate(1000)
        assert os.fstat(fd).st_size == 1000
        os.ftruncate(fd, MiB + 10)
        model.truncate(MiB + 10)
        os.pwrite(fd, b"end", MiB + 10)
        model.pwrite(b"end", MiB + 10)
        assert os.pread(fd, 2 * MiB, 0) == bytes(model)
        os.ftruncate(fd, 0)
        model.truncate(0)
        os.ftruncate(fd, 5000)
        model.truncate(5000)
        assert os.pread(fd, 10_000, 0) == bytes(5000)
    finally:
        os.close(fd)
    assert path.stat().st_size == 5000
    assert read_from_daemon(path) == bytes(model)
    flush(m, "t.bin")
    assert bucket_bytes(m, "t.bin") == bytes(model)


def test_partial_overwrite_of_bucket_only_file(mount: MountFactory) -> None:
    body = os.urandom(3 * MiB + 123)
    m = mount({"rmw.bin": body}, upload_delay=LONG_DELAY)
    assert m.where_one("rmw.bin")["cached_bytes"] == 0
    model = Model(body)
    fd = os.open(m.path / "rmw.bin", os.O_WRONLY)
    try:
        for offset, size in ((MiB - 50, 100), (7, 3), (3 * MiB + 100, 23)):
            chunk = os.urandom(size)
            os.pwrite(fd, chunk, offset)
            model.pwrite(chunk, offset)
    finally:
        os.close(fd)
    assert len(model.data) == len(body)
    assert read_from_daemon(m.path / "rmw.bin") == bytes(model)
    assert m.where_one("rmw.bin")["state"] == "dirty"
    assert bucket_bytes(m, "rmw.bin") == body  # nothing uploaded yet
    flush(m, "rmw.bin")
    assert bucket_bytes(m, "rmw.bin") == bytes(model)
    assert m.where_one("rmw.bin")["state"] == "clean"


# --- 2: unlink, mkdir, rmdir ------------------------------------------------------------------


def test_unlinked_open_file_stays_readable_until_closed(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    written = os.urandom(MiB + 17)
    (m.path / "w.bin").write_bytes(written)
    fd = os.open(m.path / "w.bin", os.O_RDWR)
    try:
        os.unlink(m.path / "w.bin")
        expect_errno(errno.ENOENT, lambda: os.stat(m.path / "w.bin"))
        expect_errno(errno.ENOENT, lambda: os.unlink(m.path / "w.bin"))
        assert os.listdir(m.path) == []
        drop_page_cache()
        assert os.pread(fd, 2 * MiB, 0) == written
        assert os.fstat(fd).st_size == len(written)
        # still writable, too
        os.pwrite(fd, b"more", len(written))
        assert os.pread(fd, 10, len(written)) == b"more"
    finally:
        os.close(fd)
    assert os.listdir(m.path) == []
    # the name can be used again at once
    (m.path / "w.bin").write_bytes(b"new")
    assert read_from_daemon(m.path / "w.bin") == b"new"
    st = m.status()
    assert st["open_files"] == 0, st


def test_unlinked_open_bucket_file_stays_readable_until_closed(mount: MountFactory) -> None:
    body = os.urandom(12 * MiB)  # much more than readahead_max (4 MiB)
    m = mount({"cold.bin": body}, upload_delay=LONG_DELAY)
    fd = os.open(m.path / "cold.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 0) == body[:10]
        os.unlink(m.path / "cold.bin")
        expect_errno(errno.ENOENT, lambda: os.stat(m.path / "cold.bin"))
        time.sleep(1.0)  # the queued bucket delete has run by now
        got = errno_of(lambda: os.pread(fd, MiB, 10 * MiB))
        assert got is None, f"pread of the unlinked open file failed: {errno.errorcode[got]}"
        drop_page_cache()
        assert os.pread(fd, len(body), 0) == body
    finally:
        os.close(fd)


def test_mkdir_rmdir_unlink_errnos(mount: MountFactory) -> None:
    m = mount({"full/inner.txt": b"inner", "file.txt": b"f", "deep/a/b.txt": b"b"})
    d = m.path / "newdir"
    os.mkdir(d, 0o750)
    assert stat.S_ISDIR(d.stat().st_mode)
    assert stat.S_IMODE(d.stat().st_mode) == 0o750
    assert os.listdir(d) == []
    expect_errno(errno.EEXIST, lambda: os.mkdir(d))
    expect_errno(errno.EEXIST, lambda: os.mkdir(m.path / "file.txt"))
    expect_errno(errno.EEXIST, lambda: os.mkdir(m.path / "full"))

    (d / "x").write_bytes(b"x")
    expect_errno(errno.ENOTEMPTY, lambda: os.rmdir(d))
    # a bucket directory whose children were never listed on this node
    expect_errno(errno.ENOTEMPTY, lambda: os.rmdir(m.path / "full"))
    expect_errno(errno.ENOTEMPTY, lambda: os.rmdir(m.path / "deep"))
    expect_errno(errno.ENOTDIR, lambda: os.rmdir(m.path / "file.txt"))
    expect_errno(errno.EISDIR, lambda: os.unlink(m.path / "full"))
    expect_errno(errno.EISDIR, lambda: os.unlink(d))
    expect_errno(errno.ENOENT, lambda: os.rmdir(m.path / "missing"))
    expect_errno(errno.ENOENT, lambda: os.unlink(m.path / "missing"))
    expect_errno(errno.ENOENT, lambda: os.mkdir(m.path / "missing" / "sub"))

    os.unlink(d / "x")
    os.rmdir(d)
    os.unlink(m.path / "full" / "inner.txt")
    os.rmdir(m.path / "full")
    assert sorted(os.listdir(m.path)) == ["deep", "file.txt"]
    # nested mkdir and rmdir
    os.makedirs(m.path / "n1" / "n2" / "n3")
    os.removedirs(m.path / "n1" / "n2" / "n3")
    assert sorted(os.listdir(m.path)) == ["deep", "file.txt"]


# --- 3: rename ------------------------------------------------------------------------------------


def test_rename_files(mount: MountFactory) -> None:
    cold = os.urandom(MiB + 5)
    m = mount({"cold.bin": cold, "target.txt": b"old target", "sub/keep.txt": b"keep"})
    (m.path / "hot.txt").write_bytes(b"hot")

    os.rename(m.path / "cold.bin", m.path / "sub" / "moved.bin")  # bucket-only file
    os.rename(m.path / "hot.txt", m.path / "target.txt")  # over an existing file
    expect_errno(errno.ENOENT, lambda: os.stat(m.path / "cold.bin"))
    expect_errno(errno.ENOENT, lambda: os.stat(m.path / "hot.txt"))
    assert sorted(os.listdir(m.path)) == ["sub", "target.txt"]
    assert sorted(os.listdir(m.path / "sub")) == ["keep.txt", "moved.bin"]
    assert read_from_daemon(m.path / "target.txt") == b"hot"
    assert read_from_daemon(m.path / "sub" / "moved.bin") == cold

    # rename onto itself is a no-op; a missing source is ENOENT
    os.rename(m.path / "target.txt", m.path / "target.txt")
    assert (m.path / "target.txt").read_bytes() == b"hot"
    expect_errno(errno.ENOENT, lambda: os.rename(m.path / "nope", m.path / "x"))
    expect_errno(errno.ENOENT, lambda: os.rename(m.path / "target.txt", m.path / "no/x"))


def test_rename_errnos(mount: MountFactory) -> None:
    m = mount(
        {
            "file.txt": b"f",
            "dir/a.txt": b"a",
            "full/b.txt": b"b",
            "emptydir/": b"",
        }
    )
    p = m.path
    os.mkdir(p / "dir" / "child")
    expect_errno(errno.EISDIR, lambda: os.rename(p / "file.txt", p / "emptydir"))
    expect_errno(errno.ENOTDIR, lambda: os.rename(p / "dir", p / "file.txt"))
    expect_errno(errno.ENOTEMPTY, lambda: os.rename(p / "dir", p / "full"))
    expect_errno(errno.EINVAL, lambda: os.rename(p / "dir", p / "dir" / "child" / "x"))
    expect_errno(errno.EINVAL, lambda: os.rename(p / "dir", p / "dir" / "x"))
    expect_errno(errno.ENOENT, lambda: os.rename(p / "missing", p / "x"))
    # nothing moved
    assert sorted(os.listdir(p)) == ["dir", "emptydir", "file.txt", "full"]
    assert sorted(os.listdir(p / "dir")) == ["a.txt", "child"]
    # a directory over an empty directory replaces it
    os.rename(p / "dir", p / "emptydir")
    assert sorted(os.listdir(p)) == ["emptydir", "file.txt", "full"]
    assert sorted(os.listdir(p / "emptydir")) == ["a.txt", "child"]
    assert (p / "emptydir" / "a.txt").read_bytes() == b"a"


def test_rename_directory_with_cached_dirty_and_cold_files(mount: MountFactory) -> None:
    bodies = {f"d/cold{i}.bin": os.urandom(1000 + i) for i in range(3)}
    bodies["d/warm.bin"] = os.urandom(MiB + 3)
    bodies["d/sub/deep.txt"] = b"deep"
    m = mount(bodies, upload_delay=LONG_DELAY)
    assert (m.path / "d" / "warm.bin").read_bytes() == bodies["d/warm.bin"]  # cached
    (m.path / "d" / "dirty.txt").write_bytes(b"dirty")
    os.mkdir(m.path / "d" / "newsub")

    os.rename(m.path / "d", m.path / "e")
    assert os.listdir(m.path) == ["e"]
    names = sorted(os.listdir(m.path / "e"))
    assert names == [
        "cold0.bin",
        "cold1.bin",
        "cold2.bin",
        "dirty.txt",
        "newsub",
        "sub",
        "warm.bin",
    ]
    drop_page_cache()
    for key, body in bodies.items():
        assert (m.path / "e" / key[2:]).read_bytes() == body, key
    assert (m.path / "e" / "dirty.txt").read_bytes() == b"dirty"
    assert os.listdir(m.path / "e" / "newsub") == []


def test_readdir_of_renamed_unlisted_directory_after_create(mount: MountFactory) -> None:
    m = mount({"d/a.txt": b"a", "d/b.txt": b"b", "d/c.txt": b"c"})
    os.rename(m.path / "d", m.path / "e")  # d was never listed on this node
    (m.path / "e" / "new.txt").write_bytes(b"new")
    for name in ("a.txt", "b.txt", "c.txt", "new.txt"):
        assert (m.path / "e" / name).exists(), name  # lookups all work
    assert sorted(os.listdir(m.path / "e")) == ["a.txt", "b.txt", "c.txt", "new.txt"]


def test_rename_across_mounts_and_out_of_the_mount_is_exdev(
    mount: MountFactory, tmp_path: Path
) -> None:
    a = mount({"f.txt": b"f", "d/x": b"x"})
    b = mount()
    expect_errno(errno.EXDEV, lambda: os.rename(a.path / "f.txt", b.path / "f.txt"))
    expect_errno(errno.EXDEV, lambda: os.rename(a.path / "d", b.path / "d"))
    expect_errno(errno.EXDEV, lambda: os.rename(a.path / "f.txt", tmp_path / "f.txt"))
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"o")
    expect_errno(errno.EXDEV, lambda: os.rename(outside, a.path / "outside.txt"))
    assert (a.path / "f.txt").read_bytes() == b"f"


# --- 4: symlinks, attributes, statvfs, fsync, xattrs, refused operations ----------------------------


def test_symlink_and_readlink(mount: MountFactory) -> None:
    m = mount({"target.txt": b"target"})
    os.symlink("target.txt", m.path / "link")
    os.symlink("/absolute/elsewhere", m.path / "dangling")
    assert stat.S_ISLNK(os.lstat(m.path / "link").st_mode)
    assert os.readlink(m.path / "link") == "target.txt"
    assert os.readlink(m.path / "dangling") == "/absolute/elsewhere"
    assert (m.path / "link").read_bytes() == b"target"
    expect_errno(errno.EEXIST, lambda: os.symlink("x", m.path / "link"))
    expect_errno(errno.EINVAL, lambda: os.readlink(m.path / "target.txt"))
    m.remount()
    assert os.readlink(m.path / "link") == "target.txt"
    assert stat.S_ISLNK(os.lstat(m.path / "dangling").st_mode)
    os.unlink(m.path / "link")
    assert sorted(os.listdir(m.path)) == ["dangling", "target.txt"]


def test_chmod_chown_utime_persist(mount: MountFactory) -> None:
    m = mount({"cold.txt": b"cold"}, upload_delay=LONG_DELAY)
    (m.path / "hot.txt").write_bytes(b"hot")
    os.mkdir(m.path / "dir")
    mtime_ns = 1_600_000_000_123_456_789
    for name in ("cold.txt", "hot.txt", "dir"):
        path = m.path / name
        os.chmod(path, 0o711)
        os.utime(path, ns=(mtime_ns, mtime_ns))
        if os.geteuid() == 0:
            os.chown(path, 1234, 5678)
    m.remount()
    for name in ("cold.txt", "hot.txt", "dir"):
        st = os.stat(m.path / name)
        assert stat.S_IMODE(st.st_mode) == 0o711, (name, oct(st.st_mode))
        assert st.st_mtime_ns == mtime_ns, name
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (1234, 5678), name
    assert (m.path / "cold.txt").read_bytes() == b"cold"
    assert (m.path / "hot.txt").read_bytes() == b"hot"


def test_statvfs_reports_tier_capacity_and_use(mount: MountFactory) -> None:
    m = mount(nvme="16MiB", hdd="64MiB", upload_delay=LONG_DELAY)
    before = os.statvfs(m.path)
    assert before.f_blocks * before.f_frsize == 80 * MiB
    assert before.f_namemax == 255
    (m.path / "four.bin").write_bytes(os.urandom(4 * MiB))
    after = os.statvfs(m.path)
    used = (before.f_bavail - after.f_bavail) * after.f_frsize
    assert used >= 4 * MiB, used
    assert after.f_bfree <= after.f_blocks


def test_fsync_and_fsyncdir(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    fd = os.open(m.path / "s.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"durable")
        os.fsync(fd)
        os.fdatasync(fd)
        assert m.where_one("s.bin")["state"] == "dirty"
        assert m.where_one("s.bin")["size"] == 7
    finally:
        os.close(fd)
    dfd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    assert read_from_daemon(m.path / "s.bin") == b"durable"


def test_user_xattrs_and_refused_namespaces(mount: MountFactory) -> None:
    m = mount({"cold.txt": b"c"})
    (m.path / "hot.txt").write_bytes(b"h")
    os.mkdir(m.path / "dir")
    for name in ("cold.txt", "hot.txt", "dir"):
        path = m.path / name
        os.setxattr(path, "user.a", b"1")
        os.setxattr(path, "user.b", b"\x00binary\xff")
        assert os.getxattr(path, "user.a") == b"1"
        assert os.getxattr(path, "user.b") == b"\x00binary\xff"
        assert sorted(os.listxattr(path)) == ["user.a", "user.b"]
        os.setxattr(path, "user.a", b"replaced")
        assert os.getxattr(path, "user.a") == b"replaced"
        os.removexattr(path, "user.a")
        assert os.listxattr(path) == ["user.b"]
        expect_errno(errno.ENODATA, lambda path=path: os.getxattr(path, "user.a"))
        expect_errno(errno.ENODATA, lambda path=path: os.removexattr(path, "user.a"))
        for other in ("trusted.x", "security.x"):
            expect_errno(
                errno.EOPNOTSUPP, lambda path=path, other=other: os.setxattr(path, other, b"v")
            )
    m.remount()
    assert os.getxattr(m.path / "hot.txt", "user.b") == b"\x00binary\xff"
    assert os.listxattr(m.path / "cold.txt") == ["user.b"]


def test_hard_link_and_device_node_are_eperm_fifo_is_stored(mount: MountFactory) -> None:
    # docs/guarantees.md: hard links and device nodes EPERM, O_TMPFILE EOPNOTSUPP; FIFOs and sockets are stored
    # as empty objects whose mode carries the type.
    m = mount({"file.txt": b"f"}, upload_delay=LONG_DELAY)
    expect_errno(errno.EPERM, lambda: os.link(m.path / "file.txt", m.path / "hard"))
    if os.geteuid() == 0:  # only root may ask for a device node at all
        expect_errno(
            errno.EPERM,
            lambda: os.mknod(m.path / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        )
        expect_errno(
            errno.EPERM,
            lambda: os.mknod(m.path / "blk", stat.S_IFBLK | 0o600, os.makedev(7, 0)),
        )
    # No O_TMPFILE: the errno of Linux filesystems without it.
    expect_errno(errno.EOPNOTSUPP, lambda: os.open(m.path, os.O_TMPFILE | os.O_RDWR, 0o600))
    assert os.listdir(m.path) == ["file.txt"]
    os.mkfifo(m.path / "fifo", 0o640)
    st = os.lstat(m.path / "fifo")
    assert stat.S_ISFIFO(st.st_mode), oct(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640
    flush(m)
    head = m.s3.head_object(Bucket=m.bucket, Key=m.key("fifo"))
    assert head["ContentLength"] == 0
    assert int(head["Metadata"]["mode"]) == st.st_mode
    m.remount()
    assert stat.S_ISFIFO(os.lstat(m.path / "fifo").st_mode)
    assert sorted(os.listdir(m.path)) == ["fifo", "file.txt"]
