"""The per-operation latency tables of tierfs.metrics, read back
through prometheus-client's own parser of the text exposition."""

from __future__ import annotations

import errno
import threading

from prometheus_client.parser import text_string_to_metric_families

from tierfs.metrics import FUSE_BUCKETS, Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def bucket(values: dict, name: str, operation: str, le: str) -> float:
    return values[(f"{name}_bucket", (("le", le), ("operation", operation)))]


def test_buckets_are_cumulative_and_bounds_inclusive() -> None:
    metrics = Metrics()
    read = metrics.fuse_ops["read"]
    read.observe(0.0001)  # exactly a bound: counted in that bucket ("le")
    read.observe(0.00003)
    read.observe(20.0)  # past the last bound: +Inf only
    values = samples(metrics)
    name = "tierfs_fuse_request_seconds"
    assert bucket(values, name, "read", "5e-05") == 1
    assert bucket(values, name, "read", "0.0001") == 2
    assert bucket(values, name, "read", str(FUSE_BUCKETS[-1])) == 2
    assert bucket(values, name, "read", "+Inf") == 3
    assert values[(f"{name}_count", (("operation", "read"),))] == 3
    assert abs(values[(f"{name}_sum", (("operation", "read"),))] - 20.00013) < 1e-9


def test_ordinary_errnos_are_not_failures() -> None:
    metrics = Metrics()
    lookup = metrics.fuse_ops["lookup"]
    lookup.failed(errno.ENOENT)
    lookup.failed(errno.ENODATA)
    lookup.failed(errno.EIO)
    assert samples(metrics)[("tierfs_fuse_errors_total", (("operation", "lookup"),))] == 1
    assert metrics.fuse_ops.summary()["lookup"]["errors"] == 1


def test_s3_table_counts_every_request_from_many_threads() -> None:
    metrics = Metrics()
    per_thread = 5000

    def worker(n: int) -> None:
        for i in range(per_thread):
            metrics.s3_request("GetObject" if n % 2 else "HeadObject", 0.01, i % 10 == 0)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    values = samples(metrics)
    for op in ("GetObject", "HeadObject"):
        assert values[("tierfs_s3_request_seconds_count", (("operation", op),))] == 4 * per_thread
        assert bucket(values, "tierfs_s3_request_seconds", op, "+Inf") == 4 * per_thread
        assert values[("tierfs_s3_errors_total", (("operation", op),))] == 4 * per_thread // 10
    assert metrics.s3_ops.summary()["GetObject"]["requests"] == 4 * per_thread
