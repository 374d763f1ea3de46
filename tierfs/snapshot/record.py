"""A snapshot's record in the bucket: what it holds, how it is written and read.

A snapshot names the objects under some paths of a mount as the bucket held
them at one moment: for each, its key, size, ETag, version ID (where the
bucket keeps versions), mtime and stored mode, owner and group.  A snapshot
mount shows exactly those names, each at its recorded version.

Layout, under the backing's prefix (``SNAPSHOT_ROOT`` is one of the store's
``RESERVED_ROOTS``: no mount lists it, none lets it be made)::

    .tierfs-snapshots/<name>/part-000000.jsonl.gz   entries, sorted by key
    .tierfs-snapshots/<name>/part-000001.jsonl.gz
    ...
    .tierfs-snapshots/<name>/manifest.json          written last

Invariants:

- **A snapshot exists iff its manifest exists.**  The writer puts every part
  first and the manifest last, so a create that fails or is killed midway
  leaves parts that nothing lists as a snapshot (``RecordStore.leftovers``
  names them, ``RecordStore.delete`` removes them).
- **Complete means immutable.**  The writer refuses a name whose manifest
  exists; nothing rewrites a part or a manifest.  (Two creates of one new
  name at the same moment: the later manifest wins, and its parts are the
  ones it names, so the record it names is whole either way.)
- **A reader gets the record whole or an error.**  The manifest names each
  part with its entry count and the xxh3-64 of its compressed bytes; a part
  that is missing, short or changed fails the read with ``SnapshotDamaged``
  naming it.
- **Entries are in key order** (UTF-8 byte order, as S3 lists), within a
  part and from one part to the next, so a reader can merge or diff two
  records in one pass, and the mount can load directories in order.
- Parts hold at most ``PART_ENTRIES`` entries: 10 million objects are about
  100 parts of a few MB each (gzip'd JSON lines), written and read one at a
  time, never the whole record in memory.

State transitions of a name: absent -> parts written (not a snapshot) ->
manifest written (a snapshot, immutable) -> manifest deleted (not a
snapshot; parts left to delete) -> absent.  Delete removes the manifest
first, so a snapshot stops listing before any of its parts go.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import xxhash

from tierfs.errors import Exists, InvalidArgument, ObjectNotFound, TierfsError
from tierfs.store import SNAPSHOT_ROOT, ObjectStore

#: The record format; a reader refuses a manifest of another.
FORMAT = 1
#: Entries per part: about 2-4 MB compressed.
PART_ENTRIES = 100_000
MANIFEST = "manifest.json"
#: A manifest names one part per 100,000 objects (about 300 bytes each):
#: 10 million objects take about 30 KB.  A longer one is refused unread.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
#: A snapshot's name: what users type and what the mount option carries.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SnapshotExists(Exists):
    """A complete snapshot of that name exists already (they are immutable)."""


class SnapshotNotFound(ObjectNotFound):
    """No complete snapshot of that name."""


class SnapshotDamaged(TierfsError):
    """A part of the record is missing, short or not the bytes the manifest names."""


def check_name(name: str) -> str:
    """``name`` if it may name a snapshot, else ``InvalidArgument`` saying why."""
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(
            f"snapshot name {name!r}: use 1 to 128 letters, digits, '.', '_' or '-', "
            "starting with a letter or a digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """One recorded object.  ``key`` is relative to the backing's prefix.
    ``version`` is None on a bucket that keeps no versions (a read then
    checks the ETag).  ``mode``/``uid``/``gid`` are None where nothing was
    stored (the mount's defaults apply)."""

    key: str
    size: int
    etag: str
    mtime: float
    version: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    def to_line(self) -> bytes:
        record: dict[str, Any] = {"k": self.key, "s": self.size, "e": self.etag, "t": self.mtime}
        for short, value in (
            ("v", self.version),
            ("m", self.mode),
            ("u", self.uid),
            ("g", self.gid),
        ):
            if value is not None:
                record[short] = value
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> SnapshotEntry:
        """The entry of one line; ``ValueError`` for anything but what
        ``to_line`` writes (a record is read from a bucket others can write)."""
        try:
            record = json.loads(line)
            entry = cls(
                key=record["k"],
                size=record["s"],
                etag=record["e"],
                mtime=float(record["t"]),
                version=record.get("v"),
                mode=record.get("m"),
                uid=record.get("u"),
                gid=record.get("g"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a snapshot entry: {exc}") from None
        if not isinstance(entry.key, str) or not entry.key or "\0" in entry.key:
            raise ValueError(f"not a snapshot entry: key {entry.key!r}")
        if not isinstance(entry.size, int) or entry.size < 0 or not isinstance(entry.etag, str):
            raise ValueError(f"not a snapshot entry: size {entry.size!r}, etag {entry.etag!r}")
        if entry.version is not None and (not isinstance(entry.version, str) or not entry.version):
            raise ValueError(f"not a snapshot entry: version {entry.version!r}")
        for field_name, value, top in (
            ("mode", entry.mode, 0o177777),
            ("uid", entry.uid, (1 << 32) - 1),
            ("gid", entry.gid, (1 << 32) - 1),
        ):
            if value is not None and (not isinstance(value, int) or not 0 <= value <= top):
                raise ValueError(f"not a snapshot entry: {field_name} {value!r}")
        return entry


@dataclass(frozen=True, slots=True)
class PartInfo:
    key: str
    entries: int
    compressed_bytes: int
    xxh3: str
    first_key: str
    last_key: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """What ``snapshot list`` and ``show`` print, and where the parts are."""

    name: str
    created: float
    creator_uid: int
    backing: str
    paths: list[str]
    versioned: bool
    objects: int
    bytes: int
    parts: list[PartInfo] = field(default_factory=list)
    format: int = FORMAT

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise SnapshotDamaged(
                    f"{where}: record format {raw.get('format')!r}, this tierfs reads {FORMAT}"
                )
            raw["parts"] = [PartInfo(**part) for part in raw["parts"]]
            return cls(**raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise SnapshotDamaged(f"{where}: not a snapshot manifest ({exc})") from None


def record_prefix(name: str) -> str:
    return f"{SNAPSHOT_ROOT}/{check_name(name)}/"


class RecordWriter:
    """Writes one snapshot's record: ``add`` entries in key order, then
    ``finish`` (the manifest, which makes it a snapshot).  Not thread-safe:
    one writer per create, in one thread."""

    def __init__(
        self,
        store: ObjectStore,
        name: str,
        *,
        creator_uid: int,
        paths: Iterable[str],
        versioned: bool,
        part_entries: int = PART_ENTRIES,
    ) -> None:
        self.store = store
        self.prefix = record_prefix(name)
        self.name = name
        self.creator_uid = creator_uid
        self.paths = list(paths)
        self.versioned = versioned
        self.part_entries = part_entries
        self.parts: list[PartInfo] = []
        self.objects = 0
        self.bytes = 0
        self._pending: list[SnapshotEntry] = []
        self._last_key: str | None = None
        if _exists(store, self.prefix + MANIFEST):
            raise SnapshotExists(f"snapshot {name!r} exists already (snapshots are immutable)")

    def add(self, entry: SnapshotEntry) -> None:
        if self._last_key is not None and entry.key.encode() <= self._last_key.encode():
            raise ValueError(f"entries out of key order: {entry.key!r} after {self._last_key!r}")
        self._last_key = entry.key
        self._pending.append(entry)
        self.objects += 1
        self.bytes += entry.size
        if len(self._pending) >= self.part_entries:
            self._put_part()

    def finish(self) -> Manifest:
        """Put the last part and then the manifest: the snapshot exists from here on."""
        if self._pending:
            self._put_part()
        manifest = Manifest(
            name=self.name,
            created=time.time(),
            creator_uid=self.creator_uid,
            backing=self.store.url,
            paths=self.paths,
            versioned=self.versioned,
            objects=self.objects,
            bytes=self.bytes,
            parts=self.parts,
        )
        if _exists(self.store, self.prefix + MANIFEST):
            raise SnapshotExists(f"snapshot {self.name!r} was created meanwhile by another")
        self.store.put(self.prefix + MANIFEST, manifest.to_json())
        return manifest

    def _put_part(self) -> None:
        body = gzip.compress(b"".join(e.to_line() for e in self._pending), mtime=0)
        key = f"{self.prefix}part-{len(self.parts):06d}.jsonl.gz"
        self.store.put(key, body)
        self.parts.append(
            PartInfo(
                key=key,
                entries=len(self._pending),
                compressed_bytes=len(body),
                xxh3=xxhash.xxh3_64_hexdigest(body),
                first_key=self._pending[0].key,
                last_key=self._pending[-1].key,
            )
        )
        self._pending = []


class RecordStore:
    """The snapshots of one bucket (one backing): list, read, delete."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def names(self) -> list[str]:
        """Every complete snapshot's name, sorted (those with a manifest)."""
        return self.survey()[0]

    def leftovers(self) -> list[str]:
        """Names with parts and no manifest: creates that did not finish."""
        return self.survey()[1]

    def survey(self) -> tuple[list[str], list[str]]:
        """``names`` and ``leftovers`` from one listing of the names (one
        HEAD per name; a listing of a name without a manifest)."""
        names: list[str] = []
        leftovers: list[str] = []
        for candidate in self._prefixes():
            if _exists(self.store, f"{SNAPSHOT_ROOT}/{candidate}/{MANIFEST}"):
                names.append(candidate)
            elif self._has_objects(candidate):
                leftovers.append(candidate)
        return names, leftovers

    def _has_objects(self, name: str) -> bool:
        """Does anything remain under the name's prefix?  (A delimited
        listing may still name a prefix whose objects are all deleted:
        some servers list one that holds only delete markers.)"""
        return any(page.objects for page in self.store.list_pages(record_prefix(name), 1))

    def manifest(self, name: str) -> Manifest:
        key = record_prefix(name) + MANIFEST
        try:  # one GET, no HEAD first; a manifest is never this long
            data = self.store.get_range(key, 0, MAX_MANIFEST_BYTES + 1)
        except ObjectNotFound:
            raise SnapshotNotFound(f"no snapshot {name!r} in {self.store.url}") from None
        if len(data) > MAX_MANIFEST_BYTES:
            raise SnapshotDamaged(f"snapshot {name!r}: a manifest longer than {MAX_MANIFEST_BYTES}")
        return Manifest.from_json(data, f"snapshot {name!r}")

    def entries(self, manifest: Manifest) -> Iterator[SnapshotEntry]:
        """The record's entries in key order, one part in memory at a time;
        a damaged part raises ``SnapshotDamaged`` naming it."""
        for part in manifest.parts:
            yield from self._part_entries(manifest.name, part)

    def delete(self, name: str) -> int:
        """Remove the snapshot (its manifest first) or a create's leftovers;
        how many objects went."""
        prefix = record_prefix(name)
        keys = [obj.key for page in self.store.list_pages(prefix) for obj in page.objects]
        if not keys:
            raise SnapshotNotFound(f"no snapshot {name!r} in {self.store.url}")
        manifest_key = prefix + MANIFEST
        if manifest_key in keys:  # first: the snapshot stops listing before its parts go
            self.store.delete(manifest_key)
        self.store.delete_many(key for key in keys if key != manifest_key)
        return len(keys)

    def _prefixes(self) -> list[str]:
        names = []
        for page in self.store.list_pages(f"{SNAPSHOT_ROOT}/"):
            for common in page.prefixes:
                candidate = common[len(SNAPSHOT_ROOT) + 1 : -1]
                if NAME_PATTERN.fullmatch(candidate):
                    names.append(candidate)
        return sorted(names)

    def _part_entries(self, name: str, part: PartInfo) -> Iterator[SnapshotEntry]:
        where = f"snapshot {name!r}, {part.key.rsplit('/', 1)[-1]}"
        try:
            body = self.store.get_range(part.key, 0, part.compressed_bytes)
        except ObjectNotFound:
            raise SnapshotDamaged(f"{where}: missing from the bucket") from None
        if len(body) != part.compressed_bytes or xxhash.xxh3_64_hexdigest(body) != part.xxh3:
            raise SnapshotDamaged(f"{where}: not the bytes the manifest names")
        lines = gzip.decompress(body).splitlines()
        if len(lines) != part.entries:
            raise SnapshotDamaged(
                f"{where}: {len(lines)} entries, the manifest says {part.entries}"
            )
        for number, line in enumerate(lines, 1):
            try:
                yield SnapshotEntry.from_line(line)
            except ValueError as exc:
                raise SnapshotDamaged(f"{where}, line {number}: {exc}") from None


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        store.head(key)
    except ObjectNotFound:
        return False
    return True
