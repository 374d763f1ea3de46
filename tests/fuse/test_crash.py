"""Crash tests: ``kill -9`` the daemon, ``fusermount3 -uz``, remount, and
check that nothing that was fsynced is lost.

``test_kill9_with_uploads_pending_loses_nothing_fsynced``: with a long
``upload_delay`` nothing reaches the bucket.  Files are written and fsynced
(some renamed, one unlinked, one rewritten in place after its first fsync,
one empty directory), and a large file is being written by a thread when the
daemon is killed: its first part was fsynced, the rest was not.  The test
first proves that the uploads were still owed at the kill (``pending_uploads``
and an empty bucket), otherwise it would prove nothing.  After the remount on
the same state and tiers every fsynced file reads back intact (for the large
file: at least its fsynced prefix).  After ``tierfs flush`` the bucket holds
exactly those files, with those bytes.  Then the tiers and the state dir are
wiped and a fresh mount on the same bucket shows the same files from S3 alone.

``test_kill9_during_multipart_upload_leaves_no_upload_behind``: a large file
is uploading (a loopback proxy delays every S3 response, so that the upload
is slow and the kill lands between parts) when the daemon is killed.  The
test proves that a multipart upload was open and the object absent at the
kill.  After remount and flush the object is complete and correct, and no
multipart upload is left open: the remount aborted the one recorded in the
journal.  (The mount's cleanup of old uploads is made to fail for that
remount, because moto dates every upload 2010-11-10 and the cleanup would
otherwise abort it first and hide whether the journal does.)

Cleanup: the ``mount`` fixture unmounts every mount point it made and stops
only the daemons it started, by PID; the tests here kill only the daemon PID
that ``tierfs status --json`` reports for their own mount.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.crashloop import CrashLoop, kill9, mounted
from tests.faults import FaultProxy
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    run_tierfs,
    wait_until,
)

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB


# --- helpers ---------------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pattern(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def with_write_config(m: Mount, **write: str) -> None:
    """Add a ``[write]`` table to the config the ``mount`` factory wrote."""
    lines = "".join(f'{k} = "{v}"\n' for k, v in write.items())
    with open(m.config_path, "a") as f:
        f.write(f"\n[write]\n{lines}")


def through_proxy(m: Mount, fault_proxy: FaultProxy) -> None:
    """Point the config the ``mount`` factory wrote at ``proxy``."""
    config = m.config_path.read_text()
    direct = f"endpoint_url = {json.dumps(m.endpoint)}"
    assert direct in config
    via_proxy = f"endpoint_url = {json.dumps(f'http://127.0.0.1:{fault_proxy.port}')}"
    m.config_path.write_text(config.replace(direct, via_proxy))


def write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bucket_keys(m: Mount) -> list[str]:
    """Keys under the mount's prefix, relative to it."""
    prefix = m.prefix + "/"
    keys: list[str] = []
    for page in m.s3.get_paginator("list_objects_v2").paginate(Bucket=m.bucket, Prefix=prefix):
        keys += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
    return keys


def bucket_body(m: Mount, name: str) -> bytes:
    body: bytes = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))["Body"].read()
    return body


def open_uploads(m: Mount) -> list[dict[str, Any]]:
    uploads: list[dict[str, Any]] = m.s3.list_multipart_uploads(
        Bucket=m.bucket, Prefix=m.prefix + "/"
    ).get("Uploads", [])
    return uploads


def daemon_pid(m: Mount) -> int:
    return int(m.status()["pid"])


def flush(m: Mount, timeout: float = 120.0) -> None:
    done = run_tierfs("flush", str(m.path), timeout=timeout)
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr.strip()}\n{m.log_tail()}"


def wipe_local_state(m: Mount) -> None:
    """Forget everything local: state dir (LMDB, journal, log) and tiers."""
    assert not mounted(m.path)
    shutil.rmtree(m.state_dir)
    for tier_dir in m.tier_dirs.values():
        shutil.rmtree(tier_dir)
        tier_dir.mkdir()


