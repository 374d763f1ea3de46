"""UploadSource's part buffers: reused only when nothing else holds them,
pooled up to ``max_buffers``, dropped by ``close``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierfs.core.write.upload_source import UploadSource

BLOCK = 4096


@pytest.fixture
def cache_file(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    data = os.urandom(8 * BLOCK)
    path = tmp_path / "cache"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd, data
    finally:
        os.close(fd)


def make_source(
    cache_file: tuple[int, bytes], blocks: int, max_buffers: int = 2
) -> tuple[UploadSource, bytes]:
    fd, data = cache_file
    data = data[: blocks * BLOCK]
    source = UploadSource(
        BLOCK, len(data), {b: (fd, BLOCK) for b in range(blocks)}, max_buffers=max_buffers
    )
    return source, data


def test_a_buffer_is_reused_only_once_nobody_holds_it(cache_file: tuple[int, bytes]) -> None:
    source, data = make_source(cache_file, 8)
    first = source.read(0, 2 * BLOCK)
    held = first  # a store still sending the part
    second = source.read(2 * BLOCK, 2 * BLOCK)
    assert second is not held, "a part on the wire must never be overwritten"
    assert held == data[: 2 * BLOCK] and second == data[2 * BLOCK : 4 * BLOCK]
    first_id = id(first)
    del first, held  # the store is done with the first part
    third = source.read(4 * BLOCK, 2 * BLOCK)
    assert id(third) == first_id, "an idle pooled buffer of the right length is reused"
    assert third == data[4 * BLOCK : 6 * BLOCK] and second == data[2 * BLOCK : 4 * BLOCK]


def test_the_pool_is_capped_and_close_drops_it(cache_file: tuple[int, bytes]) -> None:
    source, data = make_source(cache_file, 8, max_buffers=2)
    parts = [source.read(i * BLOCK, BLOCK) for i in range(5)]  # all held at once
    assert [bytes(p) for p in parts] == [data[i * BLOCK : (i + 1) * BLOCK] for i in range(5)]
    assert source.pooled == 2, "only max_buffers are kept; the others die with their holder"
    source.close()
    assert source.pooled == 0
    assert source.digests.keys() == set(range(5))
