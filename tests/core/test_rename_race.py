"""A rename onto an existing name while the renamed file's upload runs must
not lose the file in the bucket.

Found by the model test (``tests/fuse/test_model.py``): ``é x`` is clean in
the bucket, ``dd`` is truncated and rewritten (dirty, its upload starts),
``dd`` is renamed onto ``é x``.  The upload of ``dd`` ends "changed" (the
file is now at another key) and goes again, now to ``é x``.  The rename
queued the delete of the replaced object ``é x`` behind the upload entry;
since a running upload was not moved behind the rename's entries
(``JournalWriter.requeue_upload``), its retry kept its lower sequence
number and ran before that delete: the PUT of the new ``é x`` landed
first, the delete then removed it, and the next listing swept the clean
file.  The bucket lost the file.

The first test holds the first PUT (to ``dd``) until the rename is done,
and the DELETE of ``é x`` until the retried upload had the time to overtake
it.  The fix moves a running upload behind the rename's entries too (its
attempt is superseded, ``tierfs.core.state.journal``); the second test checks
that a flush waiting for the moved entry follows it to its new place.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import trio

from tests.core.conftest import put
from tierfs.meta import ROOT_INO
from tierfs.store.s3 import S3Store

OLD_BODY = b"o" * 1000
NEW_BODY = b"n" * 65535
TARGET = "é x"


class GatedStore:
    """Forwards to a store; the PUT of ``put_key`` and the DELETE of
    ``delete_key`` wait (on their store thread) until their gate is set.
    Records the order of the PUTs and DELETEs as they complete."""

    def __init__(self, inner: Any, put_key: str, delete_key: str) -> None:
        self.inner = inner
        self.put_key = put_key
        self.delete_key = delete_key
        self.put_gate = threading.Event()
        self.delete_gate = threading.Event()
        self.put_started = threading.Event()
        self.done: list[tuple[str, str]] = []

    def put_multipart(self, key: str, *args: Any, **kwargs: Any) -> str:
        if key == self.put_key:
            self.put_started.set()
            assert self.put_gate.wait(30)
        etag: str = self.inner.put_multipart(key, *args, **kwargs)
        self.done.append(("put", key))
        return etag

    def put(self, key: str, *args: Any, **kwargs: Any) -> str:
        etag: str = self.inner.put(key, *args, **kwargs)
        self.done.append(("put", key))
        return etag

    def delete(self, key: str) -> None:
        if key == self.delete_key:
            assert self.delete_gate.wait(30)
        self.inner.delete(key)
        self.done.append(("delete", key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def wait_for(predicate: Any, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return True
    return False


async def test_rename_onto_a_clean_name_during_the_upload_keeps_the_file_in_the_bucket(
    make_fs: Any, s3_store: S3Store
) -> None:
    put(s3_store, TARGET, OLD_BODY)
    put(s3_store, "dd", b"d" * 5000)
    mount = await make_fs()
    fs = mount.fs
    dd = await fs.namespace.resolve("dd")
    await fs.namespace.resolve(TARGET)
    gated = GatedStore(fs.store, put_key="dd", delete_key=TARGET)
    fs.sync.store = gated  # the uploader's store

    opened = await fs.open(dd.ino, os.O_WRONLY | os.O_TRUNC)
    await fs.write(opened.fh, 0, NEW_BODY)
    await fs.release(opened.fh)  # the upload is due after upload_delay (0.05 s)
    assert await wait_for(gated.put_started.is_set, 5), "the upload of dd did not start"

    await fs.rename(ROOT_INO, b"dd", ROOT_INO, TARGET.encode(), 0)
    gated.put_gate.set()  # the first attempt ends "changed": the file moved
    # Give a retried upload the time to overtake the held delete of the
    # replaced object (with the bug it PUTs é x within ~0.1 s).
    await wait_for(lambda: ("put", TARGET) in gated.done, 1.5)
    gated.delete_gate.set()
    await mount.flush()

    names = {info.key for page in s3_store.list_pages("") for info in page.objects}
    assert names == {TARGET}, (names, gated.done)
    assert s3_store.get_range(TARGET, 0, len(NEW_BODY) + 10) == NEW_BODY, gated.done
    # The order the bucket saw: the replaced object went before the new one came.
    assert gated.done.index(("delete", TARGET)) < gated.done.index(("put", TARGET)), gated.done


async def test_a_flush_follows_the_upload_that_a_rename_moved(
    make_fs: Any, s3_store: S3Store
) -> None:
    """A flush waiting for a running upload when a rename moves it (the
    attempt is superseded, a new entry carries the upload) returns only
    once the new entry is done: the file is in the bucket at its new name."""
    put(s3_store, "dd", b"d" * 5000)
    mount = await make_fs()
    fs = mount.fs
    dd = await fs.namespace.resolve("dd")
    gated = GatedStore(fs.store, put_key="dd", delete_key="")
    fs.sync.store = gated  # the uploader's store
    opened = await fs.open(dd.ino, os.O_WRONLY | os.O_TRUNC)
    await fs.write(opened.fh, 0, NEW_BODY)
    await fs.release(opened.fh)
    assert await wait_for(gated.put_started.is_set, 5), "the upload of dd did not start"

    flushed = trio.Event()
    bucket_at_flush: list[bytes] = []

    async def flush() -> None:
        await mount.flush()
        bucket_at_flush.append(s3_store.get_range("z", 0, len(NEW_BODY) + 10))
        flushed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flush)
        await trio.sleep(0.1)
        await fs.rename(ROOT_INO, b"dd", ROOT_INO, b"z", 0)
        # The new entry uploads z while the superseded PUT of dd is held.
        with trio.fail_after(10):
            await flushed.wait()
        assert bucket_at_flush == [NEW_BODY]
        gated.put_gate.set()
    await mount.flush()  # the held PUT of dd ended; the rename's delete of dd follows it
    names = {info.key for page in s3_store.list_pages("") for info in page.objects}
    assert names == {"z"}, (names, gated.done)
    assert s3_store.get_range("z", 0, len(NEW_BODY) + 10) == NEW_BODY
