"""The read path of TierFS over a real S3 server, without a mount."""

from __future__ import annotations

import os
from typing import Any

import trio

from tests.core.conftest import MiB, put
from tierfs.config import FetchConfig, NamespaceConfig


async def test_read_fetches_only_touched_blocks(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(16 * MiB)
    put(s3_store, "data/big.bin", data)
    mount = await make_fs()
    middle = await mount.read_file("data/big.bin", 8 * MiB + 1000, 100_000)
    assert middle == data[8 * MiB + 1000 : 8 * MiB + 101_000]
    assert mount.store.gets == [("data/big.bin", 8 * MiB, MiB)]
    where = await mount.fs.where("data/big.bin")
    assert where["blocks_cached"] == 1
    assert where["cached_bytes"] == MiB


async def test_sequential_read_matches_and_each_block_is_fetched_once(
    make_fs: Any, s3_store: Any
) -> None:
    data = os.urandom(12 * MiB + 12345)
    put(s3_store, "seq.bin", data)
    mount = await make_fs()
    assert await mount.read_file("seq.bin") == data
    ranges = sorted((start, length) for _, start, length in mount.store.gets)
    covered = 0
    for start, length in ranges:
        assert start == covered, f"gap or overlap at {start}: {ranges}"
        covered += length
    assert covered == len(data), "every byte fetched exactly once, the short tail included"
    assert len(ranges) < 13, "sequential blocks are fetched in runs, not one GET each"


async def test_readahead_fetches_ahead_of_a_sequential_reader(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "ra.bin", os.urandom(8 * MiB))
    mount = await make_fs()
    inode = await mount.fs.namespace.resolve("ra.bin")
    opened = await mount.fs.open(inode.ino, 0)
    for offset in range(0, 2 * MiB, 128 * 1024):
        await mount.fs.read(opened.fh, offset, 128 * 1024)
    with trio.fail_after(10):
        while mount.fs.open_files.files[inode.ino].flights:
            await trio.sleep(0.01)
    await mount.fs.release(opened.fh)
    fetched = {start // MiB for _, start, _ in mount.store.gets}
    assert fetched > {0, 1}, "readahead should have fetched blocks beyond the ones read"


async def test_random_read_does_not_trigger_readahead(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "rand.bin", os.urandom(8 * MiB))
    mount = await make_fs()
    for offset in (5 * MiB, 3 * MiB, 7 * MiB):
        await mount.read_file("rand.bin", offset, 4096)
    assert sorted(start for _, start, _ in mount.store.gets) == [3 * MiB, 5 * MiB, 7 * MiB]


async def test_concurrent_readers_of_one_block_share_one_get(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(4 * MiB)
    put(s3_store, "shared.bin", data)
    mount = await make_fs()
    results: list[bytes] = []

    async def reader() -> None:
        results.append(await mount.read_file("shared.bin", 2 * MiB + 10, 1000))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(reader)
    assert results == [data[2 * MiB + 10 : 2 * MiB + 1010]] * 8
    assert [start for _, start, _ in mount.store.gets].count(2 * MiB) == 1


async def test_cache_survives_remount_and_is_not_fetched_again(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(6 * MiB)
    put(s3_store, "keep.bin", data)
    mount = await make_fs()
    assert await mount.read_file("keep.bin") == data
    ino = (await mount.fs.namespace.resolve("keep.bin")).ino
    gets_before = len(mount.store.gets)
    mount = await mount.remount()
    assert (await mount.fs.namespace.resolve("keep.bin")).ino == ino
    assert await mount.read_file("keep.bin") == data
    assert len(mount.store.gets) == gets_before
    assert mount.fs.status()["counters"]["hit_blocks"] >= 6


async def test_corrupted_cached_block_is_refetched_never_served(
    make_fs: Any, s3_store: Any
) -> None:
    data = os.urandom(3 * MiB)
    put(s3_store, "c.bin", data)
    mount = await make_fs()
    assert await mount.read_file("c.bin") == data
    ino = (await mount.fs.namespace.resolve("c.bin")).ino
    tier = mount.fs.tiers[0]
    cache_file = tier.path / "data" / f"{ino % 256:02x}" / str(ino)
    with open(cache_file, "r+b") as f:
        f.seek(MiB + 100)
        f.write(b"\xff" * 64)
    mount = await mount.remount()
    gets_before = len(mount.store.gets)
    assert await mount.read_file("c.bin") == data
    assert mount.fs.status()["counters"]["verify_failures"] == 1
    assert mount.store.gets[gets_before:] == [("c.bin", MiB, MiB)]


async def test_changed_object_is_detected_on_open_after_revalidate_ttl(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "m.bin", b"old content" * 1000)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0))
    assert await mount.read_file("m.bin") == b"old content" * 1000
    put(s3_store, "m.bin", b"NEW" * 5000)
    inode = await mount.fs.namespace.resolve("m.bin")
    opened = await mount.fs.open(inode.ino, 0)
    assert not opened.keep_cache, "the kernel page cache must be dropped"
    assert await mount.fs.read(opened.fh, 0, 1 << 20) == b"NEW" * 5000
    await mount.fs.release(opened.fh)
    again = await mount.fs.open(inode.ino, 0)
    assert again.keep_cache
    await mount.fs.release(again.fh)


async def test_unchanged_object_keeps_the_kernel_cache(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "k.bin", b"x" * 5000)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0))
    # Cached, so that its opens revalidate (a cold file is checked by its GET).
    assert await mount.read_file("k.bin") == b"x" * 5000
    heads = mount.store.heads
    inode = await mount.fs.namespace.resolve("k.bin")
    for _ in range(2):
        opened = await mount.fs.open(inode.ino, 0)
        assert opened.keep_cache
        await mount.fs.release(opened.fh)
    assert mount.store.heads == heads + 2


