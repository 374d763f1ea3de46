"""The data path: cached blocks, block-level fetch, single-flight, readahead,
and writes.

Split out of this module: block digests and the running hash of writes
(:mod:`tierfs.core.digests`) and the uploader's reader of cache files
(:mod:`tierfs.core.upload_source`).  Moving a file's blocks between
tiers, and filling or evicting them on request, is
:mod:`tierfs.core.movement` (which uses ``fill``, ``fenced_tier``,
``forget_verified`` and ``drop_cache_file`` here).

A file's bytes are cut into blocks of ``block_size``.  Per block, the states:

    absent, below origin_size --fetch (ranged GET, pwrite, xxh3)--> clean+verified
    absent, at/after origin_size: a hole, reads as zeros (nothing stored)
    clean (from an earlier mount) --first read: xxh3 ok--> clean+verified
    clean --first read: xxh3 mismatch--> absent (refetched; never served;
          the tier's accounting of the file is re-derived)
    clean --bucket ETag changed / evicted--> absent
    any --write--> dirty, unsealed (no digest; served as written)
    dirty, unsealed --commit (close/fsync/truncate: ``seal``)--> dirty, sealed
          (the xxh3 of its bytes is in the record, committed with it)
    dirty, sealed --first read: xxh3 ok--> dirty, sealed+verified
    dirty, sealed --first read or upload: xxh3 mismatch--> DAMAGED: reads of
          it get EIO, the file is ``failed`` and is never uploaded
    dirty --upload done, content unchanged--> clean (digest from the upload)

A write to an absent block that holds origin bytes it does not fully cover
fetches the block first (read-modify-write).  Dirty blocks are never
evicted or dropped, damaged ones included: they are the only copy.

Dirty-block digests.  A dirty block's digest is recorded when its bytes are
committed to the tier (``seal``, called by every commit), so that a bit
flip in a tier file between commit and upload is caught, like one in a
clean block, instead of being served and uploaded.  Cost is kept off the
write path: each write of a block that starts where the previous one ended
(from offset 0 of the block) feeds a running xxh3 of that block
(``BlockHasher``; inline for small writes, in the worker thread for direct
ones), so a sequential writer's blocks are sealed from the bytes already
held, at no extra I/O.  Any other pattern (a rewrite inside the block, a
truncate, two writes of one block in flight at once) drops the running
hash, and ``seal`` reads the block back once, in a thread.  The running
hash of a write is only adopted if no other write touched the block while
it was in flight (``CachedFile.writing``), so it always describes the bytes
that ended up in the file.  A sealed block is verified, like a clean one,
once per block per mount: on its first read after a seal from a running
digest (those bytes were never read back), while a seal that read the block
back counts as its check.  Every sealed or clean block is verified by
``UploadSource`` while the upload reads it: a mismatch aborts the upload
before the wrong bytes complete an object.  A write that keeps some bytes
of a block not verified yet checks it first (as a read-modify-write would),
so that new bytes are never built on damaged ones and sealed with them.  A
block that changed while the check ran (a write in flight, a new record) is
not damage: the check is skipped or the upload retried.

On damage (``on_damage``, passed by TierFS) the file is marked ``failed`` in
LMDB, which ``tierfs where`` and ``tierfs status`` show, the daemon log
names the file and block, and the upload is refused until the file's
content changes.  What an operator does then: the damaged block's bytes
are lost (it was the only copy); restore the file from a good copy (or
rewrite the lost range) through the mount, or delete it.  A rewrite makes
the file upload again, and a clean upload clears ``failed``.

``CachedFile`` is the in-memory state of one inode while it is open or has a
fetch or upload in flight: the live ``Inode`` (size, origin, sync state),
its block map (loaded from LMDB once), the fds of its cache files, the
in-flight fetches and the writes not yet committed.  While a CachedFile
exists it, not LMDB, is the truth about the file; ``commit`` writes it
back.  A busy CachedFile is never evicted, so its fds always name the live
cache files.

Concurrency rules:

* Cache hits are served inline on the trio loop: one ``os.pread`` per run of
  blocks on the same tier.  No thread hop, no LMDB write.
* Everything that may block for long runs in a thread: the GET + pwrite +
  hash of a fetch (``_fetch_threads``, ``fetch.concurrency`` threads at most)
  and the first-read verification of a block (``io_limiter``).
* One fetch or verification per block at a time (``_Flight``); other readers
  of the block wait for it and share its outcome.
* Priority (:mod:`tierfs.core.fetch_slots` has the rule and why): every
  GET holds one of ``fetch.concurrency`` fetch slots (``self.slots``).
  DEMAND fetches (reads and their readahead) go first and queue in
  arrival order; AHEAD (``fill(..., priority=AHEAD)``: order-aware
  prefetch) and BACKGROUND (``fill``: preload, pins, promotion) fetches
  never queue ahead of a waiting demand fetch, BACKGROUND ones hold at most
  half of the slots (AHEAD ones as many as the prefetcher starts), and
  AHEAD goes before BACKGROUND.  While demand is active (a
  demand fetch waits or runs, or ended less than 0.5 s ago) BACKGROUND
  work shrinks to a trickle (one fetch at a time, at least 1 s apart, each
  a GET of at most ``BACKGROUND_TRICKLE_BYTES``, 8 MiB), and BACKGROUND
  GETs running when demand starts *give way*: each ends after the block it
  is reading (``ObjectStore.get_range_into(stop=...)``, asked between two
  blocks; the connection is closed), its blocks so far are recorded, and
  the rest of its run waits for a slot again.  So the S3 server, the
  network and the disk serve the demand read as if idle, while a preload
  alone uses GETs as long as demand ones (``BACKGROUND_RUN_BYTES`` = 16
  MiB: fewer requests per GiB, less CPU in the server and the daemon).
  A GET does not give way once a demand read joined its flight.  A demand
  read that needs a block a lower-priority fetch is waiting to start
  promotes that flight (``_Flight.priority``), so the shared fetch does
  not wait behind the priority it is being served for; a ``fill`` that
  joins a flight raises it to its own priority likewise.
* A block record is committed to LMDB (on the loop, after the thread wrote
  the bytes) only if the file's ``generation`` did not change meanwhile; an
  ETag change bumps the generation, so a late GET of the old content is
  dropped instead of recorded.

Fetches: consecutive absent blocks are fetched with one ranged GET of up to
16 MiB (``FETCH_RUN_BYTES``; BACKGROUND ones may end early, see
"Priority"); readahead holds the trailing partial run back
until it is full.  The GET reads the socket straight into pooled block
buffers (:mod:`tierfs.core.buffers`).  Whole fetched blocks are written to
the tier with O_DIRECT from those buffers (filling the page cache was most
of the daemon's CPU on cold reads: measured with perf in tests/bench) and
stay in them, up to ``recent_max`` (= readahead_max) bytes in all, for the
reads that follow: a FUSE read of a recent block is answered with a view
of its buffer, no copy.  Older ones are read back from the tier.
Filesystems without O_DIRECT (tmpfs) get buffered writes.

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
(``content_changed`` bumps the generation), ``cf.inode`` becomes the new
inode, and the flight ends without error: the reader fetches again, with
the new ETag and size, unless the object grew: the kernel would cut the new
bytes at the size it was told at open, so that read fails with ESTALE and
the next open sees the new size.  If the object did not change, the read
fails with ESTALE.  This is what lets ``TierFS.open`` skip the HEAD of a
file with nothing cached.

Readahead: each open handle tracks its last read.  A read that continues the
previous one is sequential; each time a sequential reader enters a new block
the window may grow, from 1 block up to ``readahead_max``: it doubles up to
two full-size GETs, and beyond that only while a wider window makes the
reader faster (:mod:`tierfs.core.readahead`).  Blocks in the window that
are absent are fetched in the background.  Memory stays bounded:
a fetch holds one block in memory between GET and pwrite, and at most
``fetch.concurrency`` fetches run, whatever the number of handles.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import itertools
import logging
import mmap
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from tierfs.errors import BlockDamaged, NoSpace, PreconditionFailed, StoreError, TierfsError
from tierfs.meta import BlockRecord, Inode, MetaDB, MetaTxn, SyncState
from tierfs.store import ObjectStore
from tierfs.tiers.tier import Tier, pread_padded, pwrite_all

from .buffers import BlockBuffers
from .digests import BlockHasher, block_digest, read_and_hash
from .fetch_slots import SHORT_FETCH_BYTES, FetchPriority, FetchSlots
from .readahead import ReadaheadWindow
from .space import SpaceManager
from .thread_hop import ThreadHop
from .upload_source import UploadSource

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

#: O_DIRECT needs offsets, lengths and buffers aligned to the logical block size.
_DIRECT_ALIGN = 4096

#: Aligned writes at least this long skip the page cache (O_DIRECT, in a
#: worker thread): a checkpoint written through the mount then costs one
#: copy, not a page cache fill, and its fsync has little left to flush.
DIRECT_WRITE_MIN = 256 * 1024

#: Blocks kept in memory per file when no tier had room for them.
_TRANSIENT_BLOCKS = 8


async def _nothing() -> None:
    return None


def _demand_priority() -> FetchPriority:
    return FetchPriority.DEMAND


class _Flight:
    """One fetch or verification of one block, shared by all who wait for it."""

    __slots__ = ("done", "error", "priority")

    def __init__(self, priority: FetchPriority = FetchPriority.DEMAND) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        #: The most urgent of those waiting for it (see "Priority"); it only rises.
        self.priority = priority


class _CacheFiles:
    """The fds of one cache file for a fetch thread (``_get_and_store``).

    Those the CachedFile already holds are passed in; the others are opened
    (and the file created) by the thread itself, right before it writes, so
    that the event loop never waits for a path lookup and a create per
    fetched file (a small-file preload spent about 12% of the loop there).
    Back on the loop, ``BlockCache._adopt_cache_files`` hands what the
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


