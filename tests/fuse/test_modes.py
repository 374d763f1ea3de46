"""A permission tierfs stored holds on every node, from the first access.

Root writes a 0600 file (and a 0700 directory) through
one mount; a second mount of the same bucket with an empty state directory
(a fresh node) is mounted with ``allow_other`` (tierfs always adds
``default_permissions``), and another user (``nobody``) must get EACCES,
while the S3 calls of a cold read and a cold ``find`` stay LISTs and one
GET, never a HEAD.  Contract: tierfs.core.names.shadow, tierfs.core.names.namespace
("Attributes of listed names").
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import subprocess
import sys
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, run_tierfs

SHADOW = ".tierfs-attrs"

#: Run in a child: open the mount root as root, drop to ``nobody``, then try
#: each (op, path) relative to that directory fd (so that the test's own
#: 0700 temp directories above the mount point are not what refuses).
_AS_NOBODY = r"""
import json, os, sys
mnt, uid, gid, checks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
root = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
os.setgroups([])
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
out = {}
for op, path in checks:
    try:
        if op == "read":
            fd = os.open(path, os.O_RDONLY, dir_fd=root)
            try:
                out[f"{op}:{path}"] = os.read(fd, 100).decode()
            finally:
                os.close(fd)
        elif op == "list":
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)
            try:
                out[f"{op}:{path}"] = sorted(os.listdir(fd))
            finally:
                os.close(fd)
        elif op == "write":
            fd = os.open(path, os.O_WRONLY, dir_fd=root)
            os.close(fd)
            out[f"{op}:{path}"] = "ok"
    except OSError as exc:
        out[f"{op}:{path}"] = exc.errno
print(json.dumps(out))
"""


def as_nobody(m: Mount, *checks: tuple[str, str]) -> dict[str, Any]:
    nobody = pwd.getpwnam("nobody")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _AS_NOBODY,
            str(m.path),
            str(nobody.pw_uid),
            str(nobody.pw_gid),
            json.dumps(checks),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def flush(m: Mount) -> None:
    done = run_tierfs("flush", str(m.path))
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr.strip()}"


def shadow_keys(m: Mount) -> set[str]:
    prefix = f"{m.prefix}/{SHADOW}/"
    out: set[str] = set()
    for page in m.s3.get_paginator("list_objects_v2").paginate(Bucket=m.bucket, Prefix=prefix):
        out.update(o["Key"][len(prefix) :] for o in page.get("Contents", []))
    return out


def store_calls(m: Mount) -> dict[str, int]:
    calls: dict[str, int] = m.status()["store_calls"]
    return calls


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Requests in between, without the background cleanup of stale
    multipart uploads that every mount runs once at start."""
    return {
        op: n - before.get(op, 0)
        for op, n in after.items()
        if n - before.get(op, 0) and op != "ListMultipartUploads"
    }


@pytest.fixture
def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: allow_other and switching to another user")


def write_private_tree(m: Mount) -> None:
    """As root: a 0600 file, a 0700 directory, a 0644 file, a file of another owner."""
    (m.path / "secret.bin").write_bytes(b"root only")
    os.chmod(m.path / "secret.bin", 0o600)
    (m.path / "private").mkdir()
    os.chmod(m.path / "private", 0o700)
    (m.path / "private" / "inside.txt").write_bytes(b"in a private dir")
    os.chmod(m.path / "private" / "inside.txt", 0o644)
    (m.path / "shared.txt").write_bytes(b"for everyone")
    os.chmod(m.path / "shared.txt", 0o644)
    (m.path / "owned.txt").write_bytes(b"owned by 4242")
    os.chmod(m.path / "owned.txt", 0o600)
    os.chown(m.path / "owned.txt", 4242, 4242)
    flush(m)


