"""Fetch slots and their priority rule: which GET of block data may start now.

Every GET of block data (``Fetcher.fetch``) holds one fetch slot while
it runs; there are ``fetch.concurrency`` slots.  Each fetch has a
priority (``FetchPriority``), which may rise while it waits (a demand read
that needs a block of a waiting preload fetch promotes it) but never falls:

* ``DEMAND``: a read, and the readahead of a sequential reader: a process
  is waiting;
* ``AHEAD``: work just ahead of a reader, which will wait for it soon
  (order-aware prefetch of the next files of an epoch);
* ``BACKGROUND``: nobody waits: preload, pins, promotion.

The rule (``FetchSlots.take``):

1. A DEMAND fetch waits for a slot in arrival order, and only behind other
   demand fetches and the fetches already running.
2. An AHEAD or BACKGROUND fetch never queues for a slot.  It parks, and
   starts only when (a) no DEMAND fetch waits and (b) a slot is free; a
   BACKGROUND fetch also only when (c) fewer than ``background_max`` (half
   of the slots, at least 1) non-demand fetches run: the other half is
   always free for demand.  A *short* BACKGROUND fetch (a GET of at most
   ``SHORT_FETCH_BYTES``: a small file of a preload) is held to all the
   slots instead of half: it ends within one round trip, so a demand fetch
   that comes while short ones fill every slot waits for the first of them
   to end (with 32 GETs in flight, a small share of one), and (a) then holds every
   other one back.  Why: a preload of small files is bound by the GETs it
   keeps in flight, not by bytes (see "Short fetches" below).  AHEAD
   fetches are not held to (c): the readers
   they run for will wait for them, and the prefetcher bounds how many it
   starts (all the slots by default; see
   ``tierfs.workers.prefetch`` for why a window must keep more GETs in
   flight than its readers do).
3. AHEAD before BACKGROUND: no BACKGROUND fetch starts while an AHEAD one
   waits.
4. Demand is *active* while a DEMAND fetch waits or runs, and for
   ``DEMAND_QUIET`` (0.5 s) after the last one ended.  While demand is
   active, a BACKGROUND fetch starts only when no other BACKGROUND fetch
   runs and none ended in the last ``BACKGROUND_TRICKLE`` (1 s): a trickle,
   so that a preload still moves under a reader that never pauses (a
   trickle GET asks for at most 8 MiB).  BACKGROUND GETs already running
   when demand starts give way: the block cache ends each after the block
   it is reading (``demand_present``, asked from the fetch thread) and
   fetches the rest later (see "Priority" in
   :mod:`tierfs.core.read.fetcher`).  AHEAD fetches are
   not held back by demand: they run exactly while a reader reads, for it.
   Once demand has been quiet for ``DEMAND_QUIET``, BACKGROUND work widens
   again to ``background_max``: a preload alone keeps its full throughput.

Why these rules, in short (the measurements, dated, are in
docs/benchmarks.md, "Fetch slots: the measurements behind the rules"):
a demand read waits for no slot under rules 1-3 alone, yet its GET shares
the S3 server, the loopback and the disk with the background GETs in
flight, so only fewer background bytes in flight (rule 4) keep it near its
idle time; half of the slots for BACKGROUND work was the best measured
trade for a big preload; 16 MiB BACKGROUND GETs are among the cheapest
patterns for the server; and short GETs (small files) are bound by how
many are in flight, so they may take every slot.

Waking.  Parked fetches wait in one FIFO queue per priority, and only as
many are woken as may start (``_wake``); waking every parked fetch on
every change (as a first version did) made re-checks most of the event
loop's work during a preload of a big file (hundreds of parked 8 MiB runs).

States of one fetch, and the counters that hold them:

    DEMAND:      waiting (``demand_waiting``) --slot--> running
                 (``running[DEMAND]``) --give--> done (``demand_ended`` = now)
    AHEAD/BACKGROUND: parked (in ``_parked[p]``) --``_wake``--> woken
                 (``_woken[p]``) --rules 2-4 hold--> running (``running[p]``)
                 --give--> done (BACKGROUND: ``background_ended`` = now)
    woken --rules 2-4 do not hold (any more)--> parked, at the head
    parked/woken --priority rises--> looks again at the new priority
                 (DEMAND: waiting)

``_wake`` runs whenever a condition may have changed: a slot given back,
the last waiting demand fetch got its slot, the last parked AHEAD fetch
left, a priority rose (``priority_raised`` wakes the raised fetch itself),
and by the clock: ``run`` (a task) calls it when rule 4 would let a
BACKGROUND fetch start by time alone (``_rule4_ends``).  That timer is
armed whenever a BACKGROUND fetch parks, too: one that parks just after
the last slot was given back (the rest of a BACKGROUND run whose GET
ended early, see ``fetcher``) would otherwise wait for an event that never
comes.  A woken fetch
looks again when it runs; if it still may not start it parks again at the
head of its queue, and whatever took its room wakes the next one when it
ends.  All of it runs on the one trio loop (no locks); a slot is given
back by the task that took it (``trio.CapacityLimiter`` checks the
borrower).
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Callable

import trio

#: A BACKGROUND GET of at most this many bytes is *short*: it may use any
#: free slot, not only ``background_max`` (rule 2c, see the docstring).
SHORT_FETCH_BYTES = 1024 * 1024
#: Seconds after the last demand fetch ended during which demand still counts as active.
DEMAND_QUIET = 0.5
#: While demand is active, a BACKGROUND fetch starts only when none runs and
#: none ended in the last this many seconds (so a preload still moves under
#: a reader that never pauses).
BACKGROUND_TRICKLE = 1.0


class FetchPriority(enum.IntEnum):
    """Who waits for a fetch; a lower value goes first (see the module docstring)."""

    DEMAND = 0
    AHEAD = 1
    BACKGROUND = 2


class _Waiter:
    """A parked AHEAD or BACKGROUND fetch."""

    __slots__ = ("event", "priority", "priority_of", "short")

    def __init__(
        self, priority_of: Callable[[], FetchPriority], priority: FetchPriority, short: bool
    ) -> None:
        self.event = trio.Event()
        self.priority_of = priority_of
        #: The queue it is parked in.
        self.priority = priority
        #: A short fetch (rule 2c).
        self.short = short


class FetchSlots:
    """The fetch slots of one block cache, handed out by the priority rule.

    ``run`` (a task that lives as long as the slots are used) wakes the
    BACKGROUND fetches held back by rule 4 when demand has been quiet for
    ``demand_quiet``."""

    def __init__(
        self,
        concurrency: int,
        *,
        demand_quiet: float = DEMAND_QUIET,
        background_trickle: float = BACKGROUND_TRICKLE,
    ) -> None:
        self.concurrency = concurrency
        #: Non-demand fetches that may run at once (rule 2c).
        self.background_max = max(1, concurrency // 2)
        self.demand_quiet = demand_quiet
        self.background_trickle = background_trickle
        self._limiter = trio.CapacityLimiter(concurrency)
        #: Running fetches, per priority (index = ``FetchPriority``).
        self.running = [0] * len(FetchPriority)
        #: DEMAND fetches waiting for a slot.
        self.demand_waiting = 0
        #: ``trio.current_time()`` when the last DEMAND fetch gave its slot back.
        self.demand_ended = -math.inf
        #: ``trio.current_time()`` when the last BACKGROUND fetch gave its slot back.
        self.background_ended = -math.inf
        #: Parked fetches, in arrival order, per priority (AHEAD, BACKGROUND).
        self._parked: dict[FetchPriority, collections.deque[_Waiter]] = {
            FetchPriority.AHEAD: collections.deque(),
            FetchPriority.BACKGROUND: collections.deque(),
        }
        #: Woken (no longer parked) but not yet looked again, per priority.
        self._woken = [0] * len(FetchPriority)
        #: When ``run`` must wake the BACKGROUND fetches held back by rule 4.
        self._timer_deadline = math.inf
        self._timer_lot = trio.lowlevel.ParkingLot()

    @property
    def parked(self) -> int:
        """AHEAD and BACKGROUND fetches waiting to start."""
        return sum(len(q) for q in self._parked.values())

    def demand_active(self) -> bool:
        """Rule 4: a DEMAND fetch waits or runs, or one ended less than
        ``demand_quiet`` seconds ago."""
        return (
            self.demand_waiting > 0
            or self.running[FetchPriority.DEMAND] > 0
            or trio.current_time() < self.demand_ended + self.demand_quiet
        )

    def demand_present(self) -> bool:
        """A DEMAND fetch waits or runs.  Safe to ask from a fetch thread
        (two counters read; a stale answer only delays a BACKGROUND GET's
        giving way by one block)."""
        return self.demand_waiting > 0 or self.running[FetchPriority.DEMAND] > 0

    def _room(self, priority: FetchPriority, short: bool = False) -> int:
        """How many more fetches of ``priority`` (AHEAD or BACKGROUND; a
        short one, rule 2c) rules 2-4 let start now, not counting the
        parked ones."""
        if self.demand_waiting:
            return 0
        ahead, background = FetchPriority.AHEAD, FetchPriority.BACKGROUND
        room = self._limiter.available_tokens
        if priority is background:
            limit = self.concurrency if short else self.background_max
            room = min(room, limit - self.running[ahead] - self.running[background])
            if self._parked[ahead] or self._woken[ahead]:
                return 0
            if self.demand_active():
                if self.running[background] or trio.current_time() < (
                    self.background_ended + self.background_trickle
                ):
                    return 0
                room = min(room, 1)
        return max(0, int(room))

    def _rule4_ends(self) -> float:
        """When rule 4 may next let a BACKGROUND fetch start by the clock
        alone: when demand has been quiet long enough, or the trickle is
        due; inf if only another fetch's end can (its ``give`` wakes)."""
        at = math.inf
        if not (self.demand_waiting or self.running[FetchPriority.DEMAND]):
            at = self.demand_ended + self.demand_quiet
        if not self.running[FetchPriority.BACKGROUND]:
            at = min(at, self.background_ended + self.background_trickle)
        return at

    def _wake(self) -> None:
        """Wake as many parked fetches as may start now, AHEAD ones first
        (each looks again when it runs: one that still may not start parks
        again at the head of its queue)."""
        for priority in (FetchPriority.AHEAD, FetchPriority.BACKGROUND):
            queue = self._parked[priority]
            while queue and self._room(priority, queue[0].short) > self._woken[priority]:
                waiter = queue.popleft()
                self._woken[priority] += 1
                waiter.event.set()
        self._arm_timer()

    def _arm_timer(self) -> None:
        """If a BACKGROUND fetch is parked, make ``run`` wake it when rule 4
        may let it start by the clock alone."""
        if self._parked[FetchPriority.BACKGROUND]:
            wake_at = self._rule4_ends()
            if trio.current_time() < wake_at < self._timer_deadline:
                self._timer_deadline = wake_at
                self._timer_lot.unpark_all()

    async def run(self) -> None:
        """Wake what rule 4 held back when its time comes; runs until cancelled."""
        while True:
            with trio.move_on_at(self._timer_deadline):
                await self._timer_lot.park()  # an earlier deadline was set
                continue
            self._timer_deadline = math.inf
            self._wake()

    async def take(
        self, priority_of: Callable[[], FetchPriority], *, short: bool = False
    ) -> FetchPriority:
        """Wait for a slot by the rule; ``priority_of()`` is the fetch's
        priority now (it may rise meanwhile: call ``priority_raised``);
        ``short``: its GET is at most ``SHORT_FETCH_BYTES`` (rule 2c).
        Returns the priority the slot was taken at, for ``give``, which
        the same task must call."""
        woken = False
        while (priority := priority_of()) is not FetchPriority.DEMAND:
            queue = self._parked[priority]
            # A woken fetch uses the room it was woken for; a new one must
            # not take that room, nor pass those parked before it.
            room = self._room(priority, short) - (0 if woken else self._woken[priority])
            if (woken or not queue) and room > 0:
                self._limiter.acquire_nowait()
                self.running[priority] += 1
                self._wake()  # there may be room for more
                return priority
            waiter = _Waiter(priority_of, priority, short)
            if woken:
                queue.appendleft(waiter)  # it keeps its turn
            else:
                queue.append(waiter)
            # Held back by rule 4 with nothing else to come (no fetch running
            # whose end would wake it): only the clock will.
            self._arm_timer()
            try:
                await waiter.event.wait()
            except BaseException:
                if waiter.event.is_set():
                    self._woken[waiter.priority] -= 1
                    self._wake()  # its turn goes to the next one
                else:
                    self._parked[waiter.priority].remove(waiter)
                    if (
                        waiter.priority is FetchPriority.AHEAD
                        and not self._parked[FetchPriority.AHEAD]
                    ):
                        self._wake()  # rule 3 no longer holds BACKGROUND back
                raise
            self._woken[waiter.priority] -= 1
            woken = True
        self.demand_waiting += 1
        try:
            await self._limiter.acquire()
        finally:
            self.demand_waiting -= 1
            if not self.demand_waiting:
                self._wake()
        self.running[FetchPriority.DEMAND] += 1
        return FetchPriority.DEMAND

    def give(self, taken: FetchPriority) -> None:
        """Give back the slot that ``take`` returned ``taken`` for."""
        self._limiter.release()
        self.running[taken] -= 1
        if taken is FetchPriority.DEMAND:
            self.demand_ended = trio.current_time()
        elif taken is FetchPriority.BACKGROUND:
            self.background_ended = trio.current_time()
        self._wake()

    def priority_raised(self) -> None:
        """Some parked fetch's priority rose: wake it, to look again."""
        for priority, queue in self._parked.items():
            raised = [w for w in queue if w.priority_of() is not priority]
            for waiter in raised:
                queue.remove(waiter)
                self._woken[priority] += 1
                waiter.event.set()
        self._wake()
