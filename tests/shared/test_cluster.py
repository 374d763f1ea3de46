"""The SeaweedFS cluster the shared-tier tests run on, and the S3 features
the shared tier relies on: separate processes, conditional PUTs that let
exactly one of many racing nodes claim a block, user metadata on GET, and
reads that go on when one volume server dies."""

from __future__ import annotations

import concurrent.futures
import os
import time
import uuid
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.seaweed_cluster import SeaweedCluster

CLAIMERS = 16


@pytest.fixture
def shared_bucket(seaweed: SeaweedCluster) -> tuple[Any, str]:
    client = seaweed.client()
    name = f"t-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return client, name


def test_the_cluster_is_separate_processes_on_loopback(seaweed: SeaweedCluster) -> None:
    procs = seaweed._processes
    assert sorted(procs) == ["filer", "master", "s3", "volume0", "volume1"]
    pids = {p.proc.pid for p in procs.values() if p.proc is not None}
    assert len(pids) == 5 and all(p.running() for p in procs.values())
    assert seaweed.endpoint.startswith("http://127.0.0.1:")


def test_one_of_many_concurrent_conditional_puts_wins(
    seaweed: SeaweedCluster, shared_bucket: tuple[Any, str]
) -> None:
    """``If-None-Match: *``: the claim a node makes before it fetches a
    block from the bucket for everyone.  Of 16 racing PUTs of one key,
    exactly one succeeds and the others get 412, for each of 8 keys."""
    _client, bucket = shared_bucket

    def claim(key: str, who: int) -> int:
        client = seaweed.client()  # one connection pool per claimer
        try:
            client.put_object(Bucket=bucket, Key=key, Body=str(who).encode(), IfNoneMatch="*")
        except ClientError as exc:
            return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        return 200

    for round_ in range(8):
        key = f"claims/block-{round_}"
        with concurrent.futures.ThreadPoolExecutor(CLAIMERS) as pool:
            codes = list(pool.map(lambda who, key=key: claim(key, who), range(CLAIMERS)))
        assert codes.count(200) == 1, codes
        assert set(codes) <= {200, 412}, codes
        winner = _client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert 0 <= int(winner) < CLAIMERS


def test_user_metadata_comes_back_with_a_get(shared_bucket: tuple[Any, str]) -> None:
    """A shared block carries its checksum as user metadata: a GET must
    return it, so that checking a block costs no HEAD."""
    client, bucket = shared_bucket
    body = bytes(range(256)) * 4096
    client.put_object(Bucket=bucket, Key="b/0", Body=body, Metadata={"xxh3": "0123abcd"})
    got = client.get_object(Bucket=bucket, Key="b/0")
    assert got["Metadata"] == {"xxh3": "0123abcd"}
    assert got["Body"].read() == body


def test_reads_after_a_volume_server_dies_are_right_or_fail_fast() -> None:
    """Kill the volume server that holds the most data: every GET then
    returns the object's own bytes or fails at once (a 5xx); none hangs
    and none returns other bytes.  The shared tier's fallback to the
    bucket rests on this."""
    with SeaweedCluster() as cluster:
        client = cluster.client()
        client.create_bucket(Bucket="volume-fault")
        bodies = {f"k{i}": os.urandom(256 * 1024) for i in range(40)}
        for key, body in bodies.items():
            client.put_object(Bucket="volume-fault", Key=key, Body=body)
        fullest = max(range(cluster.volumes), key=cluster.volume_bytes)
        cluster.stop_volume(fullest)
        impatient = cluster.client(Config(connect_timeout=2, read_timeout=5))
        right = failed = 0
        slowest = 0.0
        for key, body in bodies.items():
            started = time.monotonic()
            try:
                got = impatient.get_object(Bucket="volume-fault", Key=key)["Body"].read()
            except ClientError as exc:
                assert exc.response["ResponseMetadata"]["HTTPStatusCode"] >= 500
                failed += 1
            else:
                assert got == body, key
                right += 1
            slowest = max(slowest, time.monotonic() - started)
        assert failed > 0, "the killed volume server held none of the objects"
        assert right + failed == len(bodies)
        assert slowest < 5.0, slowest
