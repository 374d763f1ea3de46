"""Preload over a real bucket (moto), no mount: the lazy subtree walk
(``Namespace.walk``), the ``Preloader`` worker (counters, rerun, missing
paths, failures, the up-front warning) and the priority of demand reads
over preload fetches in the block cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, MiB, put
from tierfs.config import FetchConfig
from tierfs.core.names.listings import LIST_AHEAD
from tierfs.core.names.namespace import WALK_PAGE
from tierfs.core.read.fetcher import BACKGROUND_TRICKLE_BYTES
from tierfs.errors import InvalidArgument, StoreAccessDenied
from tierfs.workers.pathlists import normalize_path
from tierfs.workers.preload import Preloader, PreloadJob
from tierfs.workers.wiring import preloader_for

TREE = {
    "data/a/x.bin": 3 * MiB + 5,
    "data/a/y.bin": 1000,
    "data/b/deep/z.bin": 2 * MiB,
    "data/c.bin": 10,
    "other/skip.bin": 100,
}


def blob(size: int, seed: int) -> bytes:
    return bytes((i * seed) % 251 for i in range(size))


def put_tree(s3_store: Any, tree: dict[str, int]) -> dict[str, bytes]:
    out = {}
    for seed, (key, size) in enumerate(sorted(tree.items()), start=3):
        out[key] = blob(size, seed)
        put(s3_store, key, out[key])
    return out


async def run_preload(
    nursery: trio.Nursery,
    mount: CoreMount,
    paths: list[str],
    tier: str | None = None,
    *,
    bandwidth: int = 0,
    preloader: Preloader | None = None,
) -> PreloadJob:
    """Start a preloader (``preloader``: one the caller made and watches)
    in ``nursery`` and preload ``paths`` to the end."""
    preloader = preloader or preloader_for(mount.fs)
    await nursery.start(preloader.run)
    spool = preloader.new_spool()
    for path in paths:
        spool.add(path)
    job = preloader.start(spool, paths, tier, bandwidth=bandwidth)
    with trio.fail_after(30):
        await job.done.wait()
    return job


# --- the walk ---------------------------------------------------------------------------


async def test_walk_yields_every_file_depth_first(make_fs: Any, s3_store: Any) -> None:
    put_tree(s3_store, TREE)
    mount = await make_fs()
    seen = [(path, inode.size) async for inode, path in mount.fs.namespace.walk("data")]
    assert sorted(seen) == sorted((k, v) for k, v in TREE.items() if k.startswith("data/"))
    # Depth first: the files of one subtree come together.
    order = [p for p, _ in seen]
    a_files = [i for i, p in enumerate(order) if p.startswith("data/a/")]
    assert a_files == list(range(a_files[0], a_files[0] + 2))
    # A file is its own walk; the root walks everything.
    assert [p async for _i, p in mount.fs.namespace.walk("data/c.bin")] == ["data/c.bin"]
    assert len([p async for _i, p in mount.fs.namespace.walk("")]) == len(TREE)


async def test_walk_lists_directories_lazily(make_fs: Any, s3_store: Any) -> None:
    """The walk lists a directory when it gets there, plus at most
    ``LIST_AHEAD`` never-listed ones ahead of itself: never the whole tree
    up front."""
    subdirs = [f"d{i:02d}" for i in range(LIST_AHEAD + 4)]
    put_tree(s3_store, {f"t/{d}/f": 1 for d in subdirs})
    mount = await make_fs()
    ns = mount.fs.namespace
    walk = ns.walk("t")
    first_inode, first_path = await walk.__anext__()
    assert first_inode.is_file and first_path == "t/d00/f"
    t = await ns.resolve("t")
    touched = []
    for name in subdirs:
        ino = mount.fs.meta.lookup(t.ino, name.encode())
        assert ino is not None
        inode = mount.fs.meta.get_inode(ino)
        assert inode is not None
        if inode.listed_at > 0 or ino in ns.listings._listing:
            touched.append(name)
    # d00 (walked) and the LIST_AHEAD after it; the rest untouched yet.
    assert touched == subdirs[: 1 + LIST_AHEAD]
    rest = [p async for _i, p in walk]
    assert [first_path, *rest] == [f"t/{d}/f" for d in subdirs]
    assert ns.listings._listing_ahead == 0


class SlowSubdirListings:
    """Forwards to a store; each listing of a prefix under ``under`` takes
    ``delay`` seconds (in its thread) and counts how many ran at once.  A
    prefix in ``fail`` raises ``StoreAccessDenied`` instead."""

    def __init__(self, inner: Any, under: str, delay: float, fail: Sequence[str] = ()) -> None:
        self.inner = inner
        self.under = under
        self.delay = delay
        self.fail = set(fail)
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def list_pages(self, prefix: str, page_size: int = 1000) -> Any:
        # A generator, as the real one: its first page (and the delay) comes
        # in the namespace's store thread.
        if prefix in self.fail:
            raise StoreAccessDenied(f"listing {prefix!r} refused")
        if prefix.startswith(self.under) and prefix != self.under:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                time.sleep(self.delay)
            finally:
                with self.lock:
                    self.running -= 1
        yield from self.inner.list_pages(prefix, page_size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_walk_lists_the_next_subdirectories_while_it_walks_one(
    make_fs: Any, s3_store: Any
) -> None:
    subdirs = [f"d{i}" for i in range(6)]
    put_tree(s3_store, {f"t/{d}/f": 1 for d in subdirs})
    mount = await make_fs()
    slow = SlowSubdirListings(mount.fs.namespace.listings.store, "t/", 0.2)
    mount.fs.namespace.listings.store = slow
    paths = [p async for _i, p in mount.fs.namespace.walk("t")]
    assert paths == [f"t/{d}/f" for d in subdirs]
    # One at a time (the walk's own) took six delays; ahead, they overlap.
    assert slow.most >= 2


async def test_a_failed_listing_ahead_gives_the_walker_the_buckets_error(
    make_fs: Any, s3_store: Any
) -> None:
    put_tree(s3_store, {"t/a/f": 1, "t/b/f": 1, "t/c/f": 1})
    mount = await make_fs()
    ns = mount.fs.namespace
    ns.listings.store = SlowSubdirListings(ns.listings.store, "t/", 0.1, fail=["t/b/"])
    seen = []
    with pytest.raises(StoreAccessDenied, match="t/b/"):
        async for _inode, path in ns.walk("t"):
            seen.append(path)
    assert seen == ["t/a/f"]
    # The listing of t/c/ started ahead ends on its own; nothing is left behind.
    with trio.fail_after(5):
        while ns.listings._listing_ahead:
            await trio.sleep(0.01)
    assert not ns.listings._listing


async def test_walk_pages_through_large_directories(make_fs: Any, s3_store: Any) -> None:
    count = WALK_PAGE + 37
    for i in range(count):
        put(s3_store, f"big/f{i:05d}", b"x")
    put(s3_store, "big/zsub/inner", b"y")
    mount = await make_fs()
    paths = [p async for _i, p in mount.fs.namespace.walk("big")]
    assert len(paths) == count + 1
    assert len(set(paths)) == len(paths)


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a/b", "a/b"),
        ("./a//b/", "a/b"),
        ("/mnt/t/a/b", "a/b"),
        ("/mnt/t", ""),
        # A newline is a byte of a name like any other (the spool keeps records whole).
        ("a\nb/c\r", "a\nb/c\r"),
    ],
)
def test_normalize_accepts(raw: str, expected: str) -> None:
    assert normalize_path(raw, "/mnt/t") == expected


@pytest.mark.parametrize("raw", ["a/../b", "..", "a\x00b", "/etc/passwd", "/mnt/tx/a", "a\n/../b"])
def test_normalize_rejects(raw: str) -> None:
    with pytest.raises(InvalidArgument):
        normalize_path(raw, "/mnt/t")


# --- the preloader ------------------------------------------------------------------------


async def test_preload_tree_then_rerun_fetches_nothing(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    data = put_tree(s3_store, TREE)
    mount = await make_fs()
    job = await run_preload(nursery, mount, ["data"])
    want = {k: v for k, v in TREE.items() if k.startswith("data/")}
    assert job.state == "done"
    assert job.failures == []
    assert (job.files_total, job.files_done, job.files_failed) == (len(want), len(want), 0)
    assert job.bytes_total == sum(want.values())
    assert job.bytes_fetched == job.bytes_total
    assert job.bytes_resident == 0
    for key in want:
        inode = await mount.fs.namespace.resolve(key)
        res = mount.fs.movement.check(inode.ino)
        assert len(res.blocks) == res.blocks_total
    gets = len(mount.store.gets)
    assert gets > 0
    # The bytes on the tiers are the bucket's.
    assert await mount.read_file("data/a/x.bin") == data["data/a/x.bin"]
    assert len(mount.store.gets) == gets

    again = await run_preload(nursery, mount, ["data"])
    assert again.state == "done"
    assert len(mount.store.gets) == gets  # not one GET
    assert again.bytes_fetched == 0
    assert again.files_resident == again.files_total == len(want)
    assert again.bytes_resident == again.bytes_total


class ListingWaitsForAGet:
    """Forwards to a store; the listing of ``gated`` waits (at most
    ``timeout`` seconds, in its thread) until ``counting`` saw a GET of
    ``key``, and records whether that GET is what let it go on."""

    def __init__(self, inner: Any, counting: Any, gated: str, key: str, timeout: float) -> None:
        self.inner = inner
        self.counting = counting
        self.gated = gated
        self.key = key
        self.timeout = timeout
        self.released_by_get: bool | None = None

    def list_pages(self, prefix: str, page_size: int = 1000) -> Any:
        if prefix == self.gated:
            deadline = time.monotonic() + self.timeout
            while not any(key == self.key for key, _start, _n in self.counting.gets):
                if time.monotonic() > deadline:
                    self.released_by_get = False
                    break
                time.sleep(0.01)
            else:
                self.released_by_get = True
        yield from self.inner.list_pages(prefix, page_size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_the_fetch_pass_starts_while_the_scan_still_lists(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """Files found so far are fetched while the rest of the tree is still
    being listed: the listing of t/b/ goes on only once t/a/f was fetched."""
    data = put_tree(s3_store, {"t/a/f": 1000, "t/b/g": 2000})
    mount = await make_fs()
    gate = ListingWaitsForAGet(
        mount.fs.namespace.listings.store, mount.store, "t/b/", "t/a/f", 10.0
    )
    mount.fs.namespace.listings.store = gate
    job = await run_preload(nursery, mount, ["t"])
    assert gate.released_by_get is True
    assert job.state == "done" and job.failures == []
    assert (job.files_total, job.files_done, job.bytes_fetched) == (2, 2, 3000)
    assert await mount.read_file("t/b/g") == data["t/b/g"]


async def test_preload_names_missing_paths_and_goes_on(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    put_tree(s3_store, TREE)
    mount = await make_fs()
    paths = ["data/c.bin", "data/nope.bin", "data/a/y.bin", "data/c.bin"]
    job = await run_preload(nursery, mount, paths)
    assert job.state == "done"
    assert [(f.path, "No such file" in f.reason) for f in job.failures] == [("data/nope.bin", True)]
    assert (job.files_total, job.files_done, job.files_failed) == (3, 3, 1)
    # Listed twice: fetched once, then found resident.
    assert job.files_resident == 1
    assert job.bytes_fetched == 1010
    assert job.bytes_resident == 10
    assert job.ready_bytes == job.bytes_total == 1020


async def test_preload_larger_than_every_tier_warns_up_front(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    put(s3_store, "huge.bin", blob(5 * MiB, 5))
    mount = await make_fs(capacities=(MiB, MiB))
    job = await run_preload(nursery, mount, ["huge.bin"], tier="nvme")
    assert any("larger than every tier" in w for w in job.warnings)
    # It cannot all be kept: the file is named with the reason.
    assert job.files_failed == 1
    assert "tiers are full" in job.failures[0].reason


async def test_a_job_bandwidth_cap_paces_its_fetches(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    put_tree(s3_store, {"paced/a": MiB, "paced/b": MiB, "paced/c": MiB})
    mount = await make_fs()
    started = trio.current_time()
    job = await run_preload(nursery, mount, ["paced"], bandwidth=MiB)
    elapsed = trio.current_time() - started
    assert job.state == "done" and job.bytes_fetched == 3 * MiB
    assert job.snapshot()["bandwidth"] == MiB
    # 3 MiB at 1 MiB/s, less the throttle's burst of a quarter second at each
    # end (a fetch runs ahead of its pacing, and the last one sleeps only
    # until it is within the burst).  Unpaced, the preload takes well under 1 s.
    assert elapsed >= 3 - 2 * 0.25 - 0.05, elapsed


async def test_preload_to_a_named_tier(make_fs: Any, s3_store: Any, nursery: trio.Nursery) -> None:
    put_tree(s3_store, {"d/one": 2 * MiB, "d/two": 100})
    mount = await make_fs()
    job = await run_preload(nursery, mount, ["d"], tier="hdd")
    assert job.state == "done" and job.files_done == 2
    for key in ("d/one", "d/two"):
        inode = await mount.fs.namespace.resolve(key)
        assert set(mount.fs.meta.residency(inode.ino)) == {1}


async def test_huge_file_is_fetched_in_parallel_ranges(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file of several ranges: more than one GET in flight at once."""
    monkeypatch.setattr("tierfs.workers.preload.RANGE_BYTES", 2 * MiB)
    put(s3_store, "big.bin", blob(8 * MiB, 9))
    mount = await make_fs(capacities=(16 * MiB, 16 * MiB))
    in_flight = 0
    most = 0
    lock = threading.Lock()
    inner = mount.store.get_range_into

    def counting(
        key: str, start: int, bufs: Sequence[memoryview], etag: str | None = None, **kw: Any
    ) -> int:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        try:
            threading.Event().wait(0.05)
            return inner(key, start, bufs, etag, **kw)
        finally:
            with lock:
                in_flight -= 1

    mount.store.get_range_into = counting  # type: ignore[method-assign]
    job = await run_preload(nursery, mount, ["big.bin"])
    assert job.state == "done" and job.files_done == 1
    assert most >= 2


