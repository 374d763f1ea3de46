"""tierfs.policy.watermarks: property tests of the watermark arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierfs.policy.watermarks import (
    TierUsage,
    bytes_to_free,
    is_above,
    mark,
    room_below,
)

sizes = st.integers(0, 2**62)
fractions = st.floats(0, 1, allow_nan=False)


@st.composite
def tier_usages(draw: st.DrawFn) -> TierUsage:
    capacity = draw(sizes)
    used = draw(st.one_of(st.integers(0, capacity), sizes))  # used may exceed capacity
    high = draw(st.floats(0.01, 1))
    low = draw(st.floats(0.001, high, exclude_max=True))
    return TierUsage("t", 0, capacity, used, high, low)


@given(sizes, fractions)
def test_mark_is_the_exact_floor(capacity: int, fraction: float) -> None:
    m = mark(capacity, fraction)
    assert 0 <= m <= capacity
    assert m <= Fraction(repr(fraction)) * capacity < m + 1


@given(sizes, sizes, fractions)
def test_freeing_reaches_the_mark_and_no_further(used: int, capacity: int, fraction: float) -> None:
    need = bytes_to_free(used, capacity, fraction)
    assert 0 <= need <= used
    assert used - need <= mark(capacity, fraction)
    if need > 0:  # exactly enough: one byte less would stay above the mark
        assert used - need + 1 > mark(capacity, fraction)
        assert is_above(used, capacity, fraction)
    else:
        assert not is_above(used, capacity, fraction)


@given(sizes, sizes, fractions)
def test_room_and_free_are_complementary(used: int, capacity: int, fraction: float) -> None:
    room = room_below(used, capacity, fraction)
    need = bytes_to_free(used, capacity, fraction)
    assert room == 0 or need == 0
    # Adding ``room`` lands exactly on the mark when below it.
    if used <= mark(capacity, fraction):
        assert used + room == mark(capacity, fraction)
        assert not is_above(used + room, capacity, fraction)
        assert is_above(used + room + 1, capacity, fraction)


@given(tier_usages())
def test_tier_usage(tier: TierUsage) -> None:
    assert tier.low_mark <= tier.high_mark <= tier.capacity
    if tier.above_high:
        assert tier.to_free > 0
        assert tier.used - tier.to_free == tier.low_mark
        assert tier.room == 0
    else:
        assert tier.to_free == 0
        assert tier.used + tier.room == tier.high_mark
    assert tier.room_to_full == max(0, tier.capacity - tier.used)
    after = tier.with_used(tier.used - tier.to_free)
    assert not after.above_high


@given(tier_usages())
def test_draining_is_the_hysteresis_between_the_marks(tier: TierUsage) -> None:
    """Above high it must drain whatever the flag; a tier that was draining
    goes on until it reaches low, one that was not stays put between the
    marks; at or below low nothing is to be freed."""
    draining = TierUsage(
        tier.name, tier.index, tier.capacity, tier.used, tier.high, tier.low, draining=True
    )
    assert tier.must_drain == tier.above_high
    assert draining.must_drain == (tier.used > tier.low_mark)
    assert draining.to_free == max(0, tier.used - tier.low_mark)
    assert draining.with_used(draining.low_mark).to_free == 0
    assert draining.with_used(tier.used).draining


@given(sizes, sizes, fractions, fractions)
def test_monotonic_in_used_and_fraction(used: int, capacity: int, f1: float, f2: float) -> None:
    low, high = sorted((f1, f2))
    assert bytes_to_free(used, capacity, low) >= bytes_to_free(used, capacity, high)
    assert bytes_to_free(used + 1, capacity, low) == bytes_to_free(used, capacity, low) + (
        1 if used + 1 > mark(capacity, low) else 0
    )


def test_edge_cases() -> None:
    assert mark(0, 0.9) == 0
    assert is_above(1, 0, 0.9) and bytes_to_free(5, 0, 0.8) == 5
    assert not is_above(0, 0, 0.9)
    over = TierUsage("nvme", 0, capacity=100, used=150, high=0.8, low=0.7)
    assert over.above_high and over.to_free == 80 and over.room == 0 and over.room_to_full == 0
    at_high = TierUsage("nvme", 0, capacity=100, used=80, high=0.8, low=0.7)
    assert not at_high.above_high and at_high.to_free == 0
    # The binary float 0.7 is a bit below 7/10; the mark uses the decimal the user wrote.
    assert mark(10, 0.7) == 7
    assert mark(3, 0.1) == 0 and mark(10, 0.1) == 1 and mark(10**15, 0.8) == 8 * 10**14
    with pytest.raises(ValueError, match="low < high"):
        TierUsage("t", 0, 100, 0, high=0.8, low=0.8)
    with pytest.raises(ValueError, match="negative"):
        bytes_to_free(-1, 100, 0.5)
    with pytest.raises(ValueError, match="outside"):
        mark(100, 1.5)
