#!/usr/bin/env python3
"""A/B of ways to fetch many small objects with obstore, no mount.

Run as root (``drop_caches``), after ``bash tests/bench/run.sh preload
--help`` has installed s3rver and s5cmd::

    .venv/bin/python tests/bench/ab_small_get.py --rounds 3

Not a test, never collected by pytest.

What it answers (the small-file preload): how much of the
daemon's CPU per small file is the way GETs wait, apart from everything
else tierfs does (no FUSE, no LMDB, no preload bookkeeping).  The daemon's
fetch threads spent 0.5 ms of CPU per 100 KiB file, two thirds of it in
the kernel, and ``strace -c -f`` counted about 190 ``futex`` calls per
file: 32 threads each taking and dropping the GIL around every blocking
call (the GET's head, its body, the cache file's open, pwrite and close).

How: ``--files`` objects of 20-200 KiB are uploaded to a fresh s3rver on
127.0.0.1 (disk-backed).  Each round runs every variant, in an order
rotated from round to round, after dropping the page cache.  Each variant
fetches every object with a ranged GET of its whole length, and (unless
``w=0``) writes it to a file of its own (create, pwrite, close) after an
xxh3 of its bytes, as the block cache does.  Printed per variant: files/s,
the client's CPU ms per file (this process, or the s5cmd child), the
server's, and the server's read+write system calls per MiB.

Variants (``--variants``, comma-separated; options after colons):

* ``s5cmd``: ``s5cmd cp`` of the prefix into a directory.
* ``threads:t=32``: ``t`` OS threads, each a blocking ``obstore.get`` and
  ``bytes()`` (what ``NativeEngine.get`` does), then the file write;
  ``m=1``: each GET carries If-Match with the object's ETag (as the block
  cache's do).
* any variant, ``h=0.3``: a thread holds the GIL 30% of the time meanwhile,
  in bursts of 0.3 ms of pure Python (as the daemon's event loop does).
* ``asyncio:c=32``: one thread running an asyncio loop; ``c`` GETs in
  flight at once (``obstore.get_range_async``); the file write runs in
  that same thread when the GET completes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import obstore
import xxhash
from ab_s3 import S3AB, Units, add_ab_arguments
from common import (
    BUCKET,
    REGION,
    BenchError,
    run_in_workdir,
    run_threads,
)
from obstore.store import S3Store as ObstoreS3Store

KiB = 1 << 10
MiB = 1 << 20
PREFIX = "small"


def store_to_file(dest: Path, index: int, body: Any) -> None:
    """What the block cache does with a fetched small file: digest, create, pwrite, close."""
    xxhash.xxh3_64_intdigest(body)
    fd = os.open(dest / str(index), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, body, 0)
    finally:
        os.close(fd)


class GilHog:
    """A thread that holds the GIL for ``share`` of the time in 0.3 ms bursts of
    pure Python (as the daemon's event loop does between its waits)."""

    BURST = 0.0003

    def __init__(self, share: float) -> None:
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        if share > 0:
            self._thread = threading.Thread(target=self._run, args=(share,), daemon=True)
            self._thread.start()

    def _run(self, share: float) -> None:
        pause = self.BURST * (1 - share) / share
        while not self._stopping.is_set():
            until = time.perf_counter() + self.BURST
            while time.perf_counter() < until:
                pass
            time.sleep(pause)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()


class SmallGetAB(S3AB):
    KINDS = ("s5cmd", "threads", "asyncio")

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.sizes: list[int] = []
        self.etags: list[str] = []

    def obstore(self) -> ObstoreS3Store:
        return ObstoreS3Store(
            BUCKET,
            config={
                "region": REGION,
                "endpoint": self.endpoint,
                "virtual_hosted_style_request": False,
                "access_key_id": self.env["AWS_ACCESS_KEY_ID"],
                "secret_access_key": self.env["AWS_SECRET_ACCESS_KEY"],
            },  # type: ignore[arg-type]
            client_options={"allow_http": True},  # type: ignore[arg-type]
        )

    def upload(self) -> None:
        rng = random.Random(1)
        source = self.work / "src"
        source.mkdir()
        for i in range(self.args.files):
            size = rng.randint(20 * KiB, 200 * KiB)
            data = rng.randbytes(size)
            self.sizes.append(size)
            self.etags.append(hashlib.md5(data).hexdigest())
            (source / f"{i:06d}").write_bytes(data)
        self.run_quiet(self.s5cmd("mb", f"s3://{BUCKET}"))
        self.run_quiet(self.s5cmd("cp", f"{source}/*", f"s3://{BUCKET}/{PREFIX}/"))
        shutil.rmtree(source)

    def fetch(self, kind: str, options: dict[str, str], dest: Path) -> None:
        hog = GilHog(float(options.get("h", "0")))
        try:
            if kind == "s5cmd":
                self.run_quiet(self.s5cmd("cp", f"s3://{BUCKET}/{PREFIX}/*", f"{dest}/"))
                fetched = len(os.listdir(dest))
            else:
                write = options.get("w", "1") != "0"
                run = self.threads if kind == "threads" else self.asyncio
                fetched = run(dest, options, write)
        finally:
            hog.stop()
        if fetched != self.args.files:
            raise BenchError(f"{kind}: fetched {fetched} of {self.args.files} objects")

    def key(self, index: int) -> str:
        return f"{PREFIX}/{index:06d}"

    def threads(self, dest: Path, options: dict[str, str], write: bool) -> int:
        store = self.obstore()
        if_match = options.get("m") == "1"
        todo = list(range(self.args.files))
        lock = threading.Lock()
        done: list[int] = []
        failed = threading.Event()

        def fetch() -> None:
            while True:
                with lock:
                    if not todo or failed.is_set():
                        return
                    index = todo.pop()
                size = self.sizes[index]
                get_options: dict[str, Any] = {"range": (0, size)}
                if if_match:
                    get_options["if_match"] = f'"{self.etags[index]}"'
                result = obstore.get(store, self.key(index), options=get_options)
                body = result.bytes()
                if len(body) != size:
                    raise BenchError(f"{index}: {len(body)} bytes, not {size}")
                if write:
                    store_to_file(dest, index, body)
                with lock:
                    done.append(index)

        run_threads(fetch, int(options.get("t", "32")), "threads", failed)
        return len(done)

    def asyncio(self, dest: Path, options: dict[str, str], write: bool) -> int:
        store = self.obstore()
        in_flight = int(options.get("c", "32"))

        async def main() -> int:
            gate = asyncio.Semaphore(in_flight)
            done = 0

            async def fetch(index: int) -> None:
                nonlocal done
                async with gate:
                    size = self.sizes[index]
                    body = await obstore.get_range_async(store, self.key(index), start=0, end=size)
                if len(body) != size:
                    raise BenchError(f"{index}: {len(body)} bytes, not {size}")
                if write:
                    store_to_file(dest, index, body)
                done += 1

            async with asyncio.TaskGroup() as group:
                for index in range(self.args.files):
                    await gate.acquire()  # at most ``in_flight`` tasks exist at once
                    gate.release()
                    group.create_task(fetch(index))
            return done

        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(asyncio.run(main())))
        thread.start()
        thread.join()
        if not result:
            raise BenchError("asyncio: the loop failed (see above)")
        return result[0]

    def units(self) -> Units:
        n = self.args.files
        return Units(
            rate="files/s",
            amount=n,
            cpu="ms/file",
            cpu_per=n / 1000,
            mib=sum(self.sizes) / MiB,
            title=f"{n:,} objects of 20-200 KiB",
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=5000, help="objects of 20-200 KiB (5000)")
    add_ab_arguments(p, "s5cmd,threads:t=32,asyncio:c=32")
    args = p.parse_args(argv)
    bench, code = run_in_workdir(args, "tierfs-ab-small-get-", lambda work: SmallGetAB(args, work))
    if bench is not None and any(bench.samples.values()):
        print(bench.report())
    return code


if __name__ == "__main__":
    sys.exit(main())
