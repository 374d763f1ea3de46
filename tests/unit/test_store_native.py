"""S3Store's native engine (obstore) for small ranged GETs and single PUTs.

Against the real moto server, with FaultProxy for faults on the wire:

1. Faults: HTTP errors answered by the proxy (transient ones retried in the
   one retry loop, permanent ones not, a spent budget gives
   StoreUnavailable), bodies reset or cut short mid-way, a refused endpoint
   opens the breaker, a black hole costs one bounded read timeout, PUTs wait
   longer for their answer than GETs.
2. Semantics: If-Match (412), a range at or past the end, a missing bucket,
   metadata and ETags, keys sent exactly as given (and the ones obstore
   would rewrite go through botocore), request counts and the observer.
3. What goes on the wire: each PUT's payload SHA-256 in
   ``x-amz-content-sha256`` (a loopback capture), credentials from the
   botocore chain only.
4. The one mapping from obstore's failures to botocore's.
"""

from __future__ import annotations

import hashlib
import http.server
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore.exceptions
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from tests.conftest import make_s3_client
from tests.faults import FaultProxy
from tierfs.errors import (
    BucketNotFound,
    EndpointUnreachable,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from tierfs.store.retry import RetryPolicy, classify
from tierfs.store.s3 import S3Store, botocore_equivalent
from tierfs.store.s3_fast import NATIVE_GET_MAX, native_key_ok, native_metadata_ok

FAST = RetryPolicy(max_attempts=5, budget=10.0, base_delay=0.01, max_delay=0.05)
TINY = RetryPolicy(max_attempts=3, budget=1.0, base_delay=0.01, max_delay=0.05)
BLOB = random.Random(99).randbytes(300_000)


def make_store(endpoint: str, bucket: str, policy: RetryPolicy = FAST, **kwargs: Any) -> S3Store:
    return S3Store(f"s3://{bucket}/pre/", endpoint_url=endpoint, retry=policy, **kwargs)


@pytest.fixture
def proxied(bucket: tuple[str, str], fault_proxy: FaultProxy) -> Iterator[S3Store]:
    _, name = bucket
    store = make_store(fault_proxy.endpoint, name)
    store.put("obj", BLOB)
    store.calls.clear()
    yield store
    store.close()


@pytest.fixture
def direct(bucket: tuple[str, str]) -> Iterator[S3Store]:
    store = make_store(*bucket)
    yield store
    store.close()


GET = "GET /"
PUT = "PUT /"

# --- 1. faults -------------------------------------------------------------------------------------

TRANSIENT = [
    (500, "InternalError"),
    (503, "SlowDown"),
    (503, None),
    (502, None),
    (429, "Throttling"),
    (400, "RequestTimeout"),
]


@pytest.mark.parametrize(("status", "code"), TRANSIENT)
@pytest.mark.parametrize("op", ["get_range", "put"])
def test_transient_http_errors_are_retried(
    proxied: S3Store, fault_proxy: FaultProxy, op: str, status: int, code: str | None
) -> None:
    fault_proxy.answer_requests(
        2, status=status, code=code, match=GET if op == "get_range" else PUT
    )
    if op == "get_range":
        assert proxied.get_range("obj", 10, 100) == BLOB[10:110]
        assert proxied.calls == {"GetObject": 3}
    else:
        etag = proxied.put("other", b"payload")
        assert proxied.calls == {"PutObject": 3}
        assert proxied.head("other").etag == etag
    assert fault_proxy.faults_injected == 2


PERMANENT = [
    (404, "NoSuchKey", ObjectNotFound),
    (404, "NoSuchBucket", BucketNotFound),
    (403, "AccessDenied", StoreAccessDenied),
    (403, "SignatureDoesNotMatch", StoreAccessDenied),
    (412, "PreconditionFailed", PreconditionFailed),
    (400, "InvalidArgument", StoreRefused),
    (400, "KeyTooLongError", StoreRefused),
    (413, "EntityTooLarge", StoreRefused),
    (409, "OperationAborted", StoreError),
]


@pytest.mark.parametrize(("status", "code", "error"), PERMANENT)
@pytest.mark.parametrize("op", ["get_range", "put"])
def test_permanent_http_errors_are_not_retried(
    proxied: S3Store,
    fault_proxy: FaultProxy,
    op: str,
    status: int,
    code: str,
    error: type[StoreError],
) -> None:
    fault_proxy.answer_requests(10, status=status, code=code)
    with pytest.raises(error) as info:
        if op == "get_range":
            proxied.get_range("obj", 0, 10)
        else:
            proxied.put("obj", b"new")
    assert type(info.value) is error
    assert sum(proxied.calls.values()) == 1
    message = str(info.value)
    if error is BucketNotFound:
        assert proxied.bucket in message and proxied.endpoint in message
    else:
        assert f"{op} s3://{proxied.bucket}/pre/obj" in message
    if error is StoreAccessDenied:
        assert proxied.endpoint in message


def test_budget_spent_raises_store_unavailable_quickly(
    bucket: tuple[str, str], fault_proxy: FaultProxy
) -> None:
    store = make_store(fault_proxy.endpoint, bucket[1], policy=TINY)
    fault_proxy.answer_requests(1000, status=503, code="SlowDown")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.get_range("obj", 0, 1)
    assert time.monotonic() - started < 2.0
    assert store.calls["GetObject"] == TINY.max_attempts
    message = str(info.value)
    assert f"get_range s3://{store.bucket}/pre/obj" in message
    assert "SlowDown" in message


@pytest.mark.parametrize("fault", ["reset", "truncate"])
@pytest.mark.parametrize("into", [False, True])
def test_broken_bodies_are_refetched(
    proxied: S3Store, fault_proxy: FaultProxy, fault: str, into: bool
) -> None:
    (fault_proxy.reset_next if fault == "reset" else fault_proxy.truncate_next)(2)
    start, length = 1000, 200_000
    if into:
        bufs = [bytearray(50_000), bytearray(150_000)]
        assert proxied.get_range_into("obj", start, [memoryview(b) for b in bufs]) == length
        assert b"".join(bufs) == BLOB[start : start + length]
    else:
        assert proxied.get_range("obj", start, length) == BLOB[start : start + length]
    assert fault_proxy.faults_injected == 2
    assert proxied.calls == {"GetObject": 3}


def test_put_whose_request_is_cut_is_sent_again(proxied: S3Store, fault_proxy: FaultProxy) -> None:
    fault_proxy.fail_requests(1, kind="reset", match=PUT)
    etag = proxied.put("again", BLOB[:100_000])
    assert proxied.calls == {"PutObject": 2}
    assert proxied.get_range("again", 0, 100_000) == BLOB[:100_000]
    assert proxied.head("again").etag == etag


def test_refused_endpoint_opens_the_breaker(proxied: S3Store, fault_proxy: FaultProxy) -> None:
    assert proxied.breaker is not None
    fault_proxy.refuse()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="EndpointConnectionError"):
        proxied.get_range("obj", 0, 10)
    assert time.monotonic() - started < 5
    assert proxied.breaker.is_open, "refused connections did not open the breaker"
    connections = fault_proxy.connections
    for call in (lambda: proxied.get_range("obj", 0, 10), lambda: proxied.put("x", b"y")):
        started = time.monotonic()
        with pytest.raises(EndpointUnreachable):
            call()
        assert time.monotonic() - started < 0.05
    assert fault_proxy.connections == connections
    fault_proxy.restore()
    deadline = time.monotonic() + 10
    while proxied.breaker.is_open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proxied.breaker.is_open
    assert proxied.get_range("obj", 0, 10) == BLOB[:10]


