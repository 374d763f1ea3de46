"""POSIX attribute rules that the kernel leaves to a FUSE filesystem.

Access time (``AccessTimes``)
-----------------------------
The kernel never updates atime on a FUSE inode (it marks FUSE inodes
``S_NOATIME``), and it passes no ``noatime``/``relatime`` mount flag to the
daemon: the daemon decides.  tierfs follows ``relatime``, the Linux default:
a read moves atime to now only if atime <= mtime, atime <= ctime, or atime
is more than ``RELATIME_WINDOW_NS`` (24 h) old.  A read only reaches the
daemon when the kernel's page cache misses, so a file re-read from page
cache keeps its atime until a read reaches the daemon again.  A new atime
lives in memory (``pending``, shown by getattr at once) and reaches LMDB in
one write block per ``flush`` (every few seconds and at unmount, inside
the metadata group commit): never one LMDB write per read.  ``utimensat``
(``touch -a``) goes through ``setattr`` and is written at once; it drops
a pending relatime update of that inode (``discard``).

Unlinked inodes (``UnlinkedInodes``)
------------------------------------
A file or directory removed from the namespace (unlink, rmdir, the target
a rename replaced) may still be held by the kernel: an open descriptor, a
working directory.  ``fstat`` on it must succeed with nlink 0, as on ext4.
Its inode is remembered here from the removal until the kernel forgets
it (FUSE ``forget``: the kernel evicts an inode with nlink 0 as soon as its
last reference goes, so the map holds what is still referenced).  Inode
numbers are never reused, so an entry can never answer for a new inode.
Only ``getattr`` consults it; every other operation treats the inode as
gone (the kernel refuses new entries in a removed directory itself).

setuid and setgid (``mode_after_write``, ``mode_after_chown``)
--------------------------------------------------------------
The kernel's rules for local filesystems (``setattr_should_drop_suidgid``):
a write or truncation by a caller without ``CAP_FSETID`` clears S_ISUID,
and S_ISGID when the group may execute the file (or when the caller is not
in the file's group); a chown of a non-directory clears S_ISUID always and
S_ISGID when group-executable, whoever calls it.  For FUSE the kernel does
the write case itself only on its buffered write path; a ``direct_io``
handle (tierfs opens O_WRONLY handles so) and an ``open(O_TRUNC)`` (atomic
O_TRUNC) leave it to the filesystem, flagged by FUSE_WRITE_KILL_SUIDGID,
which pyfuse3 does not pass on.  So the daemon applies the rule itself:
each handle remembers who opened it (``Caller``) and the first write that
finds a bit to clear asks ``/proc/<pid>/status`` for the opener's
capabilities and groups (``privileges_of``; uid 0 counts as privileged
when the process is gone).

setgid directories (``inherit_group``)
--------------------------------------
An entry created in a directory with S_ISGID takes the directory's group,
and a new subdirectory inherits S_ISGID (``inode_init_owner``).
"""

from __future__ import annotations

import stat
import time
from dataclasses import dataclass, field

from tierfs.meta import Inode, MetaDB

#: relatime: an atime older than this is refreshed by the next read.
RELATIME_WINDOW_NS = 24 * 3600 * 10**9
#: Bit of CAP_FSETID in the capability masks of /proc/<pid>/status.
CAP_FSETID = 4


class AccessTimes:
    """Relatime access times, kept in memory and written back in batches."""

    def __init__(self, meta: MetaDB) -> None:
        self.meta = meta
        #: ino -> atime_ns not yet written to LMDB.
        self.pending: dict[int, int] = {}

    def atime_of(self, inode: Inode) -> int:
        return self.pending.get(inode.ino, inode.atime_ns)

    def accessed(self, inode: Inode, now_ns: int | None = None) -> bool:
        """A read of ``inode``: move its atime to now if relatime says so
        (True if it moved).  O(1), no I/O."""
        atime = self.atime_of(inode)
        now = time.time_ns() if now_ns is None else now_ns
        if atime > inode.mtime_ns and atime > inode.ctime_ns and now - atime < RELATIME_WINDOW_NS:
            return False
        inode.atime_ns = now  # the open file's live inode, if it is one
        self.pending[inode.ino] = now
        return True

    def discard(self, ino: int) -> None:
        """``ino``'s atime was set explicitly (or it is gone)."""
        self.pending.pop(ino, None)

    def flush(self) -> int:
        """Write the pending access times in one write block; returns how many."""
        if not self.pending:
            return 0
        batch, self.pending = self.pending, {}
        self.meta.write_posix_atimes(batch)
        return len(batch)


