"""An idle daemon leaves its event loop asleep: its workers
wake only when there is something to do, counted as trio task steps (an
instrument), not timed.  The periodic ones used to wake it about 17 times a
second for nothing: the group committer five, the mover's foreground meter
ten, the prefetcher's hold expiry one, the uploader one.  What is left is
the uploader's look at the journal (once a second) and the housekeeping
(every few seconds).  A write still reaches the disk within the group
commit interval."""

from __future__ import annotations

import collections
from typing import Any

import trio

from tierfs.core.upkeep import COMMIT_INTERVAL
from tierfs.workers.wiring import dir_readahead_for, mover_for, prefetcher_for

#: How long the daemon is watched idle (seconds) ...
IDLE_SECONDS = 2.0
#: ... and the task steps a second it may take meanwhile, all tasks together.
MAX_STEPS_PER_SECOND = 2


class StepCounter(trio.abc.Instrument):
    """Task steps by task name, except the test's own task."""

    def __init__(self, own: trio.lowlevel.Task) -> None:
        self.own = own
        self.steps: collections.Counter[str] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self.own:
            self.steps[task.name] += 1


async def test_an_idle_daemon_does_not_wake_its_loop_for_nothing(
    make_fs: Any, nursery: trio.Nursery
) -> None:
    mount = await make_fs()  # the core's workers and the uploader
    fs = mount.fs
    prefetcher = prefetcher_for(fs)
    await nursery.start(prefetcher.run)
    await nursery.start(dir_readahead_for(fs, defer=lambda: prefetcher.has_order).run)
    await nursery.start(mover_for(fs).run)
    await fs.mkdir(1, b"written", 0o755, 0, 0)  # the committer has work once
    await trio.sleep(1.0)  # start-up work (orphan cleanup, first mover pass) is over

    counter = StepCounter(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(counter)
    try:
        await trio.sleep(IDLE_SECONDS)
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert sum(counter.steps.values()) <= MAX_STEPS_PER_SECOND * IDLE_SECONDS, counter.steps

    # The committer slept, yet a write is committed within the interval.
    commits = fs.meta.commits
    await fs.mkdir(1, b"later", 0o755, 0, 0)
    assert fs.meta.uncommitted
    with trio.fail_after(10 * COMMIT_INTERVAL):
        while fs.meta.commits == commits:
            await trio.sleep(COMMIT_INTERVAL / 4)
