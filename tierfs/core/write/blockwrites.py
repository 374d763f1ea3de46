"""Block writes: the write path of an open file's blocks.

``BlockWrites`` writes, truncates, seals and commits the blocks of a
``CachedFile`` (``commit``: the block records, the inode and the upload owed
in the journal, in one LMDB transaction), makes a file wholly local before an upload and gives the
uploader a reader of its bytes.  Only ``FileWrites`` (the data path) and
``Sync`` (commits, uploads) call it.

Per block:

    absent/clean --write--> dirty, unsealed (no digest; served as written)
    dirty, unsealed --commit (close/fsync/truncate: ``seal``)--> dirty, sealed
          (the xxh3 of its bytes is in the record, committed with it)
    dirty, sealed --upload: xxh3 mismatch--> DAMAGED (see ``blockcache``)
    dirty --upload done, content unchanged--> clean (digest from the upload)

A write to an absent block that holds origin bytes it does not fully cover
fetches the block first (read-modify-write, ``BlockCache.ensure``).
Nothing is written if space cannot be found (NoSpace), so a failed write
never leaves a torn block.  Dirty blocks are never evicted: when every
tier is full of them the writer waits for uploads (``on_space_pressure``: ``Journal.hurry``)
up to ``write.space_wait``, then gets ENOSPC.

Dirty-block digests.  A dirty block's digest is recorded when its bytes are
committed to the tier (``seal``, called by every commit), so that a bit
flip in a tier file between commit and upload is caught, like one in a
clean block, instead of being served and uploaded.  Cost is kept off the
write path: each write of a block that starts where the previous one ended
(from offset 0 of the block) feeds a running xxh3 of that block
(``BlockHasher``; inline for small writes, in the worker thread for direct
ones), so a sequential writer's blocks are sealed from the bytes already
held, at no extra I/O.  Any other pattern (a rewrite inside the block, a
truncate, two writes of one block in flight at once) drops the running
hash, and ``seal`` reads the block back once, in a thread.  The running
hash of a write is only adopted if no other write touched the block while
it was in flight (``CachedFile.writing``), so it always describes the bytes
that ended up in the file.  A sealed block is verified, like a clean one,
once per block per mount: on its first read after a seal from a running
digest (those bytes were never read back), while a seal that read the block
back counts as its check.  Every sealed or clean block is verified by
``UploadSource`` while the upload reads it: a mismatch aborts the upload
before the wrong bytes complete an object.  A write that keeps some bytes
of a block not verified yet checks it first (as a read-modify-write would),
so that new bytes are never built on damaged ones and sealed with them.  A
block that changed while the check ran (a write in flight, a new record) is
not damage: the check is skipped or the upload retried.

Concurrency rules: writes of small or unaligned chunks are ``pwrite``s on
the loop; aligned writes of at least ``DIRECT_WRITE_MIN`` go through the
O_DIRECT fd in a thread (a checkpoint written through the mount then costs
one copy, not a page cache fill).  ``seal`` reads back, and ``sync_data``
fdatasyncs, in threads.  Block records of dirty blocks change only on the
loop and reach LMDB only through ``commit_records``, in the caller's
transaction (the inode and the journal entry commit with them).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import threading
from collections.abc import Callable, Iterable

import trio

from tierfs.errors import NoSpace
from tierfs.meta import BlockRecord, MetaTxn, SyncState
from tierfs.tiers import DIRECT_ALIGN, pwrite_all

from ..read.blockcache import BlockCache
from ..state.digests import BlockHasher, read_and_hash
from ..state.journal import Journal
from ..state.openfiles import CachedFile, OpenFiles
from ..state.space import SpaceManager
from .upload_source import UploadSource

#: Aligned writes at least this long skip the page cache (O_DIRECT, in a
#: worker thread): a checkpoint written through the mount then costs one
#: copy, not a page cache fill, and its fsync has little left to flush.
DIRECT_WRITE_MIN = 256 * 1024


class BlockWrites:
    """The write path of blocks (see the module docstring)."""

    def __init__(
        self,
        open_files: OpenFiles,
        reads: BlockCache,
        space: SpaceManager,
        journal: Journal,
        *,
        block_size: int,
        write_space_timeout: float = 60.0,
        on_space_pressure: Callable[[], None] = lambda: None,
    ) -> None:
        """``reads``: for the read-modify-write of partly covered blocks;
        ``on_space_pressure``: ask the uploader to hurry (space is short)."""
        self.space = space
        self.journal = journal
        self.open_files = open_files
        self.meta = open_files.meta
        self.tiers = open_files.tiers
        self.reads = reads
        self.block_size = block_size
        self.write_space_timeout = write_space_timeout
        self.on_space_pressure = on_space_pressure
        self._thread_buffers = threading.local()

    def _aligned_buffer(self, size: int) -> mmap.mmap:
        """A page-aligned buffer of this thread, for O_DIRECT writes."""
        buf: mmap.mmap | None = getattr(self._thread_buffers, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._thread_buffers.buf = mmap.mmap(-1, max(size, self.block_size))
        return buf

    async def write(self, cf: CachedFile, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset`` into the cache files; the caller has
        already marked the file dirty.  Nothing is written if space cannot be
        found (NoSpace), so a failed write never leaves a torn block."""
        if not data:
            return 0
        bs = self.block_size
        end = offset + len(data)
        first, last = offset // bs, (end - 1) // bs
        origin = cf.inode.origin_size
        rmw = sorted(
            b
            for b in {first, last}
            if b not in cf.blocks
            and b * bs < origin
            and not (offset <= b * bs and end >= min((b + 1) * bs, origin))
        )
        # A present block that keeps some of its bytes is checked first, if
        # it has not been: new bytes must not be built on damaged ones (the
        # next seal would give the damage a valid digest).
        rmw += sorted(
            b
            for b in {first, last}
            if b in cf.blocks
            and not self.open_files.ready(cf, b, cf.blocks[b])
            and not (offset <= b * bs and end >= min((b + 1) * bs, cf.inode.size))
        )
        if rmw:
            await self.reads.ensure(cf, rmw)
        for blockno in range(first, last + 1):
            if blockno not in cf.blocks:
                # A file with no block yet (a new one) has no bytes on any
                # tier: the eviction tracker need not read its residency.
                file_bytes = None if cf.blocks else 0
                tier = await self._reserve_for_write(bs, cf.ino, cf.fenced_tier, file_bytes)
                cf.reserved[blockno] = (tier, bs)
                cf.blocks[blockno] = BlockRecord(tier=tier, digest=0, nbytes=0, dirty=True)
        hashers = self._begin_writes(cf, offset, end)
        written = False
        try:
            view = memoryview(data)
            pos = offset
            direct: list[tuple[int, memoryview, int, BlockHasher | None]] = []
            while pos < end:
                blockno = pos // bs
                chunk_end = min(end, (blockno + 1) * bs)
                tier = cf.blocks[blockno].tier
                chunk = view[pos - offset : chunk_end - offset]
                direct_fd = (
                    self.open_files.direct_fd(cf, tier)
                    if len(chunk) >= DIRECT_WRITE_MIN
                    and pos % DIRECT_ALIGN == 0
                    and len(chunk) % DIRECT_ALIGN == 0
                    else None
                )
                if direct_fd is not None:
                    direct.append((direct_fd, chunk, pos, hashers[blockno]))
                else:
                    pwrite_all(self.open_files.fd(cf, tier), chunk, pos)
                    hasher = hashers[blockno]
                    if hasher is not None:
                        hasher.update(chunk, bs)
                pos = chunk_end
            if direct:
                await trio.to_thread.run_sync(
                    self._pwrite_direct, direct, limiter=self.reads.io_limiter
                )
            written = True
        finally:
            self._end_writes(cf, hashers if written else dict.fromkeys(hashers))
        old_size = cf.inode.size
        new_size = max(old_size, end)
        touched = set(range(first, last + 1))
        if new_size > old_size and old_size:
            touched.add((old_size - 1) // bs)  # the old last block grows (with zeros)
        self._mark_dirty_blocks(cf, touched, new_size)
        self.open_files.recent.forget(cf.ino, touched)
        cf.inode.size = new_size
        cf.version += 1
        cf.inode_dirty = True
        return len(data)

    def _begin_writes(self, cf: CachedFile, offset: int, end: int) -> dict[int, BlockHasher | None]:
        """Register a write of ``[offset, end)`` as in flight; per block, the
        running digest it extends (None: it cannot, see the module docstring)."""
        bs = self.block_size
        out: dict[int, BlockHasher | None] = {}
        for blockno in range(offset // bs, (end - 1) // bs + 1):
            start = max(offset, blockno * bs) - blockno * bs
            hasher: BlockHasher | None = cf.hashers.pop(blockno, None)
            if blockno in cf.writing:
                hasher = None  # two writes in flight: their order on disk is unknown
                cf.contended.add(blockno)
            elif start == 0:
                hasher = BlockHasher()
            elif hasher is not None and not hasher.extends(start):
                hasher = None
            cf.writing[blockno] = cf.writing.get(blockno, 0) + 1
            out[blockno] = hasher
        return out

    @staticmethod
    def _end_writes(cf: CachedFile, hashers: dict[int, BlockHasher | None]) -> None:
        """The write registered by ``_begin_writes`` is done: its running
        digests are adopted unless another write overlapped it."""
        for blockno, hasher in hashers.items():
            left = cf.writing[blockno] - 1
            if left:
                cf.writing[blockno] = left
            else:
                del cf.writing[blockno]
            if blockno in cf.contended:
                if not left:
                    cf.contended.discard(blockno)
            elif hasher is not None:
                cf.hashers[blockno] = hasher

    async def truncate(self, cf: CachedFile, new_size: int) -> None:
        bs = self.block_size
        old_size = cf.inode.size
        # Bytes of the block holding the new end change (cut, or zeros that
        # were past the end): running digests from there on no longer hold.
        first_changed = min(old_size, new_size) // bs
        for blockno in [b for b in cf.hashers if b >= first_changed]:
            del cf.hashers[blockno]
        cf.contended.update(b for b in cf.writing if b >= first_changed)
        if new_size < old_size:
            first_gone = (new_size + bs - 1) // bs
            for blockno in [b for b in cf.blocks if b >= first_gone]:
                del cf.blocks[blockno]
                cf.uncommitted.discard(blockno)
                self._release_reservation(cf, blockno)
                self.open_files.forget_verified(cf.ino, [blockno])
            cf.transient.clear()
            cf.truncated_from = min(first_gone, cf.truncated_from or first_gone)
            # Bytes past the new end must read as zeros if the file grows again.
            for tier in self.tiers:
                fd = self.open_files.fd_if_exists(cf, tier.index)
                if fd is not None and os.fstat(fd).st_size > new_size:
                    os.ftruncate(fd, new_size)
            cf.inode.origin_size = min(cf.inode.origin_size, new_size)
            touched = {(new_size - 1) // bs} if new_size % bs else set()
        else:
            touched = {(old_size - 1) // bs} if old_size else set()
        self._mark_dirty_blocks(cf, {b for b in touched if b in cf.blocks}, new_size)
        self.open_files.recent.forget(cf.ino)
        cf.inode.size = new_size
        cf.version += 1
        cf.inode_dirty = True

    def _mark_dirty_blocks(self, cf: CachedFile, blocknos: Iterable[int], size: int) -> None:
        bs = self.block_size
        for blockno in blocknos:
            rec = cf.blocks.get(blockno)
            if rec is None:
                continue
            nbytes = max(0, min(bs, size - blockno * bs))
            cf.blocks[blockno] = BlockRecord(tier=rec.tier, digest=0, nbytes=nbytes, dirty=True)
            cf.uncommitted.add(blockno)
            self.open_files.forget_verified(
                cf.ino, [blockno]
            )  # new bytes: checked after their seal

    def _pwrite_direct(self, writes: list[tuple[int, memoryview, int, BlockHasher | None]]) -> None:
        """Thread: aligned writes through O_DIRECT fds, via an aligned buffer;
        each chunk also feeds its block's running digest, if any."""
        for fd, chunk, offset, hasher in writes:
            buf = self._aligned_buffer(len(chunk))
            buf[: len(chunk)] = chunk
            pwrite_all(fd, memoryview(buf)[: len(chunk)], offset)
            if hasher is not None:
                hasher.update(memoryview(buf)[: len(chunk)], self.block_size)

    async def _reserve_for_write(
        self, nbytes: int, ino: int, avoid: int | None = None, file_bytes: int | None = None
    ) -> int:
        """A tier for a new dirty block; waits for uploads to free space.

        Dirty data is never evicted, so when every tier is full of it the
        writer waits (backpressure) while ``on_space_pressure`` asks the
        uploader to hurry; after ``write_space_timeout`` it gives up with
        ENOSPC.  ``file_bytes``: the file's bytes on the tier, when the
        caller knows them (``SpaceManager.block_added``).
        """
        deadline = trio.current_time() + self.write_space_timeout
        while True:
            tier = self.space.reserve(nbytes, ino=ino, avoid=avoid)
            if tier is not None:
                self.space.block_added(ino, tier, file_bytes)
                return tier
            if trio.current_time() >= deadline:
                raise NoSpace("no tier has room for new data, and nothing can be freed")
            self.on_space_pressure()
            await trio.sleep(0.05)

    def _release_reservation(self, cf: CachedFile, blockno: int) -> None:
        tier_bytes = cf.reserved.pop(blockno, None)
        if tier_bytes is not None:
            self.space.release(*tier_bytes)

    async def sync_data(self, cf: CachedFile) -> None:
        """fdatasync every cache file of ``cf`` (in a thread)."""
        for fd in list(cf.fds.values()):
            await trio.to_thread.run_sync(os.fdatasync, fd, limiter=self.reads.io_limiter)

    async def seal(self, cf: CachedFile) -> None:
        """Record the digest of each uncommitted dirty block (see "Dirty-block
        digests"): from its running digest if that covers the whole block,
        else by reading it back once (in a thread).  The caller commits right
        after, with no await in between; a block written meanwhile stays
        unsealed."""
        reread: list[tuple[int, BlockRecord]] = []
        for blockno in sorted(cf.uncommitted):
            rec = cf.blocks.get(blockno)
            if rec is None or not rec.dirty or rec.sealed or blockno in cf.writing:
                continue
            hasher = cf.hashers.get(blockno)
            if hasher is not None and hasher.length == rec.nbytes:
                cf.blocks[blockno] = dataclasses.replace(rec, digest=hasher.result(), sealed=True)
            else:
                reread.append((blockno, rec))
        if not reread:
            return
        bs = self.block_size
        jobs = [
            (self.open_files.fd(cf, rec.tier), blockno * bs, rec.nbytes) for blockno, rec in reread
        ]
        digests = await trio.to_thread.run_sync(
            lambda: [read_and_hash(*job) for job in jobs], limiter=self.reads.io_limiter
        )
        for (blockno, rec), digest in zip(reread, digests, strict=True):
            if not cf.changed_since(blockno, rec):
                cf.blocks[blockno] = dataclasses.replace(rec, digest=digest, sealed=True)
                # Hashed from the tier just now: as verified as a first read.
                self.open_files.mark_verified(cf.ino, blockno)

    async def commit(self, cf: CachedFile, *, sync: bool) -> None:
        """Make the file's writes durable on the local tier (``sync``: also
        fdatasync), with the digests of its dirty blocks (``seal``),
        and its upload owed in the journal.  ``sync`` commits the whole
        metadata group, so every namespace change made before it (the
        file's create, a parent directory made just before) is durable too."""
        if sync:
            await self.sync_data(cf)
        await self.seal(cf)  # digests of the dirty blocks, committed with them
        if cf.uncommitted or cf.inode_dirty or cf.truncated_from is not None:
            with self.journal.write() as w:
                self.commit_records(cf, w.tx)
                w.tx.put_inode(cf.inode)
                if cf.inode.state != SyncState.CLEAN:
                    w.ensure_upload(cf.ino)
            self.committed(cf)
        if sync:
            self.meta.sync()  # also what earlier closes left in the group

    def commit_records(self, cf: CachedFile, tx: MetaTxn) -> None:
        """Write uncommitted block changes into ``tx`` (the caller's
        transaction, which also writes the inode and the journal)."""
        if cf.truncated_from is not None:
            tx.drop_blocks_from(cf.ino, cf.truncated_from)
        for blockno in sorted(cf.uncommitted):
            rec = cf.blocks.get(blockno)
            if rec is not None:
                tx.add_block(cf.ino, blockno, rec)

    def committed(self, cf: CachedFile) -> None:
        """After the caller's transaction committed: release reservations."""
        for blockno in list(cf.uncommitted):
            self._release_reservation(cf, blockno)
        cf.uncommitted.clear()
        cf.truncated_from = None
        cf.inode_dirty = False

    # --- upload support ---------------------------------------------------------------------

    async def make_local(self, cf: CachedFile) -> None:
        """Fetch every block that still lives only in the origin object."""
        bs = self.block_size
        nblocks = (min(cf.inode.origin_size, cf.inode.size) + bs - 1) // bs
        for start in range(0, nblocks, 64):
            await self.reads.ensure(cf, range(start, min(nblocks, start + 64)))

    def upload_source(self, cf: CachedFile, parts_in_flight: int) -> UploadSource:
        """A thread-safe reader of the file's current bytes, for the uploader,
        pooling ``parts_in_flight`` + 1 part buffers; close it after the upload.

        Built on the loop: it snapshots the block map and opens the fds, so
        the worker threads touch no shared state but the fds (which stay
        open: the caller holds a reference to ``cf``)."""
        blocks = {b: (self.open_files.fd(cf, rec.tier), rec.nbytes) for b, rec in cf.blocks.items()}
        expected = {
            b: (rec.digest, rec.nbytes, rec.dirty)
            for b, rec in cf.blocks.items()
            if rec.checkable and b not in cf.writing
        }
        return UploadSource(
            self.block_size, cf.inode.size, blocks, expected, max_buffers=parts_in_flight + 1
        )
