"""The readahead window of one open handle: how many blocks ahead of a
sequential reader are fetched.

A wider window means more ranged GETs in flight.  That is what a
high-latency store needs to reach its bandwidth, and what a store that is
already saturated (a busy link, a server short of CPU, a reader slower than
the fetches) does not: there every extra GET in flight only costs memory,
threads and CPU.  Measured on a loopback S3 server: a 256 MiB window read a
cold 1 GiB object at about 280 MB/s with 2.8 daemon CPU-seconds, a 64 MiB
window at about 350 MB/s with 1.6.  So the window is sized by probing, the
way TCP's congestion control probes for bandwidth, instead of always
growing to ``readahead_max``.

States and transitions (counted in blocks the reader enters):

    ramp:     the window doubles on every new block until ``min_window``
              (two full-size GETs), as before: a short file or a slow start
              pays no measuring delay.
    probe:    each epoch lasts one window's worth of blocks and measures the
              reader's rate.  The first epoch is a baseline; then the
              window doubles and the next epoch measures that.  A doubled
              window that beat the previous rate by GAIN_TO_GROW is kept
              and doubled again; one that did not is halved back, and the
              state becomes
    settled:  for SETTLE_EPOCHS epochs the window stays; then it probes
              again from a fresh baseline, in case the store got slower or
              less busy.  Reaching ``max_window`` also settles.

A seek (a read that does not continue the previous one) starts over at
ramp with a window of one block.

Invariants: ``1 <= window <= max_window``; the window changes only when the
reader enters a new block; the clock is a parameter, so the logic is tested
without time passing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A doubled window must raise the reader's rate by this factor to be kept.
GAIN_TO_GROW = 1.2

#: Epochs the window stays put after a probe found no gain.
SETTLE_EPOCHS = 16


@dataclass(slots=True)
class ReadaheadWindow:
    min_window: int
    max_window: int
    window: int = 1
    epoch_start: float = 0.0
    epoch_blocks: int = 0
    #: Blocks/s of the previous epoch (0: none yet, the next epoch is a baseline).
    last_rate: float = 0.0
    #: Epochs left before probing again (0: probing).
    settle_left: int = 0
    #: The current epoch runs with a window just doubled.
    grew: bool = False

    def restart(self) -> None:
        """A seek: back to one block, ramping."""
        self.window, self.epoch_blocks, self.last_rate, self.settle_left = 1, 0, 0.0, 0
        self.grew = False

    def enter_block(self, now: float) -> int:
        """The reader entered a block it had not reached before; returns the window."""
        ceiling = min(self.min_window, self.max_window)
        if self.window < ceiling:
            self.window = min(self.window * 2, ceiling)
            self._new_epoch(now)
            return self.window
        self.epoch_blocks += 1
        if self.epoch_blocks < self.window:
            return self.window
        rate = self.epoch_blocks / max(now - self.epoch_start, 1e-6)
        if self.settle_left:
            self.settle_left -= 1
            if not self.settle_left:
                self.last_rate = 0.0  # probe again, from a fresh baseline
        elif self.grew and rate < self.last_rate * GAIN_TO_GROW:
            # The last doubling bought nothing: undo it and stay a while.
            self.window = max(ceiling, self.window // 2)
            self.grew, self.settle_left = False, SETTLE_EPOCHS
        elif self.window < self.max_window:
            self.last_rate = rate
            self.window = min(self.window * 2, self.max_window)
            self.grew = True
        else:
            self.grew, self.settle_left = False, SETTLE_EPOCHS
        self._new_epoch(now)
        return self.window

    def _new_epoch(self, now: float) -> None:
        self.epoch_start, self.epoch_blocks = now, 0
