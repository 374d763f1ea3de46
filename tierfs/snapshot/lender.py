"""The live mount a snapshot mount borrows files from (``core.read.lender``).

A snapshot mount and the node's live mount of the same bucket hold the
same bytes for every object not changed since the snapshot.  The live
mount's daemon hands out its warm files (``tierfs.client``'s fast reads:
a read-only descriptor of the tier file, under a lease that keeps its
bytes while it is held, with the version's ETag); ``LiveMountLender``
asks it for each file a snapshot mount opens with nothing cached, and
lends it when the ETag and the size are the recorded ones.  The bytes are
then read in place: no second copy on the node, no request to the bucket.

Which mount: the live mount of the same config, the one a snapshot mount
runs beside: in this node's mount table, of type ``fuse.tierfs``, whose
source is exactly the snapshot's backing URL (a snapshot mount's source
has ``?snapshot=`` after it, so none lends to another), mounted by this
daemon's own user (``user_id=``) with a control socket that user owns (any
local user may run a FUSE daemon of that name and type, and the bytes it
lent would reach every reader of the snapshot), and whose tiers
(``status``) are the directories the snapshot's own cache lies in.  It is
looked for at the first open and again at most every ``RETRY_SECONDS``
while there is none, or after its connection broke (the live mount went
away).

Threads: ``lend`` runs in worker threads; the reader connection is
thread-safe (one request at a time).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

from tierfs.control.client import locate, request
from tierfs.control.fastread import ReaderConnection, TierFile
from tierfs.errors import TierfsError
from tierfs.text import mount_source

log = logging.getLogger(__name__)

#: Seconds between two looks for a live mount while there is none.
RETRY_SECONDS = 10.0
MOUNTINFO = Path("/proc/self/mountinfo")
#: Seconds a live mount has to answer ``status`` when it is looked for.
STATUS_TIMEOUT = 5.0


class LentFile:
    """A file of the live mount, read in place (``core.read.lender.Borrowed``)."""

    def __init__(self, opened: BinaryIO) -> None:
        #: The buffered file ``ReaderConnection.open`` gave (dropping it
        #: would close the tier file) and the raw one, read with pread.
        self.opened = opened
        self.file: TierFile = opened.raw  # type: ignore[attr-defined]

    def pread(self, size: int, offset: int) -> bytes:
        return self.file.pread(size, offset)

    def close(self) -> None:
        self.opened.close()


class LiveMountLender:
    """Lends the warm files of this node's live mount of ``backing_url``."""

    def __init__(
        self, backing_url: str, tier_paths: list[str], mountinfo: Path = MOUNTINFO
    ) -> None:
        """``tier_paths``: the live mount's tier directories, in order."""
        self.source = mount_source(backing_url)
        self.tier_paths = tier_paths
        self.mountinfo = mountinfo
        self._lock = threading.Lock()
        self._connection: ReaderConnection | None = None
        self._looked_at = -RETRY_SECONDS
        #: Opens lent, and those the live mount could not (other version, not warm).
        self.lent = 0
        self.declined = 0

    def lend(self, relpath: str, etag: str, size: int) -> LentFile | None:
        connection = self._live()
        if connection is None:
            return None
        opened = connection.open(relpath, relpath)
        if opened is None:
            self.declined += 1
            return None
        lent = LentFile(opened)
        if lent.file.etag != etag or lent.file.size != size:
            lent.close()
            self.declined += 1
            return None
        self.lent += 1
        return lent

    def _live(self) -> ReaderConnection | None:
        with self._lock:
            if self._connection is not None and not self._connection.broken:
                return self._connection
            if self._connection is not None:
                log.info("the live mount stopped lending (%s)", self._connection.why)
                self._connection.close()
                self._connection = None
            now = time.monotonic()
            if now - self._looked_at < RETRY_SECONDS:
                return None
            self._looked_at = now
            mountpoint = self._find()
            if mountpoint is None:
                return None
            try:
                self._connection = ReaderConnection(locate(mountpoint))
            except (OSError, TierfsError) as exc:
                log.info("the live mount at %s lends nothing: %s", mountpoint, exc)
                return None
            log.info(
                "files not changed since the snapshot are read from the live mount at %s",
                mountpoint,
            )
            return self._connection

    def _find(self) -> str | None:
        """The mount point of the live mount of the same config, if any."""
        try:
            lines = self.mountinfo.read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in lines:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            live = len(tail) >= 2 and tail[0] == "fuse.tierfs" and tail[1] == self.source
            # Any local user may run a FUSE daemon and name it so: only a
            # mount made by this daemon's own user is trusted with the bytes.
            ours = len(tail) >= 3 and f"user_id={os.geteuid()}" in tail[2].split(",")
            if live and ours and len(fields) >= 5 and self._same_tiers(_unescape(fields[4])):
                return _unescape(fields[4])
        return None

    def _same_tiers(self, mountpoint: str) -> bool:
        try:
            socket_path = locate(mountpoint).socket_path
            if not _owned_by_us(socket_path):
                return False
            status = request(socket_path, "status", timeout=STATUS_TIMEOUT)
            return [tier["path"] for tier in status["tiers"]] == self.tier_paths
        except (OSError, TierfsError, KeyError, TypeError):
            return False

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _owned_by_us(socket_path: str) -> bool:
    """Is the control socket, and the directory it lies in, this user's own
    and writable by no one else (a daemon of this user made it)?"""
    try:
        for path in (socket_path, os.path.dirname(socket_path)):
            st = os.lstat(path)
            if st.st_uid != os.geteuid():
                return False
        return os.lstat(os.path.dirname(socket_path)).st_mode & 0o022 == 0
    except OSError:
        return False


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes."""
    out = bytearray()
    raw = field.encode(errors="surrogateescape")
    i = 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="surrogateescape")
