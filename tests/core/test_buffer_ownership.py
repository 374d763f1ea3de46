"""Fetch buffers under broken bodies: no buffer goes back to the pool while a
view of it is alive, ``trim`` never raises, and reads return the right bytes.

TierFS over the real S3 store through a FaultProxy (moto on loopback): the
ranged GETs of cold reads are cut by resets and truncated bodies, some
beyond the store's retry budget, so that fetches fail and their exceptions
(with the tracebacks that keep the fetch's views) outlive the fetch.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from typing import Any

import pytest

from tests.core.conftest import MiB, put
from tests.faults import FaultProxy
from tierfs.core.state.buffers import IDLE_TRIM_SECONDS, has_live_view
from tierfs.errors import StoreError
from tierfs.store.retry import RetryPolicy
from tierfs.store.s3 import S3Store


@pytest.fixture
def s3_store(bucket: tuple[str, str], fault_proxy: FaultProxy) -> Iterator[Any]:
    """The ``make_fs`` store, through the proxy, with a retry budget of 2 attempts."""
    store = S3Store(
        f"s3://{bucket[1]}/pre/",
        endpoint_url=f"http://127.0.0.1:{fault_proxy.port}",
        region="us-east-1",
        retry=RetryPolicy(max_attempts=2, budget=5.0, base_delay=0.01, max_delay=0.05),
    )
    try:
        yield store
    finally:
        store.close()


def pooled_without_views(mount: Any) -> None:
    pool = mount.fs.fetcher.buffers
    assert not any(has_live_view(buf) for buf in pool._free), "a pooled buffer has a live view"


@pytest.mark.parametrize("fault", ["reset", "truncate"])
async def test_failed_fetches_never_pool_a_buffer_with_a_live_view(
    make_fs: Any, s3_store: Any, fault_proxy: FaultProxy, fault: str
) -> None:
    bodies = {f"f{i}.bin": random.Random(i).randbytes(3 * MiB + 17 * i) for i in range(6)}
    for name, body in bodies.items():
        put(s3_store, name, body)
    mount = await make_fs()
    kept_errors: list[BaseException] = []  # as a log handler or a caller would keep them
    for round_no, (name, body) in enumerate(bodies.items()):
        # Even rounds: more faults than the retry budget (the fetch fails);
        # odd rounds: one fault (the store retries and the read succeeds).
        getattr(fault_proxy, f"{fault}_next")(4 if round_no % 2 == 0 else 1)
        try:
            got = await mount.read_file(name)
        except StoreError as exc:
            assert round_no % 2 == 0, f"{name}: one fault should have been retried: {exc}"
            kept_errors.append(exc)
        else:
            assert got == body, f"{name}: wrong bytes after a {fault}"
        fault_proxy.clear_faults()
        pooled_without_views(mount)
    assert fault_proxy.faults_injected >= 6
    assert kept_errors, "no fetch failed: the test did not exercise the failure path"
    pool = mount.fs.fetcher.buffers
    # The reported crash: trim() of a pool holding a buffer with a view raised
    # BufferError in the housekeeping task.  It must unmap or skip, never raise.
    pool.trim(pool._last_take + IDLE_TRIM_SECONDS + 1)
    # Every file reads right now, with buffers reused from the pool.
    for name, body in bodies.items():
        assert await mount.read_file(name) == body
    pooled_without_views(mount)
    kept_errors.clear()
    gc.collect()
    pool.trim(pool._last_take + IDLE_TRIM_SECONDS + 1)
    assert pool.free == 0
