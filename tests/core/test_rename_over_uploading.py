"""A clean file renamed over a file whose upload runs stays readable.

Found by the model test (``tests/fuse/test_model.py``; hypothesis could not
replay it: timing): ``a`` is clean in the bucket, ``dd`` is dirty and its
upload runs (``dd`` is truncated meanwhile: "changed during its upload"),
``a`` is renamed over ``dd``.  The listing then shows ``dd`` and ``lstat``
works, but ``open(dd)`` fails with ENOENT.

The rename sets the inode's origin to ``dd`` at once and queues the copy
``a -> dd`` behind the replaced file's entries on ``dd`` (its upload, then
the delete of its object).  Until that copy ran, the bucket's ``dd`` is not
this file: absent (the old file never reached the bucket) or the replaced
file's object.  An open past ``revalidate_ttl`` of a file with blocks on a
tier HEADs the origin key: ENOENT in the first case (and the parent is
marked for a re-listing), and in the second the replaced file's ETag and
size are taken for this file, and its cached blocks are dropped.

The tests hold the replaced file's PUT (its upload is running), let the
revalidation become due, rename, and open, read, stat and list the
directory; then let the upload end, flush, check the bucket, remount and
read again.  The last test holds the copy itself instead (no upload runs):
the rename's delete of the replaced object goes first, the HEAD found
nothing.  All of them failed before ``Namespace.revalidate`` left
protected inodes alone.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, put
from tests.core.test_rename_race import GatedStore, wait_for
from tierfs.config import NamespaceConfig
from tierfs.meta import ROOT_INO
from tierfs.store.s3 import S3Store

A_BODY = b"a" * 65536
DD_BODY = b"d" * 11313
OLD_DD_IN_BUCKET = b"o" * 211625
#: Short enough that the open after the rename HEADs the origin.
REVALIDATE_TTL = 0.2


def bucket_names(s3_store: S3Store) -> set[str]:
    return {info.key for page in s3_store.list_pages("") for info in page.objects}


async def check_dd_is_a(mount: CoreMount) -> None:
    """``dd`` is the renamed file: listed, stat-able, openable, its bytes."""
    fs = mount.fs
    names = {entry.name for entry in await fs.names.readdir(ROOT_INO, 0)}
    assert names == {b"dd"}, names
    dd = await fs.namespace.resolve("dd")
    attrs = await fs.getattr(dd.ino)
    assert stat.S_ISREG(attrs.mode) and attrs.size == len(A_BODY), attrs
    assert await mount.read_file("dd") == A_BODY


@pytest.mark.parametrize("old_dd_in_bucket", [False, True], ids=["dd-new", "dd-in-bucket"])
@pytest.mark.parametrize("truncate_during_upload", [False, True], ids=["", "truncated"])
async def test_open_after_renaming_a_clean_file_over_an_uploading_one(
    make_fs: Any, s3_store: S3Store, old_dd_in_bucket: bool, truncate_during_upload: bool
) -> None:
    if old_dd_in_bucket:
        put(s3_store, "dd", OLD_DD_IN_BUCKET)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=REVALIDATE_TTL))
    fs = mount.fs
    await mount.write_file("a", A_BODY)
    await mount.flush("a")  # clean, its blocks on a tier
    gated = GatedStore(fs.store, put_key="dd", delete_key="")
    fs.sync.store = gated  # the uploader's store; HEADs and GETs are not held

    dd_ino = await mount.write_file("dd", DD_BODY)
    assert await wait_for(gated.put_started.is_set, 5), "the upload of dd did not start"
    if truncate_during_upload:
        await fs.setattr(dd_ino, size=1525)
        await fs.setattr(dd_ino, size=0)
        await fs.setattr(dd_ino, size=211625)
    await trio.sleep(REVALIDATE_TTL + 0.05)  # a's ETag is due for a HEAD
    await fs.rename(ROOT_INO, b"a", ROOT_INO, b"dd", 0)

    try:
        await check_dd_is_a(mount)  # the old dd's PUT is still held
    finally:
        gated.put_gate.set()
    await mount.flush()
    await trio.sleep(REVALIDATE_TTL + 0.05)
    await check_dd_is_a(mount)
    assert bucket_names(s3_store) == {"dd"}, gated.done
    assert s3_store.get_range("dd", 0, len(A_BODY) + 10) == A_BODY

    mount = await mount.remount()
    await trio.sleep(REVALIDATE_TTL + 0.05)
    await check_dd_is_a(mount)


async def test_open_while_the_copy_of_a_renamed_clean_file_waits(
    make_fs: Any, s3_store: S3Store
) -> None:
    """The same, with the upload ending only after the open: the open must
    not drop the name, and the upload of the replaced file must not become
    the content of the renamed one."""
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=REVALIDATE_TTL))
    fs = mount.fs
    await mount.write_file("a", A_BODY)
    await mount.flush("a")
    gated = GatedStore(fs.store, put_key="dd", delete_key="")
    fs.sync.store = gated
    await mount.write_file("dd", DD_BODY)
    assert await wait_for(gated.put_started.is_set, 5), "the upload of dd did not start"
    await trio.sleep(REVALIDATE_TTL + 0.05)
    await fs.rename(ROOT_INO, b"a", ROOT_INO, b"dd", 0)
    dd = await fs.namespace.resolve("dd")
    try:
        opened = await fs.open(dd.ino, os.O_RDONLY)
    finally:
        gated.put_gate.set()  # the replaced file's PUT lands while dd is open
    await mount.flush()
    assert await fs.read(opened.fh, 0, len(A_BODY) + 10) == A_BODY
    await fs.release(opened.fh)
    await check_dd_is_a(mount)
    assert s3_store.get_range("dd", 0, len(A_BODY) + 10) == A_BODY


class CopyGatedStore(GatedStore):
    """Also holds the server-side copies (on their store thread) until
    ``copy_gate`` is set."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, put_key="", delete_key="")
        self.copy_gate = threading.Event()
        self.copy_started = threading.Event()

    def copy(self, src: str, dst: str, *args: Any, **kwargs: Any) -> str:
        self.copy_started.set()
        assert self.copy_gate.wait(30)
        etag: str = self.inner.copy(src, dst, *args, **kwargs)
        self.done.append(("copy", dst))
        return etag


