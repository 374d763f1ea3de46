"""Real mounts, two local users: what one user (the attacker, ``other_uid``)
tries against another's data (the victim's files, owned by ``VICTIM``) and
against the node, through an ``allow_other`` mount, an access point of the
same bucket, and the control socket every local user may reach.

Each test is one attempt an ordinary user made against the daemon, and
checks that it is refused or bounded with a clear message and that nothing
of the victim's is fetched, shown or uploaded.  The attacker runs in a
forked child (``as_user``: its own uid and group, no other groups); root
(this process) plays the victim's side and the administrator.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import (
    PREFIX,
    Mount,
    MountFactory,
    as_user,
    control_request,
    run_tierfs,
    traversable,
    wait_until,
)
from tierfs.control.client import locate, request

pytestmark = pytest.mark.fuse

VICTIM = 4243
KiB = 1024
MiB = 1024 * KiB


def attacker(uid: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` as ``uid``; its JSON result, or the text of what it raised."""
    text = as_user(uid, lambda: json.dumps(fn()))
    return json.loads(text.removeprefix("ok: ")) if text.startswith("ok: ") else text


def ask(m: Mount, op: str, args: dict[str, Any] | None = None) -> Callable[[], Any]:
    socket_path = locate(m.path).socket_path
    return lambda: request(socket_path, op, args or {})


def victims(m: Mount, *dirs: str) -> None:
    """``dirs`` become the victim's 0700 directories and their files 0600."""
    for name in dirs:
        top = m.path / name
        for path in [top, *top.rglob("*")]:
            os.chown(path, VICTIM, VICTIM)
            os.chmod(path, 0o700 if path.is_dir() else 0o600)


# --- 1: one truth of modes and owners per object ------------------------------------------


def test_an_access_point_and_a_full_mount_agree_on_modes_and_owners(
    mount: MountFactory, other_uid: int
) -> None:
    full = mount({"users/alice/shared.bin": b"s" * 1000}, options="allow_other")
    point = mount(
        extra_config='[access]\nroot = "users/alice"\nuid = 4242\ngid = 4242\n',
        options="allow_other",
    )
    with traversable(full.path), traversable(point.path):
        # Made 0600 through the access point ...
        (point.path / "secret.bin").write_bytes(b"x" * 5000)
        os.chmod(point.path / "secret.bin", 0o600)
        assert run_tierfs("flush", str(point.path)).returncode == 0
        # ... reads as 0600, owned by the access point's owner, on the full mount.
        secret = full.path / "users/alice/secret.bin"

        def shows(path: Path, mode: int, uid: int) -> bool:
            try:
                st = path.stat()
            except FileNotFoundError:
                return False
            return (st.st_mode & 0o777, st.st_uid) == (mode, uid)

        assert wait_until(lambda: shows(secret, 0o600, 4242), timeout=15), secret.stat()
        result = attacker(other_uid, lambda: len(secret.read_bytes()))
        assert isinstance(result, str) and result.startswith("PermissionError"), result
        # And the reverse: made 0600 on the full mount, 0600 through the access point.
        os.chmod(full.path / "users/alice/shared.bin", 0o600)
        assert run_tierfs("flush", str(full.path)).returncode == 0
        assert wait_until(lambda: shows(point.path / "shared.bin", 0o600, 4242), timeout=15)
        result = attacker(other_uid, lambda: len((point.path / "shared.bin").read_bytes()))
        assert isinstance(result, str) and result.startswith("PermissionError"), result
        # The control socket answers as the kernel does: the shown owner may.
        where = ask(point, "where", {"paths": ["secret.bin"]})
        (mine,) = attacker(4242, where)
        assert mine["size"] == 5000, mine
        (theirs,) = attacker(other_uid, where)
        assert theirs["errno"] == errno.EACCES, theirs


# --- 4, 5, 12: names that break records, directories a user may not list -----------------


