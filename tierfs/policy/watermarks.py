"""Watermark arithmetic for one tier.  Pure and synchronous.

A tier has a capacity (bytes), used bytes, and two fractions ``0 < low <
high <= 1`` (the config guarantees ``low < high``; ``TierUsage`` checks it
again).  The marks are whole bytes, rounded down and computed exactly from
the fraction as written (its shortest decimal form, so 0.7 is 7/10, not the
binary float just below it): ``mark(capacity, f) = floor(f * capacity)``.

* above high  <=>  ``used > mark(capacity, high)``;
* draining    <=>  above high, or ``draining`` was seen (the tier went above
  high and has not been seen at or below its low mark since) and ``used >
  mark(capacity, low)``.  This is the hysteresis of "above high, bring it
  down to low": a pass whose moves were skipped (a file busy, no room)
  leaves the tier between its marks, and the next pass goes on down to low
  instead of stopping because the tier is no longer above high.  Who keeps
  the ``draining`` flag between passes is the caller's business
  (``core.tiering.lifecycle``): it keeps ``must_drain`` as the next ``draining``;
* to free     =   ``max(0, used - mark(capacity, low))`` while draining, 0
  otherwise: what brings the tier down to its low mark;
* room        =   ``max(0, mark(capacity, high) - used)``: what may still be
  added before the tier goes above high (``room_to_full`` is the same up to
  the whole capacity).

Edge cases: a capacity of 0 has both marks at 0, so any used byte is above
high and all of it is to be freed; used > capacity (a tier that shrank, or a
filesystem that reports less than was written) is simply far above high.
Negative inputs are errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "TierUsage",
    "bytes_to_free",
    "is_above",
    "mark",
    "room_below",
]


def _check(used: int, capacity: int, fraction: float) -> None:
    if used < 0 or capacity < 0:
        raise ValueError(f"used ({used}) and capacity ({capacity}) must not be negative")
    if not 0 <= fraction <= 1:
        raise ValueError(f"the fraction {fraction} is outside [0, 1]")


def mark(capacity: int, fraction: float) -> int:
    """``floor(fraction * capacity)`` in whole bytes, exactly (``fraction`` as a decimal)."""
    _check(0, capacity, fraction)
    return math.floor(Fraction(repr(float(fraction))) * capacity)


def is_above(used: int, capacity: int, fraction: float) -> bool:
    """True when ``used`` is above the mark ``fraction`` of ``capacity``."""
    _check(used, capacity, fraction)
    return used > mark(capacity, fraction)


def bytes_to_free(used: int, capacity: int, fraction: float) -> int:
    """How much to free so that ``used <= mark(capacity, fraction)``."""
    _check(used, capacity, fraction)
    return max(0, used - mark(capacity, fraction))


def room_below(used: int, capacity: int, fraction: float) -> int:
    """How much may be added before ``used`` goes above ``mark(capacity, fraction)``."""
    _check(used, capacity, fraction)
    return max(0, mark(capacity, fraction) - used)


@dataclass(frozen=True, slots=True)
class TierUsage:
    """One tier's state as the planner sees it."""

    name: str
    index: int  # 0 = the fastest tier
    capacity: int  # bytes
    used: int  # bytes
    high: float
    low: float
    # Seen above high, and not seen at or below low since (see the docstring).
    draining: bool = False

    def __post_init__(self) -> None:
        _check(self.used, self.capacity, self.high)
        if not 0 < self.low < self.high <= 1:
            raise ValueError(
                f"watermarks must satisfy 0 < low < high <= 1, got {self.low}, {self.high}"
            )

    @property
    def high_mark(self) -> int:
        return mark(self.capacity, self.high)

    @property
    def low_mark(self) -> int:
        return mark(self.capacity, self.low)

    @property
    def above_high(self) -> bool:
        return self.used > self.high_mark

    @property
    def must_drain(self) -> bool:
        """Above high, or still on the way down from above high to low."""
        return self.above_high or (self.draining and self.used > self.low_mark)

    @property
    def to_free(self) -> int:
        """Bytes to free to reach the low mark while draining; 0 otherwise."""
        return max(0, self.used - self.low_mark) if self.must_drain else 0

    @property
    def room(self) -> int:
        """Bytes that fit before the high mark."""
        return max(0, self.high_mark - self.used)

    @property
    def room_to_full(self) -> int:
        """Bytes that fit before the capacity."""
        return max(0, self.capacity - self.used)

    def with_used(self, used: int) -> TierUsage:
        return TierUsage(
            self.name, self.index, self.capacity, used, self.high, self.low, self.draining
        )
