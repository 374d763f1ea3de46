"""FetchSlots: the priority rule of block fetches (tierfs/core/state/fetch_slots.py).

Fetches are trio tasks that take a slot, hold it until told to stop, and
give it back; the clock is a MockClock, so the rule's timing (the quiet
period after demand, the trickle) is checked to the millisecond.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from tierfs.core.state.fetch_slots import FetchPriority, FetchSlots

DEMAND, AHEAD, BACKGROUND = FetchPriority.DEMAND, FetchPriority.AHEAD, FetchPriority.BACKGROUND


class Fetch:
    """One fetch: takes a slot at ``priority``, records when, holds it until ``end``."""

    def __init__(
        self,
        slots: FetchSlots,
        name: str,
        priority: FetchPriority,
        log: list[str],
        short: bool = False,
    ):
        self.slots = slots
        self.short = short
        self.name = name
        self.priority = priority
        self.log = log
        self.started_at: float | None = None
        self.end = trio.Event()
        self.cancel_scope = trio.CancelScope()

    async def run(self) -> None:
        with self.cancel_scope:
            taken = await self.slots.take(lambda: self.priority, short=self.short)
            self.started_at = trio.current_time()
            self.log.append(self.name)
            try:
                await self.end.wait()
            finally:
                self.slots.give(taken)


def run_with_clock(test: Callable[[trio.testing.MockClock], Awaitable[None]]) -> None:
    clock = trio.testing.MockClock(autojump_threshold=0.01)
    trio.run(test, clock, clock=clock)


async def start(
    nursery: trio.Nursery, slots: FetchSlots, log: list[str], *specs: str
) -> list[Fetch]:
    """Fetches named like "b1" (the letter is the priority: d, a, b; s is a
    short BACKGROUND fetch), each started once the previous one took its
    slot or parked."""
    kinds = {"d": DEMAND, "a": AHEAD, "b": BACKGROUND, "s": BACKGROUND}
    fetches = [Fetch(slots, name, kinds[name[0]], log, name[0] == "s") for name in specs]
    for fetch in fetches:
        nursery.start_soon(fetch.run)
        await trio.testing.wait_all_tasks_blocked()
    return fetches


def test_background_work_holds_at_most_half_the_slots_and_demand_gets_the_rest() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(8)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            background = await start(nursery, slots, log, *(f"b{i}" for i in range(10)))
            await trio.testing.wait_all_tasks_blocked()
            assert log == [f"b{i}" for i in range(4)]  # half of 8, in arrival order
            assert slots.parked == 6
            demand = await start(nursery, slots, log, "d0", "d1", "d2", "d3", "d4")
            await trio.testing.wait_all_tasks_blocked()
            assert log[4:] == ["d0", "d1", "d2", "d3"]  # the free half
            assert slots.demand_waiting == 1
            background[0].end.set()  # its slot goes to the waiting demand fetch
            await trio.testing.wait_all_tasks_blocked()
            assert log[8:] == ["d4"]
            for fetch in demand:
                fetch.end.set()
            for fetch in background[1:4]:
                fetch.end.set()
            # Demand just ended: quiet for 0.5 s, then the background widens to 4 again.
            await trio.testing.wait_all_tasks_blocked()
            assert slots.running[BACKGROUND] <= 1
            await trio.sleep(0.6)
            assert slots.running[BACKGROUND] == 4
            assert sorted(log[9:]) == [f"b{i}" for i in range(4, 8)]
            nursery.cancel_scope.cancel()

    run_with_clock(main)


def test_while_demand_is_active_background_work_is_a_trickle() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(8, demand_quiet=0.5, background_trickle=1.0)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            (reader,) = await start(nursery, slots, log, "d0")
            await trio.testing.wait_all_tasks_blocked()
            t0 = trio.current_time()
            background = await start(nursery, slots, log, "b0", "b1", "b2")
            await trio.testing.wait_all_tasks_blocked()
            # No BACKGROUND fetch ended yet: one may start, and only one.
            assert log == ["d0", "b0"]
            await trio.sleep(0.3)
            background[0].end.set()
            # The next one waits for 1 s after b0 ended, while demand goes on.
            await trio.sleep(0.9)
            assert log == ["d0", "b0"]
            await trio.sleep(0.2)
            assert log == ["d0", "b0", "b1"]
            assert background[1].started_at == pytest.approx(t0 + 1.3, abs=0.02)
            background[1].end.set()  # at t0 + 1.4: the next trickle is due at t0 + 2.4
            # Demand ends at t0 + 1.5: after the quiet period, the rest starts at once.
            await trio.sleep(0.1)
            reader.end.set()
            await trio.sleep(0.45)
            assert log == ["d0", "b0", "b1"]
            await trio.sleep(0.1)
            assert log == ["d0", "b0", "b1", "b2"]
            assert background[2].started_at == pytest.approx(t0 + 2.0, abs=0.02)
            nursery.cancel_scope.cancel()

    run_with_clock(main)


def test_background_fetch_parked_after_every_slot_came_back_starts_by_the_clock() -> None:
    """A BACKGROUND fetch that parks under rule 4 when nothing runs any more
    (the demand and the last background fetch gave their slots back just
    before) is started by the clock, not left waiting for an event."""

    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(8, demand_quiet=0.5, background_trickle=1.0)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            reader, first = await start(nursery, slots, log, "d0", "b0")
            assert log == ["d0", "b0"]
            reader.end.set()
            await trio.testing.wait_all_tasks_blocked()
            first.end.set()  # the trickle is due 1 s from now, demand quiet in 0.5 s
            await trio.testing.wait_all_tasks_blocked()
            t0 = trio.current_time()
            (late,) = await start(nursery, slots, log, "b1")
            assert log == ["d0", "b0"]
            await trio.sleep(2)
            assert log == ["d0", "b0", "b1"]
            assert late.started_at == pytest.approx(t0 + 0.5, abs=0.02)
            nursery.cancel_scope.cancel()

    run_with_clock(main)


def test_short_background_fetches_use_every_slot_and_demand_takes_the_first_freed() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(8)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            short = await start(nursery, slots, log, *(f"s{i}" for i in range(12)))
            await trio.testing.wait_all_tasks_blocked()
            assert log == [f"s{i}" for i in range(8)]  # all 8 slots, not half
            assert slots.parked == 4
            for fetch in short[:6]:
                fetch.end.set()
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(log[8:]) == ["s10", "s11", "s8", "s9"]  # the parked ones
            assert slots.running[BACKGROUND] == 6
            # Two slots are free, but a long BACKGROUND fetch is still held
            # to half of them (6 BACKGROUND fetches run).
            await start(nursery, slots, log, "b0")
            await trio.testing.wait_all_tasks_blocked()
            assert "b0" not in log
            await start(nursery, slots, log, "s12", "s13")
            await trio.testing.wait_all_tasks_blocked()
            assert "s12" not in log  # parked behind b0, which keeps its turn
            # Demand takes a free slot at once, and the first freed one next.
            readers = await start(nursery, slots, log, "d0", "d1", "d2")
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(log[12:]) == ["d0", "d1"]
            assert slots.demand_waiting == 1
            short[6].end.set()
            await trio.testing.wait_all_tasks_blocked()
            assert log[14:] == ["d2"]
            # While demand is active the rest is a trickle: as short fetches
            # end, none of the parked ones starts while another runs.
            for fetch in short[7:]:
                fetch.end.set()
                await trio.testing.wait_all_tasks_blocked()
            assert log[15:] == []
            for reader in readers:
                reader.end.set()
            await trio.sleep(0.6)  # demand quiet: the parked ones start
            assert sorted(log[15:]) == ["b0", "s12", "s13"]
            nursery.cancel_scope.cancel()

    run_with_clock(main)


def test_ahead_goes_before_background_and_is_not_held_back_by_demand() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(4)  # 2 slots for BACKGROUND work
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            first = await start(nursery, slots, log, "b0", "b1")
            await trio.testing.wait_all_tasks_blocked()
            await start(nursery, slots, log, "b2")
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["b0", "b1"]  # b2 is held to BACKGROUND's half
            # AHEAD work is not held to that half: it takes the free slots.
            await start(nursery, slots, log, "a0", "a1", "a2")
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["b0", "b1", "a0", "a1"]
            await start(nursery, slots, log, "d0")
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["b0", "b1", "a0", "a1"]  # no slot free
            for fetch in first:
                fetch.end.set()
            await trio.testing.wait_all_tasks_blocked()
            # The first freed slot goes to the waiting demand fetch, the second
            # to AHEAD work, which active demand does not hold back; b2 (parked
            # before a2) still waits.
            assert log == ["b0", "b1", "a0", "a1", "d0", "a2"]
            nursery.cancel_scope.cancel()

    run_with_clock(main)


def test_a_raised_priority_is_served_at_once() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(2)  # 1 slot for non-demand work
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            running = await start(nursery, slots, log, "b0", "d0")
            await trio.testing.wait_all_tasks_blocked()
            waiting = await start(nursery, slots, log, "b1", "b2", "b3")
            await trio.testing.wait_all_tasks_blocked()
            assert slots.parked == 3
            waiting[2].priority = DEMAND  # a read needs b3's blocks
            slots.priority_raised()
            running[1].end.set()  # a slot frees for demand
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["b0", "d0", "b3"]
            assert slots.parked == 2
            nursery.cancel_scope.cancel()

    run_with_clock(main)


def test_a_slot_given_back_wakes_one_parked_fetch_and_cancelled_ones_leave_no_trace() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        slots = FetchSlots(4)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.run)
            fetches = await start(nursery, slots, log, *(f"b{i}" for i in range(50)))
            await trio.testing.wait_all_tasks_blocked()
            assert slots.parked == 48
            fetches[10].cancel_scope.cancel()  # parked, then cancelled
            fetches[2].cancel_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert slots.parked == 46
            fetches[0].end.set()
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["b0", "b1", "b3"]  # one woken for the one free slot, in order
            assert slots.parked == 45
            assert slots.running[BACKGROUND] == 2
            for fetch in fetches:
                fetch.end.set()
            await trio.testing.wait_all_tasks_blocked()
            assert len(log) == 48
            assert slots.parked == 0 and slots.running == [0, 0, 0]
            nursery.cancel_scope.cancel()

    run_with_clock(main)
