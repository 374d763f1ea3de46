"""Fault injection against the real moto server over loopback.

1. A botocore ``before-send`` hook answers the first N requests with 5xx /
   SlowDown / 4xx responses (or raises a connection error): transient faults
   are retried inside the budget, permanent ones are not, and a spent budget
   gives StoreUnavailable quickly.  These stores send every request through
   botocore (``BOTOCORE_ONLY``: no native engine, whose GETs and PUTs a
   botocore hook cannot see); tests/unit/test_store_native.py proves the
   same for the native engine with FaultProxy.
2. ``tests.faults.FaultProxy`` resets or truncates response bodies mid-way:
   ``get_range`` still returns the exact bytes.
3. ``check()`` fails within seconds, with the right error, for a missing
   bucket, bad credentials (on a second moto server that enforces IAM) and a
   closed port.
4. The retry policy itself, with a fake clock: backoff bounds, Retry-After,
   time budget, classification.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from tests.conftest import free_port, make_s3_client, start_moto, stop_process
from tests.faults import FaultProxy
from tierfs.errors import (
    BucketNotFound,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from tierfs.store.local import LocalStore
from tierfs.store.retry import (
    RetryPolicy,
    TruncatedBody,
    classify,
    parse_retry_after,
    run_with_retry,
)
from tierfs.store.s3 import S3Store

FAST = RetryPolicy(max_attempts=5, budget=10.0, base_delay=0.01, max_delay=0.05)
TINY = RetryPolicy(max_attempts=3, budget=1.0, base_delay=0.01, max_delay=0.05)
BLOB = random.Random(1234).randbytes(1 << 20)  # 1 MiB of reproducible noise


#: S3Store arguments that keep every request on botocore (big GETs and
#: multipart always are): for the before-send hook tests.
BOTOCORE_ONLY: dict[str, Any] = {"native_get_max": 0, "native_put_max": 0}


def make_store(endpoint: str, bucket: str, policy: RetryPolicy = FAST, **kwargs: Any) -> S3Store:
    return S3Store(f"s3://{bucket}/pre/", endpoint_url=endpoint, retry=policy, **kwargs)


@pytest.fixture
def fast_store(bucket: tuple[str, str]) -> Iterator[S3Store]:
    store = make_store(*bucket, **BOTOCORE_ONLY)
    yield store
    store.close()


# --- 1. before-send hook ------------------------------------------------------------------------


class _Raw:
    """Minimal raw body for AWSResponse (what urllib3's response offers botocore)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        yield self.read()

    def read(self, amt: int | None = None) -> bytes:
        if amt is None:
            data, self._body = self._body, b""
        else:
            data, self._body = self._body[:amt], self._body[amt:]
        return data

    def close(self) -> None:
        pass


def error_xml(code: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected {code}</Message><RequestId>test</RequestId></Error>"
    ).encode()


class Injector:
    """before-send hook: the first ``n`` requests get ``make(request)`` instead of the server.

    ``make`` returns an AWSResponse, or raises (a connection error, say).
    ``seen`` counts all requests, ``injected`` the faked ones.
    """

    def __init__(self, n: int, make: Callable[[Any], AWSResponse]) -> None:
        self.remaining = n
        self.make = make
        self.seen = 0
        self.injected = 0
        self.lock = threading.Lock()

    def __call__(self, request: Any, **kwargs: Any) -> AWSResponse | None:
        with self.lock:
            self.seen += 1
            if self.remaining <= 0:
                return None
            self.remaining -= 1
            self.injected += 1
        return self.make(request)


def error_response(status: int, code: str | None, headers: dict[str, str] | None = None):
    def make(request: Any) -> AWSResponse:
        body = b"" if request.method == "HEAD" or code is None else error_xml(code)
        hdrs = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        hdrs.update(headers or {})
        return AWSResponse(request.url, status, hdrs, _Raw(body))

    return make


def install(store: S3Store, injector: Injector) -> Injector:
    store.client.meta.events.register("before-send.s3.*", injector)
    return injector


OPERATIONS: dict[str, Callable[[S3Store], object]] = {
    "head": lambda s: s.head("obj"),
    "get_range": lambda s: s.get_range("obj", 10, 100),
    "list": lambda s: list(s.list_pages("")),
    "put": lambda s: s.put("other", b"payload"),
    "delete": lambda s: s.delete("other"),
    "check": lambda s: s.check(),
}


TRANSIENT = [
    (500, "InternalError"),
    (503, "SlowDown"),
    (503, None),
    (429, "Throttling"),
    (400, "RequestTimeout"),
]
HEAD_OPS = ("head", "check")  # a HEAD error has no body: a 400 cannot say RequestTimeout


@pytest.mark.parametrize(
    ("op", "status", "code"),
    [
        (op, status, code)
        for op in sorted(OPERATIONS)
        for status, code in TRANSIENT
        if not (op in HEAD_OPS and status == 400)
    ],
)
def test_transient_errors_are_retried(
    fast_store: S3Store, op: str, status: int, code: str | None
) -> None:
    fast_store.put("obj", BLOB[:1000])
    injector = install(fast_store, Injector(2, error_response(status, code)))
    OPERATIONS[op](fast_store)
    assert injector.injected == 2
    assert injector.seen == 3
    if op == "get_range":
        assert fast_store.get_range("obj", 10, 100) == BLOB[10:110]


@pytest.mark.parametrize("exc", [ConnectionClosedError, EndpointConnectionError])
def test_connection_errors_are_retried(fast_store: S3Store, exc: type[Exception]) -> None:
    fast_store.put("obj", BLOB[:1000])

    def fail(request: Any) -> AWSResponse:
        raise exc(endpoint_url=request.url)

    injector = install(fast_store, Injector(3, fail))
    assert fast_store.get_range("obj", 0, 10) == BLOB[:10]
    assert injector.seen == 4


def test_budget_spent_raises_store_unavailable_quickly(bucket: tuple[str, str]) -> None:
    store = make_store(*bucket, policy=TINY, **BOTOCORE_ONLY)
    store.put("obj", b"x")
    injector = install(store, Injector(1000, error_response(503, "SlowDown")))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.get_range("obj", 0, 1)
    assert time.monotonic() - started < 2.0
    assert injector.seen == TINY.max_attempts
    message = str(info.value)
    assert "get_range" in message
    assert f"s3://{store.bucket}/pre/obj" in message
    assert "SlowDown" in message
    assert info.value.errno != 0


def test_time_budget_bounds_attempts(bucket: tuple[str, str]) -> None:
    policy = RetryPolicy(max_attempts=1000, budget=0.5, base_delay=0.05, max_delay=0.1)
    store = make_store(*bucket, policy=policy, **BOTOCORE_ONLY)
    install(store, Injector(10**6, error_response(500, "InternalError")))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="time budget"):
        store.head("obj")
    assert time.monotonic() - started < 1.5


