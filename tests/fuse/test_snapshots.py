"""Dataset snapshots through real mounts: ``tierfs snapshot create|list|
show|diff|delete`` on a live mount, and ``tierfs mount ... -o
snapshot=NAME`` on another node (its own config, state and tiers), against
moto with versioning on and the ``file://`` backing (no versions: ETags).

What each test holds:

- the snapshot mount shows exactly the recorded names, with the recorded
  bytes, modes and owners, after other writers overwrote, deleted and
  added objects; every change fails with EROFS; ``status`` and
  ``/proc/mounts`` name the snapshot;
- on the ``file://`` backing a read of an object changed since fails with
  a clear error naming it, and ``create`` warns that nothing keeps versions;
- a snapshot mount sends no ``ListObjectsV2`` and no ``HeadObject`` at all
  (counted at the server's side of a proxy);
- a user may snapshot only what they may read; a refused or killed create
  leaves no snapshot.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crashloop import kill9
from tests.faults import FaultProxy
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    as_user,
    daemon_env,
    run_tierfs,
    tierfs_command,
    traversable,
    wait_until,
)
from tests.fuse.test_shared_tier import shared_toml
from tests.seaweed_cluster import SeaweedCluster
from tierfs.control.client import locate, request

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB

DATASET = {
    "ds/train/0.bin": b"zero " * 2000,
    "ds/train/1.bin": b"one " * 3000,
    "ds/train/sub/2.bin": b"two " * 100,
    "ds/val/3.bin": b"three",
    "ds/labels.csv": b"a,b\n1,2\n",
    "other/x.bin": b"not in the snapshot",
}


@pytest.fixture
def snapshot_mounts() -> Iterator[list[Mount]]:
    """Snapshot mounts a test made (unmounted in teardown)."""
    made: list[Mount] = []
    try:
        yield made
    finally:
        problems = []
        for m in made:
            problems += m.cleanup()
        assert not [m.path for m in made if os.path.ismount(m.path)]
        assert not problems, problems


def mount_snapshot(node: Mount, name: str, made: list[Mount]) -> Mount:
    """``tierfs mount CONFIG MP -o snapshot=NAME`` with ``node``'s config."""
    mountpoint = node.path.parent / f"snapshot-{name}"
    mountpoint.mkdir(exist_ok=True)
    snap = dataclasses.replace(
        node,
        path=mountpoint,
        state_dir=node.state_dir / "snapshots" / name,
        options=",".join(filter(None, [node.options, f"snapshot={name}"])),
        pids=[],
    )
    made.append(snap)
    snap.mount()
    return snap


