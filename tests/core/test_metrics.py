"""Metrics over a real TierFS and a real S3 server (moto), no mount.

Each test reads the registry's text exposition, parsed with
prometheus-client's own parser, and checks that values move as operations
happen, and that they agree with ``TierFS.status()``.
"""

from __future__ import annotations

import errno
import io
import os
import socket
import urllib.error
import urllib.request
from typing import Any

import pyfuse3
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from tierfsd.fuse_ops import TierfsOperations

from tests.core.conftest import CoreMount, MiB, put
from tests.core.test_prefetch import FILE_BYTES, put_files, settled
from tests.faults import FaultProxy
from tierfs.config import MetricsConfig
from tierfs.errors import CannotListen
from tierfs.metrics import PREFETCH_COUNTERS, PREFETCH_GAUGES, Metrics, MetricsServer
from tierfs.store.retry import RetryPolicy
from tierfs.store.s3 import S3Store
from tierfs.watch import render_status
from tierfs.workers.wiring import prefetcher_for, preloader_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: Metrics) -> Samples:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    text = metrics.exposition().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def watched(make_fs: Any, **overrides: Any) -> tuple[CoreMount, Metrics]:
    mount: CoreMount = await make_fs(**overrides)
    metrics = Metrics()
    metrics.watch(mount.fs)
    mount.store.inner.request_observer = metrics.s3_request
    return mount, metrics


async def settle(mount: CoreMount) -> None:
    """Wait until no fetch (readahead included) is in flight."""
    with trio.fail_after(10):
        while any(cf.flights for cf in mount.fs.open_files.files.values()):
            await trio.sleep(0.01)


async def test_read_miss_then_hit(make_fs: Any, s3_store: Any) -> None:
    data = os.urandom(3 * MiB)
    put(s3_store, "data/three.bin", data)
    mount, metrics = await watched(make_fs)
    before = scrape(metrics)
    assert value(before, "tierfs_cache_miss_blocks_total") == 0
    assert value(before, "tierfs_fetched_bytes_total") == 0

    assert await mount.read_file("data/three.bin") == data
    await settle(mount)
    cold = scrape(metrics)
    assert value(cold, "tierfs_cache_miss_blocks_total") == 3
    assert value(cold, "tierfs_fetched_bytes_total") == len(data)
    assert value(cold, "tierfs_read_bytes_total") == len(data)
    assert value(cold, "tierfs_s3_request_seconds_count", operation="GetObject") >= 1
    assert value(cold, "tierfs_s3_requests_total", operation="GetObject") == value(
        cold, "tierfs_s3_request_seconds_count", operation="GetObject"
    )
    assert value(cold, "tierfs_tier_used_bytes", tier="nvme") == len(data)

    assert await mount.read_file("data/three.bin") == data
    warm = scrape(metrics)
    assert value(warm, "tierfs_cache_miss_blocks_total") == 3, "a hit is no miss"

    def hits(samples: Samples) -> float:
        return value(samples, "tierfs_cache_hit_blocks_total", tier="nvme") + value(
            samples, "tierfs_cache_memory_hit_blocks_total"
        )

    # Hits count block lookups: each 128 KiB read falls in one block.
    assert hits(warm) - hits(cold) == 24
    assert value(warm, "tierfs_fetched_bytes_total") == len(data)

    # After a remount the fetch buffers are gone: the hits come from the tier.
    mount = await mount.remount()
    metrics = Metrics()
    metrics.watch(mount.fs)
    assert await mount.read_file("data/three.bin") == data
    remounted = scrape(metrics)
    assert value(remounted, "tierfs_read_requests_total") == 24
    assert value(remounted, "tierfs_cache_hit_blocks_total", tier="nvme") == 24
    assert value(remounted, "tierfs_cache_hit_blocks_total", tier="hdd") == 0
    assert value(remounted, "tierfs_cache_miss_blocks_total") == 0


async def test_upload_counts_bytes_and_empties_the_queues(make_fs: Any) -> None:
    mount, metrics = await watched(make_fs)
    data = os.urandom(MiB + 1234)
    await mount.write_file("model.pt", data)
    await mount.flush()
    flushed = scrape(metrics)
    assert value(flushed, "tierfs_uploaded_bytes_total") == len(data)
    assert value(flushed, "tierfs_s3_request_seconds_count", operation="PutObject") >= 1
    assert value(flushed, "tierfs_dirty_bytes") == 0
    assert value(flushed, "tierfs_journal_entries") == 0
    assert value(flushed, "tierfs_fetches_in_flight") == 0
    assert value(flushed, "tierfs_promotions_queued") == 0


