#!/usr/bin/env python3
"""Fast reads: a warm data set read from a local copy, through the mount,
and through ``tierfs.client.open`` (descriptors of the tier files).

Run it through ``bash tests/bench/run.sh fastread`` as root (FUSE mounts,
``drop_caches``).  Not a test: never collected by pytest, never run in CI.
The backing is ``file://`` (the files are resident on the first tier before
anything is timed: the bucket is not on the path being measured).

Setup: ``--files`` files of 20-200 KiB (``tree/``), a ``torch.save``d
checkpoint of ``--checkpoint`` bytes and a ``--big`` file of random bytes,
in the backing directory and in a local copy on the same disk as the tier
(the physical limit).  One mount (tier capacity 3x the data), preloaded,
then read once through the mount (every block fetched and checked in this
mount, as after a preload and a first epoch).

Each round runs every case on every path, each path first in turn (a slow
spell of the shared machine does not always fall on the same one), the
page cache dropped before each pass:

* ``epoch``: a ``DataLoader`` epoch, 2 workers (forked), batch 32, shuffled
  (``RandomSampler``; the client path wraps it in ``PrefetchSampler``: the
  order is what lets descriptors come ahead), over a ``Dataset`` that
  reads each file whole;
* ``load``: ``torch.load`` of the checkpoint (``tierfs.torch.load`` on the
  client path);
* ``seq``: a sequential read of the big file in 1 MiB ``readinto``s.

Paths: ``local`` (the copy), ``mount`` (``open`` through the mount),
``client`` (``tierfs.client.open``).  Printed: per case and path the
median seconds over the rounds, the ratio to local (median, min-max), and
for the epoch the daemon's CPU seconds per 1,000 files on each path (from
``/proc``): the acceptance figures are client >= 0.9x local and the
client's daemon CPU <= 10 % of the mount path's.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import (  # noqa: E402
    children_cpu_seconds,
    cpu_seconds,
    drop_caches,
    file_backing_config,
    fmt_size,
    log,
    parse_size,
    py_spy,
    tierfs_mounted,
)

import tierfs.client  # noqa: E402
import tierfs.torch  # noqa: E402

VENV_BIN = Path(sys.executable).parent
PATHS = ("local", "mount", "client")
CASES = ("epoch", "load", "seq")
KiB = 1024
MiB = 1024 * KiB


class Files:
    """A map-style data set: sample i is the bytes of files[i], read whole."""

    def __init__(self, files: list[str], opener: Callable[[str], Any]) -> None:
        self.files = files
        self.opener = opener

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> int:
        with self.opener(self.files[index]) as f:
            return len(f.read())


def _count(batch: list[int]) -> int:
    return sum(batch)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.backing = work / "backing"
        self.local = work / "local"
        self.mp = work / "mnt"
        self.names: list[str] = []
        self.pid = 0
        #: (case, path) -> per round: seconds, daemon CPU seconds
        self.samples: dict[tuple[str, str], list[tuple[float, float]]] = {}

    # --- setup ----------------------------------------------------------------------

    def make_data(self) -> None:
        import torch

        rng = random.Random(self.args.seed)
        for i in range(self.args.files):
            name = f"tree/d{i % 16:02d}/f{i:05d}.bin"
            path = self.backing / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(rng.randint(20 * KiB, 200 * KiB)))
            self.names.append(name)
        elements = self.args.checkpoint // 4
        torch.save(
            {"weights": torch.rand(elements // 2), "moments": torch.rand(elements - elements // 2)},
            self.backing / "ckpt.pt",
        )
        with open(self.backing / "big.bin", "wb") as f:
            left = self.args.big
            while left:
                n = min(left, 16 * MiB)
                f.write(rng.randbytes(n))
                left -= n
        shutil.copytree(self.backing, self.local)

    def config(self) -> Path:
        state, tier = self.work / "state", self.work / "tier"
        for d in (state, tier):
            d.mkdir(parents=True, exist_ok=True)
        total = sum(p.stat().st_size for p in self.backing.rglob("*") if p.is_file())
        lines = file_backing_config(self.backing, state, tier, str(3 * total + (1 << 30)))
        path = self.work / "tierfs.toml"
        path.write_text("\n".join([*lines, ""]))
        return path

    @contextlib.contextmanager
    def mounted(self) -> Iterator[None]:
        self.mp.mkdir(exist_ok=True)
        with tierfs_mounted(self.config(), self.mp) as self.pid:
            yield

    def warm(self) -> None:
        done = subprocess.run(
            [str(VENV_BIN / "tierfs"), "preload", str(self.mp)],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tierfs preload failed: {done.stderr.strip()}")
        for name in [*self.names, "ckpt.pt", "big.bin"]:
            with open(self.mp / name, "rb") as f:
                while f.read(8 * MiB):
                    pass

    # --- the cases ------------------------------------------------------------------

    def root(self, path: str) -> Path:
        return self.local if path == "local" else self.mp

    def opener(self, path: str) -> Callable[[str], Any]:
        base = self.root(path)
        if path == "client":
            return lambda name: tierfs.client.open(base / name)
        return lambda name: open(base / name, "rb")

    def epoch(self, path: str, number: int) -> None:
        import torch
        from torch.utils.data import DataLoader, RandomSampler

        dataset = Files(self.names, self.opener(path))
        generator = torch.Generator().manual_seed(number)
        sampler: Any = RandomSampler(dataset, generator=generator)
        if path == "client":
            sampler = tierfs.torch.PrefetchSampler(
                sampler, [str(self.mp / n) for n in self.names], self.mp
            )
        loader = DataLoader(
            dataset, batch_size=32, sampler=sampler, num_workers=2, collate_fn=_count
        )
        total = sum(loader)
        if path == "client":
            sampler.close()
        expected = sum((self.backing / n).stat().st_size for n in self.names)
        if total != expected:
            raise RuntimeError(f"epoch on {path} read {total} bytes, not {expected}")

    def load(self, path: str, number: int) -> None:
        import torch

        file = self.root(path) / "ckpt.pt"
        load = tierfs.torch.load if path == "client" else torch.load
        state = load(file, map_location="cpu", weights_only=True)
        if sum(t.numel() for t in state.values()) * 4 != self.args.checkpoint:
            raise RuntimeError(f"the checkpoint read on {path} is not whole")

    def seq(self, path: str, number: int) -> None:
        buffer = bytearray(MiB)
        total = 0
        with self.opener(path)("big.bin") as f:
            while n := f.readinto(buffer):
                total += n
        if total != self.args.big:
            raise RuntimeError(f"the big file read on {path} is {total} bytes")

    def round(self, number: int) -> None:
        for case in self.args.cases:
            shift = (number - 1) % len(PATHS)
            for path in PATHS[shift:] + PATHS[:shift]:
                drop_caches()
                spy = self.args.py_spy if path != "local" else None
                with py_spy(spy, self.pid, f"{case}-{path}-{number}"):
                    cpu0, t0 = cpu_seconds(self.pid), time.perf_counter()
                    own0 = time.process_time() + children_cpu_seconds()
                    getattr(self, case)(path, number)
                    seconds = time.perf_counter() - t0
                    cpu = cpu_seconds(self.pid) - cpu0
                    own = time.process_time() + children_cpu_seconds() - own0
                self.samples.setdefault((case, path), []).append((seconds, cpu))
                log(
                    f"round {number} {case:5s} {path:6s} {seconds:7.3f} s, daemon {cpu:.2f} s, "
                    f"readers (this process and its workers) {own:.2f} s of CPU"
                )

    # --- report ---------------------------------------------------------------------

    def report(self) -> str:
        out = [
            f"fast reads: {self.args.files} files of 20-200 KiB, checkpoint "
            f"{fmt_size(self.args.checkpoint)}, big file {fmt_size(self.args.big)}, "
            f"{self.args.rounds} rounds, page cache dropped before each pass",
            "",
            f"{'case':6s} {'path':7s} {'median s':>9s} {'vs local (median, min-max)':>28s}"
            f" {'daemon CPU s/1000 files':>24s}",
        ]
        for case in self.args.cases:
            local = [s for s, _c in self.samples[(case, "local")]]
            for path in PATHS:
                rows = self.samples[(case, path)]
                seconds = [s for s, _c in rows]
                ratios = [lo / s for lo, s in zip(local, seconds, strict=True)]
                cpu = ""
                if case == "epoch" and path != "local":
                    per = statistics.median(c for _s, c in rows) * 1000 / self.args.files
                    cpu = f"{per:.3f}"
                out.append(
                    f"{case:6s} {path:7s} {statistics.median(seconds):9.3f} "
                    f"{statistics.median(ratios):>12.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                    f"{'':7s} {cpu:>24s}"
                )
        if "epoch" in self.args.cases:
            mount = statistics.median(c for _s, c in self.samples[("epoch", "mount")])
            client = statistics.median(c for _s, c in self.samples[("epoch", "client")])
            share = client / mount if mount else float("nan")
            out += ["", f"daemon CPU, client / mount path: {share:.1%} (target <= 10%)"]
        return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--files", type=int, default=3000, help="small files (default 3000)")
    p.add_argument("--checkpoint", type=parse_size, default=parse_size("256MiB"))
    p.add_argument("--big", type=parse_size, default=parse_size("1GiB"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", type=lambda t: t.split(","), default=list(CASES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=None, help="work directory (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the samples here")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="record the daemon with py-spy during each pass (collapsed stacks in DIR)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        log("run as root (FUSE mounts, drop_caches)")
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="tierfs-fastread-", dir="/var/tmp"))
    bench = Bench(args, work)
    try:
        log(f"making the data in {work}")
        bench.make_data()
        with bench.mounted():
            log("preloading and reading everything once through the mount")
            bench.warm()
            for number in range(1, args.rounds + 1):
                bench.round(number)
            print(bench.report())
            if args.json:
                args.json.write_text(
                    json.dumps({f"{c}/{p}": v for (c, p), v in bench.samples.items()}, indent=1)
                )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
