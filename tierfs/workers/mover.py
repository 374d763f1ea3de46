"""The mover: carries out the lifecycle's plan in the background.

States (``status.mover.state``): ``starting`` -> ``planning`` -> ``moving``
-> ``idle`` -> (``interval`` passes, or something wakes it: a tier so
full that new blocks spill past it, a pin, a reload; never sooner than
``MIN_PASS_GAP`` after the last pass) -> ``planning`` ...

One pass: ``Lifecycle.plan()`` (the planner over the facts of the moment),
then the moves in plan order, one at a time, each through the data-movement
API (``core.movement``): a relocate (copy -> verify -> switch in one LMDB
transaction -> delete the old copy), an evict (clean copies only), or a
fill (pins).  Before each watermark move the source tier is checked again:
once it is at or below its low mark, the rest of that tier's watermark moves
are skipped.  A move that finds the file busy (opened for writing, an
upload running, written meanwhile) or no room is skipped and counted; the
next pass plans it again if it still applies.  Nothing is retried in a loop.

Bandwidth: every copy goes through one ``Throttle`` (``[mover]
bandwidth``), promotions included, so the mover never takes more than its
cap from training I/O.  On top of that it yields to the mount, as the
uploader does: while FUSE requests come fast (``ForegroundMeter``, the
uploader's measure), its copies run at most ``BUSY_RATE``, whatever the cap
(measured here with tiers and reader on one disk: an uncapped mover halved
sequential training reads, one at 50 MiB/s cost them nothing).  Copies and hashing run in threads, so the event
loop keeps serving reads while a move runs.

Promotions: a second task takes files from ``Lifecycle.promotions`` (queued
by reads served from a slower tier than the file's placement) and copies
them up, only while the target tier stays below its high watermark after
the copy, so that promotion never makes the next pass demote.

Crash safety is the data-movement API's (see ``core.movement``): a kill -9
at any point loses nothing and leaves no block indexed twice.
"""

from __future__ import annotations

import logging
import time

import trio

from tierfs.core import TierFS
from tierfs.core.lifecycle import CurrentMove, Lifecycle, Promotion
from tierfs.errors import Busy, NoSpace, TierfsError
from tierfs.policy.planner import Move
from tierfs.policy.watermarks import mark

from .throttle import Throttle
from .uploader import ForegroundMeter

log = logging.getLogger(__name__)

#: A move shorter than this does not update the measured rate.
RATE_MIN_SECONDS = 0.05
#: Seconds between the end of a pass and the start of the next, at least.
MIN_PASS_GAP = 0.5
#: Bytes per second the mover copies at most while the mount is busy.
BUSY_RATE = 50 << 20


class Mover:
    def __init__(self, fs: TierFS) -> None:
        self.fs = fs
        self.lifecycle: Lifecycle = fs.lifecycle
        self.movement = fs.movement
        self.status = self.lifecycle.status
        self.interval = fs.config.mover.interval
        self.throttle = Throttle(fs.config.mover.bandwidth)
        self.busy_throttle = Throttle(BUSY_RATE)
        self.meter = ForegroundMeter(fs)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._promote_forever)
            task_status.started()
            while True:
                await self.run_pass()
                self.status.state = "idle"
                gap = min(MIN_PASS_GAP, self.interval)
                await trio.sleep(gap)
                await self.lifecycle.wait_for_work(self.interval - gap)

    async def run_pass(self) -> None:
        if not self.lifecycle.needs_pass():
            return
        self.status.state = "planning"
        moves = await self.lifecycle.plan()
        self.status.passes += 1
        self.status.last_pass = time.time()
        if moves:
            self.status.state = "moving"
        for move in moves:
            if move.reason in ("watermark", "keep_newest") and self._at_low_mark(move):
                continue
            await self._execute(move)
            await trio.sleep(0)  # let readers in between moves

    def _at_low_mark(self, move: Move) -> bool:
        if move.src_tier is None:
            return False
        tier = self.fs.tiers[move.src_tier]
        return self.fs.space.used(tier.index) <= mark(tier.capacity, tier.low_watermark)

    async def _progress(self, nbytes: int) -> None:
        current = self.status.current
        if current is not None:
            current.done += nbytes
        await self._throttled(nbytes)

    async def _throttled(self, nbytes: int) -> None:
        """The configured cap, and ``BUSY_RATE`` while the mount is busy."""
        await self.throttle(nbytes)
        if self.meter.update():
            await self.busy_throttle(nbytes)

    async def _execute(self, move: Move) -> None:
        names = [t.name for t in self.fs.tiers]
        self.status.current = CurrentMove(
            path=move.relpath,
            src=names[move.src_tier] if move.src_tier is not None else "bucket",
            dst=names[move.dst_tier] if move.dst_tier is not None else None,
            nbytes=move.nbytes,
            reason=move.reason,
        )
        started = time.monotonic()
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
                    move.ino, move.src_tier, move.dst_tier, throttle=self._progress
                )
                self.status.files_moved += 1
                self.status.bytes_moved += moved
                self._measure(moved, started)
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
            self.status.current = None

    def _measure(self, nbytes: int, started: float) -> None:
        elapsed = time.monotonic() - started
        if elapsed >= RATE_MIN_SECONDS and nbytes:
            self.status.rate = nbytes / elapsed

    # --- promotion --------------------------------------------------------------------------

    async def _promote_forever(self) -> None:
        async for promotion in self.lifecycle.promotion_receive:
            try:
                await self._promote(promotion)
            finally:
                self.lifecycle.promotion_done(promotion.ino)

    async def _promote(self, promotion: Promotion) -> None:
        space = self.fs.space
        tier = self.fs.tiers[promotion.dst]
        nbytes = self.fs.meta.residency(promotion.ino).get(promotion.src, 0)
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