class UnlinkedInodes:
    """Inodes removed from the namespace that the kernel may still hold."""

    def __init__(self) -> None:
        self._inodes: dict[int, Inode] = {}

    def add(self, inode: Inode) -> None:
        self._inodes[inode.ino] = inode

    def get(self, ino: int) -> Inode | None:
        return self._inodes.get(ino)

    def __contains__(self, ino: int) -> bool:
        return ino in self._inodes

    def __len__(self) -> int:
        return len(self._inodes)

    def forget(self, ino: int) -> None:
        """The kernel dropped its last reference to ``ino``."""
        self._inodes.pop(ino, None)


@dataclass(frozen=True, slots=True)
class Privileges:
    """What the kernel checks before it keeps setuid/setgid on a write."""

    fsetid: bool
    groups: frozenset[int]


@dataclass(slots=True)
class Caller:
    """The process that opened a handle (FUSE request context).  ``pid`` 0:
    unknown (decided by uid alone)."""

    uid: int
    gid: int
    pid: int = 0
    _privileges: Privileges | None = field(default=None, repr=False)

    def privileges(self) -> Privileges:
        """Looked up once, on the first write that needs it."""
        if self._privileges is None:
            self._privileges = privileges_of(self.pid, self.uid, self.gid)
        return self._privileges


def privileges_of(pid: int, uid: int, gid: int) -> Privileges:
    """CAP_FSETID and groups of process ``pid`` from ``/proc``; if it is gone
    (or ``pid`` is 0), root is taken as privileged and ``gid`` as its group."""
    fallback = Privileges(fsetid=uid == 0, groups=frozenset({gid}))
    if pid <= 0:
        return fallback
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return fallback
    fsetid: bool | None = None
    groups = {gid}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            fsetid = bool(int(value.strip(), 16) >> CAP_FSETID & 1)
        elif key == "Gid":
            parts = value.split()
            if len(parts) > 1:
                groups.add(int(parts[1]))  # effective gid
        elif key == "Groups":
            groups.update(int(g) for g in value.split())
    if fsetid is None:
        return fallback
    return Privileges(fsetid=fsetid, groups=frozenset(groups))


def _sgid_must_go(mode: int, file_gid: int, privileges: Privileges) -> bool:
    if not mode & stat.S_ISGID:
        return False
    if mode & stat.S_IXGRP:
        return True
    return file_gid not in privileges.groups


def mode_after_write(mode: int, file_gid: int, caller: Caller) -> int:
    """``mode`` after a write or truncation by ``caller`` (regular files)."""
    if not stat.S_ISREG(mode) or not mode & (stat.S_ISUID | stat.S_ISGID):
        return mode
    kill = stat.S_ISUID if mode & stat.S_ISUID else 0
    privileges = caller.privileges()
    if _sgid_must_go(mode, file_gid, privileges):
        kill |= stat.S_ISGID
    if not kill or privileges.fsetid:
        return mode
    return mode & ~kill


def mode_after_chown(mode: int) -> int:
    """``mode`` after a chown of a non-directory, by anyone."""
    if stat.S_ISDIR(mode):
        return mode
    mode &= ~stat.S_ISUID
    if mode & stat.S_IXGRP:
        mode &= ~stat.S_ISGID
    return mode


def inherit_group(parent: Inode, mode: int, gid: int) -> tuple[int, int]:
    """(mode, gid) of a new entry under ``parent``: a setgid directory gives
    its group, and its setgid bit to a new subdirectory."""
    if not parent.mode & stat.S_ISGID:
        return mode, gid
    if stat.S_ISDIR(mode):
        mode |= stat.S_ISGID
    return mode, parent.gid
