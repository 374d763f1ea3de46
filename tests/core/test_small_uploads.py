"""Uploads of many small files: PUTs in parallel, completions marked clean in
batches (one transaction for many entries), without giving up a change made
while a file was in a batch."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.core.conftest import MiB
from tests.core.test_attrs_shadow import (
    SHADOW,
    RefusingStore,
    all_keys,
    create_file,
    fresh_node,
    shadow_keys,
    wait_for,
)
from tierfs.config import WriteConfig
from tierfs.core.write import sync as sync_module
from tierfs.meta import ROOT_INO, SyncState

#: More single PUTs than the four multipart uploads the uploader may run.
IN_FLIGHT = 8


def get(s3_store: Any, key: str) -> bytes:
    info = s3_store.head(key)
    return s3_store.get_range(key, 0, info.size) if info.size else b""


def record_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The entries of each clean-marking transaction, in order."""
    batches: list[list[int]] = []
    mark_clean = sync_module.Sync._mark_clean

    def recording(self: sync_module.Sync, batch: list[Any]) -> None:
        batches.append([done.seq for done in batch])
        mark_clean(self, batch)

    monkeypatch.setattr(sync_module.Sync, "_mark_clean", recording)
    return batches


async def test_small_files_go_up_in_parallel_and_are_marked_clean_together(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = record_batches(monkeypatch)
    # Wide enough that the PUTs the barrier releases together land in one batch.
    monkeypatch.setattr(sync_module, "CLEAN_BATCH_WAIT", 0.5)
    mount = await make_fs()
    # Each PUT waits until IN_FLIGHT of them are on the wire at once: with
    # fewer PUTs in flight the barrier breaks and the uploads fail.
    barrier = threading.Barrier(IN_FLIGHT, timeout=10)
    put_multipart = mount.store.inner.put_multipart

    def put_together(*args: Any, **kwargs: Any) -> str:
        barrier.wait()
        return put_multipart(*args, **kwargs)

    mount.store.put_multipart = put_together
    files = {f"d/f{i}.bin": bytes([i]) * (4096 + i) for i in range(IN_FLIGHT)}
    await mount.fs.mkdir(1, b"d", 0o755, 0, 0)
    for path, data in files.items():
        await mount.write_file(path, data, fsync=False)
    await mount.flush()
    assert not barrier.broken
    for path, data in files.items():
        assert get(s3_store, path) == data
        assert (await mount.fs.namespace.resolve(path)).state == SyncState.CLEAN
    uploads = [b for b in batches if b]
    assert sum(len(b) for b in uploads) == IN_FLIGHT
    assert max(len(b) for b in uploads) == IN_FLIGHT, f"batches: {uploads}"


async def test_a_file_written_while_its_batch_waits_stays_dirty_and_goes_up_again(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_module, "CLEAN_BATCH_WAIT", 0.5)
    mount = await make_fs()
    put_done = trio.Event()
    put_multipart = mount.store.inner.put_multipart
    token = trio.lowlevel.current_trio_token()

    def put_and_tell(*args: Any, **kwargs: Any) -> str:
        etag = put_multipart(*args, **kwargs)
        trio.from_thread.run_sync(put_done.set, trio_token=token)
        return etag

    mount.store.put_multipart = put_and_tell
    ino = await mount.write_file("c.bin", b"old" * 1000, fsync=False)
    mount.fs.journal.hurry()
    with trio.fail_after(10):
        await put_done.wait()
        while not mount.fs.sync._uploaded:  # the upload waits in its batch
            await trio.sleep(0.001)
    # The old bytes are in the bucket; the batch that would mark the file
    # clean waits.  A new write now must win.
    await mount.write_file("c.bin", b"new" * 1000, fsync=False)
    await mount.flush()
    assert get(s3_store, "c.bin") == b"new" * 1000
    inode = mount.fs.meta.get_inode(ino)
    assert inode is not None and inode.state == SyncState.CLEAN
    assert await mount.read_file("c.bin") == b"new" * 1000


async def test_uploads_marked_clean_in_a_batch_survive_a_remount(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = record_batches(monkeypatch)
    mount = await make_fs()
    files = {f"r{i}.bin": bytes([65 + i]) * 5000 for i in range(5)}
    for path, data in files.items():
        await mount.write_file(path, data)
    await mount.flush()
    assert batches
    mount = await mount.remount()
    assert len(mount.fs.journal) == 0
    for path, data in files.items():
        inode = await mount.fs.namespace.resolve(path)
        assert inode.state == SyncState.CLEAN
        assert await mount.read_file(path) == data
        assert get(s3_store, path) == data


async def test_a_directory_renamed_after_its_keys_were_remembered_uploads_at_the_new_keys(
    make_fs: Any, s3_store: Any
) -> None:
    """``Namespace.key_of`` remembers directory keys; a rename of a directory
    above queued uploads must make them go to the new keys, not the old."""
    mount = await make_fs(write=WriteConfig(mode="back", upload_delay=60.0, part_size=8 * MiB))
    fs = mount.fs
    top = await fs.mkdir(1, b"a", 0o755, 0, 0)
    await fs.mkdir(top.ino, b"b", 0o755, 0, 0)
    files = {f"a/b/f{i}": bytes([97 + i]) * (100 + i) for i in range(3)}
    inos = [await mount.write_file(path, data, fsync=False) for path, data in files.items()]
    # The uploads wait out upload_delay; their keys are remembered meanwhile.
    for ino, path in zip(inos, files, strict=True):
        inode = fs.meta.get_inode(ino)
        assert inode is not None
        assert fs.namespace.key_of(inode) == path
        assert fs.sync.entry_keys(fs.journal.upload_seq[ino], {"op": "upload", "ino": ino}) == [
            path
        ]
    await fs.rename(1, b"a", 1, b"z", 0)
    for ino, path in zip(inos, files, strict=True):
        inode = fs.meta.get_inode(ino)
        assert inode is not None
        assert fs.namespace.key_of(inode) == "z" + path[1:]
    await mount.flush()
    keys = all_keys(s3_store)
    for path, data in files.items():
        assert "z" + path[1:] in keys
        assert path not in keys
        assert get(s3_store, "z" + path[1:]) == data


async def test_an_upload_is_marked_clean_only_after_the_stale_shadow_of_its_key_is_gone(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    """The batch's transaction reads the file's shadow ledger: a file whose
    key still has another shadow entry is not marked clean before that
    entry is deleted from the bucket (here the delete fails: the file stays
    dirty, its entry stays, until the delete goes through)."""
    first = await make_fs()
    await create_file(first, "f.bin", b"old", 0o600, 0, 0)
    await first.flush()
    assert shadow_keys(s3_store) == {f"{SHADOW}/f.bin@m0600,u0,g0"}
    await first.aclose()
    refusing = RefusingStore(first.store)
    writer = await fresh_node(first, tmp_path, "writer", store=refusing)
    ino = (await writer.fs.lookup(ROOT_INO, b"f.bin")).ino  # its listing fills the ledger
    assert writer.fs.meta.shadow_ledger(ino) == [("f.bin", 0o600, 0, 0)]
    refusing.refuse = {"delete"}
    opened = await writer.fs.open(ino, os.O_WRONLY | os.O_TRUNC)
    await writer.fs.write(opened.fh, 0, b"new bytes")
    await writer.fs.setattr(ino, mode=0o644)  # canonical: no shadow wanted any more
    await writer.fs.release(opened.fh)
    await wait_for(lambda: get(s3_store, "f.bin") == b"new bytes")
    await wait_for(lambda: writer.fs.journal.failures.get(writer.fs.journal.upload_seq[ino], 0) > 0)
    inode = writer.fs.meta.get_inode(ino)
    assert inode is not None and inode.state != SyncState.CLEAN
    assert ino in writer.fs.journal.upload_seq
    assert shadow_keys(s3_store) == {f"{SHADOW}/f.bin@m0600,u0,g0"}
    refusing.refuse = set()
    await writer.flush()
    inode = writer.fs.meta.get_inode(ino)
    assert inode is not None and inode.state == SyncState.CLEAN
    assert shadow_keys(s3_store) == set()
    assert writer.fs.meta.shadow_ledger(ino) == []
    assert int(s3_store.head("f.bin").metadata["mode"]) & 0o7777 == 0o644
