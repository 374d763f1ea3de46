"""What a snapshot records (``tierfs.snapshot.walk``) on a real S3 protocol
server (moto) and the ``file://`` store: every object under the paths in
key order, empty directories, the shadow's attributes, nothing reserved."""

from __future__ import annotations

from typing import Any

import pytest

from tierfs.errors import InvalidArgument
from tierfs.snapshot.check import gone_versions
from tierfs.snapshot.record import RecordStore, SnapshotEntry
from tierfs.snapshot.walk import (
    normalised_paths,
    segments,
    take_snapshot,
    walk_entries,
    with_versions,
)
from tierfs.store import ObjectStore, ObjectVersion

KEYS = [
    "a-b.txt",
    "a.txt",
    "ds/0.bin",
    "ds/sub/1.bin",
    "ds/sub/deeper/2.bin",
    "ds-other/3.bin",
    "ds0.bin",
    "top.bin",
]


def fill(store: ObjectStore) -> None:
    for key in KEYS:
        store.put(key, key.encode())
    store.put("ds/empty/", b"")  # an empty directory's marker
    store.put(".tierfs-attrs/ds/0.bin@m0600,u1000,g1000", b"")  # the shadow
    store.put(".tierfs-attrs/ds/empty@m0700,u1000,g1000", b"")
    store.put(".tierfs-snapshots/old/manifest.json", b"{}")  # never recorded


def test_the_whole_bucket_in_key_order_with_attributes(store: ObjectStore) -> None:
    fill(store)
    entries = list(walk_entries(store, []))
    keys = [e.key for e in entries]
    assert keys == sorted([*KEYS, "ds/empty/"], key=str.encode)
    by_key = {e.key: e for e in entries}
    assert (by_key["ds/0.bin"].mode, by_key["ds/0.bin"].uid, by_key["ds/0.bin"].gid) == (
        0o600,
        1000,
        1000,
    )
    assert by_key["ds/empty/"].mode == 0o700
    assert by_key["ds/sub/1.bin"].mode is None  # no shadow: the mount's defaults
    assert by_key["a.txt"].size == len(b"a.txt") and by_key["a.txt"].etag


def test_paths_pick_files_and_trees(store: ObjectStore) -> None:
    fill(store)
    keys = [e.key for e in walk_entries(store, ["ds/sub", "a.txt", "ds/sub/deeper", "top.bin"])]
    assert keys == ["a.txt", "ds/sub/1.bin", "ds/sub/deeper/2.bin", "top.bin"]


def test_take_snapshot_writes_a_record_that_reads_back(store: ObjectStore) -> None:
    fill(store)
    manifest = take_snapshot(store, "run-1", ["ds"], creator_uid=1000, part_entries=2)
    assert manifest.paths == ["ds"] and manifest.objects == 4 and len(manifest.parts) == 2
    records = RecordStore(store)
    assert records.names() == ["old", "run-1"]  # "old": the manifest fill() put
    recorded = [e.key for e in records.entries(records.manifest("run-1"))]
    assert recorded == ["ds/0.bin", "ds/empty/", "ds/sub/1.bin", "ds/sub/deeper/2.bin"]
    # The record is not part of what a later snapshot records.
    later = take_snapshot(store, "run-2", [], creator_uid=0)
    assert later.objects == len(KEYS) + 1


def test_bad_paths_are_refused() -> None:
    for bad in ("../x", "a/../b", "a\0b"):
        with pytest.raises(InvalidArgument):
            normalised_paths([bad])
    assert normalised_paths([]) == [""]
    assert normalised_paths(["./a/", "a/b", "c", ""]) == [""]
    assert normalised_paths(["a/b", "a", "c//d/"]) == ["a", "c/d"]


