"""The fetch path of small files, counted in S3 requests: a cold read or a preload of a small
file is ONE GET and no HEAD, and the cache file that the fetch thread opens
itself is kept by the file (no fd leaks, no duplicate)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.core.conftest import MiB, put
from tests.core.test_preload import run_preload
from tierfs.config import NamespaceConfig
from tierfs.errors import StoreError

KiB = 1024


def small_files(s3_store: Any, count: int, prefix: str = "ds") -> dict[str, bytes]:
    """``count`` objects of 20-200 KiB under ``prefix/``, put as another tool would."""
    out = {}
    for i in range(count):
        data = os.urandom(20 * KiB + (i * 37 * KiB) % (180 * KiB))
        key = f"{prefix}/f{i:03d}.bin"
        put(s3_store, key, data)
        out[key] = data
    return out


def open_fds(under: Path) -> int:
    """This process's fds on files under ``under`` (the tiers). Sockets are
    left out: the store's connection pool may open one more connection for
    two GETs at once, and keeps it; that is not a leak."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed between the listing and the readlink
            continue
        if target.startswith(f"{under}/"):
            count += 1
    return count


async def test_a_cold_read_of_a_small_file_is_one_get_and_no_head(
    make_fs: Any, s3_store: Any
) -> None:
    files = small_files(s3_store, 12)
    mount = await make_fs()
    await mount.fs.namespace.resolve("ds/f000.bin")  # the directory is listed
    gets, heads = len(mount.store.gets), mount.store.heads
    for key, data in files.items():
        assert await mount.read_file(key) == data
    assert mount.store.heads == heads, "a cold small file must not be HEAD first"
    assert sorted(mount.store.gets[gets:]) == sorted((k, 0, len(d)) for k, d in files.items())
    for key, data in files.items():
        where = await mount.fs.where(key)
        assert where["cached_bytes"] == len(data)
    # Served from the tier from now on, also after a remount.
    mount = await mount.remount()
    gets = len(mount.store.gets)
    for key, data in files.items():
        assert await mount.read_file(key) == data
    assert len(mount.store.gets) == gets


async def test_a_preload_of_small_files_is_one_get_each_and_no_head(
    make_fs: Any, s3_store: Any
) -> None:
    files = small_files(s3_store, 30)
    mount = await make_fs(capacities=(64 * MiB, 64 * MiB))
    await mount.fs.namespace.resolve("ds/f000.bin")
    gets, heads = len(mount.store.gets), mount.store.heads
    async with trio.open_nursery() as nursery:
        job = await run_preload(nursery, mount, ["ds"])
        nursery.cancel_scope.cancel()
    assert job.state == "done" and job.files_failed == 0
    assert job.files_done == len(files)
    assert job.bytes_fetched == sum(len(d) for d in files.values())
    assert mount.store.heads == heads
    assert sorted(mount.store.gets[gets:]) == sorted((k, 0, len(d)) for k, d in files.items())
    gets = len(mount.store.gets)
    for key, data in files.items():
        assert await mount.read_file(key) == data
    assert len(mount.store.gets) == gets, "every preloaded byte is served from the tier"


async def test_concurrent_fetches_of_one_file_keep_one_cache_file_and_leak_no_fd(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    """Two GETs of one cold file run at once, each thread opening the cache
    file that does not exist yet: the file keeps one set of fds, the other
    is closed, both blocks land in the same cache file."""
    data = os.urandom(3 * MiB + 100)
    put(s3_store, "two.bin", data)
    mount = await make_fs()
    inode = await mount.fs.namespace.resolve("two.bin")
    baseline = open_fds(tmp_path)
    for _round in range(3):
        opened = await mount.fs.open(inode.ino, 0)
        got: dict[int, bytes | memoryview] = {}

        async def read_at(offset: int, fh: int = opened.fh, out: dict[int, Any] = got) -> None:
            out[offset] = bytes(await mount.fs.read(fh, offset, 1000))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_at, 0)
            nursery.start_soon(read_at, 2 * MiB + 10)
        assert got[0] == data[:1000]
        assert got[2 * MiB + 10] == data[2 * MiB + 10 : 2 * MiB + 1010]
        cached = mount.fs.open_files.files[inode.ino]
        assert set(cached.fds) == {0}, "one buffered fd on the first tier"
        assert open_fds(tmp_path) > baseline, "the open file's cache fd is counted"
        await mount.fs.release(opened.fh)
        assert open_fds(tmp_path) == baseline, "every fd the fetch threads opened was closed"
        assert mount.fs.open_files.is_busy(inode.ino) is False
        where = await mount.fs.where("two.bin")
        assert where["blocks_cached"] >= 2  # (and readahead's block 1, if it started)
        mount.fs.movement.evict(inode.ino)  # cold again for the next round
    assert open_fds(tmp_path) == baseline


