"""Is a snapshot still readable?  Its recorded versions, checked against the
versions the bucket keeps now.

A snapshot never keeps objects alive by itself: the bucket's versioning and
its lifecycle rules (a noncurrent-version expiry) decide how long a recorded
version stays.  ``gone_versions`` names the recorded entries whose version
the bucket no longer has, in one pass: the record's entries and a listing of
the bucket's versions are both in key order, and are merged segment by
segment.  The segments are the record's paths, each as the file at its key
and the tree below ``path/``; taken in the order of their starting keys,
they cover disjoint, ordered ranges of keys, so the record's entries come
segment after segment.

On a bucket without versions nothing is recorded with a version, and this
finds nothing: there, a read of an object changed since fails on its ETag.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tierfs.store import ObjectStore

from .record import SnapshotEntry
from .walk import KeyedVersions, is_tree, segments


def gone_versions(
    store: ObjectStore, paths: Iterable[str], entries: Iterable[SnapshotEntry]
) -> Iterator[SnapshotEntry]:
    """The entries of a record (of ``paths``, key order) whose recorded
    version the bucket no longer keeps."""
    pending = iter(entries)
    entry = next(pending, None)
    for start in segments(paths):
        if entry is None:
            return
        versions: KeyedVersions | None = None
        while entry is not None and _in_segment(entry.key, start):
            if entry.version is not None:
                if versions is None:
                    versions = KeyedVersions(store.versions(start))
                if entry.version not in {v.version_id for v in versions.of(entry.key)}:
                    yield entry
            entry = next(pending, None)


def _in_segment(key: str, start: str) -> bool:
    return key.startswith(start) if is_tree(start) else key == start
