"""Real mount: the cache keeps the job going while the bucket is unreachable.

The daemon talks to moto through the ``fault_proxy`` fixture.  The test
warms the cache, lets the listings and revalidations fall due, takes the
endpoint away (refusing connections, or a black hole that accepts them and
never answers), and then times every call a job makes:

- phase 1, right after the outage began (the circuit breaker may still be
  closed): cached files, ``stat`` and ``ls`` answer within a few seconds;
- the breaker opens (``tierfs status`` shows the endpoint unreachable, since
  when, the last error and the bytes waiting);
- phase 2: cached reads, create+write+fsync, mkdir, rename (of a file and of
  a directory), unlink, rmdir, chmod, utime, append, ``stat`` and ``ls`` each take well
  under a second; an uncached read and a directory never listed fail with
  EIO at once;
- the endpoint comes back: ``tierfs flush`` succeeds and every change made
  during the outage is in the bucket (read with boto3 straight from moto).

More: the first seconds of a black hole (an uncached read and an ``ls``
of a never-listed directory pay at most one read timeout, the breaker
opens after two); ``tierfs flush`` with the breaker open fails within
seconds naming the outage, and the first flush once back succeeds;
SIGTERM while an upload is stuck in a black hole ends the daemon at once,
and the upload reaches the bucket after a remount.

The bounds catch a hang (the issue measured 5-10 s per call when refused,
minutes in a black hole); they are not benchmarks.  Each duration is printed
(run with ``-s`` to see them).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults import FaultProxy
from tests.fuse.conftest import Mount, MountFactory, is_tierfsd, run_tierfs, wait_until

pytestmark = pytest.mark.fuse

KiB = 1024
#: A call that only needs what the node has, once the breaker is open.
LOCAL_BOUND = 1.0
#: Any call in the first seconds of an outage (revalidation and re-listing
#: bounds of 1 s each, plus a lookup of each parent).
EARLY_BOUND = 4.0
#: A call that needs the bucket must fail within this.
REMOTE_BOUND = 5.0
#: How long the breaker may take to open / close (black hole: a few read timeouts).
BREAKER_WAIT = 30.0


def payload(name: str, size: int) -> bytes:
    seed = name.encode() * (size // max(1, len(name)) + 1)
    return bytes((b * 7 + i) % 251 for i, b in enumerate(seed[:size]))


CACHED = {f"cached/f{i}.bin": payload(f"f{i}", 300 * KiB) for i in range(5)}
LISTED = {
    "listed/r.txt": b"rename me\n",
    "listed/u.txt": b"unlink me\n",
    "listed/m.txt": b"chmod me\n",
    "listed/ap.txt": b"append to me\n",
    "listed/cold.bin": payload("cold", 200 * KiB),
}
NEVER_LISTED = {"never/x.bin": b"never listed\n"}


def timed(durations: dict[str, float], label: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    result = fn()
    durations[label] = time.monotonic() - started
    return result


def expect_eio(durations: dict[str, float], label: str, fn: Callable[[], Any]) -> None:
    started = time.monotonic()
    with pytest.raises(OSError) as info:
        fn()
    durations[label] = time.monotonic() - started
    assert info.value.errno == errno.EIO, f"{label}: {info.value!r}"


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def endpoint_state(m: Mount) -> dict[str, Any]:
    state: dict[str, Any] = m.status()["endpoint"]
    return state


def check_cached_reads(m: Mount, durations: dict[str, float], phase: str) -> None:
    for name, body in CACHED.items():
        got = timed(durations, f"{phase} read cached {name}", lambda n=name: read(m.path / n))
        assert got == body, f"{name}: wrong bytes from the cache"


def check_known_names(m: Mount, durations: dict[str, float], phase: str) -> None:
    st = timed(durations, f"{phase} stat listed/m.txt", lambda: os.stat(m.path / "listed/m.txt"))
    assert st.st_size == len(LISTED["listed/m.txt"])
    names = timed(durations, f"{phase} ls listed", lambda: sorted(os.listdir(m.path / "listed")))
    assert set(names) >= {"r.txt", "u.txt", "m.txt", "ap.txt", "cold.bin"}


def make_changes(m: Mount, durations: dict[str, float]) -> dict[str, bytes]:
    """Every kind of local change; returns what the bucket must hold after the flush."""
    listed = m.path / "listed"
    new_body = payload("new", 96 * KiB)

    def create_write_fsync() -> None:
        fd = os.open(listed / "new.bin", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        try:
            os.write(fd, new_body)
            os.fsync(fd)
        finally:
            os.close(fd)

    timed(durations, "create+write+fsync+close", create_write_fsync)
    timed(durations, "mkdir", lambda: os.mkdir(listed / "newdir"))
    timed(durations, "mkdir for a dir rename", lambda: os.mkdir(listed / "d1"))
    (listed / "d1" / "inner.txt").write_bytes(b"inner\n")
    timed(durations, "rename file", lambda: os.rename(listed / "r.txt", listed / "r2.txt"))
    timed(durations, "rename dir", lambda: os.rename(listed / "d1", listed / "d2"))
    timed(durations, "unlink", lambda: os.unlink(listed / "u.txt"))
    os.mkdir(listed / "gone")
    timed(durations, "rmdir", lambda: os.rmdir(listed / "gone"))
    timed(durations, "utime", lambda: os.utime(listed / "r2.txt", (1e9, 1e9)))
    timed(durations, "chmod", lambda: os.chmod(listed / "m.txt", 0o600))

    def append() -> None:
        with open(listed / "ap.txt", "ab") as f:
            f.write(b"appended\n")

    timed(durations, "append", append)
    assert read(listed / "ap.txt") == b"append to me\nappended\n"
    assert sorted(os.listdir(listed / "d2")) == ["inner.txt"]
    return {
        "listed/new.bin": new_body,
        "listed/newdir/": b"",
        "listed/r2.txt": LISTED["listed/r.txt"],
        "listed/d2/inner.txt": b"inner\n",
        "listed/ap.txt": b"append to me\nappended\n",
        "listed/m.txt": LISTED["listed/m.txt"],
    }


def bucket_body(m: Mount, name: str) -> bytes | None:
    try:
        obj = m.s3.get_object(Bucket=m.bucket, Key=m.key(name))
    except m.s3.exceptions.NoSuchKey:
        return None
    body: bytes = obj["Body"].read()
    return body


@pytest.mark.parametrize("outage", ["refuse", "black_hole"])
def test_cache_serves_and_changes_land_locally_while_the_bucket_is_away(
    mount: MountFactory, fault_proxy: FaultProxy, outage: str
) -> None:
    m = mount(
        {**CACHED, **LISTED, **NEVER_LISTED},
        endpoint_url=fault_proxy.endpoint,
        list_ttl="2s",
        revalidate_ttl="1s",
        upload_delay="1s",
    )
    for name in CACHED:
        assert read(m.path / name) == CACHED[name]
    assert read(m.path / "listed/ap.txt") == LISTED["listed/ap.txt"]  # cached: append is local
    assert len(os.listdir(m.path / "listed")) == len(LISTED)
    assert endpoint_state(m)["state"] == "reachable"
    time.sleep(2.5)  # listings and revalidations are due: the outage hits them

    getattr(fault_proxy, outage)()
    durations: dict[str, float] = {}
    try:
        # Phase 1: the breaker may still be closed.
        check_cached_reads(m, durations, "early")
        check_known_names(m, durations, "early")
        early = {k: v for k, v in durations.items() if k.startswith("early")}
        assert max(early.values()) < EARLY_BOUND, early

        assert wait_until(
            lambda: endpoint_state(m)["state"] == "unreachable", BREAKER_WAIT, interval=0.5
        ), f"the endpoint never showed as unreachable: {endpoint_state(m)}\n{m.log_tail()}"
        state = endpoint_state(m)
        assert state["since"] and time.time() - 120 < state["since"] <= time.time()
        assert state["last_error"], state
        human = run_tierfs("status", str(m.path))
        assert human.returncode == 0 and "endpoint: UNREACHABLE since" in human.stdout, human

        # Phase 2: the breaker is open.
        time.sleep(2.5)  # listings and revalidations fall due again
        check_cached_reads(m, durations, "open")
        check_known_names(m, durations, "open")
        expected = make_changes(m, durations)
        local = {k: v for k, v in durations.items() if not k.startswith("early")}
        assert max(local.values()) < LOCAL_BOUND, local
        expect_eio(durations, "uncached read", lambda: read(m.path / "listed/cold.bin"))
        expect_eio(durations, "ls never listed", lambda: os.listdir(m.path / "never"))
        assert durations["uncached read"] < REMOTE_BOUND
        assert durations["ls never listed"] < REMOTE_BOUND
        assert endpoint_state(m)["bytes_waiting"] >= len(expected["listed/new.bin"])
        assert m.where_one("listed/new.bin")["state"] in ("dirty", "uploading")
    finally:
        print(f"\n{outage}: durations during the outage (s)")
        for label, seconds in durations.items():
            print(f"  {label:<40} {seconds:7.3f}")
        fault_proxy.restore()

    assert wait_until(
        lambda: endpoint_state(m)["state"] == "reachable", BREAKER_WAIT, interval=0.5
    ), f"the endpoint never showed as reachable again: {endpoint_state(m)}\n{m.log_tail()}"
    done = run_tierfs("flush", str(m.path), timeout=120)
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr}\n{m.log_tail()}"
    for name, body in expected.items():
        assert bucket_body(m, name) == body, f"{name} did not reach the bucket"
    for gone in ("listed/r.txt", "listed/u.txt", "listed/d1/inner.txt", "listed/gone/"):
        assert bucket_body(m, gone) is None, f"{gone} is still in the bucket"
    head = m.s3.head_object(Bucket=m.bucket, Key=m.key("listed/m.txt"))
    assert int(head["Metadata"]["mode"]) == stat.S_IFREG | 0o600
    head = m.s3.head_object(Bucket=m.bucket, Key=m.key("listed/r2.txt"))
    assert float(head["Metadata"]["mtime"]) == 1e9
    assert endpoint_state(m)["bytes_waiting"] == 0
    # The uncached file is readable again.
    assert read(m.path / "listed/cold.bin") == LISTED["listed/cold.bin"]


@pytest.mark.slow
def test_many_outages_lose_nothing(mount: MountFactory, fault_proxy: FaultProxy) -> None:
    """Rounds of refuse / black hole / back, with writes in each outage and
    between them: after the last round every file is in the bucket, with
    the bytes written last, and every round's cached reads were served."""
    rounds = 10
    m = mount(
        CACHED,
        endpoint_url=fault_proxy.endpoint,
        list_ttl="1s",
        revalidate_ttl="1s",
        upload_delay="0s",
    )
    os.makedirs(m.path / "out", exist_ok=True)
    for name in CACHED:
        assert read(m.path / name) == CACHED[name]
    written: dict[str, bytes] = {}
    for i in range(rounds):
        getattr(fault_proxy, "refuse" if i % 2 == 0 else "black_hole")()
        time.sleep(1.2)
        for name in CACHED:
            started = time.monotonic()
            assert read(m.path / name) == CACHED[name]
            assert time.monotonic() - started < EARLY_BOUND
        for j in range(5):
            name = f"out/r{i}-{j}.bin"
            body = payload(name, 40 * KiB + i * 1000 + j)
            started = time.monotonic()
            (m.path / name).write_bytes(body)
            assert time.monotonic() - started < EARLY_BOUND
            written[name] = body
        if i:
            prev = f"out/r{i - 1}-0.bin"
            os.rename(m.path / prev, m.path / f"{prev}.moved")
            written[f"{prev}.moved"] = written.pop(prev)
        fault_proxy.restore()
        assert wait_until(
            lambda: endpoint_state(m)["state"] == "reachable", BREAKER_WAIT, interval=0.5
        ), m.log_tail()
        if i % 3 == 2:
            done = run_tierfs("flush", str(m.path), timeout=120)
            assert done.returncode == 0, f"round {i}: {done.stderr}\n{m.log_tail()}"
    done = run_tierfs("flush", str(m.path), timeout=120)
    assert done.returncode == 0, f"{done.stderr}\n{m.log_tail()}"
    for name, body in written.items():
        assert bucket_body(m, name) == body, f"{name} did not reach the bucket"
    assert endpoint_state(m)["outages"] >= rounds // 2  # every refusal opened the breaker


