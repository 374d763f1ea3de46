"""Cost of dirty-block digests on a large sequential write (run on demand).

Mounts tierfs on a ``file://`` backing with a long ``upload_delay`` (no
upload runs), writes a file of ``--size`` through a write-only handle in
1 MiB writes (as a checkpoint writer does), then fsyncs and closes it; per
round it prints the wall time of write+fsync+close, the daemon's CPU
seconds (utime+stime from /proc) and the MB/s.  Rounds alternate between
the code under test and, with ``--base DIR``, another checkout of tierfs
(its tree is put first on the daemon's PYTHONPATH), so both run side by
side on the same machine state.

    .venv/bin/python tests/bench/bench_dirty_digest.py --size 2GiB --rounds 3 \\
        [--base /path/to/other/checkout]

Needs /dev/fuse and fusermount3.  Everything lives under a temporary
directory that is removed at the end; only the daemons started here are
stopped, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024


def tierfs(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "tierfs"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def daemon_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(work: Path, label: str, size: int, pythonpath: str | None) -> dict[str, float]:
    base = work / label
    mnt, bucket, state = base / "mnt", base / "bucket", base / "state"
    tiers = base / "nvme"
    for d in (mnt, bucket, tiers):
        d.mkdir(parents=True)
    config = base / "tierfs.toml"
    config.write_text(
        f'[backing]\nurl = "file://{bucket}"\n\n[state]\ndir = "{state}"\n\n'
        f'[[tiers]]\nname = "nvme"\npath = "{tiers}"\ncapacity = "{2 * size + 64 * MiB}"\n\n'
        '[write]\nupload_delay = "1h"\n'
    )
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = f"{pythonpath}:{pythonpath}/daemon"
    done = tierfs("mount", str(config), str(mnt), env=env)
    assert done.returncode == 0, done.stderr
    try:
        status = json.loads(tierfs("status", str(mnt), "--json", env=env).stdout)
        pid = int(status["pid"])
        chunk = os.urandom(MiB)
        cpu0, t0 = daemon_cpu(pid), time.perf_counter()
        fd = os.open(mnt / "ckpt.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for _ in range(size // MiB):
                os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        wall, cpu = time.perf_counter() - t0, daemon_cpu(pid) - cpu0
    finally:
        tierfs("umount", str(mnt), env=env)
    return {"wall": wall, "cpu": cpu, "mbps": size / wall / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB", help="file size, e.g. 2GiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default=None, help="another tierfs checkout to compare")
    args = parser.parse_args()
    units = {"MiB": MiB, "GiB": 1024 * MiB}
    size = int(args.size[:-3]) * units[args.size[-3:]]
    cases = [("this", None)] + ([("base", args.base)] if args.base else [])
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in cases}
    with tempfile.TemporaryDirectory(prefix="tierfs-digest-bench-") as tmp:
        for n in range(args.rounds):
            for label, path in cases:
                r = one_round(Path(tmp) / f"r{n}", label, size, path)
                results[label].append(r)
                print(
                    f"round {n} {label:<5} {r['mbps']:7.0f} MB/s  wall {r['wall']:6.2f} s  "
                    f"daemon cpu {r['cpu']:6.2f} s",
                    flush=True,
                )
    for label, rows in results.items():
        print(
            f"median {label:<5} {statistics.median(r['mbps'] for r in rows):7.0f} MB/s  "
            f"wall {statistics.median(r['wall'] for r in rows):6.2f} s  "
            f"daemon cpu {statistics.median(r['cpu'] for r in rows):6.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