class BigWriter(threading.Thread):
    """Writes ``synced`` bytes and fsyncs them, then keeps writing (never
    fsyncing) until ``total`` bytes, a write error (the daemon died), or
    ``stop``.  ``unsynced`` counts the bytes written after the fsync."""

    CHUNK = MiB

    def __init__(self, path: Path, seed: int, synced: int, total: int) -> None:
        super().__init__(name="big-writer", daemon=True)
        self.path = path
        self.data = pattern(seed, total)
        self.synced = synced
        self.fsynced = threading.Event()
        self.stop = threading.Event()
        self.written = 0
        self.error: BaseException | None = None

    @property
    def unsynced(self) -> int:
        return max(0, self.written - self.synced)

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while self.written < len(self.data) and not self.stop.is_set():
                end = min(len(self.data), self.written + self.CHUNK)
                if self.written < self.synced < end:
                    end = self.synced
                self.written += os.write(fd, self.data[self.written : end])
                if self.written == self.synced and not self.fsynced.is_set():
                    os.fsync(fd)
                    self.fsynced.set()
                elif self.fsynced.is_set():
                    time.sleep(0.05)  # slowly: still writing when the kill comes
        except OSError as exc:
            self.error = exc
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)


# --- kill -9 while uploads are pending ----------------------------------------------------------

SMALL_FILES = {
    "empty": b"",
    "one-byte": b"1",
    "small/a.bin": pattern(1, 100 * KiB),
    "small/deep/b.bin": pattern(2, MiB + 1),  # crosses a block boundary
    "c.bin": pattern(3, 3 * MiB + 17),
}
BIG = "big.bin"
BIG_SYNCED = 24 * MiB
BIG_TOTAL = 56 * MiB


def test_kill9_with_uploads_pending_loses_nothing_fsynced(mount: MountFactory) -> None:
    m = mount(
        nvme="128MiB",
        hdd="256MiB",
        block_size="1MiB",
        readahead_max="8MiB",
        list_ttl="2s",
        do_mount=False,
    )
    with_write_config(m, upload_delay="1h")  # nothing may go up before the kill
    m.mount()
    root = m.path

    # --- the manifest: what fsync promised --------------------------------------
    manifest: dict[str, bytes] = {}  # path -> fsynced content
    (root / "small" / "deep").mkdir(parents=True)
    (root / "emptydir").mkdir()
    for name, body in SMALL_FILES.items():
        write_synced(root / name, body)
        manifest[name] = body
    write_synced(root / "to-rename", pattern(4, 200 * KiB))
    os.rename(root / "to-rename", root / "small" / "renamed")
    manifest["small/renamed"] = pattern(4, 200 * KiB)
    write_synced(root / "doomed", pattern(5, 10 * KiB))
    os.unlink(root / "doomed")
    rewritten = bytearray(pattern(6, 2 * MiB))
    write_synced(root / "rewritten", bytes(rewritten))
    patch = pattern(7, 5000)
    fd = os.open(root / "rewritten", os.O_WRONLY)
    try:
        os.pwrite(fd, patch, MiB - 100)  # across the block boundary
        os.fsync(fd)
    finally:
        os.close(fd)
    rewritten[MiB - 100 : MiB - 100 + len(patch)] = patch
    manifest["rewritten"] = bytes(rewritten)
    for d in ("", "small", "small/deep"):
        fsync_dir(root / d)
    gone = ["doomed", "to-rename"]
    dirs = ["small", "small/deep", "emptydir"]

    writer = BigWriter(root / BIG, seed=8, synced=BIG_SYNCED, total=BIG_TOTAL)
    writer.start()
    try:
        assert writer.fsynced.wait(timeout=60), (
            f"the big file's fsync never returned: {writer.error}"
        )
        big_prefix = writer.data[:BIG_SYNCED]
        assert wait_until(lambda: writer.unsynced >= 4 * MiB or not writer.is_alive(), 60)
        assert writer.error is None, f"the big writer failed before the kill: {writer.error}"

        # --- proof that the kill comes before the uploads --------------------
        # (Directory markers and deletes are not delayed; file uploads are.)
        status = m.status()
        assert status["pending_uploads"] > 0, status
        assert status["dirty_bytes"] >= sum(map(len, manifest.values())) + BIG_SYNCED, status
        in_bucket = set(bucket_keys(m))
        early = [n for n in [*manifest, BIG] if n in in_bucket]
        assert not early, f"uploaded before the kill despite upload_delay: {early}"
        pending = [*manifest, BIG]
        pid = daemon_pid(m)
        assert writer.is_alive(), "the big writer finished before the kill"
        kill9(m, pid)
        unsynced_at_kill = writer.unsynced
    finally:
        writer.join(timeout=30)  # its next write fails on the dead mount
        writer.stop.set()
    assert not writer.is_alive(), "the big writer hangs on the dead mount"
    assert 0 < unsynced_at_kill < BIG_TOTAL - BIG_SYNCED, (
        f"the big file was not being written at the kill ({unsynced_at_kill} bytes unsynced)"
    )
    assert writer.error is not None, "the big writer did not notice the dead daemon"
    arrived = [n for n in pending if n in bucket_keys(m)]
    assert not arrived, f"pending uploads reached the bucket after the kill: {arrived}"

    # --- remount on the same state and tiers ---------------------------------------
    m.mount()
    assert int(m.status()["pid"]) != pid
    for name, body in manifest.items():
        got = (root / name).read_bytes()
        assert sha(got) == sha(body), f"{name}: fsynced content lost ({len(got)} of {len(body)})"
    for name in gone:
        assert not (root / name).exists(), f"{name} came back after the crash"
    for d in dirs:
        assert (root / d).is_dir(), f"directory {d} lost in the crash"
    big_after = (root / BIG).read_bytes()
    assert len(big_after) >= BIG_SYNCED, f"{BIG}: {len(big_after)} bytes, {BIG_SYNCED} fsynced"
    assert big_after[:BIG_SYNCED] == big_prefix, f"{BIG}: the fsynced prefix changed"
    final = {**manifest, BIG: big_after}

    # --- flush: the bucket gets exactly the surviving files ---------------------------
    flush(m)
    keys = bucket_keys(m)
    for name, body in final.items():
        assert name in keys, f"{name} missing from the bucket after flush"
        got = bucket_body(m, name)
        assert sha(got) == sha(body), f"{name}: bucket has {len(got)} bytes, wrong content"
    markers = {d + "/" for d in dirs}
    stale = [k for k in keys if k not in final and k not in markers]
    assert not stale, f"stale keys in the bucket: {stale}"
    assert "emptydir/" in keys, "the empty directory has no marker in the bucket"
    assert open_uploads(m) == [], open_uploads(m)
    assert m.status()["pending_uploads"] == 0

    # --- nothing local left: the bucket alone brings everything back -------------------
    m.umount()
    wipe_local_state(m)
    m.mount()
    assert sum(t["used"] for t in m.status()["tiers"]) == 0, "tiers not empty after the wipe"
    for name, body in final.items():
        got = (root / name).read_bytes()
        assert sha(got) == sha(body), f"{name}: wrong content from the bucket alone"
    for name in gone:
        assert not (root / name).exists(), f"{name} came back from the bucket"
    for d in dirs:
        assert (root / d).is_dir(), f"directory {d} missing from the bucket"
    assert m.status()["counters"]["fetched_bytes"] >= sum(map(len, final.values()))


