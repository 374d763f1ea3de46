"""The shared tier at cluster scale: N simulated nodes on its real read path.

    bash tests/bench/run.sh fanout [--nodes 16,64,256] [--size 1GiB] [--tree-files 2000] ...

What a node is here: the shared-tier read path of one mount, without FUSE
and without local tiers: its own ``SharedBucket`` (own connections, own
breaker), ``SharedTier`` (own claims, waits and put threads) and
``SharedOrigin`` over the backing store, as the daemon builds them.  A node
reads the file the way the fetcher reads a sequential reader's file: fetch
runs of up to 16 MiB (``FETCH_RUN_BYTES``) in order, ``--depth`` of them in
flight (the readahead), each one ``SharedOrigin.get_range_into``.  The
nodes are spread over ``--processes`` worker processes (the GIL), and all
start together.  The nodes of one process share one backing store (one
client and breaker of the bucket), to save memory.

Set-up (all on loopback, under one work directory):

- one SeaweedFS cluster (``tests.seaweed_cluster``: master, two volume
  servers, filer, S3 gateway with its Prometheus metrics) with the buckets
  ``backing`` (the bucket) and ``shared`` (the shared tier);
- the bucket through the throttled proxy (``tests.faults.FaultProxy``,
  ``--rate`` bytes per second for every connection together, ``--latency``
  before each answer): a far bucket; the shared tier directly;
- each case starts cold: a new prefix of the shared tier;
- the nodes share this machine's memory: each may hold at most an N-th of
  a third of it in blocks waiting to be put (``PUT_BACKLOG_BYTES``, 256
  MiB on a real node; the blocks other nodes wait for are never dropped).

Cases, for each N of ``--nodes``:

- ``file``: one cold file of ``--size``, read by all N nodes at once;
- ``tree`` (for each N of ``--tree-nodes``): a cold tree of ``--tree-files``
  files (``--tree-bytes`` in all), each node reading every file once,
  ``--tree-readers`` files at a time.

What it reports, per case:

- bucket bytes: the bytes the far bucket sent (response bodies and heads,
  counted by the proxy) over the data's size: 1.00 is fetch-once;
- the requests the shared cluster answered: from the gateway's own metrics
  (``SeaweedFS_s3_request_seconds_count`` by method), and from the nodes'
  side by kind (GET hit / GET 404, block PUT, claim PUT won / lost, HEAD);
- requests per node per block *beyond the block's GET*: every request the
  shared cluster answered, less one GET per block and node that served it,
  over N x blocks: the issue's figure (acceptance: <= 3 at 256 nodes);
- each node's time to read everything (median and max), the seconds it
  spent waiting for claimed blocks, and one node alone reading from the
  far bucket without a shared tier (the reference).

Verdict lines: bucket bytes <= 1.05x and <= 3 extra requests per node per
block for the file case.

On demand only (never in CI).  Run it alone on the machine, more than
once.  The N nodes share this machine's two cores (and the shared cluster
runs on them too), so times here are far longer than on N real nodes; the
request counts and the bucket bytes are what it measures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import cpu_seconds, fmt_size, log, parse_size, table  # noqa: E402

FILE_KEY = "ckpt/model.pt"
TREE = "dataset"
#: The kinds of requests a node sends to the shared tier (``CountingBucket``).
KINDS = (
    "get_hit", "get_404", "put_block", "claim_won", "claim_lost", "renew", "head", "delete",
    "failed",
)  # fmt: skip


# --- a node (worker processes) ------------------------------------------------------


def _node_parts(spec: dict[str, Any], index: int, backing: Any) -> tuple[Any, Any]:
    """One simulated node: its SharedTier (counting) and SharedOrigin."""
    from tierfs.config.schema import SharedTierConfig
    from tierfs.core.read.sharedtier import SharedOrigin, SharedTier
    from tierfs.store.shared import SharedBucket

    class CountingBucket(SharedBucket):
        """A node's shared-tier client that counts its requests by kind."""

        def __init__(self, config: SharedTierConfig) -> None:
            super().__init__(config)
            self.counts: collections.Counter[str] = collections.Counter()
            self._counts_lock = threading.Lock()

        def _add(self, kind: str) -> None:
            with self._counts_lock:
                self.counts[kind] += 1

        def get(self, key: str, size: int) -> Any:
            try:
                found = super().get(key, size)
            except Exception:
                self._add("failed")
                raise
            self._add("get_404" if found is None else "get_hit")
            return found

        def put(self, key: str, data: bytes) -> None:
            self._add("renew" if key.startswith("claims/") else "put_block")
            super().put(key, data)

        def put_if_absent(self, key: str, data: bytes) -> bool:
            won = super().put_if_absent(key, data)
            self._add("claim_won" if won else "claim_lost")
            return won

        def delete(self, key: str) -> None:
            self._add("delete")
            super().delete(key)

        def age(self, key: str) -> float | None:
            self._add("head")
            return super().age(key)

    class TimedTier(SharedTier):
        """A node's SharedTier that adds up the seconds spent waiting."""

        waited = 0.0

        def wait_for(self, *args: Any, **kwargs: Any) -> bool:
            start = time.monotonic()
            try:
                return super().wait_for(*args, **kwargs)
            finally:
                with self._lock:
                    self.waited += time.monotonic() - start

    config = SharedTierConfig(
        name="cluster",
        url=f"s3://shared/{spec['prefix']}",
        endpoint_url=spec["shared_endpoint"],
        region=spec["region"],
        timeout=spec["timeout"],
    )
    tier = TimedTier(
        "cluster", CountingBucket(config), "s3://backing", spec["block_size"], node=f"n{index}"
    )
    return tier, SharedOrigin(backing, lambda _ino: None, tier)


