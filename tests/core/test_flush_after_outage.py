"""A flush after an outage: it retries what is pending now and reports only
errors of its own attempts (core, over the real S3 store on loopback)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tierfs.errors import StoreError


class BreakableStore:
    """The real store; while ``broken``, every upload fails as a full bucket would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.broken = False
        self.uploads = 0

    def _check(self) -> None:
        self.uploads += 1
        if self.broken:
            raise StoreError("put: No space left on device (outage number one)")

    def put(self, *args: Any, **kwargs: Any) -> str:
        self._check()
        return str(self.inner.put(*args, **kwargs))

    def put_multipart(self, *args: Any, **kwargs: Any) -> str:
        self._check()
        return str(self.inner.put_multipart(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def breakable(s3_store: Any) -> Iterator[BreakableStore]:
    yield BreakableStore(s3_store)


async def test_first_flush_after_an_outage_succeeds(
    make_fs: Any, s3_store: Any, breakable: BreakableStore
) -> None:
    mount = await make_fs()
    mount.store.inner = breakable  # CountingStore -> BreakableStore -> S3Store
    fs = mount.fs
    breakable.broken = True
    await mount.write_file("a.bin", b"a" * 100_000)
    (seq,) = fs.journal.entries
    with trio.fail_after(30):  # the outage: attempts fail, the backoff grows
        while fs.journal.failures.get(seq, 0) < fs.sync.flush_max_failures + 1:
            fs.journal.hurry({seq})
            await trio.sleep(0.05)
    assert fs.journal.not_before[seq] - trio.current_time() > 1.0, "in a long backoff now"
    assert "outage number one" in fs.journal.errors[seq]

    breakable.broken = False  # the outage is over
    started = time.monotonic()
    await mount.flush()
    assert time.monotonic() - started < 5, "the flush waited for the old backoff"
    assert seq not in fs.journal.entries
    assert s3_store.get_range("a.bin", 0, 100_000) == b"a" * 100_000


async def test_a_flush_that_fails_reports_its_own_error(
    make_fs: Any, breakable: BreakableStore
) -> None:
    mount = await make_fs()
    mount.store.inner = breakable
    fs = mount.fs
    fs.sync.flush_max_failures = 2
    breakable.broken = True
    await mount.write_file("b.bin", b"b" * 1000)
    (seq,) = fs.journal.entries
    with trio.fail_after(30):
        while fs.journal.failures.get(seq, 0) < 5:
            fs.journal.hurry({seq})
            await trio.sleep(0.05)
    before = breakable.uploads
    fs.journal.errors[seq] = "upload: a stale error of an earlier attempt"
    started = time.monotonic()
    with pytest.raises(StoreError, match="outage number one"):
        await mount.flush()
    assert breakable.uploads - before >= fs.sync.flush_max_failures, (
        "the flush made its own attempts"
    )
    assert time.monotonic() - started < 10, "own attempts are not held back by the old backoff"
