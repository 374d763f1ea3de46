"""One circuit breaker per endpoint: fail fast while the bucket is unreachable.

Every request of a store goes through :func:`tierfs.store.retry.run_with_retry`,
which asks the breaker before each attempt (``before_attempt``) and tells it
how the attempt ended (``record_success`` / ``record_failure``).  So there is
one place that knows whether the endpoint answers, and a dead endpoint costs
each caller nothing instead of a whole retry budget.

States and transitions::

    CLOSED (healthy) --a request gets no answer------------> CLOSED (suspect)
    CLOSED (healthy) --a request times out-----------------> CLOSED (silent)
    CLOSED (suspect) --a request times out-----------------> CLOSED (silent)
    CLOSED (suspect/silent) --any answer (request or probe)-> CLOSED (healthy)
    CLOSED (suspect/silent) --failures weigh THRESHOLD------> OPEN
    OPEN             --a probe gets any HTTP answer---------> CLOSED (healthy)
    OPEN             --a real request that was already on
                       the wire before the opening succeeds-> CLOSED (healthy)

- CLOSED (suspect): 0 < consecutive failures < THRESHOLD.  Requests still
  go to the network, and the prober runs too, every ``probe_interval / 2``
  seconds, each probe counting like a request: so a failure is settled
  within a few probes even when nothing else asks the bucket (an idle mount
  still shows an outage in ``status``), and a healthy endpoint answers the
  first probe (or a request does, before it).
  Callers may skip optional waits for the bucket meanwhile (``suspect``).

- CLOSED (silent): the last failure was a connect or read timeout (the
  endpoint may be a black hole, where every request waits out its whole
  timeout).  A timeout weighs ``TIMEOUT_WEIGHT`` failures (a refusal one),
  so two of them in a row open the breaker (a refusal takes a few ms, a
  timeout seconds: five of them would keep the FUSE calls waiting for
  tens of seconds).  The prober is woken to probe at once, and
  *foreground* attempts (``before_attempt(foreground=True)``: a FUSE
  request waits for them) fail fast with EndpointUnreachable until any
  answer arrives: the kernel's retry of a failed read, or the next lookup,
  does not pay another full timeout.  Background requests (uploads) still
  go to the network.  On a healthy endpoint that was slow once, this lasts
  until the probe's answer (milliseconds).

- CLOSED: requests go to the network.  A failure counts only if the
  endpoint gave no HTTP answer at all (connection refused or reset before an
  answer, connect or read timeout; see ``Verdict.unreachable``) or a gateway
  said its backend is unreachable (502/504).  Any answer, even 404, 403, 500
  or a 503 SlowDown, proves the endpoint is there and resets the count: a
  throttling or flaky server is the retry policy's business, not an outage.
- OPEN: ``before_attempt`` raises :class:`~tierfs.errors.EndpointUnreachable`
  (errno EIO) at once, without touching the network.  The prober thread
  calls ``probe`` (a cheap request, e.g. HeadBucket, with the store's short
  timeouts and no retries) every ``probe_interval`` seconds; the first
  probe that returns closes the breaker.
- Every transition is logged once (warning when it opens, info when it
  closes), never per request, and calls the listeners with the new
  reachability (``add_listener``), from whatever thread made the transition:
  the core uses that to wake the uploads that failed during the outage.

``snapshot()`` gives ``tierfs status`` the state, since when (wall clock),
the last transport error and counters.  The class is thread-safe (one lock;
callbacks and probes run outside it).  The clock is injectable and the
prober optional (``start_prober=False``) so that tests drive the
transitions by hand on a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierfs.errors import EndpointUnreachable

log = logging.getLogger(__name__)

#: Consecutive unreachable-failures (over all requests) that open the breaker.
#: Above the attempts a single call makes for a couple of connection errors,
#: so that one unlucky request on a healthy endpoint does not open it.
FAILURE_THRESHOLD = 5
#: Seconds between probes while the breaker is open.
PROBE_INTERVAL = 2.0
#: How many failures a timeout counts for (see "CLOSED (silent)").
TIMEOUT_WEIGHT = 3

CLOSED = "closed"
OPEN = "open"

Listener = Callable[[bool], None]


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """What ``tierfs status`` shows about the endpoint."""

    reachable: bool
    #: Wall-clock time of the last transition (0.0: never changed since start).
    since: float
    last_error: str
    consecutive_failures: int
    #: How often the breaker opened since start.
    outages: int
    #: Requests refused without touching the network while open.
    failed_fast: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": "reachable" if self.reachable else "unreachable",
            "since": self.since or None,
            "last_error": self.last_error,
            "consecutive_failures": self.consecutive_failures,
            "outages": self.outages,
            "failed_fast": self.failed_fast,
        }


class CircuitBreaker:
    """See the module docstring."""

    def __init__(
        self,
        endpoint: str,
        probe: Callable[[], None],
        *,
        threshold: int = FAILURE_THRESHOLD,
        probe_interval: float = PROBE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        start_prober: bool = True,
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be >= 1")
        if probe_interval <= 0:
            raise ValueError("probe_interval must be > 0")
        self.endpoint = endpoint
        self.threshold = threshold
        self.probe_interval = probe_interval
        self._probe = probe
        self._clock = clock
        self._wall_clock = wall_clock
        self._start_prober = start_prober
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._since_wall = 0.0
        self._opened_at = 0.0
        self._last_error = ""
        self._outages = 0
        self._failed_fast = 0
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        #: Set to make the prober probe now (or stop, with ``_stop``).
        self._wake = threading.Event()
        self._silent = False
        self._prober: threading.Thread | None = None

    # --- queries -------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._state == OPEN

    @property
    def suspect(self) -> bool:
        """Open, or the last request got no answer: optional waits for the
        bucket (revalidation, re-listing) are not worth starting."""
        return self._state == OPEN or self._failures > 0

    def snapshot(self) -> BreakerSnapshot:
        with self._lock:
            return BreakerSnapshot(
                reachable=self._state == CLOSED,
                since=self._since_wall,
                last_error=self._last_error,
                consecutive_failures=self._failures,
                outages=self._outages,
                failed_fast=self._failed_fast,
            )

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(reachable)`` after every transition (from any thread)."""
        with self._lock:
            self._listeners.append(listener)

    # --- the request path ------------------------------------------------------------

    @property
    def silent(self) -> bool:
        """Closed, but the last request timed out without an answer."""
        return self._state == CLOSED and self._silent

    def before_attempt(self, op: str, target: str, *, foreground: bool = False) -> None:
        """Raise EndpointUnreachable at once while the breaker is open, and
        for a ``foreground`` attempt while the endpoint is silent."""
        if self._state != OPEN and not (foreground and self._silent):
            return
        with self._lock:
            if self._state != OPEN:
                if not (foreground and self._silent):
                    return
                self._failed_fast += 1
                last = self._last_error
                raise EndpointUnreachable(
                    f"{op} {target}: {self.endpoint} gave no answer to the last request "
                    f"({last}); failing fast until it answers"
                )
            self._failed_fast += 1
            since = time.strftime("%H:%M:%S", time.localtime(self._since_wall))
            last = self._last_error
        raise EndpointUnreachable(
            f"{op} {target}: {self.endpoint} is unreachable since {since} (last error: {last}); "
            "failing fast until it answers again"
        )

    def record_success(self) -> None:
        """The endpoint answered (any HTTP answer)."""
        if self._state == CLOSED and self._failures == 0:
            return
        self._transition(reachable=True, error="")

    def record_failure(self, code: str, *, timed_out: bool = False) -> None:
        """An attempt got no answer from the endpoint (``code`` names the
        error; ``timed_out``: a connect or read timeout fired)."""
        self._record(code, timed_out=timed_out)
        if self._start_prober:
            self._ensure_prober()

    def _record(self, code: str, *, timed_out: bool = False) -> None:
        opened = False
        with self._lock:
            self._last_error = code
            self._failures += TIMEOUT_WEIGHT if timed_out else 1
            if timed_out:
                self._silent = True
                self._wake.set()  # probe now: the verdict should not wait
            if self._state == CLOSED and self._failures >= self.threshold:
                self._state = OPEN
                self._outages += 1
                self._opened_at = self._clock()
                self._since_wall = self._wall_clock()
                opened = True
        if opened:
            log.warning(
                "endpoint %s unreachable after %d failed requests in a row (last: %s): "
                "serving from the cache, failing fast what needs the bucket, probing every %.0f s",
                self.endpoint,
                self.threshold,
                code,
                self.probe_interval,
            )
            self._notify(False)

    # --- probing ---------------------------------------------------------------------

    def probe_once(self) -> bool:
        """Run the probe now; close the breaker if it got an answer.  True if reachable.

        While closed, a probe that gets no answer counts like such a request."""
        try:
            self._probe()
        except Exception as exc:  # no answer: the outage goes on (or begins)
            code, unreachable, timed_out = _describe(exc)
            log.debug("probe of %s failed: %s", self.endpoint, code)
            if self._state == CLOSED and unreachable:
                self._record(code, timed_out=timed_out)
            else:  # open: the outage goes on; closed: a reset proves nothing either way
                with self._lock:
                    self._last_error = code
            return False
        self._transition(reachable=True, error="")
        return True

    def close(self) -> None:
        """Stop the prober thread (the store is being closed)."""
        self._stop.set()
        self._wake.set()
        prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join(timeout=5)

    def _ensure_prober(self) -> None:
        with self._lock:
            if self._stop.is_set() or (self._prober is not None and self._prober.is_alive()):
                return
            self._prober = threading.Thread(
                target=self._probe_loop, name="tierfs-endpoint-probe", daemon=True
            )
            self._prober.start()

    def _probe_loop(self) -> None:
        """Probe while the endpoint is suspect (every half interval) or out (every interval)."""
        while not self._stop.is_set():
            if self._settled():
                return
            self._wake.wait(self.probe_interval if self._state == OPEN else self.probe_interval / 2)
            self._wake.clear()
            if self._stop.is_set() or self._settled():
                return
            self.probe_once()
            self._wake.clear()  # this probe's own timeout asked for no other one

    def _settled(self) -> bool:
        """Healthy again: the prober ends (a new failure starts another)."""
        with self._lock:
            if self._state == CLOSED and self._failures == 0:
                self._prober = None
                return True
            return False

    def _transition(self, *, reachable: bool, error: str) -> None:
        closed = False
        with self._lock:
            self._failures = 0
            self._silent = False
            if self._state == OPEN and reachable:
                self._state = CLOSED
                self._since_wall = self._wall_clock()
                outage = self._clock() - self._opened_at
                self._last_error = error or self._last_error
                closed = True
        if closed:
            log.warning("endpoint %s reachable again after %.1f s", self.endpoint, outage)
            self._notify(True)

    def _notify(self, reachable: bool) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(reachable)
            except Exception:
                log.exception("endpoint state listener failed")


def _describe(exc: BaseException) -> tuple[str, bool, bool]:
    """The error's short name, whether it means "no answer" (as for
    requests), and whether a timeout fired."""
    from tierfs.store.retry import classify  # retry imports botocore: keep it lazy

    verdict = classify(exc)
    return verdict.code, verdict.unreachable, verdict.timed_out


def breaker_of(store: object) -> CircuitBreaker | None:
    """The circuit breaker of a store, or None (a local directory has none)."""
    breaker = getattr(store, "breaker", None)
    return breaker if isinstance(breaker, CircuitBreaker) else None
