"""Real mount: the audit log names the user, the process and the path of
each change, and with ``reads = true`` each open for reading.

An ordinary user (through an ``allow_other`` mount) runs the usual tools
in a directory of their own: ``touch``, ``mkdir``, ``mv``, ``chmod``,
``truncate``, ``ln -s``, ``cat``, ``rm``, ``rmdir``, and a hard link that
tierfs refuses.  A second mount with ``[write] deletes = false`` refuses a
delete.  Every record carries the uid, the pid and name of the process
that ran the tool, the path from the mount root, the new path of a rename,
and the errno the request got.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import MountFactory, run_tierfs, wait_until
from tests.fuse.test_cli import traversable

pytestmark = pytest.mark.fuse


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def audit_config(path: Path, reads: bool) -> str:
    return f'[audit]\npath = "{path}"\nreads = {"true" if reads else "false"}\n'


def test_the_audit_log_names_user_process_and_path_of_each_change(
    mount: MountFactory, tmp_path: Path, other_uid: int
) -> None:
    log = tmp_path / "audit" / "main.audit.jsonl"
    m = mount(
        {"data/a.bin": b"a" * 1000},
        options="allow_other",
        extra_config=audit_config(log, reads=True),
    )
    work = m.path / "work"
    work.mkdir()
    os.chown(work, other_uid, other_uid)
    ran: list[tuple[int, str, int]] = []  # (pid, tool, exit status)

    def run(*argv: str) -> int:
        proc = subprocess.Popen(
            argv,
            user=other_uid,
            group=other_uid,
            extra_groups=[],
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        status = proc.wait(timeout=30)
        ran.append((proc.pid, argv[0], status))
        return proc.pid

    with traversable(m.path):
        touch = run("touch", f"{work}/new.txt")
        mkdir = run("mkdir", f"{work}/sub")
        mv = run("mv", f"{work}/new.txt", f"{work}/sub/moved.txt")
        chmod = run("chmod", "600", f"{work}/sub/moved.txt")
        truncate = run("truncate", "-s", "100", f"{work}/sub/moved.txt")
        symlink = run("ln", "-s", "/etc/passwd", f"{work}/passwd-link")
        cat = run("cat", f"{m.path}/data/a.bin")
        hard = run("ln", f"{work}/sub/moved.txt", f"{work}/hard")  # refused: no hard links
        rm = run("rm", f"{work}/passwd-link")
        rmdir_ = run("rmdir", f"{work}/sub")  # refused: not empty
    statuses = {tool: status for _pid, tool, status in ran if tool != "ln"}
    assert statuses == {
        "touch": 0,
        "mkdir": 0,
        "mv": 0,
        "chmod": 0,
        "truncate": 0,
        "cat": 0,
        "rm": 0,
        "rmdir": 1,
    }, ran

    def by(pid: int) -> list[dict[str, Any]]:
        return [r for r in records(log) if r.get("pid") == pid]

    assert wait_until(lambda: bool(by(rmdir_)), timeout=10), records(log)
    for record in records(log):
        if record["pid"] in {pid for pid, _tool, _status in ran}:
            assert (record["uid"], record["gid"]) == (other_uid, other_uid), record
    # touch: a create, as this user and process
    (create,) = [r for r in by(touch) if r["op"] == "create"]
    assert (create["comm"], create["path"], create["errno"]) == ("touch", "work/new.txt", 0)
    assert "O_CREAT" in create["flags"]
    umask = os.umask(0o022)
    os.umask(umask)  # the tools' (they inherit it); the kernel applies it
    assert [(r["op"], r["path"], r["mode"]) for r in by(mkdir)] == [
        ("mkdir", "work/sub", f"{0o777 & ~umask:04o}")
    ]
    (rename,) = [r for r in by(mv) if r["op"] == "rename"]
    assert (rename["comm"], rename["path"], rename["new_path"], rename["errno"]) == (
        "mv",
        "work/new.txt",
        "work/sub/moved.txt",
        0,
    )
    assert [(r["op"], r["set"]) for r in by(chmod) if r["op"] == "setattr"] == [
        ("setattr", {"mode": "0600"})
    ]
    sizes = [r["set"].get("size") for r in by(truncate) if r["op"] == "setattr"]
    assert 100 in sizes, by(truncate)
    assert [(r["op"], r["path"], r["target"]) for r in by(symlink) if r["op"] == "symlink"] == [
        ("symlink", "work/passwd-link", "/etc/passwd")
    ]
    # reads = true: the open for reading, with its flags
    (read_open,) = [r for r in by(cat) if r["op"] == "open"]
    assert (read_open["comm"], read_open["path"], read_open["flags"][0]) == (
        "cat",
        "data/a.bin",
        "O_RDONLY",
    )
    # refused requests are recorded with their errno
    (link,) = [r for r in by(hard) if r["op"] == "link"]
    assert (link["path"], link["new_path"], link["errno"]) == (
        "work/sub/moved.txt",
        "work/hard",
        1,  # EPERM
    )
    assert [(r["op"], r["path"], r["errno"]) for r in by(rm)] == [("unlink", "work/passwd-link", 0)]
    assert [(r["op"], r["path"], r["errno"]) for r in by(rmdir_)] == [
        ("rmdir", "work/sub", 39)  # ENOTEMPTY
    ]
    status = m.status()["audit"]
    assert status["path"] == str(log) and status["dropped"] == 0 and status["records"] > 10
    assert "audit:" in run_tierfs("status", str(m.path)).stdout


def test_a_refused_delete_and_no_reads_unless_asked(mount: MountFactory, tmp_path: Path) -> None:
    log = tmp_path / "deletes.audit.jsonl"
    m = mount(
        {"keep/a.bin": b"a" * 100},
        extra_config=audit_config(log, reads=False) + "[write]\ndeletes = false\n",
    )
    assert (m.path / "keep/a.bin").read_bytes() == b"a" * 100  # a read: not recorded
    with pytest.raises(PermissionError):
        os.unlink(m.path / "keep/a.bin")
    with open(m.path / "keep/b.bin", "wb") as f:  # an open for writing: recorded
        f.write(b"b")
    assert wait_until(lambda: len(records(log)) >= 2, timeout=10)
    got = [(r["op"], r["path"], r["errno"], r["pid"]) for r in records(log)]
    assert got == [
        ("unlink", "keep/a.bin", 1, os.getpid()),  # EPERM: deletes = false
        ("create", "keep/b.bin", 0, os.getpid()),
    ], got
