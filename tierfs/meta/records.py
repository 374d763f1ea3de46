"""Plain records stored in LMDB, and their byte encodings.

Integers are big-endian so that composite keys sort numerically: the dentry
key ``(parent, name)`` sorts by parent then name bytes, the block key
``(ino, blockno)`` by inode then block.  Every value starts with a format byte
so that a later schema can read an older value or refuse it cleanly.

Inode records: format 2 (schema 2) has no atime and no subdirectory count;
format 3 (schema 3) appends ``atime_ns`` and ``nsubdirs`` to the fixed head,
so every field before them sits at the same offset in both formats
(``patch_attrs`` works on either).  A format 2 record decodes with atime =
mtime; ``MetaDB`` rewrites every directory record to format 3 with its
count when it upgrades a schema 2 state directory, so a format 2 record
met later is always a file or a symlink, whose count is 0.
"""

from __future__ import annotations

import enum
import stat
import struct
from dataclasses import dataclass

ROOT_INO = 1
#: ``Inode.atime_ns`` default: the new inode's atime is its mtime.
ATIME_FROM_MTIME = -(1 << 63)


class SyncState(enum.IntEnum):
    """How a file's local content relates to its object in the bucket."""

    CLEAN = 0  # content == the origin object at the file's own key
    DIRTY = 1  # local content or metadata is newer than the bucket


@dataclass(slots=True)
class Inode:
    """One file, directory or symlink.

    ``parent``/``name`` locate the inode in the namespace (no hard links, so
    each inode has exactly one dentry); the S3 key is derived from that chain,
    never stored, so renaming a directory rewrites one dentry.

    The *origin* of a file is the bucket object its unchanged bytes come
    from: ``origin_key`` (relative to the store prefix; "" = no origin, the
    file exists only locally), ``etag`` and ``origin_size``.  Bytes at offsets
    ``>= origin_size`` that no local block holds read as zeros.  For a clean
    file the origin is the object at the file's own path; during a pending
    rename it is the old key until the server-side copy completes.
    ``validated_at`` is when LIST or HEAD last confirmed that ETag.
    ``atime_ns`` is the POSIX access time (set by utimensat, moved forward
    by reads in the relatime way, see ``core.names.posix_attrs``); a record that never
    had one starts with atime = mtime.  ``nsubdirs`` (directories) counts
    the subdirectories linked under it, so that nlink = 2 + nsubdirs as on
    ext4; it changes with every dentry of a directory linked or unlinked
    (``MetaTxn.link``/``unlink``, the listing merge and sweep).
    ``listed_at`` (directories) is when the last complete listing finished;
    0 means never listed.  ``list_gen`` counts listings (for the sweep of
    names that vanished), ``next_cookie`` numbers dentries for readdir.
    """

    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    ctime_ns: int
    parent: int
    name: bytes
    etag: str = ""
    origin_key: str = ""
    origin_size: int = 0
    state: SyncState = SyncState.CLEAN
    validated_at: float = 0.0
    listed_at: float = 0.0
    list_gen: int = 0
    next_cookie: int = 1
    symlink_target: bytes = b""
    atime_ns: int = ATIME_FROM_MTIME
    nsubdirs: int = 0

    def __post_init__(self) -> None:
        if self.atime_ns == ATIME_FROM_MTIME:
            self.atime_ns = self.mtime_ns

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)


_INODE_FORMAT = 3
_INODE_FORMAT_V2 = 2  # no atime_ns, no nsubdirs (schema 2)
_INODE_HEAD_V2 = struct.Struct(">BBIIIQqqQddQQQHHHH")
_INODE_HEAD = struct.Struct(_INODE_HEAD_V2.format + "qQ")  # + atime_ns, nsubdirs
_ATIME_AT = _INODE_HEAD_V2.size


