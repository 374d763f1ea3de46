"""The control server through a real Unix socket, as an ordinary user
(no mount): every bound between users holds while the request arrives, a
malformed or hostile request gets one clean error line, and nothing a user
sends leaves a traceback in the log.

The server is the daemon's (``ControlServer`` over a TierFS on the moto
bucket, its preload and prefetch workers started); only who is on the other
end is fixed (``AsUser``: the tests run as root, and root is not bounded),
since a socket's peer cannot be forged.  The same attempts as real users
through a real mount: ``tests/fuse/test_between_users.py``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.conftest import CoreMount, CountingStore, _start, make_config, put
from tierfs.control.limits import ControlLimits
from tierfs.control.protocol import MAX_LINE, encode
from tierfs.control.server import ControlServer, Peer
from tierfs.core.names.access import Caller
from tierfs.meta import ROOT_INO
from tierfs.workers.pathlists import SpoolBudget
from tierfs.workers.wiring import prefetcher_for, preloader_for

USER = 1000


class AsUser(ControlServer):
    """The daemon's server, whose peers are all ``uid`` (root: 0)."""

    uid = USER

    def _peer_of(self, stream: trio.SocketStream) -> Peer:
        return Peer(4242, Caller(self.uid, frozenset({self.uid})))


async def serve(
    nursery: trio.Nursery,
    make_fs: Any,
    tmp_path: Path,
    *,
    limits: ControlLimits | None = None,
    spools: SpoolBudget | None = None,
    uid: int = USER,
) -> tuple[AsUser, str]:
    mount = await make_fs()
    server = AsUser(
        mount.fs, tmp_path / "ctl" / "control.sock", mountpoint=Path("/mnt/t"), limits=limits
    )
    server.uid = uid
    server.preloader = preloader_for(mount.fs, spools=spools)
    server.prefetcher = prefetcher_for(mount.fs, spools=server.preloader.spools)
    await nursery.start(server.preloader.run)
    await nursery.start(server.prefetcher.run)
    sock = server.bind()
    await nursery.start(server.serve, sock)
    return server, str(server.socket_path)


