"""The shared tier through real mounts: two nodes on one machine (each its
own state and tiers) over one backing bucket (moto) and one shared bucket
on a SeaweedFS cluster.  The second node reads what the first fetched from
the shared tier, not from the bucket."""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

import pytest

from tests.faults import FaultProxy
from tests.fuse.conftest import (
    MountFactory,
    run_tierfs,
)
from tests.seaweed_cluster import SeaweedCluster

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024


def shared_toml(seaweed: SeaweedCluster) -> str:
    bucket = f"shared-{uuid.uuid4().hex[:10]}"
    seaweed.client().create_bucket(Bucket=bucket)
    return (
        "\n[[tiers]]\n"
        'name = "cluster"\n'
        f'url = "s3://{bucket}/nodes"\n'
        f'endpoint_url = "{seaweed.endpoint}"\n'
        'region = "us-east-1"\n'
    )


def shared_status(m: Any) -> dict[str, Any]:
    section: dict[str, Any] = m.status()["shared_tier"]
    return section


def test_a_second_node_reads_a_checkpoint_from_the_shared_tier(
    mount: MountFactory, seaweed: SeaweedCluster
) -> None:
    data = os.urandom(6 * MiB + 777)
    extra = shared_toml(seaweed)
    first = mount({"ckpt/step-100/model.pt": data}, extra_config=extra)
    with open(first.path / "ckpt/step-100/model.pt", "rb") as f:
        assert f.read() == data
    deadline = time.monotonic() + 30
    while shared_status(first)["puts"] < 7:
        assert time.monotonic() < deadline, shared_status(first)
        time.sleep(0.1)
    assert shared_status(first)["bucket_bytes"] == len(data)
    assert first.status()["store_calls"].get("GetObject", 0) > 0  # what the check below counts

    second = mount(extra_config=extra)
    with open(second.path / "ckpt/step-100/model.pt", "rb") as f:
        assert f.read() == data
    status = shared_status(second)
    assert status["name"] == "cluster"
    assert status["bucket_bytes"] == 0, status
    assert status["bytes_read"] == len(data) and status["hits"] == 7
    shown = run_tierfs("status", str(second.path))
    assert shown.returncode == 0, shown.stderr
    assert "shared:   cluster s3://" in shown.stdout and "7 hits" in shown.stdout, shown.stdout
    calls = second.status()["store_calls"]
    assert calls.get("GetObject", 0) == 0 and calls, calls  # no GET reached the bucket


def test_a_checkpoint_written_on_one_node_is_read_by_another_from_the_shared_tier(
    mount: MountFactory, seaweed: SeaweedCluster
) -> None:
    """Written, closed and flushed on one mount; copied into the shared tier
    after its upload; read on a fresh mount with no GET of the bucket.  And
    ``tierfs preload --tier cluster`` warms the shared tier for a file the
    node never read, filling none of its own tiers."""
    data = os.urandom(9 * MiB + 5)
    extra = shared_toml(seaweed)
    writer = mount({"data/shard.bin": os.urandom(3 * MiB)}, extra_config=extra)
    (writer.path / "ckpt").mkdir()
    with open(writer.path / "ckpt/step-7.pt", "wb") as f:
        f.write(data)
    flushed = run_tierfs("flush", str(writer.path / "ckpt/step-7.pt"))
    assert flushed.returncode == 0, flushed.stderr
    deadline = time.monotonic() + 30
    while shared_status(writer)["files_shared"] < 1:
        assert time.monotonic() < deadline, shared_status(writer)
        time.sleep(0.1)
    preloaded = run_tierfs("preload", "--tier", "cluster", str(writer.path / "data"))
    assert preloaded.returncode == 0, preloaded.stderr + preloaded.stdout
    where = run_tierfs("where", "--json", str(writer.path / "data/shard.bin"))
    assert where.returncode == 0 and '"cached_bytes": 0' in where.stdout, where.stdout

    reader = mount(extra_config=extra)
    with open(reader.path / "ckpt/step-7.pt", "rb") as f:
        assert f.read() == data
    with open(reader.path / "data/shard.bin", "rb") as f:
        assert len(f.read()) == 3 * MiB
    status = shared_status(reader)
    assert status["bucket_bytes"] == 0 and status["hits"] == 10 + 3, status
    calls = reader.status()["store_calls"]
    assert calls.get("GetObject", 0) == 0, calls


