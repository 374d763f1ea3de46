"""Real mount: a daemon that keeps serving whatever its workers and its backing do.

* Every background worker runs under the supervisor: a failure injected into
  each of them (``TIERFS_TEST_WORKER_FAULTS``, see ``tierfs.core.state.supervisor``)
  is logged, counted in ``tierfs status`` and the worker restarts, while the
  mount keeps serving.
* Through a proxy that answers 503 and 403 at random and resets bodies, the
  daemon stays up, never serves wrong bytes, and uploads everything once the
  faults stop (a short run here; minutes in the ``slow`` suite).
* A ``file://`` backing on a small tmpfs that is filled up makes every
  upload fail (ENOSPC): the first ``tierfs flush`` after space is freed
  succeeds; under a stress of writers the daemon's peak RSS stays under
  the cap docs/operations.md documents; SIGTERM ends the daemon within seconds
  with the journal kept, and the next mount uploads what was pending.

The tmpfs tests need root (mount -t tmpfs); they are skipped otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.faults import FaultProxy
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    drop_page_cache,
    is_tierfsd,
    run_tierfs,
    wait_until,
)
from tests.fuse.test_crash import mounted, through_proxy
from tierfs.core.state.supervisor import INJECT_ENV, PAUSE_ENV

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
#: The daemon's peak RSS must stay under this (docs/operations.md, "Limits"), with the
#: test's small tiers; it states the general formula.
RSS_CAP = 400 * MiB
#: How long the stress runs before the daemon gets SIGTERM.
STRESS_SECONDS = 12.0
#: How long the default run under S3 faults lasts (minutes under ``--run-slow``).
S3_FAULT_SECONDS = 8.0
#: SIGTERM must end the daemon within this many seconds.
SIGTERM_EXIT = 5.0
BACKING_SIZE = 512 * MiB
#: The reserved name (never listed by the file:// store) of the filler.
FILLER = ".tierfs-filler"


# --- helpers ------------------------------------------------------------------------------


def daemon_pid(m: Mount) -> int:
    return int(m.status()["pid"])


def proc_status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def status_eventually(m: Mount, timeout: float = 10.0) -> dict[str, Any]:
    """``tierfs status``, retried while the control server restarts."""
    deadline = time.monotonic() + timeout
    while True:
        done = run_tierfs("status", str(m.path), "--json")
        if done.returncode == 0:
            result: dict[str, Any] = json.loads(done.stdout)
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"tierfs status kept failing: {done.stderr}\n{m.log_tail()}")
        time.sleep(0.2)


def flush_result(
    m: Mount, timeout: float = 120.0
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``tierfs flush`` of the whole mount, and how long it took (seconds)."""
    started = time.monotonic()
    done = run_tierfs("flush", str(m.path), timeout=timeout)
    return done, time.monotonic() - started


