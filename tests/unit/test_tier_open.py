"""Tier.open_file from many threads at once: the fan-out directory is made once."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tierfs.config import TierConfig
from tierfs.tiers import Tier

MiB = 1 << 20


def test_threads_creating_files_of_one_fanout_directory_all_succeed(tmp_path: Path) -> None:
    (tmp_path / "nvme").mkdir()
    tier = Tier(0, TierConfig("nvme", tmp_path / "nvme", 64 * MiB, 0.9, 0.5))
    inos = [4 + 256 * i for i in range(16)]  # all in fan-out directory "04"
    barrier = threading.Barrier(len(inos))
    fds: dict[int, int] = {}
    errors: list[BaseException] = []

    def create(ino: int) -> None:
        barrier.wait()
        try:
            fd = tier.open_file(ino, create=True)
            assert fd is not None
            fds[ino] = fd
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(ino,)) for ino in inos]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for fd in fds.values():
        os.close(fd)
    assert errors == []
    assert sorted(fds) == inos
