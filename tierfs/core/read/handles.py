"""Open file handles of TierFS.

``open`` returns a file handle number that maps to a ``Handle`` (the inode's
CachedFile plus the handle's readahead state); ``pop`` forgets it when the
kernel releases it.  Per inode, the count of handles open for writing
(``writers``): while it is non-zero the journal holds the file's upload back
(``Journal.hold``), and the data-movement API refuses to relocate the file.

Invariants: ``writers[ino]`` is the number of writable handles of ``ino``
in ``handles`` and is absent when that number is 0; every Handle holds one
reference to its CachedFile (``OpenFiles.acquire``), given back by the
caller of ``pop`` (``TierFS.release``).  Methods are synchronous.

O_DIRECT writers beside buffered readers of one file.  Before a direct
write the kernel drops the cached pages of its range, but a buffered reader
may read that range from us again while the write is on its way, and get
the old bytes.  For a synchronous write the kernel drops the range again
once the write completes (both for ``O_DIRECT`` and for the ``direct_io``
we reply to ``O_WRONLY`` opens); for an asynchronous ``O_DIRECT`` write
(native AIO: the completion runs later, outside the write call) it does
not (seen on Linux 6.18), and a buffered read issued after the write had
completed was served those old pages: about one write in twenty in
``tests/fuse/test_posix_names_flush.py``, while a direct read of the same
range showed the new bytes (ours were right; the stale copy was the
kernel's).  So, for a handle opened with ``O_DIRECT`` for writing
(``direct_writer``), TierFS invalidates the file's kernel pages after each
write landed and before answering it (``wrote_around_page_cache``), when
another handle that reads through the page cache is open
(``page_cache_readers``): the write then completes with no stale page
left.  With no such reader nothing can have re-read the range, and the
check costs a dict lookup; the next open after such a write drops the
file's pages as well (``stale_page_cache``).  What stays the kernel's, as
on any Linux filesystem: a read that runs *while* a write is in flight may
return old or new bytes, or a mix of pages.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tierfs.errors import InvalidArgument
from tierfs.meta import BlockRecord, Inode

from ..names.posix_attrs import Caller
from ..state.journal import Journal
from ..state.openfiles import CachedFile, OpenFiles
from ..state.results import OpenResult
from ..state.space import SpaceManager
from ..state.supervisor import BackgroundTasks
from .blockcache import BlockCache, ReadState


@dataclass(slots=True)
class Handle:
    inode: Inode
    cached: CachedFile
    #: Made at the first read (``Handles.read_state``): a handle whose
    #: reads the kernel's page cache serves never needs one.
    read_state: ReadState | None
    writable: bool
    #: Who opened it (None: unknown, as for the core's own callers): its
    #: writes clear setuid/setgid by the kernel's rules (``posix_attrs``).
    caller: Caller | None = None
    #: Opened for writing with ``O_DIRECT`` (see the module docstring).
    direct_writer: bool = False
    #: Reads of this handle go through the kernel page cache.
    reads_through_cache: bool = False


#: Files whose writers ``Handles.wrote`` keeps before it drops those no
#: longer owed to the bucket.
WROTE_KEPT = 65536


class Handles:
    def __init__(
        self,
        open_files: OpenFiles,
        blocks: BlockCache,
        space: SpaceManager,
        journal: Journal,
        tasks: BackgroundTasks,
        invalidate_kernel_cache: Callable[[int, bool], Awaitable[None]],
    ) -> None:
        """``invalidate_kernel_cache(ino, data)``: from the daemon, drop the
        kernel's cached attributes of an inode and, if ``data``, its pages
        (started as a task of ``tasks`` when the bucket changed a file)."""
        self.open_files = open_files
        self.tasks = tasks
        self.invalidate_kernel_cache = invalidate_kernel_cache
        self.blocks = blocks
        self.space = space
        self.journal = journal
        self.handles: dict[int, Handle] = {}
        #: ino -> handles open for writing (absent when none).
        self.writers: dict[int, int] = {}
        #: ino -> the uids that opened it for writing since its upload was
        #: last owed (``wrote_by``: a user's flush hurries what it wrote);
        #: pruned to the files still owed once it holds ``WROTE_KEPT``.
        self.wrote: dict[int, set[int]] = {}
        #: Inodes whose kernel page cache must not be kept at their next open.
        self.stale_page_cache: set[int] = set()
        #: ino -> open handles whose reads go through the kernel page cache.
        self.page_cache_readers: dict[int, int] = {}
        self._next_fh = 1
        #: Called with the inode number after every open (the prefetcher
        #: follows the readers' position from them); synchronous, O(1).
        self.open_observers: list[Callable[[int], None]] = []

    @staticmethod
    def writable_flags(flags: int) -> bool:
        return (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)

    def open_for_writing(self, ino: int) -> bool:
        return ino in self.writers

    def _wrote(self, ino: int, uid: int) -> None:
        if len(self.wrote) >= WROTE_KEPT and ino not in self.wrote:
            owed = self.journal.upload_seq
            self.wrote = {i: u for i, u in self.wrote.items() if i in owed or i in self.writers}
        self.wrote.setdefault(ino, set()).add(uid)

    def wrote_by(self, ino: int) -> set[int]:
        """The uids that opened ``ino`` for writing (while its upload is owed)."""
        return self.wrote.get(ino, set())

    def writing_uids(self) -> dict[int, set[int]]:
        """ino -> the uids whose processes hold it open for writing (one
        pass over the handles; a handle of unknown caller counts as uid -1)."""
        uids: dict[int, set[int]] = {}
        for handle in self.handles.values():
            if handle.writable:
                uid = handle.caller.uid if handle.caller is not None else -1
                uids.setdefault(handle.cached.ino, set()).add(uid)
        return uids

    def content_dropped(self, ino: int, tiers: list[int], still_exists: bool) -> None:
        """Namespace event: the bucket changed the file (or it vanished).
        The kernel's pages of a changed file are stale: dropped now, in the
        background, and not kept at its next open."""
        if not still_exists:
            return
        self.stale_page_cache.add(ino)
        self.tasks.spawn_once("kernel_invalidation", self.invalidate_kernel_cache, ino, True)

    def open(
        self,
        inode: Inode,
        flags: int,
        *,
        keep_cache: bool = True,
        caller: Caller | None = None,
        blocks: dict[int, BlockRecord] | None = None,
    ) -> OpenResult:
        """``blocks``: the block map read with ``inode`` (``OpenFiles.acquire``)."""
        ino = inode.ino
        keep_cache = keep_cache and ino not in self.stale_page_cache
        self.stale_page_cache.discard(ino)
        cached = self.open_files.acquire(inode, blocks)
        cached.opened = True
        writable = self.writable_flags(flags)
        if writable:
            self.writers[ino] = self.writers.get(ino, 0) + 1
            self.journal.hold(ino)
            if caller is not None:
                self._wrote(ino, caller.uid)
        fh = self._next_fh
        self._next_fh += 1
        direct_io = flags & os.O_ACCMODE == os.O_WRONLY  # see below
        o_direct = bool(flags & os.O_DIRECT)
        handle = Handle(
            cached.inode,
            cached,
            None,
            writable,
            caller,
            direct_writer=writable and o_direct,
            reads_through_cache=not (o_direct or direct_io),
        )
        self.handles[fh] = handle
        if handle.reads_through_cache:
            self.page_cache_readers[ino] = self.page_cache_readers.get(ino, 0) + 1
        self.space.opened(ino)
        for observer in self.open_observers:
            observer(ino)
        # A write-only handle cannot be read or mmapped, so the kernel need
        # not keep its data: with direct I/O the bytes go from the writer's
        # buffer to us without a second copy in page cache (for a checkpoint,
        # the FUSE file's copy doubled the memory and the copying).  The
        # kernel drops cached pages of the range a direct write covers, so
        # readers through other handles stay coherent (but see the module
        # docstring: ``wrote_around_page_cache``).
        return OpenResult(fh=fh, keep_cache=keep_cache, direct_io=direct_io)

    def get(self, fh: int) -> Handle:
        try:
            return self.handles[fh]
        except KeyError:
            raise InvalidArgument(f"unknown file handle {fh}") from None

    def read_state(self, handle: Handle) -> ReadState:
        """The handle's readahead state, made at its first read."""
        state = handle.read_state
        if state is None:
            state = handle.read_state = self.blocks.new_read_state()
        return state

    def pop(self, fh: int) -> Handle:
        """Forget handle ``fh``; the caller releases its CachedFile."""
        handle = self.handles.pop(fh)
        if handle.reads_through_cache:
            ino = handle.cached.ino
            left = self.page_cache_readers[ino] - 1
            if left:
                self.page_cache_readers[ino] = left
            else:
                del self.page_cache_readers[ino]
        return handle

    def wrote_around_page_cache(self, handle: Handle) -> bool:
        """A write of ``handle`` landed: must the file's kernel pages be
        invalidated before it is answered (see the module docstring)?"""
        if not handle.direct_writer:
            return False
        ino = handle.cached.ino
        self.stale_page_cache.add(ino)
        return ino in self.page_cache_readers

    def writer_closed(self, ino: int) -> bool:
        """A writable handle of ``ino`` went away; True if it was the last."""
        self.writers[ino] -= 1
        if self.writers[ino]:
            return False
        del self.writers[ino]
        return True
