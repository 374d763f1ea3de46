"""StoreThreads: an ordinary cancellation waits for the store thread; abandon() does not."""

from __future__ import annotations

import threading
import time

import trio

from tierfs.core.state.store_threads import StoreThreads


def blocking_call(release: threading.Event, finished: list[str]) -> str:
    release.wait(timeout=10)
    finished.append("done")
    return "answer"


async def test_an_ordinary_cancellation_waits_for_the_thread() -> None:
    threads = StoreThreads()
    limiter = trio.CapacityLimiter(2)
    release = threading.Event()
    finished: list[str] = []
    with trio.move_on_after(0.2) as scope:
        await trio.sleep(0)
        started = time.monotonic()

        async def release_later() -> None:
            await trio.to_thread.run_sync(time.sleep, 0.5)
            release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            got = await threads.run(lambda: blocking_call(release, finished), limiter=limiter)
            assert got == "answer"
            await trio.sleep(0)  # the deadline's cancellation lands here
    # The scope's deadline passed at 0.2 s, but the call went on until its thread returned.
    assert finished == ["done"]
    assert time.monotonic() - started >= 0.45
    assert scope.cancelled_caught
    assert threads.running == 0 and not threads.abandoned


async def test_abandon_stops_waiting_at_once_and_for_later_calls() -> None:
    threads = StoreThreads()
    limiter = trio.CapacityLimiter(2)
    release = threading.Event()
    finished: list[str] = []
    outcome: list[str] = []

    async def call() -> None:
        try:
            await threads.run(lambda: blocking_call(release, finished), limiter=limiter)
        except trio.Cancelled:
            outcome.append("cancelled")
            raise

    try:
        with trio.CancelScope() as outer:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                while threads.running == 0:
                    await trio.sleep(0.01)
                started = time.monotonic()
                outer.cancel()
                threads.abandon()
        took = time.monotonic() - started
        assert outcome == ["cancelled"]
        assert took < 0.5, took
        assert finished == []  # the thread is still waiting: it was left behind
        assert threads.abandoned and threads.left_behind == 1

        # After abandon(), a new call does not wait for its thread either.
        with trio.CancelScope() as later:
            later.cancel()
            started = time.monotonic()
            await threads.run(lambda: blocking_call(release, finished), limiter=limiter)
        assert later.cancelled_caught
        assert time.monotonic() - started < 0.5
    finally:
        release.set()