def test_retry_after_is_honoured(fast_store: S3Store) -> None:
    fast_store.put("obj", b"x")
    injector = install(
        fast_store, Injector(1, error_response(503, "SlowDown", {"Retry-After": "1"}))
    )
    started = time.monotonic()
    fast_store.head("obj")
    assert time.monotonic() - started >= 0.95
    assert injector.seen == 2


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (404, "NoSuchKey", ObjectNotFound),
        (404, "NoSuchBucket", BucketNotFound),
        (403, "AccessDenied", StoreAccessDenied),
        (403, "InvalidAccessKeyId", StoreAccessDenied),
        (403, "SignatureDoesNotMatch", StoreAccessDenied),
        (412, "PreconditionFailed", PreconditionFailed),
        (400, "InvalidArgument", StoreRefused),
        (400, "KeyTooLongError", StoreRefused),
        (413, "EntityTooLarge", StoreRefused),
        (409, "OperationAborted", StoreError),
    ],
)
def test_permanent_errors_are_not_retried(
    fast_store: S3Store, status: int, code: str, error: type[StoreError]
) -> None:
    injector = install(fast_store, Injector(10, error_response(status, code)))
    with pytest.raises(error) as info:
        fast_store.get_range("obj", 0, 10)
    assert type(info.value) is error
    assert injector.seen == 1
    assert f"s3://{fast_store.bucket}/pre/obj" in str(info.value) or error is BucketNotFound


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, ObjectNotFound), (403, StoreAccessDenied), (412, PreconditionFailed)],
)
def test_head_errors_without_body(
    fast_store: S3Store, status: int, error: type[StoreError]
) -> None:
    injector = install(fast_store, Injector(10, error_response(status, None)))
    with pytest.raises(error):
        fast_store.head("obj")
    assert injector.seen == 1


