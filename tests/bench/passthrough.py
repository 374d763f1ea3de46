#!/usr/bin/env python3
"""A trivial pyfuse3 passthrough of a local directory.

    passthrough.py SOURCE MOUNTPOINT [--timeout SECONDS]

The ceiling of ``bench_meta.py``: every open, read, release, lookup,
getattr and readdir crosses into a Python daemon on trio, as in tierfs, but
does nothing more than the system call it stands for.  Entries and
attributes get the kernel timeouts ``--timeout`` (1 s, libfuse's default;
``bench_meta`` passes tierfs's ``list_ttl``); ``open`` replies with
``keep_cache`` as tierfs does for unchanged files, and FLUSH is answered (a
no-op) as tierfs answers it: a filesystem without ``flush`` gets ENOSYS
once and is never sent FLUSH again, one request per ``close`` fewer than
any filesystem that accepts writes can have.
The write side is there for the small-file write loop of ``bench_write.py``
(create, write, flush, release; mkdir): ``create`` replies as tierfs does
(a write-only handle gets ``direct_io``, entries the ``--timeout``), so the
loop through it is the FUSE floor of the same loop through tierfs.
Inode numbers are the source's (its root is inode 1).  It runs in the
foreground until the mount is unmounted.
"""

from __future__ import annotations

import argparse
import os
import sys

import pyfuse3
import trio


class Passthrough(pyfuse3.Operations):
    def __init__(self, source: str, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout
        self.root_ino = os.lstat(source).st_ino
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: source}

    def _entry(self, path: str, st: os.stat_result) -> pyfuse3.EntryAttributes:
        ino = pyfuse3.ROOT_INODE if st.st_ino == self.root_ino else st.st_ino
        self.paths[ino] = path
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = ino
        entry.generation = 0
        entry.entry_timeout = entry.attr_timeout = self.timeout
        entry.st_mode, entry.st_nlink = st.st_mode, st.st_nlink
        entry.st_uid, entry.st_gid, entry.st_rdev = st.st_uid, st.st_gid, st.st_rdev
        entry.st_size, entry.st_blksize, entry.st_blocks = st.st_size, st.st_blksize, st.st_blocks
        entry.st_atime_ns, entry.st_mtime_ns = st.st_atime_ns, st.st_mtime_ns
        entry.st_ctime_ns = st.st_ctime_ns
        return entry

    def _path(self, ino: int) -> str:
        try:
            return self.paths[ino]
        except KeyError:
            raise pyfuse3.FUSEError(2) from None

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = os.path.join(self._path(parent_inode), os.fsdecode(name))
        try:
            return self._entry(path, os.lstat(path))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        return self._entry(path, os.lstat(path))

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        base = self._path(fh)
        with os.scandir(base) as it:
            names = sorted(entry.name for entry in it)
        for index in range(start_id, len(names)):
            path = os.path.join(base, names[index])
            entry = self._entry(path, os.lstat(path))
            if not pyfuse3.readdir_reply(token, os.fsencode(names[index]), entry, index + 1):
                return

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        access = flags & (os.O_ACCMODE | os.O_TRUNC | os.O_APPEND)
        try:
            fd = os.open(self._path(inode), access)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        return pyfuse3.FileInfo(fh=fd, keep_cache=True, direct_io=_write_only(flags))

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = os.path.join(self._path(parent_inode), os.fsdecode(name))
        access = flags & (os.O_ACCMODE | os.O_TRUNC | os.O_APPEND | os.O_EXCL)
        try:
            fd = os.open(path, access | os.O_CREAT, mode & 0o7777)
            entry = self._entry(path, os.fstat(fd))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        return pyfuse3.FileInfo(fh=fd, keep_cache=True, direct_io=_write_only(flags)), entry

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return os.pwrite(fh, buf, off)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = os.path.join(self._path(parent_inode), os.fsdecode(name))
        try:
            os.mkdir(path, mode & 0o7777)
            return self._entry(path, os.lstat(path))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    async def flush(self, fh: int) -> None:
        return None

    async def release(self, fh: int) -> None:
        os.close(fh)


def _write_only(flags: int) -> bool:
    """tierfs replies ``direct_io`` to write-only opens (``tierfs.core.read.handles``)."""
    return flags & os.O_ACCMODE == os.O_WRONLY


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source")
    p.add_argument("mountpoint")
    p.add_argument("--timeout", type=float, default=1.0, help="kernel entry/attr timeout (1)")
    args = p.parse_args(argv)
    ops = Passthrough(os.path.abspath(args.source), args.timeout)
    # Not "ro": on a read-only mount the kernel skips the atime invalidation
    # that follows every read (a stat after it costs a GETATTR on tierfs,
    # which is writable), and the ceiling would skip work tierfs cannot.
    options = set(pyfuse3.default_options) | {"fsname=passthrough"}
    pyfuse3.init(ops, args.mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
