"""Order-aware prefetch over a real bucket (moto), no mount: the window of
the ``Prefetcher`` follows the opens of ``TierFS`` (a reader in order, a
reader that jumps, several readers), stays bounded, cancels fills it passed,
and names missing files of an order."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, put
from tierfs.config import FetchConfig
from tierfs.errors import Busy, InvalidArgument, TierfsError
from tierfs.meta import ROOT_INO
from tierfs.workers import prefetch as prefetch_module
from tierfs.workers.prefetch import OrderKey, Prefetcher, _Follower, _InodeIndex
from tierfs.workers.wiring import prefetcher_for

MiB = 1024 * 1024
FILE_BYTES = 3000


def names(count: int) -> list[str]:
    return [f"ds/{i:03d}.bin" for i in range(count)]


def put_files(s3_store: Any, count: int) -> list[str]:
    paths = names(count)
    for i, path in enumerate(paths):
        put(s3_store, path, bytes([i % 251]) * FILE_BYTES)
    return paths


async def running_prefetcher(nursery: trio.Nursery, mount: CoreMount, **kwargs: Any) -> Prefetcher:
    """A prefetcher started in ``nursery``, with no order yet."""
    prefetcher = prefetcher_for(mount.fs, **kwargs)
    await nursery.start(prefetcher.run)
    return prefetcher


async def start_prefetcher(
    nursery: trio.Nursery, mount: CoreMount, paths: list[str], **kwargs: Any
) -> Prefetcher:
    prefetcher = await running_prefetcher(nursery, mount, **kwargs)
    spool = prefetcher.new_spool()
    for path in paths:
        spool.add(path)
    await prefetcher.load_order(spool)
    return prefetcher


def the_order(prefetcher: Prefetcher) -> _Follower:
    """The prefetcher's one order."""
    (follower,) = prefetcher.followers.values()
    return follower


async def settled(prefetcher: Prefetcher) -> None:
    """Wait until no fill runs and no window has anything left to start."""
    with trio.fail_after(20):
        while True:
            await trio.sleep(0.02)
            if prefetcher.in_flight:
                continue
            if not any(
                f.order.fill_state[p] == 0
                for f in prefetcher.followers.values()
                for p in f.window()
            ):
                return


def resident(mount: CoreMount, paths: list[str]) -> list[int]:
    """Positions of ``paths`` whose bytes are all on a local tier."""
    out = []
    for position, path in enumerate(paths):
        if sum(mount.fs.meta.residency(_ino(mount, path)).values()) >= FILE_BYTES:
            out.append(position)
    return out


def _ino(mount: CoreMount, path: str) -> int:
    parent, _, name = path.rpartition("/")
    dir_ino = mount.fs.meta.lookup(ROOT_INO, parent.encode())
    assert dir_ino is not None
    ino = mount.fs.meta.lookup(dir_ino, name.encode())
    assert ino is not None
    return ino


async def open_file(mount: CoreMount, path: str) -> None:
    """An open and a whole read, as a DataLoader worker does."""
    await mount.read_file(path)


async def test_window_runs_ahead_of_a_reader_in_order(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 12)
    mount = await make_fs()
    prefetcher = await start_prefetcher(nursery, mount, paths, window_files=3)
    # Before any open the reader is at the head: the first 3 files.
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1, 2]
    for position in range(6):
        gets_before = len(mount.store.gets)
        await open_file(mount, paths[position])
        # The file was resident at its open: no GET for it.
        assert len(mount.store.gets) == gets_before
        await settled(prefetcher)
        # The window is the next 3 files after the last one read.
        assert resident(mount, paths) == list(range(position + 4))
    # Files read in this order are the first to leave the first tier; the
    # window's files, not read yet, are not.
    first_tier = mount.fs.space.trackers[0]
    assert [first_tier.queue_of(_ino(mount, paths[p])) for p in range(6)] == ["first"] * 6
    assert all(first_tier.queue_of(_ino(mount, paths[p])) != "first" for p in (6, 7, 8))
    assert list(first_tier.victims(FILE_BYTES)) == [_ino(mount, paths[0])]
    status = the_order(prefetcher).status()
    assert status["hits"] == 6
    assert status["opens"] == 6
    assert status["files_prefetched"] == 9
    assert status["cursor"] == 5


