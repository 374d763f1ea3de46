"""The read path: cached blocks, block-level fetch, single-flight, readahead.

A file's bytes are cut into blocks of ``block_size``.  Per block, the states:

    absent --fetch (ranged GET, pwrite, xxh3)--> present+verified
    present (from an earlier mount) --first read: xxh3 ok--> present+verified
    present --first read: xxh3 mismatch--> absent (refetched; never served)
    present --bucket ETag changed / evicted--> absent

``CachedFile`` is the in-memory state of one inode while it is open or has a
fetch in flight: its block map (loaded from LMDB once), the fds of its cache
files, and the in-flight fetches.  A busy CachedFile is never evicted, so its
fds always name the live cache files.

Concurrency rules:

* Cache hits are served inline on the trio loop: one ``os.pread`` per run of
  blocks on the same tier.  No thread hop, no LMDB write.
* Everything that may block for long runs in a thread: the GET + pwrite +
  hash of a fetch (``fetch_limiter``, ``fetch.concurrency`` threads at most)
  and the first-read verification of a block (``io_limiter``).
* One fetch or verification per block at a time (``_Flight``); other readers
  of the block wait for it and share its outcome.
* A block record is committed to LMDB (on the loop, after the thread wrote
  the bytes) only if the file's ``generation`` did not change meanwhile; an
  ETag change bumps the generation, so a late GET of the old content is
  dropped instead of recorded.

Readahead: each open handle tracks its last read.  A read that continues the
previous one is sequential; each time a sequential reader enters a new block
the window doubles, from 1 block up to ``readahead_max``.  Blocks in the
window that are absent are fetched in the background.  Memory stays bounded:
a fetch holds one block in memory between GET and pwrite, and at most
``fetch.concurrency`` fetches run, whatever the number of handles.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

import trio
import xxhash

from tierfs.errors import ChecksumMismatch, PreconditionFailed, StoreError, TierfsError
from tierfs.meta import BlockRecord, MetaDB
from tierfs.store import ObjectStore
from tierfs.tiers.tier import Tier

from .space import SpaceManager

log = logging.getLogger(__name__)

#: Blocks kept in memory per file when no tier had room for them.
_TRANSIENT_BLOCKS = 8


def block_digest(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


class _Flight:
    """One fetch or verification of one block, shared by all who wait for it."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None


