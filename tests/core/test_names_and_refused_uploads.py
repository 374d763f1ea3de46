"""Names and keys too long (refused up front), and uploads the bucket refuses
for good, without a mount.

The store under test is S3 with the prefix ``pre/`` (4 bytes): a relative
key may have at most 1,020 bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import pytest
import trio

from tests.faults import FaultProxy, single_put_of
from tierfs.errors import NameTooLong, NotFound, StoreError
from tierfs.meta import ROOT_INO

#: Bytes a key relative to the store prefix ``pre/`` may have.
KEY_ROOM = 1024 - len("pre/")


async def _deep_parent(fs: Any) -> tuple[int, int]:
    """Four nested directories of 200-byte names: (inode, key length)."""
    parent, key_len = ROOT_INO, -1
    for letter in "pqrs":
        attrs = await fs.mkdir(parent, letter.encode() * 200, 0o755, 0, 0)
        parent, key_len = attrs.ino, key_len + 1 + 200
    return parent, key_len


def _assert_too_long(info: pytest.ExceptionInfo[NameTooLong]) -> None:
    assert info.value.errno == errno.ENAMETOOLONG


async def test_lookup_of_a_name_over_255_bytes_is_enametoolong(make_fs: Any) -> None:
    mount = await make_fs()
    with pytest.raises(NameTooLong) as info:
        await mount.fs.lookup(ROOT_INO, b"n" * 256)
    _assert_too_long(info)
    with pytest.raises(NameTooLong):
        await mount.fs.namespace.resolve("n" * 256)
    # 255 bytes is a valid name that does not exist.
    with pytest.raises(NotFound):
        await mount.fs.lookup(ROOT_INO, b"n" * 255)


async def test_names_whose_key_would_pass_1024_bytes_are_refused_up_front(make_fs: Any) -> None:
    mount = await make_fs()
    fs = mount.fs
    parent, parent_len = await _deep_parent(fs)
    room = KEY_ROOM - parent_len - 1  # bytes left for a child's name
    assert 0 < room < 255, room
    journal_before = len(fs.journal)

    with pytest.raises(NameTooLong) as info:
        await fs.create(parent, b"f" * (room + 1), 0o644, os.O_WRONLY, 0, 0)
    _assert_too_long(info)
    with pytest.raises(NameTooLong) as info:
        await fs.mkdir(parent, b"d" * room, 0o755, 0, 0)  # its marker "d.../" is one more
    _assert_too_long(info)
    with pytest.raises(NameTooLong) as info:
        await fs.symlink(parent, b"l" * (room + 1), b"target", 0, 0)
    _assert_too_long(info)
    with pytest.raises(NameTooLong) as info:
        await fs.mknod(parent, b"m" * (room + 1), stat.S_IFIFO | 0o644, 0, 0)
    _assert_too_long(info)
    assert len(fs.journal) == journal_before, "a refused name must queue nothing"
    assert fs.meta.read_dir(parent, 0, 10) == []

    # Exactly at the limit: accepted, and the bucket takes the key.
    opened, _ = await fs.create(parent, b"f" * room, 0o644, os.O_WRONLY, 0, 0)
    await fs.write(opened.fh, 0, b"fits")
    await fs.release(opened.fh)
    await fs.mkdir(parent, b"d" * (room - 1), 0o755, 0, 0)
    await mount.flush()
    assert (await fs.where(fs.path_of((await fs.lookup(parent, b"f" * room)).ino)))[
        "state"
    ] == "clean"


async def test_rename_checks_the_new_key_and_the_deepest_key_below_a_directory(
    make_fs: Any,
) -> None:
    mount = await make_fs()
    fs = mount.fs
    parent, parent_len = await _deep_parent(fs)
    room = KEY_ROOM - parent_len - 1

    # A file renamed into the deep directory.
    await mount.write_file("short", b"x", fsync=False)
    with pytest.raises(NameTooLong) as info:
        await fs.rename(ROOT_INO, b"short", parent, b"f" * (room + 1), 0)
    _assert_too_long(info)
    assert (await fs.lookup(ROOT_INO, b"short")).size == 1, "a refused rename changes nothing"

    # A directory whose deepest key is 250/250/200 bytes below it (702).
    top = await fs.mkdir(ROOT_INO, b"mv", 0o755, 0, 0)
    mid = await fs.mkdir(top.ino, b"a" * 250, 0o755, 0, 0)
    low = await fs.mkdir(mid.ino, b"b" * 250, 0o755, 0, 0)
    opened, _ = await fs.create(low.ino, b"c" * 200, 0o644, os.O_WRONLY, 0, 0)
    await fs.release(opened.fh)
    deepest = 250 + 1 + 250 + 1 + 200
    p_dir = await fs.lookup(ROOT_INO, b"p" * 200)
    # Into p...(200 bytes): 200 + 1 + name + 1 + 702 <= KEY_ROOM.
    fits = KEY_ROOM - 200 - 1 - 1 - deepest
    assert 0 < fits < 255
    with pytest.raises(NameTooLong) as info:
        await fs.rename(ROOT_INO, b"mv", p_dir.ino, b"n" * (fits + 1), 0)
    _assert_too_long(info)
    assert (await fs.lookup(ROOT_INO, b"mv")).ino == top.ino
    await fs.rename(ROOT_INO, b"mv", p_dir.ino, b"n" * fits, 0)
    await mount.flush()
    moved = await fs.namespace.resolve(
        "/".join(["p" * 200, "n" * fits, "a" * 250, "b" * 250, "c" * 200])
    )
    assert moved.is_file


@pytest.fixture
def s3_store(s3_store_through_proxy: Any) -> Any:
    """Through FaultProxy: single PUTs go through the native engine, not botocore."""
    return s3_store_through_proxy


async def test_an_upload_refused_for_good_fails_the_flush_at_once_and_holds_up_nothing(
    make_fs: Any, s3_store: Any, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs()
    fs = mount.fs
    fault_proxy.answer_requests(
        10**6, status=400, code="InvalidArgument", match=single_put_of("bad.bin")
    )
    await mount.write_file("bad.bin", b"refused by the bucket")
    for i in range(3):
        await mount.write_file(f"good{i}.bin", b"good %d" % i)

    started = trio.current_time()
    with trio.fail_after(10), pytest.raises(StoreError) as info:
        await fs.flush_path("")
    took = trio.current_time() - started
    message = str(info.value)
    assert "bad.bin" in message and "InvalidArgument" in message, message
    assert "good" not in message, message
    assert took < 5, f"the flush took {took:.1f} s to fail"
    for i in range(3):  # every other file became durable
        assert s3_store.get_range(f"good{i}.bin", 0, 6) == b"good %d" % i
    # The uploader's own attempt (upload_delay is 50 ms here) and the flush's one.
    assert 1 <= fault_proxy.faults_injected <= 2, (
        "a refusal for good is not retried within the flush"
    )
    attempts = fault_proxy.faults_injected

    where = await fs.where("bad.bin")
    assert where["state"] == "failed"
    assert "InvalidArgument" in where["failed_reason"]
    assert (await fs.where(""))["failed_files"] == 1
    status = fs.status()
    assert status["failed_files"] == 1
    assert [f["path"] for f in status["failed"]] == ["bad.bin"]
    assert "InvalidArgument" in status["failed"][0]["reason"]

    # Kept, but not retried on its own (no request storm against the bucket).
    seq = fs.journal.upload_seq[where_ino := (await fs.lookup(ROOT_INO, b"bad.bin")).ino]
    assert seq in fs.journal.refused
    await trio.sleep(2.5)
    assert fault_proxy.faults_injected == attempts

    # Each flush gives it one attempt: it fails again, quickly.
    with trio.fail_after(10), pytest.raises(StoreError, match=r"bad\.bin"):
        await fs.flush_path("")
    assert fault_proxy.faults_injected == attempts + 1

    # The operator fixes the cause: the next flush completes.
    fault_proxy.clear_faults()
    await mount.flush()
    assert s3_store.get_range("bad.bin", 0, 7) == b"refused"
    assert (await fs.where("bad.bin"))["state"] == "clean"
    assert fs.status()["failed_files"] == 0
    assert fs.journal.upload_seq.get(where_ino) is None


async def test_a_refused_entry_is_dropped_by_removing_its_file_and_survives_a_remount(
    make_fs: Any, s3_store: Any, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs()
    fault_proxy.answer_requests(
        10**6, status=400, code="KeyTooLongError", match=single_put_of("bad.bin")
    )
    await mount.write_file("bad.bin", b"never uploaded")
    with trio.fail_after(10), pytest.raises(StoreError, match="KeyTooLongError"):
        await mount.fs.flush_path("bad.bin")

    # Kept across a remount (the journal is durable), retried once there.
    mount = await mount.remount()
    with trio.fail_after(10), pytest.raises(StoreError, match=r"bad\.bin"):
        await mount.fs.flush_path("")
    assert (await mount.fs.where("bad.bin"))["state"] == "failed"

    # Removing the file drops its entry: flushes succeed again.
    await mount.fs.unlink(ROOT_INO, b"bad.bin")
    assert len(mount.fs.journal) == 0 or all(
        e["op"] != "upload" for e in mount.fs.journal.entries.values()
    )
    await mount.flush()
    assert mount.fs.status()["failed_files"] == 0


async def test_a_refused_file_renamed_to_an_accepted_name_goes_up(
    make_fs: Any, s3_store: Any, fault_proxy: FaultProxy
) -> None:
    mount = await make_fs()
    fault_proxy.answer_requests(
        10**6, status=400, code="InvalidArgument", match=single_put_of("bad.bin")
    )
    await mount.write_file("bad.bin", b"renamed")
    with trio.fail_after(10), pytest.raises(StoreError):
        await mount.fs.flush_path("")
    await mount.fs.rename(ROOT_INO, b"bad.bin", ROOT_INO, b"ok.bin", 0)
    await mount.flush()
    assert s3_store.get_range("ok.bin", 0, 7) == b"renamed"
    assert (await mount.fs.where("ok.bin"))["state"] == "clean"
