"""The fetcher: fill blocks of a file from where they come from.

``Fetcher`` turns absent blocks of a ``CachedFile`` into blocks on a tier
(or, with no room, in memory): one ranged GET per run of blocks, written
to the cache file and hashed in a thread, recorded on the loop.  Reads
(``BlockCache``), their readahead, ``DataMovement.fill`` (preload, pins,
promotion, the prefetcher) all call ``start_fetches`` / ``fill`` / ``fetch``
here and nothing below.

Where a block comes from is one seam: ``Origin`` names the object (and
the ETag for If-Match) a file's bytes are read from right now and reads a
range of it into buffers.  Today that is the file's object in the bucket,
or the object it is being moved from (a rename in the journal); a tier
shared by several nodes plugs in here (``sharedtier.SharedOrigin``), by answering ``get_range_into``
before the bucket does.

Per block, what a fetch does:

    absent, below origin_size --fetch (ranged GET, pwrite, xxh3)--> clean+verified
    absent, at/after origin_size: a hole, reads as zeros (nothing fetched)

Fetches: consecutive absent blocks are fetched with one ranged GET of up to
16 MiB (``FETCH_RUN_BYTES``; BACKGROUND ones may end early, see
"Priority"); readahead holds the trailing partial run back until it is
full.  The GET reads the socket straight into pooled block buffers
(:mod:`tierfs.core.state.buffers`).  Whole fetched blocks are written to the
tier with O_DIRECT from those buffers (filling the page cache was most of
the daemon's CPU on cold reads: measured with perf in tests/bench) and stay
in them, as recent blocks, for the reads that follow: a FUSE read of a
recent block is answered with a view of its buffer, no copy.  Filesystems
without O_DIRECT (tmpfs) get buffered writes.  A block record is committed
to LMDB (on the loop, after the thread wrote the bytes) only if the file's
``generation`` did not change meanwhile; an ETag change bumps the
generation, so a late GET of the old content is dropped instead of
recorded.  A clean file's records are committed at once; a dirty file's
with its writes (``CachedFile.uncommitted``).

Concurrency rules:

* The GET + pwrite + hash of a fetch run in a thread (``_fetch_threads``,
  ``fetch.concurrency`` threads at most); everything else on the loop.
* One fetch per block at a time (``Flight``, in ``CachedFile.flights``);
  other readers of the block wait for it and share its outcome.
* Priority (:mod:`tierfs.core.state.fetch_slots` has the rule and why): every
  GET holds one of ``fetch.concurrency`` fetch slots (``self.slots``).
  DEMAND fetches (reads and their readahead) go first and queue in
  arrival order; AHEAD (``fill(..., priority=AHEAD)``: order-aware
  prefetch) and BACKGROUND (``fill``: preload, pins, promotion) fetches
  never queue ahead of a waiting demand fetch, BACKGROUND ones hold at most
  half of the slots (AHEAD ones as many as the prefetcher starts), and
  AHEAD goes before BACKGROUND.  While demand is active (a demand fetch
  waits or runs, or ended less than 0.5 s ago) BACKGROUND work shrinks to
  a trickle (one fetch at a time, at least 1 s apart, each a GET of at
  most ``BACKGROUND_TRICKLE_BYTES``, 8 MiB), and BACKGROUND GETs running
  when demand starts *give way*: each ends after the block it is reading
  (``ObjectStore.get_range_into(stop=...)``, asked between two blocks; the
  connection is closed), its blocks so far are recorded, and the rest of
  its run waits for a slot again.  So the S3 server, the network and the
  disk serve the demand read as if idle, while a preload alone uses GETs
  as long as demand ones (``BACKGROUND_RUN_BYTES`` = 16 MiB: fewer
  requests per GiB, less CPU in the server and the daemon).  A GET does
  not give way once a demand read joined its flight.  A demand read that
  needs a block a lower-priority fetch is waiting to start promotes that
  flight (``Flight.priority``), so the shared fetch does not wait behind
  the priority it is being served for; a ``fill`` that joins a flight
  raises it to its own priority likewise.

Per-file cost on the loop (a small file is one block, one GET): the fetch
thread opens, and creates, the cache file itself when the CachedFile has
no fd on that tier yet (``_CacheFiles``), after its GET answered (a failed
GET creates no file); back on the loop the CachedFile adopts the fds, and
a duplicate opened by a concurrent fetch of the same file is closed.  The
O_DIRECT fd is opened only for a block written through it (a small file's
partial block is not).  The rest per fetched block on the loop: the tier
choice (``SpaceManager.reserve``, whose tier usage MetaDB keeps in
memory), one record in the metadata group (``MetaDB.add_block``) and the
eviction bookkeeping.  The GET's thread hop (``thread_hop.ThreadHop``)
keeps its own threads (no renaming of a trio worker thread per job) and
hands results back to the loop in batches (one wake-up of the loop for all
the GETs that finished meanwhile).

The object changed: a GET of a clean file carries the ETag it was listed
or last checked with (If-Match).  On a mismatch ``revalidate_origin`` HEADs
the object, once per generation of the file (concurrent fetches of the file
wait for that one HEAD).  If it changed, its cached blocks are dropped
(``OpenFiles.content_changed`` bumps the generation), ``cf.inode`` becomes
the new inode, and the flight ends without error: the reader fetches
again, with the new ETag and size, unless the object grew: the kernel
would cut the new bytes at the size it was told at open, so that read
fails with ESTALE and the next open sees the new size.  If the object did
not change, the read fails with ESTALE.  This is what lets ``TierFS.open``
skip the HEAD of a file with nothing cached.

Memory stays bounded: a fetch holds one buffer per block of its run
between GET and pwrite, and at most ``fetch.concurrency`` fetches run,
whatever the number of handles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import itertools
import logging
import mmap
import os
import time
from collections.abc import Awaitable, Callable, Iterable

import trio

from tierfs.errors import PreconditionFailed, StoreError, TierfsError
from tierfs.meta import BlockRecord, Inode, SyncState
from tierfs.store import ObjectStore
from tierfs.tiers import DIRECT_ALIGN, Tier, pwrite_all

from ..state.digests import block_digest
from ..state.fetch_slots import SHORT_FETCH_BYTES, FetchPriority, FetchSlots
from ..state.openfiles import CachedFile, Flight, OpenFiles, wait_flights
from ..state.space import SpaceManager
from .thread_hop import ThreadHop

log = logging.getLogger(__name__)


#: Sequential fetches are grouped into ranged GETs of up to this many bytes
#: (8-16 MiB, as Mountpoint's parts), whatever the block size.
FETCH_RUN_BYTES = 16 * 1024 * 1024

#: BACKGROUND fetches (preload, pins, promotion) are ranged GETs of up to
#: this many bytes while no demand is active: as long as demand ones (fewer
#: requests per GiB cost the S3 server and the daemon less CPU), and they
#: give way to a demand read between two blocks (see "Priority").
BACKGROUND_RUN_BYTES = FETCH_RUN_BYTES

#: A BACKGROUND GET that starts while demand is active (rule 4's trickle)
#: asks for at most this many bytes (see "Priority").
BACKGROUND_TRICKLE_BYTES = 8 * 1024 * 1024

#: Blocks kept in memory per file when no tier had room for them.
_TRANSIENT_BLOCKS = 8


@dataclasses.dataclass(frozen=True, slots=True)
class RangedGet:
    """One ranged GET of a fetch and where its blocks go (``_get_and_store``)."""

    key: str
    etag: str
    offset: int
    #: Bytes to read from the object (the blocks past its end are zeros).
    length: int
    #: Bytes of each block of the run.
    lengths: list[int]
    #: Per block, its cache file (None: kept in memory).
    files: list[_CacheFiles | None]
    #: Asked between two blocks: end the GET there (see "Priority").
    stop: Callable[[], bool] | None = None
    #: May the blocks come from, and go to, a tier shared with other nodes
    #: (``Origin.shares``: no ``share = false`` rule over the file)?
    shared: bool = True


def _demand_priority() -> FetchPriority:
    return FetchPriority.DEMAND


class Origin:
    """Where the bytes of a file's absent blocks come from (the seam a
    shared tier plugs into, see the module docstring)."""

    def __init__(self, store: ObjectStore, moving_from: Callable[[int], str | None]) -> None:
        """``moving_from(ino)``: the key the file's object is being renamed
        from, while the journal has that rename pending (None otherwise)."""
        self.store = store
        self.moving_from = moving_from

    def locate(self, inode: Inode) -> tuple[str, str]:
        """The key to read ``inode``'s origin bytes from right now, and the
        ETag for If-Match ("" when it is not known)."""
        moving_from = self.moving_from(inode.ino)
        if moving_from is not None:
            return moving_from, ""  # the ETag may change with a multipart copy
        return inode.origin_key, inode.etag

    def shares(self, inode: Inode) -> bool:
        """May ``inode``'s blocks be read from, and put into, a tier shared
        by several nodes?  This origin shares nothing with anyone."""
        return False

    def get_range_into(
        self, get: RangedGet, views: list[memoryview], stop: Callable[[], bool] | None
    ) -> int:
        """Thread: the bytes of ``get`` (its key from its offset) into
        ``views``, one per block (see ``ObjectStore.get_range_into``); how
        many arrived.  ``stop``: asked between two blocks, ends the GET."""
        return self.store.get_range_into(get.key, get.offset, views, get.etag or None, stop=stop)


class _CacheFiles:
    """The fds of one cache file for a fetch thread (``_get_and_store``).

    Those the CachedFile already holds are passed in; the others are opened
    (and the file created) by the thread itself, right before it writes, so
    that the event loop never waits for a path lookup and a create per
    fetched file (a small-file preload spent about 12% of the loop there).
    Back on the loop, ``Fetcher._adopt_cache_files`` hands what the
    thread opened to the CachedFile (or closes it, if another fetch of the
    same file adopted its own first)."""

    __slots__ = ("direct", "direct_known", "fd", "ino", "opened_direct", "opened_fd", "tier")

    def __init__(self, tier: Tier, ino: int, fd: int | None, direct: int | None, known: bool):
        self.tier = tier
        self.ino = ino
        self.fd = fd
        #: The O_DIRECT fd (None: none, or the filesystem has no O_DIRECT).
        self.direct = direct
        #: Was the O_DIRECT fd looked up already (``direct`` is the answer)?
        self.direct_known = known
        self.opened_fd = False
        self.opened_direct = False

    def plain_fd(self) -> int:
        """Thread: the buffered fd, opened (the file created) if need be."""
        if self.fd is None:
            self.fd = self.tier.open_file(self.ino, create=True)
            self.opened_fd = True
            assert self.fd is not None
        return self.fd

    def direct_fd(self) -> int | None:
        """Thread: the O_DIRECT fd, opened if need be (only for a block
        that is written with it: a small file's partial block is not)."""
        if not self.direct_known:
            self.plain_fd()  # creates the file
            self.direct = self.tier.open_direct(self.ino)
            self.direct_known = self.opened_direct = True
        return self.direct


class Fetcher:
    """Fills absent blocks of open files (see the module docstring)."""

    def __init__(
        self,
        open_files: OpenFiles,
        origin: Origin,
        space: SpaceManager,
        *,
        block_size: int,
        fetch_concurrency: int,
        revalidate_origin: Callable[[int], Awaitable[Inode | None]] | None = None,
    ) -> None:
        """``revalidate_origin``: a GET's If-Match failed (the object changed
        since it was listed or last checked): HEAD it now.  Returns the new
        inode if the content changed (its cached blocks are already dropped,
        see ``OpenFiles.content_changed``), None if not."""
        self.origin = origin
        self.space = space
        #: The metadata and the tiers are the open-file table's.
        self.meta = open_files.meta
        self.tiers = open_files.tiers
        self.open_files = open_files
        #: The pool of block buffers; those of blocks just fetched go on to
        #: the recent blocks (``OpenFiles.recent``).
        self.buffers = open_files.recent.pool
        self.stats = open_files.stats
        self.block_size = block_size
        #: Fetch slots: held by the task of each GET (see "Priority").
        self.slots = FetchSlots(fetch_concurrency)
        #: The GET threads (a task holds a fetch slot while its thread runs).
        self._fetch_threads = trio.CapacityLimiter(fetch_concurrency)
        self._fetch_hop = ThreadHop(fetch_concurrency, name="tierfs-fetch")
        self.max_run_blocks = max(1, FETCH_RUN_BYTES // block_size)
        self.background_run_blocks = max(1, BACKGROUND_RUN_BYTES // block_size)
        self.trickle_run_blocks = max(1, BACKGROUND_TRICKLE_BYTES // block_size)
        self.revalidate_origin = revalidate_origin
        #: ino -> set when its running ``revalidate_origin`` is done.
        self._revalidations: dict[int, trio.Event] = {}
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self.slots.run)

    @property
    def demand_waiting(self) -> int:
        """Demand fetches waiting for a fetch slot."""
        return self.slots.demand_waiting

    async def fill(
        self,
        cf: CachedFile,
        blocknos: Iterable[int],
        tier: int | None,
        priority: FetchPriority = FetchPriority.BACKGROUND,
    ) -> None:
        """Fetch the absent blocks ``blocknos`` (those holding origin bytes)
        into ``tier`` if it has room (None, or no room: the normal
        placement), at ``priority`` (see "Priority").  A block already being
        fetched is waited for, not fetched twice (its fetch goes at the
        higher of the two priorities); present blocks are left alone (not
        verified)."""
        waits: list[Flight] = []
        absent: list[int] = []
        for blockno in blocknos:
            if blockno in cf.blocks or blockno * self.block_size >= cf.inode.origin_size:
                continue
            flight = cf.flights.get(blockno)
            if flight is not None:
                self.raise_priority(flight, priority)
                waits.append(flight)
            else:
                absent.append(blockno)
        waits += self.start_fetches(cf, absent, tier, priority=priority)
        await wait_flights(cf, waits)

    def raise_priority(self, flight: Flight, priority: FetchPriority) -> None:
        """``flight`` is needed at ``priority`` too (a lower value is more urgent)."""
        if priority < flight.priority:
            flight.priority = priority
            self.slots.priority_raised()

    def start_fetches(
        self,
        cf: CachedFile,
        blocknos: list[int],
        tier: int | None = None,
        *,
        priority: FetchPriority = FetchPriority.DEMAND,
    ) -> list[Flight]:
        """Fetch absent blocks, consecutive ones together: one ranged GET per
        run of up to ``max_run_blocks`` (fewer, larger requests cost the
        store and us less CPU per byte than one GET per block); up to
        ``background_run_blocks`` for a BACKGROUND fetch (see "Priority")."""
        longest = (
            self.background_run_blocks
            if priority is FetchPriority.BACKGROUND
            else self.max_run_blocks
        )
        runs: list[list[int]] = []
        for blockno in sorted(blocknos):
            if runs and blockno == runs[-1][-1] + 1 and len(runs[-1]) < longest:
                runs[-1].append(blockno)
            else:
                runs.append([blockno])
        return [self._start_run(cf, run, tier, priority) for run in runs]

    def _start_run(
        self, cf: CachedFile, run: list[int], tier: int | None, priority: FetchPriority
    ) -> Flight:
        flight = Flight(priority)
        for blockno in run:
            cf.flights[blockno] = flight
        assert self._nursery is not None, "Fetcher.start() was not called"
        self._nursery.start_soon(self._run_fetch_flight, cf, run, flight, tier)
        return flight

    async def _run_fetch_flight(
        self, cf: CachedFile, run: list[int], flight: Flight, tier: int | None = None
    ) -> None:
        try:
            await self.fetch(cf, run, tier, flight)
        except Exception as exc:
            flight.error = exc
            if not isinstance(exc, TierfsError):
                log.exception("fetching blocks %d-%d of %r failed", run[0], run[-1], cf.key)
        finally:
            for blockno in run:
                if cf.flights.get(blockno) is flight:
                    del cf.flights[blockno]
            flight.done.set()
            self.open_files.close_if_idle(cf)

    async def _get_in_thread(
        self, flight: Flight | None, get: RangedGet
    ) -> list[tuple[int, bytes, mmap.mmap | None]]:
        """``_get_and_store`` in a thread, holding a fetch slot meanwhile
        (taken at the priority of ``flight``; None: DEMAND).  At debug
        level, a demand fetch logs how long it waited for its slot, for the
        thread (GET, write, hash) and for the loop to take the result."""
        asked = time.perf_counter()
        taken = await self.slots.take(
            (lambda: flight.priority) if flight is not None else _demand_priority,
            short=get.length <= SHORT_FETCH_BYTES,
        )
        try:
            if taken is FetchPriority.BACKGROUND and flight is not None:
                if self.slots.demand_active():  # the trickle: a short GET
                    lengths = get.lengths[: self.trickle_run_blocks]
                    get = dataclasses.replace(
                        get,
                        length=min(get.length, sum(lengths)),
                        lengths=lengths,
                        files=get.files[: self.trickle_run_blocks],
                    )
                else:  # gives way when demand comes
                    stop = functools.partial(self._background_gives_way, flight)
                    get = dataclasses.replace(get, stop=stop)
            started = time.perf_counter()
            async with self._fetch_threads:
                results, thread_done = await self._fetch_hop.run(
                    functools.partial(self._timed_get_and_store, get)
                )
            if taken is FetchPriority.DEMAND and log.isEnabledFor(logging.DEBUG):
                back = time.perf_counter()
                log.debug(
                    "demand GET %s @%d+%d: slot %.1f ms, thread %.1f ms, loop %.1f ms; running %s",
                    get.key,
                    get.offset,
                    get.length,
                    1e3 * (started - asked),
                    1e3 * (thread_done - started),
                    1e3 * (back - thread_done),
                    self.slots.running,
                )
            return results
        finally:
            self.slots.give(taken)

    def _background_gives_way(self, flight: Flight) -> bool:
        """Thread (``stop`` of a BACKGROUND GET, asked between two blocks):
        end the GET here?  Yes while a demand fetch waits or runs, unless a
        demand read joined this very flight."""
        return flight.priority is FetchPriority.BACKGROUND and self.slots.demand_present()

    def _timed_get_and_store(
        self, get: RangedGet
    ) -> tuple[list[tuple[int, bytes, mmap.mmap | None]], float]:
        """Thread: ``_get_and_store``, and when it ended."""
        results = self._get_and_store(get)
        return results, time.perf_counter()

    async def fetch(
        self, cf: CachedFile, run: list[int], tier: int | None = None, flight: Flight | None = None
    ) -> None:
        """Fetch consecutive blocks ``run`` with one ranged GET, write each to
        ``tier`` if given and with room, else the first tier with room, and
        record it (or keep it in memory if no tier has room).  ``flight``:
        the shared flight of the run (its ``priority`` sets when it gets a
        fetch slot).  A BACKGROUND GET may bring only the first blocks of
        the run (it gave way to demand, or was the trickle: see
        "Priority"): those are recorded at once, and the rest of the run is
        the next GET, which waits for a slot again."""
        generation = cf.generation
        self.stats.miss_blocks += len(run)
        while run:
            done = await self._fetch_some(cf, run, tier, flight, generation)
            if done is None:
                return
            if flight is not None:
                for blockno in run[:done]:
                    if cf.flights.get(blockno) is flight:
                        del cf.flights[blockno]
            run = run[done:]

    async def _fetch_some(
        self,
        cf: CachedFile,
        run: list[int],
        tier: int | None,
        flight: Flight | None,
        generation: int,
    ) -> int | None:
        """One GET of ``_fetch``: how many blocks at the start of ``run`` it
        fetched and recorded; None: the fetch is over (nothing left to
        fetch from the origin, or the object changed)."""
        bs = self.block_size
        offset = run[0] * bs
        lengths = [min(bs, cf.size - b * bs) for b in run]
        from_origin = min(sum(lengths), cf.inode.origin_size - offset)
        if min(lengths) <= 0 or from_origin <= 0:
            return None
        # ``cache = false``: the blocks are served from memory, never stored.
        keep = tier is not None or self.space.cacheable(cf.ino)
        for _attempt in range(len(self.tiers) + 1):
            tiers = [
                self.space.reserve(n, ino=cf.ino, prefer=tier, avoid=cf.fenced_tier)
                if keep
                else None
                for n in lengths
            ]
            per_tier = {t: self._cache_files(cf, t) for t in set(tiers) if t is not None}
            files = [per_tier[t] if t is not None else None for t in tiers]
            try:
                key, etag = self.origin.locate(cf.inode)
                get = RangedGet(
                    key,
                    etag,
                    offset,
                    from_origin,
                    lengths,
                    files,
                    shared=self.origin.shares(cf.inode),
                )
                results = await self._get_in_thread(flight, get)
            except OSError as exc:
                self._release_all(tiers, lengths)
                if exc.errno == errno.ENOSPC:  # the filesystem is fuller than we thought
                    for full in {t for t in tiers if t is not None}:
                        self.space.tier_filled_up(full)
                    continue
                raise
            except PreconditionFailed as exc:
                self._release_all(tiers, lengths)
                if await self._origin_changed(cf, generation):
                    return None  # blocks dropped: the reader asks again, with the new ETag
                raise StoreError(
                    f"{cf.key} changed in the bucket during the read", errno=errno.ESTALE
                ) from exc
            except BaseException:
                self._release_all(tiers, lengths)
                raise
            finally:
                self._adopt_cache_files(cf, per_tier.values())
            done = len(results)
            self.stats.gets += 1
            self.stats.fetched_bytes += min(from_origin, sum(lengths[:done]))
            if generation != cf.generation:  # the object changed meanwhile
                self._release_all(tiers, lengths)
                for _digest, _data, kept in results:
                    if kept is not None:
                        self.buffers.give(kept)
                return None
            self._release_all(tiers[done:], lengths[done:])
            for blockno, block_tier, nbytes, (digest, data, kept) in zip(
                run, tiers, lengths, results, strict=False
            ):
                self._store_fetched(cf, blockno, block_tier, nbytes, digest, data)
                if kept is not None:
                    self.open_files.recent.remember(cf.ino, blockno, kept, nbytes)
            return done
        return None

    async def _origin_changed(self, cf: CachedFile, generation: int) -> bool:
        """A GET of ``cf`` failed its If-Match: did the object change (it is
        revalidated now, once per generation of the file)?  True: the
        cached blocks are dropped and ``cf.inode`` is the new one, so the
        caller's readers fetch again; False: the ESTALE stands."""
        if self.revalidate_origin is None or cf.inode.state != SyncState.CLEAN:
            return False
        if generation != cf.generation:
            return True  # someone revalidated it meanwhile
        flight = self._revalidations.get(cf.ino)
        if flight is None:
            flight = self._revalidations[cf.ino] = trio.Event()
            try:
                new = await self.revalidate_origin(cf.ino)
                if new is not None and self.open_files.files.get(cf.ino) is cf:
                    cf.inode = new
            finally:
                del self._revalidations[cf.ino]
                flight.set()
        else:
            await flight.wait()
        return generation != cf.generation

    def _cache_files(self, cf: CachedFile, tier: int) -> _CacheFiles:
        """What a fetch thread needs to write to ``cf``'s cache file on
        ``tier``: the fds already open, the rest for the thread to open."""
        return _CacheFiles(
            self.tiers[tier],
            cf.ino,
            cf.fds.get(tier),
            cf.direct_fds.get(tier),
            tier in cf.direct_fds,
        )

    @staticmethod
    def _adopt_cache_files(cf: CachedFile, files: Iterable[_CacheFiles]) -> None:
        """On the loop, after the fetch thread: keep the fds it opened (one
        per tier and kind; a duplicate opened by a concurrent fetch of the
        same file is closed).  The CachedFile is alive: its fetch is in
        flight until the caller returns."""
        for files_of_tier in files:
            tier = files_of_tier.tier.index
            if files_of_tier.opened_fd and files_of_tier.fd is not None:
                if tier in cf.fds:
                    os.close(files_of_tier.fd)
                else:
                    cf.fds[tier] = files_of_tier.fd
            if files_of_tier.opened_direct:
                if tier in cf.direct_fds:
                    if files_of_tier.direct is not None:
                        os.close(files_of_tier.direct)
                else:
                    cf.direct_fds[tier] = files_of_tier.direct

    def _release_all(self, tiers: list[int | None], lengths: list[int]) -> None:
        for tier, nbytes in zip(tiers, lengths, strict=True):
            if tier is not None:
                self.space.release(tier, nbytes)

    def _store_fetched(
        self, cf: CachedFile, blockno: int, tier: int | None, nbytes: int, digest: int, data: bytes
    ) -> None:
        if tier is None:
            self.stats.uncached_blocks += 1
            if len(cf.transient) >= _TRANSIENT_BLOCKS:
                cf.transient.pop(next(iter(cf.transient)))
            cf.transient[blockno] = data
            return
        rec = BlockRecord(tier=tier, digest=digest, nbytes=nbytes)
        if cf.inode.state == SyncState.CLEAN:
            self.meta.add_block(cf.ino, blockno, rec)
        else:  # part of a dirty file: committed with the file's writes
            cf.uncommitted.add(blockno)
        self.space.release(tier, nbytes)
        cf.blocks[blockno] = rec
        self.open_files.mark_verified(cf.ino, blockno)
        # The file's only block (a small file): its bytes on the tier are known.
        self.space.block_added(
            cf.ino, tier, nbytes if len(cf.blocks) == 1 else None, used=cf.opened
        )

    def _get_and_store(self, get: RangedGet) -> list[tuple[int, bytes, mmap.mmap | None]]:
        """Thread: one ranged GET of ``length`` bytes, straight into one
        pooled buffer per block, zero-padded to the blocks' total; each block
        written to its cache file with its digest (or returned as bytes,
        where there is no cache file).  Cache files not open yet are opened
        (created) here, once the GET has answered (``_CacheFiles``).
        ``stop`` (see ``ObjectStore.get_range_into``) may end the GET
        between two blocks: the result is then the first blocks only.

        Whole blocks go through the O_DIRECT fd when there is one (filling
        the page cache was most of the daemon's CPU on cold reads); their
        buffers are returned too, to serve the reads that follow from
        memory.  Every other buffer goes back to the pool."""
        key, offset, lengths, files, stop = get.key, get.offset, get.lengths, get.files, get.stop
        length = get.length  # cut to the whole blocks read when the GET stops early
        bufs = [self.buffers.take() for _ in lengths]
        kept = [False] * len(bufs)
        # Every view of ``bufs`` made here is released before the buffers go
        # back to the pool (a view alive at ``give`` costs the buffer).
        views: list[memoryview] = []
        try:
            left = length
            for buf, nbytes in zip(bufs, lengths, strict=True):
                views.append(memoryview(buf)[: min(nbytes, left)])
                left -= len(views[-1])
            stopped = False

            def stop_here() -> bool:
                nonlocal stopped
                stopped = stop is not None and stop()
                return stopped

            got = self.origin.get_range_into(get, views, None if stop is None else stop_here)
            count = len(bufs)
            if stopped and got < length:  # whole blocks only: the first ``count``
                ends = list(itertools.accumulate(len(view) for view in views))
                if got not in ends:
                    raise StoreError(f"{key}: a GET stopped inside a block ({got} bytes)")
                count = ends.index(got) + 1
                length = got
            elif got != length:
                raise StoreError(
                    f"{key}: expected {length} bytes at offset {offset}, got {got}; "
                    "the object is shorter than its listing said"
                )
            out: list[tuple[int, bytes, mmap.mmap | None]] = []
            pos = 0
            for i, (buf, nbytes, target) in enumerate(
                zip(bufs[:count], lengths[:count], files[:count], strict=True)
            ):
                block = memoryview(buf)[:nbytes]
                views.append(block)
                filled = max(0, min(nbytes, length - pos))
                if filled < nbytes:  # past the origin's end (the file was extended): zeros
                    block[filled:] = bytes(nbytes - filled)
                if target is None:
                    out.append((0, bytes(block), None))
                    pos += nbytes
                    continue
                direct = target.direct_fd() if nbytes % DIRECT_ALIGN == 0 else None
                if direct is not None:
                    pwrite_all(direct, block, offset + pos)
                    out.append((block_digest(block), b"", buf))
                    kept[i] = True
                else:
                    pwrite_all(target.plain_fd(), block, offset + pos)
                    out.append((block_digest(block), b"", None))
                pos += nbytes
            return out
        finally:
            for view in views:
                with contextlib.suppress(BufferError):  # a view of the view: dropped at give
                    view.release()
            for buf, keep in zip(bufs, kept, strict=True):
                if not keep:
                    self.buffers.give(buf)
