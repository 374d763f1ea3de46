"""One name reused across types (file, directory, fifo, file) while the
delete of its first object is still owed, over a real
bucket (moto), no mount.

The rule: the bucket's changes for one name apply in the order the mount
made them, so nothing is put at ``n0/`` or ``n0`` (a marker, a fifo, a new
file) before the delete of the old object ``n0`` is done; and no listing
brings the old object back while that delete is owed, whatever happened to
the name since.  Here the delete is held at the store while the name is
reused and the directory re-listed."""

from __future__ import annotations

import stat
import threading
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, put
from tierfs.config import NamespaceConfig
from tierfs.errors import NotFound
from tierfs.meta import ROOT_INO

SHORT_TTL = NamespaceConfig(list_ttl=0.2, revalidate_ttl=60)


class Recorder:
    """The store's mutating calls, in the order they reached the store; a
    delete of ``hold`` waits until ``release`` is set."""

    def __init__(self, mount: CoreMount, hold: str) -> None:
        self.calls: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.held = threading.Event()
        store = mount.store
        for name in ("put", "put_multipart", "delete", "copy"):
            real = getattr(store.inner, name)
            setattr(store, name, self._wrap(name, real, hold))

    def _wrap(self, name: str, real: Any, hold: str) -> Any:
        def call(key: str, *args: Any, **kwargs: Any) -> Any:
            if name == "delete" and key == hold:
                self.held.set()
                assert self.release.wait(30)
            self.calls.append((name, key))
            return real(key, *args, **kwargs)

        return call

    def data_calls(self) -> list[tuple[str, str]]:
        return [(op, key) for op, key in self.calls if not key.startswith(".tierfs-attrs/")]


async def listed_names(mount: CoreMount, dir_ino: int) -> list[bytes]:
    """The names of the directory after a re-listing (past its list_ttl)."""
    await trio.sleep(0.25)
    done = mount.fs.namespace.listings.listings_done
    handle = await mount.fs.opendir(dir_ino)  # starts the re-listing
    with trio.fail_after(10):
        while mount.fs.namespace.listings.listings_done <= done:
            await trio.sleep(0.01)
    mount.fs.releasedir(handle)
    return sorted(e.name for e in await mount.fs.names.readdir(dir_ino, 0, 100))


async def test_a_reused_name_waits_for_the_owed_delete_and_never_comes_back(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "d/keep", b"k")
    put(s3_store, "d/n0", b"old object")
    mount = await make_fs(namespace=SHORT_TTL)
    d = await mount.fs.lookup(ROOT_INO, b"d")
    await mount.fs.opendir(d.ino)
    assert (await mount.fs.lookup(d.ino, b"n0")).size == 10
    recorder = Recorder(mount, hold="d/n0")

    await mount.fs.unlink(d.ino, b"n0")
    with trio.fail_after(10):
        while not recorder.held.is_set():
            await trio.sleep(0.01)  # the delete of the old object is on its way, held
    assert b"n0" not in await listed_names(mount, d.ino)

    made = await mount.fs.mkdir(d.ino, b"n0", 0o755, 0, 0)
    assert stat.S_ISDIR(made.mode)
    await trio.sleep(0.3)  # the uploader looks at the marker meanwhile
    assert b"n0" in await listed_names(mount, d.ino)
    assert stat.S_ISDIR((await mount.fs.lookup(d.ino, b"n0")).mode)
    await mount.fs.rmdir(d.ino, b"n0")
    assert b"n0" not in await listed_names(mount, d.ino)

    fifo = await mount.fs.mknod(d.ino, b"n0", stat.S_IFIFO | 0o644, 0, 0)
    assert stat.S_ISFIFO(fifo.mode)
    await trio.sleep(0.3)
    assert stat.S_ISFIFO((await mount.fs.lookup(d.ino, b"n0")).mode)
    await mount.fs.unlink(d.ino, b"n0")
    names = await listed_names(mount, d.ino)
    assert b"n0" not in names, "a listing brought back the object whose delete is owed"
    with pytest.raises(NotFound):
        await mount.fs.lookup(d.ino, b"n0")
    # Nothing reached the bucket at n0 or n0/ before the old object's delete.
    assert [c for c in recorder.data_calls() if c[1].startswith("d/n0")] == []

    await mount.write_file("d/n0", b"the new file")
    recorder.release.set()
    await mount.flush()
    calls = [c for c in recorder.data_calls() if c[1].startswith("d/n0")]
    assert calls[0] == ("delete", "d/n0"), calls
    assert s3_store.get_range("d/n0", 0, 100) == b"the new file"
    keys = [o.key for page in s3_store.list_pages("d/") for o in page.objects]
    assert sorted(keys) == ["d/keep", "d/n0"]