async def test_blocks_spill_to_the_second_tier_when_the_first_is_full(
    make_fs: Any, s3_store: Any
) -> None:
    data = os.urandom(12 * MiB)
    put(s3_store, "spill.bin", data)
    mount = await make_fs()  # nvme 8 MiB, hdd 16 MiB
    assert await mount.read_file("spill.bin") == data
    where = await mount.fs.where("spill.bin")
    assert where["tiers"]["nvme"] == 8 * MiB
    assert where["tiers"]["hdd"] == 4 * MiB


async def test_reads_succeed_when_every_tier_is_full(make_fs: Any, s3_store: Any) -> None:
    files = {f"f{i}.bin": os.urandom(3 * MiB) for i in range(4)}
    for key, data in files.items():
        put(s3_store, key, data)
    mount = await make_fs(capacities=(3 * MiB, 4 * MiB), low_watermark=0.5)
    for key, data in files.items():
        assert await mount.read_file(key) == data
    status = mount.fs.status()
    assert status["counters"]["evicted_files"] >= 1
    for tier in status["tiers"]:
        assert tier["used"] <= tier["capacity"]
    # The most recently read file is still cached.
    assert (await mount.fs.where("f3.bin"))["cached_bytes"] == 3 * MiB


async def test_file_larger_than_all_tiers_is_still_readable(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(10 * MiB)
    put(s3_store, "huge.bin", data)
    mount = await make_fs(capacities=(3 * MiB, 4 * MiB), low_watermark=0.5)
    assert await mount.read_file("huge.bin") == data
    assert mount.fs.status()["counters"]["uncached_blocks"] >= 1


async def test_block_size_is_configurable(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(3 * MiB)
    put(s3_store, "bs.bin", data)
    mount = await make_fs(
        fetch=FetchConfig(block_size=256 * 1024, readahead_max=MiB, concurrency=4)
    )
    assert await mount.read_file("bs.bin", MiB, 1000) == data[MiB : MiB + 1000]
    assert mount.store.gets == [("bs.bin", MiB, 256 * 1024)]


async def test_orphaned_cache_files_are_removed_at_mount(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(2 * MiB)
    put(s3_store, "kept.bin", data)
    mount = await make_fs()
    assert await mount.read_file("kept.bin") == data
    orphan = mount.fs.tiers[0].path / "data" / f"{999999 % 256:02x}" / "999999"
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"left behind by a crash")
    mount = await mount.remount()
    with trio.fail_after(10):
        while orphan.exists():
            await trio.sleep(0.02)
    assert await mount.read_file("kept.bin") == data
    assert mount.store.gets.count(("kept.bin", 0, MiB)) == 1, "cached blocks were kept"


async def test_long_sequential_read_reuses_fetch_buffers(make_fs: Any, s3_store: Any) -> None:
    """Fetched blocks arrive in pooled buffers that are given back once the
    reader is past them, so a long read maps a bounded number of buffers,
    and reads answered from those buffers hold the right bytes."""
    data = os.urandom(40 * MiB + 777)
    put(s3_store, "long.bin", data)
    mount = await make_fs(capacities=(64 * MiB, 64 * MiB))
    inode = await mount.fs.namespace.resolve("long.bin")
    opened = await mount.fs.open(inode.ino, 0)
    out = bytearray()
    try:
        while len(out) < len(data):
            chunk = await mount.fs.read(opened.fh, len(out), 256 * 1024)
            assert chunk, "short read"
            out += chunk  # a lent view is used before the next await
    finally:
        await mount.fs.release(opened.fh)
    assert out == data
    window = mount.config.fetch.readahead_max // MiB
    assert mount.fs.fetcher.buffers.created <= 2 * window + 4, (
        f"{mount.fs.fetcher.buffers.created} buffers mapped for 41 blocks: not reused"
    )
