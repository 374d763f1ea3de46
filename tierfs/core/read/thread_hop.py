"""A pool of worker threads for the fetch path that hands results back to the
trio loop in batches.

Why not ``trio.to_thread`` (or ``trio.lowlevel.start_thread_soon``): every
job's result goes back through ``TrioToken.run_sync_soon``, which takes the
token's lock and writes a byte to the loop's wake-up socket; the loop wakes
in ``epoll`` and reads it.  A small-file preload finishes a GET every
millisecond or so from up to ``fetch.concurrency`` threads, so that is one
socket write, one loop wake-up and one lock hand-off per file, on a machine
whose two CPUs are the cap (see the "Where the CPU of a small file goes"
note in ``workers.preload``).

Here a finished job appends its outcome to a list; only the job that finds
the list empty asks the loop (one ``run_sync_soon``) to reschedule
everything in it.  While the loop is busy, the results of further jobs wait
in the list at the cost of a lock, not of a syscall.

Invariants:

* ``run`` is uncancellable while its job runs (as ``to_thread.run_sync`` is
  by default): the caller's task is rescheduled exactly once, with the
  job's outcome.
* At most ``max_threads`` threads exist; a thread is started when a job is
  queued and no thread waits for one.  A thread that had no job for
  ``IDLE_SECONDS`` ends, so an idle pool holds no threads (and a pool whose
  trio run has ended leaks none for long).
* A result whose trio run has ended meanwhile is dropped (nobody waits).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

__all__ = ["IDLE_SECONDS", "ThreadHop"]

#: A worker thread with no job for this long ends.
IDLE_SECONDS = 10.0

_T = TypeVar("_T")
_Job = tuple[Callable[[], Any], trio.lowlevel.Task, trio.lowlevel.TrioToken]


class ThreadHop:
    """Runs blocking functions in up to ``max_threads`` threads for trio tasks."""

    def __init__(self, max_threads: int, name: str = "tierfs-worker") -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, got {max_threads}")
        self.max_threads = max_threads
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # alive
        self._waiting = 0  # alive and waiting for a job
        self._queued = 0  # queued and not taken yet
        # Finished jobs whose tasks the loop has not rescheduled yet, per trio run.
        self._finished: dict[
            trio.lowlevel.TrioToken, list[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]]
        ] = {}

    @property
    def threads(self) -> int:
        """Worker threads alive now."""
        return self._threads

    async def run(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` in a worker thread; its result (or exception) here."""
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        with self._lock:
            self._queued += 1
            start = self._waiting < self._queued and self._threads < self.max_threads
            if start:
                self._threads += 1
        if start:
            try:
                threading.Thread(target=self._work, name=self.name, daemon=True).start()
            except BaseException:  # no thread: nothing was queued, the caller gets the error
                with self._lock:
                    self._threads -= 1
                    self._queued -= 1
                raise
        self._jobs.put((fn, task, token))
        result: _T = await trio.lowlevel.wait_task_rescheduled(
            lambda _raise_cancel: trio.lowlevel.Abort.FAILED
        )
        return result

    def _work(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            try:
                fn, task, token = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    self._waiting -= 1
                    if self._queued <= self._waiting:  # nothing for this thread
                        self._threads -= 1
                        return
                continue  # a job was queued just now: take it
            with self._lock:
                self._waiting -= 1
                self._queued -= 1
            result = outcome.capture(fn)
            del fn
            self._hand_back(token, task, result)

    def _hand_back(
        self,
        token: trio.lowlevel.TrioToken,
        task: trio.lowlevel.Task,
        result: outcome.Outcome[Any],
    ) -> None:
        """Thread: queue ``result`` for ``task``; wake the loop only if no
        wake-up is on its way already."""
        with self._lock:
            finished = self._finished.setdefault(token, [])
            finished.append((task, result))
            if len(finished) > 1:
                return  # the loop has been asked and takes this one too
        try:
            token.run_sync_soon(self._reschedule_finished, token)
        except trio.RunFinishedError:
            with self._lock:
                self._finished.pop(token, None)

    def _reschedule_finished(self, token: trio.lowlevel.TrioToken) -> None:
        """Loop: reschedule every task whose job has finished."""
        with self._lock:
            finished = self._finished.pop(token, [])
        for task, result in finished:
            trio.lowlevel.reschedule(task, result)
