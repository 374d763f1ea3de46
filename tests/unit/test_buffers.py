"""BlockBuffers: reuse, the cap on free buffers, and trimming when idle."""

from __future__ import annotations

import mmap

from tierfs.core.state.buffers import IDLE_TRIM_SECONDS, BlockBuffers, has_live_view


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


def test_a_buffer_given_back_with_a_live_view_never_returns_to_the_pool() -> None:
    """The ownership rule: a view that outlived its fetch (kept by a
    traceback) must not let the buffer out to the next fetch, and trim must
    not fail on it."""
    pool = BlockBuffers(4096, keep=4)
    buf = pool.take()
    view = memoryview(buf)[100:200]
    assert has_live_view(buf)
    pool.give(buf)
    assert pool.free == 0 and pool.dropped_in_use == 1
    other = pool.take()
    assert other is not buf and pool.created == 2
    other[:4] = b"new!"
    view[:3] = b"old"  # the stale holder writes into its own buffer only
    assert other[:4] == b"new!" and buf[100:103] == b"old"
    view.release()
    assert not has_live_view(buf)


def test_take_skips_a_pooled_buffer_that_got_a_view_and_trim_never_raises() -> None:
    pool = BlockBuffers(4096, keep=4)
    a, b = pool.take(), pool.take()
    pool.give(a)
    pool.give(b)
    stray = memoryview(b)  # a bug: a view made after give
    taken = pool.take()  # the last given is tried first: b has a view, so a comes out
    assert taken is a and pool.dropped_in_use == 1 and pool.free == 0
    pool.give(taken)
    late = memoryview(taken)  # another stray view, while the buffer is free
    assert pool.trim(pool._last_take + IDLE_TRIM_SECONDS + 1) == 0, "nothing could be unmapped"
    assert pool.dropped_in_use == 2 and pool.free == 0
    late.release()
    stray.release()


def test_a_released_view_lets_the_buffer_be_pooled_again() -> None:
    pool = BlockBuffers(4096, keep=2)
    buf = pool.take()
    view = memoryview(buf)[:10]
    view.release()
    pool.give(buf)
    assert pool.free == 1 and pool.dropped_in_use == 0 and pool.take() is buf
