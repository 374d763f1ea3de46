"""Is the mount busy serving its users?  The measure background workers yield to.

The FUSE layer counts every request in ``TierFS.requests`` (one integer
increment, the only per-request cost).  A ``ForegroundMeter`` samples that
counter: the mount is *busy* while a window of ``window`` seconds saw
``BUSY_REQUESTS_PER_SECOND`` requests a second or more, and it stays busy for
``hold`` seconds after the last busy window (so that a reader's short pause
between two files does not let a background copy burst in).

Windows are closed by ``update()``: the uploader calls it from its loop; a
worker that must react within a fraction of a second (the mover: its copies
compete with training reads for the disk) runs ``run()`` beside its work,
which closes a window every ``window`` seconds.  A window that ``update()``
closes late (nobody called it for a while) averages over its whole length.

States: idle -> busy (a window at or above the rate; ``busy_since`` is the
start of that window) -> idle (``hold`` seconds after the last busy window
ended, i.e. at the first window below the rate when ``hold`` is 0).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import trio

#: The mount counts as busy at this many FUSE requests per second or more ...
BUSY_REQUESTS_PER_SECOND = 200
#: ... measured over windows of this many seconds (the uploader's).
BUSY_WINDOW = 0.5


class CountsRequests(Protocol):
    requests: int


#: ``TierFS.following_opens``: while its block runs, a worker that follows
#: the readers (the prefetcher, the directory readahead) is told of every
#: open and fills a section of ``tierfs status``.
FollowOpens = Callable[
    [Callable[[int], None], str, Callable[[], object]], AbstractContextManager[None]
]


class ForegroundMeter:
    def __init__(
        self, mount: CountsRequests, *, window: float = BUSY_WINDOW, hold: float = 0.0
    ) -> None:
        self.mount = mount
        self.window = window
        self.hold = hold
        self._since = trio.current_time()
        self._count = mount.requests
        self._busy_until = -1.0
        self.busy = False
        #: When the current busy spell began (meaningful while ``busy``).
        self.busy_since = 0.0

    def update(self) -> bool:
        """Close the current window if it is over; is the mount busy?"""
        now = trio.current_time()
        elapsed = now - self._since
        if elapsed >= self.window:
            rate = (self.mount.requests - self._count) / elapsed
            if rate >= BUSY_REQUESTS_PER_SECOND:
                if not self.busy:
                    self.busy_since = self._since  # the window that was busy began then
                self._busy_until = now + self.hold
            self.busy = now <= self._busy_until
            self._since, self._count = now, self.mount.requests
        return self.busy

    async def run(self) -> None:
        """Close a window every ``window`` seconds, for ever.  The first
        window starts now: a caller that runs the meter only while it has
        work (the mover) starts with what the mount does from then on, not
        an average over the idle time before."""
        self._since, self._count = trio.current_time(), self.mount.requests
        while True:
            self.update()
            await trio.sleep(self.window)
