#!/usr/bin/env python3
"""Preload and prefetch benchmark: tierfs against s5cmd and rclone on one local S3 server.

Run it through ``bash tests/bench/run.sh preload`` (installs the peers), as
root: ``drop_caches`` and FUSE mounts need it.  Not a test: never collected
by pytest, never run in CI.  Shared pieces (s3rver, s5cmd, the rclone
remote, unmounting, the idle wait) are in ``common.py``; the small-file
plan is ``bench_write.small_plan``.

Data set (uploaded once per run with s5cmd, to a disk-backed ``s3rver`` on
127.0.0.1): ``small/``, ``--files`` (10,000) files of random sizes in
[``--file-min``, ``--file-max``] (20-200 KiB) in ``--dirs`` directories;
``big/big.bin``, one file of ``--big-size`` (1 GiB); for the latency case,
``lat/`` (2 x ``--latency-reads`` more small files) and ``lat-big/range.bin``
(``--range-file-size``, 512 MiB).  Every tierfs case runs on a fresh mount:
empty state directory and tier, the page cache dropped, then ``--settle``
seconds of quiet (see bench_read.py on why).  The daemon runs with its
default ``[fetch]`` settings unless ``--concurrency`` or ``--block-size`` is
given.  ``--repeat`` rounds (3); medians (of rounds, or of all reads) are
printed.

Cases (``--cases``, comma-separated):

``copy``: wall time until the command exits, for each shape (``small/``
    and ``big/``; ``--shapes`` picks):

    * ``tierfs preload MOUNT/PREFIX --json``: the CLI's run until it exits,
      which is when every byte is resident on the tier (the daemon lists the
      prefix itself, as s5cmd does).  Checked: the summary names no failure
      and ``tierfs where`` of the prefix shows every byte cached;
    * ``s5cmd cp 's3://bench/PREFIX/*' DIR/`` into a local directory on the
      tier's filesystem (its default 256 workers);
    * ``rclone copy bench:bench/PREFIX DIR`` (``--transfers``/``--checkers``
      ``--rclone-transfers``, 16).

    The peers' bytes land in the page cache and are not fsynced; tierfs
    writes whole blocks with O_DIRECT and commits its block map, so the
    comparison favours the peers a little.  Printed: files/s, MB/s, CPU
    seconds per GiB of the client (the tierfs daemon, or the peer's
    process) and of the S3 server (s3rver shares the 2 CPUs: what the
    client spends, the server lacks), the server's share of a core, the
    disk's bytes read and written and its busy time during the copy (the
    tier, the peers' copies and s3rver's data share one disk; the first two
    on the tiers' filesystem, see ``--tier-fs``), and tierfs/peer speed
    ratios: the ratio of the two medians, each round's ratio (peer seconds
    / tierfs seconds of the same round) and the median of those, on which
    the target is judged (preload >= 0.9x s5cmd for both shapes).  Why the
    paired median: the machine's slow phases last seconds and hit the
    commands of one round alike, so a round's ratio cancels them, while the
    ratio of two medians can pair a slow run of one command with a fast run
    of the other (one 1 GiB run: rounds 1.10, 1.10 and 0.86, medians 0.89).

    Seen on this machine kind: s3rver answers the delimited LIST of
    ``small/`` with 10,000 keys beneath in about 3.3 s (it walks every key
    under the prefix, whatever ``--dirs``), more than tierfs's 3 s read
    timeout of foreground requests (``tierfs.store.s3.READ_TIMEOUT``): the
    preload of the 10,000-file shape then fails on that LIST (reported as
    an ERROR; the other cases go on).  s5cmd and rclone wait longer.  A
    real bucket answers a LIST page in tens of milliseconds.

``latency``: demand reads during a preload, against the same reads idle.
    One fresh mount per round; the files' directories are listed first, so
    the timed reads need no LIST.  Each read is timed from ``open`` to the
    last byte: a whole cold small file of ``lat/``, or one 1 MiB ``pread``
    at an offset of ``lat-big/range.bin`` no read touched before (the range
    reads alternate with the small ones).  Idle: ``--latency-reads`` of each
    with nothing else running.  Then ``tierfs preload MOUNT/big MOUNT/small``
    starts (``small/`` too when another case uploaded it, so that the
    preload outlasts the reads: the big file first, then the small files);
    once it fetches, the same number of reads of other cold files and
    offsets.  A read counts only if the preload was still running when it
    ended (the report says how many did).  The preload is then cancelled
    with Ctrl-C (SIGINT to the CLI).  Printed: median and p90 of each kind;
    target: median during <= 2x median idle.

``epoch``: one epoch over the first ``--epoch-files`` files of ``small/``
    in a shuffled order (``--seed`` and the round), read whole by
    ``--readers`` (8) threads that take the next file of the order, as a
    DataLoader's workers take the sampler's indices.  Variants
    (``--epoch-variants``): ``gets``: the same keys fetched whole by
    ``--readers`` threads of boto3 GETs, no mount (the reference of issue
    15: cold small-file reads >= 0.8x it); ``without``: a fresh mount,
    plain reads; ``with``: a fresh mount, and first
    ``tierfs.client.set_order(MOUNT, order)`` (its time counts in the
    epoch), then the same reads; ``two``: two jobs on one fresh mount, each
    with half of the order, half of the readers and its own order
    (``set_order(..., job=...)``), at once: the time until both are done
    against ``with`` (info), and the slower job's time over the faster's
    (1.00: the two orders shared the fills evenly).  Target: with >= 2x faster, judged only
    with ``--s3-delay`` (on loopback the epoch is CPU-bound, and a prefetch
    cannot make it faster; docs/benchmarks.md, "Order-aware prefetch in the shuffled
    epoch"; without a delay the line is marked info).  With
    ``--py-spy``, the first round's mounted variants are profiled too.

``rss``: the daemon's memory during a preload of a ``--rss-entries``
    (1,000,000) line list.  What the list names: the files of ``small/``,
    each listed ``rss-entries / files`` times, cycling through the data set
    (line i names file i mod N).  So every line is a real file that goes
    through all of the daemon's list handling (validation as it streams in,
    the path spool, resolution through the namespace, the file spool, the
    fetch pass with its duplicate bookkeeping), and the first pass over the
    data set really fetches it (the fetch buffers count too).  What it does
    not measure: the metadata of a million *distinct* files (LMDB pages of
    a million inodes, which are mapped and count in RSS) nor the LIST of a
    million keys: uploading a million objects to s3rver would take hours.
    Sampled: VmRSS every 0.2 s, and VmHWM before and after, from
    /proc/PID/status; growth = peak - the value right after the mount and
    the listing of ``small/``.  Target: growth <= 100 MB.

Quick run (a few minutes)::

    bash tests/bench/run.sh preload --files 1000 --big-size 256MiB \\
        --range-file-size 128MiB --epoch-files 1000 --rss-entries 100000 \\
        --repeat 1 --settle 2

Everything it mounts is unmounted in a ``finally``; it stops only the
processes it started, by PID; all traffic goes to 127.0.0.1.  The work
directory is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_write import small_plan, small_pool
from common import (
    BUCKET,
    REGION,
    BenchBase,
    BenchError,
    add_run_arguments,
    add_server_arguments,
    add_tier_fs_argument,
    children_cpu_seconds,
    comma_list,
    cpu_seconds,
    fmt_size,
    io_syscalls,
    log,
    parse_size,
    put_directory_markers,
    py_spy,
    run_in_workdir,
    run_threads,
    table,
    thread_cpu_delta,
    thread_cpu_seconds,
)

CASES = ("copy", "latency", "epoch", "rss")
SHAPES = ("small", "big")
RANGE_READ = 1 << 20
MOUNT_TIMEOUT = 60.0
#: How long a preload may take to start fetching (listing the prefix first).
PRELOAD_START_TIMEOUT = 120.0

# Targets: (what, numerator, denominator, comparison, bound).
COPY_TARGET = 0.9  # tierfs preload MB/s >= 0.9 x s5cmd cp
LATENCY_TARGET = 2.0  # median during a preload <= 2 x idle
EPOCH_TARGET = 2.0  # epoch with order-aware prefetch >= 2 x faster
COLD_READ_TARGET = 0.8  # target: 8-thread cold small-file reads >= 0.8 x 8 threads of GETs
#: Variants of the epoch case: the same keys GET by boto3 threads (the
#: reference), then tierfs without and with order-aware prefetch.
EPOCH_VARIANTS = ("gets", "without", "with", "two")
EPOCH_LABELS = {
    "gets": "boto3 GETs, no mount",
    "without": "epoch without prefetch",
    "with": "epoch with prefetch",
    "two": "two jobs side by side, each its order",
}
RSS_TARGET_MB = 100.0  # daemon RSS growth for the long list


def fmt_rate(value: float) -> str:
    """Files per second: whole numbers, or two decimals below 10 (one big file)."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[rank]


