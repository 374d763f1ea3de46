"""The one retry policy of the object-store layer.

Every S3 call in tierfs goes through :func:`run_with_retry` with a
:class:`RetryPolicy`.  botocore's own retries are switched off in the client
(``total_max_attempts=1``) so that there is exactly one place that decides
whether to try again, how long to wait and when to give up.  Two stacked
retry loops would multiply attempts and blow any time budget.

Invariants:

- An operation makes at most ``policy.max_attempts`` attempts.
- No new attempt starts once ``policy.budget`` seconds have passed since the
  first one, and we never sleep past the budget: if the next wait (backoff or
  the server's ``Retry-After``) would end after it, we give up at once.  The
  worst case wall time is therefore about ``budget`` plus one attempt's
  connect/read timeouts.
- Waits use exponential backoff with *full jitter*:
  ``uniform(0, min(max_delay, base_delay * 2**retry_no))``, raised to the
  server's ``Retry-After`` when it sent one (capped at ``max_retry_after``).
- Only transient failures are retried (see :func:`classify`): HTTP 5xx and
  429, the throttling / timeout error codes, connection failures, and
  reset or truncated response bodies.  Client errors (4xx such as NoSuchKey,
  AccessDenied, NoSuchBucket, PreconditionFailed) are never retried.
- After an attempt that got no answer (``Verdict.unreachable``: refused,
  timed out), the next one starts only if it can end inside the budget,
  judged by how long that attempt took: after a read timeout of T seconds
  with less than T (plus the backoff) left, we give up at once instead of
  waiting another T for a black hole.  So a foreground policy with a budget
  of a few seconds bounds a call by about that budget, whatever the
  endpoint does.
- With a :class:`~tierfs.store.breaker.CircuitBreaker` (``breaker=``),
  every attempt asks it first (an open breaker raises EndpointUnreachable
  at once, also between two attempts of one call), and reports how it
  ended: an HTTP answer of any kind is a success for the breaker, a failure
  with ``Verdict.unreachable`` (no answer at all, or a 502/504 from a
  gateway) counts towards opening it, a timeout (``Verdict.timed_out``)
  more than a refusal; ``foreground=True`` (the store's foreground policy)
  lets it fail such a request fast while the endpoint is silent.
- A permanent failure becomes ``map_error(exc)`` (the store's one mapping
  function).  A transient failure that outlives the budget becomes
  :class:`~tierfs.errors.StoreUnavailable` whose message names the
  operation, the target (bucket and key) and the last error code.  The
  original exception is chained (``raise ... from``); it never carries
  credentials.
"""

from __future__ import annotations

import email.utils
import http.client
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from urllib3.exceptions import ProtocolError as URLLib3ProtocolError

from tierfs.errors import StoreError, StoreUnavailable

if TYPE_CHECKING:
    from tierfs.store.breaker import CircuitBreaker

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Error codes that mean "try again later" even when the HTTP status is not 5xx.
RETRYABLE_CODES: frozenset[str] = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
    }
)

#: Transport-level exceptions that are worth another attempt.
RETRYABLE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    EndpointConnectionError,
    ConnectionClosedError,
    ReadTimeoutError,
    ConnectTimeoutError,
    ResponseStreamingError,
    IncompleteReadError,
    HTTPClientError,
    BotoConnectionError,
    URLLib3ProtocolError,
    http.client.IncompleteRead,
    ConnectionError,  # builtin: ConnectionResetError, BrokenPipeError, ...
    TimeoutError,
)

#: Failures that mean the endpoint gave no answer at all: it is down, refuses
#: connections, or accepts them and never answers (a black hole).  A body cut
#: short after the answer began is not among them (the server is there), nor
#: a connection reset while a request was sent: a server that went down
#: resets what was in flight and then refuses new connections (counted),
#: while a flaky path that resets now and then must not stop every request.
UNREACHABLE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    EndpointConnectionError,  # includes ConnectTimeoutError
    ConnectTimeoutError,
    ReadTimeoutError,
    TimeoutError,
)

#: Of those, the ones where a timeout fired: no answer at all within it.
TIMEOUT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    ConnectTimeoutError,
    ReadTimeoutError,
    TimeoutError,
)

#: HTTP statuses of a gateway whose backend is unreachable.
UNREACHABLE_STATUSES: frozenset[int] = frozenset({502, 504})


class TruncatedBody(Exception):
    """A response body ended before the bytes the server promised.

    Raised by the stores themselves (for example when a ranged GET returns
    fewer bytes than its Content-Range says) so that the retry loop treats it
    like a connection reset.
    """

    def __init__(self, got: int, expected: int) -> None:
        super().__init__(f"body truncated: got {got} of {expected} bytes")
        self.got = got
        self.expected = expected


class Transient(Exception):
    """A store-detected transient condition that deserves another attempt.

    For failures that are not an exception from botocore, for example a
    DeleteObjects answer that reports some keys as ``InternalError`` /
    ``SlowDown``.  ``code`` names the condition in messages.
    """

    def __init__(self, message: str, code: str = "Transient") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try.  Immutable; share one instance freely.

    ``max_attempts`` counts the first attempt too (1 = no retries).
    ``budget`` is the total time in seconds after which no new attempt starts.
    """

    max_attempts: int = 6
    budget: float = 60.0
    base_delay: float = 0.2
    max_delay: float = 10.0
    max_retry_after: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if not (self.budget >= 0 and self.base_delay >= 0 and self.max_delay >= 0):
            raise ValueError("budget and delays must be >= 0")

    def backoff(self, retry_no: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before retry number ``retry_no`` (0 for the first retry)."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(retry_no, 62)))
        return (rng or random).uniform(0.0, cap)


#: Default policy for data and metadata operations.
DEFAULT_POLICY = RetryPolicy()

#: Short policy for ``check()``: a mount must fail within seconds.
CHECK_POLICY = RetryPolicy(
    max_attempts=3, budget=4.0, base_delay=0.2, max_delay=1.0, max_retry_after=2.0
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`classify` thinks of one failure."""

    retry: bool
    code: str
    retry_after: float | None = None
    #: The endpoint gave no answer (counts towards opening the circuit breaker).
    unreachable: bool = False
    #: ... because a connect or read timeout fired (the endpoint may be a black
    #: hole): stronger evidence, see ``tierfs.store.breaker``.
    timed_out: bool = False


