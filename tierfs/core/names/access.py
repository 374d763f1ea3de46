"""Who may do what to a path through the control socket, as the kernel
would decide it for the same user.

The mount runs with ``default_permissions``: the kernel checks every
access against the attributes tierfs reports (the stored mode, uid and
gid).  The control socket serves every local user, so requests about paths
(``where``, ``flush``, ``preload``, ``prefetch``) are checked here against
the same attributes, with the caller's uid and groups (SO_PEERCRED and
``/proc/PID/status``): search (x) on every directory from the mount root
down, and read (r) on the path itself.  Root may do anything, as with the
kernel.  A refusal raises ``PermissionDenied`` naming the path; the caller
then fetches nothing for it.

Invariants: pure functions of the inodes' attributes and the caller; the
walk resolves names through ``Namespace.lookup`` exactly as ``resolve``
does (a directory listed lazily on the way), and checks each directory
before it looks a name up in it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tierfs.errors import PermissionDenied
from tierfs.meta import ROOT_INO, Inode

from .namespace import Namespace

READ = 4
WRITE = 2
SEARCH = 1


@dataclass(frozen=True, slots=True)
class Caller:
    """A local user asking: uid and every group (primary and supplementary)."""

    uid: int
    gids: frozenset[int]

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    @classmethod
    def of_process(cls, pid: int, uid: int, gid: int) -> Caller:
        """The caller ``pid`` (of ``uid``, primary group ``gid``), with the
        supplementary groups ``/proc`` shows for it (none if it is gone)."""
        groups = {gid}
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("Groups:"):
                        groups.update(int(g) for g in line.split()[1:])
                        break
        except (OSError, ValueError):
            pass
        return cls(uid, frozenset(groups))

    @classmethod
    def myself(cls) -> Caller:
        return cls(os.geteuid(), frozenset({os.getegid(), *os.getgroups()}))


def permits(inode: Inode, caller: Caller, want: int) -> bool:
    """May ``caller`` access ``inode`` for ``want`` (READ, WRITE, SEARCH
    bits), by its mode as the kernel checks it?"""
    if caller.is_root:
        return True
    mode = inode.mode
    if inode.uid == caller.uid:
        bits = (mode >> 6) & 7
    elif inode.gid in caller.gids:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


async def readable(namespace: Namespace, relpath: str, caller: Caller) -> Inode:
    """The inode of ``relpath`` if ``caller`` may read it (search on every
    directory above it, read on it); PermissionDenied naming the first
    path that stops it otherwise (NotFound as ``resolve`` for a missing one)."""
    return await _reach(namespace, relpath, caller, READ)


async def searchable(namespace: Namespace, relpath: str, caller: Caller) -> Inode:
    """The inode of the directory ``relpath`` if ``caller`` may look names
    up in it (search on it and on every directory above it)."""
    return await _reach(namespace, relpath, caller, SEARCH)


async def _reach(namespace: Namespace, relpath: str, caller: Caller, want: int) -> Inode:
    inode = namespace.get(ROOT_INO)
    walked = ""
    for part in relpath.split("/"):
        if part in ("", "."):
            continue
        if not permits(inode, caller, SEARCH):
            raise PermissionDenied(f"Permission denied: {walked or '/'}")
        inode = await namespace.lookup(inode.ino, part.encode())
        walked = f"{walked}/{part}" if walked else part
    if not permits(inode, caller, want):
        raise PermissionDenied(f"Permission denied: {walked or '/'}")
    return inode