def test_a_versioned_bucket_records_each_current_version(
    bucket: tuple[str, str], s3_client: Any, s3_store: ObjectStore
) -> None:
    """The recorded version IDs still give the recorded bytes after other
    writers overwrite and delete the objects."""
    _endpoint, name = bucket
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    fill(s3_store)
    s3_store.put("ds/0.bin", b"the version the snapshot records")
    manifest = take_snapshot(s3_store, "v1", ["ds", "top.bin"], creator_uid=0)
    assert manifest.versioned
    records = RecordStore(s3_store)
    recorded = list(records.entries(records.manifest("v1")))
    assert [e.key for e in recorded] == [
        "ds/0.bin",
        "ds/empty/",
        "ds/sub/1.bin",
        "ds/sub/deeper/2.bin",
        "top.bin",
    ]
    assert all(e.version for e in recorded)
    s3_store.put("ds/0.bin", b"overwritten later")
    s3_store.delete("top.bin")
    for entry in recorded:
        body = s3_client.get_object(Bucket=name, Key=f"pre/{entry.key}", VersionId=entry.version)
        data = body["Body"].read()
        assert len(data) == entry.size, entry.key
    first = recorded[0]
    got = s3_client.get_object(Bucket=name, Key="pre/ds/0.bin", VersionId=first.version)
    assert got["Body"].read() == b"the version the snapshot records"


def test_versions_merge_by_key_and_belong_with_their_etag() -> None:
    walked = [
        SnapshotEntry(key="a", size=1, etag="ea", mtime=1.0),
        SnapshotEntry(key="b", size=1, etag="old", mtime=1.0),  # overwritten in between
        SnapshotEntry(key="c", size=1, etag="ec", mtime=1.0),  # gone in between: no version
    ]
    versions = [
        ObjectVersion(key="a", version_id="va", size=1, etag="ea", mtime=1.0),
        ObjectVersion(key="a-other", version_id="vx", size=9, etag="ex", mtime=1.0),
        ObjectVersion(key="b", version_id="vb", size=5, etag="new", mtime=2.0),
        ObjectVersion(key="d", version_id="vd", size=1, etag="ed", mtime=1.0),
    ]
    merged = list(with_versions(walked, versions))
    assert [(e.key, e.version, e.etag, e.size) for e in merged] == [
        ("a", "va", "ea", 1),
        ("b", "vb", "new", 5),
        ("c", None, "ec", 1),
    ]


def test_recorded_versions_the_bucket_no_longer_keeps_are_named(
    bucket: tuple[str, str], s3_client: Any, s3_store: ObjectStore
) -> None:
    _endpoint, name = bucket
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    fill(s3_store)
    manifest = take_snapshot(s3_store, "v1", ["ds", "a.txt", "a-b.txt"], creator_uid=0)
    records = RecordStore(s3_store)
    recorded = list(records.entries(manifest))
    assert list(gone_versions(s3_store, manifest.paths, recorded)) == []
    # Overwrites and deletes keep the old versions: nothing is gone.
    s3_store.put("ds/0.bin", b"newer")
    s3_store.delete("a.txt")
    assert list(gone_versions(s3_store, manifest.paths, recorded)) == []
    # A version expired (here: deleted by version id) is gone.
    by_key = {e.key: e for e in recorded}
    for key in ("ds/sub/1.bin", "a.txt"):
        s3_client.delete_object(Bucket=name, Key=f"pre/{key}", VersionId=by_key[key].version)
    gone = [e.key for e in gone_versions(s3_store, manifest.paths, recorded)]
    assert gone == ["a.txt", "ds/sub/1.bin"]


def test_segments_cover_files_and_trees_in_key_order() -> None:
    assert segments([]) == [""] and segments(["", "a"]) == [""]
    assert segments(["a", "a-b"]) == ["a", "a-b", "a-b/", "a/"]


def test_an_access_points_snapshot_records_the_bucket_wide_attributes(
    bucket: tuple[str, str], s3_store: ObjectStore
) -> None:
    """An access point rooted at users/alice keeps its shadow above its root
    (``.tierfs-attrs/users/alice/...``, as its mount reads it): a snapshot
    through it records those attributes, never the defaults (wider)."""
    from tierfs.core.names.shadow import ShadowPlace
    from tierfs.store.s3 import S3Store

    s3_store.put("users/alice/private/x.bin", b"x")
    s3_store.put(".tierfs-attrs/users/alice/private@m0700,u1000,g1000", b"")
    s3_store.put(".tierfs-attrs/users/alice/private/x.bin@m0600,u1000,g1000", b"")
    endpoint, name = bucket
    point = S3Store(f"s3://{name}/pre/users/alice/", endpoint_url=endpoint, region="us-east-1")
    try:
        entries = list(walk_entries(point, [], ShadowPlace(s3_store, "users/alice/")))
    finally:
        point.close()
    by_key = {e.key: (e.mode, e.uid, e.gid) for e in entries}
    assert by_key == {"private/": (0o700, 1000, 1000), "private/x.bin": (0o600, 1000, 1000)}
