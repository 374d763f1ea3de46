"""Real mount: what the write path does to the bucket, and when.

The bucket is read back with a plain boto3 client (``s3_client``, standing
in for any other tool) after ``tierfs flush``.  ``upload_delay`` is long
unless a test says otherwise, so that nothing goes up by itself and
"before the flush" is well defined.  Contract: the bucket layout and
docs/guarantees.md, "Writes and durability".
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, drop_page_cache, run_tierfs, wait_until

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
LONG_DELAY = "600s"
MARGIN = 3.0  # seconds on top of a TTL for kernel caches and scheduling


# --- helpers --------------------------------------------------------------------------------


def flush(m: Mount, *names: str) -> None:
    """``tierfs flush`` (the mount root if no name is given)."""
    paths = [str(m.path / n) for n in names] or [str(m.path)]
    done = run_tierfs("flush", *paths)
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr.strip()}\n{m.log_tail()}"


def bucket_keys(m: Mount) -> set[str]:
    """Every key under the mount's prefix, relative to it."""
    keys: set[str] = set()
    for page in m.s3.get_paginator("list_objects_v2").paginate(
        Bucket=m.bucket, Prefix=m.prefix + "/"
    ):
        keys |= {o["Key"][len(m.prefix) + 1 :] for o in page.get("Contents", [])}
    return keys


def bucket_get(m: Mount, name: str) -> tuple[bytes, dict[str, str]]:
    obj = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))
    body: bytes = obj["Body"].read()
    return body, obj["Metadata"]


def in_bucket(m: Mount, name: str) -> bool:
    try:
        m.s3.head_object(Bucket=m.bucket, Key=m.key(name))
    except m.s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def status(m: Mount) -> dict[str, Any]:
    return m.status()


# --- 5: layout of what was written ------------------------------------------------------------


