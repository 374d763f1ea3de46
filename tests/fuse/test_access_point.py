"""Real mount: an access point (``[access]``) confines a mount to one
directory of the bucket, with a fixed owner.

Nothing above its root is reachable: ``..`` at the mount root leaves the
mount (the kernel's), an absolute or a relative symlink pointing out is
resolved by the kernel on the host, never in the bucket, a rename out is
EXDEV, and the control socket refuses a '..' path.  Every file shows the
fixed owner, new files get it and the umask, a chown to another owner is
refused, and what is written lands under the root in the bucket only.
``read_only`` refuses every change.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import PREFIX, MountFactory, run_tierfs, wait_until
from tierfs.control.client import locate, request
from tierfs.errors import ControlError

pytestmark = pytest.mark.fuse

OWNER = 4242

ACCESS = f"""
[access]
root = "users/alice"
uid = {OWNER}
gid = {OWNER}
umask = "0027"
"""


def keys(s3_client: Any, bucket: str) -> set[str]:
    pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def test_an_access_point_shows_one_directory_with_a_fixed_owner(
    mount: MountFactory, s3_client: Any, bucket: tuple[str, str], tmp_path: Path
) -> None:
    m = mount(
        {
            "users/alice/a.txt": b"alice",
            "users/alice/runs/r1.log": b"log",
            "users/bob/secret.txt": b"bob's",
            "top.txt": b"top",
        },
        extra_config=ACCESS,
    )
    assert sorted(os.listdir(m.path)) == ["a.txt", "runs"]
    assert (m.path / "a.txt").read_bytes() == b"alice"
    # The mount's source names the access point's directory.
    mounts = Path("/proc/mounts").read_text().splitlines()
    (source,) = [line.split()[0] for line in mounts if f" {m.path} " in line]
    assert source.endswith(f"/{PREFIX}/users/alice"), source
    # Every file shows the fixed owner.
    for path in (m.path, m.path / "a.txt", m.path / "runs", m.path / "runs/r1.log"):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (OWNER, OWNER), path

    # ".." at the mount root leaves the mount: the host's directory, not the bucket's.
    assert (m.path / "..").resolve() == m.path.parent
    for outside in ("../bob/secret.txt", "../users/bob/secret.txt", "../top.txt"):
        assert not (m.path / outside).exists(), outside
    # Symlinks are stored as written and resolved by the kernel on the host.
    os.symlink("/users/bob/secret.txt", m.path / "abs-link")
    os.symlink("../bob/secret.txt", m.path / "rel-link")
    assert os.readlink(m.path / "abs-link") == "/users/bob/secret.txt"
    for link in ("abs-link", "rel-link"):
        with pytest.raises(FileNotFoundError):
            (m.path / link).read_bytes()
    # A rename out of the mount is refused by the kernel.
    with pytest.raises(OSError) as exc_info:
        os.rename(m.path / "a.txt", tmp_path / "out.txt")
    assert exc_info.value.errno == errno.EXDEV

    # New files get the fixed owner and the umask; a chown to another is refused.
    new = m.path / "runs" / "r2.log"
    new.write_bytes(b"new")
    os.mkdir(m.path / "ckpt", 0o777)
    assert (new.stat().st_uid, new.stat().st_mode & 0o777) == (OWNER, 0o640)
    assert (m.path / "ckpt").stat().st_mode & 0o777 == 0o750
    with pytest.raises(PermissionError):
        os.chown(new, 1000, -1)
    os.chown(new, OWNER, OWNER)  # the fixed owner itself: fine

    # The control socket works inside the root and refuses a way out.
    socket_path = locate(m.path).socket_path
    # ".." at the root is the root: "bob" is looked for in alice's directory.
    (answer,) = request(socket_path, "where", {"paths": ["../bob/secret.txt"]})
    assert (answer["errno"], answer["error"]) == (errno.ENOENT, "No such file or directory: bob")
    outside_mount = str(m.path.parent / "elsewhere.bin")
    with pytest.raises(ControlError, match="outside the mount"):
        request(socket_path, "preload", {"paths": [outside_mount], "detach": True})
    done = run_tierfs("flush", str(new))
    assert done.returncode == 0, done.stderr

    # What was written is under the root in the bucket; nothing else changed
    # but the attribute shadow, which is the bucket's one for every mount of
    # it: under the backing prefix, at the root's path.
    after = keys(s3_client, bucket[1])
    assert f"{PREFIX}/users/alice/runs/r2.log" in after
    shadows = f"{PREFIX}/.tierfs-attrs/users/alice/"
    outside = {k for k in after if not k.startswith((f"{PREFIX}/users/alice/", shadows))}
    assert outside == {f"{PREFIX}/users/bob/secret.txt", f"{PREFIX}/top.txt"}, outside
    assert f"{shadows}runs/r2.log@m0640,u{OWNER},g{OWNER}" in after


def test_a_read_only_access_point_refuses_every_change(mount: MountFactory) -> None:
    m = mount(
        {"users/alice/a.txt": b"alice"},
        extra_config='[access]\nroot = "users/alice"\nread_only = true\n',
    )
    assert (m.path / "a.txt").read_bytes() == b"alice"
    for change in (
        lambda: (m.path / "b.txt").write_bytes(b"b"),
        lambda: os.unlink(m.path / "a.txt"),
        lambda: os.mkdir(m.path / "d"),
    ):
        with pytest.raises(OSError) as exc_info:
            change()
        assert exc_info.value.errno == errno.EROFS


def test_an_access_points_old_shadows_move_to_the_buckets_shadow_tree(
    mount: MountFactory, s3_client: Any, bucket: tuple[str, str]
) -> None:
    """Before the shadow was one per bucket, an access point kept its own
    under its root: its next mount moves them where every mount reads them,
    so a file made 0600 through it stays 0600 on both."""
    old = f"{PREFIX}/users/alice/.tierfs-attrs/runs/r1.log@m0600,u{OWNER},g{OWNER}"
    s3_client.put_object(Bucket=bucket[1], Key=f"{PREFIX}/users/alice/runs/r1.log", Body=b"log")
    s3_client.put_object(Bucket=bucket[1], Key=old, Body=b"")
    new = f"{PREFIX}/.tierfs-attrs/users/alice/runs/r1.log@m0600,u{OWNER},g{OWNER}"
    point = mount(extra_config=ACCESS)

    def moved() -> bool:
        now = keys(s3_client, bucket[1])
        return new in now and old not in now

    assert wait_until(moved, timeout=15), keys(s3_client, bucket[1])
    full = mount()
    assert (full.path / "users/alice/runs/r1.log").stat().st_mode & 0o777 == 0o600
    assert (point.path / "runs/r1.log").stat().st_mode & 0o777 == 0o600
