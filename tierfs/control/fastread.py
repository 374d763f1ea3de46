"""The reader side of fast reads: ``tierfs.client.open``.

Importable without the daemon's dependencies (plain sockets, like
``tierfs.control.client``).  One ``ReaderConnection`` per process and
mount: the first ``open`` of a path on a tierfs mount connects (op
``reader``, see ``tierfs.control.readers``) and the connection stays for
the process's life.  ``open(path)`` then:

1. takes the descriptor from the connection's *ahead cache* if it holds the
   path (no round trip), else
2. asks the daemon for the path, plus the descriptors of the files this
   process will read next (``ahead``, below), in one round trip;
3. wraps the descriptor in a ``TierFile`` (``pread`` at its own offset,
   never past the size the daemon gave: the tier file may be longer), or,
   when the daemon does not hand the file out, opens the path through the
   mount: the kernel's answer, errors included, is then the reader's.

Ahead.  A DataLoader worker reads its batches as runs of consecutive
positions of the epoch's order (``PrefetchSampler`` hands the order to the
daemon), and jumps to its next batch.  The connection learns the run
length and the stride (from one run's start to the next) from the
positions the daemon reports.  At a miss it asks for the rest of the run
and the next ``RUNS_AHEAD`` runs, and at the start of each run it finds in
its cache it asks, without waiting, for the run after those (an ``anchor``
request; replies are taken in order, each with its descriptors): the
daemon works on the next batch while this one is read, and no descriptor
of another worker's batch is asked for.  Until it has seen a run end it
asks for ``DEFAULT_AHEAD`` files.  Outside an order (no position), nothing
comes ahead.  (Two runs ahead measured no better than one: the daemon's
answers are not late, its CPU is what limits an epoch; see
docs/benchmarks.md, "Fast reads".)

Bounds and hygiene: the ahead cache holds at most ``CACHE_MAX`` descriptors
(the oldest, and those behind a jump, are closed and their leases ended in
the next request); every descriptor is received close-on-exec; a forked
child closes its copies of the connection and of the cache at once (its
parent's stay), and connects again on its first ``open``.  Safe to use from
threads (one lock per connection).

A descriptor taken from the ahead cache was handed out before the open: a
write to the file on this node in between replaces the tier file (the
daemon never rewrites a handed-out file in place), so the reader gets the
bytes of the moment it was handed out.  The cache is therefore kept short:
``CACHE_SECONDS`` after its hand-out an ahead descriptor is not used.
"""

from __future__ import annotations

import builtins
import collections
import errno
import io
import json
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from tierfs.control.client import Location, locate
from tierfs.control.protocol import encode
from tierfs.errors import TierfsError

#: Files asked for ahead before the run length is known.
DEFAULT_AHEAD = 16
#: Runs (a worker's batches) asked for ahead of the one being read.
RUNS_AHEAD = 1
#: Most files asked for in one request (the daemon's bound is 128).
MAX_AHEAD = 127
#: Descriptors kept ahead of the reader, at most.
CACHE_MAX = 256
#: An ahead descriptor older than this is not used (see the module docstring).
CACHE_SECONDS = 10.0
#: A mount whose daemon could not be reached is tried again after this long.
RETRY_SECONDS = 10.0
#: Closed leases are told to the daemon at once for a file this large ...
CLOSE_NOW_SIZE = 1 << 20
#: ... else with the next request, or once this many gathered, or this
#: long after the last line.
CLOSE_BATCH = 64
CLOSE_SECONDS = 1.0
#: Descriptors received per ``recvmsg`` at most.
_MAX_FDS = 253


@dataclass(slots=True)
class _Entry:
    fd: int
    size: int
    lease: int
    position: int | None
    at: float
    #: The ETag of the version handed out ("" from an older daemon).
    etag: str = ""