@dataclass
class SmallBacking:
    """A tmpfs of BACKING_SIZE bytes as a file:// backing, that can be filled up."""

    path: Path

    def fill(self) -> None:
        """Take every free byte (uploads then fail with ENOSPC)."""
        filler = self.path / FILLER
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            chunk = b"\0" * MiB
            with contextlib.suppress(OSError):
                while os.write(fd, chunk):
                    pass
        finally:
            os.close(fd)
        st = os.statvfs(self.path)
        assert st.f_bavail * st.f_frsize < MiB, "the backing still has room"

    def free(self) -> None:
        (self.path / FILLER).unlink(missing_ok=True)

    def objects(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for root, dirs, files in os.walk(self.path):
            dirs[:] = [d for d in dirs if not d.startswith(".tierfs-")]
            for name in files:
                if not name.startswith(".tierfs-"):
                    p = Path(root) / name
                    out[str(p.relative_to(self.path))] = p.read_bytes()
        return out


@pytest.fixture
def small_backing(tmp_path: Path) -> Iterator[SmallBacking]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the backing")
    path = tmp_path / "backing"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={BACKING_SIZE}", "tierfs-test-backing", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield SmallBacking(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


# --- C: the first flush after an outage --------------------------------------------------


def test_first_flush_after_the_backing_recovers_succeeds(
    mount: MountFactory, small_backing: SmallBacking
) -> None:
    m = mount(backing_dir=small_backing.path, upload_delay="0s")
    small_backing.fill()
    bodies = {f"f{i}.bin": random.Random(i).randbytes(3 * MiB + i) for i in range(3)}
    for name, body in bodies.items():
        write_file(m.path / name, body)
    # The uploads fail, again and again, with backoff (ENOSPC on the backing).
    assert wait_until(lambda: "No space" in m.status()["last_sync_error"], timeout=20), m.log_tail()
    failing, _ = flush_result(m)
    assert failing.returncode != 0, "a flush while the backing is full cannot succeed"
    assert "No space" in failing.stderr, failing.stderr
    small_backing.free()
    done, took = flush_result(m)
    assert done.returncode == 0, (
        f"the first flush after the outage failed after {took:.1f} s: {done.stderr}\n{m.log_tail()}"
    )
    objects = small_backing.objects()
    for name, body in bodies.items():
        assert objects.get(name) == body, f"{name} is not in the backing after the flush"
    assert m.status()["pending_uploads"] == 0


# --- B: memory while uploads fail; SIGTERM ------------------------------------------------


#: One stress process: create, write, truncate and rename files for a while.
_STRESS_SCRIPT = """
import errno, os, random, sys, time
root, n, seconds, size = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
body = random.Random(n).randbytes(size)
stop = time.monotonic() + seconds
i = 0
while time.monotonic() < stop:
    name = os.path.join(root, f"w{n}-{i % 2}.bin")
    try:
        with open(name, "wb") as f:
            f.write(body)
        if i % 3 == 0:
            os.truncate(name, size // 2)
        if i % 4 == 0:
            os.rename(name, os.path.join(root, f"w{n}-{i % 2}.moved"))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            sys.exit(f"writer {n}: {exc!r}")
    i += 1
"""


def start_stress(root: Path, writers: int, seconds: float, file_size: int) -> list[Any]:
    """``writers`` processes that create, write, truncate and rename files
    under ``root`` for ``seconds``."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", _STRESS_SCRIPT, str(root), str(n), str(seconds), str(file_size)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(writers)
    ]


def sample_rss(pid: int, seconds: float) -> int:
    """The daemon's largest VmRSS over ``seconds`` (sampled every 0.1 s), in bytes."""
    peak = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, proc_status_kib(pid, "VmRSS") * 1024)
        time.sleep(0.1)
    return peak


@pytest.mark.long
def test_memory_stays_bounded_and_sigterm_is_quick_while_uploads_fail(
    mount: MountFactory, small_backing: SmallBacking
) -> None:
    stress_failing_uploads_then_sigterm(mount, small_backing, STRESS_SECONDS)


@pytest.mark.slow
def test_minutes_of_stress_while_uploads_fail_keep_memory_bounded(
    mount: MountFactory, small_backing: SmallBacking
) -> None:
    stress_failing_uploads_then_sigterm(mount, small_backing, 240.0)