def test_black_hole_costs_one_bounded_read_timeout(
    bucket: tuple[str, str], fault_proxy: FaultProxy
) -> None:
    store = make_store(fault_proxy.endpoint, bucket[1], read_timeout=1.0)
    store.put("obj", BLOB[:100])
    fault_proxy.black_hole()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="ReadTimeout"):
        store.get_range("obj", 0, 10)
    took = time.monotonic() - started
    assert 0.9 < took < 3.0, took
    assert fault_proxy.swallowed >= 1
    assert store.breaker is not None and (store.breaker.silent or store.breaker.is_open)
    store.close()


def test_puts_wait_longer_for_their_answer_than_gets(
    bucket: tuple[str, str], fault_proxy: FaultProxy
) -> None:
    """Answers that come after 1.2 s: a GET (read timeout 0.5 s) gives up, a
    PUT (upload read timeout 5 s) waits for its answer."""
    store = make_store(
        fault_proxy.endpoint, bucket[1], policy=TINY, read_timeout=0.5, upload_read_timeout=5.0
    )
    store.put("obj", BLOB[:100])
    fault_proxy.delay = 1.2
    etag = store.put("slow", b"z" * 1000)
    assert store.calls["PutObject"] == 2
    fault_proxy.delay = 0
    assert store.head("slow").etag == etag
    fault_proxy.delay = 1.2
    with pytest.raises(StoreUnavailable, match="ReadTimeout"):
        store.get_range("obj", 0, 10)
    store.close()


