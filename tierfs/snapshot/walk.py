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
  is in the snapshot.  The reserved roots (the shadow, the snapshots'
  records) are never recorded.
- Attributes: one delimited listing of the directory's shadow prefix per
  directory gives every child's stored mode, owner and group
  (``tierfs.core.names.shadow``); a child without a shadow entry records
  none (the mount's defaults apply).  Several entries for one name combine
  to the most restrictive, as a mount reads them.

Version IDs: on a bucket that keeps versions, ``take_snapshot`` lists the
current versions of each walked root beside the walk (``with_versions``
merges the two key-ordered streams); on one that keeps none, the ETags the
walk records are what a snapshot mount's reads are checked against.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from tierfs.core.names.shadow import combine, parse_shadow_name, shadow_dir_prefix
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


def walk_entries(store: ObjectStore, paths: Iterable[str]) -> Iterator[SnapshotEntry]:
    """Every object under ``paths`` (``normalised_paths``), in key order."""
    for start, is_dir in _walks(store, normalised_paths(paths)):
        yield from _entries_of(store, start, is_dir)


def _walks(store: ObjectStore, roots: list[str]) -> list[tuple[str, bool]]:
    """What to walk for ``roots``: a file at a root's key, a tree below
    ``root/``; in the order of the keys they yield (a file root "a" sorts
    before a directory root "a/...")."""
    walks: list[tuple[str, bool]] = []
    for root in roots:
        if root == "":
            walks.append(("", True))
            continue
        try:
            store.head(root)
            walks.append((root, False))
        except ObjectNotFound:
            pass
        walks.append((f"{root}/", True))
    walks.sort(key=lambda walk: walk[0].encode())
    return walks


def _entries_of(store: ObjectStore, start: str, is_dir: bool) -> Iterator[SnapshotEntry]:
    if is_dir:
        yield from _walk_dir(store, start)
    else:
        info = store.head(start)
        yield _entry(info, _attrs_of_names(store, _parent(start)).get(_name(start)))


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
    pending = iter(versions)
    current = next(pending, None)
    for entry in entries:
        wanted = entry.key.encode()
        while current is not None and current.key.encode() < wanted:
            current = next(pending, None)
        if current is not None and current.key == entry.key:
            yield replace(
                entry,
                version=current.version_id,
                size=current.size,
                etag=current.etag,
                mtime=current.mtime,
            )
        else:
            yield entry


def _walk_dir(store: ObjectStore, prefix: str) -> Iterator[SnapshotEntry]:
    attrs = _attrs_of_names(store, prefix)
    for page in store.list_pages(prefix):
        objects = [obj for obj in page.objects if _recorded(prefix, obj.key)]
        subdirs = [p for p in page.prefixes if _recorded(prefix, p)]
        merged: list[tuple[bytes, ObjectInfo | str]] = [(o.key.encode(), o) for o in objects]
        merged += [(p.encode(), p) for p in subdirs]
        merged.sort(key=lambda item: item[0])
        for _rank, item in merged:
            if isinstance(item, str):
                yield from _walk_dir(store, item)
            elif item.key == prefix:  # the directory's own marker
                yield _entry(item, _attrs_of_dir(store, prefix))
            else:
                yield _entry(item, attrs.get(item.key[len(prefix) :]))


def _recorded(prefix: str, key: str) -> bool:
    if prefix != "":
        return True
    top = key.split("/", 1)[0]
    return top not in RESERVED_ROOTS


def _attrs_of_names(store: ObjectStore, prefix: str) -> dict[str, tuple[int, int, int]]:
    """The shadow's attributes of the children of directory ``prefix``."""
    shadow_prefix = shadow_dir_prefix(prefix)
    found: dict[str, list[object]] = {}
    for page in store.list_pages(shadow_prefix):
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


def _attrs_of_dir(store: ObjectStore, prefix: str) -> tuple[int, int, int] | None:
    body = prefix.rstrip("/")
    return _attrs_of_names(store, _parent(body)).get(_name(body))


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
) -> Manifest:
    """Walk ``paths`` and write the record of snapshot ``name``; its
    manifest (written last) is returned.  On a bucket that keeps versions,
    each object is recorded with its current version's ID (one listing of
    versions per walked root, beside the walk).  A walk or a write that
    fails leaves no snapshot (parts only, ``RecordStore.leftovers``)."""
    roots = normalised_paths(paths)
    versioned = store.versioning()
    options = {} if part_entries is None else {"part_entries": part_entries}
    writer = RecordWriter(
        store, name, creator_uid=creator_uid, paths=roots, versioned=versioned, **options
    )
    for start, is_dir in _walks(store, roots):
        entries = _entries_of(store, start, is_dir)
        if versioned:
            entries = with_versions(entries, store.current_versions(start))
        for entry in entries:
            writer.add(entry)
    return writer.finish()
