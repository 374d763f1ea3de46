"""Bucket faults during write-back: uploads retry, finish, and corrupt nothing."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.core.conftest import MiB
from tests.faults import FaultProxy, single_put_of
from tests.unit.test_store_faults import Injector, error_response


@pytest.fixture
def s3_store(s3_store_through_proxy: Any) -> Any:
    """Through FaultProxy: single PUTs go through the native engine, not botocore."""
    return s3_store_through_proxy


def _only(ops: set[str], injector: Injector) -> Any:
    """A before-send hook that injects faults only into the named S3 operations."""

    def hook(request: Any, **kwargs: Any) -> Any:
        url = request.url
        op = (
            "UploadPart"
            if "partNumber=" in url
            else "CompleteMultipartUpload"
            if "uploadId=" in url and request.method == "POST"
            else "CreateMultipartUpload"
            if url.endswith("?uploads") or "?uploads&" in url
            else "PutObject"
            if request.method == "PUT" and "x-amz-copy-source" not in request.headers
            else "Other"
        )
        return injector(request) if op in ops else None

    return hook


async def test_uploads_survive_503_and_slowdown(
    make_fs: Any, s3_store: Any, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs(capacities=(64 * MiB, 64 * MiB))
    slowdown = Injector(3, error_response(503, "SlowDown"))
    errors = Injector(1, error_response(500, "InternalError"))
    s3_store.client.meta.events.register("before-send.s3.*", _only({"UploadPart"}, slowdown))
    s3_store.client.meta.events.register(
        "before-send.s3.*", _only({"CompleteMultipartUpload"}, errors)
    )
    fault_proxy.answer_requests(1, status=500, code="InternalError", match=single_put_of())
    big = os.urandom(18 * MiB)
    small = os.urandom(1000)
    await mount.write_file("big.bin", big)
    await mount.write_file("small.bin", small)
    await mount.flush()
    assert slowdown.injected == 3 and errors.injected == 1, "the faults must really have happened"
    assert fault_proxy.faults_injected == 1
    assert s3_store.get_range("big.bin", 0, len(big)) == big
    assert s3_store.get_range("small.bin", 0, len(small)) == small
    assert s3_store.list_uploads("") == [], "no multipart upload may leak"
    assert (await mount.fs.where("big.bin"))["state"] == "clean"


async def test_flush_fails_instead_of_hanging_when_the_bucket_refuses(
    make_fs: Any, s3_store: Any, fault_proxy: FaultProxy
) -> None:
    import trio

    from tierfs.errors import StoreError

    mount = await make_fs()
    mount.fs.sync.flush_max_failures = 2
    fault_proxy.answer_requests(10**6, status=503, code="SlowDown", match=single_put_of())
    await mount.write_file("stuck.bin", b"data")
    with trio.fail_after(60), pytest.raises(StoreError, match="keeps refusing"):
        await mount.fs.flush_path("")
    # Nothing was lost: the upload is still owed and goes through once the bucket recovers.
    assert (await mount.fs.where("stuck.bin"))["state"] == "dirty"
    assert fault_proxy.faults_injected >= 2
    fault_proxy.clear_faults()
    mount.fs.sync.flush_max_failures = 100
    await mount.flush()
    assert s3_store.get_range("stuck.bin", 0, 4) == b"data"


async def test_replayed_upload_of_a_deleted_file_aborts_its_multipart_upload(
    make_fs: Any, s3_store: Any
) -> None:
    """A crash in the middle of a multipart upload leaves its upload id in the
    journal entry.  If the file is deleted before that entry is replayed, the
    entry must still abort the upload: its parts would otherwise stay in the
    bucket until the cleanup of day-old uploads."""
    mount = await make_fs()
    ino = await mount.write_file("gone.bin", os.urandom(1000))
    await mount.flush()
    root = await mount.fs.namespace.resolve("")
    await mount.fs.unlink(root.ino, b"gone.bin")
    full_key = s3_store._full_key("gone.bin")
    upload_id = s3_store.client.create_multipart_upload(Bucket=s3_store.bucket, Key=full_key)[
        "UploadId"
    ]
    assert [u.upload_id for u in s3_store.list_uploads("")] == [upload_id]
    with mount.fs.journal.write() as w:
        w.append({"op": "upload", "ino": ino, "upload_id": upload_id, "upload_key": "gone.bin"})
    await mount.flush()
    assert s3_store.list_uploads("") == [], "the recorded multipart upload must be aborted"
    keys = [obj.key for page in s3_store.list_pages("") for obj in page.objects]
    assert "gone.bin" not in keys


async def test_a_multipart_upload_id_is_committed_before_its_first_part(make_fs: Any) -> None:
    """The upload thread sends parts as soon as the upload id is journaled:
    that record must already be committed (not only in the metadata group),
    or a daemon killed before the next group commit leaves an open upload
    that no replay knows to abort (tests/fuse/test_crash.py, kill -9 during a
    multipart upload)."""
    mount = await make_fs()
    sync = mount.fs.sync
    recorded: list[tuple[bool, int, str]] = []
    record = sync._record_upload_id

    def record_and_look(seq: int, key: str, upload_id: str) -> None:
        record(seq, key, upload_id)
        meta = mount.fs.meta
        recorded.append((meta.group_commit, meta.uncommitted, upload_id))

    sync._record_upload_id = record_and_look
    body = os.urandom(20 * MiB)  # 8 MiB parts: a multipart upload
    await mount.write_file("big.bin", body)
    await mount.flush()
    assert len(recorded) == 1, recorded
    group_commit, uncommitted, upload_id = recorded[0]
    assert group_commit, "the mount runs without group commit: the test proves nothing"
    assert uncommitted == 0, "the upload id was left in the uncommitted group"
    assert upload_id
