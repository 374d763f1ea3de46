"""The uploader: a background task that carries the journal to the bucket.

At start it aborts stale multipart uploads (older than a day, so never one
of its own) beside its other work.  Otherwise it only schedules: ``Journal.runnable``
decides which entries may start (sequence order per key, due times),
``TierFS.run_entry`` does the work.  Before it starts entries it commits the
metadata group (an entry never acts on the bucket ahead of the committed
change that queued it).  A scan of a long queue is followed by a pause, so
that scheduling stays a small share of the event loop.
At most ``concurrency`` entries run at once; each large upload sends its
parts in parallel on top of that.  It wakes when the journal changes, when
the next entry falls due, and at least once a second.
"""

from __future__ import annotations

import logging
import math
import time

import trio

from tierfs.core import TierFS

log = logging.getLogger(__name__)

#: A scheduling scan longer than this (seconds) is followed by a pause ...
SCAN_PAUSE_FROM = 0.0005
#: ... of nine times its length, at most this long.
SCAN_PAUSE_MAX = 0.1


async def run_uploader(
    fs: TierFS,
    *,
    concurrency: int = 8,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    journal = fs.journal
    async with trio.open_nursery() as nursery:
        replayed = len(journal)
        task_status.started()
        if replayed:
            log.info("replaying %d journal entries from the last mount", replayed)
        nursery.start_soon(_abort_stale_uploads, fs)
        while True:
            started = time.perf_counter()
            ready, next_due = journal.runnable(fs.entry_keys)
            scan = time.perf_counter() - started
            if ready and fs.meta.uncommitted:
                # An entry's effect on the bucket must never be ahead of the
                # committed metadata that queued it (MetaDB "Group commit").
                fs.meta.commit()
            for seq in ready:
                if len(journal.running) >= concurrency:
                    break
                journal.running.add(seq)
                nursery.start_soon(fs.run_entry, seq)
            if scan > SCAN_PAUSE_FROM:
                # A scan costs O(queued entries) on the event loop: with a long
                # queue, scan less often, at most ~10% of the loop's time.
                await trio.sleep(min(SCAN_PAUSE_MAX, 9 * scan))
            wait = 1.0 if math.isinf(next_due) else max(0.01, next_due - trio.current_time())
            await journal.wait_changed(min(wait, 1.0))


async def _abort_stale_uploads(fs: TierFS) -> None:
    with trio.move_on_after(60):  # a dead bucket must not keep this task around
        await fs.abort_stale_uploads()
