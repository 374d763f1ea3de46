"""Directories through a real mount: handles, seeks, and stats over expired listings.

``.`` and ``..`` in readdir with their inode numbers; a readdir of 3,000
entries (15,000 under ``--run-slow``) renamed under it returns none twice;
seekdir/telldir over 1,000 entries (4,000) reads from the offset (counted in the daemon's ``readdir_entries``);
``stat``s across expired directories never wait for a re-listing, which
runs in the background, bounded, and costs LISTs, not HEADs (counted in
``store_calls``; the LISTs are held at the proxy meanwhile); new and deleted
objects show after that re-listing.  glibc's
``readdir``/``telldir``/``seekdir`` are called through ctypes: Python's own
listing functions drop ``.`` and ``..`` and cannot seek.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import random
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, wait_until
from tierfs.core.names.listings import RELIST_CONCURRENCY
from tierfs.core.names.namereads import READDIR_BATCH


class Dirent(ctypes.Structure):
    """glibc's ``struct dirent`` on 64-bit Linux."""

    _fields_ = [
        ("d_ino", ctypes.c_uint64),
        ("d_off", ctypes.c_int64),
        ("d_reclen", ctypes.c_ushort),
        ("d_type", ctypes.c_ubyte),
        ("d_name", ctypes.c_char * 256),
    ]


libc = ctypes.CDLL(None, use_errno=True)
libc.opendir.restype = ctypes.c_void_p
libc.opendir.argtypes = [ctypes.c_char_p]
libc.readdir.restype = ctypes.POINTER(Dirent)
libc.readdir.argtypes = [ctypes.c_void_p]
libc.telldir.restype = ctypes.c_long
libc.telldir.argtypes = [ctypes.c_void_p]
libc.seekdir.restype = None
libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
libc.closedir.argtypes = [ctypes.c_void_p]


class Dir:
    """A ``DIR *`` of glibc."""

    def __init__(self, path: Path) -> None:
        handle = libc.opendir(os.fsencode(path))
        if not handle:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
        self.handle = handle

    def read(self) -> tuple[bytes, int] | None:
        """The next (name, d_ino), None at the end."""
        ctypes.set_errno(0)
        entry = libc.readdir(self.handle)
        if not entry:
            err = ctypes.get_errno()
            if err:
                raise OSError(err, os.strerror(err))
            return None
        return entry.contents.d_name, entry.contents.d_ino

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        while (item := self.read()) is not None:
            yield item

    def tell(self) -> int:
        return int(libc.telldir(self.handle))

    def seek(self, position: int) -> None:
        libc.seekdir(self.handle, position)

    def close(self) -> None:
        libc.closedir(self.handle)


def make_files(directory: Path, names: list[str]) -> None:
    for name in names:
        os.close(os.open(directory / name, os.O_CREAT | os.O_WRONLY, 0o644))


def store_calls(m: Mount) -> dict[str, int]:
    calls: dict[str, int] = m.status()["store_calls"]
    return calls


def test_readdir_returns_dot_and_dotdot_with_their_inode_numbers(mount: MountFactory) -> None:
    m = mount({"sub/a.txt": b"a"})
    root_ino = os.stat(m.path).st_ino
    sub_ino = os.stat(m.path / "sub").st_ino
    for path, dot, dotdot, names in (
        (m.path, root_ino, root_ino, {b"sub"}),  # ".." of the root is the root
        (m.path / "sub", sub_ino, root_ino, {b"a.txt"}),
    ):
        d = Dir(path)
        try:
            entries = dict(d)
        finally:
            d.close()
        assert entries.pop(b".") == dot
        assert entries.pop(b"..") == dotdot
        assert set(entries) == names
    assert os.stat(m.path / "sub" / "..").st_ino == root_ino


@pytest.mark.parametrize(
    "count",
    [pytest.param(15_000, marks=pytest.mark.slow, id="15000"), pytest.param(3000, id="3000")],
)
def test_renames_during_a_readdir_of_many_entries_return_none_twice(
    mount: MountFactory, count: int
) -> None:
    """15,000 entries is the size of the report (``--run-slow``); 3,000 are
    still about a hundred readdir batches, read while every third entry is
    renamed: those already returned and those ahead."""
    # Nothing is uploaded while the test runs: renames stay local moves.
    m = mount(upload_delay="1h", list_ttl="60s")
    big = m.path / "big"
    big.mkdir()
    names = [f"e{i:05}" for i in range(count)]
    make_files(big, names)
    inode_of = {name: os.stat(big / name).st_ino for name in names}
    d = Dir(big)
    try:
        seen: list[tuple[bytes, int]] = []
        for _ in range(300):
            item = d.read()
            assert item is not None
            seen.append(item)
        # Rename every third entry: those already returned and those ahead.
        renamed = set(names[::3])
        for name in names[::3]:
            os.rename(big / name, big / f"moved-{name}")
        seen += list(d)
    finally:
        d.close()
    entries = [(name, ino) for name, ino in seen if name not in (b".", b"..")]
    inos = [ino for _name, ino in entries]
    assert len(inos) == len(set(inos)), "an entry was returned twice"
    returned = {name.decode() for name, _ino in entries}
    kept = set(names) - renamed
    assert kept <= returned, "an entry that was not renamed is missing"
    assert all(inode_of[name.removeprefix("moved-")] in inos for name in returned)
    assert len(entries) <= count
    assert len(os.listdir(big)) == count