class TierFile(io.RawIOBase):
    """A handed-out tier file, read-only: ``read``, ``readinto``, ``seek``,
    ``tell``, a context manager.  Reads use ``pread`` and stop at the
    file's size (bytes past the tier file's end read as zeros)."""

    def __init__(self, fd: int, size: int, name: str, done: Any, etag: str = "") -> None:
        super().__init__()
        #: The ETag of the version handed out.
        self.etag = etag
        self._fd = fd
        self._size = size
        self._pos = 0
        self.name = name
        self.mode = "rb"
        self._done = done

    @property
    def size(self) -> int:
        """The file's size as handed out."""
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        got = os.preadv(self._fd, [view[:want]], self._pos)
        if got < want:  # past the tier file's end: a hole of the file
            view[got:want] = bytes(want - got)
            got = want
        self._pos += got
        return got

    def pread(self, size: int, offset: int) -> bytes:
        """Bytes ``[offset, offset + size)``, clipped at the file's size,
        without moving the position (threads may share the file)."""
        self._check_open()
        want = max(0, min(size, self._size - offset))
        data = os.pread(self._fd, want, offset) if want else b""
        if len(data) < want:  # past the tier file's end: a hole of the file
            data += bytes(want - len(data))
        return data

    def readall(self) -> bytes:
        self._check_open()
        want = max(0, self._size - self._pos)
        data = os.pread(self._fd, want, self._pos)
        if len(data) < want:
            data += bytes(want - len(data))
        self._pos += want
        return data

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        buffer = bytearray(min(size, max(0, self._size - self._pos)))
        n = self.readinto(buffer)
        return bytes(buffer[:n])

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check_open()
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self._pos + offset
        elif whence == os.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence ({whence})")
        if pos < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self._fd)
            finally:
                self._done()
        super().close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


