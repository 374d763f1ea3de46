#!/usr/bin/env python3
"""A/B of the mover's copy function against ``cp``, interleaved, no mount.

Run as root (``drop_caches``): ``.venv/bin/python tests/bench/ab_copy.py``.
Not a test, never collected by pytest.

What it answers: how fast the copy step of a relocate (``core.movement``:
read each block of the source cache file, hash it, write it to the same
offset of the destination cache file) is against GNU ``cp --reflink=never``
of the same files, on the same filesystem, with nothing else of the mount
around it (no FUSE, no LMDB, no planning).  The gap between this ratio and
``bench_lifecycle.py``'s demotion ratio is the mover's per-file work.

How: ``--shapes`` (8 x 256 MiB and 512 x 4 MiB by default, ``--total`` 2 GiB
each) are written once under ``--dir``.  Each round runs every variant on
every shape, in an order rotated from round to round; before each timed
copy the destination is removed, everything is synced and the page cache
is dropped, so each variant reads the disk as ``cp`` does.  The time stops
when the copy returns (written bytes still in the page cache, as for
``cp``: the mover does not fsync clean blocks).  On a machine shared with
other work, read the per-round ratios (each variant against the ``cp`` of
the same round), not the absolute figures.

Variants (``--variants``):

* ``cp``: ``cp --reflink=never`` of the files into one directory.
* ``before``: the copy function before this change (8 MiB ``preadv`` into
  one buffer, xxh3 of each block, ``pwrite``), driven like the mover: up to
  ``--concurrency`` files at once, one thread call to open each pair and
  one per 8 MiB chunk.
* ``tierfs``: ``tierfs.core.tiering.movement``'s copy of a whole file, as the
  relocate calls it now, with the same concurrency.

Each tierfs variant's digests are checked against an xxh3 of the source.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trio
import xxhash

from tierfs.core.tiering import movement
from tierfs.tiers import pwrite_all

MiB = 1 << 20
BLOCK = 4 * MiB
BEFORE_CHUNK = 8 * MiB

#: (src_fd, dst_fd, [(offset, nbytes)]) -> digests, run in a thread.
CopyFn = Callable[[int, int, list[tuple[int, int]]], list[int]]


def copy_before(src_fd: int, dst_fd: int, jobs: list[tuple[int, int]]) -> list[int]:
    """The copy function before this change (for the A/B only)."""
    buf = memoryview(bytearray(max(n for _o, n in jobs)))
    digests: list[int] = []
    for offset, nbytes in jobs:
        view = buf[:nbytes]
        got = 0
        while got < nbytes:
            n = os.preadv(src_fd, [view[got:]], offset + got)
            if n == 0:
                view[got:] = bytes(nbytes - got)
                break
            got += n
        digests.append(xxhash.xxh3_64_intdigest(view))
        pwrite_all(dst_fd, view, offset)
    return digests


def file_jobs(size: int) -> list[tuple[int, int]]:
    return [(off, min(BLOCK, size - off)) for off in range(0, size, BLOCK)]


async def copy_files_before(pairs: list[tuple[Path, Path]], concurrency: int) -> list[list[int]]:
    """Like the relocate before: open in a thread, one thread call per chunk."""
    limiter = trio.CapacityLimiter(4)
    slots = trio.Semaphore(concurrency)
    out: list[list[int]] = [[] for _ in pairs]

    async def one(i: int, src: Path, dst: Path) -> None:
        try:
            fds = await trio.to_thread.run_sync(
                lambda: (os.open(src, os.O_RDONLY), os.open(dst, os.O_WRONLY | os.O_CREAT, 0o600)),
                limiter=limiter,
            )
            jobs = file_jobs(src.stat().st_size)
            per = BEFORE_CHUNK // BLOCK
            for start in range(0, len(jobs), per):
                out[i] += await trio.to_thread.run_sync(
                    copy_before, fds[0], fds[1], jobs[start : start + per], limiter=limiter
                )
            for fd in fds:
                os.close(fd)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        for i, (src, dst) in enumerate(pairs):
            await slots.acquire()
            nursery.start_soon(one, i, src, dst)
    return out


async def copy_files_tierfs(pairs: list[tuple[Path, Path]], concurrency: int) -> list[list[int]]:
    """The copy step as ``DataMovement._copy_and_verify`` runs it now: a
    ``BlockCopier`` per file, one thread call per ``COPY_CHUNK``."""
    limiter = trio.CapacityLimiter(4)
    slots = trio.Semaphore(concurrency)
    out: list[list[int]] = [[] for _ in pairs]

    async def one(i: int, src: Path, dst: Path) -> None:
        copier = movement.BlockCopier(
            lambda: os.open(src, os.O_RDONLY),
            lambda: os.open(dst, os.O_RDWR | os.O_CREAT, 0o600),
        )
        try:
            jobs = file_jobs(src.stat().st_size)
            per = max(1, movement.COPY_CHUNK // BLOCK)
            for start in range(0, len(jobs), per):
                out[i] += await trio.to_thread.run_sync(
                    copier.copy, jobs[start : start + per], limiter=limiter
                )
        finally:
            copier.close()
            slots.release()

    async with trio.open_nursery() as nursery:
        for i, (src, dst) in enumerate(pairs):
            await slots.acquire()
            nursery.start_soon(one, i, src, dst)
    return out


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def expected_digests(path: Path) -> list[int]:
    data = path.read_bytes()
    return [xxhash.xxh3_64_intdigest(data[o : o + n]) for o, n in file_jobs(len(data))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/var/tmp/tierfs-ab-copy"))
    p.add_argument("--shapes", default="256,4", help="file sizes in MiB (256,4)")
    p.add_argument("--total", type=int, default=2048, help="MiB per shape (2048)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="cp,before,tierfs")
    p.add_argument("--concurrency", type=int, default=3, help="files at once (3)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds after drop_caches")
    p.add_argument("--keep", action="store_true", help="keep the files for the next run")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("run as root (drop_caches)", file=sys.stderr)
        return 2
    shapes = [int(s) * MiB for s in a.shapes.split(",")]
    variants = a.variants.split(",")
    pool = random.Random(1).randbytes(64 * MiB)
    sources: dict[int, list[Path]] = {}
    for size in shapes:
        d = a.dir / f"src-{size // MiB}"
        d.mkdir(parents=True, exist_ok=True)
        files = [d / f"f{i:04d}" for i in range(max(1, a.total * MiB // size))]
        for i, f in enumerate(files):
            if not f.exists() or f.stat().st_size != size:
                with open(f, "wb") as out:
                    left, off = size, (i * 7919 * 4096) % len(pool)
                    while left:
                        chunk = pool[off : off + left]
                        out.write(chunk)
                        left -= len(chunk)
                        off = 0
        sources[size] = files
    checks = {size: expected_digests(files[0]) for size, files in sources.items()}
    rates: dict[tuple[int, str], list[float]] = {}
    ratios: dict[tuple[int, str], list[float]] = {}
    dst = a.dir / "dst"
    try:
        for round_no in range(a.rounds):
            order = variants[round_no % len(variants) :] + variants[: round_no % len(variants)]
            for size, files in sources.items():
                total = size * len(files)
                got: dict[str, float] = {}
                for variant in order:
                    shutil.rmtree(dst, ignore_errors=True)
                    dst.mkdir(parents=True)
                    drop_caches()
                    time.sleep(a.settle)
                    pairs = [(f, dst / f.name) for f in files]
                    t0 = time.perf_counter()
                    if variant == "cp":
                        subprocess.run(
                            ["cp", "--reflink=never", *map(str, files), str(dst)], check=True
                        )
                        digests = None
                    elif variant == "before":
                        digests = trio.run(copy_files_before, pairs, a.concurrency)
                    elif variant == "tierfs":
                        digests = trio.run(copy_files_tierfs, pairs, a.concurrency)
                    else:
                        raise SystemExit(f"unknown variant {variant}")
                    secs = time.perf_counter() - t0
                    if digests is not None and digests[0] != checks[size]:
                        raise SystemExit(f"{variant}: wrong digests")
                    if (dst / files[-1].name).stat().st_size != size:
                        raise SystemExit(f"{variant}: short copy")
                    got[variant] = total / secs / 1e6
                    rates.setdefault((size, variant), []).append(got[variant])
                line = ", ".join(f"{v} {got[v]:,.0f}" for v in variants)
                if "cp" in got:
                    for v in variants:
                        ratios.setdefault((size, v), []).append(got[v] / got["cp"])
                    line += " | / cp: " + ", ".join(
                        f"{v} {got[v] / got['cp']:.2f}" for v in variants if v != "cp"
                    )
                print(f"round {round_no + 1} {len(files)} x {size // MiB} MiB: MB/s {line}")
                sys.stdout.flush()
    finally:
        shutil.rmtree(dst, ignore_errors=True)
        if not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)
    print("medians:")
    for (size, v), values in rates.items():
        r = ratios.get((size, v))
        extra = f", / cp {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})" if r else ""
        print(f"  {size // MiB} MiB {v}: {statistics.median(values):,.0f} MB/s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