def error_code(exc: BaseException) -> str:
    """A short name for a failure, for messages: the S3 code, or the class name."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code") or "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code and status and code != str(status):
            return f"{code} (HTTP {status})"
        if code:
            return code
        return f"HTTP {status}" if status else "ClientError"
    return type(exc).__name__


def http_status(exc: BaseException) -> int | None:
    """HTTP status of a ClientError, else None."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def classify(exc: BaseException) -> Verdict:
    """Decide whether ``exc`` is transient (retry) or permanent."""
    code = error_code(exc)
    if isinstance(exc, ClientError):
        status = http_status(exc) or 0
        s3_code = str((exc.response.get("Error", {}) or {}).get("Code") or "")
        headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
        retry_after = parse_retry_after(headers.get("retry-after"))
        # 501 NotImplemented: the server lacks the operation; asking again
        # cannot help (some S3-compatible servers lack ListMultipartUploads).
        not_implemented = status == 501 or s3_code == "NotImplemented"
        retry = not not_implemented and (
            status >= 500 or status == 429 or s3_code in RETRYABLE_CODES
        )
        return Verdict(
            retry=retry,
            code=code,
            retry_after=retry_after if retry else None,
            unreachable=status in UNREACHABLE_STATUSES,
        )
    if isinstance(exc, TruncatedBody):
        return Verdict(retry=True, code=code)
    if isinstance(exc, Transient):
        return Verdict(retry=True, code=exc.code)
    if isinstance(exc, RETRYABLE_EXCEPTIONS):
        return Verdict(
            retry=True,
            code=code,
            unreachable=isinstance(exc, UNREACHABLE_EXCEPTIONS),
            timed_out=isinstance(exc, TIMEOUT_EXCEPTIONS),
        )
    return Verdict(retry=False, code=code)


def run_with_retry(
    policy: RetryPolicy,
    fn: Callable[[], T],
    *,
    op: str,
    target: str,
    map_error: Callable[[BaseException], StoreError],
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    breaker: CircuitBreaker | None = None,
    foreground: bool = False,
) -> T:
    """Call ``fn()`` until it succeeds, fails permanently, or the policy is spent.

    ``op`` and ``target`` (e.g. ``"get_range"``, ``"s3://bkt/pre/key"``) only
    feed messages and logs.  ``map_error`` turns a permanent failure into the
    StoreError to raise.  ``sleep``/``clock``/``rng`` exist for tests;
    ``sleep`` may also be an interruptible wait such as
    ``threading.Event.wait`` (its return value is ignored), so that a part
    upload stops backing off when a sibling part already failed.
    ``breaker`` (see the module docstring) is asked before every attempt;
    ``foreground`` tells it that a caller waits (a FUSE request), which it
    fails fast while the endpoint has gone silent.
    """
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        if breaker is not None:
            breaker.before_attempt(op, target, foreground=foreground)
        attempt_started = clock()
        try:
            result = fn()
        except StoreError as exc:
            if breaker is not None and not isinstance(exc, StoreUnavailable):
                breaker.record_success()  # the store judged an answer it got
            raise
        except Exception as exc:
            verdict = classify(exc)
            if breaker is not None:
                if verdict.unreachable:
                    breaker.record_failure(verdict.code, timed_out=verdict.timed_out)
                else:
                    breaker.record_success()
            if not verdict.retry:
                raise map_error(exc) from exc
            now = clock()
            elapsed = now - started
            remaining = policy.budget - elapsed
            if attempt >= policy.max_attempts:
                _give_up(op, target, attempt, elapsed, verdict, exc, "attempts exhausted")
            delay = policy.backoff(attempt - 1, rng)
            if verdict.retry_after is not None:
                delay = max(delay, min(verdict.retry_after, policy.max_retry_after))
            if delay > remaining:
                _give_up(op, target, attempt, elapsed, verdict, exc, "time budget spent")
            if verdict.unreachable and delay + (now - attempt_started) > remaining:
                # The next attempt would likely wait as long again, past the budget.
                _give_up(op, target, attempt, elapsed, verdict, exc, "time budget spent")
            log.debug(
                "%s %s: attempt %d failed (%s); retrying in %.3fs",
                op,
                target,
                attempt,
                verdict.code,
                delay,
            )
            if delay > 0:
                sleep(delay)
        else:
            if breaker is not None:
                breaker.record_success()
            return result


def _give_up(
    op: str,
    target: str,
    attempts: int,
    elapsed: float,
    verdict: Verdict,
    exc: BaseException,
    why: str,
) -> NoReturn:
    plural = "s" if attempts != 1 else ""
    raise StoreUnavailable(
        f"{op} {target}: giving up after {attempts} attempt{plural} in {elapsed:.1f}s "
        f"({why}); last error: {verdict.code}"
    ) from exc
