"""The namespace: the mount's names over the bucket's keys.

``Namespace`` answers lookups (``lookup_entry``), resolves paths and walks
subtrees, and revalidates a file's content on open.  Its parts, given at
construction:

* ``InodeKeys`` (``inodekeys``): inodes by number and their object keys;
* ``Listings`` (``listings``): directories listed lazily from the bucket
  into LMDB, re-listing in the background, the attributes of listed names
  (the shadow), the bounded waits for the bucket.

Consistency a reader gets (docs/guarantees.md says the same):

- Names of a directory come from its last completed listing, plus what a
  running re-listing merged so far (each page as it arrives: new names,
  changed sizes; names gone from the bucket only when it completes), plus
  this node's own changes, which are visible at once.
- Within ``list_ttl`` of that listing: what it holds, as it held it.  The
  kernel keeps entries and attributes that long, and "no such name" (a
  negative entry) for what is left of the directory's ``list_ttl``, never
  longer (``NameReads.negative_timeout``); names made through the mount
  replace a negative entry at once.
- After ``list_ttl``, for the first access by name:
  * a name the old listing holds is answered at once from it (size,
    attributes, existence as that listing had them), with timeout 0, while
    the directory is re-listed in the background: ``stat`` and ``ls`` of an
    object another writer replaced or deleted show the old state until that
    re-listing is done (a LIST and a shadow LIST later), then the bucket's.
    An ``open`` of such a file asks the bucket (``TierFS.open``: one HEAD,
    bounded by ``REVALIDATE_WAIT``): it reads the new bytes, or gets ENOENT;
  * a name the old listing lacks waits for that re-listing (bounded, see
    above) and then answers what the bucket holds: a new file or directory
    is found, with its settled attributes (never wider than stored).
- ``readdir`` of an expired listing is served at once from it (a new name
  shows in it once the re-listing is done); ``opendir`` of a directory
  never listed waits for its first listing.
- While the endpoint is suspect or down, every answer comes at once from
  what is cached (stale-if-error), missing names included.
- While re-listings are backlogged (``RELIST_BACKLOG``), a directory may be
  served older than one re-listing.
- A file's content is revalidated on open after ``revalidate_ttl`` (one
  HEAD; for a file with nothing cached, only when its directory's listing
  expired, else its first GET checks the ETag); a changed ETag drops the
  cached blocks.  Never while the journal
  still owes its object at its key (``protects``: a rename's copy is
  pending): the key is then ahead of the bucket, which holds nothing
  there, or the object of the file that the rename replaced.  Taking that
  answer hid the file (ENOENT on open, while the listing and ``lstat``
  showed it) or gave it the replaced file's ETag and size and dropped its
  cached blocks.  Its own copy is the current one until the copy is done.
- An open directory handle shows the names that were there at ``opendir``
  (or ``rewinddir``) and not yet removed; names linked later, by a listing
  or a rename, are left to the next ``opendir`` (``tierfs.core.names.dirhandles``).

Files are revalidated on open when their ETag was last confirmed more than
``revalidate_ttl`` ago: one HEAD.  A changed ETag drops the cached blocks.
A read-only open of a file with nothing cached sends no HEAD (``TierFS.open``)
while its directory's listing is fresh: its first GET carries the ETag
(If-Match), and a mismatch revalidates then.

Stale-if-error: while ``endpoint_suspect`` (breaker open, the last request
got no answer, or a bounded wait ran out lately: no HEAD is sent then), or
when the HEAD fails for a
transport reason (StoreUnavailable) or takes longer than
``REVALIDATE_WAIT`` seconds, the cached copy is served as it is and
``validated_at`` is left alone (the next open after the outage asks
again); a HEAD that outlives the wait is abandoned to its thread.  Only
"the object is gone" (404) and other answers of the bucket act on the file.
"""

from __future__ import annotations

import logging
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import trio

from tierfs.config import NamespaceConfig
from tierfs.errors import NameTooLong, NotADirectory, NotFound, ObjectNotFound, StoreUnavailable
from tierfs.meta import PROVISIONAL, ROOT_INO, Inode, MetaDB, SyncState
from tierfs.meta.records import decode_inode, raw_listed_at, raw_mode
from tierfs.store import ObjectStore

from .inodekeys import InodeKeys
from .listings import (
    MISSING_NAME_WAIT,
    NAME_MAX,
    STALE_LISTING_WAIT,
    Listings,
)

