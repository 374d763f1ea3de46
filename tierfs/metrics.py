"""Prometheus metrics of one daemon: one registry, owned by one ``Metrics``.

Composition, no globals.  The daemon builds ``Metrics`` first and hands its
parts to whoever counts:

* the S3 store gets ``Metrics.s3_request`` as its ``request_observer``
  (``tierfs.store.RequestObserver``): one call per request sent, from the
  store's threads, with the S3 operation name, latency and outcome, into
  ``s3_ops`` (a ``LatencyTable`` with a lock);
* the FUSE layer gets ``Metrics.fuse_ops`` (a ``LatencyTable`` without a
  lock: the trio loop alone records and reads it), which the one errno
  decorator of ``tierfsd.fuse_ops`` feeds: one latency observation per
  request, one error count per failed reply;
* ``Metrics.watch(fs)`` makes the collector export ``TierFS.status()`` too,
  and adds the FUSE, S3 and preload figures to ``status`` as sections.
  Block hits and misses, bytes fetched, uploaded and moved, queue depths,
  dirty bytes and tier usage are counters and gauges the core keeps anyway:
  they are read at scrape time, never counted twice on the read path, and a
  scrape shows what ``tierfs status`` shows;
* the preload worker's jobs are read at each scrape (``watch_preloads``);
* the prefetcher's figures (``Prefetcher.status``: orders, windows, files
  and bytes prefetched, opens, hits, cancelled fills...) are read at each scrape from
  the file system's status section that the prefetcher keeps while it runs
  (``tierfs.workers.prefetch.STATUS_SECTION``), so a scrape shows what
  ``tierfs status`` shows; no prefetcher, no ``tierfs_prefetch_*`` series.

The registry has one custom collector (``_Collector``) and nothing else:
the request latencies are plain numbers per operation (``OperationStats``:
a bisect and three additions, no lock on the FUSE path), turned into
histogram families only when scraped.  A prometheus-client ``Histogram``
costs 1.4 us per observation here (a lock, a Python loop over the buckets),
and ``status`` could read its totals only by building every sample.
Nothing uses prometheus-client's global default registry: two daemons (or
two tests) in one process never share a series.

Serving (``MetricsServer``): ``bind()`` runs at start-up, before the mount
exists, so a port in use is a clear start-up error (``CannotListen``), not a
crash later.  ``serve()`` answers HTTP/1.x ``GET /metrics`` on the trio loop
(one request per connection, bounded head size and time).  Every figure is
read on the loop, in one go (``_Collector.freeze``, plain copies): TierFS
state and the FUSE table belong to the loop, so no locks and no half-done
update; the metric families and the text are made from that copy in a
thread (``Metrics.scrape``), which is most of a scrape's cost.

What leaves the node: label values are S3 operation names, FUSE operation
names, tier names, preload job ids and quota names (checked: no ``/``, so
never a path).
No path, key, bucket, endpoint or credential is ever a label or a value.

Cost (measured, ``tests/bench/bench_metrics_overhead.py``; the README has
the figures): on the FUSE path two ``perf_counter`` calls and one
observation per request; per scrape a few ms, mostly in the thread.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from tierfs.config import MetricsConfig
from tierfs.errors import CannotListen
from tierfs.workers.mover import STATUS_SECTION as MOVER_SECTION
from tierfs.workers.prefetch import STATUS_SECTION as PREFETCH_SECTION

if TYPE_CHECKING:
    from tierfs.core import TierFS

log = logging.getLogger(__name__)

#: Latency buckets (seconds) of FUSE requests: a cache hit answers in tens of
#: microseconds, a cold read waits for S3.
FUSE_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: Latency buckets (seconds) of S3 requests, to the answer's head.
S3_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: Error replies that are ordinary answers, not failures: a name that does
#: not exist, an extended attribute that is not set.
ORDINARY_ERRNOS = frozenset({errno.ENOENT, errno.ENODATA})


#: HTTP: the request head is read within this many seconds, or dropped.
REQUEST_TIMEOUT = 10.0
#: HTTP: the longest request head accepted (bytes).
MAX_REQUEST_HEAD = 8192
#: HTTP: connections answered at once; more wait.
MAX_CONNECTIONS = 4


class OperationStats:
    """Latency histogram, request and error counts of one operation.

    Plain numbers, exported by the registry's collector at scrape time:
    cheaper per request than a prometheus-client Histogram (no lock, one
    bisect), and ``status`` reads them without building samples.
    """

    __slots__ = ("bounds", "buckets", "count", "errors", "seconds")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        #: Requests per bucket: ``buckets[i]`` took at most ``bounds[i]``
        #: (and more than the bound before); the last one is +Inf.
        self.buckets = [0] * (len(bounds) + 1)
        self.count = 0
        self.seconds = 0.0
        self.errors = 0

    def observe(self, seconds: float) -> None:
        """One request took ``seconds``."""
        self.buckets[bisect.bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.seconds += seconds

    def failed(self, err: int) -> None:
        """The request was answered with ``err``: a failure unless it is one
        of the ordinary answers in ``ORDINARY_ERRNOS``."""
        if err not in ORDINARY_ERRNOS:
            self.errors += 1


class LatencyTable(dict[str, OperationStats]):
    """operation name -> its ``OperationStats``, made on first use.

    Without a lock it belongs to one thread (the FUSE table: the trio loop
    records and reads it).  With ``lock`` every change and every reading
    holds it (the S3 table: the store's threads record, the loop reads).
    """

    def __init__(self, bounds: tuple[float, ...], lock: threading.Lock | None = None) -> None:
        super().__init__()
        self.bounds = bounds
        self.lock = lock
        self._le = [floatToGoString(b) for b in bounds]  # the "le" label values

    def __missing__(self, operation: str) -> OperationStats:
        stats = self[operation] = OperationStats(self.bounds)
        return stats

    def record(self, operation: str, seconds: float, failed: bool) -> None:
        """One request of ``operation`` (any thread when the table has a lock)."""
        with self.lock or contextlib.nullcontext():
            stats = self[operation]
            stats.observe(seconds)
            if failed:
                stats.errors += 1

    def _rows(self) -> list[tuple[str, list[int], int, float, int]]:
        with self.lock or contextlib.nullcontext():
            return [
                (op, list(st.buckets), st.count, st.seconds, st.errors)
                for op, st in sorted(self.items())
            ]

    def summary(self) -> dict[str, dict[str, float]]:
        """Per operation: requests, errors, seconds (total), for ``status``."""
        return {
            op: {"requests": count, "errors": errors, "seconds": seconds}
            for op, _buckets, count, seconds, errors in self._rows()
        }

    def rows(self) -> list[tuple[str, list[int], int, float, int]]:
        """A copy of the figures: (operation, buckets, count, seconds, errors)."""
        return self._rows()

    def families(
        self,
        prefix: str,
        doc: str,
        errors_doc: str,
        rows: list[tuple[str, list[int], int, float, int]] | None = None,
    ) -> list[Metric]:
        """``<prefix>_request_seconds`` (histogram) and ``<prefix>_errors_total``
        of ``rows`` (a copy taken earlier by ``rows()``) or of the figures now."""
        latency = HistogramMetricFamily(f"{prefix}_request_seconds", doc, labels=["operation"])
        errors = CounterMetricFamily(f"{prefix}_errors", errors_doc, labels=["operation"])
        for op, buckets, count, seconds, failed in self._rows() if rows is None else rows:
            cumulative = itertools.accumulate(buckets[:-1])
            latency.add_metric(
                [op], [*zip(self._le, cumulative, strict=True), ("+Inf", count)], seconds
            )
            errors.add_metric([op], failed)
        return [latency, errors]


@dataclass(frozen=True, slots=True)
class PreloadProgress:
    """Where one preload job stands (from its ``PreloadJob.snapshot``).

    Totals are None while the job still lists what it will fetch.
    """

    job_id: str
    files_done: int
    bytes_done: int
    files_total: int | None = None
    bytes_total: int | None = None
    files_failed: int = 0
    files_skipped: int = 0
    running: bool = True


class Metrics:
    """The daemon's one metrics registry and everything that feeds it."""

    def __init__(self) -> None:
        #: The one registry (never prometheus-client's global one).
        self.registry = CollectorRegistry(auto_describe=False)
        #: What the FUSE layer records into (see ``tierfsd.fuse_ops``): trio loop only.
        self.fuse_ops = LatencyTable(FUSE_BUCKETS)
        #: What the S3 store records into, from its threads (``s3_request``).
        self.s3_ops = LatencyTable(S3_BUCKETS, threading.Lock())
        self._preload_jobs: Callable[[], list[dict[str, Any]]] = list
        self._fs: TierFS | None = None
        self._collector = _Collector(self)
        self.registry.register(self._collector)
        self._scrape_lock = trio.Lock()

    # --- feeding -------------------------------------------------------------------

    def s3_request(self, operation: str, seconds: float, failed: bool) -> None:
        """The store's ``request_observer``: one request sent (any thread)."""
        self.s3_ops.record(operation, seconds, failed)

    def watch(self, fs: TierFS) -> None:
        """Export ``fs``'s own figures, and add this object's to its ``status``."""
        if self._fs is not None:
            raise RuntimeError("Metrics.watch: already watching a file system")
        self._fs = fs
        fs.status_sections["fuse_requests"] = self.fuse_ops.summary
        fs.status_sections["s3_requests"] = self.s3_ops.summary

    def watch_preloads(self, jobs: Callable[[], list[dict[str, Any]]]) -> None:
        """Export the preload jobs that ``jobs()`` describes at each scrape
        (``Preloader.status``: the snapshots ``status`` shows too), as
        ``tierfs_preload_{files,bytes}_{done,total}``,
        ``tierfs_preload_files_{failed,skipped}`` and ``tierfs_preload_running``
        (1 while running, 0 once finished), labelled by job id."""
        self._preload_jobs = jobs

    def preload_progress(self) -> list[PreloadProgress]:
        """The preload jobs now (read on the trio loop)."""
        return [_progress_of(job) for job in self._preload_jobs()]

    # --- reading -------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text exposition of the registry (call on the trio loop)."""
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """``exposition()`` for the HTTP endpoint: every figure is read here,
        on the loop, in one go (a consistent reading); the text is formatted
        in a thread, so that FUSE requests do not wait behind it."""
        async with self._scrape_lock:
            self._collector.freeze()
            try:
                return await trio.to_thread.run_sync(generate_latest, self.registry)
            finally:
                self._collector.thaw()

    def preload_families(self, jobs: list[PreloadProgress] | None = None) -> Iterator[Metric]:
        """The preload gauges of ``jobs`` (a copy taken earlier) or of the jobs now."""
        jobs = self.preload_progress() if jobs is None else jobs
        if not jobs:
            return
        fields: list[tuple[str, str, Callable[[PreloadProgress], int | None]]] = [
            ("files_done", "files fetched or found resident", lambda p: p.files_done),
            ("bytes_done", "bytes resident", lambda p: p.bytes_done),
            ("files_total", "files to preload (once listed)", lambda p: p.files_total),
            ("bytes_total", "bytes to preload (once listed)", lambda p: p.bytes_total),
            ("files_failed", "files that failed", lambda p: p.files_failed),
            ("files_skipped", "files already resident", lambda p: p.files_skipped),
            ("running", "1 while the job runs, 0 once finished", lambda p: int(p.running)),
        ]
        for name, doc, get in fields:
            family = GaugeMetricFamily(
                f"tierfs_preload_{name}", f"Preload: {doc}", labels=["job_id"]
            )
            for job in jobs:
                value = get(job)
                if value is not None:
                    family.add_metric([job.job_id], value)
            yield family


class _Figures(NamedTuple):
    """One reading of everything a scrape shows (plain data)."""

    fuse: list[tuple[str, list[int], int, float, int]]
    s3: list[tuple[str, list[int], int, float, int]]
    status: dict[str, Any] | None
    preloads: list[PreloadProgress]
    prefetch: dict[str, Any] | None
    readers: dict[str, Any] | None = None


class _Collector:
    """The registry's one collector: FUSE and S3 requests, the file
    system's figures (``TierFS.status()``) and the preload jobs.

    Reading the figures (``_read``) must happen on the trio loop (TierFS
    state and the FUSE table belong to it); turning them into metric
    families may happen anywhere.  ``collect`` does both when called (on the
    loop); ``freeze`` (on the loop) reads the figures once for a scrape whose
    families and text are made in a thread, and ``collect`` uses that
    reading until ``thaw``.
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._frozen: _Figures | None = None

    def _read(self) -> _Figures:
        m = self.metrics
        sections = m._fs.status_sections if m._fs is not None else {}
        section = sections.get(PREFETCH_SECTION)
        prefetch = section() if section is not None else None
        status = m._fs.status(sections=False) if m._fs is not None else None
        mover = sections.get(MOVER_SECTION)
        if status is not None and mover is not None:  # cheap, and the mover's counters
            status[MOVER_SECTION] = mover()
        return _Figures(
            fuse=m.fuse_ops.rows(),
            s3=m.s3_ops.rows(),
            status=status,
            preloads=m.preload_progress(),
            prefetch=prefetch if isinstance(prefetch, dict) else None,
            readers=m._fs.leases.status() if m._fs is not None else None,
        )

    def freeze(self) -> None:
        self._frozen = self._read()

    def thaw(self) -> None:
        self._frozen = None

    def collect(self) -> Iterable[Metric]:
        figures = self._frozen if self._frozen is not None else self._read()
        m = self.metrics
        yield from m.fuse_ops.families(
            "tierfs_fuse",
            "FUSE requests by operation: latency in seconds (_count: the requests)",
            "FUSE requests answered with an error, by operation "
            "(not counted: ENOENT and ENODATA, ordinary answers)",
            figures.fuse,
        )
        yield from m.s3_ops.families(
            "tierfs_s3",
            "S3 requests by operation: seconds from sending to the answer's head",
            "S3 requests that failed, by operation: no answer, or an HTTP error "
            "other than 404 and 416",
            figures.s3,
        )
        if figures.status is not None:
            yield from _status_families(figures.status)
        yield from m.preload_families(figures.preloads)
        if figures.prefetch is not None:
            yield from _prefetch_families(figures.prefetch)
        if figures.readers is not None:
            yield from _readers_families(figures.readers)


def _progress_of(job: dict[str, Any]) -> PreloadProgress:
    """A preload snapshot (``PreloadJob.snapshot``) as the gauges show it."""
    scanning = job["state"] == "scanning"
    return PreloadProgress(
        job_id=str(job["id"]),
        files_done=int(job["files_done"]),
        bytes_done=int(job["bytes_resident"]) + int(job["bytes_fetched"]),
        files_total=None if scanning else int(job["files_total"]),
        bytes_total=None if scanning else int(job["bytes_total"]),
        files_failed=int(job["files_failed"]),
        files_skipped=int(job["files_resident"]),
        running=job["state"] in ("scanning", "fetching"),
    )


#: Prefetcher figures (``Prefetcher.status`` keys, sums over its orders)
#: exported as gauges.  Per order figures (cursor, window size) are in
#: ``tierfs status``, not here: an order's labels would come and go with
#: each training process.
PREFETCH_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("order_count", "tierfs_prefetch_orders", "Prefetch orders followed now"),
    ("order_files", "tierfs_prefetch_order_files", "Files in the prefetch orders (0: no order)"),
    ("window", "tierfs_prefetch_window_files", "Files in the prefetch windows now"),
    ("in_flight", "tierfs_prefetch_fills_in_flight", "Prefetch fills running now"),
    ("held", "tierfs_prefetch_held_files", "Prefetched files held open for their readers"),
    ("missing", "tierfs_prefetch_order_missing_files", "Files of the orders left out"),
)
#: Prefetcher counters (since the daemon started, over every order).
PREFETCH_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("files_prefetched", "tierfs_prefetch_files", "Files the prefetcher fetched"),
    ("bytes_prefetched", "tierfs_prefetch_bytes", "Bytes the prefetcher fetched"),
    ("files_failed", "tierfs_prefetch_failed_files", "Prefetch fills that failed"),
    ("opens", "tierfs_prefetch_opens", "Opens of files in an order"),
    ("hits", "tierfs_prefetch_hits", "Opens of files the prefetcher had made resident"),
    (
        "cancelled",
        "tierfs_prefetch_cancelled_fills",
        "Prefetch fills cancelled because their file left the window unopened",
    ),
)


def _prefetch_families(prefetch: dict[str, Any]) -> Iterator[Metric]:
    """The prefetcher's figures (a ``Prefetcher.status()`` reply)."""
    for key, name, doc in PREFETCH_GAUGES:
        yield _gauge(name, doc, prefetch[key])
    for key, name, doc in PREFETCH_COUNTERS:
        yield _counter(name, doc, prefetch[key])


#: Fast reads (``ReaderLeases.status``): counters since the daemon started.
READERS_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("handed_out", "tierfs_readers_handed_out", "Tier files handed to readers (tierfs.client)"),
    (
        "refused",
        "tierfs_readers_refused",
        "Hand-outs refused past a bound (read through the mount)",
    ),
    (
        "unshared",
        "tierfs_readers_unshared",
        "Tier files copied before a write because a reader held them",
    ),
)


