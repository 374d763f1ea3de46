"""The endpoint's circuit breaker, the bounded timeouts, and the FaultProxy outage modes.

1. CircuitBreaker on a fake clock, driven by hand (no prober thread).
2. run_with_retry with a breaker and the duration-aware budget (fake clock).
3. The FaultProxy's refuse / black hole / restore modes on raw sockets.
4. S3Store against the real moto server through the proxy: refusal opens the
   breaker, calls then fail at once without a connection, the probe closes
   it when the endpoint is back; a black hole costs one read timeout.
"""

from __future__ import annotations

import errno
import socket
import time
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

from tests.conftest import make_s3_client
from tests.faults import FaultProxy
from tierfs.errors import EndpointUnreachable, StoreError, StoreUnavailable
from tierfs.store.breaker import CircuitBreaker, breaker_of
from tierfs.store.retry import RetryPolicy, classify, run_with_retry
from tierfs.store.s3 import LIST_READ_TIMEOUT, READ_TIMEOUT, S3Store


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _error_response(status: int, code: str) -> Any:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "HeadObject"
    )


# --- 1. the state machine ------------------------------------------------------------------------


def make_breaker(
    probe_results: list[bool], threshold: int = 3
) -> tuple[CircuitBreaker, FakeClock, list[bool]]:
    clock = FakeClock()
    wall = FakeClock()
    wall.now = 1_700_000_000.0
    events: list[bool] = []

    def probe() -> None:
        if not probe_results.pop(0):
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    breaker = CircuitBreaker(
        "http://127.0.0.1:1",
        probe,
        threshold=threshold,
        clock=clock,
        wall_clock=wall,
        start_prober=False,
    )
    breaker.add_listener(events.append)
    return breaker, wall, events


def test_breaker_opens_after_threshold_consecutive_failures_and_fails_fast() -> None:
    breaker, wall, events = make_breaker([])
    breaker.record_failure("EndpointConnectionError")
    breaker.record_failure("EndpointConnectionError")
    breaker.before_attempt("head", "s3://b/k")  # still closed: no exception
    assert not breaker.is_open
    breaker.record_failure("ReadTimeoutError")
    assert breaker.is_open
    assert events == [False]
    with pytest.raises(EndpointUnreachable) as info:
        breaker.before_attempt("head", "s3://b/k")
    assert info.value.errno == errno.EIO
    assert "head s3://b/k" in str(info.value) and "ReadTimeoutError" in str(info.value)
    snap = breaker.snapshot()
    assert not snap.reachable
    assert snap.since == wall.now
    assert snap.last_error == "ReadTimeoutError"
    assert snap.outages == 1 and snap.failed_fast == 1
    assert snap.as_dict()["state"] == "unreachable"


def test_an_answer_resets_the_count() -> None:
    breaker, _, events = make_breaker([])
    for _ in range(5):
        breaker.record_failure("EndpointConnectionError")
        breaker.record_failure("EndpointConnectionError")
        breaker.record_success()
    assert not breaker.is_open
    assert breaker.snapshot().consecutive_failures == 0
    assert events == []


def test_probe_closes_the_breaker_only_when_it_gets_an_answer() -> None:
    breaker, wall, events = make_breaker([False, False, True])
    for _ in range(3):
        breaker.record_failure("EndpointConnectionError")
    assert not breaker.probe_once()
    assert not breaker.probe_once()
    assert breaker.is_open
    assert breaker.snapshot().last_error == "EndpointConnectionError"
    wall.now += 42.0
    assert breaker.probe_once()
    assert not breaker.is_open
    assert events == [False, True]
    snap = breaker.snapshot()
    assert snap.reachable and snap.since == wall.now and snap.outages == 1
    breaker.before_attempt("head", "s3://b/k")  # closed again


def test_prober_settles_a_single_failure_by_itself() -> None:
    """No other request needed: probes after one failure open the breaker when
    the endpoint stays silent, and close it when it answers again."""
    answering = False
    probes = 0

    def probe() -> None:
        nonlocal probes
        probes += 1
        if not answering:  # refused: weighs one failure (a timeout weighs more)
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    breaker = CircuitBreaker("e", probe, threshold=3, probe_interval=0.05)
    try:
        breaker.record_failure("ReadTimeoutError")
        deadline = time.monotonic() + 5
        while not breaker.is_open and time.monotonic() < deadline:
            time.sleep(0.01)
        assert breaker.is_open and probes >= 2
        answering = True
        while breaker.is_open and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not breaker.is_open
        # A healthy endpoint: one failure, and the first probe settles it.
        breaker.record_failure("ReadTimeoutError")
        while breaker.suspect and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not breaker.suspect and not breaker.is_open
    finally:
        breaker.close()


def test_breaker_of_finds_only_real_breakers() -> None:
    breaker, _, _ = make_breaker([])

    class WithBreaker:
        def __init__(self) -> None:
            self.breaker = breaker

    assert breaker_of(WithBreaker()) is breaker
    assert breaker_of(object()) is None