def exchange(
    path: str, data: bytes, *, timeout: float = 20.0, shut: bool = True
) -> list[dict[str, Any]]:
    """Send ``data``, then read every line until the server closes (in a thread)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            sock.sendall(data)
            if shut:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return [json.loads(line) for line in received.splitlines()]


async def ask(path: str, data: bytes, **kw: Any) -> list[dict[str, Any]]:
    return await trio.to_thread.run_sync(lambda: exchange(path, data, **kw))


def idle_connections(path: str, count: int, partial: bytes) -> list[socket.socket]:
    """``count`` connections, each holding ``partial`` (a line never ended)."""
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        sock.sendall(partial)
        held.append(sock)
    return held


def request_line(op: str, args: dict[str, Any] | None = None) -> bytes:
    return encode({"op": op, "args": args or {}})


async def test_a_request_must_come_in_time_and_one_line_may_follow_another(
    make_fs: Any, tmp_path: Path, nursery: trio.Nursery
) -> None:
    _server, path = await serve(
        nursery, make_fs, tmp_path, limits=ControlLimits(request_deadline=0.3)
    )
    start = time.monotonic()
    (reply,) = await ask(path, b"", shut=False)  # says nothing, keeps the line open
    assert time.monotonic() - start < 5
    assert reply["ok"] is False and "no request came within 0.3 s" in reply["error"]
    # A valid line with more after it in the same write: the rest does not
    # count against the line (a long list chunk follows a short request).
    long_list = {"paths": ["x" * 100] * ((MAX_LINE - 1000) // 104)}
    data = request_line("preload", {"paths": [], "from_list": True, "detach": True})
    data += encode(long_list) * 2 + encode({"end": True})
    assert len(data) > MAX_LINE
    replies = await ask(path, data)
    assert replies[-1]["ok"] is True, replies[-1]
    # One line longer than MAX_LINE is refused, whatever it holds.
    (reply,) = await ask(path, b"x" * (MAX_LINE + 70_000))
    assert reply["errno"] == errno.EINVAL and "longer than" in reply["error"]


async def test_connections_past_a_users_bound_are_refused_and_root_still_gets_in(
    make_fs: Any, tmp_path: Path, nursery: trio.Nursery
) -> None:
    server, path = await serve(
        nursery,
        make_fs,
        tmp_path,
        limits=ControlLimits(per_user=4, total=8, root=2, request_deadline=30),
    )
    held = idle_connections(path, 4, b'{"op": "pi')
    try:
        await trio.sleep(0.2)
        (reply,) = await ask(path, request_line("ping"))
        assert reply["errno"] == errno.EAGAIN and "uid 1000 has 4 connections" in reply["error"]
        server.uid = 0  # root has room of its own
        (reply,) = await ask(path, request_line("ping"))
        assert reply["ok"] is True
    finally:
        for sock in held:
            sock.close()
    server.uid = USER
    await trio.sleep(0.2)
    (reply,) = await ask(path, request_line("ping"))
    assert reply["ok"] is True


async def test_one_users_unfinished_lines_are_bounded_together(
    make_fs: Any, tmp_path: Path, nursery: trio.Nursery
) -> None:
    _server, path = await serve(
        nursery,
        make_fs,
        tmp_path,
        limits=ControlLimits(buffered_per_user=300_000, request_deadline=30),
    )
    held = idle_connections(path, 2, b"x" * 140_000)
    try:
        await trio.sleep(0.3)
        (reply,) = await ask(path, b"y" * 100_000, shut=False)
        assert reply["errno"] == errno.EINVAL and "unfinished lines" in reply["error"]
    finally:
        for sock in held:
            sock.close()


async def test_a_list_past_the_users_spool_bound_is_refused_while_it_arrives(
    make_fs: Any, tmp_path: Path, nursery: trio.Nursery
) -> None:
    spools = SpoolBudget(per_user=64 * 1024, reserve_bytes=0)
    server, path = await serve(nursery, make_fs, tmp_path, spools=spools)
    chunk = encode({"paths": [f"d/{i:06d}" for i in range(1000)]})
    data = request_line("preload", {"paths": [], "from_list": True}) + chunk * 200
    replies = await ask(path, data)
    assert replies[-1]["ok"] is False and replies[-1]["errno"] == errno.EDQUOT, replies[-1]
    assert "uid 1000's lists and orders would hold more than 65536 bytes" in replies[-1]["error"]
    assert spools.used == {}  # the spool was dropped, its bytes given back
    assert server.preloader is not None and not server.preloader.jobs
    # The same for an order.
    data = request_line("prefetch") + chunk * 200
    replies = await ask(path, data)
    assert replies[-1]["errno"] == errno.EDQUOT, replies[-1]
    assert spools.used == {}


async def test_a_user_sees_its_own_jobs_and_root_sees_all(
    make_fs: Any, s3_store: Any, tmp_path: Path, nursery: trio.Nursery
) -> None:
    put(s3_store, "data/a.bin", b"a" * 1000)
    server, path = await serve(nursery, make_fs, tmp_path)
    tagged = {"paths": ["data"], "tag": "mine"}
    (reply,) = [r for r in await ask(path, request_line("preload", tagged)) if "ok" in r]
    assert reply["ok"], reply
    server.uid = 2000
    (reply,) = await ask(path, request_line("preload_list"))
    assert reply["result"] == []
    (reply,) = await ask(path, request_line("status"))
    assert reply["result"]["preloads"] == []
    server.uid = 0
    (reply,) = await ask(path, request_line("preload_list"))
    assert [job["tag"] for job in reply["result"]] == ["mine"]
    for bad in ("a\nb", "\x1b[2J", "t" * 200):
        server.uid = USER
        replies = await ask(path, request_line("preload", {"paths": ["data"], "tag": bad}))
        assert replies[-1]["errno"] == errno.EINVAL and "printable" in replies[-1]["error"]


control_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ops = st.sampled_from(
    [
        "ping",
        "status",
        "where",
        "flush",
        "preload",
        "prefetch",
        "preload_list",
        "preload_cancel",
        "prefetch_clear",
        "policy_show",
        "policy_plan",
        "quota",
        "evict",
        "nope",
        "",
    ]
) | st.text(max_size=10)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    garbage=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda op, args, more: request_line(op, args) + more,
            ops,
            st.dictionaries(
                st.sampled_from(
                    [
                        "paths",
                        "tag",
                        "from_list",
                        "detach",
                        "tier",
                        "job",
                        "rank",
                        "window_files",
                        "bandwidth",
                        "ready_fraction",
                        "walk",
                        "id",
                    ]
                ),
                control_values,
                max_size=5,
            ),
            st.binary(max_size=200),
        ),
    )
)
def test_any_bytes_get_one_clean_answer_and_no_traceback(
    garbage: bytes, server_thread: tuple[str, list[logging.LogRecord]]
) -> None:
    path, records = server_thread
    replies = exchange(path, garbage)
    assert replies, garbage
    final = replies[-1]
    assert isinstance(final.get("ok"), bool), final
    if not final["ok"]:
        assert isinstance(final["error"], str) and isinstance(final["errno"], int)
        assert "internal error" not in final["error"], (garbage, final)
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], garbage


@pytest.fixture
def server_thread(s3_store: Any, tmp_path: Path) -> Iterator[tuple[str, list[logging.LogRecord]]]:
    """One server for every example of a (synchronous) hypothesis test, in
    its own trio loop in a thread; the records the daemon's loggers wrote."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level=logging.WARNING)
    logging.getLogger("tierfs").addHandler(handler)
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            box["stop"] = nursery.cancel_scope
            box["token"] = trio.lowlevel.current_trio_token()
            mounts: list[CoreMount] = []

            async def make_fs() -> CoreMount:
                config = make_config(tmp_path, s3_store.url)
                return await _start(config, CountingStore(s3_store), nursery, mounts)

            _server, box["path"] = await serve(
                nursery, make_fs, tmp_path, limits=ControlLimits(request_deadline=1.0)
            )
            ready.set()
            try:
                await trio.sleep_forever()
            finally:
                for mount in mounts:
                    with trio.CancelScope(shield=True):
                        await mount.aclose()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "the control server did not start"
        yield box["path"], records
    finally:
        trio.from_thread.run_sync(box["stop"].cancel, trio_token=box["token"])
        thread.join(30)
        logging.getLogger("tierfs").removeHandler(handler)