async def test_dirty_bytes_and_journal_follow_a_write(make_fs: Any) -> None:
    # A long upload delay keeps the file dirty while we look.
    from tierfs.config import WriteConfig

    mount, metrics = await watched(
        make_fs, write=WriteConfig(mode="back", upload_delay=60, part_size=8 * MiB)
    )
    data = os.urandom(300_000)
    await mount.write_file("dirty.bin", data)
    samples = scrape(metrics)
    assert value(samples, "tierfs_dirty_bytes") == len(data)
    assert value(samples, "tierfs_journal_entries") >= 1
    assert value(samples, "tierfs_uploaded_bytes_total") == 0


async def test_scrape_matches_status(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "a.bin", os.urandom(2 * MiB))
    mount, metrics = await watched(make_fs)
    await mount.read_file("a.bin")
    await settle(mount)
    await mount.write_file("b.bin", os.urandom(100_000))
    samples = scrape(metrics)
    status = mount.fs.status()
    for tier in status["tiers"]:
        name = tier["name"]
        assert value(samples, "tierfs_tier_used_bytes", tier=name) == tier["used"]
        assert value(samples, "tierfs_tier_capacity_bytes", tier=name) == tier["capacity"]
        assert value(samples, "tierfs_tier_files", tier=name) == tier["files"]
        assert value(samples, "tierfs_cache_hit_blocks_total", tier=name) == tier["hit_blocks"]
    counters = status["counters"]
    assert value(samples, "tierfs_cache_miss_blocks_total") == counters["miss_blocks"]
    assert value(samples, "tierfs_fetched_bytes_total") == counters["fetched_bytes"]
    assert value(samples, "tierfs_relocated_bytes_total") == counters["relocated_bytes"]
    assert value(samples, "tierfs_dirty_bytes") == status["dirty_bytes"]
    assert value(samples, "tierfs_journal_entries") == status["queues"]["journal_entries"]
    for operation, count in status["store_calls"].items():
        assert value(samples, "tierfs_s3_requests_total", operation=operation) == count
    for operation, figures in status["s3_requests"].items():
        assert (
            value(samples, "tierfs_s3_request_seconds_count", operation=operation)
            == figures["requests"]
        )
    # The status sections come from the same registry.
    assert status["s3_requests"]["GetObject"]["requests"] >= 1
    assert "fuse_requests" in status and "s3_requests" in status


async def test_s3_errors_are_counted_per_operation(
    bucket: tuple[str, str], fault_proxy: FaultProxy
) -> None:
    _, name = bucket
    metrics = Metrics()
    store = S3Store(
        f"s3://{name}/pre/",
        endpoint_url=f"http://127.0.0.1:{fault_proxy.port}",
        retry=RetryPolicy(max_attempts=4, budget=10.0, base_delay=0.01, max_delay=0.05),
        request_observer=metrics.s3_request,
    )
    try:
        await trio.to_thread.run_sync(store.put, "k", b"hello")
        fault_proxy.refuse_requests(2, status="503", match=lambda line: line.startswith("GET"))
        assert await trio.to_thread.run_sync(store.get_range, "k", 0, 5) == b"hello"
        assert fault_proxy.faults_injected >= 2
        samples = scrape(metrics)
        assert value(samples, "tierfs_s3_errors_total", operation="GetObject") == 2
        assert value(samples, "tierfs_s3_request_seconds_count", operation="GetObject") == 3
        assert value(samples, "tierfs_s3_errors_total", operation="PutObject") == 0
        assert value(samples, "tierfs_s3_request_seconds_count", operation="PutObject") == 1
        # A missing key is an answer, not an error.
        with pytest.raises(Exception, match="no such key"):
            await trio.to_thread.run_sync(store.head, "missing")
        assert value(scrape(metrics), "tierfs_s3_errors_total", operation="HeadObject") == 0
        # No answer at all is an error too.
        fault_proxy.refuse()
        with pytest.raises(Exception):  # noqa: B017 - the StoreError class does not matter
            await trio.to_thread.run_sync(store.head, "k")
        assert value(scrape(metrics), "tierfs_s3_errors_total", operation="HeadObject") >= 1
    finally:
        fault_proxy.restore()
        store.close()


