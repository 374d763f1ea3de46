"""The audit log: who did what to which file, as JSON lines.

``[audit] path = "/var/log/tierfs/main.audit.jsonl"`` turns it on.  The FUSE
layer records every request that changes the namespace or data (create,
mkdir, mknod, symlink, unlink, rmdir, rename, link, setattr, setxattr,
removexattr, and an open for writing), and with ``reads = true`` every open
for reading too, whether it succeeded or failed (``errno``).  Requests the
kernel refuses by itself (a mode check under ``default_permissions``, a
read-only mount) never reach the daemon and are not in this log.

One line per record (the format is in ``docs/operations.md``)::

    {"time": "2026-12-01T22:33:01.123456Z", "uid": 1000, "gid": 1000,
     "pid": 4242, "comm": "python3", "op": "rename", "path": "a/x",
     "new_path": "b/x", "errno": 0}

Invariants:

* The request path never waits and never writes for the log.  ``record``
  appends one tuple (the time, the caller, the op, the paths it already
  knows) to a bounded deque (``QUEUE_RECORDS``) and wakes the writer.  It
  reads the process's name (``/proc/PID/comm``) then, while the process
  still runs (a ``mv`` is gone by the time the writer runs), once per pid
  and second (``COMM_TTL``: pids are reused); "?" when it is gone already.  When
  the deque is full the record is dropped and counted; the writer then
  writes a ``{"op": "dropped", "count": N}`` line where the records are
  missing and logs a warning: a lost record is always visible in the log
  itself, and a request is never stalled by it.
* What a record costs the request path (warm opens with ``reads``, the
  case the log is heaviest for): an ``open`` names its file *after* the
  open, from the inode then held in memory (before, ``path_of`` read it
  from LMDB again: a third of the cost), and its flags come encoded once
  per distinct value (``open_fields``), so neither the request path builds
  a list nor the writer JSON-encodes one per record.
* The writer (``AuditWriter.run``, a worker started from the daemon's
  nursery) wakes when a record comes, lets records gather for
  ``BATCH_SECONDS`` (0.2 s), takes what the deque holds, and in a thread
  formats the lines and appends them with one ``write``.  Why: a thread
  hop and a write per record made a warm open+read+close much dearer; per
  batch they cost nothing measurable (``docs/benchmarks.md``, "Audit log").  A record is in the file within about
  0.2 s; a daemon killed by SIGKILL loses the records of its last 0.2 s
  (a stop, SIGTERM included, writes them).  The file is opened with ``O_APPEND``, mode 0600.
* Rotation by size: once the file reaches ``max_size`` it is renamed to
  ``PATH.1`` (``PATH.1`` to ``PATH.2``..., ``keep`` files in all) and a new
  one is started; a record is never split between two files.
* A failing disk (ENOSPC, EIO) loses the batch being written, not the
  daemon: the error is logged once per kind and counted, and the writer
  goes on with the next batch.

Status: ``status()`` (records written, dropped, write errors, the path) is
the file system's status section ``audit`` while the writer runs.
"""

from __future__ import annotations

import collections
import contextlib
import errno as errno_module
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import trio

from tierfs.config import AuditConfig
from tierfs.errors import TierfsError

log = logging.getLogger(__name__)

#: Records the deque holds before new ones are dropped (about 200 bytes each).
QUEUE_RECORDS = 65536
#: Process names remembered (pid -> (name, when looked up)).
COMM_CACHE = 4096
#: A name older than this is looked up again (pids are reused).
COMM_TTL = 1.0
#: How long the writer lets records gather before it writes them.
BATCH_SECONDS = 0.2
#: The name of the writer's section of ``TierFS.status()``.
STATUS_SECTION = "audit"

