"""Control server: runs inside the daemon's trio loop.

Each connection carries one request (see ``protocol``).  The peer is known
by ``SO_PEERCRED`` and ``SO_PEERGROUPS`` (``Peer``): every local user may
connect; the admin operations (``ADMIN_OPS``) are for root and the daemon's
own user, and the others act only on paths the caller may read, and show a
user only its own jobs (``access``, ``Permissions``).  Every request is
hostile input: what one user can make the server hold (connections, lines,
time, pace) is bounded by ``tierfs.control.limits``, and a connection's life
is: admitted by the gate (or refused with one error line) -> its request
line read within the deadline -> paced -> handled -> one final reply ->
our side shut, leftovers read briefly -> closed, its counts given back.
Handlers are thin: they call ``TierFS`` methods and shape the JSON result.

Streaming handlers (``preload``) also get a ``ControlCall``: they send
``{"event": ...}`` lines before the final reply (``send_event``), read the
further lines a client sends after its request (``receive``: the chunks of
a ``--from-file`` list) and learn when the client went away
(``wait_closed``: the CLI's Ctrl-C closes the connection).  A *bound*
prefetch order lives as long as its connection: the handler announces it
with a ``bound`` event and waits for the client to close.
A TierfsError becomes ``{"ok": false, "error", "errno"}``; any other
exception is logged with its traceback and reported as an internal error, and
never stops the server.
"""

from __future__ import annotations

import array
import contextlib
import errno
import itertools
import logging
import math
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from tierfs import __version__
from tierfs.control.limits import ConnectionGate, ControlLimits, LineBudget, Pace
from tierfs.control.protocol import MAX_LINE, decode, encode
from tierfs.control.readers import ReaderSession
from tierfs.core import TierFS
from tierfs.core.names.access import Caller
from tierfs.errors import InvalidArgument, NotFound, PermissionDenied, TierfsError, describe
from tierfs.text import check_label, shown
from tierfs.workers.audit import AuditLog
from tierfs.workers.pathlists import BAD_LINES_NAMED, PathSpool, normalize_path
from tierfs.workers.prefetch import MAX_ORDER_FILES, OrderKey, Prefetcher
from tierfs.workers.preload import Preloader, PreloadJob
from tierfs.workers.snapshots import SnapshotJob, Snapshots

log = logging.getLogger(__name__)

#: Operations for root and the daemon's own user only.
ADMIN_OPS = frozenset({"evict", "pin", "unpin", "policy_reload"})
#: Characters of a preload's tag, at most.
MAX_TAG = 128
#: After its reply, a connection reads what the client still sends for at
#: most this long and this much (see ``_close_gently``).
DRAIN_SECONDS = 1.0
DRAIN_BYTES = 4 * 1024 * 1024
#: ... and a connection refused at once (past a bound) this long, while
#: fewer than REFUSED_DRAINING_MAX such are read.
REFUSED_DRAIN_SECONDS = 0.2
REFUSED_DRAINING_MAX = 32
#: What a user is shown of an error text that may name other users' files.
HIDDEN_ERROR = "(in the daemon log; root's tierfs status shows it)"
#: Seconds between two counts of the quotas' bucket that users (not root)
#: may ask for (``tierfs quota --walk``).
USER_WALK_INTERVAL = 30.0

