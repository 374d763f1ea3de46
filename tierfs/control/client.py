"""Control client used by the CLI (synchronous, plain sockets).

``locate(path)`` finds the tierfs mount that holds ``path`` and the path
relative to its root; ``request(socket, op, args)`` sends one request and
returns its result, raising ControlError with the daemon's sentence;
``BoundRequest`` keeps its connection open, for a result that lasts as long
as it does (a bound prefetch order).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierfs.control.protocol import CONTROL_XATTR, decode, encode
from tierfs.errors import ControlAccessDenied, ControlError, NoSuchPath, NotATierfsMount


@dataclass(frozen=True, slots=True)
class Location:
    mount_root: Path
    socket_path: str
    relpath: str  # "" for the root


def mount_root_of(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path):
        if path.parent == path:
            break
        path = path.parent
    return path


def _denied(path: str | Path) -> ControlAccessDenied:
    return ControlAccessDenied(
        f"permission denied: {path}: this user cannot reach that tierfs mount (it was mounted "
        "without allow_other, so only the user who mounted it can enter it)"
    )


def _exists(path: Path) -> bool:
    """Does ``path`` exist?  A path this user may not look at (a FUSE mount
    of another user) is not "absent": it raises ``ControlAccessDenied``."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        raise _denied(path) from None
    return True


def locate(path: str | Path) -> Location:
    """The mount that holds ``path`` (which need not exist below the mount)."""
    abspath = Path(os.path.abspath(path))
    probe = abspath
    while not _exists(probe) and probe.parent != probe:
        probe = probe.parent
    root = mount_root_of(probe)
    try:
        sock = os.getxattr(root, CONTROL_XATTR).decode()
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOENT):
            if probe != abspath:
                raise NoSuchPath(f"{path}: no such file or directory") from None
            raise NotATierfsMount(f"{path} is not on a tierfs mount") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise _denied(path) from None
        raise ControlError(f"{root}: cannot reach the tierfs daemon: {exc.strerror}") from None
    rel = os.path.relpath(abspath, root)
    return Location(root, sock, "" if rel == "." else rel)


def _owner_of(socket_path: str) -> str:
    """Who owns the socket's directory (the daemon's user), as "name (uid N)"."""
    try:
        uid = os.stat(os.path.dirname(socket_path)).st_uid
    except OSError:
        return "whoever mounted it"
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"


class _Connection:
    """One request's connection: sent, then its reply lines read one by one."""

    def __init__(self, socket_path: str, timeout: float | None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(socket_path)
        except OSError as exc:
            self.sock.close()
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise ControlAccessDenied(
                    f"permission denied: the control socket {socket_path} is for root and "
                    f"the user who mounted it ({_owner_of(socket_path)}) only"
                ) from None
            raise ControlError(
                f"cannot reach the tierfs daemon at {socket_path}: {exc.strerror or exc}"
            ) from None
        self._reader = self.sock.makefile("rb")

    def send(self, op: str, args: dict[str, Any] | None, more: Iterable[dict[str, Any]]) -> None:
        try:
            self.sock.sendall(encode({"op": op, "args": args or {}}))
            for message in more:
                self.sock.sendall(encode(message))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered early (an error, a refusal): read its reply

    def messages(self) -> Iterator[dict[str, Any]]:
        """The event lines, then the final reply (ControlError if it is one)."""
        for line in self._reader:
            message = decode(line)
            if "event" in message:
                yield message
                continue
            if message.get("ok"):
                yield {"result": message.get("result")}
                return
            raise ControlError(
                str(message.get("error", "request failed")),
                errno=int(message.get("errno", errno.EIO)),
            )
        raise ControlError("the tierfs daemon closed the connection without an answer")

    def close(self) -> None:
        # The socket's descriptor closes with the last of it and its reader.
        self._reader.close()
        self.sock.close()


def request(
    socket_path: str,
    op: str,
    args: dict[str, Any] | None = None,
    *,
    timeout: float | None = 600.0,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    more: Iterable[dict[str, Any]] = (),
) -> Any:
    """Send one request (then the lines of ``more``, for an op that reads
    further input, e.g. a preload list in chunks) and return its result;
    each event line before the reply goes to ``on_event``."""
    connection = _Connection(socket_path, timeout)
    try:
        connection.send(op, args, more)
        for message in connection.messages():
            if "event" not in message:
                return message["result"]
            if on_event is not None:
                on_event(message)
    finally:
        connection.close()
    raise AssertionError("unreachable: messages() ends with a result or raises")


class BoundRequest:
    """A request whose result lasts while its connection stays open (a
    bound prefetch order): ``result`` is what the daemon announced with its
    ``bound`` event; ``close`` (or the process's exit) ends it."""

    def __init__(
        self,
        socket_path: str,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float | None = 600.0,
        more: Iterable[dict[str, Any]] = (),
    ) -> None:
        self._connection: _Connection | None = _Connection(socket_path, timeout)
        try:
            self._connection.send(op, args, more)
            for message in self._connection.messages():
                if message.get("event") == "bound":
                    self.result: Any = message.get("result")
                    return
                if "event" not in message:  # answered at once: nothing to hold
                    self.result = message["result"]
                    self.close()
                    return
        except BaseException:
            self.close()
            raise

    @property
    def open(self) -> bool:
        return self._connection is not None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def by_mount(paths: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Group PATHs by the tierfs mount that holds them: mount root ->
    (control socket, paths relative to the root)."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for path in paths:
        location = locate(path)
        root = str(location.mount_root)
        groups.setdefault(root, (location.socket_path, []))[1].append(location.relpath)
    return groups


def per_path(
    op: str, paths: list[str], extra: dict[str, Any] | None = None, timeout: float | None = 600.0
) -> list[dict[str, Any]]:
    """Run ``op`` (``where``, ``pin``, ``unpin``, ``evict``, ...) on every
    PATH, one request per mount; each result's ``path`` is made absolute
    again.  A path that fails has an ``error`` in its result."""
    results: list[dict[str, Any]] = []
    for root, (sock, relpaths) in by_mount(paths).items():
        for item in request(sock, op, {"paths": relpaths, **(extra or {})}, timeout=timeout):
            item["path"] = os.path.join(root, item["path"]) if item["path"] else root
            for skipped in item.get("skipped", []):
                skipped["path"] = os.path.join(root, skipped["path"])
            results.append(item)
    return results
