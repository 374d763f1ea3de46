"""TierFS: POSIX semantics on plain types, testable without a mount.

The FUSE layer (``tierfsd.fuse_ops``) converts pyfuse3 arguments, awaits a
method here and converts the result; the control server calls ``where`` and
``status``.  Errors are TierfsError subclasses carrying an errno.

Handles (``handles``): ``open`` returns a file handle number that maps to a
``Handle`` (the inode's CachedFile plus the handle's readahead state);
``release`` drops it.  Lookups, attributes and directory handles are
``NameReads``' (``namereads``).

Composition.  TierFS is built from parts, each given its collaborators at
construction, in the order of their dependencies (``__init__``; a part only
calls parts built before it).  ``docs/design.md``, "The core and its
parts", lists them in that order with their jobs; the subpackages they live
in depend one way (``state`` -> ``names`` -> ``read`` -> ``tiering`` ->
``write``, held by ``tests/unit/test_import_rules.py``).

No part calls back into TierFS.  Two events climb up, and TierFS wires
them to the parts that follow them at the end of ``__init__``: a file no
longer in use (``OpenFiles.idle_listeners``: an unlinked file is deleted,
``NameChanges.file_idle``), and a file the bucket changed or removed
(``Listings.drop_listeners``: the space accounting, the open-file table
and the kernel's pages, ``Handles.content_dropped``).  The public async
methods the FUSE layer, the control server and the workers call stay on
TierFS and delegate to the parts (the name changes are ``NameChanges``'
own methods and the data path's ``FileWrites``', bound in ``__init__``).
TierFS keeps only the decisions that need several parts at once: open
(whether to HEAD first), create (open the new name), read (count the use),
write (drop pages re-read meanwhile), release (commit, start the upload
clock), the control attribute, and reloads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import trio

from tierfs.config import Config, load_config
from tierfs.errors import InvalidArgument, IsADirectory, NoData, NotFound, StoreError
from tierfs.meta import ROOT_INO, BlockRecord, Inode, MetaDB, SyncState
from tierfs.store import ObjectStore
from tierfs.store.breaker import breaker_of
from tierfs.tiers import Tier

from .names.access import Permissions
from .names.changes import NameChanges
from .names.inodekeys import InodeKeys
from .names.listings import Identity, Listings
from .names.namereads import NameReads
from .names.namespace import Namespace
from .names.posix_attrs import AccessTimes, Caller, UnlinkedInodes
from .names.quotas import Quotas
from .names.shadow import ShadowPlace
from .read.blockcache import BlockCache
from .read.fetcher import Fetcher, Origin
from .read.handles import Handles
from .read.handout import HandOut
from .read.lender import Borrowed, Lender
from .read.sharedtier import SharedOrigin, SharedTier
from .reports import Reports
from .state.buffers import RecentBlocks
from .state.clock import Clock
from .state.journal import Journal
from .state.leases import ReaderLeases
from .state.openfiles import OpenFiles
from .state.results import AttributeRules, Attributes, DirEntry, FsStats, OpenResult
from .state.space import SpaceManager
from .state.store_threads import StoreThreads
from .state.supervisor import BackgroundTasks, Supervisor
from .tiering.lifecycle import Lifecycle
from .tiering.movement import DataMovement
from .tiering.policies import FilePolicies
from .upkeep import Upkeep
from .write.blockwrites import BlockWrites
from .write.damage import DamageLog
from .write.sharewrites import SharedWrites
from .write.sync import FlushOutcome, Sync
from .write.writes import FileWrites

if TYPE_CHECKING:
    from tierfs.store.shared import SharedBucket

log = logging.getLogger(__name__)


async def _no_kernel(ino: int, data: bool) -> None:
    return None


#: Read-only virtual xattr on the mount root: the control socket's path.
CONTROL_XATTR = b"user.tierfs.control_socket"


class TierFS:
    """The file system the FUSE layer and the control server call: builds
    the parts and forwards each operation to them (see the module
    docstring)."""

    def __init__(
        self,
        config: Config,
        meta: MetaDB,
        store: ObjectStore,
        tiers: list[Tier],
        *,
        control_socket: str = "",
        invalidate_kernel_cache: Callable[[int, bool], Awaitable[None]] = _no_kernel,
        shared: SharedBucket | None = None,
        shadow_store: ObjectStore | None = None,
        lender: Lender | None = None,
    ) -> None:
        """``shared``: the client of the shared tier's bucket, when the
        config has a shared tier (``tierfs.store.open_shared_tier``).
        ``shadow_store``: for an access point, a store of the backing URL
        without the access root, where the attribute shadow of every mount
        of the bucket lives (``names.shadow``, ``ShadowPlace``).
        ``lender``: another cache on this node whose files at the same
        version are read in place (``read.lender``: a snapshot mount's live
        mount)."""
        self.lender = lender
        #: Handles reading a borrowed file (``read.lender``), by fh.
        self._borrowed: dict[int, Borrowed] = {}
        #: Opens served by borrowing, and their bytes read.
        self.borrow_counts = {"opens": 0, "bytes": 0}
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

        # The parts, in dependency order (see the module docstring).
        self.journal = Journal(meta)
        self._orphans = self.journal.orphans
        self.clock = Clock()
        self.tasks = BackgroundTasks(self.supervisor)
        #: Tier files handed out to readers outside the daemon (``hand_out``).
        self.leases = ReaderLeases(tiers)
        self.open_files = OpenFiles(
            meta,
            tiers,
            RecentBlocks.sized_for(config.fetch.block_size, config.fetch.readahead_max),
            self.journal,
            self.leases,
        )
        self.keys = InodeKeys(
            meta,
            live_inode=self.open_files.live_inode,
            shape_generation=lambda: self.journal.namespace_gen,
        )
        self.listings = Listings(
            meta,
            store,
            ns,
            self.identity,
            self.keys,
            self.store_limiter,
            live_inode=self.open_files.live_inode,
            being_deleted=self.journal.being_deleted,
            watch_deletes=self.journal.watch_deletes,
            protects=self.journal.protects,
            attrs_owed=self.journal.attrs_owed,
            spawn=self.tasks.spawn,
            shadows=(
                ShadowPlace(shadow_store, f"{config.access.root.strip('/')}/")
                if shadow_store is not None and config.access.root
                else None
            ),
        )
        self.namespace = Namespace(meta, store, ns, self.keys, self.listings, self.store_limiter)
        #: What a local user asking through the control socket may reach.
        self.permissions = Permissions(self.namespace, config.access.uid, config.access.gid)
        self.damage = DamageLog(
            meta, tiers, config.fetch.block_size, path_of=self.namespace.path_of
        )
        self.policies = FilePolicies(
            config.rules, tiers, meta, self.journal, self.namespace, write_mode=config.write.mode
        )
        self.space = SpaceManager(
            tiers,
            meta,
            is_busy=self.open_files.not_evictable,
            clock=self.clock,
            placement=self.policies.store_tier,
            on_tier_full=self.policies.wake_mover,
        )
        #: Blocks fetched by any node, for every node (None: no shared tier).
        self.shared_tier: SharedTier | None = None
        origin = Origin(store, self.journal.read_origin)
        if shared is not None and config.shared_tier is not None:
            self.shared_tier = SharedTier(
                config.shared_tier.name,
                shared,
                store.url,
                config.fetch.block_size,
                node=f"{socket.gethostname()}:{os.getpid()}",
            )
            origin = SharedOrigin(
                store,
                self.journal.read_origin,
                self.shared_tier,
                shares=lambda ino: self.policies.shares(ino),  # policies reload
            )
        self.fetcher = Fetcher(
            self.open_files,
            origin,
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
        #: Copies files this node uploaded into the shared tier.
        self.shared_writes: SharedWrites | None = None
        if self.shared_tier is not None:
            self.shared_writes = SharedWrites(
                self.shared_tier, meta, self.open_files, self.block_writes, self.policies
            )
        self.names = NameReads(
            AttributeRules(
                config.access.uid,
                config.access.gid,
                config.fetch.block_size,
                config.namespace.list_ttl,
            ),
            meta,
            self.namespace,
            self.listings,
            self.open_files,
            self.access_times,
            self.unlinked,
        )
        self.sync = Sync(
            config.write,
            meta,
            store,
            tiers,
            self.journal,
            self.namespace,
            self.listings,
            self.open_files,
            self.block_writes,
            self.damage,
            self.store_threads,
            store_limiter=self.store_limiter,
            upload_limiter=self.upload_limiter,
            endpoint=self.endpoint,
            shared_writes=self.shared_writes,
            block_size=config.fetch.block_size,
            access_uid=config.access.uid,
        )
        self.quotas = Quotas(
            config.quotas,
            config.namespace.list_ttl,
            meta,
            self.journal,
            self.namespace,
            store,
            self.store_threads,
            self.store_limiter,
        )
        self.quotas.start()
        self.writes = FileWrites(
            config.write,
            self.journal,
            self.namespace,
            self.listings,
            self.open_files,
            self.block_writes,
            self.handles,
            self.sync,
            self.quotas,
            write_through=self.policies.write_through,
        )
        self.name_changes = NameChanges(
            meta,
            tiers,
            self.journal,
            self.namespace,
            self.listings,
            self.open_files,
            self.space,
            self.quotas,
            access=config.access,
            write=config.write,
            block_size=config.fetch.block_size,
            control_xattr=self.control_xattr,
            attributes=self.names.attributes,
            access_times=self.access_times,
            unlinked=self.unlinked,
            truncate=self.writes.truncate,
        )
        # The name changes are NameChanges' own methods and the data path's
        # FileWrites', bound here so that their arguments are declared once;
        # ``create`` and ``write`` add a step of their own (methods below).
        self.mkdir = self.name_changes.mkdir
        self.symlink = self.name_changes.symlink
        self.mknod = self.name_changes.mknod
        self.link = self.name_changes.link
        self.unlink = self.name_changes.unlink
        self.rmdir = self.name_changes.rmdir
        self.rename = self.name_changes.rename
        self.setattr = self.name_changes.setattr
        self.setxattr = self.name_changes.setxattr
        self.removexattr = self.name_changes.removexattr
        self.fsync = self.writes.fsync
        self.flush = self.writes.flush
        self.movement = DataMovement(
            meta,
            tiers,
            self.open_files,
            self.fetcher,
            self.space,
            self.journal,
            open_for_writing=self.handles.open_for_writing,
            on_damage=self.damage.block_damaged,
            held_elsewhere=self._lendable if lender is not None else None,
        )
        self.lifecycle = Lifecycle(
            config.source,
            config.policy_files,
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

        #: Warm files' tier files for ``tierfs.client.open`` (``read.handout``).
        self.handout = HandOut(
            meta,
            self.namespace,
            self.permissions,
            self.journal,
            self.open_files,
            self.blocks,
            self.handles,
            self.space,
            self.access_times,
            block_size=config.fetch.block_size,
            revalidation_expired=self._revalidation_expired,
            invalidate_kernel_cache=invalidate_kernel_cache,
        )

        self.upkeep = Upkeep(
            meta, tiers, self.open_files, self.space, self.access_times, self.fetcher.buffers
        )

        self.reports = Reports(
            block_size=config.fetch.block_size,
            store=store,
            tiers=tiers,
            meta=meta,
            journal=self.journal,
            supervisor=self.supervisor,
            open_files=self.open_files,
            namespace=self.namespace,
            names=self.names,
            damage=self.damage,
            policies=self.policies,
            space=self.space,
            fetcher=self.fetcher,
            sync=self.sync,
            movement=self.movement,
            lifecycle=self.lifecycle,
            quotas=self.quotas,
            shared_tier=self.shared_tier,
        )
        #: Extra sections of ``status()`` (``Reports``).
        self.status_sections = self.reports.status_sections
        self.status_sections["readers"] = self.leases.status
        if lender is not None:
            self.status_sections["borrowed"] = lambda: dict(self.borrow_counts)

        # Events that climb up: each goes to the parts that follow it.
        self.open_files.idle_listeners.append(self.name_changes.file_idle)
        self.listings.drop_listeners += [
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
            self.upkeep.start(nursery, self.supervisor)
            if self.shared_writes is not None:
                await self.supervisor.start(nursery, "shared-writes", self.shared_writes.run)
            await self.supervisor.start(nursery, "quota-walk", self.quotas.run)
            self.tasks.spawn_once("legacy-shadows", self._adopt_legacy_shadows)
            task_status.started()

    async def _adopt_legacy_shadows(self) -> None:
        """Once per mount (see ``Listings.adopt_legacy_shadows``); an
        unreachable bucket leaves it to the next mount."""
        try:
            await self.listings.adopt_legacy_shadows()
        except StoreError as exc:
            log.warning("attribute shadows of this access point not moved yet: %s", exc)

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

    def reload_policy(self) -> dict[str, object]:
        """``tierfs policy reload`` and SIGHUP: read the config file and its
        policy files again; the rules and the quotas in them apply from now
        on.  A file with any problem raises ``ConfigError`` and nothing
        changes."""
        fresh = load_config(self.config.source, check_paths=False)
        reloaded = self.lifecycle.reload(fresh)
        self.quotas.set_quotas(fresh.quotas)
        log.info("policy reloaded: %d quotas in force", len(fresh.quotas))
        return {**reloaded, "quotas": len(fresh.quotas)}

    def close(self) -> None:
        self.upkeep.flush()
        if self.shared_tier is not None:
            self.shared_tier.close()

    # --- names: lookups, attributes, directories (``names``) ---------------------------

    async def lookup(self, parent: int, name: bytes) -> Attributes:
        return await self.names.lookup(parent, name)

    def negative_timeout(self, parent: int) -> float:
        return self.names.negative_timeout(parent)

    async def getattr(self, ino: int) -> Attributes:
        return await self.names.getattr(ino)

    def forget(self, inos: list[int]) -> None:
        self.names.forget(inos)

    async def opendir(self, ino: int) -> int:
        return await self.names.opendir(ino)

    async def readdir_into(self, fh: int, offset: int, reply: Callable[[DirEntry], bool]) -> None:
        await self.names.readdir_into(fh, offset, reply)

    def releasedir(self, fh: int) -> None:
        self.names.releasedir(fh)

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
                or self.listings.expired(inode.parent)
            ):
                inode, changed = await self.namespace.revalidate(inode)
                blocks = None  # read again, after the await (they may have been dropped)
            else:  # pages the kernel may hold from before its blocks left go
                cold = True
        if changed:
            # The kernel still holds the old size: reads past it would stop
            # short.  Attributes only: the pages go with keep_cache=False.
            await self.invalidate_kernel_cache(ino, False)
        borrowed = await self._borrow(inode, flags)
        result = self.handles.open(
            inode, flags, keep_cache=not (changed or cold), caller=caller, blocks=blocks
        )
        if borrowed is not None:
            self._borrowed[result.fh] = borrowed
        if flags & os.O_TRUNC and self.handles.writable_flags(flags):
            # The kernel leaves O_TRUNC to us (atomic O_TRUNC), with its
            # setuid/setgid clearing.
            handle = self.handles.get(result.fh)
            if inode.size:
                await self.writes.truncate(handle.cached.inode, 0)
            self.writes.drop_privileges(handle)
        return result

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
        """A new file (``NameChanges.create``), opened at once: nothing
        awaits between the two."""
        inode = await self.name_changes.create(parent, name, mode, uid, gid)
        opened = self.handles.open(inode, flags, caller=caller)
        return opened, self.names.attributes(self.namespace.get(inode.ino))

    async def _lendable(self, inode: Inode) -> bool:
        """Would a reading open of the file borrow it (``read.lender``)?"""
        borrowed = await self._borrow(inode, os.O_RDONLY, count=False)
        if borrowed is None:
            return False
        await trio.to_thread.run_sync(borrowed.close)
        return True

    async def _borrow(self, inode: Inode, flags: int, *, count: bool = True) -> Borrowed | None:
        """The file from the lender, for a reading open of a clean file
        with nothing in this mount's cache (``read.lender``); else None."""
        if (
            self.lender is None
            or self.handles.writable_flags(flags)
            or inode.state != SyncState.CLEAN
            or not inode.etag
            or not inode.size
            or self.meta.residency(inode.ino)
        ):
            return None
        borrowed = await trio.to_thread.run_sync(
            self.lender.lend, self.path_of(inode.ino), inode.etag, inode.size
        )
        if borrowed is not None and count:
            self.borrow_counts["opens"] += 1
        return borrowed

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        """A memoryview is lent until the caller's next ``await`` (BlockCache.read)."""
        borrowed = self._borrowed.get(fh)
        if borrowed is not None:
            data = await trio.to_thread.run_sync(borrowed.pread, size, offset)
            self.borrow_counts["bytes"] += len(data)
            return data
        handle = self.handles.get(fh)
        self.space.touch(handle.cached.ino)
        self.access_times.accessed(handle.cached.inode)
        return await self.blocks.read(handle.cached, offset, size, self.handles.read_state(handle))

    async def release(self, fh: int) -> None:
        borrowed = self._borrowed.pop(fh, None)
        if borrowed is not None:
            await trio.to_thread.run_sync(borrowed.close)
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

    def child_path(self, parent: int, name: bytes) -> str:
        """The path of ``name`` in directory ``parent``, for messages and the
        audit log (a name that is not UTF-8 keeps its bytes as surrogates)."""
        above = self.path_of(parent)
        text = name.decode(errors="surrogateescape")
        return f"{above}/{text}" if above else text

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

    # --- reports (``reports``) ---------------------------------------------------------

    def statfs(self) -> FsStats:
        return self.reports.statfs()

    async def where(
        self, relpath: str, *, enter: Callable[[Inode, str], bool] | None = None
    ) -> dict[str, object]:
        return await self.reports.where(relpath, enter=enter)

    def status(self, *, sections: bool = True) -> dict[str, object]:
        """What ``tierfs status`` shows; ``sections=False`` leaves out the
        ``status_sections`` (the metrics collector reads those itself)."""
        return self.reports.status(sections=sections)

    # --- mutations (``writes``; the others are bound in ``__init__``) -----------------------

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        written = await self.writes.write(fh, offset, data)
        handle = self.handles.get(fh)
        if self.handles.wrote_around_page_cache(handle):
            # Pages a buffered reader re-read while this write was on its
            # way hold old bytes (see ``handles``): drop them before replying.
            await self.invalidate_kernel_cache(handle.cached.ino, True)
        return written

    # --- the bucket side (``sync``) ---------------------------------------------------------

    def fsyncdir(self) -> None:
        """fsync of a directory: every namespace change made before it is
        durable when it returns (the metadata group commits and syncs)."""
        self.meta.sync()

    async def wait_uploaded(self, ino: int) -> None:
        await self.sync.wait_uploaded(ino)

    async def flush_path(self, relpath: str, *, uid: int | None = None) -> int:
        """Wait until everything under ``relpath`` is durable in the bucket
        (a user's ``uid``: what that user wrote, see ``Sync.flush_path``);
        the number of changes waited for."""
        return (await self.flush_for(relpath, uid=uid)).entries

    async def flush_for(self, relpath: str, *, uid: int | None = None) -> FlushOutcome:
        """``flush_path`` with what it left out."""
        writing = self.handles.writing_uids() if uid is not None else None
        return await self.sync.flush_path(
            relpath, uid=uid, writing=writing, wrote_by=self.handles.wrote_by
        )