async def test_status_names_to_a_user_only_the_files_it_may_list(
    make_fs: Any, tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts of ``status`` that name files (refused uploads, the
    mover's current file) show a user only what it may list; the last
    errors, which name keys, are root's to read."""
    server, path = await serve(nursery, make_fs, tmp_path)
    fs = server.fs
    for name, mode, owner in ((b"vic", 0o700, 4243), (b"pub", 0o755, USER)):
        attrs = await fs.mkdir(ROOT_INO, name, mode, owner, owner)
        opened, _ = await fs.create(attrs.ino, b"f.bin", 0o600, os.O_WRONLY, owner, owner)
        await fs.release(opened.fh)
    real_status = fs.status

    def status(**kw: Any) -> dict[str, Any]:
        report = real_status(**kw)
        report["failed"] = [
            {"path": "vic/f.bin", "reason": "r"},
            {"path": "pub/f.bin", "reason": "r"},
        ]
        report["mover"] = {"state": "moving"}  # the mover's section (no mover runs here)
        report["mover"]["current"] = {
            "path": "vic/f.bin",
            "src": "nvme",
            "dst": "hdd",
            "bytes": 1,
            "done": 0,
        }
        report["last_sync_error"] = "upload of 'vic/f.bin': refused"
        return report

    monkeypatch.setattr(fs, "status", status)
    (reply,) = await ask(path, request_line("status"))
    mine = reply["result"]
    assert [item["path"] for item in mine["failed"]] == ["pub/f.bin"]
    assert mine["mover"]["current"]["path"] is None
    shown = json.dumps(mine)
    assert "vic/" not in shown, shown[shown.find("vic") - 200 : shown.find("vic") + 100]
    server.uid = 0
    (reply,) = await ask(path, request_line("status"))
    assert [item["path"] for item in reply["result"]["failed"]] == ["vic/f.bin", "pub/f.bin"]
    assert reply["result"]["last_sync_error"] == "upload of 'vic/f.bin': refused"
