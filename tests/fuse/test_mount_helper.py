"""Real mounts through mount(8): ``mount -t fuse.tierfs`` and an fstab line
(a temporary fstab, ``mount -T``), with the helper ``scripts/install.sh``
links to /sbin/mount.fuse.tierfs; ``umount`` stops the daemon."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuse.conftest import Mount, MountFactory, daemon_env, is_tierfsd, wait_until

pytestmark = pytest.mark.fuse

HELPER = Path("/sbin/mount.fuse.tierfs")


@pytest.fixture(autouse=True)
def helper_of_this_checkout() -> None:
    """These tests run the checkout's helper through mount(8). A node's own
    helper (a file, or a link outside any checkout's venv) is never
    replaced by ``scripts/install.sh``: the tests skip there, saying why."""
    ours = Path(sys.executable).parent / "mount.fuse.tierfs"
    if HELPER.exists() and HELPER.resolve() == ours.resolve():
        return
    if HELPER.exists() and not str(HELPER.resolve()).endswith("/.venv/bin/mount.fuse.tierfs"):
        pytest.skip(f"{HELPER} is this node's own helper ({HELPER.resolve()}), not this checkout's")
    pytest.fail(f"{HELPER} is not this checkout's helper ({ours}): run scripts/install.sh as root")


def mount8(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["mount", *args], env=daemon_env(), capture_output=True, text=True, timeout=60
    )


def mount_entry(path: Path) -> list[str]:
    target = str(path.resolve()).replace(" ", "\\040")
    with open("/proc/self/mounts") as f:
        (entry,) = [line.split() for line in f if line.split()[1] == target]
    return entry


def umount_and_wait(m: Mount) -> None:
    pid = m.status()["pid"]
    m.pids.append(pid)  # the fixture's cleanup stops it if this test fails
    done = subprocess.run(["umount", str(m.path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not os.path.ismount(m.path)
    assert wait_until(lambda: not is_tierfsd(pid), timeout=20), "the daemon outlived umount"


def test_mount_t_fuse_tierfs_and_umount(mount: MountFactory) -> None:
    m = mount({"a.txt": b"hello"}, do_mount=False)
    done = mount8("-t", "fuse.tierfs", str(m.config_path), str(m.path), "-o", "allow_other,_netdev")
    assert done.returncode == 0, done.stderr
    try:
        assert (m.path / "a.txt").read_bytes() == b"hello"
        source, _target, kind, options = mount_entry(m.path)[:4]
        assert source == m.status()["backing"] and kind == "fuse.tierfs"
        assert "allow_other" in options.split(",")
    finally:
        umount_and_wait(m)


def test_an_fstab_line_mounts_read_only(mount: MountFactory, tmp_path: Path) -> None:
    m = mount({"a.txt": b"hello"}, do_mount=False)
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"# a test fstab\n{m.config_path} {m.path} fuse.tierfs "
        "ro,allow_other,_netdev,nofail,x-systemd.requires=network-online.target 0 0\n"
    )
    done = mount8("-T", str(fstab), str(m.path))
    assert done.returncode == 0, done.stderr
    try:
        assert (m.path / "a.txt").read_bytes() == b"hello"
        assert "ro" in mount_entry(m.path)[3].split(",")
        with pytest.raises(OSError, match="Read-only"):
            (m.path / "b.txt").write_bytes(b"x")
    finally:
        umount_and_wait(m)


def test_a_bad_option_is_named_and_nothing_is_mounted(mount: MountFactory) -> None:
    m = mount(do_mount=False)
    done = mount8("-t", "fuse.tierfs", str(m.config_path), str(m.path), "-o", "cache_size=1G")
    assert done.returncode != 0
    assert "unknown mount option 'cache_size=1G'" in done.stderr, done.stderr
    assert not os.path.ismount(m.path)


def test_an_fstab_line_mounts_a_snapshot(mount: MountFactory, tmp_path: Path) -> None:
    live = mount({"ds/a.txt": b"recorded"})
    done = subprocess.run(
        [sys.executable, "-m", "tierfs.cli", "snapshot", "create", str(live.path), "--name", "s1"],
        env=daemon_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (live.path / "ds/a.txt").write_bytes(b"changed")  # the snapshot keeps what it recorded...
    snap = dataclasses.replace(
        live, path=tmp_path / "snap", state_dir=live.state_dir / "snapshots" / "s1", pids=[]
    )
    snap.path.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{live.config_path} {snap.path} fuse.tierfs snapshot=s1,_netdev 0 0\n")
    done = mount8("-T", str(fstab), str(snap.path))
    assert done.returncode == 0, done.stderr
    try:
        source, _target, kind, options = mount_entry(snap.path)[:4]
        assert source.endswith("?snapshot=s1") and kind == "fuse.tierfs"
        assert "ro" in options.split(",")
        assert sorted(os.listdir(snap.path / "ds")) == ["a.txt"]
        assert os.path.getsize(snap.path / "ds/a.txt") == len(b"recorded")
    finally:
        umount_and_wait(snap)