def test_a_shared_tier_without_conditional_writes_is_refused_at_mount_and_by_policy_check(
    mount: MountFactory, s3_client: Any, fault_proxy: FaultProxy
) -> None:
    """A store that ignores ``If-None-Match: *`` (moto behind a proxy that
    drops the header) would let every node win every claim: fetch-once
    silently gone.  The mount refuses it, naming the feature, and so does
    ``tierfs policy check`` on the node; nothing is mounted."""
    bucket = f"shared-{uuid.uuid4().hex[:10]}"
    s3_client.create_bucket(Bucket=bucket)
    fault_proxy.strip_request_headers("If-None-Match")
    extra = (
        "\n[[tiers]]\n"
        'name = "cluster"\n'
        f'url = "s3://{bucket}/nodes"\n'
        f'endpoint_url = "http://127.0.0.1:{fault_proxy.port}"\n'
        'region = "us-east-1"\n'
    )
    m = mount(extra_config=extra, do_mount=False)
    done = run_tierfs("mount", str(m.config_path), str(m.path))
    assert done.returncode == 1, done.stdout
    assert "does not honour If-None-Match: *" in done.stderr, done.stderr
    assert not os.path.ismount(m.path)
    checked = run_tierfs("policy", "check", str(m.config_path))
    assert checked.returncode == 1
    assert "does not honour If-None-Match: *" in checked.stderr, checked.stderr
    fault_proxy.strip_request_headers()  # a store that has them: both pass
    assert run_tierfs("policy", "check", str(m.config_path)).returncode == 0
    m.mount()
    assert m.status()["shared_tier"]["fan_out"] == "on"


def test_a_preload_into_the_shared_tier_lets_demand_reads_through_within_twice_idle(
    mount: MountFactory, seaweed: SeaweedCluster, fault_proxy: FaultProxy
) -> None:
    """``tierfs preload --tier cluster`` of a slow prefix (its GETs paced,
    one file per second, as in tests/fuse/test_preload_latency.py) while
    cold small files are read: their median latency stays within twice
    that of the same reads with nothing running.  Each of the preload's
    GETs holds a background fetch slot of its own (``[fetch] concurrency
    = 2``), so a demand read never queues behind it."""
    from tests.fuse.test_preload_latency import (
        DELAY,
        PRELOADED,
        READS,
        SMALL,
        reads_beside_a_paced_preload,
    )

    small = {f"lat/f{i:02d}.bin": os.urandom(SMALL) for i in range(2 * READS)}
    bulk = {f"bulk/f{i:03d}.bin": os.urandom(SMALL) for i in range(PRELOADED)}
    m = mount(
        {**small, **bulk},
        extra_config=shared_toml(seaweed),
        nvme="256MiB",
        block_size="1MiB",
        list_ttl="600s",
        revalidate_ttl="600s",
        endpoint_url=fault_proxy.endpoint,
        fetch_concurrency=2,
        dir_readahead=0,
    )
    names = sorted(os.listdir(m.path / "lat"))
    assert len(names) == 2 * READS
    assert len(os.listdir(m.path / "bulk")) == PRELOADED
    idle, during, preload_ran_throughout, job = reads_beside_a_paced_preload(
        m, fault_proxy, names, ["--tier", "cluster"]
    )
    for name in names:
        assert (m.path / "lat" / name).read_bytes() == small[f"lat/{name}"]
    idle_median, during_median = statistics.median(idle), statistics.median(during)
    print(
        f"\ncold {SMALL // 1024} KiB reads beside a shared-tier preload: idle median "
        f"{1e3 * idle_median:.0f} ms, during {1e3 * during_median:.0f} ms; "
        f"{job['files_done']} files preloaded, {fault_proxy.held} GETs held"
    )
    assert min(idle + during) >= DELAY  # each read went to the bucket
    assert during_median <= 2 * idle_median, (idle, during)
    assert fault_proxy.held > 0 and preload_ran_throughout
    assert job["state"] == "fetching" and job["files_done"] < PRELOADED
