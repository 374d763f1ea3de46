#!/usr/bin/env python3
"""Read benchmark: tierfs against s5cmd, rclone mount and s3fs on one local S3 server.

Run it through ``bash tests/bench/run.sh`` (installs the peers), as root:
``drop_caches``, FUSE mounts and the kernel tuning all need it.  Not a test:
it is never collected by pytest and never run in CI.

What one run does
-----------------
1. Starts ``s3rver`` (npm, installed under ``tests/bench/.node``) on
   127.0.0.1 and a free port, with a temporary directory; creates the bucket
   and uploads one random object (``--size``, 1 GiB by default) with s5cmd.
   moto serves only about 80 MB/s here; s3rver a few hundred.
2. Repeats ``--repeat`` rounds (default 3), every case once per round, so that
   the cases interleave and the machine's drift hits them all alike:

   * ``dd direct``: ``dd`` of a same-size file on the tier's filesystem,
     page cache dropped (the reference for the warm tier read);
   * ``s5cmd cp`` (to a local file) and ``s5cmd cat`` (to /dev/null), page
     cache dropped (references for the cold read);
   * tierfs, once per kernel-tuning variant (``--tuning``):
       - cold: fresh state dir, empty tier, page cache dropped, ``dd`` of
         the object through the mount;
       - warm: unmount, mount again (the cache survives), page cache
         dropped, ``dd`` again: every byte comes from the tier;
       - second read: ``dd`` again without dropping anything (kernel page
         cache, ``keep_cache``);
   * ``rclone mount --vfs-cache-mode full`` and ``s3fs -o use_cache``: cold
     read (fresh cache dir, page cache dropped) and second reads.
3. Prints the median MB/s of every case, then the ratios against the targets
   of the read-path issue, side by side from this one run.

Kernel-tuning variants of tierfs (``--tuning``, comma-separated):

* ``daemon``: the mount as ``tierfs mount`` leaves it (as root the daemon
  raises the bdi ``read_ahead_kb`` and fusectl ``max_background``);
* ``off``: ``tierfs mount -o no_kernel_tuning``, and the bench also resets
  both values to the kernel defaults (128 KiB, 12) right after the mount
  (so that it also works with a daemon that does not know the option);
* ``late`` (not run by default): the bench itself writes
  ``read_ahead_kb=1024`` and ``max_background=64`` once the mount answers.
  The FUSE INIT reply resets the bdi readahead, so a daemon that tunes
  before INIT is done loses its ``read_ahead_kb``; ``late`` shows what
  tuning gives regardless.  With a working daemon it equals ``daemon``.

The values in force are read back after each read and printed under the
table, with the mean size of the read requests tierfs saw (when its
``status`` has the counters) and the number and mean size of its GETs.

Page cache and ``--settle``: on this kind of machine (a VM whose balloon
device reports free pages to the host) a page that has been free for a few
seconds costs about 5 us to touch again: filling 1 GiB of fresh page cache
takes 1.7 CPU seconds instead of 0.3.  Right after ``drop_caches`` the freed
pages are still cheap, so a case that ran right after the drop would be
faster the sooner it finished.  The bench therefore waits ``--settle``
seconds (10) after each drop, so that every case pays the same price for
every new page.  ``--settle 0`` measures the other way.

Everything it mounts is unmounted in a ``finally`` (``tierfs umount`` or
``fusermount3 -u``, then ``-uz``); it stops only the processes it started,
by PID; all traffic goes to 127.0.0.1.  Temporary files are removed at the
end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    BUCKET,
    REGION,
    BenchBase,
    BenchError,
    KernelKnobs,
    add_run_arguments,
    add_server_arguments,
    add_tier_fs_argument,
    children_cpu_seconds,
    comma_list,
    cpu_seconds,
    fmt_size,
    is_mounted,
    log,
    mount_device,
    parse_size,
    py_spy,
    read_int,
    run_in_workdir,
    server_name,
    system_cpu_ticks,
)

KEY = "obj"

KERNEL_DEFAULT_READ_AHEAD_KB = 128
KERNEL_DEFAULT_MAX_BACKGROUND = 12
TUNED_READ_AHEAD_KB = 1024
TUNED_MAX_BACKGROUND = 64
TUNINGS = ("daemon", "off", "late")
MOUNT_TIMEOUT = 60.0

# Targets of the read-path issue: (numerator case, denominator case, minimum ratio).
TARGETS: list[tuple[str, str, float]] = [
    ("tierfs cold", "s5cmd cp", 0.8),
    ("tierfs cold", "rclone cold", 1.5),
    ("tierfs cold", "s3fs cold", 1.5),
    ("tierfs warm", "dd direct", 0.7),
    ("tierfs 2nd read", "rclone 2nd read", 3.0),
    ("tierfs 2nd read", "s3fs 2nd read", 3.0),
]


class FuseWaitingSampler:
    """Samples ``/sys/fs/fuse/connections/N/waiting`` (requests in flight) every 5 ms."""

    def __init__(self, knobs: KernelKnobs | None) -> None:
        self.path = knobs.conn / "waiting" if knobs else None
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FuseWaitingSampler:
        if self.path is not None and self.path.exists():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        assert self.path is not None
        while not self._stop.wait(0.005):
            value = read_int(self.path)
            if value is not None:
                self.samples.append(value)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


# --- results -------------------------------------------------------------------------------


@dataclass
class Sample:
    mbps: float
    seconds: float
    daemon_cpu: float = 0.0  # CPU seconds of the FUSE daemon during the read
    server_cpu: float = 0.0  # CPU seconds of s3rver during the read
    client_cpu: float = 0.0  # CPU seconds of the reading command (dd, s5cmd)
    busy: float = 0.0  # share of all CPUs busy during the read (0..1)
    fuse_waiting: float | None = None  # mean FUSE requests in flight


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, case: str, sample: Sample) -> None:
        self.samples.setdefault(case, []).append(sample)
        extra = f", daemon CPU {sample.daemon_cpu:.2f}s" if sample.daemon_cpu else ""
        extra += f", s3rver CPU {sample.server_cpu:.2f}s" if sample.server_cpu else ""
        extra += f", client CPU {sample.client_cpu:.2f}s, CPUs {100 * sample.busy:.0f}% busy"
        if sample.fuse_waiting is not None:
            extra += f", FUSE waiting {sample.fuse_waiting:.1f}"
        log(f"  {case}: {sample.mbps:,.0f} MB/s ({sample.seconds:.2f}s{extra})")

    def median(self, case: str) -> float | None:
        values = [s.mbps for s in self.samples.get(case, [])]
        return statistics.median(values) if values else None


# --- the bench ------------------------------------------------------------------------------


class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.size: int = args.size
        self.results = Results()
        self.ref = work / "tier-fs" / "reference.bin"  # same filesystem as the tiers
        self.cases = set(args.cases)
        self.mount_option_ok = True  # tierfs mount -o no_kernel_tuning

    def check_prerequisites(self) -> None:
        self.check_common_prerequisites(self.cases)

    def upload(self) -> None:
        self.ref.parent.mkdir(exist_ok=True)
        log(f"writing {fmt_size(self.size)} of random bytes to the tier filesystem")
        chunk = 16 << 20
        with open(self.ref, "wb") as f:
            left = self.size
            while left:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
        self.run_quiet(self.s5cmd("mb", f"s3://{BUCKET}"))
        t0 = time.perf_counter()
        self.run_quiet(self.s5cmd("cp", str(self.ref), f"s3://{BUCKET}/{KEY}"))
        dt = time.perf_counter() - t0
        log(f"uploaded s3://{BUCKET}/{KEY} in {dt:.1f}s ({self.size / dt / 1e6:,.0f} MB/s)")

    # --- measuring ---

    def dd(self, path: Path) -> float:
        """Seconds to read ``path`` with dd bs=1M into /dev/null; checks the byte count."""
        t0 = time.perf_counter()
        done = subprocess.run(
            ["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True, text=True
        )
        dt = time.perf_counter() - t0
        m = re.search(r"^(\d+) bytes", done.stderr, re.M)
        if done.returncode != 0 or not m or int(m.group(1)) != self.size:
            raise BenchError(f"dd of {path} failed: {done.stderr.strip()}")
        return dt

    def measure(
        self,
        case: str,
        read: Callable[[], float],
        *,
        daemon_pid: int | None = None,
        knobs: KernelKnobs | None = None,
    ) -> Sample:
        server_pid = self.s3_server_proc.pid if self.s3_server_proc else None
        d0, s0 = cpu_seconds(daemon_pid), cpu_seconds(server_pid)
        c0, b0 = children_cpu_seconds(), system_cpu_ticks()
        with FuseWaitingSampler(knobs) as sampler:
            dt = read()
        b1 = system_cpu_ticks()
        sample = Sample(
            client_cpu=children_cpu_seconds() - c0,
            busy=(b1[0] - b0[0]) / max(1, b1[1] - b0[1]),
            mbps=self.size / dt / 1e6,
            seconds=dt,
            daemon_cpu=cpu_seconds(daemon_pid) - d0,
            server_cpu=cpu_seconds(server_pid) - s0,
            fuse_waiting=sampler.mean,
        )
        self.results.add(case, sample)
        return sample

    # --- reference cases ---

    def case_dd_direct(self) -> None:
        self.drop_caches()
        self.measure("dd direct", lambda: self.dd(self.ref))

    def case_s5cmd(self) -> None:
        dest = self.work / "s5cmd-download"
        self.drop_caches()

        def cp() -> float:
            t0 = time.perf_counter()
            self.run_quiet(self.s5cmd("cp", f"s3://{BUCKET}/{KEY}", str(dest)))
            return time.perf_counter() - t0

        self.measure("s5cmd cp", cp)
        if dest.stat().st_size != self.size:
            raise BenchError("s5cmd cp downloaded the wrong number of bytes")
        dest.unlink()
        self.drop_caches()

        def cat() -> float:
            t0 = time.perf_counter()
            done = subprocess.run(
                self.s5cmd("cat", f"s3://{BUCKET}/{KEY}"),
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            if done.returncode != 0:
                raise BenchError(f"s5cmd cat failed: {done.stderr.strip()}")
            return time.perf_counter() - t0

        self.measure("s5cmd cat", cat)

    # --- tierfs ---

    def tierfs_config(self) -> Path:
        cfg = self.work / "tierfs.toml"
        a = self.args
        cfg.write_text(
            "\n".join(
                [
                    "[backing]",
                    f'url = "s3://{BUCKET}"',
                    f'endpoint_url = "{self.endpoint}"',
                    f'region = "{REGION}"',
                    "[state]",
                    f'dir = "{self.work / "tierfs-state"}"',
                    "[[tiers]]",
                    'name = "nvme"',
                    f'path = "{self.work / "tier-fs" / "nvme"}"',
                    "[fetch]",
                    f'block_size = "{fmt_size(a.block_size)}"',
                    f'readahead_max = "{fmt_size(a.readahead_max)}"',
                    f"concurrency = {a.concurrency}",
                    "",
                ]
            )
        )
        return cfg

    def tierfs_reset_cache(self) -> None:
        for d in (self.work / "tierfs-state", self.work / "tier-fs" / "nvme"):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)

    @contextlib.contextmanager
    def tierfs_mount(self, tuning: str) -> Iterator[tuple[Path, int | None, KernelKnobs | None]]:
        mp = self.work / "mnt-tierfs"
        mp.mkdir(exist_ok=True)
        cfg = self.work / "tierfs.toml"
        cmd = [self.tierfs_bin, "mount", str(cfg), str(mp)]
        if tuning == "off" and self.mount_option_ok:
            cmd += ["-o", "no_kernel_tuning"]
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=MOUNT_TIMEOUT
        )
        if done.returncode != 0 and "no_kernel_tuning" in done.stderr and not is_mounted(mp):
            log("this tierfs has no -o no_kernel_tuning: resetting the values by hand only")
            self.mount_option_ok = False
            cmd = cmd[:4]
            done = subprocess.run(
                cmd, env=self.env, capture_output=True, text=True, timeout=MOUNT_TIMEOUT
            )
        pid: int | None = None
        try:
            if done.returncode != 0:
                raise BenchError(f"tierfs mount failed: {done.stderr.strip()}")
            status = json.loads(
                self.run_quiet([self.tierfs_bin, "status", str(mp), "--json"]).stdout
            )
            pid = int(status["pid"])
            dev = mount_device(mp)
            knobs = KernelKnobs(dev) if dev else None
            if knobs is not None:
                if tuning == "off":
                    knobs.set(KERNEL_DEFAULT_READ_AHEAD_KB, KERNEL_DEFAULT_MAX_BACKGROUND)
                elif tuning == "late":
                    os.stat(mp / KEY)  # the FUSE INIT reply has surely been processed now
                    knobs.set(TUNED_READ_AHEAD_KB, TUNED_MAX_BACKGROUND)
            yield mp, pid, knobs
        finally:
            self.unmount_tierfs(mp, pid)

    def case_tierfs(self, tuning: str, round_no: int) -> None:
        tag = "" if tuning == "daemon" else f" [{tuning}]"
        spy = self.args.py_spy if (round_no == 0 and tuning == "daemon") else None
        self.tierfs_reset_cache()
        with self.tierfs_mount(tuning) as (mp, pid, knobs):
            self.drop_caches()
            with py_spy(spy, pid, "tierfs-cold"):
                self.measure(
                    f"tierfs cold{tag}", lambda: self.dd(mp / KEY), daemon_pid=pid, knobs=knobs
                )
            if round_no == 0:
                self.note_tierfs(mp, knobs, f"[{tuning}] cold")
        with self.tierfs_mount(tuning) as (mp, pid, knobs):
            self.drop_caches()
            with py_spy(spy, pid, "tierfs-warm"):
                self.measure(
                    f"tierfs warm{tag}", lambda: self.dd(mp / KEY), daemon_pid=pid, knobs=knobs
                )
            for _ in range(self.args.second_reads):
                self.measure(
                    f"tierfs 2nd read{tag}", lambda: self.dd(mp / KEY), daemon_pid=pid, knobs=knobs
                )
            if round_no == 0:
                self.note_tierfs(mp, knobs, f"[{tuning}] warm + 2nd")
            if round_no == self.args.repeat - 1 and tuning == self.args.tuning[0]:
                self.check_content(mp / KEY)

    def note_tierfs(self, mp: Path, knobs: KernelKnobs | None, what: str) -> None:
        """Kernel knobs in force after the read, and the daemon's counters."""
        parts = []
        if knobs is not None:
            ra, bg = knobs.read()
            parts.append(f"read_ahead_kb={ra} max_background={bg}")
        status = json.loads(self.run_quiet([self.tierfs_bin, "status", str(mp), "--json"]).stdout)
        c = status.get("counters", {})
        if c.get("read_requests"):
            mean = c.get("read_bytes", 0) / c["read_requests"] / 1024
            parts.append(f"{c['read_requests']} read requests of {mean:.0f} KiB on average")
        if c.get("gets"):
            mean = c.get("fetched_bytes", 0) / c["gets"] / (1 << 20)
            parts.append(f"{c['gets']} GETs of {mean:.1f} MiB on average")
        self.results.notes[f"tierfs {what}"] = "; ".join(parts)

    def check_content(self, path: Path) -> None:
        done = subprocess.run(["cmp", str(self.ref), str(path)], capture_output=True, text=True)
        ok = done.returncode == 0
        self.results.notes["content check (cmp tierfs file vs uploaded file)"] = (
            "identical" if ok else f"DIFFERENT: {done.stdout.strip() or done.stderr.strip()}"
        )
        if not ok:
            raise BenchError(f"tierfs returned different bytes: {done.stdout.strip()}")

    # --- rclone and s3fs ---

    @contextlib.contextmanager
    def peer_mount(self, name: str, cmd: list[str], mp: Path) -> Iterator[int]:
        def ready() -> bool:
            return (mp / KEY).stat().st_size == self.size

        with self.mount_peer(name, cmd, mp, ready) as pid:
            dev = mount_device(mp)
            if dev:
                ra, bg = KernelKnobs(dev).read()
                self.results.notes[f"{name} read_ahead_kb/max_background"] = f"{ra}/{bg}"
            yield pid

    def rclone_mount(self, cache: Path) -> contextlib.AbstractContextManager[int]:
        mp = self.work / "mnt-rclone"
        mp.mkdir(exist_ok=True)
        conf = self.work / "rclone.conf"
        conf.touch()
        self.rclone_remote_env()  # an on-the-fly remote "bench:"
        cmd = ["rclone", "mount", f"bench:{BUCKET}", str(mp), "--config", str(conf)]
        cmd += ["--vfs-cache-mode", "full", "--cache-dir", str(cache), "--read-only"]
        return self.peer_mount("rclone", cmd, mp)

    def s3fs_mount(self, cache: Path) -> contextlib.AbstractContextManager[int]:
        mp = self.work / "mnt-s3fs"
        mp.mkdir(exist_ok=True)
        passwd = self.s3fs_passwd()
        opts = [
            f"url={self.endpoint}",
            "use_path_request_style",
            f"passwd_file={passwd}",
            f"use_cache={cache}",
            f"endpoint={REGION}",
            "ro",
        ]
        cmd = ["s3fs", BUCKET, str(mp), "-f", "-o", ",".join(opts)]
        return self.peer_mount("s3fs", cmd, mp)

    def case_peer(
        self, name: str, mount: Callable[[Path], contextlib.AbstractContextManager[int]]
    ) -> None:
        cache = self.work / f"{name}-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        mp = self.work / f"mnt-{name}"
        with mount(cache) as pid:
            self.drop_caches()
            self.measure(f"{name} cold", lambda: self.dd(mp / KEY), daemon_pid=pid)
            for _ in range(self.args.second_reads):
                self.measure(f"{name} 2nd read", lambda: self.dd(mp / KEY), daemon_pid=pid)

    # --- the run ---

    def run(self) -> None:
        self.check_prerequisites()
        with self.tier_filesystem(self.work / "tier-fs"), self.s3_server():
            self.upload()
            if "tierfs" in self.cases:
                self.tierfs_config()
            background: list[str] = []
            for r in range(self.args.repeat):
                log(f"round {r + 1} of {self.args.repeat}")
                background.append(f"{100 * self.wait_idle():.0f}%")
                self.results.notes["CPU busy with other work before each round"] = (
                    ", ".join(background) + " (more than a few % means the figures are noisy)"
                )
                if "dd" in self.cases:
                    self.case_dd_direct()
                if "s5cmd" in self.cases:
                    self.case_s5cmd()
                if "tierfs" in self.cases:
                    for tuning in self.args.tuning:
                        self.case_tierfs(tuning, r)
                if "rclone" in self.cases:
                    self.case_peer("rclone", self.rclone_mount)
                if "s3fs" in self.cases:
                    self.case_peer("s3fs", self.s3fs_mount)


