"""Core tests: TierFS over a real store (moto S3 on loopback), no mount.

``make_fs(**overrides)`` builds a TierFS on the ``s3_store`` bucket with two
small tiers under tmp_path, starts its workers in the test's nursery and
returns a ``CoreMount``.  Calling ``remount()`` on it closes LMDB and builds
a new TierFS on the same state and tiers, as a daemon restart would.
``CountingStore`` wraps the real store to count GETs, HEADs and LISTs (it
forwards every call).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import open_s3_store
from tierfs.config import (
    BackingConfig,
    Config,
    FetchConfig,
    NamespaceConfig,
    StateConfig,
    TierConfig,
    WriteConfig,
)
from tierfs.core import TierFS
from tierfs.errors import NotFound
from tierfs.meta import MetaDB
from tierfs.store import ListPage, ObjectInfo, open_shared_tier
from tierfs.tiers import Tier
from tierfs.workers.wiring import uploader_for

MiB = 1024 * 1024


class CountingStore:
    """The real store, with a count of ranged GETs per key, of HEADs, and the
    prefix of every listing started."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.gets: list[tuple[str, int, int]] = []
        self.heads = 0
        self.lists: list[str] = []

    def check(self) -> None:
        self.inner.check()

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[ListPage]:
        self.lists.append(prefix)
        return self.inner.list_pages(prefix, page_size)

    def head(self, key: str) -> ObjectInfo:
        self.heads += 1
        return self.inner.head(key)

    def get_range(
        self,
        key: str,
        start: int,
        length: int,
        etag: str | None = None,
        *,
        version: str | None = None,
    ) -> bytes:
        self.gets.append((key, start, length))
        return self.inner.get_range(key, start, length, etag, version=version)

    def get_range_into(
        self,
        key: str,
        start: int,
        bufs: Sequence[memoryview],
        etag: str | None = None,
        *,
        stop: Callable[[], bool] | None = None,
        version: str | None = None,
    ) -> int:
        self.gets.append((key, start, sum(len(b) for b in bufs)))
        return self.inner.get_range_into(key, start, bufs, etag, stop=stop, version=version)

    def __getattr__(self, name: str) -> Any:
        # put, put_multipart, copy, delete, ...: straight to the real store.
        return getattr(self.inner, name)