# --- 2. semantics ----------------------------------------------------------------------------------


def test_if_match(direct: S3Store) -> None:
    etag = direct.put("obj", BLOB[:1000])
    assert direct.get_range("obj", 0, 10, etag=etag) == BLOB[:10]
    assert direct.get_range("obj", 0, 10, etag=f'"{etag}"') == BLOB[:10]
    with pytest.raises(PreconditionFailed, match=f"get_range s3://{direct.bucket}/pre/obj"):
        direct.get_range("obj", 0, 10, etag="0123456789abcdef0123456789abcdef")
    buf = bytearray(10)
    with pytest.raises(PreconditionFailed):
        direct.get_range_into("obj", 0, [memoryview(buf)], etag="0" * 32)
    assert direct.calls["GetObject"] == 4


def test_ranges_at_and_past_the_end(direct: S3Store) -> None:
    direct.put("obj", BLOB[:1000])
    assert direct.get_range("obj", 990, 100) == BLOB[990:1000]
    assert direct.get_range("obj", 1000, 10) == b""
    assert direct.get_range("obj", 5000, 10) == b""
    buf = bytearray(100)
    assert direct.get_range_into("obj", 950, [memoryview(buf)]) == 50
    assert buf[:50] == BLOB[950:1000]
    assert direct.get_range_into("obj", 1000, [memoryview(buf)]) == 0
    direct.put("empty", b"")
    assert direct.get_range("empty", 0, 10) == b""
    assert direct.calls["GetObject"] == 6


def test_missing_bucket_and_key(moto_server: str, direct: S3Store) -> None:
    store = make_store(moto_server, "no-such-bucket-here")
    with pytest.raises(BucketNotFound, match="no-such-bucket-here"):
        store.get_range("obj", 0, 10)
    with pytest.raises(BucketNotFound):
        store.put("obj", b"x")
    assert store.calls == {"GetObject": 1, "PutObject": 1}
    store.close()
    with pytest.raises(ObjectNotFound, match=f"s3://{direct.bucket}/pre/nothing"):
        direct.get_range("nothing", 0, 10)


def test_metadata_and_etag_round_trip(direct: S3Store, bucket: tuple[str, str]) -> None:
    meta = {"mode": "100644", "uid": "1000", "mtime": "1700000000.25", "x-tier.fs_k": "v w"}
    etag = direct.put("meta", b"hello world", meta)
    assert direct.calls == {"PutObject": 1}
    assert etag == hashlib.md5(b"hello world").hexdigest()  # stripped of its quotes
    info = direct.head("meta")
    assert info.etag == etag
    assert info.metadata == {k.lower(): v for k, v in meta.items()}
    assert info.mtime == 1700000000.25
    raw = make_s3_client(bucket[0]).head_object(Bucket=bucket[1], Key="pre/meta")
    assert raw["Metadata"]["mode"] == "100644"