# --- priority -----------------------------------------------------------------------------


class GatedGets:
    """Wraps the store's ``get_range_into``: records the order GETs start in
    and holds each until ``gate`` is set."""

    def __init__(self, mount: CoreMount) -> None:
        self.inner = mount.store.get_range_into
        self.started: list[str] = []
        self.gate = threading.Event()
        mount.store.get_range_into = self  # type: ignore[method-assign]

    def __call__(
        self,
        key: str,
        start: int,
        bufs: Sequence[memoryview],
        etag: str | None = None,
        **kw: Any,
    ) -> int:
        self.started.append(key.rsplit("/", 1)[-1])
        assert self.gate.wait(20)
        return self.inner(key, start, bufs, etag, **kw)


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_demand_reads_go_before_queued_preload(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    for name in ("a", "b", "c", "d"):
        put(s3_store, name, blob(1000, ord(name)))
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=1)
    mount = await make_fs(fetch=fetch)
    gets = GatedGets(mount)
    inodes = {n: await mount.fs.namespace.resolve(n) for n in "abcd"}
    # A demand read takes the one fetch slot (one slot: the order of the
    # GETs that follow is decided by the priority rule alone).
    nursery.start_soon(mount.read_file, "a")
    await wait_for(lambda: len(gets.started) == 1)
    # A preload of c queues; then a demand read of d arrives.
    filled = trio.Event()

    async def preload_c() -> None:
        await mount.fs.movement.fill(inodes["c"].ino)
        filled.set()

    nursery.start_soon(preload_c)
    await trio.sleep(0.1)
    read_d = trio.Event()

    async def read_file_d() -> None:
        await mount.read_file("d")
        read_d.set()

    nursery.start_soon(read_file_d)
    await wait_for(lambda: mount.fs.fetcher.demand_waiting == 1)
    gets.gate.set()
    with trio.fail_after(20):
        await filled.wait()
        await read_d.wait()
    assert gets.started == ["a", "d", "c"]


