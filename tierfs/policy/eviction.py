"""Victim selection for making room on a tier.  Pure and synchronous.

Issue-2 scope: plain least-recently-used by file-level access time.  The
lifecycle engine (watermark demotion, scan resistance, pins) replaces the
caller, not this contract: given candidates and a byte target, return the
files to drop, oldest first, skipping files the caller marked busy.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    ino: int
    atime: float
    nbytes: int


def select_lru_victims(candidates: Iterable[Candidate], bytes_to_free: int) -> list[Candidate]:
    """The least-recently-used candidates whose sizes add up to ``bytes_to_free``.

    Returns fewer (possibly none) if all candidates together are not enough.
    Ties in atime break on inode number so that the choice is deterministic.
    """
    if bytes_to_free <= 0:
        return []
    heap = [(c.atime, c.ino, c) for c in candidates if c.nbytes > 0]
    heapq.heapify(heap)
    chosen: list[Candidate] = []
    freed = 0
    while heap and freed < bytes_to_free:
        _, _, cand = heapq.heappop(heap)
        chosen.append(cand)
        freed += cand.nbytes
    return chosen


def bytes_to_reach(used: int, capacity: int, fraction: float) -> int:
    """How much to free so that ``used <= fraction * capacity``."""
    return max(0, used - int(fraction * capacity))
