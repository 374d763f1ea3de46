"""BlockBuffers: reuse, the cap on free buffers, and trimming when idle."""

from __future__ import annotations

import mmap

from tierfs.core.buffers import IDLE_TRIM_SECONDS, BlockBuffers


def test_buffers_are_reused_page_aligned_and_capped() -> None:
    pool = BlockBuffers(64 * 1024, keep=2)
    a, b, c = pool.take(), pool.take(), pool.take()
    assert pool.created == 3
    assert all(len(x) == 64 * 1024 for x in (a, b, c))
    for buf in (a, b, c):
        pool.give(buf)
    assert pool.free == 2, "at most `keep` wait in the pool"
    assert c.closed, "the one over the cap was unmapped"
    again = {id(pool.take()), id(pool.take())}
    assert again == {id(a), id(b)} and pool.created == 3, "no new mapping while free ones exist"


def test_a_buffer_with_a_live_view_is_dropped_not_closed() -> None:
    pool = BlockBuffers(4096, keep=0)
    buf = pool.take()
    view = memoryview(buf)[:10]
    pool.give(buf)  # over the cap, but a view is alive: closing it would fail
    view[:3] = b"abc"
    assert bytes(view[:3]) == b"abc"


def test_trim_unmaps_free_buffers_only_when_idle() -> None:
    pool = BlockBuffers(4096, keep=4)
    bufs = [pool.take() for _ in range(3)]
    for buf in bufs:
        pool.give(buf)
    taken_at = pool._last_take
    assert pool.trim(taken_at + 1) == 0, "recently busy: keep them"
    assert pool.trim(taken_at + IDLE_TRIM_SECONDS + 1) == 3
    assert pool.free == 0 and all(isinstance(b, mmap.mmap) and b.closed for b in bufs)
