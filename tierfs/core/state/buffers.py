"""BlockBuffers: reusable, page-aligned block buffers for fetched data.

Why: a cold read used to receive every ranged GET into a new bytes object,
copy it into an aligned buffer for O_DIRECT, and copy each FUSE reply out
of it again.  New memory costs a page fault and a cleared page per 4 KiB
(on a VM, often a fault in the host as well): perf showed clearing fresh
pages and the copies at about a fifth of the daemon's CPU on a cold read.
With this pool the socket is read straight into a buffer that is already
mapped (``ObjectStore.get_range_into``), the O_DIRECT write goes out of the
same buffer, and the block stays there, in the recent blocks (``RecentBlocks``),
to answer the reads that follow without another copy.

Invariants:

* Every buffer is an anonymous ``mmap`` of exactly ``block_size`` bytes:
  page-aligned, as O_DIRECT needs.
* A buffer has one owner at a time: the pool (free), one fetch (between
  ``take`` and handing it to the recent blocks or ``give``), or the recent
  blocks.  Only the owner writes to it.  ``take`` and ``give`` are safe from
  any thread.
* A buffer in the pool has no live view (``memoryview``).  A view can
  outlive its owner's ``give``: a fetch that raised (a reset, a truncated
  body) leaves its views in the frames its traceback keeps, and nothing
  says when that traceback dies.  Pooling such a buffer would hand memory
  that someone still reads (or writes, for a receive still in flight) to
  the next fetch, and ``trim`` would fail on it (``mmap.close`` raises
  BufferError while views exist).  So ``give`` asks the mmap whether it is
  exported (a resize to its own size raises BufferError while a view
  exists, and costs one ``mremap`` otherwise) and drops a buffer that is:
  the pool forgets it and the mmap is unmapped when its last view dies.
  ``take`` checks again, so a view made after a ``give`` (a bug) cannot
  let a buffer out twice.  The owner should release its own views before
  ``give`` (``Fetcher`` does), so that only views it cannot reach (in a
  traceback) cost a buffer.  ``dropped_in_use`` counts the buffers dropped
  that way.
* A reply built from a recent buffer (a ``memoryview``) is a loan: it is
  valid until its holder next yields to the event loop, because only the
  loop gives recent buffers back to the pool.  pyfuse3 sends a read reply
  before it yields, so FUSE reads may return such views; nothing else may
  keep one.
* At most ``keep`` buffers wait in the pool; the others are unmapped when
  given back.  ``keep`` covers the recent blocks plus the fetches in
  flight, so a sequential read in steady state maps no new memory (a pool
  of two runs' worth mapped a new buffer for every second block).  ``trim``
  unmaps all free buffers once none was taken for ``IDLE_TRIM_SECONDS``: an
  idle mount holds no fetch memory beyond its recent blocks.  Neither
  ``give`` nor ``trim`` ever raises for a buffer with a live view.

State of one buffer: mapped by ``take`` -> owned (fetch / recent blocks)
-> ``give``: free in the pool (no view alive, room in the pool), or
unmapped now (no view alive, pool full), or dropped (a view alive: unmapped
by the garbage collector with its last view) -> a free buffer is taken
again, or unmapped by ``trim``.
"""

from __future__ import annotations

import collections
import mmap
import threading
import time
from collections.abc import Iterable

#: Free buffers are unmapped after this long without a ``take``.
IDLE_TRIM_SECONDS = 10.0


def has_live_view(buf: mmap.mmap) -> bool:
    """Does a ``memoryview`` (or another buffer export) of ``buf`` exist?

    CPython's mmap refuses to resize while it is exported; a resize to its
    own length is otherwise a no-op ``mremap`` (Linux).  Any other failure
    of the probe counts as "in use": a buffer we cannot vouch for is never
    pooled."""
    try:
        buf.resize(len(buf))
    except (BufferError, OSError, ValueError, TypeError, SystemError):
        return True
    return False


