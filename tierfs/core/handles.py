"""Open file handles of TierFS.

``open`` returns a file handle number that maps to a ``Handle`` (the inode's
CachedFile plus the handle's readahead state); ``pop`` forgets it when the
kernel releases it.  Per inode, the count of handles open for writing
(``writers``): while it is non-zero the journal holds the file's upload back
(``Journal.hold``), and the data-movement API refuses to relocate the file.

Invariants: ``writers[ino]`` is the number of writable handles of ``ino``
in ``handles`` and is absent when that number is 0; every Handle holds one
reference to its CachedFile (``BlockCache.acquire``), given back by the
caller of ``pop`` (``TierFS.release``).  Methods are synchronous.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from tierfs.errors import InvalidArgument
from tierfs.meta import Inode

from .blockcache import BlockCache, CachedFile, ReadState
from .journal import Journal
from .posix_attrs import Caller
from .results import OpenResult
from .space import SpaceManager


@dataclass(slots=True)
class Handle:
    inode: Inode
    cached: CachedFile
    read_state: ReadState
    writable: bool
    #: Who opened it (None: unknown, as for the core's own callers): its
    #: writes clear setuid/setgid by the kernel's rules (``posix_attrs``).
    caller: Caller | None = None


class Handles:
    def __init__(self, blocks: BlockCache, space: SpaceManager, journal: Journal) -> None:
        self.blocks = blocks
        self.space = space
        self.journal = journal
        self.handles: dict[int, Handle] = {}
        #: ino -> handles open for writing (absent when none).
        self.writers: dict[int, int] = {}
        #: Inodes whose kernel page cache must not be kept at their next open.
        self.stale_page_cache: set[int] = set()
        self._next_fh = 1
        #: Called with the inode number after every open (the prefetcher
        #: follows the readers' position from them); synchronous, O(1).
        self.open_observers: list[Callable[[int], None]] = []

    @staticmethod
    def writable_flags(flags: int) -> bool:
        return (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)

    def open_for_writing(self, ino: int) -> bool:
        return ino in self.writers

    def open(
        self, inode: Inode, flags: int, *, keep_cache: bool = True, caller: Caller | None = None
    ) -> OpenResult:
        ino = inode.ino
        keep_cache = keep_cache and ino not in self.stale_page_cache
        self.stale_page_cache.discard(ino)
        cached = self.blocks.acquire(inode)
        writable = self.writable_flags(flags)
        if writable:
            self.writers[ino] = self.writers.get(ino, 0) + 1
            self.journal.hold(ino)
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(
            cached.inode, cached, self.blocks.new_read_state(), writable, caller
        )
        self.space.opened(ino)
        for observer in self.open_observers:
            observer(ino)
        # A write-only handle cannot be read or mmapped, so the kernel need
        # not keep its data: with direct I/O the bytes go from the writer's
        # buffer to us without a second copy in page cache (for a checkpoint,
        # the FUSE file's copy doubled the memory and the copying).  The
        # kernel drops cached pages of the range a direct write covers, so
        # readers through other handles stay coherent.
        direct_io = flags & os.O_ACCMODE == os.O_WRONLY
        return OpenResult(fh=fh, keep_cache=keep_cache, direct_io=direct_io)

    def get(self, fh: int) -> Handle:
        try:
            return self.handles[fh]
        except KeyError:
            raise InvalidArgument(f"unknown file handle {fh}") from None

    def pop(self, fh: int) -> Handle:
        """Forget handle ``fh``; the caller releases its CachedFile."""
        return self.handles.pop(fh)

    def writer_closed(self, ino: int) -> bool:
        """A writable handle of ``ino`` went away; True if it was the last."""
        self.writers[ino] -= 1
        if self.writers[ino]:
            return False
        del self.writers[ino]
        return True
