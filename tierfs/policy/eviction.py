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
* A hit is one lookup in a small dict of pages and one byte read, plus a
  byte written in place only while the file's count grows (at most three
  per stay): no list is relinked, unlike LRU, 2Q's Am
  queue or ARC's T2.  (In CPython, ``OrderedDict.move_to_end`` is C code and
  about as fast at 10k entries; the benchmark shows both side by side.)  No
  lock is needed: the tracker is called from the event loop only.
* ARC adapts better to workloads that shift between recency and frequency,
  but needs four lists and relinks on every hit; 2Q needs tuning of two
  sizes (Kin, Kout).  S3-FIFO matches or beats both on published traces
  with one fixed 10% parameter.

Bookkeeping unit: a file (inode) with its size in bytes on this tier (the
tiers hold one cache file per inode).  The core calls:

* ``on_insert(ino, nbytes, used=True)`` when a file gets data on the tier
  (a ghost hit goes to main, anything else to small); ``used=False`` for a
  fetch no reader asked for (see "Not yet used" below);
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
  ``tierfs evict``): forgotten, no ghost;
* ``on_evict(ino)`` when the planner demoted or dropped it: forgotten as
  ``victims`` forgets, with a ghost if it left from the small queue;
* ``demote_first(ino)``: a hint that the file should be the first to go
  (already read in this epoch, an older checkpoint under ``keep_newest``):
  it moves to a "first" queue that ``victims`` drains before anything else;
* ``victims(bytes_to_free, skip)``: yields inodes, least valuable first,
  until the yielded sizes add up to ``bytes_to_free`` (the emergency path);
* ``ranking()`` / ``ranking_later()``: every inode in the order ``victims``
  would give them all up, changing nothing (the planner's order);
* ``settle(bytes_to_free)``: the queue moves of ``victims(bytes_to_free)``
  without giving anything up (before the mover plans).

One walk for all three
----------------------
``victims``, ``settle`` and ``ranking`` are the same S3-FIFO walk
(``_evict``).  ``ranking`` runs it on a private ``copy`` of the queues, to
the end, so the mover's plan and ``tierfs policy plan`` give files up in
exactly the order the emergency path would.  A plan only reads, so the
walk's transitions (a re-accessed small file moved to main, a main file's
second chance spent) would be lost and found again at every pass, with the
counts of small files never decaying; ``settle`` makes them for real, for
the bytes the pass must free, and parks the files it would give up at the
head of the "first" queue, in order, for the plan's moves to take
(``on_evict``).  The order of a ``ranking`` after a ``settle`` is the order
before it (the parked files first, then small and main as the walk left
them).  A parked file read again before its move still goes: it was given up
when the pass planned, as S3-FIFO gives a file up when it needs the room; a
parked file whose move was skipped (busy) goes first at the next pass.

``victims`` state transitions, per popped entry:

* from the "first" queue: yielded;
* from small (popped when small holds >= its share of the bytes, or main is
  empty; "holds" as the walk sees it: what it gave up or moved has left):
  ``freq > 0`` -> appended to main with ``freq = 0``; else yielded and its
  inode recorded in the ghost;
* from main: ``freq > 0`` -> appended to main again with ``freq - 1``; else
  yielded;
* ``skip(ino)`` true (busy, pinned, dirty...): set aside, and put back at
  the head of its queue, in order, when the call ends (also when the caller
  stops iterating early: the generator's ``finally``).

A yielded inode is no longer tracked (``settle`` parks it instead):
the caller drops or demotes it, or calls ``on_insert`` again if it keeps it
after all.  Each call pops at most
about five times the number of tracked entries, so it ends even when every
entry is skipped; it never scans the residency on an access.

Not yet used
------------
A file's count must be its uses.  A fetch nobody asked for yet (directory
readahead, preload, prefetch, pin fills, a relocate) inserts it with
``used=False``: the state byte carries ``_UNUSED``, and its first access
clears the flag and counts nothing, so that its first open is its first use,
as for a file a reader fetched (inserted after the open that counted
nothing, since it was not tracked yet).  Without it, every file of a scan
that directory readahead fetched ahead of its open looked read twice and
reached main, and the scan flushed the hot set.