def _readers_families(readers: dict[str, Any]) -> Iterator[Metric]:
    """What readers outside the daemon hold (a ``ReaderLeases.status()`` reply)."""
    yield _gauge("tierfs_readers_leases", "Tier files readers hold now", readers["leases"])
    for key, name, doc in READERS_COUNTERS:
        yield _counter(name, doc, readers[key])
    held = GaugeMetricFamily(
        "tierfs_readers_held_bytes",
        "Bytes of evicted or replaced tier files readers still hold",
        labels=["tier"],
    )
    for tier, figures in readers["held"].items():
        held.add_metric([tier], figures["bytes"])
    yield held


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _status_families(status: dict[str, Any]) -> Iterator[Metric]:
    """Metric families of one ``TierFS.status()`` reply (see ``tierfs status --json``)."""
    tiers: list[dict[str, Any]] = status["tiers"]
    per_tier: list[tuple[str, str, str, type[Metric]]] = [
        ("tierfs_tier_capacity_bytes", "Tier capacity in bytes", "capacity", GaugeMetricFamily),
        ("tierfs_tier_used_bytes", "Bytes cached on the tier", "used", GaugeMetricFamily),
        ("tierfs_tier_files", "Files with blocks on the tier", "files", GaugeMetricFamily),
        (
            "tierfs_tier_high_watermark_ratio",
            "Usage above which the mover demotes",
            "high_watermark",
            GaugeMetricFamily,
        ),
        (
            "tierfs_tier_low_watermark_ratio",
            "Usage the mover brings the tier down to",
            "low_watermark",
            GaugeMetricFamily,
        ),
        (
            "tierfs_cache_hit_blocks",
            "Blocks read from the tier (cache hits)",
            "hit_blocks",
            CounterMetricFamily,
        ),
    ]
    for name, doc, key, kind in per_tier:
        family = kind(name, doc, labels=["tier"])
        for tier in tiers:
            family.add_metric([tier["name"]], tier[key])  # type: ignore[attr-defined]
        yield family

    c = status["counters"]
    tier_hits = sum(t["hit_blocks"] for t in tiers)
    yield _counter(
        "tierfs_cache_memory_hit_blocks",
        "Blocks read from the fetch buffers in memory (just fetched)",
        c["hit_blocks"] - tier_hits,
    )
    yield _counter(
        "tierfs_cache_miss_blocks", "Blocks not cached on any tier when read", c["miss_blocks"]
    )
    yield _counter("tierfs_read_requests", "Reads served", c["read_requests"])
    yield _counter("tierfs_read_bytes", "Bytes read", c["read_bytes"])
    yield _counter("tierfs_fetch_requests", "Ranged GETs of block runs", c["gets"])
    yield _counter("tierfs_fetched_bytes", "Bytes fetched from the bucket", c["fetched_bytes"])
    yield _counter("tierfs_uploaded_bytes", "Bytes uploaded to the bucket", c["uploaded_bytes"])
    yield _counter(
        "tierfs_relocated_bytes", "Bytes moved between tiers (any mover)", c["relocated_bytes"]
    )
    yield _counter("tierfs_evicted_bytes", "Bytes evicted from tiers", c["evicted_bytes"])
    yield _counter("tierfs_evicted_files", "Files evicted from tiers", c["evicted_files"])
    yield _counter(
        "tierfs_verify_failures", "Blocks that failed their checksum", c["verify_failures"]
    )
    mover: dict[str, Any] = status.get("mover") or {}
    for key, doc in (
        ("bytes_moved", "Bytes the mover moved between tiers"),
        ("files_moved", "Files the mover moved between tiers"),
        ("bytes_dropped", "Bytes the mover dropped (clean copies)"),
        ("files_dropped", "Files the mover dropped (clean copies)"),
        ("bytes_fetched", "Bytes the mover fetched (pins)"),
        ("promotions", "Files promoted to a faster tier"),
        ("passes", "Mover passes"),
    ):
        if key in mover:
            yield _counter(f"tierfs_mover_{key}", doc, mover[key])

    queues: dict[str, int] = status["queues"]
    yield _gauge(
        "tierfs_journal_entries",
        "Bucket mutations owed (uploads, copies, deletes) in the journal",
        queues["journal_entries"],
    )
    yield _gauge("tierfs_uploads_running", "Journal entries running now", queues["uploads_running"])
    yield _gauge(
        "tierfs_promotions_queued", "Files queued for promotion", queues["promotions_queued"]
    )
    yield _gauge(
        "tierfs_fetches_in_flight",
        "Blocks being fetched from the bucket",
        queues["fetches_in_flight"],
    )
    yield _gauge(
        "tierfs_dirty_bytes", "Bytes written here and not yet uploaded", status["dirty_bytes"]
    )
    yield _gauge("tierfs_open_files", "Files open or in use", status["open_files"])
    yield _gauge(
        "tierfs_failed_files", "Files whose local changes are damaged", status["failed_files"]
    )
    yield _counter(
        "tierfs_worker_restarts", "Background task restarts after errors", status["worker_restarts"]
    )
    endpoint: dict[str, Any] = status.get("endpoint") or {}
    yield _gauge(
        "tierfs_endpoint_reachable",
        "1 while the bucket's endpoint answers, else 0",
        1 if endpoint.get("state") == "reachable" else 0,
    )
    yield from _shared_tier_families(status.get("shared_tier"))
    yield from _quota_families(status.get("quotas") or [])
    requests = CounterMetricFamily(
        "tierfs_s3_requests",
        "S3 requests sent, by operation (retries included)",
        labels=["operation"],
    )
    for operation, count in sorted((status.get("store_calls") or {}).items()):
        requests.add_metric([operation], count)
    yield requests


