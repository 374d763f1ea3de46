"""Which cached files to give up first.  Pure and synchronous.

The choice: S3-FIFO
-------------------
``S3FifoTracker`` implements S3-FIFO (Yang et al., SOSP 2023): a small FIFO
queue (10% of the capacity by default), a main FIFO queue, and a ghost
queue that remembers, without data, what recently left the small queue.

Why S3-FIFO and not 2Q or ARC:

* Scan resistance is what we need (one pass over a dataset three times the
  size of NVMe must not flush a hot set read again and again).  New files
  enter the small queue and leave it at once unless they are read again
  while there; a scan therefore only churns the small queue, and the main
  queue, where the hot set lives, is not touched.  A file seen again soon
  after it left (its number is in the ghost queue) goes straight to main.
* A hit is one dict lookup, plus a dict store only while the file's count
  grows (at most three per stay): no list is relinked, unlike LRU, 2Q's Am
  queue or ARC's T2.  (In CPython, ``OrderedDict.move_to_end`` is C code and
  about as fast at 10k entries; the benchmark shows both side by side.)  No
  lock is needed: the tracker is called from the event loop only.
* ARC adapts better to workloads that shift between recency and frequency,
  but needs four lists and relinks on every hit; 2Q needs tuning of two
  sizes (Kin, Kout).  S3-FIFO matches or beats both on published traces
  with one fixed 10% parameter.

Bookkeeping unit: a file (inode) with its size in bytes on this tier (the
tiers hold one cache file per inode).  The core calls:

* ``on_insert(ino, nbytes)`` when a file gets data on the tier (a ghost hit
  goes to main, anything else to small);
* ``on_access(ino)`` on a read hit: ``freq = min(freq + 1, 3)``, counted once
  per burst.  The tracker has a clock that ticks on every insert and every
  counted access; its epoch is ``tick // burst_window`` (64).  Each entry
  keeps the epoch (8 bits) of its insert or last counted access, and an
  access in that same epoch is not counted again.  So a file read in one
  pass as many blocks, or by a few DataLoader workers at once, is one
  access, not sixteen; otherwise every file of a scan would look reused and
  go to main, and scan resistance would be lost.  (The 8-bit epoch wraps:
  an entry untouched for a multiple of 256 epochs loses one count, rarely
  and harmlessly.)  ``burst_window=0`` counts every access;
* ``set_size(ino, nbytes)`` when its resident bytes change;
* ``on_remove(ino)`` when it leaves the tier for another reason (unlink,
  ``tierfs evict``, a demotion the planner chose): forgotten, no ghost;
* ``demote_first(ino)``: a hint that the file should be the first to go
  (already read in this epoch, an older checkpoint under ``keep_newest``):
  it moves to a "first" queue that ``victims`` drains before anything else;
* ``victims(bytes_to_free, skip)``: yields inodes, least valuable first,
  until the yielded sizes add up to ``bytes_to_free``.

``victims`` state transitions, per popped entry:

* from the "first" queue: yielded;
* from small (popped when small holds >= its share of the bytes, or main is
  empty): ``freq > 0`` -> appended to main with ``freq = 0``; else yielded
  and its inode recorded in the ghost;
* from main: ``freq > 0`` -> appended to main again with ``freq - 1``; else
  yielded;
* ``skip(ino)`` true (busy, pinned, dirty...): set aside, and put back at
  the head of its queue, in order, when the call ends (also when the caller
  stops iterating early: the generator's ``finally``).

A yielded inode is no longer tracked: the caller drops or demotes it, or
calls ``on_insert`` again if it keeps it after all.  Each call pops at most
about five times the number of tracked entries, so it ends even when every
entry is skipped; it never scans the residency on an access.

Implementation and memory: one dict ``ino -> packed int`` (bytes, epoch,
queue, freq) and one ``collections.deque`` of inodes per queue (8 bytes a slot).
Removing an entry (``on_remove``, ``demote_first``) leaves its old slot in a
deque; a popped slot whose inode is no longer in that queue is dropped, so
stale slots cost nothing but their 8 bytes until they are popped.  (An inode
removed and inserted again before its old slot is popped may be seen once
too early.)  The ghost keeps no inode objects: it is an ``array`` of 32-bit
stamps plus a ``bytearray`` of 8-bit fingerprints, indexed by a hash of the
inode (Fibonacci hashing), with 1 to 2 slots per tracked entry; an inode is
"in the ghost" when its slot holds its fingerprint and was written within
the last ``len(tracked)`` ghost insertions.  A collision can overwrite a
ghost entry (it is forgotten early: with 1 to 2 slots per entry the ghost
still recalls about 63% to 79% of what it should) or, rarely (1 in 256 of
the occupied slots), make a new file look like a ghost hit (it then starts
in main): harmless mistakes that the paper's fingerprint ghost makes too.
More slots would recall more at 5 bytes a slot; 1 to 2 keep the whole
tracker within 200 bytes per entry.  When the
tracked count outgrows the table, a table twice as large starts empty.  Measured per entry in the unit tests and
``tests/bench/bench_eviction.py``.

``LruTracker`` is plain LRU (``OrderedDict``, move to end on every hit) with
the same interface, kept for comparison in the benchmark and tests.
``select_lru_victims`` / ``Candidate`` / ``bytes_to_reach`` are the issue-2
API that ``core/space.py`` still uses.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from tierfs.policy.watermarks import bytes_to_reach

__all__ = [
    "Candidate",
    "EvictionTracker",
    "LruTracker",
    "S3FifoTracker",
    "bytes_to_reach",
    "select_lru_victims",
]

_SMALL, _MAIN, _FIRST = 0, 1, 2
_FREQ_BITS = 2
_QUEUE_BITS = 2
_EPOCH_SHIFT = _FREQ_BITS + _QUEUE_BITS
_EPOCH_MASK = 0xFF << _EPOCH_SHIFT
_SHIFT = _EPOCH_SHIFT + 8  # nbytes above freq, queue and epoch
_LOW_MASK = (1 << _SHIFT) - 1
_FREQ_MASK = (1 << _FREQ_BITS) - 1
_QUEUE_MASK = 3 << _FREQ_BITS
_MAX_FREQ = 3
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / phi, for Fibonacci hashing
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_MIN_GHOST_BITS = 10


class _Ghost:
    """Recently evicted inodes, hashed: a 32-bit stamp and an 8-bit fingerprint per slot.

    No Python object per entry.  The table has 1 to 2 slots per tracked
    entry; the fingerprint makes a false "seen" for a new inode 256 times
    rarer than a slot collision.
    """

    def __init__(self) -> None:
        self._bits = _MIN_GHOST_BITS
        self._stamps = array("I", bytes(4 << self._bits))
        self._prints = bytearray(1 << self._bits)
        self._seq = 0

    def _hash(self, ino: int) -> tuple[int, int]:
        mixed = (ino * _GOLDEN) & _U64
        return mixed >> (64 - self._bits), mixed & 0xFF

    def _fit(self, limit: int) -> None:
        if limit > len(self._stamps):
            self._bits = max(_MIN_GHOST_BITS, (2 * limit - 1).bit_length())
            self._stamps = array("I", bytes(4 << self._bits))
            self._prints = bytearray(1 << self._bits)

    def add(self, ino: int, limit: int) -> None:
        self._fit(limit)
        self._seq = (self._seq + 1) & _U32 or 1
        slot, fingerprint = self._hash(ino)
        self._stamps[slot] = self._seq
        self._prints[slot] = fingerprint

    def contains(self, ino: int, limit: int) -> bool:
        slot, fingerprint = self._hash(ino)
        stamp = self._stamps[slot]
        return (
            stamp != 0 and self._prints[slot] == fingerprint and (self._seq - stamp) & _U32 < limit
        )

    def discard(self, ino: int) -> None:
        slot, fingerprint = self._hash(ino)
        if self._prints[slot] == fingerprint:
            self._stamps[slot] = 0

    @property
    def nbytes(self) -> int:
        return len(self._stamps) * 5


def _never(_ino: int) -> bool:
    return False


class EvictionTracker(Protocol):
    """What the core calls; see the module docstring."""

    def on_insert(self, ino: int, nbytes: int) -> None: ...
    def on_access(self, ino: int, nbytes: int = 0) -> bool: ...
    def on_remove(self, ino: int) -> None: ...
    def set_size(self, ino: int, nbytes: int) -> None: ...
    def demote_first(self, ino: int) -> None: ...
    def victims(
        self, bytes_to_free: int, skip: Callable[[int], bool] = _never
    ) -> Iterator[int]: ...
    def ranking(self) -> list[int]: ...
    def inodes(self) -> list[int]: ...
    def set_capacity(self, capacity: int) -> None: ...
    def __contains__(self, ino: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def tracked_bytes(self) -> int: ...


class S3FifoTracker:
    """S3-FIFO over files; see the module docstring."""

    def __init__(
        self, capacity: int, *, small_fraction: float = 0.10, burst_window: int = 64
    ) -> None:
        if not 0 < small_fraction < 1:
            raise ValueError("small_fraction must be in (0, 1)")
        self._burst_window = max(0, burst_window)
        # The burst clock: ``_epoch`` (0..255) advances by one every
        # ``burst_window`` ticks; ``_ticks_left`` counts down to it.
        self._epoch = 0
        self._ticks_left = self._burst_window
        if not self._burst_window:
            self.on_access = self._on_access_every_time  # type: ignore[method-assign]
        self._small_fraction = small_fraction
        self._small_target = 0
        self.set_capacity(capacity)
        self._meta: dict[int, int] = {}  # ino -> nbytes << 4 | queue << 2 | freq
        self._queues: tuple[deque[int], deque[int], deque[int]] = (deque(), deque(), deque())
        self._bytes = [0, 0, 0]
        self._ghost = _Ghost()

    # --- state -----------------------------------------------------------------------

    def set_capacity(self, capacity: int) -> None:
        """The tier's capacity in bytes: small's share of it is ``small_fraction``."""
        self.capacity = max(0, capacity)
        self._small_target = int(self.capacity * self._small_fraction)

    def __len__(self) -> int:
        return len(self._meta)

    def __contains__(self, ino: object) -> bool:
        return ino in self._meta

    @property
    def tracked_bytes(self) -> int:
        bytes_per_queue = self._bytes
        return bytes_per_queue[0] + bytes_per_queue[1] + bytes_per_queue[2]

    @property
    def small_bytes(self) -> int:
        return self._bytes[_SMALL]

    @property
    def main_bytes(self) -> int:
        return self._bytes[_MAIN]

    def in_ghost(self, ino: int) -> bool:
        return self._ghost.contains(ino, self._ghost_limit())

    def _ghost_limit(self) -> int:
        return max(len(self._meta), 1)

    def queue_of(self, ino: int) -> str | None:
        """ "small", "main", "first" or None: for tests and ``status``."""
        packed = self._meta.get(ino)
        if packed is None:
            return None
        return ("small", "main", "first")[(packed >> _FREQ_BITS) & 3]

    # --- events ----------------------------------------------------------------------

    def on_insert(self, ino: int, nbytes: int) -> None:
        if ino in self._meta:
            self.set_size(ino, nbytes)
            return
        if self._ghost.contains(ino, self._ghost_limit()):
            self._ghost.discard(ino)
            queue = _MAIN
        else:
            queue = _SMALL
        self._tick()  # first: the reads of this burst must see the epoch stored here
        self._meta[ino] = (nbytes << _SHIFT) | (self._epoch << _EPOCH_SHIFT) | (queue << _FREQ_BITS)
        self._queues[queue].append(ino)
        self._bytes[queue] += nbytes

    def _tick(self) -> None:
        if self._burst_window:
            self._ticks_left -= 1
            if self._ticks_left <= 0:
                self._ticks_left = self._burst_window
                self._epoch = (self._epoch + 1) & 0xFF

    def on_access(self, ino: int, nbytes: int = 0) -> bool:
        """A read of ``ino``; True if it is tracked here (a hit).

        The hot path: one dict lookup; a dict store only when the count
        grows (a new burst, freq below 3): a file read often is saturated
        and costs no store.  The arithmetic stays on the low bits (small
        ints) but for one addition to the packed int (each big-int result is
        an allocation, and a store frees the old value: cache misses).
        """
        packed = self._meta.get(ino)
        if packed is None:
            return False
        low = packed & _LOW_MASK
        if low & _FREQ_MASK == _MAX_FREQ:
            return True  # saturated: nothing to count, nothing to store
        stored_epoch = low >> _EPOCH_SHIFT
        if stored_epoch == self._epoch:
            return True  # the same burst: counted already
        ticks_left = self._ticks_left - 1  # self._tick(), inlined
        if ticks_left <= 0:
            ticks_left = self._burst_window
            self._epoch = (self._epoch + 1) & 0xFF
        self._ticks_left = ticks_left
        self._meta[ino] = (
            packed + ((self._epoch - stored_epoch) << _EPOCH_SHIFT) + (low & _FREQ_MASK < _MAX_FREQ)
        )
        return True

    def _on_access_every_time(self, ino: int, nbytes: int = 0) -> bool:
        """``on_access`` with ``burst_window=0``: every access counts."""
        packed = self._meta.get(ino)
        if packed is None:
            return False
        if packed & _FREQ_MASK < _MAX_FREQ:
            self._meta[ino] = packed + 1
        return True

    def set_size(self, ino: int, nbytes: int) -> None:
        packed = self._meta.get(ino)
        if packed is None:
            return
        queue = (packed >> _FREQ_BITS) & 3
        self._bytes[queue] += nbytes - (packed >> _SHIFT)
        self._meta[ino] = (nbytes << _SHIFT) | (packed & ((1 << _SHIFT) - 1))

    def on_remove(self, ino: int) -> None:
        packed = self._meta.pop(ino, None)
        if packed is not None:  # its deque slot goes stale
            self._bytes[(packed >> _FREQ_BITS) & 3] -= packed >> _SHIFT
        self._ghost.discard(ino)

    def demote_first(self, ino: int) -> None:
        packed = self._meta.get(ino)
        if packed is None or (packed >> _FREQ_BITS) & 3 == _FIRST:
            return
        nbytes = packed >> _SHIFT
        self._bytes[(packed >> _FREQ_BITS) & 3] -= nbytes
        self._bytes[_FIRST] += nbytes
        self._meta[ino] = (nbytes << _SHIFT) | (_FIRST << _FREQ_BITS)
        self._queues[_FIRST].append(ino)

    # --- eviction --------------------------------------------------------------------

    def inodes(self) -> list[int]:
        """Every tracked inode, in no particular order."""
        return list(self._meta)

    def _live(self, queue_id: int) -> list[tuple[int, int]]:
        """(ino, freq) of the live slots of one queue, head first, each inode once."""
        meta = self._meta
        seen: set[int] = set()
        out: list[tuple[int, int]] = []
        for ino in self._queues[queue_id]:
            packed = meta.get(ino)
            if packed is None or (packed >> _FREQ_BITS) & 3 != queue_id or ino in seen:
                continue
            seen.add(ino)
            out.append((ino, packed & _FREQ_MASK))
        return out

    def ranking(self) -> list[int]:
        """Every tracked inode, least valuable first, changing nothing.

        The order ``victims`` would give up files in, as far as it can be
        told without running it: the "first" queue; files read once in the
        small queue (FIFO order); main's files with no second chance left;
        files read again while in small (``victims`` moves them to main);
        then main's others by their remaining chances, fewest first.  For the
        planner (``tierfs policy plan`` and the mover), which must not change
        the tracker while it only looks.  O(n log n) in the tracked files.
        """
        small = self._live(_SMALL)
        main = self._live(_MAIN)
        order = [ino for ino, _ in self._live(_FIRST)]
        order += [ino for ino, freq in small if freq == 0]
        order += [ino for ino, freq in main if freq == 0]
        order += [ino for ino, freq in small if freq > 0]
        order += [ino for ino, _ in sorted((e for e in main if e[1] > 0), key=lambda e: e[1])]
        return order

    def victims(self, bytes_to_free: int, skip: Callable[[int], bool] = _never) -> Iterator[int]:
        """Inodes to give up, least valuable first, until ``bytes_to_free`` are yielded."""
        freed = 0
        meta = self._meta
        queues = self._queues
        small, main, first = queues
        skipped: tuple[list[int], list[int], list[int]] = ([], [], [])
        # Each live entry is popped at most ~5 times (small -> main, 3 second
        # chances, then out or skipped): this bounds the call even when
        # every entry is skipped.
        budget = 5 * (len(small) + len(main) + len(first)) + 5
        try:
            while freed < bytes_to_free and budget > 0:
                if first:
                    queue_id, queue = _FIRST, first
                elif main and (not small or self._bytes[_SMALL] < self._small_target):
                    queue_id, queue = _MAIN, main
                elif small:
                    queue_id, queue = _SMALL, small
                elif main:
                    queue_id, queue = _MAIN, main
                else:
                    return
                ino = queue.popleft()
                packed = meta.get(ino)
                if packed is None or (packed >> _FREQ_BITS) & 3 != queue_id:
                    continue  # a stale slot
                budget -= 1
                if skip(ino):
                    skipped[queue_id].append(ino)
                    continue
                freq = packed & _FREQ_MASK
                nbytes = packed >> _SHIFT
                if queue_id == _SMALL and freq > 0:
                    meta[ino] = (nbytes << _SHIFT) | (_MAIN << _FREQ_BITS)
                    self._bytes[_SMALL] -= nbytes
                    self._bytes[_MAIN] += nbytes
                    main.append(ino)
                    continue
                if queue_id == _MAIN and freq > 0:
                    meta[ino] = packed - 1
                    main.append(ino)
                    continue
                del meta[ino]
                self._bytes[queue_id] -= nbytes
                if queue_id == _SMALL:
                    self._ghost.add(ino, self._ghost_limit())
                freed += nbytes
                budget += 1  # a yield is progress, not a wasted pop
                yield ino
        finally:
            for queue, aside in zip(queues, skipped, strict=True):
                queue.extendleft(reversed(aside))


class LruTracker:
    """Plain LRU over files, the same interface: for comparison only."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[int, int] = OrderedDict()  # ino -> nbytes, oldest first
        self.tracked_bytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, ino: object) -> bool:
        return ino in self._lru

    def set_capacity(self, capacity: int) -> None:
        self.capacity = capacity

    def inodes(self) -> list[int]:
        return list(self._lru)

    def ranking(self) -> list[int]:
        """Least recently used first."""
        return list(self._lru)

    def on_insert(self, ino: int, nbytes: int) -> None:
        self.tracked_bytes += nbytes - self._lru.get(ino, 0)
        self._lru[ino] = nbytes
        self._lru.move_to_end(ino)

    def on_access(self, ino: int, nbytes: int = 0) -> bool:
        try:
            self._lru.move_to_end(ino)
        except KeyError:
            return False
        return True

    def set_size(self, ino: int, nbytes: int) -> None:
        if ino in self._lru:
            self.tracked_bytes += nbytes - self._lru[ino]
            self._lru[ino] = nbytes

    def on_remove(self, ino: int) -> None:
        self.tracked_bytes -= self._lru.pop(ino, 0)

    def demote_first(self, ino: int) -> None:
        if ino in self._lru:
            self._lru.move_to_end(ino, last=False)

    def victims(self, bytes_to_free: int, skip: Callable[[int], bool] = _never) -> Iterator[int]:
        freed = 0
        skipped: list[tuple[int, int]] = []
        try:
            while freed < bytes_to_free and self._lru:
                ino, nbytes = self._lru.popitem(last=False)
                if skip(ino):
                    skipped.append((ino, nbytes))
                    continue
                freed += nbytes
                self.tracked_bytes -= nbytes
                yield ino
        finally:
            for ino, nbytes in reversed(skipped):  # back at the old end, in order
                self._lru[ino] = nbytes
                self._lru.move_to_end(ino, last=False)


# --- the issue-2 API (core/space.py) ------------------------------------------------------


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
