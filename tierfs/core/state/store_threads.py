"""Background store calls in worker threads, and how shutdown leaves them behind.

A request to the bucket blocks a thread until the endpoint answers or a
timeout fires; an upload may wait ``UPLOAD_READ_TIMEOUT`` (30 s) for its
answer.  Against a black hole (an endpoint that accepts connections and
never answers) that is the full timeout, and a daemon that waited for such
threads at SIGTERM or ``tierfs umount`` would take that long to exit.

Invariants and state transitions:

- ``StoreThreads.run`` runs a blocking store call in a trio worker thread
  inside a *shielded* cancel scope: an ordinary cancellation (a worker
  restarted by the supervisor, say) still waits for the thread to finish,
  exactly as ``trio.to_thread.run_sync`` does without abandoning.  So two
  threads never upload the same journal entry at the same time: the entry
  is tried again only after the first thread has returned.
- ``abandon()`` (shutdown only, once the daemon stops for good) cancels
  every such scope and every later one at once: the awaiting tasks go on
  (and are cancelled by the daemon's own cancellation) without waiting for
  their threads, which are daemon threads (trio's) and die with the
  process.  Nothing is lost: the journal entry of an upload is removed only
  by the task after its thread returned, so it stays in LMDB and the next
  mount sends it again (aborting the multipart upload it left open).
- States: RUNNING -> ABANDONED (one way; ``abandon`` is idempotent).
  ``left_behind`` counts the calls that were still running when abandoned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreThreads:
    """See the module docstring.  Used from the trio loop only."""

    def __init__(self) -> None:
        self._running: set[trio.CancelScope] = set()
        self.abandoned = False
        self.left_behind = 0

    @property
    def running(self) -> int:
        """Store calls waiting in a thread right now."""
        return len(self._running)

    async def run(self, fn: Callable[[], T], *, limiter: trio.CapacityLimiter) -> T:
        """``fn()`` in a worker thread; only ``abandon()`` stops the wait for it."""
        with trio.CancelScope(shield=True) as scope:
            if self.abandoned:
                scope.cancel()
            self._running.add(scope)
            try:
                return await trio.to_thread.run_sync(fn, limiter=limiter, abandon_on_cancel=True)
            finally:
                self._running.discard(scope)
        # Abandoned: the daemon is stopping and its own cancellation (already
        # requested) ends this task at this checkpoint.
        await trio.lowlevel.checkpoint()
        raise trio.TooSlowError("the daemon is stopping: store call abandoned")

    def abandon(self) -> None:
        """Stop waiting for every store call, now and from here on."""
        if not self.abandoned:
            self.abandoned = True
            self.left_behind = len(self._running)
            if self.left_behind:
                log.warning(
                    "stopping without waiting for %d store call(s) still on the network; "
                    "their journal entries stay for the next mount",
                    self.left_behind,
                )
        for scope in list(self._running):
            scope.cancel()
