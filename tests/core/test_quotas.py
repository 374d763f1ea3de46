"""Directory quotas over a real S3 server, without a mount: usage from the
bucket walk plus this node's changes, EDQUOT before anything lands, the
warning at ``warn_at``, renames, reload, and two nodes on one bucket."""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, MiB, put
from tierfs.config import QuotaConfig, WriteConfig
from tierfs.errors import QuotaExceeded
from tierfs.meta import ROOT_INO


def quota(path: str, **limits: Any) -> QuotaConfig:
    return QuotaConfig(path=path, source="test", **limits)


def usage(mount: CoreMount, path: str) -> dict[str, Any]:
    (entry,) = [q for q in mount.fs.quotas.status() if q["path"] == path]
    return entry


async def walked(mount: CoreMount) -> None:
    with trio.fail_after(30):
        await mount.fs.quotas.wait_walked()


async def mkdirs(mount: CoreMount, path: str) -> int:
    ino = ROOT_INO
    for name in path.split("/"):
        try:
            ino = (await mount.fs.namespace.lookup(ino, name.encode())).ino
        except Exception:
            ino = (await mount.fs.mkdir(ino, name.encode(), 0o755, 0, 0)).ino
    return ino


async def open_new(mount: CoreMount, parent: int, name: str) -> int:
    opened, _attrs = await mount.fs.create(parent, name.encode(), 0o644, os.O_WRONLY, 0, 0)
    return opened.fh


async def test_bytes_quota_counts_the_bucket_and_refuses_the_write_that_passes_it(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "users/alice/old.bin", b"x" * (3 * MiB))  # written by another tool
    put(s3_store, "users/bob/other.bin", b"y" * (5 * MiB))  # outside the quota
    mount = await make_fs(quotas=[quota("users/alice", bytes=4 * MiB)])
    await walked(mount)
    assert usage(mount, "users/alice")["bytes_used"] == 3 * MiB
    alice = await mkdirs(mount, "users/alice")
    fh = await open_new(mount, alice, "new.bin")
    await mount.fs.write(fh, 0, b"a" * MiB)  # exactly at the limit
    with pytest.raises(QuotaExceeded) as refused:
        await mount.fs.write(fh, MiB, b"b")
    assert refused.value.errno == errno.EDQUOT
    # Nothing of the refused write landed; overwriting inside the file is fine.
    await mount.fs.write(fh, 0, b"c" * 10)
    await mount.fs.release(fh)
    inode = await mount.fs.namespace.resolve("users/alice/new.bin")
    assert inode.size == MiB
    assert await mount.read_file("users/alice/new.bin") == b"c" * 10 + b"a" * (MiB - 10)
    entry = usage(mount, "users/alice")
    assert (entry["bytes_used"], entry["bytes_percent"], entry["full"]) == (4 * MiB, 100.0, True)
    assert entry["refused"] == 1
    # Removing a file gives its room back at once.
    await mount.fs.unlink(alice, b"old.bin")
    assert usage(mount, "users/alice")["bytes_used"] == MiB
    fh = await mount.fs.open(inode.ino, os.O_WRONLY)
    await mount.fs.write(fh.fh, MiB, b"d" * (2 * MiB))
    await mount.fs.release(fh.fh)


