#!/usr/bin/env python3
"""Lifecycle benchmark: the mover and the eviction order through a real tierfs mount.

Run it through ``bash tests/bench/run.sh lifecycle`` as root (``drop_caches``
and FUSE mounts need it).  Not a test: never collected by pytest, never run
in CI.  The backing is ``file://`` (a directory on the local disk): every
figure here is about moving data between the two local tiers, so an S3
server would only add noise and CPU load on a 2-core machine.  The two tier
directories are on the local disk (``--nvme-dir``/``--hdd-dir`` put them on
real NVMe and HDD mounts).  Each case mounts a fresh tierfs (empty state and
tiers) with configured capacities; the watermarks are the config's.

What one run measures, side by side, ``--repeat`` rounds (3; medians):

1. **Demotion throughput** (``--shapes``; default 8 x 256 MiB checkpoints and
   512 x 4 MiB files, ``--demote-size`` 2 GiB each).  The files are read
   through the mount (fetched into the first tier: ``--fill`` 90 % of its
   capacity, above its high watermark of 80 %), with the mover asleep
   (``[mover] interval = "1h"``).  ``policy plan`` names the files the mover
   will move (in its order, until the tier is at its low mark of 10 %).

   * ``cp``: after ``drop_caches``, GNU ``cp --reflink=never`` of exactly
     those cache files from the first tier's directory to a directory on the
     second tier's filesystem.  ``cp`` and not a copy with ``fdatasync``,
     because the mover does not fsync clean blocks either (they exist in the
     backing); both leave the written bytes in the page cache.  ``cp+sync``
     adds the ``sync`` that follows (info: it includes whatever else the
     machine has dirty).
   * ``mover``: after ``drop_caches``, ``tierfs policy reload`` wakes the mover
     (uncapped: ``bandwidth = "0"``); the clock runs from that request until
     ``status`` shows the first tier at or below its low mark (polled every
     50 ms over the control socket, with the CLI's own client: a ``tierfs``
     process per poll would cost a CPU-second a second on this machine).
     MB/s = the mover's ``bytes_moved`` / that time.  ``mover+sync`` as for
     cp.  Two moved files are then compared with the backing byte for byte.

2. **Training reads while the mover demotes** (``--bandwidths``: ``0``, the
   default cap, i.e. none; ``200MiB/s`` and ``50MiB/s``).  The first tier holds
   ``--train-size`` (1 GiB) of training files, pinned by a rule, and
   ``--demote-size`` of other files (2 GiB), 90 % full.  After one read of the
   training files (the first read after a fetch verifies each block's
   xxh3), each measured read is preceded by ``drop_caches`` and reads every
   training file sequentially through the mount (1 MiB ``read`` calls):
   ``idle`` with the mover asleep, then ``moving`` once the mover has started
   moving the other files (woken by ``policy reload``).  The slowdown is
   1 - moving / idle.  A thread reads while the bench polls ``status``; a
   read that outlasts the demotion shows ``overlap`` < 100 % (the share of
   the read time the mover was still above its target), since its end ran
   against an idle mover.

3. **The scan scenario** (the trace of ``tierfs.policy.simulate.scan_trace``
   that ``run.sh eviction`` replays in memory, here through a real mount):
   a first tier of ``--scan-tier`` (512 MiB), default watermarks 0.9/0.8,
   ``[mover] interval = "1s"``; a hot set of 4 MiB files worth a quarter of
   it read three times, then one pass over cold files worth 3x the tier,
   with one hot file read (in turn) after every 4 cold files, so each hot
   file comes back after a whole tier's worth of cold data.  Before each hot
   read, ``posix_fadvise(DONTNEED)`` drops the kernel's cached pages of that
   file, so the daemon serves it (checked: every hot read must reach the
   daemon).  Counted from ``status`` before and after each hot read during
   the pass: block lookups (one per FUSE read request and block it touches)
   served from the first tier (``hit_blocks`` of the tier), from the second,
   from the daemon's memory of just-fetched blocks, or fetched again.  S3-FIFO (the daemon's) and plain LRU
   (``TIERFS_TEST_EVICTION=lru`` in the daemon's environment) run on the
   same files in the same run.  ``--scan-rates`` (0,40) runs it unpaced and
   with the cold pass paced at 40 MB/s (a training job reads at the GPU's
   pace).  Unpaced, the pass outruns the mover (``interval = "1s"``): the
   first tier fills to its capacity, later cold blocks land on the second
   tier directly, and the hot set stays on the first tier whatever the
   eviction order.  Paced, the mover keeps up and the eviction order decides.

4. Eviction bookkeeping cost per access and RSS per million entries are not
   measured here: ``bash tests/bench/run.sh eviction``.

Prints one table of the samples (median, min, max) and one of the ratios
against the issue's acceptance.  ``--py-spy DIR`` records a py-spy profile
of tierfsd during one extra, unmeasured demotion per shape
(``tests/bench/spy_top.py`` summarises it).

Everything it mounts is unmounted in a ``finally`` (``tierfs umount``, then
``fusermount3 -u``, then ``-uz``); it stops only the processes it started,
by PID.  The work directory is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    VENV_BIN,
    BenchBase,
    BenchError,
    comma_list,
    fmt_size,
    log,
    parse_size,
    py_spy,
    run_in_workdir,
    table,
)

from tierfs.control.client import locate, request
from tierfs.policy.watermarks import mark

MiB = 1 << 20
READ_CHUNK = 1 << 20
POOL_SIZE = 64 * MiB  # every file's bytes are this random pool, rotated
POLL = 0.05  # seconds between status polls while the mover runs
MOVER_TIMEOUT = 600.0
EVICTION_ENV = "TIERFS_TEST_EVICTION"  # tierfs.core.state.space.EVICTION_ENV (bench-only switch)

#: Watermarks of the first tier in the demotion and training-read cases.
HIGH, LOW = 0.8, 0.1
#: The scan scenario, as in tierfs.policy.simulate.scan_trace.
SCAN_FILE = 4 * MiB
SCAN_HOT_FRACTION = 0.25
SCAN_FACTOR = 3.0
SCAN_COLD_PER_HOT = 4
SCAN_WARM_ROUNDS = 3


# --- results -------------------------------------------------------------------------------


@dataclass
class Results:
    #: case -> one value per round (MB/s, or a share for the scan)
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, case: str, value: float) -> None:
        self.samples.setdefault(case, []).append(value)

    def median(self, case: str) -> float | None:
        values = self.samples.get(case)
        return statistics.median(values) if values else None


@dataclass
class Mounted:
    mp: Path
    pid: int
    socket: str

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        return request(self.socket, op, args, timeout=120.0)

    def status(self) -> dict[str, Any]:
        return self.call("status")  # type: ignore[no-any-return]

    @staticmethod
    def tier(status: dict[str, Any], name: str) -> dict[str, Any]:
        (found,) = [t for t in status["tiers"] if t["name"] == name]
        return found  # type: ignore[no-any-return]


# --- file contents -----------------------------------------------------------------------------


class Pool:
    """Bytes of the bench files: one random pool, rotated by a per-file offset."""

    def __init__(self, seed: int) -> None:
        self.data = random.Random(seed).randbytes(POOL_SIZE)
        self.seed = seed

    def write(self, path: Path, size: int) -> None:
        offset = random.Random(f"{self.seed}:{path.name}:{size}").randrange(POOL_SIZE)
        rotated = memoryview(self.data[offset:] + self.data[:offset])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, POOL_SIZE)
                f.write(rotated[:n])
                left -= n


def read_file(path: Path, drop_first: bool = False) -> int:
    """Read the whole file sequentially; returns its bytes.  ``drop_first``:
    drop the kernel's cached pages of this file first, so the daemon serves it."""
    buf = bytearray(READ_CHUNK)
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop_first:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while n := os.readv(fd, [buf]):
            total += n
    finally:
        os.close(fd)
    return total


