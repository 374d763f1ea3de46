"""Real mounts: directory quotas (``[[quotas]]``).

A quota in bytes and one in names, each hit by a writer: EDQUOT exactly
where the limit is, nothing written before it lost, the warning at 80 %
logged once and shown by ``tierfs quota`` and ``tierfs status``.  Two
mounts on one bucket, both writing: the overshoot stays within the
documented bound (each node fills at most the room it saw at its last
walk), and after a walk both see the total and refuse.  ``policy reload``
adds a quota to a running mount.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, run_tierfs

pytestmark = pytest.mark.fuse

MiB = 1 << 20


def quota_report(m: Mount, walk: bool = False) -> dict[str, dict[str, Any]]:
    args = ["quota", str(m.path), "--json"] + (["--walk"] if walk else [])
    done = run_tierfs(*args)
    assert done.returncode == 0, done.stderr
    return {q["path"]: q for q in json.loads(done.stdout)["quotas"]}


def write_until_refused(path: Path, chunk: bytes, most: int) -> tuple[int, int]:
    """Append ``chunk`` with unbuffered writes until one fails; returns the
    bytes written and the errno (0: ``most`` bytes went in)."""
    written = 0
    with open(path, "ab", buffering=0) as f:
        while written < most:
            try:
                written += f.write(chunk)
            except OSError as exc:
                return written, exc.errno or 0
    return written, 0


def test_a_bytes_quota_refuses_the_write_that_passes_it(mount: MountFactory) -> None:
    m = mount(
        {"users/alice/old.bin": b"o" * (2 * MiB), "users/bob/big.bin": b"b" * (8 * MiB)},
        extra_config='\n[[quotas]]\npath = "users/alice"\nbytes = "10MiB"\nname = "alice"\n',
    )
    report = quota_report(m, walk=True)["users/alice"]
    assert (report["bytes_used"], report["bytes_limit"], report["files_used"]) == (
        2 * MiB,
        10 * MiB,
        1,
    )
    alice = m.path / "users/alice"
    written, err = write_until_refused(alice / "new.bin", b"n" * (512 * 1024), 64 * MiB)
    assert err == errno.EDQUOT, os.strerror(err) if err else "never refused"
    assert written == 8 * MiB  # the room, to the byte: the next 512 KiB did not fit
    assert (alice / "new.bin").stat().st_size == 8 * MiB
    assert (alice / "new.bin").read_bytes() == b"n" * (8 * MiB)
    assert (alice / "old.bin").read_bytes() == b"o" * (2 * MiB)
    # Outside the quota nothing is limited.
    (m.path / "users/bob/more.bin").write_bytes(b"m" * (4 * MiB))

    report = quota_report(m)["users/alice"]
    assert (report["bytes_percent"], report["full"], report["warning"]) == (100.0, True, True)
    assert report["refused"] >= 1
    log = m.log_text()
    assert log.count("quota on 'users/alice': 80% of a limit used") == 1, log[-3000:]
    assert "the quota on 'users/alice' is full" in log
    table = run_tierfs("quota", str(m.path))
    assert table.returncode == 0 and "FULL (EDQUOT)" in table.stdout, table.stdout
    status = run_tierfs("status", str(m.path))
    assert "quota:    users/alice" in status.stdout, status.stdout

    # Deleting frees the room at once; what was written reaches the bucket
    # and the next walk counts the same.
    (alice / "old.bin").unlink()
    with open(alice / "new.bin", "ab") as f:
        f.write(b"x" * MiB)
    assert run_tierfs("flush", str(alice)).returncode == 0
    report = quota_report(m, walk=True)["users/alice"]
    assert (report["bytes_used"], report["files_used"]) == (9 * MiB, 1), report
    assert report["warning"] is True and report["full"] is False


def test_a_files_quota_refuses_create_and_mkdir(mount: MountFactory) -> None:
    m = mount(extra_config='\n[[quotas]]\npath = "proj"\nfiles = 20\n')
    proj = m.path / "proj"
    proj.mkdir()
    made = []
    refused = None
    for i in range(100):
        try:
            (proj / f"f{i:03d}").write_bytes(b"%d" % i)
            made.append(i)
        except OSError as exc:
            refused = exc
            break
    assert refused is not None and refused.errno == errno.EDQUOT
    assert len(made) == 20
    with pytest.raises(OSError) as info:
        (proj / "d").mkdir()
    assert info.value.errno == errno.EDQUOT
    assert sorted(os.listdir(proj)) == [f"f{i:03d}" for i in made]
    assert all((proj / f"f{i:03d}").read_bytes() == b"%d" % i for i in made)
    # A rename inside the quota is never refused; removing makes room.
    os.rename(proj / "f000", proj / "renamed")
    os.unlink(proj / "renamed")
    (proj / "d").mkdir()
    report = quota_report(m)["proj"]
    assert (report["files_used"], report["files_limit"], report["warning"]) == (20, 20, True)
    assert m.log_text().count("quota on 'proj': 80% of a limit used") == 1


def test_two_mounts_overshoot_within_the_documented_bound(mount: MountFactory) -> None:
    """Each mount fills at most the room it saw at its last walk; the
    bucket then holds at most 2 x that room; a walk shows the total to both
    and both refuse from then on."""
    limit = 8 * MiB
    config = f'\n[[quotas]]\npath = "shared"\nbytes = "{limit}"\n'
    node_a = mount(extra_config=config)
    node_b = mount(extra_config=config)
    for node in (node_a, node_b):
        assert quota_report(node, walk=True)["shared"]["bytes_used"] == 0
    (node_a.path / "shared").mkdir()
    written = {}
    for name, node in (("a", node_a), ("b", node_b)):
        while not (node.path / "shared").is_dir():  # b sees a's mkdir after list_ttl
            os.listdir(node.path)
        count, err = write_until_refused(
            node.path / "shared" / f"from-{name}", b"w" * MiB, 4 * limit
        )
        assert err == errno.EDQUOT
        written[name] = count
    room_at_last_walk = limit
    assert all(count <= room_at_last_walk for count in written.values()), written
    for node in (node_a, node_b):
        assert run_tierfs("flush", str(node.path)).returncode == 0
    pages = node_a.s3.get_paginator("list_objects_v2").paginate(
        Bucket=node_a.bucket, Prefix=node_a.key("shared/")
    )
    total = sum(o["Size"] for page in pages for o in page.get("Contents", []))
    assert total == sum(written.values())
    assert limit < total <= 2 * room_at_last_walk  # passed, within the bound
    for name, node in (("a", node_a), ("b", node_b)):
        report = quota_report(node, walk=True)["shared"]
        assert report["bytes_used"] == total and report["full"], report
        count, err = write_until_refused(node.path / "shared" / f"from-{name}", b"x", 1)
        assert (count, err) == (0, errno.EDQUOT)


def test_policy_reload_adds_a_quota_and_check_validates_it(
    mount: MountFactory, tmp_path: Path
) -> None:
    policy = tmp_path / "quotas.toml"
    policy.write_text("", encoding="utf-8")
    m = mount()
    text = m.config_path.read_text(encoding="utf-8")
    m.config_path.write_text(f'policy_files = ["{policy}"]\n' + text, encoding="utf-8")
    (m.path / "team").mkdir()
    (m.path / "team/a").write_bytes(b"a" * MiB)
    policy.write_text('[[quotas]]\npath = "team"\nbytes = "1MiB"\nfiles = "x"\n')
    check = run_tierfs("policy", "check", str(policy))
    assert check.returncode == 1 and "files: expected an integer" in check.stderr
    reload = run_tierfs("policy", "reload", str(m.path))
    assert reload.returncode != 0  # a broken file changes nothing
    assert quota_report(m) == {}
    policy.write_text('[[quotas]]\npath = "team"\nbytes = "1MiB"\n')
    assert run_tierfs("policy", "check", str(policy)).returncode == 0
    reload = run_tierfs("policy", "reload", str(m.path))
    assert reload.returncode == 0 and "1 quotas in force" in reload.stdout, reload.stdout
    with pytest.raises(OSError) as info:
        (m.path / "team/b").write_bytes(b"b")
    assert info.value.errno == errno.EDQUOT
    assert quota_report(m)["team"]["bytes_used"] == MiB
