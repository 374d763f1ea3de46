"""The snapshot record (``tierfs.snapshot.record``) against a real S3
protocol server (moto) and the ``file://`` store: written in parts, listed
only once its manifest is there, read back whole and in order, damage
detected, deleted manifest first."""

from __future__ import annotations

import pytest

from tierfs.errors import InvalidArgument
from tierfs.snapshot.record import (
    MANIFEST,
    RecordStore,
    RecordWriter,
    SnapshotDamaged,
    SnapshotEntry,
    SnapshotExists,
    SnapshotNotFound,
    check_name,
    record_prefix,
)
from tierfs.store import SNAPSHOT_ROOT, ObjectStore


def entries(count: int) -> list[SnapshotEntry]:
    out = [
        SnapshotEntry(
            key=f"ds/{i:05d}.bin",
            size=i,
            etag=f"{i:032x}",
            mtime=1_700_000_000.5 + i,
            version=f"v{i}" if i % 2 else None,
            mode=0o100600 if i % 3 == 0 else None,
            uid=1000 if i % 3 == 0 else None,
            gid=1000 if i % 3 == 0 else None,
        )
        for i in range(count)
    ]
    out.append(SnapshotEntry(key="ds/naïve\nname", size=1, etag="e", mtime=1.0))
    return out


def write(store: ObjectStore, name: str, items: list[SnapshotEntry], part_entries: int = 7) -> None:
    writer = RecordWriter(
        store, name, creator_uid=1000, paths=["ds"], versioned=True, part_entries=part_entries
    )
    for entry in items:
        writer.add(entry)
    writer.finish()


def test_a_record_reads_back_whole_and_in_order(store: ObjectStore) -> None:
    items = entries(30)
    write(store, "run-1", items)
    records = RecordStore(store)
    assert records.names() == ["run-1"]
    manifest = records.manifest("run-1")
    assert (manifest.objects, manifest.bytes) == (31, sum(e.size for e in items))
    assert len(manifest.parts) == 5 and manifest.paths == ["ds"] and manifest.versioned
    assert manifest.creator_uid == 1000 and manifest.backing == store.url
    assert list(records.entries(manifest)) == items


def test_a_create_that_never_finished_is_not_a_snapshot(store: ObjectStore) -> None:
    writer = RecordWriter(store, "half", creator_uid=0, paths=[], versioned=False, part_entries=5)
    for entry in entries(12):
        writer.add(entry)  # two parts are in the bucket, and no manifest
    records = RecordStore(store)
    assert records.names() == []
    assert records.leftovers() == ["half"]
    with pytest.raises(SnapshotNotFound):
        records.manifest("half")
    assert records.delete("half") == 2
    assert records.leftovers() == []


def test_snapshots_are_immutable_and_deleted_manifest_first(store: ObjectStore) -> None:
    write(store, "frozen", entries(3))
    with pytest.raises(SnapshotExists):
        RecordWriter(store, "frozen", creator_uid=0, paths=[], versioned=False)
    records = RecordStore(store)
    assert records.delete("frozen") == 2  # the manifest and one part
    assert records.names() == []
    with pytest.raises(SnapshotNotFound):
        records.delete("frozen")


def test_a_damaged_or_missing_part_is_named(store: ObjectStore) -> None:
    write(store, "hurt", entries(20))
    records = RecordStore(store)
    manifest = records.manifest("hurt")
    second = manifest.parts[1].key
    store.put(second, b"not the part")
    with pytest.raises(SnapshotDamaged, match=r"part-000001\.jsonl\.gz: not the bytes"):
        list(records.entries(manifest))
    store.delete(second)
    with pytest.raises(SnapshotDamaged, match=r"part-000001\.jsonl\.gz: missing"):
        list(records.entries(manifest))
    store.put(record_prefix("hurt") + MANIFEST, b"{not json")
    with pytest.raises(SnapshotDamaged, match="not a snapshot manifest"):
        records.manifest("hurt")


def test_entries_must_come_in_key_order(store: ObjectStore) -> None:
    writer = RecordWriter(store, "order", creator_uid=0, paths=[], versioned=False)
    writer.add(SnapshotEntry(key="b", size=1, etag="e", mtime=0.0))
    with pytest.raises(ValueError, match="out of key order"):
        writer.add(SnapshotEntry(key="a", size=1, etag="e", mtime=0.0))


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "x" * 129, "sp ace", "-dash", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match="snapshot name"):
        check_name(name)


def test_good_names() -> None:
    for name in ("run-1", "2026-12-07.imagenet_v2", "A" * 128):
        assert check_name(name) == name


def test_the_record_lives_under_the_reserved_root() -> None:
    assert record_prefix("run-1") == f"{SNAPSHOT_ROOT}/run-1/"
