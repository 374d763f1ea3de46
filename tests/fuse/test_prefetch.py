"""Real mount: order-aware prefetch and the Slurm prolog.

``tierfs prefetch MOUNTPOINT --order FILE`` and ``tierfs.client.set_order``
hand the daemon the read order.  A reader that follows it finds each file
resident when it opens it (the daemon's GET counter moves by one per open:
the prefetch of the file the window reaches, none for the opened file), with the next files of the window resident ahead of it and none
further; a reader that jumps takes the window with it and the files it
skipped are not fetched.  A bad order file is rejected and the previous
order stays; a missing file is named and the rest goes on.
``deploy/slurm/prolog.sh`` runs with a SLURM_* environment and preloads the
job's dataset.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

import tierfs.client
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    daemon_env,
    run_tierfs,
    tierfs_command,
    traversable,
    wait_until,
)

pytestmark = pytest.mark.fuse

KiB = 1024
REPO = Path(__file__).resolve().parents[2]
FILES = 30
WINDOW = 3


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def name(i: int) -> str:
    return f"ds/{i:03d}.jpg"


def cached_positions(m: Mount, count: int) -> set[int]:
    """Positions of the dataset whose bytes are all on a local tier (one ``where``)."""
    items = m.where(*(name(i) for i in range(count)))
    return {i for i, item in enumerate(items) if item["cached_bytes"] == item["size"] > 0}


def read(m: Mount, i: int) -> bytes:
    with open(m.path / name(i), "rb") as f:
        return f.read()


def test_prefetch_follows_the_reader_jumps_and_rejects_a_bad_order(
    mount: MountFactory, tmp_path: Path
) -> None:
    data = {name(i): blob(40 * KiB + i, i) for i in range(FILES)}
    m = mount(data)
    gets0 = m.counters()["gets"]

    # A bad order file is rejected whole: no order, nothing fetched.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(f"{name(0)}\nds/../../etc/passwd\n/etc/passwd\n{name(1)}\x00\n".encode())
    done = run_tierfs("prefetch", str(m.path), "--order", str(bad))
    assert done.returncode == 1
    assert "bad prefetch order" in done.stderr
    assert "line 2" in done.stderr and "line 3" in done.stderr and "line 4" in done.stderr
    status = m.status()
    assert status["prefetch"]["order_files"] == 0
    assert status["counters"]["gets"] == gets0
    assert cached_positions(m, FILES) == set()

    # The CLI: a missing file is named, the rest is the order (default window).
    order = tmp_path / "order.txt"
    order.write_text(f"{m.path}/{name(0)}\n{name(1)}\n\nds/missing.jpg\n{name(2)}\n")
    done = run_tierfs("prefetch", str(m.path), "--order", str(order))
    assert done.returncode == 1, done.stderr
    assert "ds/missing.jpg" in done.stderr
    assert f"(uid {os.getuid()}, unnamed) of 3 files on" in done.stdout
    assert wait_until(lambda: cached_positions(m, FILES) == {0, 1, 2}, timeout=10)

    # The Python API replaces it: the whole dataset, a window of 3 files.
    result = tierfs.client.set_order(m.path, (name(i) for i in range(FILES)), window_files=WINDOW)
    assert (result["order_files"], result["window_files"], result["missing"]) == (FILES, 3, 0)
    # A reader in order: each file is resident before its open (no GET at the
    # open), the window is the next 3 files, and nothing further is fetched.
    for i in range(5):
        ahead = set(range(i, i + WINDOW))
        assert wait_until(lambda ahead=ahead: ahead <= cached_positions(m, FILES), timeout=10)
        assert max(cached_positions(m, FILES)) == i + WINDOW - 1
        gets = m.counters()["gets"]
        assert read(m, i) == data[name(i)]
        # One GET since: the prefetch of the file the window just reached
        # (i + 3); the open of i found it resident and fetched nothing.
        assert wait_until(lambda i=i: i + WINDOW in cached_positions(m, FILES), timeout=10)
        assert m.counters()["gets"] == gets + 1
    prefetch = m.status()["prefetch"]
    # Hits are opens of files this order fetched: 3 and 4 (0-2 were resident
    # already, fetched for the first order).
    assert (prefetch["opens"], prefetch["hits"]) == (5, 2)
    (listed,) = prefetch["orders"]
    assert (listed["id"], listed["cursor"], listed["job"], listed["owner"]) == (
        result["id"],
        4,
        "",
        os.getuid(),
    )
    status_text = run_tierfs("status", str(m.path)).stdout
    assert f"prefetch: order {result['id']} (uid {os.getuid()}, unnamed) of 30 files" in status_text

    # The reader jumps: the window goes with it; the files it skipped are not fetched.
    assert wait_until(lambda: {5, 6, 7} <= cached_positions(m, FILES), timeout=10)
    read(m, 20)
    assert wait_until(lambda: {21, 22, 23} <= cached_positions(m, FILES), timeout=10)
    cached = cached_positions(m, FILES)
    assert cached == {*range(8), 20, 21, 22, 23}
    # Prefetched and not opened, ahead of the reader: never more than the window.
    assert len({p for p in cached if p > 20}) == WINDOW

    # Clearing the order stops prefetching.
    assert tierfs.client.clear_order(m.path) == [result["id"]]
    read(m, 24)
    assert cached_positions(m, FILES) == {*range(8), 20, 21, 22, 23, 24}


def test_slurm_prolog_preloads_the_jobs_dataset(mount: MountFactory, tmp_path: Path) -> None:
    data = {f"jobdata/{i}.bin": blob(100 * KiB + i, 100 + i) for i in range(6)}
    data["other/skip.bin"] = blob(1000, 1)
    m = mount(data)
    wrapper = tmp_path / "tierfs"
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(tierfs_command())} "$@"\n')
    wrapper.chmod(0o755)
    env = daemon_env()
    for key in ("TIERFS_PRELOAD", "SPANK_TIERFS_PRELOAD"):
        env.pop(key, None)
    env.update(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_USER": "root",
            "SLURM_JOB_UID": "0",
            "SLURM_JOB_GID": "0",
            "SLURM_JOB_EXTRA": "tierfs_preload=jobdata",
            "TIERFS": str(wrapper),
            "TIERFS_MOUNT": str(m.path),
            "TIERFS_READY_FRACTION": "0.5",
        }
    )

    def slurm(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(REPO / "deploy/slurm" / script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = slurm("prolog.sh")
    assert done.returncode == 0, done.stderr
    assert f"preloading {m.path}/jobdata as uid 0" in done.stderr
    assert "preload ready" in done.stderr
    names = [n for n in data if n.startswith("jobdata/")]

    def all_resident() -> bool:
        return all(item["cached_bytes"] == item["size"] for item in m.where(*names))

    assert wait_until(all_resident, timeout=20)
    assert m.where_one("other/skip.bin")["cached_bytes"] == 0
    assert os.path.ismount(m.path)
    # The preload carries the job's tag, which the epilog cancels by (it ended here).
    (job,) = m.status()["preloads"]
    assert job["tag"] == "slurm-4242" and job["state"] == "done"
    # The job's rank 0 set an order named after the job; another job's order stays.
    mine = tierfs.client.set_order(m.path, names, job="slurm-4242", rank=0)
    other = tierfs.client.set_order(m.path, names, job="slurm-7")
    done = slurm("epilog.sh")
    assert done.returncode == 0 and "dead or broken" not in done.stderr, done.stderr
    assert f"orders ended on {m.path}: {mine['id']}" in done.stderr
    assert [order["id"] for order in m.status()["prefetch"]["orders"]] == [other["id"]]


def test_slurm_prolog_preloads_as_the_jobs_user(
    mount: MountFactory, tmp_path: Path, other_uid: int
) -> None:
    """The prolog runs as root but runs the preload as the job's user
    (its uid, gid and groups), so the daemon checks that user's rights and
    bounds; with no SLURM_JOB_UID it preloads nothing."""
    m = mount({"jobdata/a.bin": blob(1000, 1)})
    record = tmp_path / "shared"
    record.mkdir()
    record.chmod(0o1777)
    # A stand-in CLI any user can run: it writes down who ran it and with what.
    wrapper = record / "tierfs"
    wrapper.write_text(f'#!/bin/sh\necho "$(id -u) $(id -g) $*" >> {record}/calls\n')
    wrapper.chmod(0o755)
    env = daemon_env()
    for key in ("TIERFS_PRELOAD", "SPANK_TIERFS_PRELOAD", "SLURM_JOB_UID", "SLURM_JOB_GID"):
        env.pop(key, None)
    env.update(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_EXTRA": "tierfs_preload=jobdata",
            "TIERFS": str(wrapper),
            "TIERFS_MOUNT": str(m.path),
        }
    )

    def prolog(**more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(REPO / "deploy/slurm/prolog.sh")],
            env={**env, **more},
            capture_output=True,
            text=True,
            timeout=60,
        )

    with traversable(record):
        done = prolog()
        assert done.returncode == 0, done.stderr
        assert "no SLURM_JOB_UID: not preloading jobdata" in done.stderr, done.stderr
        assert not (record / "calls").exists()
        done = prolog(SLURM_JOB_UID=str(other_uid), SLURM_JOB_GID=str(other_uid))
    assert done.returncode == 0, done.stderr
    assert f"as uid {other_uid}" in done.stderr, done.stderr
    calls = (record / "calls").read_text().splitlines()
    assert calls[0] == f"{other_uid} {other_uid} preload --help", calls
    assert calls[1].startswith(
        f"{other_uid} {other_uid} preload --ready-fraction 0.3 --tag slurm-77 "
    ), calls
    assert calls[1].endswith(f"{m.path}/jobdata"), calls
