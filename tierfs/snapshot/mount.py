"""What a mount of a snapshot changes (``-o snapshot=NAME``).

A snapshot mount is an ordinary daemon with three differences, all made
before it starts:

- its store is a ``SnapshotStore`` (``tierfs.snapshot.view``): listings and
  HEADs from the record, reads of the recorded versions, no changes;
- its config (``snapshot_config``): its own metadata and cache directories
  (``<state dir>/snapshots/<name>`` and ``<tier path>/snapshots/<name>``),
  so it runs beside the node's live mount of the same config; listings and
  attributes never expire (``FOREVER_TTL``: nothing in a snapshot changes,
  so nothing is ever listed or checked again); no metrics listener (the live mount's
  port is taken; ``status`` has everything);
- it is read-only (``ro``: the kernel refuses every change with EROFS).

``status`` has a ``snapshot`` section (``snapshot_status``), and the mount's
source in ``/proc/mounts`` and ``df`` is ``<backing URL>?snapshot=<name>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tierfs.config import Config
from tierfs.errors import TierfsError
from tierfs.store import ObjectStore

from .record import Manifest, RecordStore, SnapshotNotFound, check_name
from .view import SnapshotIndex, SnapshotStore

#: The mount option that names the snapshot.
OPTION = "snapshot"
#: Where a snapshot mount keeps its own state, below the state dir and each tier.
SUBDIR = "snapshots"
#: A snapshot mount's ``list_ttl`` and ``revalidate_ttl`` (seconds): a year,
#: as good as never; finite, because the kernel is given these as its
#: entry and attribute timeouts, and those are whole seconds.
FOREVER_TTL = 365 * 24 * 3600.0


def snapshot_config(config: Config, name: str) -> Config:
    """``config`` for a mount of snapshot ``name`` (see the module docstring)."""
    check_name(name)
    state = dataclasses.replace(config.state, dir=config.state.dir / SUBDIR / name)
    tiers = tuple(dataclasses.replace(t, path=t.path / SUBDIR / name) for t in config.tiers)
    namespace = dataclasses.replace(
        config.namespace, list_ttl=FOREVER_TTL, revalidate_ttl=FOREVER_TTL
    )
    metrics = dataclasses.replace(config.metrics, listen=None)
    return dataclasses.replace(
        config, state=state, tiers=tiers, namespace=namespace, metrics=metrics
    )


def open_snapshot_store(store: ObjectStore, config: Config, name: str) -> SnapshotStore:
    """The store of a mount of snapshot ``name`` of ``store``'s bucket;
    ``config`` is the mount's (``snapshot_config``).  The index is built
    here on the first mount on this node (one read of the record)."""
    records = RecordStore(store)
    try:
        manifest = records.manifest(name)
    except SnapshotNotFound:
        raise SnapshotNotFound(
            f"no snapshot {name!r} in {store.url} (`tierfs snapshot list MOUNTPOINT` "
            "on a mount of it lists them)"
        ) from None
    index = SnapshotIndex.open(config.state.dir / "index.sqlite", records, manifest)
    for tier in config.tiers:  # the snapshot's own cache directories
        try:
            tier.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            index.close()
            raise TierfsError(
                f"snapshot {name!r}: cannot make its cache directory {tier.path}: {exc.strerror}",
                errno=exc.errno,
            ) from None
    below = config.access.root.strip("/") + "/" if config.access.root else ""
    return SnapshotStore(store, index, shadow_below=below)


def snapshot_source(url: str, name: str) -> str:
    """The mount's source: the backing URL naming the snapshot."""
    return f"{url}?snapshot={name}"


def snapshot_status(manifest: Manifest) -> dict[str, Any]:
    """The ``snapshot`` section of a snapshot mount's ``status``."""
    return {
        "name": manifest.name,
        "created": manifest.created,
        "creator_uid": manifest.creator_uid,
        "paths": manifest.paths,
        "objects": manifest.objects,
        "bytes": manifest.bytes,
        "versioned": manifest.versioned,
    }
