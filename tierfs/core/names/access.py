"""Who may do what to a path through the control socket, as the kernel
would decide it for the same user.

The mount runs with ``default_permissions``: the kernel checks every
access against the attributes tierfs reports (the stored mode, uid and
gid).  The control socket serves every local user, so requests about paths
(``where``, ``flush``, ``preload``, ``prefetch``) are checked here against
the same attributes, with the caller's uid and groups (``SO_PEERCRED`` and
``SO_PEERGROUPS``: the kernel's word for the connecting process, never a
``/proc`` file a reused PID could change): search (x) on every directory
from the mount root down, and read (r) on the path itself.  A walk of a
tree (preload, ``where`` of a directory) goes only into the directories
the caller may list (read and search), as ``find`` run by that user would.
An access point shows a fixed owner (``[access] uid/gid``): ``Permissions``
checks against the owner the kernel is shown, so that the socket and the
mount give one answer.  Root may do anything, as with the
kernel.  A refusal raises ``PermissionDenied`` naming the path; the caller
then fetches nothing for it.

Invariants: pure functions of the inodes' attributes and the caller; the
walk resolves names through ``Namespace.lookup`` exactly as ``resolve``
does (a directory listed lazily on the way), and checks each directory
before it looks a name up in it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from tierfs.errors import PermissionDenied, TierfsError
from tierfs.meta import ROOT_INO, Inode

from .namespace import Namespace

READ = 4
WRITE = 2
SEARCH = 1
#: Directories whose answer ``Permissions.visible`` keeps at once.
VISIBLE_DIRS_KEPT = 4096

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Caller:
    """A local user asking: uid and every group (primary and supplementary)."""

    uid: int
    gids: frozenset[int]

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    @classmethod
    def myself(cls) -> Caller:
        return cls(os.geteuid(), frozenset({os.getegid(), *os.getgroups()}))


def permits(
    inode: Inode,
    caller: Caller,
    want: int,
    *,
    uid: int | None = None,
    gid: int | None = None,
) -> bool:
    """May ``caller`` access ``inode`` for ``want`` (READ, WRITE, SEARCH
    bits), by its mode as the kernel checks it?  ``uid``/``gid``: the owner
    shown instead of the stored one (an access point's)."""
    if caller.is_root:
        return True
    mode = inode.mode
    if (inode.uid if uid is None else uid) == caller.uid:
        bits = (mode >> 6) & 7
    elif (inode.gid if gid is None else gid) in caller.gids:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


@dataclass(frozen=True, slots=True)
class Permissions:
    """The checks of one mount: its namespace, and the owner it shows
    (``uid``/``gid``: an access point's fixed owner; None: the stored one)."""

    namespace: Namespace
    uid: int | None = None
    gid: int | None = None

    def permits(self, inode: Inode, caller: Caller, want: int) -> bool:
        return permits(inode, caller, want, uid=self.uid, gid=self.gid)

    async def readable(self, relpath: str, caller: Caller) -> Inode:
        """The inode of ``relpath`` if ``caller`` may read it (search on every
        directory above it, read on it); PermissionDenied naming the first
        path that stops it otherwise (NotFound as ``resolve`` for a missing one)."""
        return await self._reach(relpath, caller, READ)

    async def searchable(self, relpath: str, caller: Caller) -> Inode:
        """The inode of the directory ``relpath`` if ``caller`` may look names
        up in it (search on it and on every directory above it)."""
        return await self._reach(relpath, caller, SEARCH)

    def lister(
        self, caller: Caller | None, refused: Callable[[str], None] | None = None
    ) -> Callable[[Inode, str], bool] | None:
        """For ``Namespace.walk(enter=...)``: go into the directories
        ``caller`` may list (read and search); ``refused(path)`` is told of
        each other one.  None (no check) for root or no caller."""
        if caller is None or caller.is_root:
            return None

        def enter(inode: Inode, path: str) -> bool:
            if self.permits(inode, caller, READ | SEARCH):
                return True
            if refused is not None:
                refused(path)
            return False

        return enter

    async def visible(self, items: list[T], path_of: Callable[[T], str], caller: Caller) -> list[T]:
        """The ``items`` whose path (``path_of``) ``caller`` may see: a name
        in a directory it may list (read and search on it, search above)."""
        if caller.is_root:
            return items
        listable: dict[str, bool] = {}
        shown = []
        for count, item in enumerate(items):
            parent = path_of(item).rpartition("/")[0]
            allowed = listable.get(parent)
            if allowed is None:
                try:
                    await self._reach(parent, caller, READ | SEARCH)
                    allowed = True
                except TierfsError:
                    allowed = False
                if len(listable) >= VISIBLE_DIRS_KEPT:
                    listable.clear()
                listable[parent] = allowed
            if allowed:
                shown.append(item)
            if count % 256 == 255:
                await trio.sleep(0)
        return shown

    def readable_inode(self, ino: int, caller: Caller, searchable: dict[int, bool]) -> Inode:
        """The file ``ino`` if ``caller`` may read it: read on it, search
        on every directory above it, checked from the file up (the same
        directories a walk down its path checks).  ``searchable``: the
        caller's answers per directory so far (a batch of files in a few
        directories checks each directory once); filled here."""
        namespace = self.namespace
        inode = namespace.get(ino)
        if not self.permits(inode, caller, READ):
            raise PermissionDenied(f"Permission denied: {namespace.path_of(ino)}")
        parent = inode.parent
        chain: list[int] = []
        allowed = True
        while parent not in searchable:
            chain.append(parent)
            directory = namespace.get(parent)
            if not self.permits(directory, caller, SEARCH):
                allowed = False
                break
            if parent == ROOT_INO:
                break
            parent = directory.parent
        else:
            allowed = searchable[parent]
        for directory_ino in chain:
            searchable[directory_ino] = allowed
        if not allowed:
            raise PermissionDenied(f"Permission denied: {namespace.path_of(ino)}")
        return inode

    async def _reach(self, relpath: str, caller: Caller, want: int) -> Inode:
        namespace = self.namespace
        inode = namespace.get(ROOT_INO)
        walked = ""
        for part in relpath.split("/"):
            if part in ("", "."):
                continue
            if not self.permits(inode, caller, SEARCH):
                raise PermissionDenied(f"Permission denied: {walked or '/'}")
            inode = await namespace.lookup(inode.ino, part.encode(errors="surrogateescape"))
            walked = f"{walked}/{part}" if walked else part
        if not self.permits(inode, caller, want):
            raise PermissionDenied(f"Permission denied: {walked or '/'}")
        return inode
