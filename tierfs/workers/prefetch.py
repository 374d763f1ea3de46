"""Order-aware prefetch: keep the next files of a known read order resident.

A client (``tierfs prefetch MOUNTPOINT --order FILE``, or
``tierfs.client.set_order`` from a DataLoader sampler) hands the daemon the
order in which it will open files.  The ``Prefetcher`` follows the readers'
position from their opens and keeps a bounded *window* of the next files
resident ahead of them, through ``DataMovement.fill(..., priority=FetchPriority.AHEAD)``:
demand reads go first and share in-flight fetches, but unlike preload the
fills are not held to the background half of the fetch slots (see
"Priority" in ``tierfs.core.read.fetcher``).  Why: the readers of an epoch
keep one GET each in flight (8 DataLoader workers, 8 GETs); the window is
worth something only if it keeps more in flight than they do, so it runs
up to ``tasks`` fills at once: all of ``fetch.concurrency`` (32 by
default).  A reader's miss never waits behind queued prefetch work, only
for the first running fetch to end (no AHEAD fetch starts while a demand
fetch waits, ``tierfs.core.read.fetch_slots``).  Measured
(``tests/bench/run.sh preload --cases epoch --epoch-variants without,with
--files 1000 --s3-delay 0.1``, 8 shuffled readers, one round each, the
2-core machine busy with other work): three quarters of the slots (24
fills) gave a 1.83x faster epoch (the same share, alone on the machine
the day before: 2.00x), all 32 gave 2.44x; 36 fills (``--concurrency
48``) had given 2.68x.  Every fill of a far-away bucket is a wait of one
round trip, so the epoch's speed-up is the fills in flight over the
readers' 8, less the opens that find their file still in flight.

The order (``_Order``).  The paths arrive in chunks and are spooled to an
unnamed temporary file in the state directory (``PathSpool``), then resolved
one by one to inode numbers and sizes kept in ``array``s (16 bytes per
entry), with an open-addressing index ino -> first position (``_InodeIndex``,
16 bytes per slot, at most half full) and one state byte per position
(``fill_state``, ``opened``): 50 to 80 bytes per entry in all, a
1,000,000-entry order is ~52 MB of arrays, never a million Python strings.
A file listed twice is followed at its
first position.  A new order replaces the previous one (its in-flight fills
are cancelled); an empty order stops prefetching.

Following the readers.  Every open of a file in the order (``opened``, an
observer of ``Handles.open``) marks its position opened and appends it to
``recent`` (the last ``readers_kept`` positions).  ``low`` = the smallest
recent position (the slowest recent reader), ``high`` the largest (the
furthest).  An open further than ``jump_files`` from every recent position
is a jump: ``recent`` starts again from it, so the window moves with the
reader.  Opens of files not in the order do nothing.  Before any open the
readers are at position 0.

The window: the first ``window_files`` positions at or after ``low`` that
were not opened (files behind the slowest recent reader, and files already
opened, are never prefetched again), cut where their sizes add up to more
than ``window_bytes`` (at least one file), and looked for no further than
``jump_files`` past ``high``.  Several readers (a DataLoader's
workers) read neighbouring files at once: the window covers the files
between them not opened yet and runs ahead of the furthest one.

Per position, ``fill_state``: IDLE --window--> FETCHING --fill returned
bytes--> FILLED, --nothing to fetch--> RESIDENT, --error--> FAILED;
FETCHING --left the window unopened (passed, or the reader jumped)--> the
fill is cancelled --> IDLE; a fill whose file was opened goes on (the read
shares its fetches).  At most ``tasks`` fills run at once, started in order;
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

Figures: ``status()`` (files prefetched, hits, opens, cancelled fills,
window...; the counters start again with each new order).  While ``run``
runs, it is also the file system's status section ``STATUS_SECTION``, which
``tierfs status`` shows and the metrics collector exports
(``tierfs.metrics``: ``tierfs_prefetch_*``).
"""

from __future__ import annotations

