"""What one user can make the daemon hold, part by part (no socket): the
connection gate, the budget of unfinished lines, the pace of requests, the
limits derived from the open-file limit, the spool's bounds and records,
and the escaping of what users name (``tierfs.text``).

The same bounds through a real control socket: ``tests/core/test_control_bounds.py``;
through a real mount, as two users: ``tests/fuse/test_between_users.py``.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.control.limits import (
    FD_RESERVE,
    ConnectionGate,
    ControlLimits,
    LineBudget,
    Pace,
    raise_open_file_limit,
)
from tierfs.errors import InvalidArgument
from tierfs.text import check_label, shown
from tierfs.workers.pathlists import PathSpool, SpoolBudget, SpoolFull, normalize_path


def test_the_gate_bounds_each_user_and_all_users_and_keeps_root_its_own_room() -> None:
    gate = ConnectionGate(ControlLimits(per_user=3, total=5, root=2))
    assert [gate.admit(1000) for _ in range(3)] == [None, None, None]
    refused = gate.admit(1000)
    assert refused is not None and "uid 1000 has 3 connections" in refused
    assert gate.admit(1001) is None and gate.admit(1001) is None
    assert "as many connections" in (gate.admit(1002) or "")  # 5 in all
    # Root is not counted with the others and has room of its own.
    assert gate.admit(0) is None and gate.admit(0) is None
    assert "root has 2" in (gate.admit(0) or "")
    assert gate.status() == {"connections": 7, "refused": 3, "per_user": 3, "total": 5}
    gate.leave(1000)
    assert gate.admit(1002) is None
    for uid in (1000, 1000, 1001, 1001, 1002, 0, 0):
        gate.leave(uid)
    assert gate.per_uid == {} and gate.others == 0


def test_the_limits_leave_descriptors_to_the_file_system() -> None:
    for open_files in (256, 1024, 4096, 20000, 65536, 1 << 20):
        limits = ControlLimits.for_open_files(open_files)
        held = limits.total + limits.root
        assert held <= max(16, open_files // 2), (open_files, limits)
        assert open_files - held >= min(FD_RESERVE, open_files // 2), (open_files, limits)
        assert 1 <= limits.per_user <= limits.total
    assert ControlLimits.for_open_files(65536) == ControlLimits()


def test_the_daemon_raises_its_open_file_limit_as_far_as_it_may() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        got = raise_open_file_limit(soft + 1)
        now_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert got == now_soft >= soft
        if hard == resource.RLIM_INFINITY or hard > soft:
            assert got == soft + 1
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_unfinished_lines_are_bounded_per_user_not_for_root() -> None:
    budget = LineBudget(per_user=100)
    budget.charge(1000, 60)
    with pytest.raises(InvalidArgument, match="uid 1000 hold more than 100 bytes"):
        budget.charge(1000, 41)
    budget.charge(1001, 100)  # another user has its own
    budget.charge(0, 10_000)  # root is not bounded
    budget.release(1000, 60)
    budget.charge(1000, 100)
    for uid, nbytes in ((1000, 100), (1001, 100), (0, 10_000)):
        budget.release(uid, nbytes)
    assert budget.held == {}


async def test_a_users_requests_wait_their_turn_and_root_never_waits() -> None:
    pace = Pace(ControlLimits(rate=10.0, burst=3))
    start = trio.current_time()
    for _ in range(3):  # the burst: at once
        await pace.start(1000)
    assert trio.current_time() - start < 0.05
    await pace.start(1000)  # then one per 1/rate s
    assert trio.current_time() - start >= 0.09
    before = trio.current_time()
    for _ in range(50):
        await pace.start(0)
    await pace.start(1001)  # another user's first request does not wait
    assert trio.current_time() - before < 0.05


async def test_short_requests_of_one_user_run_a_few_at_a_time() -> None:
    pace = Pace(ControlLimits(at_once=2))
    running = peak = 0

    async def one() -> None:
        nonlocal running, peak
        async with pace.short(1000):
            running += 1
            peak = max(peak, running)
            await trio.sleep(0.01)
            running -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(one)
    assert peak == 2


# --- spools --------------------------------------------------------------------------


def test_a_spool_is_bounded_per_owner_before_anything_is_written(tmp_path: Path) -> None:
    budget = SpoolBudget(per_user=1000, reserve_bytes=0)
    spool = PathSpool(tmp_path, budget=budget, owner=1000)
    other = PathSpool(tmp_path, budget=budget, owner=1001)
    try:
        for _ in range(10):
            spool.add("x" * 90)  # 94 bytes each with its length
        written = spool.nbytes
        with pytest.raises(SpoolFull, match="uid 1000"):
            spool.add("y" * 90)
        assert spool.nbytes == written and spool.count == 10  # nothing of it written
        other.add("z" * 900)  # another user's own room
        root = PathSpool(tmp_path, budget=budget, owner=0)
        root.add("r" * 5000)  # root is bounded by the disk's reserve only
        root.close()
    finally:
        spool.close()
        other.close()
    assert budget.used == {}


def test_a_spool_keeps_the_state_disks_reserve(tmp_path: Path) -> None:
    budget = SpoolBudget(reserve_bytes=1 << 62)  # more than any disk has
    spool = PathSpool(tmp_path, budget=budget, owner=1000)
    try:
        with pytest.raises(SpoolFull, match="state disk"):
            spool.add("a")
        assert spool.count == 0
    finally:
        spool.close()


names = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
    max_size=40,
) | st.binary(max_size=40).map(lambda raw: raw.replace(b"\0", b"").decode(errors="surrogateescape"))


@settings(max_examples=60, deadline=None)
@given(records=st.lists(names, max_size=30), takes=st.lists(st.integers(0, 5), max_size=10))
def test_records_come_back_whole_whatever_they_hold(
    tmp_path_factory: pytest.TempPathFactory, records: list[str], takes: list[int]
) -> None:
    """A name may hold newlines, spaces and bytes that are not UTF-8: a
    spool gives back exactly the records added, never one split in two,
    read whole (``lines``) or while it is written (``take``)."""
    spool = PathSpool(tmp_path_factory.mktemp("spool"))
    try:
        taken: list[str] = []
        added = 0
        for step in [*takes, len(records)]:
            for record in records[added : added + step]:
                spool.add(f"7 0 1 {record}")
            added = min(len(records), added + step)
            taken += spool.take()
        taken += spool.take()
        expected = [f"7 0 1 {record}" for record in records]
        assert taken == expected
        assert list(spool.lines()) == expected
        assert [line.split(" ", 3)[3] for line in taken] == records
    finally:
        spool.close()


@given(path=names)
def test_normalize_never_lets_a_path_out(path: str) -> None:
    try:
        normal = normalize_path(path, "/mnt/t")
    except InvalidArgument:
        return
    assert ".." not in normal.split("/") and "\x00" not in normal
    assert not normal.startswith("/")


# --- what users name, shown ---------------------------------------------------------------


def unshown(text: str) -> str:
    """The inverse of ``shown`` (a test of its "reads back unambiguously")."""
    out = []
    at = 0
    named = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}
    while at < len(text):
        ch = text[at]
        if ch != "\\":
            out.append(ch)
            at += 1
            continue
        kind = text[at + 1]
        if kind in named:
            out.append(named[kind])
            at += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}[kind]
        code = int(text[at + 2 : at + 2 + width], 16)
        # \xHH of 80 and above is a byte that is not UTF-8.
        out.append(chr(0xDC00 + code) if kind == "x" and code >= 0x80 else chr(code))
        at += 2 + width
    return "".join(out)


@given(text=names)
def test_shown_text_is_one_printable_line_that_reads_back(text: str) -> None:
    out = shown(text)
    assert out.isprintable() and "\n" not in out and "\x1b" not in out
    assert unshown(out) == text


def test_shown_examples() -> None:
    assert shown("plain name.bin") == "plain name.bin"
    assert shown("a\nb") == "a\\nb"
    assert shown("\x1b[31mred") == "\\x1b[31mred"
    assert shown("back\\slash") == "back\\\\slash"
    assert shown(b"\xff".decode(errors="surrogateescape")) == "\\xff"
    assert shown("\u202eevil") == "\\u202eevil"  # a bidi override is not printable


def test_a_label_is_printable_and_short() -> None:
    assert check_label("slurm-4242", "a preload tag", 128) == "slurm-4242"
    for bad in ("a\nb", "\x1b]0;title\x07", "x" * 129):
        with pytest.raises(InvalidArgument, match="printable"):
            check_label(bad, "a preload tag", 128)
