"""FaultProxy: a small threaded TCP proxy that injects network faults into HTTP/1.1.

Use it between an S3 client and a loopback S3 server::

    proxy = FaultProxy("127.0.0.1", moto_port)
    store = S3Store(url, endpoint_url=f"http://127.0.0.1:{proxy.port}")
    proxy.reset_next(2)      # the next 2 responses with a body: RST mid-body
    proxy.truncate_next(1)   # the next response with a body: FIN mid-body
    proxy.delay = 0.05       # seconds before each response is forwarded
    proxy.rate = 100e6       # bytes per second through the proxy, both ways
                             # together, shared by every connection (0: no cap)
    proxy.bytes_down         # response-body bytes forwarded so far
    proxy.request_lines      # "GET /bkt/key?... HTTP/1.1" of every request so far
    proxy.strip_request_headers("If-None-Match")  # forward requests without them
    # the next 2 requests whose request line contains "partNumber=": RST
    # while their body is being sent (the server never gets all of it)
    proxy.fail_requests(2, kind="reset", match="partNumber=")
    # the next response to a matching request: the server did the work, the
    # client gets nothing (RST) or half of the response head then FIN
    proxy.fail_responses(1, kind="truncate", match=lambda line: line.startswith("POST"))
    # the next 50 DELETE requests: answered 503 SlowDown by the proxy itself
    # (the server never sees them), so the deletes stay owed
    proxy.refuse_requests(50, status="503", match=lambda line: line.startswith("DELETE"))
    # the same with any status and S3 error code (None: no body)
    proxy.answer_requests(2, status=500, code="InternalError", match="GET ")
    # hold every matching request (before its head is forwarded) until the
    # gate is set; ``held`` counts the requests that waited
    gate = proxy.hold_requests(match=lambda line: line.startswith("DELETE"))
    gate.set()
    # take the endpoint away and bring it back, at run time:
    proxy.refuse()       # connects get ECONNREFUSED; open connections are reset
    proxy.black_hole()   # connects succeed, requests are read, nothing ever answers
    proxy.restore()      # forward again (same port)
    # from now on, at random: 30% of requests answered 503 SlowDown, 5%
    # 403 AccessDenied (neither reaches the server), 10% of bodies reset
    proxy.random_faults(error_503=0.3, error_403=0.05, reset=0.1, seed=7)
    ...
    proxy.close()

Invariants:

- It listens on 127.0.0.1 only and refuses an upstream that is not a
  loopback address: tests never reach another host through it.
- It parses just enough HTTP/1.1 to find message boundaries on a keep-alive
  connection: request heads (to remember each request's method) and
  response heads with ``Content-Length``.  A chunked or length-less message
  switches that connection to plain byte forwarding (no more faults on it).
- A fault only hits a response that has a body of at least 2 bytes (so HEAD
  and empty responses never consume one).  The client gets the response head
  and part of the body (``cut_fraction`` of it, at least 1 byte and at least
  1 byte short), then either a TCP RST (``reset``) or a clean FIN
  (``truncate``); the upstream connection is closed too.
- Request faults (``fail_requests``) hit requests with a body of at least 2
  bytes whose request line matches: the head and ``cut_fraction`` of the
  body reach the server, then the client connection is reset (``reset``) or
  closed (``truncate``) and the upstream connection dropped, so the server
  never sees a complete request.
- Response faults (``fail_responses``) hit the final response to a matching
  request, whatever its body: the server has already processed the request
  (its answer head arrived), the client gets nothing and an RST
  (``reset``), or half of the response head and a FIN (``truncate``).  This
  is the "did my request happen?" case that non-idempotent requests must
  survive.
- A rule's ``match`` is a substring of the request line (``"PUT /bkt/key?
  partNumber=1&uploadId=... HTTP/1.1"``) or a predicate on it; None matches
  every request.  Rules are consumed in the order they were added.
- Refused requests (``refuse_requests``): a matching request, whatever its
  body, is answered by the proxy itself with an S3 error document (503
  ``SlowDown``, 403 ``AccessDenied`` or 400 ``InvalidArgument``) and
  ``Connection: close``; it never
  reaches the server.  Rules are consumed in the order they were added.
- Held requests (``hold_requests``): a matching request waits, before its
  head reaches the server, until the gate that ``hold_requests`` returned
  is set (at most ``HOLD_LIMIT`` seconds); the server never sees it before.
  ``clear_faults`` and ``close`` set every gate, so no thread stays held.
- Random faults (``random_faults``): each request with a chance of
  ``error_503``/``error_403`` is answered by the proxy itself with an S3
  error document (``SlowDown`` / ``AccessDenied``) and ``Connection:
  close``, without reaching the server; each response with a body of at
  least 2 bytes, with a chance of ``reset``, is cut by an RST like
  ``reset_next``.  ``random_counts`` counts them by kind.
- ``faults_injected`` counts the faults actually delivered (all kinds), so a
  test can prove that the faults happened.
- Outage modes (``mode``): ``"forward"`` (normal), ``"refuse"`` (the
  listening socket is closed, so a connect gets ECONNREFUSED as from a
  server that is down; connections already open are reset), ``"black_hole"``
  (connections are accepted and whatever the client sends is read and
  dropped; no byte ever comes back, as behind a firewall that drops
  answers; connections open at the switch are closed, so a pooled client
  connection cannot bypass it).  ``restore()`` listens again on the same
  port and forwards; black-holed connections are closed then.
  ``swallowed`` counts the connections the black hole took in.
"""