async def test_window_is_bounded_in_bytes(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 10)
    mount = await make_fs()
    prefetcher = await start_prefetcher(
        nursery, mount, paths, window_files=8, window_bytes=2 * FILE_BYTES + 1
    )
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1]


async def test_a_reader_that_jumps_moves_the_window_and_it_stays_bounded(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 40)
    mount = await make_fs()
    prefetcher = await start_prefetcher(nursery, mount, paths, window_files=3)
    await settled(prefetcher)
    await open_file(mount, paths[0])
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1, 2, 3]
    # A jump forward (further than 4 windows): the window follows it.
    await open_file(mount, paths[30])
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1, 2, 3, 30, 31, 32, 33]
    assert the_order(prefetcher).status()["slowest"] == 30
    # Only the new window's files are held for the reader; 1-3 were let go.
    assert sorted(the_order(prefetcher).held) == the_order(prefetcher).window() == [31, 32, 33]
    assert sorted(mount.fs.open_files.files) == sorted(_ino(mount, paths[p]) for p in (31, 32, 33))
    # And back: files behind the new position are prefetched, none past the window.
    await open_file(mount, paths[15])
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1, 2, 3, 15, 16, 17, 18, 30, 31, 32, 33]
    # Prefetched and never opened: at most one window per position the reader held.
    opened = {0, 30, 15}
    assert len(set(resident(mount, paths)) - opened) <= 3 * 3


async def test_several_readers_window_ahead_of_the_slowest_and_furthest(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 20)
    mount = await make_fs()
    prefetcher = await start_prefetcher(nursery, mount, paths, window_files=4, readers_kept=3)
    # Three readers at 0, 1 and 4 (a DataLoader's workers, in order).
    for position in (0, 4, 1):
        await open_file(mount, paths[position])
    await settled(prefetcher)
    # The window: the files between them not opened yet, then ahead of the furthest.
    assert the_order(prefetcher).window() == [2, 3, 5, 6]
    assert resident(mount, paths) == [0, 1, 2, 3, 4, 5, 6]
    # The readers move on (5, 6, 7): 2 and 3 are behind the slowest recent
    # reader now and are not prefetched again; the window runs from 8.
    for position in (5, 6, 7):
        await open_file(mount, paths[position])
    await settled(prefetcher)
    assert the_order(prefetcher).status()["slowest"] == 5
    assert the_order(prefetcher).window() == [8, 9, 10, 11]
    assert resident(mount, paths) == list(range(12))


class GatedGets:
    """Holds GETs of the keys in ``held`` until ``gate`` is set."""

    def __init__(self, mount: CoreMount, held: set[str]) -> None:
        self.inner = mount.store.get_range_into
        self.held = held
        self.started: list[str] = []
        self.gate = threading.Event()
        mount.store.get_range_into = self  # type: ignore[method-assign]

    def __call__(
        self, key: str, start: int, bufs: Sequence[memoryview], etag: str | None = None, **kw: Any
    ) -> int:
        self.started.append(key)
        if any(key.endswith(name) for name in self.held):
            assert self.gate.wait(20)
        return self.inner(key, start, bufs, etag, **kw)


