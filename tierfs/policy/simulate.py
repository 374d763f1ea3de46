"""Replaying read traces through an eviction tracker.  Pure; for tests and the benchmark.

``scan_trace`` builds the scan scenario: a hot set (``hot_fraction``
of the capacity) is read ``warm_rounds`` times, then one pass over cold files
worth ``scan_factor`` times the capacity runs, with one read of the next hot
file (round robin) after every ``cold_per_hot`` cold reads.  With
``blocks_per_read`` > 1 each file read is that many consecutive accesses (a
file read block by block); only the first counts in the statistics.  ``replay``
feeds reads to a tracker the way a cache would: a hit is ``on_access``; a miss
inserts the file and evicts ``victims`` until the tracked bytes fit the
capacity.  Hits are counted per phase and per set, so the hot-set hit ratio
during the scan is ``hot_hits / hot_reads`` of the "scan" phase.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tierfs.policy.eviction import EvictionTracker

__all__ = ["Read", "ReplayStats", "replay", "scan_trace"]


@dataclass(frozen=True, slots=True)
class Read:
    ino: int
    nbytes: int
    hot: bool
    phase: str  # "warm" | "scan"
    counted: bool = True  # False for the further blocks of one file read


@dataclass(slots=True)
class ReplayStats:
    hot_reads: int = 0
    hot_hits: int = 0
    cold_reads: int = 0
    cold_hits: int = 0

    @property
    def hot_hit_ratio(self) -> float:
        return self.hot_hits / self.hot_reads if self.hot_reads else 0.0


def scan_trace(
    capacity: int,
    file_size: int,
    *,
    hot_fraction: float = 0.25,
    scan_factor: float = 3.0,
    cold_per_hot: int = 4,
    warm_rounds: int = 3,
    blocks_per_read: int = 1,
) -> Iterator[Read]:
    hot_files = max(1, int(capacity * hot_fraction) // file_size)
    cold_files = int(capacity * scan_factor) // file_size

    def whole_file(ino: int, hot: bool, phase: str) -> Iterator[Read]:
        yield Read(ino, file_size, hot, phase)
        for _ in range(blocks_per_read - 1):
            yield Read(ino, file_size, hot, phase, counted=False)

    for _ in range(warm_rounds):
        for ino in range(1, hot_files + 1):
            yield from whole_file(ino, True, "warm")
    next_hot = 0
    for index in range(cold_files):
        yield from whole_file(1_000_000 + index, False, "scan")
        if (index + 1) % cold_per_hot == 0:
            yield from whole_file(1 + next_hot, True, "scan")
            next_hot = (next_hot + 1) % hot_files


def replay(
    tracker: EvictionTracker,
    reads: Iterable[Read],
    capacity: int,
    phase: str = "scan",
    *,
    batch_to: float | None = None,
) -> ReplayStats:
    """Feed ``reads`` to ``tracker`` as a cache of ``capacity`` bytes; count ``phase``.

    By default each miss that overfills the cache gives up ``victims`` until
    it fits.  With ``batch_to`` (a fraction, like a low watermark) the cache
    works as the mover does: when full, it ``settle``s the bytes to free,
    then the head of ``ranking()`` goes (``on_evict``), in one batch, until
    the tracked bytes are at ``batch_to * capacity``.
    """
    stats = ReplayStats()
    for read in reads:
        hit = tracker.on_access(read.ino, read.nbytes)
        if not hit:
            tracker.on_insert(read.ino, read.nbytes)
            excess = tracker.tracked_bytes - capacity
            if excess > 0 and batch_to is None:
                for _ in tracker.victims(excess):
                    pass
            elif excess > 0:
                target = int(batch_to * capacity)
                tracker.settle(tracker.tracked_bytes - target)
                for ino in tracker.ranking():
                    if tracker.tracked_bytes <= target:
                        break
                    tracker.on_evict(ino)
        if read.phase != phase or not read.counted:
            continue
        if read.hot:
            stats.hot_reads += 1
            stats.hot_hits += hit
        else:
            stats.cold_reads += 1
            stats.cold_hits += hit
    return stats