log = logging.getLogger(__name__)

#: Seconds an open waits for the revalidation HEAD of a cached clean file.
REVALIDATE_WAIT = 1.0
#: A subtree walk reads this many directory entries from LMDB at a time.
WALK_PAGE = 512


@dataclass(slots=True)
class _WalkFrame:
    """One directory level of a walk (``Namespace.walk``)."""

    ino: int
    #: Its path relative to the mount root ("" for the root).
    path: str
    #: Cookie of the last entry taken.
    cookie: int = 0
    #: Cookie of the last entry looked at for list-ahead.
    ahead: int = 0


@dataclass(eq=False)
class Namespace:
    """The mount's names: lookups, paths, walks and revalidation on open,
    over the directories ``Listings`` keeps (see the module docstring)."""

    meta: MetaDB
    store: ObjectStore
    config: NamespaceConfig
    keys: InodeKeys
    listings: Listings
    store_limiter: trio.CapacityLimiter
    #: Revalidations that served the cached copy because the bucket did
    #: not answer (stale-if-error).
    stale_opens: int = field(init=False, default=0)

    # --- inodes and keys (``InodeKeys``) ----------------------------------------------

    def get(self, ino: int) -> Inode:
        return self.keys.get(ino)

    def path_of(self, ino: int) -> str:
        """The file's path in the mount, for messages."""
        return self.keys.path_of(ino)

    def key_of(self, inode: Inode) -> str:
        return self.keys.key_of(inode)

    def prefix_of(self, dir_inode: Inode) -> str:
        return self.keys.prefix_of(dir_inode)

    # --- lookup and walks -------------------------------------------------------------

    async def lookup(self, parent: int, name: bytes) -> Inode:
        inode, _expired = await self.lookup_entry(parent, name)
        return inode

    async def lookup_entry(self, parent: int, name: bytes) -> tuple[Inode, bool]:
        """``lookup``, and whether the listing of ``parent`` that answered
        is expired (``expired``; being re-listed).

        The warm path (a fresh listing, a settled name) reads two LMDB
        records, the directory's and the child's, and decodes each once:
        a fresh listing stays fresh across ``ensure_listed``, which then
        returns without yielding to the loop.  Only after a wait (a
        listing, a settling) is the directory read again.
        """
        dir_inode = self.get(parent)
        if not dir_inode.is_dir:
            raise NotADirectory(f"inode {parent} is not a directory")
        fresh = dir_inode.listed_at > 0 and time.time() - dir_inode.listed_at < self.config.list_ttl
        if name == b".":
            return dir_inode, not fresh and dir_inode.listed_at > 0
        if name == b"..":
            return self.get(dir_inode.parent), not fresh and dir_inode.listed_at > 0
        if len(name) > NAME_MAX:
            # No such name can exist (listings skip them): say why, as POSIX does.
            raise NameTooLong(f"name longer than {NAME_MAX} bytes")
        if not fresh:
            await self.listings.ensure_listed(dir_inode, stale_wait=0.0)
        child, provisional = self._entry_inode(self.meta.lookup(parent, name))
        if child is None and not fresh and dir_inode.listed_at > 0:
            # Missing from an expired listing: another writer may have made
            # it since.  The re-listing just started (or already running)
            # tells; its settled answer is the bucket's.
            await self.listings.wait_running(parent, MISSING_NAME_WAIT)
            fresh = False  # the loop ran meanwhile: ask the directory again
            child, provisional = self._entry_inode(self.meta.lookup(parent, name))
        if provisional:
            # Added by the re-listing running now (the listing served lacked
            # it): its attributes come with that re-listing's shadow listing.
            await self.listings.wait_running(parent, STALE_LISTING_WAIT)
            fresh = False  # the loop ran meanwhile: ask the directory again
            child, _provisional = self._entry_inode(self.meta.lookup(parent, name))
        if child is None:
            raise NotFound(name.decode(errors="replace"))
        return child, (not fresh and self.listings.expired(parent))

    def _entry_inode(self, ino: int | None) -> tuple[Inode | None, bool]:
        """The inode a dentry names (the live one of an open file; None if
        none) and whether its attributes are provisional (``_provisional``),
        with one decode of its record when it is not open."""
        if ino is None:
            return None, False
        live = self.keys.live_inode(ino)
        if live is not None:
            return live, self.listings.provisional(ino)
        inode = self.meta.get_inode(ino)
        return inode, inode is not None and inode.validated_at == PROVISIONAL

    async def resolve(self, relpath: str) -> Inode:
        """Inode of a path relative to the mount root ("" is the root)."""
        inode = self.get(ROOT_INO)
        for part in relpath.split("/"):
            if part in ("", "."):
                continue
            inode = await self.lookup(inode.ino, part.encode())
        return inode

    async def walk(
        self,
        relpath: str,
        *,
        list_dirs: bool = True,
        top: Inode | None = None,
        enter: Callable[[Inode, str], bool] | None = None,
    ) -> AsyncIterator[tuple[Inode, str]]:
        """Every regular file at or below ``relpath``, with its path relative
        to the mount root: depth first, in directory order.

        Memory: one frame per directory level of the current path (the
        directory inode number, its path, the cookie of the last entry
        taken) and one page of ``WALK_PAGE`` entries; never the tree, nor
        a whole directory.  A frame resumes from its cookie after its
        subdirectory is done, so entries added or removed meanwhile are
        handled as ``readdir`` would.  ``list_dirs``: list each directory
        from the bucket when its listing is missing or expired
        (``ensure_listed``); without it, only what LMDB holds is walked.
        The walk yields to the loop after every page.  Symlinks and other
        special files are not yielded.  ``top``: the inode of ``relpath``
        when the caller resolved it already.  ``enter(dir inode, path)``:
        whether to go into a directory (the top one too), asked before it
        is listed; a directory it refuses is neither listed nor walked
        (a caller's rights: ``access.Permissions.lister``).

        List-ahead (``list_dirs`` only): when the walk descends into a
        subdirectory, the never-listed subdirectories that follow it in the
        same page get their first listing started in the background
        (``list_ahead``), so that each is listed, or on its way, when the
        walk gets there: a tree of many directories costs about one LIST's
        latency per ``LIST_AHEAD`` directories instead of one per directory
        (``tests/core/test_preload.py``: listings 0.2 s away overlap).  On
        s3rver, whose one thread is busy for each LIST, it did not shorten
        the scan of a preload of 5,000 files in 10 directories (1.2-1.7 s
        both ways): there the server, not the round trips, is the cap.
        Each entry is looked at for this once per frame (its ``ahead``
        cookie).
        """
        inode = top if top is not None else await self.resolve(relpath)
        relpath = relpath.strip("/")
        if inode.is_file:
            yield inode, relpath
            return
        if not inode.is_dir or (enter is not None and not enter(inode, relpath)):
            return
        if list_dirs:
            await self.listings.ensure_listed_for_walk(inode)
        stack = [_WalkFrame(inode.ino, relpath)]
        while stack:
            frame = stack[-1]
            # One read transaction per page, each record decoded once here.
            page = self.meta.read_dir_records(frame.ino, frame.cookie, WALK_PAGE)
            if not page:
                stack.pop()
                continue
            descend: tuple[Inode, str] | None = None
            for index, (entry_cookie, name, child, record) in enumerate(page):
                frame.cookie = entry_cookie
                child_inode = self.keys.live_inode(child) or decode_inode(child, record)
                text = name.decode(errors="surrogateescape")
                child_path = f"{frame.path}/{text}" if frame.path else text
                if child_inode.is_file:
                    yield child_inode, child_path
                elif child_inode.is_dir:
                    if enter is not None and not enter(child_inode, child_path):
                        continue
                    descend = (child_inode, child_path)
                    if list_dirs:
                        self._list_ahead_of_walk(frame, page[index + 1 :])
                    break
            if descend is not None:
                if list_dirs:
                    await self.listings.ensure_listed_for_walk(descend[0])
                stack.append(_WalkFrame(descend[0].ino, descend[1]))
            await trio.sleep(0)

    def _list_ahead_of_walk(
        self, frame: _WalkFrame, later: list[tuple[int, bytes, int, bytes]]
    ) -> None:
        """Start first listings of the never-listed directories among
        ``later`` (the entries of ``frame``'s page after the one the walk
        descends into, with their records), as many as ``LIST_AHEAD`` leaves
        room for; entries looked at before (up to ``frame.ahead``) are
        skipped.  Only the records of never-listed directories are decoded
        (files, the most of a page, are told by their mode)."""
        for entry_cookie, _name, child, record in later:
            if not self.listings.may_list_ahead():
                return
            if entry_cookie <= frame.ahead:
                continue
            frame.ahead = entry_cookie
            child_inode = self.keys.live_inode(child)
            if child_inode is None:
                if not stat.S_ISDIR(raw_mode(record)) or raw_listed_at(record) > 0:
                    continue
                child_inode = decode_inode(child, record)
            if child_inode.is_dir:
                self.listings.list_ahead(child_inode)

    # --- revalidation ------------------------------------------------------------------

    async def revalidate(self, inode: Inode) -> tuple[Inode, bool]:
        """HEAD a clean file if its ETag is older than ``revalidate_ttl``.

        Returns the (possibly updated) inode and whether its content changed.
        Raises NotFound if the object is gone (and removes it).  A file the
        journal protects (a rename's copy to its key is pending) is not
        HEADed: its key is ahead of the bucket (see the module docstring).
        """
        if inode.state != SyncState.CLEAN or not inode.is_file:
            return inode, False
        if self.listings.protects(inode.ino):
            return inode, False  # the bucket does not have it at its key yet
        now = time.time()
        if now - inode.validated_at < self.config.revalidate_ttl:
            return inode, False
        key = inode.origin_key
        if self.listings.endpoint_suspect():
            self.stale_opens += 1
            return inode, False
        info = None
        try:
            with trio.move_on_after(REVALIDATE_WAIT):
                info = await trio.to_thread.run_sync(
                    self.store.head, key, limiter=self.store_limiter, abandon_on_cancel=True
                )
        except ObjectNotFound:
            self._forget_vanished(inode)
            raise NotFound(f"{key} was deleted from the bucket") from None
        except StoreUnavailable as exc:
            log.debug("revalidating %r failed, serving the cached copy: %s", key, exc)
            self.stale_opens += 1
            return inode, False
        if info is None:
            self.listings.waited_in_vain()
            self.stale_opens += 1
            return inode, False
        changed = info.etag != inode.etag
        if changed:
            tiers = self.meta.drop_blocks(inode.ino)
            self.listings.dropped(inode.ino, tiers, True)
            log.info("object %r changed in the bucket; dropped its cached blocks", key)
            inode.etag = info.etag
            inode.origin_size = info.size
            inode.size = info.size
            inode.mtime_ns = int(info.mtime * 1e9)
            inode.ctime_ns = time.time_ns()
        if inode.validated_at != PROVISIONAL:
            self._apply_metadata(inode, info.metadata)
            inode.validated_at = now
        # else: a listing settles its attributes (shadow or defaults, never
        # the object's metadata alone, which may be wider than its shadow);
        # taking them here made the owner-only ones permanent, and a write
        # then uploaded them as a shadow.
        self.meta.put_inode(inode)
        return inode, changed

    async def revalidate_now(self, ino: int) -> Inode | None:
        """A GET's If-Match failed: HEAD the clean file now, whatever its
        ``validated_at``.  The new inode if its content changed (its cached
        blocks are dropped already), None if not."""
        inode = self.meta.get_inode(ino)
        if inode is None or inode.state != SyncState.CLEAN:
            return None
        inode.validated_at = 0.0  # due now
        inode, changed = await self.revalidate(inode)
        return inode if changed else None

    def _forget_vanished(self, inode: Inode) -> None:
        parent = self.get(inode.parent)
        parent.listed_at = 0.0  # force a re-list, which sweeps the name
        self.meta.put_inode(parent)

    @staticmethod
    def _apply_metadata(inode: Inode, metadata: dict[str, str]) -> None:
        """Take mode/uid/gid from ``x-amz-meta-*`` when present and sane.

        ``mode`` is the decimal ``st_mode``, as s3fs-fuse writes it, so that
        objects written by either tool keep their permissions in the other.
        Only the permission bits are taken: the type comes from the key.
        """
        try:
            if "mode" in metadata:
                mode = int(metadata["mode"], 10)
                inode.mode = (inode.mode & ~0o7777) | (mode & 0o7777)
            if "uid" in metadata:
                inode.uid = int(metadata["uid"])
            if "gid" in metadata:
                inode.gid = int(metadata["gid"])
            if "mtime" in metadata:
                inode.mtime_ns = int(float(metadata["mtime"]) * 1e9)
        except ValueError:
            log.debug("ignoring malformed user metadata on inode %d", inode.ino)
