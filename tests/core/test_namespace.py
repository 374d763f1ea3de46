"""Lazy listing of the bucket into the namespace, without a mount."""

from __future__ import annotations

import logging
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.core.conftest import put, wait_listed
from tierfs.config import NamespaceConfig
from tierfs.errors import NotFound
from tierfs.meta import ROOT_INO
from tierfs.store import ListPage, ObjectInfo

MiB = 1024 * 1024


async def names(mount: Any, path: str = "") -> set[str]:
    inode = await mount.fs.namespace.resolve(path)
    await mount.fs.opendir(inode.ino)
    out: set[str] = set()
    after = 0
    while entries := await mount.fs.names.readdir(inode.ino, after, limit=7):
        out.update(e.name.decode() for e in entries)
        after = entries[-1].cookie
    return out


async def test_listing_shows_files_and_directories(make_fs: Any, s3_store: Any) -> None:
    for key in ("a.txt", "dir/b.txt", "dir/sub/c.txt", "empty/"):
        put(s3_store, key, b"x")
    mount = await make_fs()
    assert await names(mount) == {"a.txt", "dir", "empty"}
    assert await names(mount, "dir") == {"b.txt", "sub"}
    assert await names(mount, "empty") == set()
    attrs = await mount.fs.lookup(ROOT_INO, b"a.txt")
    assert attrs.size == 1 and attrs.mode == 0o100644
    assert (await mount.fs.lookup(ROOT_INO, b"dir")).mode == 0o040755


async def test_new_and_deleted_objects_appear_after_list_ttl(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "old.txt", b"1")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0.3, revalidate_ttl=60))
    assert await names(mount) == {"old.txt"}
    put(s3_store, "new.txt", b"2")
    s3_store.delete("old.txt")
    assert await names(mount) == {"old.txt"}, "within list_ttl the cached listing is served"
    await trio.sleep(0.35)
    done = mount.fs.namespace.listings.listings_done
    # Expired: served as it is, re-listed in the background (stale-while-revalidate).
    assert await names(mount) == {"old.txt"}
    await wait_listed(mount, done)
    assert await names(mount) == {"new.txt"}
    with pytest.raises(NotFound):
        await mount.fs.lookup(ROOT_INO, b"old.txt")