def test_listener_errors_do_not_break_transitions(caplog: pytest.LogCaptureFixture) -> None:
    breaker, _, _ = make_breaker([True], threshold=1)

    def broken(reachable: bool) -> None:
        raise RuntimeError("listener bug")

    breaker.add_listener(broken)
    breaker.record_failure("ReadTimeoutError")
    assert breaker.is_open
    assert breaker.probe_once()
    assert not breaker.is_open
    assert caplog.text.count("endpoint state listener failed") == 2


# --- 2. the retry loop with a breaker ---------------------------------------------------------------


def test_classify_counts_only_missing_answers() -> None:
    assert classify(EndpointConnectionError(endpoint_url="x")).unreachable
    assert classify(ReadTimeoutError(endpoint_url="x")).unreachable
    assert classify(_error_response(502, "BadGateway")).unreachable
    assert classify(_error_response(504, "GatewayTimeout")).unreachable
    # The endpoint answered, or a flaky path reset one request: not an outage.
    assert not classify(ConnectionClosedError(endpoint_url="x")).unreachable
    assert not classify(_error_response(503, "SlowDown")).unreachable
    assert not classify(_error_response(500, "InternalError")).unreachable
    assert not classify(_error_response(404, "NoSuchKey")).unreachable


def test_open_breaker_stops_the_retries_of_a_call() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("e", lambda: None, threshold=3, clock=clock, start_prober=False)
    calls = 0

    def refused() -> None:
        nonlocal calls
        calls += 1
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    policy = RetryPolicy(max_attempts=100, budget=1000.0, base_delay=0.1, max_delay=0.2)
    with pytest.raises(EndpointUnreachable):
        run_with_retry(
            policy,
            refused,
            op="head",
            target="s3://b/k",
            map_error=lambda exc: StoreError(str(exc)),
            sleep=clock.sleep,
            clock=clock,
            breaker=breaker,
        )
    assert calls == 3
    # The next call does not touch the network at all.
    with pytest.raises(EndpointUnreachable):
        run_with_retry(
            policy,
            refused,
            op="head",
            target="s3://b/k",
            map_error=lambda exc: StoreError(str(exc)),
            sleep=clock.sleep,
            clock=clock,
            breaker=breaker,
        )
    assert calls == 3
    assert breaker.snapshot().failed_fast == 2


def test_a_timeout_is_not_repeated_past_the_budget() -> None:
    """A black hole: each attempt waits 3 s; with 5 s of budget only one is made."""
    clock = FakeClock()
    calls = 0

    def black_hole() -> None:
        nonlocal calls
        calls += 1
        clock.sleep(3.0)
        raise ReadTimeoutError(endpoint_url="http://127.0.0.1:1")

    started = clock.now
    with pytest.raises(StoreUnavailable, match=r"time budget spent.*ReadTimeoutError"):
        run_with_retry(
            RetryPolicy(max_attempts=6, budget=5.0, base_delay=0.1, max_delay=0.2),
            black_hole,
            op="head",
            target="s3://b/k",
            map_error=lambda exc: StoreError(str(exc)),
            sleep=clock.sleep,
            clock=clock,
        )
    assert calls == 1
    assert clock.now - started == pytest.approx(3.0)


# --- 3. FaultProxy outage modes --------------------------------------------------------------------


