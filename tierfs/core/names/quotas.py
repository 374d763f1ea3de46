"""Directory quotas (``[[quotas]]``): usage, the checks that refuse a
change with EDQUOT, the warning at ``warn_at``, and the walk of the bucket.

A quota covers every name below its directory (not the directory itself):
``bytes`` limits the sum of the files' sizes, ``files`` the number of names
(files, directories, symlinks).  Its usage is what the bucket held at the
last walk (``listed``) plus this node's changes that walk did not see
(``pending``).

The walk (``walk``, run by ``run``): at mount, after each ``policy
reload``, and then every ``[namespace] list_ttl`` (at least five times as
long as the last walk took, so that walking costs at most a sixth of the
time), each quota's subtree is listed from the bucket, one directory per
LIST (up to ``WALK_LISTS`` at once, in store threads), in the background:
no change ever waits for it.  It counts the objects (their sizes and one
name each) and the directories (one name each, with a marker or implied)
below each quota's directory, and skips what the mount does not show (keys
that cannot be names, the attribute shadow).  A quota inside another is
counted by the same walk as the outer one.

This node's changes (``_Tracked``, per inode).  ``base`` is the inode as the
last walk counted it (its key, bytes and one name, or nothing: not in the
bucket); ``now`` is the inode as the mount shows it (nothing once removed).
A quota's ``pending`` is the sum of now - base over the tracked inodes, each
side counted only where its key lies below the quota's directory.
Invariants:

* a change is checked before any of it lands, and the inode's ``now`` is set
  in the same synchronous step as the LMDB transaction that makes the change
  (no ``await`` between the check and the transaction), so two writers on
  this node can never both pass a check that only one of them fits;
* checked: a write that grows a file, a create, mkdir, symlink or mknod, a
  rename that brings names below a quota's directory (a directory brings its
  whole subtree: the rename lists it anyway), a truncate up.  Shrinking,
  removing, and a rename inside one quota are never refused, even above the
  limit (that is how a user gets back under it);
* a write reserves its end before it starts (``now.bytes = max(now.bytes,
  end)``); a write that fails keeps its reservation until the next rebase;
* rebase, at the end of a walk: an inode that had no journal entry left
  *when the walk started* (``Journal.inodes_pending``) had its last change
  in the bucket before the walk's first LIST, so the walk counted it: its
  base becomes what ``now`` was at that start, and an inode whose base
  equals now is forgotten.  An inode whose change reached the bucket while
  the walk ran stays pending for one more walk: it may be counted twice
  meanwhile (the quota reads high for a while), never missed;
* after a remount, the inodes with a pending upload are tracked again, their
  base from their origin object (``start``);
* a file removed while still open (an orphan) stays counted at its old key
  until its last close, and its growth is checked against the quotas it was
  under, as ext4 charges an unlinked file until it is closed; it is never
  rebased meanwhile (the walk cannot see what it holds on this node).

A quota's states: not walked yet (``listed`` is None: only this node's
changes count) -> walked (``listed`` from the last walk that finished).  A
walk that fails keeps the last counts and says why (``walk_error``); the
next one tries again.  A ``policy reload`` keeps the counts of the quotas
whose path did not change.

How far a quota can be passed.  Nodes do not see each other's changes until
they are in the bucket and walked.  A node's checks miss what other nodes
wrote below the quota's directory and its last walk did not count: their
changes not uploaded yet (at most ``[write] upload_delay`` after a close,
plus the upload), and those uploaded since that walk began (at most
``list_ttl`` plus the walk's own time ago).  With N nodes writing at once,
each within the room it sees, the bucket can hold up to N times the room
that was left at the last walk; the next walk on each node shows the total
and every node refuses growth from then on.  This node's own changes are
never missed.

Warnings: crossing ``warn_at`` (of either limit) logs one warning; going
back under re-arms it.  The first refusal after each crossing of the limit
is logged too.

Cost.  A mount without quotas pays one attribute test per growing write
and per new name; with a quota, a new small file costs a few microseconds
of the loop (measured: ``docs/benchmarks.md``, "Between users").  The tracked inodes live until the walk
after their upload (one small record each).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from tierfs.config import QuotaConfig
from tierfs.errors import QuotaExceeded, StoreError
from tierfs.meta import Inode, MetaDB, SyncState
from tierfs.store import RESERVED_ROOTS, ObjectStore
from tierfs.units import format_size

from ..state.journal import Journal
from ..state.store_threads import StoreThreads
from .listings import name_problem
from .namespace import Namespace

log = logging.getLogger(__name__)

#: Directories listed at once by a walk.
WALK_LISTS = 4
#: A walk waits at least this many times its own duration before the next.
WALK_SPACING = 5.0
#: ... and never less than this (seconds), whatever ``list_ttl`` says.
WALK_MIN_INTERVAL = 1.0


class Quota:
    """One ``[[quotas]]`` entry and its usage (see the module docstring)."""

    __slots__ = (
        "config",
        "full_logged",
        "listed_bytes",
        "listed_files",
        "pending_bytes",
        "pending_files",
        "prefix",
        "refused",
        "walk_error",
        "walk_seconds",
        "walked_at",
        "warned",
        "warnings",
    )

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        #: Keys below the quota's directory start with this ("" = all).
        self.prefix = config.path + "/" if config.path else ""
        #: The last walk's counts; None until a walk finished.
        self.listed_bytes: int | None = None
        self.listed_files: int | None = None
        #: This node's changes the last walk did not count.
        self.pending_bytes = 0
        self.pending_files = 0
        self.walked_at = 0.0
        self.walk_seconds = 0.0
        self.walk_error = ""
        #: At or above ``warn_at`` now (the warning was logged).
        self.warned = False
        self.warnings = 0
        #: A refusal was logged since the usage last went under the limit.
        self.full_logged = False
        self.refused = 0

    @property
    def shown(self) -> str:
        return self.config.path or "/"

    @property
    def used_bytes(self) -> int:
        return (self.listed_bytes or 0) + self.pending_bytes

    @property
    def used_files(self) -> int:
        return (self.listed_files or 0) + self.pending_files

    def ratio(self) -> float:
        """The larger share of its limits in use."""
        shares = [0.0]
        if self.config.bytes is not None:
            shares.append(self.used_bytes / self.config.bytes)
        if self.config.files is not None:
            shares.append(self.used_files / self.config.files)
        return max(shares)

    def report(self) -> dict[str, object]:
        """One entry of ``tierfs quota`` and ``status``."""
        limit_bytes, limit_files = self.config.bytes, self.config.files
        return {
            "path": self.shown,
            "name": self.config.name,
            "source": self.config.source,
            "bytes_used": self.used_bytes,
            "bytes_limit": limit_bytes,
            "bytes_percent": _percent(self.used_bytes, limit_bytes),
            "files_used": self.used_files,
            "files_limit": limit_files,
            "files_percent": _percent(self.used_files, limit_files),
            "warn_at": self.config.warn_at,
            "warning": self.warned,
            "full": self.ratio() >= 1.0,
            "refused": self.refused,
            "pending_bytes": self.pending_bytes,
            "pending_files": self.pending_files,
            "walked": self.listed_bytes is not None,
            "walked_at": self.walked_at,
            "walk_seconds": round(self.walk_seconds, 3),
            "walk_error": self.walk_error,
        }


def _percent(used: int, limit: int | None) -> float | None:
    return None if limit is None else round(100.0 * used / limit, 1)


@dataclass(slots=True)
class _Tracked:
    """One inode this node changed: as the last walk counted it (base) and
    as the mount shows it (now).  A key of None: not there."""

    base_key: str | None
    base_bytes: int
    base_files: int
    base_quotas: tuple[Quota, ...]
    key: str | None
    bytes: int
    files: int
    quotas: tuple[Quota, ...]
    #: Removed from the namespace while still open: it keeps its key (and
    #: its place in the quotas) until its last close (``orphan_gone``).
    orphan: bool = False


#: A move planned by ``plan_move``: each inode's record and its new key.
MovePlan = list[tuple[_Tracked, str]]


class Quotas:
    """The quotas of one mount (see the module docstring).  Used from the
    trio loop only, except ``_list_one`` (in a store thread)."""

    def __init__(
        self,
        quotas: Iterable[QuotaConfig],
        list_ttl: float,
        meta: MetaDB,
        journal: Journal,
        namespace: Namespace,
        store: ObjectStore,
        store_threads: StoreThreads,
        store_limiter: trio.CapacityLimiter,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.meta = meta
        self.journal = journal
        self.namespace = namespace
        self.store = store
        self.store_threads = store_threads
        self.store_limiter = store_limiter
        self.list_ttl = list_ttl
        self._clock = clock
        self._quotas: tuple[Quota, ...] = ()
        self._by_prefix: dict[str, Quota] = {}
        self._tracked: dict[int, _Tracked] = {}
        #: Walks finished since the mount (a test or ``tierfs quota --walk``
        #: waits for the next one).
        self.walks = 0
        self._walked = trio.Event()
        self._wake = trio.Event()
        self._walking = False
        self.set_quotas(quotas)

    # --- configuration ------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(self._quotas)

    def set_quotas(self, configs: Iterable[QuotaConfig]) -> None:
        """The quotas in force from now on (mount, ``policy reload``).  A
        quota whose path stays keeps its counts; the tracked inodes are
        counted again against the new set."""
        old = {q.config.path: q for q in self._quotas}
        quotas: list[Quota] = []
        for config in configs:
            quota = Quota(config)
            before = old.get(config.path)
            if before is not None:
                quota.listed_bytes, quota.listed_files = before.listed_bytes, before.listed_files
                quota.walked_at, quota.walk_seconds = before.walked_at, before.walk_seconds
                quota.warned, quota.warnings = before.warned, before.warnings
                quota.refused, quota.full_logged = before.refused, before.full_logged
            quotas.append(quota)
        self._quotas = tuple(quotas)
        self._by_prefix = {q.prefix: q for q in quotas}
        for tracked in self._tracked.values():
            tracked.base_quotas = self.covering(tracked.base_key)
            tracked.quotas = self.covering(tracked.key)
            self._count(tracked, +1)
        if not quotas:
            self._tracked.clear()
        self.start()  # the first quotas of this mount: its pending uploads count
        self._wake.set()  # walk the new set now

    def covering(self, key: str | None) -> tuple[Quota, ...]:
        """The quotas whose directory ``key`` (a file's or a directory's, no
        trailing "/") is below."""
        return _covering(self._by_prefix, key)

    # --- this node's changes ----------------------------------------------------------

    def start(self) -> None:
        """At mount and at each reload: track the files whose upload is
        still pending (their changes are in no walk yet)."""
        if not self._quotas:
            return
        for ino in list(self.journal.upload_seq):
            inode = self.meta.get_inode(ino)
            if inode is not None:
                self._track(inode)

    def _track(self, inode: Inode, key: str | None = None) -> _Tracked:
        """The record of ``inode``, made from its inode if it has none: base
        from its origin object (what a walk counts), now from the inode."""
        tracked = self._tracked.get(inode.ino)
        if tracked is not None:
            return tracked
        if key is None:
            key = self.namespace.key_of(inode)
        if inode.is_dir:
            base_key: str | None = key if inode.state == SyncState.CLEAN else None
            base_bytes, size = 0, 0
        else:
            base_key = self.journal.read_origin(inode.ino) or inode.origin_key or None
            base_bytes, size = (inode.origin_size if base_key else 0), inode.size
        tracked = _Tracked(
            base_key=base_key,
            base_bytes=base_bytes,
            base_files=1 if base_key is not None else 0,
            base_quotas=self.covering(base_key),
            key=key,
            bytes=size,
            files=1,
            quotas=self.covering(key),
        )
        self._tracked[inode.ino] = tracked
        self._count(tracked, +1)
        self._after_change(tracked.quotas)
        return tracked

    def _count(self, tracked: _Tracked, sign: int) -> None:
        """Add (sign +1) or take away (-1) ``tracked``'s now - base."""
        for quota in tracked.quotas:
            quota.pending_bytes += sign * tracked.bytes
            quota.pending_files += sign * tracked.files
        for quota in tracked.base_quotas:
            quota.pending_bytes -= sign * tracked.base_bytes
            quota.pending_files -= sign * tracked.base_files

    def _set_now(self, tracked: _Tracked, key: str | None, size: int, files: int) -> None:
        before = tracked.quotas
        self._count(tracked, -1)
        if key != tracked.key:
            tracked.key, tracked.quotas = key, self.covering(key)
        tracked.bytes, tracked.files = size, files
        self._count(tracked, +1)
        self._after_change(before if before == tracked.quotas else before + tracked.quotas)

    def _admit(self, quotas: Iterable[Quota], more_bytes: int, more_files: int, what: str) -> None:
        """Raise EDQUOT if adding that much takes one of ``quotas`` past a
        limit."""
        for quota in quotas:
            limits = quota.config
            over = ""
            if (
                more_bytes > 0
                and limits.bytes is not None
                and quota.used_bytes + more_bytes > limits.bytes
            ):
                over = (
                    f"{format_size(quota.used_bytes)} of {format_size(limits.bytes)} used, "
                    f"{format_size(more_bytes)} more asked"
                )
            elif (
                more_files > 0
                and limits.files is not None
                and quota.used_files + more_files > limits.files
            ):
                over = f"{quota.used_files:,} of {limits.files:,} names used"
            if not over:
                continue
            quota.refused += 1
            message = f"{what}: the quota on {quota.shown!r} is full ({over})"
            if not quota.full_logged:
                quota.full_logged = True
                log.warning("quota: %s; refusing with EDQUOT", message)
            raise QuotaExceeded(message)

    def _after_change(self, quotas: Iterable[Quota]) -> None:
        """Log a crossing of ``warn_at`` (once per crossing) and re-arm the
        warning and the refusal log when the usage goes back under."""
        for quota in quotas:
            ratio = quota.ratio()
            if ratio >= quota.config.warn_at:
                if not quota.warned:
                    quota.warned = True
                    quota.warnings += 1
                    log.warning(
                        "quota on %r: %s%% of a limit used (warn_at %s%%): %s",
                        quota.shown,
                        f"{100 * ratio:.0f}",
                        f"{100 * quota.config.warn_at:.0f}",
                        _usage_text(quota),
                    )
            elif quota.warned:
                quota.warned = False
                log.info("quota on %r: back under warn_at: %s", quota.shown, _usage_text(quota))
            if ratio < 1.0:
                quota.full_logged = False

    def admit_new(self, key: str, size: int = 0) -> None:
        """Check a new name at ``key`` (a create, mkdir, symlink, mknod)."""
        if self._quotas:
            self._admit(self.covering(key), size, 1, key)

    def created(self, ino: int, key: str, size: int = 0) -> None:
        """The new name ``key`` is in the namespace (after ``admit_new``)."""
        if not self._quotas:
            return
        tracked = _Tracked(None, 0, 0, (), None, 0, 0, ())
        self._tracked[ino] = tracked
        self._set_now(tracked, key, size, 1)

    def grow(self, inode: Inode, end: int) -> None:
        """A write up to ``end`` (or a truncate up to it): check the growth
        past what is counted, and reserve it."""
        if not self._quotas:
            return
        tracked = self._tracked.get(inode.ino)
        if tracked is not None and end <= tracked.bytes:
            return
        tracked = self._track(inode)
        more = end - tracked.bytes
        if more <= 0:
            return
        if tracked.quotas:
            self._admit(tracked.quotas, more, 0, tracked.key or self.namespace.key_of(inode))
        self._set_now(tracked, tracked.key, end, tracked.files)

    def track(self, inode: Inode) -> None:
        """Before a change that rewrites the inode's origin fields (a
        truncate down): take its base while they still say what the
        bucket holds."""
        if self._quotas:
            self._track(inode)

    def resized(self, inode: Inode) -> None:
        """After a truncate: the file holds exactly ``inode.size`` bytes."""
        if self._quotas:
            tracked = self._track(inode)
            self._set_now(tracked, tracked.key, inode.size, tracked.files)

    def removed(self, inode: Inode, key: str, *, still_open: bool = False) -> None:
        """``inode`` (at ``key`` until now) left the namespace.  One that is
        ``still_open`` keeps counting where it was, as ext4 charges an
        unlinked file until its last close: its bytes are still on this
        node and its writers may still grow it (checked against the quotas
        it was under); ``orphan_gone`` ends that."""
        if not self._quotas:
            return
        tracked = self._track(inode, key)
        if still_open:
            tracked.orphan = True
        else:
            self._set_now(tracked, None, 0, 0)

    def orphan_gone(self, ino: int) -> None:
        """The last user of a file removed while open let go of it."""
        tracked = self._tracked.get(ino)
        if tracked is not None and tracked.orphan:
            tracked.orphan = False
            self._set_now(tracked, None, 0, 0)

    def plan_move(self, members: Iterable[tuple[Inode, str, str]]) -> MovePlan:
        """Check a rename: each member (a file, or a directory and every
        name below it) as ``(inode, old key, new key)``.  The names that
        come below a quota's directory they were not below count against
        it; raises EDQUOT before anything moves.  ``apply_move`` records the
        plan once the rename is made."""
        if not self._quotas:
            return []
        plan: MovePlan = []
        added: dict[int, tuple[Quota, list[int]]] = {}
        for inode, old_key, new_key in members:
            tracked = self._track(inode, old_key)
            for quota in self.covering(new_key):
                if quota not in tracked.quotas:
                    entry = added.setdefault(id(quota), (quota, [0, 0]))
                    entry[1][0] += tracked.bytes
                    entry[1][1] += tracked.files
            plan.append((tracked, new_key))
        for quota, (more_bytes, more_files) in added.values():
            self._admit((quota,), more_bytes, more_files, plan[0][1] if plan else "")
        return plan

    def apply_move(self, plan: MovePlan) -> None:
        for tracked, new_key in plan:
            self._set_now(tracked, new_key, tracked.bytes, tracked.files)

    # --- the walk ----------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Walk at start, after each reload, then every interval (see the
        module docstring).  Runs until cancelled."""
        task_status.started()
        while True:
            self._wake = trio.Event()
            interval = math.inf
            if self._quotas:
                began = trio.current_time()
                await self.walk()
                took = trio.current_time() - began
                interval = max(self.list_ttl, WALK_SPACING * took, WALK_MIN_INTERVAL)
            with trio.move_on_after(interval):
                await self._wake.wait()

    def walk_soon(self) -> None:
        self._wake.set()

    async def wait_walked(self) -> None:
        """Until a walk that starts after this call has finished."""
        target = self.walks + (2 if self._walking else 1)
        self.walk_soon()
        while self.walks < target and self._quotas:
            await self._walked.wait()

    async def walk(self) -> None:
        """Count every quota's subtree in the bucket, then rebase the
        tracked inodes that were settled when it began."""
        quotas = self._quotas
        if not quotas:
            return
        self._walking = True
        began, began_wall = trio.current_time(), self._clock()
        busy = self.journal.inodes_pending()
        settled = {
            ino: (t.key, t.bytes, t.files)
            for ino, t in self._tracked.items()
            if ino not in busy and not t.orphan
        }
        by_prefix = dict(self._by_prefix)
        try:
            counts = await self._count_bucket(by_prefix)
        except* StoreError as group:  # raised in the listers' nursery
            failure = _first_leaf(group)
            for quota in quotas:
                quota.walk_error = str(failure)
            log.warning("quota walk failed, the last counts stay: %s", failure)
        else:
            self._take_counts(counts, settled, trio.current_time() - began, began_wall)
        finally:
            # Waiters (``wait_walked``) learn of the walk once its counts
            # are in, or once it failed.
            self._walking = False
            self.walks += 1
            self._walked.set()
            self._walked = trio.Event()

    def _take_counts(
        self,
        counts: dict[str, list[int]],
        settled: dict[int, tuple[str | None, int, int]],
        took: float,
        began_wall: float,
    ) -> None:
        """A walk's counts become the quotas' ``listed``; the inodes settled
        when it began are rebased (see the module docstring)."""
        changed: list[Quota] = []
        for quota in self._quotas:
            found = counts.get(quota.prefix)
            if found is None:
                continue  # added by a reload while this walk ran: the next one counts it
            quota.listed_bytes, quota.listed_files = found
            quota.walked_at, quota.walk_seconds, quota.walk_error = began_wall, took, ""
            changed.append(quota)
        for ino, (key, size, files) in settled.items():
            tracked = self._tracked.get(ino)
            if tracked is None:
                continue
            self._count(tracked, -1)
            tracked.base_key, tracked.base_bytes, tracked.base_files = key, size, files
            tracked.base_quotas = self.covering(key)
            if (tracked.key, tracked.bytes, tracked.files) == (key, size, files):
                del self._tracked[ino]
            else:
                self._count(tracked, +1)
        self._after_change(changed)

    async def _count_bucket(self, by_prefix: dict[str, Quota]) -> dict[str, list[int]]:
        """[bytes, names] below each quota's directory, by its prefix."""
        counts: dict[str, list[int]] = {prefix: [0, 0] for prefix in by_prefix}
        # The outermost quotas' directories; the walk of each counts the
        # quotas inside it too.
        tops = [
            prefix
            for prefix in by_prefix
            if not any(other != prefix and prefix.startswith(other) for other in by_prefix)
        ]
        send, receive = trio.open_memory_channel[str](math.inf)
        outstanding = len(tops)
        for top in tops:
            send.send_nowait(top)

        async def lister() -> None:
            nonlocal outstanding
            async for prefix in receive:
                below, found = await self.store_threads.run(
                    lambda p=prefix: self._list_one(p, by_prefix),  # type: ignore[misc]
                    limiter=self.store_limiter,
                )
                for quota_prefix, (more_bytes, more_files) in found.items():
                    tally = counts[quota_prefix]
                    tally[0] += more_bytes
                    tally[1] += more_files
                outstanding += len(below) - 1
                for sub in below:
                    send.send_nowait(sub)
                if outstanding == 0:
                    send.close()

        async with trio.open_nursery() as nursery:
            for _ in range(WALK_LISTS):
                nursery.start_soon(lister)
        return counts

    def _list_one(
        self, prefix: str, by_prefix: dict[str, Quota]
    ) -> tuple[list[str], dict[str, list[int]]]:
        """In a store thread: list one directory; return its
        subdirectories' prefixes and [bytes, names] of its entries per
        quota prefix (added up on the loop)."""
        below: list[str] = []
        counts: dict[str, list[int]] = {}
        for page in self.store.list_pages(prefix):
            for obj in page.objects:
                name = obj.key[len(prefix) :]
                if name == "" or name_problem(name) is not None:
                    continue  # the directory's own marker; a key the mount skips
                if prefix == "" and name in RESERVED_ROOTS:
                    continue
                for quota in _covering(by_prefix, obj.key):
                    tally = counts.setdefault(quota.prefix, [0, 0])
                    tally[0] += obj.size
                    tally[1] += 1
            for common in page.prefixes:
                name = common[len(prefix) : -1]
                if name_problem(name) is not None or (prefix == "" and name in RESERVED_ROOTS):
                    continue
                for quota in _covering(by_prefix, common[:-1]):
                    counts.setdefault(quota.prefix, [0, 0])[1] += 1
                below.append(common)
        return below, counts

    # --- reports -----------------------------------------------------------------------

    def status(self) -> list[dict[str, object]]:
        return [quota.report() for quota in self._quotas]


def _covering(by_prefix: dict[str, Quota], key: str | None) -> tuple[Quota, ...]:
    if key is None or not by_prefix:
        return ()
    found: list[Quota] = []
    whole = by_prefix.get("")
    if whole is not None and key:
        found.append(whole)
    end = key.find("/")
    while end != -1:
        quota = by_prefix.get(key[: end + 1])
        if quota is not None:
            found.append(quota)
        end = key.find("/", end + 1)
    return tuple(found)


def _first_leaf(group: BaseExceptionGroup[StoreError]) -> BaseException:
    """The first exception of a (possibly nested) group."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def _usage_text(quota: Quota) -> str:
    parts = []
    if quota.config.bytes is not None:
        parts.append(f"{format_size(quota.used_bytes)} of {format_size(quota.config.bytes)}")
    if quota.config.files is not None:
        parts.append(f"{quota.used_files:,} of {quota.config.files:,} names")
    return ", ".join(parts)
