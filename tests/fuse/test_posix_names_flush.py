"""Real mount: names and keys too long, a flush never held up by a file
the bucket refuses, and buffered readers beside an O_DIRECT writer.  Errnos are asserted exactly.

The O_DIRECT race: with native AIO, the kernel (Linux 6.18 here) does not
drop the page-cache pages that buffered readers re-read while an
asynchronous direct write was on its way, so a buffered read after the
write completed returned old bytes (about one write in twenty) while a
direct read of the same range returned the new ones.  The daemon now
invalidates the file's pages before it answers such a write
(``tierfs.core.read.handles``); what these tests assert is what we guarantee: a
buffered read issued after a direct write completed sees that write, for
synchronous and asynchronous writers.  On a stale read they record what a
direct read returns, so a failure tells the kernel's stale page cache
(direct read new) from wrong bytes in the daemon (direct read old).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults import FaultProxy
from tests.fuse.conftest import Mount, MountFactory, run_tierfs

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB


def errno_of(fn: Callable[[], Any]) -> int | None:
    """The errno ``fn()`` fails with; None if it succeeds."""
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


def bucket_keys(m: Mount) -> set[str]:
    pages = m.s3.get_paginator("list_objects_v2").paginate(Bucket=m.bucket, Prefix=m.prefix + "/")
    return {
        o["Key"][len(m.prefix) + 1 :]
        for page in pages
        for o in page.get("Contents", [])
        if not o["Key"].startswith(f"{m.prefix}/.tierfs-attrs/")
    }


# --- 1: names and keys too long ---------------------------------------------------------------

#: Bytes a key relative to the mount's prefix ("data/") may have in S3.
KEY_ROOM = 1024 - len("data/")


def test_a_lookup_of_a_name_over_255_bytes_is_enametoolong(mount: MountFactory) -> None:
    m = mount()
    assert errno_of(lambda: os.stat(m.path / ("n" * 256))) == errno.ENAMETOOLONG
    assert errno_of(lambda: os.stat(m.path / ("n" * 255))) == errno.ENOENT


@pytest.mark.parametrize("backing", ["s3", "file"])
def test_reserved_names_are_eperm_on_both_backings(
    mount: MountFactory, tmp_path: Path, backing: str
) -> None:
    """``.tierfs-attrs`` in the root is reserved on every backing; the
    ``file://`` backing also keeps every ``.tierfs-*`` name for itself (its
    markers, sidecars, temp files).  Both refuse with EPERM (the departures
    from POSIX in docs/guarantees.md), never ENAMETOOLONG: the name is not too long.  On S3
    the other ``.tierfs-*`` names are ordinary names."""
    backing_dir = None
    if backing == "file":
        backing_dir = tmp_path / "backing"
        backing_dir.mkdir()
    m = mount(backing_dir=backing_dir, upload_delay="600s")
    (m.path / "d").mkdir()
    (m.path / "f").write_bytes(b"f")
    (m.path / "e").mkdir()
    eperm = errno.EPERM
    shadow_root = m.path / ".tierfs-attrs"
    assert errno_of(lambda: shadow_root.write_bytes(b"x")) == eperm
    assert errno_of(lambda: os.mkdir(shadow_root)) == eperm
    assert errno_of(lambda: os.rename(m.path / "f", shadow_root)) == eperm
    assert errno_of(lambda: os.rename(m.path / "e", shadow_root)) == eperm

    in_root, in_dir = m.path / ".tierfs-meta", m.path / "d" / ".tierfs-x"
    attempts: list[tuple[str, Callable[[], Any]]] = [
        ("create", lambda: in_dir.write_bytes(b"x")),
        ("mkdir", lambda: os.mkdir(in_root)),
        ("symlink", lambda: os.symlink("target", m.path / "d" / ".tierfs-link")),
        ("mkfifo", lambda: os.mkfifo(m.path / "d" / ".tierfs-fifo")),
        ("rename file", lambda: os.rename(m.path / "f", m.path / "d" / ".tierfs-f")),
        ("rename dir", lambda: os.rename(m.path / "e", m.path / ".tierfs-e")),
    ]
    expected = eperm if backing == "file" else None
    for what, attempt in attempts:
        assert errno_of(attempt) == expected, f"{what} on {backing}"
    names = (sorted(os.listdir(m.path)), sorted(os.listdir(m.path / "d")))
    if backing == "file":
        assert names == (["d", "e", "f"], [])
    else:
        assert names == (
            [".tierfs-e", ".tierfs-meta", "d"],
            [".tierfs-f", ".tierfs-fifo", ".tierfs-link", ".tierfs-x"],
        )
        done = run_tierfs("flush", str(m.path))
        assert done.returncode == 0, done.stderr
        assert {"d/.tierfs-x", "d/.tierfs-f", ".tierfs-meta/", ".tierfs-e/"} <= bucket_keys(m)


def test_names_whose_object_key_would_be_too_long_are_refused_up_front(
    mount: MountFactory,
) -> None:
    m = mount(upload_delay="600s")
    deep = m.path
    for letter in "pqrs":  # four levels of 200-byte names: a key of 803 bytes
        deep = deep / (letter * 200)
        deep.mkdir()
    room = KEY_ROOM - (4 * 200 + 3) - 1  # bytes left for a name in ``deep``
    assert 0 < room < 255

    too_long = errno.ENAMETOOLONG
    assert errno_of(lambda: (deep / ("f" * (room + 1))).write_bytes(b"x")) == too_long
    assert errno_of(lambda: os.mkdir(deep / ("d" * room))) == too_long  # + "/" of its marker
    assert errno_of(lambda: os.symlink("target", deep / ("l" * (room + 1)))) == too_long
    assert errno_of(lambda: os.mkfifo(deep / ("m" * (room + 1)))) == too_long
    (m.path / "short").write_bytes(b"short")
    assert errno_of(lambda: os.rename(m.path / "short", deep / ("f" * (room + 1)))) == too_long
    assert os.listdir(deep) == [] and (m.path / "short").read_bytes() == b"short"

    # A directory rename checks the deepest key below it: 250/250/200 (702 bytes).
    low = m.path / "mv" / ("a" * 250) / ("b" * 250)
    low.mkdir(parents=True)
    (low / ("c" * 200)).write_bytes(b"deepest")
    fits = KEY_ROOM - 200 - 1 - 1 - 702  # under p...(200 bytes)
    target = m.path / ("p" * 200)
    assert errno_of(lambda: os.rename(m.path / "mv", target / ("n" * (fits + 1)))) == too_long
    assert (m.path / "mv").is_dir()
    os.rename(m.path / "mv", target / ("n" * fits))

    # Names right at the limit are taken, and reach the bucket.
    (deep / ("f" * room)).write_bytes(b"fits")
    os.mkdir(deep / ("d" * (room - 1)))
    done = run_tierfs("flush", str(m.path))
    assert done.returncode == 0, f"{done.stderr}\n{m.log_tail()}"
    keys = bucket_keys(m)
    deep_key = "/".join(letter * 200 for letter in "pqrs")
    assert f"{deep_key}/{'f' * room}" in keys
    assert f"{deep_key}/{'d' * (room - 1)}/" in keys
    moved = "/".join(["p" * 200, "n" * fits, "a" * 250, "b" * 250, "c" * 200])
    assert moved in keys, sorted(k for k in keys if k.startswith("p"))
    assert max(len(k.encode()) for k in keys) <= KEY_ROOM


# --- 1: a file the bucket refuses for good never holds up a flush --------------------------


def _put_of(*names: str) -> Callable[[str], bool]:
    """Matches the PUT request lines of the mount's objects ``names``."""

    def match(line: str) -> bool:
        method, _, rest = line.partition(" ")
        path = rest.split(" ")[0].split("?")[0]
        return method == "PUT" and any(path.endswith(f"/data/{n}") for n in names)

    return match


