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

Where a small file's time goes in this layer and below (the requests per
file, pyfuse3's own cost, what each handler reads), measured and dated:
docs/benchmarks.md, "Metadata and small files".
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
        self.fs.fsyncdir()

    @_audited(_xattr_target("setxattr"))
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        await self.fs.setxattr(inode, name, value)

    @_audited(_xattr_target("removexattr"))
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.removexattr(inode, name)
