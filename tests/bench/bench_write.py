#!/usr/bin/env python3
"""Write benchmark: tierfs against s5cmd, rclone mount and s3fs on one local S3 server.

Run it through ``bash tests/bench/run.sh write`` (installs the peers), as root:
``drop_caches`` and FUSE mounts need it.  Not a test: never collected by
pytest, never run in CI.  Shared pieces (s3rver, mounts, cleanup, idle wait,
FUSE tracing) are in ``common.py``.

What one run does
-----------------
1. Starts ``s3rver`` on 127.0.0.1 and a free port, creates the bucket, and
   writes the source of the big write: ``--size`` (2 GiB) of random bytes in
   a file on the tier's filesystem (``--source zero`` reads /dev/zero
   instead).  Each tool writes under its own prefix of the bucket
   (``tierfs/``, ``rclone/``, ``s3fs/``, ``s5cmd/``); objects are deleted
   after each case.
2. Repeats ``--repeat`` rounds (3), every case once per round, so that the
   cases interleave and the machine's drift hits them all alike.  Before
   each case of the big write: page cache dropped, the source read back into
   the page cache (a checkpoint is written from memory), ``--settle`` s of
   quiet.

   Big write, a checkpoint (``dd if=SOURCE of=... bs=1M conv=fsync``):

   * ``dd direct``: into a directory on the tier's filesystem;
   * ``s5cmd cp``: upload of the source file (the reference for
     time-to-durable: the bytes are already local and go straight up);
   * ``tierfs write``: ``dd`` into a fresh tierfs mount (empty state and
     tier, ``[write] upload_delay = --upload-delay``, an nvme tier of
     ``--tier-capacity``); ``tierfs flush`` of the file: ``tierfs durable``
     is dd + flush, ``tierfs flush`` the flush alone;
   * ``rclone write``/``durable``: ``rclone mount --vfs-cache-mode full
     --vfs-write-back 1s``, dd, then the time until a HEAD of the object
     shows the full size (polled every 50 ms);
   * ``s3fs write``/``durable``: the same through ``s3fs -o use_cache``
     (s3fs uploads in fsync/close, so both times are about equal).

   Small files: ``--files`` (10,000) files of random sizes in
   [``--file-min``, ``--file-max``] (4-128 KiB, sizes and bytes from
   ``--seed``), in ``--dirs`` (10) directories, written by a separate Python
   process with one open/write/close per file from bytes prepared in memory;
   only that loop is timed (``written``).  ``in bucket``: from the start of
   the loop until every object is in the bucket: ``tierfs flush`` of the
   mount; for rclone until ``rclone rc vfs/stats`` shows no upload queued or
   in progress; then, for the peers, a listing must show every key with its
   size (the time taken is the start of that listing, the benefit of the
   doubt going to the peer); ``tierfs small flush``: that flush alone (from
   its start).  References: ``small direct`` (the same loop
   into a directory on the tier's filesystem) and ``s5cmd cp small`` (an
   upload of that directory).
3. Prints the median of every case, then the ratios against the targets of
   the write-path issue, side by side from this one run, and notes: the FUSE
   requests each mount received in the last round (count, mean WRITE size,
   median latency from the kernel's ``fuse`` tracepoints, when the kernel
   has them), tierfsd's CPU split between its main thread (trio loop, FUSE
   handlers) and its other threads, and the machine's background load.

tierfs cleans up stale multipart uploads at mount, beside its uploads;
s3rver answers that listing with 501 (not implemented), which tierfs takes
as final.

CPU columns: seconds of the FUSE daemon, of s3rver and of this script's
children (dd, s5cmd, the writer process, ``tierfs flush``) during the
timed span; busy: share of all CPUs in use during it.

``--py-spy DIR`` adds one unmeasured tierfs pass after the rounds and
records py-spy profiles of tierfsd during the dd, the flush, the small-file
loop and its flush (``tests/bench/spy_top.py`` summarises them).

Everything it mounts is unmounted in a ``finally`` (``tierfs umount`` or
``fusermount3 -u``, then ``-uz``); it stops only the processes it started,
by PID; all traffic goes to 127.0.0.1.  Temporary files are removed at the
end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    BUCKET,
    REGION,
    BenchBase,
    BenchError,
    FuseTrace,
    OpStats,
    add_run_arguments,
    add_server_arguments,
    add_tier_fs_argument,
    children_cpu_seconds,
    comma_list,
    cpu_seconds,
    drop_caches,
    fmt_size,
    free_port,
    fuse_summary,
    log,
    parse_size,
    py_spy,
    run_in_workdir,
    server_name,
    system_cpu_ticks,
    table,
)

CASES = ("direct", "s5cmd", "tierfs", "rclone", "s3fs")
PARTS = ("big", "small")
CKPT = "ckpt"
SMALL = "small"
POOL_SIZE = 4 << 20  # small files are slices of one random pool this big

# Targets of the write-path issue: (label, numerator case, denominator case,
# metric, comparison, target).  "s" ratios are times (lower is better).
TARGETS: list[tuple[str, str, str, str, str, float]] = [
    ("fsynced write", "tierfs write", "dd direct", "MB/s", ">=", 0.7),
    ("time to durable", "tierfs durable", "s5cmd cp", "s", "<=", 1.3),
    ("small files written", "tierfs small written", "rclone small written", "files/s", ">=", 2),
    ("small files written", "tierfs small written", "s3fs small written", "files/s", ">=", 2),
    # target: small files reach the bucket at >= 0.8x s5cmd cp of the same files
    ("small files in bucket", "tierfs small in bucket", "s5cmd cp small", "files/s", ">=", 0.8),
]
INFO: list[tuple[str, str, str, str]] = [
    ("upload only", "tierfs flush", "s5cmd cp", "s"),
    ("fsynced write", "tierfs write", "rclone write", "MB/s"),
    ("fsynced write", "tierfs write", "s3fs write", "MB/s"),
    ("time to durable", "tierfs durable", "rclone durable", "s"),
    ("time to durable", "tierfs durable", "s3fs durable", "s"),
    ("small files written", "tierfs small written", "small direct", "files/s"),
    ("small files in bucket", "tierfs small in bucket", "rclone small in bucket", "files/s"),
    ("small files in bucket", "tierfs small in bucket", "s3fs small in bucket", "files/s"),
    ("small files, flush only", "tierfs small flush", "s5cmd cp small", "files/s"),
]


# --- small files ---------------------------------------------------------------------------


def small_plan(count: int, seed: int, lo: int, hi: int, dirs: int) -> list[tuple[str, int, int]]:
    """(relative path, size, offset in the pool) of every small file."""
    rng = random.Random(seed)
    per_dir = -(-count // dirs)
    plan = []
    for i in range(count):
        size = rng.randint(lo, hi)
        offset = rng.randrange(0, POOL_SIZE - size + 1)
        plan.append((f"d{i // per_dir:02d}/f{i:05d}", size, offset))
    return plan


def small_pool(seed: int) -> bytes:
    return random.Random(seed ^ 0x5EED).randbytes(POOL_SIZE)


def small_writer(spec: str) -> int:
    """The writer process: prepare every file's bytes, then time one
    open/write/close per file.  Prints {"t0", "t1"} (time.monotonic, which
    is system-wide, so the parent can compare it with its own clock)."""
    a = json.loads(spec)
    root = Path(a["root"])
    plan = small_plan(a["files"], a["seed"], a["min"], a["max"], a["dirs"])
    pool = memoryview(small_pool(a["seed"]))
    jobs = [(str(root / rel), pool[off : off + size]) for rel, size, off in plan]
    for d in sorted({os.path.dirname(p) for p, _ in jobs}):
        os.makedirs(d, exist_ok=True)
    t0 = time.monotonic()
    for path, data in jobs:
        with open(path, "wb", buffering=0) as f:
            f.write(data)
    t1 = time.monotonic()
    print(json.dumps({"t0": t0, "t1": t1}))
    return 0


# --- results -------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    nbytes: int
    files: int = 0
    daemon_cpu: float = 0.0  # CPU seconds of the FUSE daemon during the span
    server_cpu: float = 0.0  # of s3rver
    client_cpu: float = 0.0  # of this script's children (dd, s5cmd, writer, tierfs flush)
    busy: float = 0.0  # share of all CPUs busy during the span (0..1)
    main_cpu: float | None = None  # tierfsd: CPU seconds of its main thread


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, case: str, s: Sample) -> None:
        self.samples.setdefault(case, []).append(s)
        what = f"{s.nbytes / s.seconds / 1e6:,.0f} MB/s"
        if s.files:
            what = f"{s.files / s.seconds:,.0f} files/s, {what}"
        extra = f", daemon CPU {s.daemon_cpu:.2f}s" if s.daemon_cpu else ""
        if s.main_cpu is not None:
            extra += f" (main thread {s.main_cpu:.2f}s)"
        extra += f", s3rver CPU {s.server_cpu:.2f}s" if s.server_cpu else ""
        extra += f", client CPU {s.client_cpu:.2f}s, CPUs {100 * s.busy:.0f}% busy"
        log(f"  {case}: {s.seconds:.2f}s, {what}{extra}")

    def seconds(self, case: str) -> float | None:
        values = [s.seconds for s in self.samples.get(case, [])]
        return statistics.median(values) if values else None

    def value(self, case: str, metric: str) -> float | None:
        """The case's median in ``metric``: s, MB/s or files/s."""
        secs = self.seconds(case)
        if secs is None:
            return None
        first = self.samples[case][0]
        if metric == "s":
            return secs
        if metric == "MB/s":
            return first.nbytes / secs / 1e6
        return first.files / secs