from __future__ import annotations

import collections
import contextlib
import http
import ipaddress
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_HEAD_LIMIT = 64 * 1024
#: The longest a held request waits for its gate (seconds).
HOLD_LIMIT = 60.0


class _Passthrough(Exception):
    """Framing we do not parse: forward raw bytes from here on."""


class _Closed(Exception):
    """The peer closed the connection."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Link:
    """A shared link of ``rate`` bytes per second (0: unlimited): each chunk
    is sent once the chunks before it, on any connection, went through."""

    def __init__(self) -> None:
        self.rate = 0.0
        self._lock = threading.Lock()
        self._free_at = 0.0

    def pace(self, nbytes: int) -> None:
        rate = self.rate
        if rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + nbytes / rate
            until = self._free_at
        wait = until - time.monotonic()
        if wait > 0:
            time.sleep(wait)


class _Count:
    """A byte count updated by several threads."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class _Reader:
    """Buffered reads from a socket; ``forward`` paces what it sends on
    ``link`` and counts it in ``counted``."""

    def __init__(
        self, sock: socket.socket, link: _Link | None = None, counted: _Count | None = None
    ) -> None:
        self.sock = sock
        self.buf = b""
        self.link = link
        self.counted = counted

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise _Closed
        self.buf += chunk

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _HEAD_LIMIT:
                raise _Passthrough
            self._fill()
        end = self.buf.index(b"\r\n\r\n") + 4
        head, self.buf = self.buf[:end], self.buf[end:]
        return head

    def forward(self, n: int, dst: socket.socket) -> None:
        """Copy exactly ``n`` bytes to ``dst`` in chunks, as they arrive."""
        while n > 0:
            if not self.buf:
                self._fill()
            chunk, self.buf = self.buf[:n], self.buf[n:]
            if self.link is not None:
                self.link.pace(len(chunk))
            dst.sendall(chunk)
            if self.counted is not None:
                self.counted.add(len(chunk))
            n -= len(chunk)

    def discard(self, n: int) -> None:
        """Read exactly ``n`` bytes and drop them."""
        while n > 0:
            if not self.buf:
                self._fill()
            dropped = min(n, len(self.buf))
            self.buf = self.buf[dropped:]
            n -= dropped

    def rest(self) -> bytes:
        data, self.buf = self.buf, b""
        return data


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


Match = str | Callable[[str], bool] | None
FAULT_KINDS = ("reset", "truncate")
FORWARD, REFUSE, BLACK_HOLE = "forward", "refuse", "black_hole"
#: status -> (status line, S3 error code) of the answers the proxy gives itself.
ERROR_ANSWERS = {
    "503": ("503 Slow Down", "SlowDown"),
    "403": ("403 Forbidden", "AccessDenied"),
    # A client error no retry fixes (a key too long, a bad argument).
    "400": ("400 Bad Request", "InvalidArgument"),
}


def _without_headers(head: bytes, names: frozenset[str]) -> bytes:
    """A request head without the header lines named (lower-case)."""
    lines = head.split(b"\r\n")
    kept = [
        line
        for line in lines
        if b":" not in line or line.split(b":", 1)[0].strip().lower().decode() not in names
    ]
    return b"\r\n".join(kept)


