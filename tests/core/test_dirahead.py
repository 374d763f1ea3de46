"""Directory readahead over a real bucket (moto), no mount: files opened in
listing order are fetched ahead, a wrong guess stops it, and shuffled opens
fetch nothing extra.  Counts of GETs, not times."""

from __future__ import annotations

from typing import Any

import trio

from tests.core.conftest import CoreMount, put
from tierfs.workers.dirahead import FIRST_TIER_SHARE, STATUS_SECTION, DirectoryReadahead
from tierfs.workers.wiring import dir_readahead_for

FILE_BYTES = 2000
MiB = 1024 * 1024


def put_files(s3_store: Any, count: int, directory: str = "ds") -> list[str]:
    paths = [f"{directory}/{i:03d}.bin" for i in range(count)]
    for i, path in enumerate(paths):
        put(s3_store, path, bytes([i % 251]) * FILE_BYTES)
    return paths


async def start(nursery: trio.Nursery, mount: CoreMount, **kwargs: Any) -> DirectoryReadahead:
    worker = dir_readahead_for(mount.fs, **kwargs)
    await nursery.start(worker.run)
    return worker


async def settled(mount: CoreMount, worker: DirectoryReadahead) -> None:
    """Wait until nothing is queued and the GET count stopped moving."""
    with trio.fail_after(20):
        last = -1
        while True:
            await trio.sleep(0.05)
            if worker.idle() and len(mount.store.gets) == last:
                return
            last = len(mount.store.gets)


def keys_fetched(mount: CoreMount) -> set[str]:
    return {key for key, _, _ in mount.store.gets}


async def test_files_opened_in_listing_order_are_fetched_ahead(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 40)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=8)
    await mount.fs.namespace.resolve("ds")
    # The first two opens in order start the stream: until then nothing ahead.
    for path in paths[:2]:
        assert await mount.read_file(path) == bytes([paths.index(path)]) * FILE_BYTES
    await settled(mount, worker)
    ahead = keys_fetched(mount) - set(paths[:2])
    assert ahead, "the second in-order open fetched nothing ahead"
    assert ahead <= set(paths[2:10]), ahead
    # A reader that goes on in order finds its files resident: no GET at
    # its opens, and the window never runs further than 8 files ahead.
    for i in range(2, 30):
        await settled(mount, worker)
        gets_before = len(mount.store.gets)
        assert await mount.read_file(paths[i]) == bytes([i]) * FILE_BYTES
        assert len(mount.store.gets) == gets_before, f"open of {paths[i]} waited for a GET"
        assert max(keys_fetched(mount)) <= paths[i + 8]
    # Each file was fetched once, whoever fetched it.
    assert len(mount.store.gets) == len(keys_fetched(mount))
    status = worker.status()
    assert status["hits"] == 28
    assert status["wrong_guesses"] == 0
    assert mount.fs.status()[STATUS_SECTION]["hits"] == 28


async def test_a_wrong_guess_stops_the_readahead(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 60)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=8)
    await mount.fs.namespace.resolve("ds")
    for path in paths[:4]:
        await mount.read_file(path)
    await settled(mount, worker)
    assert paths[6] in keys_fetched(mount)
    # The reader jumps far away: that open is one GET, and nothing after it
    # is fetched until two opens in order again.
    gets_before = len(mount.store.gets)
    await mount.read_file(paths[40])
    await settled(mount, worker)
    assert len(mount.store.gets) == gets_before + 1
    assert worker.status()["wrong_guesses"] == 1
    assert not {p for p in paths[41:] if p in keys_fetched(mount)}
    await mount.read_file(paths[41])
    await settled(mount, worker)
    assert paths[42] in keys_fetched(mount)


async def test_shuffled_opens_fetch_nothing_extra(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 40)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=8)
    await mount.fs.namespace.resolve("ds")
    # No open follows the previous one within the slack (8 entries): every
    # open is one GET and nothing else.
    order = sorted(range(len(paths)), key=lambda i: (i % 10, i))
    shuffled = [paths[i] for i in order]
    for path in shuffled:
        await mount.read_file(path)
    await settled(mount, worker)
    assert len(mount.store.gets) == len(paths)
    assert worker.status()["files_fetched"] == 0


