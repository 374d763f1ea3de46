"""BlockBuffers: reusable, page-aligned block buffers for fetched data.

Why: a cold read used to receive every ranged GET into a new bytes object,
copy it into an aligned buffer for O_DIRECT, and copy each FUSE reply out
of it again.  New memory costs a page fault and a cleared page per 4 KiB
(on a VM, often a fault in the host as well): perf showed clearing fresh
pages and the copies at about a fifth of the daemon's CPU on a cold read.
With this pool the socket is read straight into a buffer that is already
mapped (``ObjectStore.get_range_into``), the O_DIRECT write goes out of the
same buffer, and the block stays there, in ``BlockCache``'s recent blocks,
to answer the reads that follow without another copy.

Invariants:

* Every buffer is an anonymous ``mmap`` of exactly ``block_size`` bytes:
  page-aligned, as O_DIRECT needs.
* A buffer has one owner at a time: the pool (free), one fetch (between
  ``take`` and handing it to the recent blocks or ``give``), or the recent
  blocks.  Only the owner writes to it.  ``take`` and ``give`` are safe from
  any thread.
* A reply built from a recent buffer (a ``memoryview``) is a loan: it is
  valid until its holder next yields to the event loop, because only the
  loop gives recent buffers back to the pool.  pyfuse3 sends a read reply
  before it yields, so FUSE reads may return such views; nothing else may
  keep one.
* At most ``keep`` buffers wait in the pool; the others are unmapped when
  given back (or, while a view of one is still alive, when it dies).
  ``keep`` covers the recent blocks plus the fetches in flight, so a
  sequential read in steady state maps no new memory (a pool of two runs'
  worth mapped a new buffer for every second block).  ``trim`` unmaps all
  free buffers once none was taken for ``IDLE_TRIM_SECONDS``: an idle mount
  holds no fetch memory beyond its recent blocks.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import time

#: Free buffers are unmapped after this long without a ``take``.
IDLE_TRIM_SECONDS = 10.0


class BlockBuffers:
    def __init__(self, block_size: int, keep: int) -> None:
        self.block_size = block_size
        self.keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._last_take = time.monotonic()
        #: Buffers mapped so far (a measure of how well reuse works).
        self.created = 0

    def take(self) -> mmap.mmap:
        """A buffer of ``block_size`` bytes with undefined content."""
        with self._lock:
            self._last_take = time.monotonic()
            if self._free:
                return self._free.pop()
            self.created += 1
        return mmap.mmap(-1, self.block_size, flags=mmap.MAP_PRIVATE)

    def give(self, buf: mmap.mmap) -> None:
        """Return a buffer taken from this pool; the caller must not use it again."""
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)
                return
        # While a view of it is still alive, it is unmapped when the last one dies.
        with contextlib.suppress(BufferError):
            buf.close()

    def trim(self, now: float | None = None) -> int:
        """Unmap every free buffer if none was taken for IDLE_TRIM_SECONDS;
        returns how many were unmapped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last_take < IDLE_TRIM_SECONDS:
                return 0
            free, self._free = self._free, []
        for buf in free:
            buf.close()
        return len(free)

    @property
    def free(self) -> int:
        return len(self._free)