def _error_answer(status: str) -> bytes:
    """An S3 error response for ``status`` (a key of ERROR_ANSWERS, or
    ``"<status> <code>"`` from ``answer_requests``; code ``-``: no body),
    closing the connection."""
    if status in ERROR_ANSWERS:
        status_line, code = ERROR_ANSWERS[status]
    else:
        number, code = status.split(" ", 1)
        status_line = f"{number} {http.HTTPStatus(int(number)).phrase}"
    body = (
        (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>injected by FaultProxy</Message>"
            "<RequestId>faultproxy</RequestId></Error>"
        ).encode()
        if code != "-"
        else b""
    )
    head = (
        f"HTTP/1.1 {status_line}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


def single_put_of(name: str | None = None) -> Callable[[str], bool]:
    """A ``match`` for the request lines of single PUTs (no query: not a part
    upload), of keys that end in ``/name`` if ``name`` is given."""

    def match(request_line: str) -> bool:
        method, target = [*request_line.split(" "), ""][:2]
        path, _, query = target.partition("?")
        return method == "PUT" and not query and (name is None or path.endswith("/" + name))

    return match


@dataclass
class _Rule:
    """``remaining`` more faults of ``kind`` for request lines that ``match``."""

    remaining: int
    kind: str
    match: Match

    def matches(self, request_line: str) -> bool:
        if self.match is None:
            return True
        if isinstance(self.match, str):
            return self.match in request_line
        return bool(self.match(request_line))


class FaultProxy:
    """Loopback TCP proxy with injectable resets, truncations and latency."""

    def __init__(
        self, upstream_host: str, upstream_port: int, *, cut_fraction: float = 0.5
    ) -> None:
        if not _is_loopback(upstream_host):
            raise ValueError(f"FaultProxy only forwards to loopback, not {upstream_host!r}")
        self.upstream = (upstream_host, upstream_port)
        self.cut_fraction = cut_fraction
        self.delay = 0.0
        self._link = _Link()
        self._down = _Count()
        self._up = _Count()
        self.faults_injected = 0
        self.connections = 0
        self._resets = 0
        self._truncates = 0
        self._request_rules: list[_Rule] = []
        self._random: _RandomFaults | None = None
        self.random_counts: collections.Counter[str] = collections.Counter()
        self._response_rules: list[_Rule] = []
        self._refuse_rules: list[_Rule] = []
        self._holds: list[tuple[Match, threading.Event]] = []
        self.held = 0
        #: The request line of every request forwarded (or answered) so far.
        self.request_lines: list[str] = []
        #: Request headers (lower-case names) removed before a request is
        #: forwarded: a store that ignores them (``strip_request_headers``).
        self._stripped: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.mode = FORWARD
        self.refused = 0
        self.swallowed = 0
        self._swallowing: set[socket.socket] = set()
        self._accept_threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        #: The proxy's URL, for an S3 client's ``endpoint_url``.
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._start_accepting()

    @property
    def rate(self) -> float:
        """Bytes per second through the proxy, both ways, all connections
        together (0: no cap)."""
        return self._link.rate

    @rate.setter
    def rate(self, value: float) -> None:
        self._link.rate = value

    @property
    def bytes_down(self) -> int:
        """Response-body bytes forwarded so far (chunked or unparsed ones not counted)."""
        return self._down.value

    @property
    def bytes_up(self) -> int:
        """Request-body bytes forwarded so far."""
        return self._up.value

    def _start_accepting(self) -> None:
        thread = threading.Thread(
            target=self._accept_loop, args=(self._listener,), name="faultproxy-accept", daemon=True
        )
        self._accept_threads.append(thread)
        thread.start()

    # --- outages ----------------------------------------------------------------

    def refuse(self) -> None:
        """The endpoint is down: close the listening socket (connects get
        ECONNREFUSED) and reset every open connection."""
        with self._lock:
            if self.mode == REFUSE:
                return
            self.mode = REFUSE
        self._stop_listening()
        self._drop_connections(rst=True)

    def black_hole(self) -> None:
        """Accept connections, read what comes, never answer; open connections are closed."""
        with self._lock:
            previous, self.mode = self.mode, BLACK_HOLE
        if previous == REFUSE:
            self._listen_again()
        self._drop_connections(rst=False)

    def restore(self) -> None:
        """Forward again, on the same port."""
        with self._lock:
            previous, self.mode = self.mode, FORWARD
            swallowing = list(self._swallowing)
        if previous == REFUSE:
            self._listen_again()
        for s in swallowing:
            self._forget(s)

    def _stop_listening(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() does not
        with contextlib.suppress(OSError):
            self._listener.close()

    def _listen_again(self) -> None:
        deadline = time.monotonic() + 5
        while True:
            try:
                self._listener = socket.create_server(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._start_accepting()

    def _drop_connections(self, *, rst: bool) -> None:
        with self._lock:
            socks = list(self._socks - self._swallowing)
        self._forget(*socks, rst=rst)

    def _swallow(self, client: socket.socket) -> None:
        """Black hole: read and drop everything the client sends, answer nothing."""
        with contextlib.suppress(OSError):
            while client.recv(65536):
                pass
        with self._lock:
            self._swallowing.discard(client)
        self._forget(client)

    # --- control ----------------------------------------------------------------

    def reset_next(self, n: int) -> None:
        """RST the connection mid-body for the next ``n`` responses with a body."""
        with self._lock:
            self._resets = n

    def truncate_next(self, n: int) -> None:
        """Close (FIN) mid-body for the next ``n`` responses with a body."""
        with self._lock:
            self._truncates = n

    def fail_requests(self, n: int, *, kind: str = "reset", match: Match = None) -> None:
        """Break the next ``n`` matching requests while their body is being sent."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"kind must be one of {FAULT_KINDS}, not {kind!r}")
        with self._lock:
            self._request_rules.append(_Rule(n, kind, match))

    def fail_responses(self, n: int, *, kind: str = "reset", match: Match = None) -> None:
        """Lose the answers to the next ``n`` matching requests (after the server acted)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"kind must be one of {FAULT_KINDS}, not {kind!r}")
        with self._lock:
            self._response_rules.append(_Rule(n, kind, match))

    def refuse_requests(self, n: int, *, status: str = "503", match: Match = None) -> None:
        """Answer the next ``n`` matching requests with an S3 error (``status``
        "503", "403" or "400") instead of forwarding them: the server never acts."""
        if status not in ERROR_ANSWERS:
            raise ValueError(f"status must be one of {sorted(ERROR_ANSWERS)}, not {status!r}")
        with self._lock:
            self._refuse_rules.append(_Rule(n, status, match))

    def answer_requests(
        self, n: int, *, status: int, code: str | None, match: Match = None
    ) -> None:
        """Like ``refuse_requests``, with any HTTP ``status`` and S3 error
        ``code`` (None: an empty body)."""
        http.HTTPStatus(status)  # ValueError for a status that does not exist
        if code is not None and not code.isalnum():
            raise ValueError(f"S3 error codes are alphanumeric, not {code!r}")
        with self._lock:
            self._refuse_rules.append(_Rule(n, f"{status} {code or '-'}", match))

    def strip_request_headers(self, *names: str) -> None:
        """Forward every request without these headers, as a store that
        ignores them would treat it (``If-None-Match``: a store without
        conditional writes).  For servers that do not check signatures
        (moto): the headers are signed."""
        self._stripped = frozenset(name.lower() for name in names)

    def hold_requests(self, match: Match) -> threading.Event:
        """Hold every matching request until the returned gate is set."""
        gate = threading.Event()
        with self._lock:
            self._holds.append((match, gate))
        return gate

    def _wait_if_held(self, request_line: str) -> None:
        with self._lock:
            gates = [
                gate
                for match, gate in self._holds
                if not gate.is_set() and _Rule(1, "hold", match).matches(request_line)
            ]
            self.held += bool(gates)
        for gate in gates:
            gate.wait(HOLD_LIMIT)

    def random_faults(
        self,
        *,
        error_503: float = 0.0,
        error_403: float = 0.0,
        reset: float = 0.0,
        seed: int | None = None,
    ) -> None:
        """Inject faults at random from now on (see the module docstring);
        all chances 0 turns it off."""
        for name, chance in (("error_503", error_503), ("error_403", error_403), ("reset", reset)):
            if not 0.0 <= chance <= 1.0:
                raise ValueError(f"{name} must be a chance between 0 and 1, not {chance!r}")
        if error_503 + error_403 > 1.0:
            raise ValueError("error_503 + error_403 must not exceed 1")
        with self._lock:
            if error_503 == error_403 == reset == 0.0:
                self._random = None
            else:
                self._random = _RandomFaults(error_503, error_403, reset, random.Random(seed))

    def _random_error(self) -> bytes | None:
        """The proxy's own error answer for this request, if the dice say so."""
        with self._lock:
            faults = self._random
            if faults is None:
                return None
            roll = faults.rng.random()
            if roll < faults.error_503:
                kind = "503"
            elif roll < faults.error_503 + faults.error_403:
                kind = "403"
            else:
                return None
            self.random_counts[kind] += 1
            self.faults_injected += 1
        return _error_answer(kind)

    def _refusal(self, request_line: str) -> bytes | None:
        """The proxy's own error answer if a ``refuse_requests`` rule matches."""
        kind = self._take_rule(self._refuse_rules, request_line)
        return None if kind is None else _error_answer(kind)

    def _random_reset(self) -> bool:
        with self._lock:
            faults = self._random
            if faults is None or faults.rng.random() >= faults.reset:
                return False
            self.random_counts["reset"] += 1
            self.faults_injected += 1
            return True

    def clear_faults(self) -> None:
        """Drop every pending fault of every kind."""
        with self._lock:
            self._resets = self._truncates = 0
            self._request_rules.clear()
            self._response_rules.clear()
            self._refuse_rules.clear()
            self._random = None
            for _match, gate in self._holds:
                gate.set()
            self._holds.clear()

    def close(self) -> None:
        """Stop accepting, close every connection, join the threads."""
        self._closed = True
        self.clear_faults()  # releases held requests
        self._stop_listening()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        for t in self._accept_threads:
            t.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- machinery ----------------------------------------------------------------

    def _take_fault(self) -> str | None:
        with self._lock:
            if self._resets > 0:
                self._resets -= 1
                self.faults_injected += 1
                return "reset"
            if self._truncates > 0:
                self._truncates -= 1
                self.faults_injected += 1
                return "truncate"
        return None

    def _take_rule(self, rules: list[_Rule], request_line: str) -> str | None:
        with self._lock:
            for rule in rules:
                if rule.remaining > 0 and rule.matches(request_line):
                    rule.remaining -= 1
                    self.faults_injected += 1
                    return rule.kind
        return None

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.add(s)

    def _forget(self, *socks: socket.socket, rst: bool = False) -> None:
        """Close sockets for good.

        ``close()`` alone does not release a socket that another thread is
        blocked in ``recv`` on, so shut it down first: fully (FIN), or with
        ``rst`` only the read side, then close with a zero linger time (RST).
        """
        for s in socks:
            with self._lock:
                self._socks.discard(s)
            with contextlib.suppress(OSError):
                if rst:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RD)
                else:
                    s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.mode == REFUSE:  # accepted just before the listener closed
                with self._lock:
                    self.refused += 1
                self._forget(client, rst=True)
                continue
            if self.mode == BLACK_HOLE:
                with self._lock:
                    self.swallowed += 1
                    self._socks.add(client)
                    self._swallowing.add(client)
                t = threading.Thread(target=self._swallow, args=(client,), daemon=True)
                t.start()
                self._threads.append(t)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self._track(client)
            self._track(upstream)
            with self._lock:
                self.connections += 1
            methods: collections.deque[str] = collections.deque()
            for target in (self._pump_requests, self._pump_responses):
                t = threading.Thread(target=target, args=(client, upstream, methods), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump_requests(
        self,
        client: socket.socket,
        upstream: socket.socket,
        methods: collections.deque[tuple[str, str]],
    ) -> None:
        reader = _Reader(client, self._link, self._up)
        try:
            while True:
                head = reader.head()
                start_line, fields = _headers(head)
                with self._lock:
                    self.request_lines.append(start_line)
                if self._stripped:
                    head = _without_headers(head, self._stripped)
                if "chunked" in fields.get("transfer-encoding", "").lower():
                    raise _Passthrough(head)
                length = int(fields.get("content-length", "0") or 0)
                answer = self._random_error() or self._refusal(start_line)
                if answer is not None:
                    expects_continue = "100-continue" in fields.get("expect", "").lower()
                    body = 0 if expects_continue else length
                    self._answer_instead(reader, body, client, upstream, answer)
                    return
                self._wait_if_held(start_line)
                fault = self._take_rule(self._request_rules, start_line) if length >= 2 else None
                methods.append((start_line.split(" ", 1)[0].upper(), start_line))
                # Forward the head at once: with "Expect: 100-continue" the
                # client sends the body only after the server's interim reply.
                upstream.sendall(head)
                if fault is None:
                    reader.forward(length, upstream)
                    continue
                cut = min(length - 1, max(1, int(length * self.cut_fraction)))
                reader.forward(cut, upstream)
                self._forget(client, rst=fault == "reset")
                self._forget(upstream)
                return
        except _Passthrough as exc:
            methods.append(("?", ""))  # responses can no longer be matched to requests
            with contextlib.suppress(OSError, _Closed):
                upstream.sendall((exc.args[0] if exc.args else b"") + reader.rest())
                _copy_raw(client, upstream)
        except (_Closed, OSError, ValueError, IndexError):
            pass
        finally:
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)

    def _answer_instead(
        self,
        reader: _Reader,
        length: int,
        client: socket.socket,
        upstream: socket.socket,
        answer: bytes,
    ) -> None:
        """Answer a request ourselves (it never reaches the server), then
        close both connections (the answer says ``Connection: close``).
        ``length`` body bytes are read and dropped first (0 when the client
        waits for "100 Continue": S3 answers the head alone then too).  The
        answer goes out before the upstream connection is dropped: the
        response pump closes the client connection when upstream ends, and
        that must not cut the answer off."""
        with contextlib.suppress(OSError, _Closed):
            reader.discard(length)
            client.sendall(answer)
        self._forget(upstream)
        self._forget(client)

    def _pump_responses(
        self,
        client: socket.socket,
        upstream: socket.socket,
        methods: collections.deque[tuple[str, str]],
    ) -> None:
        reader = _Reader(upstream, self._link, self._down)
        try:
            while True:
                head = reader.head()
                status_line, fields = _headers(head)
                status = int(status_line.split(" ")[1])
                if 100 <= status < 200:  # interim reply: the final one follows
                    client.sendall(head)
                    continue
                method, request_line = _wait_method(methods)
                lost = (
                    self._take_rule(self._response_rules, request_line) if method != "?" else None
                )
                if lost is not None:
                    if lost == "truncate":
                        client.sendall(head[: len(head) // 2])
                    self._forget(client, rst=lost == "reset")
                    return
                if method == "?" or "chunked" in fields.get("transfer-encoding", "").lower():
                    raise _Passthrough(head)
                if method == "HEAD" or status in (204, 304):
                    length = 0
                elif "content-length" in fields:
                    length = int(fields["content-length"])
                else:
                    raise _Passthrough(head)
                if self.delay:
                    time.sleep(self.delay)
                fault = self._take_fault() if length >= 2 else None
                if fault is None and length >= 2 and self._random_reset():
                    fault = "reset"
                client.sendall(head)
                if fault is None:
                    reader.forward(length, client)
                    continue
                cut = min(length - 1, max(1, int(length * self.cut_fraction)))
                reader.forward(cut, client)
                self._forget(client, rst=fault == "reset")
                return
        except _Passthrough as exc:
            with contextlib.suppress(OSError, _Closed):
                client.sendall((exc.args[0] if exc.args else b"") + reader.rest())
                _copy_raw(upstream, client)
        except (_Closed, OSError, ValueError, IndexError):
            pass
        finally:
            self._forget(client, upstream)


@dataclass
class _RandomFaults:
    error_503: float
    error_403: float
    reset: float
    rng: random.Random


def _wait_method(
    methods: collections.deque[tuple[str, str]], timeout: float = 30.0
) -> tuple[str, str]:
    """(method, request line) of the request this response answers (in pipeline order)."""
    deadline = time.monotonic() + timeout
    while not methods:
        if time.monotonic() > deadline:
            return "?", ""
        time.sleep(0.001)
    return methods.popleft()


def _copy_raw(src: socket.socket, dst: socket.socket) -> None:
    while True:
        data = src.recv(65536)
        if not data:
            return
        dst.sendall(data)
