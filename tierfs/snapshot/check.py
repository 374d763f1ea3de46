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

from tierfs.store import ObjectStore, ObjectVersion

from .record import SnapshotEntry


def segments(paths: Iterable[str]) -> list[str]:
    """The key prefixes to list for ``paths``: "" for the whole bucket, else
    each path's own key and ``path/``, in key order."""
    roots = list(paths)
    if "" in roots or not roots:
        return [""]
    return sorted({part for root in roots for part in (root, f"{root}/")}, key=str.encode)


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
        is_file = start != "" and not start.endswith("/")
        versions: _Versions | None = None
        while entry is not None and _in_segment(entry.key, start, is_file):
            if entry.version is not None:
                if versions is None:
                    versions = _Versions(store.versions(start))
                if entry.version not in versions.of(entry.key):
                    yield entry
            entry = next(pending, None)


def _in_segment(key: str, start: str, is_file: bool) -> bool:
    return key == start if is_file else key.startswith(start)


class _Versions:
    """A key-ordered stream of versions, read one key's versions at a time."""

    def __init__(self, stream: Iterator[ObjectVersion]) -> None:
        self.stream = stream
        self.head = next(stream, None)

    def of(self, key: str) -> set[str]:
        wanted = key.encode()
        while self.head is not None and self.head.key.encode() < wanted:
            self.head = next(self.stream, None)
        found: set[str] = set()
        while self.head is not None and self.head.key == key:
            found.add(self.head.version_id)
            self.head = next(self.stream, None)
        return found
