"""UploadSource: a thread-safe reader of a file's bytes from its cache files,
for the uploader.

Invariants: it reads only through the fds it was given (snapshotted on the
loop by ``BlockWrites.upload_source``; the caller keeps them open by holding
the CachedFile), touches no other shared state, and never returns the bytes
of a whole block whose record carries a digest unless they match it (a
mismatch raises ``BlockDamaged`` and the upload is aborted before the object
is completed).
"""

from __future__ import annotations

import os
import sys
import threading

from tierfs.errors import BlockDamaged

from ..state.digests import block_digest


class UploadSource:
    """Reads a file's bytes from its cache files, from any thread, and
    records the xxh3 digest of every whole block it reads.

    ``read`` fills a buffer from a small pool (each part costs one copy
    from the cache files into memory that is already mapped, instead of a
    new allocation per block, a growing concatenation and a final copy).
    Buffer ownership: the bytes ``read`` returns belong to the caller for
    as long as it holds a reference to them.  A pooled buffer is reused
    only when nothing but the pool refers to it (CPython's reference count:
    a store still sending it, or a view of it, holds a reference), so a
    part is never overwritten while it is on the wire.  At most
    ``max_buffers`` buffers are pooled (the parts an upload has in flight,
    plus one); a read that finds none idle gets a buffer of its own, freed
    with its last reference.  ``close`` drops the pool: a finished or failed
    upload holds no part in memory."""

    #: sys.getrefcount of a pooled buffer that nobody else holds: the pool
    #: list, the loop variable and getrefcount's own argument.
    _IDLE_REFS = 3

    def __init__(
        self,
        block_size: int,
        size: int,
        blocks: dict[int, tuple[int, int]],
        expected: dict[int, tuple[int, int, bool]] | None = None,
        *,
        max_buffers: int = 5,
    ) -> None:
        self.block_size = block_size
        self.size = size
        self.blocks = blocks
        #: blockno -> (digest, nbytes, dirty) of blocks whose record carries
        #: a digest: a whole block read that does not match raises BlockDamaged.
        self.expected = expected or {}
        self.digests: dict[int, int] = {}
        self.max_buffers = max_buffers
        self._pool: list[bytearray] = []
        self._lock = threading.Lock()

    def _buffer(self, length: int) -> bytearray:
        with self._lock:
            for buf in self._pool:
                if len(buf) == length and sys.getrefcount(buf) == self._IDLE_REFS:
                    return buf
            fresh = bytearray(length)
            if len(self._pool) < self.max_buffers:
                self._pool.append(fresh)
            else:  # replace an idle buffer of another length, if there is one
                for i, buf in enumerate(self._pool):
                    if sys.getrefcount(buf) == self._IDLE_REFS:
                        self._pool[i] = fresh
                        break
            return fresh

    @property
    def pooled(self) -> int:
        return len(self._pool)

    def close(self) -> None:
        """Drop the pooled buffers (those still held elsewhere die with their holder)."""
        with self._lock:
            self._pool.clear()

    def read(self, offset: int, length: int) -> bytearray:
        bs = self.block_size
        pos, end = offset, min(offset + length, self.size)
        out = self._buffer(max(0, end - offset))
        view = memoryview(out)
        while pos < end:
            blockno = pos // bs
            block_end = min(end, (blockno + 1) * bs)
            piece = view[pos - offset : block_end - offset]
            where = self.blocks.get(blockno)
            got = 0
            if where is not None:
                while got < len(piece):
                    n = os.preadv(where[0], [piece[got:]], pos + got)
                    if n <= 0:
                        break  # past the cache file's end: never written, zeros
                    got += n
            if got < len(piece):
                piece[got:] = bytes(len(piece) - got)  # a hole, or the unwritten tail
            if pos == blockno * bs and (block_end - pos == bs or block_end == self.size):
                digest = block_digest(piece)
                want = self.expected.get(blockno)
                if want is not None and want[1] == len(piece) and want[0] != digest:
                    raise BlockDamaged(
                        f"block {blockno} failed its checksum while it was read for upload",
                        blockno=blockno,
                        dirty=want[2],
                    )
                self.digests[blockno] = digest
            pos = block_end
        return out
