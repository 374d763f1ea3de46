"""tierfs.policy.planner.MoveAdmission: how many moves of a plan run at once."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from tierfs.policy.planner import MoveAdmission
from tierfs.workers.mover import MOVE_ADMISSION

MiB = 1 << 20
RULE = MoveAdmission(min_at_once=3, max_at_once=16, max_bytes=64 * MiB)


def test_three_moves_start_whatever_their_size() -> None:
    assert RULE.may_start([], 10 << 30)
    assert RULE.may_start([10 << 30, 10 << 30], 10 << 30)
    assert not RULE.may_start([10 << 30] * 3, 1)


def test_small_files_fill_up_to_the_byte_budget() -> None:
    four_mib = 4 * MiB
    assert RULE.may_start([four_mib] * 15, four_mib)  # 64 MiB in all: allowed
    assert not RULE.may_start([four_mib] * 15, four_mib + 1)
    assert not RULE.may_start([1] * 16, 1)  # never more than max_at_once


def test_the_mover_uses_the_documented_limits() -> None:
    assert MoveAdmission(3, 16, 64 * MiB) == MOVE_ADMISSION


@given(
    sizes=st.lists(st.integers(0, 300 * MiB), max_size=60),
    finish_order=st.randoms(use_true_random=False),
)
def test_a_plan_run_in_order_keeps_the_limits_and_starts_every_move(
    sizes: list[int], finish_order: random.Random
) -> None:
    """Start moves in plan order as the mover does, let random ones finish while
    the next cannot start: the limits hold at every step, and every move starts."""
    running: list[int] = []
    started = 0
    for nbytes in sizes:
        while not RULE.may_start(running, nbytes):
            assert running, "an idle mover must always admit the next move"
            running.pop(finish_order.randrange(len(running)))
        running.append(nbytes)
        started += 1
        assert len(running) <= RULE.max_at_once
        assert len(running) <= RULE.min_at_once or sum(running) <= RULE.max_bytes
    assert started == len(sizes)