@dataclasses.dataclass
class CoreMount:
    fs: TierFS
    store: CountingStore
    config: Config
    nursery: trio.Nursery
    cancel: trio.CancelScope
    registry: list[CoreMount]
    stopped: trio.Event
    closed: bool = False

    async def read_file(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        inode = await self.fs.namespace.resolve(path)
        opened = await self.fs.open(inode.ino, 0)
        try:
            size = inode.size - offset if size is None else size
            out = bytearray()
            while len(out) < size:
                chunk = await self.fs.read(
                    opened.fh, offset + len(out), min(128 * 1024, size - len(out))
                )
                if not chunk:
                    break
                out += chunk
            return bytes(out)
        finally:
            await self.fs.release(opened.fh)

    async def write_file(self, path: str, data: bytes, *, fsync: bool = True) -> int:
        """Create (or truncate) ``path`` and write ``data``, as open/write/close would."""
        parent_path, _, name = path.rpartition("/")
        parent = await self.fs.namespace.resolve(parent_path)
        try:
            inode = await self.fs.namespace.lookup(parent.ino, name.encode())
            opened = await self.fs.open(inode.ino, os.O_WRONLY | os.O_TRUNC)
            ino = inode.ino
        except NotFound:
            opened, attrs = await self.fs.create(
                parent.ino, name.encode(), 0o644, os.O_WRONLY, 0, 0
            )
            ino = attrs.ino
        for offset in range(0, len(data), 1 << 20):
            await self.fs.write(opened.fh, offset, data[offset : offset + (1 << 20)])
        if fsync:
            await self.fs.fsync(opened.fh, False)
        await self.fs.release(opened.fh)
        return ino

    async def flush(self, path: str = "") -> None:
        with trio.fail_after(30):
            await self.fs.flush_path(path)

    async def remount(self) -> CoreMount:
        await self.aclose()
        return await _start(self.config, self.store, self.nursery, self.registry)

    async def aclose(self) -> None:
        """Stop the workers, wait until they are gone, then close LMDB."""
        self.cancel.cancel()
        await self.stopped.wait()
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.cancel.cancel()
        self.fs.close()
        self.fs.meta.close()
        for tier in self.fs.tiers:
            tier.close()


def make_config(tmp_path: Path, store_url: str, **overrides: Any) -> Config:
    """A config with two tiers under ``tmp_path``; ``node="name"`` puts
    the node's state and tiers under ``tmp_path / name`` (several nodes in
    one test), ``shared_tier`` adds a shared tier."""
    node = overrides.pop("node", "")
    if node:
        tmp_path = tmp_path / node
        tmp_path.mkdir(exist_ok=True)
    nvme, hdd = overrides.pop("capacities", (8 * MiB, 16 * MiB))
    low = overrides.pop("low_watermark", 0.8)
    tiers = (
        TierConfig("nvme", tmp_path / "nvme", nvme, 0.9, low),
        TierConfig("hdd", tmp_path / "hdd", hdd, 0.9, low),
    )
    for tier in tiers:
        tier.path.mkdir(exist_ok=True)
    return Config(
        source=tmp_path / "tierfs.toml",
        backing=BackingConfig(url=store_url),
        state=StateConfig(dir=tmp_path / "state"),
        tiers=tuple(tiers),
        fetch=overrides.pop(
            "fetch", FetchConfig(block_size=MiB, readahead_max=8 * MiB, concurrency=8)
        ),
        namespace=overrides.pop("namespace", NamespaceConfig(list_ttl=60, revalidate_ttl=60)),
        write=overrides.pop(
            "write", WriteConfig(mode="back", upload_delay=0.05, part_size=8 * MiB)
        ),
        rules=tuple(overrides.pop("rules", ())),
        quotas=tuple(overrides.pop("quotas", ())),
        shared_tier=overrides.pop("shared_tier", None),
    )


async def _start(
    config: Config, store: CountingStore, nursery: trio.Nursery, registry: list[CoreMount]
) -> CoreMount:
    meta = MetaDB(config.state.dir / "meta", store.url)
    tiers = [Tier(i, t) for i, t in enumerate(config.tiers)]
    shared = open_shared_tier(config.shared_tier) if config.shared_tier else None
    fs = TierFS(config, meta, store, tiers, shared=shared)
    cancel = trio.CancelScope()
    stopped = trio.Event()

    async def workers(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with cancel:
                async with trio.open_nursery() as inner:
                    await inner.start(fs.run_workers)
                    await inner.start(uploader_for(fs).run)
                    task_status.started()
        finally:
            stopped.set()

    await nursery.start(workers)
    mount = CoreMount(fs, store, config, nursery, cancel, registry, stopped)
    registry.append(mount)
    return mount


@pytest.fixture
def s3_store_through_proxy(bucket: tuple[str, str], fault_proxy: Any) -> Iterator[Any]:
    """Like ``s3_store``, with its requests through ``fault_proxy``: faults for
    the native engine's GETs and PUTs, which botocore hooks do not see, are
    injected on the wire.  A module overrides ``s3_store`` with it."""
    with open_s3_store(bucket[1], fault_proxy.endpoint) as store:
        yield store


@pytest.fixture
async def make_fs(s3_store: Any, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    mounts: list[CoreMount] = []
    store = CountingStore(s3_store)
    async with trio.open_nursery() as nursery:

        async def factory(**overrides: Any) -> CoreMount:
            config = make_config(tmp_path, store.url, **overrides)
            return await _start(config, store, nursery, mounts)

        yield factory
        for mount in mounts:
            if not mount.closed:
                await mount.aclose()
        nursery.cancel_scope.cancel()


def count_calls(
    monkeypatch: pytest.MonkeyPatch, counts: dict[str, int], key: str, owner: Any, attr: str
) -> None:
    """Count each call of ``owner.attr`` (a function or a coroutine function)
    in ``counts[key]``, then make the call; ``monkeypatch`` undoes it."""
    real = getattr(owner, attr)
    counts.setdefault(key, 0)
    if inspect.iscoroutinefunction(real):

        async def counted_async(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(owner, attr, counted_async)
        return

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, counted)


def put(s3_store: Any, key: str, data: bytes) -> str:
    """Put an object 'as another tool would' (under the store's prefix)."""
    return s3_store.put(key, data)


async def wait_listed(
    mount: CoreMount, done_before: int, count: int = 1, timeout: float = 10.0
) -> None:
    """Wait until ``count`` listings finished after ``done_before`` (a reading
    of ``Namespace.listings_done``): re-listings run in the background."""
    with trio.fail_after(timeout):
        while mount.fs.namespace.listings.listings_done < done_before + count:
            await trio.sleep(0.01)
