"""TierFS while the endpoint is away (no mount): stale-if-error, bounded waits,
local namespace changes, and the uploads woken when the endpoint returns.

The store is a real S3Store on moto, reached through the ``fault_proxy``
fixture, which takes the endpoint away (``refuse()``/``black_hole()``) and
brings it back (``restore()``).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tests.core.conftest import put
from tests.faults import FaultProxy
from tierfs.config import NamespaceConfig, WriteConfig
from tierfs.core.names.namespace import REVALIDATE_WAIT
from tierfs.core.write.sync import FLUSH_OUTAGE_WAIT
from tierfs.errors import EndpointUnreachable, StoreUnavailable
from tierfs.meta import ROOT_INO
from tierfs.store.retry import RetryPolicy
from tierfs.store.s3 import S3Store

BODY = bytes(range(256)) * 1024  # 256 KiB
SHORT_TTLS = NamespaceConfig(list_ttl=0.3, revalidate_ttl=0.1)
#: An operation that did not wait for a black-holed request ends within this.
#: One that waited would take at least REVALIDATE_WAIT (1 s) or a read
#: timeout (3 s for a request, 15 s for a listing); the margin over the
#: earlier 0.2 s is for a loaded 2-CPU machine, where 0.2 s failed once in a
#: full run.
NO_WAIT = 0.5


@pytest.fixture
def s3_store(bucket: tuple[str, str], fault_proxy: FaultProxy) -> Iterator[S3Store]:
    """Overrides the shared fixture: the same store, through the proxy."""
    _, name = bucket
    store = S3Store(
        f"s3://{name}/pre/",
        endpoint_url=fault_proxy.endpoint,
        region="us-east-1",
        retry=RetryPolicy(max_attempts=6, budget=10.0, base_delay=0.05, max_delay=0.2),
    )
    try:
        yield store
    finally:
        store.close()


async def wait_for(predicate: Any, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.05)
        return True
    return False


async def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    started = trio.current_time()
    result = await fn(*args)
    return result, trio.current_time() - started


async def test_cached_file_is_served_while_the_endpoint_refuses(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    put(s3_store, "d/f.bin", BODY)
    # Long list_ttl: a re-listing would confirm the ETag and spare the HEAD.
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0.1))
    assert await mount.read_file("d/f.bin") == BODY
    heads = mount.store.heads
    fault_proxy.refuse()
    await trio.sleep(0.2)  # the revalidation is due
    for _ in range(3):
        data, took = await timed(mount.read_file, "d/f.bin")
        assert data == BODY
        assert took < 2.0
    assert s3_store.breaker is not None and s3_store.breaker.is_open
    status = mount.fs.status()
    assert status["endpoint"]["state"] == "unreachable"  # type: ignore[index]
    assert "EndpointConnectionError" in status["endpoint"]["last_error"]  # type: ignore[index]
    assert status["counters"]["stale_opens"] >= 3  # type: ignore[index]
    # While the breaker is open an open sends no HEAD at all.
    opened_heads = mount.store.heads
    await mount.read_file("d/f.bin")
    assert mount.store.heads == opened_heads
    assert opened_heads - heads <= 1

    fault_proxy.restore()
    assert await wait_for(lambda: not s3_store.breaker.is_open, 10)
    await trio.sleep(0.2)
    assert await mount.read_file("d/f.bin") == BODY
    assert mount.store.heads == opened_heads + 1, "no revalidation after the outage"
    assert mount.fs.status()["endpoint"]["state"] == "reachable"  # type: ignore[index]


async def test_revalidation_never_holds_an_open_in_a_black_hole(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    put(s3_store, "f.bin", BODY)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=0.1))
    assert await mount.read_file("f.bin") == BODY
    fault_proxy.black_hole()
    await trio.sleep(0.2)
    inode = await mount.fs.namespace.resolve("f.bin")
    opened, took = await timed(mount.fs.open, inode.ino, os.O_RDONLY)
    await mount.fs.release(opened.fh)
    assert took < REVALIDATE_WAIT + 0.5
    # The HEAD is still out there; the next open does not wait for another.
    opened, took = await timed(mount.fs.open, inode.ino, os.O_RDONLY)
    await mount.fs.release(opened.fh)
    assert took < NO_WAIT
    assert mount.fs.namespace.stale_opens == 2
    fault_proxy.restore()


async def test_changes_in_a_listed_directory_do_not_wait_for_a_black_hole(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    put(s3_store, "d/a.txt", b"a")
    mount = await make_fs(namespace=SHORT_TTLS)
    d = await mount.fs.namespace.resolve("d")
    await mount.fs.opendir(d.ino)  # this node has a listing of d
    fault_proxy.black_hole()
    await trio.sleep(0.4)  # the listing of d is stale: a re-listing would hang
    _, took = await timed(mount.fs.mkdir, d.ino, b"sub", 0o755, 0, 0)
    assert took < NO_WAIT
    (opened, _attrs), took = await timed(
        mount.fs.create, d.ino, b"new.txt", 0o644, os.O_WRONLY, 0, 0
    )
    assert took < NO_WAIT
    await mount.fs.write(opened.fh, 0, b"new")
    _, took = await timed(mount.fs.fsync, opened.fh, False)
    assert took < NO_WAIT
    await mount.fs.release(opened.fh)
    _, took = await timed(mount.fs.rename, d.ino, b"a.txt", d.ino, b"b.txt", 0)
    assert took < NO_WAIT
    # A lookup never waits for the hung re-listing (stale-while-revalidate).
    attrs, took = await timed(mount.fs.lookup, d.ino, b"b.txt")
    assert attrs.size == 1 and took < NO_WAIT
    fault_proxy.restore()
    await mount.flush()
    assert s3_store.get_range("d/new.txt", 0, 10) == b"new"
    assert s3_store.get_range("d/b.txt", 0, 10) == b"a"


async def test_a_directory_never_listed_fails_with_eio_at_once_when_refused(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    put(s3_store, "never/x", b"x")
    mount = await make_fs(namespace=SHORT_TTLS)
    attrs = await mount.fs.lookup(ROOT_INO, b"never")  # listed the root, not "never"
    fault_proxy.refuse()
    for _ in range(3):
        started = trio.current_time()
        with pytest.raises(StoreUnavailable) as info:
            await mount.fs.opendir(attrs.ino)
        assert info.value.errno == errno.EIO
        assert trio.current_time() - started < 5.0
    fault_proxy.restore()


async def test_uploads_that_failed_in_the_outage_go_up_when_the_endpoint_returns(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs()
    await mount.fs.opendir(ROOT_INO)  # this node has a listing of the root
    fault_proxy.refuse()
    await mount.write_file("up.bin", BODY)
    journal = mount.fs.journal
    # The upload fails (at once, once the breaker is open) and backs off.
    assert await wait_for(lambda: sum(journal.failures.values()) >= 3, 30)
    assert s3_store.breaker is not None and s3_store.breaker.is_open
    fault_proxy.restore()
    # Woken by the breaker's close, not after its backoff (up to a minute).
    assert await wait_for(lambda: len(journal) == 0, 8), journal.entries
    assert s3_store.get_range("up.bin", 0, len(BODY)) == BODY


async def test_write_through_fsync_fails_at_once_while_the_endpoint_is_out(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs(write=WriteConfig(mode="through", upload_delay=0.0, part_size=8 << 20))
    await mount.fs.opendir(ROOT_INO)
    fault_proxy.refuse()
    with pytest.raises(StoreUnavailable):  # refused attempts open the breaker
        await trio.to_thread.run_sync(s3_store.head, "anything")
    assert await wait_for(lambda: s3_store.breaker is not None and s3_store.breaker.is_open, 10)
    started = trio.current_time()
    with pytest.raises(StoreUnavailable) as info:
        await mount.write_file("t.bin", b"through")
    assert info.value.errno == errno.EIO
    assert trio.current_time() - started < 1.0
    assert await mount.read_file("t.bin") == b"through"  # durable locally, and queued
    fault_proxy.restore()
    await mount.flush()
    assert s3_store.get_range("t.bin", 0, 100) == b"through"


async def test_flush_with_the_breaker_open_fails_with_the_outage_within_seconds(
    make_fs: Any, s3_store: S3Store, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs()
    await mount.fs.opendir(ROOT_INO)
    fault_proxy.refuse()
    await mount.write_file("waits.bin", BODY)
    assert await wait_for(lambda: s3_store.breaker is not None and s3_store.breaker.is_open, 15)
    started = trio.current_time()
    with pytest.raises(EndpointUnreachable) as info:
        await mount.fs.flush_path("")
    took = trio.current_time() - started
    assert info.value.errno == errno.EIO
    assert FLUSH_OUTAGE_WAIT <= took < FLUSH_OUTAGE_WAIT + 2.0, took
    assert "unreachable since" in str(info.value)
    assert "1 file(s) waiting for upload" in str(info.value)
    assert len(mount.fs.journal) == 1  # still queued
    fault_proxy.restore()
    # Refusals by the open breaker did not count as attempts of this flush.
    await mount.fs.flush_path("")
    assert s3_store.get_range("waits.bin", 0, len(BODY)) == BODY


class BlockingLists:
    """Forwards to a store; ``list_pages`` of ``prefix`` waits for ``release``."""

    def __init__(self, inner: Any, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.release = threading.Event()
        self.release.set()
        self.started = threading.Event()

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[Any]:
        # A generator: the wait happens in ``next()``, on the listing's thread.
        if prefix == self.prefix:
            self.started.set()
            self.release.wait(30)
        yield from self.inner.list_pages(prefix, page_size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_listing_of_a_directory_renamed_meanwhile_is_dropped(
    make_fs: Any, s3_store: S3Store
) -> None:
    put(s3_store, "d/a.txt", b"a")
    mount = await make_fs(namespace=SHORT_TTLS)
    ns = mount.fs.namespace
    d = await ns.resolve("d")
    await mount.fs.opendir(d.ino)
    blocking = BlockingLists(ns.listings.store, "d/")
    ns.listings.store = blocking
    blocking.release.clear()
    await trio.sleep(0.4)  # the listing of d is stale
    await mount.fs.opendir(d.ino)  # starts the re-listing in the background; it hangs
    assert await wait_for(blocking.started.is_set, 2)
    put(s3_store, "d/late.txt", b"late")  # the hung listing will see it under d/
    with trio.fail_after(3):
        await mount.fs.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0)
    blocking.release.set()
    await trio.sleep(0.5)  # the listing's page arrives after the rename
    e = await ns.resolve("e")
    names = {name for _c, name, _i in mount.fs.meta.read_dir(e.ino, 0, 100)}
    assert names == {b"a.txt"}, names  # "late.txt" is under d/ in the bucket, not e/
    ns.listings.store = blocking.inner
    await mount.flush()
    assert s3_store.get_range("e/a.txt", 0, 10) == b"a"
