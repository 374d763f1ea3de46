"""Real mount: ``tierfs preload`` as an operator runs it.

Nested trees and ``--from-file`` lists; a rerun that fetches nothing (the
daemon's GET counter does not move) and says so; a missing file named with
a non-zero exit while the others are preloaded; a bad list rejected with
nothing fetched; ``--json`` events that parse.  Through the fault proxy,
whose held requests keep part of a preload from finishing:
``--ready-fraction`` returns while the rest goes on, ``--detach`` returns
at once and ``tierfs status`` shows both, and Ctrl-C of a plain preload
cancels it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.faults import FaultProxy
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    daemon_env,
    run_tierfs,
    tierfs_command,
    wait_until,
)
from tests.fuse.test_crash import through_proxy

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def cached(m: Mount, name: str) -> int:
    item = m.where_one(name)
    assert "error" not in item, item
    return int(item["cached_bytes"])


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def preloads(m: Mount) -> dict[str, dict[str, Any]]:
    return {job["id"]: job for job in m.status()["preloads"]}


TREE = {
    "ds/a/one.bin": blob(300 * KiB, 1),
    "ds/a/two.bin": blob(5 * KiB, 2),
    "ds/b/c/three.bin": blob(2 * MiB + 123, 3),
    "ds/top.bin": blob(77, 4),
    **{f"list/x{i}": blob(20 * KiB + i, 10 + i) for i in range(1, 6)},
}


def test_preload_tree_list_rerun_missing_and_bad_list(mount: MountFactory, tmp_path: Path) -> None:
    m = mount(TREE)
    gets0 = m.counters()["gets"]

    # A nested tree, --json: one event per line, a summary last.
    done = run_tierfs("preload", str(m.path / "ds"), "--json")
    assert done.returncode == 0, done.stderr
    events = json_lines(done.stdout)
    assert events[-1]["event"] == "summary"
    assert {e["event"] for e in events[:-1]} <= {"progress", "warning", "failed"}
    assert any(e["event"] == "progress" for e in events)
    summary = events[-1]
    ds = {k: v for k, v in TREE.items() if k.startswith("ds/")}
    assert summary["state"] == "done"
    assert (summary["files_total"], summary["files_done"], summary["files_failed"]) == (
        len(ds),
        len(ds),
        0,
    )
    assert summary["bytes_total"] == summary["bytes_fetched"] == sum(map(len, ds.values()))
    for name, data in ds.items():
        assert cached(m, name) == len(data)
    gets1 = m.counters()["gets"]
    assert gets1 > gets0
    assert (m.path / "ds/b/c/three.bin").read_bytes() == ds["ds/b/c/three.bin"]
    assert m.counters()["gets"] == gets1  # served from the tier

    # A rerun fetches nothing, and says so.
    again = run_tierfs("preload", str(m.path / "ds"))
    assert again.returncode == 0, again.stderr
    assert "nothing to fetch" in again.stdout
    assert f"({len(ds)} already resident)" in again.stdout
    assert m.counters()["gets"] == gets1

    # A list: absolute and root-relative lines, a blank line, a missing file.
    listing = tmp_path / "list.txt"
    listing.write_text(f"{m.path}/list/x1\nlist/x2\n\nlist/missing.bin\nlist/x3\n")
    done = run_tierfs("preload", "--from-file", str(listing))
    assert done.returncode == 1
    assert f"{m.path}/list/missing.bin: " in done.stderr
    assert "No such file" in done.stderr
    for name in ("list/x1", "list/x2", "list/x3"):
        assert cached(m, name) == len(TREE[name])
    assert cached(m, "list/x4") == 0
    gets2 = m.counters()["gets"]

    # A bad list is rejected whole: nothing is fetched, each bad line named.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"list/x4\nlist/../../etc/passwd\n/etc/passwd\nlist/x5\x00\n")
    done = run_tierfs("preload", "--from-file", str(bad), str(m.path / "list/x5"))
    assert done.returncode == 1
    assert "nothing was fetched" in done.stderr
    assert "line 2:" in done.stderr and "'..'" in done.stderr
    assert "line 3:" in done.stderr and "outside the mount" in done.stderr
    assert "line 4:" in done.stderr and "NUL" in done.stderr
    assert m.counters()["gets"] == gets2
    assert cached(m, "list/x4") == 0 and cached(m, "list/x5") == 0
    assert all(job["state"] == "done" for job in preloads(m).values())

    # A bad --bandwidth is rejected before anything starts; a good one is the job's cap.
    done = run_tierfs("preload", "--bandwidth", "fast", str(m.path / "list/x4"))
    assert done.returncode == 2
    assert "--bandwidth" in done.stderr and "not a rate" in done.stderr
    assert m.counters()["gets"] == gets2 and cached(m, "list/x4") == 0
    done = run_tierfs("preload", "--bandwidth", "100MiB/s", "--json", str(m.path / "list/x4"))
    assert done.returncode == 0, done.stderr
    summary = json_lines(done.stdout)[-1]
    assert summary["bandwidth"] == 100 << 20 and summary["files_done"] == 1
    assert cached(m, "list/x4") == len(TREE["list/x4"])


def test_ready_fraction_detach_status_and_ctrl_c(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    objects = {
        **{f"fast/f{i}.bin": blob(512 * KiB, i) for i in range(3)},
        "slow/held.bin": blob(512 * KiB, 9),
        "later/held.bin": blob(256 * KiB, 10),
        "cancel/held.bin": blob(256 * KiB, 11),
    }
    m = mount(objects, do_mount=False)
    through_proxy(m, fault_proxy)
    m.mount()
    gate = fault_proxy.hold_requests(lambda line: line.startswith("GET") and "held.bin" in line)
    try:
        # 3/4 of the bytes can arrive, the rest is held: --ready-fraction 0.5
        # returns, and the preload goes on in the daemon.
        done = run_tierfs(
            "preload",
            str(m.path / "fast"),
            str(m.path / "slow"),
            "--ready-fraction",
            "0.5",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        summary = json_lines(done.stdout)[-1]
        assert summary["event"] == "summary"
        assert summary["state"] == "fetching"
        assert 0.5 <= summary["ready_fraction"] < 1
        ready_id = summary["id"]

        # --detach returns at once with the id; status shows both running.
        done = run_tierfs("preload", str(m.path / "later"), "--detach", "--json")
        assert done.returncode == 0, done.stderr
        detached_id = json_lines(done.stdout)[-1]["id"]
        jobs = preloads(m)
        assert jobs[ready_id]["state"] == "fetching"
        assert jobs[detached_id]["state"] in ("scanning", "fetching")
        human = run_tierfs("status", str(m.path))
        assert f"preload:  {ready_id} fetching" in human.stdout

        # Ctrl-C of a plain preload cancels it in the daemon.
        proc = subprocess.Popen(
            [*tierfs_command(), "preload", str(m.path / "cancel"), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=daemon_env(),
        )
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())
            cancel_id = first["id"]
            proc.send_signal(signal.SIGINT)
            assert proc.wait(20) == 130
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        assert wait_until(lambda: preloads(m)[cancel_id]["state"] == "cancelled", 10)
    finally:
        gate.set()
    # Held GETs may have run out of retries meanwhile (the store's budget is
    # a few seconds): whatever the jobs left, a rerun completes it.
    assert wait_until(
        lambda: all(preloads(m)[i]["state"] == "done" for i in (ready_id, detached_id)), 30
    )
    done = run_tierfs("preload", str(m.path / "slow"), str(m.path / "later"))
    assert done.returncode == 0, done.stderr
    assert cached(m, "slow/held.bin") == 512 * KiB
    assert cached(m, "later/held.bin") == 256 * KiB


def test_preloads_are_listed_and_cancelled_by_id_and_by_tag(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    """``--list`` shows each preload with its owner and tag; ``--cancel ID``
    and ``--cancel-tag TAG`` (what the Slurm epilog runs) end running ones;
    an unknown id is an error that names it.  Held GETs keep them running."""
    objects = {f"job{j}/held{i}.bin": blob(256 * KiB, 10 * j + i) for j in (1, 2) for i in (1, 2)}
    m = mount(objects, do_mount=False)
    through_proxy(m, fault_proxy)
    m.mount()
    gate = fault_proxy.hold_requests(lambda line: line.startswith("GET") and "held" in line)
    try:
        ids = {}
        for job in ("job1", "job2"):
            done = run_tierfs(
                "preload", str(m.path / job), "--detach", "--json", "--tag", f"slurm-{job}"
            )
            assert done.returncode == 0, done.stderr
            ids[job] = json_lines(done.stdout)[-1]["id"]
        listed = run_tierfs("preload", "--list", "--json", str(m.path))
        assert listed.returncode == 0, listed.stderr
        jobs = {job["id"]: job for job in json.loads(listed.stdout)}
        for job, job_id in ids.items():
            assert jobs[job_id]["tag"] == f"slurm-{job}" and jobs[job_id]["owner"] == os.getuid()
            assert jobs[job_id]["paths"] == [job] and jobs[job_id]["state"] != "done"
        human = run_tierfs("preload", "--list", str(m.path))
        assert "tag slurm-job1; job1" in human.stdout, human.stdout

        done = run_tierfs("preload", "--cancel-tag", "slurm-job1", str(m.path))
        assert done.returncode == 0 and f"cancelled {ids['job1']}" in done.stdout, done
        assert wait_until(lambda: preloads(m)[ids["job1"]]["state"] == "cancelled", 10)
        assert preloads(m)[ids["job2"]]["state"] != "cancelled"
        done = run_tierfs("preload", "--cancel", ids["job2"], str(m.path))
        assert done.returncode == 0, done.stderr
        assert wait_until(lambda: preloads(m)[ids["job2"]]["state"] == "cancelled", 10)
        done = run_tierfs("preload", "--cancel", "p0-404", str(m.path))
        assert done.returncode == 1 and "preload p0-404 does not exist" in done.stderr, done
        done = run_tierfs("preload", "--cancel-tag", "slurm-none", str(m.path))
        assert done.returncode == 0 and "no running preload tagged" in done.stdout
    finally:
        gate.set()


def rss_peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_million_entry_list_keeps_daemon_memory_bounded(
    mount: MountFactory, tmp_path: Path
) -> None:
    """A list of 1,000,000 lines (over 200 small files) streams through:
    the daemon's peak RSS grows by far less than the list would take."""
    files = {f"m/d{i % 10}/f{i}.bin": blob(1000, i) for i in range(200)}
    m = mount(files)
    pid = m.pids[-1]
    names = sorted(files)
    listing = tmp_path / "million.txt"
    with listing.open("w") as f:
        f.write(f"{m.path}/{names[0]}\n")  # absolute: names the mount
        for i in range(1, 1_000_000):
            f.write(f"{names[i % len(names)]}\n")
    before = rss_peak_kib(pid)
    done = run_tierfs("preload", "--from-file", str(listing), "--json", timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json_lines(done.stdout)[-1]
    assert summary["files_total"] == 1_000_000
    assert summary["files_failed"] == 0
    for name in names[:5]:
        assert cached(m, name) == 1000
    grown_mib = (rss_peak_kib(pid) - before) / 1024
    print(f"daemon peak RSS grew by {grown_mib:.1f} MiB")
    assert grown_mib <= 100
