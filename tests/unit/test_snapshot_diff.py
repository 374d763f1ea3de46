"""``tierfs.snapshot.diff``: added, removed and changed names between two
snapshots, and between a snapshot and the live bucket (moto and file://)."""

from __future__ import annotations

from typing import Any

from tierfs.snapshot.diff import diff_entries, differs
from tierfs.snapshot.record import RecordStore, SnapshotEntry
from tierfs.snapshot.walk import take_snapshot, walk_entries
from tierfs.store import ObjectStore


def entry(key: str, etag: str = "e", size: int = 1, **more: Any) -> SnapshotEntry:
    return SnapshotEntry(key=key, size=size, etag=etag, mtime=0.0, **more)


def test_added_removed_and_changed_in_key_order() -> None:
    older = [entry("a"), entry("b"), entry("c", etag="1"), entry("e")]
    newer = [entry("b"), entry("c", etag="2"), entry("d"), entry("e", mode=0o600)]
    found = [(d.change, d.key) for d in diff_entries(older, newer)]
    assert found == [("removed", "a"), ("changed", "c"), ("added", "d"), ("changed", "e")]
    assert list(diff_entries([], [])) == []
    assert [d.change for d in diff_entries([entry("x")], [])] == ["removed"]
    assert [d.change for d in diff_entries([], [entry("x")])] == ["added"]


def test_versions_decide_where_both_sides_have_them() -> None:
    same = entry("k", etag="a", version="v1")
    assert not differs(same, entry("k", etag="b", version="v1"))
    assert differs(same, entry("k", etag="a", version="v2"))
    assert differs(entry("k", etag="a"), entry("k", etag="a", size=2))
    assert not differs(entry("k"), SnapshotEntry(key="k", size=1, etag="e", mtime=99.0))


def test_a_snapshot_against_another_and_against_the_live_bucket(store: ObjectStore) -> None:
    for key in ("ds/a.bin", "ds/b.bin", "ds/c.bin"):
        store.put(key, key.encode())
    take_snapshot(store, "before", ["ds"], creator_uid=0)
    store.put("ds/b.bin", b"rewritten")
    store.delete("ds/c.bin")
    store.put("ds/d.bin", b"new")
    take_snapshot(store, "after", ["ds"], creator_uid=0)
    records = RecordStore(store)
    before = records.manifest("before")
    after = records.manifest("after")
    found = [
        (d.change, d.key) for d in diff_entries(records.entries(before), records.entries(after))
    ]
    assert found == [("changed", "ds/b.bin"), ("removed", "ds/c.bin"), ("added", "ds/d.bin")]
    live = [
        (d.change, d.key) for d in diff_entries(records.entries(after), walk_entries(store, ["ds"]))
    ]
    assert live == []
    store.put("ds/a.bin", b"changed again")
    live = [
        (d.change, d.key) for d in diff_entries(records.entries(after), walk_entries(store, ["ds"]))
    ]
    assert live == [("changed", "ds/a.bin")]