@dataclass(slots=True)
class CachedFile:
    inode: Inode
    blocks: dict[int, BlockRecord]
    generation: int = 0  # bumped when the origin changes under us
    version: int = 0  # bumped by every change of content
    refs: int = 0
    fds: dict[int, int] = field(default_factory=dict)
    flights: dict[int, _Flight] = field(default_factory=dict)
    transient: dict[int, bytes] = field(default_factory=dict)
    direct_fds: dict[int, int | None] = field(default_factory=dict)
    uncommitted: set[int] = field(default_factory=set)  # dirty blocks not yet in LMDB
    reserved: dict[int, tuple[int, int]] = field(default_factory=dict)  # block -> tier, bytes
    truncated_from: int | None = None  # first block dropped by a truncate, not yet committed
    inode_dirty: bool = False  # size/times changed since the last commit
    #: Running digests of dirty blocks written in order (see the module docstring).
    hashers: dict[int, BlockHasher] = field(default_factory=dict)
    #: block -> writes of it in flight (their bytes may be half on the tier).
    writing: dict[int, int] = field(default_factory=dict)
    #: Blocks that two writes were in flight for at once: no running digest.
    contended: set[int] = field(default_factory=set)
    #: A tier on which no new block of the file may be placed now: the one a
    #: relocate is copying the file to, or the one whose old copy it is
    #: deleting (see ``tierfs.core.movement``).
    fenced_tier: int | None = None
    #: A handle opened the file while this CachedFile lived: blocks stored
    #: now are that open's use, not a fetch nobody asked for yet
    #: (``SpaceManager.block_added(used=...)``).
    opened: bool = False

    @property
    def ino(self) -> int:
        return self.inode.ino

    @property
    def size(self) -> int:
        return self.inode.size

    @property
    def key(self) -> str:
        return self.inode.origin_key


@dataclass(slots=True)
class ReadState:
    """Sequential detection and readahead window of one open handle."""

    window: ReadaheadWindow
    last_end: int = 0  # a first read at offset 0 counts as sequential
    last_block: int = -1


@dataclass(slots=True)
class ReadStats:
    read_requests: int = 0
    read_bytes: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    fetched_bytes: int = 0
    gets: int = 0
    verify_failures: int = 0
    uncached_blocks: int = 0
    #: block hits served from each tier (index = tier); memory hits not counted
    tier_hit_blocks: list[int] = dataclasses.field(default_factory=list)