def proc_status_kib(pid: int, field_name: str) -> int | None:
    """A ``kB`` field (VmRSS, VmHWM) of /proc/PID/status, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler:
    """Samples a process's VmRSS every ``interval`` s in a thread; ``peak_kib``."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            value = proc_status_kib(self.pid, "VmRSS")
            if value is not None:
                self.peak_kib = max(self.peak_kib, value)
                self.samples += 1
            if self._stop.wait(self.interval):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskUse:
    """What a block device did between two readings of its stat file."""

    read_bytes: int
    written_bytes: int
    busy: float

    def describe(self) -> str:
        return (
            f"disk read {self.read_bytes / 1e6:,.0f} MB, written {self.written_bytes / 1e6:,.0f} MB,"
            f" busy {100 * self.busy:.0f}%"
        )


class DiskMeter:
    """Reads /sys/dev/block/MAJ:MIN/stat of the device under a path (the
    tier's disk, where the S3 server's data lives too)."""

    SECTOR = 512

    def __init__(self, path: Path) -> None:
        dev = os.stat(path).st_dev
        self.stat_file = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")

    def read(self) -> tuple[int, int, int, float] | None:
        """(sectors read, sectors written, io_ticks ms, when), None if unknown."""
        try:
            fields = [int(v) for v in self.stat_file.read_text().split()]
        except (OSError, ValueError):
            return None
        return fields[2], fields[6], fields[9], time.monotonic()

    def since(self, before: tuple[int, int, int, float] | None) -> DiskUse | None:
        after = self.read()
        if before is None or after is None:
            return None
        seconds = max(1e-9, after[3] - before[3])
        return DiskUse(
            (after[0] - before[0]) * self.SECTOR,
            (after[1] - before[1]) * self.SECTOR,
            min(1.0, (after[2] - before[2]) / 1e3 / seconds),
        )


@dataclass
class Copy:
    seconds: float
    files: int
    nbytes: int
    #: CPU seconds of the client: the tierfs daemon, or the peer's process.
    daemon_cpu: float = 0.0
    #: CPU seconds of the S3 server during the copy.
    server_cpu: float = 0.0
    #: The tier's disk during the copy: bytes read, bytes written, share of the time busy.
    disk: DiskUse | None = None
    #: Read and write system calls of the S3 server during the copy (its
    #: /proc/PID/io ``syscr + syscw``): s3rver reads the object in 64 KiB
    #: chunks and writes each to the socket, so at least 32 per MiB; more
    #: when its socket writes come back short (the socket buffer is full:
    #: the client drains it slower than the server fills it), and each short
    #: write costs the server an epoll round as well.
    server_syscalls: int = 0

    @property
    def gib(self) -> float:
        return self.nbytes / (1 << 30)

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6

    @property
    def server_syscalls_per_mib(self) -> float:
        return self.server_syscalls / (self.nbytes / (1 << 20))