def cli_json(*args: str) -> Any:
    done = run_tierfs(*args, "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def names(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def tree(root: Path) -> dict[str, bytes | None]:
    """Every name below ``root``: a file's bytes, a directory's None."""
    found: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return found


def change_the_bucket(live: Mount) -> None:
    """Other writers, after the snapshot: overwrite, delete, add."""
    (live.path / "ds/train/0.bin").write_bytes(b"OVERWRITTEN")
    os.unlink(live.path / "ds/val/3.bin")
    (live.path / "ds/train/new.bin").write_bytes(b"added later")
    done = run_tierfs("flush", str(live.path))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("backing", ["s3-versioned", "file"])
def test_a_snapshot_mount_on_another_node_shows_the_recorded_bytes(
    mount: MountFactory,
    snapshot_mounts: list[Mount],
    s3_client: Any,
    bucket: tuple[str, str],
    tmp_path: Path,
    backing: str,
) -> None:
    backing_dir = None
    if backing == "file":
        backing_dir = tmp_path / "bucket"
        backing_dir.mkdir()
    else:
        s3_client.put_bucket_versioning(
            Bucket=bucket[1], VersioningConfiguration={"Status": "Enabled"}
        )
    live = mount(backing_dir=backing_dir)
    for name, body in DATASET.items():
        (live.path / name).parent.mkdir(parents=True, exist_ok=True)
        (live.path / name).write_bytes(body)
    (live.path / "ds/empty").mkdir()
    os.chmod(live.path / "ds/train/1.bin", 0o600)
    os.chown(live.path / "ds/train/1.bin", 4242, 4243)
    assert run_tierfs("flush", str(live.path)).returncode == 0
    recorded = tree(live.path / "ds")

    done = run_tierfs("snapshot", "create", str(live.path), "--name", "run-1", "ds")
    assert done.returncode == 0, done.stderr
    # Every file, and every directory's marker (each was made by mkdir), ds/ too.
    objects = len(recorded) + 1
    assert f"snapshot run-1: {objects} objects" in done.stdout
    if backing == "file":
        assert "keeps no object versions" in done.stderr
    listed = cli_json("snapshot", "list", str(live.path))
    assert [s["name"] for s in listed["snapshots"]] == ["run-1"]
    assert listed["snapshots"][0]["paths"] == ["ds"] and listed["leftovers"] == []
    shown = cli_json("snapshot", "show", str(live.path), "run-1")
    assert shown["versioned"] is (backing != "file") and shown["objects"] == objects

    change_the_bucket(live)

    node2 = mount(backing_dir=backing_dir)  # a second node: its own state and tiers
    snap = mount_snapshot(node2, "run-1", snapshot_mounts)
    assert names(snap.path) == {"ds", *(f"ds/{name}" for name in recorded)}
    assert (snap.path / "ds/val").is_dir() and not (snap.path / "ds/train/new.bin").exists()
    st = os.stat(snap.path / "ds/train/1.bin")
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, 4242, 4243)
    assert (snap.path / "ds/train/1.bin").read_bytes() == DATASET["ds/train/1.bin"]
    if backing == "file":  # no versions: what changed since cannot be read
        with pytest.raises(OSError) as caught:
            (snap.path / "ds/train/0.bin").read_bytes()
        assert caught.value.errno in (errno.EIO, errno.ESTALE)
        assert wait_until(lambda: "ds/train/0.bin changed" in snap.log_text(), 10)
        with pytest.raises(OSError):
            (snap.path / "ds/val/3.bin").read_bytes()
        assert "no longer holds ds/val/3.bin" in snap.log_text()
    else:
        # A preload warms the snapshot as any mount; then every byte is local.
        preload = run_tierfs("preload", str(snap.path / "ds"))
        assert preload.returncode == 0, preload.stderr
        assert int(snap.where_one("ds")["cached_bytes"]) == sum(
            len(b) for b in recorded.values() if b is not None
        )
        gets = snap.status()["store_calls"].get("GetObject", 0)
        assert tree(snap.path / "ds") == recorded
        assert snap.status()["store_calls"].get("GetObject", 0) == gets
    # Read-only, and named as the snapshot it is.
    for change in (
        lambda: (snap.path / "ds/new").write_bytes(b"x"),
        lambda: os.unlink(snap.path / "ds/labels.csv"),
        lambda: os.mkdir(snap.path / "ds/d"),
        lambda: os.chmod(snap.path / "ds/labels.csv", 0o777),
    ):
        with pytest.raises(OSError) as caught:
            change()
        assert caught.value.errno == errno.EROFS
    status = snap.status()
    assert status["snapshot"]["name"] == "run-1" and status["snapshot"]["objects"] == objects
    shown_status = run_tierfs("status", str(snap.path))
    assert "snapshot: run-1 (read-only), taken" in shown_status.stdout, shown_status.stdout
    sources = [
        line.split()[0]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1] == str(snap.path)
    ]
    assert sources and sources[0].endswith("?snapshot=run-1")
    create_there = run_tierfs("snapshot", "create", str(snap.path), "--name", "x")
    assert create_there.returncode == 1 and "mount of snapshot 'run-1'" in create_there.stderr

    if backing != "file":
        # The bucket's lifecycle expires a recorded version: show says so.
        versions = s3_client.list_object_versions(Bucket=bucket[1], Prefix=live.key("ds/val/3.bin"))
        for version in versions.get("Versions", []):
            s3_client.delete_object(
                Bucket=bucket[1], Key=version["Key"], VersionId=version["VersionId"]
            )
        done = run_tierfs("snapshot", "show", str(live.path), "run-1")
        assert done.returncode == 0 and "gone:     1 recorded versions" in done.stdout, done.stdout
        assert "no longer keeps the recorded version of 1 object(s)" in done.stderr
        assert "(first: ds/val/3.bin)" in done.stderr

    # diff against the bucket now, from either mount; then delete.
    changes = cli_json("snapshot", "diff", str(live.path), "run-1")
    assert changes["added"] == ["ds/train/new.bin"]
    assert changes["removed"] == ["ds/val/3.bin"]
    assert changes["changed"] == ["ds/train/0.bin"]
    assert cli_json("snapshot", "diff", str(snap.path), "run-1")["counts"] == changes["counts"]
    assert cli_json("snapshot", "delete", str(live.path), "run-1")["deleted"] >= 2
    gone = run_tierfs("snapshot", "show", str(live.path), "run-1", "--json")
    assert gone.returncode == 1 and json.loads(gone.stdout)["errno"] == errno.ENOENT
    assert cli_json("snapshot", "list", str(live.path)) == {"snapshots": [], "leftovers": []}
    # The mount of it goes on reading what it has.
    assert (snap.path / "ds/labels.csv").read_bytes() == DATASET["ds/labels.csv"]