KEYS_SENT_AS_THEY_ARE = [
    "plain",
    "dir/sub/file.bin",
    "spaces and+plus%percent&amp=eq?q#hash~tilde",
    "unicode é 字 🙂",
    "brackets[]{}^`|\\\"'<>",
]


@pytest.mark.parametrize("key", KEYS_SENT_AS_THEY_ARE)
def test_keys_go_out_exactly_as_given(direct: S3Store, bucket: tuple[str, str], key: str) -> None:
    assert native_key_ok("pre/" + key)
    direct.put(key, key.encode())
    client = make_s3_client(bucket[0])
    assert client.get_object(Bucket=bucket[1], Key="pre/" + key)["Body"].read() == key.encode()
    assert direct.get_range(key, 0, 1000) == key.encode()


@pytest.mark.parametrize("key", ["a//b", "a/./b", "a/../b", "trailing/", "tab\there"])
def test_keys_obstore_would_rewrite_use_botocore(
    direct: S3Store, bucket: tuple[str, str], key: str
) -> None:
    assert not native_key_ok("pre/" + key)
    hits: list[str] = []
    direct.client.meta.events.register(
        "before-send.s3.*", lambda event_name, **_: hits.append(event_name)
    )
    direct.put(key, b"data")
    assert direct.get_range(key, 0, 10) == b"data"
    assert [h.rsplit(".", 1)[-1] for h in hits] == ["PutObject", "GetObject"]
    client = make_s3_client(bucket[0])
    assert client.get_object(Bucket=bucket[1], Key="pre/" + key)["Body"].read() == b"data"


def test_routing_by_size_and_metadata(direct: S3Store) -> None:
    hits: list[str] = []
    direct.client.meta.events.register(
        "before-send.s3.*", lambda event_name, **_: hits.append(event_name.rsplit(".", 1)[-1])
    )
    big = random.Random(5).randbytes(NATIVE_GET_MAX + 10)
    direct.put("big", big)  # native: under NATIVE_PUT_MAX
    assert direct.get_range("big", 0, NATIVE_GET_MAX) == big[:NATIVE_GET_MAX]  # native
    assert direct.get_range("big", 5, NATIVE_GET_MAX + 1) == big[5 : NATIVE_GET_MAX + 6]  # botocore
    assert hits == ["GetObject"]
    assert not native_metadata_ok({"content-type": "text/plain"})
    direct.put("typed", b"x", {"content-type": "text/plain"})  # botocore: an x-amz-meta-* name
    assert hits == ["GetObject", "PutObject"]
    assert direct.head("typed").metadata == {"content-type": "text/plain"}
    assert direct.calls == {"PutObject": 2, "GetObject": 2, "HeadObject": 1}


def test_observer_is_told_each_request(proxied: S3Store, fault_proxy: FaultProxy) -> None:
    seen: list[tuple[str, float, bool]] = []
    proxied.request_observer = lambda op, seconds, failed: seen.append((op, seconds, failed))
    fault_proxy.answer_requests(1, status=503, code="SlowDown", match=GET)
    proxied.get_range("obj", 0, 10)
    with pytest.raises(ObjectNotFound):
        proxied.get_range("missing", 0, 10)
    assert proxied.get_range("obj", len(BLOB), 10) == b""
    proxied.put("new", b"abc")
    assert [(op, failed) for op, _, failed in seen] == [
        ("GetObject", True),  # 503
        ("GetObject", False),
        ("GetObject", False),  # 404: an ordinary "no"
        ("GetObject", False),  # 416: past the end
        ("PutObject", False),
    ]
    assert all(0 < seconds < 5 for _, seconds, _ in seen)
    assert proxied.calls == {"GetObject": 4, "PutObject": 1}


# --- 3. on the wire --------------------------------------------------------------------------------


