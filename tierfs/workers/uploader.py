"""The uploader: a background task that carries the journal to the bucket.

At start it aborts stale multipart uploads, before any upload of its own
can be mistaken for one.  Then it only schedules: ``Journal.runnable`` decides which entries may start
(sequence order per key, due times), ``TierFS.run_entry`` does the work.
At most ``concurrency`` entries run at once; each large upload sends its
parts in parallel on top of that.  It wakes when the journal changes, when
the next entry falls due, and at least once a second.
"""

from __future__ import annotations

import logging
import math

import trio

from tierfs.core import TierFS

log = logging.getLogger(__name__)


async def run_uploader(
    fs: TierFS,
    *,
    concurrency: int = 8,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    journal = fs.journal
    async with trio.open_nursery() as nursery:
        task_status.started()
        with trio.move_on_after(60):  # never let a dead bucket block the uploader
            await fs.abort_stale_uploads()
        if len(journal):
            log.info("replaying %d journal entries from the last mount", len(journal))
        while True:
            ready, next_due = journal.runnable(fs.entry_keys)
            if ready and fs.meta.uncommitted:
                # An entry's effect on the bucket must never be ahead of the
                # committed metadata that queued it (MetaDB "Group commit").
                fs.meta.commit()
            for seq in ready:
                if len(journal.running) >= concurrency:
                    break
                journal.running.add(seq)
                nursery.start_soon(fs.run_entry, seq)
            wait = 1.0 if math.isinf(next_due) else max(0.01, next_due - trio.current_time())
            await journal.wait_changed(min(wait, 1.0))