def partial_content(body: bytes, content_range: str):
    def make(request: Any) -> AWSResponse:
        headers = {
            "Content-Length": str(len(body)),
            "Content-Range": content_range,
            "ETag": '"whatever"',
        }
        return AWSResponse(request.url, 206, headers, _Raw(body))

    return make


@pytest.mark.parametrize(
    ("body", "content_range"),
    [
        (BLOB[:5], "bytes 0-9/1048576"),  # shorter than its own Content-Range
        (BLOB[:5], "bytes 0-4/1048576"),  # a shorter range than asked, object long enough
    ],
)
def test_short_range_body_is_refetched(
    fast_store: S3Store, body: bytes, content_range: str
) -> None:
    fast_store.put("obj", BLOB)
    injector = install(fast_store, Injector(2, partial_content(body, content_range)))
    assert fast_store.get_range("obj", 0, 10) == BLOB[:10]
    assert injector.seen == 3


def test_credentials_never_in_messages(
    bucket: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "SuperSecretValue/ShouldNeverAppear"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    store = make_store(*bucket, policy=TINY, **BOTOCORE_ONLY)
    install(store, Injector(100, error_response(403, "SignatureDoesNotMatch")))
    with pytest.raises(StoreAccessDenied) as info:
        store.head("obj")
    chain: list[BaseException] = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert all(secret not in str(e) and secret not in repr(e) for e in chain)
    assert secret not in repr(store)


# --- 2. FaultProxy: resets and truncated bodies -----------------------------------------------------


@pytest.fixture(params=["native", "botocore"])
def proxied_store(
    bucket: tuple[str, str], fault_proxy: FaultProxy, request: pytest.FixtureRequest
) -> Iterator[S3Store]:
    """Both engines: ranges up to 1 MiB go native unless BOTOCORE_ONLY."""
    _, name = bucket
    engine = BOTOCORE_ONLY if request.param == "botocore" else {}
    store = make_store(f"http://127.0.0.1:{fault_proxy.port}", name, **engine)
    store.put("blob", BLOB)
    yield store
    store.close()


@pytest.mark.parametrize("fault", ["reset", "truncate"])
@pytest.mark.parametrize(
    ("start", "length"), [(0, len(BLOB)), (12345, 300000), (len(BLOB) - 1000, 5000)]
)
def test_get_range_survives_broken_bodies(
    proxied_store: S3Store, fault_proxy: FaultProxy, fault: str, start: int, length: int
) -> None:
    getattr(fault_proxy, f"{fault}_next")(2)
    assert proxied_store.get_range("blob", start, length) == BLOB[start : start + length]
    assert fault_proxy.faults_injected == 2


@pytest.mark.parametrize("fault", ["reset", "truncate"])
def test_get_range_into_survives_broken_bodies(
    proxied_store: S3Store, fault_proxy: FaultProxy, fault: str
) -> None:
    """The zero-copy read: a broken body is fetched again, the buffers end
    up with exactly the object's bytes, and the pooled connections still
    serve correct answers afterwards."""
    getattr(fault_proxy, f"{fault}_next")(2)
    start, sizes = 4321, [100_000, 250_000, 7]
    bufs = [bytearray(n) for n in sizes]
    got = proxied_store.get_range_into("blob", start, [memoryview(b) for b in bufs])
    assert got == sum(sizes)
    assert b"".join(bufs) == BLOB[start : start + got]
    assert fault_proxy.faults_injected == 2
    for offset in (0, 5000, 90_000):  # reused connections: no stray bytes left in them
        buf = bytearray(3000)
        assert proxied_store.get_range_into("blob", offset, [memoryview(buf)]) == 3000
        assert buf == BLOB[offset : offset + 3000]


def test_get_range_into_reads_without_a_copy(proxied_store: S3Store) -> None:
    """A canary for botocore/urllib3 upgrades: the zero-copy read depends
    on http.client's response under botocore's body; without it,
    get_range_into still works but silently falls back to a copy.  (moto
    answers ``Connection: close``, so the reuse of pooled connections is
    checked by the benchmark against s3rver, not here.)"""
    resp = proxied_store.client.get_object(Bucket=proxied_store.bucket, Key="pre/blob")
    fp = getattr(getattr(resp["Body"], "_raw_stream", None), "_fp", None)
    assert callable(getattr(fp, "readinto", None)), "botocore's body changed: update s3.py"
    resp["Body"].close()
    for offset in range(0, 50_000, 5000):
        buf = bytearray(5000)
        assert proxied_store.get_range_into("blob", offset, [memoryview(buf)]) == 5000
        assert buf == BLOB[offset : offset + 5000]


def test_get_range_mixed_faults_with_if_match(
    proxied_store: S3Store, fault_proxy: FaultProxy
) -> None:
    etag = proxied_store.head("blob").etag  # HEAD has no body: consumes no fault
    fault_proxy.reset_next(1)
    fault_proxy.truncate_next(1)
    assert proxied_store.get_range("blob", 1000, 500000, etag=etag) == BLOB[1000:501000]
    assert fault_proxy.faults_injected == 2
    assert fault_proxy.connections >= 2


def test_get_range_gives_up_on_persistent_resets(
    bucket: tuple[str, str], fault_proxy: FaultProxy
) -> None:
    _, name = bucket
    make_s3_client(f"http://127.0.0.1:{fault_proxy.port}").put_object(
        Bucket=name, Key="pre/blob", Body=BLOB
    )
    store = make_store(f"http://127.0.0.1:{fault_proxy.port}", name, policy=TINY)
    fault_proxy.reset_next(1000)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.get_range("blob", 0, len(BLOB))
    assert time.monotonic() - started < 5
    assert fault_proxy.faults_injected == TINY.max_attempts
    assert "get_range" in str(info.value) and "pre/blob" in str(info.value)


def test_read_timeout_is_retried_then_gives_up(
    bucket: tuple[str, str], fault_proxy: FaultProxy
) -> None:
    """The retry policy alone (with a breaker, a foreground request is not
    retried after a timeout: tests/unit/test_store_breaker.py)."""
    _, name = bucket
    store = make_store(
        f"http://127.0.0.1:{fault_proxy.port}",
        name,
        policy=TINY,
        read_timeout=0.2,
        circuit_breaker=False,
    )
    store.put("obj", b"x")
    fault_proxy.delay = 0.6
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="ReadTimeout"):
        store.head("obj")
    assert time.monotonic() - started < 5
    fault_proxy.delay = 0.0
    assert store.head("obj").size == 1