async def test_a_prefetched_file_is_held_so_its_open_is_cheap(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """The reader's open of a file prefetched for it finds the file in use
    (held): no HEAD, even past ``revalidate_ttl`` (its fill's GET checked
    the ETag); the hold goes at the open, and after ``hold_seconds``."""
    paths = put_files(s3_store, 8)
    mount = await make_fs()
    # Every file's ETag was last confirmed long ago: an open of a resident
    # file nobody uses HEADs it.
    for path in paths:
        inode = await mount.fs.namespace.resolve(path)
        inode.validated_at = 1.0
        mount.fs.meta.put_inode(inode)
    prefetcher = await start_prefetcher(nursery, mount, paths, window_files=3)
    await settled(prefetcher)
    assert the_order(prefetcher).status()["held"] == 3
    heads = mount.store.heads
    for position in range(3):
        await open_file(mount, paths[position])
    await settled(prefetcher)
    assert mount.store.heads == heads
    assert the_order(prefetcher).status()["hits"] == 3
    # Opened and closed: not held any more; the next window is.
    assert sorted(the_order(prefetcher).held) == [3, 4, 5]
    assert sorted(mount.fs.open_files.files) == sorted(_ino(mount, paths[p]) for p in (3, 4, 5))
    # The HEAD a hold saved: a resident file nobody holds is revalidated.
    await open_file(mount, paths[0])
    assert mount.store.heads == heads + 1
    # A hold older than ``hold_seconds`` goes (its open revalidates again).
    prefetcher.hold_seconds = 0.1
    with trio.fail_after(5):
        while the_order(prefetcher).held:
            await trio.sleep(0.05)
    assert not mount.fs.open_files.files
    await open_file(mount, paths[3])
    assert mount.store.heads == heads + 2


async def test_a_fill_the_reader_passed_is_cancelled(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 12)
    mount = await make_fs(fetch=FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=4))
    gets = GatedGets(mount, {paths[0]})
    try:
        prefetcher = await start_prefetcher(nursery, mount, paths, window_files=2, tasks=1)
        with trio.fail_after(10):
            while not any(k.endswith(paths[0]) for k in gets.started):
                await trio.sleep(0.01)
        assert list(the_order(prefetcher).in_flight) == [0]
        # The reader starts at 3: 0 is behind it and not reached, its fill goes.
        await open_file(mount, paths[3])
        await settled(prefetcher)
        status = the_order(prefetcher).status()
        assert status["cancelled"] == 1
        assert status["files_prefetched"] == 2  # 4 and 5, not 0
        assert 0 not in the_order(prefetcher).window()
    finally:
        gets.gate.set()


class GetsOneByOne:
    """Holds every GET until ``release`` lets that one go (or ``release_all``)."""

    def __init__(self, mount: CoreMount) -> None:
        self.inner = mount.store.get_range_into
        self.started: list[str] = []
        self._gates: dict[str, threading.Event] = {}
        self._all = threading.Event()
        self._lock = threading.Lock()
        mount.store.get_range_into = self  # type: ignore[method-assign]

    def _gate(self, key: str) -> threading.Event:
        with self._lock:
            return self._gates.setdefault(key, threading.Event())

    def release(self, key: str) -> None:
        self._gate(key).set()

    def release_all(self) -> None:
        self._all.set()
        with self._lock:
            for gate in self._gates.values():
                gate.set()

    def __call__(
        self, key: str, start: int, bufs: Sequence[memoryview], etag: str | None = None, **kw: Any
    ) -> int:
        gate = self._gate(key)
        self.started.append(key)
        if self._all.is_set():
            gate.set()
        assert gate.wait(20)
        return self.inner(key, start, bufs, etag, **kw)


