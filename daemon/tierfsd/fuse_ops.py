"""pyfuse3.Operations over TierFS: thin by design.

Each method converts pyfuse3 arguments, awaits ``TierFS`` and converts the
result.  The ``_errno`` decorator (``_audited`` for the requests the audit log
records: the same wrapper) is the one place that turns errors into errnos,
in ``_answer`` (it also counts requests, for ``TierFS.requests``, and
records each request's latency and failure in the daemon's metrics,
``op_metrics``): a
TierfsError or OSError keeps its errno, anything else is a bug, logged with
its traceback and answered with EIO.  Nothing escapes to
``pyfuse3.main()``, which would end the mount.

Where the time of small files goes (``tests/bench/bench_meta.py
--trace --py-spy``, 1,000 files of 1-16 KiB, a 2-core machine shared with
other work, so CPU per item rather than rates):

* Warm open+read+close: the kernel serves the bytes from its page cache
  (``keep_cache``); what reaches us is OPEN, FLUSH and RELEASE, 3 requests
  per file, as for the passthrough that answers FLUSH.  pyfuse3's own cost
  per request (receive, dispatch, reply: about 70 us of CPU here, the
  passthrough's whole cost) comes first; then, per open, one inode decode
  (LMDB) and the block map read for the CachedFile, the Handle and its
  readahead state; per release, closing the cache file's fd.  No LMDB
  write, no thread, no HEAD within ``revalidate_ttl``.
  With the directory readahead (``tierfs.workers.dirahead``) following the
  opens, a shuffled warm read (4,000 files in 10 directories, one reader)
  measured 0.44-0.54x the passthrough: each open read ~16 readdir entries
  (``read_dir``) to find that its guess was wrong, and fills of resident
  files ran behind it, ~40% of the daemon's busy time (448-480 us of CPU
  per file against 215-240 us for the passthrough).  Now a wrong guess
  costs one LMDB read (the cookie; past ``high + slack``, at most
  ``slack`` keys more), resident files are not queued, the handle's
  readahead state waits for a first read and a reader's open carries no
  caller: 360 us against 238 us, 0.63x, in the one run not disturbed by
  other work on the shared machine.  Of our share (py-spy, ~18% of the
  samples; pyfuse3's receive/dispatch/reply and trio's scheduling are the
  rest, as for the passthrough), an open is: the inode's decode
  (``MetaDB.get_inode``, ~5 us) and the block map with a new
  ``CachedFile`` of ten containers (``OpenFiles.acquire``, ~6 us), the
  directory readahead (~2-4 us), the eviction trackers' access
  (``SpaceManager.opened``); a release closes the ``CachedFile``.  What is
  left to reach 0.9x lies there: a ``CachedFile`` (and its block map) that
  a read-only open does not need until its first read, an inode decode
  without the ``SyncState`` enum call, one read transaction for both.
  Then (micro-benchmark: 400 resident files in 4 directories, shuffled,
  ``open``/``flush``/``release`` of this class with the directory
  readahead following, no mount, best of 15 passes; loaded machine) 41-44
  us per file became 35-36 us: the inode and the block map come in one
  read transaction (``MetaDB.get_inode_and_blocks``, 38.7 -> 34.6 us with
  the decode below), the decode takes ``SyncState`` from a table and builds
  the ``Inode`` positionally, and the directory readahead keeps the
  readdir cookie of a file once read (a warm epoch reads none).  The
  bench after these (one run not flagged as disturbed): passthrough
  4,639/s, tierfs 3,253/s (0.70x), daemon CPU 305 us per file against
  215 us.  This
  wrapper costs ~1.1 us per request (the extra coroutine ~0.5 us, two
  clock reads and ``observe`` ~0.5 us); a version with the error
  conversion out of line measured the same, so it stays.  Left per open:
  the ``CachedFile`` built and closed per open/release (its ten containers,
  ``_close``'s scan of the recent blocks), ``SpaceManager.opened``, and
  for a shuffled reader ``nth_cookie_after`` on ~40% of the opens.  By
  the figures above, our code is ~18% of 360 us per file; without any of
  it ~295 us would be left, more than the 264 us that 0.9x of the
  passthrough's 238 us allows: the rest of the gap is in pyfuse3's and
  trio's work per request and per task, not in these methods.
  Measured again (a mount of 4,000 files in 10 directories,
  shuffled passes, per pass: the daemon's CPU from /proc, its main
  thread's context switches and run-queue wait, the handler time per
  request from ``fuse_requests``), that last sentence was wrong; what
  was found:

  - The swing of the bench (0.30-0.87x) is other work on the machine,
    not the daemon.  Other helpers' benches write ``drop_caches`` (83
    times in the first 20 minutes of one session): a warm pass that sees
    one turns into LOOKUP, GETATTR and READ for most files, and our READ
    (~190 us in the handler: block map, cache file open, ``pread``)
    costs far more than the passthrough's ``pread``.  Passes without a
    drop but with a loaded run queue (runqueue wait 100-700 us per
    file) swing by 2x for both mounts.
  - Same requests, same answers: 3 per file (OPEN, FLUSH, RELEASE), both
    ``keep_cache``, no ``direct_io``, the same mount options
    (``default_permissions``, rw, relatime) and ``pyfuse3.init``; the
    same syscalls per request (strace: 2 ``epoll_wait``, 1 ``epoll_ctl``,
    1 ``read`` of /dev/fuse, 1 ``writev``) and two trio task steps per
    request for both (pyfuse3's two session tasks hand the read lock to
    each other).  The warm open, flush and release never yield to the
    scheduler and start no thread (a trio instrument in the daemon: no
    ``to_thread``, no other task stepping during a clean pass).
  - No thread competes for the GIL during a clean pass: the obstore
    runtime's two threads and trio's cached threads use no CPU then
    (/proc per-thread ticks).  Threads ran only in the first pass after
    a mount (each resident block is hashed once, ``read_and_hash``) and
    after a drop (fetches and reads).
  - The periodic tasks woke an idle daemon 17 times a second (the
    mover's foreground meter 10, the group committer 5, the uploader 1,
    the prefetcher's hold expiry 1): harmless during a pass (~0.1% of a
    core) but pointless; now 1 (the uploader;
    ``tests/core/test_idle_wakeups.py``).
  - The gap is user time and it is these methods.  In the quietest
    passes of one session: passthrough 67-72 us of CPU per file, 9,200-
    9,700 files/s; tierfs 98-108 us, 6,400-7,700 files/s (0.7-0.8x);
    system time equal (13-18 us), user time 53 against 83-90 us.  The
    handler time per file in those passes was 24 us (open 20.3, release
    3.3, flush 0.8) plus the wrapper, i.e. the whole gap; the same
    methods cost 13.5 us per file in a loop in one process (hot caches),
    of which (py-spy) the inode and block map read 31%, the directory
    readahead 10-16% (a shuffled reader continues a stream by chance
    and ``_schedule`` reads entries that are all resident), the rest
    ``Handles.open``, release, the metrics.  0.9x of the passthrough
    leaves ~8 us of CPU per file for all of it: that needs an open that
    reads nothing from LMDB for a file opened before (a cache of decoded
    inodes and block maps kept coherent with every MetaDB write), not
    trimming.  The voluntary context switches of the daemon's main thread
    (1-2 per file against ~0.1 for the passthrough on a loaded machine,
    0.1-0.6 when quiet) follow the load, not tierfs.
* Warm stat: no request at all within the entry/attr timeout (``list_ttl``).
* Warm lookup (after a timeout, or ``find``): was four inode decodes (the
  directory twice, the child twice), now one each (``lookup_entry``).
* Warm readdir: requests carry as many entries as the kernel's buffer
  takes (was one batch of 32 per request: 52 READDIRPLUS for 1,011
  entries, now one per buffer; ``NameReads.readdir_into``).  Per entry, in
  the daemon apart from pyfuse3's reply (a directory of 400 files read
  whole again and again, best of 20, cProfile for the shares), it was
  12.2 us: the child's inode record (a read transaction of its own, the
  decode of ~20 fields, the ``Inode``) 70%, its ``Attributes`` (access
  time, ``attributes_of``) 13%, the dentry reads 10%, the
  ``EntryAttributes`` 4%.  Now 4.0 us: dentries and inode records come in
  one transaction (``MetaDB.read_dir_records``); an inode whose record
  has the same bytes as last time gets the same ``Attributes``
  (``tierfs.core.names.attrcache``, which says where invalidation happens) and
  the same ``EntryAttributes`` (built once, ``entry_attributes``).  What
  is left is the two LMDB gets of each entry and its ``DirEntry``.
* Cold reads by 8 threads: all 8 GETs are in flight at once (nothing on
  the way to the GET is serial: ``tests/core/test_parallel_cold_reads.py``);
  the gap to a boto3 GET loop is CPU: the daemon spends about twice a bare
  GET's CPU per file (active samples: boto3 in the fetch threads 38%, then
  on the loop pyfuse3 request handling 16%, fetch bookkeeping 12%
  (``SpaceManager.reserve`` reads tier usage from LMDB per block,
  ``MetaDB.add_block``), trio scheduling 10%, the five FUSE requests of a
  file 13%, the group commit 4%), on two cores shared with the S3 server.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from tierfs.core import Attributes, DirEntry, TierFS
from tierfs.core.names.posix_attrs import Caller
from tierfs.errors import EndpointUnreachable, NotFound, TierfsError
from tierfs.metrics import LatencyTable, Metrics
from tierfs.workers.audit import AuditLog, open_fields, opens_for_writing

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


#: What an audit record says of a request: (op, path, new path, extra fields),
#: from the request's arguments; None: no record for this one.  The path may
#: be a function, called once the request is answered (an ``open``: its
#: inode is then in memory, so no LMDB read); the extra fields a dict or a
#: string of JSON members (``open_fields``).
AuditTarget = tuple[str, str | Callable[[], str], str | None, dict[str, Any] | str | None] | None


def _errno(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The request wrapper of a method (see the module docstring)."""
    return _request(fn, None)


