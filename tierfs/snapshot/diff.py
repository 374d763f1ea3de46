"""What differs between two views of a bucket: a snapshot and another
snapshot, or a snapshot and the bucket as it is now.

Both sides are streams of ``SnapshotEntry`` in key order (a record's
entries, or ``walk_entries`` of the live bucket), so one pass with one entry
of each side in hand finds every difference; nothing is held whole, however
many objects the views have.

A name is **added** (only in the newer view), **removed** (only in the
older), or **changed**: in both, with another version, another ETag or
another size, or other stored mode, owner or group.  Two entries with the
same version ID are the same object whatever else differs; without version
IDs (a bucket that keeps none, or the live side) the ETag and the size
decide.  The mtime alone never makes a change: a listing and a HEAD may
report different ones for the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from .record import SnapshotEntry

Change = Literal["added", "removed", "changed"]


@dataclass(frozen=True, slots=True)
class Difference:
    change: Change
    key: str
    old: SnapshotEntry | None
    new: SnapshotEntry | None


def differs(old: SnapshotEntry, new: SnapshotEntry) -> bool:
    """Are ``old`` and ``new`` (one key) different objects or attributes?"""
    if (old.mode, old.uid, old.gid) != (new.mode, new.uid, new.gid):
        return True
    if old.version is not None and new.version is not None:
        return old.version != new.version
    return (old.etag, old.size) != (new.etag, new.size)


def diff_entries(
    older: Iterable[SnapshotEntry], newer: Iterable[SnapshotEntry]
) -> Iterator[Difference]:
    """Every difference from ``older`` to ``newer``, in key order."""
    olds, news = iter(older), iter(newer)
    old, new = next(olds, None), next(news, None)
    while old is not None or new is not None:
        if new is None or (old is not None and old.key.encode() < new.key.encode()):
            assert old is not None
            yield Difference("removed", old.key, old, None)
            old = next(olds, None)
        elif old is None or new.key.encode() < old.key.encode():
            yield Difference("added", new.key, None, new)
            new = next(news, None)
        else:
            if differs(old, new):
                yield Difference("changed", old.key, old, new)
            old, new = next(olds, None), next(news, None)