def test_written_files_are_plain_objects_with_metadata(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    bodies = {
        "small.txt": b"hello bucket\n",
        "empty": b"",
        "multi.bin": os.urandom(2 * MiB + 12345),
        "a/b/c/deep.txt": b"deep",
    }
    os.makedirs(m.path / "a" / "b" / "c")
    os.mkdir(m.path / "emptydir")
    os.makedirs(m.path / "x" / "emptysub")
    for name, body in bodies.items():
        (m.path / name).write_bytes(body)
    os.chmod(m.path / "small.txt", 0o600)
    # directory markers may go up at once; file contents wait for upload_delay
    early = {k for k in bucket_keys(m) if not k.endswith("/")}
    assert early == set(), f"uploaded before upload_delay: {early}"

    flush(m)
    keys = bucket_keys(m)
    # Directories that hold something are implied by "/"; markers are allowed
    # for them but not required.  Empty directories must have theirs.
    assert {"emptydir/", "x/emptysub/"} <= keys, keys
    files = {k for k in keys if not k.endswith("/")}
    # small.txt is 0600: its attribute shadow entry goes with it (tierfs.core.names.shadow)
    assert files == set(bodies) | {".tierfs-attrs/small.txt@m0600,u0,g0"}, keys
    assert keys - files <= {"emptydir/", "x/", "x/emptysub/", "a/", "a/b/", "a/b/c/"}, keys

    for name, body in bodies.items():
        got, meta = bucket_get(m, name)
        assert got == body, name
        st = os.stat(m.path / name)
        assert meta["mode"] == str(st.st_mode), (name, meta)
        assert stat.S_ISREG(int(meta["mode"])), (name, meta)
        assert meta["uid"] == str(st.st_uid), (name, meta)
        assert meta["gid"] == str(st.st_gid), (name, meta)
        assert abs(float(meta["mtime"]) - st.st_mtime) < 1.0, (name, meta, st.st_mtime)
    assert bucket_get(m, "small.txt")[1]["mode"] == str(stat.S_IFREG | 0o600)

    for marker in ("emptydir/", "x/emptysub/"):
        body, _meta = bucket_get(m, marker)
        assert body == b"", marker


def test_boto3_and_mount_see_each_others_writes(mount: MountFactory) -> None:
    m = mount({"seed.txt": b"seed"}, list_ttl="1s", upload_delay=LONG_DELAY)
    assert os.listdir(m.path) == ["seed.txt"]

    # another tool writes: the mount shows it within list_ttl
    m.put("dir/from-boto3.bin", b"from boto3")
    m.put("top.txt", b"top")
    assert wait_until(lambda: {"dir", "top.txt"} <= set(os.listdir(m.path)), m.list_ttl + MARGIN), (
        os.listdir(m.path)
    )
    assert (m.path / "dir" / "from-boto3.bin").read_bytes() == b"from boto3"
    assert (m.path / "top.txt").read_bytes() == b"top"

    # tierfs writes: boto3 reads the same bytes
    body = os.urandom(MiB + 77)
    (m.path / "dir" / "from-tierfs.bin").write_bytes(body)
    flush(m, "dir/from-tierfs.bin")
    assert bucket_get(m, "dir/from-tierfs.bin")[0] == body


def test_directory_rename_moves_every_key(mount: MountFactory) -> None:
    cold = {f"src/cold{i}.bin": os.urandom(500 + i) for i in range(4)}
    cold["src/sub/deeper/cold.txt"] = b"never read on this node"
    cold["src/big.bin"] = os.urandom(2 * MiB + 1)  # multi-block, never read
    warm = {"src/warm.bin": os.urandom(MiB + 9)}
    m = mount({**cold, **warm, "src/emptysub/": b"", "other.txt": b"o"}, upload_delay=LONG_DELAY)
    assert (m.path / "src" / "warm.bin").read_bytes() == warm["src/warm.bin"]  # now cached
    (m.path / "src" / "dirty.txt").write_bytes(b"written here, not yet uploaded")
    os.mkdir(m.path / "src" / "newdir")

    os.rename(m.path / "src", m.path / "dst")
    flush(m)
    keys = bucket_keys(m)
    assert not {k for k in keys if k.startswith("src/")}, sorted(keys)
    expected = {**cold, **warm, "src/dirty.txt": b"written here, not yet uploaded"}
    for name, body in expected.items():
        new = "dst/" + name[len("src/") :]
        assert new in keys, (new, sorted(keys))
        assert bucket_get(m, new)[0] == body, new
    assert {"dst/emptysub/", "dst/newdir/"} <= keys, sorted(keys)
    assert "other.txt" in keys

    # and the mount agrees, from the daemon (not the page cache)
    drop_page_cache()
    for name, body in expected.items():
        assert (m.path / "dst" / name[len("src/") :]).read_bytes() == body, name


def test_deletes_through_the_mount_delete_in_the_bucket(mount: MountFactory) -> None:
    m = mount(
        {
            "gone.txt": b"never read",
            "tree/a.txt": b"a",
            "tree/sub/b.txt": b"b",
            "emptydir/": b"",
            "kept.txt": b"kept",
        },
        upload_delay=LONG_DELAY,
    )
    (m.path / "local.txt").write_bytes(b"local")
    flush(m)
    assert "local.txt" in bucket_keys(m)

    os.unlink(m.path / "gone.txt")
    os.unlink(m.path / "local.txt")
    os.rmdir(m.path / "emptydir")
    os.unlink(m.path / "tree" / "sub" / "b.txt")
    os.rmdir(m.path / "tree" / "sub")
    os.unlink(m.path / "tree" / "a.txt")
    os.rmdir(m.path / "tree")
    # a file created and deleted before any upload leaves nothing behind
    (m.path / "ephemeral.txt").write_bytes(b"e")
    os.unlink(m.path / "ephemeral.txt")
    flush(m)
    assert bucket_keys(m) == {"kept.txt"}
    assert os.listdir(m.path) == ["kept.txt"]
    time.sleep(m.list_ttl + 0.5)  # a re-listing does not bring anything back
    assert os.listdir(m.path) == ["kept.txt"]


def test_chmod_of_clean_bucket_file_rewrites_only_its_metadata(mount: MountFactory) -> None:
    body = os.urandom(3 * MiB + 3)
    m = mount({"clean.bin": body}, upload_delay=LONG_DELAY)
    before = m.s3.head_object(Bucket=m.bucket, Key=m.key("clean.bin"))
    os.chmod(m.path / "clean.bin", 0o640)
    flush(m)
    got, meta = bucket_get(m, "clean.bin")
    assert got == body
    assert meta["mode"] == str(stat.S_IFREG | 0o640), meta
    after = m.s3.head_object(Bucket=m.bucket, Key=m.key("clean.bin"))
    assert after["ContentLength"] == before["ContentLength"]
    item = m.where_one("clean.bin")
    assert item["cached_bytes"] == 0, f"chmod downloaded the file: {item}"
    assert item["state"] == "clean", item
    assert m.counters()["fetched_bytes"] == 0


# --- 6: where / status before and after a flush ------------------------------------------------


def test_where_and_status_show_dirty_then_clean(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    (m.path / "one.bin").write_bytes(os.urandom(MiB + 1))
    (m.path / "two.txt").write_bytes(b"two")
    time.sleep(1.0)  # nothing uploads by itself
    for item in m.where("one.bin", "two.txt"):
        assert item["state"] == "dirty", item
    st = status(m)
    assert st["dirty_bytes"] >= MiB + 4, st
    assert st["pending_uploads"] >= 2, st
    assert not in_bucket(m, "one.bin")

    flush(m)
    for item in m.where("one.bin", "two.txt"):
        assert item["state"] == "clean", item
    st = status(m)
    assert st["dirty_bytes"] == 0, st
    assert st["pending_uploads"] == 0, st
    assert in_bucket(m, "one.bin") and in_bucket(m, "two.txt")


# --- 7: umount, umount --flush, write-through -------------------------------------------------


def test_umount_keeps_pending_uploads_for_the_next_mount(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    body = os.urandom(MiB + 5)
    (m.path / "pending.bin").write_bytes(body)
    m.umount()  # without --flush
    assert not in_bucket(m, "pending.bin"), "tierfs umount uploaded a pending file"
    m.mount()
    assert (m.path / "pending.bin").read_bytes() == body
    flush(m)
    assert bucket_get(m, "pending.bin")[0] == body


def test_umount_flush_uploads_before_unmounting(mount: MountFactory) -> None:
    m = mount(upload_delay=LONG_DELAY)
    body = os.urandom(2 * MiB + 7)
    (m.path / "dir").mkdir()
    (m.path / "dir" / "f.bin").write_bytes(body)
    done = run_tierfs("umount", "--flush", str(m.path))
    assert done.returncode == 0, done.stderr
    assert not os.path.ismount(m.path)
    assert bucket_get(m, "dir/f.bin")[0] == body


def test_write_through_close_and_fsync_wait_for_the_bucket(mount: MountFactory) -> None:
    m = mount(write_mode="through", upload_delay=LONG_DELAY)
    body = os.urandom(MiB + 3)
    with open(m.path / "wt.bin", "wb") as f:
        f.write(body)
    assert bucket_get(m, "wt.bin")[0] == body, "close() returned before the upload"

    fd = os.open(m.path / "wt2.txt", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"first")
        os.fsync(fd)
        assert bucket_get(m, "wt2.txt")[0] == b"first", "fsync() returned before the upload"
        os.write(fd, b" second")
        os.fsync(fd)
        assert bucket_get(m, "wt2.txt")[0] == b"first second"
    finally:
        os.close(fd)
    assert bucket_get(m, "wt2.txt")[0] == b"first second"
    assert status(m)["pending_uploads"] == 0


# --- renames and deletes racing the bucket -----------------------------------------------------


def test_renames_over_targets_and_reused_names_end_up_right(mount: MountFactory) -> None:
    cold = {
        "d/c1.txt": b"c1",
        "d/c2.bin": os.urandom(MiB + 1),
        "f.txt": b"f",
        "target.txt": b"old target, only in the bucket",
    }
    m = mount(cold, upload_delay=LONG_DELAY)
    p = m.path
    os.rename(p / "f.txt", p / "target.txt")  # over a bucket-only file
    os.rename(p / "d" / "c1.txt", p / "c1.txt")
    # the directory moves, and a new one takes its old name, with a file of
    # the same name as one that moved away
    os.rename(p / "d", p / "e")
    os.mkdir(p / "d")
    (p / "d" / "c2.bin").write_bytes(b"the new c2")
    (p / "f.txt").write_bytes(b"the new f")
    flush(m)
    files = {k for k in bucket_keys(m) if not k.endswith("/")}
    assert files == {"target.txt", "c1.txt", "e/c2.bin", "d/c2.bin", "f.txt"}, files
    assert bucket_get(m, "target.txt")[0] == b"f"
    assert bucket_get(m, "c1.txt")[0] == b"c1"
    assert bucket_get(m, "e/c2.bin")[0] == cold["d/c2.bin"]
    assert bucket_get(m, "d/c2.bin")[0] == b"the new c2"
    assert bucket_get(m, "f.txt")[0] == b"the new f"


def test_rename_chmod_rename_of_clean_file_reaches_the_bucket(mount: MountFactory) -> None:
    m = mount({"f.txt": b"f"}, upload_delay=LONG_DELAY)
    os.rename(m.path / "f.txt", m.path / "g.txt")
    os.chmod(m.path / "g.txt", 0o600)
    os.rename(m.path / "g.txt", m.path / "h.txt")
    # renames and metadata go to the bucket without upload_delay; a few
    # seconds are plenty (a flush would only fail after its retry budget)
    settled = wait_until(lambda: status(m)["pending_uploads"] == 0, 5.0, interval=0.2)
    assert settled, f"journal stuck: {status(m)['last_sync_error']}"
    assert bucket_keys(m) == {"h.txt", ".tierfs-attrs/h.txt@m0600,u0,g0"}
    body, meta = bucket_get(m, "h.txt")
    assert body == b"f"
    assert meta["mode"] == str(stat.S_IFREG | 0o600), meta


def test_file_written_across_a_rename_lands_under_the_new_name(mount: MountFactory) -> None:
    m = mount({"dir/old.bin": os.urandom(MiB)}, upload_delay=LONG_DELAY)
    fd = os.open(m.path / "dir" / "old.bin", os.O_WRONLY)
    try:
        os.pwrite(fd, b"before", 0)
        os.fsync(fd)
        os.rename(m.path / "dir", m.path / "moved")
        os.rename(m.path / "moved" / "old.bin", m.path / "moved" / "new.bin")
        os.pwrite(fd, b"after", MiB + 10)
    finally:
        os.close(fd)
    flush(m)
    keys = bucket_keys(m)
    assert {k for k in keys if not k.endswith("/")} == {"moved/new.bin"}, keys
    body = bucket_get(m, "moved/new.bin")[0]
    assert len(body) == MiB + 15
    assert body[:6] == b"before" and body[-5:] == b"after"
    assert body[MiB : MiB + 10] == bytes(10)


def test_unlinked_open_dirty_file_never_reaches_the_bucket(mount: MountFactory) -> None:
    m = mount({"cold.txt": b"cold"}, upload_delay="1s")
    fd = os.open(m.path / "tmp.bin", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, os.urandom(MiB))
        os.fsync(fd)
        os.unlink(m.path / "tmp.bin")
        os.write(fd, b"more after the unlink")
        os.fsync(fd)
        time.sleep(2.0)  # longer than upload_delay
        assert os.pread(fd, 21, MiB) == b"more after the unlink"
    finally:
        os.close(fd)
    flush(m)
    assert bucket_keys(m) == {"cold.txt"}
    st = status(m)
    assert st["pending_uploads"] == 0 and st["dirty_bytes"] == 0, st
    assert sum(t["used"] for t in st["tiers"]) == 0, st["tiers"]


def test_utime_chown_of_clean_file_and_symlink_in_the_bucket(mount: MountFactory) -> None:
    m = mount({"clean.txt": b"clean bytes"}, upload_delay=LONG_DELAY)
    mtime = 1_500_000_000
    os.utime(m.path / "clean.txt", (mtime, mtime))
    if os.geteuid() == 0:
        os.chown(m.path / "clean.txt", 4321, 8765)
    os.symlink("clean.txt", m.path / "link")
    flush(m)
    body, meta = bucket_get(m, "clean.txt")
    assert body == b"clean bytes"
    assert float(meta["mtime"]) == pytest.approx(mtime, abs=1e-6), meta
    if os.geteuid() == 0:
        assert (meta["uid"], meta["gid"]) == ("4321", "8765"), meta
    body, meta = bucket_get(m, "link")
    assert body == b"clean.txt"
    assert stat.S_ISLNK(int(meta["mode"])), meta
    assert m.where_one("clean.txt")["cached_bytes"] == 0
