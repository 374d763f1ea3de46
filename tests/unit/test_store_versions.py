"""Object versions in the stores: ``versioning`` and ``current_versions``
against moto with versioning on and off, and the ``file://`` store (which
keeps none).  A snapshot records these version IDs."""

from __future__ import annotations

from typing import Any

import pytest

from tierfs.errors import InvalidArgument, ObjectNotFound
from tierfs.store import ObjectStore


def test_a_versioned_bucket_lists_each_objects_current_version(
    bucket: tuple[str, str], s3_client: Any, s3_store: ObjectStore
) -> None:
    _endpoint, name = bucket
    assert s3_store.versioning() is False
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    assert s3_store.versioning() is True
    first = s3_store.put("ds/a.bin", b"one")
    s3_store.put("ds/a.bin", b"two, longer")  # a new current version of a.bin
    s3_store.put("ds/b.bin", b"b")
    s3_store.put("ds/sub/c.bin", b"c")
    s3_store.put("ds/gone.bin", b"x")
    s3_store.delete("ds/gone.bin")  # its current version is a delete marker
    s3_store.put("other.bin", b"o")
    current = list(s3_store.current_versions("ds/"))
    assert [v.key for v in current] == ["ds/a.bin", "ds/b.bin", "ds/sub/c.bin"]
    a = current[0]
    assert a.size == len(b"two, longer") and a.etag != first and a.version_id
    listed = {o.key: o for page in s3_store.list_pages("ds/") for o in page.objects}
    assert listed["ds/a.bin"].etag == a.etag
    # Each version can be told from the others: all three ids differ.
    assert len({v.version_id for v in current}) == 3


def test_paging_through_many_versions(
    bucket: tuple[str, str], s3_client: Any, s3_store: ObjectStore
) -> None:
    _endpoint, name = bucket
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    for i in range(1100):  # more than one page of 1000
        s3_store.put(f"p/{i:05d}", b"x")
    s3_store.put("p/00007", b"new")
    keys = [v.key for v in s3_store.current_versions("p/")]
    assert keys == [f"p/{i:05d}" for i in range(1100)]


def test_a_local_store_keeps_no_versions(local_store: ObjectStore) -> None:
    local_store.put("a.bin", b"a")
    assert local_store.versioning() is False
    assert list(local_store.current_versions("")) == []


def test_a_recorded_version_reads_back_after_overwrite_and_delete(
    bucket: tuple[str, str], s3_client: Any, s3_store: Any
) -> None:
    """Both GET engines (the native one for small ranges, boto3 for the
    rest) read the version asked for, whatever is current; a version the
    bucket no longer keeps is ObjectNotFound."""
    _endpoint, name = bucket
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3_store.put("ds/a.bin", b"first bytes")
    (old,) = s3_store.current_versions("ds/a.bin")
    s3_store.put("ds/a.bin", b"second, other bytes")
    s3_store.delete("ds/a.bin")  # the current version is now a delete marker
    with pytest.raises(ObjectNotFound):
        s3_store.get_range("ds/a.bin", 0, 100)
    for native_max in (s3_store.native_get_max, 0):
        s3_store.native_get_max = native_max
        assert s3_store.get_range("ds/a.bin", 0, 100, version=old.version_id) == b"first bytes"
        bufs = [memoryview(bytearray(4)), memoryview(bytearray(4))]
        got = s3_store.get_range_into("ds/a.bin", 6, bufs, old.etag, version=old.version_id)
        assert got == 5 and bytes(bufs[0]) + bytes(bufs[1][:1]) == b"bytes"
    # The bucket's lifecycle expires the old version (the key with the store's prefix).
    s3_client.delete_object(Bucket=name, Key=s3_store.prefix + "ds/a.bin", VersionId=old.version_id)
    for native_max in (1 << 20, 0):
        s3_store.native_get_max = native_max
        with pytest.raises(ObjectNotFound):
            s3_store.get_range("ds/a.bin", 0, 100, version=old.version_id)


def test_a_local_store_refuses_a_version(local_store: ObjectStore) -> None:
    local_store.put("a.bin", b"a")
    with pytest.raises(InvalidArgument, match="keeps no versions"):
        local_store.get_range("a.bin", 0, 1, version="v1")
    assert local_store.get_range("a.bin", 0, 1) == b"a"