# --- report ---------------------------------------------------------------------------------------


def report(res: Results, a: argparse.Namespace) -> str:
    """The two tables and the notes, as printed (and pasted into README.md)."""
    lines: list[str] = []
    lines.append(
        f"object {fmt_size(a.size)}, {a.repeat} rounds (median), tierfs [fetch] "
        f"block_size={fmt_size(a.block_size)} readahead_max={fmt_size(a.readahead_max)} "
        f"concurrency={a.concurrency}; S3 server {server_name(a)}; {os.cpu_count()} CPUs; "
        f"settle {a.settle:g}s"
    )
    lines.append("")
    header = (
        f"{'case':<28} {'MB/s':>7} {'min':>7} {'max':>7} {'n':>2} "
        f"{'daemon s':>8} {'server s':>8} {'reader s':>8} {'busy':>5}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for case, samples in res.samples.items():
        mb = [s.mbps for s in samples]
        dcpu = statistics.median(s.daemon_cpu for s in samples)
        scpu = statistics.median(s.server_cpu for s in samples)
        ccpu = statistics.median(s.client_cpu for s in samples)
        busy = statistics.median(s.busy for s in samples)
        lines.append(
            f"{case:<28} {statistics.median(mb):>7,.0f} {min(mb):>7,.0f} {max(mb):>7,.0f} "
            f"{len(mb):>2} {dcpu:>8.2f} {scpu:>8.2f} {ccpu:>8.2f} {100 * busy:>4.0f}%"
        )
    lines.append(
        "(MB/s = 10^6 bytes/s; CPU seconds per read of the FUSE daemon, of the S3 server and of "
        "the reading command (dd or s5cmd); busy: share of all CPUs in use during the read)"
    )
    lines.append("")

    rows: list[tuple[str, str, float | None, str, str]] = []
    counted: list[str] = []  # results of the first variant (tierfs as mounted) only
    variants = [("", "daemon")] + [(f" [{t}]", t) for t in a.tuning if t != "daemon"]
    if "daemon" not in a.tuning:
        variants = [(f" [{t}]", t) for t in a.tuning]
    for tag, _t in variants:
        for num, den, target in TARGETS:
            n, d = res.median(num + tag), res.median(den)
            if n is None or d is None:
                continue
            ratio = n / d
            result = "PASS" if ratio >= target else "FAIL"
            rows.append((f"{num}{tag}", den, ratio, f">= {target:g}", result))
            if tag == variants[0][0]:
                counted.append(result)
        n, d = res.median("tierfs cold" + tag), res.median("s5cmd cat")
        if n is not None and d is not None:
            rows.append((f"tierfs cold{tag}", "s5cmd cat", n / d, "info", ""))
    if "off" in a.tuning:
        for tag, _t in variants:
            if tag == " [off]":
                continue
            for kind in ("cold", "warm", "2nd read"):
                n, d = res.median(f"tierfs {kind}{tag}"), res.median(f"tierfs {kind} [off]")
                if n is not None and d is not None:
                    rows.append((f"tierfs {kind}{tag}", f"tierfs {kind} [off]", n / d, "info", ""))
    header = (
        f"{'case':<28} {'MB/s':>7}  {'vs':<22} {'MB/s':>7} {'ratio':>6} {'target':>7} {'result':>6}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for num, den, ratio, target, result in rows:
        n, d = res.median(num), res.median(den)
        assert n is not None and d is not None and ratio is not None
        lines.append(
            f"{num:<28} {n:>7,.0f}  {den:<22} {d:>7,.0f} {ratio:>6.2f} {target:>7} {result:>6}"
        )
    lines.append("")
    what = "tierfs as mounted" if variants[0][1] == "daemon" else f"tierfs [{variants[0][1]}]"
    lines.append(f"targets met by {what}: {counted.count('PASS')} of {len(counted)}")
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
    raw = doc["args"]
    tuning = raw["tuning"]
    args = argparse.Namespace(
        size=int(raw["size"]),
        repeat=int(raw["repeat"]),
        block_size=int(raw["block_size"]),
        readahead_max=int(raw["readahead_max"]),
        concurrency=int(raw["concurrency"]),
        settle=float(raw.get("settle", 0)),
        tuning=list(ast.literal_eval(tuning) if isinstance(tuning, str) else tuning),
    )
    return res, args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_read.py",
        description="Read benchmark: tierfs vs s5cmd, rclone mount and s3fs on a local s3rver.",
    )
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="object size (1GiB)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (3)")
    p.add_argument("--second-reads", type=int, default=2, help="page-cache reads per round (2)")
    p.add_argument("--block-size", type=parse_size, default=parse_size("4MiB"))
    p.add_argument("--readahead-max", type=parse_size, default=parse_size("256MiB"))
    p.add_argument("--concurrency", type=int, default=32, help="tierfs [fetch] concurrency (32)")
    p.add_argument(
        "--tuning",
        default="daemon,off",
        type=comma_list,
        help="tierfs kernel-tuning variants: daemon, off, late (daemon,off)",
    )
    p.add_argument(
        "--cases",
        default="dd,s5cmd,tierfs,rclone,s3fs",
        type=comma_list,
        help="cases to run (dd,s5cmd,tierfs,rclone,s3fs)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds to wait after dropping the page cache (10; see the docstring)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=120.0,
        help="before each round, wait up to this many seconds for other work to stop (120)",
    )
    add_server_arguments(p)
    add_tier_fs_argument(p)
    add_run_arguments(p, json_help="also write raw samples to this file")
    p.add_argument(
        "--py-spy", type=Path, default=None, help="record py-spy profiles of tierfsd here"
    )
    p.add_argument(
        "--report-from", type=Path, default=None, help="print the tables of a run saved with --json"
    )
    args = p.parse_args(argv)
    bad = [t for t in args.tuning if t not in TUNINGS] or [
        c for c in args.cases if c not in ("dd", "s5cmd", "tierfs", "rclone", "s3fs")
    ]
    if bad:
        p.error(f"unknown variant or case: {', '.join(bad)}")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_from is not None:
        print(report(*load_results(args.report_from)))
        return 0

    bench, code = run_in_workdir(args, "tierfs-bench-", lambda work: Bench(args, work))
    if bench is not None and bench.results.samples:
        if code:
            print("(incomplete run)")
        print(report(bench.results, args))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps(
                    {
                        "args": {
                            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                        },
                        "samples": {
                            c: [s.__dict__ for s in v] for c, v in bench.results.samples.items()
                        },
                        "notes": bench.results.notes,
                    },
                    indent=2,
                )
            )
    return code


if __name__ == "__main__":
    sys.exit(main())