def test_proxy_refuses_non_loopback() -> None:
    with pytest.raises(ValueError):
        FaultProxy("192.0.2.1", 80)
    with pytest.raises(ValueError):
        FaultProxy("example.com", 80)


# --- 3. check() --------------------------------------------------------------------------------


def test_check_ok(fast_store: S3Store) -> None:
    fast_store.check()


def test_check_missing_bucket(moto_server: str) -> None:
    store = S3Store("s3://tierfs-missing-bucket", endpoint_url=moto_server)
    started = time.monotonic()
    with pytest.raises(BucketNotFound) as info:
        store.check()
    assert time.monotonic() - started < 10
    assert str(info.value) == f"bucket 'tierfs-missing-bucket' does not exist at {moto_server}"


def test_check_closed_port() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Store("s3://bkt", endpoint_url=endpoint)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.check()
    assert time.monotonic() - started < 10
    assert endpoint in str(info.value)
    assert "EndpointConnectionError" in str(info.value)


def test_check_no_credentials(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = S3Store("s3://bkt", endpoint_url=moto_server)
    started = time.monotonic()
    with pytest.raises(StoreAccessDenied, match="no usable AWS credentials"):
        store.check()
    assert time.monotonic() - started < 10


@pytest.fixture(scope="module")
def moto_with_auth(
    moto_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """A second moto server that enforces IAM after its first 4 requests.

    Those 4 (create user, attach policy, create access key, create bucket) set
    up one valid identity; every later request must be signed by it.
    """
    log_path = tmp_path_factory.mktemp("moto-auth") / "moto.log"
    proc, endpoint = start_moto(log_path, {"INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    try:
        import boto3

        iam = boto3.session.Session().client("iam", endpoint_url=endpoint, region_name="us-east-1")
        iam.create_user(UserName="tierfs")
        iam.put_user_policy(
            UserName="tierfs",
            PolicyName="all-s3",
            PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}',
        )
        key = iam.create_access_key(UserName="tierfs")["AccessKey"]
        make_s3_client(endpoint).create_bucket(Bucket="authbucket")
        yield {
            "endpoint": endpoint,
            "key_id": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
        }
    finally:
        stop_process(proc)


def test_check_credentials_enforced(
    moto_with_auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = moto_with_auth["endpoint"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_with_auth["key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_with_auth["secret"])
    S3Store("s3://authbucket", endpoint_url=endpoint).check()  # the good identity works

    for key_id, secret in [
        (moto_with_auth["key_id"], "wrong-secret"),
        ("AKIAUNKNOWNUNKNOWN00", moto_with_auth["secret"]),
    ]:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        store = S3Store("s3://authbucket", endpoint_url=endpoint)
        started = time.monotonic()
        with pytest.raises(StoreAccessDenied) as info:
            store.check()
        assert time.monotonic() - started < 10
        assert "access denied" in str(info.value)
        assert secret not in str(info.value)


def test_check_local_store(tmp_path: Path) -> None:
    with pytest.raises(BucketNotFound, match="does not exist"):
        LocalStore((tmp_path / "missing").as_uri()).check()
    LocalStore(tmp_path.as_uri()).check()
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StoreAccessDenied):
            LocalStore(locked.as_uri()).check()


# --- 4. the retry policy on its own ---------------------------------------------------------------


def client_error(status: int, code: str, headers: dict[str, str] | None = None) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
        },
        "GetObject",
    )


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(errors: list[BaseException], result: str = "ok") -> Callable[[], str]:
    pending = list(errors)

    def fn() -> str:
        if pending:
            raise pending.pop(0)
        return result

    return fn


def mapper(exc: BaseException) -> StoreError:
    return StoreError(f"mapped {type(exc).__name__}")


def run(policy: RetryPolicy, fn: Callable[[], str], fake: FakeTime) -> str:
    return run_with_retry(
        policy,
        fn,
        op="op",
        target="s3://b/k",
        map_error=mapper,
        sleep=fake.sleep,
        clock=fake.clock,
        rng=random.Random(7),
    )


def test_backoff_full_jitter_bounds() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=2.0)
    rng = random.Random(3)
    for n in range(12):
        cap = min(2.0, 0.1 * 2**n)
        samples = [policy.backoff(n, rng) for _ in range(200)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8  # really spread over the whole interval
        assert min(samples) < cap * 0.2


def test_retry_succeeds_within_attempts() -> None:
    fake = FakeTime()
    errors: list[BaseException] = [client_error(500, "InternalError")] * 5
    assert run(RetryPolicy(max_attempts=6), failing(errors), fake) == "ok"
    assert len(fake.sleeps) == 5


def test_retry_attempt_limit() -> None:
    fake = FakeTime()
    errors: list[BaseException] = [client_error(503, "SlowDown")] * 10
    with pytest.raises(
        StoreUnavailable, match=r"op s3://b/k: giving up after 3 attempts.*SlowDown"
    ):
        run(RetryPolicy(max_attempts=3), failing(errors), fake)
    assert len(fake.sleeps) == 2


def test_retry_after_header_and_budget() -> None:
    fake = FakeTime()
    errors: list[BaseException] = [client_error(503, "SlowDown", {"retry-after": "3"})]
    assert run(RetryPolicy(base_delay=0.001, budget=10), failing(errors), fake) == "ok"
    assert fake.sleeps == [3.0]

    fake = FakeTime()
    errors = [client_error(503, "SlowDown", {"retry-after": "30"})]
    with pytest.raises(StoreUnavailable, match="time budget"):
        run(RetryPolicy(budget=10), failing(errors), fake)
    assert fake.sleeps == []  # gave up at once instead of sleeping past the budget


def test_retry_never_sleeps_past_budget() -> None:
    fake = FakeTime()
    errors: list[BaseException] = [ConnectionResetError()] * 1000
    with pytest.raises(StoreUnavailable):
        run(
            RetryPolicy(max_attempts=1000, budget=5.0, base_delay=0.5, max_delay=2.0),
            failing(errors),
            fake,
        )
    assert fake.now <= 5.0
    assert len(fake.sleeps) > 3


def test_permanent_error_is_mapped_without_retry() -> None:
    fake = FakeTime()
    with pytest.raises(StoreError, match="mapped ClientError"):
        run(RetryPolicy(), failing([client_error(404, "NoSuchKey")]), fake)
    assert fake.sleeps == []


def test_store_errors_pass_through() -> None:
    fake = FakeTime()
    with pytest.raises(ObjectNotFound):
        run(RetryPolicy(), failing([ObjectNotFound("x")]), fake)
    assert fake.sleeps == []


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (client_error(500, "InternalError"), True),
        (client_error(502, "502"), True),
        (client_error(503, "SlowDown"), True),
        (client_error(400, "RequestTimeout"), True),
        (client_error(400, "Throttling"), True),
        (client_error(429, "TooManyRequests"), True),
        (client_error(404, "NoSuchKey"), False),
        (client_error(404, "NoSuchBucket"), False),
        (client_error(403, "AccessDenied"), False),
        (client_error(412, "PreconditionFailed"), False),
        (client_error(416, "InvalidRange"), False),
        (client_error(501, "NotImplemented"), False),
        (EndpointConnectionError(endpoint_url="http://x"), True),
        (ConnectionClosedError(endpoint_url="http://x"), True),
        (ReadTimeoutError(endpoint_url="http://x"), True),
        (ResponseStreamingError(error="reset"), True),
        (IncompleteReadError(actual_bytes=1, expected_bytes=2), True),
        (TruncatedBody(1, 2), True),
        (ConnectionResetError(), True),
        (NoCredentialsError(), False),
        (ParamValidationError(report="bad"), False),
        (ValueError("bug"), False),
    ],
)
def test_classify(exc: BaseException, retry: bool) -> None:
    assert classify(exc).retry is retry


def test_parse_retry_after() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0.0
    when = parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0)
    assert when == pytest.approx(10.0)


def test_an_object_another_tool_deleted_leaves_no_sidecar_in_the_way(local_store: Any) -> None:
    """``rm`` of an object's file in a ``file://`` bucket leaves its sidecar
    (``.tierfs-meta/NAME``).  The directory is still given up when its last
    object goes, and a file may take its name (found by the model test:
    ``dd/x`` deleted by another tool, ``dd/`` removed, then a file ``dd``)."""
    from pathlib import Path

    root = Path(local_store.root)
    local_store.put("dd/", b"")  # a directory's marker
    local_store.put("dd/x", b"x")
    (root / "dd" / "x").unlink()  # another tool; the sidecar stays
    assert (root / "dd" / ".tierfs-meta" / "x").exists()
    local_store.delete("dd/")  # rmdir through a mount
    assert not (root / "dd").exists()
    local_store.put("dd", b"now a file")
    assert local_store.get_range("dd", 0, 100) == b"now a file"
    # The same with the file put while the directory is still there.
    local_store.put("ee/y", b"y")
    (root / "ee" / "y").unlink()
    local_store.put("ee", b"a file")
    assert local_store.get_range("ee", 0, 100) == b"a file"