async def test_usage_stays_right_after_the_upload_and_the_next_walk(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs(quotas=[quota("data", bytes=10 * MiB, files=100)])
    await walked(mount)
    await mkdirs(mount, "data/sub")
    await mount.write_file("data/sub/a.bin", b"a" * (2 * MiB))
    await mount.write_file("data/b.bin", b"b" * MiB)
    before = usage(mount, "data")
    assert (before["bytes_used"], before["files_used"]) == (3 * MiB, 3)
    assert before["pending_bytes"] == 3 * MiB
    await mount.flush()
    await walked(mount)
    after = usage(mount, "data")
    assert (after["bytes_used"], after["files_used"]) == (3 * MiB, 3)
    assert (after["pending_bytes"], after["pending_files"]) == (0, 0), after
    # A change to an uploaded file counts only its growth.
    await mount.write_file("data/b.bin", b"b" * (2 * MiB))
    assert usage(mount, "data")["bytes_used"] == 4 * MiB
    await mount.flush()
    await walked(mount)
    assert usage(mount, "data")["bytes_used"] == 4 * MiB
    assert usage(mount, "data")["pending_bytes"] == 0


async def test_files_quota_refuses_create_and_mkdir(make_fs: Any) -> None:
    mount = await make_fs(quotas=[quota("proj", files=3)])
    await walked(mount)
    proj = await mkdirs(mount, "proj")
    await mount.fs.mkdir(proj, b"d", 0o755, 0, 0)
    fh = await open_new(mount, proj, "f1")
    await mount.fs.release(fh)
    await mount.fs.symlink(proj, b"link", b"f1", 0, 0)
    with pytest.raises(QuotaExceeded):
        await open_new(mount, proj, "f2")
    with pytest.raises(QuotaExceeded):
        await mount.fs.mkdir(proj, b"d2", 0o755, 0, 0)
    names = {name for _c, name, _i in mount.fs.meta.read_dir(proj, 0, 100)}
    assert names == {b"d", b"f1", b"link"}  # the refused ones left nothing behind
    assert usage(mount, "proj")["files_used"] == 3
    # The quota's own directory is not counted; outside it nothing is limited.
    fh = await open_new(mount, ROOT_INO, "outside")
    await mount.fs.release(fh)


async def test_warning_is_logged_once_per_crossing(make_fs: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="tierfs.core.names.quotas")
    mount = await make_fs(quotas=[quota("w", bytes=10 * MiB, warn_at=0.8)])
    await walked(mount)
    parent = await mkdirs(mount, "w")
    fh = await open_new(mount, parent, "f")
    for i in range(9):
        await mount.fs.write(fh, i * MiB, b"z" * MiB)
    await mount.fs.release(fh)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "warn_at" in r.getMessage()]

    assert len(warnings()) == 1, warnings()
    assert "80% of a limit used" in warnings()[0]
    assert usage(mount, "w")["warning"] is True
    inode = await mount.fs.namespace.resolve("w/f")
    await mount.fs.setattr(inode.ino, size=MiB)  # back under: re-armed
    assert usage(mount, "w")["warning"] is False
    await mount.fs.setattr(inode.ino, size=9 * MiB)
    assert len(warnings()) == 3  # the crossing down (info) and the second crossing up
    assert usage(mount, "w")["warning"] is True


async def test_truncate_up_and_rename_into_a_full_quota_are_refused(make_fs: Any) -> None:
    mount = await make_fs(quotas=[quota("q", bytes=2 * MiB, files=10)])
    await walked(mount)
    await mkdirs(mount, "q")
    await mount.write_file("q/f", b"f" * MiB)
    inode = await mount.fs.namespace.resolve("q/f")
    with pytest.raises(QuotaExceeded):
        await mount.fs.setattr(inode.ino, size=3 * MiB)
    assert (await mount.fs.namespace.resolve("q/f")).size == MiB
    # A directory of 2 MiB outside cannot move in; a file inside can move
    # within the quota however full it is.
    src = await mkdirs(mount, "src/deep")
    await mount.write_file("src/deep/big", b"b" * (2 * MiB))

    q_ino = (await mount.fs.namespace.resolve("q")).ino
    with pytest.raises(QuotaExceeded):
        await mount.fs.rename(ROOT_INO, b"src", q_ino, b"src", 0)
    assert (await mount.fs.namespace.resolve("src/deep/big")).size == 2 * MiB
    await mount.fs.rename(q_ino, b"f", q_ino, b"g", 0)
    # Moving the file out frees its room; then the directory fits... not
    # quite (2 MiB + 2 names is within 10 names and 2 MiB).
    await mount.fs.rename(q_ino, b"g", ROOT_INO, b"g", 0)
    assert usage(mount, "q")["bytes_used"] == 0
    await mount.fs.rename(ROOT_INO, b"src", q_ino, b"src", 0)
    entry = usage(mount, "q")
    assert (entry["bytes_used"], entry["files_used"]) == (2 * MiB, 3)
    del src
    await mount.flush()
    await walked(mount)
    entry = usage(mount, "q")
    assert (entry["bytes_used"], entry["files_used"]) == (2 * MiB, 3)


