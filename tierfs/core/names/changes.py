"""Where names change: create, mkdir, symlink, mknod, link, unlink, rmdir,
rename, and the attributes of a name (setattr, extended attributes).

Every change commits its LMDB change and the journal entries that carry it
to the bucket in ONE transaction (``Journal.write``).  The bucket side of
each change:

* create (and symlink, mknod) of a file: one upload entry per file;
* mkdir: a ``dir/`` marker; rmdir: delete of the marker;
* unlink: delete of the file's origin object (and of the key an in-flight
  upload is writing, which would otherwise be left behind);
* rename of a file: server-side copy of its origin to the new key, then a
  delete of the origin (a dirty file whose bytes are all local skips the
  copy), and its pending upload moves behind them;
* rename of a directory: the same for every file below it, plus markers.
  The whole subtree is listed first so that every key is known.
* chmod/chown/utimens of a clean file: the object's metadata is rewritten
  in place (``setmeta``), without downloading it; chmod/chown of a
  directory puts its marker again with the new metadata (``mkdir``).
* Attribute shadow (``shadow``): the entries above keep it in step; every
  delete of a file's or directory's object carries ``shadow_ino`` so that
  its shadow entries go after it.  A name created where the last listing
  found orphaned shadow entries takes them into its ledger, so that its
  upload deletes them.
* ``.tierfs-attrs`` in the root is reserved for the shadow: creating or
  renaming anything to that name fails with EPERM.

No change waits for the bucket when this node has a listing of the
directories involved (``ensure_listed(..., stale_wait=0)``): while the
endpoint is unreachable, changes land in LMDB and the journal at local speed
and go up when it answers again.  Only a directory never listed (whose
names are unknown) has to be listed first, and fails with EIO if the bucket
does not answer.

Quotas (``quotas``): every change that adds bytes or names checks the
quotas above it first (``Quotas.admit_new``, ``plan_move``) and tells them
what it did after its transaction, with no ``await`` between the check and
the transaction; EDQUOT leaves nothing changed.

An unlinked file still in use stays (``Journal.orphans``) until the last
user lets go (``file_idle``, which ``OpenFiles`` calls).  A setattr that
changes the size truncates through the write path (``truncate``, handed in
at construction: this package sits below ``write/``).

Hard links are refused with EPERM, and so are device nodes; FIFOs and
sockets are empty objects whose mode carries the type.  Extended
attributes: ``user.*`` only, kept in LMDB on this node (not in the bucket).
"""

from __future__ import annotations

import itertools
import logging
import math
import stat
import time
from collections.abc import Awaitable, Callable

from tierfs.config import AccessConfig, WriteConfig
from tierfs.errors import (
    DirectoryNotEmpty,
    Exists,
    InvalidArgument,
    IsADirectory,
    NameNotUtf8,
    NameTooLong,
    NoData,
    NoSpace,
    NotADirectory,
    NotFound,
    NotPermitted,
    NotSupported,
)
from tierfs.meta import ROOT_INO, Inode, MetaDB, SyncState
from tierfs.store import RESERVED_ROOTS
from tierfs.tiers import Tier

from ..state.journal import Journal, JournalWriter, child_key
from ..state.openfiles import OpenFiles
from ..state.results import Attributes
from ..state.space import SpaceManager
from .listings import NAME_MAX, Listings
from .namespace import Namespace
from .posix_attrs import (
    AccessTimes,
    Caller,
    UnlinkedInodes,
    inherit_group,
    mode_after_chown,
    mode_after_write,
)
from .quotas import Quotas

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
XATTR_VALUE_MAX = 64 * 1024
#: Bytes of names and values one inode's extended attributes hold at most
#: (ext4 keeps them in one block; a user must not grow the state disk
#: through them).
XATTR_BYTES_PER_FILE = 64 * 1024
#: ... and every inode's together.
XATTR_BYTES_TOTAL = 64 * 1024 * 1024
#: An attribute counts at least this many bytes against both bounds (as a
#: filesystem counts an entry's overhead): the total then holds at most
#: 262,144 attributes, so counting it again is a short pass over LMDB.
XATTR_ENTRY_MIN = 256
#: Seconds between two counts of every inode's attributes (a refusal counts
#: again, to see the attributes of removed files gone, at most this often).
XATTR_RECOUNT_INTERVAL = 60.0

