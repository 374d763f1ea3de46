"""``PathSpool.take``: the fetch pass of a preload follows the file spool
while the scan still writes it."""

from __future__ import annotations

from pathlib import Path

from tierfs.workers.pathlists import TAKE_BYTES, PathSpool


def test_take_returns_what_was_added_since_the_last_take(tmp_path: Path) -> None:
    spool = PathSpool(tmp_path)
    try:
        assert spool.take() == []
        spool.add("1 0 1 a")
        spool.add("2 0 1 dir/b")
        assert spool.take() == ["1 0 1 a", "2 0 1 dir/b"]
        assert spool.take() == []
        spool.add("3 0 1 \udcff-not-utf8")
        assert spool.take() == ["3 0 1 \udcff-not-utf8"]
        assert spool.count == 3
        # ``take`` does not move the writer: what follows is appended.
        spool.add("4 0 1 d")
        assert spool.take() == ["4 0 1 d"]
        assert list(spool.lines()) == ["1 0 1 a", "2 0 1 dir/b", "3 0 1 \udcff-not-utf8", "4 0 1 d"]
    finally:
        spool.close()


def test_take_reads_on_across_chunks_and_long_lines(tmp_path: Path) -> None:
    spool = PathSpool(tmp_path)
    try:
        long = "x" * (2 * TAKE_BYTES + 100)
        many = [f"{i} 0 1 file-{i:06d}" for i in range(TAKE_BYTES // 10)]
        spool.add(long)
        for line in many:
            spool.add(line)
        spool.add("last")
        # An empty take means nothing complete is left, even after a line
        # longer than what one read brings.
        taken: list[str] = []
        while batch := spool.take():
            taken += batch
        assert taken == [long, *many, "last"]
    finally:
        spool.close()
