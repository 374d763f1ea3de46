"""Borrowed files: bytes another cache on this node holds, read in place.

A mount of a snapshot runs beside the node's live mount of the same bucket
(``tierfs.snapshot.mount``).  Most of what a snapshot names is, at that
moment, the same object version the live mount has cached: the same ETag
is the same bytes.  Instead of fetching and caching those bytes a second
time, ``TierFS.open`` asks the mount's ``Lender`` for the file: a lender
answers with a ``Borrowed`` file when it holds every byte of that version
(its ETag and size match), else None, and then the file is read as any
other (its own cache, the bucket).

Invariants:

- A file is borrowed only whole, only at the version the inode names
  (ETag and size checked by the lender against what it hands out), only
  for a reading open of a clean file that has no block in this mount's
  cache (a file this mount started to cache goes on from there).
- A borrowed handle's reads never touch this mount's cache or the
  bucket: ``Borrowed.pread`` reads the lender's bytes, which stay what
  they were while the handle is open (the lender's lease), even if the
  lender's file is evicted or replaced meanwhile.
- ``close`` gives the lease back; it is called once, at release.

``lend`` and ``pread`` block (a socket round trip, a disk read): they run
in threads.  A lender that fails answers None (the file is read as any
other), never an error.
"""

from __future__ import annotations

from typing import Protocol


class Borrowed(Protocol):
    """One file borrowed from a lender (see the module docstring)."""

    def pread(self, size: int, offset: int) -> bytes:
        """Thread: bytes ``[offset, offset + size)``, clipped at the file's end."""
        ...

    def close(self) -> None: ...


class Lender(Protocol):
    def lend(self, relpath: str, etag: str, size: int) -> Borrowed | None:
        """Thread: the file at ``relpath`` (from the mount root) if the
        lender holds all of it at that ETag and size, else None."""
        ...
