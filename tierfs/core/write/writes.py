"""The data path of a file: write, truncate, fsync, flush.

State of a file (``Inode.state``):

    CLEAN --first write/truncate/create--> DIRTY  (inode + upload entry
          committed at once, before any byte changes)
    DIRTY --commit (fsync: fdatasync + LMDB; close: LMDB)--> DIRTY, durable
          locally; the upload entry becomes due upload_delay later
    DIRTY --upload done, no change meanwhile--> CLEAN (see ``sync``)

The first write or truncate of a CLEAN file commits CLEAN -> DIRTY with its
upload entry before any byte changes (``_make_dirty``); a tier file that a
reader outside the daemon holds is replaced by a copy first
(``OpenFiles.unshare``).

fsync and names.  ``fsync`` fdatasyncs the file's cache files, seals and
commits its block map, and then commits the whole metadata group
(``MetaDB.sync``): every namespace change made before it (the file's own
create, a parent directory made just before it, as ``torch.save`` into a
new ``step-N/`` does) is durable when it returns, with no fsync of the
directory, as on ext4.  ``tests/crashloop.py`` kills the daemon in a loop
and checks every fsynced file after the remount; its writers are pinned to
the mount (paths resolved from an fd of the mount's root), since a writer
with plain paths lands in the bare mount point once a dead mount is lazily
unmounted.  Completing an upload, copy or marker stamps the name as seen by
a listing that runs meanwhile (``MetaTxn.mark_seen``), so that the
listing's sweep does not drop a file that became clean after its LIST.

In write-through mode (``[write] mode = "through"`` or a rule's ``write``),
fsync and close wait for the upload, and fail at once with EIO while the
endpoint's circuit breaker is open (the data stays durable locally and
queued).  A write that grows a file checks its quotas first
(``Quotas.grow``); EDQUOT leaves nothing changed.

The name changes (create, unlink, rename, attributes) are in
``core/names/changes.py``.  What a new small file costs per request is in
``docs/benchmarks.md`` ("The seven requests of a new small file").
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable

from tierfs.config import WriteConfig
from tierfs.errors import EndpointUnreachable, InvalidArgument, IsADirectory, PermissionDenied
from tierfs.meta import Inode, SyncState

from ..names.listings import Listings
from ..names.namespace import Namespace
from ..names.posix_attrs import mode_after_write
from ..names.quotas import Quotas
from ..read.handles import Handle, Handles
from ..state.journal import Journal
from ..state.openfiles import CachedFile, OpenFiles
from .blockwrites import BlockWrites
from .sync import Sync


class FileWrites:
    """The data path of a file (see the module docstring).  Its
    collaborators come in at construction; it calls ``sync`` to commit a
    file's writes and to wait for the bucket."""

    def __init__(
        self,
        write: WriteConfig,
        journal: Journal,
        namespace: Namespace,
        listings: Listings,
        open_files: OpenFiles,
        block_writes: BlockWrites,
        handles: Handles,
        sync: Sync,
        quotas: Quotas,
        *,
        write_through: Callable[[int], bool] | None = None,
    ) -> None:
        #: ``[write]``: ``mode`` and ``upload_delay``.
        self.write_config = write
        #: Does a close or fsync of this inode wait for the bucket (``write``
        #: of its rule, else ``[write] mode``)?
        self._write_through_of: Callable[[int], bool] = write_through or (
            lambda ino: write.mode == "through"
        )
        self.journal = journal
        self.namespace = namespace
        self.listings = listings
        self.open_files = open_files
        self.block_writes = block_writes
        self.handles = handles
        self.sync = sync
        #: Checked before a write grows a file (``quotas``).
        self.quotas = quotas

    # --- data --------------------------------------------------------------------------------------

    async def _make_dirty(self, cf: CachedFile) -> None:
        """CLEAN -> DIRTY, committed before the first byte changes.  A tier
        file of it that a reader holds is replaced by a copy first
        (``OpenFiles.unshare``; a write that comes meanwhile waits here)."""
        if cf.unsharing is not None or cf.inode.state == SyncState.CLEAN:
            await self.open_files.unshare(cf)
        if cf.inode.state != SyncState.CLEAN:
            return
        cf.inode.state = SyncState.DIRTY
        with self.journal.write() as w:
            w.tx.put_inode(cf.inode)
            w.ensure_upload(cf.ino)
        if self.handles.writers.get(cf.ino):
            self.journal.hold(cf.ino)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self.handles.get(fh)
        if not handle.writable:
            raise PermissionDenied("file handle is not open for writing")
        cf = handle.cached
        end = offset + len(data)
        if end > cf.inode.size:
            self.quotas.grow(cf.inode, end)  # EDQUOT before any byte lands
        await self._make_dirty(cf)
        written = await self.block_writes.write(cf, offset, data)
        self.sync.content_changed_locally(cf.ino)
        cf.inode.mtime_ns = cf.inode.ctime_ns = time.time_ns()
        self.drop_privileges(handle)
        return written

    def drop_privileges(self, handle: Handle) -> None:
        """A write or truncation through ``handle``: clear setuid/setgid as
        the kernel does for a caller without CAP_FSETID (``posix_attrs``).
        The mode is committed with the file's next commit (close, fsync)."""
        inode = handle.cached.inode
        if handle.caller is None or not inode.mode & (stat.S_ISUID | stat.S_ISGID):
            return
        mode = mode_after_write(inode.mode, inode.gid, handle.caller)
        if mode != inode.mode:
            inode.mode = mode
            inode.ctime_ns = time.time_ns()
            handle.cached.inode_dirty = True

    async def truncate(self, inode: Inode, size: int) -> None:
        if inode.is_dir:
            raise IsADirectory(f"inode {inode.ino} is a directory")
        if not inode.is_file:
            raise InvalidArgument(f"inode {inode.ino} is not a regular file")
        cf = self.open_files.acquire(inode)
        try:
            if size > cf.inode.size:
                self.quotas.grow(cf.inode, size)  # EDQUOT before anything changes
            else:
                self.quotas.track(cf.inode)  # its base, before the origin is cut
            await self._make_dirty(cf)
            self.sync.content_changed_locally(cf.ino)
            await self.block_writes.truncate(cf, size)
            self.quotas.resized(cf.inode)
            cf.inode.mtime_ns = cf.inode.ctime_ns = time.time_ns()
            await self.block_writes.commit(cf, sync=False)
            if not self.handles.writers.get(cf.ino):
                self.journal.schedule(cf.ino, self.write_config.upload_delay)
        finally:
            self.open_files.release(cf)

    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self.handles.get(fh)
        await self.block_writes.commit(handle.cached, sync=True)
        if handle.cached.inode.state != SyncState.CLEAN:
            await self._after_durable_point(handle.cached.ino)

    async def flush(self, fh: int) -> None:
        handle = self.handles.get(fh)
        if handle.writable:
            await self.block_writes.commit(handle.cached, sync=False)
            if self._write_through(handle.inode) and handle.cached.inode.state != SyncState.CLEAN:
                await self._after_durable_point(handle.cached.ino)

    async def _after_durable_point(self, ino: int) -> None:
        """After fsync (or close in write-through mode): start the upload
        clock, or wait for S3 in write-through mode."""
        inode = self.namespace.get(ino)
        if self._write_through(inode):
            self.journal.schedule(ino, 0.0)
            if self.listings.endpoint_down():
                raise EndpointUnreachable(
                    f"{self.namespace.key_of(inode)}: written locally, not yet in the bucket "
                    "(the endpoint is unreachable); it goes up when the endpoint answers"
                )
            await self.sync.wait_uploaded(ino)
        else:
            self.journal.schedule(ino, self.write_config.upload_delay)

    def _write_through(self, inode: Inode) -> bool:
        return self._write_through_of(inode.ino)