log = logging.getLogger(__name__)


def check_name(name: bytes) -> None:
    if len(name) > NAME_MAX:
        raise NameTooLong(f"name longer than {NAME_MAX} bytes")
    if name in (b"", b".", b"..") or b"/" in name or b"\0" in name:
        raise InvalidArgument(f"invalid name {name!r}")
    try:
        name.decode()
    except UnicodeDecodeError:
        raise NameNotUtf8(
            f"the name {name!r} is not UTF-8: object keys are UTF-8, so the bucket cannot hold it"
        ) from None


def _xattr_cost(name: bytes, value: bytes) -> int:
    """What an extended attribute counts against the bounds."""
    return max(XATTR_ENTRY_MIN, len(name) + len(value))


def check_not_reserved(parent: int, name: bytes) -> None:
    """tierfs's reserved top-level names (the attribute shadow's, ...)
    cannot be made in the root."""
    if parent == ROOT_INO and name.decode(errors="replace") in RESERVED_ROOTS:
        raise NotPermitted(f"{name.decode()!r} is reserved by tierfs in the root of the mount")


class NameChanges:
    """The changes of names and their attributes (see the module docstring).
    Its collaborators come in at construction; ``truncate`` is the write
    path's, for a setattr that changes the size."""

    def __init__(
        self,
        meta: MetaDB,
        tiers: list[Tier],
        journal: Journal,
        namespace: Namespace,
        listings: Listings,
        open_files: OpenFiles,
        space: SpaceManager,
        quotas: Quotas,
        *,
        access: AccessConfig,
        write: WriteConfig,
        block_size: int,
        control_xattr: bytes,
        attributes: Callable[[Inode], Attributes],
        access_times: AccessTimes,
        unlinked: UnlinkedInodes,
        truncate: Callable[[Inode, int], Awaitable[None]],
    ) -> None:
        self.meta = meta
        self.tiers = tiers
        self.journal = journal
        self.namespace = namespace
        self.listings = listings
        self.open_files = open_files
        self.space = space
        #: Checked before a change adds bytes or names (``quotas``).
        self.quotas = quotas
        #: ``[access]``: an access point's owner and umask.
        self.access = access
        #: ``[write]``: ``deletes`` and ``upload_delay``.
        self.write_config = write
        self.block_size = block_size
        self.control_xattr = control_xattr
        #: What the kernel sees of an inode (``NameReads.attributes``).
        self.attributes = attributes
        self.access_times = access_times
        #: Removed inodes the kernel may still hold (``posix_attrs``).
        self.unlinked = unlinked
        self._truncate = truncate
        #: Bytes of every inode's extended attributes (None: not counted yet),
        #: and when they were last counted (``_xattr_growth``).
        self._xattr_total: int | None = None
        self._xattr_counted_at = -math.inf
        #: Unlinked files still in use: deleted when the last user lets go.
        self._orphans = journal.orphans

    # --- helpers ------------------------------------------------------------------------

    async def _parent_for_change(self, parent: int) -> Inode:
        """The directory ``parent``'s current record, listed (see below).

        Read once: with a fresh listing nothing awaits, so the record is
        what a write transaction opened right after sees (``create`` hands
        it on to ``_new_inode`` and ``_link_new`` instead of decoding it
        twice more); after a wait for a listing it is read again."""
        inode = self.namespace.get(parent)
        if not inode.is_dir:
            raise NotADirectory(f"inode {parent} is not a directory")
        if self.listings.listing_fresh(inode):
            return inode
        # A listing this node has is good enough for a change (the kernel's
        # lookup just before waited for a fresh one, within its bound): a
        # change lands locally at once, also while the bucket is away.
        await self.listings.ensure_listed(inode, stale_wait=0.0)
        return self.namespace.get(parent)  # the listing may have rewritten it

    def _new_inode(self, parent: Inode, name: bytes, mode: int, uid: int, gid: int) -> Inode:
        access = self.access
        if access.uid is not None:  # an access point: its owner, its umask
            uid = access.uid
        if access.gid is not None:
            gid = access.gid
        mode &= ~access.umask
        mode, gid = inherit_group(parent, mode, gid)
        now = time.time_ns()
        return Inode(
            ino=0,
            mode=mode,
            uid=uid,
            gid=gid,
            size=0,
            mtime_ns=now,
            ctime_ns=now,
            parent=parent.ino,
            name=name,
            state=SyncState.DIRTY,
            listed_at=time.time() if stat.S_ISDIR(mode) else 0.0,
        )

    def _link_new(self, w: JournalWriter, inode: Inode, parent: Inode) -> Inode:
        """Link new ``inode`` into ``parent``: the directory's record as
        ``w``'s transaction sees it (``_parent_for_change``, with no await
        since)."""
        inode.ino = w.tx.alloc_ino()
        w.tx.put_inode(inode)
        self._touch_dir(parent)
        w.tx.link(parent, inode.name, inode.ino)
        orphans = self.listings.orphan_shadows.get(parent.ino, {}).pop(inode.name, None)
        if orphans:
            key = child_key(self.namespace.key_of(parent), inode.name)
            w.tx.set_shadow_ledger(inode.ino, [(key, a.perm, a.uid, a.gid) for a in orphans])
        return inode

    def _refuse_other_owner(self, uid: int | None, gid: int | None) -> None:
        """On an access point with a fixed owner, every file has that owner:
        a chown to another is refused (EPERM)."""
        access = self.access
        for asked, fixed, what in ((uid, access.uid, "owner"), (gid, access.gid, "group")):
            if asked is not None and fixed is not None and asked != fixed:
                raise NotPermitted(
                    f"this access point gives every file the {what} {fixed}; "
                    f"it cannot be changed to {asked}"
                )

    @staticmethod
    def _touch_dir(parent: Inode) -> None:
        parent.mtime_ns = parent.ctime_ns = time.time_ns()

    def _existing_child(self, parent: int, name: bytes) -> Inode:
        ino = self.meta.lookup(parent, name)
        if ino is None:
            raise NotFound(name.decode(errors="replace"))
        return self.namespace.get(ino)

    def _check_key(self, key: str) -> None:
        """Refuse up front a name whose object key (store prefix included)
        the bucket would never take: it could be written locally but never
        uploaded.  EPERM for a name the store reserves (the ``file://``
        backing's ``.tierfs-*``, like ``.tierfs-attrs`` in the root on
        every backing), else ENAMETOOLONG (S3: 1,024 bytes)."""
        if self.namespace.store.reserved(key):
            raise NotPermitted(f"{key[-64:]!r}: names starting with '.tierfs-' are reserved")
        if not self.namespace.store.key_fits(key):
            raise NameTooLong(f"the object key of {key[-64:]!r} would be too long for the bucket")

    def _new_key(self, parent: Inode, name: bytes, *, is_dir: bool = False) -> str:
        """The key of a new name in ``parent``, checked (``_check_key``); a
        directory's marker ends in "/"."""
        key = child_key(self.namespace.key_of(parent), name)
        self._check_key(key + "/" if is_dir else key)
        return key

    # --- creating ----------------------------------------------------------------------------

    async def _new_child(
        self, parent: int, name: bytes, mode: int, uid: int, gid: int, size: int = 0
    ) -> tuple[Inode, Inode, str]:
        """Checks and makes a new name in ``parent``, not linked yet: the
        directory's record, the new inode (type and permissions in
        ``mode``) and its key.  Raises if the name is bad, reserved or
        taken, or if a quota has no room for it (``size`` bytes and one
        name).  The caller links it with no ``await`` in between and then
        tells ``quotas.created``."""
        check_name(name)
        check_not_reserved(parent, name)
        dir_inode = await self._parent_for_change(parent)
        if self.meta.lookup(parent, name) is not None:
            raise Exists(name.decode(errors="replace"))
        key = self._new_key(dir_inode, name, is_dir=stat.S_ISDIR(mode))
        self.quotas.admit_new(key, size)
        return dir_inode, self._new_inode(dir_inode, name, mode, uid, gid), key

    async def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Inode:
        """A new empty regular file, DIRTY with its upload entry; the
        caller opens it (``TierFS.create``) with no ``await`` in between."""
        dir_inode, inode, key = await self._new_child(
            parent, name, stat.S_IFREG | (mode & 0o7777), uid, gid
        )
        with self.journal.write() as w:
            self._link_new(w, inode, dir_inode)
            w.ensure_upload(inode.ino)
        self.quotas.created(inode.ino, key)
        return inode

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attributes:
        dir_inode, inode, key = await self._new_child(
            parent, name, stat.S_IFDIR | (mode & 0o7777), uid, gid
        )
        with self.journal.write() as w:
            self._link_new(w, inode, dir_inode)
            w.append({"op": "mkdir", "key": key + "/", "ino": inode.ino})
        self.quotas.created(inode.ino, key)
        return self.attributes(inode)

    async def symlink(
        self, parent: int, name: bytes, target: bytes, uid: int, gid: int
    ) -> Attributes:
        dir_inode, inode, key = await self._new_child(
            parent, name, stat.S_IFLNK | 0o777, uid, gid, size=len(target)
        )
        inode.symlink_target = target
        inode.size = len(target)
        with self.journal.write() as w:
            self._link_new(w, inode, dir_inode)
            w.ensure_upload(inode.ino)
        self.quotas.created(inode.ino, key, inode.size)
        self.journal.schedule(inode.ino, self.write_config.upload_delay)
        return self.attributes(inode)

    async def mknod(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attributes:
        """FIFOs, sockets and empty regular files; device nodes are refused.

        In the bucket they are empty objects whose ``x-amz-meta-mode``
        carries the type (as s3fs-fuse stores them)."""
        kind = stat.S_IFMT(mode)
        if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK):
            raise NotPermitted("tierfs does not store device nodes")
        dir_inode, inode, key = await self._new_child(
            parent, name, kind | (mode & 0o7777), uid, gid
        )
        with self.journal.write() as w:
            self._link_new(w, inode, dir_inode)
            w.ensure_upload(inode.ino)
        self.quotas.created(inode.ino, key)
        self.journal.schedule(inode.ino, self.write_config.upload_delay)
        return self.attributes(inode)

    async def link(self, ino: int, new_parent: int, new_name: bytes) -> Attributes:
        raise NotPermitted("tierfs does not support hard links")

    # --- removing -------------------------------------------------------------------------------

    def _unlink_name(self, w: JournalWriter, parent: int, name: bytes) -> None:
        """Remove ``name`` from directory ``parent`` in the transaction
        ``w``, and touch the directory (mtime, ctime)."""
        parent_inode = w.tx.get_inode(parent)
        assert parent_inode is not None
        self._touch_dir(parent_inode)
        w.tx.put_inode(parent_inode)
        w.tx.unlink(parent, name)

    def _refuse_deletes(self, what: str, parent: int, name: bytes) -> None:
        """``[write] deletes = false``: nothing is deleted through the mount."""
        if self.write_config.deletes:
            return
        above = self.namespace.path_of(parent)
        path = f"{above}/{name.decode(errors='replace')}".lstrip("/")
        log.warning("%s of %r refused: [write] deletes = false", what, path)
        raise NotPermitted(f"{path}: deletes are turned off on this mount ([write] deletes)")

    async def unlink(self, parent: int, name: bytes) -> None:
        self._refuse_deletes("unlink", parent, name)
        dir_inode = await self._parent_for_change(parent)
        inode = self._existing_child(parent, name)
        if inode.is_dir:
            raise IsADirectory(name.decode(errors="replace"))
        key = child_key(self.namespace.key_of(dir_inode), name)
        busy = self.open_files.is_busy(inode.ino)
        tiers: list[int] = []
        with self.journal.reshaping() as w:
            self._unlink_name(w, parent, name)
            self._queue_removal(w, inode, key)
            if busy:
                w.tx.keep_unlinked(inode.ino)
            else:
                tiers = w.tx.delete_inode(inode.ino)
        self.quotas.removed(inode, key, still_open=busy)
        self.unlinked.add(inode)
        if busy:
            self._orphans.add(inode.ino)  # deleted when the last handle closes
        else:
            self.remove_cache_files(inode.ino, tiers)

    def _queue_removal(self, w: JournalWriter, inode: Inode, key: str) -> None:
        """Bucket side of removing a file from the namespace."""
        w.cancel_upload(inode.ino)
        if inode.origin_key:
            # Tagged with the inode: if it is still open, the object must stay
            # readable until the last close (Journal.orphans holds it back).
            w.append(
                {"op": "delete", "key": inode.origin_key, "ino": inode.ino, "shadow_ino": inode.ino}
            )
        if self.journal.uploading(inode.ino) and key != inode.origin_key:
            w.append({"op": "delete", "key": key, "shadow_ino": inode.ino})

    def file_idle(self, ino: int) -> None:
        """Nothing uses the file any more (``OpenFiles`` tells, whenever the
        last user of a CachedFile lets go, be it a handle's release, an
        upload or a fetch still in flight): an unlinked one goes away now."""
        if ino not in self._orphans:
            return
        self._orphans.discard(ino)
        self.quotas.orphan_gone(ino)
        self.journal.namespace_gen += 1
        self.journal.wake()  # its object may be deleted now
        with self.meta.write() as tx:
            tiers = tx.delete_inode(ino)
        self.remove_cache_files(ino, tiers)

    def remove_cache_files(self, ino: int, tiers: list[int]) -> None:
        for tier in tiers:
            self.tiers[tier].remove_file(ino)
        self.space.forget(ino)

    async def rmdir(self, parent: int, name: bytes) -> None:
        self._refuse_deletes("rmdir", parent, name)
        dir_inode = await self._parent_for_change(parent)
        inode = self._existing_child(parent, name)
        if not inode.is_dir:
            raise NotADirectory(name.decode(errors="replace"))
        await self.listings.ensure_listed(inode, stale_wait=0.0)
        if self.meta.count_children(inode.ino):
            raise DirectoryNotEmpty(name.decode(errors="replace"))
        key = child_key(self.namespace.key_of(dir_inode), name)
        with self.journal.reshaping() as w:
            self._unlink_name(w, parent, name)
            w.tx.delete_inode(inode.ino)
            w.append({"op": "delete", "key": key + "/", "shadow_ino": inode.ino})
        self.quotas.removed(inode, key)
        self.unlinked.add(inode)

    # --- rename ----------------------------------------------------------------------------------

    async def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None:
        if flags & RENAME_EXCHANGE:
            raise InvalidArgument("RENAME_EXCHANGE is not supported")
        check_name(new_name)
        check_not_reserved(new_parent, new_name)
        src_dir = await self._parent_for_change(old_parent)
        dst_dir = await self._parent_for_change(new_parent)
        inode = self._existing_child(old_parent, old_name)
        target_ino = self.meta.lookup(new_parent, new_name)
        if target_ino == inode.ino:
            return
        target = self.namespace.get(target_ino) if target_ino is not None else None
        if target is not None:
            self._refuse_deletes("rename over", new_parent, new_name)
            if flags & RENAME_NOREPLACE:
                raise Exists(new_name.decode(errors="replace"))
            if inode.is_dir and not target.is_dir:
                raise NotADirectory(new_name.decode(errors="replace"))
            if not inode.is_dir and target.is_dir:
                raise IsADirectory(new_name.decode(errors="replace"))
            if target.is_dir:
                await self.listings.ensure_listed(target, stale_wait=0.0)
                if self.meta.count_children(target.ino):
                    raise DirectoryNotEmpty(new_name.decode(errors="replace"))
        new_key = self._new_key(dst_dir, new_name, is_dir=inode.is_dir)
        below: list[tuple[Inode, str]] = []
        if inode.is_dir:
            probe = dst_dir
            while True:
                if probe.ino == inode.ino:
                    raise InvalidArgument("cannot move a directory into itself")
                if probe.ino == ROOT_INO:
                    break
                probe = self.namespace.get(probe.parent)
            deepest, below = await self._list_subtree(inode)
            if deepest:
                self._check_key(new_key + "/" + deepest)  # every key below moves too
            inode = self.namespace.get(inode.ino)  # the listing updated its record
        old_key = child_key(self.namespace.key_of(src_dir), old_name)
        # No await from the quota check to the transaction (see ``quotas``);
        # the subtree's keys are made only if a quota looks at them.
        quota_plan = self.quotas.plan_move(
            itertools.chain(
                [(inode, old_key, new_key)],
                ((child, f"{old_key}/{rel}", f"{new_key}/{rel}") for child, rel in below),
            )
        )
        target_tiers: list[int] = []
        target_busy = target is not None and self.open_files.is_busy(target.ino)
        with self.journal.reshaping() as w:
            if target is not None:
                w.tx.unlink(new_parent, new_name)
                if target.is_dir:
                    w.tx.delete_inode(target.ino)
                    w.append({"op": "delete", "key": new_key + "/", "shadow_ino": target.ino})
                else:
                    self._queue_removal(w, target, new_key)
                    if target_busy:
                        w.tx.keep_unlinked(target.ino)
                    else:
                        target_tiers = w.tx.delete_inode(target.ino)
            w.tx.unlink(old_parent, old_name)
            inode.parent, inode.name = new_parent, new_name
            inode.ctime_ns = time.time_ns()
            w.tx.put_inode(inode)
            for dir_ino in {old_parent, new_parent}:
                parent_inode = w.tx.get_inode(dir_ino)
                assert parent_inode is not None
                self._touch_dir(parent_inode)
                if dir_ino == new_parent:
                    w.tx.link(parent_inode, new_name, inode.ino)
                else:
                    w.tx.put_inode(parent_inode)
            if inode.is_dir:
                self._queue_dir_move(w, inode, old_key, new_key)
            else:
                self._queue_file_move(w, inode, old_key, new_key)
        if target is not None:
            self.quotas.removed(target, new_key, still_open=target_busy and not target.is_dir)
        self.quotas.apply_move(quota_plan)
        if target is not None:
            self.unlinked.add(target)
        if target is not None and not target.is_dir:
            if target_busy:
                self._orphans.add(target.ino)
            else:
                self.remove_cache_files(target.ino, target_tiers)

    async def _list_subtree(self, top: Inode) -> tuple[str, list[tuple[Inode, str]]]:
        """List every directory below ``top`` so that every key is known;
        returns the longest key below it, relative to it ("" if it is
        empty; a directory's ends in "/", as its marker's does), and every
        name below it with its path relative to ``top`` (for the quotas).

        The rename of a directory checks that key at its new place: no key
        of the subtree may grow past the bucket's limit.  Finding it costs
        one length per entry on this walk, which the rename makes anyway
        (it queues a copy per file): no extra I/O, no index to keep."""
        deepest, deepest_len = "", 0
        members: list[tuple[Inode, str]] = []
        pending: list[tuple[Inode, str]] = [(top, "")]
        while pending:
            inode, rel = pending.pop()
            # Every key must be known: wait for a re-listing as a lookup
            # does (bounded, and not at all while the endpoint is out).
            await self.listings.ensure_listed(inode)
            for _cookie, name, child in self.meta.read_dir(inode.ino, 0, 1 << 30):
                child_inode = self.namespace.get(child)
                child_rel = rel + name.decode() + ("/" if child_inode.is_dir else "")
                if len(child_rel.encode()) > deepest_len:
                    deepest, deepest_len = child_rel, len(child_rel.encode())
                members.append((child_inode, child_rel.rstrip("/")))
                if child_inode.is_dir:
                    pending.append((child_inode, child_rel))
        return deepest, members

    def _queue_file_move(self, w: JournalWriter, live: Inode, old_key: str, new_key: str) -> None:
        """``live`` is the inode as this transaction sees it (the open file's
        in-memory inode if it is open): it is modified and written here."""
        if live.origin_key:
            if live.state == SyncState.DIRTY and self._fully_local(live):
                w.append({"op": "delete", "key": live.origin_key, "shadow_ino": live.ino})
                live.origin_key, live.etag, live.origin_size = "", "", 0
                w.tx.put_inode(live)
            elif live.origin_key != new_key:
                w.append({"op": "copy", "src": live.origin_key, "dst": new_key, "ino": live.ino})
                w.append({"op": "delete", "key": live.origin_key, "shadow_ino": live.ino})
                live.origin_key = new_key  # reads use the copy's source until it is done
                w.tx.put_inode(live)
        if self.journal.uploading(live.ino) and old_key != live.origin_key:
            w.append({"op": "delete", "key": old_key, "shadow_ino": live.ino})
        w.requeue_upload(live.ino)

    def _queue_dir_move(self, w: JournalWriter, top: Inode, old_key: str, new_key: str) -> None:
        pending = [(top, old_key, new_key)]
        while pending:
            inode, old, new = pending.pop()
            w.append({"op": "mkdir", "key": new + "/", "ino": inode.ino})
            w.append({"op": "delete", "key": old + "/", "shadow_ino": inode.ino})
            if inode.state == SyncState.CLEAN:
                inode.state = SyncState.DIRTY  # until its marker exists
                w.tx.put_inode(inode)
            for name, child in w.tx.children(inode.ino):
                # Inside the write transaction: a separate read would not see
                # what this transaction already changed.
                child_inode = self.open_files.live_inode(child) or w.tx.get_inode(child)
                assert child_inode is not None
                old_child, new_child = child_key(old, name), child_key(new, name)
                if child_inode.is_dir:
                    pending.append((child_inode, old_child, new_child))
                else:
                    self._queue_file_move(w, child_inode, old_child, new_child)

    def _fully_local(self, inode: Inode) -> bool:
        """Are all bytes the origin still provides present locally?"""
        bs = self.block_size
        needed = (min(inode.origin_size, inode.size) + bs - 1) // bs
        cf = self.open_files.files.get(inode.ino)
        blocks = cf.blocks if cf is not None else self.meta.get_blocks(inode.ino)
        return all(b in blocks for b in range(needed))

    # --- attributes ------------------------------------------------------------------------------

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
        """``caller``: who asks (FUSE context).  A truncation by a caller
        without CAP_FSETID, and any chown of a non-directory, clear
        setuid/setgid by the kernel's rules (``posix_attrs``)."""
        inode = self.namespace.get(ino)
        self._refuse_other_owner(uid, gid)
        if (mode, uid, gid) != (None, None, None) and self.listings.is_provisional(inode):
            # A chmod or chown changes the attributes a listing gives the
            # name, not its provisional owner-only ones, which the next
            # listing would otherwise put back over it.
            await self.listings.settle_provisional(inode, self.journal.read_origin(ino))
        if size is not None and size != inode.size:
            await self._truncate(inode, size)
            inode = self.namespace.get(ino)
        if size is not None and mode is None and caller is not None and inode.is_file:
            cleared = mode_after_write(inode.mode, inode.gid, caller)
            if cleared != inode.mode:
                mode = cleared
        if mode is None and uid is None and gid is None and mtime_ns is None and atime_ns is None:
            return self.attributes(inode)
        if mode is not None:
            inode.mode = stat.S_IFMT(inode.mode) | (mode & 0o7777)
        if uid is not None:
            inode.uid = uid
        if gid is not None:
            inode.gid = gid
        if uid is not None or gid is not None:
            inode.mode = mode_after_chown(inode.mode)
        if mtime_ns is not None:
            inode.mtime_ns = mtime_ns
        if atime_ns is not None:
            inode.atime_ns = atime_ns
            self.access_times.discard(ino)
        inode.ctime_ns = time.time_ns()
        with self.journal.write() as w:
            w.tx.put_inode(inode)
            if not inode.is_dir and inode.state == SyncState.CLEAN and inode.origin_key:
                # The key is pinned now: a later rename must not retarget it.
                w.append({"op": "setmeta", "ino": ino, "key": inode.origin_key})
            elif (
                inode.is_dir
                and inode.ino != ROOT_INO
                and (mode is not None or uid is not None or gid is not None)
            ):
                # Even if a mkdir of it is pending: it may be running already,
                # with the old attributes.  A marker put twice is harmless.
                key = self.namespace.key_of(inode) + "/"
                w.append({"op": "mkdir", "key": key, "ino": ino})
        return self.attributes(inode)

    # --- extended attributes ---------------------------------------------------------------------

    async def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.namespace.get(ino)
        if name == self.control_xattr:
            raise NotPermitted("this attribute is read-only")
        if not name.startswith(b"user."):
            raise NotSupported("only user.* extended attributes are supported")
        if len(value) > XATTR_VALUE_MAX:
            raise InvalidArgument("extended attribute value too large")
        grows = self._xattr_growth(ino, name, value)
        inode = self.namespace.get(ino)
        inode.ctime_ns = time.time_ns()  # an attribute of the inode changed
        with self.meta.write() as tx:
            tx.set_xattr(ino, name, value)
            tx.put_inode(inode)
        if self._xattr_total is not None:
            self._xattr_total = max(0, self._xattr_total + grows)

    def _xattr_growth(self, ino: int, name: bytes, value: bytes) -> int:
        """The bytes the attribute adds (an attribute replaced frees its old
        value first; each counts at least ``XATTR_ENTRY_MIN``); NoSpace if it
        would take the inode past ``XATTR_BYTES_PER_FILE`` or every inode's
        past ``XATTR_BYTES_TOTAL``.  The running total is counted once and
        kept; removed files leave it high until it is counted again, which a
        refusal does first, at most every ``XATTR_RECOUNT_INTERVAL``.  No
        await: the check and the write that follows are one step of the loop."""
        old = self.meta.get_xattr(ino, name)
        grows = _xattr_cost(name, value) - (0 if old is None else _xattr_cost(name, old))
        if grows <= 0:
            return grows
        if self.meta.xattr_bytes(ino, entry_min=XATTR_ENTRY_MIN) + grows > XATTR_BYTES_PER_FILE:
            raise NoSpace(
                f"no room for more extended attributes on this file "
                f"(at most {XATTR_BYTES_PER_FILE} bytes of names and values per file)"
            )
        now = time.monotonic()
        if self._xattr_total is None or (
            self._xattr_total + grows > XATTR_BYTES_TOTAL
            and now - self._xattr_counted_at >= XATTR_RECOUNT_INTERVAL
        ):
            self._xattr_total = self.meta.xattr_bytes(entry_min=XATTR_ENTRY_MIN)
            self._xattr_counted_at = now
        if self._xattr_total + grows > XATTR_BYTES_TOTAL:
            raise NoSpace(
                f"the mount's extended attributes hold {self._xattr_total} bytes, "
                f"the most it keeps ({XATTR_BYTES_TOTAL})"
            )
        return grows

    async def removexattr(self, ino: int, name: bytes) -> None:
        inode = self.namespace.get(ino)
        old = self.meta.get_xattr(ino, name)
        with self.meta.write() as tx:
            removed = tx.remove_xattr(ino, name)
            if removed:
                inode.ctime_ns = time.time_ns()
                tx.put_inode(inode)
        if not removed:
            raise NoData(name.decode(errors="replace"))
        if self._xattr_total is not None and old is not None:
            self._xattr_total = max(0, self._xattr_total - _xattr_cost(name, old))
