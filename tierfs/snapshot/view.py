"""A snapshot as a store: what a snapshot mount lists and reads.

A snapshot mount runs the ordinary file system (``tierfs.core``) over a
``SnapshotStore``: an ``ObjectStore`` whose listings and HEADs are answered
from the snapshot's record, never by the bucket, and whose reads go to the
bucket for the recorded bytes.  So the read path, the cache, preload and
prefetch are the ones every mount uses, and nothing in the core knows about
snapshots.  (The alternative, loading the record into the mount's metadata
database at mount time, would make a 10-million-object snapshot wait for
10 million inserts before its first ``ls``; here a directory costs what its
own listing costs.)

What it answers:

- ``list_pages(prefix)``: the recorded keys directly under ``prefix`` and
  the recorded sub-directories, in key order, pages as S3 gives them; the
  shadow prefix (``.tierfs-attrs/<dir>/``) lists one shadow entry per
  recorded child with stored attributes, so the mount shows the recorded
  modes and owners through its usual attribute path.
- ``head(key)``: the recorded size, ETag and mtime (``ObjectNotFound`` for a
  name the snapshot does not hold).
- ``get_range`` / ``get_range_into``: the bucket's bytes of the recorded
  version (``GetObject`` with its version ID), or, on a bucket that keeps
  no versions, of the current object if its ETag is still the recorded one
  (``If-Match``).  An object changed since (``PreconditionFailed``) or a
  version the bucket no longer keeps (``ObjectNotFound``) fails the read;
  the error names the object and the snapshot, and is logged.
- Every change (put, copy, delete) is refused: a snapshot is immutable.

So after the index is built a snapshot mount sends no ``ListObjectsV2`` and
no ``HeadObject`` at all; only ``GetObject``.

The index (``SnapshotIndex``): the record's entries in an SQLite table keyed
by the UTF-8 key (a BLOB, compared bytewise: S3's order), built once per node
and snapshot from the record (one pass over its parts, checked against the
manifest) and then only read.  SQLite rather than LMDB: an S3 key may be
1024 bytes and LMDB's keys stop at 511.  Built into a temporary file and
renamed, so a killed build leaves no index that looks whole; an index whose
manifest stamp differs from the snapshot's (a snapshot deleted and made
again under the name) is built again.  Reads take a read-only connection from a
small pool for each query (the store's methods run in worker threads, which
come and go).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tierfs.core.names.shadow import SHADOW_ROOT, ShadowAttrs, shadow_dir_prefix
from tierfs.errors import ObjectNotFound, PreconditionFailed, ReadOnly
from tierfs.store import ListPage, ObjectInfo, ObjectStore, ObjectVersion, UploadInfo

from .record import Manifest, RecordStore, SnapshotDamaged, SnapshotEntry

log = logging.getLogger(__name__)

#: Rows fetched per query of a listing.
_BATCH = 1000
#: Objects whose lost bytes are logged (each once), at most.
_LOGGED_KEYS = 10_000


class SnapshotReadOnly(ReadOnly):
    """A change asked of a snapshot (they are immutable)."""


class RecordedVersionGone(ObjectNotFound):
    """The bucket no longer holds the recorded bytes of an object."""


def manifest_stamp(manifest: Manifest) -> str:
    """What identifies one record: the same name made again differs."""
    return json.dumps([manifest.created, [p.xxh3 for p in manifest.parts]])


class SnapshotIndex:
    """The entries of one snapshot, by key (see the module docstring)."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest
        #: Connections not in use (at most one per thread that queries at once).
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, records: RecordStore, manifest: Manifest) -> SnapshotIndex:
        """The index at ``path``, built from the record first unless one
        of this very record is there."""
        if _stamp_of(path) != manifest_stamp(manifest):
            _build(path, records, manifest)
        return cls(path, manifest)

    def _query(self, sql: str, args: Sequence[Any]) -> list[Any]:
        """All rows of one query, on a connection of the pool (a thread
        takes one for the query and gives it back: threads come and go)."""
        with self._lock:
            db = self._idle.pop() if self._idle else None
        if db is None:
            db = sqlite3.connect(
                f"file:{self.path}?mode=ro&immutable=1", uri=True, check_same_thread=False
            )
        try:
            return db.execute(sql, args).fetchall()
        finally:
            with self._lock:
                self._idle.append(db)

    def close(self) -> None:
        with self._lock:
            for db in self._idle:
                db.close()
            self._idle.clear()

    def get(self, key: str) -> SnapshotEntry | None:
        rows = self._query("SELECT line FROM entries WHERE key = ?", (key.encode(),))
        return SnapshotEntry.from_line(rows[0][0]) if rows else None

    def children(self, prefix: str) -> Iterator[SnapshotEntry | str]:
        """What a delimited listing of ``prefix`` shows, in key order: the
        entries directly under it (its own marker first, if recorded) and
        each sub-directory's prefix (a ``str`` ending in "/")."""
        low = prefix.encode()
        high = _after_prefix(low)
        while True:
            query = "SELECT key, line FROM entries WHERE key >= ?"
            args: list[bytes | int] = [low]
            if high is not None:
                query += " AND key < ?"
                args.append(high)
            rows = self._query(query + " ORDER BY key LIMIT ?", [*args, _BATCH])
            if not rows:
                return
            for key, line in rows:
                rest = key[len(prefix.encode()) :]
                slash = rest.find(b"/")
                if slash < 0:
                    yield SnapshotEntry.from_line(line)
                    low = key + b"\0"
                    continue
                sub = key[: len(key) - len(rest) + slash + 1]
                yield sub.decode()
                # Skip the sub-directory's keys: every one sorts below sub[:-1] + "0".
                low = sub[:-1] + b"0"
                break
            else:
                if len(rows) < _BATCH:
                    return


