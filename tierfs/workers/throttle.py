"""A bandwidth cap for background copies (``[mover] bandwidth``).

``await throttle(nbytes)`` after each chunk copied.  The throttle keeps a
virtual finish time: each chunk pushes it on by ``nbytes / rate``, and a
caller that gets more than ``burst`` seconds ahead of real time sleeps until
it is back within it.  So the long-run rate never exceeds ``rate``, a copy
may burst by ``burst * rate`` bytes after an idle spell, and the cost per
call is a few float operations.  ``rate == 0`` means no cap.  One throttle
is shared by every copy of one worker, so parallel copies share the cap.
"""

from __future__ import annotations

import trio


class Throttle:
    def __init__(self, rate: int, *, burst: float = 0.25) -> None:
        self.rate = max(0, int(rate))
        self.burst = burst
        self._finish = 0.0

    async def __call__(self, nbytes: int) -> None:
        if not self.rate or nbytes <= 0:
            return
        now = trio.current_time()
        self._finish = max(self._finish, now - self.burst) + nbytes / self.rate
        ahead = self._finish - now - self.burst
        if ahead > 0:
            await trio.sleep(ahead)
