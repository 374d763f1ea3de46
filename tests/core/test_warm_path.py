"""The warm small-file path (issue 15 item 2), counted, not timed: lookup,
getattr, open, read and release of resident small files open no LMDB write
transaction, hop to no thread, send nothing to the bucket, and read no more
inode records than they need (a lookup: the directory's and the child's)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

from tests.core.conftest import put
from tierfs.errors import NotFound

KiB = 1024
FILES = 12


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

    counts = {"write": 0, "thread": 0, "get_inode": 0}
    real_write, real_get_inode = meta.write, meta.get_inode
    real_run_sync = trio.to_thread.run_sync

    def counted_write() -> Any:
        counts["write"] += 1
        return real_write()

    def counted_get_inode(ino: int) -> Any:
        counts["get_inode"] += 1
        return real_get_inode(ino)

    async def counted_run_sync(*args: Any, **kwargs: Any) -> Any:
        counts["thread"] += 1
        return await real_run_sync(*args, **kwargs)

    monkeypatch.setattr(meta, "write", counted_write)
    monkeypatch.setattr(meta, "get_inode", counted_get_inode)
    monkeypatch.setattr(trio.to_thread, "run_sync", counted_run_sync)
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