async def test_readers_taking_turns_make_one_stream(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Four readers over a sequential sampler open neighbouring files out of
    step: one stream, not a wrong guess at every open."""
    paths = put_files(s3_store, 48)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=16)
    await mount.fs.namespace.resolve("ds")
    # Opens arrive in batches of 4 whose order within the batch is mixed.
    for base in range(0, 40, 4):
        for i in (base + 1, base, base + 3, base + 2):
            await mount.read_file(paths[i])
        await settled(mount, worker)
    assert worker.status()["wrong_guesses"] == 0
    # From the third open on (file 3), the stream runs ahead: every file
    # after it was fetched ahead of its open.
    assert worker.status()["hits"] == 36
    # Every file was fetched once.
    assert len(mount.store.gets) == len(keys_fetched(mount))


async def test_it_stands_down_for_an_order_and_when_off(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """While ``defer()`` says so (an order is followed), and with
    ``max_files`` 0 (``[fetch] dir_readahead = 0``), reads in listing order
    fetch nothing ahead."""
    paths = put_files(s3_store, 12)
    mount = await make_fs()
    following_an_order = True
    deferring = await start(nursery, mount, max_files=8, defer=lambda: following_an_order)
    off = await start(nursery, mount, max_files=0)
    await mount.fs.namespace.resolve("ds")
    for path in paths[:4]:
        await mount.read_file(path)
    await settled(mount, deferring)
    assert len(mount.store.gets) == 4
    # The order is gone: the next reads in order start a stream again.
    following_an_order = False
    for path in paths[4:6]:
        await mount.read_file(path)
    await settled(mount, deferring)
    assert paths[6] in keys_fetched(mount)
    assert off.status()["files_fetched"] == 0


class _Counted:
    """Calls of one MetaDB method, counted (the method still runs)."""

    def __init__(self, monkeypatch: Any, meta: Any, name: str) -> None:
        self.calls = 0
        real = getattr(meta, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(meta, name, counted)


async def test_a_shuffled_reader_costs_no_directory_read(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: Any
) -> None:
    """The observer runs at every open: a shuffled (warm) epoch must not read
    the directory to find that the guess was wrong.  Only an open further
    than ``slack`` cookies past the furthest one reads the readdir order,
    and then ``slack`` keys of it, never ``read_dir``."""
    paths = put_files(s3_store, 60)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=8)
    await mount.fs.namespace.resolve("ds")
    # Far apart both ways (never within 8 entries after the previous open):
    # 0, 30, 1, 31, 2, 32, ... (each open far past, or before, the last).
    order = [i for pair in zip(range(30), range(30, 60), strict=True) for i in pair]
    read_dir = _Counted(monkeypatch, mount.fs.meta, "read_dir_records")
    nth = _Counted(monkeypatch, mount.fs.meta, "nth_cookie_after")
    for i in order:
        assert await mount.read_file(paths[i]) == bytes([i]) * FILE_BYTES
    await settled(mount, worker)
    assert read_dir.calls == 0
    # The opens of 30, 31, ... go past high + slack: those check the order;
    # the opens of 1, 2, ... fall before the stream: arithmetic alone.
    assert nth.calls == 30
    assert len(mount.store.gets) == len(paths)
    assert worker.status()["files_fetched"] == 0


async def test_resident_files_are_not_queued(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: Any
) -> None:
    """A warm epoch in listing order: every file is resident already, so
    the stream queues no fill (the fills would find nothing to fetch)."""
    paths = put_files(s3_store, 30)
    mount = await make_fs()
    await mount.fs.namespace.resolve("ds")
    for path in paths:
        await mount.read_file(path)
    gets_before = len(mount.store.gets)
    worker = await start(nursery, mount, max_files=8)
    fills = 0
    real_fill = mount.fs.movement.fill

    async def counted_fill(*args: Any, **kwargs: Any) -> int:
        nonlocal fills
        fills += 1
        return await real_fill(*args, **kwargs)

    monkeypatch.setattr(mount.fs.movement, "fill", counted_fill)
    read_dir = _Counted(monkeypatch, mount.fs.meta, "read_dir_records")
    for path in paths:
        await mount.read_file(path)
    await settled(mount, worker)
    assert fills == 0
    assert len(mount.store.gets) == gets_before
    # The window was read as the stream moved, about one entry per open.
    assert 0 < read_dir.calls <= len(paths)
    # Evicted, the files are fetched ahead again.
    for path in paths[10:]:
        inode = await mount.fs.namespace.resolve(path)
        mount.fs.movement.evict(inode.ino)
    for path in paths[:14]:
        await mount.read_file(path)
    await settled(mount, worker)
    assert fills > 0
    assert paths[15] in keys_fetched(mount) - set(paths[:10])


async def test_a_directory_with_gaps_continues_the_stream(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Deletions leave gaps in the cookies wider than ``slack``: the next
    entry in listing order is still within ``slack`` entries, so reading
    the survivors in order is one stream that runs ahead."""
    paths = put_files(s3_store, 160)
    mount = await make_fs()
    ds = await mount.fs.namespace.resolve("ds")
    kept = paths[::12]  # 11 deleted between two kept ones: gaps of 12 cookies
    for path in paths:
        if path not in kept:
            await mount.fs.unlink(ds.ino, path.rpartition("/")[2].encode())
    worker = await start(nursery, mount, max_files=4, slack=8)
    for path in kept[:8]:
        await settled(mount, worker)
        await mount.read_file(path)
    # The opens in order continued the stream: from the third one on
    # (kept[2]), each found its file fetched ahead, and the window of 4
    # files ran ahead of the last open (kept[7]) to kept[11].
    with trio.fail_after(20):
        while not set(kept[:12]) <= keys_fetched(mount):
            await trio.sleep(0.05)
    await settled(mount, worker)
    assert worker.status()["wrong_guesses"] == 0
    assert worker.status()["hits"] == 6
    assert keys_fetched(mount) == set(kept[:12])
    assert len(mount.store.gets) == 12  # each once


async def test_a_stream_keeps_at_most_a_sixteenth_of_the_first_tier_ahead(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """An 8 MiB first tier: a stream keeps at most 512 KiB ahead of its
    reader, so of files of 192 KiB two, not the eight of ``max_files``;
    the reader in order still finds them fetched ahead."""
    file_bytes = 192 * 1024
    paths = [f"big/{i:02d}.bin" for i in range(16)]
    for i, path in enumerate(paths):
        put(s3_store, path, bytes([i]) * file_bytes)
    mount = await make_fs(capacities=(8 * MiB, 16 * MiB))
    worker = await start(nursery, mount, max_files=8)
    assert worker.max_bytes == 8 * MiB // FIRST_TIER_SHARE
    await mount.fs.namespace.resolve("big")
    hits = 0
    for i, path in enumerate(paths):
        await settled(mount, worker)
        gets_before = len(mount.store.gets)
        assert await mount.read_file(path) == bytes([i]) * file_bytes
        hits += len(mount.store.gets) == gets_before
        await settled(mount, worker)
        # Fetched so far: what was opened, and at most two files past it.
        assert max(keys_fetched(mount)) <= paths[min(i + 2, len(paths) - 1)], i
    assert worker.status()["files_fetched"] >= 10
    assert hits >= 10, "the reader in order did not find its files fetched ahead"
    assert len(mount.store.gets) == len(paths)  # each once


async def test_a_file_bigger_than_the_share_is_not_fetched_ahead(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """A 4 MiB first tier allows 256 KiB ahead: files of 300 KiB (one
    block) are never fetched ahead; smaller ones after them still are."""
    paths = [f"mixed/{i:02d}.bin" for i in range(12)]
    sizes = [300 * 1024] * 6 + [FILE_BYTES] * 6
    for i, (path, size) in enumerate(zip(paths, sizes, strict=True)):
        put(s3_store, path, bytes([i]) * size)
    mount = await make_fs(capacities=(4 * MiB, 16 * MiB))
    worker = await start(nursery, mount, max_files=8)
    await mount.fs.namespace.resolve("mixed")
    for i, path in enumerate(paths[:6]):
        assert await mount.read_file(path) == bytes([i]) * sizes[i]
        await settled(mount, worker)
        assert not keys_fetched(mount) & set(paths[i + 1 : 6]), f"a big file fetched ahead at {i}"
    # Once the reader is past the big ones, the small ones are fetched ahead.
    assert keys_fetched(mount) & set(paths[6:])
    assert worker.status()["files_fetched"] > 0


async def test_an_opened_files_cookie_is_read_once_and_again_after_a_rename(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: Any
) -> None:
    """A warm shuffled epoch after the first reads no dentry cookie from
    LMDB (they are kept in memory); a renamed file's cookie is read again,
    and its new place in the listing order is the one the stream sees."""
    paths = put_files(s3_store, 20)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=4)
    ds = await mount.fs.namespace.resolve("ds")
    order = [(7 * i) % 20 for i in range(20)]  # shuffled, every file once
    cookies = _Counted(monkeypatch, mount.fs.meta, "dentry_cookie")
    for i in order:
        await mount.read_file(paths[i])
    assert cookies.calls == 20
    for i in order:
        await mount.read_file(paths[i])
    assert cookies.calls == 20, "a second epoch read cookies from LMDB"
    # Renamed to the end of the listing order: its cookie is read again,
    # and the stream sees the open at its new place (past every other).
    await mount.fs.rename(ds.ino, b"000.bin", ds.ino, b"zzz.bin", 0)
    await mount.read_file("ds/zzz.bin")
    assert cookies.calls == 21
    new_cookie = mount.fs.meta.dentry_cookie(ds.ino, b"zzz.bin")
    assert new_cookie is not None and new_cookie > 20
    assert worker._streams[ds.ino].recent[-1] == new_cookie


async def test_files_fetched_ahead_and_read_once_count_one_use(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Scan resistance: the fill ahead of an open is not a use, so a file read once
    is a file read once for the eviction ranking, and a pass over a
    directory does not look like reuse."""
    paths = put_files(s3_store, 30)
    mount = await make_fs()
    worker = await start(nursery, mount, max_files=8)
    await mount.fs.namespace.resolve("ds")
    for path in paths:
        await mount.read_file(path)
        await settled(mount, worker)
    assert worker.status()["hits"] >= 20  # most were fetched ahead of their open
    tracker = mount.fs.space.trackers[0]
    inos = [(await mount.fs.namespace.resolve(path)).ino for path in paths]
    assert all(tracker.queue_of(ino) == "small" for ino in inos)
    # Read once each: no file is counted as re-accessed.  One more open of
    # the last one makes it the only one.
    assert [tracker.freq_of(ino) for ino in inos] == [0] * 30
    await mount.read_file(paths[-1])
    assert [tracker.freq_of(ino) for ino in inos] == [0] * 29 + [1]