@pytest.mark.parametrize(
    "count", [pytest.param(4000, marks=pytest.mark.slow, id="4000"), pytest.param(1000, id="1000")]
)
def test_seekdir_over_many_entries_reads_from_the_offset(mount: MountFactory, count: int) -> None:
    """4,000 entries is the size of the report (``--run-slow``); the bound on
    the entries built is per seek, so 1,000 entries tell a seek from the
    offset (about 34 entries built per seek) from a walk from the start
    (about 500) just as well."""
    m = mount(upload_delay="1h", list_ttl="60s")
    big = m.path / "big"
    big.mkdir()
    make_files(big, [f"s{i:04}" for i in range(count)])
    d = Dir(big)
    try:
        positions: list[tuple[int, bytes]] = []
        while True:
            position = d.tell()
            item = d.read()
            if item is None:
                break
            positions.append((position, item[0]))
        assert len(positions) == count + 2
        before = m.counters()["readdir_entries"]
        random.Random(14).shuffle(positions)
        for position, name in positions:
            d.seek(position)
            item = d.read()
            assert item is not None and item[0] == name
        built = m.counters()["readdir_entries"] - before
    finally:
        d.close()
    # Each seek reads one kernel page of entries from its offset; a walk from
    # the start per seek would build about count * count / 2 entries.
    assert built <= len(positions) * (READDIR_BATCH + 2), built


def test_stats_in_expired_directories_never_wait_for_a_relisting(
    mount: MountFactory, fault_proxy: Any
) -> None:
    dirs = [f"d{i:02}" for i in range(30)]
    objects = {f"{d}/f{j}.bin": b"x" * j for d in dirs for j in range(10)}
    m = mount(objects, list_ttl="2s", endpoint_url=f"http://127.0.0.1:{fault_proxy.port}")
    paths = [(m.path / key, len(body)) for key, body in objects.items()]
    for path, size in paths:  # every directory listed once
        assert os.stat(path).st_size == size
    time.sleep(2.2)  # every listing and every kernel entry expired
    before = store_calls(m)
    listings = m.counters()["listings"]
    gate = fault_proxy.hold_requests(match="list-type=2")
    random.Random(7).shuffle(paths)
    results: list[int] = []

    def sweep() -> None:
        results.extend(os.stat(path).st_size - size for path, size in paths)

    worker = threading.Thread(target=sweep, daemon=True)
    try:
        worker.start()
        # Every LIST is held at the proxy: a stat that waited for one would
        # not finish until the gate opens.
        worker.join(timeout=20)
        assert not worker.is_alive(), "a stat waited for a re-listing"
        held_lists = fault_proxy.held
    finally:
        gate.set()
    worker.join(timeout=30)
    assert results == [0] * len(paths)
    # Only RELIST_CONCURRENCY re-listings were on the wire; the rest queued.
    assert 1 <= held_lists <= RELIST_CONCURRENCY
    assert wait_until(lambda: m.counters()["listings"] >= listings + len(dirs) + 1, 30)
    calls = {op: n - before.get(op, 0) for op, n in store_calls(m).items()}
    assert calls.get("HeadObject", 0) == 0  # every name was in its stale listing
    # One re-listing (a data LIST and a shadow LIST) per directory and the
    # root, not one per stat (a LIST per stat would be 300 and more).
    assert calls["ListObjectsV2"] <= 2 * (len(dirs) + 1) * 2, calls


