"""The block cache: serving reads of open files from the tiers.

A file's bytes are cut into blocks of ``block_size``.  This module serves
``read`` from the blocks on the tiers (and the recent blocks in memory),
checks each block once per mount before it is served, and reads ahead of
sequential readers.  Absent blocks are filled by the fetcher
(:mod:`tierfs.core.read.fetcher`); the state of the files in use is the
open-file table (:mod:`tierfs.core.state.openfiles`); writes, truncates and
their commit are :mod:`tierfs.core.write.blockwrites`; moving a file's blocks
between tiers is :mod:`tierfs.core.tiering.movement`.

Per block, what a read sees:

    absent, below origin_size: fetched first (the fetcher), then served
    absent, at/after origin_size: a hole, reads as zeros (nothing stored)
    clean (from an earlier mount, or moved) --first read: xxh3 ok--> clean+verified
    clean --first read: xxh3 mismatch--> absent (refetched; never served;
          the tier's accounting of the file is re-derived)
    dirty, unsealed: served as written (no digest yet)
    dirty, sealed --first read: xxh3 ok--> dirty, sealed+verified
    dirty, sealed --first read: xxh3 mismatch--> DAMAGED: reads of it get
          EIO, the file is ``failed`` and is never uploaded
    no tier had room: the block is kept in memory (``CachedFile.transient``)

Dirty blocks are never evicted or dropped, damaged ones included: they
are the only copy.

On damage (``on_damage``, ``DamageLog.block_damaged``) the file is marked
``failed`` in LMDB, which ``tierfs where`` and ``tierfs status`` show, the
daemon log names the file and block, and the upload is refused until the
file's content changes.  What an operator does then: the damaged block's
bytes are lost (it was the only copy); restore the file from a good copy
(or rewrite the lost range) through the mount, or delete it.  A rewrite
makes the file upload again, and a clean upload clears ``failed``.

Concurrency rules:

* Cache hits are served inline on the trio loop: one ``os.pread`` per run
  of blocks on the same tier.  No thread hop, no LMDB write.
* The first-read check of a block runs in a thread (``io_limiter``).
* One fetch or check per block at a time (``Flight``); other readers of
  the block wait for it and share its outcome.  A demand read that needs a
  block a lower-priority fetch is waiting for raises that fetch's priority
  (:mod:`tierfs.core.read.fetcher`, "Priority").

Readahead: each open handle tracks its last read.  A read that continues
the previous one is sequential; each time a sequential reader enters a new
block the window may grow, from 1 block up to ``readahead_max``: it doubles
up to two full-size GETs, and beyond that only while a wider window makes
the reader faster (:mod:`tierfs.core.read.readahead`).  Blocks in the window
that are absent are fetched in the background (at DEMAND priority); cached
ones are read ahead by the kernel (``POSIX_FADV_WILLNEED``) and checked.
A sequential reader gives the buffers of blocks two behind it back to the
pool (the page cache has their bytes).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from tierfs.errors import BlockDamaged, StoreError, TierfsError
from tierfs.meta import BlockRecord
from tierfs.tiers import pread_padded

from ..state.digests import read_and_hash
from ..state.fetch_slots import FetchPriority
from ..state.openfiles import CachedFile, Flight, OpenFiles, wait_flights
from .fetcher import Fetcher
from .readahead import ReadaheadWindow

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReadState:
    """Sequential detection and readahead window of one open handle."""

    window: ReadaheadWindow
    last_end: int = 0  # a first read at offset 0 counts as sequential
    last_block: int = -1


class BlockCache:
    """Serves reads from the tiers (see the module docstring)."""

    def __init__(
        self,
        open_files: OpenFiles,
        fetcher: Fetcher,
        *,
        block_size: int,
        readahead_max: int,
        on_damage: Callable[[int, int, int, str], None] | None = None,
        on_slow_tier_read: Callable[[int, int], None] | None = None,
    ) -> None:
        """``on_damage``: (ino, blockno, tier, during) when a dirty block
        failed its checksum; ``on_slow_tier_read``: (ino, tier) when a read
        was served from a tier other than the first (the lifecycle may
        promote the file), O(1), on the read path."""
        self.open_files = open_files
        self.recent = open_files.recent
        self.fetcher = fetcher
        self.stats = open_files.stats
        self.block_size = block_size
        self.max_window = max(1, readahead_max // block_size)
        #: Threads for the first-read checks and the block writes' disk work.
        self.io_limiter = trio.CapacityLimiter(4)
        self.on_damage: Callable[[int, int, int, str], None] = on_damage or (
            lambda ino, b, t, during: None
        )
        self.on_slow_tier_read: Callable[[int, int], None] = on_slow_tier_read or (
            lambda ino, tier: None
        )
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def new_read_state(self) -> ReadState:
        """Readahead state for a new handle (see :mod:`tierfs.core.read.readahead`)."""
        return ReadState(
            ReadaheadWindow(min_window=2 * self.fetcher.max_run_blocks, max_window=self.max_window)
        )

    # --- reads -----------------------------------------------------------------------

    async def read(
        self, cf: CachedFile, offset: int, size: int, state: ReadState
    ) -> bytes | memoryview:
        """Bytes ``[offset, offset+size)`` of the file, clipped at its end.

        A memoryview is a loan of a recent block's buffer (see
        :mod:`tierfs.core.state.buffers`): use it before the next ``await``."""
        end = min(offset + size, cf.size)
        if offset >= end:
            return b""
        self.stats.read_requests += 1
        self.stats.read_bytes += end - offset
        bs = self.block_size
        first, last = offset // bs, (end - 1) // bs
        self._update_readahead(cf, state, offset, end, first, last)
        size_before, generation = cf.size, cf.generation
        for attempt in range(3):
            await self.ensure(cf, range(first, last + 1))
            if cf.generation != generation:  # the object changed (e.g. If-Match failed)
                generation = cf.generation
                if cf.size > size_before:
                    # The kernel clips this read at the size it was told:
                    # an error, not the new bytes cut at the old size.
                    raise StoreError(
                        f"{cf.key} grew in the bucket since it was opened: open it again",
                        errno=errno.ESTALE,
                    )
                size_before = cf.size
                end = min(offset + size, cf.size)
                if offset >= end:
                    return b""
                last = (end - 1) // bs
                continue
            data = self._assemble(cf, offset, end, first, last)
            if data is not None:
                return data
            log.debug("blocks of inode %d vanished during read, retry %d", cf.ino, attempt)
        raise StoreError(f"{cf.key}: blocks kept disappearing during the read")

    def _assemble(
        self, cf: CachedFile, offset: int, end: int, first: int, last: int
    ) -> bytes | memoryview | None:
        """Bytes [offset, end) from present blocks; None if one is missing."""
        bs = self.block_size
        pieces: list[bytes | memoryview] = []
        run_tier, run_start, pos = -1, offset, offset
        for blockno in range(first, last + 1):
            rec = cf.blocks.get(blockno)
            block_end = min(end, (blockno + 1) * bs)
            recent = self.recent.get(cf.ino, blockno) if rec is not None else None
            if recent is not None and not rec.dirty:
                if run_tier >= 0:
                    pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier = -1
                buf, valid = recent
                base = blockno * bs
                if block_end - base <= valid:
                    pieces.append(memoryview(buf)[pos - base : block_end - base])
                else:  # the file grew since the fetch: zeros after the fetched bytes
                    piece = bytes(memoryview(buf)[pos - base : max(pos - base, valid)])
                    pieces.append(piece + bytes(block_end - pos - len(piece)))
                self.stats.hit_blocks += 1
            elif rec is not None and self.open_files.ready(cf, blockno, rec):
                if rec.tier != run_tier:
                    if run_tier >= 0:
                        pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier, run_start = rec.tier, pos
                self.stats.hit_blocks += 1
                self.stats.tier_hit_blocks[rec.tier] += 1
            else:
                if rec is not None:
                    return None  # present, but not checked yet: the caller ensures again
                if run_tier >= 0:
                    pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier = -1
                if blockno * bs >= cf.inode.origin_size:
                    pieces.append(bytes(block_end - pos))  # a hole
                    pos = block_end
                    continue
                buf = cf.transient.get(blockno)
                if buf is None:
                    return None
                pieces.append(buf[pos - blockno * bs : block_end - blockno * bs])
            pos = block_end
        if run_tier >= 0:
            pieces.append(self._pread(cf, run_tier, run_start, pos))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _pread(self, cf: CachedFile, tier: int, start: int, end: int) -> bytes:
        if tier:
            self.on_slow_tier_read(cf.ino, tier)
        return pread_padded(self.open_files.fd(cf, tier), end - start, start)

    async def ensure(self, cf: CachedFile, blocknos: Iterable[int]) -> None:
        """Make every block present and verified (or transient)."""
        waits: list[Flight] = []
        absent: list[int] = []
        for blockno in blocknos:
            if blockno in cf.transient:
                continue
            rec = cf.blocks.get(blockno)
            if rec is None and blockno * self.block_size >= cf.inode.origin_size:
                continue  # a hole
            if rec is not None and self.open_files.ready(cf, blockno, rec):
                continue
            if rec is None and blockno not in cf.flights:
                absent.append(blockno)
            else:
                waits.append(self._start_flight(cf, blockno))
        waits += self.fetcher.start_fetches(cf, absent)
        await wait_flights(cf, waits)

    def _start_flight(self, cf: CachedFile, blockno: int) -> Flight:
        """The flight of a block a demand read needs (one of lower priority
        is promoted: see "Priority")."""
        flight = cf.flights.get(blockno)
        if flight is not None:
            self.fetcher.raise_priority(flight, FetchPriority.DEMAND)
            return flight
        flight = cf.flights[blockno] = Flight()
        assert self._nursery is not None, "BlockCache.start() was not called"
        self._nursery.start_soon(self._run_flight, cf, blockno, flight)
        return flight

    async def _run_flight(self, cf: CachedFile, blockno: int, flight: Flight) -> None:
        try:
            rec = cf.blocks.get(blockno)
            if rec is not None and rec.dirty:
                await self._verify_dirty(cf, blockno, rec)
            else:
                if rec is not None and not await self._verify(cf, blockno, rec):
                    rec = None
                if rec is None:
                    await self.fetcher.fetch(cf, [blockno])
        except Exception as exc:
            flight.error = exc
            if not isinstance(exc, TierfsError):
                log.exception("fetching block %d of %r failed", blockno, cf.key)
        finally:
            del cf.flights[blockno]
            flight.done.set()
            self.open_files.close_if_idle(cf)

    async def _hash_block(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> int:
        fd = self.open_files.fd(cf, rec.tier)
        return await trio.to_thread.run_sync(
            read_and_hash, fd, blockno * self.block_size, rec.nbytes, limiter=self.io_limiter
        )

    async def _verify(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> bool:
        """Check a clean block cached by an earlier mount (or moved) against
        its digest.  False: it was damaged, and is dropped (to be refetched)."""
        digest = await self._hash_block(cf, blockno, rec)
        if cf.changed_since(blockno, rec):
            return True  # rewritten meanwhile: the writer's bytes are the truth
        if digest == rec.digest:
            self.open_files.mark_verified(cf.ino, blockno)
            return True
        self.stats.verify_failures += 1
        log.error(
            "checksum mismatch in cached block %d of %r on tier %s: refetching it",
            blockno,
            cf.key,
            self.open_files.tiers[rec.tier].name,
        )
        self.open_files.drop_damaged_clean(cf, blockno)
        return False

    async def _verify_dirty(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> None:
        """Check a sealed dirty block against its digest; BlockDamaged if it
        fails (it is the only copy: it stays, and the file is failed)."""
        if not rec.sealed:
            return
        digest = await self._hash_block(cf, blockno, rec)
        if cf.changed_since(blockno, rec):
            return  # rewritten meanwhile: the new bytes have no digest yet
        if digest == rec.digest:
            self.open_files.mark_verified(cf.ino, blockno)
            return
        self.stats.verify_failures += 1
        self.on_damage(cf.ino, blockno, rec.tier, "a read")
        raise BlockDamaged(
            f"inode {cf.ino}: block {blockno} (written here, not uploaded yet) failed "
            "its checksum on the tier",
            blockno=blockno,
            dirty=True,
        )

    # --- readahead -------------------------------------------------------------------------

    def _update_readahead(
        self, cf: CachedFile, state: ReadState, offset: int, end: int, first: int, last: int
    ) -> None:
        bs = self.block_size
        if abs(offset - state.last_end) > bs:  # a seek: start over
            state.window.restart()
            state.last_end, state.last_block = end, last
            return
        state.last_end = max(end, state.last_end)
        if last <= state.last_block:  # still in a block we already planned for
            return
        state.last_block = last
        window = state.window.enter_block(time.monotonic())
        # A sequential reader is past this block: give its buffer to the next
        # fetch instead of mapping a new one (the kernel's page cache has the
        # bytes; two blocks back, for reads that arrive a little out of order).
        self.recent.forget(cf.ino, [first - 2])
        nblocks = (cf.size + bs - 1) // bs
        window_end = min(last + 1 + window, nblocks)
        # Cached blocks are read ahead (WILLNEED, first-read checks) as far as
        # readahead_max whatever the window: that costs page cache, not
        # GETs, and keeps a deep queue on the tier's disk.
        ahead_end = min(last + 1 + self.max_window, nblocks) if cf.blocks else window_end
        run_tier, run_start, run_end = -1, 0, 0
        absent: list[int] = []
        for blockno in range(last + 1, ahead_end):
            if blockno in cf.flights or blockno in cf.transient:
                continue
            rec = cf.blocks.get(blockno)
            if rec is not None and self.open_files.ready(cf, blockno, rec):
                # Cached: let the kernel read it into the page cache ahead of
                # us, so the inline pread later does not wait for the disk.
                if rec.tier == run_tier and run_end == blockno * bs:
                    run_end += rec.nbytes
                    continue
                self._advise_willneed(cf, run_tier, run_start, run_end)
                run_tier, run_start, run_end = rec.tier, blockno * bs, blockno * bs + rec.nbytes
                continue
            if rec is None:
                if blockno < window_end and blockno * bs < cf.inode.origin_size:
                    absent.append(blockno)
            else:
                self._start_flight(cf, blockno)  # cached by an earlier mount: verify
        self._advise_willneed(cf, run_tier, run_start, run_end)
        if (
            absent
            and window >= 2 * self.fetcher.max_run_blocks
            and absent[-1] == window_end - 1
            and window_end < nblocks
        ):
            # The window's far end grows by a block or two per read: hold the
            # trailing run back until it makes one full-size GET.
            tail = 1
            while tail < len(absent) and absent[-tail - 1] == absent[-tail] - 1:
                tail += 1
            if tail % self.fetcher.max_run_blocks:
                absent = absent[: len(absent) - tail % self.fetcher.max_run_blocks]
        self.fetcher.start_fetches(cf, absent)

    def _advise_willneed(self, cf: CachedFile, tier: int, start: int, end: int) -> None:
        if tier >= 0 and end > start:
            os.posix_fadvise(
                self.open_files.fd(cf, tier), start, end - start, os.POSIX_FADV_WILLNEED
            )
