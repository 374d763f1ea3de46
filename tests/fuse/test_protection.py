"""Mounts that protect the bucket: ``-o ro`` (read-only) and ``[write]
deletes = false`` (nothing is deleted through the mount), through real
mounts."""

from __future__ import annotations

import errno
import os
import time
from typing import Any

import pytest

from tests.fuse.conftest import MountFactory, run_tierfs

pytestmark = pytest.mark.fuse


def keys_of(s3_client: Any, bucket: str, prefix: str) -> set[str]:
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return {item["Key"].removeprefix(prefix + "/") for item in listed}


def test_a_read_only_mount_reads_and_refuses_every_change(mount: MountFactory) -> None:
    m = mount({"d/a.txt": b"hello", "b.txt": b"b"}, options="ro")
    assert (m.path / "d/a.txt").read_bytes() == b"hello"
    attempts = [
        lambda: (m.path / "new.txt").write_bytes(b"x"),
        lambda: open(m.path / "b.txt", "r+b").close(),
        lambda: (m.path / "b.txt").unlink(),
        lambda: (m.path / "d/a.txt").rename(m.path / "a2.txt"),
        lambda: (m.path / "e").mkdir(),
        lambda: os.truncate(m.path / "b.txt", 0),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS
    assert sorted(p.name for p in m.path.iterdir()) == ["b.txt", "d"]
    assert m.status()["pending_uploads"] == 0


def test_with_deletes_off_nothing_is_deleted_and_the_log_says_why(
    mount: MountFactory, s3_client: Any
) -> None:
    m = mount(
        {"d/a.txt": b"a", "keep.txt": b"k", "other.txt": b"o"},
        extra_config="\n[write]\ndeletes = false\n",
    )
    bucket = m.bucket
    before = keys_of(s3_client, bucket, m.prefix)
    refused = [
        lambda: (m.path / "keep.txt").unlink(),
        lambda: (m.path / "d/a.txt").unlink(),
        lambda: os.rmdir(m.path / "d"),
        lambda: (m.path / "other.txt").replace(m.path / "keep.txt"),  # rename over a name
    ]
    for attempt in refused:
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EPERM
    (m.path / "new.txt").write_bytes(b"new")  # writing and moving still work
    (m.path / "new.txt").rename(m.path / "moved.txt")
    flushed = run_tierfs("flush", str(m.path))
    assert flushed.returncode == 0, flushed.stderr
    deadline = time.monotonic() + 10
    while "moved.txt" not in keys_of(s3_client, bucket, m.prefix):
        assert time.monotonic() < deadline, keys_of(s3_client, bucket, m.prefix)
        time.sleep(0.1)
    assert before <= keys_of(s3_client, bucket, m.prefix)  # nothing deleted
    assert (m.path / "keep.txt").read_bytes() == b"k"
    assert "deletes = false" in m.log_tail() and "keep.txt" in m.log_tail()