def encode_inode(inode: Inode) -> bytes:
    etag = inode.etag.encode()
    origin = inode.origin_key.encode()
    return (
        _INODE_HEAD.pack(
            _INODE_FORMAT,
            int(inode.state),
            inode.mode,
            inode.uid,
            inode.gid,
            inode.size,
            inode.mtime_ns,
            inode.ctime_ns,
            inode.parent,
            inode.validated_at,
            inode.listed_at,
            inode.list_gen,
            inode.next_cookie,
            inode.origin_size,
            len(etag),
            len(inode.name),
            len(inode.symlink_target),
            len(origin),
            inode.atime_ns,
            inode.nsubdirs,
        )
        + etag
        + inode.name
        + inode.symlink_target
        + origin
    )


# Offsets of fields that a listing rewrites in bulk (``patch_attrs``).
_MODE_AT = 2  # mode, uid, gid: three ">I" after format and state
_OWNER = struct.Struct(">III")
_VALIDATED_AT = struct.calcsize(">BBIIIQqqQ")
_F64 = struct.Struct(">d")


def raw_validated_at(raw: bytes) -> float:
    """``validated_at`` of an encoded inode, without decoding the rest."""
    value: float = _F64.unpack_from(raw, _VALIDATED_AT)[0]
    return value


_LISTED_AT = _VALIDATED_AT + _F64.size


def raw_listed_at(raw: bytes) -> float:
    """``listed_at`` of an encoded inode (either format), without decoding the rest."""
    value: float = _F64.unpack_from(raw, _LISTED_AT)[0]
    return value


_SIZE_AT = struct.calcsize(">BBIII")
_U64 = struct.Struct(">Q")


def raw_size(raw: bytes) -> int:
    """``size`` of an encoded inode (either format), without decoding the rest."""
    size: int = _U64.unpack_from(raw, _SIZE_AT)[0]
    return size


def raw_mode(raw: bytes) -> int:
    mode: int = struct.unpack_from(">I", raw, _MODE_AT)[0]
    return mode


def patch_attrs(raw: bytes, mode: int, uid: int, gid: int, validated_at: float) -> bytes:
    """An encoded inode with new mode, uid, gid and validated_at (the rest
    unchanged): a listing settles thousands of inodes, a full decode and
    encode of each would double its cost."""
    if raw[0] not in (_INODE_FORMAT, _INODE_FORMAT_V2):
        raise ValueError(f"unknown inode record format {raw[0]}")
    out = bytearray(raw)
    _OWNER.pack_into(out, _MODE_AT, mode, uid, gid)
    _F64.pack_into(out, _VALIDATED_AT, validated_at)
    return bytes(out)


def raw_is_v2(raw: bytes) -> bool:
    """Is this an inode record of schema 2 (no atime, no subdirectory count)?"""
    return raw[0] == _INODE_FORMAT_V2


def patch_atime(raw: bytes, atime_ns: int) -> bytes:
    """A format 3 inode record with a new ``atime_ns`` (the rest unchanged):
    the batched access-time write-back touches nothing else."""
    if raw[0] != _INODE_FORMAT:
        raise ValueError(f"inode record format {raw[0]} has no atime field")
    out = bytearray(raw)
    struct.pack_into(">q", out, _ATIME_AT, atime_ns)
    return bytes(out)


#: ``SyncState`` by its stored value: a tuple index, where calling the enum
#: (a lookup through ``EnumMeta.__call__``) cost ~1 us of each decode.
_SYNC_STATES: tuple[SyncState, ...] = tuple(sorted(SyncState, key=int))
assert [int(s) for s in _SYNC_STATES] == list(range(len(_SYNC_STATES)))