async def test_a_cold_read_after_revalidate_ttl_is_still_one_get_and_no_head(
    make_fs: Any, s3_store: Any
) -> None:
    """``revalidate_ttl = 0``: every open is due for a check, but a file
    with nothing cached is checked by its GET (If-Match), not by a HEAD."""
    files = small_files(s3_store, 6)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0))
    await mount.fs.namespace.resolve("ds/f000.bin")
    gets, heads = len(mount.store.gets), mount.store.heads
    for key, data in files.items():
        inode = await mount.fs.namespace.resolve(key)
        opened = await mount.fs.open(inode.ino, os.O_RDONLY)
        assert not opened.keep_cache, "not checked: no page the kernel may hold is kept"
        assert await mount.fs.read(opened.fh, 0, 1 << 20) == data
        await mount.fs.release(opened.fh)
    assert mount.store.heads == heads
    assert len(mount.store.gets) - gets == len(files)
    # Cached now: the next open is a HEAD (and the kernel keeps its pages).
    inode = await mount.fs.namespace.resolve("ds/f000.bin")
    opened = await mount.fs.open(inode.ino, os.O_RDONLY)
    assert opened.keep_cache
    await mount.fs.release(opened.fh)
    assert mount.store.heads == heads + 1


async def test_a_cold_file_changed_since_its_listing_is_read_new_through_its_get(
    make_fs: Any, s3_store: Any
) -> None:
    """The object changed after the listing: the GET's If-Match fails, the
    block cache HEADs it once and reads the new content (a smaller object:
    the new bytes at once; never ESTALE, never old bytes)."""
    put(s3_store, "chg/a.bin", b"old" * 30_000)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0))
    inode = await mount.fs.namespace.resolve("chg/a.bin")
    new = os.urandom(50_000)
    put(s3_store, "chg/a.bin", new)
    heads = mount.store.heads
    opened = await mount.fs.open(inode.ino, os.O_RDONLY)
    assert await mount.fs.read(opened.fh, 0, 1 << 20) == new
    await mount.fs.release(opened.fh)
    assert mount.store.heads == heads + 1
    assert (await mount.fs.namespace.resolve("chg/a.bin")).size == len(new)
    assert (await mount.fs.where("chg/a.bin"))["cached_bytes"] == len(new)
    assert await mount.read_file("chg/a.bin") == new


async def test_a_cold_file_that_grew_since_its_listing_is_estale_once_then_new(
    make_fs: Any, s3_store: Any
) -> None:
    """A larger object: the kernel would cut the new bytes at the size it was
    told at open, so that read is ESTALE (never a torn file); the next open
    reads the new content in full."""
    put(s3_store, "chg/g.bin", b"old" * 1000)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0))
    inode = await mount.fs.namespace.resolve("chg/g.bin")
    new = os.urandom(90_000)
    put(s3_store, "chg/g.bin", new)
    opened = await mount.fs.open(inode.ino, os.O_RDONLY)
    with pytest.raises(StoreError) as caught:
        await mount.fs.read(opened.fh, 0, 1 << 20)
    assert caught.value.errno == errno.ESTALE
    await mount.fs.release(opened.fh)
    assert await mount.read_file("chg/g.bin") == new


async def test_concurrent_readers_of_a_changed_cold_file_share_one_head(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "chg/b.bin", b"o" * (3 * MiB))
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0))
    inode = await mount.fs.namespace.resolve("chg/b.bin")
    new = os.urandom(3 * MiB)
    put(s3_store, "chg/b.bin", new)
    heads = mount.store.heads
    opened = await mount.fs.open(inode.ino, os.O_RDONLY)
    got: dict[int, bytes] = {}

    async def read_at(offset: int) -> None:
        got[offset] = bytes(await mount.fs.read(opened.fh, offset, 4096))

    async with trio.open_nursery() as nursery:
        for offset in (0, MiB + 5, 2 * MiB + 7):
            nursery.start_soon(read_at, offset)
    await mount.fs.release(opened.fh)
    for offset, data in got.items():
        assert data == new[offset : offset + 4096]
    assert mount.store.heads == heads + 1
