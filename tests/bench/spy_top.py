#!/usr/bin/env python3
"""Summarise a py-spy ``--format raw`` profile (collapsed stacks) as text.

    python tests/bench/spy_top.py tests/bench/results/spy/tierfs-cold.txt [-n 25]

Prints, per thread kind (the FUSE/trio loop thread vs worker threads), the
share of samples, then the functions with the largest self and inclusive
share.  bench_read.py --py-spy DIR writes the input files.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path


def frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    m = re.match(r"(.*?) \((.*?):\d+\)$", frame)
    if not m:
        return frame
    return f"{m.group(1)} ({Path(m.group(2)).name})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", type=Path)
    p.add_argument("-n", type=int, default=25, help="rows per table")
    args = p.parse_args(argv)
    self_count: collections.Counter[str] = collections.Counter()
    incl_count: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in args.profile.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = stack.split(";")
        thread = frames[0] if frames and frames[0].startswith(("thread", "process")) else "?"
        names = [frame_name(f) for f in frames[1:]] if thread != "?" else frames
        kind = (
            "trio loop" if any("trio.run" in n or "run (_run.py)" in n for n in names) else "worker"
        )
        threads[f"{kind}: {thread}"] += count
        total += count
        if names:
            self_count[names[-1]] += count
        for n in set(names):
            incl_count[n] += count
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples")
    print("\nby thread:")
    for name, c in threads.most_common(args.n):
        print(f"  {100 * c / total:5.1f}%  {name}")
    print("\nself time:")
    for name, c in self_count.most_common(args.n):
        print(f"  {100 * c / total:5.1f}%  {name}")
    print("\ninclusive time:")
    for name, c in incl_count.most_common(args.n):
        print(f"  {100 * c / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