# --- kill -9 while a multipart upload is in flight ----------------------------------------------

INFLIGHT = "inflight.bin"
INFLIGHT_SIZE = 40 * MiB  # 1 MiB blocks: 8 MiB parts, 5 of them
PROXY_DELAY = 2.0  # seconds before each S3 response reaches the daemon


def test_kill9_during_multipart_upload_leaves_no_upload_behind(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    # Long TTLs: no LIST or HEAD goes through the slow proxy after the write.
    m = mount(
        nvme="128MiB",
        hdd="128MiB",
        block_size="1MiB",
        list_ttl="1h",
        revalidate_ttl="1h",
        do_mount=False,
    )
    through_proxy(m, fault_proxy)
    with_write_config(m, upload_delay="0s", part_size="8MiB")
    m.mount()

    body = pattern(9, INFLIGHT_SIZE)
    fault_proxy.delay = PROXY_DELAY  # from here on, the upload crawls
    write_synced(m.path / INFLIGHT, body)
    key = m.key(INFLIGHT)

    def parts_arrived() -> bool:
        for upload in open_uploads(m):
            if upload["Key"] == key:
                listed = m.s3.list_parts(Bucket=m.bucket, Key=key, UploadId=upload["UploadId"])
                if listed.get("Parts"):
                    return True
        return False

    # A part on the server means the upload id was recorded in the journal
    # first (it is, before any part); the parts' answers are still delayed.
    assert wait_until(parts_arrived, timeout=60, interval=0.05), (
        f"no part of the multipart upload arrived\n{m.log_tail()}"
    )
    seen = time.monotonic()
    assert m.where_one(INFLIGHT)["state"] == "uploading"
    kill9(m, daemon_pid(m))
    killed_after = time.monotonic() - seen
    fault_proxy.delay = 0.0

    # --- proof that the kill cut the upload --------------------------------------------
    in_flight = [u for u in open_uploads(m) if u["Key"] == key]
    assert INFLIGHT not in bucket_keys(m), (
        f"the upload completed before the kill ({killed_after:.1f} s after its first part)"
    )
    assert in_flight, "no multipart upload open after the kill: test proves nothing"

    # moto reports every multipart upload as initiated on 2010-11-10, so the
    # mount's cleanup of "uploads older than a day" would abort this one too
    # and hide whether the journal replay aborts it.  Make that cleanup fail
    # (its ListMultipartUploads answers are lost) for this remount.
    fault_proxy.fail_responses(
        50, kind="reset", match=lambda line: line.startswith("GET ") and "?uploads" in line
    )
    log_start = len(m.log_text())
    m.mount()
    assert (m.path / INFLIGHT).read_bytes() == body, "fsynced content lost in the crash"
    flush(m)
    assert fault_proxy.faults_injected > 0, "the stale-upload cleanup did not run"
    # The cleanup runs beside the uploads and gives up after its retries.
    assert wait_until(
        lambda: "cannot clean up stale multipart uploads" in m.log_text()[log_start:],
        timeout=30,
    ), f"the stale-upload cleanup was not bypassed:\n{m.log_text()[log_start:]}"
    fault_proxy.clear_faults()
    got = bucket_body(m, INFLIGHT)
    assert len(got) == len(body) and sha(got) == sha(body), "the object in the bucket is wrong"
    leaked = [u for u in open_uploads(m) if u["Key"] == key]
    assert not leaked, f"multipart uploads left open after remount + flush: {leaked}"
    assert m.status()["pending_uploads"] == 0


# --- regression: a bug the crash test ran into ----------------------------------------------


def test_rename_keeps_the_upload_delay(mount: MountFactory) -> None:
    """A rename re-queues the file's upload behind the rename's own bucket
    changes; the re-queued upload must keep its due time (it was uploaded at
    once instead, which made the crash test's "nothing uploaded yet" proof
    fail for renamed files)."""
    m = mount(do_mount=False)
    with_write_config(m, upload_delay="1h")
    m.mount()
    (m.path / "a").write_bytes(b"hello")
    (m.path / "b").write_bytes(b"world")
    os.rename(m.path / "a", m.path / "renamed")
    time.sleep(2.5)  # the uploader looks at least once a second
    assert m.status()["pending_uploads"] == 2
    assert bucket_keys(m) == [], "uploaded before upload_delay ran out"


def test_unlink_during_upload_does_not_block_flush(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    m = mount(list_ttl="1h", revalidate_ttl="1h", do_mount=False)
    through_proxy(m, fault_proxy)
    with_write_config(m, upload_delay="0s")
    m.mount()
    path = m.path / "f"
    path.write_bytes(b"v1")
    flush(m)  # "f" has an object now
    fault_proxy.delay = 1.0  # the next upload is slow
    with open(path, "ab") as f:
        f.write(b"v2")
    assert wait_until(lambda: m.where_one("f")["state"] == "uploading", timeout=10, interval=0.05)
    os.unlink(path)
    fault_proxy.delay = 0.0
    try:
        done = run_tierfs("flush", str(m.path), timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tierfs flush hangs; status: {m.status()}")
    assert done.returncode == 0, done.stderr
    assert bucket_keys(m) == [], "the unlinked file's object is still in the bucket"


def test_delete_of_a_new_file_waits_for_its_upload_in_flight(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    """Unlink of a never-uploaded file while its first PUT is on the wire:
    the DELETE must not overtake the PUT.  The PUT's answer is lost, so
    tierfs sends it again after the unlink: a DELETE that ran meanwhile would
    leave the object behind.  (The model test found such an overtaking once;
    this test pins the outcome, it does not force that interleaving.)"""
    m = mount(list_ttl="1h", revalidate_ttl="1h", do_mount=False)
    through_proxy(m, fault_proxy)
    with_write_config(m, upload_delay="0s")
    m.mount()
    fault_proxy.delay = 1.0  # every answer comes a second late ...
    fault_proxy.fail_responses(1, kind="reset", match=lambda line: line.startswith("PUT "))
    (m.path / "new").write_bytes(b"first version")
    assert wait_until(lambda: m.where_one("new")["state"] == "uploading", timeout=10, interval=0.02)
    os.unlink(m.path / "new")
    fault_proxy.delay = 0.0
    done = run_tierfs("flush", str(m.path), timeout=60)
    assert done.returncode == 0, done.stderr
    assert fault_proxy.faults_injected == 1, "the PUT's answer was not lost: test proves nothing"
    assert bucket_keys(m) == [], "the unlinked file's object came back"


# --- the kill -9 loop: fsync makes a new file's name durable ------------------------------------


def crash_loop(
    mount: MountFactory, tmp_path: Path, *, seed: int, upload_delay: str, pinned: bool = True
) -> CrashLoop:
    m = mount(
        nvme="256MiB",
        hdd="512MiB",
        block_size="1MiB",
        list_ttl="1s",
        revalidate_ttl="1s",
        upload_delay=upload_delay,
    )
    workdir = tmp_path / "crashloop"
    workdir.mkdir()
    return CrashLoop(m, workdir, writers=2, min_files=3, max_pause=1.0, seed=seed, pinned=pinned)


#: Rounds of the default kill -9 loop: two, so that a later crash is seen not
#: to lose an earlier round's files (``check_all``).
KILL9_ROUNDS = 2


@pytest.mark.parametrize("upload_delay", ["1h", "0s"])
def test_kill9_loop_keeps_every_fsynced_file(
    mount: MountFactory, tmp_path: Path, upload_delay: str
) -> None:
    """Two rounds of create (some in new directories), write, fsync,
    kill -9, remount: every fsynced file is there by its name, with its bytes,
    the first round's files after the second kill too.  With ``upload_delay
    = 1h`` nothing but directory markers reaches the bucket before a kill;
    with ``0s`` uploads race the kills.  (20 rounds: ``test_kill9_loop_long``,
    under ``--run-slow``.)"""
    loop = crash_loop(mount, tmp_path, seed=11, upload_delay=upload_delay)
    for _ in range(KILL9_ROUNDS):
        result = loop.round()
        assert not result.lost and not result.damaged, loop.summary()
        assert not result.stray, f"a pinned writer wrote beside the mount: {loop.summary()}"
    assert loop.fsynced >= KILL9_ROUNDS * 2 * loop.min_files, loop.summary()
    assert loop.check_all() == ([], []), loop.summary()
    # The proof that the kills cut something: uploads were still owed.  With
    # no upload delay a round may find everything uploaded, not all rounds.
    owed = [r.pending_at_kill > 0 for r in loop.rounds]
    assert all(owed) if upload_delay == "1h" else any(owed), (
        f"nothing was owed to the bucket at a kill: {loop.summary()}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("upload_delay", ["5s", "0s"])
def test_kill9_loop_long(mount: MountFactory, tmp_path: Path, upload_delay: str) -> None:
    """The long loop: 20 rounds.  Prints the totals (files fsynced, lost)."""
    loop = crash_loop(mount, tmp_path, seed=20, upload_delay=upload_delay)
    for _ in range(20):
        loop.round()
    print(f"kill -9 loop (upload_delay {upload_delay}): {loop.summary()}")
    assert sum(r.pending_at_kill > 0 for r in loop.rounds) >= 15, loop.summary()
    assert not loop.lost and not loop.damaged, loop.summary()
    assert loop.check_all() == ([], []), loop.summary()
    assert not any(r.stray for r in loop.rounds), loop.summary()


@pytest.mark.slow
def test_kill9_loop_losses_of_a_path_writer_are_beside_the_mount(
    mount: MountFactory, tmp_path: Path
) -> None:
    """Why a naive kill -9 loop "loses" the last file fsynced before a kill.

    A writer that uses plain paths goes on after ``fusermount3 -uz``: its
    paths now name the bare mount point directory, so its next mkdir,
    create, write and fsync succeed THERE, and it promises a file tierfs
    never saw.  Every file such a loop reports lost must be one of those."""
    loop = crash_loop(mount, tmp_path, seed=21, upload_delay="5s", pinned=False)
    for _ in range(20):
        loop.round()
    print(f"kill -9 loop, writers on plain paths: {loop.summary()}")
    stray = {name for r in loop.rounds for name in r.stray}
    assert set(loop.lost) <= stray, f"lost files that were written to the mount: {loop.summary()}"
    assert not loop.damaged, loop.summary()