def test_a_snapshot_mount_sends_no_list_and_no_head(
    mount: MountFactory,
    snapshot_mounts: list[Mount],
    s3_client: Any,
    bucket: tuple[str, str],
    fault_proxy: FaultProxy,
) -> None:
    s3_client.put_bucket_versioning(Bucket=bucket[1], VersioningConfiguration={"Status": "Enabled"})
    live = mount({f"ds/d{i % 7}/f{i}.bin": bytes([i]) * (i * 100) for i in range(60)})
    assert run_tierfs("snapshot", "create", str(live.path), "--name", "s").returncode == 0
    node2 = mount(do_mount=False, list_ttl="1s", revalidate_ttl="1s")
    config = node2.config_path.read_text()
    node2.config_path.write_text(
        config.replace(
            json.dumps(node2.endpoint), json.dumps(f"http://127.0.0.1:{fault_proxy.port}")
        )
    )
    snap = mount_snapshot(node2, "s", snapshot_mounts)
    at_mount = len(fault_proxy.request_lines)  # the bucket's check, the manifest
    first = tree(snap.path)
    assert len([v for v in first.values() if v is not None]) == 60
    for _ in range(2):  # again, past every TTL of the config
        time.sleep(1.2)
        assert tree(snap.path) == first
    lines = fault_proxy.request_lines[at_mount:]
    assert not [line for line in lines if "list-type=2" in line], lines
    assert not [line for line in lines if line.startswith("HEAD ")], lines
    gets = [line for line in lines if line.startswith("GET ") and "versionId=" in line]
    assert len(gets) >= 59  # one per non-empty file (the record's reads have no versionId)


def test_a_user_may_snapshot_only_what_they_may_read(mount: MountFactory, other_uid: int) -> None:
    live = mount({"pub/a.bin": b"a", "priv/secret.bin": b"s"}, options="allow_other")
    os.chmod(live.path / "priv", 0o700)
    with traversable(live.path):
        socket_path = locate(live.path).socket_path

        def create(name: str, paths: list[str]) -> Any:
            return lambda: json.dumps(
                request(socket_path, "snapshot_create", {"name": name, "paths": paths})
            )

        refused = as_user(other_uid, create("mine", ["priv"]))
        assert refused.startswith("ControlError") and "priv" in refused, refused
        whole = as_user(other_uid, create("all", []))  # the whole mount holds priv/
        assert whole.startswith("ControlError") and "may not read priv" in whole, whole
        assert as_user(other_uid, create("pub", ["pub"])).startswith("ok: ")
        # Root's snapshot: another user may list it (without its paths),
        # and may neither diff nor delete it.
        assert run_tierfs("snapshot", "create", str(live.path), "--name", "root").returncode == 0

        def ask(op: str, args: dict[str, Any]) -> Any:
            return lambda: json.dumps(request(socket_path, op, args))

        for op in ("snapshot_delete", "snapshot_diff"):
            answer = as_user(other_uid, ask(op, {"name": "root"}))
            assert "only its creator or root" in answer, answer
        theirs = json.loads(as_user(other_uid, ask("snapshot_list", {})).removeprefix("ok: "))
        by_name = {s["name"]: s for s in theirs["snapshots"]}
        assert by_name["root"]["paths_hidden"] == 1 and "paths" not in by_name["root"]
        assert by_name["pub"]["paths"] == ["pub"]
    listed = cli_json("snapshot", "list", str(live.path))
    assert sorted(s["name"] for s in listed["snapshots"]) == ["pub", "root"]
    assert listed["leftovers"] == []
    assert {s["name"]: s["creator_uid"] for s in listed["snapshots"]}["pub"] == other_uid


