"""The uploader: a background task that carries the journal to the bucket.

At start it aborts stale multipart uploads (older than a day, so never one
of its own) beside its other work.  Otherwise it only schedules: ``Journal.runnable``
decides which entries may start (sequence order per key, due times),
``Sync.run_entry`` does the work.  Before it starts entries it commits the
metadata group (an entry never acts on the bucket ahead of the committed
change that queued it).  A scan of a long queue is followed by a pause, so
that scheduling stays a small share of the event loop.
At most ``concurrency`` entries run at once (32: enough for the single-PUT
uploads of small files, ``Sync.small_upload_limiter``, to keep their 16
PUTs in flight while others wait for their batch to be marked clean, and
for deletes and copies beside them); large uploads are bounded further by
``TierFS.upload_limiter`` and send their parts in parallel on top of that.  It wakes when the journal changes, when
the next entry falls due, and at least once a second.

Yielding to the mount.  Uploads run in this process: boto3 is Python, and
while it holds the GIL a FUSE request waits.  A writer that creates many
small files one after the other pays that wait on every request (measured:
about 600 files/s with uploads running beside it, about 1,000 without).  So
while the mount is busy (``ForegroundMeter``: FUSE requests come fast), the
uploader starts nothing for up to BURST_HOLD seconds (a burst of writes runs
at local speed and the bucket catches up after it), and after that at most
``busy_concurrency`` entries at once, so that a mount that stays busy still
uploads.  Entries already running go on.  A flush, a write-through close or
a writer waiting for tier space lifts both limits: someone is waiting for the
bucket (``Journal.someone_waits``).

Why the hold stays: with uploads running during a burst, the write loop
and the time until the burst is in the bucket both got longer on a small
machine (the FUSE requests and the upload bookkeeping share the loop
thread, the PUT threads take the GIL); measured three times, dated, in
docs/benchmarks.md, "Holding uploads back during a burst".

States: idle (full ``concurrency``) -> busy, holding (0) -> busy for
BURST_HOLD (``busy_concurrency``); any BUSY_WINDOW below the rate -> idle.
"""

from __future__ import annotations

import logging
import math
import time

import trio

from tierfs.core.state.journal import Journal
from tierfs.core.write.sync import Sync
from tierfs.meta import MetaDB

from .foreground import BUSY_WINDOW, CountsRequests, ForegroundMeter

log = logging.getLogger(__name__)

#: A scheduling scan longer than this (seconds) is followed by a pause ...
SCAN_PAUSE_FROM = 0.0005
#: ... of nine times its length, at most this long.
SCAN_PAUSE_MAX = 0.1
#: Seconds of continuous foreground load during which no new upload starts.
BURST_HOLD = 30.0


def upload_limit(meter: ForegroundMeter, concurrency: int, busy_concurrency: int) -> int:
    """How many entries may run now (see the module docstring)."""
    if not meter.update():
        return concurrency
    if trio.current_time() - meter.busy_since < BURST_HOLD:
        return 0
    return busy_concurrency


class Uploader:
    """The uploader worker (see the module docstring): schedules the
    journal's entries; ``sync`` runs each.  ``requests`` counts the mount's
    FUSE requests (``ForegroundMeter``)."""

    def __init__(
        self,
        journal: Journal,
        sync: Sync,
        meta: MetaDB,
        requests: CountsRequests,
        *,
        concurrency: int = 32,
        busy_concurrency: int = 1,
    ) -> None:
        self.journal = journal
        self.sync = sync
        self.meta = meta
        self.foreground = ForegroundMeter(requests)
        self.concurrency = concurrency
        self.busy_concurrency = busy_concurrency

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        journal = self.journal
        async with trio.open_nursery() as nursery:
            replayed = len(journal)
            task_status.started()
            if replayed:
                log.info("replaying %d journal entries from the last mount", replayed)
            nursery.start_soon(self._abort_stale_uploads)
            while True:
                scan = 0.0
                next_due = math.inf
                # Uploads share the CPU (and the GIL) with the requests of the
                # mount: while those come fast, hold back, unless someone waits
                # for the bucket (flush, write-through, a writer short of space).
                limit = upload_limit(self.foreground, self.concurrency, self.busy_concurrency)
                if journal.someone_waits():
                    limit = self.concurrency
                free = limit - len(journal.running)
                if free > 0:  # when every slot is busy, the end of an entry wakes us
                    started = time.perf_counter()
                    ready, next_due = journal.runnable(self.sync.entry_keys, limit=free)
                    scan = time.perf_counter() - started
                    if not all(journal.committed(seq) for seq in ready):
                        # An entry's effect on the bucket must never be ahead of the
                        # committed metadata that queued it (MetaDB "Group commit").
                        self.meta.commit()
                    for seq in ready:
                        journal.running.add(seq)
                        nursery.start_soon(self.sync.run_entry, seq)
                if scan > SCAN_PAUSE_FROM:
                    # A scan costs O(queued entries) on the event loop: with a long
                    # queue, scan less often, at most ~10% of the loop's time.
                    await trio.sleep(min(SCAN_PAUSE_MAX, 9 * scan))
                wait = 1.0 if math.isinf(next_due) else max(0.01, next_due - trio.current_time())
                wait = min(wait, BUSY_WINDOW if self.foreground.busy else 1.0)
                journal.next_look = trio.current_time() + wait
                await journal.wait_changed(wait)

    async def _abort_stale_uploads(self) -> None:
        with trio.move_on_after(60):  # a dead bucket must not keep this task around
            await self.sync.abort_stale_uploads()
