"""Real mount: what another writer did to the bucket is seen after ``list_ttl``.

Node A lists a directory; another writer (a plain boto3
put, or a second tierfs mount of the same bucket) then adds a file, adds a
directory, overwrites a file with a larger one, or deletes one; after
``list_ttl`` the first ``stat``, ``open`` or ``ls`` on node A must give the
bucket's state, with no retry in the test:

* a name the expired listing lacks (a new file, a new directory) waits for
  the re-listing of its directory and is found, with settled attributes;
* a name the expired listing holds is answered at once from it (the
  contract's stale-while-revalidate, checked with every LIST held at a
  proxy): the open revalidates it (new bytes; ENOENT for a deleted object),
  and ``stat`` and ``ls`` show the bucket's state once the re-listing that
  the first access started is done.

Every trial is a directory of its own, listed once by node A, so all the
trials of a case run in one pass: 10 of each (``--run-slow``: 50).
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, run_tierfs, wait_until

pytestmark = pytest.mark.fuse

TTL = 1.0
KEEP = b"keep"
OLD = b"old"
NEW = b"new bytes, longer than the old"


def trials(request: pytest.FixtureRequest) -> int:
    return 50 if request.config.getoption("--run-slow") else 10


class BotoWriter:
    """Another tool: plain boto3 puts and deletes."""

    def __init__(self, m: Mount) -> None:
        self.m = m

    def put(self, name: str, body: bytes) -> None:
        self.m.put(name, body)

    def delete(self, name: str) -> None:
        self.m.delete(name)

    def done(self) -> None:
        pass


class MountWriter:
    """Another node: a second tierfs mount of the same bucket, flushed."""

    def __init__(self, other: Mount) -> None:
        self.other = other

    def put(self, name: str, body: bytes) -> None:
        path = self.other.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)

    def delete(self, name: str) -> None:
        (self.other.path / name).unlink()

    def done(self) -> None:
        flushed = run_tierfs("flush", str(self.other.path), timeout=120)
        assert flushed.returncode == 0, flushed.stderr


def _ls(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ls", "-ln", str(path)], capture_output=True, text=True, timeout=60)


# What the first access of each case must see: (check, reason) per op.
Check = Callable[[Path], None]


def _stat_size(size: int) -> Check:
    def check(t: Path) -> None:
        assert os.stat(t).st_size == size

    return check


def _enoent(op: Callable[[Path], object]) -> Check:
    def check(t: Path) -> None:
        with pytest.raises(OSError) as caught:
            op(t)
        assert caught.value.errno == errno.ENOENT

    return check


def _ls_shows(size: int) -> Check:
    def check(t: Path) -> None:
        done = _ls(t)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[4] == str(size), done.stdout

    return check


def _ls_missing(t: Path) -> None:
    done = _ls(t)
    assert done.returncode != 0 and "No such file or directory" in done.stderr, done


CASES: dict[str, dict[str, Check]] = {
    # t is the trial's new.bin
    "new_file": {
        "stat": _stat_size(len(NEW)),
        "open": lambda t: (
            None if t.read_bytes() == NEW else pytest.fail(f"{t}: {t.read_bytes()!r}")
        ),
        "ls": _ls_shows(len(NEW)),
    },
    # t is the trial's new.bin, looked up (ENOENT) by node A before it was put:
    # the kernel's negative entry lives no longer than list_ttl
    "new_file_seen_missing": {
        "stat": _stat_size(len(NEW)),
        "open": lambda t: (
            None if t.read_bytes() == NEW else pytest.fail(f"{t}: {t.read_bytes()!r}")
        ),
        "ls": _ls_shows(len(NEW)),
    },
    # t is the trial's new directory (holding f.bin)
    "new_dir": {
        "stat": lambda t: None if stat.S_ISDIR(os.stat(t).st_mode) else pytest.fail(str(t)),
        "open": lambda t: (
            None if (t / "f.bin").read_bytes() == NEW else pytest.fail(str(t / "f.bin"))
        ),
        "ls": lambda t: (
            None if _ls(t).stdout.split()[-1:] == ["f.bin"] else pytest.fail(_ls(t).stdout)
        ),
    },
}


def _seeds(count: int) -> dict[str, bytes]:
    objects: dict[str, bytes] = {}
    for case, ops in CASES.items():
        for op in ops:
            for i in range(count):
                objects[f"vis/{case}-{op}/t{i:02d}/keep.bin"] = KEEP
    for case in ("overwritten", "deleted"):
        for i in range(count):
            objects[f"vis/{case}/t{i:02d}/keep.bin"] = KEEP
            objects[f"vis/{case}/t{i:02d}/target.bin"] = OLD
    return objects


def _change(writer: BotoWriter | MountWriter, case: str, base: str) -> str:
    """Make the case's change under ``base``; the path node A then accesses."""
    if case in ("new_file", "new_file_seen_missing"):
        writer.put(f"{base}/new.bin", NEW)
        return f"{base}/new.bin"
    if case == "new_dir":
        writer.put(f"{base}/newdir/f.bin", NEW)
        return f"{base}/newdir"
    if case == "overwritten":
        writer.put(f"{base}/target.bin", NEW)
        return f"{base}/target.bin"
    writer.delete(f"{base}/target.bin")
    return f"{base}/target.bin"


