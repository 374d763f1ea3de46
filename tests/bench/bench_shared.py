"""The shared tier across nodes: a far bucket, a SeaweedFS cluster near the
"nodes", several tierfs mounts on this machine playing the nodes.

    bash tests/bench/run.sh shared [--size 1GiB] [--mounts 4] [--tree-files 2000] ...

Set-up (all on loopback, everything under one work directory):

- one SeaweedFS cluster (``tests.seaweed_cluster``: master, two volume
  servers, filer, S3 gateway) with two buckets: ``backing`` (the bucket)
  and ``shared`` (the shared tier);
- the bucket is reached through a throttled proxy (``tests.faults.FaultProxy``:
  ``--rate`` bytes per second in all, both ways, every connection
  together, and ``--latency`` before each response): a far bucket, as in
  another region; the shared tier is reached directly;
- each mount has its own state directory and local tier (empty when it
  mounts), ``[fetch]`` defaults; "fresh" means a new mount with both empty.

Cases, each measured as wall time per mount (``dd`` of the file, or ``cat``
of every file of the tree with 16 readers) and the bytes the bucket served
(response bodies through the proxy):

- ``alone``: one mount, no shared tier, reads the file: the reference time;
- ``no-shared``: ``--mounts`` mounts with no shared tier read it at once;
- ``wave1``: ``--mounts`` fresh mounts with the shared tier read it at once
  (cold: the shared tier is empty);
- ``wave2``: ``--mounts`` fresh mounts read it again;
- ``tree-alone``: one mount, no shared tier, reads the tree;
- ``tree``: ``tierfs preload --tier cluster`` of the tree on one mount, then
  ``--mounts`` fresh mounts read it at once;
- ``one-fresh`` / ``tree-one``: after wave1 / tree, one fresh mount reads the
  file / the tree with the machine to itself: a node's own speed (the
  waves' mounts share this machine's 2 cores, real nodes do not);
- ``write``: a file of ``--size`` written on one mount and flushed (its copy
  into the shared tier waited for), then ``--mounts`` - 1 fresh mounts read it.

The issue's acceptance is printed as a verdict per line: wave1 bucket bytes
<= 1.25x the file and each mount <= 1.5x alone; wave2 and tree <= 2 % from
the bucket and each mount >= 3x faster than alone; write <= 2 %.

On demand only (never in CI).  Run it alone on the machine, more than
once: the figures are ratios of times taken on the same machine a minute
apart, and other work on the 2 cores moves them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import (  # noqa: E402
    BenchError,
    cpu_seconds,
    drop_caches,
    fmt_size,
    fusermount_unmount,
    is_mounted,
    log,
    parse_size,
    py_spy,
    system_cpu_ticks,
    table,
    wait_pid_gone,
)
from tests.faults import FaultProxy  # noqa: E402
from tests.seaweed_cluster import ACCESS_KEY, REGION, SECRET_KEY, SeaweedCluster  # noqa: E402

VENV_BIN = Path(sys.executable).parent
FILE_KEY = "ckpt/model.pt"
WRITTEN = "ckpt/written.pt"
TREE = "dataset"
SHARED_NAME = "cluster"
#: The shared tier's counts summed over a case's mounts (``tierfs status``).
SHARED_COUNTS = ("hits", "misses", "claims", "claims_held", "waits", "wait_timeouts", "errors")


@contextlib.contextmanager
def far_bucket_and_shared_cluster(
    work: Path, rate: int, latency: float
) -> Iterator[tuple[SeaweedCluster, Any, FaultProxy]]:
    """The set-up of the module docstring, under ``work``: one SeaweedFS
    cluster with the buckets ``backing`` and ``shared``, a boto3 client of
    it, and the throttled proxy (``rate`` bytes per second in all,
    ``latency`` before each answer) through which the nodes reach the
    bucket.  Everything is stopped on the way out."""
    (work / "seaweed").mkdir()
    with SeaweedCluster(root=work / "seaweed", volume_size_mb=1024) as cluster:
        client = cluster.client()
        for bucket in ("backing", "shared"):
            client.create_bucket(Bucket=bucket)
        with FaultProxy("127.0.0.1", cluster.s3_port) as proxy:
            proxy.delay = latency
            proxy.rate = rate
            yield cluster, client, proxy


@dataclass
class Case:
    name: str
    times: list[float]
    bucket_bytes: int
    data_bytes: int
    notes: dict[str, Any] = field(default_factory=dict)


class SharedBench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.tierfs = str(VENV_BIN / "tierfs")
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("AWS_") and "proxy" not in k
        }
        self.env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            NO_PROXY="127.0.0.1",
        )
        self.cases: list[Case] = []
        self._mounts = 0
        #: Daemon PIDs of the mounts up now.
        self.pids: list[int] = []
        self.cluster: SeaweedCluster | None = None
        self.proxy: FaultProxy | None = None
        self.shared_prefix = ""

    # --- set-up ---

    def run(self) -> None:
        with far_bucket_and_shared_cluster(self.work, self.args.rate, self.args.latency) as (
            cluster,
            client,
            proxy,
        ):
            self.cluster, self.proxy = cluster, proxy
            self.upload(client)
            for case in self.args.cases:
                getattr(self, f"case_{case.replace('-', '_')}")()

    def upload(self, client: Any) -> None:
        a = self.args
        source = self.work / "source"
        source.mkdir()
        big = source / "big"
        with open(big, "wb") as f:
            for _ in range(0, a.size, 64 << 20):
                f.write(os.urandom(min(64 << 20, a.size - f.tell())))
        log(f"uploading {fmt_size(a.size)} and a tree of {a.tree_files} files")
        client.upload_file(str(big), "backing", FILE_KEY)
        sizes = [a.tree_bytes // a.tree_files] * a.tree_files
        blob = os.urandom(max(sizes) + a.tree_files)

        def put(i: int) -> None:  # every file different
            body = blob[i : i + sizes[i]]
            client.put_object(Bucket="backing", Key=f"{TREE}/d{i % 20:02d}/f{i:05d}", Body=body)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(a.tree_files)))
        big.unlink()

    # --- mounts ---

    def config(self, name: str, shared: bool) -> Path:
        assert self.cluster is not None and self.proxy is not None
        node = self.work / "nodes" / name
        for d in ("state", "tier"):
            shutil.rmtree(node / d, ignore_errors=True)
            (node / d).mkdir(parents=True)
        lines = [
            "[backing]",
            'url = "s3://backing"',
            f'endpoint_url = "{self.proxy.endpoint}"',
            f'region = "{REGION}"',
            "[state]",
            f'dir = "{node / "state"}"',
            "[[tiers]]",
            'name = "nvme"',
            f'path = "{node / "tier"}"',
        ]
        if shared:
            lines += [
                "[[tiers]]",
                f'name = "{SHARED_NAME}"',
                f'url = "s3://shared/{self.shared_prefix}"',
                f'endpoint_url = "{self.cluster.endpoint}"',
                f'region = "{REGION}"',
            ]
        path = node / "tierfs.toml"
        path.write_text("\n".join([*lines, ""]))
        return path

    @contextlib.contextmanager
    def mounts(self, count: int, *, shared: bool) -> Iterator[list[Path]]:
        """``count`` fresh mounts (empty state and local tier)."""
        points: list[tuple[Path, int | None]] = []
        try:
            for _ in range(count):
                self._mounts += 1
                name = f"node{self._mounts}"
                mp = self.work / "nodes" / name / "mnt"
                mp.mkdir(parents=True, exist_ok=True)
                cfg = self.config(name, shared)
                done = subprocess.run(
                    [self.tierfs, "mount", str(cfg), str(mp)],
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if done.returncode != 0:
                    raise BenchError(f"tierfs mount failed: {done.stderr.strip()}")
                points.append((mp, int(self.status(mp)["pid"])))
                self.pids.append(points[-1][1])
            yield [mp for mp, _pid in points]
        finally:
            for mp, pid in points:
                if is_mounted(mp):
                    subprocess.run(
                        [self.tierfs, "umount", str(mp)], env=self.env, capture_output=True
                    )
                fusermount_unmount(mp)
                if pid is not None:
                    wait_pid_gone(pid, "tierfsd")
                    self.pids.remove(pid)

    def status(self, mp: Path) -> dict[str, Any]:
        done = subprocess.run(
            [self.tierfs, "status", str(mp), "--json"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        status: dict[str, Any] = json.loads(done.stdout)
        return status

    # --- reads ---

    def read_all(self, points: list[Path], reader: Callable[[Path], None]) -> list[float]:
        """Each mount's ``reader`` at once (one thread each); their times."""
        drop_caches()

        def timed(mp: Path) -> float:
            started = time.perf_counter()
            reader(mp)
            return time.perf_counter() - started

        with ThreadPoolExecutor(len(points)) as pool:
            try:
                return list(pool.map(timed, points))
            except (OSError, subprocess.CalledProcessError) as exc:
                raise BenchError(f"a reader failed: {exc}") from exc

    def read_file(self, name: str) -> Callable[[Path], None]:
        def reader(mp: Path) -> None:
            subprocess.run(
                ["dd", f"if={mp / name}", "of=/dev/null", "bs=4M", "status=none"], check=True
            )

        return reader

    def read_tree(self, mp: Path) -> None:
        cmd = f"find {mp / TREE} -type f -print0 | xargs -0 -P 16 -n 50 cat > /dev/null"
        subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True)

    def measure(
        self, name: str, points: list[Path], reader: Callable[[Path], None], data: int
    ) -> Case:
        assert self.proxy is not None and self.cluster is not None
        before = self.proxy.bytes_down
        cpu_before = self.cpu()
        busy_before = system_cpu_ticks()
        spied = self.pids[-len(points)] if self.args.py_spy and points else None
        with py_spy(self.args.py_spy, spied, f"tierfsd-{name}"):
            times = self.read_all(points, reader)
        busy_after = system_cpu_ticks()
        cpu = {k: v - cpu_before.get(k, 0.0) for k, v in self.cpu().items()}
        case = Case(name, times, self.proxy.bytes_down - before, data)
        case.notes["cpu_s"] = {k: round(v, 1) for k, v in cpu.items()}
        case.notes["machine_busy"] = round(
            (busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1]), 2
        )
        counts: dict[str, int] = {}
        for mp in points:
            for key, value in (self.status(mp).get("shared_tier") or {}).items():
                if isinstance(value, int) and key in SHARED_COUNTS:
                    counts[key] = counts.get(key, 0) + value
        case.notes["shared"] = counts
        self.cases.append(case)
        log(
            f"{name}: {', '.join(f'{t:.1f}s' for t in times)}; bucket served "
            f"{case.bucket_bytes / data:.3f}x the data; machine "
            f"{100 * case.notes['machine_busy']:.0f}% busy; CPU s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in case.notes["cpu_s"].items())
            + (f"; shared tier: {counts}" if counts else "")
        )
        return case

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the mounted daemons, SeaweedFS, this process
        (the far bucket's proxy) and finished children (dd, cat)."""
        assert self.cluster is not None
        import resource

        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        weed = [p.proc.pid for p in self.cluster._processes.values() if p.proc is not None]
        return {
            "tierfsd": sum(cpu_seconds(pid) for pid in self.pids),
            "seaweedfs": sum(cpu_seconds(pid) for pid in weed),
            "proxy": me.ru_utime + me.ru_stime,
            "readers": kids.ru_utime + kids.ru_stime,
        }

    def new_shared_prefix(self) -> None:
        self.shared_prefix = f"run{time.monotonic_ns()}"

    # --- cases ---

    def case_alone(self) -> None:
        with self.mounts(1, shared=False) as points:
            self.measure("alone", points, self.read_file(FILE_KEY), self.args.size)

    def case_no_shared(self) -> None:
        with self.mounts(self.args.mounts, shared=False) as points:
            self.measure("no-shared", points, self.read_file(FILE_KEY), self.args.size)

    def case_wave1(self) -> None:
        self.new_shared_prefix()
        with self.mounts(self.args.mounts, shared=True) as points:
            self.measure("wave1", points, self.read_file(FILE_KEY), self.args.size)
            self.wait_puts(points)

    def case_wave2(self) -> None:
        if not self.shared_prefix:
            raise BenchError("wave2 needs wave1 before it")
        with self.mounts(self.args.mounts, shared=True) as points:
            self.measure("wave2", points, self.read_file(FILE_KEY), self.args.size)

    def case_one_fresh(self) -> None:
        """One fresh mount reads the file from the warm shared tier with
        the machine to itself (a node has its own CPUs; the waves share
        this machine's between all their mounts)."""
        if not self.shared_prefix:
            raise BenchError("one-fresh needs wave1 before it")
        with self.mounts(1, shared=True) as points:
            self.measure("one-fresh", points, self.read_file(FILE_KEY), self.args.size)

    def case_tree_one(self) -> None:
        """One fresh mount reads the preloaded tree with the machine to itself."""
        with self.mounts(1, shared=True) as points:
            self.measure("tree-one", points, self.read_tree, self.args.tree_bytes)

    def case_tree_alone(self) -> None:
        with self.mounts(1, shared=False) as points:
            self.measure("tree-alone", points, self.read_tree, self.args.tree_bytes)

    def case_tree(self) -> None:
        self.new_shared_prefix()
        with self.mounts(1, shared=True) as (admin,):
            started = time.perf_counter()
            done = subprocess.run(
                [self.tierfs, "preload", "--tier", SHARED_NAME, "--json", str(admin / TREE)],
                env=self.env,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise BenchError(f"tierfs preload --tier: {done.stderr.strip()}")
            preload_s = time.perf_counter() - started
            log(f"preload of the tree into the shared tier: {preload_s:.1f}s")
        with self.mounts(self.args.mounts, shared=True) as points:
            case = self.measure("tree", points, self.read_tree, self.args.tree_bytes)
            case.notes["preload_s"] = preload_s

    def case_write(self) -> None:
        self.new_shared_prefix()
        size = self.args.size
        local = self.work / "to-write"
        with open(local, "wb") as f:
            for _ in range(0, size, 64 << 20):
                f.write(os.urandom(min(64 << 20, size - f.tell())))
        with self.mounts(1, shared=True) as (writer,):
            started = time.perf_counter()
            (writer / WRITTEN).parent.mkdir(exist_ok=True)
            shutil.copyfile(local, writer / WRITTEN)
            subprocess.run([self.tierfs, "flush", str(writer / WRITTEN)], env=self.env, check=True)
            flushed = time.perf_counter() - started
            deadline = time.monotonic() + 600
            while self.status(writer)["shared_tier"]["files_shared"] < 1:
                if time.monotonic() > deadline:
                    raise BenchError("the written file was not copied into the shared tier")
                time.sleep(0.2)
            shared_s = time.perf_counter() - started
            log(f"write: flushed in {flushed:.1f}s, in the shared tier after {shared_s:.1f}s")
        local.unlink()
        with self.mounts(self.args.mounts - 1, shared=True) as points:
            case = self.measure("write", points, self.read_file(WRITTEN), size)
            case.notes.update(flush_s=flushed, shared_s=shared_s)

    def wait_puts(self, points: list[Path]) -> None:
        """Until the mounts' background puts into the shared tier are done."""
        deadline = time.monotonic() + 300
        last = -1
        while time.monotonic() < deadline:
            total = sum(
                self.status(mp)["shared_tier"]["puts"]
                + self.status(mp)["shared_tier"]["puts_failed"]
                for mp in points
            )
            if total == last:
                return
            last = total
            time.sleep(1.0)


def report(cases: list[Case]) -> str:
    by = {c.name: c for c in cases}
    alone = max(by["alone"].times) if "alone" in by else None
    tree_alone = max(by["tree-alone"].times) if "tree-alone" in by else None
    rows = []
    for c in cases:
        ref = tree_alone if c.name.startswith("tree") else alone
        slowest = max(c.times)
        share = c.bucket_bytes / c.data_bytes
        verdict = ""
        if c.name == "wave1" and ref:
            verdict = (
                f"bytes {_ok(share <= 1.25)} (<=1.25x), time {_ok(slowest <= 1.5 * ref)} (<=1.5x)"
            )
        elif c.name in ("wave2", "tree", "one-fresh", "tree-one") and ref:
            verdict = f"bytes {_ok(share <= 0.02)} (<=2%), time {_ok(ref / slowest >= 3)} (>=3x)"
        elif c.name == "write":
            verdict = f"bytes {_ok(share <= 0.02)} (<=2%)"
        rows.append(
            [
                c.name,
                str(len(c.times)),
                f"{min(c.times):.1f}-{slowest:.1f}s",
                f"{slowest / ref:.2f}" if ref else "-",
                f"{ref / slowest:.1f}x" if ref else "-",
                f"{share:.3f}x",
                f"{100 * c.notes.get('machine_busy', 0):.0f}%",
                verdict,
            ]
        )
    header = [
        "case",
        "mounts",
        "time",
        "slowest/alone",
        "speed-up",
        "bucket bytes",
        "busy",
        "verdict",
    ]
    return "\n".join(table(header, rows, left={0, 7}))


def _ok(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_shared.py", description=__doc__.split("\n\n")[0])
    cases = (
        "alone",
        "no-shared",
        "wave1",
        "wave2",
        "one-fresh",
        "tree-alone",
        "tree",
        "tree-one",
        "write",
    )
    p.add_argument("--cases", default=",".join(cases), help=f"comma list of {','.join(cases)}")
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="file (1GiB)")
    p.add_argument("--mounts", type=int, default=4, help="mounts per wave (4)")
    p.add_argument("--tree-files", type=int, default=2000, help="files of the tree (2000)")
    p.add_argument(
        "--tree-bytes", type=parse_size, default=parse_size("500MiB"), help="tree total (500MiB)"
    )
    p.add_argument(
        "--rate", type=parse_size, default=100_000_000, help="far bucket bytes/s (100MB)"
    )
    p.add_argument("--latency", type=float, default=0.02, help="per request, seconds (0.02)")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp"), help="on a disk (/var/tmp)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record the first mount's daemon of each case with py-spy into DIR",
    )
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = set(args.cases) - set(cases)
    if unknown:
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("bench: run as root (FUSE mounts, drop_caches)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tierfs-bench-shared-", dir=args.workdir))
    bench = SharedBench(args, work)
    code = 0
    try:
        bench.run()
    except BenchError as exc:
        print(f"bench: ERROR: {exc}", file=sys.stderr)
        code = 1
    finally:
        for mp in (work / "nodes").glob("*/mnt") if (work / "nodes").exists() else []:
            if is_mounted(mp):
                fusermount_unmount(mp)
        shutil.rmtree(work, ignore_errors=True)
    if bench.cases:
        print(
            f"far bucket: {args.rate / 1e6:.0f} MB/s, {args.latency * 1e3:.0f} ms per request; "
            f"file {fmt_size(args.size)}; tree {args.tree_files} files, "
            f"{fmt_size(args.tree_bytes)}"
        )
        print(report(bench.cases))
        if args.json:
            args.json.write_text(json.dumps([c.__dict__ for c in bench.cases], indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
