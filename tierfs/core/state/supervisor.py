"""Supervised background workers: one failing task never takes the mount down.

Every long-lived task of the daemon (housekeeping, the metadata group
commit, the uploader, the orphan cleanup, the control server, the signal
handler) is started through one ``Supervisor``.  Before it, any exception
that escaped a worker's loop went up through the trio nurseries, cancelled
every other task and ended ``pyfuse3.main``: each process on the node then
got ENOTCONN from the mount (a BufferError in the housekeeping task did
exactly that, see :mod:`tierfs.core.state.buffers`).

Rules:

* A worker that raises an ``Exception`` is logged with its traceback,
  counted (``errors``, ``restarts`` and the last error, per worker, in
  ``tierfs status`` under ``workers``) and started again after a pause.  The
  pause doubles with each failure in a row, from ``pause_min`` up to
  ``pause_max``; a run that lasted ``HEALTHY_RUN`` seconds resets it.  So a
  worker that fails at once on every start costs a log line per
  ``pause_max``, not a busy loop.
* ``FatalWorkerError`` is the one exception that is let through, on
  purpose: it ends the daemon (see ``Upkeep._commit_periodically``: a
  failed LMDB group commit).  Cancellation (``trio.Cancelled``) and other
  ``BaseException``s (KeyboardInterrupt, SystemExit) pass through too: the
  daemon is stopping.
* A worker that returns ends its supervision (one-shot workers such as the
  orphan cleanup).  ``restart=False`` makes a failure final as well (logged
  and counted, not restarted): for one-shot tasks whose repetition would be
  wrong or useless.
* A worker started with ``start`` (``nursery.start`` style) reports
  ``started`` to its starter once, from its first run that gets that far;
  later runs report to nobody.

States of one worker: running -> (returned: done) | (Exception: waiting
``pause`` -> running) | (FatalWorkerError / BaseException: propagates).

Fault injection (tests only; off unless the variable is set):
``TIERFS_TEST_WORKER_FAULTS="housekeeping,commit:0.5,uploader"`` makes each
named worker fail once with ``InjectedWorkerFault``, that many seconds (0.2
by default) after its first start, or at its end if it returns sooner.  The
failure is raised beside the worker in the same nursery, so the worker is
cancelled at its next checkpoint exactly as if its own code had raised
there.  ``TIERFS_TEST_WORKER_PAUSE`` (seconds) sets ``pause_min`` for tests.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

log = logging.getLogger(__name__)

#: Environment variables of the test-only fault injection (module docstring).
INJECT_ENV = "TIERFS_TEST_WORKER_FAULTS"
PAUSE_ENV = "TIERFS_TEST_WORKER_PAUSE"
#: Seconds after its first start at which an injected fault hits a worker.
INJECT_DEFAULT_DELAY = 0.2

PAUSE_MIN = 1.0
PAUSE_MAX = 30.0
#: A run at least this long (seconds) resets the pause to ``pause_min``.
HEALTHY_RUN = 60.0


class FatalWorkerError(Exception):
    """A worker failure that must end the daemon instead of a restart."""


class InjectedWorkerFault(RuntimeError):
    """The failure ``TIERFS_TEST_WORKER_FAULTS`` injects into a worker."""


@dataclass(slots=True)
class WorkerRecord:
    """What ``tierfs status`` shows of one worker."""

    running: bool = False
    errors: int = 0
    restarts: int = 0
    last_error: str = ""
    #: Wall clock (seconds since the epoch) of the last error, 0 if none.
    last_error_at: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "running": self.running,
            "errors": self.errors,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }


class _StartedOnce:
    """Hands ``started`` to the real task status once; later calls do nothing."""

    def __init__(self, inner: trio.TaskStatus[None]) -> None:
        self.inner = inner
        self.done = False

    def started(self, value: None = None) -> None:
        if not self.done:
            self.done = True
            self.inner.started(value)


def parse_injections(spec: str | None) -> dict[str, float]:
    """``"a,b:0.5"`` -> ``{"a": INJECT_DEFAULT_DELAY, "b": 0.5}``; bad entries
    are an error (a test that asked for a fault must get it)."""
    faults: dict[str, float] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, delay = item.partition(":")
        try:
            seconds = float(delay) if delay else INJECT_DEFAULT_DELAY
        except ValueError:
            raise ValueError(f"{INJECT_ENV}: bad delay in {item!r}") from None
        if not name or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"{INJECT_ENV}: bad entry {item!r}")
        faults[name] = seconds
    return faults


def _describe(exc: BaseException) -> str:
    """One line for ``status``: the innermost error of a single-error group."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _is_fatal(exc: BaseException) -> bool:
    if isinstance(exc, FatalWorkerError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_fatal(e) for e in exc.exceptions)
    return False