class _Capture(http.server.BaseHTTPRequestHandler):
    """Records each PUT (headers, body) and answers 200 with an ETag."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[dict[str, str], bytes]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("ETag", '"0123abcd"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def capture_endpoint() -> Iterator[str]:
    """A loopback HTTP server that records PUTs (``_Capture.seen``)."""
    _Capture.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_put_payload_carries_its_sha256(aws_test_env: None, capture_endpoint: str) -> None:
    store = S3Store("s3://capture/pre", endpoint_url=capture_endpoint)
    payload = random.Random(3).randbytes(70_000)
    assert store.put("k", payload, {"mode": "1"}) == "0123abcd"
    store.close()
    [(headers, body)] = _Capture.seen
    assert body == payload
    assert headers["x-amz-content-sha256"] == hashlib.sha256(payload).hexdigest()
    signed = headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert "x-amz-content-sha256" in signed
    assert headers["x-amz-meta-mode"] == "1"


def test_credentials_come_from_the_botocore_chain(
    capture_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys only in a shared-credentials profile (which botocore reads and
    obstore's own environment lookup does not) sign the native PUT."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[tierfs-test]\naws_access_key_id = AKIAPROFILEONLY00001\n"
        "aws_secret_access_key = profile-secret\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "tierfs-test")
    store = S3Store("s3://capture/pre", endpoint_url=capture_endpoint, region="us-east-1")
    store.put("k", b"signed by the profile")
    store.close()
    [(headers, _)] = _Capture.seen
    assert "Credential=AKIAPROFILEONLY00001/" in headers["authorization"]


def test_no_credentials_is_access_denied(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = make_store(moto_server, "bkt", policy=TINY)
    for call in (lambda: store.get_range("k", 0, 1), lambda: store.put("k", b"x")):
        with pytest.raises(StoreAccessDenied, match="no usable AWS credentials"):
            call()
    store.close()


# --- 4. the mapping ----------------------------------------------------------------------------------


def _obstore_http(status: int, code: str | None) -> BaseException:
    body = f"<Error><Code>{code}</Code></Error>" if code else "oops"
    return obstore.exceptions.GenericError(
        "Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 1ms - Server "
        f"returned non-2xx status code: {status} Whatever: {body}\n\nDebug source: ..."
    )


def _obstore_wire(kind: str, detail: str = "") -> BaseException:
    return obstore.exceptions.GenericError(
        "Generic S3 error: HTTP error: error sending request\n\nDebug source:\nGeneric {\n"
        f"    source: HttpError {{\n        kind: {kind},\n {detail} retry_timeout: 1ms }} }}"
    )


@pytest.mark.parametrize(
    ("exc", "expected", "retry", "unreachable"),
    [
        (_obstore_http(503, "SlowDown"), (503, "SlowDown"), True, False),
        (_obstore_http(502, None), (502, "502"), True, True),
        (_obstore_http(416, "InvalidRange"), (416, "InvalidRange"), False, False),
        (_obstore_http(404, "NoSuchBucket"), (404, "NoSuchBucket"), False, False),
        (obstore.exceptions.PreconditionError("precondition"), (412, "412"), False, False),
        (_obstore_wire("Connect", "ConnectionRefused"), EndpointConnectionError, True, True),
        (_obstore_wire("Connect", "TimedOut"), ConnectTimeoutError, True, True),
        (_obstore_wire("Timeout", "TimedOut"), ReadTimeoutError, True, True),
        (_obstore_wire("Interrupted", "ConnectionReset"), ConnectionClosedError, True, False),
    ],
)
def test_botocore_equivalent(
    exc: BaseException, expected: Any, retry: bool, unreachable: bool
) -> None:
    mapped = botocore_equivalent(exc, "GetObject", "http://127.0.0.1:1")
    if isinstance(expected, tuple):
        assert isinstance(mapped, ClientError)
        assert mapped.response["ResponseMetadata"]["HTTPStatusCode"] == expected[0]
        assert mapped.response["Error"]["Code"] == expected[1]
    else:
        assert type(mapped) is expected
    verdict = classify(mapped)
    assert (verdict.retry, verdict.unreachable) == (retry, unreachable)


def test_botocore_equivalent_leaves_other_errors_alone() -> None:
    exc = ValueError("not a store failure")
    assert botocore_equivalent(exc, "GetObject", "http://e") is exc
