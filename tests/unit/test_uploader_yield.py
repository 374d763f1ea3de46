"""The uploader's yield to a busy mount (ForegroundMeter, Journal.someone_waits), on trio's mock clock."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from tierfs.core.state.journal import HURRY_FAILED_RETRY, HURRY_WAIT, Journal
from tierfs.meta import MetaDB
from tierfs.workers.foreground import BUSY_REQUESTS_PER_SECOND, BUSY_WINDOW, ForegroundMeter
from tierfs.workers.uploader import BURST_HOLD, upload_limit

CONCURRENCY, BUSY_CONCURRENCY = 8, 1


def advance(clock: trio.testing.MockClock, fs: Any, seconds: float, rate: float) -> None:
    """Let ``seconds`` pass while the mount serves ``rate`` requests a second."""
    fs.requests += int(seconds * rate)
    clock.jump(seconds)


async def test_an_idle_mount_uploads_at_full_concurrency(mock_clock: Any) -> None:
    fs = SimpleNamespace(requests=0)
    meter = ForegroundMeter(fs)  # type: ignore[arg-type]
    for _ in range(10):
        advance(mock_clock, fs, BUSY_WINDOW, BUSY_REQUESTS_PER_SECOND / 2)
        assert upload_limit(meter, CONCURRENCY, BUSY_CONCURRENCY) == CONCURRENCY


async def test_a_burst_holds_uploads_then_a_long_one_lets_one_through(mock_clock: Any) -> None:
    fs = SimpleNamespace(requests=0)
    meter = ForegroundMeter(fs)  # type: ignore[arg-type]
    busy_rate = BUSY_REQUESTS_PER_SECOND * 3
    elapsed = 0.0
    limits: list[tuple[float, int]] = []
    while elapsed < BURST_HOLD + 5:
        advance(mock_clock, fs, BUSY_WINDOW, busy_rate)
        elapsed += BUSY_WINDOW
        limits.append((elapsed, upload_limit(meter, CONCURRENCY, BUSY_CONCURRENCY)))
    # Held from the first busy window until BURST_HOLD after the load began ...
    assert all(limit == 0 for t, limit in limits if t < BURST_HOLD)
    # ... and then one at a time, so that a mount that stays busy still uploads.
    assert all(limit == BUSY_CONCURRENCY for t, limit in limits if t >= BURST_HOLD + BUSY_WINDOW)
    # One quiet window ends the spell; the next burst is held afresh.
    advance(mock_clock, fs, BUSY_WINDOW, 0)
    assert upload_limit(meter, CONCURRENCY, BUSY_CONCURRENCY) == CONCURRENCY
    advance(mock_clock, fs, BUSY_WINDOW, busy_rate)
    assert upload_limit(meter, CONCURRENCY, BUSY_CONCURRENCY) == 0


async def test_the_rate_is_measured_over_whole_windows(mock_clock: Any) -> None:
    fs = SimpleNamespace(requests=0)
    meter = ForegroundMeter(fs)  # type: ignore[arg-type]
    # A short spike inside a window does not count until the window ends.
    fs.requests += BUSY_REQUESTS_PER_SECOND
    mock_clock.jump(BUSY_WINDOW / 10)
    assert upload_limit(meter, CONCURRENCY, BUSY_CONCURRENCY) == CONCURRENCY
    mock_clock.jump(BUSY_WINDOW)
    # BUSY_REQUESTS_PER_SECOND requests over 1.1 windows (0.55 s) is busy.
    assert upload_limit(meter, CONCURRENCY, BUSY_CONCURRENCY) == 0


async def test_a_writer_short_of_space_counts_as_waiting_for_the_bucket(
    mock_clock: Any, tmp_path: Path
) -> None:
    # The uploader lifts its hold when someone waits for the bucket; a writer
    # waiting for tier space does not wait in the journal, it hurries it.
    meta = MetaDB(tmp_path, "s3://b")
    try:
        journal = Journal(meta)
        assert not journal.someone_waits()
        journal.hurry()
        assert journal.someone_waits()
        mock_clock.jump(HURRY_WAIT / 2)
        assert journal.someone_waits()
        mock_clock.jump(HURRY_WAIT)
        assert not journal.someone_waits()
    finally:
        meta.close()


async def test_a_writer_short_of_space_does_not_storm_failing_entries(
    mock_clock: Any, tmp_path: Path
) -> None:
    """A writer hurries every 50 ms; an entry in backoff after failures runs
    again within HURRY_FAILED_RETRY, not at once; a flush (named entries)
    makes it due at once."""
    meta = MetaDB(tmp_path, "s3://b")
    try:
        journal = Journal(meta)
        with journal.write() as w:
            failing = w.append({"op": "delete", "key": "a"})
            fresh = w.append({"op": "delete", "key": "b"})
        journal.retry_later(failing, 60.0, "delete: No space left on device")
        now = trio.current_time()
        for _ in range(10):
            journal.hurry()
            mock_clock.jump(0.05)
        assert journal.not_before[fresh] == 0.0
        assert journal.not_before[failing] == now + HURRY_FAILED_RETRY
        assert journal.errors[failing] == "delete: No space left on device"
        journal.hurry({failing})
        assert journal.not_before[failing] == 0.0
    finally:
        meta.close()
