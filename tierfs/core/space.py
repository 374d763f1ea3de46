"""Placement of fetched blocks on tiers, and LRU eviction when all are full.

Rules (issue-2 scope; the lifecycle mover takes over demotion later):

* A fetched block goes to the first tier, fastest first, whose accounted
  usage plus in-flight reservations plus the block stays within its capacity
  and within what the filesystem has free.
* ``drop_clean`` is the one place that drops local copies of blocks: the
  LRU eviction below and ``DataMovement.evict`` both call it.
* When no tier has room, the least recently used files (file-level atime) are
  dropped: clean data only, it is all in the bucket.  The tier that holds the
  globally least-recently-used file is emptied down to its low watermark, in
  one batch, so eviction does not run once per block.
* A file that is busy (open, or with a fetch in flight) is never a victim:
  its cache files stay where the open handles expect them.
* If nothing can be freed, ``reserve`` returns None and the caller serves the
  block from memory without caching it.  A read never fails because tiers are
  full.

Access times are kept in memory on every hit (no LMDB write per read) and
flushed to LMDB in batches by ``flush_atimes`` (called periodically and at
unmount), so they survive a remount and order eviction across mounts.

All methods are synchronous: between two awaits of the caller they are atomic
with respect to other trio tasks, which is what keeps ``reserved`` exact.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from tierfs.meta import MetaDB
from tierfs.policy.eviction import Candidate, bytes_to_reach, select_lru_victims
from tierfs.tiers.tier import Tier

log = logging.getLogger(__name__)


class SpaceManager:
    def __init__(
        self,
        tiers: Sequence[Tier],
        meta: MetaDB,
        is_busy: Callable[[int], bool],
    ) -> None:
        self.tiers = list(tiers)
        self.meta = meta
        self._is_busy = is_busy
        self._reserved = [0] * len(self.tiers)
        self._atimes: dict[int, float] = meta.get_atimes()
        self._unflushed: dict[int, float] = {}
        self.evicted_files = 0
        self.evicted_bytes = 0

    # --- usage ---------------------------------------------------------------------

    def used(self, tier: int) -> int:
        return self.meta.tier_usage(tier).bytes + self._reserved[tier]

    def has_room(self, tier: int, nbytes: int) -> bool:
        return self.tiers[tier].usable_bytes(self.used(tier)) >= nbytes

    # --- reservations ---------------------------------------------------------------

    def reserve(
        self, nbytes: int, *, prefer: int | None = None, avoid: int | None = None
    ) -> int | None:
        """Pick a tier for ``nbytes`` and reserve the space; None if impossible.

        ``prefer``: that tier if it has room (a fill into a chosen tier),
        else the usual order.  ``avoid``: never that tier (a relocate is
        copying the file there)."""
        if prefer is not None and prefer != avoid and self.reserve_on(prefer, nbytes):
            return prefer
        for _round in range(len(self.tiers) + 1):
            for tier in range(len(self.tiers)):
                if tier != avoid and self.has_room(tier, nbytes):
                    self._reserved[tier] += nbytes
                    return tier
            if not self._evict_lru():
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

    def _evict_lru(self) -> bool:
        """Drop LRU files from one tier down to its low watermark.  True if any."""
        by_tier: dict[int, list[Candidate]] = {}
        for ino, tier, nbytes in self.meta.iter_residency():
            if self._is_busy(ino):
                continue
            atime = self._atimes.get(ino, 0.0)
            by_tier.setdefault(tier, []).append(Candidate(ino, atime, nbytes))
        if not by_tier:
            return False
        # The tier whose least-recently-used file is the oldest of all.
        tier = min(by_tier, key=lambda t: min(c.atime for c in by_tier[t]))
        t = self.tiers[tier]
        target = bytes_to_reach(self.used(tier), t.capacity, t.low_watermark)
        victims = select_lru_victims(by_tier[tier], max(target, 1))
        for victim in victims:
            self.drop_clean(victim.ino, tier)
        log.info(
            "tier %s full: evicted %d least-recently-used files (%d bytes)",
            t.name,
            len(victims),
            sum(v.nbytes for v in victims),
        )
        return bool(victims)

    def drop_clean(self, ino: int, tier: int | None = None) -> int:
        """Drop the clean blocks of ``ino`` (on ``tier``, or on every tier):
        the one place that drops local copies (LRU eviction here, and
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
        nbytes = sum(rec.nbytes for rec in victims.values())
        self.evicted_files += 1
        self.evicted_bytes += nbytes
        return nbytes

    # --- access times ------------------------------------------------------------------

    def touch(self, ino: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._atimes[ino] = now
        self._unflushed[ino] = now

    def forget(self, ino: int) -> None:
        self._atimes.pop(ino, None)
        self._unflushed.pop(ino, None)

    def flush_atimes(self) -> None:
        if self._unflushed:
            batch, self._unflushed = self._unflushed, {}
            self.meta.put_atimes(batch)
