#!/usr/bin/env python3
"""Metadata and small-file benchmark: tierfs against a pyfuse3 passthrough
(the FUSE ceiling), rclone mount and s3fs, over one local S3 server
(s3rver, or SeaweedFS with ``--server seaweedfs``: see ``common.py``).

Run it through ``bash tests/bench/run.sh meta`` (installs the peers), as
root: ``drop_caches`` and FUSE mounts need it.  Not a test: never collected
by pytest, never run in CI.  Shared pieces are in ``common.py``.

What one run does
-----------------
1. Starts the S3 server (``--server``), writes a tree of ``--files``
   (4,000) files of ``--file-min``-``--file-max`` (1-16 KiB, sizes and bytes
   from ``--seed``) in ``--dirs`` (10) directories on the local disk, and
   uploads it with ``s5cmd cp`` under ``meta/t4000/`` (on s3rver with
   directory markers for every directory, which s3rver needs to list a
   prefix that holds only prefixes; SeaweedFS, like S3, needs none).
   ``--large`` adds a tree of 100,000 files (``--large-files``), measured
   only in ``--large-scenarios`` (cold) and ``--large-operations``
   (find,stat) by default: what the request-count check needs,
   without reading 100,000 files through every mount.
2. For every tree and every mount of ``--cases`` (passthrough of the local
   copy, tierfs, rclone ``--vfs-cache-mode full``, s3fs ``use_cache``):

   * ``warm``: one mount; a full pass (``find``, ``stat`` and read of every
     file) warms it, untimed; then, timed: ``find`` of the tree (entries/s),
     ``os.stat`` of every file in shuffled order, and open+read+close of
     every file in shuffled order (files/s);
   * ``cold``: the same three operations, each on a fresh mount (empty
     cache and state) after ``drop_caches``;
   * ``ttl1s`` (tierfs only): a mount with ``[namespace] list_ttl = "1s"``,
     warmed, then each operation after 1.5 s of waiting (every listing and
     kernel timeout has expired);
   * ``cold 8 threads``: a fresh mount, every file read once by 8 threads
     (shuffled); the reference is 8 threads of boto3 ``get_object`` over the
     same keys on the same server;
   * ``cold in order`` (scenario ``order``): a fresh mount, every file read
     once by one thread in listing order, directory by directory (what
     ``cat dir/*`` or ``tar`` do: tierfs's directory readahead fetches the
     next files ahead); the reference is one thread of ``get_object`` over
     the same keys in the same order.
3. Prints the rates per scenario and mount, the ratios (tierfs / passthrough,
   tierfs / GET loop, tierfs / rclone and s3fs), and for tierfs the LIST,
   HEAD and GET requests each scenario sent (``tierfs status`` ``store_calls``,
   counted by the daemon's store).
4. Checks every tierfs ``cold find`` against the target "one LIST per 1,000
   entries and no HEAD": PASS when the step sent no HEAD and no more LISTs
   than the pages a delimited listing of each directory on the way needs
   (the mount's root, the tree's root, each directory: ``ceil(keys /
   1000)``, at least 1; on s3rver a directory's marker is one of its keys),
   else FAIL.  tierfs also lists each directory's attribute shadow prefix
   (``tierfs.core.names.namespace``, "Attributes of listed names"): one LIST more
   per directory than the pages, which this check counts against it.

``--scenarios`` picks a subset (``warm,cold,ttl1s,threads,order``) while
iterating, ``--operations`` a subset of ``find,stat,read`` (the warm-up
pass too does only those: ``find,stat`` over 100,000 files reads none); ``--trace`` adds, per scenario and mount, the FUSE requests the
kernel sent (kernel tracepoints, ``common.FuseTrace``); ``--py-spy DIR``
records the tierfs daemon during every timed tierfs step (collapsed stacks,
``DIR/<tree>-<scenario>.txt``).

Like with like
--------------
The ceiling must pay for what tierfs is asked to do, and no more: the
passthrough gives entries and attributes the kernel timeouts tierfs gives
(``list_ttl``, 60 s by default, ``--passthrough-timeout`` otherwise), replies
``keep_cache`` as tierfs does for unchanged files, is mounted read-write
as tierfs is (on a read-only mount the kernel does not mark the atime
stale after each read, which spares it the GETATTR of the next ``stat``),
and answers FLUSH (a
no-op) as tierfs must for its writers: a filesystem that leaves FLUSH
unimplemented is never sent one again, which saves one request per
``close`` that no writable filesystem can save (pyfuse3 3.5 cannot set
``FOPEN_NOFLUSH``).  Both mounts read the same files in the same shuffled
order (``--seed``).  With a 1 s passthrough timeout (the earlier runs),
the warm ``stat`` of tierfs compared a mount that answers from the kernel's
cache against one that looks every file up again.

One run, one round: on a shared machine the figures are noisy (the
background load before the run is printed).  Everything it mounts is
unmounted in a ``finally``; it stops only the processes it started, by PID;
all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
    comma_list,
    cpu_seconds,
    drop_caches,
    fmt_size,
    fuse_summary,
    log,
    parse_size,
    put_directory_markers,
    py_spy,
    run_in_workdir,
    s3_client,
    server_name,
    table,
)

HERE = Path(__file__).resolve().parent
CASES = ("passthrough", "tierfs", "rclone", "s3fs")
OPERATIONS = ("find", "stat", "read")
PREFIX = "meta"
THREADS = 8
TTL_WAIT = 1.5
SCENARIOS = ("warm", "cold", "ttl1s", "threads", "order")
#: tierfs's default ``list_ttl``: the passthrough's kernel timeouts.
DEFAULT_TIMEOUT = 60.0
#: Keys of a full ListObjectsV2 page (S3's MaxKeys limit).
LIST_PAGE = 1000
#: tierfs store calls reported per scenario.
COUNTED = {"LIST": "ListObjectsV2", "HEAD": "HeadObject", "GET": "GetObject"}


@dataclass
class Tree:
    name: str
    files: list[str]  # relative to the tree's root, "dNN/fNNNNNN"
    entries: int  # what find prints: the root, the directories and the files


@dataclass
class Result:
    tree: str
    scenario: str  # "warm find", "cold read", "cold 8 threads", "ttl1s stat" ...
    mount: str
    seconds: float
    count: int
    calls: dict[str, int] | None = None
    fuse: str = ""  # the FUSE requests of the step (--trace)
    #: CPU seconds of the mount's daemon (the GET loop: of this process)
    #: and of the S3 server during the step: on a busy machine a steadier
    #: figure than the rate.
    daemon_cpu: float = 0.0
    server_cpu: float = 0.0
    #: Another process dropped the page cache since the mount's warm-up
    #: (``/proc/vmstat`` drop_pagecache): a warm step was not warm.
    dropped: bool = False

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Results:
    rows: list[Result] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    #: tree -> (the LIST pages a cold ``find`` of it needs, the directories
    #: on the way): ``list_pages_needed``, ``directories_listed``.
    trees: dict[str, tuple[int, int]] = field(default_factory=dict)

    def rate(self, tree: str, scenario: str, mount: str) -> float | None:
        for row in self.rows:
            if (row.tree, row.scenario, row.mount) == (tree, scenario, mount):
                return row.rate
        return None


def directories_listed(tree: Tree, markers: bool) -> Counter[str]:
    """Keys of each directory a walk of ``tree`` from the mount's root
    lists: the mount's root (the trees: counted as 1, a few prefixes), the
    tree's root (its ``dNN``) and each ``dNN`` (its files); with directory
    markers, each directory's listing also holds its own marker (``d00/``
    lists ``d00/``: 10,001 keys for 10,000 files, 11 pages)."""
    per_dir = Counter(rel.split("/", 1)[0] for rel in tree.files)
    listed = Counter({"": 1, tree.name: len(per_dir), **per_dir})
    if markers:
        listed.update(listed.keys())
    return listed


def list_pages_needed(tree: Tree, markers: bool, page_size: int = LIST_PAGE) -> int:
    """The ListObjectsV2 pages (delimiter "/") a walk of ``tree`` needs: one
    per ``page_size`` keys of each directory on the way, at least one."""
    return sum(max(1, -(-n // page_size)) for n in directories_listed(tree, markers).values())


def list_check(res: Results) -> list[str]:
    """The target: "cold find on 100,000 files makes one LIST per 1,000
    entries and no HEAD", for every tree's tierfs cold find."""
    out = []
    for row in res.rows:
        if row.mount != "tierfs" or row.scenario != "cold find" or row.calls is None:
            continue
        if row.tree not in res.trees:
            continue
        needed, dirs = res.trees[row.tree]
        lists, heads = row.calls["LIST"], row.calls["HEAD"]
        verdict = "PASS" if lists <= needed and heads == 0 else "FAIL"
        out.append(
            f"check {row.tree} cold find: one LIST per {LIST_PAGE:,} entries and no HEAD:"
            f" LIST {lists:,} for {needed:,} pages needed ({dirs} directories listed),"
            f" HEAD {heads:,}, {row.count:,} entries: {verdict}"
        )
    return out