async def test_nested_quotas_and_the_walk_skips_what_the_mount_does_not_show(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "team/a/x", b"1" * 100)
    put(s3_store, "team/a/y/", b"")  # an empty directory's marker
    put(s3_store, "team/b//bad", b"2" * 50)  # an empty segment: not a name
    put(s3_store, "team/z", b"3" * 10)
    mount = await make_fs(
        quotas=[quota("", files=1000), quota("team", bytes=MiB), quota("team/a", files=5)]
    )
    await walked(mount)
    assert (usage(mount, "team/a")["bytes_used"], usage(mount, "team/a")["files_used"]) == (
        100,
        2,
    )
    # team: a, a/x, a/y, b, z (b's only key cannot be shown, b still lists)
    assert usage(mount, "team")["bytes_used"] == 110
    assert usage(mount, "team")["files_used"] == 5
    assert usage(mount, "/")["files_used"] == 6


async def test_reload_keeps_counts_and_recounts_tracked_changes(
    make_fs: Any, s3_store: Any
) -> None:
    mount = await make_fs(quotas=[quota("r", bytes=10 * MiB)])
    await walked(mount)
    await mkdirs(mount, "r/s")
    await mount.write_file("r/s/f", b"f" * MiB, fsync=False)
    fs = mount.fs
    fs.quotas.set_quotas([quota("r", bytes=10 * MiB), quota("r/s", bytes=MiB)])
    assert usage(mount, "r")["bytes_used"] == MiB
    assert usage(mount, "r/s")["bytes_used"] == MiB  # this node's change, before any walk
    parent = (await fs.namespace.resolve("r/s")).ino
    fh = await open_new(mount, parent, "g")
    with pytest.raises(QuotaExceeded):
        await fs.write(fh, 0, b"g")
    await fs.release(fh)
    await walked(mount)
    assert usage(mount, "r/s")["bytes_used"] == MiB


async def test_pending_changes_survive_a_remount(make_fs: Any) -> None:
    held = WriteConfig(mode="back", upload_delay=3600, part_size=8 * MiB)
    mount = await make_fs(quotas=[quota("p", bytes=4 * MiB)], write=held)
    await walked(mount)
    await mkdirs(mount, "p")
    await mount.write_file("p/f", b"f" * (3 * MiB))  # fsynced, not uploaded
    assert usage(mount, "p")["bytes_used"] == 3 * MiB
    mount = await mount.remount()
    # The pending upload is tracked again at once (it may also be counted
    # by a walk that runs while it goes up: high, never low).
    assert usage(mount, "p")["bytes_used"] >= 3 * MiB
    fh = await open_new(mount, (await mount.fs.namespace.resolve("p")).ino, "g")
    with pytest.raises(QuotaExceeded):
        await mount.fs.write(fh, 0, b"g" * (2 * MiB))
    await mount.fs.release(fh)


