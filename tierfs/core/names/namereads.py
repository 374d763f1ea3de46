"""What the kernel reads of names: lookups, attributes and directory reads.

``NameReads`` answers ``lookup``, ``getattr``, ``forget``, the negative
entry timeout, ``opendir``, ``readdir`` and ``releasedir``.  It changes
nothing in the namespace: the changes are ``NameChanges``' (``changes``),
which takes ``attributes`` from here so that a reply to a change and a
reply to a lookup are built alike.

Directory handles (``dirhandles``): ``opendir`` returns a handle whose
readdir offsets are keys (``.``, ``..``, then dirseq cookies, see
``MetaDB``), so that a seek is one LMDB lookup and a name renamed during a
readdir is never returned twice; ``releasedir`` drops it.  A handle also
knows whether a request goes on where the last one stopped, and
``readdir_into`` then fills the kernel's whole buffer.  The attributes
readdir hands out are kept with the inode records they were built from
(``attrcache``): a warm listing decodes only the inodes that changed.

Timeouts.  The kernel may keep what it is given for ``list_ttl`` seconds.
Attributes that come from an expired listing (being re-listed) are given
with timeout 0, so the next access asks again and sees the re-listing as
soon as it is done; a negative entry is kept for what is left of its
directory's ``list_ttl`` (``negative_timeout``).

Waits: ``opendir`` waits only for a directory never listed (an expired
listing is served and re-listed in the background, see ``Namespace``);
``readdir`` waits for a first listing still running, whose names have no
settled attributes yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tierfs.errors import NotADirectory, NotFound
from tierfs.meta import Inode, MetaDB
from tierfs.meta.records import decode_inode

from ..state.openfiles import OpenFiles
from ..state.results import AttributeRules, Attributes, DirEntry, attributes_of
from .attrcache import AttributeCache
from .dirhandles import DOT, DOTDOT, DirHandles, cookie_after, offset_of
from .listings import Listings
from .namespace import Namespace
from .posix_attrs import AccessTimes, UnlinkedInodes

#: Entries one readdir request reads from LMDB: about what fits in the
#: kernel's one-page readdirplus reply, so a seek does not build entries
#: that are thrown away.
READDIR_BATCH = 32


@dataclass(eq=False)
class NameReads:
    """Lookups, attributes and directory reads (see the module docstring)."""

    rules: AttributeRules
    meta: MetaDB
    namespace: Namespace
    listings: Listings
    open_files: OpenFiles
    access_times: AccessTimes
    unlinked: UnlinkedInodes
    dir_handles: DirHandles = field(init=False, default_factory=DirHandles)
    #: Attributes readdir hands out, with the inode records they came from.
    attribute_cache: AttributeCache = field(init=False)
    #: Directory entries handed out by ``readdir_handle`` (``.``/``..`` too).
    readdir_entries: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        rules = self.rules
        self.attribute_cache = AttributeCache(lambda inode: attributes_of(inode, rules))

    def attributes(self, inode: Inode, timeout: float | None = None) -> Attributes:
        """What the kernel sees of ``inode``; ``timeout`` (seconds it may
        keep them) defaults to ``list_ttl``."""
        return attributes_of(
            inode,
            self.rules,
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
        return max(0.0, listed_at + self.rules.list_ttl - time.time())

    # --- directories -----------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        """A directory handle for ``readdir_handle``; waits only for a
        directory never listed."""
        inode = self.namespace.get(ino)
        if not inode.is_dir:
            raise NotADirectory(f"inode {ino} is not a directory")
        await self.listings.ensure_listed(inode, stale_wait=0.0)
        self.access_times.accessed(inode)  # reading a directory is an access
        return self.dir_handles.open(ino, self.namespace.get(ino).next_cookie)

    async def readdir_handle(
        self, fh: int, offset: int, limit: int = READDIR_BATCH
    ) -> list[DirEntry]:
        """Entries of open directory ``fh`` after readdir ``offset`` (0 is
        the start), ``.`` and ``..`` first; each entry's ``cookie`` is the
        offset to continue from.  An empty list is the end.  Offsets stay
        valid while names come and go (``tierfs.core.names.dirhandles``)."""
        handle = self.dir_handles.get(fh)
        try:
            inode = self.namespace.get(handle.ino)
        except NotFound:
            return []  # removed while open: reads as empty, as on ext4
        if offset == 0:
            handle.horizon = inode.next_cookie  # rewinddir: what is there now
        out: list[DirEntry] = []
        # From an expired listing the kernel may not keep entries (``lookup``).
        timeout = 0.0 if self.listings.listing_expired(inode) else None
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
        (any other offset) one batch only (``tierfs.core.names.dirhandles``)."""
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
        # out provisional, owner-only (see tierfs.core.names.namespace).
        await self.listings.wait_listing(ino)
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
