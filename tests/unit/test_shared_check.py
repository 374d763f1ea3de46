"""The shared tier's check (``SharedBucket.check``, run at mount and by
``tierfs policy check``): against moto, which honours ``If-None-Match: *``;
against moto behind a proxy that drops that header (a store without
conditional writes, on loopback); against nothing and a missing bucket."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.faults import FaultProxy
from tierfs.config.schema import SharedTierConfig
from tierfs.errors import SharedTierUnusable, StoreUnavailable
from tierfs.store.shared import SharedBucket


def shared_bucket(s3_client: Any, endpoint: str, *, create: bool = True) -> SharedBucket:
    name = f"shared-{uuid.uuid4().hex[:10]}"
    if create:
        s3_client.create_bucket(Bucket=name)
    return SharedBucket(
        SharedTierConfig(
            name="cluster", url=f"s3://{name}/tier", endpoint_url=endpoint, region="us-east-1"
        )
    )


def test_a_store_with_conditional_writes_passes_and_keeps_no_probe(
    moto_server: str, s3_client: Any
) -> None:
    shared = shared_bucket(s3_client, moto_server)
    try:
        shared.check()
        left = s3_client.list_objects_v2(Bucket=shared.bucket).get("Contents", [])
        assert left == []  # the probe objects were deleted
    finally:
        shared.close()


def test_a_store_that_ignores_if_none_match_is_named(
    moto_server: str, s3_client: Any, fault_proxy: FaultProxy
) -> None:
    fault_proxy.strip_request_headers("If-None-Match")
    shared = shared_bucket(s3_client, f"http://127.0.0.1:{fault_proxy.port}")
    try:
        with pytest.raises(SharedTierUnusable, match=r"does not honour If-None-Match: \*"):
            shared.check()
    finally:
        shared.close()


def test_no_bucket_and_no_answer_are_told_apart(moto_server: str, s3_client: Any) -> None:
    missing = shared_bucket(s3_client, moto_server, create=False)
    try:
        with pytest.raises(SharedTierUnusable, match="no such bucket"):
            missing.check()
    finally:
        missing.close()
    gone = SharedBucket(
        SharedTierConfig(
            name="cluster", url="s3://shared/x", endpoint_url="http://127.0.0.1:9", timeout=0.5
        )
    )
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match="does not answer"):
            gone.check()
    finally:
        gone.close()
    assert time.monotonic() - started < 10


def test_found_later_without_conditional_writes_the_tier_runs_without_fan_out(
    moto_server: str, s3_client: Any, fault_proxy: FaultProxy
) -> None:
    """A node that mounted while its shared tier was away checks it once it
    answers; a store without conditional writes then turns claims off,
    loudly in ``status``: each node fetches what it misses (correct, no
    fetch-once), and no claim is sent."""
    from tierfs.core.read.sharedtier import Claim, SharedTier

    away = SharedTier(
        "cluster",
        SharedBucket(
            SharedTierConfig(
                name="cluster", url="s3://s/x", endpoint_url="http://127.0.0.1:9", timeout=0.5
            )
        ),
        "s3://bkt/data",
        1 << 20,
    )
    try:
        assert away.check() is False and away.status()["checked"] is False
    finally:
        away.close()
    fault_proxy.strip_request_headers("If-None-Match")
    tier = SharedTier(
        "cluster",
        shared_bucket(s3_client, f"http://127.0.0.1:{fault_proxy.port}"),
        "s3://bkt/data",
        1 << 20,
    )
    try:
        assert tier.check() is True
        status = tier.status()
        assert status["checked"] is True
        assert str(status["fan_out"]).startswith("OFF: ") and "If-None-Match" in str(
            status["fan_out"]
        )
        sent = len(fault_proxy.request_lines)
        assert tier.claim("blocks/a/e/1048576/0") is Claim.WON
        assert len(fault_proxy.request_lines) == sent
    finally:
        tier.close()


@pytest.mark.parametrize("engine", ["native", "botocore"])
def test_a_block_whose_body_breaks_off_is_a_failure_the_breaker_counts(
    moto_server: str, s3_client: Any, fault_proxy: FaultProxy, engine: str
) -> None:
    """The connection is reset in the middle of a block's body, after its
    headers: the read fails (the block then comes from the bucket) and the
    shared tier's breaker counts a failure, on both GET engines."""
    shared = shared_bucket(s3_client, f"http://127.0.0.1:{fault_proxy.port}")
    try:
        if engine == "botocore":
            shared._native = None
        s3_client.put_object(Bucket=shared.bucket, Key=shared.prefix + "b/0", Body=b"x" * 65536)
        assert bytes(shared.get("b/0", 65536) or b"") == b"x" * 65536
        assert shared.breaker.snapshot().consecutive_failures == 0
        fault_proxy.reset_next(1)
        with pytest.raises(StoreUnavailable):
            shared.get("b/0", 65536)
        assert shared.breaker.snapshot().consecutive_failures == 1
    finally:
        shared.close()
