"""The metrics reference (docs/metrics.md) names every series the daemon
exports, and only those: one TierFS with every part that has series (the
shared tier, quotas, the mover, a preload, a prefetch order, a reader's
lease, FUSE and S3 requests) is scraped, and the names are compared with
the reference's table.  ``tests/unit/test_dashboard.py`` then checks the
dashboard and alert rules against the same table."""

from __future__ import annotations

import os
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.core.conftest import MiB, put
from tests.core.test_prefetch import put_files, settled
from tests.core.test_preload import run_preload
from tests.core.test_shared_tier import shared_config, wait_puts
from tests.seaweed_cluster import SeaweedCluster
from tests.unit.test_dashboard import documented
from tierfs.config import QuotaConfig
from tierfs.metrics import Metrics
from tierfs.workers.wiring import mover_for, prefetcher_for, preloader_for


def exported_series(text: str) -> dict[str, str]:
    """The series of an exposition, as the reference names them: counters
    with ``_total``, histograms by their family name."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            out[f"{family.name}_total"] = "counter"
        else:
            out[family.name] = family.type
    return out


async def test_every_exported_series_is_in_the_reference_and_nothing_else(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    quota = QuotaConfig(path="ds", source="test", name="ds", bytes=64 * MiB, files=1000)
    mount = await make_fs(shared_tier=shared_config(seaweed), quotas=[quota])
    metrics = Metrics()
    metrics.watch(mount.fs)
    mount.store.inner.request_observer = metrics.s3_request
    metrics.fuse_ops.record("read", 0.001, False)
    metrics.fuse_ops.record("lookup", 0.001, True)
    put(s3_store, "ds/big.bin", os.urandom(2 * MiB))
    paths = put_files(s3_store, 6)
    assert len(await mount.read_file("ds/big.bin")) == 2 * MiB
    await wait_puts(mount, 2)
    mover = mover_for(mount.fs)
    preloader = preloader_for(mount.fs)
    metrics.watch_preloads(preloader.status)
    async with trio.open_nursery() as nursery:
        await nursery.start(mover.run)
        await run_preload(nursery, mount, ["ds"], preloader=preloader)
        prefetcher = prefetcher_for(mount.fs, window_files=2)
        await nursery.start(prefetcher.run)
        spool = prefetcher.new_spool()
        for path in paths:
            spool.add(path)
        await prefetcher.load_order(spool)
        await settled(prefetcher)
        text = metrics.exposition().decode()
        nursery.cancel_scope.cancel()
    exported = exported_series(text)
    reference = documented()
    assert sorted(set(exported) - set(reference)) == [], "exported, not in docs/metrics.md"
    assert sorted(set(reference) - set(exported)) == [], "in docs/metrics.md, not exported"
    assert exported == reference, "a series' type differs from the reference's"
