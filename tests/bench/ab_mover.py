"""Mover passes without FUSE: A/B of the mover's settings, interleaved with ``cp``.

Run as root (``drop_caches``)::

    .venv/bin/python tests/bench/ab_mover.py 4 4 "mc=3,maxmc=3,iol=4/mc=3,maxmc=16,iol=16"

Arguments: file size in MiB (2 GiB of files), rounds, and variants separated
by ``/``, each a comma list of ``mc`` (MOVE_CONCURRENCY), ``maxmc``
(MAX_MOVE_CONCURRENCY), ``bif`` (MOVE_BYTES_IN_FLIGHT in MiB) and ``iol``
(DataMovement's copy threads); a key left out takes its value before
this change (3, 3, 64, 4).  One TierFS over a ``file://`` backing (in
``$WORK``, default /var/tmp/tierfs-ab-mover), no mount: the files are fetched into
the first tier once; each round runs ``cp --reflink=never`` of 80 % of the
cache files and one ``Mover.run_pass`` per variant (first tier at 90 %, high
mark 80 %, low 10 %), in an order rotated per round, each after putting
every file back on the first tier and dropping the page cache.  Prints
MB/s, the loop thread's and the process's CPU seconds, the group commits
and their time, and per round each variant against that round's ``cp``.
Not a test; never collected by pytest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

import tierfs.workers.mover as mover_mod
from tierfs.config import load_config
from tierfs.core import TierFS
from tierfs.meta import MetaDB
from tierfs.store import open_store
from tierfs.tiers import Tier
from tierfs.workers.wiring import mover_for

MiB = 1 << 20
WORK = Path(os.environ.get("WORK", "/var/tmp/tierfs-ab-mover"))


def drop() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(1)


def write_config(work: Path, total: int) -> Path:
    cap = total * 100 // 90
    text = f"""
