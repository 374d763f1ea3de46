"""The uploader: a background task that carries the journal to the bucket.

At start it aborts stale multipart uploads (older than a day, so never one
of its own) beside its other work.  Otherwise it only schedules: ``Journal.runnable``
decides which entries may start (sequence order per key, due times),
``TierFS.run_entry`` does the work.  Before it starts entries it commits the
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

Holding back during a burst also wins for the time until a burst is in the
bucket, on a small machine.  Measured with the write bench (2,000 files of
4-128 KiB written, then ``tierfs flush``; s3rver on the same 2 CPUs; two
rounds each, the machine shared): held, the write loop took 3.4-4.1 s and
the files were in the bucket after 9.9-10.2 s (``s5cmd cp``: 6.3 s); with 4
uploads running during the burst the loop took 7.1-10.1 s and the bucket
11.8-13.6 s; with 8, 13.9 s and 14.6 s; with 16 (on a busier machine) the
writer collapsed to 42 files/s.  The loop thread serves both the FUSE
requests and the upload bookkeeping, and interleaving them cost more of it
than running them one after the other (5.3-6.0 against 4.6-4.9 CPU-s), while the S3 server took
the other CPU from the writer.  So the hold stays; the flush is made cheap
instead (``tierfs.core.write.sync``, "Cost per small file on the event loop").
Measured again once the flush cost the loop about 0.55 ms per file (two
rounds, the machine 55-65% busy with other work beforehand): with no hold
and 4 uploads during the burst, the loop took 5.3-6.7 s (held: 2.6-4.1 s)
and the files were in the bucket after 10.9-11.9 s (held: 7.6-10.7 s).
A py-spy of the loop thread during such a burst put the uploads' own share
at about 9% of its samples: the writer is slowed by the two CPUs being
shared with the S3 server and the PUT threads, not by upload bookkeeping.

Measured a third time (on the code before the trim of the small-file
write loop, ``tierfs.core.write.writes``, which saves a few microseconds
per file and does not change the picture).  Same 2,000 files,
``upload_delay`` 1 s as in the bench, s3rver on the same 2 CPUs, four
interleaved rounds on a machine whose load average was 7-11 from other
work (so the spread is wide):

=========================  ==============  ==============  ================
uploads during the burst   write loop (s)  in bucket (s)   daemon CPU/file
=========================  ==============  ==============  ================
none (held, kept)          1.8-5.8         4.3-9.0         1.1-1.75 ms
8 at once, no hold         5.1-9.2         7.5-10.3        1.3-1.95 ms
16 at once, no hold        2.8-7.5         5.4-8.5         1.15-2.0 ms
16, GIL switch 0.5 ms      10.7 (1 round)  11.7            2.1 ms
=========================  ==============  ==============  ================

(``s5cmd cp`` of the same files: 3.9-4.3 s, once 10.0 s.)  The rounds in
which uploads really ran during the burst are the ones whose loop took
twice as long or more, and the daemon spent about a fifth more CPU per
file in all (its loop thread interleaving FUSE requests with completions);
the two good rounds of 16 had fast loops and did most uploads after them,
as held does.  A shorter GIL switch interval (to let the loop thread take
the GIL back from a PUT thread sooner) made the writer slower still.  So
the hold stays.

States: idle (full ``concurrency``) -> busy, holding (0) -> busy for
BURST_HOLD (``busy_concurrency``); any BUSY_WINDOW below the rate -> idle.
"""

from __future__ import annotations

import logging
import math
import time

import trio

from tierfs.core import TierFS

from .foreground import BUSY_WINDOW, ForegroundMeter

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


async def run_uploader(
    fs: TierFS,
    *,
    concurrency: int = 32,
    busy_concurrency: int = 1,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    journal = fs.journal
    foreground = ForegroundMeter(fs)
    async with trio.open_nursery() as nursery:
        replayed = len(journal)
        task_status.started()
        if replayed:
            log.info("replaying %d journal entries from the last mount", replayed)
        nursery.start_soon(_abort_stale_uploads, fs)
        while True:
            scan = 0.0
            next_due = math.inf
            # Uploads share the CPU (and the GIL) with the requests of the
            # mount: while those come fast, hold back, unless someone waits
            # for the bucket (flush, write-through, a writer short of space).
            limit = upload_limit(foreground, concurrency, busy_concurrency)
            if journal.someone_waits():
                limit = concurrency
            free = limit - len(journal.running)
            if free > 0:  # when every slot is busy, the end of an entry wakes us
                started = time.perf_counter()
                ready, next_due = journal.runnable(fs.entry_keys, limit=free)
                scan = time.perf_counter() - started
                if not all(journal.committed(seq) for seq in ready):
                    # An entry's effect on the bucket must never be ahead of the
                    # committed metadata that queued it (MetaDB "Group commit").
                    fs.meta.commit()
                for seq in ready:
                    journal.running.add(seq)
                    nursery.start_soon(fs.run_entry, seq)
            if scan > SCAN_PAUSE_FROM:
                # A scan costs O(queued entries) on the event loop: with a long
                # queue, scan less often, at most ~10% of the loop's time.
                await trio.sleep(min(SCAN_PAUSE_MAX, 9 * scan))
            wait = 1.0 if math.isinf(next_due) else max(0.01, next_due - trio.current_time())
            wait = min(wait, BUSY_WINDOW if foreground.busy else 1.0)
            journal.next_look = trio.current_time() + wait
            await journal.wait_changed(wait)


async def _abort_stale_uploads(fs: TierFS) -> None:
    with trio.move_on_after(60):  # a dead bucket must not keep this task around
        await fs.abort_stale_uploads()