def test_private_file_and_directory_are_refused_on_a_fresh_node(
    mount: MountFactory, require_root: None
) -> None:
    writer = mount(options="allow_other", list_ttl="60s", revalidate_ttl="60s")
    write_private_tree(writer)
    assert shadow_keys(writer) == {
        "secret.bin@m0600,u0,g0",
        "private@m0700,u0,g0",
        "owned.txt@m0600,u4242,g4242",
    }
    # The node that wrote them enforces them too.
    on_writer = as_nobody(writer, ("read", "secret.bin"), ("list", "private"))
    assert on_writer == {"read:secret.bin": errno.EACCES, "list:private": errno.EACCES}

    # A fresh node: its own, empty state directory and tiers; same bucket.
    node = mount(options="allow_other", list_ttl="60s", revalidate_ttl="60s")
    seen = as_nobody(
        node,
        ("read", "secret.bin"),
        ("list", "private"),
        ("read", "private/inside.txt"),
        ("read", "owned.txt"),
        ("write", "shared.txt"),
        ("read", "shared.txt"),
    )
    assert seen == {
        "read:secret.bin": errno.EACCES,
        "list:private": errno.EACCES,
        "read:private/inside.txt": errno.EACCES,  # the 0700 directory blocks the way
        "read:owned.txt": errno.EACCES,
        "write:shared.txt": errno.EACCES,
        "read:shared.txt": "for everyone",  # the control: nobody does reach the mount
    }
    st = os.stat(node.path / "owned.txt")
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, 4242, 4242)
    assert os.stat(node.path / "private").st_mode & 0o7777 == 0o700
    assert SHADOW not in os.listdir(node.path)
    # root still reads everything
    assert (node.path / "secret.bin").read_bytes() == b"root only"
    assert (node.path / "private" / "inside.txt").read_bytes() == b"in a private dir"

    # chmod 0644 back on the writer: readable on the next fresh node
    os.chmod(writer.path / "secret.bin", 0o644)
    os.chmod(writer.path / "private", 0o755)
    flush(writer)
    assert shadow_keys(writer) == {"owned.txt@m0600,u4242,g4242"}
    again = mount(options="allow_other", list_ttl="60s", revalidate_ttl="60s")
    assert as_nobody(again, ("read", "secret.bin"), ("list", "private")) == {
        "read:secret.bin": "root only",
        "list:private": ["inside.txt"],
    }