def _after_prefix(prefix: bytes) -> bytes | None:
    """The least key above every key that starts with ``prefix`` (None: none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _stamp_of(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM about WHERE name = 'stamp'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def _build(path: Path, records: RecordStore, manifest: Manifest) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    building = path.with_name(path.name + ".building")
    with contextlib.suppress(FileNotFoundError):
        building.unlink()
    db = sqlite3.connect(building)
    try:
        db.execute("PRAGMA journal_mode = OFF")
        db.execute("PRAGMA synchronous = OFF")
        db.execute("CREATE TABLE about (name TEXT PRIMARY KEY, value TEXT)")
        db.execute("CREATE TABLE entries (key BLOB PRIMARY KEY, line BLOB) WITHOUT ROWID")
        count = 0
        last = b""

        def rows() -> Iterator[tuple[bytes, bytes]]:
            nonlocal count, last
            for entry in records.entries(manifest):
                key = entry.key.encode()
                if count and key <= last:
                    raise SnapshotDamaged(
                        f"snapshot {manifest.name!r}: entries out of key order at {entry.key!r}"
                    )
                last = key
                count += 1
                yield key, entry.to_line()

        db.executemany("INSERT INTO entries VALUES (?, ?)", rows())
        if count != manifest.objects:
            raise SnapshotDamaged(
                f"snapshot {manifest.name!r}: {count} entries, the manifest says {manifest.objects}"
            )
        db.execute("INSERT INTO about VALUES ('stamp', ?)", (manifest_stamp(manifest),))
        db.commit()
    except BaseException:
        db.close()
        with contextlib.suppress(FileNotFoundError):
            building.unlink()
        raise
    db.close()
    os.replace(building, path)


class SnapshotStore:
    """An ``ObjectStore`` showing one snapshot (see the module docstring).

    ``inner`` is the bucket's store; ``shadow_below`` the access root the
    mount's shadow keys carry ("" for a full mount)."""

    def __init__(self, inner: ObjectStore, index: SnapshotIndex, *, shadow_below: str = "") -> None:
        self.inner = inner
        self.index = index
        self.name = index.manifest.name
        self.url = inner.url
        self.shadow_below = shadow_below
        #: Keys whose lost bytes were logged (each once; a reader may retry).
        self._logged: set[str] = set()

    # -- what a mount asks -------------------------------------------------

    def check(self) -> None:
        self.inner.check()

    def key_fits(self, key: str) -> bool:
        return self.inner.key_fits(key)

    def reserved(self, key: str) -> bool:
        return self.inner.reserved(key)

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[ListPage]:
        shadow_root = f"{SHADOW_ROOT}/{self.shadow_below}"
        if prefix.startswith(shadow_root):
            yield from _pages(self._shadow_items(prefix[len(shadow_root) :]), page_size)
        elif prefix.split("/", 1)[0] == SHADOW_ROOT:
            return  # a shadow prefix outside this mount's: nothing recorded there
        else:
            yield from _pages(self._data_items(prefix), page_size)

    def _data_items(self, prefix: str) -> Iterator[ObjectInfo | str]:
        for item in self.index.children(prefix):
            yield item if isinstance(item, str) else _info(item)

    def _shadow_items(self, dir_prefix: str) -> Iterator[ObjectInfo | str]:
        """One shadow entry per child of ``dir_prefix`` with stored
        attributes (a sub-directory's come from its recorded marker)."""
        shadow_prefix = shadow_dir_prefix(self.shadow_below + dir_prefix)
        for item in self.index.children(dir_prefix):
            entry = self.index.get(item) if isinstance(item, str) else item
            if entry is None or entry.mode is None or entry.key == dir_prefix:
                continue
            attrs = ShadowAttrs(entry.mode & 0o7777, entry.uid or 0, entry.gid or 0)
            name = entry.key[len(dir_prefix) :].rstrip("/")
            yield ObjectInfo(f"{shadow_prefix}{name}{attrs.suffix()}", 0, "", entry.mtime)

    def head(self, key: str) -> ObjectInfo:
        entry = self.index.get(key)
        if entry is None:
            raise ObjectNotFound(f"{key!r} is not in snapshot {self.name!r}")
        info = _info(entry)
        if entry.mode is not None:
            metadata = {"mode": str(entry.mode), "uid": str(entry.uid or 0)}
            metadata["gid"] = str(entry.gid or 0)
            metadata["mtime"] = repr(entry.mtime)
            info = ObjectInfo(info.key, info.size, info.etag, info.mtime, metadata)
        return info

    def get_range(
        self,
        key: str,
        start: int,
        length: int,
        etag: str | None = None,
        *,
        version: str | None = None,
    ) -> bytes:
        entry = self._recorded(key)
        return self._read(
            entry,
            lambda: self.inner.get_range(
                key, start, length, None if entry.version else entry.etag, version=entry.version
            ),
        )

    def get_range_into(
        self,
        key: str,
        start: int,
        bufs: Sequence[memoryview],
        etag: str | None = None,
        *,
        stop: Callable[[], bool] | None = None,
        version: str | None = None,
    ) -> int:
        entry = self._recorded(key)
        return self._read(
            entry,
            lambda: self.inner.get_range_into(
                key,
                start,
                bufs,
                None if entry.version else entry.etag,
                stop=stop,
                version=entry.version,
            ),
        )

    def _recorded(self, key: str) -> SnapshotEntry:
        entry = self.index.get(key)
        if entry is None:
            raise ObjectNotFound(f"{key!r} is not in snapshot {self.name!r}")
        return entry

    def _read(self, entry: SnapshotEntry, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except PreconditionFailed:
            message = (
                f"snapshot {self.name!r}: {entry.key} changed in {self.url} since the "
                "snapshot was taken, and the bucket keeps no versions: its recorded "
                "bytes are gone"
            )
            self._log_once(entry.key, message)
            raise PreconditionFailed(message) from None
        except ObjectNotFound:
            if entry.version:
                what = f"no longer keeps the recorded version {entry.version} of {entry.key}"
            else:
                what = f"no longer holds {entry.key}, and keeps no versions"
            message = f"snapshot {self.name!r}: {self.url} {what}"
            self._log_once(entry.key, message)
            raise RecordedVersionGone(message) from None

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged and len(self._logged) < _LOGGED_KEYS:
            self._logged.add(key)
            log.error("%s", message)

    def versioning(self) -> bool:
        return self.index.manifest.versioned

    def current_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        return iter(())

    def versions(self, prefix: str) -> Iterator[ObjectVersion]:
        return iter(())

    def list_uploads(self, prefix: str = "") -> list[UploadInfo]:
        return []

    def abort_upload(self, key: str, upload_id: str) -> None:
        return None

    def close(self) -> None:
        self.index.close()
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    # -- changes: refused ------------------------------------------------

    def _refuse(self, *_args: Any, **_kwargs: Any) -> Any:
        raise SnapshotReadOnly(f"snapshot {self.name!r} is read-only")

    put = put_multipart = copy = delete = delete_many = _refuse

    def __getattr__(self, name: str) -> Any:
        # What a mount may ask beyond the protocol (pool sizes, the request
        # counter's engine names): the bucket's store answers.
        return getattr(self.inner, name)


def _info(entry: SnapshotEntry) -> ObjectInfo:
    return ObjectInfo(entry.key, entry.size, entry.etag, entry.mtime)


def _pages(items: Iterable[ObjectInfo | str], page_size: int) -> Iterator[ListPage]:
    """Pages of at most ``page_size`` items; one empty page for nothing, as S3."""
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    pages = 0
    for item in items:
        if isinstance(item, str):
            prefixes.append(item)
        else:
            objects.append(item)
        if len(objects) + len(prefixes) >= page_size:
            yield ListPage(objects, prefixes)
            objects, prefixes = [], []
            pages += 1
    if objects or prefixes or not pages:
        yield ListPage(objects, prefixes)
