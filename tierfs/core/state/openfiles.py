"""The open-file table: the in-memory state of the files in use.

``CachedFile`` is the state of one inode while it is open or has a fetch
or an upload in flight: the live ``Inode`` (size, origin, sync state), its
block map (loaded from LMDB once), the fds of its cache files, the flights
(fetches and checks) of its blocks and the writes not yet committed.

Invariants:

* While a CachedFile exists it, not LMDB, is the truth about the file
  (``live_inode``); ``Sync`` commits it back.
* One CachedFile per inode at most (``files``).  It lives while it has a
  reference (``acquire``/``release``: a handle, an upload, a data
  movement) or a flight; the last of those to end closes its fds and
  calls the ``idle_listeners`` (an unlinked file is deleted then).
* A busy CachedFile is never evicted (``is_busy``), so its fds always name
  the live cache files.  Nor is a file with changes not uploaded yet
  (``busy_reason``: the one check the emergency eviction and the
  data-movement API both use).  A part that deletes or replaces a cache file
  closes the fds first (``close_cache_fds``).
* A block is served without a check only once it was verified in this
  mount (``mark_verified``; a block moved between tiers or rewritten is
  forgotten again), or while it is dirty with no digest yet or a write of
  it is in flight (``ready``).  The verified set outlives the CachedFile:
  a block is checked once per mount.
* Recent blocks (``recent``, :class:`tierfs.core.state.buffers.RecentBlocks`)
  hold the pooled buffers of blocks just fetched; a file's are given back
  when it closes or its content changes.

State of one CachedFile: created by the first ``acquire`` -> busy (refs
or flights) -> idle (no ref, no flight): closed and forgotten.  The
content may change under it (``content_changed``: the bucket's object
changed) which bumps ``generation`` so late fetches of the old content are
dropped, not recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio

from tierfs.errors import StoreError, TierfsError
from tierfs.meta import BlockRecord, Inode, MetaDB, SyncState
from tierfs.tiers import Tier

from .buffers import RecentBlocks
from .digests import BlockHasher
from .fetch_slots import FetchPriority
from .journal import Journal
from .leases import ReaderLeases


class Flight:
    """One fetch or check of one block (or a run of blocks), shared by all
    who wait for it."""

    __slots__ = ("done", "error", "priority")

    def __init__(self, priority: FetchPriority = FetchPriority.DEMAND) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        #: The most urgent of those waiting for it; it only rises
        #: (see :mod:`tierfs.core.read.fetcher`, "Priority").
        self.priority = priority


@dataclass(slots=True)
class CachedFile:
    inode: Inode
    blocks: dict[int, BlockRecord]
    generation: int = 0  # bumped when the origin changes under us
    version: int = 0  # bumped by every change of content
    refs: int = 0
    fds: dict[int, int] = field(default_factory=dict)
    flights: dict[int, Flight] = field(default_factory=dict)
    transient: dict[int, bytes] = field(default_factory=dict)
    direct_fds: dict[int, int | None] = field(default_factory=dict)
    uncommitted: set[int] = field(default_factory=set)  # dirty blocks not yet in LMDB
    reserved: dict[int, tuple[int, int]] = field(default_factory=dict)  # block -> tier, bytes
    truncated_from: int | None = None  # first block dropped by a truncate, not yet committed
    inode_dirty: bool = False  # size/times changed since the last commit
    #: Running digests of dirty blocks written in order (see ``blockwrites``).
    hashers: dict[int, BlockHasher] = field(default_factory=dict)
    #: block -> writes of it in flight (their bytes may be half on the tier).
    writing: dict[int, int] = field(default_factory=dict)
    #: Blocks that two writes were in flight for at once: no running digest.
    contended: set[int] = field(default_factory=set)
    #: A tier on which no new block of the file may be placed now: the one a
    #: relocate is copying the file to, or the one whose old copy it is
    #: deleting (see ``tierfs.core.tiering.movement``).
    fenced_tier: int | None = None
    #: A handle opened the file while this CachedFile lived: blocks stored
    #: now are that open's use, not a fetch nobody asked for yet
    #: (``SpaceManager.block_added(used=...)``).
    opened: bool = False
    #: Fds of cache files replaced under the file (``OpenFiles.unshare``,
    #: ``content_changed``): a thread may still be using one, so they are
    #: closed with the file, not when replaced.
    retired_fds: list[int] = field(default_factory=list)
    #: Set while ``OpenFiles.unshare`` copies a leased tier file: no byte
    #: of the file changes until it is done.
    unsharing: trio.Event | None = None

    @property
    def ino(self) -> int:
        return self.inode.ino

    @property
    def size(self) -> int:
        return self.inode.size

    @property
    def key(self) -> str:
        return self.inode.origin_key

    def changed_since(self, blockno: int, rec: BlockRecord) -> bool:
        """Was block ``blockno`` rewritten (or is a write of it in flight)
        since its record was ``rec``?  Then a check of ``rec`` means nothing."""
        return self.blocks.get(blockno) is not rec or blockno in self.writing


class OpenFiles:
    """The CachedFiles in use, their cache-file fds, and which blocks were
    checked in this mount (see the module docstring)."""

    def __init__(
        self,
        meta: MetaDB,
        tiers: list[Tier],
        recent: RecentBlocks,
        journal: Journal,
        leases: ReaderLeases | None = None,
    ) -> None:
        self.meta = meta
        self.tiers = tiers
        self.recent = recent
        self.journal = journal
        #: Tier files handed out to readers outside the daemon.
        self.leases = leases if leases is not None else ReaderLeases(tiers)
        self.files: dict[int, CachedFile] = {}
        self.stats = ReadStats(tier_hit_blocks=[0] * len(tiers))
        #: Called with an inode number once nothing uses its CachedFile any
        #: more (no reference, no flight).
        self.idle_listeners: list[Callable[[int], None]] = []
        self._verified: set[tuple[int, int]] = set()

    # --- lifetime -----------------------------------------------------------------------

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
        self.close_if_idle(cf)

    def close_if_idle(self, cf: CachedFile) -> None:
        """Close ``cf`` if nothing uses it any more (after a release, or
        after one of its flights ended)."""
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
        for fd in cf.retired_fds:
            os.close(fd)
        cf.retired_fds.clear()
        self.recent.forget(cf.ino)
        if self.files.get(cf.ino) is cf:
            del self.files[cf.ino]
            for listener in self.idle_listeners:
                listener(cf.ino)

    def is_busy(self, ino: int) -> bool:
        return ino in self.files

    def busy_reason(self, ino: int) -> str | None:
        """Why the file's local copies must not be dropped now, or None."""
        if self.is_busy(ino):
            return "it is open or has a fetch or an upload in flight"
        if self.journal.pending_upload(ino):
            return "it has changes not uploaded yet"
        inode = self.meta.get_inode(ino)
        if inode is not None and inode.state != SyncState.CLEAN:
            return "it has changes not uploaded yet"
        return None

    def not_evictable(self, ino: int) -> bool:
        """The emergency eviction's skip (``busy_reason`` gives a reason)."""
        return self.busy_reason(ino) is not None

    def live_inode(self, ino: int) -> Inode | None:
        """The in-memory inode of a file in use (open, or with a fetch or an
        upload in flight): while it exists it, not LMDB, is the truth."""
        cf = self.files.get(ino)
        return cf.inode if cf is not None else None

    def content_dropped(self, ino: int, tiers: list[int], still_exists: bool) -> None:
        """Namespace event: the bucket changed the file (``still_exists``) or
        it vanished; LMDB already forgot its blocks."""
        self.content_changed(ino, tiers, self.meta.get_inode(ino) if still_exists else None)

    def content_changed(self, ino: int, tiers: list[int], inode: Inode | None) -> None:
        """The bucket's object changed (or vanished): LMDB already forgot the blocks.

        A busy file keeps its cache files (open fds point at them), empties
        them and forgets its block map; an idle file's cache files are deleted.
        """
        cf = self.files.get(ino)
        self._verified = {v for v in self._verified if v[0] != ino}
        self.recent.forget(ino)
        if cf is not None:
            cf.generation += 1
            cf.blocks.clear()
            cf.transient.clear()
            cf.hashers.clear()
            cf.contended.update(cf.writing)
            for tier in sorted(set(tiers) | set(cf.fds)):
                if self.leases.leased(tier, ino):
                    # A reader holds this file: never truncated under it
                    # (nor filled again with the new content: a new file).
                    self.tiers[tier].remove_file(ino)
                    self.retire_cache_fds(cf, tier)
                elif tier in cf.fds:
                    os.ftruncate(cf.fds[tier], 0)
            if inode is not None:
                cf.inode = inode
            return
        for tier in tiers:
            self.tiers[tier].remove_file(ino)

    # --- checked blocks ------------------------------------------------------------------

    def mark_verified(self, ino: int, blockno: int) -> None:
        self._verified.add((ino, blockno))

    def verified(self, ino: int, blockno: int) -> bool:
        """Was the block checked (or written and checked) in this mount?"""
        return (ino, blockno) in self._verified

    def forget_verified(self, ino: int, blocknos: Iterable[int]) -> None:
        """These blocks moved or changed: check each again on its first read."""
        for blockno in blocknos:
            self._verified.discard((ino, blockno))

    def ready(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> bool:
        """May this present block be served without a check?  Yes once it
        was verified; a dirty block also while it has no digest yet, or
        while a write of it is in flight (the writer's bytes, half landed)."""
        if (cf.ino, blockno) in self._verified:
            return True
        return rec.dirty and (not rec.sealed or blockno in cf.writing)

    def drop_damaged_clean(self, cf: CachedFile, blockno: int) -> None:
        """Forget a clean block that failed its checksum (it is refetched
        when needed) and re-derive the file's share of the tier accounting."""
        self.meta.drop_block_list(cf.ino, [blockno])
        self.meta.recount_residency(cf.ino)
        cf.blocks.pop(blockno, None)
        self.forget_verified(cf.ino, [blockno])
        self.recent.forget(cf.ino, [blockno])

    # --- cache-file fds ------------------------------------------------------------------

    def fd(self, cf: CachedFile, tier: int) -> int:
        """``cf``'s buffered fd on ``tier`` (the cache file created if need be)."""
        fd = cf.fds.get(tier)
        if fd is None:
            fd = self.tiers[tier].open_file(cf.ino, create=True)
            assert fd is not None
            cf.fds[tier] = fd
        return fd

    def direct_fd(self, cf: CachedFile, tier: int) -> int | None:
        """``cf``'s O_DIRECT fd on ``tier`` (None: the filesystem has none)."""
        if tier not in cf.direct_fds:
            self.fd(cf, tier)  # creates the cache file
            cf.direct_fds[tier] = self.tiers[tier].open_direct(cf.ino)
        return cf.direct_fds[tier]

    def fd_if_exists(self, cf: CachedFile, tier: int) -> int | None:
        """``cf``'s buffered fd on ``tier`` if it has a cache file there."""
        fd = cf.fds.get(tier)
        if fd is None:
            fd = self.tiers[tier].open_file(cf.ino, create=False)
            if fd is not None:
                cf.fds[tier] = fd
        return fd

    @staticmethod
    def retire_cache_fds(cf: CachedFile, tier: int) -> None:
        """``cf``'s fds on ``tier`` name a file no longer at its path: the
        next use opens the path again; these close with ``cf``."""
        for fds in (cf.fds, cf.direct_fds):
            fd = fds.pop(tier, None)
            if fd is not None:
                cf.retired_fds.append(fd)

    async def unshare(self, cf: CachedFile) -> None:
        """Before the first byte of ``cf`` changes here: replace each of its
        tier files that a reader holds (``leases``) with a copy, so the
        reader keeps the bytes it opened.  A second caller waits for the
        first; the copy runs in a thread."""
        while cf.unsharing is not None:
            await cf.unsharing.wait()
        tiers = self.leases.leased_tiers(cf.ino)
        if not tiers:
            return
        cf.unsharing = done = trio.Event()
        try:
            for tier in tiers:
                ranges = block_ranges(
                    [(b, rec.nbytes) for b, rec in cf.blocks.items() if rec.tier == tier],
                    self.recent.pool.block_size,
                )
                await trio.to_thread.run_sync(self.tiers[tier].replace_with_copy, cf.ino, ranges)
                self.retire_cache_fds(cf, tier)
                self.leases.unshared += 1
        finally:
            cf.unsharing = None
            done.set()

    @staticmethod
    def close_cache_fds(cf: CachedFile, tier: int) -> None:
        """Close ``cf``'s fds on ``tier`` (the next use opens the file again)."""
        for fds in (cf.fds, cf.direct_fds):
            fd = fds.pop(tier, None)
            if fd is not None:
                os.close(fd)


def block_ranges(blocks: list[tuple[int, int]], block_size: int) -> list[tuple[int, int]]:
    """(offset, length) runs of the blocks ``(blockno, nbytes)``, neighbours joined."""
    runs: list[tuple[int, int]] = []
    for blockno, nbytes in sorted(blocks):
        offset = blockno * block_size
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + nbytes)
        else:
            runs.append((offset, nbytes))
    return runs


async def wait_flights(cf: CachedFile, waits: Iterable[Flight]) -> None:
    """Wait for ``waits`` (flights of ``cf``); the first that failed raises
    its error."""
    for flight in set(waits):
        await flight.done.wait()
        if flight.error is not None:
            err = flight.error
            if isinstance(err, TierfsError):
                raise type(err)(str(err), errno=err.errno) from err
            raise StoreError(f"{cf.key}: {err}") from err


@dataclass(slots=True)
class ReadStats:
    """Counters of the data path (reads, fetches, checks), for ``status``."""

    read_requests: int = 0
    read_bytes: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    fetched_bytes: int = 0
    gets: int = 0
    verify_failures: int = 0
    uncached_blocks: int = 0
    #: block hits served from each tier (index = tier); memory hits not counted
    tier_hit_blocks: list[int] = field(default_factory=list)
