"""The data-movement API: where a file's blocks are, and moving them.

Everything that moves data on purpose (the lifecycle mover, preload,
prefetch, promotion, the ``evict`` and ``pin`` commands) calls this module;
none of them touches block maps or tier files.  Four operations, after
JuiceFS's Check/Fill/EvictCache and mountpoint-s3's multilevel cache:

* ``check(ino)``: where each block of the file is (``FileResidency``);
  ``residency(ino)``: its bytes per tier, from memory; ``inode(ino)``: the
  file as it is now (the open one's in-memory inode, else LMDB's).
* ``fill(ino, tier)``: fetch absent blocks of the file into a tier (or the
  normal placement).  It shares in-flight fetches with demand reads (one
  ``Flight`` per block, see ``fetcher``): a reader waiting for a block
  that a fill is fetching waits for that fetch, and the other way round.
  ``fill_range`` does the same and also says whether the range is all
  resident afterwards, from the block map in memory (preload needs no
  second look at LMDB per small file).
* ``relocate(ino, src, dst)``: move every block of the file that is on
  ``src`` to ``dst``.
* ``evict(ino, tier)``: drop clean local copies.  It raises ``Busy`` for a
  file it must not touch (see below) and never returns 0 for that reason:
  a caller can name what it skipped.  The emergency eviction of
  ``SpaceManager`` drops blocks through the same function (``SpaceManager.drop_clean``), so
  there is one place that drops blocks.

Relocate, step by step (``src``/``dst`` are tier indexes):

1. Refuse (``Busy``) a file open for writing, with an upload running, or
   with writes not committed yet (uncommitted blocks, a truncate, a write
   in flight).  Skip blocks the file records as damaged (``failed``): they
   stay where they are.
2. Reserve the bytes on ``dst`` through ``SpaceManager.reserve_on``; no room
   raises ``NoSpace`` and nothing changes.  While the relocate runs, no new
   block of the file is placed on ``dst`` (``CachedFile.fenced_tier``):
   the copy writes at the offsets of the blocks it moves, and a block
   fetched or written there meanwhile would be overwritten by the copy.
3. COPY, in a thread, in chunks of whole blocks (``COPY_CHUNK``), by a
   ``BlockCopier``: each block is read from the ``src`` cache file, hashed
   and written at the same offset of the ``dst`` cache file (one sparse
   file per inode per tier, so a whole-file relocate copies the present
   blocks to the same offsets), in pieces of ``COPY_PIECE`` (256 KiB)
   through one buffer that stays in the CPU cache: the hash and the write
   read what the read just put there.  The digest is therefore the xxh3 of
   exactly the bytes written to ``dst``.  Why pieces: an 8 MiB
   buffer makes the read, the hash and the write each go through main
   memory (measured against ``cp``: ``docs/benchmarks.md``, "Copying
   between tiers", with what was tried and left out).  Before
   each chunk, ``await throttle(nbytes)`` lets the caller cap the bandwidth
   (before, not after: several copies sharing one cap then take turns, and
   their chunks do not reach the disk at once).  The first chunk's thread
   call also opens the two cache files (after the page cache was dropped a
   path lookup reads the disk, and the event loop must not wait for it), so
   a small file costs one thread call.  Up to ``COPY_THREADS`` copies run
   at once (parallel reads keep the source device's queue full).
4. VERIFY: every block whose record carries a digest (clean, or dirty and
   sealed) must hash to it.  A clean block that does not is damaged: it is
   dropped (fetched again on its next read) and not moved.  A dirty block
   that does not is the only copy: the file becomes ``failed``
   (``on_damage``) and the relocate fails with ``BlockDamaged``; nothing
   moves.  An unsealed dirty block (no digest) is copied as it is.  If a
   dirty block moves, ``dst`` is fdatasynced before the switch.
5. SWITCH, on the loop with no await between the check and the
   transaction: if the file's content did not change during the copy (its
   ``generation`` and ``version``, and every moved block's record is the
   one copied), still no writer and no upload: every moved block's record
   is rewritten with ``tier = dst`` (digest, dirty and sealed flags carried
   over) and the per-tier accounting moves with it (``MetaTxn.add_block``),
   in ONE LMDB write transaction.  If a dirty block moved, it is committed
   and synced at once; otherwise it joins the metadata group and reaches
   the disk with the next group commit (``COMMIT_INTERVAL``, MetaDB "Group
   commit"): a commit is an fdatasync, and one per file kept the event loop
   busy when small files moved.  Step 6 never runs before that commit.
   Otherwise the relocate fails with ``Busy``,
   the copy on ``dst`` is discarded, nothing changes.  Moved blocks are
   verified again on their first read from ``dst`` (as every block is after a
   move between tiers: ``blockcache``: a block is checked on its first read in a mount).
6. DELETE the old copy: if no block of the file is left on ``src`` and
   nothing else uses the file, its ``src`` cache file is deleted, in a
   thread and in the background (one task started by ``start``, which
   unlinks whatever queued up meanwhile in one thread call after one wait
   for the group commit; a task per file polling the commit count cost the
   loop about 10% of its time when small files moved): an unlink frees
   extents and reads the disk (0.2-0.5 s for 256 MiB here), and the caller
   need not wait for it to start its next move.  Until the unlink is done,
   the task holds a reference to the file's CachedFile (so it counts as
   busy) and ``src`` is the file's fenced tier: a block fetched or written
   meanwhile goes elsewhere, never into the file being unlinked.  The
   unlink waits for the commit of the switch (step 5).  Otherwise the moved
   ranges are punched out of it (``Tier.punch_hole``), before ``relocate``
   returns, after committing the switch if no commit did yet; unless a
   reader outside the daemon holds that file (``leases``): its bytes then
   stay, unindexed, until the file is dropped.

Crash safety (kill -9 at any point; states as LMDB has them after the
last commit, and the cache files):

* before 5 committed: every block's record names ``src``, whose bytes are
  untouched: the file reads as before.  ``dst`` holds bytes no record
  names.  If no block of the file was on ``dst`` before, the ``dst`` cache
  file has no residency on that tier and the orphan cleanup of the next
  mount (``Upkeep._remove_orphan_cache_files``) deletes it.  If some were,
  the file is kept (it holds indexed blocks) and the copied bytes sit at
  offsets no record names: never served, overwritten by a later fetch or
  write of those blocks, freed when the file is dropped.
* 5 committed, before 6: every moved record names ``dst``, whose bytes were
  written (and fsynced, for dirty ones) before the commit.  Each block has
  ONE record (the block map is keyed by ino and block number), so no block
  is ever indexed on two tiers.  ``src`` holds bytes no record names: if no
  block is left on ``src`` (the whole-file case), the orphan cleanup deletes
  the ``src`` file at the next mount; otherwise those bytes are unindexed
  space until the file is dropped.  Nothing is punched before the switch
  is committed, so no record ever names punched bytes.
* after 6: done.

The orphan cleanup deletes a cache file only when the file has no block
recorded on that tier: a ``dst`` file that holds switched blocks is never
deleted, whatever happened to the rest of the file.

Concurrency: the checks of step 5 and the transaction run with no await in
between, so they are atomic with respect to other trio tasks.  Readers may
read the file during a relocate: until the switch they read ``src``, after
it ``dst`` (the CachedFile's block map is updated with the records).  The
relocate holds a reference to the file's CachedFile, so the file counts as
busy (no emergency eviction, no orphan cleanup) while it runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from tierfs.errors import (
    BlockDamaged,
    Busy,
    InvalidArgument,
    IsADirectory,
    NoSpace,
    NotFound,
    StoreError,
)
from tierfs.meta import BlockRecord, Inode, MetaDB
from tierfs.tiers import Tier, pwrite_all

from ..read.fetcher import Fetcher
from ..read.sharedtier import SharedOrigin, WarmPace
from ..state.digests import BlockHasher, block_digest
from ..state.fetch_slots import FetchPriority
from ..state.journal import Journal
from ..state.openfiles import CachedFile, OpenFiles
from ..state.space import SpaceManager

log = logging.getLogger(__name__)

#: A relocate copies (and throttles) this many bytes per thread call, in
#: whole blocks (at least one).
COPY_CHUNK = 8 * 1024 * 1024

#: ... each block read, hashed and written in pieces of this many bytes
#: (``BlockCopier``).
COPY_PIECE = 256 * 1024

#: Threads that copy, sync and delete for relocates at once (the mover runs
#: up to this many small moves at once: parallel reads keep the source
#: device's queue full, see ``workers.mover``).
COPY_THREADS = 16

#: A fill asks the block cache for this many blocks at a time, so that a
#: huge file does not start every fetch at once (memory stays bounded by
#: ``fetch.concurrency`` either way; this bounds the bookkeeping).
FILL_BATCH = 64

#: Seconds between two looks at whether the group commit that holds a
#: switch has run (it runs every ``COMMIT_INTERVAL``, 0.2 s).
SWITCH_COMMIT_POLL = 0.02
#: Seconds a relocate waits for a fence on its file to go (``_wait_unfenced``):
#: several group commits (``COMMIT_INTERVAL``).
FENCE_WAIT = 5.0

#: ``await throttle(nbytes)`` before each copied chunk: a caller's bandwidth cap.
Throttle = Callable[[int], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class BlockPlace:
    blockno: int
    tier: int
    dirty: bool


@dataclass(frozen=True, slots=True)
class FileResidency:
    ino: int
    size: int
    blocks_total: int
    bytes_per_tier: dict[int, int]
    dirty_bytes: int
    blocks: list[BlockPlace]
    #: Blocks that hold bytes of the bucket's object (past them, a file
    #: extended here has holes or local blocks): what a fill can fetch.
    origin_blocks: int = 0


@dataclass(frozen=True, slots=True)
class FillOutcome:
    """What ``DataMovement.fill_range`` did."""

    #: Bytes that became resident (fetched by this fill, or by a demand
    #: read it shared a fetch with).
    nbytes: int
    #: Is every block of the range that holds origin bytes resident now?
    complete: bool
    #: Bytes of the range that were resident already when the fill began.
    present: int = 0


@dataclass(frozen=True, slots=True)
class _OldCopy:
    """A ``src`` cache file to unlink once the switch is on disk (step 6)."""

    cf: CachedFile
    tier: int
    #: ``MetaDB.commits`` before the switch: it is on disk once past this.
    switched_before: int


def _remove_files(files: list[tuple[Tier, int]]) -> None:
    """Thread: delete the cache file of each ``(tier, ino)``; a failure is
    logged (the file then has no residency on that tier: the orphan cleanup
    of the next mount deletes it)."""
    for tier, ino in files:
        try:
            tier.remove_file(ino)
        except OSError as exc:
            log.warning(
                "could not delete the old copy of inode %d on tier %s: %s", ino, tier.name, exc
            )


def _created(fd: int | None) -> int:
    assert fd is not None  # ``Tier.open_file(create=True)`` returns a file
    return fd


class BlockCopier:
    """The thread side of one relocate's copy: ``copy`` runs in a thread
    (one call at a time), ``close`` on the loop once no call runs.

    The first ``copy`` opens the two cache files (``open_src`` may return
    None: no cache file, every block reads as zeros; ``open_dst`` creates
    it), so a file whose blocks fit in one chunk costs one thread call.
    Each block is read, hashed and written in pieces of ``COPY_PIECE``
    bytes through one buffer of this copier, small enough to stay in the
    CPU cache: the hash and the write read the bytes the read just put
    there, not main memory.  The digest is the xxh3 of exactly the bytes
    written to ``dst`` (bytes past the end of the ``src`` cache file are
    zeros, as a read of them returns, and are written as zeros)."""

    __slots__ = ("_buffer", "_open_dst", "_open_src", "_opened", "dst_fd", "src_fd")

    def __init__(self, open_src: Callable[[], int | None], open_dst: Callable[[], int]) -> None:
        self._open_src = open_src
        self._open_dst = open_dst
        self._opened = False
        self.src_fd: int | None = None
        self.dst_fd: int | None = None
        self._buffer = memoryview(bytearray(COPY_PIECE))

    def _open(self) -> None:
        self._opened = True
        self.src_fd = self._open_src()
        self.dst_fd = self._open_dst()

    def copy(self, jobs: list[tuple[int, int]]) -> list[int]:
        """Thread: copy each ``(offset, nbytes)`` block to the same offset of
        the ``dst`` cache file; the xxh3 of each block."""
        if not self._opened:
            self._open()
        if self.src_fd is None:  # no cache file at all: every block reads as zeros
            return [block_digest(bytes(n)) for _o, n in jobs]
        assert self.dst_fd is not None
        return [self._copy_block(offset, nbytes) for offset, nbytes in jobs]

    def _copy_block(self, offset: int, nbytes: int) -> int:
        assert self.src_fd is not None and self.dst_fd is not None
        hasher = BlockHasher()
        pos, end = offset, offset + nbytes
        while pos < end:
            piece = self._buffer[: min(COPY_PIECE, end - pos)]
            got = 0
            while got < len(piece):
                n = os.preadv(self.src_fd, [piece[got:]], pos + got)
                if n == 0:  # past the end of the cache file: zeros
                    piece[got:] = bytes(len(piece) - got)
                    break
                got += n
            hasher.update(piece, nbytes)
            pwrite_all(self.dst_fd, piece, pos)
            pos += len(piece)
        return hasher.result()

    def close(self) -> None:
        for fd in (self.src_fd, self.dst_fd):
            if fd is not None:
                os.close(fd)
        self.src_fd = self.dst_fd = None


def _background() -> FetchPriority:
    return FetchPriority.BACKGROUND


class DataMovement:
    def __init__(
        self,
        meta: MetaDB,
        tiers: list[Tier],
        open_files: OpenFiles,
        fetcher: Fetcher,
        space: SpaceManager,
        journal: Journal,
        *,
        open_for_writing: Callable[[int], bool],
        on_damage: Callable[[int, int, int, str], None],
        copy_chunk: int = COPY_CHUNK,
        held_elsewhere: Callable[[Inode], Awaitable[bool]] | None = None,
    ) -> None:
        """``held_elsewhere(inode)``: does another cache on this node hold
        the whole file at its version, to be read in place (``read.lender``)?
        A fill of such a file fetches nothing."""
        self.held_elsewhere = held_elsewhere
        self.meta = meta
        self.tiers = tiers
        self.open_files = open_files
        self.fetcher = fetcher
        self.on_damage = on_damage
        self.space = space
        self.journal = journal
        self._open_for_writing = open_for_writing
        self.block_size = fetcher.block_size
        self.copy_chunk = max(copy_chunk, self.block_size)
        #: Threads of copies, syncs and deletes (several relocates may run at once).
        self.io_limiter = trio.CapacityLimiter(COPY_THREADS)
        #: Bytes moved between tiers by ``relocate`` (for status).
        self.relocated_bytes = 0
        #: Old copies waiting for ``_delete_old_copies`` (see step 6).
        self._old_copies: list[_OldCopy] = []
        self._old_copies_queued = trio.Event()
        self._deleting_in_background = False

    def start(self, nursery: trio.Nursery) -> None:
        """Delete old copies in ``nursery`` from now on (see step 6)."""
        self._deleting_in_background = True
        nursery.start_soon(self._delete_old_copies)

    def inode(self, ino: int) -> Inode | None:
        """The file as it is now: the in-memory inode of a file in use, else
        LMDB's (None: no such inode)."""
        return self.open_files.live_inode(ino) or self.meta.get_inode(ino)

    def residency(self, ino: int) -> dict[int, int]:
        """The file's bytes on each tier (tier -> bytes), from memory."""
        return self.meta.residency(ino)

    def hold(self, ino: int) -> CachedFile | None:
        """Keep the file's open state (its block map and cache-file fds)
        alive until ``let_go``, so that an open soon after finds it ready
        (None: not a regular file any more)."""
        inode = self.inode(ino)
        if inode is None or not inode.is_file:
            return None
        return self.open_files.acquire(inode)

    def let_go(self, cf: CachedFile) -> None:
        """The end of a ``hold``."""
        self.open_files.release(cf)

    # --- helpers -----------------------------------------------------------------------

    def _file(self, ino: int) -> Inode:
        inode = self.inode(ino)
        if inode is None:
            raise NotFound(f"inode {ino}")
        if inode.is_dir:
            raise IsADirectory(f"inode {ino} is a directory")
        if not inode.is_file:
            raise InvalidArgument(f"inode {ino} is not a regular file")
        return inode

    def _check_tier(self, tier: int) -> None:
        if not 0 <= tier < len(self.tiers):
            raise InvalidArgument(f"no tier {tier}")

    def _block_map(self, ino: int) -> dict[int, BlockRecord]:
        """The file's block map: the open CachedFile's, or LMDB's."""
        cf = self.open_files.files.get(ino)
        return dict(cf.blocks) if cf is not None else self.meta.get_blocks(ino)

    def _nblocks(self, size: int) -> int:
        return (size + self.block_size - 1) // self.block_size

    # --- check ---------------------------------------------------------------------------

    def check(self, ino: int) -> FileResidency:
        """Where each present block of the file is (blocks still only in the
        bucket, and holes, are not listed)."""
        inode = self._file(ino)
        places: list[BlockPlace] = []
        per_tier: dict[int, int] = {}
        dirty = 0
        for blockno, rec in sorted(self._block_map(ino).items()):
            places.append(BlockPlace(blockno, rec.tier, rec.dirty))
            per_tier[rec.tier] = per_tier.get(rec.tier, 0) + rec.nbytes
            if rec.dirty:
                dirty += rec.nbytes
        return FileResidency(
            ino=ino,
            size=inode.size,
            blocks_total=self._nblocks(inode.size),
            bytes_per_tier=per_tier,
            dirty_bytes=dirty,
            blocks=places,
            origin_blocks=self._nblocks(min(inode.size, inode.origin_size)),
        )

    # --- fill ----------------------------------------------------------------------------

    async def fill(
        self,
        ino: int,
        tier: int | None = None,
        *,
        blocks: range | None = None,
        priority: FetchPriority = FetchPriority.BACKGROUND,
    ) -> int:
        """Fetch the absent blocks of the file (all, or those in ``blocks``)
        into ``tier`` (None: the normal placement; a tier without room also
        falls back to it, and with no room anywhere a block is not kept).
        ``priority``: BACKGROUND (preload, pins, promotion) or AHEAD (just
        ahead of a reader), see :mod:`tierfs.core.state.fetch_slots`.
        Returns the bytes that became resident (fetched by this fill, or by
        a demand read it shared a fetch with).  Of a file with changes not
        uploaded yet, fetched blocks are recorded with the file's next
        commit, as for a demand read (see ``Fetcher._store_fetched``)."""
        return (await self.fill_range(ino, tier, blocks=blocks, priority=priority)).nbytes

    async def fill_range(
        self,
        ino: int,
        tier: int | None = None,
        *,
        blocks: range | None = None,
        priority: FetchPriority = FetchPriority.BACKGROUND,
    ) -> FillOutcome:
        """``fill``, and whether the range is all resident afterwards (from
        the block map in memory: a caller such as preload needs no second
        look at LMDB per file)."""
        inode = self._file(ino)
        if tier is not None:
            self._check_tier(tier)
        if (
            self.held_elsewhere is not None
            and blocks is None
            and not self.meta.residency(ino)
            and await self.held_elsewhere(inode)
        ):
            # Read in place from there (a snapshot mount's live mount): a
            # second copy would only take room.
            return FillOutcome(nbytes=0, complete=True, present=inode.size)
        cf = self.open_files.acquire(inode)
        try:
            nblocks = self._nblocks(min(cf.inode.origin_size, cf.inode.size))
            candidates = blocks if blocks is not None else range(nblocks)
            wanted = [b for b in candidates if 0 <= b < nblocks and b not in cf.blocks]
            present = sum(
                cf.blocks[b].nbytes for b in candidates if 0 <= b < nblocks and b in cf.blocks
            )
            for start in range(0, len(wanted), FILL_BATCH):
                await self.fetcher.fill(cf, wanted[start : start + FILL_BATCH], tier, priority)
            nblocks = self._nblocks(min(cf.inode.origin_size, cf.inode.size))
            return FillOutcome(
                nbytes=sum(cf.blocks[b].nbytes for b in wanted if b in cf.blocks),
                complete=all(b in cf.blocks for b in candidates if 0 <= b < nblocks),
                present=present,
            )
        finally:
            self.open_files.release(cf)

    async def fill_shared(self, ino: int, blocks: range | None = None) -> FillOutcome:
        """Make the file's blocks (all, or those in ``blocks``) present in
        the shared tier, filling no local tier (``SharedOrigin.warm``): a
        BACKGROUND fetch, which waits for a fetch slot as preload does.
        ``nbytes``: bytes fetched from the bucket and put; ``present``: bytes
        the shared tier held (or another node was putting) already."""
        origin = self.fetcher.origin
        if not isinstance(origin, SharedOrigin):
            raise InvalidArgument("this mount has no shared tier")
        inode = self._file(ino)
        key, etag = origin.locate(inode)
        if not origin.shares(inode):
            raise InvalidArgument(f"{key}: a share = false rule keeps it out of the shared tier")
        if not etag:
            raise StoreError(f"{key}: its ETag is not known yet (a rename is on its way)")
        nblocks = self._nblocks(inode.origin_size)
        wanted = (
            range(nblocks)
            if blocks is None
            else range(max(0, blocks.start), min(nblocks, blocks.stop))
        )
        slots = self.fetcher.slots

        async def take() -> tuple[object, bool]:
            taken = await slots.take(_background)
            return taken, slots.demand_active()

        # Each GET of the warm takes its own BACKGROUND slot, from the
        # warm's thread: rule 4 of the slots (a trickle while demand reads
        # are active, a GET that gives way) applies to it as to a local fill.
        pace = WarmPace(
            take=lambda: trio.from_thread.run(take),
            give=lambda taken: trio.from_thread.run_sync(slots.give, taken),
            stop=slots.demand_present,
        )
        fetched, present = await trio.to_thread.run_sync(
            origin.warm, key, etag, inode.origin_size, wanted, pace
        )
        return FillOutcome(nbytes=fetched, complete=True, present=present)

    # --- evict ---------------------------------------------------------------------------

    def busy_reason(self, ino: int) -> str | None:
        """Why the file's local copies must not be dropped now, or None."""
        return self.open_files.busy_reason(ino)

    def evict(self, ino: int, tier: int | None = None) -> int:
        """Drop the clean local copies of the file (from ``tier``, or every
        tier); returns the bytes dropped.  Dirty blocks are never dropped.
        A busy file (open, a fetch or an upload in flight, changes not
        uploaded) raises ``Busy`` and nothing is dropped."""
        self._file(ino)
        if tier is not None:
            self._check_tier(tier)
        reason = self.busy_reason(ino)
        if reason is not None:
            raise Busy(f"inode {ino} is busy: {reason}")
        return self.space.drop_clean(ino, tier)

    # --- relocate ------------------------------------------------------------------------

    def _refuse_if_busy(self, cf: CachedFile) -> None:
        ino = cf.ino
        if self._open_for_writing(ino):
            raise Busy(f"inode {ino} is open for writing")
        if self.journal.uploading(ino):
            raise Busy(f"inode {ino} is being uploaded")
        if cf.writing or cf.uncommitted or cf.truncated_from is not None:
            raise Busy(f"inode {ino} has writes not committed yet")

    async def relocate(
        self, ino: int, src: int, dst: int, *, throttle: Throttle | None = None
    ) -> int:
        """Move every block of the file that is on tier ``src`` to ``dst``
        (see the module docstring); returns the bytes moved.  Raises
        ``Busy`` (nothing changed) for a file open for writing, being
        uploaded, or changed during the copy; ``NoSpace`` if ``dst`` has no
        room; ``BlockDamaged`` if a dirty block failed its checksum."""
        self._check_tier(src)
        self._check_tier(dst)
        if src == dst:
            raise InvalidArgument("relocate: source and destination are the same tier")
        inode = self._file(ino)
        cf = self.open_files.acquire(inode)
        try:
            return await self._relocate(cf, src, dst, throttle)
        finally:
            self.open_files.release(cf)

    async def _relocate(self, cf: CachedFile, src: int, dst: int, throttle: Throttle | None) -> int:
        await self._wait_unfenced(cf)
        self._refuse_if_busy(cf)
        damaged = set(self.meta.failed_blocks(cf.ino))
        plan = [
            (blockno, rec)
            for blockno, rec in sorted(cf.blocks.items())
            if rec.tier == src and blockno not in damaged
        ]
        if not plan:
            return 0
        total = sum(rec.nbytes for _b, rec in plan)
        if not self.space.reserve_on(dst, total):
            raise NoSpace(
                f"tier {self.tiers[dst].name} has no room for {total} bytes of inode {cf.ino}"
            )
        generation, version = cf.generation, cf.version
        dst_had_file = any(rec.tier == dst for rec in cf.blocks.values()) or dst in cf.fds
        cf.fenced_tier = dst
        switched = False
        src_tier, dst_tier, ino = self.tiers[src], self.tiers[dst], cf.ino
        copier = BlockCopier(
            lambda: src_tier.open_file(ino, create=False),
            lambda: _created(dst_tier.open_file(ino, create=True)),
        )
        try:
            moved = await self._copy_and_verify(cf, plan, copier, throttle)
            if any(rec.dirty for _b, rec in moved) and copier.dst_fd is not None:
                await trio.to_thread.run_sync(os.fdatasync, copier.dst_fd, limiter=self.io_limiter)
            # --- no await from here to the end of the switch (atomic on the loop) ---
            self._refuse_if_busy(cf)
            if (
                cf.generation != generation
                or cf.version != version
                or any(cf.blocks.get(b) is not rec for b, rec in moved)
            ):
                raise Busy(f"inode {cf.ino} changed while it was relocated")
            switched_before = self._switch(cf, moved, dst)
            switched = True
        finally:
            self.space.release(dst, total)
            cf.fenced_tier = None
            copier.close()
            if not switched and not dst_had_file:
                self._discard_copy(cf, dst)
        nbytes = sum(rec.nbytes for _b, rec in moved)
        self.relocated_bytes += nbytes
        await self._delete_old_copy(cf, src, [b for b, _rec in moved], switched_before)
        return nbytes

    async def _wait_unfenced(self, cf: CachedFile) -> None:
        """Wait (at most ``FENCE_WAIT`` seconds) until no other relocate of
        the file and no unlink of its old copy (step 6) holds a tier fenced:
        a promotion asked for by the first read after a demotion comes while
        that demotion's old copy waits for the group commit, and must not be
        dropped for it.  ``Busy`` if the fence outlasts the wait."""
        if cf.fenced_tier is None:
            return
        with trio.move_on_after(FENCE_WAIT):
            while cf.fenced_tier is not None:
                await trio.sleep(SWITCH_COMMIT_POLL)
        if cf.fenced_tier is not None:
            raise Busy(f"inode {cf.ino} is being relocated already")

    async def _copy_and_verify(
        self,
        cf: CachedFile,
        plan: list[tuple[int, BlockRecord]],
        copier: BlockCopier,
        throttle: Throttle | None,
    ) -> list[tuple[int, BlockRecord]]:
        """Copy the planned blocks chunk by chunk; the blocks that passed
        their check (or had no digest to check).  A clean block that failed
        is dropped; a dirty one fails the relocate (``BlockDamaged``)."""
        bs = self.block_size
        per_chunk = max(1, self.copy_chunk // bs)
        moved: list[tuple[int, BlockRecord]] = []
        for start in range(0, len(plan), per_chunk):
            chunk = plan[start : start + per_chunk]
            jobs = [(blockno * bs, rec.nbytes) for blockno, rec in chunk]
            if throttle is not None:  # before the copy: concurrent copies take turns
                await throttle(sum(n for _o, n in jobs))
            digests = await trio.to_thread.run_sync(copier.copy, jobs, limiter=self.io_limiter)
            for (blockno, rec), digest in zip(chunk, digests, strict=True):
                if not rec.checkable or digest == rec.digest:
                    moved.append((blockno, rec))
                    continue
                if cf.blocks.get(blockno) is not rec:
                    continue  # rewritten meanwhile: the switch check refuses the move
                self._block_failed(cf, blockno, rec, src_tier=rec.tier)
        return moved

    def _block_failed(self, cf: CachedFile, blockno: int, rec: BlockRecord, src_tier: int) -> None:
        self.open_files.stats.verify_failures += 1
        if not rec.dirty:
            log.error(
                "checksum mismatch in cached block %d of inode %d on tier %s while moving it: "
                "dropped, it is fetched again",
                blockno,
                cf.ino,
                self.tiers[src_tier].name,
            )
            self.open_files.drop_damaged_clean(cf, blockno)
            return
        self.on_damage(cf.ino, blockno, src_tier, "a move between tiers")
        raise BlockDamaged(
            f"inode {cf.ino}: block {blockno} (written here, not uploaded yet) failed its "
            "checksum on the tier; the file is not moved",
            blockno=blockno,
            dirty=True,
        )

    def _switch(self, cf: CachedFile, moved: list[tuple[int, BlockRecord]], dst: int) -> int:
        """Point the moved blocks at ``dst``: one LMDB transaction (see step 5
        for when it is committed).  Returns ``MetaDB.commits`` before it: the
        switch is on disk once ``commits`` is past that."""
        commits_before = self.meta.commits
        new = [(blockno, dataclasses.replace(rec, tier=dst)) for blockno, rec in moved]
        with self.meta.write() as tx:
            for blockno, rec in new:
                tx.add_block(cf.ino, blockno, rec)
        for blockno, rec in new:
            cf.blocks[blockno] = rec
        self.open_files.forget_verified(cf.ino, [b for b, _r in new])
        # The eviction bookkeeping follows the bytes (``SpaceManager``).
        src = moved[0][1].tier
        self.space.block_added(cf.ino, dst, used=cf.opened)
        if not any(rec.tier == src for rec in cf.blocks.values()):
            self.space.left(cf.ino, src)
        if any(rec.dirty for _b, rec in new):
            self.meta.sync()
        return commits_before

    def _discard_copy(self, cf: CachedFile, dst: int) -> None:
        """The relocate failed: delete the ``dst`` cache file it created,
        unless something placed a block there meanwhile."""
        if any(rec.tier == dst for rec in cf.blocks.values()) or dst in cf.fds:
            return
        self.tiers[dst].remove_file(cf.ino)

    async def _unlink_old_copies(self, batch: list[_OldCopy]) -> None:
        """Unlink the ``src`` cache files of ``batch`` once the switches are on
        disk, in one thread call; then unfence and release each file."""
        try:
            switched_before = max(old.switched_before for old in batch)
            while self.meta.commits <= switched_before:  # a switch is not on disk yet
                await trio.sleep(SWITCH_COMMIT_POLL)
            files = [(self.tiers[old.tier], old.cf.ino) for old in batch]
            await trio.to_thread.run_sync(_remove_files, files, limiter=self.io_limiter)
        finally:
            for old in batch:
                old.cf.fenced_tier = None
                self.open_files.release(old.cf)

    async def _delete_old_copies(self) -> None:
        """Background (``start``): unlink the queued old copies, all that
        queued up during the last batch in the next one (one wait for the
        group commit and one thread call for many small files).  Stopped,
        it leaves what is queued to the orphan cleanup of the next mount."""
        try:
            while True:
                if not self._old_copies:
                    await self._old_copies_queued.wait()
                    self._old_copies_queued = trio.Event()
                    continue
                batch, self._old_copies = self._old_copies, []
                await self._unlink_old_copies(batch)
        finally:
            self._deleting_in_background = False
            for old in self._old_copies:
                old.cf.fenced_tier = None
                self.open_files.release(old.cf)
            self._old_copies = []

    async def _delete_old_copy(
        self, cf: CachedFile, src: int, moved: Iterable[int], switched_before: int
    ) -> None:
        """After the switch: free the moved blocks' bytes on ``src``."""
        left_on_src = any(rec.tier == src for rec in cf.blocks.values())
        if not left_on_src and cf.refs == 1 and not cf.flights and cf.fenced_tier is None:
            # Nobody else has it open.  Fenced, so that nothing places a
            # block in the file while the thread unlinks it.
            self.open_files.close_cache_fds(cf, src)
            cf.fenced_tier = src
            self.open_files.acquire(cf.inode)  # the unlink's own reference
            old = _OldCopy(cf, src, switched_before)
            if self._deleting_in_background:
                self._old_copies.append(old)
                self._old_copies_queued.set()
            else:
                await self._unlink_old_copies([old])
            return
        if self.open_files.leases.leased(src, cf.ino):
            # A reader holds this file: its bytes stay (unindexed space
            # until the file is dropped), never punched under the reader.
            return
        if self.meta.commits <= switched_before:
            self.meta.commit()  # nothing is punched before the switch is on disk
        fd = self.tiers[src].open_file(cf.ino, create=False)
        if fd is None:
            return
        bs = self.block_size
        ranges = [(b * bs, bs) for b in moved]
        try:
            await trio.to_thread.run_sync(
                lambda: [Tier.punch_hole(fd, off, n) for off, n in ranges],
                limiter=self.io_limiter,
            )
        finally:
            os.close(fd)