#: open(2) flags named in an ``open`` record (the access mode first).
_OPEN_FLAGS = (
    ("O_CREAT", os.O_CREAT),
    ("O_EXCL", os.O_EXCL),
    ("O_TRUNC", os.O_TRUNC),
    ("O_APPEND", os.O_APPEND),
    ("O_DIRECT", getattr(os, "O_DIRECT", 0)),
    ("O_SYNC", os.O_SYNC),
    ("O_NOATIME", getattr(os, "O_NOATIME", 0)),
)
_ACCESS_MODES = {os.O_RDONLY: "O_RDONLY", os.O_WRONLY: "O_WRONLY", os.O_RDWR: "O_RDWR"}


def open_flags(flags: int) -> list[str]:
    """The names of an open's flags, its access mode first."""
    names = [_ACCESS_MODES.get(flags & os.O_ACCMODE, "O_RDONLY")]
    names += [name for name, bit in _OPEN_FLAGS if bit and flags & bit]
    return names


_OPEN_FIELDS: dict[int, str] = {}


def open_fields(flags: int) -> str:
    """The ``"flags": [...]`` member of an ``open`` or ``create`` record,
    encoded once per distinct flags value (an ``extra`` given as a string
    is written as it is: no list built on the request path, no JSON
    encoding per record in the writer)."""
    fields = _OPEN_FIELDS.get(flags)
    if fields is None:
        fields = '"flags": ' + json.dumps(open_flags(flags))
        if len(_OPEN_FIELDS) < 4096:
            _OPEN_FIELDS[flags] = fields
    return fields


def opens_for_writing(flags: int) -> bool:
    """An open with these flags may change the file's data."""
    return flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & os.O_TRUNC)


class AuditLog:
    """What the FUSE layer calls: ``record`` per request (see the module
    docstring); ``reads`` says whether opens for reading are recorded."""

    def __init__(self, config: AuditConfig) -> None:
        self.config = config
        self.reads = config.reads
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake = trio.Event()
        self.dropped = 0
        self._comms: dict[int, tuple[str, float]] = {}

    def record(
        self,
        op: str,
        uid: int,
        gid: int,
        pid: int,
        path: str,
        error: int,
        *,
        new_path: str | None = None,
        extra: dict[str, Any] | str | None = None,
    ) -> None:
        """Queue one record (never blocks; see the module docstring).
        ``extra``: more fields, as a dict or already encoded as JSON
        members (``open_fields``)."""
        if len(self._queue) >= QUEUE_RECORDS:
            self.dropped += 1
            return
        now = time.time()
        self._queue.append(
            (now, op, uid, gid, pid, self._comm(pid, now), path, new_path, error, extra)
        )
        self._wake.set()

    def _comm(self, pid: int, now: float) -> str:
        """The process's name, read while it still runs (a ``mv`` is gone
        by the time the writer runs); remembered for ``COMM_TTL``."""
        known = self._comms.get(pid)
        if known is not None and now - known[1] < COMM_TTL:
            return known[0]
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                name = f.read().rstrip(b"\n").decode(errors="replace")
        except OSError:
            name = "?"
        if len(self._comms) >= COMM_CACHE:
            self._comms.clear()
        self._comms[pid] = (name, now)
        return name

    @property
    def queued(self) -> int:
        return len(self._queue)

    def take(self) -> list[tuple[Any, ...]]:
        """Everything queued, oldest first."""
        queue = self._queue
        taken = [queue.popleft() for _ in range(len(queue))]
        return taken

    async def wait(self) -> None:
        """Until something was queued (or dropped) since the last ``take``."""
        if not self._queue and not self.dropped:
            self._wake = trio.Event()
            await self._wake.wait()


