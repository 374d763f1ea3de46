#!/usr/bin/env python3
"""What the audit log costs small files: tierfs with ``[audit]`` against
tierfs without it, and a pyfuse3 passthrough (the FUSE floor).

Run it through ``bash tests/bench/run.sh audit`` as root (FUSE mounts).  Not
a test: never collected by pytest, never run in CI.  The backing is
``file://`` (a directory on the local disk): the audit log costs the
daemon's request path, so an S3 server would only add noise.

Each round mounts, one after the other (each round starting with the next
variant), in a fresh state:

* ``passthrough``: ``passthrough.py`` over the backing directory;
* ``off``: tierfs without ``[audit]``;
* ``changes``: tierfs with ``[audit] path`` (changes: creates, opens for
  writing...);
* ``reads``: the same with ``reads = true`` (every open for reading too).

and on each, timed:

* ``read``: open+read+close of every file of the tree (``--files``, 1-16
  KiB), shuffled, after one untimed pass (warm: the kernel serves the bytes,
  the daemon sees OPEN, FLUSH, RELEASE);
* ``create``: create+write (4 KiB)+close of ``--files`` new files in a new
  directory.

It prints per variant the median files/s and the daemon's CPU per file,
the cost of each audit variant against ``off`` (1 - rate/off, per round,
with the spread), against the targets (changes: at most 5 % on create;
reads: at most 15 % on read), and the records the log got (every create
and, with reads, every open must be there: a bench that loses records
measures nothing).

``--variants off,quota`` (not in the default set) measures a quota the
same way: ``quota`` is tierfs with a ``[[quotas]]`` on the whole mount
(limits far away), so every create and every growing write is checked and
recorded against it.
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import (  # noqa: E402
    cpu_seconds,
    file_backing_config,
    fusermount_unmount,
    is_mounted,
    log,
    stop_process,
    thread_cpu_seconds,
    tierfs_mounted,
)

from tierfs.control.client import locate, request  # noqa: E402

VENV_BIN = Path(sys.executable).parent
VARIANTS = ("passthrough", "off", "changes", "reads")
#: Also known to ``--variants``: a quota over the whole mount.
EXTRA_VARIANTS = ("quota",)
#: The variants compared with ``off``.
COMPARED = ("changes", "reads", "quota")
WRITE_BYTES = 4096
#: Targets: the audit log's cost against tierfs without it.
TARGETS = {("changes", "create"): 0.05, ("reads", "read"): 0.15}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.backing = work / "backing"
        self.names: list[str] = []
        #: (variant, op) -> per round: (files/s, daemon CPU s per file)
        self.samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.records: dict[str, list[int]] = {}
        #: (variant, op) -> per round: (handler s per file, other threads' CPU s per file)
        self.inside_samples: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def make_tree(self) -> None:
        rng = random.Random(self.args.seed)
        for i in range(self.args.files):
            name = f"d{i % 10}/f{i:05d}.bin"
            path = self.backing / "tree" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(rng.randint(1024, 16 * 1024)))
            self.names.append(name)

    def config(self, variant: str) -> Path:
        state = self.work / "state"
        tier = self.work / "tier"
        for d in (state, tier):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        lines = file_backing_config(self.backing, state, tier, "8GiB")
        if variant in ("changes", "reads"):
            log_path = self.work / "audit.jsonl"
            log_path.unlink(missing_ok=True)
            lines += [
                "[audit]",
                f"path = {json.dumps(str(log_path))}",
                f"reads = {'true' if variant == 'reads' else 'false'}",
            ]
        if variant == "quota":
            lines += ["[[quotas]]", 'path = ""', 'bytes = "1PiB"', "files = 1000000000"]
        path = self.work / "tierfs.toml"
        path.write_text("\n".join([*lines, ""]))
        return path

    @contextlib.contextmanager
    def mounted(self, variant: str) -> Iterator[tuple[Path, int]]:
        mp = self.work / "mnt"
        mp.mkdir(exist_ok=True)
        if variant == "passthrough":
            scratch = self.work / "passthrough"
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.copytree(self.backing, scratch)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "passthrough.py"),
                    str(scratch),
                    str(mp),
                    "--timeout",
                    "60",
                ],
            )
            deadline = time.monotonic() + 30
            while not is_mounted(mp):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the passthrough did not mount")
                time.sleep(0.05)
            try:
                yield mp, proc.pid
            finally:
                fusermount_unmount(mp)
                stop_process(proc, "passthrough")
            return
        with tierfs_mounted(self.config(variant), mp) as pid:
            yield mp, pid

    def round(self, number: int) -> None:
        order = list(self.names)
        random.Random(number).shuffle(order)
        # Each round starts with another variant: a slow spell of the
        # machine does not always fall on the same one.
        shift = (number - 1) % len(self.args.variants)
        variants = self.args.variants[shift:] + self.args.variants[:shift]
        for variant in variants:
            with self.mounted(variant) as (mp, pid):
                tree = mp / "tree"
                for name in self.names:  # warm, untimed
                    (tree / name).read_bytes()
                before = self.inside(variant, mp, pid)
                cpu0, t0 = cpu_seconds(pid), time.perf_counter()
                for name in order:
                    with open(tree / name, "rb") as f:
                        f.read()
                self.add(variant, "read", t0, cpu0, pid)
                self.add_inside(variant, "read", before, self.inside(variant, mp, pid))
                new = mp / f"new-{number}-{variant}"
                new.mkdir()
                payload = b"w" * WRITE_BYTES
                before = self.inside(variant, mp, pid)
                cpu0, t0 = cpu_seconds(pid), time.perf_counter()
                for i in range(len(self.names)):
                    with open(new / f"f{i:05d}", "wb") as f:
                        f.write(payload)
                self.add(variant, "create", t0, cpu0, pid)
                self.add_inside(variant, "create", before, self.inside(variant, mp, pid))
                if variant in ("changes", "reads"):
                    time.sleep(1.0)  # the writer is off the request path: let it write
                    log_path = self.work / "audit.jsonl"
                    ops = [json.loads(line)["op"] for line in log_path.read_text().splitlines()]
                    self.records.setdefault(variant, []).append(len(ops))
                    creates = ops.count("create")
                    opens = ops.count("open")
                    if creates < len(self.names) or (
                        variant == "reads" and opens < 2 * len(self.names)
                    ):
                        raise RuntimeError(
                            f"{variant}: the log holds {creates} creates and {opens} opens"
                        )
            rate, cpu = self.samples[(variant, "read")][-1]
            crate, ccpu = self.samples[(variant, "create")][-1]
            log(
                f"round {number}: {variant:<11} read {rate:,.0f} files/s ({cpu * 1e6:,.0f} us CPU"
                f"/file), create {crate:,.0f} files/s ({ccpu * 1e6:,.0f} us CPU/file)"
            )

    @staticmethod
    def inside(variant: str, mp: Path, pid: int) -> tuple[float, float]:
        """(seconds in the daemon's FUSE handlers so far, CPU seconds of its
        threads other than the event loop's: the audit writer's, in trio's
        worker threads)."""
        if variant == "passthrough":
            return 0.0, 0.0
        status = request(locate(mp).socket_path, "status", timeout=30)
        handlers = sum(op["seconds"] for op in status["fuse_requests"].values())
        threads = sum(
            user + system
            for name, (user, system) in thread_cpu_seconds(pid).items()
            if name != "main"
        )
        return handlers, threads

    def add_inside(
        self, variant: str, op: str, before: tuple[float, float], after: tuple[float, float]
    ) -> None:
        count = len(self.names)
        self.inside_samples.setdefault((variant, op), []).append(
            ((after[0] - before[0]) / count, (after[1] - before[1]) / count)
        )

    def add(self, variant: str, op: str, t0: float, cpu0: float, pid: int) -> None:
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0
        count = len(self.names)
        self.samples.setdefault((variant, op), []).append((count / seconds, cpu / count))

    def report(self) -> str:
        out = [
            f"{self.args.files:,} files of 1-16 KiB (read) and {self.args.files:,} creates of "
            f"4 KiB, {self.args.rounds} rounds, medians",
            "",
            f"{'variant':<12} {'read files/s':>13} {'us CPU/file':>12} "
            f"{'create files/s':>15} {'us CPU/file':>12}",
        ]
        for variant in self.args.variants:
            cells = []
            for op in ("read", "create"):
                rates = [r for r, _c in self.samples[(variant, op)]]
                cpus = [c for _r, c in self.samples[(variant, op)]]
                cells.append(f"{statistics.median(rates):>13,.0f}")
                cells.append(f"{statistics.median(cpus) * 1e6:>12,.0f}")
            out.append(f"{variant:<12} {cells[0]} {cells[1]}   {cells[2]} {cells[3]}")
        out.append("")
        if "off" in self.args.variants:
            for variant in COMPARED:
                if variant not in self.args.variants:
                    continue
                for op in ("read", "create"):
                    costs = [
                        1 - rate / base
                        for (rate, _c), (base, _b) in zip(
                            self.samples[(variant, op)], self.samples[("off", op)], strict=True
                        )
                    ]
                    target = TARGETS.get((variant, op))
                    verdict = ""
                    if target is not None:
                        verdict = " PASS" if statistics.median(costs) <= target else " FAIL"
                        if max(costs) - min(costs) > 2 * target:
                            verdict = " NOT CONCLUSIVE: the rounds spread more than the target"
                        verdict = f" (target <= {target:.0%}){verdict}"
                    out.append(
                        f"{variant:<14} {op:<7} cost {statistics.median(costs):+.1%} "
                        f"(rounds {min(costs):+.1%} .. {max(costs):+.1%}){verdict}"
                    )
            out.append(f"records in the log per round: {self.records}")
            out.append("")
            out.append(
                "inside the daemon, per file (medians): time in the FUSE handlers (the request "
                "path: open, flush, release; create, write, flush, release), and CPU of the "
                "threads other than the event loop's (the audit writer's)"
            )
            for op in ("read", "create"):
                base_cpu = statistics.median(c for _r, c in self.samples[("off", op)])
                base_handler = statistics.median(h for h, _t in self.inside_samples[("off", op)])
                for variant in ("off", *COMPARED):
                    if (variant, op) not in self.inside_samples:
                        continue
                    handler = statistics.median(h for h, _t in self.inside_samples[(variant, op)])
                    threads = statistics.median(t for _h, t in self.inside_samples[(variant, op)])
                    added = handler - base_handler + threads
                    out.append(
                        f"  {op:<7} {variant:<8} handlers {handler * 1e6:6.1f} us, other "
                        f"threads {threads * 1e6:6.1f} us; added to off: {added * 1e6:+6.1f} us = "
                        f"{added / base_cpu:+.1%} of the daemon's CPU per file of off"
                    )
        return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000, help="files read and created (2000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, variants interleaved (5)")
    p.add_argument(
        "--variants",
        type=lambda t: t.split(","),
        default=list(VARIANTS),
        help=f"comma-separated, from {', '.join((*VARIANTS, *EXTRA_VARIANTS))} "
        f"(default: {','.join(VARIANTS)})",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=None, help="work directory (a temporary one)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.variants) - {*VARIANTS, *EXTRA_VARIANTS})
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join((*VARIANTS, *EXTRA_VARIANTS))}")
    if os.geteuid() != 0:
        print("run as root: FUSE mounts", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="tierfs-bench-audit-", dir="/var/tmp"))
    bench = Bench(args, work)
    try:
        bench.make_tree()
        for number in range(1, args.rounds + 1):
            bench.round(number)
        print(bench.report())
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