Implementation and memory: pages indexed by inode number
---------------------------------------------------------
Inode numbers are dense (the daemon allocates them in sequence, with a gap
of 2**20 after a crash), so the per-inode state lives in pages of 4096
consecutive inode numbers rather than in a dict keyed by inode:

* ``_states[ino >> 12]`` is a ``bytearray``: the state byte of inode ``ino``
  is at ``ino & 4095`` (``_TRACKED | _UNUSED? | queue << 2 | freq``; 0 when
  the inode is not tracked).  With a burst window, each state byte is followed by its
  epoch byte (page of 8192 bytes, slot ``i`` at ``2 * i``), so that a hit
  reads and writes one cache line.
* ``_sizes[ino >> 12]`` is an ``array("q")`` of the sizes, same numbering:
  the hit path never touches it.
* ``_live_in_page[ino >> 12]`` counts the tracked inodes of the page; a page
  is freed (all three entries) when it drops to 0, and made again, zeroed,
  by the next insert into its range.

Why: a hit used to cost a lookup in a dict of up to 1M entries (the hash
slot, the stored key's int object for the equality check, the value's int
object, and a new int for the stored result: cache and TLB misses that
grow with the size, 4-7x from 10k to 1M).  Now it is a lookup in a dict of
one entry per 4096 inodes (about 250 at 1M: it stays in cache), one byte
read and, while the count grows, one or two bytes written in place: no
object is allocated but the page number's int.  At 1M tracked files the
state bytes are 1 MB (2 MB with epochs).

Memory, per tracked entry with dense inodes: 1 byte of state (2 with the
epoch) and 8 of size per inode number of the pages' ranges, plus the deque
slot (8 bytes) and the inode's int object (about 32 bytes) that the deque
keeps, plus 5 to 10 bytes of ghost: about 60 bytes.  The cost is per inode
number *in the range* of an allocated page, not per entry: a tracked set
spread thinly over a much larger inode range (fewer than about one inode
number in 10 tracked) costs more than the dict did (about 120 to 170
bytes per entry), and a lone inode in its page costs 36 KB (40 KB with
epochs).  The daemon's inode numbers come in sequence, so a tier's set is
dense unless it is a small, scattered part of a much larger namespace.

The queues are ``collections.deque`` of inodes (8 bytes a slot).
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
More slots would recall more at 5 bytes a slot.  When the tracked count
outgrows the table, a table twice as large starts empty.  Measured per
entry in the unit tests and ``tests/bench/bench_eviction.py``.

``LruTracker`` is plain LRU (``OrderedDict``, move to end on every hit) with
the same interface, kept for comparison in the benchmark and tests
(``used`` and ``settle`` mean nothing to it).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Protocol

__all__ = [
    "EvictionTracker",
    "LruTracker",
    "S3FifoTracker",
]

_SMALL, _MAIN, _FIRST = 0, 1, 2
_QUEUE_NAMES = ("small", "main", "first")
# The state byte of an inode: freq in bits 0-1, queue in bits 2-3, and
# ``_TRACKED`` so that a tracked entry is never 0 (0 = not tracked here).
_FREQ_MASK = 3
_QUEUE_SHIFT = 2
_TRACKED = 0x10
# Inserted by a fetch no reader asked for (``on_insert(used=False)``): the
# first access clears it and counts nothing (see "Not yet used").
_UNUSED = 0x20
_MAX_FREQ = 3
# Pages: one per 4096 consecutive inode numbers.
_PAGE_BITS = 12
_PAGE_SLOTS = 1 << _PAGE_BITS
_SLOT_MASK = _PAGE_SLOTS - 1
_EMPTY_SIZES = bytes(8 * _PAGE_SLOTS)  # one zeroed array("q") page, copied on allocation
_NONZERO_TO_ONE = bytes([0] + [1] * 255)  # bytes.translate table: tracked slots -> 1
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


