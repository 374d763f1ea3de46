"""Real mount: one pass over a dataset larger than NVMe does not flush the hot set.

The scan scenario, with the defaults a user runs: no ``[fetch]`` table
(4 MiB blocks, directory readahead on), the default ``[mover]`` interval, and
an unpaced scan (``cat scan/*``, the files in listing order, nothing waits for
the mover).  Two 4 MiB "hot" files are read three times, then 48 files of
4 MiB (three times NVMe) once each.  Afterwards the hot set must still be on
NVMe: S3-FIFO keeps it, and ``TIERFS_TEST_EVICTION=lru`` on the same bucket
shows that plain LRU does not.  The same with 1 MiB files (192 of them).

(``tests/fuse/test_lifecycle_crash.py`` keeps the paced variant, which
checks the hot set *during* the scan with small blocks.)
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.fuse.conftest import Mount, MountFactory, wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.long]

MiB = 1024 * 1024
HOT = ["hot/h0.bin", "hot/h1.bin"]
NVME = 64 * MiB
SCAN_BYTES = 3 * NVME
HIGH, LOW = 0.8, 0.7


def _mount_scenario(
    mount: MountFactory,
    monkeypatch: pytest.MonkeyPatch,
    eviction: str,
    objects: dict[str, bytes] | None,
) -> Mount:
    monkeypatch.setenv("TIERFS_TEST_EVICTION", eviction)
    return mount(
        objects,
        nvme="64MiB",
        hdd="1GiB",
        watermarks={"nvme": (HIGH, LOW)},
        # The defaults: no [fetch] table at all.
        block_size=None,
        readahead_max=None,
        fetch_concurrency=None,
        dir_readahead=None,
    )


def _hot_bytes_on_nvme_after_scan(m: Mount, scan_files: int) -> int:
    for _ in range(3):
        for name in HOT:
            subprocess.run(["cat", str(m.path / name)], stdout=subprocess.DEVNULL, check=True)
    # One unpaced pass in listing order, as `cat data/*` makes it.
    names = sorted(os.listdir(m.path / "scan"))
    assert len(names) == scan_files
    subprocess.run(
        ["cat", *(str(m.path / "scan" / n) for n in names)], stdout=subprocess.DEVNULL, check=True
    )

    def settled() -> bool:
        status = m.status()
        nvme = status["tiers"][0]
        return nvme["used"] <= HIGH * NVME and status["mover"]["state"] == "idle"

    assert wait_until(settled, 60, interval=0.2), m.status()
    return sum(int(item["tiers"]["nvme"]) for item in m.where(*HOT))


@pytest.mark.parametrize("file_bytes", [4 * MiB, MiB], ids=["4MiB", "1MiB"])
def test_an_unpaced_scan_with_default_fetch_settings_keeps_the_hot_set_where_lru_does_not(
    mount: MountFactory, monkeypatch: pytest.MonkeyPatch, file_bytes: int
) -> None:
    scan = [f"scan/c{i:03d}.bin" for i in range(SCAN_BYTES // file_bytes)]
    objects = {name: os.urandom(file_bytes) for name in HOT + scan}
    hot_total = file_bytes * len(HOT)

    m = _mount_scenario(mount, monkeypatch, "s3fifo", objects)
    s3fifo = _hot_bytes_on_nvme_after_scan(m, len(scan))
    m.umount()

    m = _mount_scenario(mount, monkeypatch, "lru", None)
    lru = _hot_bytes_on_nvme_after_scan(m, len(scan))
    m.umount()

    print(f"hot set on NVMe after the scan: S3-FIFO {s3fifo} of {hot_total} bytes, LRU {lru}")
    assert s3fifo >= 0.9 * hot_total, (s3fifo, lru)
    assert lru < 0.5 * hot_total, (s3fifo, lru)
