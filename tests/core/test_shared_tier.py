"""The shared tier in the read path, without a mount: several nodes (each
its own state and local tiers) over one backing bucket (moto) and one
shared bucket on a SeaweedFS cluster (``tests.seaweed_cluster``)."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, MiB, put
from tests.core.test_metrics import scrape, value
from tests.core.test_preload import run_preload
from tests.seaweed_cluster import SeaweedCluster
from tierfs.config import RuleConfig, SharedTierConfig
from tierfs.core.read import fetcher, sharedtier
from tierfs.core.read.sharedtier import CLAIM_ALIVE, CLAIMS, TRAILER
from tierfs.errors import InvalidArgument
from tierfs.metrics import Metrics
from tierfs.workers.wiring import preloader_for


def shared_config(seaweed: SeaweedCluster, **extra: Any) -> SharedTierConfig:
    bucket = f"shared-{uuid.uuid4().hex[:10]}"
    seaweed.client().create_bucket(Bucket=bucket)
    return SharedTierConfig(
        name="cluster",
        url=f"s3://{bucket}/tierfs",
        endpoint_url=seaweed.endpoint,
        region="us-east-1",
        **extra,
    )


async def wait_puts(mount: CoreMount, count: int, timeout: float = 20.0) -> None:
    shared = mount.fs.shared_tier
    assert shared is not None
    with trio.fail_after(timeout):
        while shared.stats["puts"] + shared.stats["puts_failed"] < count:
            await trio.sleep(0.02)
    assert shared.stats["puts_failed"] == 0


def bucket_bytes(mount: CoreMount, key: str, before: int = 0) -> int:
    return sum(length for k, _start, length in mount.store.gets[before:] if k == key)


async def test_a_block_fetched_by_one_node_is_read_by_the_next_from_the_shared_tier(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    data = os.urandom(3 * MiB + 4321)  # three whole blocks and a short one
    put(s3_store, "ckpt/model.pt", data)
    tier = shared_config(seaweed)
    first = await make_fs(node="a", shared_tier=tier)
    assert await first.read_file("ckpt/model.pt") == data
    assert bucket_bytes(first, "ckpt/model.pt") == len(data)
    await wait_puts(first, 4)
    status = first.fs.status()["shared_tier"]
    assert status["name"] == "cluster" and status["bytes_put"] == len(data)
    assert status["bucket_bytes"] == len(data) and status["hits"] == 0

    gets_before = len(first.store.gets)  # the nodes share one counting store
    second = await make_fs(node="b", shared_tier=tier)
    assert await second.read_file("ckpt/model.pt") == data
    assert bucket_bytes(second, "ckpt/model.pt", gets_before) == 0
    shared = second.fs.shared_tier
    assert shared is not None
    assert (shared.stats["hits"], shared.stats["bytes_read"]) == (4, len(data))
    assert shared.stats["bucket_bytes"] == 0
    metrics = Metrics()
    metrics.watch(second.fs)
    samples = scrape(metrics)
    assert value(samples, "tierfs_shared_hits_total") == 4
    assert value(samples, "tierfs_shared_bytes_read_total") == len(data)
    assert value(samples, "tierfs_shared_bucket_bytes_total") == 0
    assert value(samples, "tierfs_shared_reachable") == 1


async def test_a_changed_object_is_never_served_from_its_old_shared_blocks(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    old, new = os.urandom(MiB), os.urandom(MiB)
    put(s3_store, "w.bin", old)
    tier = shared_config(seaweed)
    first = await make_fs(node="a", shared_tier=tier)
    assert await first.read_file("w.bin") == old
    await wait_puts(first, 1)
    put(s3_store, "w.bin", new)  # another writer: a new ETag
    second = await make_fs(node="b", shared_tier=tier)
    assert await second.read_file("w.bin") == new
    shared = second.fs.shared_tier
    assert shared is not None and shared.stats["hits"] == 0


async def test_a_damaged_shared_block_is_detected_read_from_the_bucket_and_replaced(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    data = os.urandom(2 * MiB)
    put(s3_store, "d.bin", data)
    tier = shared_config(seaweed)
    first = await make_fs(node="a", shared_tier=tier)
    assert await first.read_file("d.bin") == data
    await wait_puts(first, 2)
    shared = first.fs.shared_tier
    assert shared is not None
    etag = (await first.fs.namespace.resolve("d.bin")).etag
    key = shared.block_key("d.bin", etag, 1)
    assert key is not None
    client, bucket = seaweed.client(), tier.url.removeprefix("s3://").split("/")[0]
    good = client.get_object(Bucket=bucket, Key="tierfs/" + key)["Body"].read()
    assert good[:MiB] == data[MiB:] and len(good) == MiB + TRAILER.size
    damaged = bytearray(good)
    damaged[1000] ^= 0xFF  # one flipped byte, the checksum kept
    client.put_object(Bucket=bucket, Key="tierfs/" + key, Body=bytes(damaged))
    client.put_object(  # and a short one for block 0
        Bucket=bucket, Key="tierfs/" + str(shared.block_key("d.bin", etag, 0)), Body=b"short"
    )
    second = await make_fs(node="b", shared_tier=tier)
    assert await second.read_file("d.bin") == data
    stats = second.fs.shared_tier.stats if second.fs.shared_tier else None
    assert stats is not None and stats["corrupt"] == 2 and stats["hits"] == 0
    await wait_puts(second, 2)
    third = await make_fs(node="c", shared_tier=tier)
    assert await third.read_file("d.bin") == data
    assert third.fs.shared_tier is not None and third.fs.shared_tier.stats["hits"] == 2


async def test_reads_go_on_from_the_bucket_when_the_shared_tier_is_gone(
    make_fs: Any, s3_store: Any
) -> None:
    """Nothing listens at the shared tier's endpoint: every read is served
    by the bucket, and the breaker soon stops asking the shared tier."""
    data = os.urandom(4 * MiB)
    put(s3_store, "f.bin", data)
    gone = SharedTierConfig(
        name="cluster", url="s3://shared/x", endpoint_url="http://127.0.0.1:9", timeout=0.5
    )
    mount = await make_fs(node="a", shared_tier=gone)
    started = time.monotonic()
    assert await mount.read_file("f.bin") == data
    assert time.monotonic() - started < 5.0
    shared = mount.fs.shared_tier
    assert shared is not None and shared.stats["errors"] >= 1 and shared.stats["hits"] == 0
    assert shared.stats["bucket_bytes"] == len(data)


async def test_nodes_reading_the_same_cold_file_at_once_fetch_it_from_the_bucket_about_once(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    """The fan-out: four nodes start reading one cold file together; each
    block is claimed by one node, fetched by it and read by the others
    from the shared tier."""
    data = os.urandom(24 * MiB + 12345)
    put(s3_store, "ckpt/step-100.pt", data)
    tier = shared_config(seaweed)
    nodes = [await make_fs(node=name, shared_tier=tier) for name in "abcd"]
    results: dict[str, bytes] = {}

    async def read(name: str, node: CoreMount) -> None:
        results[name] = await node.read_file("ckpt/step-100.pt")

    async with trio.open_nursery() as nursery:
        for name, node in zip("abcd", nodes, strict=True):
            nursery.start_soon(read, name, node)
    assert all(got == data for got in results.values())
    from_bucket = bucket_bytes(nodes[0], "ckpt/step-100.pt")
    assert from_bucket <= 1.25 * len(data), f"the bucket served {from_bucket / len(data):.2f}x"
    stats = [node.fs.shared_tier.stats for node in nodes if node.fs.shared_tier is not None]
    blocks = -(-len(data) // MiB)
    assert sum(s["claims"] for s in stats) >= blocks - sum(s["claims_stale"] for s in stats)
    assert sum(s["waits"] + s["hits"] for s in stats) >= 3 * blocks * 0.75
    # A request of the shared tier may time out on a busy machine (its
    # timeout is 2 s; a new bucket's first writes make SeaweedFS grow
    # volumes): it costs a duplicate fetch, never a wrong byte, and the
    # bounds above hold.  The tier must still have answered nearly always.
    failed = sum(s["puts_failed"] + s["errors"] for s in stats)
    assert failed <= blocks // 4, stats


async def claimed_elsewhere(
    make_fs: Any, s3_store: Any, tier: SharedTierConfig, path: str
) -> tuple[CoreMount, bytes, str]:
    """A 1 MiB file in the bucket whose one block another node claimed
    (and never put); a node to read it, the bytes, the block's key."""
    data = os.urandom(MiB)
    put(s3_store, path, data)
    node = await make_fs(node="a", shared_tier=tier)
    shared = node.fs.shared_tier
    assert shared is not None
    etag = (await node.fs.namespace.resolve(path)).etag
    key = shared.block_key(path, etag, 0)
    assert key is not None
    assert shared.bucket.put_if_absent(CLAIMS + key, b"another node")
    return node, data, key


