"""Damaged dirty blocks through a real mount: never served, never uploaded.

A file is written through the mount with a long ``upload_delay`` (so it
stays dirty), bits are flipped in its tier cache file
(``<tier>/data/<ino % 256 hex>/<ino>``), and then: a read of the damaged
block gets EIO, the other blocks still read, ``tierfs where --json`` shows
the file ``failed`` with the block, ``tierfs status --json`` counts it and
its tier accounting still equals the bytes on disk, ``tierfs flush`` fails
naming the file, and the bucket never gets the object (HEAD against the S3
server).  The state survives a remount; rewriting the file (what an
operator does) uploads the good bytes and clears ``failed``.
"""

from __future__ import annotations

import errno
import os
import random

import pytest
from botocore.exceptions import ClientError

from tests.fuse.conftest import Mount, MountFactory, run_tierfs

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024


def write_file(path: os.PathLike[str], data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:MiB]) :]
    finally:
        os.close(fd)


def object_exists(m: Mount, name: str) -> bool:
    try:
        m.s3.head_object(Bucket=m.bucket, Key=m.key(name))
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("404", "NoSuchKey"), exc
        return False
    return True


def read_error(path: os.PathLike[str], offset: int, size: int) -> int | None:
    """The errno of a pread through the mount, or None if it succeeds."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, size, offset)
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)
    return None


def tier_used(m: Mount) -> int:
    return sum(int(t["used"]) for t in m.status()["tiers"])


def test_damaged_dirty_block_is_never_served_nor_uploaded(mount: MountFactory) -> None:
    m = mount(upload_delay="1h", block_size="1MiB", nvme="64MiB")
    data = random.Random(5).randbytes(3 * MiB + 4321)
    path = m.path / "ckpt.pt"
    write_file(path, data)
    ino = os.stat(path).st_ino
    assert m.where_one("ckpt.pt")["state"] == "dirty"
    cache_file = m.tier_dirs["nvme"] / "data" / f"{ino % 256:02x}" / str(ino)
    assert cache_file.stat().st_size == len(data), "the file is not on the nvme tier"
    assert tier_used(m) == len(data)

    with open(cache_file, "r+b") as f:  # flip bits inside block 1
        f.seek(MiB + 1000)
        good = f.read(16)
        f.seek(MiB + 1000)
        f.write(bytes(b ^ 0x24 for b in good))

    assert read_error(path, MiB + 4096, 4096) == errno.EIO
    assert read_error(path, MiB, MiB) == errno.EIO, "the damaged block was served"
    with open(path, "rb") as f:  # the undamaged blocks still read
        assert f.read(MiB) == data[:MiB]
        f.seek(2 * MiB)
        assert f.read() == data[2 * MiB :]
    assert "DAMAGED DATA in 'ckpt.pt'" in m.log_text()

    where = m.where_one("ckpt.pt")
    assert where["state"] == "failed" and where["damaged_blocks"] == [1], where
    status = m.status()
    assert status["failed_files"] == 1
    assert status["counters"]["damaged_dirty_blocks"] == 1
    assert tier_used(m) == len(data) == cache_file.stat().st_size

    done = run_tierfs("flush", str(path), timeout=60)
    assert done.returncode != 0, "flush reported success for a damaged file"
    assert "ckpt.pt" in done.stderr, done.stderr
    assert not object_exists(m, "ckpt.pt"), "the damaged bytes reached the bucket"
    human = run_tierfs("status", str(m.path))
    assert "FAILED:   1 files" in human.stdout, human.stdout

    m.remount()
    assert m.where_one("ckpt.pt")["state"] == "failed"
    assert read_error(path, MiB, 4096) == errno.EIO
    assert run_tierfs("flush", str(m.path), timeout=60).returncode != 0
    assert not object_exists(m, "ckpt.pt")
    assert tier_used(m) == len(data)

    write_file(path, data)  # the operator restores the file from a good copy
    done = run_tierfs("flush", str(path), timeout=60)
    assert done.returncode == 0, done.stderr
    body = m.s3.get_object(Bucket=m.bucket, Key=m.key("ckpt.pt"))["Body"].read()
    assert body == data
    assert m.where_one("ckpt.pt")["state"] == "clean"
    assert m.status()["failed_files"] == 0
