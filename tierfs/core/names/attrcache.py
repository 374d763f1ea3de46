"""Attributes of listed inodes, kept between readdir requests.

A warm ``find`` spends its time in readdir, and there, per entry, in
decoding the child's LMDB inode record (about twenty fields) and building
its ``Attributes``: 70% of a warm entry's cost in the daemon (measured on
400 entries, cProfile; see ``NameReads.readdir``).  This cache keeps the
``Attributes`` of each inode a listing handed out, so that the next
readdir of the same directory reads only the dentries.

Invariant: ``attributes(ino, record)`` returns what ``build`` makes of
``decode_inode(ino, record)``, for the record as it is stored now.

Invalidation happens in ``attributes`` itself, per inode, by the record:
each entry keeps the stored bytes of the inode record it was built from,
and serves only a caller that read the very same bytes (``MetaDB``
``read_dir_records`` reads them with the dentries, in the same read
transaction).  Any change of the inode (a chmod, a write that moved its
size or mtime, a listing that saw a new ETag or size, its access time
written back) rewrites its record, so the next call builds anew.  Comparing
about a hundred bytes costs a fraction of decoding them.  Nothing else
needs to tell the cache about changes: the dozens of places that write
inode records do not know it exists, and writes to other inodes, or to
other tables, leave its entries in use.

What the kernel sees that is *not* in the record is left to the caller
(``NameReads.readdir``), which does not ask the cache for such inodes: an
access time still pending in memory (``AccessTimes.pending``), an inode
removed while held (``UnlinkedInodes``), an expired listing (timeout 0).
``build`` depends on nothing else but the configuration, fixed for the
life of a ``TierFS``.

The attributes handed out are shared between calls: like every
``Attributes``, they are never changed once built, so the FUSE layer may
keep its conversion of them with them (``Attributes.converted``).

Memory: at most ``capacity`` inodes (``ATTRIBUTE_CACHE_ENTRIES``, about
600 bytes each with the record and the FUSE reply).  When it is full the
cache is emptied and fills again: entries of removed inodes (numbers are
never reused) go then, with no bookkeeping on removal.  A tree of more
than ``capacity`` inodes, read over and over, hits only for part of it.
"""

from __future__ import annotations

from collections.abc import Callable

from tierfs.meta import Inode
from tierfs.meta.records import decode_inode

from ..state.results import Attributes

#: Inodes whose attributes are kept (about 75 MiB with records and replies).
ATTRIBUTE_CACHE_ENTRIES = 131_072


class AttributeCache:
    """ino -> ``Attributes`` built from its inode record, with that record."""

    def __init__(
        self,
        build: Callable[[Inode], Attributes],
        capacity: int = ATTRIBUTE_CACHE_ENTRIES,
    ) -> None:
        self._build = build
        self._capacity = capacity
        self._entries: dict[int, tuple[bytes, Attributes]] = {}
        #: Calls answered from the cache, and calls that decoded the record.
        self.hits = 0
        self.misses = 0

    def attributes(self, ino: int, record: bytes) -> Attributes:
        """The attributes of ``ino`` whose stored inode record is ``record``."""
        cached = self._entries.get(ino)
        if cached is not None and cached[0] == record:
            self.hits += 1
            return cached[1]
        self.misses += 1
        attrs = self._build(decode_inode(ino, record))
        if cached is None and len(self._entries) >= self._capacity:
            self._entries.clear()
        self._entries[ino] = (record, attrs)
        return attrs

    def __len__(self) -> int:
        return len(self._entries)