# --- the operations, timed by the caller ----------------------------------------------------


def page_cache_drops() -> int:
    """How often anyone wrote to ``drop_caches`` since boot (other benches on
    a shared machine do): a warm step that saw one measured cold reads."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("drop_pagecache "):
                return int(line.split()[1])
    return 0


def op_find(root: Path) -> int:
    done = subprocess.run(["find", str(root)], capture_output=True)
    if done.returncode != 0:
        errors = done.stderr.decode(errors="replace").strip().splitlines()
        raise BenchError(f"find {root} failed ({len(errors)} errors), first: {errors[:3]}")
    return done.stdout.count(b"\n")


def op_stat(paths: list[Path]) -> int:
    for path in paths:
        os.stat(path)
    return len(paths)


def read_one(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
        return total
    finally:
        os.close(fd)


def op_read(paths: list[Path]) -> int:
    for path in paths:
        read_one(path)
    return len(paths)


def op_read_threads(paths: list[Path], threads: int = THREADS) -> int:
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(read_one, paths, chunksize=16):
            pass
    return len(paths)


class MetaBench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.cases = [c for c in CASES if c in args.cases]
        self.source = work / "source"
        self.results = Results()
        self.trace: FuseTrace | None = None
        #: ``page_cache_drops()`` when the mount in use was warmed (or after
        #: this bench's own drop for a cold step).
        self.drops_before = 0
        #: PID of the daemon of the mount in use (py-spy's target, CPU time).
        self.daemon_pid: int | None = None

    @property
    def uses_markers(self) -> bool:
        """s3rver lists a prefix that holds only prefixes only with a marker
        (``put_directory_markers``); SeaweedFS, like S3, needs none."""
        return self.server_name == "s3rver"

    def check_prerequisites(self) -> None:
        self.check_common_prerequisites(set(self.cases))
        self._tool("find")

    # --- the trees ---

    def make_tree(self, count: int) -> Tree:
        a = self.args
        name = f"t{count}"
        rng = random.Random(a.seed)
        pool = rng.randbytes(a.file_max)
        files: list[str] = []
        for d in range(a.dirs):
            (self.source / name / f"d{d:02d}").mkdir(parents=True)
        for i in range(count):
            rel = f"d{i % a.dirs:02d}/f{i:06d}"
            size = rng.randint(a.file_min, a.file_max)
            (self.source / name / rel).write_bytes(pool[:size])
            files.append(rel)
        log(f"uploading {name}: {count} files with s5cmd to {self.server_name}")
        started = time.perf_counter()
        self.run_quiet(
            self.s5cmd("cp", f"{self.source / name}/*", f"s3://{BUCKET}/{PREFIX}/{name}/")
        )
        log(f"uploaded {name} in {time.perf_counter() - started:.0f} s")
        if self.uses_markers:
            markers = [f"{PREFIX}/", f"{PREFIX}/{name}/"]
            markers += [f"{PREFIX}/{name}/d{d:02d}/" for d in range(a.dirs)]
            put_directory_markers(self.endpoint, markers)
        return Tree(name, files, 1 + a.dirs + count)

    # --- mounts: each yields the mount point and a function that reads tierfs's store calls ---

    def tierfs_config(self, list_ttl: float | None) -> Path:
        cfg = self.work / "tierfs.toml"
        lines = [
            "[backing]",
            f'url = "s3://{BUCKET}/{PREFIX}"',
            f'endpoint_url = "{self.endpoint}"',
            f'region = "{REGION}"',
            "[state]",
            f'dir = "{self.work / "tierfs-state"}"',
            "[[tiers]]",
            'name = "nvme"',
            f'path = "{self.work / "tier"}"',
            f'capacity = "{fmt_size(self.args.tier_capacity)}"',
        ]
        if list_ttl is not None:
            lines += ["[namespace]", f'list_ttl = "{list_ttl:g}s"']
        cfg.write_text("\n".join([*lines, ""]))
        return cfg

    def tierfs_calls(self, mp: Path) -> dict[str, int]:
        out = self.run_quiet([self.tierfs_bin, "status", str(mp), "--json"]).stdout
        calls = json.loads(out).get("store_calls") or {}
        return {short: int(calls.get(op, 0)) for short, op in COUNTED.items()}

    @contextlib.contextmanager
    def mount(
        self, name: str, list_ttl: float | None = None
    ) -> Iterator[tuple[Path, Callable[[], dict[str, int]] | None]]:
        """A fresh mount of ``name`` (empty cache and state) over the bucket's
        ``meta/`` (the passthrough: over the local copy)."""
        mp = self.work / f"mnt-{name}"
        mp.mkdir(exist_ok=True)
        cache = self.work / f"cache-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        if name == "tierfs":
            for d in (self.work / "tierfs-state", self.work / "tier"):
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir()
            cmd = [self.tierfs_bin, "mount", str(self.tierfs_config(list_ttl)), str(mp)]
            done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
            pid: int | None = None
            try:
                if done.returncode != 0:
                    raise BenchError(f"tierfs mount failed: {done.stderr.strip()}")
                pid = int(
                    json.loads(
                        self.run_quiet([self.tierfs_bin, "status", str(mp), "--json"]).stdout
                    )["pid"]
                )
                self.daemon_pid = pid
                yield mp, lambda: self.tierfs_calls(mp)
            finally:
                self.daemon_pid = None
                self.unmount_tierfs(mp, pid)
            return
        if name == "passthrough":
            cmd = [sys.executable, str(HERE / "passthrough.py"), str(self.source), str(mp)]
            cmd += ["--timeout", f"{self.args.passthrough_timeout:g}"]
        elif name == "rclone":
            self.rclone_remote_env()
            conf = self.work / "rclone.conf"
            conf.touch()
            cmd = ["rclone", "mount", f"bench:{BUCKET}/{PREFIX}", str(mp), "--config", str(conf)]
            cmd += ["--vfs-cache-mode", "full", "--cache-dir", str(cache), "--read-only"]
        else:
            opts = [
                f"url={self.endpoint}",
                "use_path_request_style",
                f"passwd_file={self.s3fs_passwd()}",
                f"use_cache={cache}",
                f"endpoint={REGION}",
                "ro",
            ]
            cmd = ["s3fs", f"{BUCKET}:/{PREFIX}", str(mp), "-f", "-o", ",".join(opts)]
        with self.mount_peer(name, cmd, mp, lambda: bool(os.listdir(mp))) as pid:
            self.daemon_pid = pid
            try:
                yield mp, None
            finally:
                self.daemon_pid = None

    # --- scenarios ---

    def timed(
        self,
        tree: Tree,
        scenario: str,
        mount: str,
        op: Callable[[], int],
        calls: Callable[[], dict[str, int]] | None,
    ) -> None:
        before = calls() if calls else None
        requests: dict[str, OpStats] = {}
        mp = self.work / f"mnt-{mount}"
        spy = self.args.py_spy if mount == "tierfs" else None
        name = f"{tree.name}-{scenario.replace(' ', '-')}"
        server = self.s3_server_proc.pid if self.s3_server_proc else None
        with (
            py_spy(spy, self.daemon_pid, name),
            self.trace.record(mp, requests) if self.trace else contextlib.nullcontext(),
        ):
            cpu0 = self.daemon_cpu()
            server0 = cpu_seconds(server)
            t0 = time.perf_counter()
            count = op()
            seconds = time.perf_counter() - t0
            daemon_cpu = self.daemon_cpu() - cpu0
            server_cpu = cpu_seconds(server) - server0
        dropped = page_cache_drops() != self.drops_before
        sent = None
        if calls and before is not None:
            after = calls()
            sent = {k: after[k] - before[k] for k in after}
        row = Result(
            tree.name,
            scenario,
            mount,
            seconds,
            count,
            sent,
            fuse_summary(requests),
            daemon_cpu,
            server_cpu,
            dropped,
        )
        self.results.rows.append(row)
        extra = f" ({', '.join(f'{k} {v}' for k, v in sent.items())})" if sent else ""
        extra += (
            f" CPU/item: daemon {1e6 * daemon_cpu / max(count, 1):,.0f} us,"
            f" server {1e6 * server_cpu / max(count, 1):,.0f} us"
        )
        log(f"  {tree.name} {scenario:<16} {mount:<11} {row.rate:>10,.0f}/s{extra}")
        if row.fuse:
            log(f"    FUSE: {row.fuse}")
        if dropped:
            log("    (another process dropped the page cache meanwhile: not comparable)")

    def daemon_cpu(self) -> float:
        """CPU seconds of the daemon of the mount in use; of this process
        (the GET loop's threads) when there is none."""
        if self.daemon_pid is None:
            return time.process_time()
        return cpu_seconds(self.daemon_pid)

    def operations(self, tree: Tree, mp: Path) -> dict[str, Callable[[], int]]:
        root = mp / tree.name
        order = list(tree.files)
        random.Random(self.args.seed + 1).shuffle(order)
        paths = [root / rel for rel in order]
        in_order = [root / rel for rel in sorted(tree.files)]
        return {
            "find": lambda: op_find(root),
            "stat": lambda: op_stat(paths),
            "read": lambda: op_read(paths),
            "8 threads": lambda: op_read_threads(paths),
            "in order": lambda: op_read(in_order),
        }

    def wanted(self, tree: Tree) -> tuple[list[str], list[str]]:
        """The scenarios and operations to run on ``tree``: the large one
        has its own (``--large-scenarios``, ``--large-operations``)."""
        if tree.name == f"t{self.args.large_files}" and self.args.large:
            return self.args.large_scenarios, self.args.large_operations
        return self.args.scenarios, self.args.operations

    def run_mount_case(self, tree: Tree, name: str) -> None:
        wanted, operations = self.wanted(tree)
        if "warm" in wanted:
            with self.mount(name) as (mp, calls):
                ops = self.operations(tree, mp)
                self.drops_before = page_cache_drops()
                for op in operations:  # the warm-up pass, untimed
                    ops[op]()
                for op in operations:
                    self.timed(tree, f"warm {op}", name, ops[op], calls)
        cold = [
            *(operations if "cold" in wanted else ()),
            *(["8 threads"] * ("threads" in wanted)),
            *(["in order"] * ("order" in wanted)),
        ]
        for op in cold:
            drop_caches()
            self.drops_before = page_cache_drops()
            with self.mount(name) as (mp, calls):
                self.timed(tree, f"cold {op}", name, self.operations(tree, mp)[op], calls)
        if name == "tierfs" and "ttl1s" in wanted:
            with self.mount(name, list_ttl=1.0) as (mp, calls):
                ops = self.operations(tree, mp)
                self.drops_before = page_cache_drops()
                for op in operations:
                    ops[op]()
                for op in operations:
                    time.sleep(TTL_WAIT)
                    self.timed(tree, f"ttl1s {op}", name, ops[op], calls)

    def run_get_loop(self, tree: Tree) -> None:
        client = s3_client(self.endpoint, pool=THREADS + 2)
        keys = [f"{PREFIX}/{tree.name}/{rel}" for rel in tree.files]
        random.Random(self.args.seed + 1).shuffle(keys)

        def get(key: str) -> int:
            return len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

        def loop() -> int:
            with ThreadPoolExecutor(THREADS) as pool:
                for _ in pool.map(get, keys, chunksize=16):
                    pass
            return len(keys)

        wanted, _ = self.wanted(tree)
        # A drop seen during a GET loop step is one made after this point
        # (the mounts' steps set their own starting count).
        self.drops_before = page_cache_drops()
        if "threads" in wanted:
            self.timed(tree, "cold 8 threads", "GET loop", loop, None)
        if "order" in wanted:
            in_order = sorted(keys)

            def loop_in_order() -> int:
                for key in in_order:
                    get(key)
                return len(in_order)

            self.timed(tree, "cold in order", "GET loop", loop_in_order, None)

    def run(self) -> None:
        self.check_prerequisites()
        with self.s3_server():
            s3_client(self.endpoint).create_bucket(Bucket=BUCKET)
            sizes = [self.args.files] + ([self.args.large_files] if self.args.large else [])
            load = self.wait_idle()
            self.results.notes["CPU busy with other work before the run"] = f"{100 * load:.0f}%"
            if self.args.trace:
                self.trace = FuseTrace(self.work)
                if not self.trace.available:
                    log(f"--trace: {self.trace.why_not}")
            try:
                for count in sizes:
                    tree = self.make_tree(count)
                    self.results.trees[tree.name] = (
                        list_pages_needed(tree, self.uses_markers),
                        len(directories_listed(tree, self.uses_markers)),
                    )
                    if {"threads", "order"} & set(self.wanted(tree)[0]):
                        self.run_get_loop(tree)
                    for name in self.cases:
                        log(f"{tree.name}: {name}")
                        self.run_mount_case(tree, name)
            finally:
                if self.trace is not None:
                    self.trace.close()


# --- the report -------------------------------------------------------------------------------


def scenarios(res: Results, tree: str) -> list[str]:
    seen: list[str] = []
    for row in res.rows:
        if row.tree == tree and row.scenario not in seen:
            seen.append(row.scenario)
    return seen


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def report(res: Results, a: argparse.Namespace) -> str:
    out = [
        f"trees of {a.files:,} files"
        + (f" and {a.large_files:,} files" if a.large else "")
        + f" of {fmt_size(a.file_min)}-{fmt_size(a.file_max)} in {a.dirs} dirs (seed {a.seed});"
        f" one round; S3 server {server_name(a)}; {os.cpu_count()} CPUs; rates per second"
        " (find: entries, others: files)",
        "",
    ]
    mounts = [m for m in (*CASES, "GET loop") if any(r.mount == m for r in res.rows)]
    for tree in dict.fromkeys(r.tree for r in res.rows):
        header = ["scenario", *mounts, "/passthrough", "/GET loop", "/rclone", "/s3fs"]
        rows = []
        for scenario in scenarios(res, tree):
            rates = {m: res.rate(tree, scenario, m) for m in mounts}
            ours = rates.get("tierfs")
            spoilt = any(r.dropped for r in res.rows if (r.tree, r.scenario) == (tree, scenario))
            rows.append(
                [
                    f"{tree} {scenario}" + (" (!)" if spoilt else ""),
                    *(fmt_rate(rates[m]) for m in mounts),
                    *(fmt_ratio(ours, rates.get(m)) for m in ("passthrough", "GET loop")),
                    *(fmt_ratio(ours, rates.get(m)) for m in ("rclone", "s3fs")),
                ]
            )
        out += table(header, rows, left={0})
        out.append("")
        counted = [r for r in res.rows if r.tree == tree and r.calls is not None]
        if counted:
            crow = [
                [f"{tree} {r.scenario}", f"{r.count:,}", *(f"{r.calls[k]:,}" for k in COUNTED)]
                for r in counted
                if r.calls is not None
            ]
            out += table(["tierfs requests", "items", *COUNTED], crow, left={0})
            out.append("")
        cpu_rows = [
            [
                f"{r.tree} {r.scenario}",
                r.mount,
                f"{1e6 * r.daemon_cpu / max(r.count, 1):,.0f}",
                f"{1e6 * r.server_cpu / max(r.count, 1):,.0f}",
            ]
            for r in res.rows
            if r.tree == tree
        ]
        out += table(["CPU per item", "mount", "daemon us", "S3 server us"], cpu_rows, left={0, 1})
        out.append("")
        traced = [r for r in res.rows if r.tree == tree and r.fuse]
        if traced:
            out.append("FUSE requests per step (count, median latency, total latency):")
            out += [f"  {r.tree} {r.scenario} {r.mount}: {r.fuse}" for r in traced]
            out.append("")
    checks = list_check(res)
    if checks:
        out += [*checks, ""]
    out.append("(/X: tierfs rate / X rate; tierfs requests: sent to the bucket during the step)")
    if any(r.dropped for r in res.rows):
        out.append("(!): another process dropped the page cache during the step: not comparable")
    out += [f"{k}: {v}" for k, v in res.notes.items()]
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_meta.py",
        description="Metadata and small files: tierfs vs a pyfuse3 passthrough, rclone, s3fs.",
    )
    p.add_argument("--files", type=int, default=4000, help="files of the tree (4000)")
    p.add_argument("--large", action="store_true", help="also a tree of --large-files")
    p.add_argument("--large-files", type=int, default=100_000, help="(100000)")
    p.add_argument(
        "--large-scenarios",
        default="cold",
        type=comma_list,
        help=f"scenarios to run on the large tree (cold; any of {','.join(SCENARIOS)})",
    )
    p.add_argument(
        "--large-operations",
        default="find,stat",
        type=comma_list,
        help="operations of the large tree's warm, cold and ttl1s scenarios (find,stat)",
    )
    p.add_argument("--file-min", type=parse_size, default=parse_size("1KiB"))
    p.add_argument("--file-max", type=parse_size, default=parse_size("16KiB"))
    p.add_argument("--dirs", type=int, default=10, help="directories of each tree (10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--cases",
        default=",".join(CASES),
        type=comma_list,
        help=f"mounts to measure ({','.join(CASES)})",
    )
    p.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        type=comma_list,
        help=f"scenarios to run ({','.join(SCENARIOS)})",
    )
    p.add_argument(
        "--operations",
        default=",".join(OPERATIONS),
        type=comma_list,
        help=f"operations of the warm, cold and ttl1s scenarios ({','.join(OPERATIONS)})",
    )
    p.add_argument(
        "--passthrough-timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="kernel entry/attr timeout of the passthrough, seconds (60: tierfs's list_ttl)",
    )
    p.add_argument("--trace", action="store_true", help="count FUSE requests per step")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="record the tierfs daemon with py-spy during each timed step into DIR",
    )
    p.add_argument("--tier-capacity", type=parse_size, default=parse_size("8GiB"))
    p.add_argument(
        "--wait-idle",
        type=float,
        default=60.0,
        help="before the run, wait up to this many seconds for other work to stop (60)",
    )
    add_server_arguments(p)
    add_run_arguments(p, json_help="also write the rows to this file")
    args = p.parse_args(argv)
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        p.error(f"unknown case: {', '.join(bad)}")
    bad = [c for c in [*args.scenarios, *args.large_scenarios] if c not in SCENARIOS]
    if bad:
        p.error(f"unknown scenario: {', '.join(bad)}")
    bad = [c for c in [*args.operations, *args.large_operations] if c not in OPERATIONS]
    if bad:
        p.error(f"unknown operation: {', '.join(bad)}")
    if args.large and args.large_files == args.files:
        p.error("--large-files must differ from --files (the trees are named by their size)")
    if args.files < 1 or args.dirs < 1 or not 0 < args.file_min <= args.file_max:
        p.error("need --files >= 1, --dirs >= 1 and 0 < --file-min <= --file-max")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench, code = run_in_workdir(args, "tierfs-bench-meta-", lambda work: MetaBench(args, work))
    if bench is not None and bench.results.rows:
        if code:
            print("(incomplete run)")
        print(report(bench.results, args))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            rows = [r.__dict__ for r in bench.results.rows]
            document = {
                "server": server_name(args),
                "rows": rows,
                "notes": bench.results.notes,
                "checks": list_check(bench.results),
            }
            args.json.write_text(json.dumps(document, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