Handler = Callable[[dict[str, Any], "Peer"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end of a connection (SO_PEERCRED): its process
    and the caller the path checks use (uid and every group)."""

    pid: int
    caller: Caller
    #: The primary group (for the audit log).
    gid: int = -1

    @property
    def uid(self) -> int:
        return self.caller.uid

    @property
    def is_root(self) -> bool:
        return self.caller.is_root


#: Seconds between two progress events of a streaming request.
PROGRESS_INTERVAL = 0.5


class _LineReader:
    """JSON lines from a stream, keeping what a read brought past a newline.

    Bounds (``tierfs.control.limits``): the line being read is at most
    ``MAX_LINE`` bytes (whatever follows its newline in the same read does
    not count against it), and every byte held here is charged to the
    connection's uid in ``budget`` until its line is taken."""

    def __init__(self, stream: trio.SocketStream, budget: LineBudget, uid: int) -> None:
        self.stream = stream
        self._buf = bytearray()
        self.eof = False
        self._budget = budget
        self._uid = uid
        #: Bytes of ``_buf`` already known to hold no newline.
        self._scanned = 0

    async def line(self) -> bytes | None:
        """The next line (without its newline); None at the end of the stream."""
        while True:
            newline = self._buf.find(b"\n", self._scanned)
            if newline >= 0:
                return self._take(newline, 1)
            self._scanned = len(self._buf)
            if self._scanned > MAX_LINE:
                raise InvalidArgument(f"control request line longer than {MAX_LINE} bytes")
            if self.eof:
                return None
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                self.eof = True
                return self._take(len(self._buf), 0) if self._buf else None
            self._budget.charge(self._uid, len(chunk))
            self._buf += chunk

    def _take(self, end: int, skip: int) -> bytes:
        line = bytes(self._buf[:end])
        del self._buf[: end + skip]
        self._scanned = 0
        self._budget.release(self._uid, end + skip)
        return line

    def close(self) -> None:
        """Give back what is still held (the connection ends)."""
        self._budget.release(self._uid, len(self._buf))
        self._buf = bytearray()


class ControlCall:
    """One streaming request's connection, for its handler."""

    def __init__(
        self, stream: trio.SocketStream, reader: _LineReader, peer: Peer, limits: ControlLimits
    ) -> None:
        self._stream = stream
        self._reader = reader
        #: Who sent the request.
        self.peer = peer
        self._limits = limits
        self._send_lock = trio.Lock()

    async def send_event(self, event: str, **fields: Any) -> None:
        """Send one event line; ``trio.BrokenResourceError`` if the client is
        gone or does not take it within the send deadline."""
        async with self._send_lock:
            await _send(
                self._stream, encode({"event": event, **fields}), self._limits.send_deadline
            )

    async def receive(self) -> dict[str, Any] | None:
        """The next line the client sent after its request (None: it
        closed); InvalidArgument if none comes within the line deadline."""
        with trio.move_on_after(self._limits.line_deadline):
            line = await self._reader.line()
            return None if line is None else decode(line)
        raise InvalidArgument(
            f"no line of the list came for {self._limits.line_deadline:g} s; the request ends"
        )

    async def receive_idle(self) -> dict[str, Any] | None:
        """The next line the client sends, however long it takes (None: it
        closed): for a connection that waits idle by design (a reader's)."""
        line = await self._reader.line()
        return None if line is None else decode(line)

    async def send_with_fds(self, message: dict[str, Any], fds: list[int]) -> None:
        """Send one line with ``fds`` passed along (``SCM_RIGHTS``, with its
        first bytes); the caller still owns and closes its copies."""
        data = encode(message)
        async with self._send_lock:
            with trio.move_on_after(self._limits.send_deadline):
                sent = 0
                if fds:
                    sent = await self._stream.socket.sendmsg(
                        [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    )
                await self._stream.send_all(data[sent:])
                return
            raise trio.BrokenResourceError("the client took nothing for the send deadline")

    async def wait_closed(self) -> None:
        """Return once the client closed its side (anything more it sends
        is ignored)."""
        try:
            while await self._reader.line() is not None:
                pass
        except (trio.BrokenResourceError, InvalidArgument, OSError):
            pass


async def _send(stream: trio.SocketStream, data: bytes, deadline: float) -> None:
    """``send_all`` within ``deadline`` seconds (a client that does not
    read must not hold the handler): BrokenResourceError past it."""
    with trio.move_on_after(deadline):
        await stream.send_all(data)
        return
    raise trio.BrokenResourceError("the client took nothing for the send deadline")


StreamingHandler = Callable[[dict[str, Any], ControlCall], Awaitable[Any]]


class ControlServer:
    def __init__(
        self,
        fs: TierFS,
        socket_path: Path,
        *,
        mountpoint: Path,
        limits: ControlLimits | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.fs = fs
        #: The audit log: a reader's open is recorded as the mount's would be.
        self.audit = audit
        self.socket_path = socket_path
        self.mountpoint = mountpoint
        #: What one user may make the server hold (``tierfs.control.limits``).
        self.limits = limits if limits is not None else ControlLimits()
        self._gate = ConnectionGate(self.limits)
        self._line_budget = LineBudget(self.limits.buffered_per_user)
        self._pace = Pace(self.limits)
        #: When a user last had the quotas' bucket counted on request.
        self._user_walk_at = -math.inf
        #: Refused connections whose leftovers are being read (``_refuse``).
        self._refused_draining = 0
        self._handlers: dict[str, Handler] = {
            "ping": self._ping,
            "status": self._status,
            "where": self._where,
            "flush": self._flush,
            "evict": self._evict,
            "pin": self._pin,
            "unpin": self._unpin,
            "policy_show": self._policy_show,
            "policy_plan": self._policy_plan,
            "policy_reload": self._policy_reload,
            "quota": self._quota,
            "preload_list": self._preload_list,
            "preload_cancel": self._preload_cancel,
            "prefetch_clear": self._prefetch_clear,
            "snapshot_list": self._snapshot_list,
            "snapshot_show": self._snapshot_show,
            "snapshot_delete": self._snapshot_delete,
        }
        self._streaming: dict[str, StreamingHandler] = {"preload": self._preload}
        self._streaming["prefetch"] = self._prefetch
        self._streaming["reader"] = self._reader
        self._streaming["snapshot_create"] = self._snapshot_create
        self._streaming["snapshot_diff"] = self._snapshot_diff
        #: The snapshot worker (set by the daemon when it starts it).
        self.snapshots: Snapshots | None = None
        #: The preload worker (set by the daemon when it starts it).
        self.preloader: Preloader | None = None
        #: The prefetch worker (set by the daemon when it starts it).
        self.prefetcher: Prefetcher | None = None
        #: Names the bound prefetch orders set without a session name.
        self._connections = itertools.count(1)

    def bind(self) -> trio.socket.SocketType:
        """Create the socket (synchronously, before the mount is announced)."""
        # Every local user may connect (0755 directory, 0666 socket): what
        # each may do is checked per request (``_peer_refused``, ``access``).
        directory = self.socket_path.parent
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
        if self.socket_path.is_socket() or self.socket_path.exists():
            self.socket_path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o111)
        try:
            sock.bind(str(self.socket_path))
        finally:
            os.umask(old_umask)
        sock.listen(512)
        return trio.socket.from_stdlib_socket(sock)

    async def serve(
        self,
        sock: trio.socket.SocketType,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        listener = trio.SocketListener(sock)
        try:
            await trio.serve_listeners(self._connection, [listener], task_status=task_status)
        finally:
            self.socket_path.unlink(missing_ok=True)

    @staticmethod
    def _peer_of(stream: trio.SocketStream) -> Peer:
        """The process at the other end and its user, as the kernel says
        (``SO_PEERCRED``, ``SO_PEERGROUPS``): taken when it connected, so a
        PID reused since cannot change them."""
        sock = stream.socket
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", creds)
        return Peer(pid, Caller(uid, frozenset({gid, *_peer_groups(sock)})), gid)

    def _peer_refused(self, peer: Peer, op: object) -> str | None:
        """Why the peer may not run ``op`` (None: it may).  Every local user
        may ask about, flush, preload and prefetch the paths it may read
        (each path is checked as the kernel would: ``access``); the admin
        operations (``ADMIN_OPS``) are for root and the daemon's own user
        (the one who mounted)."""
        if op not in ADMIN_OPS or peer.uid in (0, os.geteuid()):
            return None
        log.warning(
            "control: refused %s from uid %d (pid %d): only root and uid %d may",
            op,
            peer.uid,
            peer.pid,
            os.geteuid(),
        )
        return (
            f"permission denied: {op} on {self.mountpoint} is for root and the user who "
            f"mounted it (uid {os.geteuid()}); you are uid {peer.uid}"
        )

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                peer = self._peer_of(stream)
            except OSError:
                return  # gone before we looked
            refused = self._gate.admit(peer.uid)
            if refused is not None:
                await self._refuse(stream, refused)
                return
            reader = _LineReader(stream, self._line_budget, peer.uid)
            try:
                reply = await self._answer(stream, reader, peer)
                with contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError, OSError
                ):
                    await _send(stream, encode(reply), self.limits.send_deadline)
                    await self._close_gently(stream, eof=reader.eof)
            finally:
                reader.close()
                self._gate.leave(peer.uid)

    async def _refuse(self, stream: trio.SocketStream, why: str) -> None:
        """Answer a connection past a bound with one error line.  Its
        leftovers are read briefly only while few refused connections are
        (a flood of them must not hold descriptors)."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await _send(stream, encode({"ok": False, "error": why, "errno": errno.EAGAIN}), 1.0)
            if self._refused_draining >= REFUSED_DRAINING_MAX:
                return
            self._refused_draining += 1
            try:
                await self._close_gently(stream, eof=False, seconds=REFUSED_DRAIN_SECONDS)
            finally:
                self._refused_draining -= 1

    @staticmethod
    async def _close_gently(
        stream: trio.SocketStream, *, eof: bool, seconds: float = DRAIN_SECONDS
    ) -> None:
        """End our side, then read (and drop) what the client still sends,
        briefly: closing a Unix socket with unread data resets the peer,
        which then loses the reply it has not read yet.  ``eof``: the
        client's side has ended already."""
        await stream.send_eof()
        if eof:
            return
        drained = 0
        with trio.move_on_after(seconds):
            while drained < DRAIN_BYTES:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                drained += len(chunk)

    async def _answer(
        self, stream: trio.SocketStream, reader: _LineReader, peer: Peer
    ) -> dict[str, Any]:
        """Read, check and run one request; its final reply."""
        try:
            line = None
            with trio.move_on_after(self.limits.request_deadline) as waited:
                line = await reader.line()
            if waited.cancelled_caught:
                raise InvalidArgument(
                    f"no request came within {self.limits.request_deadline:g} s of the connect"
                )
            request = decode(line or b"")
            op = request.get("op")
            args = request.get("args") or {}
            if not isinstance(args, dict):
                raise InvalidArgument("control request 'args' must be an object")
            refused = self._peer_refused(peer, op)
            if refused is not None:
                raise PermissionDenied(refused)
            await self._pace.start(peer.uid)
            if isinstance(op, str) and op in self._streaming:
                call = ControlCall(stream, reader, peer, self.limits)
                result = await self._streaming[op](args, call)
            else:
                handler = self._handlers.get(op) if isinstance(op, str) else None
                if handler is None:
                    raise InvalidArgument(f"unknown control operation {_shown(op)}")
                async with self._pace.short(peer.uid):
                    result = await handler(args, peer)
            return {"ok": True, "result": result}
        except TierfsError as exc:
            # A missing path is named by its errno's text, never as a bare name.
            text = describe(exc) if exc.errno in (errno.ENOENT, errno.ENOTDIR) else str(exc)
            return {"ok": False, "error": text, "errno": exc.errno}
        except (ValueError, UnicodeError, RecursionError) as exc:
            return {
                "ok": False,
                "error": f"malformed control request: {_shown(str(exc))}",
                "errno": errno.EINVAL,
            }
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            # The client went away, or its socket failed: nobody to answer.
            log.debug("control connection of uid %d ended: %r", peer.uid, exc)
            return {"ok": False, "error": "connection lost", "errno": errno.EPIPE}
        except Exception:
            log.exception("control request failed")
            return {
                "ok": False,
                "error": "internal error (see the daemon log)",
                "errno": errno.EIO,
            }

    # --- handlers ----------------------------------------------------------------------

    async def _ping(self, args: dict[str, Any], peer: Peer) -> Any:
        return {"pid": os.getpid(), "mountpoint": str(self.mountpoint), "version": __version__}

    async def _status(self, args: dict[str, Any], peer: Peer) -> Any:
        """The mount's figures; a user sees only their own preloads and
        prefetch orders (root: everyone's)."""
        status = self.fs.status()
        status["mountpoint"] = str(self.mountpoint)
        status["pid"] = os.getpid()
        status["version"] = __version__
        status["preloads"] = self._own_preloads(peer)
        prefetch = self.prefetcher.status() if self.prefetcher is not None else None
        if prefetch is not None and not peer.is_root:
            prefetch["orders"] = [o for o in prefetch["orders"] if o["owner"] == peer.uid]
        status["prefetch"] = prefetch
        status["control"] = self._gate.status()
        if not peer.is_root:
            await self._names_for_user(status, peer)
        return status

    async def _names_for_user(self, status: dict[str, Any], peer: Peer) -> None:
        """What of ``status`` names files is cut to what ``peer`` may list:
        the files whose uploads were refused, the mover's current file; the
        last errors (which name keys and files) are root's to read."""
        visible = self.fs.permissions.visible
        status["failed"] = await visible(status["failed"], lambda item: item["path"], peer.caller)
        current = (status.get("mover") or {}).get("current")
        if current and not await visible([current], lambda item: item["path"], peer.caller):
            current["path"] = None
        if status["last_sync_error"]:
            status["last_sync_error"] = HIDDEN_ERROR
        if status["endpoint"].get("last_error"):
            status["endpoint"]["last_error"] = HIDDEN_ERROR
        for worker in status["workers"].values():
            if worker.get("last_error"):
                worker["last_error"] = HIDDEN_ERROR

    def _own_preloads(self, peer: Peer) -> list[dict[str, Any]]:
        """The preloads ``peer`` may see: its own (root: all)."""
        if self.preloader is None:
            return []
        jobs = self.preloader.status()
        return jobs if peer.is_root else [job for job in jobs if job["owner"] == peer.uid]

    async def _preload(self, args: dict[str, Any], call: ControlCall) -> Any:
        """Validate every path (the arguments, then the list the client
        streams), start the job, then stream its progress until it is done,
        ``ready_fraction`` of its bytes are resident, or at once with
        ``detach``.  The client going away cancels the job unless it asked
        for ``detach`` or ``ready_fraction``."""
        preloader = self.preloader
        if preloader is None:
            raise InvalidArgument("this daemon runs no preload worker")
        paths = _paths("preload", args)
        tier = _optional_str(args, "tier")
        detach = bool(args.get("detach"))
        fraction = args.get("ready_fraction")
        if fraction is not None and (
            not isinstance(fraction, int | float) or not 0 <= fraction <= 1
        ):
            raise InvalidArgument("'ready_fraction' must be a number from 0 to 1")
        bandwidth = args.get("bandwidth", 0)
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, int) or bandwidth < 0:
            raise InvalidArgument(
                "'bandwidth' must be a whole number of bytes per second, 0 or more"
            )
        tag = _name(args, "tag", "a preload tag")
        preloader.admit(call.peer.caller)  # before the list is taken
        spool = preloader.new_spool(call.peer.uid)
        await self._receive_paths(
            spool,
            paths,
            call,
            stream=bool(args.get("from_list")),
            noun="list",
            rejected="preload list, nothing was fetched",
        )
        if not spool.count:
            spool.close()
            raise InvalidArgument("nothing to preload: no paths given")
        roots = [normalize_path(p, str(self.mountpoint)) for p in paths]
        job = preloader.start(
            spool, roots, tier, bandwidth=bandwidth, caller=call.peer.caller, tag=tag
        )
        if detach:
            return job.snapshot()
        sent = _Sent()
        async with trio.open_nursery() as nursery:

            async def client_gone() -> None:
                await call.wait_closed()
                if fraction is None:
                    preloader.cancel(job)
                nursery.cancel_scope.cancel()

            nursery.start_soon(client_gone)
            try:
                while True:
                    await self._send_progress(call, job, sent)
                    if job.done.is_set() or (fraction is not None and job.ready(fraction)):
                        break
                    with trio.move_on_after(PROGRESS_INTERVAL):
                        await job.done.wait()
            except trio.BrokenResourceError:  # the client went away
                if fraction is None:
                    preloader.cancel(job)
            nursery.cancel_scope.cancel()
        summary = job.snapshot()
        summary["failures"] = [{"path": f.path, "reason": f.reason} for f in job.failures]
        summary["warnings"] = list(job.warnings)
        return summary

    def _snapshot_worker(self) -> Snapshots:
        if self.snapshots is None:
            raise InvalidArgument("this daemon runs no snapshot worker")
        return self.snapshots

    async def _snapshot_create(self, args: dict[str, Any], call: ControlCall) -> Any:
        """Snapshot ``name`` of ``paths`` (the whole mount if none); progress
        events until it is done.  The client going away stops it (nothing
        is kept)."""
        worker = self._snapshot_worker()
        paths = _paths("snapshot_create", args) if args.get("paths") is not None else []
        roots = [normalize_path(p, str(self.mountpoint)) for p in paths]
        job = await worker.create(call.peer.caller, _snapshot_name(args, "name"), roots)
        return await self._follow_snapshot_job(job, call)

    async def _snapshot_diff(self, args: dict[str, Any], call: ControlCall) -> Any:
        """Added, removed and changed names from snapshot ``name`` to
        ``other`` (a snapshot, or the live bucket when absent)."""
        worker = self._snapshot_worker()
        other = _optional_str(args, "other")
        job = await worker.diff(call.peer.caller, _snapshot_name(args, "name"), other)
        return await self._follow_snapshot_job(job, call)

    @staticmethod
    async def _follow_snapshot_job(job: SnapshotJob, call: ControlCall) -> Any:
        async with trio.open_nursery() as nursery:

            async def client_gone() -> None:
                await call.wait_closed()
                job.stop.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(client_gone)
            try:
                while not job.done.is_set():
                    await call.send_event("progress", **job.snapshot())
                    with trio.move_on_after(PROGRESS_INTERVAL):
                        await job.done.wait()
            except trio.BrokenResourceError:  # the client went away
                job.stop.set()
            nursery.cancel_scope.cancel()
        await job.done.wait()
        result = job.result or {}
        if result.get("ok") is False:
            raise TierfsError(result["error"], errno=result["errno"])
        return result

    async def _snapshot_list(self, args: dict[str, Any], peer: Peer) -> Any:
        return await self._snapshot_worker().list(peer.caller)

    async def _snapshot_show(self, args: dict[str, Any], peer: Peer) -> Any:
        return await self._snapshot_worker().show(peer.caller, _snapshot_name(args, "name"))

    async def _snapshot_delete(self, args: dict[str, Any], peer: Peer) -> Any:
        return await self._snapshot_worker().delete(peer.caller, _snapshot_name(args, "name"))

    async def _preload_list(self, args: dict[str, Any], peer: Peer) -> Any:
        """The preloads the daemon knows (running, and the last finished):
        the caller's own; root's call lists every user's."""
        return self._own_preloads(peer)

    async def _preload_cancel(self, args: dict[str, Any], peer: Peer) -> Any:
        """Cancel the running preload ``id``, or every running one tagged
        ``tag``: its owner's, or any with root.  The ids cancelled."""
        preloader = self.preloader
        if preloader is None:
            raise InvalidArgument("this daemon runs no preload worker")
        job_id, tag = _optional_str(args, "id"), _optional_str(args, "tag")
        if (job_id is None) == (tag is None):
            raise InvalidArgument("name one preload: its 'id', or a 'tag'")
        jobs = preloader.running(job_id=job_id, tag=tag)
        if job_id is not None and not jobs:
            known = job_id in preloader.jobs
            raise NotFound(f"preload {job_id}" + (" has ended" if known else " does not exist"))
        others = [job for job in jobs if job.owner != peer.uid and not peer.is_root]
        if others:
            raise PermissionDenied(
                f"preload {others[0].id} belongs to uid {others[0].owner}; "
                "only its owner or root may cancel it"
            )
        for job in jobs:
            preloader.cancel(job)
            log.info("preload %s cancelled by uid %d", job.id, peer.uid)
        return {"cancelled": [job.id for job in jobs]}

    @staticmethod
    async def _send_progress(call: ControlCall, job: PreloadJob, sent: _Sent) -> None:
        """New warnings and failures (each once), then the figures."""
        for warning in job.warnings[sent.warnings :]:
            await call.send_event("warning", message=warning)
        sent.warnings = len(job.warnings)
        for failure in job.failures[sent.failures :]:
            await call.send_event("failed", path=failure.path, reason=failure.reason)
        sent.failures = len(job.failures)
        await call.send_event("progress", **job.snapshot())

    async def _receive_paths(
        self,
        spool: PathSpool,
        paths: list[str],
        call: ControlCall,
        *,
        stream: bool,
        noun: str,
        rejected: str,
        max_count: int | None = None,
    ) -> None:
        """Validate every path (``paths``, then, if ``stream``, the chunks the
        client sends until ``{"end": true}``) into ``spool``.  Any bad one
        raises InvalidArgument naming the bad ones (up to
        ``BAD_LINES_NAMED``), ``rejected`` saying what that means; the spool
        is closed whenever this raises.  ``noun``: "list", "order".  The
        bounds hold while the list arrives: past ``max_count`` paths, or
        past what the spool may hold (``SpoolFull``), it is refused at once."""
        bad: list[str] = []
        nbad = 0

        def add(path: object, where: str) -> None:
            nonlocal nbad
            try:
                if not isinstance(path, str):
                    raise InvalidArgument("is not a string")
                spool.add(normalize_path(path, str(self.mountpoint)))
            except InvalidArgument as exc:
                nbad += 1
                if len(bad) < BAD_LINES_NAMED:
                    bad.append(f"{where} {_shown(path)} {exc}")

        try:
            for path in paths:
                add(path, "argument")
            line = 0
            while stream:
                message = await call.receive()
                if message is None:
                    raise InvalidArgument(
                        f"the client closed the connection before the {noun} ended"
                    )
                if message.get("end"):
                    break
                chunk = message.get("paths")
                if not isinstance(chunk, list):
                    article = "an" if noun[0] in "aeiou" else "a"
                    raise InvalidArgument(f'{article} {noun} chunk must be {{"paths": [...]}}')
                for path in chunk:
                    line += 1
                    add(path, f"line {line}:")
                if max_count is not None and spool.count > max_count:
                    raise InvalidArgument(
                        f"a prefetch {noun} has at most {max_count:,} files; this one has more"
                    )
                await trio.sleep(0)
            if nbad:
                more = f" (and {nbad - len(bad)} more)" if nbad > len(bad) else ""
                raise InvalidArgument(f"bad {rejected}: {'; '.join(bad)}{more}")
        except BaseException:
            spool.close()
            raise

    async def _prefetch(self, args: dict[str, Any], call: ControlCall) -> Any:
        """Receive an order (the chunks the client streams, as for a preload
        list), validate every line, then make it the order of the caller's
        session (``job``, ``rank``): a bad line rejects the whole order and
        the session's previous one stays; missing files are named and left
        out; an empty order ends the session's order.  With ``bound`` the
        order is announced as a ``bound`` event and lasts while the client
        keeps this connection open: its close ends the order (if no newer
        one of the session replaced it), and the order's end otherwise
        closes the connection."""
        prefetcher = self.prefetcher
        if prefetcher is None:
            raise InvalidArgument("this daemon runs no prefetch worker")
        window: dict[str, int | None] = {}
        for name in ("window_files", "window_bytes"):
            value = args.get(name)
            if value is not None and (not _whole(value) or value < 1):
                raise InvalidArgument(f"{name!r} must be a positive integer")
            window[name] = value
        bound = bool(args.get("bound"))
        session = _optional_str(args, "session")
        if bound and not session:
            session = f"connection-{next(self._connections)}"
        key = OrderKey(
            call.peer.uid, _optional_str(args, "job") or "", _optional_rank(args), session or ""
        )
        prefetcher.check_bounds(key, 1)  # before the order is taken
        spool = prefetcher.new_spool(call.peer.uid)
        await self._receive_paths(
            spool,
            [],
            call,
            stream=True,
            noun="order",
            rejected="prefetch order, the previous order stays",
            max_count=MAX_ORDER_FILES,
        )
        summary = await prefetcher.load_order(
            spool, key=key, bound=bound, caller=call.peer.caller, **window
        )
        if not bound or summary["id"] is None:
            return summary
        try:
            await call.send_event("bound", result=summary)
            # Until the client closes, or the order ends otherwise (a newer
            # order of the session, a clear): then this connection closes
            # too, so a session holds one connection, however many orders.
            async with trio.open_nursery() as nursery:

                async def client_gone() -> None:
                    await call.wait_closed()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(client_gone)
                await prefetcher.until_ended(key, summary["id"])
                nursery.cancel_scope.cancel()
        except trio.BrokenResourceError:
            pass
        finally:
            prefetcher.end(key, summary["id"])
        return summary

    async def _reader(self, args: dict[str, Any], call: ControlCall) -> Any:
        """A reader connection of ``tierfs.client`` (``readers``): lines of
        files to hand out, answered with their descriptors, until the
        client closes; its leases end with it."""
        session = ReaderSession(
            self.fs,
            call.peer.caller,
            pid=call.peer.pid,
            gid=call.peer.gid,
            connection=next(self._connections),
            mountpoint=str(self.mountpoint),
            prefetcher=self.prefetcher,
            audit=self.audit,
        )
        try:
            return await session.serve(call.receive_idle, call.send_with_fds)
        except trio.BrokenResourceError:
            return {"answered": None}

    async def _prefetch_clear(self, args: dict[str, Any], peer: Peer) -> Any:
        """End prefetch orders: the caller's of job ``job`` ("": no job
        name, absent: every job) and rank ``rank`` (absent: every rank), of
        every session; root's call ends those of every user."""
        if self.prefetcher is None:
            raise InvalidArgument("this daemon runs no prefetch worker")
        job = _optional_str(args, "job") if "job" in args else None
        rank = _optional_rank(args)
        ended = self.prefetcher.clear(uid=None if peer.is_root else peer.uid, job=job, rank=rank)
        return {"ended": ended}

    async def _where(self, args: dict[str, Any], peer: Peer) -> Any:
        """Each path's figures; a directory's totals count only what the
        caller may list (``dirs_not_listed`` says how many were left out)."""
        enter = self.fs.permissions.lister(peer.caller)

        async def where(path: str) -> dict[str, Any]:
            await self._check_readable(path, peer)
            return await self.fs.where(path, enter=enter)

        return await self._each_path("where", args, where)

    async def _check_readable(self, path: str, peer: Peer) -> None:
        """PermissionDenied unless ``peer`` may read ``path`` (``access``)."""
        if not peer.is_root:
            await self.fs.permissions.readable(path, peer.caller)

    @staticmethod
    async def _each_path(
        op: str, args: dict[str, Any], fn: Callable[[str], Awaitable[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """``fn(path)`` for each of ``args["paths"]``; a path that fails
        gets its error in its own result, and the others go on."""
        paths = _paths(op, args)
        results = []
        for path in paths:
            try:
                results.append(await fn(path))
            except TierfsError as exc:
                results.append({"path": path, "error": describe(exc), "errno": exc.errno})
        return results

    async def _evict(self, args: dict[str, Any], peer: Peer) -> Any:
        tier = _optional_str(args, "tier")
        return await self._each_path(
            "evict", args, lambda path: self.fs.lifecycle.evict_path(path, tier)
        )

    async def _pin(self, args: dict[str, Any], peer: Peer) -> Any:
        tier = _optional_str(args, "tier")
        return await self._each_path(
            "pin", args, lambda path: self.fs.lifecycle.pin_path(path, tier)
        )

    async def _unpin(self, args: dict[str, Any], peer: Peer) -> Any:
        return await self._each_path("unpin", args, self.fs.lifecycle.unpin_path)

    async def _policy_show(self, args: dict[str, Any], peer: Peer) -> Any:
        return await self.fs.lifecycle.show()

    async def _policy_plan(self, args: dict[str, Any], peer: Peer) -> Any:
        """The plan; a user sees the moves of the files whose names it may
        list (the summary's figures stay whole; ``moves_hidden`` counts the
        others)."""
        report = await self.fs.lifecycle.plan_report()
        if not peer.is_root:
            moves = report["moves"]
            report["moves"] = await self.fs.permissions.visible(
                moves, lambda move: move["path"], peer.caller
            )
            report["moves_hidden"] = len(moves) - len(report["moves"])
        return report

    async def _quota(self, args: dict[str, Any], peer: Peer) -> Any:
        """The quotas and their usage (any user); ``walk``: after a fresh
        count of the bucket (one walk, shared by every caller waiting)."""
        note = None
        if args.get("walk"):
            # A user may have the bucket counted once per USER_WALK_INTERVAL
            # (every user's asks together): a walk is a LIST per directory.
            now = trio.current_time()
            if peer.is_root or now - self._user_walk_at >= USER_WALK_INTERVAL:
                if not peer.is_root:
                    self._user_walk_at = now
                await self.fs.quotas.wait_walked()
            else:
                note = (
                    f"the bucket was counted on a user's request less than "
                    f"{USER_WALK_INTERVAL:g} s ago: these are the last counts"
                )
        result: dict[str, Any] = {"quotas": self.fs.quotas.status()}
        if note is not None:
            result["note"] = note
        return result

    async def _policy_reload(self, args: dict[str, Any], peer: Peer) -> Any:
        """Reload; with quotas, reply once the bucket is counted for them,
        so that they hold from the moment the command returns."""
        reloaded = self.fs.reload_policy()
        await self.fs.quotas.wait_walked()
        return reloaded

    async def _flush(self, args: dict[str, Any], peer: Peer) -> Any:
        paths = _paths("flush", args)
        for path in paths:  # every path checked before anything is waited for
            await self._check_readable(path, peer)
        waited = others = open_elsewhere = 0
        for path in paths:
            outcome = await self.fs.flush_for(path, uid=None if peer.is_root else peer.uid)
            waited += outcome.entries
            others += outcome.others
            open_elsewhere += outcome.open_elsewhere
        result: dict[str, Any] = {"entries": waited}
        if others or open_elsewhere:
            result["left"] = {"others": others, "open_elsewhere": open_elsewhere}
        return result


#: ``SO_PEERGROUPS`` (Linux 4.13+; Python names it from 3.14 only).
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
#: Supplementary groups a process may have (``NGROUPS_MAX``).
NGROUPS_MAX = 65536


def _peer_groups(sock: trio.socket.SocketType) -> list[int]:
    """The peer's supplementary groups as of its connect (``SO_PEERGROUPS``)."""
    size = 64 * 4
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == errno.ERANGE and size < NGROUPS_MAX * 4:
                size = NGROUPS_MAX * 4
                continue
            raise
        count = len(raw) // 4
        return list(struct.unpack(f"{count}I", raw[: count * 4]))


def _shown(value: object, limit: int = 200) -> str:
    """``value`` as a user sent it, quoted, safe to put in a reply or a log
    line (``tierfs.text.shown``) and cut to ``limit`` characters."""
    text = f"'{shown(value)}'" if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class _Sent:
    """How many warnings and failures of a job were sent as events."""

    __slots__ = ("failures", "warnings")

    def __init__(self) -> None:
        self.warnings = 0
        self.failures = 0


def _paths(op: str, args: dict[str, Any]) -> list[str]:
    paths = args.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise InvalidArgument(f"{op!r} needs a list of paths relative to the mount root")
    return paths


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_rank(args: dict[str, Any]) -> int | None:
    rank = args.get("rank")
    if rank is not None and (not _whole(rank) or rank < 0):
        raise InvalidArgument("'rank' must be a whole number, 0 or more")
    return rank


def _name(args: dict[str, Any], key: str, what: str) -> str:
    """A label the user chose (``key``, "" if absent): printable, at most
    ``MAX_TAG`` characters (it is shown to other users and root)."""
    return check_label(_optional_str(args, key) or "", what, MAX_TAG)


def _snapshot_name(args: dict[str, Any], key: str) -> str:
    value = _optional_str(args, key)
    if value is None:
        raise InvalidArgument(f"{key!r}: a snapshot's name is needed")
    return value


def _optional_str(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{key!r} must be a string")
    return value