def _quota_families(quotas: list[dict[str, Any]]) -> Iterator[Metric]:
    """The quotas (``Quotas.status``): totals over all of them, and per
    quota for those with a ``name`` (the label; a path never is one)."""
    yield _gauge("tierfs_quotas", "Directory quotas in force", len(quotas))
    yield _gauge(
        "tierfs_quotas_warning",
        "Quotas at or above their warn_at share of a limit (alert on > 0)",
        sum(1 for q in quotas if q["warning"]),
    )
    yield _gauge(
        "tierfs_quotas_full",
        "Quotas at or above a limit: growth below them fails with EDQUOT",
        sum(1 for q in quotas if q["full"]),
    )
    yield _counter(
        "tierfs_quota_refused",
        "Changes refused with EDQUOT since the daemon started, all quotas",
        sum(int(q["refused"]) for q in quotas),
    )
    named = [q for q in quotas if q.get("name")]
    per_quota: list[tuple[str, str, str]] = [
        ("tierfs_quota_used_bytes", "Bytes below the quota's directory", "bytes_used"),
        ("tierfs_quota_limit_bytes", "The quota's bytes limit (absent: none)", "bytes_limit"),
        ("tierfs_quota_used_files", "Names below the quota's directory", "files_used"),
        ("tierfs_quota_limit_files", "The quota's names limit (absent: none)", "files_limit"),
    ]
    for name, doc, field in per_quota:
        family = GaugeMetricFamily(name, doc, labels=["quota"])
        for quota in named:
            if quota[field] is not None:
                family.add_metric([quota["name"]], quota[field])
        yield family
    ratio = GaugeMetricFamily(
        "tierfs_quota_used_ratio",
        "The larger share of the quota's limits in use (1 = full)",
        labels=["quota"],
    )
    warning = GaugeMetricFamily(
        "tierfs_quota_warning", "1 while the quota is at or above warn_at", labels=["quota"]
    )
    for quota in named:
        shares = [
            quota[used] / quota[limit]
            for used, limit in (("bytes_used", "bytes_limit"), ("files_used", "files_limit"))
            if quota[limit]
        ]
        ratio.add_metric([quota["name"]], max(shares, default=0.0))
        warning.add_metric([quota["name"]], 1 if quota["warning"] else 0)
    yield ratio
    yield warning