async def test_open_while_the_copy_over_a_clean_name_runs(make_fs: Any, s3_store: S3Store) -> None:
    """No upload runs: ``dd`` is clean in the bucket, ``a`` is renamed over
    it and the copy ``a -> dd`` is held.  An open meanwhile must not take
    the replaced object's ETag and size for ``a``'s."""
    put(s3_store, "dd", OLD_DD_IN_BUCKET)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=REVALIDATE_TTL))
    fs = mount.fs
    await fs.namespace.resolve("dd")
    await mount.write_file("a", A_BODY)
    await mount.flush("a")
    gated = CopyGatedStore(fs.store)
    fs.sync.store = gated
    await trio.sleep(REVALIDATE_TTL + 0.05)
    await fs.rename(ROOT_INO, b"a", ROOT_INO, b"dd", 0)
    try:
        assert await wait_for(gated.copy_started.is_set, 5), "the copy a -> dd did not start"
        await check_dd_is_a(mount)
    finally:
        gated.copy_gate.set()
    await mount.flush()
    await trio.sleep(REVALIDATE_TTL + 0.05)
    await check_dd_is_a(mount)
    assert bucket_names(s3_store) == {"dd"}, gated.done
    assert s3_store.get_range("dd", 0, len(A_BODY) + 10) == A_BODY


async def test_a_crash_while_the_replaced_file_uploads_keeps_the_renamed_one(
    make_fs: Any, s3_store: S3Store
) -> None:
    """A crash after the rename, while the replaced file's upload runs: that
    file's inode is still in LMDB (it goes at its last use, which the crash
    skips).  The next mount deletes it (``MetaDB`` ``unlinked``), so its
    upload entry is obsolete and the old bytes are never put again; the
    bucket ends with the renamed file's bytes at ``dd``, nothing else."""
    put(s3_store, "dd", OLD_DD_IN_BUCKET)
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=60, revalidate_ttl=REVALIDATE_TTL))
    fs = mount.fs
    await mount.write_file("a", A_BODY)
    await mount.flush("a")
    gated = GatedStore(fs.store, put_key="dd", delete_key="")
    fs.sync.store = gated
    dd_ino = await mount.write_file("dd", DD_BODY)
    assert await wait_for(gated.put_started.is_set, 5), "the upload of dd did not start"
    await fs.rename(ROOT_INO, b"a", ROOT_INO, b"dd", 0)
    assert fs.meta.get_inode(dd_ino) is not None and dd_ino in fs.journal.upload_seq
    fs.meta.sync()
    fs.open_files.idle_listeners.clear()  # the crash: the replaced inode is never removed
    gated.put_gate.set()  # (the held PUT may land or not: the stop waits for its thread)
    await mount.aclose()

    puts_before = s3_store.calls["PutObject"]
    mount = await mount.remount()
    assert mount.fs.meta.swept_unlinked == 1
    assert mount.fs.meta.get_inode(dd_ino) is None
    assert mount.fs.meta.residency(dd_ino) == {}
    await mount.flush()
    assert s3_store.calls["PutObject"] == puts_before, "the replaced file was put again"
    await trio.sleep(REVALIDATE_TTL + 0.05)
    await check_dd_is_a(mount)
    assert bucket_names(s3_store) == {"dd"}
    assert s3_store.get_range("dd", 0, len(A_BODY) + 10) == A_BODY
