"""The audit log's queue and writer, without a mount: the record format,
rotation by size, a full queue (dropped records are written down where
they are missing), a failing disk, the process name, and the open flags."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from tierfs.config import AuditConfig
from tierfs.errors import TierfsError
from tierfs.workers import audit as audit_module
from tierfs.workers.audit import AuditLog, AuditWriter, open_flags, opens_for_writing


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_is_one_json_line_with_who_what_and_which_file(tmp_path: Path) -> None:
    log = AuditLog(AuditConfig(path=tmp_path / "audit.jsonl"))
    writer = AuditWriter(log)
    writer.open()
    log.record("rename", 1000, 100, os.getpid(), "a/x", 0, new_path="b/é")
    log.record("unlink", 0, 0, 2**22 + 7, b"a/\xff".decode(errors="surrogateescape"), 1)
    log.record("open", 5, 5, os.getpid(), "a/z", 0, extra={"flags": open_flags(os.O_RDONLY)})
    writer.write_batch(log.take(), 0)
    first, second, third = lines(tmp_path / "audit.jsonl")
    assert first["time"].endswith("Z") and first["time"][:2] == "20"
    assert {k: v for k, v in first.items() if k != "time"} == {
        "uid": 1000,
        "gid": 100,
        "pid": os.getpid(),
        "comm": Path("/proc/self/comm").read_text().strip(),
        "op": "rename",
        "path": "a/x",
        "new_path": "b/é",
        "errno": 0,
    }
    # A process that is gone has no name; the errno is the request's; a
    # name that is not UTF-8 is escaped (every line is ASCII, valid JSON).
    assert (second["comm"], second["errno"], "new_path" in second) == ("?", 1, False)
    assert second["path"] == "a/\udcff"
    assert (tmp_path / "audit.jsonl").read_bytes().isascii()
    assert third["flags"] == ["O_RDONLY"]
    assert os.stat(tmp_path / "audit.jsonl").st_mode & 0o777 == 0o600
    assert writer.status()["records"] == 3


def test_open_flags_and_what_counts_as_a_write() -> None:
    assert open_flags(os.O_WRONLY | os.O_CREAT | os.O_TRUNC) == ["O_WRONLY", "O_CREAT", "O_TRUNC"]
    assert open_flags(os.O_RDWR | os.O_APPEND) == ["O_RDWR", "O_APPEND"]
    assert opens_for_writing(os.O_WRONLY) and opens_for_writing(os.O_RDONLY | os.O_TRUNC)
    assert not opens_for_writing(os.O_RDONLY | os.O_NOATIME)


def test_the_log_rotates_by_size_and_keeps_as_many_files_as_asked(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(AuditConfig(path=path, max_size=1000, keep=2))
    writer = AuditWriter(log)
    writer.open()
    for n in range(40):
        log.record("mkdir", 0, 0, 1, f"dir-{n:03d}", 0)
        writer.write_batch(log.take(), 0)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    for name in files:
        assert (tmp_path / name).stat().st_size <= 1000
    # Whole records in each file, the newest in the current one, in order.
    records = [r["path"] for name in reversed(files) for r in lines(tmp_path / name)]
    assert records == sorted(records)
    assert records[-1] == "dir-039"


def test_a_full_queue_drops_and_says_so_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(audit_module, "QUEUE_RECORDS", 3)
    log = AuditLog(AuditConfig(path=tmp_path / "audit.jsonl"))
    writer = AuditWriter(log)
    writer.open()
    for n in range(5):
        log.record("create", 0, 0, 1, f"f{n}", 0)  # never blocks
    assert (log.queued, log.dropped) == (3, 2)
    with caplog.at_level(logging.WARNING):
        writer.write_batch(log.take(), log.dropped)
    records = lines(tmp_path / "audit.jsonl")
    assert [r.get("path") for r in records] == ["f0", "f1", "f2", None]
    assert records[-1]["op"] == "dropped" and records[-1]["count"] == 2
    assert "2 records dropped" in caplog.text


def test_a_failing_disk_loses_the_batch_not_the_writer(caplog: pytest.LogCaptureFixture) -> None:
    log = AuditLog(AuditConfig(path=Path("/dev/full")))
    writer = AuditWriter(log)
    writer.open()
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            log.record("create", 0, 0, 1, "f", 0)
            writer.write_batch(log.take(), 0)
    assert writer.write_errors == 3
    assert caplog.text.count("cannot write /dev/full") == 1  # once per kind of error


def test_a_path_the_daemon_cannot_write_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    writer = AuditWriter(AuditLog(AuditConfig(path=tmp_path / "file" / "audit.jsonl")))
    with pytest.raises(TierfsError, match=r"cannot open the audit log .*audit\.jsonl"):
        writer.open()


async def test_the_writer_runs_off_the_request_path_and_drains_at_stop(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(AuditConfig(path=path))
    writer = AuditWriter(log)
    writer.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        log.record("mkdir", 0, 0, 1, "one", 0)
        with trio.fail_after(5):
            while not path.stat().st_size:
                await trio.sleep(0.01)
        log.record("mkdir", 0, 0, 1, "two", 0)  # queued as the daemon stops
        nursery.cancel_scope.cancel()
    assert [r["path"] for r in lines(path)] == ["one", "two"]