def stress_failing_uploads_then_sigterm(
    mount: MountFactory, small_backing: SmallBacking, seconds: float
) -> None:
    """20 writers on a mount whose file:// backing is full, for ``seconds``:
    the peak RSS stays under RSS_CAP; SIGTERM while they run ends the daemon
    within SIGTERM_EXIT with the journal kept; after space is freed, a
    remount uploads everything."""
    m = mount(
        backing_dir=small_backing.path,
        upload_delay="0s",
        nvme="32MiB",
        hdd="64MiB",
        part_size="5MiB",
        space_wait="60s",
    )
    pid = daemon_pid(m)
    small_backing.fill()
    # 20 writers: the tiers fill up with data that cannot be uploaded, and
    # then the writers wait for space (up to space_wait, 60 s).
    procs = start_stress(m.path, writers=20, seconds=seconds + 60, file_size=6 * MiB)
    sampled = sample_rss(pid, seconds)
    status = m.status()
    assert status["pending_uploads"] > 0 and "No space" in status["last_sync_error"], status
    pending = status["pending_uploads"]
    peak = proc_status_kib(pid, "VmHWM") * 1024
    print(f"daemon RSS: sampled max {sampled / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB")
    assert peak < RSS_CAP, f"daemon peak RSS {peak / MiB:.0f} MiB >= cap {RSS_CAP / MiB:.0f} MiB"

    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    exited = wait_until(lambda: not is_tierfsd(pid), timeout=SIGTERM_EXIT, interval=0.05)
    took = time.monotonic() - started
    for proc in procs:  # they lose the mount under them: errors are expected now
        proc.kill()
        proc.communicate()
    assert exited, f"the daemon did not exit within {SIGTERM_EXIT} s of SIGTERM\n{m.log_tail()}"
    print(f"SIGTERM exit after {took:.2f} s")
    assert wait_until(lambda: not mounted(m.path), timeout=5), "SIGTERM left the mount behind"

    small_backing.free()
    m.mount()
    replayed = re.search(r"replaying (\d+) journal entries", m.log_text())
    assert replayed and int(replayed.group(1)) >= pending, "the journal was lost at SIGTERM"
    done, _ = flush_result(m)
    assert done.returncode == 0, f"flush after remount failed: {done.stderr}\n{m.log_tail()}"
    names = {p.name for p in m.path.iterdir()}
    objects = small_backing.objects()
    assert names == set(objects), f"mount and backing disagree: {names ^ set(objects)}"
    for name in names:
        assert objects[name] == (m.path / name).read_bytes(), name
    print(f"peak RSS {peak / MiB:.0f} MiB, {pending} pending uploads, SIGTERM exit {took:.2f} s")


# --- A: supervised workers -----------------------------------------------------------------

#: Every supervised worker of the daemon, and when (seconds after its first
#: start) the injected failure hits it: after `tierfs mount` has asked for
#: its status, while the test uses the mount.
INJECTED = {
    "housekeeping": 2.0,
    "commit": 2.0,
    "orphan_cleanup": 0.0,
    "uploader": 3.0,
    "control": 4.0,
    "signals": 2.0,
}


def test_a_failure_injected_into_each_worker_leaves_the_mount_serving(
    mount: MountFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INJECT_ENV, ",".join(f"{w}:{d}" for w, d in INJECTED.items()))
    monkeypatch.setenv(PAUSE_ENV, "0.3")
    seed = random.Random(1).randbytes(3 * MiB)
    m = mount({"seed.bin": seed}, upload_delay="0s")
    pid = m.pids[-1]
    written: dict[str, bytes] = {}
    deadline = time.monotonic() + max(INJECTED.values()) + 3
    i = 0
    while time.monotonic() < deadline:  # the mount serves while the workers fail
        name = f"during-{i}.bin"
        written[name] = random.Random(100 + i).randbytes(256 * 1024 + i)
        write_file(m.path / name, written[name])
        assert (m.path / "seed.bin").read_bytes() == seed
        assert (m.path / name).read_bytes() == written[name]
        i += 1
        time.sleep(0.2)

    def all_restarted() -> bool:
        workers = status_eventually(m)["workers"]
        return all(
            workers[w]["errors"] >= 1 and (workers[w]["restarts"] >= 1 or w == "orphan_cleanup")
            for w in INJECTED
        )

    assert wait_until(all_restarted, timeout=20, interval=0.3), status_eventually(m)["workers"]
    status = status_eventually(m)
    assert is_tierfsd(pid) and status["pid"] == pid, "the daemon was replaced or died"
    assert status["worker_restarts"] >= len(INJECTED), status["workers"]
    for worker in INJECTED:
        record = status["workers"][worker]
        assert "InjectedWorkerFault" in record["last_error"], (worker, record)
        if worker != "orphan_cleanup":  # one-shot: it ran again, to its end
            assert record["running"], (worker, record)
    human = run_tierfs("status", str(m.path))
    assert human.returncode == 0 and "restarts after errors" in human.stdout, human
    assert "uploader: 1 errors, last: InjectedWorkerFault" in human.stdout, human.stdout
    log = m.log_text()
    for worker in INJECTED:
        assert f"worker {worker} failed; restarting it" in log, worker
    assert "Traceback" in log and "InjectedWorkerFault" in log

    # Everything still works after the restarts: writes reach the bucket
    # (uploader, commit), the control socket answers, SIGTERM is handled.
    written["after.bin"] = b"after the restarts\n"
    write_file(m.path / "after.bin", written["after.bin"])
    done, _ = flush_result(m)
    assert done.returncode == 0, f"flush failed: {done.stderr}\n{m.log_tail()}"
    for name, body in written.items():
        got = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))["Body"].read()
        assert got == body, name
    os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: not is_tierfsd(pid), timeout=SIGTERM_EXIT, interval=0.05), (
        m.log_tail()
    )
    assert wait_until(lambda: not mounted(m.path), timeout=5)