class ReaderConnection:
    """One process's connection to one mount's daemon (see the module docstring)."""

    def __init__(self, location: Location) -> None:
        self.root = str(location.mount_root)
        # Reentrant: a TierFile dropped unclosed is closed by the garbage
        # collector, which may run inside ``open`` on this very thread, and
        # its close takes this lock (``_closed``).
        self._lock = threading.RLock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.settimeout(600.0)
            self._sock.connect(location.socket_path)
            self._sock.sendall(encode({"op": "reader", "args": {}}))
        except OSError:
            self._sock.close()
            raise
        self._buffer = bytearray()
        #: Descriptors received, in order; each reply takes its own from the front.
        self._fds: collections.deque[int] = collections.deque()
        self._cache: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._closes: list[int] = []
        self._sent_at = time.monotonic()
        #: Replies owed for requests sent without waiting (the next run's).
        self._pending = 0
        self._last_position: int | None = None
        self._run_start: int | None = None
        self._run_length: int | None = None
        self._stride: int | None = None
        #: The furthest run start asked for ahead.
        self._asked_to = -1
        self.broken = False
        self.why = ""
        #: Counters, for tests and benchmarks.
        self.hits = 0
        self.asked = 0
        self.via_mount = 0

    # --- opening ------------------------------------------------------------------------

    def open(self, relpath: str, shown_name: str) -> BinaryIO | None:
        """The file from its tier file, or None (open it through the mount)."""
        with self._lock:
            if self.broken:
                return None
            try:
                entry = self._cached(relpath)
                if entry is None and self._pending:
                    self._collect(wait=True)  # it may be in the reply on its way
                    entry = self._cached(relpath)
                if entry is not None:
                    self.hits += 1
                    self._follow(entry.position)
                    self._ask_next_run(relpath, entry.position)
                else:
                    entry = self._ask(relpath)
                    if entry is None:
                        self.via_mount += 1
                        return None
                    self._follow(entry.position)
            except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                self._break(exc)
                if entry is None:
                    return None
        lease, size = entry.lease, entry.size
        raw = TierFile(entry.fd, size, shown_name, lambda: self._closed(lease, size), entry.etag)
        return io.BufferedReader(raw)  # type: ignore[return-value]

    def _cached(self, relpath: str) -> _Entry | None:
        entry = self._cache.pop(relpath, None)
        if entry is not None and time.monotonic() - entry.at > CACHE_SECONDS:
            self._drop(entry)
            return None
        return entry

    def _spans(self) -> list[list[int]]:
        """What to ask for with a miss: the rest of this run and the next
        ``RUNS_AHEAD``."""
        if self._run_length is None or self._stride is None:
            return [[1, DEFAULT_AHEAD]]
        room = MAX_AHEAD
        rest = min(self._run_length - 1, room)
        spans = [[1, rest]] if rest > 0 else []
        room -= rest
        for run in range(1, RUNS_AHEAD + 1):
            count = min(self._run_length, room)
            if count <= 0:
                break
            spans.append([run * self._stride, count])
            room -= count
        return spans

    def _ask(self, relpath: str) -> _Entry | None:
        """One round trip: ``relpath`` and the files ahead of it."""
        self._collect(wait=True)  # replies owed come first, in order
        request: dict[str, Any] = {"open": [relpath], "ahead": self._spans()}
        if self._closes:
            request["close"], self._closes = self._closes, []
        self._send(request)
        reply = self._receive()
        if "files" not in reply:  # refused at the door, or a malformed line
            self._break(reply.get("error", reply))
            return None
        mine = self._take(reply)
        position = reply.get("position")
        if position is not None and self._stride is not None:
            self._asked_to = position + RUNS_AHEAD * self._stride
        return mine

    def _ask_next_run(self, relpath: str, position: int | None) -> None:
        """At the start of a run read from the cache, ask (without waiting)
        for the run after the next one asked for: the daemon works on it
        while this process reads."""
        if (
            position is None
            or self._stride is None
            or self._run_length is None
            or position != self._run_start
            or position + RUNS_AHEAD * self._stride <= self._asked_to
        ):
            return
        after = RUNS_AHEAD * self._stride
        self._send({"anchor": relpath, "ahead": [[after, self._run_length]]})
        self._pending += 1
        self._asked_to = position + after

    def _collect(self, *, wait: bool) -> None:
        """Take the replies owed (all of them, waiting if ``wait``; else
        those already here)."""
        while self._pending:
            reply = self._receive(wait=wait)
            if reply is None:
                return
            self._pending -= 1
            if "files" not in reply:
                raise ValueError(f"the daemon refused: {reply.get('error', reply)}")
            self._take(reply)

    def _take(self, reply: dict[str, Any]) -> _Entry | None:
        """The opened file's entry, if any; the ahead ones go to the cache.
        The reply's descriptors are the next ones received, in order."""
        items = [*reply["files"], *reply.get("ahead", [])]
        count = sum("fd" in item for item in items)
        if count > len(self._fds):
            raise IndexError("fewer descriptors came than the reply names")
        fds = [self._fds.popleft() for _ in range(count)]
        now = time.monotonic()
        position = reply.get("position")
        mine: _Entry | None = None
        for item in reply["files"]:
            if "fd" in item:
                mine = _Entry(
                    fds[item["fd"]],
                    item["size"],
                    item["lease"],
                    position,
                    now,
                    item.get("etag", ""),
                )
        if mine is not None and position is not None:
            # A new run: what is cached behind it will not be read.
            for path, old in list(self._cache.items()):
                if old.position is not None and old.position < position:
                    del self._cache[path]
                    self._drop(old)
        for item in reply.get("ahead", []):
            entry = _Entry(
                fds[item["fd"]],
                item["size"],
                item["lease"],
                item["position"],
                now,
                item.get("etag", ""),
            )
            stale = self._cache.pop(item["path"], None)
            if stale is not None:
                self._drop(stale)
            self._cache[item["path"]] = entry
        while len(self._cache) > CACHE_MAX:
            _path, old = self._cache.popitem(last=False)
            self._drop(old)
        self.asked += 1
        return mine

    def _receive(self, *, wait: bool = True) -> Any:
        """The next reply line (None if ``wait`` is false and none is
        complete yet); the descriptors that came go to ``_fds``."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                return json.loads(line)
            if not wait and not select.select([self._sock], [], [], 0)[0]:
                return None
            data, fds, msg_flags, _addr = socket.recv_fds(
                self._sock, 1 << 16, _MAX_FDS, socket.MSG_CMSG_CLOEXEC
            )
            self._fds.extend(fds)
            if msg_flags & socket.MSG_CTRUNC:
                raise OSError(errno.EMSGSIZE, "descriptors were lost in transit")
            if not data:
                raise OSError(errno.ECONNRESET, "the tierfs daemon closed the connection")
            self._buffer += data

    def _follow(self, position: int | None) -> None:
        """Learn the run length and the stride from the positions opened."""
        if position is None:
            return
        last = self._last_position
        if last is None or position != last + 1:
            if last is not None and self._run_start is not None and position > last:
                self._run_length = max(1, last - self._run_start + 1)
                self._stride = position - self._run_start
            self._run_start = position
        self._last_position = position

    # --- closing ------------------------------------------------------------------------

    def _closed(self, lease: int, size: int) -> None:
        """A TierFile closed: its lease ends with the next line, which is
        sent now for a large file (the daemon counts what an evicted file
        held), after ``CLOSE_BATCH`` closes, or ``CLOSE_SECONDS`` after the
        last line."""
        with self._lock:
            self._closes.append(lease)
            if self.broken:
                self._closes.clear()
                return
            if (
                size >= CLOSE_NOW_SIZE
                or len(self._closes) >= CLOSE_BATCH
                or time.monotonic() - self._sent_at >= CLOSE_SECONDS
            ):
                closes, self._closes = self._closes, []
                try:
                    self._send({"close": closes})
                except OSError as exc:
                    self._break(exc)

    def _send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(encode(message))
        self._sent_at = time.monotonic()

    def _drop(self, entry: _Entry) -> None:
        os.close(entry.fd)
        self._closes.append(entry.lease)

    def _break(self, why: object) -> None:
        self.broken = True
        self.broken_at = time.monotonic()
        self.why = str(why)
        self.close()

    def close(self) -> None:
        """Close the connection and the cached descriptors (the daemon ends
        every lease of the connection)."""
        for entry in self._cache.values():
            os.close(entry.fd)
        self._cache.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self._sock.close()

    def forget_in_child(self) -> None:
        """After a fork, in the child: close the copies, tell nothing (a
        file the child inherited and closes sends nothing either)."""
        self._lock = threading.RLock()
        self.broken = True
        self.close()


class Readers:
    """The connections of this process, one per mount, found by path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_root: dict[str, ReaderConnection] = {}
        #: Directories not on a tierfs mount (or whose daemon failed), and when.
        self._not_here: dict[str, float] = {}
        #: Mounts whose daemon refused or failed a reader connection, and when.
        self._down: dict[str, float] = {}
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def open(self, path: str | os.PathLike[str]) -> BinaryIO:
        name = os.fspath(path)
        if isinstance(name, bytes):
            name = os.fsdecode(name)
        abspath = os.path.abspath(name)
        found = self._connection_for(abspath)
        if found is not None:
            connection, relpath = found
            handed = connection.open(relpath, name)
            if handed is not None:
                return handed
            if connection.broken:
                self._forget(connection)
        return builtins.open(path, "rb")

    def _connection_for(self, abspath: str) -> tuple[ReaderConnection, str] | None:
        for root, connection in list(self._by_root.items()):
            if abspath.startswith(root + "/"):
                return connection, abspath[len(root) + 1 :]
        now = time.monotonic()
        directory = os.path.dirname(abspath)
        failed_at = self._not_here.get(directory)
        if failed_at is not None and now - failed_at < RETRY_SECONDS:
            return None
        if len(self._not_here) > 4096:
            self._not_here.clear()
        try:
            location = locate(abspath)
        except (TierfsError, OSError):
            self._not_here[directory] = now
            return None
        root = str(location.mount_root)
        down_at = self._down.get(root)
        if not location.relpath or (down_at is not None and now - down_at < RETRY_SECONDS):
            return None
        try:
            with self._lock:
                connection = self._by_root.get(root)
                if connection is None:
                    connection = ReaderConnection(location)
                    self._by_root[root] = connection
        except OSError:
            self._down[root] = now
            return None
        return connection, location.relpath

    def _forget(self, connection: ReaderConnection) -> None:
        with self._lock:
            if self._by_root.get(connection.root) is connection:
                del self._by_root[connection.root]
            self._down[connection.root] = time.monotonic()

    def connection(self, root: str) -> ReaderConnection | None:
        return self._by_root.get(root)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        for connection in self._by_root.values():
            connection.forget_in_child()
        self._by_root.clear()


#: This process's reader connections.
READERS = Readers()
