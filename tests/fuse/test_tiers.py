"""Real mount: blocks fill NVMe, then HDD; beyond both, reads still succeed.

Acceptance check 6, with tiers of a few MiB and 1 MiB blocks.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.fuse.conftest import MountFactory, run_tierfs

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            digest.update(chunk)
    return digest.hexdigest()


def test_nvme_fills_then_hdd_then_reads_beyond_both_still_succeed(mount: MountFactory) -> None:
    bodies = {
        "a.bin": os.urandom(6 * MiB),  # more than nvme (4 MiB)
        "b.bin": os.urandom(12 * MiB),  # more than both tiers still have free
        "c.bin": os.urandom(20 * MiB),  # more than both tiers hold together
    }
    # Watermarks at 100%: the mover never demotes, so what is on each tier
    # is where placement put it (the mover has tests of its own).
    full = (1.0, 0.9)
    m = mount(
        bodies,
        nvme="4MiB",
        hdd="8MiB",
        readahead_max="2MiB",
        watermarks={"nvme": full, "hdd": full},
    )

    assert sha256_of(m.path / "a.bin") == hashlib.sha256(bodies["a.bin"]).hexdigest()
    a = m.where_one("a.bin")
    assert a["cached_bytes"] == 6 * MiB, a
    assert a["tiers"]["nvme"] > 0 and a["tiers"]["hdd"] > 0, a
    tiers = {t["name"]: t for t in m.status()["tiers"]}
    assert tiers["nvme"]["used"] >= tiers["nvme"]["capacity"] - MiB, tiers  # NVMe first
    assert tiers["hdd"]["used"] > 0, tiers

    for name in ("b.bin", "c.bin", "a.bin", "c.bin"):
        assert sha256_of(m.path / name) == hashlib.sha256(bodies[name]).hexdigest(), name

    # Random-offset reads across all files, after the tiers are full.
    for name, body in bodies.items():
        fd = os.open(m.path / name, os.O_RDONLY)
        try:
            for offset in (len(body) - 1000, 0, len(body) // 2 + 7):
                assert os.pread(fd, 3000, offset) == body[offset : offset + 3000]
        finally:
            os.close(fd)

    status = m.status()
    for tier in status["tiers"]:
        assert tier["used"] <= tier["capacity"], tier
    counters = status["counters"]
    assert counters["evicted_files"] > 0 or counters["uncached_blocks"] > 0, counters
    assert counters["verify_failures"] == 0, counters
    assert "Traceback" not in m.log_text()


def test_where_of_a_directory_shows_its_subtree_totals(mount: MountFactory) -> None:
    bodies = {"ds/a.bin": os.urandom(2 * MiB), "ds/sub/b.bin": os.urandom(MiB), "c.bin": b"c"}
    m = mount(bodies, upload_delay="600s")
    assert sha256_of(m.path / "ds" / "a.bin") == hashlib.sha256(bodies["ds/a.bin"]).hexdigest()
    (m.path / "ds" / "sub" / "new.txt").write_bytes(b"x" * 100)  # dirty: upload_delay

    tree = m.where_one("ds")
    assert tree["type"] == "directory" and tree["files"] == 3, tree
    assert tree["size"] == 3 * MiB + 100 and tree["cached_bytes"] == 2 * MiB + 100, tree
    assert sum(tree["tiers"].values()) == tree["cached_bytes"], tree
    assert (tree["state"], tree["dirty_files"], tree["dirty_bytes"]) == ("dirty", 1, 100), tree

    done = run_tierfs("where", str(m.path / "ds"), str(m.path / "c.bin"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["size", "cached"], lines
    assert "ds/ (3 files, 1 dirty: 100 B)" in lines[1] and "dirty" in lines[1].split(), lines
    assert lines[2].endswith("c.bin") and "clean" in lines[2].split(), lines