async def test_a_relisting_that_fails_by_a_defect_keeps_a_right_listing(
    make_fs: Any, s3_store: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background re-listing that raises something other than a store
    error (a defect, like the ValueError of ``Journal.watch_deletes`` the
    model found) keeps what its pages merged, sweeps nothing, leaves the
    directory expired, logs the traceback, and the next one completes."""
    put(s3_store, "old.txt", b"1")
    put(s3_store, "kept.txt", b"2")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0.3, revalidate_ttl=60))
    namespace = mount.fs.namespace
    assert await names(mount) == {"old.txt", "kept.txt"}
    listed_at = namespace.get(ROOT_INO).listed_at
    put(s3_store, "new.txt", b"3")
    s3_store.delete("old.txt")
    real_finish = mount.fs.meta.finish_listing

    def broken_finish(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected defect")

    monkeypatch.setattr(mount.fs.meta, "finish_listing", broken_finish)
    await trio.sleep(0.35)
    with caplog.at_level(logging.ERROR, logger="tierfs.core.names.listings"):
        await mount.fs.lookup(ROOT_INO, b"kept.txt")  # starts the re-listing
        with trio.fail_after(10):
            while ROOT_INO in namespace.listings._listing:
                await trio.sleep(0.01)
    failures = [r for r in caplog.records if "re-listing" in r.getMessage()]
    assert failures and failures[0].exc_info is not None, "no traceback in the log"
    assert "injected defect" in str(failures[0].exc_info[1])
    # The merged page stays (new.txt exists in the bucket); nothing is swept
    # (only a complete listing proves old.txt gone); still expired.
    assert await names(mount) == {"old.txt", "kept.txt", "new.txt"}
    assert namespace.get(ROOT_INO).listed_at == listed_at
    assert namespace.listings.expired(ROOT_INO)
    monkeypatch.setattr(mount.fs.meta, "finish_listing", real_finish)
    await trio.sleep(0.35)  # a failed re-listing is not tried again within list_ttl
    done = namespace.listings.listings_done
    await mount.fs.lookup(ROOT_INO, b"kept.txt")
    await wait_listed(mount, done)
    assert await names(mount) == {"kept.txt", "new.txt"}


async def test_inode_numbers_are_stable_across_relisting_and_remount(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "d/f.txt", b"1")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0, revalidate_ttl=60))
    first = (await mount.fs.namespace.resolve("d/f.txt")).ino
    assert (await mount.fs.namespace.resolve("d/f.txt")).ino == first
    mount = await mount.remount()
    assert (await mount.fs.namespace.resolve("d/f.txt")).ino == first


async def test_keys_that_cannot_be_names_are_skipped_with_one_warning(
    make_fs: Any, s3_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bad = ["a//b", "./x", "y/../z", "long/" + "n" * 300]
    for key in [*bad, "ok.txt"]:
        put(s3_store, key, b"x")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0, revalidate_ttl=60))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            top = await names(mount)
            assert await names(mount, "a") == set()
            assert await names(mount, "y") == set()
            assert await names(mount, "long") == set()
    assert top == {"a", "ok.txt", "y", "long"}
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(warnings) == 4, warnings


async def test_directory_wins_over_object_of_the_same_name(
    make_fs: Any, s3_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    put(s3_store, "a", b"file")
    put(s3_store, "a/inner.txt", b"inner")
    put(s3_store, "a.txt", b"between a and a/ in key order")
    mount = await make_fs()
    with caplog.at_level(logging.WARNING):
        assert await names(mount) == {"a", "a.txt"}
    assert (await mount.fs.lookup(ROOT_INO, b"a")).mode & 0o040000
    assert await names(mount, "a") == {"inner.txt"}
    assert any("object is hidden" in r.getMessage() for r in caplog.records)


async def test_a_relisting_keeps_the_directory_that_hides_an_object(
    make_fs: Any, s3_store: Any
) -> None:
    # The object ``d`` comes before the prefix ``d/`` in a page: a re-listing
    # replaced the directory (and dropped its subtree) before the prefix
    # marked it seen: a new inode, and the cached blocks below it dropped.
    put(s3_store, "d", b"file")
    put(s3_store, "d/inner", b"inner")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0.2, revalidate_ttl=60))
    assert await names(mount) == {"d"}
    before = await mount.fs.lookup(ROOT_INO, b"d")
    assert await names(mount, "d") == {"inner"}
    await trio.sleep(0.25)
    done = mount.fs.namespace.listings.listings_done
    assert await names(mount) == {"d"}  # expired: re-lists the root in the background
    await wait_listed(mount, done)
    assert await names(mount) == {"d"}
    after = await mount.fs.lookup(ROOT_INO, b"d")
    assert after.ino == before.ino and after.mode & 0o040000
    assert await names(mount, "d") == {"inner"}


async def test_readdir_resumes_by_cookie_while_entries_change(make_fs: Any, s3_store: Any) -> None:
    for i in range(20):
        put(s3_store, f"f{i:02}", b"x")
    mount = await make_fs()
    await mount.fs.opendir(ROOT_INO)
    first = await mount.fs.names.readdir(ROOT_INO, 0, limit=5)
    rest = []
    after = first[-1].cookie
    while entries := await mount.fs.names.readdir(ROOT_INO, after, limit=5):
        rest += entries
        after = entries[-1].cookie
    assert len({e.name for e in first + rest}) == 20


class SyntheticBucket:
    """An ObjectStore whose single directory holds ``count`` objects, generated
    page by page, so a listing can be measured without storing them."""

    url = "synthetic://bucket"

    def __init__(self, count: int, page_size: int = 1000) -> None:
        self.count = count
        self.page_size = page_size

    def check(self) -> None:
        return None

    def key_fits(self, key: str) -> bool:
        return len(key.encode()) <= 1024

    def reserved(self, key: str) -> bool:
        return False

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[ListPage]:
        if prefix != "big/":
            yield ListPage(objects=[], prefixes=["big/"]) if prefix == "" else ListPage([], [])
            return
        for start in range(0, self.count, self.page_size):
            stop = min(self.count, start + self.page_size)
            yield ListPage(
                objects=[
                    ObjectInfo(f"big/{i:08d}.jpg", 1000, f"etag{i}", 1.7e9)
                    for i in range(start, stop)
                ],
                prefixes=[],
            )

    def head(self, key: str) -> ObjectInfo:
        raise NotImplementedError

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes:
        raise NotImplementedError

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list_uploads(self, prefix: str = "") -> list[Any]:
        return []


@pytest.mark.parametrize(
    ("count", "peak_bound"),
    [
        # One page of 1000 entries costs well under 2 MiB in Python objects;
        # all 100,000 at once would cost over 30 MiB.
        pytest.param(100_000, 8 * MiB, marks=pytest.mark.slow, id="100k"),
        # Measured: the listing peaks near 1.1 MiB, while the 30 pages alone,
        # held at once, are 7.7 MiB.  (tracemalloc makes every allocation
        # slow: 30,000 entries take a third of the time of 100,000.)
        pytest.param(30_000, 4 * MiB, id="30k"),
    ],
)
async def test_listing_many_objects_streams_pages_into_lmdb(
    tmp_path: Path, count: int, peak_bound: int
) -> None:
    from tests.core.conftest import _start, make_config

    bucket = SyntheticBucket(count)
    config = make_config(tmp_path, bucket.url)
    registry: list[Any] = []
    async with trio.open_nursery() as nursery:
        mount = await _start(config, bucket, nursery, registry)  # type: ignore[arg-type]
        tracemalloc.start()
        try:
            inode = await mount.fs.namespace.resolve("big")
            await mount.fs.opendir(inode.ino)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < peak_bound, f"listing peaked at {peak / MiB:.1f} MiB"
        assert mount.fs.meta.count_children(inode.ino) == count
        last = f"{count - 1:08d}.jpg".encode()
        assert (await mount.fs.lookup(inode.ino, last)).size == 1000
        await mount.aclose()
        nursery.cancel_scope.cancel()
