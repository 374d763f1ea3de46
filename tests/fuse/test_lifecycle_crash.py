"""Real mount: the mover under a kill -9, and the scan scenario.

* kill -9 while a move is in flight (checked: ``status`` shows a move with
  bytes copied), ``fusermount3 -uz``, remount: every byte reads right, each
  block is indexed on one tier only, dirty data still uploads, and no cache
  file is left that the index does not name (the orphan cleanup at mount).
* The scan scenario: a small hot set read again and again while one pass
  over cold files three times the size of NVMe goes by.  The hot set stays
  on NVMe (S3-FIFO); ``TIERFS_TEST_EVICTION=lru`` in the same test shows
  that plain LRU loses it.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import pytest

from tests.fuse.conftest import (
    Mount,
    MountFactory,
    drop_page_cache,
    fusermount,
    run_tierfs,
    wait_until,
)

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_files(m: Mount) -> dict[str, set[int]]:
    """Tier name -> inode numbers that have a cache file on that tier."""
    out: dict[str, set[int]] = {}
    for name, tier_dir in m.tier_dirs.items():
        inos: set[int] = set()
        data = tier_dir / "data"
        if data.is_dir():
            for fan in data.iterdir():
                inos.update(int(p.name) for p in fan.iterdir() if p.name.isdigit())
        out[name] = inos
    return out


def test_kill9_mid_move_loses_nothing_and_leaves_no_orphan(mount: MountFactory) -> None:
    clean = {f"clean{i}.bin": os.urandom(MiB) for i in range(5)}
    m = mount(
        clean,
        nvme="8MiB",
        hdd="64MiB",
        watermarks={"nvme": (0.5, 0.25)},
        upload_delay="600s",
        # Slow copies, so that the kill finds a move half done.
        extra_config='[mover]\ninterval = "1s"\nbandwidth = "1MiB/s"\n',
    )
    dirty = os.urandom(2 * MiB + 4321)
    (m.path / "dirty.bin").write_bytes(dirty)  # closed: movable, not uploaded
    for name, body in clean.items():
        assert sha((m.path / name).read_bytes()) == sha(body)

    def moving() -> bool:
        # Bytes copied, block map not switched yet: the throttle holds the
        # move between its copy and its switch.
        current = m.status()["mover"]["current"]
        return current is not None and current["done"] > 0

    assert wait_until(moving, 30, interval=0.05), m.status()["mover"]
    assert m.where_one("dirty.bin")["state"] == "dirty"  # its only copy is local
    pid = m.pids[-1]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10)
    fusermount("-uz", str(m.path))
    m.mount()

    files = {**clean, "dirty.bin": dirty}
    drop_page_cache()
    for name, body in files.items():
        assert sha((m.path / name).read_bytes()) == sha(body), name
    inos = {name: os.stat(m.path / name).st_ino for name in files}
    for item in m.where(*files):
        # One record per block: the tiers never add up to more than the file.
        assert sum(item["tiers"].values()) == item["cached_bytes"] <= item["size"], item

    def no_orphans() -> bool:
        on_disk = cache_files(m)
        indexed = {
            tier: {inos[n] for n in files if m.where_one(n)["tiers"][tier] > 0} for tier in on_disk
        }
        return all(on_disk[tier] <= indexed[tier] for tier in on_disk)

    assert wait_until(no_orphans, 30), (cache_files(m), m.where(*files))
    done = run_tierfs("flush", str(m.path / "dirty.bin"), timeout=120)
    assert done.returncode == 0, done.stderr
    body = m.s3.get_object(Bucket=m.bucket, Key=m.key("dirty.bin"))["Body"].read()
    assert sha(body) == sha(dirty)


HOT = [f"hot/h{i}.bin" for i in range(3)]
COLD = [f"cold/c{i:02d}.bin" for i in range(36)]  # 3x NVMe


def _scan_hot_share(
    mount: MountFactory,
    monkeypatch: pytest.MonkeyPatch,
    eviction: str,
    objects: dict[str, bytes] | None,
) -> float:
    """Share of hot-file block reads served by NVMe during a cold scan.
    ``objects`` (the HOT and COLD files) go into the bucket first; None: the
    bucket holds them already (every mount of a test shares its bucket)."""
    monkeypatch.setenv("TIERFS_TEST_EVICTION", eviction)
    m = mount(
        objects,
        nvme="12MiB",
        hdd="128MiB",
        watermarks={"nvme": (0.75, 0.5)},
        readahead_max="1MiB",
        # The scan reads cold/ in listing order: files fetched ahead of it
        # would be scan pressure the test does not set.
        dir_readahead=0,
        extra_config='[mover]\ninterval = "0.2s"\n[[rules]]\nmatch = "**"\npromote = "never"\n',
    )
    # Warm up: the hot set is read twice before the scan starts.
    for _ in range(2):
        for name in HOT:
            (m.path / name).read_bytes()
            drop_page_cache()
    hot_on_nvme = hot_reads = 0
    for index, name in enumerate(COLD):
        (m.path / name).read_bytes()
        # 8 MiB of cold files between two reads of a hot file: more than
        # NVMe keeps below its low mark, so recency alone cannot keep it.
        if index % 8 == 7:
            drop_page_cache()
            for hot_name in HOT:
                where = m.where_one(hot_name)
                hot_on_nvme += where["tiers"]["nvme"] == MiB
                hot_reads += 1
                (m.path / hot_name).read_bytes()
        # Let the mover keep up with the scan, as it does at training speed.
        wait_until(
            lambda: (
                m.status()["tiers"][0]["used"] <= 0.75 * 12 * MiB
                and m.status()["mover"]["state"] == "idle"
            ),
            5,
            interval=0.05,
        )
    m.umount()
    return hot_on_nvme / hot_reads


def test_the_scan_keeps_the_hot_set_on_nvme_where_lru_does_not(
    mount: MountFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = {name: os.urandom(MiB) for name in HOT + COLD}
    s3fifo = _scan_hot_share(mount, monkeypatch, "s3fifo", objects)
    lru = _scan_hot_share(mount, monkeypatch, "lru", None)
    print(f"hot-set reads on NVMe during the scan: S3-FIFO {s3fifo:.2f}, LRU {lru:.2f}")
    assert s3fifo >= 0.9, (s3fifo, lru)
    assert lru <= 0.6, (s3fifo, lru)