def test_a_preload_walks_only_what_the_user_may_list_and_no_name_splits_a_record(
    mount: MountFactory, other_uid: int
) -> None:
    m = mount(
        {
            "pub/open.bin": b"o" * 3000,
            "pub/priv/open.bin": b"p" * 3000,
            "pub/priv/secret.bin": b"q" * 3000,
            "vic/secret.bin": b"v" * 7000,
        },
        options="allow_other",
    )
    with traversable(m.path):
        victims(m, "vic", "pub/priv")
        os.chmod(m.path / "pub/priv/open.bin", 0o644)  # readable, in a dir nobody else lists
        secret_ino = (m.path / "vic/secret.bin").stat().st_ino
        own = m.path / "pub/att"
        own.mkdir()
        os.chown(own, other_uid, other_uid)
        # The attacker's own files: a name that reads as a record of the scan
        # naming the victim's inode, and one with a newline only.
        forged = f"i0\n{secret_ino} 0 1 z"

        def make_names() -> list[str]:
            (own / forged).write_bytes(b"f" * 100)
            (own / "line\nbreak.bin").write_bytes(b"n" * 200)
            return sorted(os.listdir(own))

        assert attacker(other_uid, make_names) == sorted([forged, "line\nbreak.bin"])
        summary = attacker(other_uid, ask(m, "preload", {"paths": ["pub"]}))
        assert isinstance(summary, dict), summary
        assert summary["state"] == "done", summary
        # Only the directory it may not list is named, by the name it can see.
        assert summary["failures"] == [
            {"path": "pub/priv", "reason": "Permission denied: pub/priv (not listed)"}
        ], summary
        assert summary["files_total"] == 3 and summary["bytes_total"] == 3300, summary
    # Nothing of the victim's was fetched; the attacker's odd names were.
    assert m.where_one("vic/secret.bin")["cached_bytes"] == 0
    assert m.where_one("pub/priv/open.bin")["cached_bytes"] == 0
    assert m.where_one("pub/priv/secret.bin")["cached_bytes"] == 0
    assert m.where_one(f"pub/att/{forged}")["cached_bytes"] == 100
    assert m.where_one("pub/att/line\nbreak.bin")["cached_bytes"] == 200
    # The log shows names escaped, one line each, and no traceback.
    log = m.log_text()
    assert "Traceback" not in log
    assert not [line for line in log.splitlines() if line.startswith(f"{secret_ino} 0 1 z")]


def test_a_name_that_is_not_utf8_gets_a_clean_error(mount: MountFactory) -> None:
    m = mount({"a.txt": b"a"})
    bad = os.fsencode(m.path) + b"/bad-\xff-name"
    for change in (
        lambda: open(bad, "wb").close(),
        lambda: os.mkdir(bad),
        lambda: os.symlink(b"a.txt", bad),
        lambda: os.rename(os.fsencode(m.path / "a.txt"), bad),
    ):
        with pytest.raises(OSError) as caught:
            change()
        assert caught.value.errno == errno.EILSEQ
    assert (m.path / "a.txt").read_bytes() == b"a"
    assert "Traceback" not in m.log_text()


# --- 2, 9, 13: descriptors, memory and the loop ------------------------------------------


def stream_list(sock: socket.socket, seconds: float) -> None:
    """Send a preload list that never ends, as fast as the daemon takes it,
    for ``seconds``."""
    chunk = json.dumps({"paths": [f"pub/never-{i:07d}.bin" for i in range(8000)]}).encode()
    stop = time.monotonic() + seconds
    with contextlib.suppress(OSError):
        sock.settimeout(seconds)
        sock.sendall(
            json.dumps({"op": "preload", "args": {"paths": [], "from_list": True}}).encode() + b"\n"
        )
        while time.monotonic() < stop:
            sock.sendall(chunk + b"\n")


