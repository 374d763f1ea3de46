"""The worker supervisor: restarts with a growing pause, counts, fatal errors, injection.

On trio's mock clock (autojump): the pauses cost no real time."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from tierfs.core.state.supervisor import (
    FatalWorkerError,
    InjectedWorkerFault,
    Supervisor,
    parse_injections,
)


async def test_a_failing_worker_is_restarted_with_a_doubling_pause(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    supervisor = Supervisor(pause_min=1.0, pause_max=4.0, inject="")
    starts: list[float] = []

    async def flaky() -> None:
        starts.append(trio.current_time())
        if len(starts) <= 4:
            raise KeyError(f"boom {len(starts)}")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        supervisor.start_soon(nursery, "flaky", flaky)
        await trio.sleep(100)
        record = supervisor.workers["flaky"]
        assert record.running and record.errors == 4 and record.restarts == 4
        assert record.last_error == "KeyError: 'boom 4'"
        assert supervisor.restarts == 4
        nursery.cancel_scope.cancel()
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(starts)]
    assert gaps == [1.0, 2.0, 4.0, 4.0], "pause doubles from pause_min up to pause_max"


async def test_a_worker_that_returns_is_done_and_fatal_errors_pass_through(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    supervisor = Supervisor(pause_min=0.5, inject="")
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1

    async def fatal() -> None:
        raise FatalWorkerError("metadata group commit failed")

    async with trio.open_nursery() as nursery:
        supervisor.start_soon(nursery, "once", once)
    assert runs == 1 and supervisor.workers["once"].restarts == 0
    with pytest.RaisesGroup(pytest.RaisesExc(FatalWorkerError, match="group commit")):
        async with trio.open_nursery() as nursery:
            supervisor.start_soon(nursery, "fatal", fatal)
    assert supervisor.workers["fatal"].restarts == 0


async def test_start_reports_started_once_even_when_the_first_run_fails_before(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    supervisor = Supervisor(pause_min=0.5, inject="")
    runs = 0

    async def worker(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise OSError("failed before it started")
        task_status.started()
        if runs == 2:
            raise OSError("failed after it started")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await supervisor.start(nursery, "worker", worker)
        assert runs == 2
        await trio.sleep(5)
        assert runs == 3 and supervisor.workers["worker"].restarts == 2
        nursery.cancel_scope.cancel()


async def test_an_injected_fault_hits_a_running_worker_once(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    supervisor = Supervisor(pause_min=0.5, inject="loop:2,short")
    ticks = 0
    short_runs = 0
    cleaned_up = 0

    async def loop() -> None:
        nonlocal ticks, cleaned_up
        try:
            while True:
                await trio.sleep(0.5)
                ticks += 1
        finally:
            cleaned_up += 1

    async def short() -> None:
        nonlocal short_runs
        short_runs += 1

    async with trio.open_nursery() as nursery:
        supervisor.start_soon(nursery, "loop", loop)
        supervisor.start_soon(nursery, "short", short)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    loop_record, short_record = supervisor.workers["loop"], supervisor.workers["short"]
    assert loop_record.errors == 1 and loop_record.restarts == 1 and cleaned_up == 2
    assert "InjectedWorkerFault" in loop_record.last_error
    assert 3 <= ticks <= 19, "it ran before the fault and again after the restart"
    assert short_record.errors == 1 and short_runs == 2, "a one-shot worker gets it at its end"


def test_parse_injections() -> None:
    assert parse_injections("a, b:0.5,,") == {"a": 0.2, "b": 0.5}
    assert parse_injections(None) == {}
    for bad in ("a:x", ":1", "a:-1", "a:inf"):
        with pytest.raises(ValueError, match="TIERFS_TEST_WORKER_FAULTS"):
            parse_injections(bad)


def test_injected_fault_is_a_plain_exception() -> None:
    assert issubclass(InjectedWorkerFault, Exception)
    assert not issubclass(InjectedWorkerFault, FatalWorkerError)