async def test_demand_read_promotes_a_queued_preload_fetch(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """A read that needs a block a queued preload fetch holds does not wait
    behind other queued preload work: the shared fetch becomes demand."""
    for name in ("a", "b", "c", "e"):
        put(s3_store, name, blob(1000, ord(name)))
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=1)
    mount = await make_fs(fetch=fetch)
    gets = GatedGets(mount)
    inodes = {n: await mount.fs.namespace.resolve(n) for n in "abce"}
    nursery.start_soon(mount.read_file, "a")
    await wait_for(lambda: len(gets.started) == 1)
    for name in ("e", "c"):  # e queued first
        nursery.start_soon(mount.fs.movement.fill, inodes[name].ino)
        await trio.sleep(0.05)
    done = trio.Event()

    async def read_c() -> None:
        assert await mount.read_file("c") == blob(1000, ord("c"))
        done.set()

    nursery.start_soon(read_c)
    # The promoted fetch waits for the slot as demand does.
    await wait_for(lambda: mount.fs.fetcher.demand_waiting == 1)
    gets.gate.set()
    with trio.fail_after(20):
        await done.wait()
    await wait_for(lambda: len(gets.started) == 3)
    assert gets.started == ["a", "c", "e"]  # c before e, which was queued earlier


async def test_preload_and_demand_read_share_one_fetch(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    data = blob(3 * MiB, 11)
    put(s3_store, "shared.bin", data)
    mount = await make_fs()
    gets = GatedGets(mount)
    inode = await mount.fs.namespace.resolve("shared.bin")
    filled = trio.Event()

    async def preload() -> None:
        await mount.fs.movement.fill(inode.ino)
        filled.set()

    nursery.start_soon(preload)
    await wait_for(lambda: len(gets.started) == 1)
    got: list[bytes] = []

    async def read() -> None:
        got.append(await mount.read_file("shared.bin"))

    nursery.start_soon(read)
    await trio.sleep(0.1)
    gets.gate.set()
    with trio.fail_after(20):
        await filled.wait()
        await wait_for(lambda: bool(got))
    assert got == [data]
    assert gets.started == ["shared.bin"]  # one GET for both


async def test_small_file_made_resident_after_the_scan_counts_as_resident(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small file the scan found with nothing resident is filled whole with
    no second look at LMDB; bytes that arrived between scan and fetch (a
    demand read) must still count as resident, not fetched, and cost no GET."""
    data = put_tree(s3_store, {"d/small.bin": 70_000, "d/other.bin": 1234})
    mount = await make_fs()
    assert await mount.read_file("d/small.bin") == data["d/small.bin"]
    gets = len(mount.store.gets)
    # The scan runs as if the demand read had not landed yet.
    monkeypatch.setattr(mount.fs.meta, "residency", lambda ino: {})
    job = await run_preload(nursery, mount, ["d"])
    assert job.state == "done" and job.failures == []
    assert (job.files_total, job.files_done, job.files_resident) == (2, 2, 1)
    assert job.bytes_fetched == 1234
    assert job.bytes_resident == 70_000
    assert job.ready_bytes == job.bytes_total
    assert len(mount.store.gets) == gets + 1  # only other.bin


async def test_fill_range_reports_the_bytes_present_before_it(make_fs: Any, s3_store: Any) -> None:
    put_tree(s3_store, {"f.bin": 3 * MiB + 7})
    mount = await make_fs()
    ino = (await mount.fs.namespace.resolve("f.bin")).ino
    bs = mount.fs.config.fetch.block_size
    first = await mount.fs.movement.fill_range(ino, blocks=range(0, 1))
    assert (first.nbytes, first.present, first.complete) == (min(bs, 3 * MiB + 7), 0, True)
    whole = await mount.fs.movement.fill_range(ino)
    assert whole.present == first.nbytes
    assert whole.nbytes + whole.present == 3 * MiB + 7 and whole.complete


class GiveWayProbe:
    """Wraps the store's ``get_range_into``.  The first GET of ``big`` that
    may give way (it carries ``stop``) pauses once its first block is in,
    until ``demand_started`` is set; GETs of ``held`` wait for ``release``.
    Records (name, start, bytes asked, bytes got) of every GET."""

    def __init__(self, mount: CoreMount, big: str, held: str) -> None:
        self.inner = mount.store.get_range_into
        self.big, self.held = big, held
        self.first_block_in = threading.Event()
        self.demand_started = threading.Event()
        self.release = threading.Event()
        self.gets: list[tuple[str, int, int, int]] = []
        self._probed = False
        mount.store.get_range_into = self  # type: ignore[method-assign]

    def __call__(
        self,
        key: str,
        start: int,
        bufs: Sequence[memoryview],
        etag: str | None = None,
        *,
        stop: Any = None,
    ) -> int:
        name = key.rsplit("/", 1)[-1]
        if name == self.held:
            assert self.release.wait(20)
        if name == self.big and stop is not None and not self._probed:
            self._probed = True
            outer = stop

            def stop_after_demand() -> bool:
                self.first_block_in.set()
                assert self.demand_started.wait(20)
                return bool(outer())

            stop = stop_after_demand
        got = self.inner(key, start, bufs, etag, stop=stop)
        self.gets.append((name, start, sum(len(b) for b in bufs), got))
        return got


async def test_background_get_gives_way_to_demand_between_blocks(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """A preload GET running when a demand read starts ends after the block
    it is reading (its blocks so far are recorded at once), instead of
    holding the server until its whole range is in; the rest of the file is
    fetched once demand is quiet, and every byte is right."""
    data = blob(8 * MiB, 13)
    put(s3_store, "big.bin", data)
    put(s3_store, "small.bin", blob(1000, 5))
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=2)
    mount = await make_fs(fetch=fetch)
    probe = GiveWayProbe(mount, "big.bin", "small.bin")
    big = await mount.fs.namespace.resolve("big.bin")
    filled = trio.Event()

    async def preload() -> None:
        await mount.fs.movement.fill(big.ino)
        filled.set()

    nursery.start_soon(preload)
    await wait_for(probe.first_block_in.is_set)
    nursery.start_soon(mount.read_file, "small.bin")  # its GET is held: demand runs
    await wait_for(mount.fs.fetcher.slots.demand_present)
    probe.demand_started.set()
    await wait_for(lambda: any(g[0] == "big.bin" for g in probe.gets))
    assert probe.gets[0] == ("big.bin", 0, 8 * MiB, MiB)  # one block, not the 8 asked for
    await wait_for(lambda: [p.blockno for p in mount.fs.movement.check(big.ino).blocks] == [0])
    await trio.sleep(0.2)
    assert [g for g in probe.gets if g[0] == "big.bin"] == [probe.gets[0]], "demand still runs"
    probe.release.set()
    with trio.fail_after(20):
        await filled.wait()
    big_gets = [g for g in probe.gets if g[0] == "big.bin"]
    assert big_gets[1][1] == MiB  # the rest starts where the first GET stopped
    assert sum(g[3] for g in big_gets) == 8 * MiB
    assert len(mount.fs.movement.check(big.ino).blocks) == 8
    assert await mount.read_file("big.bin") == data


async def test_background_get_started_under_demand_is_a_short_trickle(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery
) -> None:
    """While demand is active a preload GET still starts now and then (the
    trickle), but asks for at most BACKGROUND_TRICKLE_BYTES, not a whole
    run: it holds the server as briefly as the 8 MiB GETs measured for it."""
    data = blob(16 * MiB, 17)
    put(s3_store, "big.bin", data)
    put(s3_store, "small.bin", blob(1000, 5))
    fetch = FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=2)
    mount = await make_fs(fetch=fetch)
    probe = GiveWayProbe(mount, "big.bin", "small.bin")
    probe.demand_started.set()  # no pause in the GET that may give way
    big = await mount.fs.namespace.resolve("big.bin")
    nursery.start_soon(mount.read_file, "small.bin")  # held: demand stays active
    await wait_for(mount.fs.fetcher.slots.demand_present)
    filled = trio.Event()

    async def preload() -> None:
        await mount.fs.movement.fill(big.ino)
        filled.set()

    nursery.start_soon(preload)
    await wait_for(lambda: any(g[0] == "big.bin" for g in probe.gets))
    assert probe.gets[0] == ("big.bin", 0, BACKGROUND_TRICKLE_BYTES, BACKGROUND_TRICKLE_BYTES)
    probe.release.set()
    with trio.fail_after(20):
        await filled.wait()
    assert await mount.read_file("big.bin") == data
