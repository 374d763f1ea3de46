"""The write path of TierFS over a real S3 server, without a mount."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from tests.core.conftest import MiB, put
from tierfs.config import WriteConfig
from tierfs.errors import DirectoryNotEmpty, NotFound, TierfsError
from tierfs.meta import ROOT_INO


def get(s3_store: Any, key: str) -> bytes:
    info = s3_store.head(key)
    return s3_store.get_range(key, 0, info.size) if info.size else b""


def keys(s3_store: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    pending = [prefix]
    while pending:
        p = pending.pop()
        for page in s3_store.list_pages(p):
            out.update(o.key for o in page.objects)
            pending.extend(page.prefixes)
            out.update(page.prefixes)
    return out


async def test_written_file_reads_back_and_reaches_the_bucket(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    data = os.urandom(3 * MiB + 1234)
    await mount.write_file("new.bin", data)
    assert await mount.read_file("new.bin") == data
    await mount.flush()
    assert get(s3_store, "new.bin") == data
    info = s3_store.head("new.bin")
    assert int(info.metadata["mode"]) & 0o7777 == 0o644
    where = await mount.fs.where("new.bin")
    assert where["state"] == "clean"
    assert where["cached_bytes"] == len(data)


async def test_large_file_goes_up_in_parallel_parts(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs(capacities=(64 * MiB, 64 * MiB))
    data = os.urandom(20 * MiB + 5)
    await mount.write_file("big.bin", data)
    await mount.flush()
    assert get(s3_store, "big.bin") == data
    assert "-" in s3_store.head("big.bin").etag, "a multipart upload was expected"


async def test_partial_overwrite_of_a_bucket_only_file_fetches_the_block_first(
    make_fs: Any, s3_store: Any
) -> None:
    original = os.urandom(3 * MiB)
    put(s3_store, "rmw.bin", original)
    mount = await make_fs()
    inode = await mount.fs.namespace.resolve("rmw.bin")
    opened = await mount.fs.open(inode.ino, os.O_RDWR)
    await mount.fs.write(opened.fh, MiB + 10, b"PATCH")
    await mount.fs.release(opened.fh)
    expected = original[: MiB + 10] + b"PATCH" + original[MiB + 15 :]
    assert await mount.read_file("rmw.bin") == expected
    await mount.flush()
    assert get(s3_store, "rmw.bin") == expected


async def test_append_and_truncate(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs()
    put(s3_store, "t.bin", b"a" * 3000)
    inode = await mount.fs.namespace.resolve("t.bin")
    opened = await mount.fs.open(inode.ino, os.O_WRONLY)
    await mount.fs.write(opened.fh, 3000, b"b" * 100)
    await mount.fs.release(opened.fh)
    await mount.fs.setattr(inode.ino, size=1000)
    await mount.fs.setattr(inode.ino, size=5000)
    expected = b"a" * 1000 + bytes(4000)
    assert await mount.read_file("t.bin") == expected
    await mount.flush()
    assert get(s3_store, "t.bin") == expected


async def test_unlink_and_rmdir(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "d/x.txt", b"x")
    mount = await make_fs()
    d = await mount.fs.namespace.resolve("d")
    with pytest.raises(DirectoryNotEmpty):
        await mount.fs.rmdir(ROOT_INO, b"d")
    await mount.fs.unlink(d.ino, b"x.txt")
    await mount.fs.rmdir(ROOT_INO, b"d")
    with pytest.raises(NotFound):
        await mount.fs.namespace.resolve("d")
    await mount.flush()
    assert keys(s3_store) == set()


async def test_rename_file_and_directory_moves_keys(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "src/a.txt", b"A")
    put(s3_store, "src/sub/b.txt", b"B")
    mount = await make_fs()
    await mount.write_file("src/new.txt", b"NEW")
    src = await mount.fs.namespace.resolve("src")
    await mount.fs.mkdir(ROOT_INO, b"dst", 0o755, 0, 0)
    dst = await mount.fs.namespace.resolve("dst")
    await mount.fs.rename(ROOT_INO, b"src", dst.ino, b"moved", 0)
    moved = await mount.fs.namespace.resolve("dst/moved")
    await mount.fs.rename(moved.ino, b"a.txt", moved.ino, b"renamed.txt", 0)
    assert await mount.read_file("dst/moved/sub/b.txt") == b"B"
    await mount.flush()
    assert keys(s3_store) == {
        "dst/",
        "dst/moved/",
        "dst/moved/renamed.txt",
        "dst/moved/new.txt",
        "dst/moved/sub/",
        "dst/moved/sub/b.txt",
    }
    assert get(s3_store, "dst/moved/renamed.txt") == b"A"
    assert get(s3_store, "dst/moved/new.txt") == b"NEW"
    assert src.ino == moved.ino


async def test_rename_errors(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "f", b"f")
    put(s3_store, "d/inner", b"i")
    put(s3_store, "e/x", b"x")
    mount = await make_fs()
    d = await mount.fs.namespace.resolve("d")
    cases = [
        ((ROOT_INO, b"f", ROOT_INO, b"d", 0), errno.EISDIR),
        ((ROOT_INO, b"d", ROOT_INO, b"f", 0), errno.ENOTDIR),
        ((ROOT_INO, b"d", ROOT_INO, b"e", 0), errno.ENOTEMPTY),
        ((ROOT_INO, b"d", d.ino, b"loop", 0), errno.EINVAL),
        ((ROOT_INO, b"missing", ROOT_INO, b"x", 0), errno.ENOENT),
        ((ROOT_INO, b"f", ROOT_INO, b"d", 1), errno.EEXIST),
    ]
    for args, expected in cases:
        with pytest.raises(TierfsError) as info:
            await mount.fs.rename(*args)
        assert info.value.errno == expected, args


async def test_dirty_data_survives_a_remount_and_is_uploaded(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs(write=WriteConfig(mode="back", upload_delay=3600))
    data = os.urandom(2 * MiB)
    await mount.write_file("later.bin", data)
    assert (await mount.fs.where("later.bin"))["state"] == "dirty"
    mount = await mount.remount()
    assert await mount.read_file("later.bin") == data
    await mount.flush()
    assert get(s3_store, "later.bin") == data


async def test_write_through_waits_for_the_bucket_on_fsync(make_fs: Any, s3_store: Any) -> None:
    mount = await make_fs(write=WriteConfig(mode="through", upload_delay=3600))
    await mount.write_file("wt.bin", b"through", fsync=True)
    assert get(s3_store, "wt.bin") == b"through"


async def test_hard_links_are_refused_with_eperm(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "f", b"f")
    mount = await make_fs()
    f = await mount.fs.namespace.resolve("f")
    with pytest.raises(TierfsError) as info:
        await mount.fs.link(f.ino, ROOT_INO, b"g")
    assert info.value.errno == errno.EPERM