import collections
import logging
from array import array
from pathlib import Path
from typing import Any

import trio

from tierfs.core import TierFS
from tierfs.core.names.access import READ, Caller, permits, searchable
from tierfs.core.read.fetch_slots import FetchPriority
from tierfs.core.read.openfiles import CachedFile
from tierfs.errors import IsADirectory, PermissionDenied, TierfsError, describe
from tierfs.meta import Inode

from .pathlists import BAD_LINES_NAMED, SPOOL_BATCH, PathSpool

log = logging.getLogger(__name__)

#: Default window: the next 64 files or 2 GiB, whichever is smaller.
DEFAULT_WINDOW_FILES = 64
DEFAULT_WINDOW_BYTES = 2 * 1024 * 1024 * 1024
#: Share of ``fetch.concurrency`` the prefetcher's fills may use at once
#: (all of it: see the module docstring).
FILL_SHARE = 1.0
#: Recent open positions that define the readers' span (a DataLoader with
#: 8 workers and prefetch_factor 2 has ~16 files open at once).
DEFAULT_READERS_KEPT = 32
#: Directories kept resolved while an order loads (``_resolve``).
PARENTS_KEPT = 4096
#: The name of the prefetcher's section of ``TierFS.status()`` (while it runs).
STATUS_SECTION = "prefetch"

_IDLE = 0
_FETCHING = 1
_FILLED = 2
_RESIDENT = 3
_FAILED = 4

_HASH_MULTIPLIER = 0x9E3779B97F4A7C15
_U64 = (1 << 64) - 1


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


