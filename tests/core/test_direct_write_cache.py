"""An O_DIRECT writer beside buffered readers: after each
write lands, and before it is answered, TierFS drops the file's kernel pages
when a handle that reads through the page cache is open (see
``tierfs.core.read.handles``).  The kernel side is faked by a recorder here; the
real race is in ``tests/fuse/test_posix_names_flush.py``."""

from __future__ import annotations

import os
from typing import Any

from tierfs.meta import ROOT_INO


async def test_direct_writes_invalidate_pages_only_while_buffered_readers_are_open(
    make_fs: Any,
) -> None:
    mount = await make_fs()
    fs = mount.fs
    invalidated: list[tuple[int, bool]] = []

    async def record(ino: int, data: bool) -> None:
        invalidated.append((ino, data))

    fs.invalidate_kernel_cache = record
    created, attrs = await fs.create(ROOT_INO, b"f", 0o644, os.O_RDWR, 0, 0)
    ino = attrs.ino
    block = b"x" * 4096

    # A direct writer alone: nothing to invalidate (no reader could re-read).
    direct = await fs.open(ino, os.O_RDWR | os.O_DIRECT)
    await fs.release(created.fh)  # a buffered O_RDWR handle: it read through the cache
    await fs.write(direct.fh, 0, block)
    assert invalidated == []

    # The next open after a direct write does not keep the old pages.
    reader = await fs.open(ino, os.O_RDONLY)
    assert reader.keep_cache is False
    await fs.write(direct.fh, 4096, block)
    assert invalidated == [(ino, True)], "pages must go before the write is answered"

    # Buffered writes and O_WRONLY (direct_io) writes are left to the kernel.
    buffered = await fs.open(ino, os.O_RDWR)
    write_only = await fs.open(ino, os.O_WRONLY)
    assert write_only.direct_io
    await fs.write(buffered.fh, 0, block)
    await fs.write(write_only.fh, 0, block)
    assert invalidated == [(ino, True)]

    # Once the readers are gone, direct writes cost no invalidation again.
    for opened in (reader, buffered, write_only):
        await fs.release(opened.fh)
    await fs.write(direct.fh, 0, block)
    assert invalidated == [(ino, True)]
    assert fs.handles.page_cache_readers == {}
    await fs.release(direct.fh)
    assert await mount.read_file("f") == block * 2
