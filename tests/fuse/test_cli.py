"""Real mount: the ``tierfs`` command's errors and foreground mode (check 9)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.fuse.conftest import (
    MountFactory,
    daemon_env,
    daemons_using,
    run_tierfs,
    tierfs_command,
    wait_until,
)

pytestmark = pytest.mark.fuse


def test_mount_of_missing_bucket_fails_fast(mount: MountFactory, unique_name: str) -> None:
    m = mount(do_mount=False)
    text = m.config_path.read_text()
    assert f"s3://{m.bucket}/" in text
    m.config_path.write_text(text.replace(f"s3://{m.bucket}/", f"s3://{unique_name}/"))

    start = time.monotonic()
    done = run_tierfs("mount", str(m.config_path), str(m.path), timeout=30)
    elapsed = time.monotonic() - start
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert elapsed < 10.0, f"took {elapsed:.1f} s"
    assert unique_name in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not os.path.ismount(m.path)
    # The daemon that found the bucket missing is gone too.
    leftover = daemons_using(m.config_path)
    m.pids += leftover  # teardown stops them if the check below fails
    assert wait_until(lambda: not daemons_using(m.config_path), 5), leftover


def test_mount_on_busy_mount_point_fails(mount: MountFactory) -> None:
    m = mount({"a.txt": b"a"})
    done = run_tierfs("mount", str(m.config_path), str(m.path), timeout=30)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "busy" in done.stderr.lower(), done.stderr
    assert "Traceback" not in done.stderr
    # The first mount is untouched.
    assert (m.path / "a.txt").read_bytes() == b"a"
    assert m.status()["pid"] == m.pids[0]


def test_misspelt_config_key_is_reported_with_its_line(mount: MountFactory) -> None:
    m = mount(do_mount=False)
    lines = m.config_path.read_text().splitlines()
    tier_header = [i for i, line in enumerate(lines) if line == "[[tiers]]"][1]
    lines.insert(tier_header + 2, "hihg_watermark = 0.9")
    lineno = tier_header + 3  # 1-based number of the inserted line
    m.config_path.write_text("\n".join(lines) + "\n")

    done = run_tierfs("mount", str(m.config_path), str(m.path), timeout=30)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert f":{lineno}:" in done.stderr, done.stderr
    assert "hihg_watermark" in done.stderr, done.stderr
    assert not os.path.ismount(m.path)

    check = run_tierfs("policy", "check", str(m.config_path))
    assert check.returncode == 1
    assert f":{lineno}:" in check.stderr, check.stderr


def test_where_outside_a_mount_fails_clearly(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("not on tierfs")
    done = run_tierfs("where", str(plain))
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "not on a tierfs mount" in done.stderr, done.stderr
    assert str(plain) in done.stderr
    assert "Traceback" not in done.stderr


def test_mount_foreground_stays_until_umount(mount: MountFactory, tmp_path: Path) -> None:
    m = mount({"fg.txt": b"foreground"}, do_mount=False)
    log_path = tmp_path / "foreground.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*tierfs_command(), "mount", str(m.config_path), str(m.path), "-f"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=daemon_env(),
        )
    m.pids.append(proc.pid)  # `mount -f` execs the daemon: same PID
    try:
        assert wait_until(lambda: os.path.ismount(m.path) or proc.poll() is not None, 30)
        assert proc.poll() is None, log_path.read_text(errors="replace")
        assert wait_until(lambda: (m.path / "fg.txt").exists(), 10)
        assert (m.path / "fg.txt").read_bytes() == b"foreground"
        status = m.status()
        assert status["pid"] == proc.pid
        time.sleep(0.5)
        assert proc.poll() is None, "tierfs mount -f left the foreground"

        m.umount()
        assert proc.wait(timeout=30) == 0, log_path.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            m.cleanup()
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
