"""The snapshot worker's rules that need no mount: who may read what a
snapshot records (``ShownAttrs``), and the bound on jobs per user."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tierfs.config import NamespaceConfig
from tierfs.core.names.access import Caller
from tierfs.errors import Busy
from tierfs.snapshot.record import SnapshotEntry
from tierfs.workers.snapshots import MAX_JOBS, ShownAttrs, Snapshots

ALICE = Caller(1000, frozenset({1000}))
BOB = Caller(1001, frozenset({1001, 50}))
ROOT = Caller(0, frozenset({0}))


def entry(key: str, mode: int | None = None, uid: int | None = None, gid: int | None = None) -> Any:
    return SnapshotEntry(key=key, size=1, etag="e", mtime=0.0, mode=mode, uid=uid, gid=gid)


def test_what_a_snapshot_records_is_checked_as_the_mount_shows_it() -> None:
    shown = ShownAttrs.of(NamespaceConfig(), 0, 0, None, None)  # 0644 files, 0755 dirs, root
    assert shown.readable(entry("a.bin"), ALICE)  # the defaults: world-readable
    assert shown.readable(entry("d/"), ALICE)
    assert not shown.readable(entry("p.bin", 0o600, 1000, 1000), BOB)
    assert shown.readable(entry("p.bin", 0o600, 1000, 1000), ALICE)
    assert shown.readable(entry("g.bin", 0o640, 7, 50), BOB)  # by a supplementary group
    assert not shown.readable(entry("d/", 0o711, 1000, 1000), BOB)  # search alone: not listed
    assert shown.readable(entry("p.bin", 0o600, 1000, 1000), ROOT)
    closed = ShownAttrs.of(NamespaceConfig(file_mode=0o600, dir_mode=0o700), 0, 0, None, None)
    assert not closed.readable(entry("a.bin"), ALICE)  # the mount's defaults count too
    # An access point shows its fixed owner whatever is stored.
    point = ShownAttrs.of(NamespaceConfig(), 0, 0, 1001, 1001)
    assert point.readable(entry("p.bin", 0o600, 1000, 1000), BOB)
    assert not point.readable(entry("p.bin", 0o600, 1000, 1000), ALICE)


async def test_one_job_per_user_and_a_bound_in_all(tmp_path: Path) -> None:
    from tierfs.store.local import LocalStore

    (tmp_path / "bucket").mkdir()
    store = LocalStore((tmp_path / "bucket").as_uri())
    shown = ShownAttrs.of(NamespaceConfig(), 0, 0, None, None)
    worker = Snapshots(store, None, shown, trio.CapacityLimiter(2))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        first = worker._admit(ALICE, "create", "a", [])
        with pytest.raises(Busy, match="one at a time"):
            worker._admit(ALICE, "show", "b", [])
        worker._admit(ROOT, "create", "r1", [])  # root is not bound per user
        worker._admit(BOB, "diff", "c", [])
        worker._admit(ROOT, "create", "r2", [])
        with pytest.raises(Busy, match=f"{MAX_JOBS} snapshot jobs"):
            worker._admit(ROOT, "create", "r3", [])
        first.state = "done"
        worker._admit(Caller(1002, frozenset()), "list", "", [])
        nursery.cancel_scope.cancel()
