"""Real mount: where written data goes when the tiers are small.

Tiers of a few MiB with 1 MiB blocks (configured capacities).  docs/guarantees.md,
"Writes and durability", Space: new data goes to the first tier with room,
then the next; dirty data is never evicted; writers wait for uploads to free
space and get ENOSPC only if nothing can be freed within a minute.
"""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from tests.fuse.conftest import Mount, MountFactory, drop_page_cache, run_tierfs

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
LONG_DELAY = "600s"
#: Watermarks at 100%: the mover never demotes, so what is on each tier is
#: where placement put it (the mover has tests of its own).
NO_MOVER = {"nvme": (1.0, 0.9), "hdd": (1.0, 0.9)}


def flush(m: Mount, *names: str) -> None:
    paths = [str(m.path / n) for n in names] or [str(m.path)]
    done = run_tierfs("flush", *paths, timeout=120)
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr.strip()}\n{m.log_tail()}"


def bucket_sha(m: Mount, name: str) -> str:
    body = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))["Body"].read()
    return hashlib.sha256(body).hexdigest()


def test_file_larger_than_nvme_spills_to_hdd(mount: MountFactory) -> None:
    m = mount(
        nvme="8MiB", hdd="16MiB", upload_delay=LONG_DELAY, part_size="5MiB", watermarks=NO_MOVER
    )
    body = os.urandom(12 * MiB)
    (m.path / "big.bin").write_bytes(body)
    item = m.where_one("big.bin")
    assert item["state"] == "dirty", item
    assert item["size"] == len(body), item
    assert item["tiers"]["nvme"] > 0 and item["tiers"]["hdd"] > 0, item
    assert item["tiers"]["nvme"] + item["tiers"]["hdd"] == len(body), item
    assert item["tiers"]["nvme"] <= 8 * MiB, item
    for tier in m.status()["tiers"]:
        assert tier["used"] <= tier["capacity"], tier
    drop_page_cache()
    assert (m.path / "big.bin").read_bytes() == body
    flush(m, "big.bin")  # several 5 MiB parts
    assert bucket_sha(m, "big.bin") == hashlib.sha256(body).hexdigest()


def test_writing_more_than_all_tiers_waits_for_uploads(mount: MountFactory) -> None:
    m = mount(nvme="8MiB", hdd="16MiB", upload_delay="0.2s", watermarks=NO_MOVER)
    bodies = {f"f{i}.bin": os.urandom(10 * MiB) for i in range(4)}  # 40 MiB > 24 MiB
    for name, body in bodies.items():
        with open(m.path / name, "wb") as f:
            for off in range(0, len(body), MiB):
                f.write(body[off : off + MiB])
    status = m.status()
    for tier in status["tiers"]:
        assert tier["used"] <= tier["capacity"], tier
    # 40 MiB went through 24 MiB of tiers: uploaded files had to make room
    assert status["counters"]["evicted_files"] > 0, status["counters"]
    flush(m)
    for name, body in bodies.items():
        assert bucket_sha(m, name) == hashlib.sha256(body).hexdigest(), name
    drop_page_cache()
    for name, body in bodies.items():
        assert (m.path / name).read_bytes() == body, name
    assert "Traceback" not in m.log_text()


def test_enospc_when_nothing_can_be_freed_keeps_earlier_bytes(mount: MountFactory) -> None:
    # One file, open for writing the whole time, larger than both tiers:
    # its blocks cannot be evicted while it is open, so the writer must
    # eventually get ENOSPC, and what it wrote before stays intact.
    m = mount(
        nvme="4MiB", hdd="4MiB", upload_delay=LONG_DELAY, space_wait="2s", watermarks=NO_MOVER
    )
    first = os.urandom(3 * MiB)
    path = m.path / "huge.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    written = bytearray()
    failure: OSError | None = None
    try:
        os.write(fd, first)
        os.fsync(fd)
        written += first
        for _ in range(12):  # up to 15 MiB in all, far beyond 8 MiB
            chunk = os.urandom(MiB)
            try:
                n = os.write(fd, chunk)
            except OSError as exc:
                failure = exc
                break
            written += chunk[:n]
        assert failure is not None, f"wrote {len(written)} bytes into 8 MiB of tiers"
        assert failure.errno == errno.ENOSPC, failure
        assert len(written) <= 8 * MiB
        assert os.fstat(fd).st_size == len(written)
        assert os.pread(fd, len(written) + MiB, 0) == bytes(written)
    finally:
        os.close(fd)
    drop_page_cache()
    assert path.read_bytes() == bytes(written)
    assert path.read_bytes()[: len(first)] == first