def _shared_tier_families(shared: dict[str, Any] | None) -> Iterator[Metric]:
    """The shared tier's figures (``SharedTier.status``), when there is one."""
    if not shared:
        return
    for key, doc in (
        ("hits", "Blocks read from the shared tier"),
        ("misses", "Blocks the shared tier did not hold"),
        ("corrupt", "Shared blocks ignored for a wrong length or checksum"),
        ("errors", "Shared-tier requests that failed (the bucket served them)"),
        ("bytes_read", "Bytes read from the shared tier"),
        ("bytes_put", "Bytes put into the shared tier"),
        ("puts_dropped", "Blocks not put into the shared tier: its backlog was full"),
        ("bucket_bytes", "Bytes of fetches the bucket served while a shared tier was set"),
        ("claims", "Blocks this node claimed, to fetch them from the bucket for all nodes"),
        ("claims_held", "Blocks another node had claimed when this one missed them"),
        ("waits", "Blocks another node claimed, read here once it put them"),
        ("wait_timeouts", "Claimed blocks not put in time: this node read them from the bucket"),
        ("claims_stale", "Claims found dead or given up while waiting: taken over, or fetched"),
        ("claims_renewed", "Claims this node wrote again while still fetching their blocks"),
        ("files_shared", "Files this node uploaded and then copied into the shared tier"),
    ):
        yield _counter(f"tierfs_shared_{key}", doc, shared[key])
    endpoint: dict[str, Any] = shared.get("endpoint") or {}
    yield _gauge(
        "tierfs_shared_reachable",
        "1 while the shared tier's endpoint answers, else 0",
        1 if endpoint.get("state") == "reachable" else 0,
    )