def _read_file(origin: Any, key: str, etag: str, size: int, block: int, depth: int) -> None:
    """Read ``key`` whole as the fetcher reads a sequential reader's file:
    fetch runs of up to FETCH_RUN_BYTES, ``depth`` in flight."""
    from tierfs.core.read.fetcher import FETCH_RUN_BYTES, RangedGet

    run = max(block, FETCH_RUN_BYTES // block * block)

    def fetch(offset: int) -> None:
        length = min(run, size - offset)
        lengths = [min(block, length - at) for at in range(0, length, block)]
        views = [memoryview(bytearray(n)) for n in lengths]
        get = RangedGet(key, etag, offset, length, lengths, [None] * len(lengths))
        got = origin.get_range_into(get, views, None)
        if got != length:
            raise RuntimeError(f"{key} at {offset}: {got} of {length} bytes")

    with ThreadPoolExecutor(depth) as pool:
        list(pool.map(fetch, range(0, size, run)))


def worker() -> int:
    """A worker process: builds its nodes, says ``ready``, waits for ``go``
    on stdin, reads, prints one JSON line of per-node figures."""
    spec = json.loads(sys.stdin.readline())
    from tierfs.config.schema import BackingConfig
    from tierfs.core.read import sharedtier
    from tierfs.store import open_store

    # The nodes share this machine's memory: each may hold a N-th of a
    # third of it in puts waiting (a real node holds up to 256 MiB).
    sharedtier.PUT_BACKLOG_BYTES = min(sharedtier.PUT_BACKLOG_BYTES, spec["put_backlog"])
    nodes = spec["nodes"]
    backing = open_store(
        BackingConfig(
            url="s3://backing", endpoint_url=spec["bucket_endpoint"], region=spec["region"]
        ),
        max_pool_connections=max(10, len(nodes) * spec["depth"]),
    )
    if spec["case"] == "alone":  # no shared tier: the bucket only
        from tierfs.core.read.fetcher import Origin

        parts = [(None, Origin(backing, lambda _ino: None)) for _ in nodes]
    else:
        parts = [_node_parts(spec, index, backing) for index in nodes]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    results: list[dict[str, Any]] = [{} for _ in parts]
    errors: list[str] = []

    def run_node(slot: int) -> None:
        tier, origin = parts[slot]
        start = time.monotonic()
        try:
            if spec["case"] in ("file", "alone"):
                file = spec["file"]
                _read_file(
                    origin,
                    file["key"],
                    file["etag"],
                    file["size"],
                    spec["block_size"],
                    spec["depth"],
                )
            else:
                with ThreadPoolExecutor(spec["tree_readers"]) as pool:
                    list(
                        pool.map(
                            lambda f: _read_file(
                                origin, f["key"], f["etag"], f["size"], spec["block_size"], 1
                            ),
                            spec["tree"],
                        )
                    )
        except Exception as exc:  # reported, the run goes on
            errors.append(f"node {nodes[slot]}: {exc!r}")
        seconds = time.monotonic() - start
        if tier is None:
            results[slot] = {"node": nodes[slot], "seconds": seconds, "waited": 0.0}
            results[slot].update(requests={}, stats={})
            return
        tier._puts.shutdown(wait=True)  # its puts are part of the case
        results[slot] = {
            "node": nodes[slot],
            "seconds": seconds,
            "waited": tier.waited,
            "requests": dict(tier.bucket.counts),
            "stats": dict(tier.stats),
        }

    cpu0 = time.process_time()
    threads = [threading.Thread(target=run_node, args=(slot,)) for slot in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0  # from "go" on: not the imports and set-up
    print(json.dumps({"nodes": results, "errors": errors, "cpu": cpu}), flush=True)
    return 0


# --- the bench (parent process) -----------------------------------------------------


class FanoutBench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.cluster: Any = None
        self.proxy: Any = None
        self.file: dict[str, Any] = {}
        self.tree: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("AWS_") and "proxy" not in k
        }

    def run(self) -> None:
        from tests.bench.bench_shared import far_bucket_and_shared_cluster
        from tests.seaweed_cluster import ACCESS_KEY, REGION, SECRET_KEY

        self.env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            NO_PROXY="127.0.0.1",
            PYTHONPATH=str(ROOT),
        )
        with far_bucket_and_shared_cluster(self.work, self.args.rate, self.args.latency) as (
            cluster,
            client,
            proxy,
        ):
            self.cluster, self.proxy = cluster, proxy
            self.upload(client)
            if self.file:
                self.case("alone", 1)
            for n in self.args.nodes:
                self.case("file", n)
            for n in self.args.tree_nodes:
                self.case("tree", n)

    def upload(self, client: Any) -> None:
        a = self.args
        if a.size:
            log(f"uploading a file of {fmt_size(a.size)}")
            big = self.work / "big"
            with open(big, "wb") as f:
                for _ in range(0, a.size, 64 << 20):
                    f.write(os.urandom(min(64 << 20, a.size - f.tell())))
            client.upload_file(str(big), "backing", FILE_KEY)
            big.unlink()
            head = client.head_object(Bucket="backing", Key=FILE_KEY)
            self.file = {"key": FILE_KEY, "etag": head["ETag"].strip('"'), "size": a.size}
        if a.tree_nodes:
            log(f"uploading a tree of {a.tree_files} files ({fmt_size(a.tree_bytes)})")
            each = a.tree_bytes // a.tree_files
            blob = os.urandom(each + a.tree_files)

            def put(i: int) -> dict[str, Any]:
                key = f"{TREE}/d{i % 20:02d}/f{i:05d}"
                answer = client.put_object(Bucket="backing", Key=key, Body=blob[i : i + each])
                return {"key": key, "etag": answer["ETag"].strip('"'), "size": each}

            with ThreadPoolExecutor(16) as pool:
                self.tree = list(pool.map(put, range(a.tree_files)))

    def server_requests(self) -> collections.Counter[str]:
        """The requests the gateway answered for the shared bucket, by method."""
        url = f"http://127.0.0.1:{self.cluster.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        counts: collections.Counter[str] = collections.Counter()
        pattern = re.compile(r"SeaweedFS_s3_request_seconds_count\{(.*)\} (\S+)")
        for match in pattern.finditer(text):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if labels.get("bucket") == "shared":
                counts[labels.get("type", "?")] += int(float(match.group(2)))
        return counts

    def seaweed_cpu(self) -> float:
        return sum(
            cpu_seconds(process.proc.pid)
            for process in self.cluster._processes.values()
            if process.proc is not None
        )

    def case(self, case: str, n: int) -> None:
        a = self.args
        prefix = f"{case}-{n}-{time.monotonic_ns()}/"
        per = [list(range(p, n, a.processes)) for p in range(min(a.processes, n))]
        base = {
            "case": case,
            "prefix": prefix,
            "shared_endpoint": self.cluster.endpoint,
            "bucket_endpoint": self.proxy.endpoint,
            "region": "us-east-1",
            "block_size": a.block_size,
            "depth": a.depth,
            "tree_readers": a.tree_readers,
            "put_backlog": _available_memory() // 3 // n,
            "timeout": a.timeout,
        }
        if case in ("file", "alone"):
            base["file"] = self.file
            data = self.file["size"]
            blocks = -(-data // a.block_size)
        else:
            base["tree"] = self.tree
            data = sum(f["size"] for f in self.tree)
            blocks = sum(-(-f["size"] // a.block_size) for f in self.tree)
        log(f"{case}: {n} nodes in {len(per)} processes, {blocks} blocks each")
        workers: list[subprocess.Popen[str]] = []
        try:
            for nodes in per:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.bench.bench_fanout", "--worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=self.env,
                    cwd=ROOT,
                )
                workers.append(proc)
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({**base, "nodes": nodes}) + "\n")
                proc.stdin.flush()
            for proc in workers:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError("a worker did not start")
            down0 = self.proxy.bytes_down
            server0 = self.server_requests()
            seaweed0 = self.seaweed_cpu()
            start = time.monotonic()
            for proc in workers:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results: list[dict[str, Any]] = []
            errors: list[str] = []
            nodes_cpu = 0.0
            for proc in workers:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError("a worker died")
                got = json.loads(line)
                results += got["nodes"]
                errors += got["errors"]
                nodes_cpu += got["cpu"]
            wall = time.monotonic() - start
            server = self.server_requests() - server0
            bucket = self.proxy.bytes_down - down0
            seaweed = self.seaweed_cpu() - seaweed0
        except BaseException:  # Ctrl-C, a dead worker: stop the others now
            for proc in workers:
                proc.kill()
            raise
        finally:
            for proc in workers:
                with contextlib.suppress(OSError):
                    if proc.stdin is not None:
                        proc.stdin.close()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for error in errors[:5]:
            log(f"  error: {error}")
        requests: collections.Counter[str] = collections.Counter()
        for r in results:
            requests.update(r["requests"])
        answered = sum(server.values())
        served_by_get = requests["get_hit"]
        extra = (answered - served_by_get) / (n * blocks)
        if case == "alone":
            self.alone_seconds = wall
            self.alone_cpu_per_gib = nodes_cpu / (data / 2**30)
            log(f"alone: {wall:.1f} s, {self.alone_cpu_per_gib:.2f} CPU s per GiB from the bucket")
            return
        seconds = sorted(r["seconds"] for r in results)
        waited = sorted(r["waited"] for r in results)
        row = {
            "case": case,
            "nodes": n,
            "blocks": blocks,
            "data_bytes": data,
            "bucket_bytes": bucket,
            "bucket_x": bucket / data,
            "server": dict(server),
            "answered": answered,
            "client": {k: requests[k] for k in KINDS},
            "client_total": sum(requests[k] for k in KINDS if k != "failed"),
            "extra_per_node_block": extra,
            "wall": wall,
            "node_median": seconds[len(seconds) // 2],
            "node_max": seconds[-1],
            "waited_median": waited[len(waited) // 2],
            "waited_max": waited[-1],
            "errors": len(errors),
            "nodes_cpu": nodes_cpu,
            "seaweed_cpu": seaweed,
            "node_cpu_per_gib": nodes_cpu / (n * data / 2**30),
            "wait_timeouts": sum(r["stats"].get("wait_timeouts", 0) for r in results),
            "claims_stale": sum(r["stats"].get("claims_stale", 0) for r in results),
            "fetchers": sum(1 for r in results if r["stats"].get("bucket_bytes", 0)),
        }
        totals: collections.Counter[str] = collections.Counter()
        for r in results:
            totals.update(r["stats"])
        row["stats"] = dict(totals)
        served = totals["bytes_read"] / 2**30
        row["seaweed_cpu_per_gib_served"] = seaweed / served if served else 0.0
        self.rows.append(row)
        log(
            f"  {case} {n}: bucket {row['bucket_x']:.3f}x, {extra:.2f} extra requests per node "
            f"per block, server {dict(server)}, nodes {dict(row['client'])}, wall {wall:.1f} s"
        )

    def report(self) -> None:
        a = self.args
        print()
        print(
            f"shared tier fan-out: block {fmt_size(a.block_size)}, far bucket "
            f"{fmt_size(a.rate)}/s + {a.latency * 1000:.0f} ms, depth {a.depth}, "
            f"{a.processes} processes, shared tier timeout {a.timeout:g} s"
        )
        if self.file:
            print(
                f"one node alone, no shared tier: {self.alone_seconds:.1f} s for the file, "
                f"{self.alone_cpu_per_gib:.2f} CPU s per GiB"
            )
        header = [
            "case", "nodes", "blocks", "bucket x", "extra req/node/block", "GET", "PUT", "HEAD",
            "hits", "404", "claims won/lost", "node s med/max", "waited s med/max", "timeouts", "stale",
            "fetchers", "node CPU s/GiB", "weed CPU s/GiB",
        ]  # fmt: skip
        rows = []
        for r in self.rows:
            c = r["client"]
            rows.append(
                [
                    r["case"],
                    str(r["nodes"]),
                    str(r["blocks"]),
                    f"{r['bucket_x']:.3f}",
                    f"{r['extra_per_node_block']:.2f}",
                    str(r["server"].get("GET", 0)),
                    str(r["server"].get("PUT", 0)),
                    str(r["server"].get("HEAD", 0)),
                    str(c["get_hit"]),
                    str(c["get_404"]),
                    f"{c['claim_won']}/{c['claim_lost']}",
                    f"{r['node_median']:.1f}/{r['node_max']:.1f}",
                    f"{r['waited_median']:.1f}/{r['waited_max']:.1f}",
                    str(r["wait_timeouts"]),
                    str(r["claims_stale"]),
                    str(r["fetchers"]),
                    f"{r['node_cpu_per_gib']:.2f}",
                    f"{r['seaweed_cpu_per_gib_served']:.2f}",
                ]
            )
        for line in table(header, rows):
            print(line)
        print(
            "node CPU s/GiB: the worker processes' CPU over the bytes the nodes read; "
            "weed CPU s/GiB: SeaweedFS's CPU (all its processes, puts included) over the "
            "bytes it served"
        )
        print()
        for r in self.rows:
            if r["case"] != "file":
                continue
            ok_bytes = r["bucket_x"] <= 1.05
            ok_requests = r["extra_per_node_block"] <= 3
            print(
                f"file, {r['nodes']} nodes: bucket {r['bucket_x']:.3f}x "
                f"({'ok' if ok_bytes else 'OVER'} <= 1.05x); "
                f"{r['extra_per_node_block']:.2f} extra requests per node per block "
                f"({'ok' if ok_requests else 'OVER'} <= 3); server vs nodes' count "
                f"{r['answered']} / {r['client_total']}"
            )


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> int:
    if "--worker" in sys.argv[1:]:
        return worker()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=_int_list, default=[16, 64, 256], help="file case (16,64,256)")
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="file (1GiB)")
    p.add_argument("--tree-nodes", type=_int_list, default=[16, 64], help="tree case (16,64)")
    p.add_argument("--tree-files", type=int, default=2000, help="files of the tree (2000)")
    p.add_argument(
        "--tree-bytes", type=parse_size, default=parse_size("500MiB"), help="tree total (500MiB)"
    )
    p.add_argument("--tree-readers", type=int, default=4, help="files a node reads at once (4)")
    p.add_argument("--block-size", type=parse_size, default=parse_size("4MiB"), help="(4MiB)")
    p.add_argument("--depth", type=int, default=2, help="fetch runs in flight per node (2)")
    p.add_argument("--processes", type=int, default=4, help="worker processes (4)")
    p.add_argument(
        "--rate", type=parse_size, default=100_000_000, help="far bucket bytes/s (100MB)"
    )
    p.add_argument("--latency", type=float, default=0.02, help="per request, seconds (0.02)")
    p.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        help="the shared tier's timeout key (2, its default): raise it where the simulated "
        "nodes' requests queue on this machine for longer",
    )
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp"), help="on a disk (/var/tmp)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args()
    work = Path(tempfile_dir(args.workdir))
    try:
        bench = FanoutBench(args, work)
        bench.run()
        bench.report()
        if args.json:
            args.json.write_text(json.dumps(bench.rows, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def tempfile_dir(under: Path) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="tierfs-fanout-", dir=under)


if __name__ == "__main__":
    sys.exit(main())
