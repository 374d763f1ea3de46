"""What one local user can make the control server hold, and how fast.

The control socket serves every local user, and the daemon is root: a user
must not be able to take the daemon's file descriptors, memory or loop time
away from the others.  The bounds (``ControlLimits``; written down for
operators in docs/operations.md, "Bounds between users"):

* **connections**: at most ``per_user`` open at once for one uid and
  ``total`` for every uid but root; root has ``root`` more of its own, so
  that an administrator's ``tierfs status`` always gets in.  ``total`` is
  derived from the open-file limit the daemon runs with
  (``for_open_files``): the rest of the descriptors stay for the file
  system's own work (tier files, LMDB, S3 connections).  A connection past
  a bound is answered with one error line (EAGAIN) and closed at once.
* **deadlines**: the request line must arrive within ``request_deadline``
  seconds of the connect, and each later line of a list within
  ``line_deadline``; a reply or event the client does not take within
  ``send_deadline`` ends the connection.  A bound prefetch order's
  connection waits idle by design (it ends the order when it closes).
* **memory**: a line is at most ``MAX_LINE`` bytes (of the line being
  read, never of what follows it in the same read), and the unfinished
  lines of one uid's connections hold at most ``buffered_per_user`` bytes
  (``LineBudget``).
* **pace**: one uid's requests start at most ``rate`` per second (a burst
  of ``burst``; the rest wait their turn, they are not refused), and at
  most ``at_once`` of its short requests run at a time (``Pace``).  Root is
  not paced.  Streaming requests (preload, prefetch) are bounded by the
  workers instead (preloads and orders per user, bytes spooled per user).

Invariants: every ``admit`` that returned True is matched by one ``leave``
(the server's ``finally``); a ``LineBudget`` charge is given back when its
line is taken or its connection ends.  Everything here runs on the trio
loop; there is no lock because no method awaits between its reads and
writes of the counters.
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass, field

import trio

from tierfs.control.protocol import MAX_LINE
from tierfs.errors import InvalidArgument
from tierfs.tally import Tally

#: Open files the daemon asks for at start (``raise_open_file_limit``).
WANTED_OPEN_FILES = 65536
#: Descriptors kept for the file system's own work, whatever the limit.
FD_RESERVE = 1024


@dataclass(frozen=True)
class ControlLimits:
    per_user: int = 256
    total: int = 1024
    root: int = 256
    request_deadline: float = 10.0
    line_deadline: float = 30.0
    send_deadline: float = 30.0
    buffered_per_user: int = 16 * MAX_LINE
    rate: float = 20.0
    burst: int = 40
    at_once: int = 4

    @classmethod
    def for_open_files(cls, open_files: int) -> ControlLimits:
        """Limits whose connections leave ``FD_RESERVE`` descriptors (and at
        least half of them all) to the file system."""
        room = max(16, min(open_files - FD_RESERVE, open_files // 2))
        total = min(cls.total, room * 3 // 4)
        root = min(cls.root, max(4, room - total))
        return cls(per_user=min(cls.per_user, total), total=total, root=root)


def raise_open_file_limit(wanted: int = WANTED_OPEN_FILES) -> int:
    """Raise this process's open-file limit towards ``wanted`` (the soft
    limit to the hard one; as root the hard one too, within the kernel's
    ``fs.nr_open``); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target_hard = hard if hard == resource.RLIM_INFINITY else max(hard, wanted)
    for new_hard in (target_hard, hard):
        new_soft = wanted if new_hard == resource.RLIM_INFINITY else min(wanted, new_hard)
        new_soft = max(soft, new_soft)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
        except (ValueError, OSError):
            continue
        return new_soft
    return soft


@dataclass
class ConnectionGate:
    """Open connections per uid, against ``ControlLimits``."""

    limits: ControlLimits
    per_uid: Tally = field(default_factory=Tally)
    others: int = 0
    #: Connections refused past a bound, since the start.
    refused: int = 0

    def admit(self, uid: int) -> str | None:
        """Count a new connection of ``uid``; why not (and nothing counted)."""
        why = self._past_bound(uid)
        if why is not None:
            self.refused += 1
            return why
        self.per_uid.add(uid, 1)
        if uid != 0:
            self.others += 1
        return None

    def _past_bound(self, uid: int) -> str | None:
        held = self.per_uid.get(uid, 0)
        if uid == 0:
            if held >= self.limits.root:
                return f"root has {held} connections open, the most it may"
        elif held >= self.limits.per_user:
            return (
                f"uid {uid} has {held} connections open to this daemon, the most one user "
                "may; close some and try again"
            )
        elif self.others >= self.limits.total:
            return "the daemon has as many connections open as it serves; try again shortly"
        return None

    def leave(self, uid: int) -> None:
        self.per_uid.take(uid, 1)
        if uid != 0:
            self.others -= 1

    def status(self) -> dict[str, int]:
        """``status``'s ``control`` section."""
        return {
            "connections": sum(self.per_uid.values()),
            "refused": self.refused,
            "per_user": self.limits.per_user,
            "total": self.limits.total,
        }


@dataclass
class LineBudget:
    """Bytes of unfinished lines held per uid (root is not bounded)."""

    per_user: int
    held: Tally = field(default_factory=Tally)

    def charge(self, uid: int, nbytes: int) -> None:
        now = self.held.get(uid, 0) + nbytes
        if uid != 0 and now > self.per_user:
            raise InvalidArgument(
                f"the control requests of uid {uid} hold more than {self.per_user} bytes "
                "of unfinished lines; send whole lines"
            )
        self.held[uid] = now

    def release(self, uid: int, nbytes: int) -> None:
        self.held.take(uid, nbytes)


class _UserPace:
    __slots__ = ("at_once", "tokens", "updated")

    def __init__(self, limits: ControlLimits) -> None:
        self.tokens = float(limits.burst)
        self.updated = trio.current_time()
        self.at_once = trio.Semaphore(limits.at_once)


class Pace:
    """Per-uid request pacing (see the module docstring)."""

    def __init__(self, limits: ControlLimits) -> None:
        self.limits = limits
        self._users: dict[int, _UserPace] = {}

    def _user(self, uid: int) -> _UserPace:
        user = self._users.get(uid)
        if user is None:
            user = self._users[uid] = _UserPace(self.limits)
        return user

    async def start(self, uid: int) -> None:
        """Wait until ``uid`` may start another request (root: at once)."""
        if uid == 0:
            return
        user = self._user(uid)
        limits = self.limits
        while True:
            now = trio.current_time()
            user.tokens = min(limits.burst, user.tokens + (now - user.updated) * limits.rate)
            user.updated = now
            if user.tokens >= 1:
                user.tokens -= 1
                return
            await trio.sleep((1 - user.tokens) / limits.rate)

    def short(self, uid: int) -> contextlib.AbstractAsyncContextManager[object]:
        """What a short request of ``uid`` holds while it runs (root: nothing)."""
        return contextlib.nullcontext() if uid == 0 else self._user(uid).at_once


__all__ = [
    "FD_RESERVE",
    "MAX_LINE",
    "ConnectionGate",
    "ControlLimits",
    "LineBudget",
    "Pace",
    "raise_open_file_limit",
]