class BlockBuffers:
    def __init__(self, block_size: int, keep: int) -> None:
        self.block_size = block_size
        self.keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._last_take = time.monotonic()
        #: Buffers mapped so far (a measure of how well reuse works).
        self.created = 0
        #: Buffers given back (or found in the pool) while a view of them was
        #: alive: left to the garbage collector instead of being reused.
        self.dropped_in_use = 0

    def take(self) -> mmap.mmap:
        """A buffer of ``block_size`` bytes with undefined content, and no
        view of it alive anywhere."""
        with self._lock:
            self._last_take = time.monotonic()
            while self._free:
                buf = self._free.pop()
                if not has_live_view(buf):
                    return buf
                self.dropped_in_use += 1
            self.created += 1
        return mmap.mmap(-1, self.block_size, flags=mmap.MAP_PRIVATE)

    def give(self, buf: mmap.mmap) -> None:
        """Return a buffer taken from this pool; the caller must not use it
        again.  A buffer that still has a live view is dropped, not pooled
        (see the module docstring)."""
        if has_live_view(buf):
            with self._lock:
                self.dropped_in_use += 1
            return
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)
                return
        self._unmap(buf)

    def trim(self, now: float | None = None) -> int:
        """Unmap every free buffer if none was taken for IDLE_TRIM_SECONDS;
        returns how many were unmapped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last_take < IDLE_TRIM_SECONDS:
                return 0
            free, self._free = self._free, []
        return sum(1 for buf in free if self._unmap(buf))

    def _unmap(self, buf: mmap.mmap) -> bool:
        """Unmap ``buf`` now; False if a view appeared meanwhile (then the
        garbage collector unmaps it with its last view)."""
        try:
            buf.close()
        except BufferError:
            with self._lock:
                self.dropped_in_use += 1
            return False
        return True

    @property
    def free(self) -> int:
        return len(self._free)


class RecentBlocks:
    """Blocks just fetched, kept in their pooled buffers for the reads that
    follow (a read of one is answered with a view of its buffer, no copy);
    at most ``max_bytes`` of them, oldest given back first.

    On the loop only.  A buffer here is owned by this table until it is
    evicted or forgotten, which gives it back to ``pool``."""

    def __init__(self, pool: BlockBuffers, max_bytes: int) -> None:
        self.pool = pool
        self.max_bytes = max_bytes
        #: (ino, blockno) -> (pooled buffer, valid bytes).
        self._blocks: collections.OrderedDict[tuple[int, int], tuple[mmap.mmap, int]] = (
            collections.OrderedDict()
        )

    @classmethod
    def sized_for(cls, block_size: int, readahead_max: int) -> RecentBlocks:
        """Recent blocks for readers with this readahead, with their pool:
        at least 16 blocks, and a pool that holds them plus a full readahead
        window in flight."""
        max_bytes = max(readahead_max, 16 * block_size)
        return cls(BlockBuffers(block_size, keep=2 * (max_bytes // block_size)), max_bytes)

    def get(self, ino: int, blockno: int) -> tuple[mmap.mmap, int] | None:
        return self._blocks.get((ino, blockno))

    def remember(self, ino: int, blockno: int, buf: mmap.mmap, nbytes: int) -> None:
        """Keep ``buf`` (``nbytes`` valid) as block ``blockno`` of ``ino``."""
        self.forget(ino, [blockno])
        self._blocks[(ino, blockno)] = (buf, nbytes)
        while len(self._blocks) * self.pool.block_size > self.max_bytes:
            _, (evicted, _n) = self._blocks.popitem(last=False)
            self.pool.give(evicted)

    def forget(self, ino: int, blocknos: Iterable[int] | None = None) -> None:
        """Give back the buffers of these blocks of ``ino`` (None: all of them)."""
        keys = (
            [k for k in self._blocks if k[0] == ino]
            if blocknos is None
            else [(ino, b) for b in blocknos]
        )
        for key in keys:
            old = self._blocks.pop(key, None)
            if old is not None:
                self.pool.give(old[0])