[backing]
url = {json.dumps((work / "backing").as_uri())}
[state]
dir = {json.dumps(str(work / "state"))}
[[tiers]]
name = "nvme"
path = {json.dumps(str(work / "nvme"))}
capacity = {cap}
high_watermark = 0.8
low_watermark = 0.1
[[tiers]]
name = "hdd"
path = {json.dumps(str(work / "hdd"))}
capacity = {4 * total}
[fetch]
block_size = "4MiB"
[mover]
interval = "1h"
bandwidth = "0"
"""
    p = work / "tierfs.toml"
    p.write_text(text)
    return p


def apply(variant: str, fs: TierFS) -> None:
    """variant: comma list of KEY=VALUE (mc=, iol=)."""
    settings = dict(kv.split("=") for kv in variant.split(",") if kv)
    mover_mod.MOVE_CONCURRENCY = int(settings.get("mc", 3))
    mover_mod.MAX_MOVE_CONCURRENCY = int(settings.get("maxmc", 3))
    mover_mod.MOVE_BYTES_IN_FLIGHT = int(settings.get("bif", 64)) << 20
    fs.movement.io_limiter.total_tokens = int(settings.get("iol", 4))
    for key, value in settings.items():
        if key.startswith("env:"):
            os.environ[key[4:]] = value


async def main_async(size: int, rounds: int, variants: list[str]) -> None:
    backing = WORK / "backing" / f"s{size // MiB}"
    backing.mkdir(parents=True, exist_ok=True)
    pool = random.Random(1).randbytes(64 * MiB)
    count = 2048 * MiB // size
    names = [f"s{size // MiB}/f{i:04d}" for i in range(count)]
    for i, n in enumerate(names):
        p = WORK / "backing" / n
        if not p.exists():
            with open(p, "wb") as f:
                left, off = size, (i * 40961) % (32 * MiB)
                while left:
                    c = pool[off : off + left]
                    f.write(c)
                    left -= len(c)
                    off = 0
    total = size * count
    for d in ("state", "nvme", "hdd", "cpdst"):
        shutil.rmtree(WORK / d, ignore_errors=True)
        (WORK / d).mkdir()
    config = load_config(write_config(WORK, total))
    store = open_store(config.backing)
    store.check()
    meta = MetaDB(config.state.dir / "meta", store.url)
    tiers = [Tier(i, t) for i, t in enumerate(config.tiers)]
    fs = TierFS(config, meta, store, tiers)
    commit_times: list[float] = []
    real_commit = meta.commit

    def timed_commit() -> None:
        t = time.perf_counter()
        real_commit()
        commit_times.append(time.perf_counter() - t)

    meta.commit = timed_commit  # type: ignore[method-assign]
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(fs.run_workers)
            inos = []
            for name in names:
                ino = (await fs.namespace.resolve(name)).ino
                await fs.movement.fill(ino, 0)
                inos.append(ino)
            for r in range(rounds):
                order = ["cp", *variants]
                k = r % len(order)
                order = order[k:] + order[:k]
                got: dict[str, float] = {}
                for variant in order:
                    # everything back on nvme, as after the fill
                    for ino in inos:
                        while fs.meta.residency(ino).get(1):
                            try:
                                await fs.movement.relocate(ino, 1, 0)
                            except Exception as exc:
                                print("   reset retry", exc)
                                await trio.sleep(0.3)
                    await trio.sleep(0.5)
                    if variant == "cp":
                        n = int(count * 0.8)
                        fan = WORK / "nvme" / "data"
                        src = [fan / f"{ino % 256:02x}" / str(ino) for ino in inos[:n]]
                        dst = WORK / "cpdst"
                        shutil.rmtree(dst, ignore_errors=True)
                        dst.mkdir()
                        await trio.to_thread.run_sync(drop)
                        t0 = time.perf_counter()
                        await trio.to_thread.run_sync(
                            lambda src=src, dst=dst: subprocess.run(
                                ["cp", "--reflink=never", *map(str, src), str(dst)], check=True
                            )
                        )
                        got[variant] = n * size / (time.perf_counter() - t0) / 1e6
                        print(f"  cp {got[variant]:.0f} MB/s", flush=True)
                        continue
                    await trio.to_thread.run_sync(drop)
                    mover = mover_for(fs)
                    moved0, files0 = mover.status.bytes_moved, mover.status.files_moved
                    apply(variant, fs)
                    nursery.start_soon(mover.meter.run)
                    commit_times.clear()
                    t0, l0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
                    await mover.run_pass()
                    secs = time.perf_counter() - t0
                    loop_cpu, proc_cpu = time.thread_time() - l0, time.process_time() - p0
                    got[variant] = (mover.status.bytes_moved - moved0) / secs / 1e6
                    print(
                        f"  {variant}: {got[variant]:.0f} MB/s, {mover.status.files_moved - files0} files "
                        f"in {secs:.2f}s, loop cpu {loop_cpu:.2f}s, proc cpu {proc_cpu:.2f}s, "
                        f"{len(commit_times)} commits {sum(commit_times):.2f}s",
                        flush=True,
                    )
                line = ", ".join(f"{v} {got[v] / got['cp']:.2f}" for v in variants)
                print(f"round {r + 1}: / cp: {line}", flush=True)
                for v in ["cp", *variants]:
                    rates.setdefault(v, []).append(got[v])
                    ratios.setdefault(v, []).append(got[v] / got["cp"])
            nursery.cancel_scope.cancel()
    finally:
        fs.close()
        meta.close()
        for t in tiers:
            t.close()
    for v in ["cp", *variants]:
        print(
            f"{v}: median {statistics.median(rates[v]):.0f} MB/s, / cp median "
            f"{statistics.median(ratios[v]):.2f} ({min(ratios[v]):.2f}-{max(ratios[v]):.2f})"
        )


def main() -> None:
    size = int(sys.argv[1]) * MiB
    rounds = int(sys.argv[2])
    variants = sys.argv[3].split("/") if len(sys.argv) > 3 else ["mc=3"]
    trio.run(main_async, size, rounds, variants)


main()