def _echo_server() -> tuple[socket.socket, int]:
    """A loopback HTTP server: one answer with the body b"hello" per connection."""
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(1000)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _ask(port: int, timeout: float = 1.0) -> bytes:
    """One HTTP request through the proxy; the body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"hello"):
            chunk = s.recv(1000)
            if not chunk:
                break
            answer += chunk
        return answer.split(b"\r\n\r\n", 1)[-1]


def test_proxy_refuse_black_hole_restore() -> None:
    server, port = _echo_server()
    with server, FaultProxy("127.0.0.1", port) as proxy:
        assert _ask(proxy.port) == b"hello"
        proxy.refuse()
        assert proxy.mode == "refuse"
        with pytest.raises(ConnectionRefusedError):
            _ask(proxy.port)
        proxy.black_hole()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            _ask(proxy.port, timeout=0.3)
        assert 0.25 < time.monotonic() - started < 2
        assert proxy.swallowed == 1
        proxy.restore()
        assert proxy.mode == "forward"
        assert _ask(proxy.port) == b"hello"
        proxy.refuse()
        proxy.restore()  # from refused straight back: listens on the same port again
        assert _ask(proxy.port) == b"hello"


# --- 4. S3Store through the proxy ------------------------------------------------------------------


@pytest.fixture
def proxied(bucket: tuple[str, str], fault_proxy: FaultProxy) -> Any:
    _, name = bucket
    make_s3_client(fault_proxy.endpoint).put_object(Bucket=name, Key="pre/obj", Body=b"x" * 100)
    store = S3Store(f"s3://{name}/pre/", endpoint_url=fault_proxy.endpoint, region="us-east-1")
    yield store
    store.close()


def test_refused_endpoint_opens_the_breaker_then_calls_fail_at_once(
    proxied: S3Store, fault_proxy: FaultProxy
) -> None:
    assert proxied.breaker is not None
    reachable: list[bool] = []
    proxied.breaker.add_listener(reachable.append)
    assert proxied.head("obj").size == 100
    fault_proxy.refuse()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        proxied.head("obj")
    assert time.monotonic() - started < 5
    assert info.value.errno == errno.EIO
    assert proxied.breaker.is_open, "refused connections did not open the breaker"
    assert reachable == [False]
    connections = fault_proxy.connections
    for _ in range(20):
        started = time.monotonic()
        with pytest.raises(EndpointUnreachable):
            proxied.get_range("obj", 0, 10)
        assert time.monotonic() - started < 0.05
    assert fault_proxy.connections == connections
    assert proxied.breaker.snapshot().failed_fast >= 20
    fault_proxy.restore()
    deadline = time.monotonic() + 10
    # The probe's thread closes the breaker, then tells the listeners: wait
    # for both (checking the list the moment the breaker closed raced it).
    while (proxied.breaker.is_open or len(reachable) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proxied.breaker.is_open, "the probe did not close the breaker"
    assert reachable == [False, True]
    assert proxied.get_range("obj", 0, 10) == b"x" * 10


def test_black_hole_costs_one_read_timeout(proxied: S3Store, fault_proxy: FaultProxy) -> None:
    """The first foreground request waits out one read timeout; the ones
    after it fail fast (the endpoint is silent) instead of paying another."""
    fault_proxy.black_hole()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="ReadTimeout"):
        proxied.head("obj")
    took = time.monotonic() - started
    assert READ_TIMEOUT - 0.5 < took < READ_TIMEOUT + 2, took
    assert fault_proxy.swallowed >= 1
    breaker = breaker_of(proxied)
    assert breaker is not None and (breaker.silent or breaker.is_open)
    for call in (proxied.head, lambda key: list(proxied.list_pages(""))):
        started = time.monotonic()
        with pytest.raises(EndpointUnreachable) as info:
            call("obj")
        assert info.value.errno == errno.EIO
        assert time.monotonic() - started < 0.5
    fault_proxy.restore()
    deadline = time.monotonic() + 10
    while breaker.suspect and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not breaker.suspect, breaker.snapshot()
    assert proxied.head("obj").size == 100


def test_a_timeout_weighs_more_and_silences_foreground_requests_only() -> None:
    breaker = CircuitBreaker("e", lambda: None, threshold=5, start_prober=False)
    breaker.record_failure("ReadTimeoutError", timed_out=True)
    assert breaker.silent and not breaker.is_open
    breaker.before_attempt("put", "s3://b/k")  # background: still goes out
    with pytest.raises(EndpointUnreachable, match="gave no answer"):
        breaker.before_attempt("head", "s3://b/k", foreground=True)
    breaker.record_failure("ReadTimeoutError", timed_out=True)
    assert breaker.is_open  # two timeouts weigh more than the threshold of 5
    assert breaker.snapshot().failed_fast == 1
    breaker.record_success()
    assert not breaker.silent and not breaker.is_open
    breaker.before_attempt("head", "s3://b/k", foreground=True)
    # Refusals weigh one each and do not silence anything.
    for _ in range(4):
        breaker.record_failure("EndpointConnectionError")
    assert not breaker.silent and not breaker.is_open
    breaker.before_attempt("head", "s3://b/k", foreground=True)


def test_uploads_and_lists_get_longer_read_timeouts(proxied: S3Store) -> None:
    """The request that goes on the wire carries the per-request read timeout
    that botocore's HTTP session applies (``context["read_timeout"]``): uploads
    and LISTs wait longer for their answer than other requests."""
    sent: dict[str, Any] = {}

    def spy(request: Any, event_name: str, **_: Any) -> None:
        sent[event_name.rsplit(".", 1)[-1]] = request.context.get("read_timeout")

    proxied.client.meta.events.register("before-send.s3.*", spy)
    # A small PUT goes through the native engine, which a botocore hook
    # cannot see: its upload read timeout is proven by
    # test_store_native.py::test_puts_wait_longer_for_their_answer_than_gets.
    proxied.native_put_max = 0
    proxied.put("up", b"y")
    proxied.head("up")
    list(proxied.list_pages(""))
    assert sent["PutObject"] == proxied.upload_read_timeout
    assert sent["ListObjectsV2"] == LIST_READ_TIMEOUT > READ_TIMEOUT
    assert sent["HeadObject"] is None  # the client's READ_TIMEOUT applies
