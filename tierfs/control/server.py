"""Control server: runs inside the daemon's trio loop.

Each connection carries one request (see ``protocol``).  The peer is checked
with ``SO_PEERCRED``: only root and the daemon's own user may talk to it.
Handlers are thin: they call ``TierFS`` methods and shape the JSON result.
A TierfsError becomes ``{"ok": false, "error", "errno"}``; any other
exception is logged with its traceback and reported as an internal error, and
never stops the server.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from tierfs.control.protocol import MAX_LINE, decode, encode
from tierfs.core import TierFS
from tierfs.errors import InvalidArgument, TierfsError

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ControlServer:
    def __init__(self, fs: TierFS, socket_path: Path, *, mountpoint: Path) -> None:
        self.fs = fs
        self.socket_path = socket_path
        self.mountpoint = mountpoint
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
        }

    def bind(self) -> trio.socket.SocketType:
        """Create the socket (synchronously, before the mount is announced)."""
        directory = self.socket_path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        if self.socket_path.is_socket() or self.socket_path.exists():
            self.socket_path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(self.socket_path))
        finally:
            os.umask(old_umask)
        sock.listen(64)
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

    def _peer_allowed(self, stream: trio.SocketStream) -> bool:
        creds = stream.socket.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
        )
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid in (0, os.geteuid())

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            if not self._peer_allowed(stream):
                await stream.send_all(
                    encode({"ok": False, "error": "permission denied", "errno": errno.EACCES})
                )
                return
            try:
                line = await self._read_line(stream)
                request = decode(line)
                op = request.get("op")
                handler = self._handlers.get(op) if isinstance(op, str) else None
                if handler is None:
                    raise InvalidArgument(f"unknown control operation {op!r}")
                args = request.get("args") or {}
                if not isinstance(args, dict):
                    raise InvalidArgument("control request 'args' must be an object")
                result = await handler(args)
                reply: dict[str, Any] = {"ok": True, "result": result}
            except TierfsError as exc:
                reply = {"ok": False, "error": str(exc), "errno": exc.errno}
            except (ValueError, UnicodeDecodeError) as exc:
                reply = {
                    "ok": False,
                    "error": f"malformed control request: {exc}",
                    "errno": errno.EINVAL,
                }
            except Exception:
                log.exception("control request failed")
                reply = {
                    "ok": False,
                    "error": "internal error (see the daemon log)",
                    "errno": errno.EIO,
                }
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(encode(reply))

    @staticmethod
    async def _read_line(stream: trio.SocketStream) -> bytes:
        buf = bytearray()
        while b"\n" not in buf:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_LINE:
                raise InvalidArgument("control request too long")
        return bytes(buf.split(b"\n", 1)[0])

    # --- handlers ----------------------------------------------------------------------

    async def _ping(self, args: dict[str, Any]) -> Any:
        return {"pid": os.getpid(), "mountpoint": str(self.mountpoint)}

    async def _status(self, args: dict[str, Any]) -> Any:
        status = self.fs.status()
        status["mountpoint"] = str(self.mountpoint)
        status["pid"] = os.getpid()
        return status

    async def _where(self, args: dict[str, Any]) -> Any:
        return await self._each_path("where", args, self.fs.where)

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
                results.append({"path": path, "error": str(exc), "errno": exc.errno})
        return results

    async def _evict(self, args: dict[str, Any]) -> Any:
        tier = _optional_str(args, "tier")
        return await self._each_path(
            "evict", args, lambda path: self.fs.lifecycle.evict_path(path, tier)
        )

    async def _pin(self, args: dict[str, Any]) -> Any:
        tier = _optional_str(args, "tier")
        return await self._each_path(
            "pin", args, lambda path: self.fs.lifecycle.pin_path(path, tier)
        )

    async def _unpin(self, args: dict[str, Any]) -> Any:
        return await self._each_path("unpin", args, self.fs.lifecycle.unpin_path)

    async def _policy_show(self, args: dict[str, Any]) -> Any:
        return await self.fs.lifecycle.show()

    async def _policy_plan(self, args: dict[str, Any]) -> Any:
        return await self.fs.lifecycle.plan_report()

    async def _policy_reload(self, args: dict[str, Any]) -> Any:
        return self.fs.lifecycle.reload()

    async def _flush(self, args: dict[str, Any]) -> Any:
        paths = _paths("flush", args)
        waited = 0
        for path in paths:
            waited += await self.fs.flush_path(path)
        return {"entries": waited}


def _paths(op: str, args: dict[str, Any]) -> list[str]:
    paths = args.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise InvalidArgument(f"{op!r} needs a list of paths relative to the mount root")
    return paths


def _optional_str(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{key!r} must be a string")
    return value
