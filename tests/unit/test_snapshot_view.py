"""A snapshot as a store (``tierfs.snapshot.view``), on moto and the
``file://`` store: listings and HEADs from the record (no request to the
bucket), reads of the recorded bytes after the bucket changed, clear errors
when they are gone, the index built once and checked, changes refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tierfs.errors import ObjectNotFound, PreconditionFailed
from tierfs.snapshot.record import RecordStore, SnapshotDamaged
from tierfs.snapshot.view import (
    RecordedVersionGone,
    SnapshotIndex,
    SnapshotReadOnly,
    SnapshotStore,
)
from tierfs.snapshot.walk import take_snapshot
from tierfs.store import ObjectStore


class CountingStore:
    """The real store, with the name of every call that reached it."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return target(*args, **kwargs)

        return call


def fill(store: ObjectStore) -> None:
    for key in ("a.txt", "ds/0.bin", "ds/sub/1.bin", "ds/sub/deeper/2.bin", "z.bin"):
        store.put(key, f"recorded {key}".encode())
    store.put("ds/empty/", b"")
    store.put(".tierfs-attrs/ds/0.bin@m0600,u1000,g1000", b"")
    store.put(".tierfs-attrs/ds/empty@m0700,u1000,g1000", b"")
    store.put(".tierfs-attrs/ds/sub@m0750,u1000,g100", b"")  # no marker for ds/sub


def open_view(store: ObjectStore, tmp_path: Path, name: str = "snap") -> SnapshotStore:
    records = RecordStore(store)
    index = SnapshotIndex.open(tmp_path / f"{name}.sqlite", records, records.manifest(name))
    return SnapshotStore(CountingStore(store), index)  # type: ignore[arg-type]


def listing(view: SnapshotStore, prefix: str, page_size: int = 1000) -> tuple[list[str], list[str]]:
    pages = list(view.list_pages(prefix, page_size))
    assert pages, "a listing has at least one page"
    return (
        [o.key for page in pages for o in page.objects],
        [p for page in pages for p in page.prefixes],
    )


def test_listings_and_heads_come_from_the_record(store: ObjectStore, tmp_path: Path) -> None:
    fill(store)
    take_snapshot(store, "snap", [], creator_uid=0)
    store.put("new.bin", b"made after")  # not in the snapshot
    store.delete("a.txt")
    view = open_view(store, tmp_path)
    assert listing(view, "") == (["a.txt", "z.bin"], ["ds/"])
    assert listing(view, "ds/") == (["ds/0.bin"], ["ds/empty/", "ds/sub/"])
    assert listing(view, "ds/empty/") == (["ds/empty/"], [])  # its marker
    assert listing(view, "ds/sub/", page_size=1) == (
        ["ds/sub/", "ds/sub/1.bin"],
        ["ds/sub/deeper/"],
    )
    assert listing(view, "nothing/") == ([], [])
    assert view.head("ds/0.bin").size == len(b"recorded ds/0.bin")
    with pytest.raises(ObjectNotFound):
        view.head("new.bin")
    # The attributes: one shadow entry per child with stored ones.
    shadows, _ = listing(view, ".tierfs-attrs/ds/")
    assert shadows == [
        ".tierfs-attrs/ds/0.bin@m0600,u1000,g1000",
        ".tierfs-attrs/ds/empty@m0700,u1000,g1000",
        ".tierfs-attrs/ds/sub@m0750,u1000,g100",
    ]
    assert listing(view, ".tierfs-attrs/") == ([], [])
    assert view.inner.calls == []  # type: ignore[attr-defined]


def test_reads_get_the_recorded_bytes_or_a_clear_error(store: ObjectStore, tmp_path: Path) -> None:
    fill(store)
    manifest = take_snapshot(store, "snap", [], creator_uid=0)
    view = open_view(store, tmp_path)
    assert view.get_range("ds/0.bin", 0, 100) == b"recorded ds/0.bin"
    store.put("ds/0.bin", b"overwritten")
    store.delete("z.bin")
    if manifest.versioned:  # the recorded versions are still there
        assert view.get_range("ds/0.bin", 0, 100) == b"recorded ds/0.bin"
        bufs = [memoryview(bytearray(8))]
        assert view.get_range_into("z.bin", 0, bufs) == 8 and bytes(bufs[0]) == b"recorded"
    else:  # the ETag check: the bytes are gone, and the error says so
        with pytest.raises(PreconditionFailed, match=r"snapshot 'snap': ds/0\.bin changed"):
            view.get_range("ds/0.bin", 0, 100)
        with pytest.raises(RecordedVersionGone, match=r"no longer holds z\.bin"):
            view.get_range_into("z.bin", 0, [memoryview(bytearray(8))])
    with pytest.raises(ObjectNotFound, match="not in snapshot"):
        view.get_range("new.bin", 0, 1)


def test_on_a_versioned_bucket_an_expired_version_is_named(
    bucket: tuple[str, str], s3_client: Any, s3_store: Any, tmp_path: Path
) -> None:
    _endpoint, name = bucket
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3_store.put("a.bin", b"recorded")
    manifest = take_snapshot(s3_store, "snap", [], creator_uid=0)
    assert manifest.versioned
    view = open_view(s3_store, tmp_path)
    entry = view.index.get("a.bin")
    assert entry is not None and entry.version
    s3_store.put("a.bin", b"newer")
    assert view.get_range("a.bin", 0, 100) == b"recorded"
    s3_client.delete_object(Bucket=name, Key=s3_store.prefix + "a.bin", VersionId=entry.version)
    with pytest.raises(
        RecordedVersionGone, match=re.escape(f"recorded version {entry.version} of a.bin")
    ):
        view.get_range("a.bin", 0, 100)


def test_changes_are_refused(store: ObjectStore, tmp_path: Path) -> None:
    fill(store)
    take_snapshot(store, "snap", [], creator_uid=0)
    view = open_view(store, tmp_path)
    for change in (
        lambda: view.put("x", b""),
        lambda: view.delete("a.txt"),
        lambda: view.copy("a.txt", "b"),
        lambda: view.delete_many(["a.txt"]),
    ):
        with pytest.raises(SnapshotReadOnly, match="read-only"):
            change()
    assert store.get_range("a.txt", 0, 100) == b"recorded a.txt"


def test_the_index_is_built_once_and_again_for_a_new_record(
    store: ObjectStore, tmp_path: Path
) -> None:
    fill(store)
    take_snapshot(store, "snap", [], creator_uid=0)
    records = RecordStore(store)
    path = tmp_path / "snap.sqlite"
    SnapshotIndex.open(path, records, records.manifest("snap")).close()
    built = path.stat().st_mtime_ns
    SnapshotIndex.open(path, records, records.manifest("snap")).close()
    assert path.stat().st_mtime_ns == built
    records.delete("snap")  # the same name made again, over other objects
    store.put("only.bin", b"x")
    take_snapshot(store, "snap", ["only.bin"], creator_uid=0)
    index = SnapshotIndex.open(path, records, records.manifest("snap"))
    assert [e if isinstance(e, str) else e.key for e in index.children("")] == ["only.bin"]
    index.close()


def test_a_damaged_record_builds_no_index(store: ObjectStore, tmp_path: Path) -> None:
    fill(store)
    manifest = take_snapshot(store, "snap", [], creator_uid=0)
    store.put(manifest.parts[0].key, b"not the part")
    records = RecordStore(store)
    path = tmp_path / "index" / "snap.sqlite"
    with pytest.raises(SnapshotDamaged, match="not the bytes"):
        SnapshotIndex.open(path, records, records.manifest("snap"))
    assert not list(path.parent.iterdir())
