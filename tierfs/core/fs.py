"""TierFS: POSIX semantics on plain types, testable without a mount.

The FUSE layer (``tierfsd.fuse_ops``) converts pyfuse3 arguments, awaits a
method here and converts the result; the control server calls ``where`` and
``status``.  Errors are TierfsError subclasses carrying an errno.

Handles (``handles``): ``open`` returns a file handle number that maps to a ``Handle``
(the inode's CachedFile plus the handle's readahead state); ``release``
drops it.  Directory handles (``dirhandles``): ``opendir`` returns a handle
whose readdir offsets are keys (``.``, ``..``, then dirseq cookies, see
``MetaDB``), so that a seek is one LMDB lookup and a name renamed during a
readdir is never returned twice; ``releasedir`` drops it.  A handle also
knows whether a request goes on where the last one stopped, and
``readdir_into`` then fills the kernel's whole buffer.  The attributes
readdir hands out are kept with the inode records they were built from
(``attrcache``): a warm listing decodes only the inodes that changed.

Composition.  TierFS is built from parts, each given its collaborators at
construction, in the order of their dependencies (``__init__``; a part only
calls parts built before it):

    journal       the durable queue of bucket mutations (``journal``)
    clock         the lifecycle's clock: access times and rule ages (``clock``)
    tasks         starts the parts' background tasks (``supervisor``)
    open_files    the files in use, their fds, checked blocks (``openfiles``)
    namespace     names, listings, revalidation (``namespace``)
    damage        what a block that fails its checksum does (``damage``)
    policies      rules and pins per file: placement, promotion (``policies``)
    space         placement of blocks on tiers, emergency eviction (``space``)
    fetcher       filling absent blocks from the bucket (``fetcher``)
    blocks        serving reads from the tiers, checks, readahead (``blockcache``)
    block_writes  the blocks of writes: write, truncate, seal, commit (``blockwrites``)
    handles       open file handles and writers (``handles``)
    sync          journal execution, upload, flush (``sync``)
    writes        POSIX mutations (``writes``)
    movement      fill / relocate / evict / check of a file's blocks (``movement``)
    lifecycle     the plan of moves, pin / evict / reload (``lifecycle``)

No part calls back into TierFS.  Two events climb up, and TierFS wires
them to the parts that follow them at the end of ``__init__``: a file no
longer in use (``OpenFiles.idle_listeners``: an unlinked file is deleted,
``FileWrites.file_idle``), and a file the bucket changed or removed
(``Namespace.drop_listeners``: the space accounting, the open-file table
and the kernel's pages, ``Handles.content_dropped``).  The public async
methods the FUSE layer, the control server and the workers call stay on
TierFS and delegate to the parts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterator

import trio

from tierfs.config import Config
from tierfs.errors import InvalidArgument, IsADirectory, NoData, NotADirectory, NotFound
from tierfs.meta import ROOT_INO, BlockRecord, Inode, MetaDB, SyncState
from tierfs.meta.records import decode_inode
from tierfs.store import ObjectStore
from tierfs.store.breaker import breaker_of
from tierfs.tiers import Tier

from .attrcache import AttributeCache
from .blockcache import BlockCache
from .blockwrites import BlockWrites
from .buffers import RecentBlocks
from .clock import Clock
from .damage import DamageLog
from .dirhandles import DOT, DOTDOT, DirHandles, cookie_after, offset_of
from .fetcher import Fetcher, Origin
from .handles import Handles
from .journal import Entry, Journal
from .lifecycle import Lifecycle
from .movement import DataMovement
from .namespace import Identity, Namespace
from .openfiles import OpenFiles
from .policies import FilePolicies
from .posix_attrs import AccessTimes, Caller, UnlinkedInodes
from .results import Attributes, DirEntry, FsStats, OpenResult, attributes_of
from .space import SpaceManager
from .store_threads import StoreThreads
from .supervisor import BackgroundTasks, FatalWorkerError, Supervisor
from .sync import Sync
from .writes import FileWrites

log = logging.getLogger(__name__)


async def _no_kernel(ino: int, data: bool) -> None:
    return None


#: Read-only virtual xattr on the mount root: the control socket's path.
CONTROL_XATTR = b"user.tierfs.control_socket"

_ATIME_FLUSH_SECONDS = 5.0
#: Metadata written since the last commit is at most this old (see MetaDB,
#: "Group commit"): what a killed daemon can lose of writes not fsynced.
COMMIT_INTERVAL = 0.2
#: Entries one readdir request reads from LMDB: about what fits in the
#: kernel's one-page readdirplus reply, so a seek does not build entries
#: that are thrown away.
READDIR_BATCH = 32


class TierFS:
    """The file system the FUSE layer and the control server call: builds
    the parts, forwards each operation to them, and answers ``status`` and
    ``where`` from their figures (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        meta: MetaDB,
        store: ObjectStore,
        tiers: list[Tier],
        *,
        control_socket: str = "",
        invalidate_kernel_cache: Callable[[int, bool], Awaitable[None]] = _no_kernel,
    ) -> None:
        self.config = config
        self.meta = meta
        self.store = store
        self.tiers = tiers
        self.control_socket = control_socket
        ns = config.namespace
        self.identity = Identity(
            uid=ns.uid if ns.uid is not None else os.getuid(),
            gid=ns.gid if ns.gid is not None else os.getgid(),
            file_mode=ns.file_mode,
            dir_mode=ns.dir_mode,
        )
        self.store_limiter = trio.CapacityLimiter(max(4, config.fetch.concurrency))
        self.upload_limiter = trio.CapacityLimiter(4)
        #: Background store calls; the daemon abandons them at shutdown.
        self.store_threads = StoreThreads()
        self.control_xattr = CONTROL_XATTR
        self.endpoint = breaker_of(store)
        #: FUSE requests served (counted by the FUSE layer); the uploader
        #: holds back while they come fast.
        self.requests = 0
        #: From the daemon: drop the kernel's cached attributes of an inode
        #: and, if the flag is true, its cached pages too.
        self.invalidate_kernel_cache = invalidate_kernel_cache
        self._trio_token: trio.lowlevel.TrioToken | None = None
        #: Runs every background task of the daemon (see ``supervisor``).
        self.supervisor = Supervisor()
        #: Extra sections of ``status()``: name -> a function returning plain
        #: JSON data (the daemon's metrics add FUSE and S3 request figures and
        #: preload progress).  Called on the trio loop, at each ``status``.
        self.status_sections: dict[str, Callable[[], object]] = {}

        # The parts, in dependency order (see the module docstring).
        self.journal = Journal(meta)
        self._orphans = self.journal.orphans
        self.clock = Clock()
        self.tasks = BackgroundTasks(self.supervisor)
        self.open_files = OpenFiles(
            meta,
            tiers,
            RecentBlocks.sized_for(config.fetch.block_size, config.fetch.readahead_max),
            self.journal,
        )
        self.namespace = Namespace(
            meta,
            store,
            ns,
            self.identity,
            self.store_limiter,
            live_inode=self.open_files.live_inode,
            being_deleted=self.journal.being_deleted,
            watch_deletes=self.journal.watch_deletes,
            protects=self.journal.protects,
            attrs_owed=self.journal.attrs_owed,
            shape_generation=lambda: self.journal.namespace_gen,
            spawn=self.tasks.spawn,
        )
        self.damage = DamageLog(
            meta, tiers, config.fetch.block_size, path_of=self.namespace.path_of
        )
        self.policies = FilePolicies(config, tiers, meta, self.journal, self.namespace)
        self.space = SpaceManager(
            tiers,
            meta,
            is_busy=self.open_files.not_evictable,
            clock=self.clock,
            placement=self.policies.store_tier,
            on_tier_full=self.policies.wake_mover,
        )
        self.fetcher = Fetcher(
            self.open_files,
            Origin(store, self.journal.read_origin),
            self.space,
            block_size=config.fetch.block_size,
            fetch_concurrency=config.fetch.concurrency,
            revalidate_origin=self.namespace.revalidate_now,
        )
        self.blocks = BlockCache(
            self.open_files,
            self.fetcher,
            block_size=config.fetch.block_size,
            readahead_max=config.fetch.readahead_max,
            on_damage=self.damage.block_damaged,
            on_slow_tier_read=self.policies.slow_tier_read,
        )
        self.block_writes = BlockWrites(
            self.open_files,
            self.blocks,
            self.space,
            self.journal,
            block_size=config.fetch.block_size,
            write_space_timeout=config.write.space_wait,
            on_space_pressure=self.journal.hurry,
        )
        self.handles = Handles(
            self.open_files,
            self.blocks,
            self.space,
            self.journal,
            self.tasks,
            invalidate_kernel_cache,
        )
        #: POSIX atime, relatime, batched (see ``posix_attrs``).
        self.access_times = AccessTimes(meta)
        #: Removed inodes the kernel may still hold: getattr shows nlink 0.
        self.unlinked = UnlinkedInodes()
        self.dir_handles = DirHandles()
        #: Attributes readdir hands out, with the inode records they came from.
        self.attribute_cache = AttributeCache(lambda inode: attributes_of(inode, self.config))
        #: Directory entries handed out by ``readdir_handle`` (``.``/``..`` too).
        self.readdir_entries = 0
        self.sync = Sync(
            config,
            meta,
            store,
            tiers,
            self.journal,
            self.namespace,
            self.open_files,
            self.block_writes,
            self.damage,
            self.store_threads,
            store_limiter=self.store_limiter,
            upload_limiter=self.upload_limiter,
            endpoint=self.endpoint,
        )
        self.writes = FileWrites(
            config,
            meta,
            tiers,
            self.journal,
            self.namespace,
            self.open_files,
            self.block_writes,
            self.space,
            self.handles,
            self.sync,
            control_xattr=self.control_xattr,
            write_through=self.policies.write_through,
            access_times=self.access_times,
            unlinked=self.unlinked,
        )
        self.movement = DataMovement(
            meta,
            tiers,
            self.open_files,
            self.fetcher,
            self.space,
            self.journal,
            open_for_writing=self.handles.open_for_writing,
            on_damage=self.damage.block_damaged,
        )
        self.lifecycle = Lifecycle(
            config,
            meta,
            tiers,
            self.journal,
            self.namespace,
            self.policies,
            self.space,
            self.movement,
            self.clock,
            open_for_write=self.handles.open_for_writing,
        )

        # Events that climb up: each goes to the parts that follow it.
        self.open_files.idle_listeners.append(self.writes.file_idle)
        self.namespace.drop_listeners += [
            self.space.content_dropped,
            self.open_files.content_dropped,
            self.handles.content_dropped,
        ]
        if self.endpoint is not None:
            self.endpoint.add_listener(self._endpoint_changed)

    def _revalidation_expired(self, inode: Inode) -> bool:
        """Is a clean file's ETag older than ``revalidate_ttl``?"""
        if inode.state != SyncState.CLEAN:
            return False
        return time.time() - inode.validated_at >= self.config.namespace.revalidate_ttl

    # --- lifecycle -------------------------------------------------------------------

    async def run_workers(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Background work of the core; runs until cancelled.  Each worker
        runs under ``self.supervisor``: a failure restarts it."""
        self._trio_token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self.tasks.attach(nursery)
            self.fetcher.start(nursery)
            self.blocks.start(nursery)
            self.movement.start(nursery)
            self.supervisor.start_soon(nursery, "housekeeping", self._housekeep_periodically)
            self.supervisor.start_soon(nursery, "commit", self._commit_periodically)
            self.supervisor.start_soon(nursery, "orphan_cleanup", self._remove_orphan_cache_files)
            task_status.started()

    @contextlib.contextmanager
    def following_opens(
        self, on_open: Callable[[int], None], section: str, status: Callable[[], object]
    ) -> Iterator[None]:
        """While the block runs, ``on_open(ino)`` is called after every open
        (``Handles.open_observers``) and ``status()`` is the ``section`` of
        ``status()``: what a worker that follows the readers (the prefetcher,
        the directory readahead) attaches for as long as it runs."""
        self.handles.open_observers.append(on_open)
        self.status_sections[section] = status
        try:
            yield
        finally:
            self.handles.open_observers.remove(on_open)
            if self.status_sections.get(section) == status:
                del self.status_sections[section]

    def _endpoint_changed(self, reachable: bool) -> None:
        """Breaker listener (any thread): the endpoint answers again, so what
        failed during the outage is tried now instead of after its backoff."""
        token = self._trio_token
        if not reachable or token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):  # the daemon is stopping
            token.run_sync_soon(self.journal.retry_failed_now)

    async def _commit_periodically(self) -> None:
        """Batch metadata commits while the workers run (MetaDB "Group commit").

        A failed commit ends the daemon (``FatalWorkerError``, the one
        failure the supervisor does not restart): LMDB has dropped the group,
        so the in-memory state (journal, caches) is ahead of the metadata on
        disk, and only a restart from disk makes them agree again.  The disk
        holds the last commit, as after a crash, and the next mount goes on
        from there.  Any other failure of this loop restarts it; meanwhile
        (``group_commit`` off) every write transaction commits by itself.

        With nothing written since the last commit it sleeps until the next
        write (``MetaDB.on_first_uncommitted``), then commits
        ``COMMIT_INTERVAL`` later, as often as before while writes go on:
        it used to wake five times a second on an idle mount (a third of an
        idle daemon's wake-ups, counted with a trio instrument).
        """
        written = trio.Event()

        def first_write() -> None:
            written.set()

        self.meta.group_commit = True
        self.meta.on_first_uncommitted = first_write
        try:
            while True:
                if not self.meta.uncommitted:
                    written = trio.Event()
                    await written.wait()
                await trio.sleep(COMMIT_INTERVAL)
                if self.meta.uncommitted:
                    try:
                        self.meta.commit()
                    except Exception as exc:
                        raise FatalWorkerError(f"metadata group commit failed: {exc}") from exc
        finally:
            self.meta.on_first_uncommitted = None
            self.meta.group_commit = False

    async def _housekeep_periodically(self) -> None:
        """Every few seconds: write access times back, unmap idle fetch buffers."""
        while True:
            await trio.sleep(_ATIME_FLUSH_SECONDS)
            self.space.flush_atimes()
            self.access_times.flush()
            self.fetcher.buffers.trim()

    async def _remove_orphan_cache_files(self) -> None:
        """Delete cache files that no block record refers to.

        They are left by a crash between dropping blocks in LMDB and deleting
        the file (eviction, a changed object), or by a relocate: the copy on
        the destination before the switch, the source after it (see
        ``movement``, "Crash safety").  A file with any block recorded on
        its tier is kept.  Runs once, at mount.
        """
        removed = 0
        for tier in self.tiers:
            inos = await trio.to_thread.run_sync(tier.iter_cached_inodes)
            for ino in inos:
                if tier.index not in self.meta.residency(ino) and not self.open_files.is_busy(ino):
                    tier.remove_file(ino)
                    removed += 1
        if removed:
            log.info("removed %d orphaned cache files", removed)

    def close(self) -> None:
        self.space.flush_atimes()
        self.access_times.flush()

    # --- attributes ------------------------------------------------------------------

    def attributes(self, inode: Inode, timeout: float | None = None) -> Attributes:
        """What the kernel sees of ``inode``; ``timeout`` (seconds it may
        keep them) defaults to ``list_ttl``."""
        return attributes_of(
            inode,
            self.config,
            unlinked=inode.ino in self.unlinked,
            atime_ns=self.access_times.atime_of(inode),
            timeout=timeout,
        )

    async def getattr(self, ino: int) -> Attributes:
        gone = self.unlinked.get(ino)
        if gone is not None:  # removed, still held by the kernel: nlink 0
            return self.attributes(self.open_files.live_inode(ino) or gone)
        return self.attributes(self.namespace.get(ino))

    def forget(self, inos: list[int]) -> None:
        """The kernel dropped these inodes (FUSE forget)."""
        for ino in inos:
            self.unlinked.forget(ino)

    async def lookup(self, parent: int, name: bytes) -> Attributes:
        """Attributes of ``name`` in ``parent``; from an expired listing
        (being re-listed) with timeout 0, so the kernel may not keep them:
        the next access asks again and sees the re-listing as soon as it
        is done."""
        inode, expired = await self.namespace.lookup_entry(parent, name)
        return self.attributes(inode, timeout=0.0 if expired else None)

    def negative_timeout(self, parent: int) -> float:
        """Seconds the kernel may remember that a name is absent from
        directory ``parent`` (a negative entry): what is left of its
        listing's ``list_ttl``.  The contract is that of the names that
        exist (``Namespace``, "Consistency a reader gets"): a name another
        writer adds to the bucket shows within ``list_ttl`` plus one
        re-listing; a name made through this mount replaces the kernel's
        negative entry itself (the kernel links the new entry).  0 for a
        listing that expired (being re-listed: its additions show at the
        next access) or was never made."""
        listed_at = self.meta.listed_at(parent)
        if listed_at is None or listed_at <= 0:
            return 0.0
        return max(0.0, listed_at + self.config.namespace.list_ttl - time.time())

    # --- directories -----------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        """A directory handle for ``readdir_handle``; waits only for a
        directory never listed (an expired listing is served and re-listed
        in the background, see ``Namespace``)."""
        inode = self.namespace.get(ino)
        if not inode.is_dir:
            raise NotADirectory(f"inode {ino} is not a directory")
        await self.namespace.ensure_listed(inode, stale_wait=0.0)
        self.access_times.accessed(inode)  # reading a directory is an access
        return self.dir_handles.open(ino, self.namespace.get(ino).next_cookie)

    async def readdir_handle(
        self, fh: int, offset: int, limit: int = READDIR_BATCH
    ) -> list[DirEntry]:
        """Entries of open directory ``fh`` after readdir ``offset`` (0 is
        the start), ``.`` and ``..`` first; each entry's ``cookie`` is the
        offset to continue from.  An empty list is the end.  Offsets stay
        valid while names come and go (``tierfs.core.dirhandles``)."""
        handle = self.dir_handles.get(fh)
        try:
            inode = self.namespace.get(handle.ino)
        except NotFound:
            return []  # removed while open: reads as empty, as on ext4
        if offset == 0:
            handle.horizon = inode.next_cookie  # rewinddir: what is there now
        out: list[DirEntry] = []
        # From an expired listing the kernel may not keep entries (``lookup``).
        timeout = 0.0 if self.namespace.listing_expired(inode) else None
        if offset < DOT:
            out.append(DirEntry(DOT, b".", self.attributes(inode, timeout)))
        if offset < DOTDOT:
            parent = self.namespace.get(inode.parent)
            out.append(DirEntry(DOTDOT, b"..", self.attributes(parent, timeout)))
        for entry in await self.readdir(handle.ino, cookie_after(offset), limit, timeout=timeout):
            if entry.cookie >= handle.horizon:
                break  # linked after the handle started: cookies only grow
            entry.cookie = offset_of(entry.cookie)  # ours: no second DirEntry
            out.append(entry)
        self.readdir_entries += len(out)
        return out

    async def readdir_into(self, fh: int, offset: int, reply: Callable[[DirEntry], bool]) -> None:
        """Hand entries of open directory ``fh`` after ``offset`` to ``reply``
        (the FUSE layer's ``readdir_reply``) until it refuses one (the
        kernel's buffer is full) or the directory ends.  A reader that goes
        on where the handle's last reply stopped gets batches until then:
        one request per buffer, as a passthrough does, instead of one per
        batch (a newer kernel's buffer takes a hundred entries and more);
        built in vain is at most one batch less one entry.  After a seek
        (any other offset) one batch only (``tierfs.core.dirhandles``)."""
        handle = self.dir_handles.get(fh)
        sequential = handle.continues(offset)
        taken: int | None = None  # the offset after the last entry the kernel took
        try:
            while True:
                entries = await self.readdir_handle(fh, offset)
                if not entries:
                    return
                for entry in entries:
                    if not reply(entry):
                        return
                    taken = entry.cookie
                if not sequential:
                    return
                offset = entries[-1].cookie
        finally:
            if taken is not None:
                handle.replied(taken)

    def releasedir(self, fh: int) -> None:
        self.dir_handles.release(fh)

    async def readdir(
        self, ino: int, after_cookie: int, limit: int = 256, *, timeout: float | None = None
    ) -> list[DirEntry]:
        """Entries of directory ``ino`` after dirseq ``after_cookie``, in a
        stable order, without ``.`` and ``..``.  Use the last entry's cookie
        to continue; an empty list is the end.  ``timeout``: see
        ``attributes``."""
        # A first listing running now holds names whose attributes are not
        # settled yet: never hand those out.  Names a re-listing adds may go
        # out provisional, owner-only (see tierfs.core.namespace).
        await self.namespace.wait_listing(ino)
        out: list[DirEntry] = []
        # Attributes from the cache (``AttributeCache``: kept with the inode
        # record they were built from) unless the kernel must see what the
        # record does not hold: an access time not yet written, an inode
        # removed while held, an expired listing's timeout 0.
        cached = self.attribute_cache.attributes
        pending = self.access_times.pending
        unlinked = self.unlinked
        for cookie, name, child, record in self.meta.read_dir_records(ino, after_cookie, limit):
            if timeout is None and child not in pending and child not in unlinked:
                attrs = cached(child, record)
            else:
                attrs = self.attributes(decode_inode(child, record), timeout)
            out.append(DirEntry(cookie, name, attrs))
        return out

    # --- files ---------------------------------------------------------------------------

    async def open(self, ino: int, flags: int, caller: Caller | None = None) -> OpenResult:
        """``caller``: who opens (FUSE context); its writes clear setuid and
        setgid as the kernel's rules say (``posix_attrs``)."""
        # A file not in use: its inode and block map in one read transaction.
        blocks: dict[int, BlockRecord] | None = None
        live = self.open_files.live_inode(ino)
        if live is not None:
            inode = live
        else:
            found = self.meta.get_inode_and_blocks(ino)
            if found is None:
                raise NotFound(f"inode {ino} does not exist")
            inode, blocks = found
        if inode.is_dir:
            raise IsADirectory(f"inode {ino} is a directory")
        if not inode.is_file:
            raise InvalidArgument(f"inode {ino} is not a regular file")
        changed = cold = False
        if not self.open_files.is_busy(ino) and self._revalidation_expired(inode):
            # A reader's open HEADs only a file with blocks on a tier: a
            # file with nothing cached has nothing to go stale, and its
            # first GET checks the ETag it was listed with (If-Match; on a
            # mismatch the block cache revalidates and fetches the new
            # content).  So a cold small file is one GET, never a HEAD and
            # a GET.  A writer's open still HEADs (its read-modify-write
            # must start from the current object), and so does an open of
            # a file whose size comes from an expired listing (another
            # writer may have replaced it with a larger object since: the
            # kernel would clip the reads at the old size, and the read
            # fails with ESTALE; a deleted object answers ENOENT at open).
            if (
                self.handles.writable_flags(flags)
                or self.meta.residency(ino)
                or self.namespace.expired(inode.parent)
            ):
                inode, changed = await self.namespace.revalidate(inode)
                blocks = None  # read again, after the await (they may have been dropped)
            else:  # pages the kernel may hold from before its blocks left go
                cold = True
        if changed:
            # The kernel still holds the old size: reads past it would stop
            # short.  Attributes only: the pages go with keep_cache=False.
            await self.invalidate_kernel_cache(ino, False)
        result = self.handles.open(
            inode, flags, keep_cache=not (changed or cold), caller=caller, blocks=blocks
        )
        if flags & os.O_TRUNC and self.handles.writable_flags(flags):
            # The kernel leaves O_TRUNC to us (atomic O_TRUNC), with its
            # setuid/setgid clearing.
            handle = self.handles.get(result.fh)
            if inode.size:
                await self.writes.truncate(handle.cached.inode, 0)
            self.writes.drop_privileges(handle)
        return result

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        """A memoryview is lent until the caller's next ``await`` (BlockCache.read)."""
        handle = self.handles.get(fh)
        self.space.touch(handle.cached.ino)
        self.access_times.accessed(handle.cached.inode)
        return await self.blocks.read(handle.cached, offset, size, self.handles.read_state(handle))

    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        cf = handle.cached
        ino = cf.ino
        try:
            if handle.writable:
                if ino not in self._orphans:
                    await self.block_writes.commit(cf, sync=False)
                if self.handles.writer_closed(ino):
                    self.journal.schedule(ino, self.config.write.upload_delay)
        finally:
            self.open_files.release(cf)

    async def readlink(self, ino: int) -> bytes:
        inode = self.namespace.get(ino)
        if not stat.S_ISLNK(inode.mode):
            raise InvalidArgument(f"inode {ino} is not a symlink")
        return inode.symlink_target

    def path_of(self, ino: int) -> str:
        """The file's path in the mount, for messages."""
        return self.namespace.path_of(ino)

    # --- extended attributes ---------------------------------------------------------------

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        if ino == ROOT_INO and name == CONTROL_XATTR and self.control_socket:
            return self.control_socket.encode()
        if not name.startswith(b"user."):
            # Only user.* is stored.  The kernel asks for security.capability
            # before every write to a file: answer without touching LMDB.
            raise NoData(name.decode(errors="replace"))
        self.namespace.get(ino)
        value = self.meta.get_xattr(ino, name)
        if value is None:
            raise NoData(name.decode(errors="replace"))
        return value

    async def listxattr(self, ino: int) -> list[bytes]:
        self.namespace.get(ino)
        names = self.meta.list_xattrs(ino)
        return [CONTROL_XATTR, *names] if ino == ROOT_INO and self.control_socket else names

    # --- statfs ----------------------------------------------------------------------------------

    def statfs(self) -> FsStats:
        total = free = 0
        for tier in self.tiers:
            cap = tier.capacity
            total += cap
            free += tier.usable_bytes(self.space.used(tier.index))
        return FsStats(
            block_size=self.config.fetch.block_size,
            total_bytes=total,
            free_bytes=free,
            files=sum(self.meta.tier_usage(t.index).files for t in self.tiers),
        )

    # --- control plane -------------------------------------------------------------------------

    async def where(self, relpath: str) -> dict[str, object]:
        inode = await self.namespace.resolve(relpath)
        if inode.is_dir:
            return await self._where_tree(inode, relpath)
        residency = self.meta.residency(inode.ino)
        pin = self.policies.pinned_tier(inode.ino)
        open_file = self.open_files.files.get(inode.ino)
        damaged = self.meta.failed_blocks(inode.ino)
        refused = self.sync.refusal_of(inode.ino)
        if damaged or refused:
            state = "failed"
        elif self.journal.uploading(inode.ino):
            state = "uploading"
        else:
            state = "clean" if inode.state == SyncState.CLEAN else "dirty"
        bs = self.config.fetch.block_size
        blocks = self.meta.get_blocks(inode.ino)
        return {
            "path": relpath,
            "type": "file",
            "size": inode.size,
            "cached_bytes": sum(residency.values()),
            "blocks_total": (inode.size + bs - 1) // bs,
            "blocks_cached": len(blocks),
            "tiers": {t.name: residency.get(t.index, 0) for t in self.tiers},
            "state": state,
            "damaged_blocks": damaged,
            "failed_reason": refused
            or (f"{len(damaged)} damaged block(s) of local changes" if damaged else None),
            "pinned": pin is not None,
            "pin_tier": self.tiers[pin].name if pin is not None else None,
            "fetching_blocks": len(open_file.flights) if open_file else 0,
        }

    async def _where_tree(self, top: Inode, relpath: str) -> dict[str, object]:
        """``where`` of a directory: the totals of its subtree (listed from
        the bucket where this node has no fresh listing).  Dirty bytes count
        whole files, as ``status`` does."""
        per_tier = [0] * len(self.tiers)
        files = size = dirty_files = dirty = pinned = failed = 0
        async for inode, _path in self.namespace.walk(relpath, list_dirs=True, top=top):
            files += 1
            size += inode.size
            for tier, nbytes in self.meta.residency(inode.ino).items():
                per_tier[tier] += nbytes
            if inode.state != SyncState.CLEAN or self.journal.pending_upload(inode.ino):
                dirty_files += 1
                dirty += inode.size
            if self.policies.pinned_tier(inode.ino) is not None:
                pinned += 1
            if self.meta.failed_blocks(inode.ino) or self.sync.refusal_of(inode.ino):
                failed += 1
        return {
            "path": relpath,
            "type": "directory",
            "files": files,
            "size": size,
            "cached_bytes": sum(per_tier),
            "tiers": {t.name: per_tier[t.index] for t in self.tiers},
            "state": "failed" if failed else ("dirty" if dirty_files else "clean"),
            "dirty_files": dirty_files,
            "dirty_bytes": dirty,
            "pinned_files": pinned,
            "failed_files": failed,
        }

    def _dirty_bytes(self) -> int:
        total = 0
        for ino in self.journal.upload_seq:
            inode = self.sync.linked_inode(ino)
            if inode is not None:
                total += inode.size
        return total

    def _endpoint_status(self) -> dict[str, object]:
        """Can the bucket be reached: state, since when (wall clock), the last
        transport error, and the bytes written here that wait for it."""
        if self.endpoint is None:  # a local directory: always there
            health: dict[str, object] = {"state": "reachable", "since": None, "last_error": ""}
        else:
            health = self.endpoint.snapshot().as_dict()
        health["bytes_waiting"] = self._dirty_bytes()
        health["uploads_waiting"] = len(self.journal)
        return health

    def status(self, *, sections: bool = True) -> dict[str, object]:
        """What ``tierfs status`` shows; ``sections=False`` leaves out the
        ``status_sections`` (the metrics collector reads those itself)."""
        tiers = []
        for tier in self.tiers:
            usage = self.meta.tier_usage(tier.index)
            cap = tier.capacity
            tiers.append(
                {
                    "name": tier.name,
                    "path": str(tier.path),
                    "capacity": cap,
                    "used": usage.bytes,
                    "files": usage.files,
                    "used_ratio": usage.bytes / cap if cap else 0.0,
                    "high_watermark": tier.high_watermark,
                    "low_watermark": tier.low_watermark,
                    "hit_blocks": self.open_files.stats.tier_hit_blocks[tier.index],
                }
            )
        stats = self.open_files.stats
        lookups = stats.hit_blocks + stats.miss_blocks
        return {
            "backing": self.store.url,
            "block_size": self.config.fetch.block_size,
            "tiers": tiers,
            "dirty_bytes": self._dirty_bytes(),
            "pending_uploads": len(self.journal),
            "uploading": len(self.journal.running),
            "last_sync_error": self.sync.last_sync_error,
            "endpoint": self._endpoint_status(),
            "failed_files": len(self.meta.failed_files()) + len(self.journal.refused),
            "failed": self.sync.refused_files(),
            "worker_restarts": self.supervisor.restarts,
            "workers": self.supervisor.status(),
            "mover": self.lifecycle.status.as_dict(),
            "hit_ratio": stats.hit_blocks / lookups if lookups else None,
            "open_files": len(self.open_files.files),
            "queues": self._queue_depths(),
            "counters": {
                "read_requests": stats.read_requests,
                "read_bytes": stats.read_bytes,
                "hit_blocks": stats.hit_blocks,
                "miss_blocks": stats.miss_blocks,
                "fetched_bytes": stats.fetched_bytes,
                "gets": stats.gets,
                "verify_failures": stats.verify_failures,
                "uncached_blocks": stats.uncached_blocks,
                "fetch_buffers_mapped": self.fetcher.buffers.created,
                "fetch_buffers_dropped_in_use": self.fetcher.buffers.dropped_in_use,
                "evicted_files": self.space.evicted_files,
                "evicted_bytes": self.space.evicted_bytes,
                "listings": self.namespace.listings_done,
                "uploaded_bytes": self.sync.stats_uploaded_bytes,
                "relocated_bytes": self.movement.relocated_bytes,
                "stale_opens": self.namespace.stale_opens,
                "damaged_dirty_blocks": self.damage.dirty_blocks,
                "damaged_clean_blocks": self.damage.clean_blocks,
                "readdir_entries": self.readdir_entries,
            },
            # Requests sent to the bucket per S3 operation (stores that count).
            "store_calls": dict(getattr(self.store, "calls", {})),
            **{name: section() for name, section in self.status_sections.items() if sections},
            "time": time.time(),
        }

    def _queue_depths(self) -> dict[str, int]:
        """Work waiting or running now: journal entries owed to the bucket,
        files queued for promotion, blocks being fetched."""
        return {
            "journal_entries": len(self.journal),
            "uploads_running": len(self.journal.running),
            "promotions_queued": self.policies.promotion_send.statistics().current_buffer_used,
            "fetches_in_flight": sum(len(cf.flights) for cf in self.open_files.files.values()),
        }

    # --- mutations (``writes``) ------------------------------------------------------------

    async def create(
        self,
        parent: int,
        name: bytes,
        mode: int,
        flags: int,
        uid: int,
        gid: int,
        *,
        caller: Caller | None = None,
    ) -> tuple[OpenResult, Attributes]:
        return await self.writes.create(parent, name, mode, flags, uid, gid, caller=caller)

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attributes:
        return await self.writes.mkdir(parent, name, mode, uid, gid)

    async def symlink(
        self, parent: int, name: bytes, target: bytes, uid: int, gid: int
    ) -> Attributes:
        return await self.writes.symlink(parent, name, target, uid, gid)

    async def mknod(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attributes:
        return await self.writes.mknod(parent, name, mode, uid, gid)

    async def link(self, ino: int, new_parent: int, new_name: bytes) -> Attributes:
        return await self.writes.link(ino, new_parent, new_name)

    async def unlink(self, parent: int, name: bytes) -> None:
        await self.writes.unlink(parent, name)

    async def rmdir(self, parent: int, name: bytes) -> None:
        await self.writes.rmdir(parent, name)

    async def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None:
        await self.writes.rename(old_parent, old_name, new_parent, new_name, flags)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        written = await self.writes.write(fh, offset, data)
        handle = self.handles.get(fh)
        if self.handles.wrote_around_page_cache(handle):
            # Pages a buffered reader re-read while this write was on its
            # way hold old bytes (see ``handles``): drop them before replying.
            await self.invalidate_kernel_cache(handle.cached.ino, True)
        return written

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.writes.fsync(fh, datasync)

    async def flush(self, fh: int) -> None:
        await self.writes.flush(fh)

    async def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        caller: Caller | None = None,
    ) -> Attributes:
        return await self.writes.setattr(
            ino,
            mode=mode,
            uid=uid,
            gid=gid,
            size=size,
            atime_ns=atime_ns,
            mtime_ns=mtime_ns,
            caller=caller,
        )

    async def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        await self.writes.setxattr(ino, name, value)

    async def removexattr(self, ino: int, name: bytes) -> None:
        await self.writes.removexattr(ino, name)

    # --- the bucket side (``sync``) ---------------------------------------------------------

    def entry_keys(self, seq: int, entry: Entry) -> list[str] | None:
        """The keys a journal entry touches, for ordering; None if obsolete."""
        return self.sync.entry_keys(seq, entry)

    async def run_entry(self, seq: int) -> None:
        await self.sync.run_entry(seq)

    async def wait_uploaded(self, ino: int) -> None:
        await self.sync.wait_uploaded(ino)

    async def flush_path(self, relpath: str) -> int:
        """Wait until everything under ``relpath`` is durable in the bucket."""
        return await self.sync.flush_path(relpath)

    async def abort_stale_uploads(self, older_than: float = 24 * 3600) -> int:
        return await self.sync.abort_stale_uploads(older_than)
