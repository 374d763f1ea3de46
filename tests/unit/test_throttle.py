"""The mover's bandwidth cap, on trio's virtual clock."""

from __future__ import annotations

import trio
import trio.testing

from tierfs.workers.throttle import Throttle


def _copy_time(rate: int, chunks: int, chunk: int) -> float:
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def copy() -> float:
        throttle = Throttle(rate)
        start = trio.current_time()
        for _ in range(chunks):
            await throttle(chunk)
        return trio.current_time() - start

    return trio.run(copy, clock=clock)


def test_the_long_run_rate_stays_under_the_cap() -> None:
    # 100 MiB at 10 MiB/s: about 10 s, minus at most the burst allowance.
    elapsed = _copy_time(10 << 20, 100, 1 << 20)
    assert 9.5 <= elapsed <= 10.1, elapsed


def test_no_cap_never_sleeps() -> None:
    assert _copy_time(0, 1000, 1 << 20) == 0.0
