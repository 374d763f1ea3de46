"""Directory listings: the bucket's keys listed lazily into LMDB.

State of a directory inode:

    never listed (listed_at == 0)
        --first lookup/readdir--> listing --complete--> listed (listed_at = t)
    listed, t + list_ttl < now
        --next lookup/readdir--> listing --complete--> listed (listed_at = t')

A listing streams ListObjectsV2 pages (delimiter "/") and merges each page
into LMDB in one transaction, so memory holds one page, not the directory.
When the last page is merged, names that were not seen are swept (only clean,
bucket-backed entries; local-only data of later issues stays).  Likewise a
listed name of the other type (``c/`` for a file ``c``) replaces a local
name only if that is a clean copy of the bucket, and never when its key is
still being deleted by this node (``MetaDB.merge_listing``): a LIST sent
before the deletes of a directory renamed away still shows its prefix.
"Being deleted" includes the deletes that completed while the listing ran
(``Journal.watch_deletes``, opened before the LIST is sent): the LIST may
predate them, and would bring an unlinked or renamed-away name back.  A listing
whose directory was renamed or removed while a page was on its way is
dropped before it merges anything more (checked right after each await, so
the check and the merge are atomic for the other trio tasks).  Only one
listing of a directory runs at a time; concurrent callers wait for it.

A directory that was listed once is never held hostage by the bucket
(stale-while-revalidate, stale-if-error):

- while the endpoint's circuit breaker is open, its LMDB listing is served
  at once and no re-listing is tried;
- otherwise the re-listing runs as a background task (``spawn``, passed by
  TierFS; inline when there is none) and the caller is served the listing
  it has.  Lookups of names it holds, ``opendir`` and ``readdir`` never
  wait for a re-listing, and neither do namespace changes
  (``stale_wait=0``); a lookup of a name it lacks does (below).  Only
  callers that need every key of a subtree (a directory rename, a walk)
  wait for it, at most ``STALE_LISTING_WAIT`` seconds from its start, and
  not at all while the last request to the endpoint got no answer or such
  a wait ran out less than ``SLOW_HOLDOFF`` seconds ago
  (``endpoint_suspect``).  A re-listing that fails leaves the old listing
  and is logged.
- Background re-listings are bounded: single-flight per directory (one
  entry in ``_listing``, queued or running), at most
  ``RELIST_CONCURRENCY`` run at once (the others queue, in order), at most
  ``RELIST_BACKLOG`` are queued or running (beyond, a directory is served
  as it is and re-listed by a later lookup), and a directory whose
  re-listing failed is not tried again before ``list_ttl`` has passed.  A
  successful one stamps ``listed_at``, so a directory is re-listed at most
  once per ``list_ttl``: a shuffled sweep over many directories costs about
  one LIST per directory per ``list_ttl``, never one per lookup.
- A re-listing that fails (the bucket's error, or a defect: any exception,
  logged with its traceback) leaves a listing that is still right, only
  older: every page merged before the failure was merged whole, in one
  transaction (names it added exist in the bucket; the ones new to this
  node stay provisional, owner-only, until a listing settles them); no
  name is swept, since only a complete listing proves a name gone;
  ``listed_at`` is not stamped, so the directory stays expired and is
  re-listed by an access after ``list_ttl`` (``_relist_failed``).  A first
  listing that fails leaves the directory never listed, and its caller
  gets the error.
- A lookup of a name that the expired listing does not hold waits for the
  re-listing of its directory (the one it starts, or one already queued
  or running), at most ``MISSING_NAME_WAIT`` seconds from that re-listing's
  start and not at all while the endpoint is suspect, then answers what the
  bucket holds, with settled attributes (``lookup_entry``): another node's
  ``checkpoints/step-200/`` is found by the first lookup after ``list_ttl``.
  It costs no request of its own (no HEAD): only that re-listing, which
  the lookup would have started anyway.  A HEAD of the key was tried here
  once and dropped: a name found so must get the attributes a LIST would
  give it (its shadow, else ``file_mode``), which only a listing of the
  shadow can tell (the object's ``x-amz-meta-*`` may be wider than its
  shadow).  A wait that runs out answers ENOENT and holds off the next
  waits for ``SLOW_HOLDOFF`` seconds.
- A name that a running re-listing added is provisional until that
  re-listing settles its attributes (see below): a lookup of such a name
  waits for that re-listing, at most ``STALE_LISTING_WAIT`` seconds from
  its start and not while the endpoint is suspect (``_wait_listing``),
  then is served what there is (owner-only at worst, never wider).  A
  revalidation HEAD on open leaves a provisional inode provisional.
  Provisional attributes never leave the node and never outlive a change:
  before an upload, copy, metadata rewrite or marker of a provisional
  inode, and before a chmod or chown of it, ``settle_provisional`` gives
  it what a listing would (one LIST of its directory's shadow prefix, or a
  HEAD for a name too long for a shadow; else the defaults).  While the
  bucket cannot answer, such an upload waits in the journal like any
  other, and a chmod or chown of a provisional name fails with the
  store's errno (EIO) rather than be undone by the next listing.

A directory that was never listed needs the bucket: the caller waits for the
listing, which fails with the store's errno (EIO within the store's
foreground bound, at once while the breaker is open).

Keys that cannot be names (empty segment, ``.``/``..``, NUL, > 255 bytes) are
skipped with one warning per key per mount.  When both the object ``a`` and
objects under ``a/`` exist, the directory wins (``MetaDB.merge_listing``) and
the hidden object is reported once.

Attributes of listed names (mode, uid, gid)
-------------------------------------------
The kernel checks permissions (``default_permissions``) against the
attributes that lookup, getattr and readdirplus hand it, so a name must
never be shown more permissive than what tierfs stored for it, on any node,
from the first access.  LIST carries no user metadata; the choices were:

* a HEAD per name (s3fs): correct, but a cold ``find`` becomes a HEAD per
  file and a cold small-file read a HEAD plus a GET;
* one manifest object per directory: one GET per directory, but every
  change is a read-modify-write that two nodes can race on;
* one empty *shadow object* per name with non-default attributes, whose key
  carries them (``tierfs.core.names.shadow``), under ``.tierfs-attrs/<dir>/``:
  each change is a single PUT or DELETE that never races a neighbour's, and
  a directory's attributes cost one extra LIST of its shadow prefix (a page
  of only the names that have non-default attributes).  Chosen.  The shadow
  lives under one top-level prefix rather than inside each directory, so
  tools that list a data prefix (dataset loaders) never see it.

A listing therefore: merges the data pages (new names get *provisional*,
owner-only attributes, see ``MetaDB``), then lists the shadow prefix (after
the data, so a shadow written before its object is always seen), HEADs the
few names too long to carry a shadow, and settles the attributes in one
transaction (``MetaDB.settle_attrs``).  Lookups wait for a running first
listing and so does ``readdir`` (``wait_listing``): no name is handed to the
kernel before its attributes are settled.  A re-listing of a directory
listed before is not waited for (see above); a name it adds meanwhile may
be shown provisional by ``readdir`` (owner-only, never wider, and with
timeout 0), while a lookup of it waits for the settling (bounded, see
``_wait_listing``).  If the shadow listing fails, the new names stay
provisional (restrictive) and the error is that of the listing.
Names without a shadow get ``file_mode``/``dir_mode`` (objects of other
tools, and tierfs objects with the canonical 0644/0755 root:root); a known
name whose shadow disappeared keeps its attributes until a HEAD (open of a
cached file, or a writer's open, after ``revalidate_ttl``) reads them, which
errs on the restrictive side.  The
reserved name ``.tierfs-attrs`` is never listed in the root.

Shadow names this listing found for no child (orphans, e.g. of a delete on
a node that crashed) are remembered per directory in memory: a file created
under such a name takes them into its shadow ledger, and its upload deletes
them (``Sync``).  Mounts of a sub-prefix of another mount's prefix do not
see that mount's shadows; mount the same prefix on every node.

Who else uses this: ``Namespace`` answers lookups and walks, and asks here
for a listing that is missing or expired (``ensure_listed``), for the
settling a lookup must wait for (``wait_running``) and for list-ahead; the
bounded waits of revalidation share the endpoint's hold-off
(``endpoint_suspect``, ``waited_in_vain``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from array import array
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import trio

from tierfs.config import NamespaceConfig
from tierfs.errors import (
    EndpointUnreachable,
    NotFound,
    ObjectNotFound,
    StoreError,
    StoreUnavailable,
)
from tierfs.meta import PROVISIONAL, Inode, ListedEntry, MergeResult, MetaDB
from tierfs.store import RESERVED_ROOTS, ObjectInfo, ObjectStore
from tierfs.store.breaker import breaker_of

from .inodekeys import InodeKeys
from .shadow import (
    SHADOW_ROOT,
    ShadowAttrs,
    ShadowPlace,
    attrs_from_metadata,
    combine,
    parse_shadow_name,
)

log = logging.getLogger(__name__)

NAME_MAX = 255

#: Seconds a lookup or readdir waits for the re-listing of a directory it
#: already has a listing of, before it is served that listing.
STALE_LISTING_WAIT = 1.0
#: Seconds a lookup of a name missing from an expired listing waits for the
#: re-listing of its directory (from that re-listing's start) before it
#: answers ENOENT: the foreground budget of a request to the bucket
#: (``FOREGROUND_BUDGET`` of ``tierfs.store.s3``).
MISSING_NAME_WAIT = 5.0
#: After one of the bounded waits for the bucket ran out, optional waits are
#: skipped this long.
SLOW_HOLDOFF = 5.0
#: First listings a walk keeps running ahead of itself, at most (all walks
#: together): of the never-listed subdirectories it will descend into next.
LIST_AHEAD = 8
#: Background re-listings that run at once (each holds a store thread while
#: a page is on its way).
RELIST_CONCURRENCY = 4
#: Background re-listings queued or running; beyond, expired directories are
#: served as they are until a slot frees.  Also bounds ``_relist_failed``.
RELIST_BACKLOG = 4096

#: Starts ``fn(*args)`` as a background task; False if there is no nursery.
Spawn = Callable[..., bool]

#: Called with (ino, tiers that held its blocks, still_exists) whenever
#: blocks of a file were dropped because the bucket changed or it vanished.
DropCallback = Callable[[int, list[int], bool], None]


def _no_spawn(*args: object) -> bool:
    return False


def name_problem(name: str) -> str | None:
    """Why ``name`` (one key segment) cannot be a file name, or None."""
    if name == "":
        return "empty path segment"
    if name in (".", ".."):
        return f"'{name}' segment"
    if "\0" in name:
        return "NUL byte"
    if len(name.encode()) > NAME_MAX:
        return f"segment longer than {NAME_MAX} bytes"
    return None


@dataclass(frozen=True, slots=True)
class Identity:
    """The owner and modes of names without attributes of their own."""

    uid: int
    gid: int
    file_mode: int
    dir_mode: int


class Listings:
    """Lists directories from the bucket into LMDB, keeps them fresh and
    settles the attributes of the names listed (see the module docstring)."""

    def __init__(
        self,
        meta: MetaDB,
        store: ObjectStore,
        config: NamespaceConfig,
        identity: Identity,
        keys: InodeKeys,
        store_limiter: trio.CapacityLimiter,
        *,
        live_inode: Callable[[int], Inode | None] | None = None,
        being_deleted: Callable[[str], bool] | None = None,
        watch_deletes: Callable[[], AbstractContextManager[Callable[[str], bool]]] | None = None,
        protects: Callable[[int], bool] | None = None,
        attrs_owed: Callable[[int], bool] | None = None,
        spawn: Spawn = _no_spawn,
        shadows: ShadowPlace | None = None,
    ) -> None:
        """The callbacks come from the journal and the open-file table
        (the defaults suit listings on their own):

        * ``live_inode``: the in-memory inode of an open file, if any;
        * ``being_deleted``: is a delete of this key (or a key under this
          prefix) still owed to the bucket?  Such names are not re-created
          by a listing;
        * ``watch_deletes``: ``being_deleted`` that also remembers the
          deletes completed while the block runs (``Journal.watch_deletes``);
        * ``protects``: must a listing (or a revalidation) leave this inode
          alone (its object is not at its key in the bucket yet)?
        * ``attrs_owed``: does the bucket still owe a local change of this
          inode's attributes (a listing must not take the shadow's then)?
        * ``spawn``: start a background task (see ``Spawn``);
        * ``shadows``: where the attribute shadow lives (default: under
          ``store``'s own prefix; an access point's is the backing's).
        """
        #: Where the attribute shadow lives when it is not under ``store``'s own
        #: prefix (an access point's: the backing's); None: under ``store``.
        self._shadows = shadows
        self.meta = meta
        self.store = store
        self.config = config
        self.identity = identity
        self.keys = keys
        self._limiter = store_limiter
        #: Told (ino, tiers that held its blocks, still_exists) whenever the
        #: blocks of a file were dropped because the bucket changed it or it
        #: vanished: the open-file table, the space accounting and the open
        #: handles (the kernel's pages) follow.
        self.drop_listeners: list[DropCallback] = []
        self.live_inode: Callable[[int], Inode | None] = live_inode or (lambda ino: None)
        self.being_deleted: Callable[[str], bool] = being_deleted or (lambda key: False)
        self.watch_deletes: Callable[[], AbstractContextManager[Callable[[str], bool]]] = (
            watch_deletes or (lambda: contextlib.nullcontext(self.being_deleted))
        )
        self.protects: Callable[[int], bool] = protects or (lambda ino: False)
        self.attrs_owed: Callable[[int], bool] = attrs_owed or (lambda ino: False)
        #: dir ino -> {name: shadow entries} found by its last listing for
        #: names it does not hold (see "Attributes of listed names").
        self.orphan_shadows: dict[int, dict[bytes, list[ShadowAttrs]]] = {}
        self.spawn = spawn
        self.endpoint = breaker_of(store)
        #: Directories being listed (or queued for a background re-listing):
        #: (done, when it started on the trio clock).
        self._listing: dict[int, tuple[trio.Event, float]] = {}
        #: Background re-listings queued or running, and the slots they run in.
        self._relists_pending = 0
        self._relist_slots = trio.Semaphore(RELIST_CONCURRENCY)
        #: First listings started ahead of a walk and not finished (``list_ahead``).
        self._listing_ahead = 0
        #: dir ino -> trio time its last background re-listing failed.
        self._relist_failed: dict[int, float] = {}
        self._warned: set[str] = set()
        self.listings_done = 0
        self._slow_until = -math.inf

    def endpoint_down(self) -> bool:
        """Is the endpoint's circuit breaker open (requests fail at once)?"""
        return self.endpoint is not None and self.endpoint.is_open

    def endpoint_suspect(self) -> bool:
        """Open, or the last request to the endpoint got no answer, or a wait
        for it ran out in the last ``SLOW_HOLDOFF`` seconds."""
        if trio.current_time() < self._slow_until:
            return True
        return self.endpoint is not None and self.endpoint.suspect

    def waited_in_vain(self) -> None:
        """A bounded wait for the bucket ran out: the next ones are not worth it
        for a while (the request is still out there; the breaker learns from it)."""
        self._slow_until = trio.current_time() + SLOW_HOLDOFF

    def may_list_ahead(self) -> bool:
        """Is there room for one more listing ahead of a walk (``LIST_AHEAD``)?"""
        return self._listing_ahead < LIST_AHEAD

    def expired(self, dir_ino: int) -> bool:
        """Has directory ``dir_ino`` a listing older than ``list_ttl`` (served
        while it is re-listed)?"""
        inode = self.meta.get_inode(dir_ino)
        return inode is not None and self.listing_expired(inode)

    def listing_fresh(self, dir_inode: Inode) -> bool:
        """Is the listing of ``dir_inode`` younger than ``list_ttl`` (so
        ``ensure_listed`` returns at once, without yielding)?  Never for
        one never listed, however long ``list_ttl`` is."""
        listed_at = dir_inode.listed_at
        return listed_at > 0 and time.time() - listed_at < self.config.list_ttl

    def listing_expired(self, dir_inode: Inode) -> bool:
        """``expired`` for a directory record already read (readdir reads
        it for each batch anyway: one decode less)."""
        return dir_inode.listed_at > 0 and time.time() - dir_inode.listed_at >= self.config.list_ttl

    def provisional(self, ino: int) -> bool:
        """Are the attributes of ``ino`` not settled by a listing yet?"""
        inode = self.meta.get_inode(ino)
        return inode is not None and inode.validated_at == PROVISIONAL

    def is_provisional(self, inode: Inode) -> bool:
        """Are ``inode``'s attributes not settled by a listing yet (its
        in-memory copy, or LMDB's)?"""
        return inode.validated_at == PROVISIONAL or self.provisional(inode.ino)

    async def wait_running(self, dir_ino: int, bound: float) -> None:
        """Wait for the listing of ``dir_ino`` that runs (or is queued), at
        most ``bound`` seconds from its start, not at all while the endpoint
        is suspect.  Only lookups of names the listing served lacks wait so
        (``MISSING_NAME_WAIT``), or of names a re-listing added and has not
        settled yet (``STALE_LISTING_WAIT``): a name of the listing served
        never does."""
        running = self._listing.get(dir_ino)
        if running is None or self.endpoint_suspect():
            return
        done, started = running
        with trio.move_on_at(started + bound) as waited:
            await done.wait()
        if waited.cancelled_caught:
            self.waited_in_vain()

    async def wait_listing(self, ino: int) -> None:
        """Wait for a first listing of directory ``ino`` that is running, if
        any: its names are provisional until it settles their attributes.
        A re-listing is not waited for: names it adds stay provisional
        (owner-only, never wider) until it settles them."""
        running = self._listing.get(ino)
        if running is None:
            return
        inode = self.meta.get_inode(ino)
        if inode is not None and inode.listed_at > 0:
            return
        await running[0].wait()

    def list_ahead(self, dir_inode: Inode) -> bool:
        """Start the first listing of ``dir_inode`` in the background, if it
        was never listed and no listing of it runs: a caller that will need
        it soon (``ensure_listed``) then waits for that one.  At most
        ``LIST_AHEAD`` run at once; False when none was started."""
        ino = dir_inode.ino
        if dir_inode.listed_at > 0 or ino in self._listing or self._listing_ahead >= LIST_AHEAD:
            return False
        done = trio.Event()
        self._listing[ino] = (done, trio.current_time())
        if not self.spawn(self._list_ahead_task, ino, done):
            del self._listing[ino]
            return False
        self._listing_ahead += 1
        return True

    async def _list_ahead_task(self, ino: int, done: trio.Event) -> None:
        """``list_ahead``'s background task: nothing escapes into the
        nursery.  A failure is only logged: whoever needs the directory
        lists it again (``ensure_listed_for_walk``) and gets the error."""
        try:
            dir_inode = self.meta.get_inode(ino)
            if dir_inode is not None and dir_inode.listed_at == 0:
                await self._relist(dir_inode, done)
        except StoreError as exc:
            log.debug("listing ahead of a walk: directory inode %d: %s", ino, exc)
        except Exception:
            log.exception("listing ahead of a walk: directory inode %d failed", ino)
        finally:
            self._listing_ahead -= 1
            if not done.is_set():
                self._listing.pop(ino, None)
                done.set()

    async def ensure_listed_for_walk(self, dir_inode: Inode) -> None:
        """``ensure_listed``; a first listing that another task ran (one
        started ahead of the walk, ``list_ahead``) and that failed is tried
        once more here, so the walker gets the bucket's own error, not "did
        not answer".  A listing of the walker's own that failed is not."""
        someone_elses = dir_inode.ino in self._listing
        try:
            await self.ensure_listed(dir_inode)
        except StoreUnavailable:
            current = self.meta.get_inode(dir_inode.ino)
            if (
                not someone_elses
                or current is None
                or current.listed_at > 0
                or current.ino in self._listing
            ):
                raise
            await self.ensure_listed(current)

    async def adopt_legacy_shadows(self) -> int:
        """An access point's shadow objects from before the shadow was one
        per bucket (under its own root: ``<root>/.tierfs-attrs/...``) are
        moved to the backing's shadow tree (``.tierfs-attrs/<root>/...``),
        where every mount reads them: put there first, then deleted here, so
        a crash between leaves both and the next mount moves it again.
        Returns how many were moved; a full mount has nothing to move."""
        place = self._shadows
        if place is None or not place.below:
            return 0
        moved = 0
        prefixes = [f"{SHADOW_ROOT}/"]
        while prefixes:
            pages = self.store.list_pages(prefixes.pop())
            while True:
                page = await trio.to_thread.run_sync(next, pages, None, limiter=self._limiter)
                if page is None:
                    break
                prefixes.extend(page.prefixes)
                for obj in page.objects:
                    rest = obj.key[len(SHADOW_ROOT) + 1 :]
                    target = f"{SHADOW_ROOT}/{place.below}{rest}"
                    await trio.to_thread.run_sync(
                        place.store.put, target, b"", limiter=self._limiter
                    )
                    await trio.to_thread.run_sync(self.store.delete, obj.key, limiter=self._limiter)
                    moved += 1
        if moved:
            log.info(
                "moved %d attribute shadow objects of this access point to the bucket's "
                "shadow tree (%s%s)",
                moved,
                SHADOW_ROOT,
                f"/{place.below}",
            )
        return moved

    @property
    def shadows(self) -> ShadowPlace:
        """Where the attribute shadow of this mount's keys lives."""
        return self._shadows if self._shadows is not None else ShadowPlace(self.store)

    def shadow_fits(self, key: str) -> bool:
        """Can the object (or directory, no trailing "/") at ``key`` carry a
        shadow entry in this store?  Writers and readers decide alike."""
        return self.shadows.fits(key)

    async def ensure_listed(self, dir_inode: Inode, stale_wait: float = STALE_LISTING_WAIT) -> None:
        """List ``dir_inode`` if its listing is older than ``list_ttl``.

        A directory listed before waits at most ``stale_wait`` seconds for
        its re-listing (see the module docstring); one never listed waits
        for its listing and raises its error.
        """
        if self.listing_fresh(dir_inode):
            return
        ino = dir_inode.ino
        have_listing = dir_inode.listed_at > 0
        if have_listing and self.endpoint_down():
            return
        running = self._listing.get(ino)
        if running is None:
            if have_listing and not self._relist_allowed(ino):
                return  # served as it is (see "Background re-listings are bounded")
            running = self._listing[ino] = (trio.Event(), trio.current_time())
            if have_listing and self.spawn(self._relist_in_background, ino, running[0]):
                self._relists_pending += 1
            else:
                await self._relist(dir_inode, running[0])
                return
        done, started = running
        if have_listing:
            # Bounded from the start of the re-listing, not per caller: the
            # lookups of an ``ls -l`` that queue behind one slow re-listing
            # wait ``stale_wait`` in all, not each.
            if self.endpoint_suspect():
                return  # the last request got no answer: do not wait for this one
            with trio.move_on_at(started + stale_wait) as waited:
                await done.wait()
            if waited.cancelled_caught and stale_wait > 0:
                self.waited_in_vain()
            return
        await done.wait()
        current = self.meta.get_inode(ino)
        if current is None or current.listed_at == 0:
            raise StoreUnavailable(
                f"cannot list {self.keys.prefix_of(dir_inode) or '/'!r}: the bucket did not answer"
            )

    def _relist_allowed(self, ino: int) -> bool:
        """May a background re-listing of ``ino`` be queued now?"""
        if self._relists_pending >= RELIST_BACKLOG:
            return False
        failed_at = self._relist_failed.get(ino)
        return failed_at is None or trio.current_time() - failed_at >= self.config.list_ttl

    def _note_relist_failed(self, ino: int) -> None:
        now = trio.current_time()
        if len(self._relist_failed) >= RELIST_BACKLOG:
            ttl = self.config.list_ttl
            for old in [i for i, t in self._relist_failed.items() if now - t >= ttl]:
                del self._relist_failed[old]
            if len(self._relist_failed) >= RELIST_BACKLOG:
                self._relist_failed.pop(next(iter(self._relist_failed)))  # the oldest
        self._relist_failed[ino] = now

    async def _relist(self, dir_inode: Inode, done: trio.Event) -> None:
        """One listing of ``dir_inode``; a failed re-listing keeps the old one."""
        try:
            await self._list(dir_inode)
            self._relist_failed.pop(dir_inode.ino, None)
        except StoreError as exc:
            if dir_inode.listed_at == 0:
                raise
            self._note_relist_failed(dir_inode.ino)
            if isinstance(exc, StoreUnavailable):  # the breaker logs the outage once
                level = logging.DEBUG if isinstance(exc, EndpointUnreachable) else logging.INFO
                log.log(
                    level,
                    "re-listing %r failed, serving the cached listing: %s",
                    dir_inode.name,
                    exc,
                )
            else:
                log.warning(
                    "re-listing %r failed, serving the cached listing: %s", dir_inode.name, exc
                )
        except Exception:
            # A defect, not the bucket: what the pages merged so far stays
            # (each page is one transaction), nothing is swept, the listing
            # stays expired; the traceback goes to the log.
            if dir_inode.listed_at == 0:
                raise
            self._note_relist_failed(dir_inode.ino)
            log.exception(
                "re-listing of directory inode %d failed, serving the cached listing",
                dir_inode.ino,
            )
        finally:
            self._listing.pop(dir_inode.ino, None)
            done.set()

    async def _relist_in_background(self, ino: int, done: trio.Event) -> None:
        """``_relist`` as a queued background task (``RELIST_CONCURRENCY``
        at once): nothing may escape into the nursery."""
        try:
            async with self._relist_slots:
                # Read now, not when queued: it may have moved or gone since.
                dir_inode = self.meta.get_inode(ino)
                if dir_inode is not None:
                    await self._relist(dir_inode, done)
        except StoreError as exc:  # its listing was dropped meanwhile (``_forget_vanished``)
            log.warning("background listing of directory inode %d failed: %s", ino, exc)
        except Exception:
            log.exception("background re-listing of directory inode %d failed", ino)
        finally:
            self._relists_pending -= 1
            if not done.is_set():  # removed while queued, or cancelled before it ran
                self._listing.pop(ino, None)
                done.set()

    async def _list(self, dir_inode: Inode) -> None:
        # Opened before the LIST is sent: a name whose delete completes
        # after that is still in the answer, and must not come back.
        with self.watch_deletes() as deleted:
            await self._list_watched(dir_inode, deleted)

    async def _list_watched(self, dir_inode: Inode, deleted: Callable[[str], bool]) -> None:
        prefix = self.keys.prefix_of(dir_inode)
        gen = self.meta.begin_listing(dir_inode.ino)
        pages = self.store.list_pages(prefix)
        ident = self.identity
        # Inode numbers only (8 bytes each): a huge first listing must not
        # hold its names in memory.
        unsettled = array("Q")
        too_long: list[tuple[bytes, int]] = []
        while True:
            page = await trio.to_thread.run_sync(next, pages, None, limiter=self._limiter)
            if not self._still_at(dir_inode.ino, prefix):
                # Renamed or removed while the page was on its way (a change
                # does not wait for a re-listing): these names belong to the
                # old key; the next listing uses the new one.
                log.debug("listing of %r dropped: the directory moved", prefix)
                return
            if page is None:
                break
            entries = [e for e in (self._object_entry(prefix, o) for o in page.objects) if e]
            entries += [e for e in (self._prefix_entry(prefix, p) for p in page.prefixes) if e]
            result = self.meta.merge_listing(
                dir_inode.ino,
                gen,
                entries,
                prefix=prefix,
                protects=self.protects,
                skip_new=lambda name, is_dir: deleted(
                    prefix + name.decode() + ("/" if is_dir else "")
                ),
                file_mode=ident.file_mode,
                dir_mode=ident.dir_mode,
                uid=ident.uid,
                gid=ident.gid,
                now=time.time(),
            )
            for name, ino in result.unsettled:
                unsettled.append(ino)
                if not self.shadow_fits(prefix + name.decode()):
                    too_long.append((name, ino))
            self._after_merge(prefix, result)
        await self._settle_attrs(dir_inode.ino, prefix, unsettled, too_long)
        if not self._still_at(dir_inode.ino, prefix):
            log.debug("listing of %r not finished: the directory moved", prefix)
            return
        swept = self.meta.finish_listing(
            dir_inode.ino, gen, time.time(), prefix=prefix, protects=self.protects
        )
        self._after_merge(prefix, swept)
        self.listings_done += 1

    async def _settle_attrs(
        self,
        dir_ino: int,
        prefix: str,
        unsettled: array[int],
        too_long: list[tuple[bytes, int]],
    ) -> None:
        """Shadow listing, HEAD fallback for ``too_long`` names, then
        ``MetaDB.settle_attrs``."""
        seen = await self._list_shadow(prefix)
        attrs = {name: combine(found) for name, found in seen.items()}
        keep_provisional: set[int] = set()
        for name, ino in too_long:
            # Too long for a shadow entry: its object's metadata says.
            inode = self.meta.get_inode(ino)
            if inode is None:
                continue
            key = prefix + name.decode() + ("/" if inode.is_dir else "")
            try:
                info = await trio.to_thread.run_sync(self.store.head, key, limiter=self._limiter)
            except ObjectNotFound:
                continue  # an implied directory or a vanished object: defaults
            except StoreError as exc:
                log.warning("cannot read the attributes of %r, keeping it private: %s", key, exc)
                keep_provisional.add(ino)
                continue
            found = attrs_from_metadata(info.metadata)
            if found is not None:
                attrs[name] = found
        ident = self.identity
        orphans = self.meta.settle_attrs(
            dir_ino,
            unsettled,
            {name: (a.perm, a.uid, a.gid) for name, a in attrs.items() if a is not None},
            {name: [(a.perm, a.uid, a.gid) for a in found] for name, found in seen.items()},
            prefix=prefix,
            keep_provisional=keep_provisional,
            keeps_attrs=lambda ino: self.protects(ino) or self.attrs_owed(ino),
            live_inode=self.live_inode,
            file_mode=ident.file_mode,
            dir_mode=ident.dir_mode,
            uid=ident.uid,
            gid=ident.gid,
            now=time.time(),
        )
        if orphans:
            self.orphan_shadows[dir_ino] = {name: seen[name] for name in orphans if name in seen}
        else:
            self.orphan_shadows.pop(dir_ino, None)

    async def settle_provisional(self, inode: Inode, listed_key: str | None = None) -> None:
        """Give a provisional inode now the attributes a listing would give
        it: its shadow entries (one LIST of its directory's shadow prefix),
        for a key too long for a shadow its object's metadata (one HEAD),
        else ``file_mode``/``dir_mode`` and the mount's owner.

        ``listed_key``: where a listing found it (a rename's pending copy
        still reads from there); default its ``origin_key`` (files) or its
        current key (directories).  Called before anything of the inode
        leaves the node (``Sync``: upload, copy, metadata, marker) and
        before a chmod or chown of it (``NameChanges.setattr``): provisional,
        owner-only attributes must never become a shadow object or object
        metadata (a write after a lookup whose ``wait_running`` ran out
        once uploaded a 0600 shadow nobody asked for).  Raises the store's
        error; the inode then stays provisional.
        """
        if not self.is_provisional(inode):
            return
        if listed_key is None:
            listed_key = (
                self.keys.prefix_of(inode)
                if inode.is_dir or not inode.origin_key
                else inode.origin_key
            )
        key = listed_key.rstrip("/")
        parent_key, _, name = key.rpartition("/")
        dir_prefix = parent_key + "/" if parent_key else ""
        seen: list[ShadowAttrs] = []
        found: ShadowAttrs | None = None
        if self.shadow_fits(key):
            seen = (await self._list_shadow(dir_prefix)).get(name.encode(), [])
            found = combine(seen)
        else:
            try:
                info = await trio.to_thread.run_sync(
                    self.store.head, listed_key, limiter=self._limiter
                )
                found = attrs_from_metadata(info.metadata)
            except ObjectNotFound:
                pass  # an implied directory or a vanished object: defaults
        ident = self.identity
        self.meta.settle_one(
            inode.ino,
            None if found is None else (found.perm, found.uid, found.gid),
            [(key, a.perm, a.uid, a.gid) for a in seen],
            file_mode=ident.file_mode,
            dir_mode=ident.dir_mode,
            uid=ident.uid,
            gid=ident.gid,
            now=time.time(),
        )
        # Settled now, or by a listing meanwhile: the copies in memory too.
        current = self.meta.get_inode(inode.ino)
        if current is None or current.validated_at == PROVISIONAL:
            return
        for copy in (inode, self.live_inode(inode.ino)):
            if copy is not None:
                copy.mode, copy.uid, copy.gid = current.mode, current.uid, current.gid
                if copy.validated_at == PROVISIONAL:
                    copy.validated_at = current.validated_at

    async def _list_shadow(self, prefix: str) -> dict[bytes, list[ShadowAttrs]]:
        """name -> shadow entries under the shadow prefix of a directory."""
        shadow_prefix = self.shadows.dir_prefix(prefix)
        if not self.shadow_fits(prefix + "x"):
            return {}  # no child of this directory can have a shadow entry
        seen: dict[bytes, list[ShadowAttrs]] = {}
        pages = self.shadows.store.list_pages(shadow_prefix)
        while True:
            page = await trio.to_thread.run_sync(next, pages, None, limiter=self._limiter)
            if page is None:
                return seen
            for obj in page.objects:
                parsed = parse_shadow_name(obj.key[len(shadow_prefix) :])
                if parsed is None:
                    self._warn_once(obj.key, f"ignoring {obj.key!r}: not an attribute entry")
                    continue
                name, found = parsed
                seen.setdefault(name.encode(errors="surrogateescape"), []).append(found)

    def _still_at(self, ino: int, prefix: str) -> bool:
        """Is directory ``ino`` still linked at ``prefix``?"""
        try:
            return self.keys.prefix_of(self.keys.get(ino)) == prefix
        except NotFound:
            return False

    def _after_merge(self, prefix: str, result: MergeResult) -> None:
        for name in result.conflicts:
            key = prefix + name.decode()
            self._warn_once(
                key,
                f"both the object {key!r} and objects under {key + '/'!r} exist: "
                "showing the directory, the object is hidden",
            )
        for name in result.dirty_overwritten:
            key = prefix + name.decode()
            self._warn_once(
                "conflict:" + key,
                f"object {key!r} changed in the bucket while the local copy has changes not yet "
                "uploaded: the local version wins and will overwrite it",
            )
        for ino, tiers in result.changed:
            self.dropped(ino, tiers, True)
        for ino, tiers in result.removed:
            self.dropped(ino, tiers, False)

    def _object_entry(self, prefix: str, obj: ObjectInfo) -> ListedEntry | None:
        name = obj.key[len(prefix) :]
        if name == "":  # the directory's own marker object
            return None
        if prefix == "" and name in RESERVED_ROOTS:
            return None  # reserved: the attribute shadow, tierfs's own records
        if not self._name_ok(obj.key, name):
            return None
        return ListedEntry(
            name=name.encode(),
            is_dir=False,
            size=obj.size,
            etag=obj.etag,
            mtime_ns=int(obj.mtime * 1e9),
        )

    def _prefix_entry(self, prefix: str, common: str) -> ListedEntry | None:
        name = common[len(prefix) : -1]
        if prefix == "" and name in RESERVED_ROOTS:
            return None  # the attribute shadow, tierfs's records: never a directory of the mount
        problem = name_problem(name)
        if problem is not None:
            self._warn_once(
                common,
                f"skipping all keys under {common!r}: {name!r} cannot be a directory name "
                f"({problem})",
            )
            return None
        return ListedEntry(name=name.encode(), is_dir=True)

    def _name_ok(self, key: str, name: str) -> bool:
        problem = name_problem(name)
        if problem is None:
            return True
        self._warn_once(key, f"skipping key {key!r}: it cannot be a file name ({problem})")
        return False

    def _warn_once(self, dedup_key: str, message: str) -> None:
        """Log ``message`` once per mount for ``dedup_key`` (keys may hold any
        character, so messages are built by the caller, never formatted)."""
        if dedup_key not in self._warned:
            self._warned.add(dedup_key)
            log.warning("%s", message)

    def dropped(self, ino: int, tiers: list[int], still_exists: bool) -> None:
        for listener in self.drop_listeners:
            listener(ino, tiers, still_exists)