async def test_two_nodes_overshoot_within_the_documented_bound(make_fs: Any, s3_store: Any) -> None:
    """Each node sees only its own changes until they are uploaded and
    walked: both fill the room left at their last walk, so the bucket holds
    at most twice that; after a walk each sees the total and refuses."""
    limit = 8 * MiB
    limits = [quota("shared", bytes=limit)]
    node_a = await make_fs(node="a", quotas=limits)
    node_b = await make_fs(node="b", quotas=limits)
    await walked(node_a)
    await walked(node_b)
    written = {"a": 0, "b": 0}
    for name, mount in (("a", node_a), ("b", node_b)):
        parent = await mkdirs(mount, "shared")
        fh = await open_new(mount, parent, f"from-{name}")
        try:
            while True:
                await mount.fs.write(fh, written[name], b"w" * MiB)
                written[name] += MiB
        except QuotaExceeded:
            pass
        await mount.fs.release(fh)
    assert written == {"a": limit, "b": limit}  # each saw the whole room
    await node_a.flush()
    await node_b.flush()
    total = sum(o.size for page in s3_store.list_pages("shared/") for o in page.objects)
    room_at_last_walk = limit
    assert total <= 2 * room_at_last_walk  # the bound: N nodes x the room
    await walked(node_a)
    await walked(node_b)
    for mount in (node_a, node_b):
        assert usage(mount, "shared")["bytes_used"] == total
        inode = await mount.fs.namespace.resolve(
            "shared/from-a" if mount is node_a else "shared/from-b"
        )
        opened = await mount.fs.open(inode.ino, os.O_WRONLY)
        with pytest.raises(QuotaExceeded):
            await mount.fs.write(opened.fh, inode.size, b"more")
        await mount.fs.release(opened.fh)


async def test_quota_metrics_label_named_quotas_and_never_a_path(make_fs: Any) -> None:
    from tests.core.test_metrics import scrape, value
    from tierfs.metrics import Metrics

    mount = await make_fs(
        quotas=[quota("users/alice", bytes=4 * MiB, name="alice"), quota("tmp", files=2)]
    )
    metrics = Metrics()
    metrics.watch(mount.fs)
    await walked(mount)
    await mkdirs(mount, "users/alice")
    await mount.write_file("users/alice/f", b"a" * (3 * MiB + MiB // 2))
    tmp = await mkdirs(mount, "tmp")
    await mount.fs.mkdir(tmp, b"a", 0o755, 0, 0)
    await mount.fs.mkdir(tmp, b"b", 0o755, 0, 0)
    with pytest.raises(QuotaExceeded):
        await mount.fs.mkdir(tmp, b"c", 0o755, 0, 0)
    samples = scrape(metrics)
    assert value(samples, "tierfs_quotas") == 2
    assert value(samples, "tierfs_quotas_warning") == 2
    assert value(samples, "tierfs_quotas_full") == 1
    assert value(samples, "tierfs_quota_refused_total") == 1
    assert value(samples, "tierfs_quota_used_bytes", quota="alice") == 3 * MiB + MiB // 2
    assert value(samples, "tierfs_quota_limit_bytes", quota="alice") == 4 * MiB
    assert value(samples, "tierfs_quota_used_ratio", quota="alice") == 0.875
    assert value(samples, "tierfs_quota_warning", quota="alice") == 1
    labels = {v for (_n, labels) in samples for _k, v in labels}
    assert not any("/" in v or v == "tmp" for v in labels), labels


async def test_a_failed_walk_keeps_the_last_counts_and_says_why(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierfs.errors import StoreUnavailable

    put(s3_store, "f/a", b"a" * MiB)
    mount = await make_fs(quotas=[quota("f", bytes=2 * MiB)])
    await walked(mount)
    assert usage(mount, "f")["bytes_used"] == MiB

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the endpoint does not answer")

    parent = (await mount.fs.namespace.resolve("f")).ino
    await mount.fs.namespace.resolve("f/a")  # listed: the mount needs no LIST below
    monkeypatch.setattr(mount.fs.quotas.store, "list_pages", unreachable)
    await walked(mount)  # returns: a failed walk ends the wait too
    entry = usage(mount, "f")
    assert entry["bytes_used"] == MiB and "does not answer" in entry["walk_error"]
    fh = await open_new(mount, parent, "b")
    await mount.fs.write(fh, 0, b"b" * MiB)
    with pytest.raises(QuotaExceeded):  # still enforced from the last counts
        await mount.fs.write(fh, MiB, b"b")
    await mount.fs.release(fh)
    monkeypatch.undo()
    await walked(mount)
    assert usage(mount, "f")["walk_error"] == ""
