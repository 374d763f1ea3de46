"""Directory readahead over a real bucket (moto), no mount: files opened in
listing order are fetched ahead, a wrong guess stops it, and shuffled opens
fetch nothing extra.  Counts of GETs, not times."""

from __future__ import annotations

from typing import Any

import trio

from tests.core.conftest import CoreMount, put
from tierfs.workers.dirahead import STATUS_SECTION, DirectoryReadahead

FILE_BYTES = 2000


def put_files(s3_store: Any, count: int, directory: str = "ds") -> list[str]:
    paths = [f"{directory}/{i:03d}.bin" for i in range(count)]
    for i, path in enumerate(paths):
        put(s3_store, path, bytes([i % 251]) * FILE_BYTES)
    return paths


async def start(nursery: trio.Nursery, mount: CoreMount, **kwargs: Any) -> DirectoryReadahead:
    worker = DirectoryReadahead(mount.fs, **kwargs)
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