async def test_fuse_ops_are_timed_and_failures_counted(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "f.bin", b"x" * 1000)
    mount, metrics = await watched(make_fs)
    ops = TierfsOperations(mount.fs, metrics)
    root = pyfuse3.ROOT_INODE
    entry = await ops.lookup(root, b"f.bin")
    await ops.getattr(entry.st_ino)
    # An absent name of a fresh listing: a negative entry (inode 0), not an error.
    missing = await ops.lookup(root, b"nope")
    assert missing.st_ino == 0 and missing.entry_timeout > 0
    with pytest.raises(pyfuse3.FUSEError) as not_a_link:
        await ops.readlink(entry.st_ino, None)
    assert not_a_link.value.errno == errno.EINVAL
    samples = scrape(metrics)
    assert value(samples, "tierfs_fuse_request_seconds_count", operation="lookup") == 2
    assert value(samples, "tierfs_fuse_request_seconds_count", operation="getattr") == 1
    assert value(samples, "tierfs_fuse_request_seconds_count", operation="readlink") == 1
    assert value(samples, "tierfs_fuse_errors_total", operation="lookup") == 0
    assert value(samples, "tierfs_fuse_errors_total", operation="readlink") == 1
    assert value(samples, "tierfs_fuse_request_seconds_sum", operation="lookup") > 0
    summary = mount.fs.status()["fuse_requests"]
    assert summary["lookup"]["requests"] == 2
    assert summary["readlink"]["errors"] == 1


async def test_preload_jobs_are_exported_as_they_stand(make_fs: Any, s3_store: Any) -> None:
    mount, metrics = await watched(make_fs)
    for i in range(3):
        put(s3_store, f"ds/f{i}.bin", bytes([i]) * 1000)
    preloader = preloader_for(mount.fs)
    metrics.watch_preloads(preloader.status)
    assert not [
        f
        for f in text_string_to_metric_families(metrics.exposition().decode())
        if f.name.startswith("tierfs_preload")
    ]
    async with trio.open_nursery() as nursery:
        await nursery.start(preloader.run)
        spool = preloader.new_spool()
        spool.add("ds")
        job = preloader.start(spool, ["ds"], None)
        with trio.fail_after(30):
            await job.done.wait()
        nursery.cancel_scope.cancel()
    samples = scrape(metrics)
    assert value(samples, "tierfs_preload_files_done", job_id=job.id) == 3
    assert value(samples, "tierfs_preload_files_total", job_id=job.id) == 3
    assert value(samples, "tierfs_preload_bytes_done", job_id=job.id) == 3000
    assert value(samples, "tierfs_preload_bytes_total", job_id=job.id) == 3000
    assert value(samples, "tierfs_preload_running", job_id=job.id) == 0
    assert ("tierfs_preload_running", (("job_id", job.id),)) in samples


def prefetch_series(samples: Samples) -> list[str]:
    return sorted({name for name, _labels in samples if name.startswith("tierfs_prefetch")})


async def test_prefetcher_figures_are_exported_as_status_shows_them(
    make_fs: Any, s3_store: Any
) -> None:
    mount, metrics = await watched(make_fs)
    paths = put_files(s3_store, 12)
    assert prefetch_series(scrape(metrics)) == []  # no prefetcher, no series
    async with trio.open_nursery() as nursery:
        prefetcher = prefetcher_for(mount.fs, window_files=4)
        await nursery.start(prefetcher.run)
        spool = prefetcher.new_spool()
        for path in [*paths, "ds/missing.bin"]:
            spool.add(path)
        await prefetcher.load_order(spool)
        await settled(prefetcher)
        for path in paths[:3]:  # a reader in order: the window was resident
            await mount.read_file(path)
        await settled(prefetcher)
        await mount.read_file(paths[8])  # the window has not reached it: a miss
        # No await from here on: the scrape and status see the same moment.
        samples = scrape(metrics)
        status = mount.fs.status()["prefetch"]
        assert status == prefetcher.status()
        for key, name, _doc in PREFETCH_GAUGES:
            assert value(samples, name) == status[key], name
        for key, name, _doc in PREFETCH_COUNTERS:
            assert value(samples, f"{name}_total") == status[key], name
        assert value(samples, "tierfs_prefetch_order_files") == 12
        assert value(samples, "tierfs_prefetch_order_missing_files") == 1
        assert value(samples, "tierfs_prefetch_orders") == 1
        assert value(samples, "tierfs_prefetch_opens_total") == 4
        assert value(samples, "tierfs_prefetch_hits_total") == 3
        assert value(samples, "tierfs_prefetch_files_total") >= 7
        assert (
            value(samples, "tierfs_prefetch_bytes_total")
            == value(samples, "tierfs_prefetch_files_total") * FILE_BYTES
        )
        # The order ends: no order, and the counters do not go back.
        opens = value(samples, "tierfs_prefetch_opens_total")
        await prefetcher.load_order(prefetcher.new_spool())
        samples = scrape(metrics)
        assert value(samples, "tierfs_prefetch_orders") == 0
        assert value(samples, "tierfs_prefetch_order_files") == 0
        assert value(samples, "tierfs_prefetch_opens_total") == opens
        nursery.cancel_scope.cancel()
    # The prefetcher stopped: its section and its series are gone.
    assert "prefetch" not in mount.fs.status()
    assert prefetch_series(scrape(metrics)) == []


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