def decode_inode(ino: int, raw: bytes) -> Inode:
    fmt = raw[0]
    if fmt == _INODE_FORMAT:
        head = _INODE_HEAD
    elif fmt == _INODE_FORMAT_V2:
        head = _INODE_HEAD_V2
    else:
        raise ValueError(f"inode {ino}: unknown record format {fmt}")
    fields = head.unpack_from(raw)
    if fmt == _INODE_FORMAT:
        atime_ns, nsubdirs = fields[-2:]
    else:
        atime_ns, nsubdirs = ATIME_FROM_MTIME, 0
    (
        _fmt,
        state,
        mode,
        uid,
        gid,
        size,
        mtime_ns,
        ctime_ns,
        parent,
        validated_at,
        listed_at,
        list_gen,
        next_cookie,
        origin_size,
        etag_len,
        name_len,
        target_len,
        origin_len,
    ) = fields[: len(fields) - (2 if fmt == _INODE_FORMAT else 0)]
    pos = head.size
    etag = bytes(raw[pos : pos + etag_len]).decode()
    pos += etag_len
    name = bytes(raw[pos : pos + name_len])
    pos += name_len
    target = bytes(raw[pos : pos + target_len])
    pos += target_len
    origin = bytes(raw[pos : pos + origin_len]).decode()
    if state >= len(_SYNC_STATES):
        raise ValueError(f"inode {ino}: unknown sync state {state}")
    # Positional, in the field order of ``Inode`` (keywords cost more).
    return Inode(
        ino,
        mode,
        uid,
        gid,
        size,
        mtime_ns,
        ctime_ns,
        parent,
        name,
        etag,
        origin,
        origin_size,
        _SYNC_STATES[state],
        validated_at,
        listed_at,
        list_gen,
        next_cookie,
        target,
        atime_ns,
        nsubdirs,
    )


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """Where block ``blockno`` of an inode lives, and its xxh3_64 digest.

    ``nbytes`` is the block's length (the last block of a file is short).
    A clean block always carries the digest of its bytes.  A dirty block
    carries one once it is ``sealed``: its bytes were hashed when they were
    committed to the tier (close, fsync); an unsealed dirty block (being
    written, or recorded by a tierfs that did not seal) has none.
    """

    tier: int
    digest: int
    nbytes: int
    dirty: bool = False
    sealed: bool = False

    @property
    def checkable(self) -> bool:
        """Does ``digest`` describe the block's bytes?"""
        return not self.dirty or self.sealed


_BLOCK = struct.Struct(">BBQIB")  # format, tier, digest, nbytes, flags
_BLOCK_FORMAT = 1
_FLAG_DIRTY = 1
_FLAG_SEALED = 2  # a dirty block whose digest is valid (older records lack it)


def encode_block(rec: BlockRecord) -> bytes:
    flags = (_FLAG_DIRTY if rec.dirty else 0) | (_FLAG_SEALED if rec.dirty and rec.sealed else 0)
    return _BLOCK.pack(_BLOCK_FORMAT, rec.tier, rec.digest, rec.nbytes, flags)


def decode_block(raw: bytes) -> BlockRecord:
    fmt, tier, digest, nbytes, flags = _BLOCK.unpack(raw)
    if fmt != _BLOCK_FORMAT:
        raise ValueError(f"unknown block record format {fmt}")
    return BlockRecord(
        tier=tier,
        digest=digest,
        nbytes=nbytes,
        dirty=bool(flags & _FLAG_DIRTY),
        sealed=bool(flags & _FLAG_DIRTY and flags & _FLAG_SEALED),
    )


# --- keys -------------------------------------------------------------------------

U64 = struct.Struct(">Q")
U8 = struct.Struct(">B")
_INO_BLOCK = struct.Struct(">QI")
_INO_TIER = struct.Struct(">QB")
_PARENT_COOKIE = struct.Struct(">QQ")
_DENTRY_VALUE = struct.Struct(">QQQ")  # ino, cookie, gen


def ino_key(ino: int) -> bytes:
    return U64.pack(ino)


def dentry_key(parent: int, name: bytes) -> bytes:
    return U64.pack(parent) + name


def block_key(ino: int, blockno: int) -> bytes:
    return _INO_BLOCK.pack(ino, blockno)


def unpack_block_key(key: bytes) -> tuple[int, int]:
    return _INO_BLOCK.unpack(key)


def residency_key(ino: int, tier: int) -> bytes:
    return _INO_TIER.pack(ino, tier)


def unpack_residency_key(key: bytes) -> tuple[int, int]:
    return _INO_TIER.unpack(key)


def dirseq_key(parent: int, cookie: int) -> bytes:
    return _PARENT_COOKIE.pack(parent, cookie)


def encode_dentry(ino: int, cookie: int, gen: int) -> bytes:
    return _DENTRY_VALUE.pack(ino, cookie, gen)


def decode_dentry(raw: bytes) -> tuple[int, int, int]:
    return _DENTRY_VALUE.unpack(raw)
