"""The TierfsError tree: every error the library raises on purpose.

Each class carries an ``errno``.  The FUSE layer (``tierfsd.fuse_ops``) turns a
TierfsError into ``FUSEError(err.errno)``; any other exception is a bug, gets
logged with its traceback and becomes EIO.  The CLI turns a TierfsError into a
one-line message on stderr and exit status 1.

Messages never contain credentials.  Store errors name the bucket and key, the
operation and the S3 error code, nothing more.
"""

from __future__ import annotations

import errno as _errno
import os


class TierfsError(Exception):
    """Base class.  ``errno`` is what a FUSE caller sees."""

    errno: int = _errno.EIO

    def __init__(self, message: str = "", *, errno: int | None = None) -> None:
        super().__init__(message)
        if errno is not None:
            self.errno = errno

    @property
    def message(self) -> str:
        return str(self)


def describe(exc: TierfsError) -> str:
    """What a user is told about ``exc`` beside the path it concerns: the
    errno's text first, unless the message has it ("No such file or
    directory: c.bin"), so that no message is a bare name (the namespace
    raises ``NotFound(name)``)."""
    text = str(exc) or type(exc).__name__
    meaning = os.strerror(exc.errno)
    return text if meaning in text else f"{meaning}: {text}"


# --- namespace / POSIX -------------------------------------------------------


class NotFound(TierfsError):
    errno = _errno.ENOENT


class Exists(TierfsError):
    errno = _errno.EEXIST


class NotADirectory(TierfsError):
    errno = _errno.ENOTDIR


class IsADirectory(TierfsError):
    errno = _errno.EISDIR


class DirectoryNotEmpty(TierfsError):
    errno = _errno.ENOTEMPTY


class ReadOnly(TierfsError):
    errno = _errno.EROFS


class PermissionDenied(TierfsError):
    errno = _errno.EACCES


class NotPermitted(TierfsError):
    errno = _errno.EPERM


class InvalidArgument(TierfsError):
    errno = _errno.EINVAL


class NameTooLong(TierfsError):
    errno = _errno.ENAMETOOLONG


class NameNotUtf8(TierfsError):
    """A new name that is not UTF-8: a bucket's keys are UTF-8 text, so no
    object can carry it (``EILSEQ``, as ZFS with ``utf8only`` answers)."""

    errno = _errno.EILSEQ


class NotSupported(TierfsError):
    errno = _errno.EOPNOTSUPP


class NoSpace(TierfsError):
    """No tier can take the data and nothing can be freed."""

    errno = _errno.ENOSPC


class QuotaExceeded(TierfsError):
    """A change would take a directory past its ``[[quotas]]`` limit."""

    errno = _errno.EDQUOT


class Busy(TierfsError):
    errno = _errno.EBUSY


class NoData(TierfsError):
    """Missing extended attribute."""

    errno = _errno.ENODATA


# --- data integrity ------------------------------------------------------------


class ChecksumMismatch(TierfsError):
    """A cached block failed its xxh3 check."""

    errno = _errno.EIO


class BlockDamaged(ChecksumMismatch):
    """The bytes of block ``blockno`` on its tier differ from the digest
    recorded for them (``dirty``: the only copy; it cannot be refetched)."""

    def __init__(
        self, message: str = "", *, blockno: int = -1, dirty: bool = True, errno: int | None = None
    ) -> None:
        super().__init__(message, errno=errno)
        self.blockno = blockno
        self.dirty = dirty


# --- configuration -----------------------------------------------------------------


class ConfigError(TierfsError):
    """One or more problems in a config or policy file.

    ``problems`` holds ``(file, line, sentence)`` tuples; ``line`` is 0 when the
    problem has no single line (for example a missing table).  ``str()`` gives
    one ``file:line: sentence`` per line.
    """

    errno = _errno.EINVAL

    def __init__(self, problems: list[tuple[str, int, str]]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.format_problem(p) for p in self.problems))

    @staticmethod
    def format_problem(problem: tuple[str, int, str]) -> str:
        file, line, sentence = problem
        return f"{file}:{line}: {sentence}" if line else f"{file}: {sentence}"


class SchemaMismatch(TierfsError):
    """The state directory was written by an incompatible tierfs version."""

    errno = _errno.EINVAL


# --- object store ----------------------------------------------------------------


class StoreError(TierfsError):
    """An object-store operation failed after its retries."""

    errno = _errno.EIO


class ObjectNotFound(StoreError):
    errno = _errno.ENOENT


class BucketNotFound(StoreError):
    errno = _errno.ENOENT


class StoreAccessDenied(StoreError):
    """Bad credentials or a policy that denies the operation."""

    errno = _errno.EACCES


class StoreRefused(StoreError):
    """The bucket refused the request with a client error (4xx) that asking
    again cannot fix: a key too long, an invalid argument, an object or its
    metadata too large.  The journal keeps such an entry without retrying it
    (``tierfs.core.state.journal``, "Refused entries")."""

    errno = _errno.EIO


class StoreUnavailable(StoreError):
    """The endpoint cannot be reached, or the retry budget ran out."""

    errno = _errno.EIO


class EndpointUnreachable(StoreUnavailable):
    """The endpoint's circuit breaker is open: refused without a request
    (see ``tierfs.store.breaker``)."""


class SharedTierUnusable(StoreError):
    """The shared tier answers, but cannot serve as one: credentials
    refused, no such bucket, or no conditional PUT (``SharedBucket.check``)."""


class PreconditionFailed(StoreError):
    """The object changed under us (If-Match failed)."""

    errno = _errno.ESTALE


# --- control plane -------------------------------------------------------------------


class ControlError(TierfsError):
    """The daemon could not be reached, or it refused a control request."""

    errno = _errno.EIO


class NotATierfsMount(ControlError):
    errno = _errno.EINVAL


class NoSuchPath(NotATierfsMount):
    """The path does not exist, nor does any directory above it on a tierfs
    mount: "no such file", not "not on a tierfs mount"."""

    errno = _errno.ENOENT


class ControlAccessDenied(ControlError):
    """The caller may not use this mount's control socket."""

    errno = _errno.EACCES


class CannotListen(TierfsError):
    """A configured listening address could not be bound (``[metrics] listen``:
    the port is in use, the address is not on this host...)."""

    errno = _errno.EADDRINUSE