class BlockCache:
    def __init__(
        self,
        meta: MetaDB,
        store: ObjectStore,
        tiers: list[Tier],
        space: SpaceManager,
        *,
        block_size: int,
        readahead_max: int,
        fetch_concurrency: int,
        write_space_timeout: float = 60.0,
        read_origin: Callable[[Inode], tuple[str, str]] | None = None,
        on_space_pressure: Callable[[], Awaitable[None]] = _nothing,
        on_idle: Callable[[int], None] | None = None,
        on_damage: Callable[[int, int, int, str], None] | None = None,
        on_slow_tier_read: Callable[[int, int], None] | None = None,
        revalidate_origin: Callable[[int], Awaitable[Inode | None]] | None = None,
    ) -> None:
        """The callbacks reach back up to the file system (TierFS passes them):

        * ``read_origin``: the key (and ETag for If-Match, if known) to read
          an inode's origin bytes from right now;
        * ``on_space_pressure``: ask the uploader to hurry (space is short);
        * ``on_idle``: called with an inode number once nothing uses its
          CachedFile any more (no handle, no upload, no fetch in flight);
        * ``on_damage``: (ino, blockno, tier, during) when a dirty block
          failed its checksum (see "Dirty-block digests");
        * ``on_slow_tier_read``: (ino, tier) when a read was served from a
          tier other than the first (the lifecycle may promote the file).
          O(1), on the read path;
        * ``revalidate_origin``: a GET's If-Match failed (the object changed
          since it was listed or last checked): HEAD it now.  Returns the
          new inode if the content changed (its cached blocks are already
          dropped, see ``content_changed``), None if not.
        """
        self.meta = meta
        self.store = store
        self.tiers = tiers
        self.space = space
        self.block_size = block_size
        self.max_window = max(1, readahead_max // block_size)
        #: Fetch slots: held by the task of each GET (see "Priority").
        self.slots = FetchSlots(fetch_concurrency)
        #: The GET threads (a task holds a fetch slot while its thread runs).
        self._fetch_threads = trio.CapacityLimiter(fetch_concurrency)
        self._fetch_hop = ThreadHop(fetch_concurrency, name="tierfs-fetch")
        self._thread_buffers = threading.local()
        #: (ino, blockno) -> (pooled buffer, valid bytes) of blocks just fetched.
        self._recent: collections.OrderedDict[tuple[int, int], tuple[mmap.mmap, int]] = (
            collections.OrderedDict()
        )
        self.recent_max = max(readahead_max, 16 * block_size)
        self.max_run_blocks = max(1, FETCH_RUN_BYTES // block_size)
        self.background_run_blocks = max(1, BACKGROUND_RUN_BYTES // block_size)
        self.trickle_run_blocks = max(1, BACKGROUND_TRICKLE_BYTES // block_size)
        # Recent blocks plus a full readahead window in flight.
        self.buffers = BlockBuffers(block_size, keep=2 * (self.recent_max // block_size))
        self.io_limiter = trio.CapacityLimiter(4)
        self.files: dict[int, CachedFile] = {}
        self.write_space_timeout = write_space_timeout
        self.read_origin: Callable[[Inode], tuple[str, str]] = read_origin or (
            lambda i: (i.origin_key, i.etag)
        )
        self.on_space_pressure = on_space_pressure
        self.on_idle: Callable[[int], None] = on_idle or (lambda ino: None)
        self.on_damage: Callable[[int, int, int, str], None] = on_damage or (
            lambda ino, b, t, during: None
        )
        self._verified: set[tuple[int, int]] = set()
        self.on_slow_tier_read: Callable[[int, int], None] = on_slow_tier_read or (
            lambda ino, tier: None
        )
        self.revalidate_origin = revalidate_origin
        self.stats = ReadStats(tier_hit_blocks=[0] * len(tiers))
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

    def new_read_state(self) -> ReadState:
        """Readahead state for a new handle (see :mod:`tierfs.core.readahead`)."""
        return ReadState(
            ReadaheadWindow(min_window=2 * self.max_run_blocks, max_window=self.max_window)
        )

    # --- CachedFile lifetime -------------------------------------------------------

    def acquire(self, inode: Inode, blocks: dict[int, BlockRecord] | None = None) -> CachedFile:
        """The CachedFile of ``inode`` (created from LMDB on first use).

        ``blocks``: the file's block map as LMDB holds it now, read by the
        caller in the transaction that read ``inode`` (``TierFS.open``:
        ``MetaDB.get_inode_and_blocks``) with no await since; used only
        when the CachedFile is created here, else read now."""
        cf = self.files.get(inode.ino)
        if cf is None:
            if blocks is None:
                blocks = self.meta.get_blocks(inode.ino)
            cf = CachedFile(inode, blocks)
            self.files[inode.ino] = cf
        cf.refs += 1
        return cf

    def release(self, cf: CachedFile) -> None:
        cf.refs -= 1
        if cf.refs == 0 and not cf.flights:
            self._close(cf)

    def _close(self, cf: CachedFile) -> None:
        for fd in cf.fds.values():
            os.close(fd)
        cf.fds.clear()
        for direct in cf.direct_fds.values():
            if direct is not None:
                os.close(direct)
        cf.direct_fds.clear()
        self._forget_recent(cf.ino)
        if self.files.get(cf.ino) is cf:
            del self.files[cf.ino]
            self.on_idle(cf.ino)

    def is_busy(self, ino: int) -> bool:
        return ino in self.files

    def live_inode(self, ino: int) -> Inode | None:
        """The in-memory inode of a file in use (open, or with a fetch or an
        upload in flight): while it exists it, not LMDB, is the truth."""
        cf = self.files.get(ino)
        return cf.inode if cf is not None else None

    def content_changed(self, ino: int, tiers: list[int], inode: Inode | None) -> None:
        """The bucket's object changed (or vanished): LMDB already forgot the blocks.

        A busy file keeps its cache files (open fds point at them), empties
        them and forgets its block map; an idle file's cache files are deleted.
        """
        cf = self.files.get(ino)
        self._verified = {v for v in self._verified if v[0] != ino}
        self._forget_recent(ino)
        if cf is not None:
            cf.generation += 1
            cf.blocks.clear()
            cf.transient.clear()
            cf.hashers.clear()
            cf.contended.update(cf.writing)
            for fd in cf.fds.values():
                os.ftruncate(fd, 0)
            if inode is not None:
                cf.inode = inode
            return
        for tier in tiers:
            self.tiers[tier].remove_file(ino)

    def mark_verified(self, ino: int, blockno: int) -> None:
        self._verified.add((ino, blockno))

    def forget_verified(self, ino: int, blocknos: Iterable[int]) -> None:
        """These blocks moved: check each again on its first read."""
        for blockno in blocknos:
            self._verified.discard((ino, blockno))

    def drop_cache_file(self, cf: CachedFile, tier: int) -> None:
        """Delete ``cf``'s cache file on ``tier``, which no block record names
        any more, and close its fds (a later block placed there starts a
        new file).  Only when nothing else is using those fds."""
        self.close_cache_fds(cf, tier)
        self.tiers[tier].remove_file(cf.ino)

    @staticmethod
    def close_cache_fds(cf: CachedFile, tier: int) -> None:
        """Close ``cf``'s fds on ``tier`` (the next use opens the file again)."""
        for fds in (cf.fds, cf.direct_fds):
            fd = fds.pop(tier, None)
            if fd is not None:
                os.close(fd)

    def _direct_fd(self, cf: CachedFile, tier: int) -> int | None:
        if tier not in cf.direct_fds:
            self._fd(cf, tier)  # creates the cache file
            cf.direct_fds[tier] = self.tiers[tier].open_direct(cf.ino)
        return cf.direct_fds[tier]

    def _aligned_buffer(self, size: int) -> mmap.mmap:
        """A page-aligned buffer of this thread, for O_DIRECT writes."""
        buf: mmap.mmap | None = getattr(self._thread_buffers, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._thread_buffers.buf = mmap.mmap(-1, max(size, self.block_size))
        return buf

    def _remember(self, ino: int, blockno: int, buf: mmap.mmap, nbytes: int) -> None:
        """Keep a block just fetched (written past the page cache) in its
        pooled buffer, for the reads that follow it; bounded by
        ``recent_max`` bytes.  Evicted buffers go back to the pool."""
        key = (ino, blockno)
        self._forget_recent(ino, [blockno])
        self._recent[key] = (buf, nbytes)
        while len(self._recent) * self.block_size > self.recent_max:
            _, (evicted, _n) = self._recent.popitem(last=False)
            self.buffers.give(evicted)

    def _forget_recent(self, ino: int, blocknos: Iterable[int] | None = None) -> None:
        keys = (
            [k for k in self._recent if k[0] == ino]
            if blocknos is None
            else [(ino, b) for b in blocknos]
        )
        for key in keys:
            old = self._recent.pop(key, None)
            if old is not None:
                self.buffers.give(old[0])

    def _ready(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> bool:
        """May this present block be served without a check?  Yes once it
        was verified; a dirty block also while it has no digest yet, or
        while a write of it is in flight (the writer's bytes, half landed)."""
        if (cf.ino, blockno) in self._verified:
            return True
        return rec.dirty and (not rec.sealed or blockno in cf.writing)

    def _fd(self, cf: CachedFile, tier: int) -> int:
        fd = cf.fds.get(tier)
        if fd is None:
            fd = self.tiers[tier].open_file(cf.ino, create=True)
            assert fd is not None
            cf.fds[tier] = fd
        return fd

    # --- reads -----------------------------------------------------------------------

    async def read(
        self, cf: CachedFile, offset: int, size: int, state: ReadState
    ) -> bytes | memoryview:
        """Bytes ``[offset, offset+size)`` of the file, clipped at its end.

        A memoryview is a loan of a recent block's buffer (see
        :mod:`tierfs.core.buffers`): use it before the next ``await``."""
        end = min(offset + size, cf.size)
        if offset >= end:
            return b""
        self.stats.read_requests += 1
        self.stats.read_bytes += end - offset
        bs = self.block_size
        first, last = offset // bs, (end - 1) // bs
        self._update_readahead(cf, state, offset, end, first, last)
        size_before, generation = cf.size, cf.generation
        for attempt in range(3):
            await self._ensure(cf, range(first, last + 1))
            if cf.generation != generation:  # the object changed (e.g. If-Match failed)
                generation = cf.generation
                if cf.size > size_before:
                    # The kernel clips this read at the size it was told:
                    # an error, not the new bytes cut at the old size.
                    raise StoreError(
                        f"{cf.key} grew in the bucket since it was opened: open it again",
                        errno=errno.ESTALE,
                    )
                size_before = cf.size
                end = min(offset + size, cf.size)
                if offset >= end:
                    return b""
                last = (end - 1) // bs
                continue
            data = self._assemble(cf, offset, end, first, last)
            if data is not None:
                return data
            log.debug("blocks of inode %d vanished during read, retry %d", cf.ino, attempt)
        raise StoreError(f"{cf.key}: blocks kept disappearing during the read")

    def _assemble(
        self, cf: CachedFile, offset: int, end: int, first: int, last: int
    ) -> bytes | memoryview | None:
        """Bytes [offset, end) from present blocks; None if one is missing."""
        bs = self.block_size
        pieces: list[bytes | memoryview] = []
        run_tier, run_start, pos = -1, offset, offset
        for blockno in range(first, last + 1):
            rec = cf.blocks.get(blockno)
            block_end = min(end, (blockno + 1) * bs)
            recent = self._recent.get((cf.ino, blockno)) if rec is not None else None
            if recent is not None and not rec.dirty:
                if run_tier >= 0:
                    pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier = -1
                buf, valid = recent
                base = blockno * bs
                if block_end - base <= valid:
                    pieces.append(memoryview(buf)[pos - base : block_end - base])
                else:  # the file grew since the fetch: zeros after the fetched bytes
                    piece = bytes(memoryview(buf)[pos - base : max(pos - base, valid)])
                    pieces.append(piece + bytes(block_end - pos - len(piece)))
                self.stats.hit_blocks += 1
            elif rec is not None and self._ready(cf, blockno, rec):
                if rec.tier != run_tier:
                    if run_tier >= 0:
                        pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier, run_start = rec.tier, pos
                self.stats.hit_blocks += 1
                self.stats.tier_hit_blocks[rec.tier] += 1
            else:
                if rec is not None:
                    return None  # present, but not checked yet: the caller ensures again
                if run_tier >= 0:
                    pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier = -1
                if blockno * bs >= cf.inode.origin_size:
                    pieces.append(bytes(block_end - pos))  # a hole
                    pos = block_end
                    continue
                buf = cf.transient.get(blockno)
                if buf is None:
                    return None
                pieces.append(buf[pos - blockno * bs : block_end - blockno * bs])
            pos = block_end
        if run_tier >= 0:
            pieces.append(self._pread(cf, run_tier, run_start, pos))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _pread(self, cf: CachedFile, tier: int, start: int, end: int) -> bytes:
        if tier:
            self.on_slow_tier_read(cf.ino, tier)
        return pread_padded(self._fd(cf, tier), end - start, start)

    async def _ensure(self, cf: CachedFile, blocknos: Iterable[int]) -> None:
        """Make every block present and verified (or transient)."""
        waits: list[_Flight] = []
        absent: list[int] = []
        for blockno in blocknos:
            if blockno in cf.transient:
                continue
            rec = cf.blocks.get(blockno)
            if rec is None and blockno * self.block_size >= cf.inode.origin_size:
                continue  # a hole
            if rec is not None and self._ready(cf, blockno, rec):
                continue
            if rec is None and blockno not in cf.flights:
                absent.append(blockno)
            else:
                waits.append(self._start_flight(cf, blockno))
        waits += self._start_fetches(cf, absent)
        await self._wait_flights(cf, waits)

    async def _wait_flights(self, cf: CachedFile, waits: Iterable[_Flight]) -> None:
        """Wait for ``waits``; the first that failed raises its error."""
        for flight in set(waits):
            await flight.done.wait()
            if flight.error is not None:
                err = flight.error
                if isinstance(err, TierfsError):
                    raise type(err)(str(err), errno=err.errno) from err
                raise StoreError(f"{cf.key}: {err}") from err

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
        waits: list[_Flight] = []
        absent: list[int] = []
        for blockno in blocknos:
            if blockno in cf.blocks or blockno * self.block_size >= cf.inode.origin_size:
                continue
            flight = cf.flights.get(blockno)
            if flight is not None:
                self._raise_priority(flight, priority)
                waits.append(flight)
            else:
                absent.append(blockno)
        waits += self._start_fetches(cf, absent, tier, priority=priority)
        await self._wait_flights(cf, waits)

    def _raise_priority(self, flight: _Flight, priority: FetchPriority) -> None:
        """``flight`` is needed at ``priority`` too (a lower value is more urgent)."""
        if priority < flight.priority:
            flight.priority = priority
            self.slots.priority_raised()

    def _start_flight(self, cf: CachedFile, blockno: int) -> _Flight:
        """The flight of a block a demand read needs (one of lower priority
        is promoted: see "Priority")."""
        flight = cf.flights.get(blockno)
        if flight is not None:
            self._raise_priority(flight, FetchPriority.DEMAND)
            return flight
        flight = cf.flights[blockno] = _Flight()
        assert self._nursery is not None, "BlockCache.start() was not called"
        self._nursery.start_soon(self._run_flight, cf, blockno, flight)
        return flight

    def _start_fetches(
        self,
        cf: CachedFile,
        blocknos: list[int],
        tier: int | None = None,
        *,
        priority: FetchPriority = FetchPriority.DEMAND,
    ) -> list[_Flight]:
        """Fetch absent blocks, consecutive ones together: one ranged GET per
        run of up to ``max_run_blocks`` (fewer, larger requests cost the
        store and us less CPU per byte than one GET per block); up to
        ``background_run_blocks`` for a BACKGROUND fetch (see "Priority")."""
        longest = (
            self.background_run_blocks
            if priority is FetchPriority.BACKGROUND
            else self.max_run_blocks
        )
        flights: list[_Flight] = []
        run: list[int] = []
        for blockno in sorted(blocknos):
            if run and (blockno != run[-1] + 1 or len(run) >= longest):
                flights.append(self._start_run(cf, run, tier, priority))
                run = []
            run.append(blockno)
        if run:
            flights.append(self._start_run(cf, run, tier, priority))
        return flights

    def _start_run(
        self,
        cf: CachedFile,
        run: list[int],
        tier: int | None = None,
        priority: FetchPriority = FetchPriority.DEMAND,
    ) -> _Flight:
        flight = _Flight(priority)
        for blockno in run:
            cf.flights[blockno] = flight
        assert self._nursery is not None, "BlockCache.start() was not called"
        self._nursery.start_soon(self._run_fetch_flight, cf, run, flight, tier)
        return flight

    async def _run_fetch_flight(
        self, cf: CachedFile, run: list[int], flight: _Flight, tier: int | None = None
    ) -> None:
        try:
            await self._fetch(cf, run, tier, flight)
        except Exception as exc:
            flight.error = exc
            if not isinstance(exc, TierfsError):
                log.exception("fetching blocks %d-%d of %r failed", run[0], run[-1], cf.key)
        finally:
            for blockno in run:
                if cf.flights.get(blockno) is flight:
                    del cf.flights[blockno]
            flight.done.set()
            if cf.refs == 0 and not cf.flights:
                self._close(cf)

    async def _run_flight(self, cf: CachedFile, blockno: int, flight: _Flight) -> None:
        try:
            rec = cf.blocks.get(blockno)
            if rec is not None and rec.dirty:
                await self._verify_dirty(cf, blockno, rec)
            else:
                if rec is not None and not await self._verify(cf, blockno, rec):
                    rec = None
                if rec is None:
                    await self._fetch(cf, [blockno])
        except Exception as exc:
            flight.error = exc
            if not isinstance(exc, TierfsError):
                log.exception("fetching block %d of %r failed", blockno, cf.key)
        finally:
            del cf.flights[blockno]
            flight.done.set()
            if cf.refs == 0 and not cf.flights:
                self._close(cf)

    async def _hash_block(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> int:
        fd = self._fd(cf, rec.tier)
        return await trio.to_thread.run_sync(
            read_and_hash, fd, blockno * self.block_size, rec.nbytes, limiter=self.io_limiter
        )

    def _changed_since(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> bool:
        """Was block ``blockno`` rewritten (or is a write of it in flight)
        since its record was ``rec``?  Then a check of ``rec`` means nothing."""
        return cf.blocks.get(blockno) is not rec or blockno in cf.writing

    async def _verify(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> bool:
        """Check a clean block cached by an earlier mount (or moved) against
        its digest.  False: it was damaged, and is dropped (to be refetched)."""
        digest = await self._hash_block(cf, blockno, rec)
        if self._changed_since(cf, blockno, rec):
            return True  # rewritten meanwhile: the writer's bytes are the truth
        if digest == rec.digest:
            self._verified.add((cf.ino, blockno))
            return True
        self.stats.verify_failures += 1
        log.error(
            "checksum mismatch in cached block %d of %r on tier %s: refetching it",
            blockno,
            cf.key,
            self.tiers[rec.tier].name,
        )
        self.drop_damaged_clean(cf, blockno)
        return False

    def drop_damaged_clean(self, cf: CachedFile, blockno: int) -> None:
        """Forget a clean block that failed its checksum (it is refetched
        when needed) and re-derive the file's share of the tier accounting."""
        self.meta.drop_block_list(cf.ino, [blockno])
        self.meta.recount_residency(cf.ino)
        cf.blocks.pop(blockno, None)
        self._verified.discard((cf.ino, blockno))
        self._forget_recent(cf.ino, [blockno])

    async def _verify_dirty(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> None:
        """Check a sealed dirty block against its digest; BlockDamaged if it
        fails (it is the only copy: it stays, and the file is failed)."""
        if not rec.sealed:
            return
        digest = await self._hash_block(cf, blockno, rec)
        if self._changed_since(cf, blockno, rec):
            return  # rewritten meanwhile: the new bytes have no digest yet
        if digest == rec.digest:
            self._verified.add((cf.ino, blockno))
            return
        self.stats.verify_failures += 1
        self.on_damage(cf.ino, blockno, rec.tier, "a read")
        raise BlockDamaged(
            f"inode {cf.ino}: block {blockno} (written here, not uploaded yet) failed "
            "its checksum on the tier",
            blockno=blockno,
            dirty=True,
        )

    async def _get_in_thread(
        self,
        flight: _Flight | None,
        key: str,
        etag: str,
        offset: int,
        length: int,
        lengths: list[int],
        files: list[_CacheFiles | None],
    ) -> list[tuple[int, bytes, mmap.mmap | None]]:
        """``_get_and_store`` in a thread, holding a fetch slot meanwhile
        (taken at the priority of ``flight``; None: DEMAND).  At debug
        level, a demand fetch logs how long it waited for its slot, for the
        thread (GET, write, hash) and for the loop to take the result."""
        asked = time.perf_counter()
        taken = await self.slots.take(
            (lambda: flight.priority) if flight is not None else _demand_priority,
            short=length <= SHORT_FETCH_BYTES,
        )
        try:
            stop: Callable[[], bool] | None = None
            if taken is FetchPriority.BACKGROUND and flight is not None:
                if self.slots.demand_active():  # the trickle: a short GET
                    lengths = lengths[: self.trickle_run_blocks]
                    files = files[: self.trickle_run_blocks]
                    length = min(length, sum(lengths))
                else:  # gives way when demand comes
                    stop = functools.partial(self._background_gives_way, flight)
            started = time.perf_counter()
            async with self._fetch_threads:
                results, thread_done = await self._fetch_hop.run(
                    functools.partial(
                        self._timed_get_and_store, key, etag, offset, length, lengths, files, stop
                    )
                )
            if taken is FetchPriority.DEMAND and log.isEnabledFor(logging.DEBUG):
                back = time.perf_counter()
                log.debug(
                    "demand GET %s @%d+%d: slot %.1f ms, thread %.1f ms, loop %.1f ms; running %s",
                    key,
                    offset,
                    length,
                    1e3 * (started - asked),
                    1e3 * (thread_done - started),
                    1e3 * (back - thread_done),
                    self.slots.running,
                )
            return results
        finally:
            self.slots.give(taken)

    def _background_gives_way(self, flight: _Flight) -> bool:
        """Thread (``stop`` of a BACKGROUND GET, asked between two blocks):
        end the GET here?  Yes while a demand fetch waits or runs, unless a
        demand read joined this very flight."""
        return flight.priority is FetchPriority.BACKGROUND and self.slots.demand_present()

    def _timed_get_and_store(
        self,
        key: str,
        etag: str,
        offset: int,
        length: int,
        lengths: list[int],
        files: list[_CacheFiles | None],
        stop: Callable[[], bool] | None = None,
    ) -> tuple[list[tuple[int, bytes, mmap.mmap | None]], float]:
        """Thread: ``_get_and_store``, and when it ended."""
        results = self._get_and_store(key, etag, offset, length, lengths, files, stop)
        return results, time.perf_counter()

    async def _fetch(
        self, cf: CachedFile, run: list[int], tier: int | None = None, flight: _Flight | None = None
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
        flight: _Flight | None,
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
                key, etag = self.read_origin(cf.inode)
                results = await self._get_in_thread(
                    flight, key, etag, offset, from_origin, lengths, files
                )
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
                    self._remember(cf.ino, blockno, kept, nbytes)
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
                if new is not None and self.files.get(cf.ino) is cf:
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
        self._verified.add((cf.ino, blockno))
        # The file's only block (a small file): its bytes on the tier are known.
        self.space.block_added(
            cf.ino, tier, nbytes if len(cf.blocks) == 1 else None, used=cf.opened
        )

    def _get_and_store(
        self,
        key: str,
        etag: str,
        offset: int,
        length: int,
        lengths: list[int],
        files: list[_CacheFiles | None],
        stop: Callable[[], bool] | None = None,
    ) -> list[tuple[int, bytes, mmap.mmap | None]]:
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

            got = self.store.get_range_into(
                key, offset, views, etag or None, stop=None if stop is None else stop_here
            )
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
                direct = target.direct_fd() if nbytes % _DIRECT_ALIGN == 0 else None
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

    # --- writes -----------------------------------------------------------------------------

    async def write(self, cf: CachedFile, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset`` into the cache files; the caller has
        already marked the file dirty.  Nothing is written if space cannot be
        found (NoSpace), so a failed write never leaves a torn block."""
        if not data:
            return 0
        bs = self.block_size
        end = offset + len(data)
        first, last = offset // bs, (end - 1) // bs
        origin = cf.inode.origin_size
        rmw = sorted(
            b
            for b in {first, last}
            if b not in cf.blocks
            and b * bs < origin
            and not (offset <= b * bs and end >= min((b + 1) * bs, origin))
        )
        # A present block that keeps some of its bytes is checked first, if
        # it has not been: new bytes must not be built on damaged ones (the
        # next seal would give the damage a valid digest).
        rmw += sorted(
            b
            for b in {first, last}
            if b in cf.blocks
            and not self._ready(cf, b, cf.blocks[b])
            and not (offset <= b * bs and end >= min((b + 1) * bs, cf.inode.size))
        )
        if rmw:
            await self._ensure(cf, rmw)
        for blockno in range(first, last + 1):
            if blockno not in cf.blocks:
                # A file with no block yet (a new one) has no bytes on any
                # tier: the eviction tracker need not read its residency.
                file_bytes = None if cf.blocks else 0
                tier = await self._reserve_for_write(bs, cf.ino, cf.fenced_tier, file_bytes)
                cf.reserved[blockno] = (tier, bs)
                cf.blocks[blockno] = BlockRecord(tier=tier, digest=0, nbytes=0, dirty=True)
        hashers = self._begin_writes(cf, offset, end)
        written = False
        try:
            view = memoryview(data)
            pos = offset
            direct: list[tuple[int, memoryview, int, BlockHasher | None]] = []
            while pos < end:
                blockno = pos // bs
                chunk_end = min(end, (blockno + 1) * bs)
                tier = cf.blocks[blockno].tier
                chunk = view[pos - offset : chunk_end - offset]
                direct_fd = (
                    self._direct_fd(cf, tier)
                    if len(chunk) >= DIRECT_WRITE_MIN
                    and pos % _DIRECT_ALIGN == 0
                    and len(chunk) % _DIRECT_ALIGN == 0
                    else None
                )
                if direct_fd is not None:
                    direct.append((direct_fd, chunk, pos, hashers[blockno]))
                else:
                    pwrite_all(self._fd(cf, tier), chunk, pos)
                    hasher = hashers[blockno]
                    if hasher is not None:
                        hasher.update(chunk, bs)
                pos = chunk_end
            if direct:
                await trio.to_thread.run_sync(self._pwrite_direct, direct, limiter=self.io_limiter)
            written = True
        finally:
            self._end_writes(cf, hashers if written else dict.fromkeys(hashers))
        old_size = cf.inode.size
        new_size = max(old_size, end)
        touched = set(range(first, last + 1))
        if new_size > old_size and old_size:
            touched.add((old_size - 1) // bs)  # the old last block grows (with zeros)
        self._mark_dirty_blocks(cf, touched, new_size)
        self._forget_recent(cf.ino, touched)
        cf.inode.size = new_size
        cf.version += 1
        cf.inode_dirty = True
        return len(data)

    def _begin_writes(self, cf: CachedFile, offset: int, end: int) -> dict[int, BlockHasher | None]:
        """Register a write of ``[offset, end)`` as in flight; per block, the
        running digest it extends (None: it cannot, see the module docstring)."""
        bs = self.block_size
        out: dict[int, BlockHasher | None] = {}
        for blockno in range(offset // bs, (end - 1) // bs + 1):
            start = max(offset, blockno * bs) - blockno * bs
            hasher: BlockHasher | None = cf.hashers.pop(blockno, None)
            if blockno in cf.writing:
                hasher = None  # two writes in flight: their order on disk is unknown
                cf.contended.add(blockno)
            elif start == 0:
                hasher = BlockHasher()
            elif hasher is not None and not hasher.extends(start):
                hasher = None
            cf.writing[blockno] = cf.writing.get(blockno, 0) + 1
            out[blockno] = hasher
        return out

    @staticmethod
    def _end_writes(cf: CachedFile, hashers: dict[int, BlockHasher | None]) -> None:
        """The write registered by ``_begin_writes`` is done: its running
        digests are adopted unless another write overlapped it."""
        for blockno, hasher in hashers.items():
            left = cf.writing[blockno] - 1
            if left:
                cf.writing[blockno] = left
            else:
                del cf.writing[blockno]
            if blockno in cf.contended:
                if not left:
                    cf.contended.discard(blockno)
            elif hasher is not None:
                cf.hashers[blockno] = hasher

    async def truncate(self, cf: CachedFile, new_size: int) -> None:
        bs = self.block_size
        old_size = cf.inode.size
        # Bytes of the block holding the new end change (cut, or zeros that
        # were past the end): running digests from there on no longer hold.
        first_changed = min(old_size, new_size) // bs
        for blockno in [b for b in cf.hashers if b >= first_changed]:
            del cf.hashers[blockno]
        cf.contended.update(b for b in cf.writing if b >= first_changed)
        if new_size < old_size:
            first_gone = (new_size + bs - 1) // bs
            for blockno in [b for b in cf.blocks if b >= first_gone]:
                del cf.blocks[blockno]
                cf.uncommitted.discard(blockno)
                self._release_reservation(cf, blockno)
                self._verified.discard((cf.ino, blockno))
            cf.transient.clear()
            cf.truncated_from = min(first_gone, cf.truncated_from or first_gone)
            # Bytes past the new end must read as zeros if the file grows again.
            for tier in self.tiers:
                fd = self._fd_if_exists(cf, tier.index)
                if fd is not None and os.fstat(fd).st_size > new_size:
                    os.ftruncate(fd, new_size)
            cf.inode.origin_size = min(cf.inode.origin_size, new_size)
            touched = {(new_size - 1) // bs} if new_size % bs else set()
        else:
            touched = {(old_size - 1) // bs} if old_size else set()
        self._mark_dirty_blocks(cf, {b for b in touched if b in cf.blocks}, new_size)
        self._forget_recent(cf.ino)
        cf.inode.size = new_size
        cf.version += 1
        cf.inode_dirty = True

    def _mark_dirty_blocks(self, cf: CachedFile, blocknos: Iterable[int], size: int) -> None:
        bs = self.block_size
        for blockno in blocknos:
            rec = cf.blocks.get(blockno)
            if rec is None:
                continue
            nbytes = max(0, min(bs, size - blockno * bs))
            cf.blocks[blockno] = BlockRecord(tier=rec.tier, digest=0, nbytes=nbytes, dirty=True)
            cf.uncommitted.add(blockno)
            self._verified.discard((cf.ino, blockno))  # new bytes: checked after their seal

    def _pwrite_direct(self, writes: list[tuple[int, memoryview, int, BlockHasher | None]]) -> None:
        """Thread: aligned writes through O_DIRECT fds, via an aligned buffer;
        each chunk also feeds its block's running digest, if any."""
        for fd, chunk, offset, hasher in writes:
            buf = self._aligned_buffer(len(chunk))
            buf[: len(chunk)] = chunk
            pwrite_all(fd, memoryview(buf)[: len(chunk)], offset)
            if hasher is not None:
                hasher.update(memoryview(buf)[: len(chunk)], self.block_size)

    async def _reserve_for_write(
        self, nbytes: int, ino: int, avoid: int | None = None, file_bytes: int | None = None
    ) -> int:
        """A tier for a new dirty block; waits for uploads to free space.

        Dirty data is never evicted, so when every tier is full of it the
        writer waits (backpressure) while ``on_space_pressure`` asks the
        uploader to hurry; after ``write_space_timeout`` it gives up with
        ENOSPC.  ``file_bytes``: the file's bytes on the tier, when the
        caller knows them (``SpaceManager.block_added``).
        """
        deadline = trio.current_time() + self.write_space_timeout
        while True:
            tier = self.space.reserve(nbytes, ino=ino, avoid=avoid)
            if tier is not None:
                self.space.block_added(ino, tier, file_bytes)
                return tier
            if trio.current_time() >= deadline:
                raise NoSpace("no tier has room for new data, and nothing can be freed")
            await self.on_space_pressure()
            await trio.sleep(0.05)

    def _release_reservation(self, cf: CachedFile, blockno: int) -> None:
        tier_bytes = cf.reserved.pop(blockno, None)
        if tier_bytes is not None:
            self.space.release(*tier_bytes)

    def _fd_if_exists(self, cf: CachedFile, tier: int) -> int | None:
        fd = cf.fds.get(tier)
        if fd is None:
            fd = self.tiers[tier].open_file(cf.ino, create=False)
            if fd is not None:
                cf.fds[tier] = fd
        return fd

    async def sync_data(self, cf: CachedFile) -> None:
        """fdatasync every cache file of ``cf`` (in a thread)."""
        for fd in list(cf.fds.values()):
            await trio.to_thread.run_sync(os.fdatasync, fd, limiter=self.io_limiter)

    async def seal(self, cf: CachedFile) -> None:
        """Record the digest of each uncommitted dirty block (see "Dirty-block
        digests"): from its running digest if that covers the whole block,
        else by reading it back once (in a thread).  The caller commits right
        after, with no await in between; a block written meanwhile stays
        unsealed."""
        reread: list[tuple[int, BlockRecord]] = []
        for blockno in sorted(cf.uncommitted):
            rec = cf.blocks.get(blockno)
            if rec is None or not rec.dirty or rec.sealed or blockno in cf.writing:
                continue
            hasher = cf.hashers.get(blockno)
            if hasher is not None and hasher.length == rec.nbytes:
                cf.blocks[blockno] = dataclasses.replace(rec, digest=hasher.result(), sealed=True)
            else:
                reread.append((blockno, rec))
        if not reread:
            return
        bs = self.block_size
        jobs = [(self._fd(cf, rec.tier), blockno * bs, rec.nbytes) for blockno, rec in reread]
        digests = await trio.to_thread.run_sync(
            lambda: [read_and_hash(*job) for job in jobs], limiter=self.io_limiter
        )
        for (blockno, rec), digest in zip(reread, digests, strict=True):
            if not self._changed_since(cf, blockno, rec):
                cf.blocks[blockno] = dataclasses.replace(rec, digest=digest, sealed=True)
                # Hashed from the tier just now: as verified as a first read.
                self._verified.add((cf.ino, blockno))

    def commit_records(self, cf: CachedFile, tx: MetaTxn) -> None:
        """Write uncommitted block changes into ``tx`` (the caller's
        transaction, which also writes the inode and the journal)."""
        if cf.truncated_from is not None:
            tx.drop_blocks_from(cf.ino, cf.truncated_from)
        for blockno in sorted(cf.uncommitted):
            rec = cf.blocks.get(blockno)
            if rec is not None:
                tx.add_block(cf.ino, blockno, rec)

    def committed(self, cf: CachedFile) -> None:
        """After the caller's transaction committed: release reservations."""
        for blockno in list(cf.uncommitted):
            self._release_reservation(cf, blockno)
        cf.uncommitted.clear()
        cf.truncated_from = None
        cf.inode_dirty = False

    # --- upload support ---------------------------------------------------------------------

    async def make_local(self, cf: CachedFile) -> None:
        """Fetch every block that still lives only in the origin object."""
        bs = self.block_size
        nblocks = (min(cf.inode.origin_size, cf.inode.size) + bs - 1) // bs
        for start in range(0, nblocks, 64):
            await self._ensure(cf, range(start, min(nblocks, start + 64)))

    def upload_source(self, cf: CachedFile, parts_in_flight: int) -> UploadSource:
        """A thread-safe reader of the file's current bytes, for the uploader,
        pooling ``parts_in_flight`` + 1 part buffers; close it after the upload.

        Built on the loop: it snapshots the block map and opens the fds, so
        the worker threads touch no shared state but the fds (which stay
        open: the caller holds a reference to ``cf``)."""
        blocks = {b: (self._fd(cf, rec.tier), rec.nbytes) for b, rec in cf.blocks.items()}
        expected = {
            b: (rec.digest, rec.nbytes, rec.dirty)
            for b, rec in cf.blocks.items()
            if rec.checkable and b not in cf.writing
        }
        return UploadSource(
            self.block_size, cf.inode.size, blocks, expected, max_buffers=parts_in_flight + 1
        )

    # --- readahead -------------------------------------------------------------------------

    def _update_readahead(
        self, cf: CachedFile, state: ReadState, offset: int, end: int, first: int, last: int
    ) -> None:
        bs = self.block_size
        if abs(offset - state.last_end) > bs:  # a seek: start over
            state.window.restart()
            state.last_end, state.last_block = end, last
            return
        state.last_end = max(end, state.last_end)
        if last <= state.last_block:  # still in a block we already planned for
            return
        state.last_block = last
        window = state.window.enter_block(time.monotonic())
        # A sequential reader is past this block: give its buffer to the next
        # fetch instead of mapping a new one (the kernel's page cache has the
        # bytes; two blocks back, for reads that arrive a little out of order).
        self._forget_recent(cf.ino, [first - 2])
        nblocks = (cf.size + bs - 1) // bs
        window_end = min(last + 1 + window, nblocks)
        # Cached blocks are read ahead (WILLNEED, first-read checks) as far as
        # readahead_max whatever the window: that costs page cache, not
        # GETs, and keeps a deep queue on the tier's disk.
        ahead_end = min(last + 1 + self.max_window, nblocks) if cf.blocks else window_end
        run_tier, run_start, run_end = -1, 0, 0
        absent: list[int] = []
        for blockno in range(last + 1, ahead_end):
            if blockno in cf.flights or blockno in cf.transient:
                continue
            rec = cf.blocks.get(blockno)
            if rec is not None and self._ready(cf, blockno, rec):
                # Cached: let the kernel read it into the page cache ahead of
                # us, so the inline pread later does not wait for the disk.
                if rec.tier == run_tier and run_end == blockno * bs:
                    run_end += rec.nbytes
                    continue
                self._advise_willneed(cf, run_tier, run_start, run_end)
                run_tier, run_start, run_end = rec.tier, blockno * bs, blockno * bs + rec.nbytes
                continue
            if rec is None:
                if blockno < window_end and blockno * bs < cf.inode.origin_size:
                    absent.append(blockno)
            else:
                self._start_flight(cf, blockno)  # cached by an earlier mount: verify
        self._advise_willneed(cf, run_tier, run_start, run_end)
        if (
            absent
            and window >= 2 * self.max_run_blocks
            and absent[-1] == window_end - 1
            and window_end < nblocks
        ):
            # The window's far end grows by a block or two per read: hold the
            # trailing run back until it makes one full-size GET.
            tail = 1
            while tail < len(absent) and absent[-tail - 1] == absent[-tail] - 1:
                tail += 1
            if tail % self.max_run_blocks:
                absent = absent[: len(absent) - tail % self.max_run_blocks]
        self._start_fetches(cf, absent)

    def _advise_willneed(self, cf: CachedFile, tier: int, start: int, end: int) -> None:
        if tier >= 0 and end > start:
            os.posix_fadvise(self._fd(cf, tier), start, end - start, os.POSIX_FADV_WILLNEED)