@dataclass(slots=True)
class CachedFile:
    ino: int
    key: str
    etag: str
    size: int
    blocks: dict[int, BlockRecord]
    generation: int = 0
    refs: int = 0
    fds: dict[int, int] = field(default_factory=dict)
    flights: dict[int, _Flight] = field(default_factory=dict)
    transient: dict[int, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class ReadState:
    """Sequential detection and readahead window of one open handle."""

    last_end: int = 0  # a first read at offset 0 counts as sequential
    last_block: int = -1
    window: int = 1  # blocks, doubled up to readahead_max


@dataclass(slots=True)
class ReadStats:
    read_requests: int = 0
    read_bytes: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    fetched_bytes: int = 0
    gets: int = 0
    verify_failures: int = 0
    uncached_blocks: int = 0


class BlockCache:
    def __init__(
        self,
        meta: MetaDB,
        store: ObjectStore,
        tiers: list[Tier],
        space: SpaceManager,
        *,
        block_size: int,
        readahead_max: int,
        fetch_concurrency: int,
    ) -> None:
        self.meta = meta
        self.store = store
        self.tiers = tiers
        self.space = space
        self.block_size = block_size
        self.max_window = max(1, readahead_max // block_size)
        self.fetch_limiter = trio.CapacityLimiter(fetch_concurrency)
        self.io_limiter = trio.CapacityLimiter(4)
        self.files: dict[int, CachedFile] = {}
        self._verified: set[tuple[int, int]] = set()
        self.stats = ReadStats()
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    # --- CachedFile lifetime -------------------------------------------------------

    def acquire(self, ino: int, key: str, etag: str, size: int) -> CachedFile:
        cf = self.files.get(ino)
        if cf is None:
            cf = CachedFile(
                ino=ino, key=key, etag=etag, size=size, blocks=self.meta.get_blocks(ino)
            )
            self.files[ino] = cf
        cf.refs += 1
        return cf

    def release(self, cf: CachedFile) -> None:
        cf.refs -= 1
        if cf.refs == 0 and not cf.flights:
            self._close(cf)

    def _close(self, cf: CachedFile) -> None:
        for fd in cf.fds.values():
            os.close(fd)
        cf.fds.clear()
        if self.files.get(cf.ino) is cf:
            del self.files[cf.ino]

    def is_busy(self, ino: int) -> bool:
        return ino in self.files

    def content_changed(self, ino: int, tiers: list[int], key: str, etag: str, size: int) -> None:
        """The bucket's object changed (or vanished): LMDB already forgot the blocks.

        A busy file keeps its cache files (open fds point at them) and just
        forgets its block map; an idle file's cache files are deleted.
        """
        cf = self.files.get(ino)
        self._verified = {v for v in self._verified if v[0] != ino}
        if cf is not None:
            cf.generation += 1
            cf.blocks.clear()
            cf.transient.clear()
            cf.key, cf.etag, cf.size = key, etag, size
            return
        for tier in tiers:
            self.tiers[tier].remove_file(ino)

    def _fd(self, cf: CachedFile, tier: int) -> int:
        fd = cf.fds.get(tier)
        if fd is None:
            fd = self.tiers[tier].open_file(cf.ino, create=True)
            assert fd is not None
            cf.fds[tier] = fd
        return fd

    # --- reads -----------------------------------------------------------------------

    async def read(self, cf: CachedFile, offset: int, size: int, state: ReadState) -> bytes:
        end = min(offset + size, cf.size)
        if offset >= end:
            return b""
        self.stats.read_requests += 1
        self.stats.read_bytes += end - offset
        bs = self.block_size
        first, last = offset // bs, (end - 1) // bs
        self._update_readahead(cf, state, offset, end, first, last)
        for attempt in range(3):
            await self._ensure(cf, range(first, last + 1))
            data = self._assemble(cf, offset, end, first, last)
            if data is not None:
                return data
            log.debug("blocks of inode %d vanished during read, retry %d", cf.ino, attempt)
        raise StoreError(f"{cf.key}: blocks kept disappearing during the read")

    def _assemble(
        self, cf: CachedFile, offset: int, end: int, first: int, last: int
    ) -> bytes | None:
        """Bytes [offset, end) from present blocks; None if one is missing."""
        bs = self.block_size
        pieces: list[bytes] = []
        run_tier, run_start, pos = -1, offset, offset
        for blockno in range(first, last + 1):
            rec = cf.blocks.get(blockno)
            block_end = min(end, (blockno + 1) * bs)
            if rec is not None and (cf.ino, blockno) in self._verified:
                if rec.tier != run_tier:
                    if run_tier >= 0:
                        pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier, run_start = rec.tier, pos
                self.stats.hit_blocks += 1
            else:
                if run_tier >= 0:
                    pieces.append(self._pread(cf, run_tier, run_start, pos))
                    run_tier = -1
                buf = cf.transient.get(blockno)
                if buf is None:
                    return None
                pieces.append(buf[pos - blockno * bs : block_end - blockno * bs])
            pos = block_end
        if run_tier >= 0:
            pieces.append(self._pread(cf, run_tier, run_start, pos))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _pread(self, cf: CachedFile, tier: int, start: int, end: int) -> bytes:
        return os.pread(self._fd(cf, tier), end - start, start)

    async def _ensure(self, cf: CachedFile, blocknos: range) -> None:
        """Make every block present and verified (or transient)."""
        waits: list[_Flight] = []
        for blockno in blocknos:
            if blockno in cf.transient:
                continue
            rec = cf.blocks.get(blockno)
            if rec is not None and (cf.ino, blockno) in self._verified:
                continue
            waits.append(self._start_flight(cf, blockno))
        for flight in waits:
            await flight.done.wait()
            if flight.error is not None:
                err = flight.error
                if isinstance(err, TierfsError):
                    raise type(err)(str(err), errno=err.errno) from err
                raise StoreError(f"{cf.key}: {err}") from err

    def _start_flight(self, cf: CachedFile, blockno: int) -> _Flight:
        flight = cf.flights.get(blockno)
        if flight is not None:
            return flight
        flight = cf.flights[blockno] = _Flight()
        assert self._nursery is not None, "BlockCache.start() was not called"
        self._nursery.start_soon(self._run_flight, cf, blockno, flight)
        return flight

    async def _run_flight(self, cf: CachedFile, blockno: int, flight: _Flight) -> None:
        try:
            rec = cf.blocks.get(blockno)
            if rec is not None and not await self._verify(cf, blockno, rec):
                rec = None
            if rec is None:
                await self._fetch(cf, blockno)
        except Exception as exc:
            flight.error = exc
            if not isinstance(exc, TierfsError):
                log.exception("fetching block %d of %r failed", blockno, cf.key)
        finally:
            del cf.flights[blockno]
            flight.done.set()
            if cf.refs == 0 and not cf.flights:
                self._close(cf)

    async def _verify(self, cf: CachedFile, blockno: int, rec: BlockRecord) -> bool:
        """Check a block cached by an earlier mount (or moved) against its digest."""
        fd = self._fd(cf, rec.tier)
        offset = blockno * self.block_size
        data = await trio.to_thread.run_sync(
            os.pread, fd, rec.nbytes, offset, limiter=self.io_limiter
        )
        if len(data) == rec.nbytes and block_digest(data) == rec.digest:
            self._verified.add((cf.ino, blockno))
            return True
        self.stats.verify_failures += 1
        log.error(
            "checksum mismatch in cached block %d of %r on tier %s: refetching it",
            blockno,
            cf.key,
            self.tiers[rec.tier].name,
        )
        if rec.dirty:
            raise ChecksumMismatch(f"{cf.key}: dirty block {blockno} failed its checksum")
        self.meta.drop_block_list(cf.ino, [blockno])
        cf.blocks.pop(blockno, None)
        return False

    async def _fetch(self, cf: CachedFile, blockno: int) -> None:
        offset = blockno * self.block_size
        nbytes = min(self.block_size, cf.size - offset)
        if nbytes <= 0:
            return
        generation = cf.generation
        self.stats.miss_blocks += 1
        for _attempt in range(len(self.tiers) + 1):
            tier = self.space.reserve(nbytes)
            fd = self._fd(cf, tier) if tier is not None else None
            try:
                digest, data = await trio.to_thread.run_sync(
                    self._get_and_store,
                    cf.key,
                    cf.etag,
                    offset,
                    nbytes,
                    fd,
                    limiter=self.fetch_limiter,
                )
            except OSError as exc:
                if (
                    tier is not None and exc.errno == errno.ENOSPC
                ):  # the filesystem is fuller than we thought
                    self.space.release(tier, nbytes)
                    self.space.tier_filled_up(tier)
                    continue
                raise
            except PreconditionFailed as exc:
                if tier is not None:
                    self.space.release(tier, nbytes)
                raise StoreError(
                    f"{cf.key} changed in the bucket during the read", errno=errno.ESTALE
                ) from exc
            except BaseException:
                if tier is not None:
                    self.space.release(tier, nbytes)
                raise
            self.stats.gets += 1
            self.stats.fetched_bytes += nbytes
            if generation != cf.generation:  # the object changed meanwhile
                if tier is not None:
                    self.space.release(tier, nbytes)
                return
            if tier is None:
                self.stats.uncached_blocks += 1
                if len(cf.transient) >= _TRANSIENT_BLOCKS:
                    cf.transient.pop(next(iter(cf.transient)))
                cf.transient[blockno] = data
                return
            rec = BlockRecord(tier=tier, digest=digest, nbytes=nbytes)
            self.meta.add_block(cf.ino, blockno, rec)
            self.space.release(tier, nbytes)
            cf.blocks[blockno] = rec
            self._verified.add((cf.ino, blockno))
            return

    def _get_and_store(
        self, key: str, etag: str, offset: int, nbytes: int, fd: int | None
    ) -> tuple[int, bytes]:
        """Thread: ranged GET, write to the cache file, digest."""
        data = self.store.get_range(key, offset, nbytes, etag or None)
        if len(data) != nbytes:
            raise StoreError(
                f"{key}: expected {nbytes} bytes at offset {offset}, got {len(data)}; "
                "the object is shorter than its listing said"
            )
        if fd is not None:
            view = memoryview(data)
            written = 0
            while written < nbytes:
                written += os.pwrite(fd, view[written:], offset + written)
            return block_digest(data), b""
        return 0, data

    # --- readahead -------------------------------------------------------------------------

    def _update_readahead(
        self, cf: CachedFile, state: ReadState, offset: int, end: int, first: int, last: int
    ) -> None:
        bs = self.block_size
        if abs(offset - state.last_end) > bs:  # a seek: start over
            state.window, state.last_end, state.last_block = 1, end, last
            return
        state.last_end = max(end, state.last_end)
        if last <= state.last_block:  # still in a block we already planned for
            return
        state.last_block = last
        state.window = min(state.window * 2, self.max_window)
        nblocks = (cf.size + bs - 1) // bs
        run_tier, run_start, run_end = -1, 0, 0
        for blockno in range(last + 1, min(last + 1 + state.window, nblocks)):
            if blockno in cf.flights or blockno in cf.transient:
                continue
            rec = cf.blocks.get(blockno)
            if rec is not None and (cf.ino, blockno) in self._verified:
                # Cached: let the kernel read it into the page cache ahead of
                # us, so the inline pread later does not wait for the disk.
                if rec.tier == run_tier and run_end == blockno * bs:
                    run_end += rec.nbytes
                    continue
                self._advise_willneed(cf, run_tier, run_start, run_end)
                run_tier, run_start, run_end = rec.tier, blockno * bs, blockno * bs + rec.nbytes
                continue
            self._start_flight(cf, blockno)
        self._advise_willneed(cf, run_tier, run_start, run_end)

    def _advise_willneed(self, cf: CachedFile, tier: int, start: int, end: int) -> None:
        if tier >= 0 and end > start:
            os.posix_fadvise(self._fd(cf, tier), start, end - start, os.POSIX_FADV_WILLNEED)