#: SIGTERM must end the daemon within this many seconds, even while an
#: upload waits in a black hole (its read timeout is 30 s).
SIGTERM_EXIT = 5.0


def test_sigterm_exits_at_once_while_an_upload_is_stuck_in_a_black_hole(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    """An upload in flight into a black hole holds its thread for the upload
    read timeout; SIGTERM does not wait for it: the daemon exits within
    SIGTERM_EXIT, the journal keeps the upload, and once the endpoint is
    back a remount and a flush put the file in the bucket."""
    m = mount({}, endpoint_url=fault_proxy.endpoint, upload_delay="0s")
    pid = int(m.status()["pid"])
    body = payload("stuck", 256 * KiB)
    assert os.listdir(m.path) == []  # listed: a create needs no bucket now
    fault_proxy.black_hole()
    swallowed_before = fault_proxy.swallowed
    try:
        (m.path / "stuck.bin").write_bytes(body)
        # The upload is really in flight: the file is uploading and the
        # proxy holds a connection it never answers.
        assert wait_until(
            lambda: (
                m.where_one("stuck.bin")["state"] == "uploading"
                and fault_proxy.swallowed > swallowed_before
            ),
            timeout=10,
            interval=0.1,
        ), f"no upload in flight: {m.where_one('stuck.bin')}\n{m.log_tail()}"
        time.sleep(0.5)
        assert m.where_one("stuck.bin")["state"] == "uploading"

        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        exited = wait_until(lambda: not is_tierfsd(pid), timeout=SIGTERM_EXIT, interval=0.05)
        took = time.monotonic() - started
        print(f"\nSIGTERM exit during a black-holed upload after {took:.2f} s")
        assert exited, f"the daemon did not exit within {SIGTERM_EXIT} s\n{m.log_tail()}"
        assert wait_until(lambda: not os.path.ismount(m.path), timeout=5), "mount left behind"
        assert "still on the network" in m.log_text(), m.log_tail()
    finally:
        fault_proxy.restore()

    assert bucket_body(m, "stuck.bin") is None  # it never got through
    m.mount()
    assert re.search(r"replaying \d+ journal entries", m.log_text()), "the journal was lost"
    done = run_tierfs("flush", str(m.path), timeout=120)
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr}\n{m.log_tail()}"
    assert bucket_body(m, "stuck.bin") == body
    assert read(m.path / "stuck.bin") == body


