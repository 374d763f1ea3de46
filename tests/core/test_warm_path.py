"""The warm small-file path, counted, not timed: lookup,
getattr, open, read and release of resident small files open no LMDB write
transaction, hop to no thread, send nothing to the bucket, and read no more
inode records than they need (a lookup: the directory's and the child's).
The same through the FUSE operations, as the daemon runs them, with the
directory readahead following a shuffled reader's opens."""

from __future__ import annotations

import os
import random
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from tierfsd.fuse_ops import TierfsOperations

from tests.core.conftest import count_calls, put
from tierfs.errors import NotFound
from tierfs.workers.wiring import dir_readahead_for

KiB = 1024
FILES = 12
#: Files of the run through the FUSE operations, and who opens them.
RUN_FILES = 40
CTX = SimpleNamespace(uid=0, gid=0, pid=1)


async def test_warm_small_files_cost_no_write_no_thread_no_request(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"w/f{i:02d}": os.urandom(KiB + 1301 * i) for i in range(FILES)}
    for key, data in files.items():
        put(s3_store, key, data)
    mount = await make_fs()
    fs, meta, store = mount.fs, mount.fs.meta, mount.store
    for key, data in files.items():  # cold: fetched to the tier
        assert await mount.read_file(key) == data
    directory = await fs.namespace.resolve("w")
    await trio.sleep(0.3)  # the group commit of the fetched blocks ran

    counts: dict[str, int] = {}
    count_calls(monkeypatch, counts, "write", meta, "write")
    count_calls(monkeypatch, counts, "get_inode", meta, "get_inode")
    count_calls(monkeypatch, counts, "thread", trio.to_thread, "run_sync")
    requests = (len(store.gets), store.heads, len(store.lists))

    for key, data in files.items():
        name = key.split("/")[1].encode()
        counts["get_inode"] = 0
        attrs = await fs.lookup(directory.ino, name)
        assert counts["get_inode"] == 2, "a warm lookup reads the directory and the child once"
        assert attrs.timeout == mount.config.namespace.list_ttl
        assert (await fs.getattr(attrs.ino)).size == len(data)
        opened = await fs.open(attrs.ino, os.O_RDONLY)
        assert opened.keep_cache, "an unchanged resident file keeps the kernel's pages"
        assert bytes(await fs.read(opened.fh, 0, 128 * KiB)) == data
        await fs.flush(opened.fh)
        await fs.release(opened.fh)
    with pytest.raises(NotFound):
        await fs.lookup(directory.ino, b"absent")
    # An absent name of a fresh listing: the kernel may remember it as long
    # as the listing stays fresh, never longer.
    assert 0 < fs.negative_timeout(directory.ino) <= mount.config.namespace.list_ttl

    assert counts["write"] == 0, "no LMDB write transaction on the warm path"
    assert counts["thread"] == 0, "no thread hop on the warm path"
    assert (len(store.gets), store.heads, len(store.lists)) == requests


async def test_warm_open_flush_release_do_no_avoidable_work(
    make_fs: Any, s3_store: Any, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [f"d{d}/{i:02d}.bin" for d in range(2) for i in range(RUN_FILES // 2)]
    for i, path in enumerate(paths):
        put(s3_store, path, bytes([i]) * (1000 + 100 * i))
    mount = await make_fs()
    readahead = dir_readahead_for(mount.fs, max_files=8)
    await nursery.start(readahead.run)
    for path in paths:  # the warm-up: every file resident
        await mount.read_file(path)
    inos = [(await mount.fs.namespace.resolve(path)).ino for path in paths]
    with trio.fail_after(20):  # what the warm-up's opens fetched ahead has landed
        while not readahead.idle() or mount.fs.open_files.files:
            await trio.sleep(0.02)
    ops = TierfsOperations(mount.fs)
    store_calls = (len(mount.store.gets), mount.store.heads, len(mount.store.lists))
    fetched_ahead = readahead.status()["files_fetched"]  # by the warm-up, in order

    meta = mount.fs.meta
    counts: dict[str, int] = {}
    count_calls(monkeypatch, counts, "write", meta, "write")
    count_calls(monkeypatch, counts, "read", meta, "_read")
    count_calls(monkeypatch, counts, "thread", trio.to_thread, "run_sync")
    order = inos[:]
    random.Random(15).shuffle(order)
    for ino in order:
        info = await ops.open(ino, os.O_RDONLY, CTX)
        assert info.keep_cache
        handle = mount.fs.handles.get(info.fh)
        # Nothing that only a read or a write would use: no readahead
        # state, no caller (its writes would clear setuid/setgid).
        assert handle.read_state is None
        assert handle.caller is None
        await ops.flush(info.fh)
        await ops.release(info.fh)
    assert counts["write"] == 0
    assert counts["thread"] == 0
    # Per file: the inode, its block map, its readdir cookie, and for some
    # opens the next ``slack`` keys of the readdir order (dirahead).
    assert counts["read"] <= 4 * len(order), counts
    assert (len(mount.store.gets), mount.store.heads, len(mount.store.lists)) == store_calls
    assert readahead.status()["files_fetched"] == fetched_ahead
    # A read makes the readahead state; a writer's open keeps its caller.
    info = await ops.open(inos[0], os.O_RDWR, CTX)
    assert await ops.read(info.fh, 0, 100) == bytes([0]) * 100
    handle = mount.fs.handles.get(info.fh)
    assert handle.read_state is not None
    assert handle.caller is not None and handle.caller.pid == 1
    await ops.release(info.fh)


async def test_fuse_errors_keep_their_errno_and_a_bug_is_eio(
    make_fs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one errno wrapper of the FUSE operations (its success path was
    made lighter): each request is counted and timed; a TierfsError or an
    OSError keeps its errno, anything else is EIO; trio's cancellation
    passes through untouched."""
    import errno

    import pyfuse3

    mount = await make_fs()
    ops = TierfsOperations(mount.fs)
    faults: list[BaseException] = []

    async def failing_readlink(ino: int) -> bytes:
        raise faults.pop()

    monkeypatch.setattr(mount.fs, "readlink", failing_readlink)
    requests = mount.fs.requests
    for fault, expected in (
        (NotFound("gone"), errno.ENOENT),
        (OSError(errno.ENOSPC, "full"), errno.ENOSPC),
        (OSError("no errno"), errno.EIO),
        (RuntimeError("a bug"), errno.EIO),
        (pyfuse3.FUSEError(errno.EPERM), errno.EPERM),
    ):
        faults.append(fault)
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await ops.readlink(1, CTX)
        assert raised.value.errno == expected, fault
    with trio.CancelScope() as scope:
        scope.cancel()
        faults.append(trio.Cancelled._create())  # type: ignore[attr-defined]
        await ops.readlink(1, CTX)
    assert scope.cancelled_caught
    stats = ops.op_metrics["readlink"]
    assert stats.count == 6
    assert stats.errors == 4  # ENOENT is an ordinary answer, not a failure
    assert mount.fs.requests == requests + 6