def test_new_and_deleted_objects_show_after_one_background_relisting(
    mount: MountFactory, fault_proxy: Any
) -> None:
    m = mount(
        {"d/old.bin": b"old", "d/gone.bin": b"gone"},
        list_ttl="2s",
        endpoint_url=f"http://127.0.0.1:{fault_proxy.port}",
    )
    assert sorted(os.listdir(m.path / "d")) == ["gone.bin", "old.bin"]
    m.put("d/new.bin", b"new!")
    m.delete("d/gone.bin")
    time.sleep(2.2)  # expired
    before = store_calls(m)
    gate = fault_proxy.hold_requests(match="list-type=2")
    try:
        # A name the expired listing holds is served from it: no HEAD, no
        # LIST waited for.  (A name it lacks waits for the re-listing:
        # tests/fuse/test_visibility.py.)
        assert os.stat(m.path / "d" / "gone.bin").st_size == 4
        calls = {op: n - before.get(op, 0) for op, n in store_calls(m).items()}
        assert calls.get("HeadObject", 0) == 0
        assert wait_until(lambda: fault_proxy.held >= 1, 10), "no re-listing started"
    finally:
        gate.set()

    def relisted() -> bool:
        return sorted(os.listdir(m.path / "d")) == ["new.bin", "old.bin"]

    # Within list_ttl plus one re-listing (plus the kernel's entry timeout).
    assert wait_until(relisted, 15)
    assert (m.path / "d" / "new.bin").read_bytes() == b"new!"
    # Shown with the attributes of a listed name, not provisional owner-only ones.
    assert stat.S_IMODE(os.stat(m.path / "d" / "new.bin").st_mode) == 0o644
    with pytest.raises(FileNotFoundError):
        os.stat(m.path / "d" / "gone.bin")
    try:
        os.stat(m.path / "d" / "never.bin")
    except OSError as exc:
        assert exc.errno == errno.ENOENT
    else:
        raise AssertionError("never.bin exists")


@pytest.mark.slow
def test_shuffled_stats_over_expired_directories_measured(mount: MountFactory) -> None:
    """The figures of shuffled stats over expired listings, measured and printed
    (``--run-slow -s``): 30 directories of 400 files, ``list_ttl = 1s``,
    300 ``stat``s in shuffled order after every listing expired.  The
    median ``stat`` against the median time of one LIST of a directory
    (ListObjectsV2 of its 400 keys, sent by boto3 to the same server), and
    the LISTs the daemon sent against one per directory per ``list_ttl``
    (each re-listing is a data LIST and a shadow LIST).  Before the
    stale-while-revalidate listings: 323 LISTs for 300 stats, each stat as
    slow as a LIST."""
    ndirs, nfiles, nstats, ttl = 30, 400, 300, 1.0
    dirs = [f"d{i:02}" for i in range(ndirs)]
    objects = {f"{d}/f{j:03}.bin": b"x" * (j % 7) for d in dirs for j in range(nfiles)}
    m = mount(objects, list_ttl=f"{ttl}s")
    for d in dirs:  # every directory listed once (warm)
        assert len(os.listdir(m.path / d)) == nfiles

    list_times = []
    for d in dirs[:10]:
        start = time.perf_counter()
        pages = m.s3.get_paginator("list_objects_v2").paginate(
            Bucket=m.bucket, Prefix=m.key(d) + "/", Delimiter="/"
        )
        assert sum(len(page.get("Contents", [])) for page in pages) == nfiles
        list_times.append(time.perf_counter() - start)

    picks = random.Random(14).sample(sorted(objects), nstats)
    time.sleep(ttl + 0.3)  # every listing and every kernel entry expired
    before = store_calls(m)
    stat_times = []
    sweep_start = time.perf_counter()
    for key in picks:
        start = time.perf_counter()
        assert os.stat(m.path / key).st_size == len(objects[key])
        stat_times.append(time.perf_counter() - start)
    sweep = time.perf_counter() - sweep_start
    time.sleep(2 * ttl)  # the re-listings the sweep started finish
    calls = {op: n - before.get(op, 0) for op, n in store_calls(m).items()}
    lists = calls.get("ListObjectsV2", 0)
    stat_median = sorted(stat_times)[len(stat_times) // 2]
    list_median = sorted(list_times)[len(list_times) // 2]
    ttl_periods = math.ceil(sweep / ttl) + 1
    print(
        f"\n{ndirs} dirs x {nfiles} files, list_ttl {ttl:g}s, {nstats} shuffled stats in "
        f"{sweep:.2f} s: stat median {stat_median * 1e3:.3f} ms, p90 "
        f"{sorted(stat_times)[nstats * 9 // 10] * 1e3:.3f} ms, max {max(stat_times) * 1e3:.3f} ms; "
        f"one LIST of a directory (boto3) median {list_median * 1e3:.1f} ms "
        f"(stat/LIST {stat_median / list_median:.3f}); daemon LISTs during and after the "
        f"sweep: {lists} (data + shadow), HEADs {calls.get('HeadObject', 0)}; "
        f"bound 2 x {ndirs + 1} dirs x {ttl_periods} list_ttl periods = "
        f"{2 * (ndirs + 1) * ttl_periods}"
    )
    assert stat_median < list_median / 5, (stat_median, list_median)
    assert calls.get("HeadObject", 0) == 0
    assert lists <= 2 * (ndirs + 1) * ttl_periods, calls