def test_a_file_the_bucket_refuses_fails_flush_fast_and_holds_up_nothing(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    m = mount(endpoint_url=fault_proxy.endpoint, upload_delay="600s")
    fault_proxy.refuse_requests(10**6, status="400", match=_put_of("bad.bin", "doomed.bin"))
    (m.path / "bad.bin").write_bytes(b"refused until the operator acts")
    (m.path / "doomed.bin").write_bytes(b"removed by the user")
    (m.path / "sub").mkdir()
    goods = {f"good{i}.bin": b"good %d" % i for i in range(4)} | {"sub/good.bin": b"in sub"}
    for name, body in goods.items():
        (m.path / name).write_bytes(body)

    started = time.monotonic()
    done = run_tierfs("flush", str(m.path), timeout=60)
    took = time.monotonic() - started
    print(f"\nflush with refused files: {took:.2f} s, exit {done.returncode}: {done.stderr}")
    assert done.returncode != 0
    assert took < 10, f"flush took {took:.1f} s to fail"
    for name in ("bad.bin", "doomed.bin"):
        assert name in done.stderr and "InvalidArgument" in done.stderr, done.stderr
    assert "good" not in done.stderr, done.stderr
    keys = bucket_keys(m)
    for name, body in goods.items():  # every other file is durable
        assert name in keys, sorted(keys)
        assert m.s3.get_object(Bucket=m.bucket, Key=m.key(name))["Body"].read() == body
    assert "bad.bin" not in keys and "doomed.bin" not in keys

    item = m.where_one("bad.bin")
    assert item["state"] == "failed", item
    assert "InvalidArgument" in item["failed_reason"], item
    status = m.status()
    assert status["failed_files"] == 2
    assert {f["path"] for f in status["failed"]} == {"bad.bin", "doomed.bin"}
    human = run_tierfs("status", str(m.path)).stdout
    assert "FAILED" in human and "bad.bin" in human and "InvalidArgument" in human, human
    human = run_tierfs("where", str(m.path / "bad.bin")).stdout
    assert "failed" in human and "InvalidArgument" in human, human

    # Dropping an entry: remove its file.
    os.unlink(m.path / "doomed.bin")
    done = run_tierfs("flush", str(m.path), timeout=60)
    assert done.returncode != 0 and "bad.bin" in done.stderr and "doomed" not in done.stderr

    # The other is kept, across a remount too, and a flush retries it.
    m.remount()
    done = run_tierfs("flush", str(m.path), timeout=60)
    assert done.returncode != 0 and "bad.bin" in done.stderr, done.stderr
    assert m.where_one("bad.bin")["state"] == "failed"
    # ``umount --flush`` does not wait forever either: it names the file and
    # leaves the mount as it is (a plain umount keeps the entry for later).
    started = time.monotonic()
    done = run_tierfs("umount", str(m.path), "--flush", timeout=60)
    assert done.returncode != 0 and "bad.bin" in done.stderr, done.stderr
    assert time.monotonic() - started < 10
    assert os.path.ismount(m.path)
    # Kept, but not retried on its own: no request storm against the bucket.
    refused = fault_proxy.faults_injected
    time.sleep(3)
    assert fault_proxy.faults_injected == refused, "a refusal for good was retried on its own"

    # The operator fixes the cause: the next flush completes.
    fault_proxy.clear_faults()
    done = run_tierfs("flush", str(m.path), timeout=60)
    assert done.returncode == 0, f"{done.stderr}\n{m.log_tail()}"
    assert m.s3.get_object(Bucket=m.bucket, Key=m.key("bad.bin"))["Body"].read() == (
        b"refused until the operator acts"
    )
    assert m.where_one("bad.bin")["state"] == "clean"
    assert m.status()["failed_files"] == 0


# --- 3: buffered readers beside an O_DIRECT writer ------------------------------------------

#: One direct write: aligned, and large enough for the daemon's direct path too.
CHUNK = 256 * KiB
SLOTS = 4
ROUNDS = 300


def _pattern(gen: int, size: int) -> bytes:
    return gen.to_bytes(8, "little") * (size // 8)


def _gen_of(data: bytes) -> int:
    return int.from_bytes(data[:8], "little")


# Linux native AIO through raw syscalls (x86_64 numbers), as an asynchronous
# O_DIRECT writer (fio, databases) submits its writes: several in flight at once.

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
SYS_io_setup, SYS_io_destroy, SYS_io_getevents, SYS_io_submit = 206, 207, 208, 209
IOCB_CMD_PREAD, IOCB_CMD_PWRITE = 0, 1


class IoCb(ctypes.Structure):
    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class IoEvent(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


class Aio:
    """One native AIO context (``io_setup``) of ``depth`` requests."""

    def __init__(self, depth: int) -> None:
        self.ctx = ctypes.c_ulong(0)
        _check(_libc.syscall(SYS_io_setup, ctypes.c_long(depth), ctypes.byref(self.ctx)))

    def submit(self, cbs: list[IoCb]) -> int:
        arr = (ctypes.POINTER(IoCb) * len(cbs))(*[ctypes.pointer(c) for c in cbs])
        return _check(_libc.syscall(SYS_io_submit, self.ctx, ctypes.c_long(len(cbs)), arr))

    def wait(self, n: int) -> list[IoEvent]:
        """Block until ``n`` requests completed; their events."""
        events = (IoEvent * n)()
        got = _check(
            _libc.syscall(
                SYS_io_getevents, self.ctx, ctypes.c_long(n), ctypes.c_long(n), events, None
            )
        )
        return list(events[:got])

    def close(self) -> None:
        _libc.syscall(SYS_io_destroy, self.ctx)


def _race_direct_writer_with_buffered_readers(
    path: Path,
    readers: int,
    *,
    writer_flags: int = os.O_RDWR | os.O_DIRECT,
    asynchronous: bool = False,
) -> dict[str, Any]:
    """An O_DIRECT writer rewrites ``SLOTS`` chunks of ``path`` in turn; after
    each write it reads the chunk back through its direct fd and through a
    buffered fd, while ``readers`` threads read the file buffered in a loop.

    Returns the stale reads seen: through the direct fd (``direct_stale``,
    which must never happen) and through the buffered fd after the write
    completed (``buffered_stale``), plus how many reads the readers made."""
    size = CHUNK * SLOTS
    with open(path, "wb") as f:
        f.write(_pattern(0, CHUNK) * SLOTS)
    stop = threading.Event()
    reads = [0] * readers

    def reader(index: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            while not stop.is_set():
                for off in range(0, size, 128 * KiB):
                    os.pread(fd, 128 * KiB, off)
                reads[index] += 1
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
    for t in threads:
        t.start()
    direct_stale: list[tuple[int, int]] = []
    buffered_stale: list[tuple[int, ...]] = []
    wbuf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
    rbuf = mmap.mmap(-1, CHUNK)
    dfd = os.open(path, writer_flags)
    rdfd = os.open(path, os.O_RDONLY | os.O_DIRECT)  # reads what the daemon holds
    bfd = os.open(path, os.O_RDONLY)
    try:
        if asynchronous:
            _aio_rounds(dfd, rdfd, bfd, buffered_stale)
        for gen in range(1, 0 if asynchronous else ROUNDS + 1):
            off = (gen % SLOTS) * CHUNK
            wbuf.seek(0)
            wbuf.write(_pattern(gen, CHUNK))
            assert os.pwritev(dfd, [wbuf], off) == CHUNK
            assert os.preadv(rdfd, [rbuf], off) == CHUNK
            if rbuf[:CHUNK] != _pattern(gen, CHUNK):
                direct_stale.append((gen, _gen_of(rbuf[:8])))
            seen = os.pread(bfd, CHUNK, off)
            if seen != _pattern(gen, CHUNK):
                buffered_stale.append((gen, _gen_of(seen)))
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for fd in (dfd, rdfd, bfd):
            os.close(fd)
        wbuf.close()
        rbuf.close()
    return {"direct_stale": direct_stale, "buffered_stale": buffered_stale, "reads": sum(reads)}


def _aio_rounds(dfd: int, rdfd: int, bfd: int, buffered_stale: list[tuple[int, ...]]) -> None:
    """Rounds of ``SLOTS`` direct writes submitted at once (one per slot); as
    each completes, a buffered read of its range must see it."""
    aio = Aio(SLOTS)
    bufs = [mmap.mmap(-1, CHUNK) for _ in range(SLOTS)]
    check = mmap.mmap(-1, CHUNK)
    try:
        for round_no in range(ROUNDS // SLOTS):
            cbs = []
            for slot in range(SLOTS):
                gen = round_no * SLOTS + slot + 1
                bufs[slot].seek(0)
                bufs[slot].write(_pattern(gen, CHUNK))
                cb = IoCb()
                cb.aio_data = gen
                cb.aio_lio_opcode = IOCB_CMD_PWRITE
                cb.aio_fildes = dfd
                cb.aio_buf = ctypes.addressof(ctypes.c_char.from_buffer(bufs[slot]))
                cb.aio_nbytes = CHUNK
                cb.aio_offset = slot * CHUNK
                cbs.append(cb)
            assert aio.submit(cbs) == SLOTS
            done = 0
            while done < SLOTS:
                for event in aio.wait(1):
                    assert event.res == CHUNK, event.res
                    gen = event.data
                    slot = (gen - 1) % SLOTS
                    seen = os.pread(bfd, CHUNK, slot * CHUNK)
                    if seen != _pattern(gen, CHUNK):
                        # What the daemon holds: a direct read bypasses the page cache.
                        assert os.preadv(rdfd, [check], slot * CHUNK) == CHUNK
                        buffered_stale.append((gen, _gen_of(seen), _gen_of(check[:8])))
                    done += 1
            del cbs
    finally:
        aio.close()
        for buf in bufs:
            with contextlib.suppress(BufferError):
                buf.close()


@pytest.mark.parametrize(
    "writer_flags",
    [os.O_RDWR | os.O_DIRECT, os.O_WRONLY],
    ids=["O_DIRECT", "O_WRONLY-direct_io"],
)
def test_buffered_reads_after_a_completed_direct_write_see_it(
    mount: MountFactory, writer_flags: int
) -> None:
    """Synchronous writes that bypass the page cache: an ``O_DIRECT`` one,
    and a plain ``O_WRONLY`` one (tierfs replies ``direct_io`` to those)."""
    m = mount(upload_delay="600s")
    result = _race_direct_writer_with_buffered_readers(
        m.path / "race.bin", readers=2, writer_flags=writer_flags
    )
    print(f"\nO_DIRECT race: {result['reads']} reader passes, stale: {result}")
    assert result["reads"] > 0, "the readers never ran beside the writer"
    assert result["direct_stale"] == [], result
    assert result["buffered_stale"] == [], result


def test_buffered_reads_after_a_completed_async_direct_write_see_it(mount: MountFactory) -> None:
    m = mount(upload_delay="600s")
    result = _race_direct_writer_with_buffered_readers(
        m.path / "race.bin", readers=2, asynchronous=True
    )
    print(f"\nasync O_DIRECT race: {result['reads']} reader passes, stale: {result}")
    assert result["reads"] > 0, "the readers never ran beside the writer"
    assert result["buffered_stale"] == [], result
