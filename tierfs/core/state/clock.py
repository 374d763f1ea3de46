"""The wall clock of the lifecycle: access times, ages, and the mover's checks.

Age rules count days (``demote_after = "3d"``), and tests cannot wait days.
``Clock.now()`` is ``time.time()`` plus an offset that a test can move
forward while the daemon runs: when the environment variable
``TIERFS_TEST_CLOCK_FILE`` names a file, the offset in seconds is read from
it (a decimal number; a missing or unreadable file means 0).  The file is
stat'ed at most once per ``_RECHECK`` seconds and reread only when it
changed, so the clock is cheap enough for every access-time update.

Only the lifecycle uses this clock (access times kept for eviction, rule
ages, the mover's schedule); inode timestamps and the upload delay use the
real clock.  Without the variable (every real mount) the offset is always 0.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

CLOCK_FILE_ENV = "TIERFS_TEST_CLOCK_FILE"
_RECHECK = 0.2


class Clock:
    def __init__(self, offset_file: str | None = None) -> None:
        self._file = offset_file if offset_file is not None else os.environ.get(CLOCK_FILE_ENV)
        self.offset = 0.0
        self._checked = 0.0
        self._stamp: tuple[int, int] | None = None
        if self._file:
            log.warning("test clock: the lifecycle clock follows the offset in %s", self._file)

    def now(self) -> float:
        """Seconds since the epoch, as the lifecycle sees them."""
        real = time.time()
        if self._file and real - self._checked >= _RECHECK:
            self._checked = real
            self._reload()
        return real + self.offset

    def _reload(self) -> None:
        assert self._file is not None
        try:
            st = os.stat(self._file)
        except OSError:
            self.offset, self._stamp = 0.0, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            with open(self._file) as f:
                self.offset = float(f.read().strip() or 0)
        except (OSError, ValueError) as exc:
            log.warning(
                "test clock: cannot read %s (%s); offset stays %s", self._file, exc, self.offset
            )