# --- A: S3 faults for a while: 503s, 403s, resets --------------------------------------------


def run_under_s3_faults(mount: MountFactory, fault_proxy: FaultProxy, seconds: float) -> None:
    """Read (cold, through eviction) and write through a proxy that answers
    30% of requests 503, 5% 403 and resets 10% of bodies, for ``seconds``:
    the daemon stays up, every read either returns the right bytes or fails
    with EIO/EACCES (so does a write), and once the faults stop every
    write that succeeded reaches the bucket."""
    objects = {f"obj-{i}.bin": random.Random(i).randbytes(2 * MiB + i) for i in range(24)}
    m = mount(objects, nvme="8MiB", hdd="16MiB", upload_delay="0s", do_mount=False)
    through_proxy(m, fault_proxy)
    m.mount()
    pid = m.pids[-1]
    fault_proxy.random_faults(error_503=0.3, error_403=0.05, reset=0.1, seed=11)
    rng = random.Random(5)
    written: dict[str, bytes] = {}
    reads = failures = 0
    deadline = time.monotonic() + seconds
    round_no = 0
    while time.monotonic() < deadline:
        for name in rng.sample(sorted(objects), 6):
            try:
                data = (m.path / name).read_bytes()
            except OSError as exc:
                assert exc.errno in (errno.EIO, errno.EACCES), f"{name}: {exc!r}"
                failures += 1
            else:
                assert data == objects[name], f"{name}: wrong bytes under faults"
                reads += 1
        name = f"new-{round_no % 10}.bin"
        body = random.Random(1000 + round_no).randbytes(512 * 1024)
        try:
            write_file(m.path / name, body)
        except OSError as exc:  # opening an existing file revalidates it: a 403 is EACCES
            assert exc.errno in (errno.EIO, errno.EACCES), f"{name}: {exc!r}"
            written.pop(name, None)  # its content is whatever got through: not checked
            failures += 1
        else:
            written[name] = body
        assert is_tierfsd(pid), f"the daemon died under S3 faults\n{m.log_tail()}"
        drop_page_cache()
        round_no += 1
    assert fault_proxy.random_counts["503"] and fault_proxy.random_counts["reset"], (
        fault_proxy.random_counts
    )
    assert reads > 0 and written, "nothing got through the faults"
    fault_proxy.clear_faults()
    done, _ = flush_result(m)
    assert done.returncode == 0, f"flush failed after the faults: {done.stderr}\n{m.log_tail()}"
    for name, body in written.items():
        got = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))["Body"].read()
        assert got == body, name
    status = m.status()
    assert status["pid"] == pid and is_tierfsd(pid)
    for worker, record in status["workers"].items():
        assert record["errors"] == 0, f"worker {worker} failed under S3 faults: {record}"
    print(
        f"{seconds:.0f} s of S3 faults {dict(fault_proxy.random_counts)}: {reads} reads, "
        f"{failures} failed calls, buffers dropped in use: "
        f"{status['counters']['fetch_buffers_dropped_in_use']}"
    )


def test_s3_503s_403s_and_resets_do_not_stop_the_daemon(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    run_under_s3_faults(mount, fault_proxy, seconds=S3_FAULT_SECONDS)


@pytest.mark.slow
def test_minutes_of_s3_503s_403s_and_resets_do_not_stop_the_daemon(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    run_under_s3_faults(mount, fault_proxy, seconds=300)