class MetricsServer:
    """``GET /metrics`` over HTTP on the configured address, on the trio loop."""

    def __init__(self, metrics: Metrics, config: MetricsConfig) -> None:
        self.metrics = metrics
        self.config = config
        self._sock: socket.socket | None = None
        self._limiter = trio.CapacityLimiter(MAX_CONNECTIONS)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) bound (after ``bind``)."""
        if self._sock is None:
            raise RuntimeError("MetricsServer: not bound")
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def bind(self) -> None:
        """Bind the configured address now (synchronously, at start-up).

        CannotListen with one sentence if it cannot be had (in use, not an
        address of this host, a name that does not resolve).
        """
        where = self.config.listen
        try:
            infos = socket.getaddrinfo(self.config.host, self.config.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise CannotListen(f"[metrics] listen {where}: {exc.strerror}") from None
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(16)
        except OSError as exc:
            sock.close()
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise CannotListen(
                f"[metrics] listen {where}: cannot listen there ({reason})", errno=exc.errno
            ) from None
        self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer scrapes until cancelled.  A restart (supervisor) binds again."""
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        sock, self._sock = self._sock, None
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        async with listener:
            await trio.serve_listeners(self._connection, [listener], task_status=task_status)

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream, self._limiter:
            status, body, content_type = 408, b"request timeout\n", "text/plain"
            head_only = False
            with trio.move_on_after(REQUEST_TIMEOUT):
                request_line = await _read_request_line(stream)
                status, body, content_type, head_only = await self._answer(request_line)
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
            head = (
                f"HTTP/1.1 {status} {reason.get(status, 'Request Timeout')}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode("ascii")
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                with trio.move_on_after(REQUEST_TIMEOUT):
                    await stream.send_all(head if head_only else head + body)

    async def _answer(self, request_line: bytes | None) -> tuple[int, bytes, str, bool]:
        """(status, body, content type, head only) for one request line."""
        parts = request_line.split() if request_line else []
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, b"bad request\n", "text/plain", False
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            return 405, b"only GET\n", "text/plain", False
        if target.split(b"?", 1)[0] != b"/metrics":
            return 404, b"tierfs: metrics are at /metrics\n", "text/plain", method == b"HEAD"
        return 200, await self.metrics.scrape(), CONTENT_TYPE_LATEST, method == b"HEAD"


async def _read_request_line(stream: trio.SocketStream) -> bytes | None:
    """The request line, once the whole head has arrived; None if malformed."""
    buf = bytearray()
    while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_REQUEST_HEAD:
            return None
    return bytes(buf.split(b"\n", 1)[0]).rstrip(b"\r")