class AuditWriter:
    """The worker that writes the queued records (see the module docstring)."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self.path = Path(audit.config.path)
        self.max_size = audit.config.max_size
        self.keep = audit.config.keep
        self.written = 0
        self.dropped_total = 0
        self.write_errors = 0
        self._errors_logged: set[int] = set()
        self._fd: int | None = None
        self._size = 0
        self._second = -1
        self._second_text = ""

    def open(self) -> None:
        """Open (create) the log file: at mount, so that a path the daemon
        cannot write fails the mount with a clear error, not silently."""
        try:
            self._open()
        except OSError as exc:
            raise TierfsError(
                f"cannot open the audit log {self.path}: {exc.strerror}", errno=exc.errno
            ) from None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        batch: list[tuple[Any, ...]] = []
        dropped = 0
        try:
            task_status.started()
            while True:
                await self.audit.wait()
                # Let records gather: one thread hop and one write per
                # ``BATCH_SECONDS``, not per request.
                await trio.sleep(BATCH_SECONDS)
                dropped, self.audit.dropped = self.audit.dropped, 0
                batch = self.audit.take()
                await trio.to_thread.run_sync(self.write_batch, batch, dropped)
                batch, dropped = [], 0
        finally:
            # What is still taken or queued when the daemon stops is written
            # first (a cancel may come before the thread took the batch).
            dropped += self.audit.dropped
            self.audit.dropped = 0
            self.write_batch([*batch, *self.audit.take()], dropped)
            self._close()

    # --- in the writer's thread ----------------------------------------------------------

    def write_batch(self, batch: Iterable[tuple[Any, ...]], dropped: int) -> None:
        lines = [self._line(record) for record in batch]
        if dropped:
            self.dropped_total += dropped
            lines.append(
                f'{{"time": "{self._time(time.time())}", "op": "dropped", "count": {dropped}}}\n'
            )
            log.warning(
                "audit: %d records dropped: the queue of %d was full", dropped, QUEUE_RECORDS
            )
        if not lines:
            return
        data = "".join(lines).encode("ascii")
        try:
            if self._fd is None:
                self._open()
            if self._size and self._size + len(data) > self.max_size:
                self._rotate()
            assert self._fd is not None
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
            self._size += len(data)
            self.written += len(lines) - (1 if dropped else 0)
        except OSError as exc:
            self.write_errors += 1
            code = exc.errno or errno_module.EIO
            if code not in self._errors_logged:
                self._errors_logged.add(code)
                log.error("audit: cannot write %s: %s; records are lost", self.path, exc.strerror)
            self._close()

    def _line(self, record: tuple[Any, ...]) -> str:
        """One JSON line, built from its parts: the strings through the C
        encoder, the time's seconds formatted once per second (``json.dumps``
        of a dict and ``datetime.isoformat`` per record were most of the
        writer's time: py-spy, ``bench_audit.py`` with ``reads``)."""
        when, op, uid, gid, pid, comm, path, new_path, error, extra = record
        parts = [
            f'{{"time": "{self._time(when)}", "uid": {uid}, "gid": {gid}, '
            f'"pid": {pid}, "comm": {_string(comm)}, "op": "{op}", "path": {_string(path)}'
        ]
        if new_path is not None:
            parts.append(f', "new_path": {_string(new_path)}')
        if extra:
            parts.append(", " + (extra if isinstance(extra, str) else json.dumps(extra)[1:-1]))
        parts.append(f', "errno": {error}}}\n')
        return "".join(parts)

    def _time(self, when: float) -> str:
        """``when`` in ISO 8601, UTC, to the microsecond; the seconds are
        formatted once per second."""
        second = int(when)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{min(999_999, int((when - second) * 1_000_000)):06d}Z"

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _rotate(self) -> None:
        self._close()
        for index in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
        if self.keep > 0:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._open()

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "reads": self.audit.reads,
            "records": self.written,
            "dropped": self.dropped_total + self.audit.dropped,
            "queued": self.audit.queued,
            "write_errors": self.write_errors,
        }


#: A JSON string of a ``str``, in ASCII (C code): a name that is not UTF-8
#: (its bytes kept as surrogates) shows as ``\\udcXX`` escapes, so that
#: every line is valid UTF-8 for ``jq``.
_string: Any = json.encoder.encode_basestring_ascii
