"""Order-aware prefetch: keep the next files of known read orders resident.

A client (``tierfs prefetch MOUNTPOINT --order FILE``, ``tierfs.client``, or
the ``tierfs.torch`` sampler wrapper) hands the daemon the order in which it
will open files.  The ``Prefetcher`` follows the readers' position from
their opens and keeps a bounded *window* of the next files resident ahead
of them, through ``DataMovement.fill(..., priority=FetchPriority.AHEAD)``:
demand reads go first and share in-flight fetches, but unlike preload the
fills are not held to the background half of the fetch slots (see
"Priority" in ``tierfs.core.read.fetcher``).  Why: the readers of an epoch
keep one GET each in flight (8 DataLoader workers, 8 GETs); the window is
worth something only if it keeps more in flight than they do, so it runs
up to ``tasks`` fills at once: all of ``fetch.concurrency`` (32 by
default).  A reader's miss never waits behind queued prefetch work, only
for the first running fetch to end (no AHEAD fetch starts while a demand
fetch waits, ``tierfs.core.state.fetch_slots``).  The epochs measured
with 24, 32 and 36 fills: ``docs/benchmarks.md``, "Fills at once".  Every fill of a far-away bucket is a wait of one
round trip, so the epoch's speed-up is the fills in flight over the
readers' 8, less the opens that find their file still in flight.

The order (``_Order``).  The paths arrive in chunks and are spooled to an
unnamed temporary file in the state directory (``PathSpool``), then resolved
one by one to inode numbers and sizes kept in ``array``s (16 bytes per
entry), with an open-addressing index ino -> first position (``_InodeIndex``,
16 bytes per slot, at most half full) and one state byte per position
(``fill_state``, ``opened``): 50 to 80 bytes per entry in all, a
1,000,000-entry order is ~52 MB of arrays, never a million Python strings.
A file listed twice is followed at its first position.

Sessions: several orders side by side.  Each order belongs to a *session*,
``OrderKey(uid, job, rank, session)``: the user who set it, the job and
rank names the client gave, and the token of a client's
``PrefetchSession`` (all empty for ``tierfs prefetch --order``: one order
per user).  A new order replaces the previous one *of its session*
(its in-flight fills are cancelled); an empty order ends it, and so does
``clear`` (``tierfs prefetch --clear [--job J]``, the Slurm epilog).  An
order set with ``bound=True`` (``tierfs.client.PrefetchSession``, the
sampler wrapper) also ends when the control connection that set it closes:
its process exited or closed the session, so no order outlives a training
process that died.  Eight DDP ranks, or two jobs on one node, each follow
their own order (``_Follower``), and every open is shown to every follower.
Bounds per user (root too): ``ORDERS_PER_USER`` orders, ``MAX_ORDER_FILES``
files in one order and ``USER_ORDER_FILES`` in all of a user's orders, so
one user cannot fill the daemon's memory; beyond them a new order is
refused (EBUSY / EINVAL) and the user's other orders stay.

Sharing, per user first, then per order.  The ``tasks`` fills at once are
shared by the users whose orders have something to fill: each free task
goes to the user with the fewest fills running, and within that user to
its order with the fewest (``_schedule``: water-filling at both levels),
so two users that both want more run ``tasks / 2`` each however many
orders each has, and one alone may use them all.  The first tier's room:
the windows of all orders together hold at most ``ROOM_SHARE`` of the
first tier's capacity below its high watermark; each user with an order
gets an equal part of it, and each of that user's orders an equal part of
the user's (``_Follower.room_bytes``; at least one file), recomputed when
an order comes or goes.  One user's 32 orders therefore take no more of
either than another user's one.  Why equal parts and not the
readers' speed: the window is sized in files ahead of a reader, and a
fast reader's window empties faster, so it takes more of the tasks already.

Following the readers.  Every open of a file in the order (``opened``, an
observer of ``Handles.open``) marks its position opened and appends it to
``recent`` (the last ``readers_kept`` positions).  ``low`` = the smallest
recent position (the slowest recent reader), ``high`` the largest (the
furthest).  An open further than ``jump_files`` from every recent position
is a jump: ``recent`` starts again from it, so the window moves with the
reader.  Opens of files not in the order do nothing.  Before any open the
readers are at position 0.  An open carries no session: an open of a file
moves every order that lists it, whoever opened it (two jobs reading one
data set in different orders see each other's opens as jumps; ranks of one
job, with their own slices, do not meet).

The window: the first ``window_files`` positions at or after ``low`` that
were not opened (files behind the slowest recent reader, and files already
opened, are never prefetched again), cut where their sizes add up to more
than ``window_bytes`` or the order's part of the room (at least one file), and looked for no further than
``jump_files`` past ``high``.  Several readers (a DataLoader's
workers) read neighbouring files at once: the window covers the files
between them not opened yet and runs ahead of the furthest one.

Per position, ``fill_state``: IDLE --window--> FETCHING --fill returned
bytes--> FILLED, --nothing to fetch--> RESIDENT, --error--> FAILED;
FETCHING --left the window unopened (passed, or the reader jumped)--> the
fill is cancelled --> IDLE; a fill whose file was opened goes on (the read
shares its fetches).  At most ``tasks`` fills run at once (of all orders),
started in order within each order;
a fill is never started for a position outside the window, so the files
made resident by prefetch and not opened yet never exceed the window.

Cheap hits: a file this prefetcher filled and no reader opened yet is
*held*: the prefetcher keeps a reference to its ``CachedFile``, as an open
handle would (``_held``, position -> CachedFile and the time of its fill).
The reader's open then finds it in memory: no LMDB read of its block map,
its cache file already open, no HEAD (a busy file is not revalidated at
open: the fill's GET checked its ETag with If-Match a moment ago; past
``revalidate_ttl`` a hold is let go, so the open revalidates as usual).
The open takes its own reference and ``opened`` lets go of the hold.  A
hold is also let go when its position leaves the window unopened, when a
new order replaces this one and when the worker stops.  Held files are busy
(never evicted while held): they are the window's filled files, so at most
``window_files`` files and ``window_bytes`` bytes.

Eviction hint: a file opened in this order (read in this epoch) is the
first candidate to leave the first tier (``SpaceManager.demote_first``),
at its open (it is busy while open, so it stays while read) and again when
the slowest reader passes it.  ``hits`` counts opens of files this
prefetcher fetched (FILLED) and found resident at the open.

Figures: ``status()``: per order (``orders``: its session, files,
cursor, window, files prefetched, hits, opens, cancelled fills...; the
counters start with the order), and for the worker (orders, fills in
flight, and counters since the daemon started, the sum over every order
that ran: never going back, as the metrics' counters must).  While ``run``
runs, it is also the file system's status section ``STATUS_SECTION``, which
``tierfs status`` shows and the metrics collector exports
(``tierfs.metrics``: ``tierfs_prefetch_*``).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import itertools
import logging
import time
from array import array
from pathlib import Path
from typing import Any

import trio

from tierfs.config import FetchConfig
from tierfs.core.names.access import READ, Caller
from tierfs.core.state.fetch_slots import FetchPriority
from tierfs.core.state.openfiles import CachedFile
from tierfs.errors import (
    Busy,
    InvalidArgument,
    IsADirectory,
    PermissionDenied,
    TierfsError,
    describe,
)
from tierfs.meta import Inode
from tierfs.text import check_label

from .fillparts import FillParts
from .foreground import FollowOpens
from .pathlists import BAD_LINES_NAMED, SPOOL_BATCH, PathSpool

log = logging.getLogger(__name__)

#: Default window: the next 64 files or 2 GiB, whichever is smaller.
DEFAULT_WINDOW_FILES = 64
DEFAULT_WINDOW_BYTES = 2 * 1024 * 1024 * 1024
#: Share of ``fetch.concurrency`` the prefetcher's fills may use at once
#: (all of it: see the module docstring).
FILL_SHARE = 1.0
#: Share of the first tier (below its high watermark) that the windows of
#: all orders together may hold.
ROOM_SHARE = 0.5
#: Recent open positions that define the readers' span (a DataLoader with
#: 8 workers and prefetch_factor 2 has ~16 files open at once).
DEFAULT_READERS_KEPT = 32
#: Directories kept resolved while an order loads (``_resolve``).
PARENTS_KEPT = 4096
#: Orders one user may have at once (a node's DDP ranks and a few jobs).
ORDERS_PER_USER = 32
#: Files in one order, and in all of one user's orders (50-80 bytes each).
MAX_ORDER_FILES = 4_000_000
USER_ORDER_FILES = 8_000_000
#: The longest job or session name a client may give.
MAX_NAME = 128
#: The name of the prefetcher's section of ``TierFS.status()`` (while it runs).
STATUS_SECTION = "prefetch"
#: The counters of an order, summed over every order for the worker's totals.
COUNTERS = ("files_prefetched", "bytes_prefetched", "files_failed", "opens", "hits", "cancelled")

_IDLE = 0
_FETCHING = 1
_FILLED = 2
_RESIDENT = 3
_FAILED = 4

_HASH_MULTIPLIER = 0x9E3779B97F4A7C15
_U64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class OrderKey:
    """The session an order belongs to: its user, the job and rank the
    client named, and the client's session token (a ``PrefetchSession``
    names itself, so that two samplers of one rank do not replace each
    other's orders); all empty: the user's one unnamed order."""

    uid: int
    job: str = ""
    rank: int | None = None
    session: str = ""

    def __post_init__(self) -> None:
        for what, text in (("job", self.job), ("session", self.session)):
            check_label(text, f"a prefetch {what} name", MAX_NAME)
        if self.rank is not None and self.rank < 0:
            raise InvalidArgument("a prefetch rank is a whole number, 0 or more")


class _InodeIndex:
    """ino -> first position in the order: open addressing (linear probing)
    over two ``array('q')``, at most half full; inode numbers are > 0 and
    0 marks an empty slot."""

    __slots__ = ("_keys", "_mask", "_shift", "_values")

    def __init__(self, entries: int) -> None:
        bits = max(4, (2 * max(1, entries) - 1).bit_length())
        self._mask = (1 << bits) - 1
        self._shift = 64 - bits
        self._keys = array("q", bytes(8 << bits))
        self._values = array("q", bytes(8 << bits))

    def _slot(self, ino: int) -> int:
        return ((ino * _HASH_MULTIPLIER) & _U64) >> self._shift

    def add(self, ino: int, position: int) -> None:
        """Record ``ino`` at ``position`` unless it is already there."""
        slot = self._slot(ino)
        keys = self._keys
        while keys[slot]:
            if keys[slot] == ino:
                return
            slot = (slot + 1) & self._mask
        keys[slot] = ino
        self._values[slot] = position

    def get(self, ino: int) -> int | None:
        slot = self._slot(ino)
        keys = self._keys
        while keys[slot]:
            if keys[slot] == ino:
                return self._values[slot]
            slot = (slot + 1) & self._mask
        return None


class _Order:
    """One order: inode numbers and sizes per position, and their states.
    Built by ``append`` (while the paths are resolved, with yields to the
    loop in between), then ``seal``ed."""

    def __init__(self, capacity: int) -> None:
        self.inos: array[int] = array("Q")
        self.sizes: array[int] = array("Q")
        self.index = _InodeIndex(capacity)
        self.fill_state = bytearray()
        self.opened = bytearray()

    def append(self, ino: int, size: int) -> None:
        self.index.add(ino, len(self.inos))
        self.inos.append(ino)
        self.sizes.append(size)

    def seal(self) -> None:
        self.fill_state = bytearray(len(self.inos))
        self.opened = bytearray(len(self.inos))

    def __len__(self) -> int:
        return len(self.inos)


class _Follower:
    """One session's order and where its readers are: the window, the fills
    running and the files held for it (see the module docstring).  The
    worker (``Prefetcher``) starts and ends its fills."""

    def __init__(
        self,
        ident: int,
        key: OrderKey,
        order: _Order,
        *,
        bound: bool,
        window_files: int,
        window_bytes: int,
        readers_kept: int,
    ) -> None:
        self.ident = ident
        self.key = key
        self.order = order
        #: Ends when the control connection that set it closes.
        self.bound = bound
        self.window_files = window_files
        self.window_bytes = window_bytes
        #: This order's part of the first tier's room (``Prefetcher._share_room``).
        self.room_bytes = window_bytes
        self.started_at = time.time()
        self.recent: collections.deque[int] = collections.deque(maxlen=readers_kept)
        self.demoted_to = 0
        self.in_flight: dict[int, trio.CancelScope] = {}
        #: position -> (the CachedFile held for the reader, trio time of the fill)
        self.held: dict[int, tuple[CachedFile, float]] = {}
        #: ``low`` when the worker last looked for what left the window.
        self.window_low: int | None = None
        self.missing = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        #: Set when the order ends (replaced, cleared, its session gone).
        self.ended = trio.Event()

    @property
    def jump_files(self) -> int:
        """An open this far from every recent position is a jump."""
        return 4 * self.window_files

    @property
    def low(self) -> int:
        return min(self.recent) if self.recent else 0

    @property
    def high(self) -> int:
        return max(self.recent) if self.recent else 0

    def position_of(self, ino: int) -> int | None:
        return self.order.index.get(ino)

    def follow_open(self, position: int) -> None:
        """Move the readers to an opened ``position`` (a jump starts again)."""
        self.order.opened[position] = 1
        recent = self.recent
        if recent and (
            position > max(recent) + self.jump_files or position < min(recent) - self.jump_files
        ):
            recent.clear()
            self.demoted_to = position
        recent.append(position)

    def window(self) -> list[int]:
        """The positions that should be resident now (see the module docstring)."""
        order = self.order
        members: list[int] = []
        nbytes = 0
        limit = min(self.window_bytes, self.room_bytes)
        # Past ``high + jump_files`` the reader would be jumping: the scan
        # stops there (an order read again without a new one does not scan
        # every opened position at each open).
        for position in range(self.low, min(len(order), self.high + self.jump_files + 1)):
            if order.opened[position]:
                continue
            size = order.sizes[position]
            if members and nbytes + size > limit:
                break
            members.append(position)
            nbytes += size
            if len(members) >= self.window_files:
                break
        return members

    def status(self) -> dict[str, Any]:
        window = self.window()
        return {
            "id": self.ident,
            "owner": self.key.uid,
            "job": self.key.job,
            "rank": self.key.rank,
            "session": self.key.session,
            "bound": self.bound,
            "started": self.started_at,
            "order_files": len(self.order),
            "cursor": self.high,
            "slowest": self.low,
            "window_files": self.window_files,
            "window_bytes": min(self.window_bytes, self.room_bytes),
            "window": len(window),
            "in_flight": len(self.in_flight),
            "held": len(self.held),
            **self.counters,
            "missing": self.missing,
        }


class Prefetcher:
    """The prefetch worker: the orders of every session, followed from the opens."""

    def __init__(
        self,
        parts: FillParts,
        *,
        follow_opens: FollowOpens,
        fetch: FetchConfig,
        revalidate_ttl: float,
        spool_dir: Path,
        window_files: int = DEFAULT_WINDOW_FILES,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        tasks: int | None = None,
        readers_kept: int = DEFAULT_READERS_KEPT,
    ) -> None:
        self.parts = parts
        self.spools = parts.spools
        self.movement = parts.movement
        self.follow_opens = follow_opens
        self.default_window = (window_files, window_bytes)
        self.readers_kept = readers_kept
        #: Fills at once, of all orders (each is one GET for a small file):
        #: well above the readers' own GETs (see the docstring).
        self.tasks = tasks or max(2, int(fetch.concurrency * FILL_SHARE))
        self.spool_dir = spool_dir
        self.followers: dict[OrderKey, _Follower] = {}
        self._idents = itertools.count(1)
        #: The counters of the orders that ended (``status``'s totals).
        self._ended = dict.fromkeys(COUNTERS, 0)
        self.hold_seconds = revalidate_ttl
        #: Set when a hold is taken: ``_expire_holds`` sleeps while none is held.
        self._hold_taken = trio.Event()
        self._holds_due = False
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def has_order(self) -> bool:
        """An order is being followed (the directory readahead stands down)."""
        return bool(self.followers)

    @property
    def in_flight(self) -> int:
        return sum(len(f.in_flight) for f in self.followers.values())

    @property
    def held(self) -> int:
        return sum(len(f.held) for f in self.followers.values())

    # --- lifecycle -------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.follow_opens(self.opened, STATUS_SECTION, self.status):
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._expire_holds)
                    task_status.started()
                    while True:
                        await self._changed.wait()
                        self._changed = trio.Event()
                        self._schedule()
        finally:
            self._nursery = None
            for follower in list(self.followers.values()):
                self._end(follower)

    async def _expire_holds(self) -> None:
        """Let ``_schedule`` look for holds older than ``hold_seconds``, at
        least every half of it (and every second), while any is held; with
        none it sleeps until one is taken (an idle daemon's loop is not
        woken every second for nothing)."""
        while True:
            if not self.held:
                self._hold_taken = trio.Event()
                await self._hold_taken.wait()
            await trio.sleep(min(1.0, max(0.05, self.hold_seconds / 2)))
            if self.held:
                self._holds_due = True
                self._changed.set()

    def new_spool(self, owner: int = 0) -> PathSpool:
        """A spool whose bytes count against ``owner`` (``SpoolBudget``)."""
        return PathSpool(Path(self.spool_dir), budget=self.spools, owner=owner)

    async def load_order(
        self,
        spool: PathSpool,
        *,
        key: OrderKey | None = None,
        bound: bool = False,
        window_files: int | None = None,
        window_bytes: int | None = None,
        caller: Caller | None = None,
    ) -> dict[str, Any]:
        """Resolve the relpaths of ``spool`` (which it closes) and make them
        the order of session ``key`` (default: the caller's unnamed order),
        replacing its previous one; an empty spool ends that session's
        order.  Missing files, and files ``caller`` may not read
        (``access``: a directory above it without search, the file without
        read), are named (up to ``BAD_LINES_NAMED``) and left out; the rest
        goes on.  Returns the order's status (``id``: ``end`` it by that)
        and the files left out (``missing_named``)."""
        if key is None:
            key = OrderKey(caller.uid if caller is not None else 0)
        try:
            self.check_bounds(key, spool.count)
        except BaseException:
            spool.close()
            raise
        order = _Order(spool.count)
        missing: list[str] = []
        nmissing = 0
        parents: dict[str, int] = {}
        try:
            for count, relpath in enumerate(spool.lines()):
                if count % SPOOL_BATCH == 0:
                    await trio.sleep(0)
                try:
                    inode = await self._resolve(relpath, parents, caller)
                    if not inode.is_file:
                        raise IsADirectory("is not a regular file")
                    if caller is not None and not self.parts.permissions.permits(
                        inode, caller, READ
                    ):
                        raise PermissionDenied(f"Permission denied: {relpath}")
                except TierfsError as exc:
                    nmissing += 1
                    if len(missing) < BAD_LINES_NAMED:
                        missing.append(f"{relpath or '/'}: {describe(exc)}")
                    continue
                order.append(inode.ino, inode.size)
        finally:
            spool.close()
        order.seal()
        previous = self.followers.get(key)
        if previous is not None:
            self._end(previous)
        if len(order):
            follower = _Follower(
                next(self._idents),
                key,
                order,
                bound=bound,
                window_files=max(1, window_files or self.default_window[0]),
                window_bytes=max(1, window_bytes or self.default_window[1]),
                readers_kept=self.readers_kept,
            )
            follower.missing = nmissing
            self.followers[key] = follower
            self._share_room()
            summary = follower.status()
        else:
            summary = {"id": None, "order_files": 0, "missing": nmissing}
        self._changed.set()
        summary["missing_named"] = missing
        log.info(
            "prefetch order of uid %d (job %r, rank %s): %d files, %d missing",
            key.uid,
            key.job,
            key.rank,
            len(order),
            nmissing,
        )
        return summary

    def check_bounds(self, key: OrderKey, files: int) -> None:
        """Refuse an order past the per-user bounds (its session's previous
        order, which it replaces, does not count)."""
        if files > MAX_ORDER_FILES:
            raise InvalidArgument(
                f"a prefetch order has at most {MAX_ORDER_FILES:,} files; this one has {files:,}"
            )
        others = [f for k, f in self.followers.items() if k.uid == key.uid and k != key]
        if files and len(others) >= ORDERS_PER_USER:
            raise Busy(
                f"uid {key.uid} has {len(others)} prefetch orders, the most one user may; "
                "clear one (tierfs prefetch --clear) or end its session"
            )
        held = sum(len(f.order) for f in others)
        if held + files > USER_ORDER_FILES:
            raise TierfsError(
                f"uid {key.uid}'s prefetch orders would list {held + files:,} files, more than "
                f"the {USER_ORDER_FILES:,} one user may",
                errno=errno.E2BIG,
            )

    async def _resolve(self, relpath: str, parents: dict[str, int], caller: Caller | None) -> Inode:
        """The inode of a (normalized) relpath; its directory is looked up
        (and, for a ``caller``, checked for search all the way down) once
        per ``parents`` (an order's files share a few directories: one name
        lookup per file instead of one per path component)."""
        namespace = self.parts.namespace
        parent_path, _, name = relpath.rpartition("/")
        if not name:
            return await namespace.resolve(relpath)
        parent = parents.get(parent_path)
        if parent is None:
            above = (
                await namespace.resolve(parent_path)
                if caller is None
                else await self.parts.permissions.searchable(parent_path, caller)
            )
            parent = above.ino
            if len(parents) >= PARENTS_KEPT:
                parents.clear()
            parents[parent_path] = parent
        return await namespace.lookup(parent, name.encode(errors="surrogateescape"))

    def end(self, key: OrderKey, ident: int | None = None) -> bool:
        """End the order of session ``key`` (only if it is still order
        ``ident``, when given: a bound order whose connection closed after
        a newer order replaced it ends nothing).  True if one ended."""
        follower = self.followers.get(key)
        if follower is None or (ident is not None and follower.ident != ident):
            return False
        self._end(follower)
        self._changed.set()
        return True

    async def until_ended(self, key: OrderKey, ident: int) -> None:
        """Return once order ``ident`` of session ``key`` has ended (at
        once if it is not that session's order any more)."""
        follower = self.followers.get(key)
        if follower is not None and follower.ident == ident:
            await follower.ended.wait()

    def clear(
        self,
        *,
        uid: int | None,
        job: str | None,
        rank: int | None = None,
        session: str | None = None,
    ) -> list[int]:
        """End the orders of ``uid`` whose job is ``job``, rank ``rank`` and
        session ``session`` (each None: any); their ids."""
        ended = []
        for key, follower in list(self.followers.items()):
            if (
                (uid is None or key.uid == uid)
                and (job is None or key.job == job)
                and (rank is None or key.rank == rank)
                and (session is None or key.session == session)
            ):
                ended.append(follower.ident)
                self._end(follower)
        self._changed.set()
        return ended

    def _end(self, follower: _Follower) -> None:
        for scope in follower.in_flight.values():
            scope.cancel()
        follower.in_flight.clear()
        self._let_go(follower, list(follower.held))
        if self._current(follower):
            del self.followers[follower.key]
            for name in COUNTERS:
                self._ended[name] += follower.counters[name]
        follower.ended.set()
        self._share_room()
        log.info("prefetch order %d of uid %d ended", follower.ident, follower.key.uid)

    def _share_room(self) -> None:
        """Give each user an equal part of the first tier's room, and each
        of a user's orders an equal part of the user's."""
        if not self.followers:
            return
        first = self.parts.space.tiers[0]
        try:
            room = int(first.capacity * first.high_watermark * ROOM_SHARE)
        except OSError:  # the tier's file system did not answer: leave the windows be
            return
        orders_of = collections.Counter(key.uid for key in self.followers)
        for follower in self.followers.values():
            part = max(1, room // len(orders_of) // orders_of[follower.key.uid])
            if follower.room_bytes != part:
                follower.room_bytes = part
                follower.window_low = None  # the window changed: sweep it

    # --- following the readers ---------------------------------------------------------

    def following(
        self, uid: int, ino: int, spans: list[tuple[int, int]]
    ) -> tuple[int | None, list[tuple[int, int]]]:
        """For a reader of ``uid`` opening ``ino``: its position in the
        first of that user's orders that lists it, and the files at
        ``position + offset`` for ``count`` positions of each span, as
        (position, ino) (the descriptors a reader gets ahead,
        ``tierfs.control.readers``).
        (None, []) when no order of the user lists it."""
        for follower in self.followers.values():
            if follower.key.uid != uid:
                continue
            position = follower.position_of(ino)
            if position is None:
                continue
            inos = follower.order.inos
            wanted: list[tuple[int, int]] = []
            for offset, count in spans:
                start = max(0, position + offset)
                wanted.extend((p, inos[p]) for p in range(start, min(len(inos), start + count)))
            return position, wanted
        return None, []

    def opened(self, ino: int) -> None:
        """An open of ``ino`` (synchronous, from ``Handles.open``)."""
        moved = False
        for follower in self.followers.values():
            position = follower.position_of(ino)
            if position is None:
                continue
            moved = True
            follower.counters["opens"] += 1
            order = follower.order
            if position in follower.held:
                # The open took its own reference already (``Handles.open``).
                follower.counters["hits"] += 1
                self._let_go(follower, [position])
            elif order.fill_state[position] == _FILLED and self._resident(
                ino, order.sizes[position]
            ):
                follower.counters["hits"] += 1
            self.parts.space.demote_first(ino)
            follower.follow_open(position)
            self._demote_passed(follower)
        if moved:
            self._changed.set()

    def _let_go(self, follower: _Follower, positions: list[int]) -> None:
        for position in positions:
            cf, _filled_at = follower.held.pop(position)
            self.movement.let_go(cf)

    def _resident(self, ino: int, size: int) -> bool:
        return sum(self.movement.residency(ino).values()) >= size

    def _demote_passed(self, follower: _Follower) -> None:
        """Files opened behind the slowest recent reader: first to go."""
        order = follower.order
        low = follower.low
        for position in range(follower.demoted_to, low):
            if order.opened[position]:
                self.parts.space.demote_first(order.inos[position])
        follower.demoted_to = max(follower.demoted_to, low)

    def _schedule(self) -> None:
        """Cancel fills that left their window, then start the next ones:
        each free task to the user with the fewest fills running, and to
        that user's order with the fewest."""
        if self._nursery is None:
            return
        holds_due, self._holds_due = self._holds_due, False
        waiting: list[tuple[_Follower, collections.deque[int]]] = []
        for follower in self.followers.values():
            wanted = follower.window()
            self._sweep(follower, wanted, holds_due)
            order = follower.order
            idle: collections.deque[int] = collections.deque()
            for position in wanted:
                if order.fill_state[position] != _IDLE:
                    continue
                if self._resident(order.inos[position], order.sizes[position]):
                    # Nothing to fetch: no fill task (its bookkeeping cost
                    # a warm epoch more than the reads it served).
                    order.fill_state[position] = _RESIDENT
                    continue
                idle.append(position)
            if idle:
                waiting.append((follower, idle))
        free = self.tasks - self.in_flight
        per_user: collections.Counter[int] = collections.Counter()
        for follower in self.followers.values():
            per_user[follower.key.uid] += len(follower.in_flight)
        while free > 0 and waiting:
            follower, idle = min(
                waiting, key=lambda entry: (per_user[entry[0].key.uid], len(entry[0].in_flight))
            )
            self._start_fill(follower, idle.popleft())
            per_user[follower.key.uid] += 1
            free -= 1
            if not idle:
                waiting = [entry for entry in waiting if entry[1]]

    def _sweep(self, follower: _Follower, wanted: list[int], holds_due: bool) -> None:
        """Cancel the fills of ``follower`` outside its window and let go of
        holds outside it (or too old).  The window starts at ``low`` and
        only an open changes it: one inside it takes a position out (its
        fill goes on, it has no hold) and lets the next one in; only a move
        of ``low`` (the slowest reader went on, or a jump) can leave fills
        and holds outside (or a change of its part of the room).  So this
        runs when ``low`` moved, not at every open."""
        low = follower.low
        if low == follower.window_low and not holds_due:
            return
        order = follower.order
        keep = set(wanted)
        # A fill a reader reached goes on (the read shares its fetches).
        passed = [p for p in follower.in_flight if p not in keep and not order.opened[p]]
        for position in passed:
            follower.in_flight.pop(position).cancel()
            follower.counters["cancelled"] += 1
        oldest = trio.current_time() - self.hold_seconds
        self._let_go(
            follower, [p for p, (_cf, at) in follower.held.items() if p not in keep or at < oldest]
        )
        follower.window_low = low

    def _start_fill(self, follower: _Follower, position: int) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        follower.order.fill_state[position] = _FETCHING
        follower.in_flight[position] = scope
        self._nursery.start_soon(self._fill, follower, position, scope)

    async def _fill(self, follower: _Follower, position: int, scope: trio.CancelScope) -> None:
        order = follower.order
        ino = order.inos[position]
        state = _IDLE
        held: CachedFile | None = None
        try:
            with scope:
                held = self.movement.hold(ino)
                nbytes = await self.movement.fill(ino, priority=FetchPriority.AHEAD)
                state = _FILLED if nbytes else _RESIDENT
                if nbytes and self._current(follower):
                    follower.counters["files_prefetched"] += 1
                    follower.counters["bytes_prefetched"] += nbytes
        except TierfsError as exc:
            state = _FAILED
            follower.counters["files_failed"] += self._current(follower)
            log.info("prefetch of inode %d failed: %s", ino, describe(exc))
        except Exception:
            # A bug must not take the worker (and the order) down.
            state = _FAILED
            follower.counters["files_failed"] += self._current(follower)
            log.exception("prefetch of inode %d failed", ino)
        finally:
            if self._current(follower):
                order.fill_state[position] = state
                if follower.in_flight.get(position) is scope:
                    del follower.in_flight[position]
                if held is not None and state == _FILLED and not order.opened[position]:
                    follower.held[position] = (held, trio.current_time())
                    self._hold_taken.set()
                    held = None
                self._changed.set()
            if held is not None:
                self.movement.let_go(held)

    def _current(self, follower: _Follower) -> bool:
        """``follower`` is still its session's order (not ended or replaced)."""
        return self.followers.get(follower.key) is follower

    # --- status --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The worker's figures: its orders (each ``_Follower.status``), the
        sums over them, and counters since the worker started."""
        orders = [f.status() for f in sorted(self.followers.values(), key=lambda f: f.ident)]
        totals = dict(self._ended)
        for follower in self.followers.values():
            for name in COUNTERS:
                totals[name] += follower.counters[name]
        return {
            "orders": orders,
            "order_count": len(orders),
            "order_files": sum(o["order_files"] for o in orders),
            "window": sum(o["window"] for o in orders),
            "in_flight": sum(o["in_flight"] for o in orders),
            "held": sum(o["held"] for o in orders),
            "missing": sum(o["missing"] for o in orders),
            "tasks": self.tasks,
            **totals,
        }