def test_a_create_killed_midway_leaves_no_snapshot(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    live = mount({f"ds/{i}.bin": b"x" for i in range(20)}, do_mount=False)
    config = live.config_path.read_text()
    live.config_path.write_text(
        config.replace(
            json.dumps(live.endpoint), json.dumps(f"http://127.0.0.1:{fault_proxy.port}")
        )
    )
    live.mount()
    # The create's first PUT (its one part) is held: the daemon dies before
    # it could write the manifest.
    gate = fault_proxy.hold_requests(
        lambda line: line.startswith("PUT ") and "/.tierfs-snapshots/cut/part-" in line
    )
    client = subprocess.Popen(
        [*tierfs_command(), "snapshot", "create", str(live.path), "--name", "cut"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=daemon_env(),
    )
    try:
        assert wait_until(lambda: fault_proxy.held >= 1, 30), "the part's PUT never came"
        kill9(live, live.pids[-1])
    finally:
        gate.set()
        client.wait(30)
    assert client.returncode != 0
    live.mount()
    listed = cli_json("snapshot", "list", str(live.path))
    assert listed["snapshots"] == []
    mount_it = run_tierfs(
        "mount", str(live.config_path), str(live.path.parent), "-o", "snapshot=cut"
    )
    assert mount_it.returncode == 1 and "no snapshot 'cut'" in mount_it.stderr
    made = [p for p in (live.state_dir, *live.tier_dirs.values()) if (p / "snapshots").exists()]
    assert not made, f"a failed snapshot mount left {made}"
    # The part may have landed after the kill (the request was sent): it
    # is named as what a create left, and root deletes it.
    assert listed["leftovers"] in ([], ["cut"])
    if listed["leftovers"]:
        assert cli_json("snapshot", "delete", str(live.path), "cut")["deleted"] == 1
    assert cli_json("snapshot", "list", str(live.path)) == {"snapshots": [], "leftovers": []}


def test_the_shared_tier_serves_a_snapshot_mount(
    mount: MountFactory,
    snapshot_mounts: list[Mount],
    s3_client: Any,
    bucket: tuple[str, str],
    seaweed: SeaweedCluster,
) -> None:
    """Blocks are shared by object version (its ETag): what one node's live
    mount fetched is what another node's snapshot mount reads, from the
    shared tier, with no GET of the bucket."""
    s3_client.put_bucket_versioning(Bucket=bucket[1], VersioningConfiguration={"Status": "Enabled"})
    data = os.urandom(3 * MiB + 5)
    extra = shared_toml(seaweed)
    first = mount({"ds/big.bin": data}, extra_config=extra)
    assert run_tierfs("snapshot", "create", str(first.path), "--name", "s").returncode == 0
    assert (first.path / "ds/big.bin").read_bytes() == data
    assert wait_until(lambda: first.status()["shared_tier"]["puts"] >= 4, 30)
    second = mount(extra_config=extra, do_mount=False)
    snap = mount_snapshot(second, "s", snapshot_mounts)
    at_mount = snap.status()["store_calls"].get("GetObject", 0)  # the record's reads
    assert (snap.path / "ds/big.bin").read_bytes() == data
    shared = snap.status()["shared_tier"]
    assert shared["bytes_read"] == len(data) and shared["bucket_bytes"] == 0, shared
    assert snap.status()["store_calls"].get("GetObject", 0) == at_mount


def test_a_snapshot_mount_reads_the_live_mounts_warm_files_in_place(
    mount: MountFactory,
    snapshot_mounts: list[Mount],
    s3_client: Any,
    bucket: tuple[str, str],
) -> None:
    """Beside the node's live mount (the same config), a file unchanged
    since the snapshot and warm in the live mount is read from the live
    mount's tier file: no GET, nothing cached twice.  A file changed since
    is read at its recorded version and cached by the snapshot mount."""
    s3_client.put_bucket_versioning(Bucket=bucket[1], VersioningConfiguration={"Status": "Enabled"})
    same, changed = os.urandom(2 * MiB + 3), os.urandom(300 * KiB)
    live = mount({"ds/same.bin": same, "ds/changed.bin": changed})
    assert (live.path / "ds/same.bin").read_bytes() == same  # warm in the live mount
    assert run_tierfs("snapshot", "create", str(live.path), "--name", "s").returncode == 0
    (live.path / "ds/changed.bin").write_bytes(b"new bytes")
    assert run_tierfs("flush", str(live.path)).returncode == 0

    snap = mount_snapshot(live, "s", snapshot_mounts)
    gets = snap.status()["store_calls"].get("GetObject", 0)
    # A preload fetches only what the live mount does not hold at its version.
    preload = run_tierfs("preload", str(snap.path / "ds"), "--json")
    assert preload.returncode == 0, preload.stderr
    assert int(snap.where_one("ds/same.bin")["cached_bytes"]) == 0
    assert int(snap.where_one("ds/changed.bin")["cached_bytes"]) == len(changed)
    fetched = snap.status()["store_calls"].get("GetObject", 0)
    assert fetched > gets
    assert (snap.path / "ds/same.bin").read_bytes() == same
    assert (snap.path / "ds/changed.bin").read_bytes() == changed
    assert snap.status()["store_calls"].get("GetObject", 0) == fetched
    assert int(snap.where_one("ds/same.bin")["cached_bytes"]) == 0
    borrowed = snap.status()["borrowed"]
    assert borrowed["opens"] >= 1 and borrowed["bytes"] >= len(same), borrowed