class Supervisor:
    def __init__(
        self,
        *,
        pause_min: float | None = None,
        pause_max: float = PAUSE_MAX,
        inject: str | None = None,
    ) -> None:
        if pause_min is None:
            pause_min = float(os.environ.get(PAUSE_ENV) or PAUSE_MIN)
        self.pause_min = pause_min
        self.pause_max = max(pause_max, pause_min)
        self.workers: dict[str, WorkerRecord] = {}
        self._inject = parse_injections(os.environ.get(INJECT_ENV) if inject is None else inject)
        if self._inject:
            log.warning("test fault injection armed for workers: %s", ", ".join(self._inject))

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers.values())

    def status(self) -> dict[str, dict[str, object]]:
        return {name: w.as_dict() for name, w in self.workers.items()}

    def start_soon(
        self,
        nursery: trio.Nursery,
        name: str,
        worker: Callable[..., Awaitable[Any]],
        *args: Any,
        restart: bool = True,
    ) -> None:
        """Run ``worker(*args)`` in ``nursery`` under supervision."""
        nursery.start_soon(self._supervise, name, worker, args, None, restart, name=name)

    async def start(
        self,
        nursery: trio.Nursery,
        name: str,
        worker: Callable[..., Awaitable[Any]],
        *args: Any,
    ) -> None:
        """Like ``nursery.start(worker, *args)``: returns once the worker
        called ``task_status.started()``; ``worker`` takes ``task_status``."""

        async def supervised(task_status: trio.TaskStatus[None]) -> None:
            await self._supervise(name, worker, args, _StartedOnce(task_status), True)

        await nursery.start(supervised, name=name)

    async def _supervise(
        self,
        name: str,
        worker: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        status: _StartedOnce | None,
        restart: bool,
    ) -> None:
        record = self.workers.setdefault(name, WorkerRecord())
        pause = self.pause_min
        while True:
            began = time.monotonic()
            record.running = True
            try:
                await self._run_once(name, worker, args, status)
                return
            except Exception as exc:
                if _is_fatal(exc):
                    raise
                record.errors += 1
                record.last_error = _describe(exc)
                record.last_error_at = time.time()
                if not restart:
                    log.error("task %s failed (not restarted)", name, exc_info=exc)
                    return
                if time.monotonic() - began >= HEALTHY_RUN:
                    pause = self.pause_min
                log.error("worker %s failed; restarting it in %.1f s", name, pause, exc_info=exc)
            finally:
                record.running = False
            await trio.sleep(pause)
            pause = min(self.pause_max, pause * 2)
            record.restarts += 1
            log.info("worker %s restarted (restart %d)", name, record.restarts)

    async def _run_once(
        self,
        name: str,
        worker: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        status: _StartedOnce | None,
    ) -> None:
        kwargs: dict[str, Any] = {} if status is None else {"task_status": status}
        delay = self._inject.pop(name, None)
        if delay is None:
            await worker(*args, **kwargs)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._inject_fault, name, delay)
            await worker(*args, **kwargs)
            raise InjectedWorkerFault(f"injected fault in worker {name} (at its end)")

    @staticmethod
    async def _inject_fault(name: str, delay: float) -> None:
        await trio.sleep(delay)
        raise InjectedWorkerFault(f"injected fault in worker {name}")


class BackgroundTasks:
    """Starts the parts' background tasks in the workers' nursery.

    A part that starts tasks of its own (a background re-listing, a kernel
    cache invalidation) is given this at construction, before the nursery
    exists (``TierFS.run_workers`` attaches it).  Until then a start is
    refused (False) and the part does the work another way or not at all."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> bool:
        """Start ``fn(*args)``; False when no nursery runs yet."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(fn, *args)
        return True

    def spawn_once(self, name: str, fn: Callable[..., Awaitable[object]], *args: object) -> bool:
        """Start ``fn(*args)`` under the supervisor as ``name``, not restarted
        when it fails (the failure is logged and counted); False when no
        nursery runs yet."""
        if self._nursery is None:
            return False
        self.supervisor.start_soon(self._nursery, name, fn, *args, restart=False)
        return True
