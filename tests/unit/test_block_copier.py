"""``BlockCopier``, the thread side of a relocate's copy: each block lands
at the same offset of the destination, in ``COPY_PIECE`` pieces, and its
digest is the xxh3 of exactly the bytes written (zeros past the end of the
source cache file, as a read of them returns)."""

from __future__ import annotations

import os
from pathlib import Path

from tierfs.core.state.digests import block_digest
from tierfs.core.tiering.movement import COPY_PIECE, BlockCopier

BLOCK = 3 * COPY_PIECE + 1000  # several pieces, the last one short


def _copier(src: Path | None, dst: Path) -> BlockCopier:
    def open_src() -> int | None:
        return None if src is None else os.open(src, os.O_RDONLY)

    def open_dst() -> int:
        return os.open(dst, os.O_RDWR | os.O_CREAT, 0o600)

    return BlockCopier(open_src, open_dst)


def test_blocks_of_several_pieces_are_copied_to_their_offsets(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = os.urandom(3 * BLOCK)
    src.write_bytes(data)
    copier = _copier(src, dst)
    try:
        # Blocks 0 and 2, not 1: a whole-file relocate copies the present ones.
        digests = copier.copy([(0, BLOCK), (2 * BLOCK, BLOCK)])
    finally:
        copier.close()
    assert digests == [block_digest(data[:BLOCK]), block_digest(data[2 * BLOCK :])]
    copied = dst.read_bytes()
    assert copied[:BLOCK] == data[:BLOCK]
    assert copied[BLOCK : 2 * BLOCK] == bytes(BLOCK)  # a hole: never written
    assert copied[2 * BLOCK :] == data[2 * BLOCK :]


def test_bytes_past_the_end_of_the_source_are_zeros(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    short = os.urandom(COPY_PIECE + 123)  # the block's tail is not in the file
    src.write_bytes(short)
    copier = _copier(src, dst)
    try:
        (digest,) = copier.copy([(0, BLOCK)])
    finally:
        copier.close()
    expected = short + bytes(BLOCK - len(short))
    assert digest == block_digest(expected)
    assert dst.read_bytes() == expected


def test_no_source_file_reads_as_zeros_and_opens_once(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    opened: list[str] = []

    def open_src() -> int | None:
        opened.append("src")
        return None

    def open_dst() -> int:
        opened.append("dst")
        return os.open(dst, os.O_RDWR | os.O_CREAT, 0o600)

    copier = BlockCopier(open_src, open_dst)
    try:
        assert copier.copy([(0, 10)]) == [block_digest(bytes(10))]
        assert copier.copy([(10, 5)]) == [block_digest(bytes(5))]
    finally:
        copier.close()
    assert opened == ["src", "dst"]
