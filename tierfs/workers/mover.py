"""The mover: carries out the lifecycle's plan in the background.

States (``status.mover.state``): ``starting`` -> ``planning`` -> ``moving``
-> ``idle`` -> (``interval`` passes, or something wakes it: a tier so
full that new blocks spill past it, a pin, a reload; never sooner than
``MIN_PASS_GAP`` after the last pass) -> ``planning`` ...

One pass: ``Lifecycle.plan()`` (the planner over the facts of the moment),
then the moves in plan order, each through the data-movement API
(``core.tiering.movement``): a relocate (copy -> verify -> switch in one LMDB
transaction -> delete the old copy), an evict (clean copies only), or a
fill (pins).  Moves start in plan order, ``MOVE_CONCURRENCY`` (3) at once
whatever their size, and more, up to ``MAX_MOVE_CONCURRENCY`` (16, one copy
thread each), while the running moves hold at most ``MOVE_BYTES_IN_FLIGHT``
(64 MiB): one file at a time leaves the disk idle while the loop opens,
switches and deletes, and the loop stops for a whole group commit (an
fdatasync of LMDB), during which only copies already in their thread go
on (the measurements that chose these numbers: docs/benchmarks.md,
"Moves at once").  Parallel reads suit the source tier of a demotion
(NVMe); the writes go to the page cache.  Before
a watermark or keep_newest move starts, the source tier is checked again,
counting the bytes of moves still running from it as gone: once that is
at or below its low mark, the rest of that tier's watermark moves are
skipped.  A move that finds the file busy (opened for writing, an upload
running, written meanwhile, a move of it running) or no room is skipped
and counted; the next pass plans it again if it still applies.  A tier
that went above high stays draining until it reaches its low mark
(``TierUsage.must_drain``, kept by the lifecycle), so a skipped watermark
move still applies when the skip left the tier between its marks: the
next pass goes on down to low.  Nothing is retried in a loop.

Bandwidth: every copy goes through one ``Throttle`` (``[mover]
bandwidth``), promotions included, so the mover never takes more than its
cap from training I/O.  On top of that it yields to the mount: while FUSE
requests come fast (``ForegroundMeter`` over windows of ``BUSY_WINDOW``
seconds, held ``BUSY_HOLD`` seconds after the last busy window), its copies
share at most ``BUSY_RATE``, whatever the cap.  The meter closes its windows
in its own task while copies run (only then: an idle mover's meter
woke the daemon's loop ten times a second for nothing), so a reader that
starts is seen within ``BUSY_WINDOW`` seconds, and the mover then has at
most one chunk per running move in flight.  Opens, copies, hashing and
deletes run in threads, so the event loop keeps serving reads while a move
runs.

Promotions: a second task takes files from ``Lifecycle.promotions`` (queued
by reads served from a slower tier than the file's placement) and copies
them up, only while the target tier stays below its high watermark after
the copy, so that promotion never makes the next pass demote.

Crash safety is the data-movement API's (see ``core.tiering.movement``): a kill -9
at any point loses nothing and leaves no block indexed twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from tierfs.config import MoverConfig
from tierfs.core.state.space import SpaceManager
from tierfs.core.tiering.lifecycle import Lifecycle
from tierfs.core.tiering.movement import COPY_THREADS, DataMovement
from tierfs.core.tiering.policies import FilePolicies, Promotion
from tierfs.errors import Busy, NoSpace, TierfsError
from tierfs.policy.planner import Move, MoveAdmission
from tierfs.policy.watermarks import mark
from tierfs.tiers import Tier

from .foreground import CountsRequests, ForegroundMeter
from .throttle import Throttle

log = logging.getLogger(__name__)

#: The section of ``tierfs status`` the mover's status fills.
STATUS_SECTION = "mover"

#: A pass shorter than this does not update the measured rate.
RATE_MIN_SECONDS = 0.05
#: Seconds between the end of a pass and the start of the next, at least.
MIN_PASS_GAP = 0.5
#: Moves running at once, whatever their size ...
MOVE_CONCURRENCY = 3
#: ... and more, up to this many (one copy thread each), while the running
#: moves hold at most ...
MAX_MOVE_CONCURRENCY = COPY_THREADS
#: ... this many bytes in all (small files: see the module docstring).
MOVE_BYTES_IN_FLIGHT = 64 << 20
MOVE_ADMISSION = MoveAdmission(MOVE_CONCURRENCY, MAX_MOVE_CONCURRENCY, MOVE_BYTES_IN_FLIGHT)
#: Bytes per second the mover copies at most while the mount is busy ...
BUSY_RATE = 50 << 20
#: ... as measured over windows of this many seconds ...
BUSY_WINDOW = 0.1
#: ... and for this long after the last busy window.
BUSY_HOLD = 0.5


@dataclass(slots=True)
class CurrentMove:
    path: str
    src: str
    dst: str | None
    nbytes: int
    reason: str
    done: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class MoverStatus:
    state: str = "starting"
    bandwidth: int = 0
    interval: float = 0.0
    files_moved: int = 0
    bytes_moved: int = 0
    files_dropped: int = 0
    bytes_dropped: int = 0
    files_fetched: int = 0
    bytes_fetched: int = 0
    promotions: int = 0
    skipped: int = 0
    passes: int = 0
    last_pass: float | None = None
    last_error: str = ""
    #: The moves running now, oldest first (the mover runs a few at once).
    moving: list[CurrentMove] = field(default_factory=list)
    #: Bytes per second moved by the last pass that took long enough to measure.
    rate: float = 0.0

    @property
    def current(self) -> CurrentMove | None:
        """The oldest move running now."""
        return self.moving[0] if self.moving else None

    def as_dict(self) -> dict[str, Any]:
        current = None
        if self.current is not None:
            c = self.current
            current = {
                "path": c.path,
                "src": c.src,
                "dst": c.dst,
                "bytes": c.nbytes,
                "done": c.done,
                "reason": c.reason,
            }
        return {
            "state": self.state,
            "bandwidth": self.bandwidth,
            "interval": self.interval,
            "files_moved": self.files_moved,
            "bytes_moved": self.bytes_moved,
            "files_dropped": self.files_dropped,
            "bytes_dropped": self.bytes_dropped,
            "files_fetched": self.files_fetched,
            "bytes_fetched": self.bytes_fetched,
            "promotions": self.promotions,
            "skipped": self.skipped,
            "passes": self.passes,
            "last_pass": self.last_pass,
            "last_error": self.last_error,
            "current": current,
            "in_flight": len(self.moving),
            "rate": self.rate,
        }


@dataclass(slots=True)
class _Running:
    move: Move
    done: trio.Event = field(default_factory=trio.Event)


class Mover:
    """The mover worker (see the module docstring).  It owns its status
    (``MoverStatus``), which ``tierfs status`` shows as ``mover``."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        policies: FilePolicies,
        movement: DataMovement,
        space: SpaceManager,
        tiers: list[Tier],
        config: MoverConfig,
        requests: CountsRequests,
    ) -> None:
        self.lifecycle = lifecycle
        self.policies = policies
        self.movement = movement
        self.space = space
        self.tiers = tiers
        self.status = MoverStatus(bandwidth=config.bandwidth, interval=config.interval)
        self.interval = config.interval
        self.throttle = Throttle(config.bandwidth)
        self.busy_throttle = Throttle(BUSY_RATE, burst=0.0)
        self.meter = ForegroundMeter(requests, window=BUSY_WINDOW, hold=BUSY_HOLD)
        #: The moves running now, by inode.
        self._running: dict[int, _Running] = {}
        #: Set (and replaced) each time a move ends.
        self._move_ended = trio.Event()
        #: Moves and promotions running; the meter runs while there are any.
        self._copies = 0
        self._copies_started = trio.Event()
        self._meter_scope: trio.CancelScope | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._meter_while_copying)
            nursery.start_soon(self._promote_forever)
            task_status.started()
            while True:
                await self.run_pass()
                self.status.state = "idle"
                gap = min(MIN_PASS_GAP, self.interval)
                await trio.sleep(gap)
                await self.policies.wait_for_work(self.interval - gap)

    async def run_pass(self) -> None:
        if not self.lifecycle.needs_pass():
            return
        self.status.state = "planning"
        moves = await self.lifecycle.plan(settle=True)
        self.status.passes += 1
        self.status.last_pass = time.time()
        if not moves:
            return
        self.status.state = "moving"
        moved_before = self.status.bytes_moved
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for move in moves:
                while not self._may_start(move):  # started in plan order, a few at once
                    await self._move_ended.wait()
                while (earlier := self._running.get(move.ino)) is not None:
                    await earlier.done.wait()  # two moves of one file: in order
                if move.reason in ("watermark", "keep_newest") and self._at_low_mark(move):
                    continue
                running = self._running[move.ino] = _Running(move)
                nursery.start_soon(self._run_move, running)
        self._measure(self.status.bytes_moved - moved_before, started)

    async def _meter_while_copying(self) -> None:
        """Run the meter while moves or promotions run, sleep otherwise."""
        while True:
            await self._copies_started.wait()
            if not self._copies:  # they ended before this task got to run
                self._copies_started = trio.Event()
                continue
            with trio.CancelScope() as self._meter_scope:
                await self.meter.run()
            self._meter_scope = None

    @contextlib.contextmanager
    def _copying(self) -> Iterator[None]:
        """A move or a promotion runs (the meter runs meanwhile)."""
        self._copies += 1
        if self._copies == 1:
            self._copies_started.set()
        try:
            yield
        finally:
            self._copies -= 1
            if not self._copies:
                self._copies_started = trio.Event()
                if self._meter_scope is not None:
                    self._meter_scope.cancel()

    def _may_start(self, move: Move) -> bool:
        """May another move start now (see ``MOVE_ADMISSION``)?"""
        running = [r.move.nbytes for r in self._running.values()]
        return MOVE_ADMISSION.may_start(running, move.nbytes)

    async def _run_move(self, running: _Running) -> None:
        move = running.move
        try:
            with self._copying():
                await self._execute(move)
        finally:
            del self._running[move.ino]
            running.done.set()
            self._move_ended.set()
            self._move_ended = trio.Event()

    def _at_low_mark(self, move: Move) -> bool:
        """Is the move's source tier at its low mark, once the moves running
        from it are done?"""
        src = move.src_tier
        if src is None:
            return False
        tier = self.tiers[src]
        leaving = sum(
            self.movement.residency(ino).get(src, 0)
            for ino, running in self._running.items()
            if running.move.src_tier == src
        )
        return self.space.used(src) - leaving <= mark(tier.capacity, tier.low_watermark)

    async def _throttled(self, nbytes: int) -> None:
        """The configured cap, and ``BUSY_RATE`` while the mount is busy."""
        await self.throttle(nbytes)
        if self.meter.update():
            await self.busy_throttle(nbytes)

    async def _execute(self, move: Move) -> None:
        names = [t.name for t in self.tiers]
        current = CurrentMove(
            path=move.relpath,
            src=names[move.src_tier] if move.src_tier is not None else "bucket",
            dst=names[move.dst_tier] if move.dst_tier is not None else None,
            nbytes=move.nbytes,
            reason=move.reason,
        )

        async def progress(nbytes: int) -> None:
            current.done += nbytes
            await self._throttled(nbytes)

        self.status.moving.append(current)
        try:
            if move.dst_tier is None:
                assert move.src_tier is not None
                dropped = self.movement.evict(move.ino, move.src_tier)
                if dropped:
                    self.status.files_dropped += 1
                    self.status.bytes_dropped += dropped
                return
            if move.src_tier is None:
                fetched = await self.movement.fill(move.ino, move.dst_tier)
                self.status.files_fetched += 1
                self.status.bytes_fetched += fetched
            else:
                moved = await self.movement.relocate(
                    move.ino, move.src_tier, move.dst_tier, throttle=progress
                )
                self.status.files_moved += 1
                self.status.bytes_moved += moved
        except (Busy, NoSpace) as exc:
            self.status.skipped += 1
            log.debug("mover: skipped %s (%s): %s", move.relpath, move.reason, exc)
        except TierfsError as exc:
            self.status.skipped += 1
            self.status.last_error = f"{move.relpath}: {exc}"
            log.warning(
                "mover: %s %s -> %s failed: %s", move.relpath, move.src_tier, move.dst_tier, exc
            )
        finally:
            self.status.moving.remove(current)

    def _measure(self, nbytes: int, started: float) -> None:
        elapsed = time.monotonic() - started
        if elapsed >= RATE_MIN_SECONDS and nbytes:
            self.status.rate = nbytes / elapsed

    # --- promotion --------------------------------------------------------------------------

    async def _promote_forever(self) -> None:
        async for promotion in self.policies.promotion_receive:
            try:
                with self._copying():
                    await self._promote(promotion)
            finally:
                self.policies.promotion_done(promotion.ino)

    async def _promote(self, promotion: Promotion) -> None:
        space = self.space
        tier = self.tiers[promotion.dst]
        nbytes = self.movement.residency(promotion.ino).get(promotion.src, 0)
        if not nbytes:
            return
        if space.used(tier.index) + nbytes > mark(tier.capacity, tier.high_watermark):
            return  # it would push the tier into demotion
        try:
            moved = await self.movement.relocate(
                promotion.ino, promotion.src, promotion.dst, throttle=self._throttled
            )
        except (Busy, NoSpace) as exc:
            log.debug("promotion of inode %d skipped: %s", promotion.ino, exc)
            return
        except TierfsError as exc:
            log.warning("promotion of inode %d failed: %s", promotion.ino, exc)
            return
        self.status.promotions += 1
        self.status.bytes_moved += moved
