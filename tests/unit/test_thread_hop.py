"""tierfs.core.read.thread_hop: results and errors come back to their tasks, the
pool stays within its threads and ends them when idle, and jobs that finish
while the loop is busy are handed back with one wake-up of the loop."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from tierfs.core.read import thread_hop
from tierfs.core.read.thread_hop import ThreadHop


async def test_results_and_errors_reach_their_own_tasks() -> None:
    hop = ThreadHop(4)
    results: dict[int, object] = {}

    async def one(i: int) -> None:
        try:
            results[i] = await hop.run(lambda: i * i if i % 3 else 1 // 0)
        except ZeroDivisionError as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(30):
            nursery.start_soon(one, i)
    for i in range(30):
        if i % 3:
            assert results[i] == i * i
        else:
            assert isinstance(results[i], ZeroDivisionError)


async def test_at_most_max_threads_run_jobs_at_once() -> None:
    hop = ThreadHop(3)
    running = 0
    most = 0
    lock = threading.Lock()
    names: set[str] = set()

    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            names.add(threading.current_thread().name)
        time.sleep(0.02)
        with lock:
            running -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(hop.run, job)
    assert most == 3 and hop.threads <= 3
    assert names == {"tierfs-worker"}


async def test_jobs_that_finish_while_the_loop_is_busy_take_one_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hop = ThreadHop(8)
    wakeups = 0
    real = ThreadHop._reschedule_finished

    def counted(self: ThreadHop, token: trio.lowlevel.TrioToken) -> None:
        nonlocal wakeups
        wakeups += 1
        real(self, token)

    monkeypatch.setattr(ThreadHop, "_reschedule_finished", counted)
    started = threading.Barrier(9)
    done: list[int] = []

    def job(i: int) -> int:
        started.wait()
        return i

    async def one(i: int) -> None:
        done.append(await hop.run(lambda: job(i)))

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
        await trio.sleep(0.05)  # the eight jobs wait at the barrier
        started.wait()  # lets them finish while the loop is held here ...
        time.sleep(0.2)  # ... blocked, so all eight finish meanwhile
    assert sorted(done) == list(range(8))
    assert wakeups == 1


async def test_idle_threads_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_hop, "IDLE_SECONDS", 0.05)
    hop = ThreadHop(4)
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(hop.run, lambda: time.sleep(0.02))
    assert hop.threads > 0
    with trio.fail_after(5):
        while hop.threads:
            await trio.sleep(0.02)
    assert await hop.run(lambda: "again") == "again"  # a new thread starts when needed


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ThreadHop(0)


async def test_a_thread_that_cannot_start_fails_the_call_and_leaves_the_pool_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hop = ThreadHop(2)

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", no_thread)
        with pytest.raises(RuntimeError, match="can't start"):
            await hop.run(lambda: "never")
    assert hop.threads == 0
    assert await hop.run(lambda: "later") == "later"
