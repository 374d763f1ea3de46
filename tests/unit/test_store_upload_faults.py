"""Faults during uploads, copies and batch deletes, against the real moto server.

1. A botocore ``before-send`` hook answers chosen operations (UploadPart,
   CompleteMultipartUpload, UploadPartCopy, ...) with 5xx / SlowDown, a
   "200 with an error body", or a connection error: the upload completes with
   the right bytes.
2. ``tests.faults.FaultProxy`` breaks the TCP stream: connection resets while
   a part's body is being sent, answers lost after the server acted (part,
   create, complete), bodies cut mid-way.  On a versioned bucket the upload
   completes with exactly one object version and leaves no multipart upload
   behind.
3. Failures that must abort: a spent retry budget gives StoreUnavailable, a
   failing ``read_part`` its own exception, and in both cases the upload is
   aborted after the parts in flight stopped.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit
from xml.dom import minidom

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError

from tests.faults import FaultProxy
from tests.unit.test_store_faults import TINY, _Raw, error_response, error_xml, make_store
from tierfs.errors import StoreError, StoreUnavailable
from tierfs.store.multipart import MiB, multipart_etag
from tierfs.store.s3 import S3Store

PART = 5 * MiB
DATA = random.Random(4321).randbytes(12 * MiB + 7)


def expected_etag(data: bytes, part_size: int = PART) -> str:
    return multipart_etag(
        [hashlib.md5(data[o : o + part_size]).digest() for o in range(0, len(data), part_size)]
    )


def read_data(offset: int, length: int) -> bytes:
    return DATA[offset : offset + length]


class OpFaults:
    """before-send hook: the first ``budget[op]`` requests of operation ``op`` get ``make``.

    ``log`` lists every operation sent, in order; ``injected`` counts fakes per op.
    """

    def __init__(self, budget: dict[str, int], make: Callable[[Any], AWSResponse | None]) -> None:
        self.budget = dict(budget)
        self.make = make
        self.log: list[str] = []
        self.injected: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, request: Any, event_name: str, **kwargs: Any) -> AWSResponse | None:
        op = event_name.rsplit(".", 1)[-1]
        with self.lock:
            self.log.append(op)
            if self.budget.get(op, 0) <= 0:
                return None
            self.budget[op] -= 1
            self.injected[op] = self.injected.get(op, 0) + 1
        return self.make(request)


def install(store: S3Store, hook: Any) -> Any:
    store.client.meta.events.register("before-send.s3.*", hook)
    return hook


def bucket_uploads(s3_client: Any, bucket: str) -> list[str]:
    """Every multipart upload in the bucket, seen by another client."""
    return [u["Key"] for u in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def object_bytes(s3_client: Any, bucket: str, key: str) -> bytes:
    return s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture
def fast_store(bucket: tuple[str, str]) -> Iterator[S3Store]:
    store = make_store(*bucket)
    yield store
    store.close()


# --- 1. injected error responses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"), [(503, "SlowDown"), (500, "InternalError"), (503, None)]
)
def test_part_and_complete_errors_are_retried(
    fast_store: S3Store, s3_client: Any, status: int, code: str | None
) -> None:
    faults = install(
        fast_store,
        OpFaults({"UploadPart": 3, "CompleteMultipartUpload": 2}, error_response(status, code)),
    )
    etag = fast_store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert faults.injected == {"UploadPart": 3, "CompleteMultipartUpload": 2}
    assert faults.log.count("UploadPart") == 3 + 3
    assert faults.log.count("CreateMultipartUpload") == 1
    assert "AbortMultipartUpload" not in faults.log
    assert etag == expected_etag(DATA)
    assert object_bytes(s3_client, fast_store.bucket, "pre/obj") == DATA
    assert bucket_uploads(s3_client, fast_store.bucket) == []


def test_complete_200_with_error_body_is_retried(fast_store: S3Store, s3_client: Any) -> None:
    """S3 may answer CompleteMultipartUpload with 200 and an <Error> body."""

    def make(request: Any) -> AWSResponse:
        body = error_xml("InternalError")
        return AWSResponse(request.url, 200, {"Content-Length": str(len(body))}, _Raw(body))

    faults = install(fast_store, OpFaults({"CompleteMultipartUpload": 1}, make))
    assert fast_store.put_multipart("obj", len(DATA), read_data, part_size=PART) == expected_etag(
        DATA
    )
    assert faults.log.count("CompleteMultipartUpload") == 2
    assert object_bytes(s3_client, fast_store.bucket, "pre/obj") == DATA


def test_connection_errors_on_parts_are_retried(fast_store: S3Store, s3_client: Any) -> None:
    def fail(request: Any) -> AWSResponse:
        raise ConnectionClosedError(endpoint_url=request.url)

    faults = install(fast_store, OpFaults({"UploadPart": 4, "CreateMultipartUpload": 1}, fail))
    assert fast_store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert sum(faults.injected.values()) == 5
    assert object_bytes(s3_client, fast_store.bucket, "pre/obj") == DATA
    assert bucket_uploads(s3_client, fast_store.bucket) == []


class LostComplete:
    """CompleteMultipartUpload: the first attempt completes for real but its answer
    is lost; the retry is told NoSuchUpload (what S3 may say once it is done)."""

    def __init__(
        self, s3_client: Any, bucket: str, *, overwrite_after: bytes | None = None
    ) -> None:
        self.s3_client = s3_client
        self.bucket = bucket
        self.overwrite_after = overwrite_after
        self.calls = 0

    def __call__(self, request: Any, event_name: str, **kwargs: Any) -> AWSResponse | None:
        if not event_name.endswith(".CompleteMultipartUpload"):
            return None
        self.calls += 1
        query = dict(p.split("=", 1) for p in urlsplit(request.url).query.split("&") if "=" in p)
        key = urlsplit(request.url).path.split("/", 2)[2]
        if self.calls == 1:
            doc = minidom.parseString(request.body)
            parts = [
                {
                    "PartNumber": int(p.getElementsByTagName("PartNumber")[0].firstChild.data),
                    "ETag": p.getElementsByTagName("ETag")[0].firstChild.data,
                }
                for p in doc.getElementsByTagName("Part")
            ]
            self.s3_client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=query["uploadId"],
                MultipartUpload={"Parts": parts},
            )
            if self.overwrite_after is not None:  # another writer wins the race
                self.s3_client.put_object(Bucket=self.bucket, Key=key, Body=self.overwrite_after)
            raise ConnectionClosedError(endpoint_url=request.url)
        body = error_xml("NoSuchUpload")
        return AWSResponse(request.url, 404, {"Content-Length": str(len(body))}, _Raw(body))


def test_lost_complete_answer_then_no_such_upload(fast_store: S3Store, s3_client: Any) -> None:
    hook = install(fast_store, LostComplete(s3_client, fast_store.bucket))
    etag = fast_store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert hook.calls == 2
    assert etag == expected_etag(DATA) == fast_store.head("obj").etag
    assert object_bytes(s3_client, fast_store.bucket, "pre/obj") == DATA


def test_no_such_upload_with_foreign_object_fails(fast_store: S3Store, s3_client: Any) -> None:
    install(fast_store, LostComplete(s3_client, fast_store.bucket, overwrite_after=b"theirs"))
    with pytest.raises(StoreError, match="no longer exists") as info:
        fast_store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert not isinstance(info.value, StoreUnavailable)
    assert object_bytes(s3_client, fast_store.bucket, "pre/obj") == b"theirs"


def test_copy_errors_are_retried(fast_store: S3Store, s3_client: Any) -> None:
    fast_store.put("src", DATA, {"uid": "3"})
    faults = install(
        fast_store,
        OpFaults({"CopyObject": 2, "UploadPartCopy": 2}, error_response(503, "SlowDown")),
    )
    fast_store.copy("src", "plain")
    fast_store.copy("src", "parts", multipart_threshold=MiB)
    assert faults.injected == {"CopyObject": 2, "UploadPartCopy": 2}
    for key in ("plain", "parts"):
        assert object_bytes(s3_client, fast_store.bucket, f"pre/{key}") == DATA
        assert fast_store.head(key).metadata == {"uid": "3"}
    assert bucket_uploads(s3_client, fast_store.bucket) == []


def test_delete_many_retries_keys_reported_as_failed(fast_store: S3Store, s3_client: Any) -> None:
    keys = ["d/a", "d/b", "d/c"]
    for key in keys:
        fast_store.put(key, b"x")

    def make(request: Any) -> AWSResponse:
        # The server deletes a and c but reports b as InternalError.
        for key in ("pre/d/a", "pre/d/c"):
            s3_client.delete_object(Bucket=fast_store.bucket, Key=key)
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><DeleteResult><Error><Key>pre/d/b</Key>'
            b"<Code>InternalError</Code><Message>try again</Message></Error></DeleteResult>"
        )
        return AWSResponse(request.url, 200, {"Content-Length": str(len(body))}, _Raw(body))

    faults = install(fast_store, OpFaults({"DeleteObjects": 1}, make))
    fast_store.delete_many(keys)
    assert faults.log.count("DeleteObjects") == 2
    assert list(fast_store.list_pages("")) == []


def test_delete_many_reports_permanent_key_errors(fast_store: S3Store) -> None:
    def make(request: Any) -> AWSResponse:
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><DeleteResult><Error><Key>pre/x</Key>'
            b"<Code>AccessDenied</Code><Message>no</Message></Error></DeleteResult>"
        )
        return AWSResponse(request.url, 200, {"Content-Length": str(len(body))}, _Raw(body))

    install(fast_store, OpFaults({"DeleteObjects": 1}, make))
    with pytest.raises(StoreError, match=r"1 of 2 keys not deleted; first: pre/x \(AccessDenied\)"):
        fast_store.delete_many(["x", "y"])


# --- 2. FaultProxy: resets, lost answers, cut bodies ------------------------------------------------


@pytest.fixture
def versioned(bucket: tuple[str, str], s3_client: Any) -> str:
    """Name of the fresh bucket, with versioning on (to count object versions)."""
    _, name = bucket
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture
def proxied(versioned: str, fault_proxy: FaultProxy) -> Iterator[S3Store]:
    store = make_store(f"http://127.0.0.1:{fault_proxy.port}", versioned)
    yield store
    store.close()


def is_part(line: str) -> bool:
    return "partNumber=" in line


def is_create(line: str) -> bool:
    return line.startswith("POST ") and "?uploads " in line


def is_complete(line: str) -> bool:
    return line.startswith("POST ") and "uploadId=" in line


#: name -> arms the proxy; returns (faults it will inject, creates whose answer is lost)
Scenario = Callable[[FaultProxy], tuple[int, int]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def reset_while_sending_parts(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.fail_requests(3, kind="reset", match=is_part)
    return 3, 0


@scenario
def closed_while_sending_parts(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.fail_requests(2, kind="truncate", match=is_part)
    return 2, 0


@scenario
def part_answers_lost(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.fail_responses(2, kind="reset", match=is_part)
    fault_proxy.fail_responses(1, kind="truncate", match=is_part)
    return 3, 0


@scenario
def create_answer_lost(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.fail_responses(1, kind="reset", match=is_create)
    return 1, 1


@scenario
def create_answer_cut_mid_body(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.reset_next(1)  # the first response with a body is CreateMultipartUpload's
    return 1, 1


@scenario
def complete_answer_lost(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.fail_responses(1, kind="reset", match=is_complete)
    fault_proxy.fail_responses(1, kind="truncate", match=is_complete)
    return 2, 0


@scenario
def everything_at_once(fault_proxy: FaultProxy) -> tuple[int, int]:
    fault_proxy.truncate_next(1)
    fault_proxy.fail_requests(1, kind="reset", match=is_part)
    fault_proxy.fail_responses(1, kind="reset", match=is_part)
    fault_proxy.fail_responses(1, kind="truncate", match=is_complete)
    return 4, 1


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_upload_survives_network_faults(
    proxied: S3Store,
    fault_proxy: FaultProxy,
    s3_client: Any,
    versioned: str,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """(b) bytes right, one object version, no leaked multipart upload."""
    caplog.set_level(logging.INFO, logger="tierfs.store.s3")
    expected_faults, lost_creates = SCENARIOS[name](fault_proxy)
    ids: list[str] = []
    etag = proxied.put_multipart(
        "ckpt/step-1.bin",
        len(DATA),
        read_data,
        {"mode": "0100644"},
        part_size=PART,
        on_upload_id=ids.append,
    )
    assert fault_proxy.faults_injected == expected_faults
    assert caplog.text.count("left by a create whose answer was lost") == lost_creates
    assert etag == expected_etag(DATA)
    assert len(ids) == 1
    assert object_bytes(s3_client, versioned, "pre/ckpt/step-1.bin") == DATA
    versions = s3_client.list_object_versions(Bucket=versioned, Prefix="pre/ckpt/")
    assert len(versions.get("Versions", [])) == 1
    assert versions["Versions"][0]["ETag"].strip('"') == etag
    assert bucket_uploads(s3_client, versioned) == []
    assert proxied.list_uploads() == []
    assert proxied.head("ckpt/step-1.bin").metadata == {"mode": "0100644"}


def test_persistent_resets_give_up_and_abort(
    versioned: str, fault_proxy: FaultProxy, s3_client: Any
) -> None:
    store = make_store(f"http://127.0.0.1:{fault_proxy.port}", versioned, policy=TINY)
    fault_proxy.fail_requests(1000, kind="reset", match=is_part)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="put_multipart part"):
        store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert time.monotonic() - started < 5
    assert fault_proxy.faults_injected >= TINY.max_attempts
    assert bucket_uploads(s3_client, versioned) == []
    assert "Versions" not in s3_client.list_object_versions(Bucket=versioned)
    store.close()


# --- 3. failures that abort -----------------------------------------------------------------------


def test_budget_spent_raises_unavailable_and_aborts(
    bucket: tuple[str, str], s3_client: Any
) -> None:
    """(d) every UploadPart answered SlowDown: StoreUnavailable, upload aborted."""
    store = make_store(*bucket, policy=TINY)
    faults = install(store, OpFaults({"UploadPart": 10**6}, error_response(503, "SlowDown")))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert time.monotonic() - started < 3
    message = str(info.value)
    assert "put_multipart part" in message and "SlowDown" in message
    assert f"s3://{store.bucket}/pre/obj" in message
    assert faults.log[-1] == "AbortMultipartUpload"
    assert bucket_uploads(s3_client, store.bucket) == []
    store.close()


def test_failed_abort_is_logged_not_raised(
    bucket: tuple[str, str], s3_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(*bucket, policy=TINY)
    install(
        store,
        OpFaults(
            {"UploadPart": 10**6, "AbortMultipartUpload": 10**6},
            error_response(500, "InternalError"),
        ),
    )
    with (
        caplog.at_level(logging.WARNING, logger="tierfs.store.s3"),
        pytest.raises(StoreUnavailable, match="put_multipart part"),
    ):
        store.put_multipart("obj", len(DATA), read_data, part_size=PART)
    assert "could not abort upload" in caplog.text
    [leaked] = store.list_uploads()  # left for the journal / list_uploads cleanup
    store.close()
    fresh = make_store(*bucket)
    fresh.abort_upload(leaked.key, leaked.upload_id)
    assert bucket_uploads(s3_client, fresh.bucket) == []
    fresh.close()


def test_read_part_error_stops_parts_then_aborts(fast_store: S3Store, s3_client: Any) -> None:
    """(c) with parts in flight: they finish or stop first, then the abort, then the raise."""
    boom = RuntimeError("tier unreadable")

    def slow_parts(request: Any, event_name: str, **kwargs: Any) -> None:
        if event_name.endswith(".UploadPart"):
            time.sleep(0.3)

    faults = install(fast_store, OpFaults({}, lambda request: None))
    fast_store.client.meta.events.register("before-send.s3.UploadPart", slow_parts)

    def read_part(offset: int, length: int) -> bytes:
        if offset >= 2 * PART:
            time.sleep(0.05)  # parts 1 and 2 are on the wire by now
            raise boom
        return read_data(offset, length)

    with pytest.raises(RuntimeError) as info:
        fast_store.put_multipart("obj", len(DATA), read_part, part_size=PART, concurrency=3)
    assert info.value is boom
    log = faults.log
    assert log.count("AbortMultipartUpload") == 1
    assert "UploadPart" not in log[log.index("AbortMultipartUpload") :]
    assert "CompleteMultipartUpload" not in log
    assert bucket_uploads(s3_client, fast_store.bucket) == []


def test_retry_backoff_stops_when_a_sibling_part_fails(
    bucket: tuple[str, str], s3_client: Any
) -> None:
    """A part that is backing off does not keep the failed upload alive for long."""
    from tierfs.store.retry import RetryPolicy

    slow = RetryPolicy(max_attempts=50, budget=30.0, base_delay=2.0, max_delay=2.0)
    store = make_store(*bucket, policy=slow)
    install(store, OpFaults({"UploadPart": 10**6}, error_response(503, "SlowDown")))
    boom = ValueError("boom")

    def read_part(offset: int, length: int) -> bytes:
        if offset >= 2 * PART:
            time.sleep(0.3)  # parts 1 and 2 failed once and are backing off now
            raise boom
        return read_data(offset, length)

    started = time.monotonic()
    with pytest.raises(ValueError):
        store.put_multipart("obj", len(DATA), read_part, part_size=PART, concurrency=3)
    assert time.monotonic() - started < 3
    assert bucket_uploads(s3_client, store.bucket) == []
    store.close()


def test_proxy_rejects_unknown_fault_kind(fault_proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        fault_proxy.fail_requests(1, kind="explode")
    with pytest.raises(ValueError):
        fault_proxy.fail_responses(1, kind="explode")
    fault_proxy.fail_requests(1, match=is_part)
    fault_proxy.clear_faults()
    assert fault_proxy._request_rules == [] and fault_proxy._response_rules == []
