"""Claims in the shared tier (``tierfs.core.read.sharedtier``): a claimer
that is alive but slow is waited for (it writes its claim again every
``HEARTBEAT``), one that gives up deletes its claim so that the nodes
waiting fetch at once, and a waiting node learns how long claimed blocks
take to arrive.  Two ``SharedTier`` objects over one moto bucket play two
nodes."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import FaultProxy
from tierfs.config.schema import SharedTierConfig
from tierfs.core.read.sharedtier import (
    CLAIM_ALIVE,
    CLAIM_WAIT,
    LONGEST_FIRST_POLL,
    SharedTier,
    Wait,
)
from tierfs.store.shared import SharedBucket

BLOCK = 64 * 1024


@pytest.fixture
def config(moto_server: str, s3_client: Any) -> SharedTierConfig:
    name = f"shared-{uuid.uuid4().hex[:10]}"
    s3_client.create_bucket(Bucket=name)
    return SharedTierConfig(
        name="cluster", url=f"s3://{name}/tier", endpoint_url=moto_server, region="us-east-1"
    )


@pytest.fixture
def two_nodes(config: SharedTierConfig) -> Iterator[tuple[SharedTier, SharedTier]]:
    nodes = tuple(
        SharedTier("cluster", SharedBucket(config), "s3://backing", BLOCK, node=n) for n in "ab"
    )
    try:
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.close()


def wait_in_thread(node: SharedTier, key: str) -> tuple[threading.Thread, dict[str, Any]]:
    """``node.wait_for(key)`` in a thread; the result and its time land in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        out["into"] = memoryview(bytearray(BLOCK))
        out["found"] = node.wait_for(key, out["into"])
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_slow_claimer_that_is_alive_is_waited_for_not_fetched_twice(
    two_nodes: tuple[SharedTier, SharedTier],
) -> None:
    claimer, waiter = two_nodes
    key = claimer.block_key("ckpt/model.pt", "etag1", 0)
    assert key is not None
    data = os.urandom(BLOCK)
    assert claimer.claim(key).value == "won"
    assert waiter.claim(key).value == "held"
    thread, out = wait_in_thread(waiter, key)
    slow = CLAIM_ALIVE + CLAIM_WAIT + 1.0  # longer than a dead claim would be waited for
    time.sleep(slow)
    assert claimer.put_now(key, data)
    thread.join(30)
    assert out["found"] is Wait.SERVED and bytes(out["into"]) == data
    assert slow <= out["seconds"] < slow + 2.0
    assert claimer.stats["claims_renewed"] >= 3
    assert (waiter.stats["claims_stale"], waiter.stats["wait_timeouts"]) == (0, 0)
    assert waiter.first_pause() == LONGEST_FIRST_POLL  # learnt: claimed blocks come slowly


def test_a_claim_given_up_is_taken_over_by_one_waiting_node_at_once(
    two_nodes: tuple[SharedTier, SharedTier],
) -> None:
    claimer, waiter = two_nodes
    key = claimer.block_key("ckpt/model.pt", "etag1", 1)
    assert key is not None
    assert claimer.claim(key).value == "won"
    thread, out = wait_in_thread(waiter, key)
    time.sleep(0.05)
    claimer.release([key])  # its GET of the bucket failed
    thread.join(10)
    assert out["found"] is Wait.CLAIMED  # it fetches the block, for the others too
    assert out["seconds"] < 1.0
    assert (waiter.stats["claims_stale"], waiter.stats["claims"]) == (1, 1)
    assert claimer.claim(key).value == "held"  # the next node waits for the new claimer


def test_a_claim_is_no_longer_kept_alive_once_its_block_is_put(
    two_nodes: tuple[SharedTier, SharedTier],
) -> None:
    claimer, _ = two_nodes
    key = claimer.block_key("ckpt/model.pt", "etag1", 2)
    assert key is not None
    assert claimer.claim(key).value == "won"
    assert claimer.put_now(key, os.urandom(BLOCK))
    time.sleep(2.5)
    assert claimer.stats["claims_renewed"] == 0
    age = claimer.bucket.age("claims/" + key)
    assert age is not None and age >= 1.0


def test_a_dead_claim_is_taken_over_by_one_waiting_node_not_by_all(
    config: SharedTierConfig, two_nodes: tuple[SharedTier, SharedTier]
) -> None:
    dead, first = two_nodes
    second = SharedTier("cluster", SharedBucket(config), "s3://backing", BLOCK, node="c")
    try:
        key = dead.block_key("ckpt/model.pt", "etag1", 3)
        assert key is not None
        assert dead.claim(key).value == "won"
        dead.close()  # its node dies: nobody writes the claim again
        waits = [wait_in_thread(node, key) for node in (first, second)]
        data = os.urandom(BLOCK)
        deadline = time.monotonic() + 10
        while not any("found" in out for _thread, out in waits) and time.monotonic() < deadline:
            time.sleep(0.05)
        taker = [out for _thread, out in waits if "found" in out]
        assert len(taker) == 1 and taker[0]["found"] is Wait.CLAIMED
        assert CLAIM_ALIVE - 1.0 <= taker[0]["seconds"] < 5.0
        winner = first if waits[0][1] is taker[0] else second
        assert winner.put_now(key, data)  # it fetched the block; the other node gets it
        for thread, _out in waits:
            thread.join(15)
        other = next(out for _thread, out in waits if out is not taker[0])
        assert other["found"] is Wait.SERVED and bytes(other["into"]) == data
    finally:
        second.close()


def test_a_claim_without_an_answer_is_waited_on_and_sorted_out_by_its_check(
    s3_client: Any, fault_proxy: FaultProxy
) -> None:
    """The claim's PUT reached the tier but its answer was lost (a loaded
    tier): the node cannot know it holds the claim.  It waits as for a held
    one instead of going to the bucket; nobody writes that claim again, so
    its check finds it dead and the node takes it over (the next
    generation), once: one fetch, by one node."""
    name = f"shared-{uuid.uuid4().hex[:10]}"
    s3_client.create_bucket(Bucket=name)
    config = SharedTierConfig(
        name="cluster", url=f"s3://{name}/tier", endpoint_url=fault_proxy.endpoint,
        region="us-east-1",
    )  # fmt: skip
    node = SharedTier("cluster", SharedBucket(config), "s3://backing", BLOCK, node="a")
    try:
        key = node.block_key("ckpt/model.pt", "etag1", 4)
        assert key is not None
        fault_proxy.fail_responses(1, match="PUT ")
        assert node.claim(key).value == "failed"
        assert node.bucket.age("claims/" + key) is not None  # it was made all the same
        started = time.monotonic()
        found = node.wait_for(key, memoryview(bytearray(BLOCK)), failed=1)
        assert found is Wait.CLAIMED
        assert CLAIM_ALIVE - 1.0 <= time.monotonic() - started < 6.0
        assert node.bucket.age("claims/" + key + ".1") is not None
    finally:
        node.close()
