"""Block digests: the xxh3_64 of a block's bytes, as block records carry it.

* ``block_digest``: the digest of bytes in memory.
* ``read_and_hash``: the digest of a block read back from a cache file (run
  it in a thread); bytes past the cache file's end are zeros, as a read of
  them would return.
* ``BlockHasher``: a running digest of a block fed by writes in offset
  order, so that a sequential writer's blocks are sealed from the bytes
  already held, with no read back (see ``blockwrites``, "Dirty-block
  digests").  Invariant: ``result()`` is the digest of the bytes
  ``[0, length)`` of the block exactly when every byte was fed once, in
  order; the caller drops the hasher on any other pattern.
"""

from __future__ import annotations

import xxhash

from tierfs.tiers import pread_padded


def block_digest(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def read_and_hash(fd: int, offset: int, nbytes: int) -> int:
    """Thread: xxh3 of ``nbytes`` at ``offset`` (zeros past the file's end)."""
    return block_digest(pread_padded(fd, nbytes, offset))


class BlockHasher:
    """Running xxh3 of a block's bytes ``[0, length)``, fed by writes in
    offset order; a full block keeps only its digest."""

    __slots__ = ("_state", "digest", "length")

    def __init__(self) -> None:
        self._state: xxhash.xxh3_64 | None = xxhash.xxh3_64()
        self.length = 0
        self.digest = 0

    def extends(self, start: int) -> bool:
        return self._state is not None and self.length == start

    def update(self, data: bytes | memoryview, block_size: int) -> None:
        assert self._state is not None
        self._state.update(data)
        self.length += len(data)
        if self.length >= block_size:
            self.digest = self._state.intdigest()
            self._state = None

    def result(self) -> int:
        return self._state.intdigest() if self._state is not None else self.digest
