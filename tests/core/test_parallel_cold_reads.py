"""Cold small files read by 8 readers at once (a DataLoader with 8 workers),
counted in S3 requests, not timed: every reader's GET is
in flight at the same moment (nothing on the way to the GET runs one
reader at a time), each file is ONE GET and no HEAD, and each directory is
listed once (one data LIST and one LIST of its attribute shadow) however
many readers look names up in it while it is being listed."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import trio

from tests.core.conftest import put
from tierfs.core.names.shadow import shadow_dir_prefix

READERS = 8
KiB = 1024


async def test_eight_cold_readers_have_eight_gets_in_flight_and_send_nothing_else(
    make_fs: Any, s3_store: Any
) -> None:
    files = {f"ds/f{i:02d}.bin": os.urandom(KiB + 997 * i) for i in range(2 * READERS)}
    for key, data in files.items():
        put(s3_store, key, data)
    mount = await make_fs()
    store = mount.store
    # Every GET waits until READERS of them are in flight (a barrier): if
    # anything between a reader's lookup and its GET ran one reader at a
    # time, the barrier would break and the reads fail.
    barrier = threading.Barrier(READERS, timeout=20)
    in_flight = peak = 0
    lock = threading.Lock()
    real_get = store.get_range_into

    def gated_get(
        key: str, start: int, bufs: Sequence[memoryview], etag: str | None = None, **kw: Any
    ) -> int:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            barrier.wait()
            return real_get(key, start, bufs, etag, **kw)
        finally:
            with lock:
                in_flight -= 1

    store.get_range_into = gated_get  # type: ignore[method-assign]
    got: dict[str, bytes] = {}

    async def reader(keys: list[str]) -> None:
        for key in keys:
            got[key] = await mount.read_file(key)

    names = sorted(files)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for r in range(READERS):
                nursery.start_soon(reader, names[r::READERS])
    assert got == files
    assert peak == READERS
    assert store.heads == 0, "a cold small file is never a HEAD and a GET"
    assert sorted(store.gets) == sorted((key, 0, len(data)) for key, data in files.items())
    # The root and ds/, each listed once for all the readers: data and shadow.
    assert sorted(store.lists) == sorted(
        ["", shadow_dir_prefix(""), "ds/", shadow_dir_prefix("ds/")]
    )