@pytest.fixture(params=["boto3", "mount"])
def writer_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def scenario(
    fault_proxy: Any, mount: MountFactory, writer_kind: str, request: pytest.FixtureRequest
) -> tuple[Mount, BotoWriter | MountWriter, int]:
    """Node A (through ``fault_proxy``, so that a test can hold its LISTs)
    and the other writer; the seeds of every trial are in the bucket.  The
    proxy is made first, so that it outlives the mounts at teardown."""
    count = trials(request)
    reader = mount(
        _seeds(count),
        list_ttl=f"{TTL}s",
        revalidate_ttl=f"{TTL}s",
        endpoint_url=f"http://127.0.0.1:{fault_proxy.port}",
    )
    writer: BotoWriter | MountWriter
    if writer_kind == "boto3":
        writer = BotoWriter(reader)
    else:
        writer = MountWriter(mount(None, list_ttl=f"{TTL}s", revalidate_ttl=f"{TTL}s"))
    return reader, writer, count


def _run(checks: dict[tuple[str, str, int], tuple[Check, Path]]) -> dict[tuple[str, str], int]:
    """Each check once, in order: the failures per (case, op), and what they were."""
    failures: dict[tuple[str, str], list[str]] = {}
    for (case, op, _i), (check, path) in checks.items():
        try:
            check(path)
        except (AssertionError, OSError, pytest.fail.Exception) as exc:
            failures.setdefault((case, op), []).append(f"{path}: {exc!r}"[:300])
    counts = {(case, op): len(failures.get((case, op), [])) for case, op, _i in checks}
    print(f"failures per case: {counts}")
    assert not failures, "\n".join(f for found in failures.values() for f in found[:5])
    return counts


def test_a_name_missing_from_an_expired_listing_is_found_at_the_first_access(
    scenario: tuple[Mount, BotoWriter | MountWriter, int],
) -> None:
    reader, writer, count = scenario
    cases = [(case, op, i) for case, ops in CASES.items() for op in ops for i in range(count)]
    for case, op, i in cases:  # node A lists every trial directory once
        trial = reader.path / f"vis/{case}-{op}/t{i:02d}"
        assert "keep.bin" in os.listdir(trial)
        if case == "new_file_seen_missing":
            _enoent(os.stat)(trial / "new.bin")
    targets = {
        (case, op, i): _change(writer, case, f"vis/{case}-{op}/t{i:02d}") for case, op, i in cases
    }
    writer.done()
    time.sleep(TTL + 0.3)  # every listing of node A expired
    _run({key: (CASES[key[0]][key[1]], reader.path / target) for key, target in targets.items()})
    # Found with the attributes of a listed name, not provisional owner-only ones.
    for (case, _op, _i), target in targets.items():
        if case in ("new_file", "new_file_seen_missing"):
            assert stat.S_IMODE(os.stat(reader.path / target).st_mode) == 0o644


def test_a_name_an_expired_listing_holds_answers_at_once_and_opens_as_the_bucket_has_it(
    scenario: tuple[Mount, BotoWriter | MountWriter, int], fault_proxy: Any
) -> None:
    reader, writer, count = scenario
    trials_ = [(case, i) for case in ("overwritten", "deleted") for i in range(count)]
    for case, i in trials_:
        assert os.stat(reader.path / f"vis/{case}/t{i:02d}/target.bin").st_size == len(OLD)
    targets = {(case, i): _change(writer, case, f"vis/{case}/t{i:02d}") for case, i in trials_}
    writer.done()
    time.sleep(TTL + 0.3)
    listings = reader.counters()["listings"]
    gate = fault_proxy.hold_requests(match="list-type=2")
    results: dict[tuple[str, int], int] = {}

    def first_stats() -> None:  # the listing served: no wait for a LIST
        for key, target in targets.items():
            results[key] = os.stat(reader.path / target).st_size

    worker = threading.Thread(target=first_stats, daemon=True)
    try:
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "a stat of a listed name waited for a re-listing"
        assert results == {key: len(OLD) for key in targets}
        # The open revalidates: the bucket's bytes, or ENOENT, while LISTs still wait.
        opens: dict[tuple[str, str, int], tuple[Check, Path]] = {}
        for (case, i), target in targets.items():
            check = _enoent(lambda t: t.read_bytes()) if case == "deleted" else _reads_new
            opens[(case, "open", i)] = (check, reader.path / target)
        _run(opens)
    finally:
        gate.set()
    # Once the re-listings the first stats started are done, stat and ls agree.
    assert wait_until(lambda: reader.counters()["listings"] >= listings + 2 * count, 30)
    time.sleep(0.1)
    settled: dict[tuple[str, str, int], tuple[Check, Path]] = {}
    for (case, i), target in targets.items():
        path = reader.path / target
        if case == "deleted":
            settled[(case, "stat", i)] = (_enoent(os.stat), path)
            settled[(case, "ls", i)] = (_ls_missing, path)
        else:
            settled[(case, "stat", i)] = (_stat_size(len(NEW)), path)
            settled[(case, "ls", i)] = (_ls_shows(len(NEW)), path)
    _run(settled)


def _reads_new(t: Path) -> None:
    assert t.read_bytes() == NEW