#: ``tierfs flush`` with the breaker open must fail within this (seconds).
FLUSH_FAILS_WITHIN = 6.0


def test_flush_while_the_breaker_is_open_fails_fast_then_succeeds_once_back(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    """With the endpoint refusing and the breaker open, ``tierfs flush`` fails
    within seconds, non-zero, naming the outage and what waits; the file
    stays queued, and the first flush once the endpoint is back succeeds."""
    m = mount({}, endpoint_url=fault_proxy.endpoint, upload_delay="0s")
    body = payload("queued", 64 * KiB)
    assert os.listdir(m.path) == []
    fault_proxy.refuse()
    try:
        (m.path / "queued.bin").write_bytes(body)
        assert wait_until(
            lambda: endpoint_state(m)["state"] == "unreachable", BREAKER_WAIT, interval=0.2
        ), f"the breaker never opened: {endpoint_state(m)}\n{m.log_tail()}"
        started = time.monotonic()
        done = run_tierfs("flush", str(m.path), timeout=60)
        took = time.monotonic() - started
        print(f"\nflush with the breaker open failed after {took:.2f} s: {done.stderr.strip()}")
        assert done.returncode != 0, done
        assert took < FLUSH_FAILS_WITHIN, f"flush took {took:.1f} s to fail"
        assert "unreachable since" in done.stderr, done.stderr
        assert "1 file(s) waiting for upload" in done.stderr, done.stderr
        assert m.where_one("queued.bin")["state"] in ("dirty", "uploading")
    finally:
        fault_proxy.restore()

    assert wait_until(
        lambda: endpoint_state(m)["state"] == "reachable", BREAKER_WAIT, interval=0.2
    ), f"the endpoint never showed as reachable again: {endpoint_state(m)}\n{m.log_tail()}"
    done = run_tierfs("flush", str(m.path), timeout=60)
    assert done.returncode == 0, f"the first flush after the outage failed: {done.stderr}"
    assert bucket_body(m, "queued.bin") == body


#: In the first seconds of a black hole (breaker still closed), a call that
#: needs the bucket fails within this: one read timeout (3 s) and a bit.
FIRST_SECONDS_BOUND = 4.5
#: The breaker opens within this after a black hole begins (two timeouts).
BLACK_HOLE_OPENS_WITHIN = 8.0


def test_first_seconds_of_a_black_hole(mount: MountFactory, fault_proxy: FaultProxy) -> None:
    """Right after the endpoint becomes a black hole, before the breaker
    opens: an uncached read (the kernel sends it twice) and an ``ls`` of a
    directory never listed each fail with EIO after at most one read
    timeout, and the breaker opens within BLACK_HOLE_OPENS_WITHIN."""
    m = mount({**LISTED, **NEVER_LISTED}, endpoint_url=fault_proxy.endpoint)
    assert len(os.listdir(m.path / "listed")) == len(LISTED)
    assert endpoint_state(m)["state"] == "reachable"
    durations: dict[str, float] = {}
    fault_proxy.black_hole()
    began = time.monotonic()
    try:
        expect_eio(durations, "uncached read", lambda: read(m.path / "listed/cold.bin"))
        expect_eio(durations, "ls never listed", lambda: os.listdir(m.path / "never"))
        opened = wait_until(
            lambda: endpoint_state(m)["state"] == "unreachable", BREAKER_WAIT, interval=0.1
        )
        durations["breaker open after"] = time.monotonic() - began
        assert opened, f"the breaker never opened: {endpoint_state(m)}\n{m.log_tail()}"
    finally:
        print("\nfirst seconds of a black hole (s)")
        for label, seconds in durations.items():
            print(f"  {label:<40} {seconds:7.3f}")
        fault_proxy.restore()
    assert durations["uncached read"] < FIRST_SECONDS_BOUND, durations
    assert durations["ls never listed"] < FIRST_SECONDS_BOUND, durations
    assert durations["breaker open after"] < BLACK_HOLE_OPENS_WITHIN, durations
    assert wait_until(lambda: endpoint_state(m)["state"] == "reachable", BREAKER_WAIT, 0.2)
    assert read(m.path / "listed/cold.bin") == LISTED["listed/cold.bin"]
    assert os.listdir(m.path / "never") == ["x.bin"]