def hold_connections(
    uid: int, socket_path: str, partial: int, stream_seconds: float
) -> tuple[int, Callable[[], None]]:
    """A child as ``uid`` that streams the longest preload list it can on
    one connection (for ``stream_seconds``, in a thread), and opens as many
    more connections to the daemon as it can (each with ``partial`` bytes of
    a line that never ends); it keeps them until released.  How many it
    opened, and the release."""
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(ready_r)
            os.close(release_w)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            streaming = socket.socket(socket.AF_UNIX)
            streaming.connect(socket_path)
            threading.Thread(target=stream_list, args=(streaming, stream_seconds)).start()
            held = [streaming]
            for _ in range(3000):
                sock = socket.socket(socket.AF_UNIX)
                sock.settimeout(0.5)
                try:
                    sock.connect(socket_path)
                except OSError:
                    sock.close()
                    break
                with contextlib.suppress(OSError):
                    sock.sendall(b'{"op":"' + b"x" * partial)
                held.append(sock)
            os.write(ready_w, struct.pack("I", len(held)))
            os.read(release_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(release_r)
    opened = struct.unpack("I", os.read(ready_r, 4))[0]
    os.close(ready_r)

    def release() -> None:
        os.write(release_w, b"x")
        os.close(release_w)
        os.waitpid(pid, 0)

    return opened, release


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_one_user_holding_every_connection_it_can_starves_nobody(
    mount: MountFactory, other_uid: int
) -> None:
    m = mount(
        {f"cold/{i}.bin": os.urandom(200 * KiB) for i in range(4)},
        options="allow_other",
    )
    socket_path = locate(m.path).socket_path
    pid = int(control_request(m.path, "ping")["pid"])
    rss_before = rss_kib(pid)
    opened, release = hold_connections(other_uid, socket_path, 256 * KiB, stream_seconds=4.0)
    try:
        assert opened > 64  # it tried well past its bound
        # While its list streams in: root's ping and another user's cold
        # reads answer within 1 s.
        pings = []
        reads = []
        for i in range(4):
            start = time.monotonic()
            assert control_request(m.path, "ping", timeout=5)["pid"] == pid
            pings.append(time.monotonic() - start)
            start = time.monotonic()
            assert len((m.path / f"cold/{i}.bin").read_bytes()) == 200 * KiB
            reads.append(time.monotonic() - start)
            time.sleep(0.5)
        grew = rss_kib(pid) - rss_before
        print(f"held {opened} connections: pings {pings}, cold reads {reads}, rss +{grew} KiB")
        assert max(pings) < 1.0 and max(reads) < 1.0, (pings, reads)
        control = control_request(m.path, "status")["control"]
        assert control["refused"] > 0 and control["connections"] <= 64 + 1, control
        # The daemon holds a bounded amount for that user (16 MiB of lines).
        assert rss_kib(pid) - rss_before < 48 * 1024, (rss_before, rss_kib(pid))
    finally:
        release()
    assert wait_until(lambda: isinstance(attacker(other_uid, ask(m, "ping")), dict), timeout=10)
    assert "Traceback" not in m.log_text()


def test_a_user_looping_on_expensive_requests_does_not_slow_roots(
    mount: MountFactory, other_uid: int
) -> None:
    m = mount(
        {f"tree/d{d}/f{i}.bin": b"x" for d in range(10) for i in range(100)},
        options="allow_other",
    )
    socket_path = locate(m.path).socket_path
    control_request(m.path, "where", {"paths": [""]})  # listed once

    def loop() -> int:
        done = 0
        stop = time.monotonic() + 4

        def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                request(socket_path, "where", {"paths": [""]})
                done += 1

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return done

    with traversable(m.path):
        results: list[Any] = []
        child = threading.Thread(target=lambda: results.append(attacker(other_uid, loop)))
        child.start()
        time.sleep(0.5)
        latencies = []
        while child.is_alive():
            start = time.monotonic()
            control_request(m.path, "ping", timeout=5)
            latencies.append(time.monotonic() - start)
            time.sleep(0.1)
        child.join()
    assert isinstance(results[0], int) and results[0] > 0, results
    print(f"{results[0]} where requests of the other user; root's pings: {latencies}")
    assert max(latencies) < 1.0, latencies


# --- 6, 7: quotas and the state disk -------------------------------------------------------


def test_writes_to_an_unlinked_open_file_count_against_its_quota(mount: MountFactory) -> None:
    m = mount(nvme="64MiB", extra_config='\n[[quotas]]\npath = "proj"\nbytes = "8MiB"\n')
    (m.path / "proj").mkdir()
    written = 0
    with open(m.path / "proj/scratch.bin", "wb", buffering=0) as handle:
        os.unlink(m.path / "proj/scratch.bin")
        with pytest.raises(OSError) as caught:
            for _ in range(40):
                written += handle.write(b"u" * MiB)
        assert caught.value.errno == errno.EDQUOT
    assert written <= 8 * MiB
    # Closed, the file is gone and its room is back.
    (quota,) = control_request(m.path, "quota")["quotas"]
    assert quota["bytes_used"] == 0, quota


def test_extended_attributes_are_bounded_per_file(mount: MountFactory) -> None:
    m = mount({"a.bin": b"a"})
    path = m.path / "a.bin"
    stored = 0
    with pytest.raises(OSError) as caught:
        for i in range(200):
            os.setxattr(path, f"user.k{i}", b"v" * 60_000)
            stored += 1
    assert caught.value.errno == errno.ENOSPC
    assert stored == 1
    assert os.getxattr(path, "user.k0") == b"v" * 60_000
    os.setxattr(path, "user.k0", b"w" * 60_000)  # replacing one fits
    os.removexattr(path, "user.k0")
    os.setxattr(path, "user.k1", b"v" * 60_000)  # its room is back


# --- 8, 10, 11: what a user sees and hurries -------------------------------------------------


def test_labels_and_names_reach_roots_terminal_escaped(mount: MountFactory, other_uid: int) -> None:
    m = mount({"pub/ok.bin": b"k"}, options="allow_other")
    escape = "\x1b]0;owned\x07\x1b[2J"
    with traversable(m.path):
        os.chmod(m.path / "pub", 0o777)
        refused = attacker(other_uid, ask(m, "preload", {"paths": ["pub"], "tag": escape}))
        assert isinstance(refused, str) and "printable" in refused, refused

        def odd_preload() -> Any:
            (m.path / "pub" / f"n{escape}").mkdir()
            return request(locate(m.path).socket_path, "preload", {"paths": [f"pub/n{escape}"]})

        summary = attacker(other_uid, odd_preload)
        assert isinstance(summary, dict) and summary["state"] == "done", summary
    listed = run_tierfs("preload", "--list", str(m.path))
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout
    assert "pub/n\\x1b]0;owned\\x07\\x1b[2J" in listed.stdout, listed.stdout
    status = run_tierfs("status", str(m.path))
    assert status.returncode == 0 and "\x1b" not in status.stdout


def test_a_users_flush_hurries_its_own_files_only(mount: MountFactory, other_uid: int) -> None:
    m = mount(options="allow_other", upload_delay="60s")
    (m.path / "victim").mkdir()
    os.chown(m.path / "victim", VICTIM, VICTIM)
    half = b"h" * (2 * MiB)
    (m.path / "shared.txt").write_bytes(b"root's")
    os.chmod(m.path / "shared.txt", 0o666)
    assert run_tierfs("flush", str(m.path)).returncode == 0
    with traversable(m.path):
        # What a user wrote, in a file it does not own, its flush hurries.
        def write_and_flush() -> Any:
            (m.path / "shared.txt").write_bytes(b"the user's")
            return request(locate(m.path).socket_path, "flush", {"paths": [""]})

        result = attacker(other_uid, write_and_flush)
        assert isinstance(result, dict) and result["entries"] >= 1, result
        shared = m.s3.get_object(Bucket=m.bucket, Key=f"{PREFIX}/shared.txt")["Body"].read()
        assert shared == b"the user's"
        with open(m.path / "victim/ckpt.pt", "wb") as writer:
            writer.write(half)
            writer.flush()
            os.fsync(writer.fileno())
            result = attacker(other_uid, ask(m, "flush", {"paths": [""]}))
            assert isinstance(result, dict), result
            assert result["left"]["open_elsewhere"] >= 1, result
            listed = m.s3.list_objects_v2(Bucket=m.bucket, Prefix=f"{PREFIX}/victim/")
            keys = {o["Key"] for o in listed.get("Contents", [])}
            assert f"{PREFIX}/victim/ckpt.pt" not in keys, "uploaded mid-write on another's request"
            writer.write(half)
        # Root's flush (the writer closed): all of it.
        assert run_tierfs("flush", str(m.path)).returncode == 0
    body = m.s3.get_object(Bucket=m.bucket, Key=f"{PREFIX}/victim/ckpt.pt")["Body"].read()
    assert body == half + half


def test_a_user_sees_only_what_it_may_list_and_its_own_jobs(
    mount: MountFactory, other_uid: int
) -> None:
    m = mount(
        {"pub/a.bin": b"a" * 100, "vic/secret.bin": b"s" * 5000, "vic/more.bin": b"m" * 50},
        options="allow_other",
        extra_config='\n[mover]\ninterval = "1h"\n\n[[rules]]\nmatch = "**"\ndemote_after = "1s"\n',
    )
    with traversable(m.path):
        victims(m, "vic")
        for name in ("pub/a.bin", "vic/secret.bin"):  # resident, then old: the plan moves them
            (m.path / name).read_bytes()
        root_job = control_request(m.path, "preload", {"paths": ["vic"], "tag": "root-job"})
        assert root_job["state"] == "done"
        time.sleep(1.5)
        plan = control_request(m.path, "policy_plan")
        assert {"pub/a.bin", "vic/secret.bin"} <= {move["path"] for move in plan["moves"]}
        theirs = attacker(other_uid, ask(m, "policy_plan"))
        assert {move["path"] for move in theirs["moves"]} == {"pub/a.bin"}, theirs
        assert theirs["moves_hidden"] >= 1
        (tree,) = attacker(other_uid, ask(m, "where", {"paths": [""]}))
        assert (tree["files"], tree["size"], tree["dirs_not_listed"]) == (1, 100, 1), tree
        assert attacker(other_uid, ask(m, "preload_list")) == []
        status = attacker(other_uid, ask(m, "status"))
        assert status["preloads"] == [], status
        assert [job["tag"] for job in control_request(m.path, "preload_list")] == ["root-job"]