def _audited(
    target: Callable[..., AuditTarget],
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """``_errno``, and the request recorded in the audit log
    (``tierfs.workers.audit``) with its outcome when the mount has one:
    ``target(ops, *args)`` names it before it runs (an unlinked name has no
    path afterwards).  One wrapper, not two: a mount without the log pays
    one attribute read per request, not a second coroutine."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        return _request(fn, target)

    return decorate


def _request(
    fn: Callable[P, Awaitable[R]], target: Callable[..., AuditTarget] | None
) -> Callable[P, Awaitable[R]]:
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        ops: TierfsOperations = args[0]  # type: ignore[assignment]
        ops.fs.requests += 1
        recorder = ops.op_metrics[name]
        audit = ops.audit if target is not None else None
        what = target(*args) if audit is not None and target is not None else None
        started = time.perf_counter()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            err = _answer(name, exc)
            recorder.failed(err)
            if what is not None:
                _record(audit, what, args[-1], err)
            if isinstance(exc, pyfuse3.FUSEError):
                raise
            raise pyfuse3.FUSEError(err) from None
        finally:
            recorder.observe(time.perf_counter() - started)
        if what is not None:
            _record(audit, what, args[-1], 0)
        return result

    return wrapper


def _answer(name: str, exc: Exception) -> int:
    """The errno request ``name`` that raised ``exc`` is answered with; a
    failure worth it is logged (the one place errors become errnos)."""
    if isinstance(exc, pyfuse3.FUSEError):
        return int(exc.errno)
    if isinstance(exc, TierfsError):
        if isinstance(exc, EndpointUnreachable):  # the breaker logs the outage once
            log.debug("%s: %s", name, exc)
        elif exc.errno == errno.EIO:
            log.warning("%s: %s", name, exc)
        return exc.errno
    if isinstance(exc, OSError):
        log.warning("%s: %s", name, exc)
        return exc.errno or errno.EIO
    log.exception("unexpected error in %s", name)
    return errno.EIO


def _record(audit: AuditLog | None, what: AuditTarget, ctx: Any, err: int) -> None:
    assert audit is not None and what is not None
    op, path, new_path, extra = what
    if callable(path):
        path = path()
    audit.record(op, ctx.uid, ctx.gid, ctx.pid, path, err, new_path=new_path, extra=extra)


def _at_name(op: str) -> Callable[..., AuditTarget]:
    """A request on ``(parent, name, ...)``: create, mkdir, unlink..."""

    def target(ops: TierfsOperations, parent: int, name: bytes, *rest: Any) -> AuditTarget:
        return op, ops.fs.child_path(parent, name), None, None

    return target


def _created(op: str) -> Callable[..., AuditTarget]:
    """mknod, mkdir and create: the path and the mode asked for."""

    def target(
        ops: TierfsOperations, parent: int, name: bytes, mode: int, *rest: Any
    ) -> AuditTarget:
        extra = f'"mode": "{stat.S_IMODE(mode):04o}"'
        if op == "create":
            extra += ", " + open_fields(rest[0])
        return op, ops.fs.child_path(parent, name), None, extra

    return target


def _symlink_target(
    ops: TierfsOperations, parent: int, name: bytes, target: bytes, ctx: Any
) -> AuditTarget:
    extra = {"target": target.decode(errors="surrogateescape")}
    return "symlink", ops.fs.child_path(parent, name), None, extra


def _rename_target(
    ops: TierfsOperations,
    parent_old: int,
    name_old: bytes,
    parent_new: int,
    name_new: bytes,
    flags: int,
    ctx: Any,
) -> AuditTarget:
    extra = {"flags": flags} if flags else None
    return (
        "rename",
        ops.fs.child_path(parent_old, name_old),
        ops.fs.child_path(parent_new, name_new),
        extra,
    )


def _link_target(
    ops: TierfsOperations, inode: int, new_parent: int, new_name: bytes, ctx: Any
) -> AuditTarget:
    return "link", ops.fs.path_of(inode), ops.fs.child_path(new_parent, new_name), None


def _open_target(ops: TierfsOperations, inode: int, flags: int, ctx: Any) -> AuditTarget:
    audit = ops.audit
    if audit is None or not (audit.reads or opens_for_writing(flags)):
        return None
    return "open", functools.partial(ops.fs.path_of, inode), None, open_fields(flags)


def _setattr_target(
    ops: TierfsOperations,
    inode: int,
    attr: pyfuse3.EntryAttributes,
    fields: pyfuse3.SetattrFields,
    fh: Any,
    ctx: Any,
) -> AuditTarget:
    changes: dict[str, Any] = {}
    if fields.update_mode:
        changes["mode"] = f"{stat.S_IMODE(attr.st_mode):04o}"
    if fields.update_uid:
        changes["uid"] = attr.st_uid
    if fields.update_gid:
        changes["gid"] = attr.st_gid
    if fields.update_size:
        changes["size"] = attr.st_size
    if fields.update_atime:
        changes["atime_ns"] = attr.st_atime_ns
    if fields.update_mtime:
        changes["mtime_ns"] = attr.st_mtime_ns
    return "setattr", ops.fs.path_of(inode), None, {"set": changes}


def _xattr_target(op: str) -> Callable[..., AuditTarget]:
    def target(ops: TierfsOperations, inode: int, name: bytes, *rest: Any) -> AuditTarget:
        return op, ops.fs.path_of(inode), None, {"name": name.decode(errors="surrogateescape")}

    return target


def entry_attributes(attrs: Attributes) -> pyfuse3.EntryAttributes:
    """The reply for ``attrs``, built once per ``Attributes`` (kept in
    ``attrs.converted``: readdir serves cached attributes again and again;
    pyfuse3 copies the fields into each reply, so one object serves all)."""
    converted = attrs.converted
    if converted is not None:
        return converted  # type: ignore[return-value]
    entry = attrs.converted = pyfuse3.EntryAttributes()
    entry.st_ino = attrs.ino
    entry.generation = 0
    entry.entry_timeout = attrs.timeout
    entry.attr_timeout = attrs.timeout
    entry.st_mode = attrs.mode
    entry.st_nlink = attrs.nlink
    entry.st_uid = attrs.uid
    entry.st_gid = attrs.gid
    entry.st_rdev = 0
    entry.st_size = attrs.size
    entry.st_blksize = attrs.blksize
    entry.st_blocks = (attrs.size + 511) // 512
    entry.st_atime_ns = attrs.atime_ns
    entry.st_mtime_ns = attrs.mtime_ns
    entry.st_ctime_ns = attrs.ctime_ns
    return entry


def negative_entry(timeout: float) -> pyfuse3.EntryAttributes:
    """ "No such name" that the kernel may remember for ``timeout`` seconds."""
    entry = pyfuse3.EntryAttributes()
    entry.st_ino = 0
    entry.entry_timeout = timeout
    entry.attr_timeout = 0
    return entry


def caller_of(ctx: Any) -> Caller:
    return Caller(uid=ctx.uid, gid=ctx.gid, pid=ctx.pid)


class TierfsOperations(pyfuse3.Operations):
    # No kernel writeback cache: with it, FUSE never takes a regular file's
    # size from us again (it trusts its own i_size), so an object that grew
    # or shrank in the bucket would be read with its old size.  Large writes
    # still arrive as 1 MiB requests (libfuse negotiates max_pages).
    enable_writeback_cache = False

    def __init__(
        self, fs: TierFS, metrics: Metrics | None = None, audit: AuditLog | None = None
    ) -> None:
        super().__init__()
        self.fs = fs
        #: The audit log (``[audit]``), or None.
        self.audit = audit
        #: Per-operation latency and error recorders (the daemon's metrics;
        #: a private registry when none is given).
        self.op_metrics: LatencyTable = (metrics or Metrics()).fuse_ops

    # --- namespace -------------------------------------------------------------------

    @_errno
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: Any = None
    ) -> pyfuse3.EntryAttributes:
        try:
            return entry_attributes(await self.fs.lookup(parent_inode, name))
        except NotFound:
            # A negative entry (inode 0) that the kernel keeps while the
            # directory's listing is fresh (``TierFS.negative_timeout``):
            # module imports and $PATH searches ask for absent names often.
            timeout = self.fs.negative_timeout(parent_inode)
            if timeout <= 0:
                raise
            return negative_entry(timeout)

    @_errno
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.fs.getattr(inode))

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        # Inodes live in LMDB with stable numbers; only removed ones that the
        # kernel still held are remembered until it forgets them.
        self.fs.forget([ino for ino, _nlookup in inode_list])

    @_errno
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return await self.fs.readlink(inode)

    @_errno
    async def opendir(self, inode: int, ctx: Any) -> int:
        return await self.fs.opendir(inode)

    @_errno
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        def reply(entry: DirEntry) -> bool:
            return pyfuse3.readdir_reply(
                token, entry.name, entry_attributes(entry.attrs), entry.cookie
            )

        await self.fs.readdir_into(fh, start_id, reply)

    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    @_errno
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        stats = self.fs.statfs()
        data = pyfuse3.StatvfsData()
        frsize = 4096
        data.f_bsize = stats.block_size
        data.f_frsize = frsize
        data.f_blocks = stats.total_bytes // frsize
        data.f_bfree = stats.free_bytes // frsize
        data.f_bavail = stats.free_bytes // frsize
        data.f_files = stats.files
        data.f_ffree = 1 << 32
        data.f_favail = 1 << 32
        data.f_namemax = stats.name_max
        return data

    # --- files ---------------------------------------------------------------------------

    @_audited(_open_target)
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        # Who opens matters to writes only (they clear setuid/setgid).
        caller = caller_of(ctx) if flags & os.O_ACCMODE != os.O_RDONLY else None
        result = await self.fs.open(inode, flags, caller)
        return pyfuse3.FileInfo(
            fh=result.fh, keep_cache=result.keep_cache, direct_io=result.direct_io
        )

    @_errno
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        # pyfuse3 sends the reply before it yields: a lent view is safe here.
        return await self.fs.read(fh, off, size)

    @_errno
    async def release(self, fh: int) -> None:
        await self.fs.release(fh)

    @_errno
    async def flush(self, fh: int) -> None:
        await self.fs.flush(fh)

    # --- extended attributes ---------------------------------------------------------------

    @_errno
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        return await self.fs.getxattr(inode, name)

    @_errno
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return await self.fs.listxattr(inode)

    # --- mutations ---------------------------------------------------------------------------

    @_audited(_setattr_target)
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: Any,
        ctx: Any,
    ) -> pyfuse3.EntryAttributes:
        attrs = await self.fs.setattr(
            inode,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            caller=caller_of(ctx),
        )
        return entry_attributes(attrs)

    @_audited(_created("mknod"))
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.fs.mknod(parent_inode, name, mode, ctx.uid, ctx.gid))

    @_audited(_created("mkdir"))
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.fs.mkdir(parent_inode, name, mode, ctx.uid, ctx.gid))

    @_audited(_at_name("unlink"))
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.unlink(parent_inode, name)

    @_audited(_at_name("rmdir"))
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.rmdir(parent_inode, name)

    @_audited(_symlink_target)
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.fs.symlink(parent_inode, name, target, ctx.uid, ctx.gid))

    @_audited(_rename_target)
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: Any,
    ) -> None:
        await self.fs.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    @_audited(_link_target)
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        return await self.fs.link(inode, new_parent_inode, new_name)

    @_audited(_created("create"))
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        opened, attrs = await self.fs.create(
            parent_inode, name, mode, flags, ctx.uid, ctx.gid, caller=caller_of(ctx)
        )
        info = pyfuse3.FileInfo(
            fh=opened.fh, keep_cache=opened.keep_cache, direct_io=opened.direct_io
        )
        return info, entry_attributes(attrs)

    @_errno
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @_errno
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh, datasync)

    @_errno
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        self.fs.meta.sync()

    @_audited(_xattr_target("setxattr"))
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        await self.fs.setxattr(inode, name, value)

    @_audited(_xattr_target("removexattr"))
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.removexattr(inode, name)