class Prefetcher:
    """The prefetch worker: one order per mount, followed from the opens."""

    def __init__(
        self,
        fs: TierFS,
        *,
        window_files: int = DEFAULT_WINDOW_FILES,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        tasks: int | None = None,
        readers_kept: int = DEFAULT_READERS_KEPT,
    ) -> None:
        self.fs = fs
        self.movement = fs.movement
        self.default_window = (window_files, window_bytes)
        self.window_files = window_files
        self.window_bytes = window_bytes
        #: Fills at once (each is one GET for a small file): well above the
        #: readers' own GETs, below ``fetch.concurrency`` (see the docstring).
        self.tasks = tasks or max(2, int(fs.config.fetch.concurrency * FILL_SHARE))
        self.spool_dir = fs.config.state.dir / "prefetch"
        self._order: _Order | None = None
        self._recent: collections.deque[int] = collections.deque(maxlen=readers_kept)
        self._demoted_to = 0
        self._in_flight: dict[int, trio.CancelScope] = {}
        #: position -> (the CachedFile held for the reader, trio time of the fill)
        self._held: dict[int, tuple[CachedFile, float]] = {}
        self.hold_seconds = fs.config.namespace.revalidate_ttl
        #: Set when a hold is taken: ``_expire_holds`` sleeps while none is held.
        self._hold_taken = trio.Event()
        #: ``low`` when ``_schedule`` last looked for what left the window:
        #: fills and holds leave it only when ``low`` moves (see ``_schedule``).
        self._window_low: int | None = None
        self._holds_due = False
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._reset_counters()

    def _reset_counters(self) -> None:
        self.prefetched_files = 0
        self.prefetched_bytes = 0
        self.failed_files = 0
        self.hits = 0
        self.opens = 0
        self.cancelled = 0
        self.missing = 0

    @property
    def has_order(self) -> bool:
        """An order is being followed (the directory readahead stands down)."""
        return self._order is not None

    @property
    def jump_files(self) -> int:
        """An open this far from every recent position is a jump."""
        return 4 * self.window_files

    # --- lifecycle -------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.fs.following_opens(self.opened, STATUS_SECTION, self.status):
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
            self._in_flight.clear()
            self._let_go(list(self._held))

    async def _expire_holds(self) -> None:
        """Let ``_schedule`` look for holds older than ``hold_seconds``, at
        least every half of it (and every second), while any is held; with
        none it sleeps until one is taken (an idle daemon's loop is not
        woken every second for nothing)."""
        while True:
            if not self._held:
                self._hold_taken = trio.Event()
                await self._hold_taken.wait()
            await trio.sleep(min(1.0, max(0.05, self.hold_seconds / 2)))
            if self._held:
                self._holds_due = True
                self._changed.set()

    def new_spool(self) -> PathSpool:
        return PathSpool(Path(self.spool_dir))

    async def load_order(
        self,
        spool: PathSpool,
        *,
        window_files: int | None = None,
        window_bytes: int | None = None,
        caller: Caller | None = None,
    ) -> dict[str, Any]:
        """Resolve the relpaths of ``spool`` (which it closes) and make them
        the order, replacing the previous one; an empty spool stops
        prefetching.  Missing files, and files ``caller`` may not read
        (``access``: a directory above it without search, the file without
        read), are named (up to ``BAD_LINES_NAMED``) and left out; the rest
        goes on."""
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
                    if caller is not None and not permits(inode, caller, READ):
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
        self._replace(order if len(order) else None, window_files, window_bytes)
        self.missing = nmissing
        summary = self.status()
        summary["missing_named"] = missing
        log.info("prefetch order: %d files, %d missing", len(order), nmissing)
        return summary

    async def _resolve(self, relpath: str, parents: dict[str, int], caller: Caller | None) -> Inode:
        """The inode of a (normalized) relpath; its directory is looked up
        (and, for a ``caller``, checked for search all the way down) once per ``parents`` (an order's files share a few
        directories: one name lookup per file instead of one per path
        component)."""
        namespace = self.fs.namespace
        parent_path, _, name = relpath.rpartition("/")
        if not name:
            return await namespace.resolve(relpath)
        parent = parents.get(parent_path)
        if parent is None:
            above = (
                await namespace.resolve(parent_path)
                if caller is None
                else await searchable(namespace, parent_path, caller)
            )
            parent = above.ino
            if len(parents) >= PARENTS_KEPT:
                parents.clear()
            parents[parent_path] = parent
        return await namespace.lookup(parent, name.encode())

    def _replace(
        self, order: _Order | None, window_files: int | None, window_bytes: int | None
    ) -> None:
        for scope in self._in_flight.values():
            scope.cancel()
        self._in_flight.clear()
        self._let_go(list(self._held))
        self._order = order
        self._recent.clear()
        self._window_low = None
        self._demoted_to = 0
        self.window_files = max(1, window_files or self.default_window[0])
        self.window_bytes = max(1, window_bytes or self.default_window[1])
        self._reset_counters()
        self._changed.set()

    # --- following the readers ---------------------------------------------------------

    def opened(self, ino: int) -> None:
        """An open of ``ino`` (synchronous, from ``Handles.open``)."""
        order = self._order
        if order is None:
            return
        position = order.index.get(ino)
        if position is None:
            return
        self.opens += 1
        if position in self._held:
            # The open took its own reference already (``Handles.open``).
            self.hits += 1
            self._let_go([position])
        elif order.fill_state[position] == _FILLED and self._resident(ino, order.sizes[position]):
            self.hits += 1
        order.opened[position] = 1
        self.fs.space.demote_first(ino)
        recent = self._recent
        if recent and (
            position > max(recent) + self.jump_files or position < min(recent) - self.jump_files
        ):
            recent.clear()
            self._demoted_to = position
        recent.append(position)
        self._demote_passed(order)
        self._changed.set()

    def _let_go(self, positions: list[int]) -> None:
        for position in positions:
            cf, _filled_at = self._held.pop(position)
            self.movement.let_go(cf)

    def _resident(self, ino: int, size: int) -> bool:
        return sum(self.movement.residency(ino).values()) >= size

    def _demote_passed(self, order: _Order) -> None:
        """Files opened behind the slowest recent reader: first to go."""
        low = self.low
        for position in range(self._demoted_to, low):
            if order.opened[position]:
                self.fs.space.demote_first(order.inos[position])
        self._demoted_to = max(self._demoted_to, low)

    @property
    def low(self) -> int:
        return min(self._recent) if self._recent else 0

    @property
    def high(self) -> int:
        return max(self._recent) if self._recent else 0

    def window(self) -> list[int]:
        """The positions that should be resident now (see the module docstring)."""
        order = self._order
        if order is None:
            return []
        members: list[int] = []
        nbytes = 0
        # Past ``high + jump_files`` the reader would be jumping: the scan
        # stops there (an order read again without a new one does not scan
        # every opened position at each open).
        for position in range(self.low, min(len(order), self.high + self.jump_files + 1)):
            if order.opened[position]:
                continue
            size = order.sizes[position]
            if members and nbytes + size > self.window_bytes:
                break
            members.append(position)
            nbytes += size
            if len(members) >= self.window_files:
                break
        return members

    def _schedule(self) -> None:
        """Cancel fills that left the window, start the next ones in it."""
        order = self._order
        if order is None or self._nursery is None:
            return
        wanted = self.window()
        # The window starts at ``low`` and only an open changes it: one inside
        # it takes a position out (its fill goes on, it has no hold) and lets
        # the next one in; only a move of ``low`` (the slowest reader went on,
        # or a jump) can leave fills and holds outside.  So the scans below
        # run when ``low`` moved, not at every open.
        low = self.low
        if low != self._window_low or self._holds_due:
            keep = set(wanted)
            # A fill a reader reached goes on (the read shares its fetches).
            passed = [p for p in self._in_flight if p not in keep and not order.opened[p]]
            for position in passed:
                self._in_flight.pop(position).cancel()
                self.cancelled += 1
            oldest = trio.current_time() - self.hold_seconds
            self._let_go([p for p, (_cf, at) in self._held.items() if p not in keep or at < oldest])
            self._window_low = low
            self._holds_due = False
        for position in wanted:
            if len(self._in_flight) >= self.tasks:
                break
            if order.fill_state[position] == _IDLE:
                scope = trio.CancelScope()
                order.fill_state[position] = _FETCHING
                self._in_flight[position] = scope
                self._nursery.start_soon(self._fill, order, position, scope)

    async def _fill(self, order: _Order, position: int, scope: trio.CancelScope) -> None:
        state = _IDLE
        held: CachedFile | None = None
        try:
            with scope:
                held = self.movement.hold(order.inos[position])
                nbytes = await self.movement.fill(
                    order.inos[position], priority=FetchPriority.AHEAD
                )
                state = _FILLED if nbytes else _RESIDENT
                if nbytes and order is self._order:
                    self.prefetched_files += 1
                    self.prefetched_bytes += nbytes
        except TierfsError as exc:
            state = _FAILED
            self.failed_files += order is self._order
            log.info("prefetch of inode %d failed: %s", order.inos[position], describe(exc))
        except Exception:
            # A bug must not take the worker (and the order) down.
            state = _FAILED
            log.exception("prefetch of inode %d failed", order.inos[position])
        finally:
            if order is self._order:
                order.fill_state[position] = state
                if self._in_flight.get(position) is scope:
                    del self._in_flight[position]
                if held is not None and state == _FILLED and not order.opened[position]:
                    self._held[position] = (held, trio.current_time())
                    self._hold_taken.set()
                    held = None
                self._changed.set()
            if held is not None:
                self.movement.let_go(held)

    # --- status --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        order = self._order
        window = self.window()
        return {
            "order_files": len(order) if order is not None else 0,
            "cursor": self.high,
            "slowest": self.low,
            "window_files": self.window_files,
            "window_bytes": self.window_bytes,
            "window": len(window),
            "in_flight": len(self._in_flight),
            "held": len(self._held),
            "files_prefetched": self.prefetched_files,
            "bytes_prefetched": self.prefetched_bytes,
            "files_failed": self.failed_files,
            "opens": self.opens,
            "hits": self.hits,
            "cancelled": self.cancelled,
            "missing": self.missing,
        }
