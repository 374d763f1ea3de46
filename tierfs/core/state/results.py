"""Plain results of TierFS calls (what the FUSE layer converts to pyfuse3
types), and ``attributes_of``, which derives an entry's attributes from its
inode.  No state, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from tierfs.meta import Inode


@dataclass(slots=True)
class Attributes:
    """What the kernel is told of an inode.  Not frozen, but never changed
    after it is built: one is built per lookup, getattr and readdir entry,
    and a frozen dataclass costs 3.7 us to build against 0.9 us (measured
    here), the largest single item of a warm ``getattr``."""

    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    blksize: int
    mtime_ns: int
    ctime_ns: int
    atime_ns: int
    timeout: float  # seconds the kernel may cache this entry and its attributes
    #: The FUSE layer's reply built from these attributes, kept with them
    #: (they never change) so that attributes served again from the
    #: ``AttributeCache`` are not converted again.  Core never reads it.
    converted: object = None


@dataclass(slots=True)
class DirEntry:
    """One readdir entry (not frozen, for the same reason as ``Attributes``)."""

    cookie: int
    name: bytes
    attrs: Attributes


@dataclass(slots=True)
class OpenResult:  # one per open: not frozen either (see ``Attributes``)
    fh: int
    keep_cache: bool
    #: Bypass the kernel page cache for this handle (see ``Handles.open``).
    direct_io: bool = False


@dataclass(frozen=True, slots=True)
class FsStats:
    block_size: int
    total_bytes: int
    free_bytes: int
    files: int
    name_max: int = 255


@dataclass(frozen=True, slots=True)
class AttributeRules:
    """What of the config the kernel's attributes follow: an access point's
    fixed owner (``[access] uid``/``gid``, None: the stored one), the block
    size shown as ``st_blksize``, and how long the kernel keeps attributes
    (``[namespace] list_ttl``)."""

    uid: int | None
    gid: int | None
    block_size: int
    list_ttl: float


def attributes_of(
    inode: Inode,
    rules: AttributeRules,
    *,
    unlinked: bool = False,
    atime_ns: int | None = None,
    timeout: float | None = None,
) -> Attributes:
    """The attributes the kernel sees for ``inode``, cached for ``timeout``
    seconds (default ``list_ttl``).

    nlink: 0 once ``unlinked`` (removed from the namespace while still open
    or referenced), 2 + its subdirectories for a directory (as on ext4; a
    directory never listed knows none yet), else 1 (no hard links).
    ``atime_ns``: an access time newer than the record's (``core.names.posix_attrs``)."""
    if unlinked:
        nlink = 0
    elif inode.is_dir:
        nlink = 2 + inode.nsubdirs
    else:
        nlink = 1
    return Attributes(
        ino=inode.ino,
        mode=inode.mode,
        nlink=nlink,
        # An access point's fixed owner hides the stored one.
        uid=inode.uid if rules.uid is None else rules.uid,
        gid=inode.gid if rules.gid is None else rules.gid,
        size=inode.size,
        blksize=rules.block_size,
        mtime_ns=inode.mtime_ns,
        ctime_ns=inode.ctime_ns,
        atime_ns=inode.atime_ns if atime_ns is None else atime_ns,
        timeout=rules.list_ttl if timeout is None else timeout,
    )
