"""Placement of new blocks on tiers, the eviction bookkeeping, and the
emergency eviction when every tier is full.

Rules:

* A new block (fetched or written) of file ``ino`` goes to the first tier
  with room at or after the file's placement tier (``placement(ino)``, the
  lifecycle's answer: a rule's ``place``, else the first tier), then to the
  tiers before it.  "Room": accounted usage plus in-flight reservations plus
  the block stays within the tier's capacity and within what the filesystem
  has free.  ``placement`` returning None (``cache = false``) makes a fetch
  keep the block in memory only (``cacheable``).
* One ``S3FifoTracker`` per tier (``policy.eviction``) ranks the files on
  that tier by value.  Every open calls ``opened`` (one O(1) ``on_access``
  per tier: a file's value is how often it is opened, see ``opened``) and
  every read ``touch`` (an access time in memory); never an LMDB write and
  never a scan.  Blocks landing on a tier insert the file into that tier's tracker
  (``block_added``), drops and moves remove it (``left``).  An insert while
  no handle has the file open (directory readahead, preload, prefetch, pin
  fills, relocates: ``CachedFile.opened`` is false) marks it not yet used,
  so that the open that follows is its first use, not a second one; an
  insert while it is open is that open's use.  The trackers
  are rebuilt at mount from the residency, least recently accessed first
  (not yet used: an insert at mount is no open), and ``reconcile`` (the
  mover's planning pass, in the background) brings
  them in line with the residency.
* The mover plans with ``ranking_later`` (the order in which the trackers'
  ``victims`` would give every file up, worked out from copies in the
  planner's thread) after ``settle`` (the S3-FIFO queue moves for what
  each tier must free, made for real): one eviction walk for the plan and
  the emergency path below.
* ``drop_clean`` is the one place that drops local copies of blocks: the
  emergency eviction below and ``DataMovement.evict`` both call it.
* Emergency eviction: when no tier has room for a block, clean files are
  dropped from the slowest tier that has any (victims from its tracker,
  least valuable first) down to its low watermark, in one batch.  Normally
  the mover keeps tiers below their high watermark and this never runs.
* A file that is busy (open, or with a fetch in flight) is never a victim:
  its cache files stay where the open handles expect them.
* If nothing can be freed, ``reserve`` returns None and the caller serves the
  block from memory without caching it.  A read never fails because tiers are
  full.

``TIERFS_TEST_EVICTION=lru`` (benchmarks only) swaps S3-FIFO for plain LRU.

Access times (on the lifecycle clock, ``core.state.clock``) are kept in memory and
flushed to LMDB in batches by ``flush_atimes`` (called periodically and at
unmount), so they survive a remount and order the trackers across mounts.

All methods are synchronous: between two awaits of the caller they are atomic
with respect to other trio tasks, which is what keeps ``reserved`` exact.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from tierfs.meta import MetaDB
from tierfs.policy.eviction import EvictionTracker, LruTracker, S3FifoTracker
from tierfs.policy.watermarks import bytes_to_free
from tierfs.tiers import Tier

from .clock import Clock

log = logging.getLogger(__name__)

#: Benchmarks only: ``TIERFS_TEST_EVICTION=lru`` ranks files by plain LRU
#: instead of S3-FIFO, to compare the two in one run (tests/bench).
EVICTION_ENV = "TIERFS_TEST_EVICTION"


class SpaceManager:
    def __init__(
        self,
        tiers: Sequence[Tier],
        meta: MetaDB,
        is_busy: Callable[[int], bool],
        *,
        clock: Clock | None = None,
        placement: Callable[[int], int | None] | None = None,
        on_tier_full: Callable[[], None] | None = None,
    ) -> None:
        self.tiers = list(tiers)
        self.meta = meta
        self._is_busy = is_busy
        self.clock = clock if clock is not None else Clock()
        self._placement = placement
        #: Called when a block cannot go to its placement tier because that
        #: tier is full, so it spills to another (the lifecycle wakes the
        #: mover instead of waiting for its interval).  A tier merely above
        #: its high watermark waits for the mover's interval: that is the
        #: window in which ``tierfs policy plan`` shows what will move.
        self._on_full = on_tier_full
        self._reserved = [0] * len(self.tiers)
        self.atimes: dict[int, float] = meta.get_atimes()
        self._unflushed: dict[int, float] = {}
        self.evicted_files = 0
        self.evicted_bytes = 0
        self.trackers: list[EvictionTracker]
        if os.environ.get(EVICTION_ENV) == "lru":
            self.trackers = [LruTracker(max(1, t.capacity)) for t in self.tiers]
        else:  # accesses are opens (``opened``): every one counts, no burst window
            self.trackers = [S3FifoTracker(max(1, t.capacity), burst_window=0) for t in self.tiers]
        self._rebuild_trackers()

    # --- usage ---------------------------------------------------------------------

    def used(self, tier: int) -> int:
        return self.meta.tier_usage(tier).bytes + self._reserved[tier]

    def has_room(self, tier: int, nbytes: int) -> bool:
        return self.tiers[tier].usable_bytes(self.used(tier)) >= nbytes

    # --- reservations ---------------------------------------------------------------

    def placement(self, ino: int) -> int | None:
        """The tier new blocks of ``ino`` go to first; None: not cached."""
        return 0 if self._placement is None else self._placement(ino)

    def cacheable(self, ino: int) -> bool:
        """May fetched blocks of ``ino`` be kept on a tier (not ``cache = false``)?"""
        return self.placement(ino) is not None

    def reserve(
        self,
        nbytes: int,
        *,
        ino: int | None = None,
        prefer: int | None = None,
        avoid: int | None = None,
    ) -> int | None:
        """Pick a tier for ``nbytes`` and reserve the space; None if impossible.

        ``ino``: the file the block belongs to; its placement tier is tried
        first, then the tiers after it, then the ones before it.
        ``prefer``: that tier if it has room (a fill into a chosen tier),
        else the usual order.  ``avoid``: never that tier (a relocate is
        copying the file there)."""
        if prefer is not None and prefer != avoid and self.reserve_on(prefer, nbytes):
            return prefer
        first = (self.placement(ino) or 0) if ino is not None else 0
        order = [*range(first, len(self.tiers)), *range(first)]
        for _round in range(len(self.tiers) + 1):
            for tier in order:
                if tier != avoid and self.has_room(tier, nbytes):
                    self._reserved[tier] += nbytes
                    if tier != first and self._on_full is not None:
                        self._on_full()
                    return tier
            if not self._evict_for_room():
                return None
        return None

    def reserve_on(self, tier: int, nbytes: int) -> bool:
        """Reserve ``nbytes`` on ``tier`` if it has room now (no eviction)."""
        if not self.has_room(tier, nbytes):
            return False
        self._reserved[tier] += nbytes
        return True

    def release(self, tier: int, nbytes: int) -> None:
        """Give back a reservation (after the block was recorded, or failed)."""
        self._reserved[tier] -= nbytes

    def tier_filled_up(self, tier: int) -> None:
        """The filesystem said ENOSPC: treat the tier as full at its current usage."""
        self.tiers[tier].enospc_at = self.meta.tier_usage(tier).bytes
        log.warning(
            "tier %s: filesystem full at %d bytes; capping the tier there",
            self.tiers[tier].name,
            self.tiers[tier].enospc_at,
        )

    # --- eviction ----------------------------------------------------------------------

    def _evict_for_room(self) -> bool:
        """Every tier is full: drop clean files from the slowest tier that
        has any, least valuable first, down to its low watermark.  True if
        anything was dropped."""
        for tier in reversed(range(len(self.tiers))):
            t = self.tiers[tier]
            target = max(bytes_to_free(self.used(tier), t.capacity, t.low_watermark), 1)
            tracker = self.trackers[tier]
            kept: list[tuple[int, int]] = []
            freed = files = 0
            for ino in tracker.victims(target, skip=self._is_busy):
                nbytes = self.drop_clean(ino, tier)
                if nbytes:
                    freed += nbytes
                    files += 1
                left = self.meta.residency(ino).get(tier, 0)
                if left:  # dirty blocks stay: so does the file, in the tracker
                    kept.append((ino, left))
            for ino, left in kept:
                tracker.on_insert(ino, left)
            if freed:
                log.info(
                    "every tier full: dropped %d files (%d bytes) from tier %s",
                    files,
                    freed,
                    t.name,
                )
                return True
        return False

    def drop_clean(self, ino: int, tier: int | None = None) -> int:
        """Drop the clean blocks of ``ino`` (on ``tier``, or on every tier):
        the one place that drops local copies (the emergency eviction here, and
        ``DataMovement.evict``).  Dirty blocks are never dropped.  The caller
        checked that the file is not busy (no CachedFile: no open fds).

        Records go first (one transaction), then the bytes: a cache file
        left with no record on its tier is deleted; one that still holds
        dirty blocks keeps the dropped bytes, unindexed, until it is
        dropped itself.  A crash in between leaves a cache file with no
        record, which the orphan cleanup at the next mount deletes.
        Returns the bytes dropped."""
        victims = {
            blockno: rec
            for blockno, rec in self.meta.get_blocks(ino).items()
            if not rec.dirty and (tier is None or rec.tier == tier)
        }
        if not victims:
            return 0
        self.meta.drop_block_list(ino, victims)
        left = self.meta.residency(ino)
        for t in {rec.tier for rec in victims.values()}:
            if t not in left:
                self.tiers[t].remove_file(ino)
        for t in {rec.tier for rec in victims.values()}:
            if t not in left:
                self.trackers[t].on_remove(ino)
        nbytes = sum(rec.nbytes for rec in victims.values())
        self.evicted_files += 1
        self.evicted_bytes += nbytes
        return nbytes

    # --- eviction bookkeeping ------------------------------------------------------------

    def tracks(self, ino: int) -> bool:
        """Has ``ino`` bytes on some tier (the trackers, in memory)?"""
        return any(ino in tracker for tracker in self.trackers)

    def _rebuild_trackers(self) -> None:
        """At mount: every resident file, least recently accessed first, as
        not yet used (an insert at mount is no open: a file's first open
        after a remount is its first use of this mount, so a pass over a
        dataset that was resident before does not look like reuse)."""
        atimes = self.atimes
        rows = sorted(self.meta.iter_residency(), key=lambda r: (atimes.get(r[0], 0.0), r[0]))
        for ino, tier, nbytes in rows:
            if tier < len(self.trackers):
                self.trackers[tier].on_insert(ino, nbytes, used=False)

    def block_added(
        self, ino: int, tier: int, file_bytes: int | None = None, *, used: bool = True
    ) -> None:
        """A block of ``ino`` landed on ``tier`` (O(1); sizes are settled by
        ``reconcile``).  ``file_bytes``: the file's bytes on ``tier`` now, if
        the caller knows them (else they are read from LMDB).  ``used``: a
        reader or writer has the file open, so the open it already counted
        is this insert's use; False (a fetch or move nobody asked for yet):
        the file is tracked as not yet used, and its next open is its first
        use, not a second one (see the module docstring)."""
        tracker = self.trackers[tier]
        if ino not in tracker:
            if file_bytes is None:
                file_bytes = self.meta.residency(ino).get(tier, 0)
            tracker.on_insert(ino, file_bytes, used=used)

    def left(self, ino: int, tier: int) -> None:
        """``ino`` has no bytes on ``tier`` any more (moved or dropped): the
        tracker remembers it in its ghost, so that a file promoted back
        soon after is known as one that was used before."""
        self.trackers[tier].on_evict(ino)

    def reconcile(self, residency: dict[int, list[int]]) -> None:
        """Bring the trackers in line with ``residency`` (ino -> bytes per
        tier): sizes, files that arrived unseen, files that left."""
        for index, tracker in enumerate(self.trackers):
            tracker.set_capacity(max(1, self.tiers[index].capacity))
            for ino in tracker.inodes():
                per_tier = residency.get(ino)
                if per_tier is None or not per_tier[index]:
                    tracker.on_remove(ino)
            for ino, per_tier in residency.items():
                nbytes = per_tier[index]
                if not nbytes:
                    continue
                if ino in tracker:
                    tracker.set_size(ino, nbytes)
                else:
                    tracker.on_insert(ino, nbytes, used=False)

    def settle(self, to_free: Sequence[int]) -> None:
        """Before the mover plans: each tier's tracker makes the S3-FIFO
        queue moves that giving up ``to_free[tier]`` bytes would make
        (``S3FifoTracker.settle``), so that they persist as the emergency
        path's do.  Synchronous, on the loop: 67 ms for a tenth of 1M
        tracked files (measured on this kind of machine)."""
        for tracker, nbytes in zip(self.trackers, to_free, strict=False):
            if nbytes > 0:
                tracker.settle(nbytes)

    def ranking_later(self) -> Callable[[], list[int]]:
        """Inodes, least valuable first: the first tier's ranking, then the
        others' (for the planner), as of now; worked out when the returned
        function is called, in any thread (``S3FifoTracker.ranking_later``)."""
        parts = [tracker.ranking_later() for tracker in self.trackers]

        def ranking() -> list[int]:
            seen: set[int] = set()
            order: list[int] = []
            for part in parts:
                for ino in part():
                    if ino not in seen:
                        seen.add(ino)
                        order.append(ino)
            return order

        return ranking

    # --- access times ------------------------------------------------------------------

    def touch(self, ino: int, now: float | None = None) -> None:
        """A read of ``ino``: its access time, O(1), in memory."""
        now = self.clock.now() if now is None else now
        self.atimes[ino] = now
        self._unflushed[ino] = now

    def opened(self, ino: int) -> None:
        """An open of ``ino``: one access for the trackers (O(1) each).

        Value is counted per open, not per read request: a file read in one
        pass as many 128 KiB requests is one access, and a DataLoader opens
        each sample once per epoch, so a file's count is the number of times
        it was used."""
        self.touch(ino)
        for tracker in self.trackers:
            tracker.on_access(ino)

    def demote_first(self, ino: int) -> None:
        """A hint: ``ino`` was read in this epoch (order-aware prefetch) and
        is not needed again soon.  It becomes the first candidate to leave
        the first tier under pressure, as one not re-accessed (S3-FIFO: its
        count is reset).  O(1); a file not on the first tier is ignored."""
        self.trackers[0].demote_first(ino)

    def content_dropped(self, ino: int, tiers: list[int], still_exists: bool) -> None:
        """Namespace event: a file's blocks were dropped; one that vanished
        from the bucket is forgotten."""
        if not still_exists:
            self.forget(ino)

    def forget(self, ino: int) -> None:
        self.atimes.pop(ino, None)
        self._unflushed.pop(ino, None)
        for tracker in self.trackers:
            tracker.on_remove(ino)

    def flush_atimes(self) -> None:
        if self._unflushed:
            batch, self._unflushed = self._unflushed, {}
            self.meta.put_atimes(batch)
