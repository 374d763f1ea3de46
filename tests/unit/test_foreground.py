"""ForegroundMeter with short windows and a hold (the mover's), on trio's mock clock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio

from tierfs.workers.foreground import BUSY_REQUESTS_PER_SECOND, ForegroundMeter
from tierfs.workers.throttle import Throttle

WINDOW, HOLD = 0.1, 0.5


async def test_a_reader_is_seen_within_one_window_and_held_after_it_stops(
    autojump_clock: Any,
) -> None:
    fs = SimpleNamespace(requests=0)
    meter = ForegroundMeter(fs, window=WINDOW, hold=HOLD)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(meter.run)
        await trio.sleep(1.0)
        assert not meter.busy  # no requests
        # A reader starts: 3x the busy rate.
        started = trio.current_time()
        while not meter.busy:
            fs.requests += int(3 * BUSY_REQUESTS_PER_SECOND * 0.01)
            await trio.sleep(0.01)
        assert trio.current_time() - started <= 2 * WINDOW + 1e-9
        for _ in range(100):  # one second of reading: busy throughout
            fs.requests += int(3 * BUSY_REQUESTS_PER_SECOND * 0.01)
            await trio.sleep(0.01)
            assert meter.busy
        # It stops: still busy for HOLD, idle within HOLD + 2 windows.
        stopped = trio.current_time()
        while meter.busy:
            await trio.sleep(0.01)
        assert HOLD <= trio.current_time() - stopped <= HOLD + 2 * WINDOW + 1e-9
        nursery.cancel_scope.cancel()


async def test_a_slow_trickle_of_requests_is_not_busy(autojump_clock: Any) -> None:
    fs = SimpleNamespace(requests=0)
    meter = ForegroundMeter(fs, window=WINDOW, hold=HOLD)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(meter.run)
        for _ in range(300):
            fs.requests += int(BUSY_REQUESTS_PER_SECOND * 0.01 / 2)  # half the busy rate
            await trio.sleep(0.01)
            assert not meter.busy
        nursery.cancel_scope.cancel()


async def test_the_throttle_shares_its_rate_between_concurrent_copies(autojump_clock: Any) -> None:
    throttle = Throttle(100 << 20, burst=0.1)
    copied = [0, 0, 0]

    async def copy(i: int) -> None:
        while True:
            await throttle(8 << 20)
            copied[i] += 8 << 20

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(copy, i)
        await trio.sleep(10.0)
        nursery.cancel_scope.cancel()
    # 10 s at 100 MiB/s, plus the burst and one chunk per copy.
    assert sum(copied) <= (1000 + 10 + 3 * 8) << 20
    assert sum(copied) >= 950 << 20
