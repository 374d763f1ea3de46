"""Lists of paths sent to the daemon (preload lists, prefetch orders):
checked and made relative to the mount root (``normalize_path``), and
spooled to an unnamed file in the state directory (``PathSpool``), so that
memory holds a chunk of a list, never the list.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tierfs.errors import InvalidArgument

#: Bad lines named when a list is rejected; more are counted only.
BAD_LINES_NAMED = 20
#: Lines read from a spool between two yields to the loop.
SPOOL_BATCH = 256
#: Bytes of the file spool read at a time by a reader that follows the
#: writer (``PathSpool.take``).
TAKE_BYTES = 64 * 1024


def normalize_path(path: str, mountpoint: str | None) -> str:
    """A preload path made relative to the mount root, or InvalidArgument
    with the reason.  Absolute paths must lie inside ``mountpoint``;
    ``..`` components, NUL and newlines are refused; ``.`` and empty
    components are dropped ("" is the mount root)."""
    if "\x00" in path:
        raise InvalidArgument("contains a NUL byte")
    if "\n" in path or "\r" in path:
        raise InvalidArgument("contains a line break")
    if path.startswith("/"):
        root = (mountpoint or "").rstrip("/")
        if not root or not (path == root or path.startswith(root + "/")):
            raise InvalidArgument(f"is outside the mount ({mountpoint or 'unknown'})")
        path = path[len(root) :]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument("has a '..' component")
    return "/".join(parts)


class PathSpool:
    """Lines of text in an unnamed temporary file: written once, then read
    back line by line (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Closed by ``close`` when the job ends (it outlives any one block).
        self._file: IO[bytes] = tempfile.TemporaryFile(  # noqa: SIM115
            dir=directory, prefix="preload-"
        )
        self.count = 0
        #: ``take``'s place in the file, and the start of a line not complete there.
        self._taken_to = 0
        self._partial = b""

    def add(self, line: str) -> None:
        self._file.write(line.encode(errors="surrogateescape") + b"\n")
        self.count += 1

    def lines(self) -> Iterator[str]:
        self._file.flush()
        self._file.seek(0)
        for raw in self._file:
            yield raw[:-1].decode(errors="surrogateescape")

    def take(self) -> list[str]:
        """The lines added since the last ``take`` (at most about
        ``TAKE_BYTES`` of them): a reader that follows the writer while it
        writes.  Does not move the writer."""
        self._file.flush()
        while True:
            chunk = os.pread(self._file.fileno(), TAKE_BYTES, self._taken_to)
            self._taken_to += len(chunk)
            *complete, self._partial = (self._partial + chunk).split(b"\n")
            # A line longer than one chunk: read on, so that an empty result
            # always means that nothing complete was added.
            if complete or len(chunk) < TAKE_BYTES:
                return [raw.decode(errors="surrogateescape") for raw in complete]

    def close(self) -> None:
        self._file.close()