def thread_cpu(pid: int | None) -> float | None:
    """CPU seconds of the main thread of ``pid`` (tierfsd: the trio loop)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """CPU and busy counters from now until ``stop``."""

    def __init__(self, server_pid: int | None, daemon_pid: int | None, main: bool) -> None:
        self.server_pid, self.daemon_pid, self.main = server_pid, daemon_pid, main
        self.t0 = time.monotonic()
        self.d0, self.s0 = cpu_seconds(daemon_pid), cpu_seconds(server_pid)
        self.m0 = thread_cpu(daemon_pid) if main else None
        self.c0, self.b0 = children_cpu_seconds(), system_cpu_ticks()

    def stop(self, seconds: float, nbytes: int, files: int = 0) -> Sample:
        b1 = system_cpu_ticks()
        m1 = thread_cpu(self.daemon_pid) if self.main else None
        return Sample(
            seconds=seconds,
            nbytes=nbytes,
            files=files,
            daemon_cpu=cpu_seconds(self.daemon_pid) - self.d0,
            server_cpu=cpu_seconds(self.server_pid) - self.s0,
            client_cpu=children_cpu_seconds() - self.c0,
            busy=(b1[0] - self.b0[0]) / max(1, b1[1] - self.b0[1]),
            main_cpu=(m1 - self.m0) if (m1 is not None and self.m0 is not None) else None,
        )


# --- the bench ------------------------------------------------------------------------------


class WriteBench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.size: int = args.size
        self.results = Results()
        self.cases = set(args.cases)
        self.parts = set(args.parts)
        self.tierdir = work / "tier-fs"  # the tier's filesystem: tiers, source, direct writes
        self.source = self.tierdir / "source.bin"
        self.plan = small_plan(args.files, args.seed, args.file_min, args.file_max, args.dirs)
        self.small_bytes = sum(size for _, size, _ in self.plan)
        self.trace: FuseTrace | None = None
        self.fuse_ops: dict[str, dict[str, OpStats]] = {}
        self.s3 = None

    def check_prerequisites(self) -> None:
        self.check_common_prerequisites(self.cases)

    # --- S3 access from this process (polling, listing, cleanup) ---

    def s3_client(self):  # type: ignore[no-untyped-def]
        if self.s3 is None:
            import boto3
            from botocore.config import Config

            self.s3 = boto3.session.Session(
                aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                region_name=REGION,
            ).client(
                "s3",
                endpoint_url=self.endpoint,
                config=Config(
                    s3={"addressing_style": "path"},
                    retries={"max_attempts": 3},
                    proxies={},
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                ),
            )
        return self.s3

    def head_size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(self.s3_client().head_object(Bucket=BUCKET, Key=key)["ContentLength"])
        except ClientError:
            return None

    def listing(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        pages = self.s3_client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = int(obj["Size"])
        return out

    def missing_small(self, prefix: str) -> int:
        """How many small files are not (yet) in the bucket with their size."""
        have = self.listing(f"{prefix}/{SMALL}/")
        return sum(1 for rel, size, _ in self.plan if have.get(f"{prefix}/{SMALL}/{rel}") != size)

    def clear_prefix(self, prefix: str) -> None:
        self.run_quiet(self.s5cmd("rm", f"s3://{BUCKET}/{prefix}/*"), check=False)
        left = self.listing(f"{prefix}/")
        if left:
            s3 = self.s3_client()
            keys = list(left)
            for i in range(0, len(keys), 1000):
                s3.delete_objects(
                    Bucket=BUCKET,
                    Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
                )

    def run_quiet(
        self, cmd: list[str], check: bool = True, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        if check:
            return super().run_quiet(cmd, **kw)
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, **kw)  # type: ignore[call-overload]

    # --- setup ---

    def setup(self) -> None:
        self.tierdir.mkdir(exist_ok=True)
        if self.args.source == "file" and "big" in self.parts:
            log(f"writing {fmt_size(self.size)} of random bytes to {self.source.name}")
            chunk = 16 << 20
            with open(self.source, "wb") as f:
                left = self.size
                while left:
                    n = min(chunk, left)
                    f.write(os.urandom(n))
                    left -= n
        self.run_quiet(self.s5cmd("mb", f"s3://{BUCKET}"))
        # Directory markers for the peers' mount roots (s3fs wants its root to exist).
        for prefix in ("rclone", "s3fs"):
            self.s3_client().put_object(Bucket=BUCKET, Key=f"{prefix}/", Body=b"")
        self.rclone_remote_env()
        if not self.args.no_fuse_trace:
            self.trace = FuseTrace(self.work)
            if not self.trace.available:
                self.results.notes["FUSE requests"] = f"not traced: {self.trace.why_not}"

    def prepare_big(self) -> None:
        """Page cache dropped, the source read back into it, then --settle s."""
        drop_caches()
        if self.args.source == "file":
            with open(self.source, "rb", buffering=0) as f:
                buf = bytearray(16 << 20)
                while f.readinto(buf):
                    pass
        time.sleep(self.args.settle)

    def dd_write(self, dest: Path) -> float:
        """Seconds of ``dd ... of=dest bs=1M conv=fsync``; checks the byte count."""
        if self.args.source == "file":
            src = [f"if={self.source}"]
        else:
            src = ["if=/dev/zero", f"count={self.size >> 20}"]
        t0 = time.perf_counter()
        done = subprocess.run(
            ["dd", *src, f"of={dest}", "bs=1M", "conv=fsync"], capture_output=True, text=True
        )
        dt = time.perf_counter() - t0
        m = re.search(r"^(\d+) bytes", done.stderr, re.M)
        if done.returncode != 0 or not m or int(m.group(1)) != self.size:
            raise BenchError(f"dd to {dest} failed: {done.stderr.strip()}")
        return dt

    def meter(self, daemon_pid: int | None = None, main: bool = False) -> Meter:
        return Meter(self.s3_server_proc.pid if self.s3_server_proc else None, daemon_pid, main)

    @contextlib.contextmanager
    def traced(self, mp: Path, name: str) -> Iterator[None]:
        """FUSE requests of ``mp`` during the block, kept per ``name`` (last round wins)."""
        if self.trace is None or not self.trace.available:
            yield
            return
        ops: dict[str, OpStats] = {}
        with self.trace.record(mp, ops):
            yield
        self.fuse_ops[name] = ops

    def wait_big(self, key: str, timeout_from: float) -> float:
        """Poll HEAD until ``key`` has the full size; the monotonic time it did."""
        while True:
            if self.head_size(key) == self.size:
                return time.monotonic()
            if time.monotonic() - timeout_from > self.args.durable_timeout:
                raise BenchError(f"s3://{BUCKET}/{key} not complete after --durable-timeout")
            time.sleep(0.05)

    # --- big write: references ---

    def case_direct(self) -> None:
        dest = self.tierdir / "direct" / CKPT
        dest.parent.mkdir(exist_ok=True)
        self.prepare_big()
        m = self.meter()
        dt = self.dd_write(dest)
        self.results.add("dd direct", m.stop(dt, self.size))
        dest.unlink()

    def case_s5cmd(self) -> None:
        if self.args.source != "file":
            return
        self.prepare_big()
        m = self.meter()
        t0 = time.perf_counter()
        self.run_quiet(self.s5cmd("cp", str(self.source), f"s3://{BUCKET}/s5cmd/{CKPT}"))
        dt = time.perf_counter() - t0
        self.results.add("s5cmd cp", m.stop(dt, self.size))
        if self.head_size(f"s5cmd/{CKPT}") != self.size:
            raise BenchError("s5cmd cp uploaded the wrong number of bytes")
        self.clear_prefix("s5cmd")

    # --- tierfs ---

    def tierfs_config(self) -> Path:
        cfg = self.work / "tierfs.toml"
        cfg.write_text(
            "\n".join(
                [
                    "[backing]",
                    f'url = "s3://{BUCKET}/tierfs"',
                    f'endpoint_url = "{self.endpoint}"',
                    f'region = "{REGION}"',
                    "[state]",
                    f'dir = "{self.work / "tierfs-state"}"',
                    "[[tiers]]",
                    'name = "nvme"',
                    f'path = "{self.tierdir / "nvme"}"',
                    f'capacity = "{fmt_size(self.args.tier_capacity)}"',
                    "[write]",
                    f'upload_delay = "{self.args.upload_delay:g}s"',
                    "",
                ]
            )
        )
        return cfg

    @contextlib.contextmanager
    def tierfs_mount(self) -> Iterator[tuple[Path, int | None]]:
        """A fresh tierfs: empty state dir and tier, nothing under tierfs/ in the bucket."""
        for d in (self.work / "tierfs-state", self.tierdir / "nvme"):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        mp = self.work / "mnt-tierfs"
        mp.mkdir(exist_ok=True)
        cmd = [self.tierfs_bin, "mount", str(self.tierfs_config()), str(mp)]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        pid: int | None = None
        try:
            if done.returncode != 0:
                raise BenchError(f"tierfs mount failed: {done.stderr.strip()}")
            status = self.tierfs_status(mp)
            pid = int(status["pid"])
            yield mp, pid
        finally:
            self.unmount_tierfs(mp, pid)
            self.clear_prefix("tierfs")

    def tierfs_status(self, mp: Path) -> dict:  # type: ignore[type-arg]
        return json.loads(self.run_quiet([self.tierfs_bin, "status", str(mp), "--json"]).stdout)

    def tierfs_flush(self, path: Path) -> None:
        self.run_quiet([self.tierfs_bin, "flush", str(path)], timeout=self.args.durable_timeout)

    def case_tierfs_big(self, spy: Path | None = None) -> None:
        with self.tierfs_mount() as (mp, pid):
            self.prepare_big()
            with self.traced(mp, f"tierfs {fmt_size(self.size)} write + flush"):
                md = self.meter(pid, main=True)
                mw = self.meter(pid, main=True)
                t0 = time.monotonic()
                with py_spy(spy, pid, "tierfs-big-write"):
                    self.dd_write(mp / CKPT)
                t1 = time.monotonic()
                sw = mw.stop(t1 - t0, self.size)
                mf = self.meter(pid, main=True)
                with py_spy(spy, pid, "tierfs-big-flush"):
                    self.tierfs_flush(mp / CKPT)
                t2 = time.monotonic()
                sf, sd = mf.stop(t2 - t1, self.size), md.stop(t2 - t0, self.size)
            got = self.head_size(f"tierfs/{CKPT}")
            if got != self.size:
                raise BenchError(f"after tierfs flush the object has {got} bytes, not {self.size}")
            status = self.tierfs_status(mp)
            if spy is not None:
                return
            self.results.add("tierfs write", sw)
            self.results.add("tierfs flush", sf)
            self.results.add("tierfs durable", sd)
            c = status.get("counters", {})
            self.results.notes[f"tierfs after the {fmt_size(self.size)} flush"] = (
                f"dirty_bytes={status.get('dirty_bytes')} pending_uploads="
                f"{status.get('pending_uploads')} uploaded_bytes={c.get('uploaded_bytes')}"
            )
            if self.round_no == self.args.repeat - 1 and self.args.source == "file":
                self.check_big_content()

    def check_big_content(self) -> None:
        """The object tierfs uploaded has the source's bytes (one s5cmd cat | cmp)."""
        cat = subprocess.Popen(
            self.s5cmd("cat", f"s3://{BUCKET}/tierfs/{CKPT}"),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        done = subprocess.run(
            ["cmp", "-", str(self.source)], stdin=cat.stdout, capture_output=True, text=True
        )
        assert cat.stdout is not None
        cat.stdout.close()
        cat.wait()
        ok = done.returncode == 0 and cat.returncode == 0
        self.results.notes["content check (bucket object tierfs/ckpt vs source)"] = (
            "identical" if ok else f"DIFFERENT: {done.stdout.strip() or done.stderr.strip()}"
        )
        if not ok:
            raise BenchError("the object tierfs uploaded differs from what dd wrote")

    # --- rclone and s3fs ---

    def rclone_mount(self, cache: Path, rc_port: int) -> contextlib.AbstractContextManager[int]:
        mp = self.work / "mnt-rclone"
        mp.mkdir(exist_ok=True)
        conf = self.work / "rclone.conf"
        conf.touch()
        cmd = ["rclone", "mount", f"bench:{BUCKET}/rclone", str(mp), "--config", str(conf)]
        cmd += ["--vfs-cache-mode", "full", "--cache-dir", str(cache)]
        cmd += ["--vfs-write-back", f"{self.args.rclone_write_back:g}s"]
        cmd += ["--rc", "--rc-addr", f"127.0.0.1:{rc_port}", "--rc-no-auth"]
        return self.mount_peer("rclone", cmd, mp, lambda: os.listdir(mp) is not None)

    def s3fs_mount(self, cache: Path) -> contextlib.AbstractContextManager[int]:
        mp = self.work / "mnt-s3fs"
        mp.mkdir(exist_ok=True)
        opts = [
            f"url={self.endpoint}",
            "use_path_request_style",
            f"passwd_file={self.s3fs_passwd()}",
            f"use_cache={cache}",
            f"endpoint={REGION}",
        ]
        cmd = ["s3fs", f"{BUCKET}:/s3fs", str(mp), "-f", "-o", ",".join(opts)]
        return self.mount_peer("s3fs", cmd, mp, lambda: os.listdir(mp) is not None)

    @contextlib.contextmanager
    def peer(self, name: str) -> Iterator[tuple[Path, int, Callable[[], bool]]]:
        """A fresh mount of ``name``; yields (mount point, pid, uploads_idle)."""
        cache = self.work / f"{name}-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        try:
            if name == "rclone":
                rc_port = free_port()
                with self.rclone_mount(cache, rc_port) as pid:
                    yield self.work / "mnt-rclone", pid, lambda: self.rclone_idle(rc_port)
            else:
                with self.s3fs_mount(cache) as pid:
                    yield self.work / "mnt-s3fs", pid, lambda: True
        finally:
            shutil.rmtree(cache, ignore_errors=True)
            self.clear_prefix(name)
            self.s3_client().put_object(Bucket=BUCKET, Key=f"{name}/", Body=b"")

    @staticmethod
    def rclone_idle(rc_port: int) -> bool:
        """rclone rc vfs/stats: no upload in progress or queued (write-back delay included)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        req = urllib.request.Request(
            f"http://127.0.0.1:{rc_port}/vfs/stats", data=b"{}", method="POST"
        )
        req.add_header("Content-Type", "application/json")
        try:
            with opener.open(req, timeout=5) as resp:
                stats = json.loads(resp.read())
        except OSError:
            return True  # no rc: rely on the listing
        cache = stats.get("diskCache", {})
        return not cache.get("uploadsInProgress", 0) and not cache.get("uploadsQueued", 0)

    def case_peer_big(self, name: str) -> None:
        with self.peer(name) as (mp, pid, _idle):
            self.prepare_big()
            with self.traced(mp, f"{name} {fmt_size(self.size)} write"):
                md, mw = self.meter(pid), self.meter(pid)
                t0 = time.monotonic()
                self.dd_write(mp / CKPT)
                t1 = time.monotonic()
                sw = mw.stop(t1 - t0, self.size)
                t2 = self.wait_big(f"{name}/{CKPT}", t0)
                sd = md.stop(t2 - t0, self.size)
            self.results.add(f"{name} write", sw)
            self.results.add(f"{name} durable", sd)

    # --- small files ---

    def write_small(self, root: Path) -> tuple[float, float]:
        """Run the writer process into ``root``; its (t0, t1), monotonic."""
        a = self.args
        spec = {
            "root": str(root),
            "files": a.files,
            "seed": a.seed,
            "min": a.file_min,
            "max": a.file_max,
            "dirs": a.dirs,
        }
        done = self.run_quiet([sys.executable, __file__, "--small-writer", json.dumps(spec)])
        times = json.loads(done.stdout.strip().splitlines()[-1])
        return float(times["t0"]), float(times["t1"])

    def prepare_small(self) -> None:
        drop_caches()
        time.sleep(self.args.settle)

    def small_sample(self, m: Meter, seconds: float) -> Sample:
        return m.stop(seconds, self.small_bytes, self.args.files)

    def case_small_direct(self) -> None:
        root = self.tierdir / "direct-small"
        self.prepare_small()
        m = self.meter()
        t0, t1 = self.write_small(root)
        self.results.add("small direct", self.small_sample(m, t1 - t0))
        if "s5cmd" in self.cases:
            os.sync()
            self.prepare_small()
            m = self.meter()
            s0 = time.perf_counter()
            self.run_quiet(self.s5cmd("cp", f"{root}/*", f"s3://{BUCKET}/s5cmd/{SMALL}/"))
            dt = time.perf_counter() - s0
            self.results.add("s5cmd cp small", self.small_sample(m, dt))
            missing = self.missing_small("s5cmd")
            if missing:
                raise BenchError(f"s5cmd cp left {missing} small files out of the bucket")
            self.clear_prefix("s5cmd")
        shutil.rmtree(root)

    def case_tierfs_small(self, spy: Path | None = None) -> None:
        with self.tierfs_mount() as (mp, pid):
            self.prepare_small()
            with self.traced(mp, f"tierfs {self.args.files} small files"):
                mw, md = self.meter(pid, main=True), self.meter(pid, main=True)
                with py_spy(spy, pid, "tierfs-small-write"):
                    t0, t1 = self.write_small(mp / SMALL)
                sw = self.small_sample(mw, t1 - t0)
                mf = self.meter(pid, main=True)
                f0 = time.monotonic()
                with py_spy(spy, pid, "tierfs-small-flush"):
                    self.tierfs_flush(mp)
                t2 = time.monotonic()
                sd = self.small_sample(md, t2 - t0)
                sf = self.small_sample(mf, t2 - f0)
            missing = self.missing_small("tierfs")
            if missing:
                raise BenchError(f"after tierfs flush, {missing} small files are not in the bucket")
            if spy is None:
                self.results.add("tierfs small written", sw)
                self.results.add("tierfs small in bucket", sd)
                self.results.add("tierfs small flush", sf)
                self.check_small_content("tierfs")

    def check_small_content(self, prefix: str, samples: int = 20) -> None:
        pool = small_pool(self.args.seed)
        s3 = self.s3_client()
        bad = 0
        for rel, size, off in random.Random(self.round_no).sample(self.plan, samples):
            body = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{SMALL}/{rel}")["Body"].read()
            bad += body != pool[off : off + size]
        self.results.notes[f"content check ({samples} random small files of {prefix})"] = (
            "identical" if not bad else f"{bad} DIFFERENT"
        )
        if bad:
            raise BenchError(f"{bad} small files in the bucket differ from what was written")

    def case_peer_small(self, name: str) -> None:
        with self.peer(name) as (mp, pid, idle):
            self.prepare_small()
            with self.traced(mp, f"{name} {self.args.files} small files"):
                mw, md = self.meter(pid), self.meter(pid)
                t0, t1 = self.write_small(mp / SMALL)
                sw = self.small_sample(mw, t1 - t0)
                while True:
                    if time.monotonic() - t0 > self.args.durable_timeout:
                        raise BenchError(f"{name}: small files not in the bucket in time")
                    if not idle():
                        time.sleep(0.1)
                        continue
                    t2 = time.monotonic()
                    if not self.missing_small(name):
                        break
                    time.sleep(0.5)
                sd = self.small_sample(md, t2 - t0)
            self.results.add(f"{name} small written", sw)
            self.results.add(f"{name} small in bucket", sd)

    # --- the run ---

    def run(self) -> None:
        self.check_prerequisites()
        self.round_no = 0
        try:
            with self.tier_filesystem(self.tierdir), self.s3_server():
                self.setup()
                background: list[str] = []
                for r in range(self.args.repeat):
                    self.round_no = r
                    log(f"round {r + 1} of {self.args.repeat}")
                    background.append(f"{100 * self.wait_idle():.0f}%")
                    self.results.notes["CPU busy with other work before each round"] = (
                        ", ".join(background) + " (more than a few % means the figures are noisy)"
                    )
                    if "big" in self.parts:
                        if "direct" in self.cases:
                            self.case_direct()
                        if "s5cmd" in self.cases:
                            self.case_s5cmd()
                        if "tierfs" in self.cases:
                            self.case_tierfs_big()
                        for name in ("rclone", "s3fs"):
                            if name in self.cases:
                                self.case_peer_big(name)
                    if "small" in self.parts:
                        if "direct" in self.cases:
                            self.case_small_direct()
                        if "tierfs" in self.cases:
                            self.case_tierfs_small()
                        for name in ("rclone", "s3fs"):
                            if name in self.cases:
                                self.case_peer_small(name)
                self.note_fuse()
                if self.args.py_spy is not None and "tierfs" in self.cases:
                    log("profiling pass (py-spy, not measured)")
                    if "big" in self.parts:
                        self.case_tierfs_big(spy=self.args.py_spy)
                    if "small" in self.parts:
                        self.case_tierfs_small(spy=self.args.py_spy)
        finally:
            if self.trace is not None:
                self.trace.close()

    def note_fuse(self) -> None:
        for name, ops in self.fuse_ops.items():
            self.results.notes[f"FUSE requests, {name}"] = fuse_summary(ops)


# --- report ---------------------------------------------------------------------------------------


def fmt_value(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if metric == "s" else f"{v:,.0f}"


def report(res: Results, a: argparse.Namespace) -> str:
    """The two tables and the notes, as printed (and pasted into README.md)."""
    lines: list[str] = []
    source = "a random file in the page cache" if a.source == "file" else "/dev/zero"
    lines.append(
        f"big write {fmt_size(a.size)} (dd bs=1M conv=fsync, from {source}); "
        f"{a.files:,} small files of {fmt_size(a.file_min)}-{fmt_size(a.file_max)} "
        f"(seed {a.seed}) in {a.dirs} dirs; {a.repeat} rounds (median); tierfs "
        f"[write] upload_delay={a.upload_delay:g}s, one tier of {fmt_size(a.tier_capacity)}; "
        f"rclone --vfs-write-back {a.rclone_write_back:g}s; S3 server {server_name(a)}; "
        f"{os.cpu_count()} CPUs; "
        f"settle {a.settle:g}s"
    )
    lines.append("")
    rows = []
    for case, samples in res.samples.items():
        secs = [s.seconds for s in samples]
        files = res.value(case, "files/s")
        daemon = statistics.median(s.daemon_cpu for s in samples)
        mains = [s.main_cpu for s in samples if s.main_cpu is not None]
        rows.append(
            [
                case,
                f"{statistics.median(secs):.2f}",
                f"{min(secs):.2f}",
                f"{max(secs):.2f}",
                fmt_value(res.value(case, "MB/s"), "MB/s"),
                fmt_value(files, "files/s") if samples[0].files else "",
                str(len(samples)),
                f"{daemon:.2f}" + (f" ({statistics.median(mains):.2f})" if mains else ""),
                f"{statistics.median(s.server_cpu for s in samples):.2f}",
                f"{statistics.median(s.client_cpu for s in samples):.2f}",
                f"{100 * statistics.median(s.busy for s in samples):.0f}%",
            ]
        )
    header = ["case", "s", "min", "max", "MB/s", "files/s", "n", "daemon s", "server s"]
    lines += table([*header, "client s", "busy"], rows)
    lines.append(
        "(s: median seconds; MB/s = 10^6 bytes/s; CPU seconds during the span: daemon = the "
        "FUSE daemon (tierfsd's main thread in parentheses), the S3 server, client = dd, s5cmd, the "
        "writer process, tierfs flush; busy: share of all CPUs in use)"
    )
    lines.append("")

    rows = []
    counted: list[str] = []
    for label, num, den, metric, op, target in TARGETS:
        n, d = res.value(num, metric), res.value(den, metric)
        if n is None or d is None:
            continue
        ratio = n / d
        ok = ratio >= target if op == ">=" else ratio <= target
        counted.append("PASS" if ok else "FAIL")
        rows.append(
            [
                f"{label}, {metric}",
                num,
                fmt_value(n, metric),
                den,
                fmt_value(d, metric),
                f"{ratio:.2f}",
                f"{op} {target:g}",
                counted[-1],
            ]
        )
    for label, num, den, metric in INFO:
        n, d = res.value(num, metric), res.value(den, metric)
        if n is None or d is None:
            continue
        rows.append(
            [
                f"{label}, {metric}",
                num,
                fmt_value(n, metric),
                den,
                fmt_value(d, metric),
                f"{n / d:.2f}",
                "info",
                "",
            ]
        )
    header = ["metric", "tierfs", "", "vs", "", "ratio", "target", "result"]
    lines += table(header, rows, left={0, 1, 3, 6, 7})
    lines.append("")
    lines.append(
        "(ratio = tierfs / other; for times (s) lower is better, so time to durable "
        "passes at <= 1.3)"
    )
    lines.append(f"targets met by tierfs: {counted.count('PASS')} of {len(counted)}")
    if res.notes:
        lines.append("")
        for k, v in res.notes.items():
            lines.append(f"{k}: {v}")
    return "\n".join(line.rstrip() for line in lines)


def load_results(path: Path) -> tuple[Results, argparse.Namespace]:
    """A run saved with --json, for --report-from."""
    doc = json.loads(path.read_text())
    res = Results(
        samples={c: [Sample(**s) for s in v] for c, v in doc["samples"].items()},
        notes=doc.get("notes", {}),
    )
    args = parse_args([])
    for k, v in doc["args"].items():
        if hasattr(args, k) and k not in ("json", "report_from", "workdir", "py_spy"):
            setattr(args, k, v)
    return res, args


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 1s or 500ms)")
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_write.py",
        description="Write benchmark: tierfs vs s5cmd, rclone mount and s3fs on a local s3rver.",
    )
    p.add_argument("--size", type=parse_size, default=parse_size("2GiB"), help="big write (2GiB)")
    p.add_argument(
        "--source",
        choices=("file", "zero"),
        default="file",
        help="what dd writes: a random file in the page cache, or /dev/zero (file); "
        "s5cmd cp needs the file",
    )
    p.add_argument("--files", type=int, default=10_000, help="small files (10000)")
    p.add_argument("--file-min", type=parse_size, default=parse_size("4KiB"))
    p.add_argument("--file-max", type=parse_size, default=parse_size("128KiB"))
    p.add_argument("--dirs", type=int, default=10, help="directories of the small files (10)")
    p.add_argument("--seed", type=int, default=1, help="small file sizes and bytes (1)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (3)")
    p.add_argument(
        "--parts",
        default="big,small",
        type=comma_list,
        help="big (the 2GiB checkpoint), small (the small files) (big,small)",
    )
    p.add_argument(
        "--cases",
        default=",".join(CASES),
        type=comma_list,
        help=f"cases to run ({','.join(CASES)})",
    )
    p.add_argument("--upload-delay", type=parse_duration, default=1.0, help="tierfs (1s)")
    p.add_argument("--tier-capacity", type=parse_size, default=parse_size("8GiB"))
    p.add_argument("--rclone-write-back", type=parse_duration, default=1.0, help="(1s)")
    p.add_argument(
        "--durable-timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for the bucket to have everything (1800)",
    )
    p.add_argument(
        "--settle", type=float, default=10.0, help="seconds of quiet before each case (10)"
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=120.0,
        help="before each round, wait up to this many seconds for other work to stop (120)",
    )
    p.add_argument(
        "--no-fuse-trace", action="store_true", help="do not trace FUSE requests (tracefs)"
    )
    add_server_arguments(p)
    add_tier_fs_argument(p)
    add_run_arguments(p, json_help="also write raw samples to this file")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="after the rounds, profile one tierfs pass with py-spy into this directory",
    )
    p.add_argument(
        "--report-from", type=Path, default=None, help="print the tables of a run saved with --json"
    )
    args = p.parse_args(argv)
    bad = [c for c in args.cases if c not in CASES] + [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"unknown case or part: {', '.join(bad)}")
    if args.repeat < 1 or args.files < 1 or args.dirs < 1:
        p.error("--repeat, --files and --dirs must be at least 1")
    if not 0 < args.file_min <= args.file_max <= POOL_SIZE:
        p.error(f"need 0 < --file-min <= --file-max <= {fmt_size(POOL_SIZE)}")
    if args.size % (1 << 20):
        p.error("--size must be a whole number of MiB (dd bs=1M)")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--small-writer"]:
        return small_writer(argv[1])
    args = parse_args(argv)
    if args.report_from is not None:
        print(report(*load_results(args.report_from)))
        return 0

    bench, code = run_in_workdir(args, "tierfs-bench-write-", lambda work: WriteBench(args, work))
    if bench is not None and bench.results.samples:
        if code:
            print("(incomplete run)")
        print(report(bench.results, args))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "samples": {c: [s.__dict__ for s in v] for c, v in bench.results.samples.items()},
                "notes": bench.results.notes,
            }
            args.json.write_text(json.dumps(doc, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