async def test_fills_keep_more_gets_in_flight_than_preload_and_yield_to_demand(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Prefetch fills are ahead of demand: they may take every free fetch
    slot (preload takes at most half), and a demand read that waits for a
    slot still goes before the fills queued behind it."""
    paths = put_files(s3_store, 8)
    put(s3_store, "other.bin", b"o" * FILE_BYTES)
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=4)
    mount = await make_fs(fetch=fetch)
    assert prefetcher_for(mount.fs).tasks == 4  # the default: every slot
    assert mount.fs.fetcher.slots.background_max == 2  # preload's share
    gets = GetsOneByOne(mount)
    try:
        prefetcher = await start_prefetcher(nursery, mount, paths, window_files=6, tasks=6)
        # All 4 fetch slots hold prefetch GETs: twice preload's share.
        with trio.fail_after(10):
            while len(gets.started) < 4:
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        assert len(gets.started) == 4
        assert len(the_order(prefetcher).in_flight) == 6  # two more fills wait for a slot
        read_done = trio.Event()

        async def read_other() -> None:
            assert await mount.read_file("other.bin") == b"o" * FILE_BYTES
            read_done.set()

        nursery.start_soon(read_other)
        with trio.fail_after(10):
            while mount.fs.fetcher.slots.demand_waiting != 1:
                await trio.sleep(0.01)
        # One slot frees: it goes to the demand read, not to the two
        # prefetch fills that were waiting before it.
        gets.release(gets.started[0])
        with trio.fail_after(10):
            while len(gets.started) < 5:
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        assert len(gets.started) == 5
        assert gets.started[4].endswith("other.bin"), gets.started
        gets.release_all()
        with trio.fail_after(20):
            await read_done.wait()
        await settled(prefetcher)
        assert resident(mount, paths) == list(range(6))
    finally:
        gets.release_all()


async def test_missing_files_are_named_and_an_empty_order_stops(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 6)
    mount = await make_fs()
    prefetcher = await running_prefetcher(nursery, mount, window_files=2)
    spool = prefetcher.new_spool()
    for path in [paths[0], "ds/nope.bin", paths[1], "ds", paths[2]]:
        spool.add(path)
    summary = await prefetcher.load_order(spool)
    assert summary["order_files"] == 3
    assert summary["missing"] == 2
    assert summary["missing_named"][0].startswith("ds/nope.bin: No such file")
    assert [line.split(":")[0] for line in summary["missing_named"]] == ["ds/nope.bin", "ds"]
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1]
    # An empty order of the same session ends it: prefetching stops.
    summary = await prefetcher.load_order(prefetcher.new_spool())
    assert summary["order_files"] == 0
    assert prefetcher.followers == {}
    await open_file(mount, paths[3])
    await trio.sleep(0.2)
    assert resident(mount, paths) == [0, 1, 3]
    assert prefetcher.status()["opens"] == 0


def test_inode_index_holds_a_large_order_in_arrays() -> None:
    count = 200_000
    index = _InodeIndex(count)
    for position in range(count):
        index.add(7 * position + 3, position)
    index.add(3, 99)  # listed twice: the first position stays
    assert index.get(3) == 0
    assert index.get(7 * 123_456 + 3) == 123_456
    assert index.get(5) is None
    # 16 bytes per slot, at most half full: no Python object per entry.
    assert index._keys.itemsize * len(index._keys) <= 16 * 2 * count


async def load(
    prefetcher: Prefetcher, paths: list[str], key: OrderKey | None = None, **kwargs: Any
) -> dict[str, Any]:
    spool = prefetcher.new_spool()
    for path in paths:
        spool.add(path)
    return await prefetcher.load_order(spool, key=key, **kwargs)


async def test_two_sessions_orders_run_side_by_side_and_both_hit(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Two ranks of one job, each with its own slice of the data set: both
    orders are followed at once, each reader finds its files resident, and
    a new order of one session replaces only that session's."""
    paths = put_files(s3_store, 24)
    mount = await make_fs()
    prefetcher = await running_prefetcher(nursery, mount, window_files=3)
    rank0, rank1 = OrderKey(1000, "job-7", 0), OrderKey(1000, "job-7", 1)
    first = await load(prefetcher, paths[0::2], rank0)
    second = await load(prefetcher, paths[1::2], rank1)
    assert first["id"] != second["id"]
    await settled(prefetcher)
    assert resident(mount, paths) == [0, 1, 2, 3, 4, 5]
    gets = len(mount.store.gets)
    for step in range(4):  # the two readers take turns
        await open_file(mount, paths[2 * step])
        await open_file(mount, paths[2 * step + 1])
        await settled(prefetcher)
    orders = {(o["job"], o["rank"]): o for o in prefetcher.status()["orders"]}
    assert sorted(orders) == [("job-7", 0), ("job-7", 1)]
    for order in orders.values():
        assert (order["opens"], order["hits"], order["cursor"]) == (4, 4, 3)
    # Every open found its file resident: the GETs since are the windows' fills.
    assert len(mount.store.gets) - gets == 8
    assert resident(mount, paths) == list(range(14))
    # Rank 1's new order replaces rank 1's only; rank 0's goes on.
    await load(prefetcher, paths[23:24], rank1)
    assert {o["rank"]: o["order_files"] for o in prefetcher.status()["orders"]} == {0: 12, 1: 1}
    # Ending one session leaves the other.
    assert prefetcher.end(rank1)
    assert [o["rank"] for o in prefetcher.status()["orders"]] == [0]


async def test_sessions_share_the_fill_tasks_fairly(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Each free task goes to the order with the fewest fills running: two
    orders that both want more run half of the tasks each; one alone may
    take them all."""
    paths = put_files(s3_store, 24)
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=8)
    mount = await make_fs(fetch=fetch)
    gets = GetsOneByOne(mount)
    try:
        prefetcher = prefetcher_for(mount.fs, window_files=8, tasks=4)
        await nursery.start(prefetcher.run)
        alone = OrderKey(1000, "a")
        await load(prefetcher, paths[:12], alone)
        with trio.fail_after(10):
            while len(gets.started) < 4:
                await trio.sleep(0.01)
        assert len(prefetcher.followers[alone].in_flight) == 4
        # A second order comes: each fill that ends frees a task for the
        # order with fewer running, until both run 2.
        other = OrderKey(1001, "b")
        await load(prefetcher, paths[12:], other)
        for _ in range(2):
            gets.release(gets.started[len(gets.started) - 4])
            await trio.sleep(0.3)
        running = {key.job: len(f.in_flight) for key, f in prefetcher.followers.items()}
        assert running == {"a": 2, "b": 2}, running
        gets.release_all()
        await settled(prefetcher)
        assert resident(mount, paths) == [*range(8), *range(12, 20)]
    finally:
        gets.release_all()


async def test_the_windows_share_the_first_tier(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """The windows together hold at most half the first tier below its high
    watermark, in equal parts: a second order halves the first's room."""
    paths = put_files(s3_store, 40)
    # First tier: 40,000 bytes, high watermark 0.9: room for 18,000 bytes
    # of windows, 6 files of 3,000.
    mount = await make_fs(capacities=(40_000, 16 * MiB))
    prefetcher = await running_prefetcher(nursery, mount, window_files=20)
    first = OrderKey(1000, "first")
    await load(prefetcher, paths[:20], first)
    await settled(prefetcher)
    assert the_order(prefetcher).window() == list(range(6))
    await load(prefetcher, paths[20:], OrderKey(1000, "second"))
    await settled(prefetcher)
    for follower in prefetcher.followers.values():
        assert len(follower.window()) == 3
        assert follower.status()["window_bytes"] == 9000
    # The first order's window shrank: files 3-5 it had filled were let go.
    assert sorted(prefetcher.followers[first].held) == [0, 1, 2]


async def test_fills_and_room_are_shared_per_user_first(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """A user with two orders gets what a user with one gets: the fill
    tasks and the first tier's room go to users in equal parts, then to
    each user's orders."""
    paths = put_files(s3_store, 36)
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=8)
    # Room for 180,000 bytes of windows: 90,000 per user, more than the
    # 8 files (24,000 bytes) a window asks for, so each order wants more.
    mount = await make_fs(fetch=fetch, capacities=(400_000, 16 * MiB))
    gets = GetsOneByOne(mount)
    try:
        prefetcher = prefetcher_for(mount.fs, window_files=8, tasks=4)
        # The three orders are in before the worker schedules its first fill.
        await load(prefetcher, paths[:12], OrderKey(1000, "a"))
        await load(prefetcher, paths[12:24], OrderKey(1000, "b"))
        await load(prefetcher, paths[24:], OrderKey(1001, "c"))
        await nursery.start(prefetcher.run)
        room = {key.job: f.room_bytes for key, f in prefetcher.followers.items()}
        assert room == {"a": 45_000, "b": 45_000, "c": 90_000}, room
        with trio.fail_after(10):
            while len(gets.started) < 4:
                await trio.sleep(0.01)
        running = {key.job: len(f.in_flight) for key, f in prefetcher.followers.items()}
        assert running == {"a": 1, "b": 1, "c": 2}, running
    finally:
        gets.release_all()


async def test_clear_ends_a_jobs_orders_and_a_stale_end_ends_nothing(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    paths = put_files(s3_store, 6)
    mount = await make_fs()
    prefetcher = await running_prefetcher(nursery, mount, window_files=2)
    key = OrderKey(1000, "slurm-5", 0, "pid-1-1")
    old = await load(prefetcher, paths[:3], key, bound=True)
    new = await load(prefetcher, paths[3:], key, bound=True)
    await settled(prefetcher)  # files 3 and 4 prefetched
    # The connection of the replaced order closes: the newer order stays.
    assert not prefetcher.end(key, old["id"])
    assert [o["id"] for o in prefetcher.status()["orders"]] == [new["id"]]
    other_rank = await load(prefetcher, paths[:1], OrderKey(1000, "slurm-5", 1))
    others = await load(prefetcher, paths[:1], OrderKey(1001, "slurm-5", 0))
    mine = await load(prefetcher, paths[:1], OrderKey(1000))
    # uid 1000 clears its job: both ranks, not uid 1001's, not its unnamed order.
    ended = prefetcher.clear(uid=1000, job="slurm-5")
    assert sorted(ended) == sorted([new["id"], other_rank["id"]])
    assert sorted(o["id"] for o in prefetcher.status()["orders"]) == [others["id"], mine["id"]]
    # Root (uid None) clears the job of every user.
    assert prefetcher.clear(uid=None, job="slurm-5") == [others["id"]]
    # The counters of ended orders stay in the totals.
    assert prefetcher.status()["files_prefetched"] >= 2
    assert prefetcher.status()["order_count"] == 1


async def test_orders_are_bounded_per_user(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: Any
) -> None:
    paths = put_files(s3_store, 4)
    mount = await make_fs()
    prefetcher = await running_prefetcher(nursery, mount, window_files=2)
    monkeypatch.setattr(prefetch_module, "ORDERS_PER_USER", 2)
    monkeypatch.setattr(prefetch_module, "MAX_ORDER_FILES", 3)
    monkeypatch.setattr(prefetch_module, "USER_ORDER_FILES", 5)
    await load(prefetcher, paths[:2], OrderKey(1000, "a"))
    await load(prefetcher, paths[:2], OrderKey(1000, "b"))
    with pytest.raises(Busy, match="uid 1000 has 2 prefetch orders"):
        await load(prefetcher, paths[:1], OrderKey(1000, "c"))
    # Replacing one of them is not a third; another user is not counted.
    await load(prefetcher, paths[:3], OrderKey(1000, "b"))
    await load(prefetcher, paths[:3], OrderKey(1001, "a"))
    with pytest.raises(InvalidArgument, match="at most 3 files; this one has 4"):
        await load(prefetcher, paths, OrderKey(1001, "a"))
    with pytest.raises(TierfsError, match="would list 6 files"):
        await load(prefetcher, paths[:3], OrderKey(1001, "b"))
    # The refused orders changed nothing.
    assert {(o["owner"], o["job"]): o["order_files"] for o in prefetcher.status()["orders"]} == {
        (1000, "a"): 2,
        (1000, "b"): 3,
        (1001, "a"): 3,
    }
    with pytest.raises(InvalidArgument, match="job name is at most"):
        OrderKey(1000, "x" * 200)