def test_a_cold_read_is_one_get_and_a_cold_find_makes_no_head(
    mount: MountFactory, require_root: None
) -> None:
    writer = mount(list_ttl="60s", revalidate_ttl="60s")
    for d in ("a", "a/b", "c"):
        (writer.path / d).mkdir()
    os.chmod(writer.path / "a" / "b", 0o700)
    for i, d in enumerate(("a", "a/b", "c", "")):
        (writer.path / d / f"f{i}.txt").write_bytes(b"x" * 100)
        os.chmod(writer.path / d / f"f{i}.txt", 0o600 if i % 2 else 0o644)
    flush(writer)
    assert len(shadow_keys(writer)) == 3  # a/b, f1 (in a/b), f3 (in the root)

    reader = mount(list_ttl="60s", revalidate_ttl="60s")
    before = store_calls(reader)
    assert (reader.path / "f3.txt").read_bytes() == b"x" * 100
    # root listed (data + shadow), then ONE GET: no HEAD
    assert delta(store_calls(reader), before) == {"ListObjectsV2": 2, "GetObject": 1}

    finder = mount(list_ttl="60s", revalidate_ttl="60s")
    before = store_calls(finder)
    found = subprocess.run(
        ["find", str(finder.path), "-printf", "%m %u %P\n"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert "700 root a/b" in found and "600 root a/b/f1.txt" in found
    assert "644 root a/f0.txt" in found and "600 root f3.txt" in found
    # 4 directories, each: one data LIST and one shadow LIST; nothing else
    assert delta(store_calls(finder), before) == {"ListObjectsV2": 8}


def test_rename_and_unlink_keep_the_shadow_in_step(mount: MountFactory, require_root: None) -> None:
    m = mount(list_ttl="60s", revalidate_ttl="60s")
    (m.path / "d").mkdir()
    os.chmod(m.path / "d", 0o750)
    (m.path / "d" / "r.bin").write_bytes(b"r")
    os.chmod(m.path / "d" / "r.bin", 0o640)
    flush(m)
    assert shadow_keys(m) == {"d@m0750,u0,g0", "d/r.bin@m0640,u0,g0"}
    os.rename(m.path / "d" / "r.bin", m.path / "d" / "s.bin")
    flush(m)
    assert shadow_keys(m) == {"d@m0750,u0,g0", "d/s.bin@m0640,u0,g0"}
    os.rename(m.path / "d", m.path / "e")
    flush(m)
    assert shadow_keys(m) == {"e@m0750,u0,g0", "e/s.bin@m0640,u0,g0"}
    os.unlink(m.path / "e" / "s.bin")
    flush(m)
    assert shadow_keys(m) == {"e@m0750,u0,g0"}
    os.rmdir(m.path / "e")
    flush(m)
    assert shadow_keys(m) == set()
    with pytest.raises(PermissionError) as info:
        (m.path / SHADOW).mkdir()
    assert info.value.errno == errno.EPERM


def test_fresh_node_state_wiped_and_remounted(mount: MountFactory, require_root: None) -> None:
    """The same node after its state directory and tiers are lost."""
    import shutil

    m = mount(options="allow_other", list_ttl="60s", revalidate_ttl="60s")
    (m.path / "k.bin").write_bytes(b"k")
    os.chmod(m.path / "k.bin", 0o600)
    flush(m)
    m.umount()
    shutil.rmtree(m.state_dir)
    for tier in m.tier_dirs.values():
        shutil.rmtree(tier)
        tier.mkdir()
    m.mount()
    assert as_nobody(m, ("read", "k.bin")) == {"read:k.bin": errno.EACCES}
    assert os.stat(m.path / "k.bin").st_mode & 0o7777 == 0o600


def test_a_private_file_fsynced_before_kill9_gets_its_shadow_after_remount(
    mount: MountFactory, require_root: None
) -> None:
    from tests.fuse.test_crash import kill9

    m = mount(options="allow_other", upload_delay="60s", list_ttl="60s", revalidate_ttl="60s")
    fd = os.open(m.path / "crash.bin", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.write(fd, b"private")
        os.fsync(fd)
    finally:
        os.close(fd)
    # nothing reached the bucket yet (upload_delay): the journal must carry it
    assert shadow_keys(m) == set()
    assert m.s3.list_objects_v2(Bucket=m.bucket, Prefix=m.key("crash.bin")).get("KeyCount") == 0
    kill9(m, m.pids[-1])
    m.mount()
    flush(m)
    assert shadow_keys(m) == {"crash.bin@m0600,u0,g0"}
    node = mount(options="allow_other", list_ttl="60s", revalidate_ttl="60s")
    assert as_nobody(node, ("read", "crash.bin")) == {"read:crash.bin": errno.EACCES}
    assert (node.path / "crash.bin").read_bytes() == b"private"


def bucket_view(m: Mount, name: str) -> tuple[int, int, int]:
    """(perm, uid, gid) a fresh node would show for the root-level ``name``,
    from the shadow entries in the bucket (tierfs.core.names.shadow), or the
    canonical attributes when there are none."""
    from tierfs.core.names.shadow import combine, parse_shadow_name

    found = []
    for key in shadow_keys(m):
        parsed = parse_shadow_name(key)
        if parsed is not None and parsed[0] == name:
            found.append(parsed[1])
    view = combine(found)
    return (0o644, 0, 0) if view is None else (view.perm, view.uid, view.gid)


def no_wider(view: tuple[int, int, int], perm: int) -> bool:
    return view[1:] == (0, 0) and view[0] & ~perm == 0


@pytest.mark.slow
def test_chmod_then_kill9_loop_never_leaves_a_wider_view(
    mount: MountFactory, require_root: None
) -> None:
    """Each round: chmod, kill -9 the daemon a few ms later (the chmod's
    journal entry may be anywhere in its steps), then the bucket must show
    the old or the new permission or something narrower, never more; after
    a remount and a flush it shows exactly the file's permission."""
    import random
    import time

    from tests.fuse.test_crash import kill9

    rounds = int(os.environ.get("TIERFS_MODES_ROUNDS", "20"))
    rng = random.Random(11)
    m = mount(list_ttl="60s", revalidate_ttl="60s")
    (m.path / "f.bin").write_bytes(b"f")
    os.chmod(m.path / "f.bin", 0o644)
    flush(m)
    current = 0o644
    choices = [0o600, 0o644, 0o640, 0o604, 0o400, 0o666, 0o700, 0o444]
    halfway = 0
    for _ in range(rounds):
        new = rng.choice([c for c in choices if c != current])
        os.chmod(m.path / "f.bin", new)
        time.sleep(rng.uniform(0.0, 0.06))
        kill9(m, m.pids[-1])
        view = bucket_view(m, "f.bin")
        assert no_wider(view, current) or no_wider(view, new), (oct(current), oct(new), view)
        halfway += view[0] not in (current, new)
        m.mount()
        actual = os.stat(m.path / "f.bin").st_mode & 0o7777
        assert actual in (current, new)  # a chmod not yet committed may be lost, like on ext4
        flush(m)
        assert bucket_view(m, "f.bin") == (actual, 0, 0)
        current = actual
    print(f"{rounds} rounds, {halfway} caught with both shadows in the bucket")
    node = mount(options="allow_other", list_ttl="60s", revalidate_ttl="60s")
    assert os.stat(node.path / "f.bin").st_mode & 0o7777 == current
