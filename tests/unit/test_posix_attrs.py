"""POSIX attribute rules (tierfs.core.names.posix_attrs) and what MetaDB keeps for
them: atime and the subdirectory count in inode records, the schema 2 -> 3
upgrade, the count across listing merges and sweeps."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tierfs.core.names.posix_attrs import (
    RELATIME_WINDOW_NS,
    AccessTimes,
    Caller,
    Privileges,
    inherit_group,
    mode_after_chown,
    mode_after_write,
    privileges_of,
)
from tierfs.meta import ROOT_INO, Inode, ListedEntry, MetaDB
from tierfs.meta.db import SCHEMA_VERSION
from tierfs.meta.records import (
    _INODE_HEAD_V2,
    U64,
    decode_inode,
    encode_inode,
    ino_key,
)

IDENT = {"file_mode": 0o644, "dir_mode": 0o755, "uid": 0, "gid": 0}
REG = stat.S_IFREG


def encode_v2(inode: Inode) -> bytes:
    """An inode record as schema 2 wrote it (no atime, no subdirectory count)."""
    etag, origin = inode.etag.encode(), inode.origin_key.encode()
    head = _INODE_HEAD_V2.pack(
        2,
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
    )
    return head + etag + inode.name + inode.symlink_target + origin


def listing(db: MetaDB, parent: int, entries: list[ListedEntry]) -> None:
    gen = db.begin_listing(parent)
    db.merge_listing(parent, gen, entries, now=1.0, prefix="", **IDENT)
    db.finish_listing(parent, gen, now=1.0, prefix="")


# --- records -------------------------------------------------------------------------------


def test_atime_and_subdirectory_count_round_trip() -> None:
    inode = Inode(9, 0o040755, 1, 2, 0, 10**18, 2 * 10**18, 1, b"d", atime_ns=5, nsubdirs=7)
    back = decode_inode(9, encode_inode(inode))
    assert (back.atime_ns, back.nsubdirs) == (5, 7)
    assert back == inode
    assert Inode(3, REG | 0o644, 0, 0, 0, 42, 43, 1, b"f").atime_ns == 42  # new: atime = mtime


def test_schema_2_record_reads_with_atime_equal_to_mtime() -> None:
    old = Inode(7, REG | 0o600, 1, 2, 12345, 10**18, 2 * 10**18, 3, b"name", etag="e")
    back = decode_inode(7, encode_v2(old))
    assert back.atime_ns == old.mtime_ns
    assert back.nsubdirs == 0
    assert (back.size, back.name, back.etag, back.mode) == (12345, b"name", "e", REG | 0o600)


def test_schema_2_state_directory_is_upgraded_with_exact_subdirectory_counts(
    tmp_path: Path,
) -> None:
    db = MetaDB(tmp_path, "s3://b")
    listing(
        db,
        ROOT_INO,
        [ListedEntry(b"a", True), ListedEntry(b"b", True), ListedEntry(b"f", False, 1, "e")],
    )
    a = db.lookup(ROOT_INO, b"a")
    assert a is not None
    listing(db, a, [ListedEntry(b"x", True), ListedEntry(b"y", True), ListedEntry(b"z", True)])
    # Turn it into what the previous release left: schema 2, format 2 records.
    with db.write() as w:
        for ino in [ROOT_INO, a, *(ino for _, _, ino in db.read_dir(ROOT_INO, 0, 100))]:
            inode = w.get_inode(ino)
            assert inode is not None
            w.txn.put(ino_key(ino), encode_v2(inode), db=db._inodes)
        w.txn.put(b"schema", U64.pack(2), db=db._meta)
    db.close()

    db = MetaDB(tmp_path, "s3://b")
    try:
        with db._read() as txn:
            assert U64.unpack(txn.get(b"schema", db=db._meta))[0] == SCHEMA_VERSION == 3
        root, a_inode = db.get_inode(ROOT_INO), db.get_inode(a)
        assert root is not None and a_inode is not None
        assert root.nsubdirs == 2
        assert a_inode.nsubdirs == 3
        f = db.get_inode(db.lookup(ROOT_INO, b"f") or 0)
        assert f is not None and f.atime_ns == f.mtime_ns  # still format 2, read as such
    finally:
        db.close()


def test_listing_merge_and_sweep_keep_the_subdirectory_count(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    listing(db, ROOT_INO, [ListedEntry(b"d1", True), ListedEntry(b"d2", True)])
    assert db.get_inode(ROOT_INO).nsubdirs == 2  # type: ignore[union-attr]
    # d2 vanished, a file "d1" replaced the directory d1, d3 appeared.
    listing(db, ROOT_INO, [ListedEntry(b"d1", False, 1, "e"), ListedEntry(b"d3", True)])
    assert db.get_inode(ROOT_INO).nsubdirs == 1  # type: ignore[union-attr]
    listing(db, ROOT_INO, [])
    assert db.get_inode(ROOT_INO).nsubdirs == 0  # type: ignore[union-attr]
    db.close()


def test_batched_atimes_patch_records_of_both_formats(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    listing(db, ROOT_INO, [ListedEntry(b"new", False, 1, "e"), ListedEntry(b"old", False, 1, "e")])
    new, old = db.lookup(ROOT_INO, b"new"), db.lookup(ROOT_INO, b"old")
    assert new is not None and old is not None
    with db.write() as w:
        inode = w.get_inode(old)
        assert inode is not None
        w.txn.put(ino_key(old), encode_v2(inode), db=db._inodes)
    db.write_posix_atimes({new: 111, old: 222, 999_999: 3})  # the last one is gone: skipped
    assert db.get_inode(new).atime_ns == 111  # type: ignore[union-attr]
    assert db.get_inode(old).atime_ns == 222  # type: ignore[union-attr]
    db.close()


# --- relatime ------------------------------------------------------------------------------


def test_relatime_updates_only_when_atime_is_not_newer_than_mtime_or_is_a_day_old(
    tmp_path: Path,
) -> None:
    db = MetaDB(tmp_path, "s3://b")
    times = AccessTimes(db)
    day = RELATIME_WINDOW_NS
    inode = Inode(5, REG | 0o644, 0, 0, 0, 10 * day, 10 * day, 1, b"f")  # atime == mtime
    assert times.accessed(inode, now_ns=11 * day)  # atime <= mtime: moves
    assert times.atime_of(inode) == 11 * day
    assert not times.accessed(inode, now_ns=11 * day + day // 2)  # fresh: stays
    assert times.atime_of(inode) == 11 * day
    assert times.accessed(inode, now_ns=12 * day + 1)  # older than 24 h: moves
    inode.mtime_ns = 12 * day + 5  # modified after the last access
    assert times.accessed(inode, now_ns=12 * day + 10)
    assert times.pending == {5: 12 * day + 10}
    times.discard(5)
    assert times.pending == {}
    db.close()


# --- setuid / setgid -------------------------------------------------------------------------

USER = Caller(uid=1000, gid=1000, _privileges=Privileges(fsetid=False, groups=frozenset({1000})))
ROOT = Caller(uid=0, gid=0, _privileges=Privileges(fsetid=True, groups=frozenset({0})))


def test_a_write_without_cap_fsetid_clears_setuid_and_group_executable_setgid() -> None:
    assert mode_after_write(REG | 0o4755, 1000, USER) == REG | 0o755
    assert mode_after_write(REG | 0o6755, 1000, USER) == REG | 0o755
    assert mode_after_write(REG | 0o2755, 1000, USER) == REG | 0o755
    # setgid without group execute: cleared only for a caller outside the group
    assert mode_after_write(REG | 0o2644, 1000, USER) == REG | 0o2644
    assert mode_after_write(REG | 0o2644, 50, USER) == REG | 0o644
    # CAP_FSETID keeps them; directories are never touched
    assert mode_after_write(REG | 0o6755, 1000, ROOT) == REG | 0o6755
    assert mode_after_write(stat.S_IFDIR | 0o2775, 1000, USER) == stat.S_IFDIR | 0o2775


def test_chown_clears_setuid_always_and_setgid_when_group_executable() -> None:
    assert mode_after_chown(REG | 0o6755) == REG | 0o755
    assert mode_after_chown(REG | 0o6744) == REG | 0o2744
    assert mode_after_chown(stat.S_IFDIR | 0o6755) == stat.S_IFDIR | 0o6755


def test_privileges_come_from_proc_and_fall_back_to_uid() -> None:
    mine = privileges_of(os.getpid(), os.getuid(), os.getgid())
    with open(f"/proc/{os.getpid()}/status") as f:
        cap_eff = next(line for line in f if line.startswith("CapEff:")).split()[1]
    assert mine.fsetid == bool(int(cap_eff, 16) & (1 << 4))
    assert os.getegid() in mine.groups
    assert privileges_of(0, 0, 0).fsetid
    assert not privileges_of(0, 1000, 1000).fsetid
    assert privileges_of(0, 1000, 1000).groups == frozenset({1000})


def test_setgid_directory_gives_its_group_and_its_bit_to_new_directories() -> None:
    sgid_dir = Inode(2, stat.S_IFDIR | 0o2775, 0, 50, 0, 1, 1, 1, b"d")
    plain_dir = Inode(3, stat.S_IFDIR | 0o775, 0, 50, 0, 1, 1, 1, b"p")
    assert inherit_group(sgid_dir, REG | 0o644, 1000) == (REG | 0o644, 50)
    assert inherit_group(sgid_dir, stat.S_IFDIR | 0o755, 1000) == (stat.S_IFDIR | 0o2755, 50)
    assert inherit_group(plain_dir, stat.S_IFDIR | 0o755, 1000) == (stat.S_IFDIR | 0o755, 1000)
