"""What a snapshot records: the bucket's objects under some paths, walked in
key order, each with the attributes the attribute shadow stores for it.

``walk_entries(store, paths)`` yields ``SnapshotEntry`` in UTF-8 key order
across all the paths, which is the order ``RecordWriter`` takes:

- A path is a file (an object at exactly that key) or a directory (every
  key below ``path/``); "" is the whole bucket.  Paths inside another path
  are covered by it and not walked twice.
- Directories are walked depth first with delimited listings, one page in
  memory per level (never a whole tree): within a page, objects and
  sub-directories are merged by key, and a sub-directory's keys all sort
  between the page's keys before and after its prefix.
- A directory's marker object (``dir/``) is recorded, so an empty directory
  is in the snapshot.  A directory with stored attributes and no marker
  gets a recorded marker (size 0, no ETag) that carries them.  The reserved roots (the shadow, the snapshots'
  records) are never recorded.
- Attributes: one delimited listing of the directory's shadow prefix per
  directory (``ShadowPlace``: for an access point, the bucket-wide shadow
  above its root, as its mount reads it) gives every child's stored mode, owner and group
  (``tierfs.core.names.shadow``); a child without a shadow entry records
  none (the mount's defaults apply).  Several entries for one name combine
  to the most restrictive, as a mount reads them.

Version IDs: on a bucket that keeps versions, ``take_snapshot`` lists the
current versions of each walked root beside the walk (``with_versions``
merges the two key-ordered streams); on one that keeps none, the ETags the
walk records are what a snapshot mount's reads are checked against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from tierfs.core.names.shadow import ShadowPlace, combine, parse_shadow_name
from tierfs.errors import InvalidArgument, ObjectNotFound
from tierfs.store import RESERVED_ROOTS, ObjectInfo, ObjectStore, ObjectVersion

from .record import Manifest, RecordWriter, SnapshotEntry


def normalised_paths(paths: Iterable[str]) -> list[str]:
    """Paths relative to the mount root, without "." or ".." segments, the
    ones inside another dropped; "" (or no path at all) is the whole mount."""
    cleaned: list[str] = []
    for raw in paths:
        segments = [s for s in raw.split("/") if s not in ("", ".")]
        if any(s == ".." for s in segments) or "\0" in raw:
            raise InvalidArgument(f"snapshot path {raw!r}: no '..' segments, no NUL")
        cleaned.append("/".join(segments))
    if not cleaned or "" in cleaned:
        return [""]
    kept: list[str] = []
    for path in sorted(set(cleaned)):
        if not any(path.startswith(f"{outer}/") for outer in kept):
            kept.append(path)
    return kept


def walk_entries(
    store: ObjectStore, paths: Iterable[str], shadows: ShadowPlace | None = None
) -> Iterator[SnapshotEntry]:
    """Every object under ``paths`` (``normalised_paths``), in key order;
    ``shadows``: where the mount's attribute shadow is (default: ``store``'s
    own, as for a mount of the whole backing)."""
    place = shadows if shadows is not None else ShadowPlace(store)
    for start, file_info in _walks(store, normalised_paths(paths)):
        yield from _entries_of(store, place, start, file_info)


def segments(paths: Iterable[str]) -> list[str]:
    """The key ranges of ``paths`` (``normalised_paths``): "" for the whole
    bucket, else each path's own key (a file) and ``path/`` (a tree), in key
    order.  They are disjoint, and in that order their keys are in order."""
    roots = list(paths)
    if "" in roots or not roots:
        return [""]
    return sorted({part for root in roots for part in (root, f"{root}/")}, key=str.encode)


def is_tree(segment: str) -> bool:
    return segment == "" or segment.endswith("/")


def _walks(store: ObjectStore, roots: list[str]) -> list[tuple[str, ObjectInfo | None]]:
    """The segments to walk for ``roots``: each tree, and each file segment
    whose object exists (with its HEAD, so it is not asked twice)."""
    walks: list[tuple[str, ObjectInfo | None]] = []
    for segment in segments(roots):
        if is_tree(segment):
            walks.append((segment, None))
            continue
        with contextlib.suppress(ObjectNotFound):
            walks.append((segment, store.head(segment)))
    return walks


def _entries_of(
    store: ObjectStore, shadows: ShadowPlace, start: str, file_info: ObjectInfo | None
) -> Iterator[SnapshotEntry]:
    if file_info is not None:
        yield _entry(file_info, _attrs_of_names(shadows, _parent(start)).get(_name(start)))
    elif start == "":
        yield from _walk_dir(store, shadows, start, None)
    else:
        body = start.rstrip("/")
        own = _attrs_of_names(shadows, _parent(body)).get(_name(body))
        yield from _walk_dir(store, shadows, start, own)


class KeyedVersions:
    """A key-ordered stream of versions, read one key's versions at a time
    (newest first, as listed); keys between two asked-for keys are skipped."""

    def __init__(self, stream: Iterable[ObjectVersion]) -> None:
        self.stream = iter(stream)
        self.head = next(self.stream, None)

    def of(self, key: str) -> list[ObjectVersion]:
        wanted = key.encode()
        while self.head is not None and self.head.key.encode() < wanted:
            self.head = next(self.stream, None)
        found: list[ObjectVersion] = []
        while self.head is not None and self.head.key == key:
            found.append(self.head)
            self.head = next(self.stream, None)
        return found


def with_versions(
    entries: Iterable[SnapshotEntry], versions: Iterable[ObjectVersion]
) -> Iterator[SnapshotEntry]:
    """``entries`` (key order) with the version ID of each key's current
    version from ``versions`` (key order, other keys among them skipped).
    Where both name a key, the version's size and ETag are recorded with
    its ID, so the three always belong together (an object overwritten
    between the two listings is recorded as its newer version).  An entry
    without a version (gone or made between the listings) keeps its ETag
    and no ID."""
    current = KeyedVersions(versions)
    for entry in entries:
        found = current.of(entry.key)
        if found:
            version = found[0]
            yield replace(
                entry,
                version=version.version_id,
                size=version.size,
                etag=version.etag,
                mtime=version.mtime,
            )
        else:
            yield entry


def _walk_dir(
    store: ObjectStore, shadows: ShadowPlace, prefix: str, own: tuple[int, int, int] | None
) -> Iterator[SnapshotEntry]:
    """The tree below ``prefix``; ``own``: the directory's own attributes
    (from its parent's shadow listing, which the caller has)."""
    attrs = _attrs_of_names(shadows, prefix)
    marked = False
    for page in store.list_pages(prefix):
        if not marked and own is not None and prefix:
            marked = True
            if not (page.objects and page.objects[0].key == prefix):
                # No marker object: record one, so the directory's stored
                # attributes are in the snapshot (a mount must never show
                # it wider than the bucket does).
                yield SnapshotEntry(
                    key=prefix, size=0, etag="", mtime=0.0, mode=own[0], uid=own[1], gid=own[2]
                )
        objects = [obj for obj in page.objects if _recorded(prefix, obj.key)]
        subdirs = [p for p in page.prefixes if _recorded(prefix, p)]
        merged: list[tuple[bytes, ObjectInfo | str]] = [(o.key.encode(), o) for o in objects]
        merged += [(p.encode(), p) for p in subdirs]
        merged.sort(key=lambda item: item[0])
        for _rank, item in merged:
            if isinstance(item, str):
                yield from _walk_dir(store, shadows, item, attrs.get(item[len(prefix) : -1]))
            elif item.key == prefix:  # the directory's own marker
                yield _entry(item, own)
            else:
                yield _entry(item, attrs.get(item.key[len(prefix) :]))


def _recorded(prefix: str, key: str) -> bool:
    if prefix != "":
        return True
    top = key.split("/", 1)[0]
    return top not in RESERVED_ROOTS


def _attrs_of_names(shadows: ShadowPlace, prefix: str) -> dict[str, tuple[int, int, int]]:
    """The shadow's attributes of the children of directory ``prefix``."""
    shadow_prefix = shadows.dir_prefix(prefix)
    found: dict[str, list[object]] = {}
    for page in shadows.store.list_pages(shadow_prefix):
        for obj in page.objects:
            parsed = parse_shadow_name(obj.key[len(shadow_prefix) :])
            if parsed is not None:
                found.setdefault(parsed[0], []).append(parsed[1])
    out: dict[str, tuple[int, int, int]] = {}
    for name, items in found.items():
        combined = combine(items)  # type: ignore[arg-type]
        if combined is not None:
            out[name] = (combined.perm, combined.uid, combined.gid)
    return out


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _entry(info: ObjectInfo, attrs: tuple[int, int, int] | None) -> SnapshotEntry:
    perm, uid, gid = attrs if attrs is not None else (None, None, None)
    return SnapshotEntry(
        key=info.key, size=info.size, etag=info.etag, mtime=info.mtime, mode=perm, uid=uid, gid=gid
    )


def take_snapshot(
    store: ObjectStore,
    name: str,
    paths: Iterable[str],
    *,
    creator_uid: int,
    part_entries: int | None = None,
    observe: Callable[[SnapshotEntry], None] | None = None,
    shadows: ShadowPlace | None = None,
) -> Manifest:
    """Walk ``paths`` and write the record of snapshot ``name``; its
    manifest (written last) is returned.  On a bucket that keeps versions,
    each object is recorded with its current version's ID (one listing of
    versions per walked root, beside the walk).  A walk or a write that
    fails leaves no snapshot (parts only, ``RecordStore.leftovers``).
    ``observe(entry)`` is called before each entry is recorded; what it
    raises ends the create (a refusal, a cancel), as a failure would.
    ``shadows`` as for ``walk_entries``."""
    place = shadows if shadows is not None else ShadowPlace(store)
    roots = normalised_paths(paths)
    versioned = store.versioning()
    options = {} if part_entries is None else {"part_entries": part_entries}
    writer = RecordWriter(
        store, name, creator_uid=creator_uid, paths=roots, versioned=versioned, **options
    )
    for start, file_info in _walks(store, roots):
        entries = _entries_of(store, place, start, file_info)
        if versioned:
            entries = with_versions(entries, store.current_versions(start))
        for entry in entries:
            if observe is not None:
                observe(entry)
            writer.add(entry)
    return writer.finish()