class _NoGhost(_Ghost):
    """The ghost of a ``copy``: it remembers nothing."""

    def __init__(self) -> None:
        pass

    def add(self, ino: int, limit: int) -> None:
        pass

    def contains(self, ino: int, limit: int) -> bool:
        return False

    def discard(self, ino: int) -> None:
        pass


_NO_GHOST = _NoGhost()


def _never(_ino: int) -> bool:
    return False


class EvictionTracker(Protocol):
    """What the core calls; see the module docstring."""

    def on_insert(self, ino: int, nbytes: int, *, used: bool = True) -> None: ...
    def on_access(self, ino: int, nbytes: int = 0) -> bool: ...
    def on_remove(self, ino: int) -> None: ...
    def on_evict(self, ino: int) -> None: ...
    def set_size(self, ino: int, nbytes: int) -> None: ...
    def demote_first(self, ino: int) -> None: ...
    def victims(
        self, bytes_to_free: int, skip: Callable[[int], bool] = _never
    ) -> Iterator[int]: ...
    def ranking(self) -> list[int]: ...
    def ranking_later(self) -> Callable[[], list[int]]: ...
    def settle(self, bytes_to_free: int) -> None: ...
    def inodes(self) -> list[int]: ...
    def set_capacity(self, capacity: int) -> None: ...
    def __contains__(self, ino: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def tracked_bytes(self) -> int: ...


class S3FifoTracker:
    """S3-FIFO over files; see the module docstring (the layout is under "Implementation")."""

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
        # A state page holds 4096 state bytes; in burst mode each is followed by
        # its epoch byte (the same cache line): slot i at index i * stride.
        self._stride = 2 if self._burst_window else 1
        if not self._burst_window:
            self.on_access = self._on_access_every_time  # type: ignore[method-assign]
        self._small_fraction = small_fraction
        self._small_target = 0
        self.set_capacity(capacity)
        self._states: dict[int, bytearray] = {}  # ino >> 12 -> state (and epoch) bytes
        self._sizes: dict[int, array[int]] = {}  # ino >> 12 -> nbytes per slot
        self._live_in_page: dict[int, int] = {}  # ino >> 12 -> tracked entries in the page
        self._count = 0
        self._queues: tuple[deque[int], deque[int], deque[int]] = (deque(), deque(), deque())
        self._bytes = [0, 0, 0]
        self._ghost = _Ghost()

    # --- state -----------------------------------------------------------------------

    def set_capacity(self, capacity: int) -> None:
        """The tier's capacity in bytes: small's share of it is ``small_fraction``."""
        self.capacity = max(0, capacity)
        self._small_target = int(self.capacity * self._small_fraction)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, ino: object) -> bool:
        return isinstance(ino, int) and self._state(ino) != 0

    def _state(self, ino: int) -> int:
        """The state byte of ``ino``: 0 when it is not tracked."""
        page = self._states.get(ino >> _PAGE_BITS)
        return 0 if page is None else page[(ino & _SLOT_MASK) * self._stride]

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

    @property
    def pages(self) -> int:
        """Allocated pages (of 4096 inode numbers): for tests and memory figures."""
        return len(self._states)

    def in_ghost(self, ino: int) -> bool:
        return self._ghost.contains(ino, self._ghost_limit())

    def _ghost_limit(self) -> int:
        return max(self._count, 1)

    def freq_of(self, ino: int) -> int | None:
        """Its count of accesses after the first (0 to 3), or None: for tests."""
        state = self._state(ino)
        return state & _FREQ_MASK if state else None

    def queue_of(self, ino: int) -> str | None:
        """ "small", "main", "first" or None: for tests and ``status``."""
        state = self._state(ino)
        return _QUEUE_NAMES[state >> _QUEUE_SHIFT & 3] if state else None

    # --- events ----------------------------------------------------------------------

    def on_insert(self, ino: int, nbytes: int, *, used: bool = True) -> None:
        """``ino`` got data on the tier.  ``used``: a reader has it open, so
        this insert is its first use; False: a fetch nobody asked for yet
        (readahead, preload, a move), whose first access is its first use."""
        page_no = ino >> _PAGE_BITS
        slot = ino & _SLOT_MASK
        index = slot * self._stride
        page = self._states.get(page_no)
        if page is not None and page[index]:
            self.set_size(ino, nbytes)
            return
        if self._ghost.contains(ino, self._ghost_limit()):
            self._ghost.discard(ino)
            queue = _MAIN
        else:
            queue = _SMALL
        if page is None:
            page = self._states[page_no] = bytearray(_PAGE_SLOTS * self._stride)
            self._sizes[page_no] = array("q", _EMPTY_SIZES)
            self._live_in_page[page_no] = 0
        self._tick()  # first: the reads of this burst must see the epoch stored here
        page[index] = _TRACKED | queue << _QUEUE_SHIFT | (0 if used else _UNUSED)
        if self._burst_window:
            page[index + 1] = self._epoch
        self._sizes[page_no][slot] = nbytes
        self._live_in_page[page_no] += 1
        self._count += 1
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

        The hot path: a lookup in the small dict of pages, one byte read; one
        byte written (two with the epoch) only when the count grows (a new
        burst, freq below 3): a file read often is saturated and costs no
        store.  No int object is allocated but the page number's.
        """
        page = self._states.get(ino >> _PAGE_BITS)
        if page is None:
            return False
        index = (ino & _SLOT_MASK) << 1  # the state byte, then the epoch byte
        state = page[index]
        if not state:
            return False
        if state & _FREQ_MASK == _MAX_FREQ:
            return True  # saturated: nothing to count, nothing to store
        if state & _UNUSED:  # its first use: counts nothing, starts its burst
            page[index] = state ^ _UNUSED
            page[index + 1] = self._epoch
            return True
        if page[index + 1] == self._epoch:
            return True  # the same burst: counted already
        ticks_left = self._ticks_left - 1  # self._tick(), inlined
        if ticks_left <= 0:
            ticks_left = self._burst_window
            self._epoch = (self._epoch + 1) & 0xFF
        self._ticks_left = ticks_left
        page[index] = state + 1
        page[index + 1] = self._epoch
        return True

    def _on_access_every_time(self, ino: int, nbytes: int = 0) -> bool:
        """``on_access`` with ``burst_window=0``: every access counts."""
        page = self._states.get(ino >> _PAGE_BITS)
        if page is None:
            return False
        slot = ino & _SLOT_MASK
        state = page[slot]
        if not state:
            return False
        if state & _UNUSED:
            page[slot] = state ^ _UNUSED
        elif state & _FREQ_MASK != _MAX_FREQ:
            page[slot] = state + 1
        return True

    def set_size(self, ino: int, nbytes: int) -> None:
        page_no = ino >> _PAGE_BITS
        slot = ino & _SLOT_MASK
        page = self._states.get(page_no)
        state = 0 if page is None else page[slot * self._stride]
        if not state:
            return
        sizes = self._sizes[page_no]
        self._bytes[state >> _QUEUE_SHIFT & 3] += nbytes - sizes[slot]
        sizes[slot] = nbytes

    def _forget(self, ino: int) -> int:
        """Stop tracking ``ino`` (tracked): its bytes leave its queue; frees an emptied page.

        Its deque slot goes stale.  Returns its size.
        """
        page_no = ino >> _PAGE_BITS
        slot = ino & _SLOT_MASK
        page = self._states[page_no]
        nbytes = self._sizes[page_no][slot]
        self._bytes[page[slot * self._stride] >> _QUEUE_SHIFT & 3] -= nbytes
        self._count -= 1
        left = self._live_in_page[page_no] - 1
        if left:
            self._live_in_page[page_no] = left
            page[slot * self._stride] = 0
        else:
            del self._states[page_no], self._sizes[page_no], self._live_in_page[page_no]
        return nbytes

    def on_remove(self, ino: int) -> None:
        if self._state(ino):
            self._forget(ino)
        self._ghost.discard(ino)

    def on_evict(self, ino: int) -> None:
        """``ino`` left the tier because the planner demoted or dropped it,
        as ``victims`` gives files up: forgotten, and, if it left from the
        small queue, remembered in the ghost, so that if it comes back soon
        (a promotion, a fetch) it goes straight to main."""
        state = self._state(ino)
        if state:
            self._forget(ino)
            if state >> _QUEUE_SHIFT & 3 == _SMALL:
                self._ghost.add(ino, self._ghost_limit())

    def demote_first(self, ino: int) -> None:
        page_no = ino >> _PAGE_BITS
        slot = ino & _SLOT_MASK
        page = self._states.get(page_no)
        index = slot * self._stride
        state = 0 if page is None else page[index]
        if page is None or not state or state >> _QUEUE_SHIFT & 3 == _FIRST:
            return
        self._requeue(page, index, state, _FIRST, self._sizes[page_no][slot])
        self._queues[_FIRST].append(ino)

    def _requeue(self, page: bytearray, index: int, state: int, queue: int, nbytes: int) -> None:
        """The entry at ``page[index]`` (``state``, ``nbytes``) now belongs to
        ``queue``, with freq 0 (and epoch 0), its bytes counted there.  The
        caller puts it in that queue's deque."""
        page[index] = _TRACKED | queue << _QUEUE_SHIFT
        if self._burst_window:
            page[index + 1] = 0
        self._bytes[state >> _QUEUE_SHIFT & 3] -= nbytes
        self._bytes[queue] += nbytes

    # --- eviction --------------------------------------------------------------------

    def inodes(self) -> list[int]:
        """Every tracked inode, in no particular order."""
        out: list[int] = []
        for page_no, page in self._states.items():
            base = page_no << _PAGE_BITS
            tracked = page[:: self._stride].translate(_NONZERO_TO_ONE)
            slot = tracked.find(1)
            while slot >= 0:
                out.append(base + slot)
                slot = tracked.find(1, slot + 1)
        return out

    def ranking(self) -> list[int]:
        """Every tracked inode, least valuable first, changing nothing.

        Exactly the order in which ``victims`` would give them all up (no
        skip): ``victims`` runs on a private copy of the queues (``copy``),
        with the same transitions (re-accessed small files move to main,
        main's files spend their second chances).  For the planner (``tierfs
        policy plan`` and the mover).  O(n) in the tracked files, about five
        pops each at most; the copy can run in another thread.
        """
        return self.copy().drain()

    def ranking_later(self) -> Callable[[], list[int]]:
        """``ranking`` as of now, worked out when called, in any thread: the
        copy is made now (about 14 ms at 1M entries), the walk later (about
        1.2 s at 1M entries: not on the event loop)."""
        return self.copy().drain

    def copy(self) -> S3FifoTracker:
        """A private copy of the queues and states (no ghost: it never
        inserts), for ``drain`` off the event loop.  O(n) memory copies."""
        twin = S3FifoTracker.__new__(S3FifoTracker)
        twin.__dict__.update(self.__dict__)
        twin._states = {page_no: bytearray(page) for page_no, page in self._states.items()}
        twin._sizes = {page_no: array("q", sizes) for page_no, sizes in self._sizes.items()}
        twin._live_in_page = dict(self._live_in_page)
        twin._queues = (deque(self._queues[0]), deque(self._queues[1]), deque(self._queues[2]))
        twin._bytes = list(self._bytes)
        twin._ghost = _NO_GHOST
        if not self._burst_window:  # ``on_access`` is bound per instance
            twin.on_access = twin._on_access_every_time  # type: ignore[method-assign]
        return twin

    def drain(self) -> list[int]:
        """Give up every entry (``victims`` with no limit): the order.  Run
        it on a ``copy``; it leaves the tracker empty."""
        order = list(self.victims(self.tracked_bytes + 1))
        if self._count:  # entries of 0 bytes are not needed to reach the limit
            order += self.inodes()
        return order

    def settle(self, bytes_to_free: int) -> None:
        """Make the queue moves that giving up ``bytes_to_free`` would make,
        without giving anything up: re-accessed files of the small queue go
        to main, main's files spend second chances, and the files
        ``victims`` would yield are parked at the head of the "first" queue,
        in that order, to be taken by the plan's moves (``on_evict``).  The
        mover calls it for what a pass must free, so that its plan's S3-FIFO
        transitions persist as the emergency path's do.  ``ranking`` after
        it is ``ranking`` before it."""
        for _ in self._evict(bytes_to_free, _never, keep=True):
            pass

    def victims(self, bytes_to_free: int, skip: Callable[[int], bool] = _never) -> Iterator[int]:
        """Inodes to give up, least valuable first, until ``bytes_to_free`` are yielded."""
        return self._evict(bytes_to_free, skip, keep=False)

    def _evict(self, bytes_to_free: int, skip: Callable[[int], bool], keep: bool) -> Iterator[int]:
        """The S3-FIFO eviction walk (``victims``, ``settle``, ``drain``).

        ``keep`` (``settle``): a file to give up is not forgotten but parked
        in the "first" queue (its state says so at once, so later slots of
        it are stale), and the parked files go to that queue's head, in the
        order given up, when the walk ends.  A later walk therefore gives
        them up first, in that order, and then finds small and main as this
        walk left them.  The choice between small and main uses the bytes
        left in small as the walk sees them."""
        freed = 0
        states = self._states
        stride = self._stride
        queues = self._queues
        small, main, first = queues
        small_bytes = self._bytes[_SMALL]
        aside: tuple[list[int], list[int], list[int]] = ([], [], [])
        parked: list[int] = []  # with ``keep``: given up, in order
        # Each live entry is popped at most ~5 times (small -> main, 3 second
        # chances, then out or skipped): this bounds the call even when
        # every entry is skipped.
        budget = 5 * (len(small) + len(main) + len(first)) + 5
        try:
            while freed < bytes_to_free and budget > 0:
                if first:
                    queue_id, queue = _FIRST, first
                elif main and (not small or small_bytes < self._small_target):
                    queue_id, queue = _MAIN, main
                elif small:
                    queue_id, queue = _SMALL, small
                elif main:
                    queue_id, queue = _MAIN, main
                else:
                    return
                ino = queue.popleft()
                page = states.get(ino >> _PAGE_BITS)
                slot = ino & _SLOT_MASK
                index = slot * stride
                state = 0 if page is None else page[index]
                if page is None or not state or state >> _QUEUE_SHIFT & 3 != queue_id:
                    continue  # a stale slot
                budget -= 1
                if skip(ino):
                    aside[queue_id].append(ino)
                    continue
                freq = state & _FREQ_MASK
                if queue_id == _MAIN and freq > 0:
                    page[index] = state - 1
                    main.append(ino)
                    continue
                nbytes = self._sizes[ino >> _PAGE_BITS][slot]
                if queue_id == _SMALL and freq > 0:
                    self._requeue(page, index, state, _MAIN, nbytes)
                    small_bytes -= nbytes
                    main.append(ino)
                    continue
                if queue_id == _SMALL:
                    small_bytes -= nbytes
                freed += nbytes
                budget += 1  # a yield is progress, not a wasted pop
                if keep:
                    self._requeue(page, index, state, _FIRST, nbytes)
                    parked.append(ino)
                else:
                    self._forget(ino)
                    if queue_id == _SMALL:
                        self._ghost.add(ino, self._ghost_limit())
                yield ino
        finally:
            for queue, set_aside in zip(queues, aside, strict=True):
                queue.extendleft(reversed(set_aside))
            first.extendleft(reversed(parked))


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

    def ranking_later(self) -> Callable[[], list[int]]:
        order = list(self._lru)
        return lambda: order

    def settle(self, bytes_to_free: int) -> None:
        """LRU has no queue moves to make."""

    def on_insert(self, ino: int, nbytes: int, *, used: bool = True) -> None:
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

    def on_evict(self, ino: int) -> None:
        self.on_remove(ino)

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
