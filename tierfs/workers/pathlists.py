"""Lists of paths sent to the daemon (preload lists, prefetch orders) and
the records a preload's scan writes: checked and made relative to the mount
root (``normalize_path``), and spooled to an unnamed file in the state
directory (``PathSpool``), so that memory holds a chunk of a list, never
the list.

Records, not lines.  A file name may hold any byte but ``/`` and NUL, a
newline too, so no separator can split a spool safely: each record is its
length (4 bytes, big-endian) and then its bytes (text encoded with
``surrogateescape``, so names that are not UTF-8 round-trip).  Whatever a
record holds, reading it back gives exactly that record, never two.

Bounds (``SpoolBudget``, one per daemon, shared by the preload and prefetch
workers).  The state disk also holds LMDB and the journal: a full state
disk is a node down.  So every byte is counted BEFORE it is written:

* per user (the spool's owner, not root): at most ``SPOOL_BYTES_PER_USER``
  in all of that user's spools at once (lists, orders, a preload's scan);
* for everyone, root too: the state disk keeps ``reserve_bytes`` free
  (looked at every ``FREE_CHECK_BYTES`` written, and for the first record).

A record past either bound raises ``SpoolFull`` and writes nothing; the
spool's bytes are given back when it is closed.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tierfs.errors import InvalidArgument, QuotaExceeded
from tierfs.tally import Tally

#: Bad lines named when a list is rejected; more are counted only.
BAD_LINES_NAMED = 20
#: Records read from a spool between two yields to the loop.
SPOOL_BATCH = 256
#: Bytes of a spool read at a time by a reader that follows the writer
#: (``PathSpool.take``).
TAKE_BYTES = 64 * 1024
#: Bytes one user's spools may hold on the state disk at once.
SPOOL_BYTES_PER_USER = 512 * 1024 * 1024
#: The state disk's free space is looked at again after this many bytes.
FREE_CHECK_BYTES = 1024 * 1024
#: At most this much of the state disk is kept free from spools ...
RESERVE_MAX = 1024 * 1024 * 1024
#: ... or this fraction of its size, whichever is smaller.
RESERVE_FRACTION = 0.10

_LENGTH = struct.Struct(">I")


def normalize_path(path: str, mountpoint: str | None) -> str:
    """A path of a list made relative to the mount root, or InvalidArgument
    with the reason.  Absolute paths must lie inside ``mountpoint``;
    ``..`` components and NUL are refused (a newline is a byte of a name
    like any other); ``.`` and empty components are dropped ("" is the
    mount root)."""
    if "\x00" in path:
        raise InvalidArgument("contains a NUL byte")
    if path.startswith("/"):
        root = (mountpoint or "").rstrip("/")
        if not root or not (path == root or path.startswith(root + "/")):
            raise InvalidArgument(f"is outside the mount ({mountpoint or 'unknown'})")
        path = path[len(root) :]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument("has a '..' component")
    return "/".join(parts)


class SpoolFull(QuotaExceeded):
    """A spool would pass its owner's bound or eat the state disk's reserve."""


@dataclass
class SpoolBudget:
    """The bytes spooled per owner, and the state disk's reserve (see the
    module docstring)."""

    per_user: int = SPOOL_BYTES_PER_USER
    #: Bytes the state disk keeps free (None: ``RESERVE_FRACTION`` of its
    #: size, at most ``RESERVE_MAX``, worked out at the first look).
    reserve_bytes: int | None = None
    used: Tally = field(default_factory=Tally)
    _unchecked: int = 0

    def charge(self, owner: int, nbytes: int, directory: Path) -> None:
        """Count ``nbytes`` more for ``owner`` or raise ``SpoolFull``."""
        held = self.used.get(owner, 0)
        if owner != 0 and held + nbytes > self.per_user:
            raise SpoolFull(
                f"uid {owner}'s lists and orders would hold more than {self.per_user} bytes "
                "on the daemon's state disk, the most one user may; nothing more was taken"
            )
        if self._unchecked == 0 or self._unchecked + nbytes >= FREE_CHECK_BYTES:
            self._check_free(directory, nbytes)
            self._unchecked = 0
        self._unchecked += nbytes
        self.used[owner] = held + nbytes

    def release(self, owner: int, nbytes: int) -> None:
        self.used.take(owner, nbytes)

    def _check_free(self, directory: Path, nbytes: int) -> None:
        try:
            stats = os.statvfs(directory)
        except OSError:
            return  # the write itself will say what is wrong
        if self.reserve_bytes is None:
            size = stats.f_blocks * stats.f_frsize
            self.reserve_bytes = min(RESERVE_MAX, int(size * RESERVE_FRACTION))
        free = stats.f_bavail * stats.f_frsize
        if free - nbytes < self.reserve_bytes:
            raise SpoolFull(
                f"the daemon's state disk has {free} bytes free and keeps {self.reserve_bytes} "
                "for its metadata and journal: no list or order can be taken now"
            )


class PathSpool:
    """Records of text in an unnamed temporary file: written once, then
    read back record by record (see the module docstring)."""

    def __init__(
        self, directory: Path, *, budget: SpoolBudget | None = None, owner: int = 0
    ) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._directory = directory
        self._budget = budget
        self._owner = owner
        # Closed by ``close`` when the job ends (it outlives any one block).
        self._file: IO[bytes] = tempfile.TemporaryFile(  # noqa: SIM115
            dir=directory, prefix="spool-"
        )
        self.count = 0
        #: Bytes written (and charged to the owner).
        self.nbytes = 0
        #: ``take``'s place in the file, and the start of a record not complete there.
        self._taken_to = 0
        self._partial = b""

    def add(self, record: str) -> None:
        """Append one record (any text; ``SpoolFull`` past the bounds)."""
        data = record.encode(errors="surrogateescape")
        size = _LENGTH.size + len(data)
        if self._budget is not None:
            self._budget.charge(self._owner, size, self._directory)
        self.nbytes += size
        self._file.write(_LENGTH.pack(len(data)) + data)
        self.count += 1

    def lines(self) -> Iterator[str]:
        """Every record, from the first."""
        self._file.flush()
        self._file.seek(0)
        read = self._file.read
        while header := read(_LENGTH.size):
            (length,) = _LENGTH.unpack(header)
            yield read(length).decode(errors="surrogateescape")

    def take(self) -> list[str]:
        """The records added since the last ``take`` (at most about
        ``TAKE_BYTES`` of them): a reader that follows the writer while it
        writes.  Does not move the writer."""
        self._file.flush()
        while True:
            chunk = os.pread(self._file.fileno(), TAKE_BYTES, self._taken_to)
            self._taken_to += len(chunk)
            data = self._partial + chunk
            records, used = _split_records(data)
            self._partial = data[used:]
            # A record longer than one chunk: read on, so that an empty
            # result always means that nothing complete was added.
            if records or len(chunk) < TAKE_BYTES:
                return records

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        if self._budget is not None:
            self._budget.release(self._owner, self.nbytes)


def _split_records(data: bytes) -> tuple[list[str], int]:
    """The complete records at the start of ``data`` and the bytes they take."""
    records = []
    at = 0
    while at + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, at)
        end = at + _LENGTH.size + length
        if end > len(data):
            break
        records.append(data[at + _LENGTH.size : end].decode(errors="surrogateescape"))
        at = end
    return records, at