def mover_progress(status: dict[str, Any]) -> int:
    """Bytes the mover has copied: whole moves, plus the part of the current one."""
    mover = status["mover"]
    current = mover["current"]
    return int(mover["bytes_moved"]) + (int(current["done"]) if current else 0)


def same_content(a: Path, b: Path) -> bool:
    return subprocess.run(["cmp", "-s", str(a), str(b)]).returncode == 0


# --- the bench --------------------------------------------------------------------------------


class LifecycleBench(BenchBase):
    needs_s5cmd = False

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.results = Results()
        self.backing = work / "backing"
        self.nvme_root = args.nvme_dir or work / "nvme"
        self.hdd_root = args.hdd_dir or work / "hdd"
        self.state = work / "state"
        self.pool = Pool(args.seed)
        self.shape_files: dict[str, list[str]] = {}
        self.train_files: list[str] = []
        self.other_files: list[str] = []
        self.hot_files: list[str] = []
        self.cold_files: list[str] = []

    def check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise BenchError("run as root: the bench drops the page cache and mounts FUSE")
        if not Path("/dev/fuse").exists():
            raise BenchError("/dev/fuse is missing: run `bash scripts/install.sh`")
        for tool in ("fusermount3", "cp", "cmp", "sync"):
            self._tool(tool)
        if self.args.py_spy:
            self._tool("py-spy", VENV_BIN / "py-spy")
        for root in (self.nvme_root, self.hdd_root):
            root.mkdir(parents=True, exist_ok=True)

    # --- data in the backing ---

    def make_files(self, prefix: str, count: int, size: int) -> list[str]:
        width = len(str(count - 1))
        names = [f"{prefix}/f{i:0{width}d}.bin" for i in range(count)]
        for name in names:
            self.pool.write(self.backing / name, size)
        return names

    def setup(self) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        a = self.args
        total = 0
        if "demotion" in a.parts:
            for size in a.shapes:
                count = max(1, a.demote_size // size)
                self.shape_files[fmt_size(size)] = self.make_files(
                    f"demote-{fmt_size(size)}", count, size
                )
                total += count * size
        if "reads" in a.parts:
            self.train_files = self.make_files(
                "train", max(1, a.train_size // a.train_file), a.train_file
            )
            self.other_files = self.make_files(
                "other", max(1, a.demote_size // a.train_file), a.train_file
            )
            total += (len(self.train_files) + len(self.other_files)) * a.train_file
        if "scan" in a.parts:
            hot = max(1, int(a.scan_tier * SCAN_HOT_FRACTION) // SCAN_FILE)
            cold = int(a.scan_tier * SCAN_FACTOR) // SCAN_FILE
            self.hot_files = self.make_files("hot", hot, SCAN_FILE)
            self.cold_files = self.make_files("cold", cold, SCAN_FILE)
            total += (hot + cold) * SCAN_FILE
        log(f"wrote {total / 2**30:.1f} GiB of bench files into the backing directory")

    # --- mounts ---

    def write_config(
        self,
        *,
        nvme_capacity: int,
        hdd_capacity: int,
        watermarks: tuple[float, float] | None,
        interval: str,
        bandwidth: str,
        rules: str = "",
    ) -> Path:
        lines = [
            "[backing]",
            f"url = {json.dumps(self.backing.resolve().as_uri())}",
            "",
            "[state]",
            f"dir = {json.dumps(str(self.state))}",
            "",
        ]
        for name, root, capacity, marks in (
            ("nvme", self.nvme_root, nvme_capacity, watermarks),
            ("hdd", self.hdd_root, hdd_capacity, None),
        ):
            lines += [
                "[[tiers]]",
                f"name = {json.dumps(name)}",
                f"path = {json.dumps(str(root / 'tier'))}",
                f"capacity = {capacity}",
            ]
            if marks is not None:
                lines += [f"high_watermark = {marks[0]}", f"low_watermark = {marks[1]}"]
            lines.append("")
        lines += [
            "[fetch]",
            f"block_size = {json.dumps(fmt_size(self.args.block_size))}",
            "",
            "[mover]",
            f"interval = {json.dumps(interval)}",
            f"bandwidth = {json.dumps(bandwidth)}",
            "",
            rules,
        ]
        path = self.work / "tierfs.toml"
        path.write_text("\n".join(lines))
        return path

    def fresh_dirs(self) -> None:
        for d in (self.state, self.nvme_root / "tier", self.hdd_root / "tier"):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)

    @contextlib.contextmanager
    def tierfs(self, config: Path, eviction: str | None = None) -> Iterator[Mounted]:
        """A fresh tierfs (empty state dir and tiers) with ``config``."""
        self.fresh_dirs()
        mp = self.work / "mnt"
        mp.mkdir(exist_ok=True)
        env = dict(self.env)
        env.pop(EVICTION_ENV, None)
        if eviction is not None:
            env[EVICTION_ENV] = eviction
        done = subprocess.run(
            [self.tierfs_bin, "mount", str(config), str(mp)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        pid: int | None = None
        try:
            if done.returncode != 0:
                raise BenchError(f"tierfs mount failed: {done.stderr.strip()}")
            sock = locate(mp).socket_path
            pid = int(request(sock, "ping", timeout=10)["pid"])
            yield Mounted(mp, pid, sock)
        finally:
            self.unmount_tierfs(mp, pid)
            for d in (self.nvme_root / "tier", self.hdd_root / "tier"):
                shutil.rmtree(d, ignore_errors=True)

    def read_all(self, m: Mounted, names: list[str]) -> float:
        """Seconds to read every file through the mount, in order."""
        t0 = time.perf_counter()
        for name in names:
            read_file(m.mp / name)
        return time.perf_counter() - t0

    def wait_low_mark(
        self, m: Mounted, low_mark: int, timeout: float = MOVER_TIMEOUT
    ) -> dict[str, Any]:
        """Poll status until the first tier is at or below ``low_mark``; the last status."""
        deadline = time.monotonic() + timeout
        while True:
            status = m.status()
            if m.tier(status, "nvme")["used"] <= low_mark:
                return status
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the first tier is still above its low mark after {timeout:.0f}s: "
                    f"mover {status['mover']}"
                )
            time.sleep(POLL)

    @staticmethod
    def timed_sync() -> float:
        t0 = time.perf_counter()
        os.sync()
        return time.perf_counter() - t0

    # --- 1. demotion throughput ---

    def case_demotion(self, shape: str, spy: Path | None = None) -> None:
        files = self.shape_files[shape]
        size = (self.backing / files[0]).stat().st_size
        total = size * len(files)
        capacity = -(-total * 100 // round(self.args.fill * 100))
        config = self.write_config(
            nvme_capacity=capacity,
            hdd_capacity=4 * total,
            watermarks=(HIGH, LOW),
            interval="1h",
            bandwidth="0",
        )
        label = f"{len(files)} x {shape}"
        with self.tierfs(config) as m:
            self.read_all(m, files)
            status = m.status()
            used = m.tier(status, "nvme")["used"]
            low_mark = mark(capacity, LOW)
            if used <= mark(capacity, HIGH):
                raise BenchError(
                    f"demotion {label}: the first tier holds {used} bytes, not above high"
                )
            # The files the mover will move: the plan's order, until the low mark.
            plan = m.call("policy_plan")
            chosen: list[Path] = []
            planned = 0
            for move in plan["moves"]:
                if planned >= used - low_mark:
                    break
                if move["reason"] == "watermark" and move["src"] == "nvme":
                    chosen.append(m.mp / move["path"])
                    planned += int(move["bytes"])
            if not chosen:
                raise BenchError(f"demotion {label}: policy plan has no watermark moves: {plan}")
            fan = self.nvme_root / "tier" / "data"
            sources = [fan / f"{(ino := os.stat(p).st_ino) % 256:02x}" / str(ino) for p in chosen]
            copied = sum(s.stat().st_size for s in sources)

            ref = self.hdd_root / "cp-ref"
            shutil.rmtree(ref, ignore_errors=True)
            ref.mkdir()
            if spy is None:
                self.drop_caches()
                t0 = time.perf_counter()
                self.run_quiet(["cp", "--reflink=never", *map(str, sources), str(ref)])
                cp_secs = time.perf_counter() - t0
                cp_sync = self.timed_sync()
                shutil.rmtree(ref)
                os.sync()

            self.drop_caches()
            before = status["mover"]["bytes_moved"]
            t0 = time.perf_counter()
            with py_spy(spy, m.pid, f"mover-demotion-{shape}"):
                m.call("policy_reload")
                status = self.wait_low_mark(m, low_mark)
            mover_secs = time.perf_counter() - t0
            mover_sync = self.timed_sync()
            moved = status["mover"]["bytes_moved"] - before
            if spy is not None:
                return
            for p in (chosen[0], chosen[-1]):
                rel = p.relative_to(m.mp)
                where = m.call("where", {"paths": [str(rel)]})
                if not same_content(p, self.backing / rel):
                    raise BenchError(f"{rel} read through the mount differs from the backing")
                log(f"  moved {rel}: {where[0]['tiers']}, content identical")
        mover_rate = moved / mover_secs / 1e6
        cp_rate = copied / cp_secs / 1e6
        log(
            f"  demotion {label}: mover {moved / 2**20:.0f} MiB in {mover_secs:.2f}s "
            f"({mover_rate:,.0f} MB/s; +sync {mover_sync:.2f}s), cp {copied / 2**20:.0f} MiB "
            f"in {cp_secs:.2f}s ({cp_rate:,.0f} MB/s; +sync {cp_sync:.2f}s)"
        )
        self.results.add(f"demotion {label}: mover", mover_rate)
        self.results.add(f"demotion {label}: cp", cp_rate)
        self.results.add(f"demotion {label}: mover+sync", moved / (mover_secs + mover_sync) / 1e6)
        self.results.add(f"demotion {label}: cp+sync", copied / (cp_secs + cp_sync) / 1e6)

    # --- 2. training reads while the mover demotes ---

    def case_reads(self, bandwidth: str) -> None:
        a = self.args
        train = len(self.train_files) * a.train_file
        total = train + len(self.other_files) * a.train_file
        capacity = -(-total * 100 // round(a.fill * 100))
        config = self.write_config(
            nvme_capacity=capacity,
            hdd_capacity=4 * total,
            watermarks=(HIGH, LOW),
            interval="1h",
            bandwidth=bandwidth,
            rules='[[rules]]\nmatch = "train/**"\npin = true\n',
        )
        # The pinned training files stay: the mover is done when only they are left.
        low_mark = max(mark(capacity, LOW), train)
        with self.tierfs(config) as m:
            self.read_all(m, self.train_files + self.other_files)
            self.read_all(m, self.train_files)  # the first read after a fetch verifies
            status = m.status()
            if m.tier(status, "nvme")["used"] != total:
                raise BenchError(f"not all bench files are on the first tier: {status['tiers']}")
            self.drop_caches()
            idle, _ = self.watched_read(m, low_mark)
            if m.status()["mover"]["bytes_moved"]:
                raise BenchError("the mover moved data during the idle read")

            self.drop_caches()
            m.call("policy_reload")
            deadline = time.monotonic() + 30
            while (
                not (status := m.status())["mover"]["bytes_moved"]
                and status["mover"]["current"] is None
            ):
                if time.monotonic() > deadline:
                    raise BenchError(f"the mover did not start: {status['mover']}")
                time.sleep(0.005)
            moved0, t0 = mover_progress(status), time.perf_counter()
            busy, done_at = self.watched_read(m, low_mark)
            status = m.status()
            window = time.perf_counter() - t0
            moved1 = mover_progress(status)
            if done_at is None:
                self.wait_low_mark(m, low_mark)
            for name in (self.train_files[0], self.other_files[0]):
                if not same_content(m.mp / name, self.backing / name):
                    raise BenchError(f"{name} read through the mount differs from the backing")
        overlap = 1.0 if done_at is None else min(1.0, done_at / busy)
        idle_rate, busy_rate = train / idle / 1e6, train / busy / 1e6
        cap = "none" if bandwidth in ("0", "") else bandwidth
        log(
            f"  training reads, mover cap {cap}: idle {idle_rate:,.0f} MB/s, while moving "
            f"{busy_rate:,.0f} MB/s ({100 * (1 - busy_rate / idle_rate):.1f}% slower); mover "
            f"{(moved1 - moved0) / window / 1e6:,.0f} MB/s during the reads, overlap "
            f"{100 * overlap:.0f}%"
        )
        self.results.add(f"reads, cap {cap}: mover idle", idle_rate)
        self.results.add(f"reads, cap {cap}: mover moving", busy_rate)
        self.results.add(f"reads, cap {cap}: mover during reads", (moved1 - moved0) / window / 1e6)
        self.results.add(f"reads, cap {cap}: overlap %", 100 * overlap)

    def watched_read(self, m: Mounted, low_mark: int) -> tuple[float, float | None]:
        """Read the training files in a thread while this one polls ``status``
        every ``POLL`` s (idle and busy reads alike, so both carry the same
        polling); (seconds of the read, seconds until the first tier was at
        ``low_mark``, or None if it never was during the read)."""
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=1) as reader:
            reading = reader.submit(self.read_all, m, self.train_files)
            done_at: float | None = None
            while not reading.done():
                if done_at is None and m.tier(m.status(), "nvme")["used"] <= low_mark:
                    done_at = time.perf_counter() - t0
                time.sleep(POLL)
            return reading.result(), done_at

    # --- 3. the scan scenario ---

    def case_scan(self, algorithm: str, rate: float) -> None:
        a = self.args
        data = (len(self.hot_files) + len(self.cold_files)) * SCAN_FILE
        config = self.write_config(
            nvme_capacity=a.scan_tier,
            hdd_capacity=2 * data,
            watermarks=None,
            interval="1s",
            bandwidth="0",
        )
        counts = {"nvme": 0, "hdd": 0, "memory": 0, "fetched": 0}
        eviction = "lru" if algorithm == "LRU" else None

        def hot_read(m: Mounted, name: str) -> dict[str, int]:
            s0 = m.status()
            read_file(m.mp / name, drop_first=True)
            s1 = m.status()
            c0, c1 = s0["counters"], s1["counters"]
            nvme = m.tier(s1, "nvme")["hit_blocks"] - m.tier(s0, "nvme")["hit_blocks"]
            hdd = m.tier(s1, "hdd")["hit_blocks"] - m.tier(s0, "hdd")["hit_blocks"]
            hits = c1["hit_blocks"] - c0["hit_blocks"]
            got = {
                "nvme": nvme,
                "hdd": hdd,
                "memory": hits - nvme - hdd,
                "fetched": c1["miss_blocks"] - c0["miss_blocks"],
            }
            if not sum(got.values()):
                raise BenchError(f"a read of {name} did not reach the daemon (page cache?)")
            return got

        pace = rate * 1e6
        label = f"scan {algorithm}" + (f" @{rate:g}MB/s" if rate else "")
        with self.tierfs(config, eviction=eviction) as m:
            for _ in range(SCAN_WARM_ROUNDS):
                for name in self.hot_files:
                    hot_read(m, name)
            next_hot = 0
            t0 = time.perf_counter()
            scanned = 0
            for index, name in enumerate(self.cold_files):
                scanned += read_file(m.mp / name)
                if pace:
                    ahead = t0 + scanned / pace - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                if (index + 1) % SCAN_COLD_PER_HOT == 0:
                    got = hot_read(m, self.hot_files[next_hot])
                    next_hot = (next_hot + 1) % len(self.hot_files)
                    for k, v in got.items():
                        counts[k] += v
            secs = time.perf_counter() - t0
            status = m.status()
        total = sum(counts.values())
        share = counts["nvme"] / total
        tiers = ", ".join(f"{t['name']} {t['used'] / 2**20:.0f} MiB" for t in status["tiers"])
        log(
            f"  {label}: hot-set block lookups from nvme {counts['nvme']}, hdd {counts['hdd']}, "
            f"memory {counts['memory']}, fetched {counts['fetched']} of {total} "
            f"({100 * share:.1f}% nvme); cold pass {scanned / secs / 1e6:,.0f} MB/s; mover moved "
            f"{status['mover']['bytes_moved'] / 2**20:.0f} MiB, dropped "
            f"{status['mover']['bytes_dropped'] / 2**20:.0f} MiB; at the end {tiers}"
        )
        self.results.add(f"{label}: hot reads on nvme %", 100 * share)
        self.results.add(f"{label}: hot reads on hdd %", 100 * counts["hdd"] / total)
        self.results.add(f"{label}: hot reads fetched %", 100 * counts["fetched"] / total)

    # --- the run ---

    def run(self) -> None:
        self.check_prerequisites()
        self.setup()
        a = self.args
        for round_no in range(1, a.repeat + 1):
            load = self.wait_idle()
            self.results.notes.append(f"{100 * load:.0f}%")
            log(f"round {round_no}/{a.repeat} (machine {100 * load:.0f}% busy before it)")
            if "demotion" in a.parts:
                for shape in self.shape_files:
                    self.case_demotion(shape)
            if "reads" in a.parts:
                for bandwidth in a.bandwidths:
                    self.case_reads(bandwidth)
            if "scan" in a.parts:
                for rate in a.scan_rates:
                    for algorithm in ("S3-FIFO", "LRU"):
                        self.case_scan(algorithm, rate)
        if a.py_spy is not None and "demotion" in a.parts:
            for shape in self.shape_files:
                log(f"profiling one unmeasured demotion of {shape} files")
                self.case_demotion(shape, spy=a.py_spy)


# --- report ------------------------------------------------------------------------------------


def report(res: Results, a: argparse.Namespace) -> str:
    out = [
        f"tierfs lifecycle: file:// backing; tiers on {a.nvme_dir or 'the work dir'} and "
        f"{a.hdd_dir or 'the work dir'}; block_size={fmt_size(a.block_size)}; "
        f"{a.repeat} rounds (median); {os.cpu_count()} CPUs; settle {a.settle:g}s",
        "",
    ]
    rows = []
    for case, values in res.samples.items():
        unit = "%" if case.endswith("%") else "MB/s"
        fmt = "{:,.1f}" if unit == "%" else "{:,.0f}"
        rows.append(
            [
                case,
                fmt.format(statistics.median(values)),
                fmt.format(min(values)),
                fmt.format(max(values)),
                unit,
                str(len(values)),
            ]
        )
    out += table(["case", "median", "min", "max", "unit", "n"], rows)
    out.append("(MB/s = 10^6 bytes/s)")
    out.append("")

    ratio_rows: list[list[str]] = []

    def ratio(metric: str, num: str, den: str, target: float | None) -> None:
        x, y = res.median(num), res.median(den)
        if x is None or y is None or not y:
            return
        r = x / y
        result = "info" if target is None else ("PASS" if r >= target else "FAIL")
        ratio_rows.append(
            [
                metric,
                f"{x:,.0f}",
                f"{y:,.0f}",
                f"{r:.2f}",
                "info" if target is None else f">= {target}",
                result,
            ]
        )

    for case in res.samples:
        if case.startswith("demotion") and case.endswith(": mover"):
            label = case[: -len(": mover")]
            ratio(f"{label}, mover / cp", case, f"{label}: cp", 0.8)
            ratio(f"{label}, with sync", f"{label}: mover+sync", f"{label}: cp+sync", None)
        if case.startswith("reads") and case.endswith(": mover moving"):
            label = case[: -len(": mover moving")]
            target = 0.9 if label == "reads, cap none" else None
            ratio(f"training {label}, moving / idle", case, f"{label}: mover idle", target)
    header = ["metric", "tierfs", "vs", "ratio", "target", "result"]
    if ratio_rows:
        out += table(header, ratio_rows)
        out.append("(training reads: >= 0.9 is a slowdown of <= 10% with the default cap, none)")
        out.append("")
    scan_rows = []
    for case in res.samples:
        if not (case.startswith("scan S3-FIFO") and case.endswith(": hot reads on nvme %")):
            continue
        pace = case[len("scan S3-FIFO") : -len(": hot reads on nvme %")]
        fifo, lru = res.median(case), res.median(f"scan LRU{pace}: hot reads on nvme %")
        where = f"scan{pace or ' unpaced'}: hot-set reads on nvme"
        if fifo is not None:
            scan_rows.append(
                [f"{where}, S3-FIFO", f"{fifo:.1f}%", ">= 90%", "PASS" if fifo >= 90 else "FAIL"]
            )
        if lru is not None and fifo is not None:
            verdict = "PASS" if lru <= fifo / 2 else "FAIL"
            scan_rows.append([f"{where}, plain LRU", f"{lru:.1f}%", "<= half of S3-FIFO", verdict])
    if scan_rows:
        out += table(["metric", "share", "target", "result"], scan_rows)
        out.append("")
    out.append(
        "eviction bookkeeping cost per access and RSS per million entries: "
        "bash tests/bench/run.sh eviction"
    )
    out.append(f"CPU busy with other work before each round: {', '.join(res.notes)}")
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_lifecycle.py",
        description="Lifecycle benchmark: mover throughput vs cp, training reads while the "
        "mover runs, the scan scenario with S3-FIFO vs LRU, through real tierfs mounts.",
    )
    parts = ("demotion", "reads", "scan")
    sizes = lambda s: [parse_size(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument(
        "--parts",
        default=",".join(parts),
        type=comma_list,
        help=f"({','.join(parts)})",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (3)")
    p.add_argument(
        "--demote-size",
        type=parse_size,
        default=parse_size("2GiB"),
        help="bytes per demotion shape, and the other data of the read case (2GiB)",
    )
    p.add_argument(
        "--shapes",
        type=sizes,
        default=sizes("256MiB,4MiB"),
        help="file sizes of the demotion (256MiB,4MiB)",
    )
    p.add_argument(
        "--fill",
        type=float,
        default=0.9,
        help="first tier filled to this share of its capacity (0.9; high mark 0.8, low 0.1)",
    )
    p.add_argument(
        "--train-size",
        type=parse_size,
        default=parse_size("1GiB"),
        help="training files read while the mover runs (1GiB)",
    )
    p.add_argument(
        "--train-file",
        type=parse_size,
        default=parse_size("256MiB"),
        help="size of each training and other file (256MiB)",
    )
    p.add_argument(
        "--bandwidths",
        type=comma_list,
        default=["0", "200MiB/s", "50MiB/s"],
        help="[mover] bandwidth values for the read case "
        '("0,200MiB/s,50MiB/s"; 0 = no cap, the default)',
    )
    p.add_argument(
        "--scan-tier",
        type=parse_size,
        default=parse_size("512MiB"),
        help="first tier in the scan scenario (512MiB)",
    )
    p.add_argument(
        "--scan-rates",
        type=lambda s: [float(x) for x in s.split(",") if x],
        default=[0.0, 40.0],
        help="paces of the cold pass in MB/s, one scan each (0,40; 0 = as fast as it reads)",
    )
    p.add_argument(
        "--block-size",
        type=parse_size,
        default=parse_size("4MiB"),
        help="[fetch] block_size (4MiB)",
    )
    p.add_argument("--seed", type=int, default=1, help="file contents (1)")
    p.add_argument(
        "--nvme-dir", type=Path, default=None, help="put the first tier under this directory"
    )
    p.add_argument(
        "--hdd-dir", type=Path, default=None, help="put the second tier under this directory"
    )
    p.add_argument(
        "--settle", type=float, default=3.0, help="seconds of quiet after each drop_caches (3)"
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=120.0,
        help="before each round, wait up to this many seconds for other work to stop (120)",
    )
    p.add_argument(
        "--workdir", type=Path, default=None, help="temporary directory (default /var/tmp)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--json", type=Path, default=None, help="also write the samples to this file")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="after the rounds, profile one demotion per shape with py-spy into this directory",
    )
    p.set_defaults(port=0, rclone_serve=None)
    args = p.parse_args(argv)
    bad = [x for x in args.parts if x not in parts]
    if bad:
        p.error(f"unknown part: {', '.join(bad)}")
    if args.repeat < 1 or not 0.8 < args.fill < 1:
        p.error("--repeat must be at least 1 and --fill between 0.8 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.workdir is None:
        args.workdir = Path("/var/tmp")  # the tiers need a disk, not a tmpfs $TMPDIR
    bench, code = run_in_workdir(
        args, "tierfs-bench-lifecycle-", lambda work: LifecycleBench(args, work)
    )
    if bench is not None and bench.results.samples:
        if code:
            print("(incomplete run)")
        print(report(bench.results, args))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "samples": bench.results.samples,
            }
            args.json.write_text(json.dumps(doc, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
