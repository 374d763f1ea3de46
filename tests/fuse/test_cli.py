"""Real mount: the ``tierfs`` command's errors and foreground mode (check 9)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fuse.conftest import (
    Mount,
    MountFactory,
    as_user,
    daemon_env,
    daemons_using,
    run_tierfs,
    tierfs_command,
    traversable,
    wait_until,
)
from tierfs.control.client import locate, request

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


def test_status_and_where_json_of_the_cli_are_what_the_fixture_reads(
    mount: MountFactory,
) -> None:
    """``Mount.status()`` and ``Mount.where()`` ask the control socket from
    the test process; the ``tierfs`` command's ``--json`` prints the same."""
    m = mount({"a.txt": b"a" * 1000, "d/b.txt": b"b"})
    assert (m.path / "a.txt").read_bytes() == b"a" * 1000
    done = run_tierfs("status", str(m.path), "--json")
    assert done.returncode == 0, done.stderr
    by_cli, by_fixture = json.loads(done.stdout), m.status()
    assert set(by_cli) == set(by_fixture)
    for key in ("pid", "mountpoint", "backing"):
        assert by_cli[key] == by_fixture[key], key
    assert [t["name"] for t in by_cli["tiers"]] == [t["name"] for t in by_fixture["tiers"]]
    names = ("a.txt", "d", "d/b.txt")
    done = run_tierfs("where", "--json", *(str(m.path / n) for n in names))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == m.where(*names)
    assert m.where_one("a.txt")["path"] == str(m.path / "a.txt")


def test_the_mount_names_its_backing_and_reports_its_version(mount: MountFactory) -> None:
    """The mount's source in the mount table is the backing URL (an
    operator with several mounts tells them apart in ``df`` and
    ``findmnt``), its type ``fuse.tierfs``; ``tierfs --version`` and the
    daemon's ``status`` name the same version."""
    m = mount({"a.txt": b"a"})
    target = os.fsencode(str(m.path.resolve())).replace(b" ", b"\\040")
    with open("/proc/self/mounts", "rb") as f:
        (entry,) = [line.split() for line in f if line.split()[1] == target]
    assert entry[0].decode() == m.status()["backing"] and entry[0].startswith(b"s3://")
    assert entry[2] == b"fuse.tierfs"
    done = run_tierfs("--version")
    assert done.returncode == 0 and done.stdout.startswith("tierfs "), done
    version = done.stdout.split()[1]
    assert version[0].isdigit() and m.status()["version"] == version
    shown = run_tierfs("status", str(m.path))
    assert f"tierfs {version})" in shown.stdout.splitlines()[0], shown.stdout


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


def test_a_missing_path_is_named_as_missing_by_every_path_command(mount: MountFactory) -> None:
    """An error names the path, never the bare name (``tierfs: PATH: c.bin``)."""
    m = mount({"here.bin": b"x"})
    for missing in ("c.bin", "nodir/c.bin"):
        target = str(m.path / missing)
        for args in (
            ["where", target],
            ["flush", target],
            ["evict", target],
            ["pin", target],
            ["unpin", target],
            ["preload", target],
        ):
            done = run_tierfs(*args)
            assert done.returncode != 0, (args, done.stdout)
            assert "No such file or directory" in done.stderr, (args, done.stderr)
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


def test_other_users_are_refused_clearly_and_logged(mount: MountFactory, other_uid: int) -> None:
    m = mount({"a.txt": b"a"})
    socket_path = locate(m.path).socket_path

    # Without allow_other the kernel keeps them out of the mount, so the CLI
    # cannot find the daemon's socket: it says who may.
    text = as_user(other_uid, lambda: str(locate(m.path / "a.txt")))
    assert text.startswith("ControlAccessDenied: permission denied"), text
    assert "mounted without allow_other, so only the user who mounted it" in text, text

    # The socket serves every local user; the admin operations stay root's
    # (and the mounting user's), refused with a sentence, and logged.
    assert as_user(other_uid, lambda: str(request(socket_path, "ping")["pid"])).startswith("ok")
    text = as_user(other_uid, lambda: str(request(socket_path, "evict", {"paths": ["a.txt"]})))
    assert text.startswith("ControlError: permission denied: evict on"), text
    assert f"is for root and the user who mounted it (uid {os.geteuid()})" in text, text
    assert f"you are uid {other_uid}" in text, text
    text = as_user(other_uid, lambda: str(request(socket_path, "policy_reload")))
    assert text.startswith("ControlError: permission denied: policy_reload"), text
    assert wait_until(lambda: f"refused evict from uid {other_uid}" in m.log_path.read_text(), 10)
    # Root still gets through.
    assert request(socket_path, "ping")["pid"] > 0


