"""Faults of the shared tier through real mounts, each on a cluster of its
own: a volume server killed under a read wave, and the whole cluster gone.
Reads go on from the bucket, right, within the foreground budget."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator

import pytest

from tests.fuse.conftest import MountFactory
from tests.fuse.test_shared_tier import shared_status, shared_toml
from tests.seaweed_cluster import SeaweedCluster

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
#: A read must not wait on the shared tier longer than this (the store's
#: foreground budget, see tierfs.store.s3).
FOREGROUND_BUDGET = 5.0


@pytest.fixture
def private_cluster() -> Iterator[SeaweedCluster]:
    with SeaweedCluster() as cluster:
        yield cluster


def read_timed(path: os.PathLike[str] | str) -> tuple[bytes, float]:
    started = time.monotonic()
    with open(path, "rb") as f:
        data = f.read()
    return data, time.monotonic() - started


def wait_puts(m: object, count: int) -> None:
    deadline = time.monotonic() + 30
    while shared_status(m)["puts"] < count:
        assert time.monotonic() < deadline, shared_status(m)
        time.sleep(0.1)


def test_a_volume_server_killed_during_a_read_wave_serves_nothing_wrong(
    mount: MountFactory, private_cluster: SeaweedCluster
) -> None:
    files = {f"shard/{i:02d}.bin": os.urandom(2 * MiB) for i in range(8)}
    extra = shared_toml(private_cluster)
    first = mount(files, extra_config=extra)
    for name in files:
        read_timed(first.path / name)
    wait_puts(first, 16)
    second = mount(extra_config=extra)
    fullest = max(range(private_cluster.volumes), key=private_cluster.volume_bytes)
    for index, (name, body) in enumerate(files.items()):
        if index == 2:
            private_cluster.stop_volume(fullest)  # in the middle of the wave
        data, took = read_timed(second.path / name)
        assert hashlib.sha256(data).digest() == hashlib.sha256(body).digest(), name
        assert took < FOREGROUND_BUDGET + 2, (name, took)
    status = shared_status(second)
    assert status["hits"] > 0, status  # before the kill, and from the other server
    assert status["bucket_bytes"] > 0, status  # what the dead server held came from the bucket


def test_reads_fall_back_to_the_bucket_when_the_whole_cluster_stops(
    mount: MountFactory, private_cluster: SeaweedCluster
) -> None:
    body = os.urandom(4 * MiB)
    extra = shared_toml(private_cluster)
    first = mount({"ckpt.pt": body}, extra_config=extra)
    read_timed(first.path / "ckpt.pt")
    wait_puts(first, 4)
    private_cluster.stop()
    second = mount(extra_config=extra)
    data, took = read_timed(second.path / "ckpt.pt")
    assert data == body
    assert took < FOREGROUND_BUDGET, took
    status = shared_status(second)
    assert status["errors"] >= 1 and status["hits"] == 0, status
    assert status["bucket_bytes"] == len(body), status