async def test_http_endpoint_serves_the_registry(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "secret-dir/secret-name.bin", os.urandom(MiB))
    mount, metrics = await watched(make_fs)
    await mount.read_file("secret-dir/secret-name.bin")
    server = MetricsServer(metrics, MetricsConfig(listen="127.0.0.1:0", host="127.0.0.1", port=0))
    server.bind()
    host, port = server.address
    assert host == "127.0.0.1" and port > 0
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        status, ctype, text = await trio.to_thread.run_sync(_get, f"http://{host}:{port}/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["tierfs_cache_miss_blocks"].samples[0].value == 1
        assert all(name.startswith("tierfs_") for name in families)
        assert "secret" not in text and s3_store.url not in text
        status, _, _ = await trio.to_thread.run_sync(_get, f"http://{host}:{port}/")
        assert status == 404
        # A client that never finishes its request does not block the others.
        with socket.create_connection((host, port)) as idle:
            idle.sendall(b"GET /metrics HTTP/1.1\r\n")
            status, _, _ = await trio.to_thread.run_sync(_get, f"http://{host}:{port}/metrics?x=1")
            assert status == 200
        nursery.cancel_scope.cancel()


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = MetricsServer(
            Metrics(),
            MetricsConfig(listen=f"127.0.0.1:{port}", host="127.0.0.1", port=port),
        )
        with pytest.raises(CannotListen, match="address already in use"):
            server.bind()


def test_registries_are_private() -> None:
    one, two = Metrics(), Metrics()
    one.s3_request("GetObject", 0.01, False)
    assert value(scrape(one), "tierfs_s3_request_seconds_count", operation="GetObject") == 1
    assert value(scrape(two), "tierfs_s3_request_seconds_count", operation="GetObject") == 0


async def test_watch_renders_rates_from_two_status_replies(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "w.bin", os.urandom(2 * MiB))
    mount, metrics = await watched(make_fs)
    ops = TierfsOperations(mount.fs, metrics)
    before = mount.fs.status()
    for _ in range(4):
        await ops.getattr(pyfuse3.ROOT_INODE)
    await mount.read_file("w.bin")
    await settle(mount)
    now = mount.fs.status()
    now["preloads"] = [  # as the control server adds them (``PreloadJob.snapshot``)
        {
            "id": "job-7",
            "state": "fetching",
            "files_done": 1,
            "files_total": 2,
            "files_failed": 0,
            "bytes_resident": 0,
            "bytes_fetched": MiB,
            "bytes_total": 2 * MiB,
        }
    ]
    now["time"] = before["time"] + 2.0  # a fixed interval: 2 MiB read in 2 s

    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render_status(now, before))
    text = console.export_text()
    assert table_row(text, "nvme")[1] == "2 MiB", text
    read = table_row(text, "read")
    assert read[1] == "1 MiB/s" and "misses 1.0/s" in read[2]
    assert table_row(text, "getattr")[1:3] == ["2.0/s", "0.0/s"]
    assert table_row(text, "GetObject")[4] == "2"
    assert table_row(text, "job-7")[1:5] == ["1/2", "1 MiB/2 MiB (50%)", "0", "fetching"]

    # The first frame has no previous reply: totals, and "-" for rates.
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render_status(now))
    first = console.export_text()
    assert table_row(first, "read")[1] == "-"
    assert table_row(first, "getattr")[1] == "4", "totals on the first frame"


def table_row(text: str, first: str) -> list[str]:
    """The cells of the rendered table row whose first cell is ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


async def test_reader_figures_are_exported_as_status_shows_them(
    make_fs: Any, s3_store: Any
) -> None:
    from tierfs.core.names.access import Caller
    from tierfs.core.read.handout import Handed

    mount, metrics = await watched(make_fs)
    put(s3_store, "r.bin", b"r" * 5000)
    ino = (await mount.fs.namespace.resolve("r.bin")).ino
    await mount.fs.movement.fill(ino, 0)
    got = await mount.fs.handout.hand_out("r.bin", Caller(0, frozenset({0})), connection=1)
    assert isinstance(got, Handed)
    os.close(got.fd)
    samples = scrape(metrics)
    status = mount.fs.leases.status()
    assert value(samples, "tierfs_readers_leases") == status["leases"] == 1
    assert value(samples, "tierfs_readers_handed_out_total") == status["handed_out"] == 1
    assert value(samples, "tierfs_readers_refused_total") == 0
    assert value(samples, "tierfs_readers_held_bytes", tier="nvme") == 0
    mount.fs.leases.end_connection(1)
    assert value(scrape(metrics), "tierfs_readers_leases") == 0