async def test_a_block_claimed_by_a_node_that_died_is_read_from_the_bucket_within_the_budget(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    """A claim whose node died before putting the block (nobody writes it
    again): the next node sees it dead once it is ``CLAIM_ALIVE`` old, by
    the cluster's clock, within the foreground budget of 5 s, then reads
    the block from the bucket and puts it for the others."""
    tier = shared_config(seaweed)
    node, data, _key = await claimed_elsewhere(make_fs, s3_store, tier, "dead.bin")
    shared = node.fs.shared_tier
    assert shared is not None
    started = time.monotonic()
    assert await node.read_file("dead.bin") == data
    waited = time.monotonic() - started
    assert CLAIM_ALIVE - 1.0 <= waited < 5.0  # Last-Modified counts whole seconds
    assert (shared.stats["claims_held"], shared.stats["claims_stale"]) == (1, 1)
    assert shared.stats["wait_timeouts"] == 0
    await wait_puts(node, 1)
    other = await make_fs(node="b", shared_tier=tier)
    started = time.monotonic()
    assert await other.read_file("dead.bin") == data
    assert time.monotonic() - started < 1.0
    assert other.fs.shared_tier is not None and other.fs.shared_tier.stats["hits"] == 1


async def test_a_stale_claim_is_not_waited_for(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster, monkeypatch: Any
) -> None:
    """A claim not written for ``CLAIM_ALIVE`` (by the cluster's clock) is
    dead: the block is fetched at once.  (The default of 3 s is shortened
    to 0 here; the wait for a fresh claim is tested above with defaults.)"""
    monkeypatch.setattr(sharedtier, "CLAIM_ALIVE", 0.0)
    node, data, key = await claimed_elsewhere(make_fs, s3_store, shared_config(seaweed), "s.bin")
    shared = node.fs.shared_tier
    assert shared is not None
    assert not shared.bucket.put_if_absent(CLAIMS + key, b"again")
    age = shared.bucket.age(CLAIMS + key)
    assert age is not None and 0 <= age < 30
    await trio.sleep(1.1)  # Last-Modified counts whole seconds
    started = time.monotonic()
    assert await node.read_file("s.bin") == data
    assert time.monotonic() - started < 1.5
    assert (shared.stats["claims_stale"], shared.stats["wait_timeouts"]) == (1, 0)


async def wait_shared_files(mount: CoreMount, count: int, timeout: float = 30.0) -> None:
    shared = mount.fs.shared_tier
    assert shared is not None
    with trio.fail_after(timeout):
        while shared.stats["files_shared"] < count:
            await trio.sleep(0.02)


async def test_a_file_written_on_one_node_is_read_by_the_others_from_the_shared_tier(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    """The write path: once its upload completed, a checkpoint is copied
    from the writer's own copy into the shared tier under the new ETag;
    the other nodes read it from there, not from the bucket."""
    data = os.urandom(5 * MiB + 777)
    tier = shared_config(seaweed)
    writer = await make_fs(node="w", shared_tier=tier)
    await writer.fs.mkdir(1, b"ckpt", 0o755, 0, 0)
    await writer.write_file("ckpt/step-7.pt", data)
    await writer.flush()
    await wait_shared_files(writer, 1)
    shared = writer.fs.shared_tier
    assert shared is not None and shared.stats["bytes_put"] == len(data)
    gets_before = len(writer.store.gets)
    for name in "xyz":
        reader = await make_fs(node=name, shared_tier=tier)
        assert await reader.read_file("ckpt/step-7.pt") == data
        stats = reader.fs.shared_tier.stats if reader.fs.shared_tier else None
        assert stats is not None and stats["hits"] == 6 and stats["bucket_bytes"] == 0
    assert bucket_bytes(writer, "ckpt/step-7.pt", gets_before) == 0


async def test_a_share_false_rule_keeps_written_files_out_of_the_shared_tier(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    data = os.urandom(2 * MiB)
    tier = shared_config(seaweed)
    rules = [RuleConfig(match="private/**", share=False)]
    writer = await make_fs(node="w", shared_tier=tier, rules=rules)
    for name in ("private", "public"):
        await writer.fs.mkdir(1, name.encode(), 0o755, 0, 0)
        await writer.write_file(f"{name}/f.bin", data)
    await writer.flush()
    await wait_shared_files(writer, 1)  # public/f.bin
    await trio.sleep(0.5)  # private/f.bin would have been queued before it
    shared = writer.fs.shared_tier
    assert shared is not None
    assert (shared.stats["files_shared"], shared.stats["bytes_put"]) == (1, len(data))
    reader = await make_fs(node="r", shared_tier=tier)
    assert await reader.read_file("private/f.bin") == data
    assert reader.fs.shared_tier is not None and reader.fs.shared_tier.stats["hits"] == 0


async def test_a_share_false_rule_keeps_reads_out_of_the_shared_tier_too(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    """Under ``share = false`` a read neither asks the shared tier nor puts
    what the bucket served there, even when another node (without the rule)
    shared the blocks; ``preload --tier`` of such a file is refused."""
    data = os.urandom(2 * MiB + 17)
    put(s3_store, "private/model.pt", data)
    put(s3_store, "public/model.pt", data)
    tier = shared_config(seaweed)
    rules = [RuleConfig(match="private/**", share=False)]
    kept_out = await make_fs(node="a", shared_tier=tier, rules=rules)
    shared = kept_out.fs.shared_tier
    assert shared is not None
    assert await kept_out.read_file("private/model.pt") == data
    await trio.sleep(0.3)  # a put would have been queued at once
    untouched = ("hits", "misses", "claims", "puts", "bytes_put")
    assert [shared.stats[k] for k in untouched] == [0] * len(untouched)
    assert await kept_out.read_file("public/model.pt") == data  # the tier works
    await wait_puts(kept_out, 3)
    assert shared.stats["bytes_put"] == len(data)

    sharer = await make_fs(node="b", shared_tier=tier)  # no rule: shares private/ too
    assert await sharer.read_file("private/model.pt") == data
    await wait_puts(sharer, 3)
    third = await make_fs(node="c", shared_tier=tier, rules=rules)
    gets_before = len(third.store.gets)
    assert await third.read_file("private/model.pt") == data
    assert bucket_bytes(third, "private/model.pt", gets_before) == len(data)
    assert third.fs.shared_tier is not None
    assert [third.fs.shared_tier.stats[k] for k in untouched] == [0] * len(untouched)
    inode = await third.fs.namespace.resolve("private/model.pt")
    with pytest.raises(InvalidArgument, match="share = false"):
        await third.fs.movement.fill_shared(inode.ino)


async def test_a_preload_into_the_shared_tier_warms_it_for_every_node_and_fills_no_local_tier(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster, nursery: trio.Nursery
) -> None:
    files = {f"ds/shard-{i:02d}.bin": os.urandom(i * 300_000 + 10) for i in range(12)}
    files["ds/big.bin"] = os.urandom(20 * MiB + 5)
    for key, data in files.items():
        put(s3_store, key, data)
    total = sum(map(len, files.values()))
    tier = shared_config(seaweed)
    admin = await make_fs(node="admin", shared_tier=tier)
    job = await run_preload(nursery, admin, ["ds"], "cluster")
    snapshot = job.snapshot()
    assert (job.state, job.files_failed, job.files_done) == ("done", 0, len(files)), snapshot
    assert (job.bytes_fetched, snapshot["tier"]) == (total, "cluster")
    assert sum(admin.fs.space.used(t) for t in range(len(admin.fs.tiers))) == 0
    assert bucket_bytes(admin, "ds/big.bin") == len(files["ds/big.bin"])

    again = await run_preload(nursery, admin, ["ds"], "cluster")  # all there: nothing fetched
    assert (again.bytes_fetched, again.bytes_resident) == (0, total)

    gets_before = len(admin.store.gets)
    reader = await make_fs(node="r", shared_tier=tier)
    for key, data in files.items():
        assert await reader.read_file(key) == data
    assert len(admin.store.gets) == gets_before  # every block from the shared tier


async def test_a_preload_into_the_shared_tier_gives_way_to_demand_reads(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster
) -> None:
    """The warm of ``preload --tier`` takes a fetch slot per GET (never one
    for a whole file), makes its GETs short while demand reads are active
    (the trickle) and lets a GET give way between two blocks when one
    starts, as a local preload does; every block still ends up shared."""
    data = os.urandom(20 * MiB + 5)  # 21 blocks of 1 MiB
    put(s3_store, "big.bin", data)
    put(s3_store, "big2.bin", data)
    node = await make_fs(node="a", shared_tier=shared_config(seaweed))
    origin = node.fs.fetcher.origin
    assert isinstance(origin, sharedtier.SharedOrigin)
    inode = await node.fs.namespace.resolve("big.bin")
    taken: list[int] = []
    given: list[object] = []

    def take() -> tuple[object, bool]:
        taken.append(len(node.store.gets))
        return len(taken), True  # demand is active: the trickle

    pace = sharedtier.WarmPace(take=take, give=given.append, stop=lambda: False)
    fetched, present = await trio.to_thread.run_sync(
        origin.warm, "big.bin", inode.etag, len(data), range(21), pace
    )
    assert (fetched, present) == (len(data), 0)
    gets = [length for key, _start, length in node.store.gets if key == "big.bin"]
    assert max(gets) <= fetcher.BACKGROUND_TRICKLE_BYTES and len(gets) == 3  # 8 + 8 + 5 blocks
    assert len(taken) == len(given) == 3  # a slot per GET, each given back

    inode = await node.fs.namespace.resolve("big2.bin")
    taken.clear()
    given.clear()
    giving_way = sharedtier.WarmPace(take=lambda: (0, False), give=given.append, stop=lambda: True)
    fetched, _ = await trio.to_thread.run_sync(
        origin.warm, "big2.bin", inode.etag, len(data), range(21), giving_way
    )
    assert fetched == len(data)
    gets2 = [(start, length) for key, start, length in node.store.gets if key == "big2.bin"]
    # Each GET gave way after a block (a store may fill a short range whole,
    # see ObjectStore.get_range_into): more GETs than the two runs of 16 MiB
    # and 5 MiB without it, each starting at a block past the one before.
    assert len(gets2) > 2 and gets2[0][0] == 0
    assert all(b[0] > a[0] and b[0] % MiB == 0 for a, b in itertools.pairwise(gets2))
    assert len(given) == len(gets2)

    gets_before = len(node.store.gets)
    reader = await make_fs(node="r", shared_tier=node.config.shared_tier)
    assert await reader.read_file("big.bin") == data
    assert await reader.read_file("big2.bin") == data
    assert len(node.store.gets) == gets_before  # every block from the shared tier


async def test_a_preload_into_an_unknown_tier_names_the_shared_tier_among_the_choices(
    make_fs: Any, s3_store: Any, seaweed: SeaweedCluster, nursery: trio.Nursery
) -> None:
    put(s3_store, "x.bin", b"x")
    node = await make_fs(node="a", shared_tier=shared_config(seaweed))
    preloader = preloader_for(node.fs)
    await nursery.start(preloader.run)
    spool = preloader.new_spool()
    spool.add("x.bin")
    with pytest.raises(InvalidArgument, match=r"no tier named 'tape'.*shared tier cluster"):
        preloader.start(spool, ["x.bin"], "tape")