@dataclass
class Results:
    copies: dict[str, list[Copy]] = field(default_factory=dict)
    #: "small idle", "small during", "range idle", "range during" -> seconds per read
    latencies: dict[str, list[float]] = field(default_factory=dict)
    #: "without", "with", "two" -> epoch seconds
    epochs: dict[str, list[float]] = field(default_factory=dict)
    #: per round of "two": seconds until each job's last file
    epoch_jobs: list[list[float]] = field(default_factory=list)
    rss: list[dict[str, float]] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)

    def add_copy(self, case: str, sample: Copy) -> None:
        self.copies.setdefault(case, []).append(sample)
        cpu = (
            f", client CPU {sample.daemon_cpu:.1f}s ({sample.daemon_cpu / sample.gib:.2f} s/GiB), "
            f"server CPU {sample.server_cpu:.1f}s ({sample.server_cpu / sample.gib:.2f} s/GiB, "
            f"{100 * sample.server_cpu / sample.seconds:.0f}% of a core)"
        )
        disk = f"; {sample.disk.describe()}" if sample.disk is not None else ""
        if sample.server_syscalls:
            cpu += f", server syscalls {sample.server_syscalls_per_mib:.1f}/MiB"
        log(
            f"  {case}: {sample.seconds:.2f}s, {fmt_rate(sample.files_per_s)} files/s, "
            f"{sample.mbps:,.0f} MB/s{cpu}{disk}"
        )

    def copy_median(self, case: str) -> Copy | None:
        samples = self.copies.get(case)
        if not samples:
            return None
        return sorted(samples, key=lambda s: s.seconds)[len(samples) // 2]


# --- the bench ------------------------------------------------------------------------------


class PreloadBench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.cases = set(args.cases)
        self.results = Results()
        self.src = work / "tier-fs" / "src"  # the data set, on the tiers' filesystem
        self.tier = work / "tier-fs" / "nvme"
        #: The disk of the tier, of the peers' copies and of the S3 server's data.
        self.disk = DiskMeter(work)
        self.state = work / "tierfs-state"
        self.small = small_plan(args.files, args.seed, args.file_min, args.file_max, args.dirs)
        self.small_bytes = sum(size for _rel, size, _off in self.small)
        self.latency_files = small_plan(
            2 * args.latency_reads, args.seed + 1, args.file_min, args.file_max, 1
        )

    @property
    def has_small(self) -> bool:
        """Is ``small/`` in the bucket?"""
        return bool(self.cases & {"copy", "epoch", "rss"})

    def check_prerequisites(self) -> None:
        self.check_common_prerequisites({"rclone"} if "copy" in self.cases else set())

    # --- the data set ---

    def write_small(self, root: Path, plan: list[tuple[str, int, int]], seed: int) -> None:
        pool = memoryview(small_pool(seed))
        for rel, size, offset in plan:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(pool[offset : offset + size])

    @staticmethod
    def write_random(path: Path, size: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        chunk = 16 << 20
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n

    def upload(self) -> None:
        a = self.args
        self.run_quiet(self.s5cmd("mb", f"s3://{BUCKET}"))
        parts: list[tuple[str, Path]] = []
        if self.has_small:
            log(f"writing {a.files:,} small files ({self.small_bytes / 1e6:,.0f} MB)")
            self.write_small(self.src / "small", self.small, a.seed)
            parts.append(("small", self.src / "small"))
        if self.cases & {"copy", "latency"}:
            log(f"writing {fmt_size(a.big_size)} of random bytes")
            self.write_random(self.src / "big" / "big.bin", a.big_size)
            parts.append(("big", self.src / "big"))
        if "latency" in self.cases:
            self.write_small(self.src / "lat", self.latency_files, a.seed + 1)
            self.write_random(self.src / "lat-big" / "range.bin", a.range_file_size)
            parts += [("lat", self.src / "lat"), ("lat-big", self.src / "lat-big")]
        for prefix, local in parts:
            t0 = time.perf_counter()
            self.run_quiet(self.s5cmd("cp", f"{local}/*", f"s3://{BUCKET}/{prefix}/"))
            log(f"uploaded {prefix}/ in {time.perf_counter() - t0:.1f}s")
        put_directory_markers(self.endpoint, [f"{prefix}/" for prefix, _local in parts])

    # --- tierfs ---

    def tierfs_config(self, endpoint: str | None = None) -> Path:
        a = self.args
        lines = [
            "[backing]",
            f'url = "s3://{BUCKET}"',
            f'endpoint_url = "{endpoint or self.endpoint}"',
            f'region = "{REGION}"',
            "[state]",
            f'dir = "{self.state}"',
            "[[tiers]]",
            'name = "nvme"',
            f'path = "{self.tier}"',
        ]
        fetch = []
        if a.block_size:
            fetch.append(f'block_size = "{fmt_size(a.block_size)}"')
        if a.concurrency:
            fetch.append(f"concurrency = {a.concurrency}")
        if fetch:
            lines += ["[fetch]", *fetch]
        cfg = self.work / "tierfs.toml"
        cfg.write_text("\n".join([*lines, ""]))
        return cfg

    @contextlib.contextmanager
    def tierfs_mount(self, endpoint: str | None = None) -> Iterator[tuple[Path, int]]:
        """A fresh mount (of ``endpoint``, default s3rver): empty state
        directory and tier; yields (mountpoint, daemon PID)."""
        for d in (self.state, self.tier):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        mp = self.work / "mnt-tierfs"
        mp.mkdir(exist_ok=True)
        cmd = [self.tierfs_bin, "mount", str(self.tierfs_config(endpoint)), str(mp)]
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=MOUNT_TIMEOUT
        )
        pid: int | None = None
        try:
            if done.returncode != 0:
                raise BenchError(f"tierfs mount failed: {done.stderr.strip()}")
            pid = int(self.tierfs_status(mp)["pid"])
            yield mp, pid
        finally:
            self.unmount_tierfs(mp, pid)

    def tierfs_status(self, mp: Path) -> dict[str, Any]:
        status: dict[str, Any] = json.loads(
            self.run_quiet([self.tierfs_bin, "status", str(mp), "--json"]).stdout
        )
        return status

    def server_cpu(self) -> float:
        """CPU seconds the S3 server has used so far."""
        proc = getattr(self, "s3_server_proc", None)
        return cpu_seconds(proc.pid if proc is not None else None)

    def server_syscalls(self) -> int:
        """Read and write system calls the S3 server has made so far (0 if unknown)."""
        proc = getattr(self, "s3_server_proc", None)
        return io_syscalls(proc.pid if proc is not None else None)

    def cached_bytes(self, path: Path) -> int:
        (item,) = json.loads(self.run_quiet([self.tierfs_bin, "where", "--json", str(path)]).stdout)
        return int(item["cached_bytes"])

    def preload(self, path: Path, *extra: str) -> dict[str, Any]:
        """``tierfs preload PATH --json EXTRA...`` until it exits; its summary
        line, with ``scan_seconds`` added: when the first event of the state
        "fetching" came, that is when the scan ended (to within one progress
        interval; the fetch pass runs beside the scan from the start)."""
        cmd = [self.tierfs_bin, "preload", str(path), "--json", *extra]
        started = time.perf_counter()
        scan_seconds: float | None = None
        lines: list[str] = []
        with subprocess.Popen(
            cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            for line in proc.stdout:
                lines.append(line)
                if scan_seconds is None and '"fetching"' in line:
                    scan_seconds = time.perf_counter() - started
            err = proc.stderr.read()
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} exited {proc.returncode}: {err.strip()}")
        summary: dict[str, Any] = json.loads(lines[-1])
        if summary.get("files_failed"):
            raise BenchError(f"tierfs preload of {path}: {summary['files_failed']} files failed")
        summary["scan_seconds"] = scan_seconds
        return summary

    # --- copy: preload against s5cmd cp and rclone copy ---

    def shape(self, shape: str) -> tuple[int, int]:
        """(files, bytes) of a shape."""
        if shape == "small":
            return len(self.small), self.small_bytes
        return 1, self.args.big_size

    def local_copy(self, case: str, shape: str, cmd: list[str], dest: Path) -> None:
        files, nbytes = self.shape(shape)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        self.drop_caches()
        server0, client0 = self.server_cpu(), children_cpu_seconds()
        calls0 = self.server_syscalls()
        disk0 = self.disk.read()
        t0 = time.perf_counter()
        self.run_quiet(cmd)
        dt = time.perf_counter() - t0
        disk = self.disk.since(disk0)
        server, client = self.server_cpu() - server0, children_cpu_seconds() - client0
        calls = self.server_syscalls() - calls0
        got = [p.stat().st_size for p in dest.rglob("*") if p.is_file()]
        if len(got) != files or sum(got) != nbytes:
            raise BenchError(
                f"{case}: {len(got)} files of {sum(got)} bytes, not {files} of {nbytes}"
            )
        self.results.add_copy(case, Copy(dt, files, nbytes, client, server, disk, calls))
        shutil.rmtree(dest, ignore_errors=True)

    def case_s5cmd(self, shape: str) -> None:
        dest = self.work / "tier-fs" / "dl-s5cmd"
        cmd = self.s5cmd("cp", f"s3://{BUCKET}/{shape}/*", f"{dest}/")
        self.local_copy(f"s5cmd cp {shape}", shape, cmd, dest)

    def case_rclone(self, shape: str) -> None:
        dest = self.work / "tier-fs" / "dl-rclone"
        conf = self.work / "rclone.conf"
        conf.touch()
        self.rclone_remote_env()
        n = str(self.args.rclone_transfers)
        cmd = ["rclone", "copy", f"bench:{BUCKET}/{shape}", str(dest), "--config", str(conf)]
        cmd += ["--transfers", n, "--checkers", n]
        self.local_copy(f"rclone copy {shape}", shape, cmd, dest)

    def case_tierfs_copy(self, shape: str, round_no: int) -> None:
        files, nbytes = self.shape(shape)
        spy = self.args.py_spy if round_no == 0 else None
        with self.tierfs_mount() as (mp, pid):
            self.drop_caches()
            cpu0, server0 = cpu_seconds(pid), self.server_cpu()
            threads0 = thread_cpu_seconds(pid)
            calls0 = self.server_syscalls()
            disk0 = self.disk.read()
            with py_spy(spy, pid, f"preload-{shape}"):
                t0 = time.perf_counter()
                summary = self.preload(mp / shape)
                dt = time.perf_counter() - t0
            disk = self.disk.since(disk0)
            cpu, server = cpu_seconds(pid) - cpu0, self.server_cpu() - server0
            log(
                f"  tierfs daemon CPU by thread: {thread_cpu_delta(threads0, thread_cpu_seconds(pid))}"
            )
            if summary["scan_seconds"] is not None:
                log(f"  tierfs preload {shape}: scan over after {summary['scan_seconds']:.2f}s")
            calls = self.server_syscalls() - calls0
            if summary["files_total"] != files or summary["bytes_total"] != nbytes:
                raise BenchError(f"tierfs preload {shape}: summary {summary}")
            cached = self.cached_bytes(mp / shape)
            if cached != nbytes:
                raise BenchError(f"tierfs preload {shape}: {cached} of {nbytes} bytes cached")
            self.results.add_copy(
                f"tierfs preload {shape}",
                Copy(dt, files, nbytes, cpu, server, disk, calls),
            )
            if round_no == 0:
                self.check_content(mp / shape, self.src / shape)

    def check_content(self, mounted: Path, local: Path) -> None:
        """A few files read back through the mount (from the tier) equal the source."""
        sources = sorted(p for p in local.rglob("*") if p.is_file())
        picks = random.Random(self.args.seed).sample(sources, min(5, len(sources)))
        for src in picks:
            through = mounted / src.relative_to(local)
            done = subprocess.run(["cmp", str(src), str(through)], capture_output=True, text=True)
            if done.returncode != 0:
                raise BenchError(f"tierfs returned different bytes for {through}")
        self.results.notes[f"content check of {local.name}/ (cmp after preload)"] = (
            f"{len(picks)} files identical"
        )

    # --- latency: demand reads during a preload ---

    @staticmethod
    def timed_read(path: Path, offset: int | None) -> float:
        """Seconds from open to the last byte: the whole file, or 1 MiB at ``offset``."""
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            if offset is None:
                while os.read(fd, 1 << 20):
                    pass
            else:
                got = os.pread(fd, RANGE_READ, offset)
                if len(got) != RANGE_READ:
                    raise BenchError(f"short read of {path} at {offset}")
        finally:
            os.close(fd)
        return time.perf_counter() - t0

    def read_pairs(
        self, mp: Path, files: list[str], offsets: list[int], still_running: Any
    ) -> tuple[list[float], list[float], int]:
        """Alternate small-file and range reads; only reads that ended while
        ``still_running()`` count.  (small, range, reads not counted)."""
        small: list[float] = []
        ranged: list[float] = []
        dropped = 0
        for rel, offset in zip(files, offsets, strict=True):
            for target, off, into in (
                (mp / "lat" / rel, None, small),
                (mp / "lat-big" / "range.bin", offset, ranged),
            ):
                seconds = self.timed_read(target, off)
                if still_running():
                    into.append(seconds)
                else:
                    dropped += 1
        return small, ranged, dropped

    def case_latency(self) -> None:
        k = self.args.latency_reads
        names = [rel for rel, _size, _off in self.latency_files]
        span = self.args.range_file_size // (2 * k)
        if span < 2 * RANGE_READ:
            raise BenchError("--range-file-size is too small for 2 x --latency-reads cold ranges")
        offsets = [(i * span) // RANGE_READ * RANGE_READ for i in range(2 * k)]
        with self.tierfs_mount() as (mp, _pid):
            # Listed first: the timed reads need no LIST, idle or not.
            for d in ("lat", "lat-big", "big", *(("small",) if self.has_small else ())):
                for _ in (mp / d).rglob("*"):
                    pass
            self.drop_caches()
            small, ranged, _ = self.read_pairs(mp, names[0::2], offsets[0::2], lambda: True)
            self.results.latencies.setdefault("small idle", []).extend(small)
            self.results.latencies.setdefault("range idle", []).extend(ranged)
            targets = [str(mp / "big")] + ([str(mp / "small")] if self.has_small else [])
            proc = subprocess.Popen(
                [self.tierfs_bin, "preload", *targets, "--json"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            small: list[float] = []
            ranged: list[float] = []
            dropped = 0
            try:
                fetched0 = self.wait_preload_fetching(mp, proc)
                if fetched0 is None:
                    self.results.notes["latency"] = (
                        "the preload ended before the reads could start: make --big-size larger"
                    )
                else:
                    t0 = time.perf_counter()
                    small, ranged, dropped = self.read_pairs(
                        mp, names[1::2], offsets[1::2], lambda: proc.poll() is None
                    )
                    dt = time.perf_counter() - t0
                    if proc.poll() is None:
                        rate = (self.preload_fetched(mp) - fetched0) / dt / 1e6
                        key = "latency: preload rate during the reads"
                        self.results.notes[key] = self.results.notes.get(key, "") + (
                            f"{rate:,.0f} MB/s; "
                        )
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)  # Ctrl-C: the preload is cancelled
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.results.latencies.setdefault("small during", []).extend(small)
            self.results.latencies.setdefault("range during", []).extend(ranged)
            key = "latency: reads that ended after the preload (not counted)"
            previous = int(self.results.notes.get(key, "0").split()[0])
            self.results.notes[key] = f"{previous + dropped} of {2 * k * self.args.repeat}"
            log(
                f"  latency: idle small {1e3 * statistics.median(self.results.latencies['small idle']):.1f} ms, "
                f"during {len(small)} small reads counted ({dropped} after the preload)"
            )

    def preload_fetched(self, mp: Path) -> int:
        jobs = self.tierfs_status(mp)["preloads"]
        return sum(int(j["bytes_fetched"]) for j in jobs if j["state"] == "fetching")

    def wait_preload_fetching(self, mp: Path, proc: subprocess.Popen[bytes]) -> int | None:
        """Wait until the preload fetches (bytes_fetched > 0); its bytes fetched
        then, or None if it ended first (with success: it was too short)."""
        deadline = time.monotonic() + PRELOAD_START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if proc.returncode == 0:
                    return None
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise BenchError(f"tierfs preload exited {proc.returncode}: {err.strip()}")
            fetched = self.preload_fetched(mp)
            if fetched:
                return fetched
            time.sleep(0.05)
        raise BenchError("the preload did not start fetching")

    # --- epoch: shuffled reads, with and without order-aware prefetch ---

    def read_epoch(self, mp: Path, order: list[str]) -> None:
        lock = threading.Lock()
        position = iter(order)

        def reader() -> None:
            buf = bytearray(1 << 20)
            while True:
                with lock:
                    rel = next(position, None)
                if rel is None:
                    return
                with open(mp / rel, "rb", buffering=0) as f:
                    while f.readinto(buf):
                        pass

        run_threads(reader, self.args.readers, "epoch read failed")

    def read_jobs(self, mp: Path, orders: list[list[str]]) -> list[float]:
        """Each order read by its own ``--readers`` / len(orders) threads, all
        at once (two jobs on one node); seconds until each job's last file."""
        lock = threading.Lock()
        positions = [iter(order) for order in orders]
        done = [0.0] * len(orders)
        per_job = max(1, self.args.readers // len(orders))
        starts = iter(range(per_job * len(orders)))
        t0 = time.perf_counter()

        def reader() -> None:
            with lock:
                job = next(starts) % len(orders)
            buf = bytearray(1 << 20)
            while True:
                with lock:
                    rel = next(positions[job], None)
                if rel is None:
                    with lock:
                        done[job] = max(done[job], time.perf_counter() - t0)
                    return
                with open(mp / rel, "rb", buffering=0) as f:
                    while f.readinto(buf):
                        pass

        run_threads(reader, per_job * len(orders), "epoch read failed")
        return done

    def case_epoch(self, round_no: int) -> None:
        files = [f"small/{rel}" for rel, _size, _off in self.small[: self.args.epoch_files]]
        order = list(files)
        random.Random(self.args.seed * 1000 + round_no).shuffle(order)
        with self.slow_endpoint() as endpoint:
            for variant in self.args.epoch_variants:
                if variant == "gets":
                    self.epoch_gets(order, endpoint)
                else:
                    self.epoch_variant(variant, order, endpoint, round_no)

    def epoch_gets(self, order: list[str], endpoint: str | None) -> None:
        """The reference: the epoch's keys fetched whole by
        ``--readers`` threads of boto3 GETs (one shared client), no mount."""
        import boto3
        from botocore.config import Config as BotoConfig

        client = boto3.session.Session(
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            config=BotoConfig(max_pool_connections=2 * self.args.readers),
        )
        lock = threading.Lock()
        position = iter(order)

        def reader() -> None:
            while True:
                with lock:
                    key = next(position, None)
                if key is None:
                    return
                client.get_object(Bucket=BUCKET, Key=key)["Body"].read()

        self.drop_caches()
        t0 = time.perf_counter()
        run_threads(reader, self.args.readers, "epoch GETs failed")
        dt = time.perf_counter() - t0
        self.results.epochs.setdefault("gets", []).append(dt)
        log(f"  epoch of boto3 GETs: {dt:.2f}s ({len(order) / dt:,.0f} files/s)")

    @contextlib.contextmanager
    def slow_endpoint(self) -> Iterator[str | None]:
        """With ``--s3-delay``: a FaultProxy holding every s3rver response that
        long; yields its endpoint (None: s3rver directly)."""
        if not self.args.s3_delay:
            yield None
            return
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.faults import FaultProxy

        with FaultProxy("127.0.0.1", self.port) as proxy:
            proxy.delay = self.args.s3_delay
            yield proxy.endpoint

    def epoch_variant(
        self, variant: str, order: list[str], endpoint: str | None, round_no: int
    ) -> None:
        import tierfs.client

        spy = self.args.py_spy if round_no == 0 else None
        with self.tierfs_mount(endpoint) as (mp, pid):
            for _ in (mp / "small").rglob("*"):  # listed, as a Dataset's file list does
                pass
            self.drop_caches()
            cpu0 = cpu_seconds(pid)
            with py_spy(spy, pid, f"epoch-{variant}"):
                t0 = time.perf_counter()
                if variant == "with":
                    tierfs.client.set_order(mp, order)
                if variant == "two":  # two jobs, each its half, its readers, its order
                    halves = [order[: len(order) // 2], order[len(order) // 2 :]]
                    for job, half in zip("ab", halves, strict=True):
                        tierfs.client.set_order(mp, half, job=f"bench-{job}")
                order_s = time.perf_counter() - t0
                if variant == "two":
                    jobs = self.read_jobs(mp, halves)
                    self.results.epoch_jobs.append(jobs)
                else:
                    self.read_epoch(mp, order)
                dt = time.perf_counter() - t0
            cpu = cpu_seconds(pid) - cpu0
            self.results.epochs.setdefault(variant, []).append(dt)
            note = ""
            if variant in ("with", "two"):
                p = self.tierfs_status(mp)["prefetch"] or {}
                note = (
                    f", set_order {order_s:.2f}s"
                    f", prefetched {p.get('files_prefetched', 0):,} files, hits "
                    f"{p.get('hits', 0):,} of {p.get('opens', 0):,} opens"
                )
                if variant == "two":
                    note += f", jobs done at {jobs[0]:.2f}s and {jobs[1]:.2f}s"
                self.results.notes[f"{EPOCH_LABELS[variant]}, round {round_no + 1}"] = note[2:]
            log(
                f"  epoch {variant} prefetch: {dt:.2f}s ({len(order) / dt:,.0f} files/s, "
                f"daemon CPU {cpu:.1f}s{note})"
            )

    # --- rss: a long preload list ---

    def case_rss(self) -> None:
        entries = self.args.rss_entries
        names = [f"small/{rel}" for rel, _size, _off in self.small]
        with self.tierfs_mount() as (mp, pid):
            listing = self.work / "preload-list.txt"
            with listing.open("w") as f:
                f.write(f"{mp}/{names[0]}\n")  # absolute: names the mount
                for i in range(1, entries):
                    f.write(f"{names[i % len(names)]}\n")
            for _ in (mp / "small").rglob("*"):
                pass
            rss0 = proc_status_kib(pid, "VmRSS") or 0
            hwm0 = proc_status_kib(pid, "VmHWM") or 0
            t0 = time.perf_counter()
            with RssSampler(pid) as sampler:
                done = subprocess.run(
                    [self.tierfs_bin, "preload", "--from-file", str(listing), "--json"],
                    env=self.env,
                    capture_output=True,
                    text=True,
                )
            dt = time.perf_counter() - t0
            if done.returncode != 0:
                raise BenchError(f"tierfs preload of the list: {done.stderr.strip()[-500:]}")
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            if summary["files_total"] != entries:
                raise BenchError(f"the list preload counted {summary['files_total']} entries")
            hwm1 = proc_status_kib(pid, "VmHWM") or 0
            peak = max(sampler.peak_kib, hwm1)
            sample = {
                "entries": entries,
                "seconds": dt,
                "rss_before_mb": rss0 * 1024 / 1e6,
                "hwm_before_mb": hwm0 * 1024 / 1e6,
                "peak_mb": peak * 1024 / 1e6,
                "growth_mb": (peak - max(rss0, hwm0)) * 1024 / 1e6,
                "samples": sampler.samples,
            }
            self.results.rss.append(sample)
            log(
                f"  rss: {entries:,} entries in {dt:.1f}s; RSS {sample['rss_before_mb']:.0f} MB "
                f"before, peak {sample['peak_mb']:.0f} MB, growth {sample['growth_mb']:.1f} MB"
            )

    # --- the run ---

    def run(self) -> None:
        self.check_prerequisites()
        with self.tier_filesystem(self.work / "tier-fs"), self.s3_server():
            self.upload()
            background: list[str] = []
            for r in range(self.args.repeat):
                log(f"round {r + 1} of {self.args.repeat}")
                background.append(f"{100 * self.wait_idle():.0f}%")
                self.results.notes["CPU busy with other work before each round"] = (
                    ", ".join(background) + " (more than a few % means the figures are noisy)"
                )
                if "copy" in self.cases:
                    for shape in self.args.shapes:
                        self.attempt(f"s5cmd cp {shape}", self.case_s5cmd, shape)
                        self.attempt(f"tierfs preload {shape}", self.case_tierfs_copy, shape, r)
                        self.attempt(f"rclone copy {shape}", self.case_rclone, shape)
                if "latency" in self.cases:
                    self.attempt("latency", self.case_latency)
                if "epoch" in self.cases:
                    self.attempt("epoch", self.case_epoch, r)
            if "rss" in self.cases:  # once: it is long, and its figure is a peak
                self.attempt("rss", self.case_rss)

    def attempt(self, case: str, run: Callable[..., None], *args: Any) -> None:
        """Run one case; a failure is reported (ERROR in the notes) and the
        other cases go on."""
        try:
            run(*args)
        except (BenchError, subprocess.SubprocessError, OSError) as exc:
            log(f"  {case}: ERROR: {exc}")
            self.results.notes[f"ERROR in {case}"] = str(exc)[:400]


# --- report ---------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def paired_ratios(res: Results, tierfs_case: str, peer_case: str) -> list[float]:
    """The speed ratio of each round (peer seconds / tierfs seconds of the
    same round): the machine's load moves both, so a round's ratio is less
    noisy than the ratio of two medians.  Empty when a case failed in some
    round (the rounds no longer pair up)."""
    ours, theirs = res.copies.get(tierfs_case, []), res.copies.get(peer_case, [])
    if not ours or len(ours) != len(theirs):
        return []
    return [p.seconds / t.seconds for t, p in zip(ours, theirs, strict=True)]


def report(res: Results, a: argparse.Namespace) -> str:
    lines: list[str] = [
        f"small/: {a.files:,} files of {fmt_size(a.file_min)}-{fmt_size(a.file_max)}; "
        f"big/: one file of {fmt_size(a.big_size)}; {a.repeat} rounds (median); "
        f"S3 server s3rver; {os.cpu_count()} CPUs; settle {a.settle:g}s; tierfs [fetch] "
        f"block_size={fmt_size(a.block_size) if a.block_size else 'default'} "
        f"concurrency={a.concurrency or 'default'}; rclone --transfers {a.rclone_transfers}",
        "",
    ]
    if res.copies:
        rows = []
        for case, samples in res.copies.items():
            m = res.copy_median(case)
            assert m is not None
            rows.append(
                [
                    case,
                    f"{m.seconds:.2f}",
                    fmt_rate(m.files_per_s),
                    f"{m.mbps:,.0f}",
                    f"{m.daemon_cpu / m.gib:.2f}",
                    f"{m.server_cpu / m.gib:.2f}",
                    f"{100 * m.server_cpu / m.seconds:.0f}%",
                    f"{m.server_syscalls_per_mib:.1f}",
                    str(len(samples)),
                ]
            )
        lines += table(
            [
                "copy (until the command exits)",
                "s",
                "files/s",
                "MB/s",
                "client CPU s/GiB",
                "server CPU s/GiB",
                "server busy",
                "server syscalls/MiB",
                "n",
            ],
            rows,
        )
        lines.append("")
        rows = []
        for shape in SHAPES:
            t = res.copy_median(f"tierfs preload {shape}")
            for peer, target in (("s5cmd cp", COPY_TARGET), ("rclone copy", None)):
                p = res.copy_median(f"{peer} {shape}")
                if t is None or p is None:
                    continue
                ratio = p.seconds / t.seconds
                cases = (f"tierfs preload {shape}", f"{peer} {shape}")
                rounds = paired_ratios(res, *cases)
                paired = statistics.median(rounds) if rounds else None
                judged = paired if paired is not None else ratio
                rows.append(
                    [
                        *cases,
                        f"{ratio:.2f}",
                        " ".join(f"{r:.2f}" for r in rounds),
                        f"{paired:.2f}" if paired is not None else "-",
                        f">= {target:g}" if target else "info",
                        verdict(judged >= target) if target else "",
                    ]
                )
        lines += table(
            [
                "case",
                "vs",
                "ratio of medians",
                "by round",
                "median of rounds",
                "target",
                "result",
            ],
            rows,
            left={0, 1, 3},
        )
        lines.append(
            "(the result is judged on the median of the rounds' ratios, see the module docstring)"
        )
        lines.append("")
    if res.latencies:
        rows = []
        for kind in ("small", "range"):
            idle = res.latencies.get(f"{kind} idle", [])
            during = res.latencies.get(f"{kind} during", [])
            for what, values in (("idle", idle), ("during preload", during)):
                if values:
                    rows.append(
                        [
                            f"{'small file' if kind == 'small' else '1 MiB range'} {what}",
                            f"{1e3 * statistics.median(values):.1f}",
                            f"{1e3 * percentile(values, 0.9):.1f}",
                            str(len(values)),
                        ]
                    )
        lines += table(["demand read", "median ms", "p90 ms", "reads"], rows)
        rows = []
        for kind in ("small", "range"):
            idle = res.latencies.get(f"{kind} idle", [])
            during = res.latencies.get(f"{kind} during", [])
            if idle and during:
                ratio = statistics.median(during) / statistics.median(idle)
                rows.append(
                    [
                        f"{kind} during / idle (median)",
                        f"{ratio:.2f}",
                        f"<= {LATENCY_TARGET:g}",
                        verdict(ratio <= LATENCY_TARGET),
                    ]
                )
        lines.append("")
        lines += table(["latency", "ratio", "target", "result"], rows)
        lines.append("")
    if res.epochs:
        rows = []
        for variant in EPOCH_VARIANTS:
            values = res.epochs.get(variant, [])
            if values:
                med = statistics.median(values)
                rows.append(
                    [
                        EPOCH_LABELS[variant],
                        f"{med:.2f}",
                        f"{a.epoch_files / med:,.0f}",
                        str(len(values)),
                    ]
                )
        delay = f", S3 delay {a.s3_delay:g}s" if a.s3_delay else ""
        lines += table(
            [f"epoch ({a.readers} readers, shuffled, cold{delay})", "s", "files/s", "n"], rows
        )
        if res.epochs.get("without") and res.epochs.get("gets"):
            ratio = statistics.median(res.epochs["gets"]) / statistics.median(res.epochs["without"])
            lines.append(
                f"cold reads without prefetch / the same GETs from {a.readers} boto3 threads: "
                f"{ratio:.2f} (target >= {COLD_READ_TARGET:g}) "
                f"{verdict(ratio >= COLD_READ_TARGET)}"
            )
        if res.epochs.get("without") and res.epochs.get("with"):
            ratio = statistics.median(res.epochs["without"]) / statistics.median(res.epochs["with"])
            # On loopback the epoch is CPU-bound (s3rver, the daemon and the
            # readers share the machine): a prefetch keeps more GETs in
            # flight, which pays only while each GET waits on the network.
            judged = (
                verdict(ratio >= EPOCH_TARGET)
                if a.s3_delay
                else "info (the target applies to a bucket far away: --s3-delay)"
            )
            lines.append(
                f"speed-up with prefetch: {ratio:.2f} (target >= {EPOCH_TARGET:g}) {judged}"
            )
        if res.epochs.get("with") and res.epochs.get("two"):
            both = statistics.median(res.epochs["two"]) / statistics.median(res.epochs["with"])
            spread = [max(jobs) / min(jobs) for jobs in res.epoch_jobs if min(jobs) > 0]
            lines.append(
                f"two jobs side by side / one order over the same files: {both:.2f} (info: "
                "the orders share the fills); slower job / faster job per round: "
                + ", ".join(f"{x:.2f}" for x in spread)
                + " (1.00: an even share)"
            )
        lines.append("")
    for sample in res.rss:
        lines.append(
            f"daemon RSS during a {int(sample['entries']):,}-entry preload list "
            f"({sample['seconds']:.0f}s): {sample['rss_before_mb']:.0f} MB before, peak "
            f"{sample['peak_mb']:.0f} MB, growth {sample['growth_mb']:.1f} MB (target <= "
            f"{RSS_TARGET_MB:g} MB) {verdict(sample['growth_mb'] <= RSS_TARGET_MB)}"
        )
        lines.append("")
    for k, v in res.notes.items():
        lines.append(f"{k}: {v}")
    return "\n".join(line.rstrip() for line in lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_preload.py",
        description="Preload and prefetch benchmark: tierfs preload vs s5cmd cp and "
        "rclone copy, demand-read latency during a preload, a shuffled epoch with and without "
        "order-aware prefetch, daemon RSS during a long preload list. See the module docstring.",
    )
    p.add_argument(
        "--cases",
        default=",".join(CASES),
        type=comma_list,
        help=f"cases to run ({','.join(CASES)})",
    )
    p.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        type=comma_list,
        help=f"shapes of the copy case ({','.join(SHAPES)})",
    )
    p.add_argument(
        "--epoch-variants",
        default=",".join(EPOCH_VARIANTS),
        type=comma_list,
        help=f"variants of the epoch case ({','.join(EPOCH_VARIANTS)})",
    )
    p.add_argument("--files", type=int, default=10_000, help="small files (10000)")
    p.add_argument("--file-min", type=parse_size, default=parse_size("20KiB"))
    p.add_argument("--file-max", type=parse_size, default=parse_size("200KiB"))
    p.add_argument("--dirs", type=int, default=10, help="directories of the small files (10)")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--big-size", type=parse_size, default=parse_size("1GiB"), help="(1GiB)")
    p.add_argument(
        "--latency-reads", type=int, default=20, help="reads of each kind, idle and during (20)"
    )
    p.add_argument(
        "--range-file-size",
        type=parse_size,
        default=parse_size("512MiB"),
        help="the cold big file of the 1 MiB range reads (512MiB)",
    )
    p.add_argument(
        "--epoch-files", type=int, default=None, help="files in the epoch (all of --files)"
    )
    p.add_argument("--readers", type=int, default=8, help="reader threads of the epoch (8)")
    p.add_argument(
        "--s3-delay",
        type=float,
        default=0.0,
        help="epoch case: reach s3rver through a proxy that holds every response this many "
        "seconds, as a far-away bucket would (0: directly)",
    )
    p.add_argument(
        "--rss-entries", type=int, default=1_000_000, help="lines of the preload list (1000000)"
    )
    p.add_argument("--rclone-transfers", type=int, default=16, help="rclone copy --transfers (16)")
    p.add_argument("--block-size", type=parse_size, default=None, help="tierfs [fetch] block_size")
    p.add_argument("--concurrency", type=int, default=None, help="tierfs [fetch] concurrency")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (3)")
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds to wait after dropping the page cache (10; see bench_read.py)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=120.0,
        help="before each round, wait up to this many seconds for other work to stop (120)",
    )
    add_server_arguments(p)
    add_tier_fs_argument(p)
    add_run_arguments(p, json_help="also write the raw figures here")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="record py-spy profiles of the first preloads here",
    )
    args = p.parse_args(argv)
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        p.error(f"unknown case: {', '.join(bad)}")
    bad = [x for x in args.shapes if x not in SHAPES] + [
        x for x in args.epoch_variants if x not in EPOCH_VARIANTS
    ]
    if bad:
        p.error(f"unknown shape or epoch variant: {', '.join(bad)}")
    if args.repeat < 1 or args.files < 1 or args.latency_reads < 1:
        p.error("--repeat, --files and --latency-reads must be at least 1")
    if args.epoch_files is None:
        args.epoch_files = args.files
    if not 1 <= args.epoch_files <= args.files:
        p.error("--epoch-files must be from 1 to --files")
    if args.rclone_serve:
        p.error("--rclone-serve: this bench runs on s3rver only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench, code = run_in_workdir(
        args, "tierfs-bench-preload-", lambda work: PreloadBench(args, work)
    )
    if bench is not None:
        res = bench.results
        if res.copies or res.latencies or res.epochs or res.rss:
            if code:
                print("(incomplete run)")
            print(report(res, args))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps(
                    {
                        "args": {k: str(v) for k, v in vars(args).items()},
                        "copies": {c: [asdict(s) for s in v] for c, v in res.copies.items()},
                        "latencies": res.latencies,
                        "epochs": res.epochs,
                        "rss": res.rss,
                        "notes": res.notes,
                    },
                    indent=2,
                )
            )
    return code


if __name__ == "__main__":
    sys.exit(main())
