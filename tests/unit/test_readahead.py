"""The readahead window: ramp, probe, settle (tierfs.core.read.readahead), on a fake clock."""

from __future__ import annotations

from tierfs.core.read.readahead import GAIN_TO_GROW, SETTLE_EPOCHS, ReadaheadWindow


def read_blocks(w: ReadaheadWindow, clock: list[float], n: int, seconds_per_block: float) -> int:
    """Enter ``n`` new blocks, ``seconds_per_block`` apart; returns the last window."""
    window = w.window
    for _ in range(n):
        clock[0] += seconds_per_block
        window = w.enter_block(clock[0])
    return window


def test_ramps_to_the_minimum_without_measuring() -> None:
    w, clock = ReadaheadWindow(min_window=8, max_window=64), [0.0]
    assert [read_blocks(w, clock, 1, 1.0) for _ in range(4)] == [2, 4, 8, 8]


def test_grows_while_a_wider_window_makes_the_reader_faster() -> None:
    """A latency-bound store: the rate follows the window, so it grows to the cap."""
    w, clock = ReadaheadWindow(min_window=8, max_window=64), [0.0]
    read_blocks(w, clock, 3, 0.1)  # ramp to 8
    for _ in range(20):
        read_blocks(w, clock, w.window, 1.0 / w.window)  # rate proportional to the window
    assert w.window == 64


def test_stays_small_when_a_wider_window_buys_nothing() -> None:
    """A saturated store (the rate is flat): one probe, then back to the minimum."""
    w, clock = ReadaheadWindow(min_window=8, max_window=64), [0.0]
    read_blocks(w, clock, 3, 0.01)
    seen = set()
    for _ in range(SETTLE_EPOCHS):
        read_blocks(w, clock, w.window, 0.01)
        seen.add(w.window)
    assert w.window == 8
    assert seen == {8, 16}, "it probed one doubling and undid it"


def test_probes_again_after_settling() -> None:
    w, clock = ReadaheadWindow(min_window=8, max_window=64), [0.0]
    read_blocks(w, clock, 3, 0.01)
    read_blocks(w, clock, 8, 0.01)  # baseline at 8 -> 16
    read_blocks(w, clock, 16, 0.01)  # no gain -> back to 8, settled
    assert w.window == 8 and w.settle_left == SETTLE_EPOCHS
    read_blocks(w, clock, 8 * SETTLE_EPOCHS, 0.01)  # settled; the last epoch ends it
    assert w.settle_left == 0 and w.window == 8
    read_blocks(w, clock, 8, 0.01)  # a fresh baseline: probe 16 again
    assert w.window == 16
    # Now the store got slower per request: the wider window pays off.
    read_blocks(w, clock, 16, 0.01 / (GAIN_TO_GROW + 0.5))
    assert w.window == 32


def test_a_seek_starts_over() -> None:
    w, clock = ReadaheadWindow(min_window=8, max_window=64), [0.0]
    read_blocks(w, clock, 30, 0.01)
    w.restart()
    assert w.window == 1
    assert read_blocks(w, clock, 1, 0.01) == 2


def test_small_caps_are_respected() -> None:
    w, clock = ReadaheadWindow(min_window=8, max_window=2), [0.0]
    assert read_blocks(w, clock, 50, 0.01) == 2
    w = ReadaheadWindow(min_window=8, max_window=8)
    assert read_blocks(w, [0.0], 100, 0.01) == 8
