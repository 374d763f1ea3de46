"""Reader connections: the control side of ``tierfs.client.open``.

A process that reads through ``tierfs.client`` keeps one connection to the
daemon (op ``reader``) for as long as it runs.  After the request line it
sends one line per batch and gets one reply line per batch, with the
descriptors of the files handed out passed along (``SCM_RIGHTS``)::

    -> {"open": ["train/0001.jpg"], "ahead": [[1, 31], [64, 32]], "close": [17, 18]}
    <- {"files": [{"path": "train/0001.jpg", "size": 81234, "etag": "9b2c...", "lease": 19,
                   "fd": 0}],
        "position": 0,
        "ahead": [{"path": "train/0002.jpg", "size": 90210, "lease": 20, "fd": 1}, ...]}

* ``open``: paths relative to the mount root.  Each is handed out
  (``TierFS.handout``: the caller's rights, the version an open would see,
  only warm clean files on one tier) or answered ``{"path", "via":
  "mount", "why"}``: the client then opens it through the mount, which
  gives the answer (and the error) the kernel would.
* ``ahead``: spans ``[offset, count]`` of positions after the first opened
  file's position in one of this user's prefetch orders
  (``Prefetcher.following``): a client that knows how its reads walk the
  order (``tierfs.client``: the runs and the stride a DataLoader worker
  reads) gets the descriptors of its next files in the same reply.  Files
  that cannot be handed out are left out silently.
* ``anchor`` (instead of ``open``): a path the spans count from, not
  opened; a client asks this way, without waiting for the reply, for its
  next run while it reads the current one.
* ``close``: leases the client is done with (it closed their descriptors).
  A line with nothing but ``close`` gets no reply (the client sends it
  when it closes a large file, or every ``CLOSE_BATCH`` closes, without
  waiting).  The connection's close ends all of its leases.

``"fd": k`` is the index of the file's descriptor among those passed with
the line.  Bounds: ``MAX_FILES`` files handed out per line (the kernel
passes at most 253 descriptors per message), the leases'
(``tierfs.core.state.leases``), and the connection gate of every control
connection.  A reader connection waits idle by design (between epochs);
its lines are not paced (a DataLoader worker sends one per batch), each is
bounded in work by ``MAX_FILES``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tierfs.core import TierFS
from tierfs.core.names.access import Caller
from tierfs.core.read.handout import Handed
from tierfs.errors import InvalidArgument, TierfsError, describe
from tierfs.workers.audit import AuditLog, open_fields
from tierfs.workers.pathlists import normalize_path
from tierfs.workers.prefetch import Prefetcher

#: Files handed out per request line at most (opens and ahead together).
MAX_FILES = 128
#: Leases one line may end.
MAX_CLOSES = 4096
#: The caller's search rights on directories are reused this long (ahead files).
SEARCHABLE_SECONDS = 1.0
#: An offset of an ``ahead`` span, at most (either way).
MAX_OFFSET = 1 << 20
_READ_ONLY_FIELDS = open_fields(os.O_RDONLY)


class ReaderSession:
    """One reader connection (see the module docstring)."""

    def __init__(
        self,
        fs: TierFS,
        caller: Caller,
        *,
        pid: int,
        gid: int,
        connection: int,
        mountpoint: str,
        prefetcher: Prefetcher | None,
        audit: AuditLog | None,
    ) -> None:
        self.fs = fs
        self.caller = caller
        self.pid = pid
        self.gid = gid
        self.connection = connection
        self.mountpoint = mountpoint
        self.prefetcher = prefetcher
        self.audit = audit
        #: Directories this caller may search (``_searchable``).
        self._dirs: dict[int, bool] = {}
        self._searchable_since = time.monotonic()

    async def serve(
        self,
        receive: Callable[[], Awaitable[dict[str, Any] | None]],
        send: Callable[[dict[str, Any], list[int]], Awaitable[None]],
    ) -> dict[str, Any]:
        """Answer lines until the client closes; then end its leases."""
        answered = 0
        try:
            while True:
                message = await receive()
                if message is None:
                    break
                if set(message) == {"close"}:  # a close-only line has no reply
                    self._end(message["close"])
                    continue
                reply, fds = await self.answer(message)
                try:
                    await send(reply, fds)
                finally:
                    for fd in fds:
                        os.close(fd)
                answered += 1
        finally:
            self.fs.leases.end_connection(self.connection)
        return {"answered": answered}

    async def answer(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """One line's reply and the descriptors to pass with it (the
        caller closes them once sent).  A malformed line changes nothing
        and is answered with its error."""
        try:
            paths, spans, closes, anchor = _parse(message, self.mountpoint)
        except InvalidArgument as exc:
            return {"error": str(exc), "errno": exc.errno}, []
        self._end(closes)
        fds: list[int] = []
        if anchor is not None:  # where the spans count from, not opened
            try:
                inode = await self.fs.permissions.readable(anchor, self.caller)
            except TierfsError as exc:
                return {"files": [], "ahead": [], "why": str(exc)}, []
            return {"files": [], **await self._ahead(inode.ino, spans, 0, fds)}, fds
        files: list[dict[str, Any]] = []
        first_ino: int | None = None
        for relpath in paths:
            entry, ino = await self._one(relpath, fds)
            files.append(entry)
            if first_ino is None:
                first_ino = ino
        reply: dict[str, Any] = {"files": files}
        if spans and first_ino is not None:
            reply.update(await self._ahead(first_ino, spans, len(paths), fds))
        return reply, fds

    async def _ahead(
        self, ino: int, spans: list[tuple[int, int]], taken: int, fds: list[int]
    ) -> dict[str, Any]:
        """``position`` of ``ino`` in the caller's order and the files of
        ``spans`` from it that can be handed out (``ahead``)."""
        reply: dict[str, Any] = {}
        if self.prefetcher is not None:
            position, inos = self.prefetcher.following(self.caller.uid, ino, spans)
            reply["position"] = position
            wanted = inos[: MAX_FILES - taken]
            positions = {ino: at for at, ino in wanted}
            ahead: list[dict[str, Any]] = []
            for relpath, outcome in await self.fs.handout.hand_out_ahead(
                [ino for _at, ino in wanted], self.caller, self.connection, self._searchable()
            ):
                self._record(relpath, 0)
                fds.append(outcome.fd)
                ahead.append(
                    {
                        "path": relpath,
                        "size": outcome.size,
                        "etag": outcome.etag,
                        "lease": outcome.lease,
                        "fd": len(fds) - 1,
                        "position": positions[outcome.ino],
                    }
                )
            reply["ahead"] = ahead
        return reply

    async def _one(self, relpath: str, fds: list[int]) -> tuple[dict[str, Any], int | None]:
        """Hand out ``relpath``: its entry and inode (None: not handed out);
        its descriptor is appended to ``fds``."""
        try:
            outcome = await self.fs.handout.hand_out(relpath, self.caller, self.connection)
        except TierfsError as exc:
            self._record(relpath, exc.errno)
            text = describe(exc) if exc.errno in (errno.ENOENT, errno.ENOTDIR) else str(exc)
            return {"path": relpath, "via": "mount", "why": text}, None
        if not isinstance(outcome, Handed):
            return {"path": relpath, "via": "mount", "why": outcome.why}, None
        self._record(relpath, 0)
        fds.append(outcome.fd)
        entry = {
            "path": relpath,
            "size": outcome.size,
            "etag": outcome.etag,
            "lease": outcome.lease,
            "fd": len(fds) - 1,
        }
        return entry, outcome.ino

    def _searchable(self) -> dict[int, bool]:
        """The caller's search rights per directory, as found in the last
        ``SEARCHABLE_SECONDS`` (the kernel, too, checks a path against the
        attributes it cached for ``list_ttl``)."""
        now = time.monotonic()
        if now - self._searchable_since > SEARCHABLE_SECONDS or len(self._dirs) > 65536:
            self._dirs = {}
            self._searchable_since = now
        return self._dirs

    def _end(self, closes: object) -> None:
        if isinstance(closes, list) and len(closes) <= MAX_CLOSES:
            for ident in closes:
                if isinstance(ident, int):
                    self.fs.leases.end(ident, self.connection)

    def _record(self, relpath: str, error: int) -> None:
        """The audit log's ``open`` record, as the mount's for a read."""
        audit = self.audit
        if audit is None or not audit.reads:
            return
        with contextlib.suppress(Exception):
            audit.record(
                "open",
                self.caller.uid,
                self.gid,
                self.pid,
                relpath,
                error,
                extra=_READ_ONLY_FIELDS,
            )


def _parse(
    message: dict[str, Any], mountpoint: str
) -> tuple[list[str], list[tuple[int, int]], list[int], str | None]:
    """The line's paths (normalised), ahead spans, leases to end and
    anchor; any malformed part raises InvalidArgument."""
    anchor = message.get("anchor")
    if anchor is not None:
        if not isinstance(anchor, str) or message.get("open"):
            raise InvalidArgument("'anchor' must be a path, without 'open'")
        try:
            anchor = normalize_path(anchor, mountpoint)
        except InvalidArgument as exc:
            raise InvalidArgument(f"anchor {anchor[:200]!r} {exc}") from None
    opens = message.get("open", [])
    if not isinstance(opens, list) or not all(isinstance(p, str) for p in opens):
        raise InvalidArgument("'open' must be a list of paths")
    spans_in = message.get("ahead", [])
    if not isinstance(spans_in, list):
        raise InvalidArgument("'ahead' must be a list of [offset, count]")
    closes = message.get("close", [])
    if (
        not isinstance(closes, list)
        or len(closes) > MAX_CLOSES
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in closes)
    ):
        raise InvalidArgument(f"'close' must be a list of at most {MAX_CLOSES} lease numbers")
    paths: list[str] = []
    for path in opens:
        try:
            paths.append(normalize_path(path, mountpoint))
        except InvalidArgument as exc:
            raise InvalidArgument(f"path {path[:200]!r} {exc}") from None
    spans: list[tuple[int, int]] = []
    room = MAX_FILES - len(paths)
    if room < 0:
        raise InvalidArgument(f"at most {MAX_FILES} files per line")
    for span in spans_in:
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)
            or abs(span[0]) > MAX_OFFSET
            or span[1] < 0
        ):
            raise InvalidArgument("'ahead' must be a list of [offset, count] (whole numbers)")
        count = min(span[1], room)
        room -= count
        if count:
            spans.append((span[0], count))
    return paths, spans, closes, anchor
