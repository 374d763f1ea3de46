"""What metrics cost the FUSE path, and what a scrape costs the loop (run on demand).

    .venv/bin/python tests/bench/bench_metrics_overhead.py

* per FUSE request: the daemon's errno decorator (``tierfsd.fuse_ops._errno``,
  which times each request and counts failures into the registry) against
  the same decorator without the metric calls, around an ``async def`` that
  returns at once; both driven by ``coroutine.send`` (no event loop), so the
  difference is the added cost alone.  Also a failing request (EINVAL).
* per scrape: ``Metrics.exposition()`` (and the part of ``Metrics.scrape``
  that stays on the loop, the collector's ``freeze``) with 20 FUSE and 10 S3 operations
  observed, two preload jobs, and the collector over a fixed status reply
  of two tiers (the shape of ``TierFS.status()``; the real one also reads
  LMDB, see ``tierfs status``).

Prints microseconds per call; medians of 5 runs.
"""

from __future__ import annotations

import errno
import functools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pyfuse3
from tierfsd.fuse_ops import _errno

from tierfs.errors import EndpointUnreachable, InvalidArgument, TierfsError
from tierfs.metrics import Metrics

CALLS = 200_000
RUNS = 5


def _errno_without_metrics(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The errno decorator as it was before metrics (the baseline)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        ops = args[0]
        ops.fs.requests += 1
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except TierfsError as exc:
            if isinstance(exc, EndpointUnreachable):
                pass
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    return wrapper


class _Fs:
    requests = 0


class _Ops:
    def __init__(self) -> None:
        self.fs = _Fs()
        self.op_metrics = Metrics().fuse_ops

    async def getattr(self, ino: int) -> int:
        return ino

    async def readlink(self, ino: int) -> int:
        raise InvalidArgument("not a symlink")


def _per_call_us(ops: _Ops, method: Callable[..., Awaitable[Any]], fails: bool) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        coro = method(ops, 1)
        try:
            coro.send(None)
        except StopIteration:
            pass
        except pyfuse3.FUSEError:
            assert fails
    return (time.perf_counter() - start) / CALLS * 1e6


def bench_fuse() -> None:
    ops = _Ops()
    variants = {
        "getattr (ok)": (_Ops.getattr, False),
        "readlink (EINVAL)": (_Ops.readlink, True),
    }
    for label, (fn, fails) in variants.items():
        with_metrics = _errno(fn)
        without = _errno_without_metrics(fn)
        a = [_per_call_us(ops, without, fails) for _ in range(RUNS)]
        b = [_per_call_us(ops, with_metrics, fails) for _ in range(RUNS)]
        base, timed = statistics.median(a), statistics.median(b)
        print(
            f"FUSE {label:<18} without metrics {base:6.2f} us   with {timed:6.2f} us   "
            f"added {timed - base:5.2f} us per request"
        )


def _status() -> dict[str, Any]:
    tier = {
        "capacity": 1 << 40,
        "used": 1 << 39,
        "files": 12345,
        "high_watermark": 0.9,
        "low_watermark": 0.8,
        "hit_blocks": 10**6,
    }
    counters = dict.fromkeys(
        (
            "hit_blocks",
            "miss_blocks",
            "read_requests",
            "read_bytes",
            "gets",
            "fetched_bytes",
            "uploaded_bytes",
            "relocated_bytes",
            "evicted_bytes",
            "evicted_files",
            "verify_failures",
        ),
        3 * 10**6,
    )
    return {
        "tiers": [{**tier, "name": "nvme"}, {**tier, "name": "hdd"}],
        "counters": counters,
        "mover": {"bytes_moved": 1, "files_moved": 1, "passes": 3},
        "queues": {
            "journal_entries": 3,
            "uploads_running": 1,
            "promotions_queued": 0,
            "fetches_in_flight": 4,
        },
        "dirty_bytes": 10,
        "open_files": 5,
        "failed_files": 0,
        "worker_restarts": 0,
        "endpoint": {"state": "reachable"},
        "store_calls": {f"Op{i}": i for i in range(10)},
    }


class _StatusFs:
    """Stands in for TierFS in ``Metrics.watch``: a fixed status reply."""

    def __init__(self) -> None:
        self.status_sections: dict[str, Callable[[], object]] = {}

    def status(self, *, sections: bool = True) -> dict[str, Any]:
        extra = {k: f() for k, f in self.status_sections.items()} if sections else {}
        return {**_status(), **extra}


def bench_scrape() -> None:
    metrics = Metrics()
    metrics.watch(_StatusFs())  # type: ignore[arg-type]
    for i in range(20):
        for seconds in (0.00003, 0.0004, 0.02):
            metrics.fuse_ops[f"op{i}"].observe(seconds)
    for i in range(10):
        metrics.s3_request(f"Op{i}", 0.02, i % 3 == 0)
    jobs = [
        {
            "id": f"job-{i}",
            "state": "fetching",
            "files_done": i,
            "files_total": 9,
            "files_failed": 0,
            "files_resident": 0,
            "bytes_resident": 0,
            "bytes_fetched": i,
            "bytes_total": 9,
        }
        for i in range(2)
    ]
    metrics.watch_preloads(lambda: jobs)
    n = 200
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(n):
            metrics.exposition()
        runs.append((time.perf_counter() - start) / n * 1e3)
    collector = metrics._collector
    on_loop = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(n):
            collector.freeze()
        on_loop.append((time.perf_counter() - start) / n * 1e3)
    size = len(metrics.exposition())
    print(
        f"scrape: {statistics.median(runs):.2f} ms in all ({size} bytes of text), "
        f"of which {statistics.median(on_loop):.2f} ms on the loop (the rest in a thread)"
    )


if __name__ == "__main__":
    bench_fuse()
    bench_scrape()