def test_a_user_job_reads_and_steers_what_it_may_read(mount: MountFactory, other_uid: int) -> None:
    """An allow_other mount: another user reads a 0644 file and is refused
    a 0600 one and a file in a 0700 directory, by the kernel; through the
    control socket it may ask where, flush, preload and prefetch what it may
    read, and each path it may not read is refused by name with nothing
    fetched."""
    objects = {
        "open/shard-0.bin": os.urandom(300_000),
        "open/shard-1.bin": os.urandom(200_000),
        "closed/secret.bin": os.urandom(100_000),
        "open/private.bin": os.urandom(100_000),
    }
    m = mount(objects, options="allow_other")
    with traversable(m.path):
        steered_by_another_user(m, other_uid)


def steered_by_another_user(m: Mount, other_uid: int) -> None:
    os.chmod(m.path / "closed", 0o700)
    os.chmod(m.path / "open/private.bin", 0o600)
    socket_path = locate(m.path).socket_path

    def read(name: str) -> Callable[[], str]:
        return lambda: str(len((m.path / name).read_bytes()))

    assert as_user(other_uid, read("open/shard-0.bin")) == "ok: 300000"
    assert as_user(other_uid, read("open/private.bin")).startswith("PermissionError")
    assert as_user(other_uid, read("closed/secret.bin")).startswith("PermissionError")

    def where(name: str) -> Callable[[], str]:
        return lambda: json.dumps(request(socket_path, "where", {"paths": [name]}))

    (item,) = json.loads(as_user(other_uid, where("open/shard-0.bin")).removeprefix("ok: "))
    assert item["size"] == 300_000, item
    (item,) = json.loads(as_user(other_uid, where("closed/secret.bin")).removeprefix("ok: "))
    assert item["error"] == "Permission denied: closed" and item["errno"] == 13, item

    def preload(path: str) -> Callable[[], str]:
        # In the forked child, not the CLI: the venv's interpreter may live
        # where that user cannot run it (the CLI sends the same request).
        return lambda: json.dumps(request(socket_path, "preload", {"paths": [path]}))

    summary = json.loads(as_user(other_uid, preload("open")).removeprefix("ok: "))
    assert (summary["state"], summary["files_failed"]) == ("done", 1), summary
    assert summary["failures"] == [
        {"path": "open/private.bin", "reason": "Permission denied: open/private.bin"}
    ], summary
    assert summary["owner"] == other_uid
    assert m.where_one("open/shard-1.bin")["cached_bytes"] == 200_000
    assert m.where_one("open/private.bin")["cached_bytes"] == 0
    summary = json.loads(as_user(other_uid, preload("closed/secret.bin")).removeprefix("ok: "))
    assert summary["failures"] == [
        {"path": "closed/secret.bin", "reason": "Permission denied: closed"}
    ], summary
    assert m.where_one("closed/secret.bin")["cached_bytes"] == 0

    def flush(name: str) -> Callable[[], str]:
        return lambda: json.dumps(request(socket_path, "flush", {"paths": [name]}))

    assert as_user(other_uid, flush("open/shard-0.bin")) == 'ok: {"entries": 0}'
    text = as_user(other_uid, flush("open/private.bin"))
    assert text == "ControlError: Permission denied: open/private.bin", text

    def prefetch() -> str:
        import tierfs.client

        return json.dumps(
            tierfs.client.set_order(m.path, ["open/shard-0.bin", "closed/secret.bin"])
        )

    summary = json.loads(as_user(other_uid, prefetch).removeprefix("ok: "))
    assert summary["order_files"] == 1, summary
    assert summary["missing_named"] == ["closed/secret.bin: Permission denied: closed"], summary


def test_every_command_that_prints_a_result_has_json_and_errors_are_json_too(
    mount: MountFactory, tmp_path: Path
) -> None:
    m = mount({"a.txt": b"a", "b.txt": b"b"})
    (m.path / "new.txt").write_bytes(b"new")
    done = run_tierfs("flush", "--json", str(m.path / "new.txt"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["flushed"] == [str(m.path / "new.txt")]

    order = tmp_path / "order.txt"
    order.write_text("a.txt\nmissing.txt\n")
    done = run_tierfs("prefetch", str(m.path), "--order", str(order), "--json")
    result = json.loads(done.stdout)
    assert done.returncode == 1 and result["order_files"] == 1 and result["missing"] == 1

    done = run_tierfs("policy", "reload", "--json", str(m.path))
    assert done.returncode == 0 and "rules" in json.loads(done.stdout), done

    done = run_tierfs("where", "--json", str(tmp_path))  # not on a mount: the error as JSON
    error = json.loads(done.stdout)
    assert (
        done.returncode == 1 and error["ok"] is False and "not on a tierfs mount" in error["error"]
    )
    assert done.stderr == ""

    pid = m.status()["pid"]
    done = run_tierfs("umount", "--json", str(m.path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"unmounted": str(m.path), "pid": pid, "flushed": False}
