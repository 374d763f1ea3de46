"""The small-file write loop, counted, not timed: a new file's
lookup (a miss), create, getattr, write, flush and release, through the FUSE
operations as the daemon runs them, open two LMDB write transactions (the
create, the close's commit), hop to no thread, send nothing to the bucket,
and decode the parent directory's record once per request that needs it.
What they must keep: the file is in LMDB with its size and block map at
close, its upload is queued once, and it reaches the bucket intact."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from tierfsd.fuse_ops import TierfsOperations

from tests.core.conftest import count_calls
from tierfs.config import WriteConfig
from tierfs.meta import db as db_module

KiB = 1024
FILES = 24
CTX = SimpleNamespace(uid=0, gid=0, pid=1)
#: Per new file: the lookup decodes the directory (the negative entry's
#: timeout reads one field of its record), the create decodes it once more.
DIRECTORY_DECODES_PER_FILE = 2
#: Once per directory: its key is worked out from its ancestors (``out``,
#: then remembered: ``Namespace.key_of``).
ANCESTOR_DECODES = 2


async def test_new_small_file_costs_two_write_transactions_and_no_thread(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Uploads wait for the flush at the end: nothing overlaps the loop.
    mount = await make_fs(write=WriteConfig(mode="back", upload_delay=60.0, part_size=8 << 20))
    fs, meta = mount.fs, mount.fs.meta
    ops = TierfsOperations(fs)
    top = await ops.mkdir(1, b"out", 0o755, CTX)
    directory = await ops.mkdir(top.st_ino, b"step-1", 0o755, CTX)
    payloads = {f"f{i:02d}".encode(): os.urandom(4 * KiB + 997 * i) for i in range(FILES)}

    counts: dict[str, int] = {}
    count_calls(monkeypatch, counts, "write", meta, "write")
    count_calls(monkeypatch, counts, "decode", db_module, "decode_inode")
    count_calls(monkeypatch, counts, "thread", trio.to_thread, "run_sync")
    store_calls = dict(getattr(mount.store.inner, "calls", {}))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # open(path, "wb")
    for name, data in payloads.items():
        missing = await ops.lookup(directory.st_ino, name, CTX)
        assert missing.st_ino == 0
        info, entry = await ops.create(directory.st_ino, name, 0o644, flags, CTX)
        assert entry.entry_timeout > 0 and entry.attr_timeout > 0
        assert (await ops.getattr(entry.st_ino, CTX)).st_size == 0
        assert await ops.write(info.fh, 0, data) == len(data)
        await ops.flush(info.fh)
        await ops.release(info.fh)
    monkeypatch.undo()

    assert counts["write"] == 2 * FILES, counts
    assert counts["thread"] == 0, counts
    assert counts["decode"] <= DIRECTORY_DECODES_PER_FILE * FILES + ANCESTOR_DECODES, counts
    assert dict(getattr(mount.store.inner, "calls", {})) == store_calls

    # What the close promises: size and block map in LMDB, one upload each.
    for name, data in payloads.items():
        ino = meta.lookup(directory.st_ino, name)
        assert ino is not None
        inode = meta.get_inode(ino)
        assert inode is not None and inode.size == len(data)
        assert sum(rec.nbytes for rec in meta.get_blocks(ino).values()) == len(data)
        assert fs.journal.pending_upload(ino)
    assert len(fs.journal.upload_seq) == FILES
    await mount.flush("out")
    for name, data in payloads.items():
        assert mount.store.get_range(f"out/step-1/{name.decode()}", 0, len(data)) == data
