"""MetaDB: schema, listing merge, block accounting invariants."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.errors import SchemaMismatch
from tierfs.meta import ROOT_INO, BlockRecord, ListedEntry, MetaDB
from tierfs.meta.records import (
    _BLOCK,
    Inode,
    block_key,
    decode_block,
    decode_inode,
    encode_block,
    encode_inode,
    raw_listed_at,
)

IDENT = {"file_mode": 0o644, "dir_mode": 0o755, "uid": 0, "gid": 0}


def merge(db: MetaDB, entries: list[ListedEntry], parent: int = ROOT_INO) -> None:
    gen = db.begin_listing(parent)
    db.merge_listing(parent, gen, entries, now=1.0, prefix="", **IDENT)
    db.finish_listing(parent, gen, now=1.0, prefix="")


def test_inode_record_round_trip() -> None:
    inode = Inode(7, 0o100600, 1, 2, 12345, 10**18, 2 * 10**18, 3, "ü name".encode(), etag="abc-2")
    assert decode_inode(7, encode_inode(inode)) == inode


def test_listed_at_is_read_without_a_decode(tmp_path: Path) -> None:
    """A missed lookup's negative timeout reads one field of the directory's
    record (``MetaDB.listed_at``): the same value a decode gives."""
    inode = Inode(9, 0o40755, 0, 0, 0, 1, 1, ROOT_INO, b"d", validated_at=5.5, listed_at=1234.25)
    assert raw_listed_at(encode_inode(inode)) == 1234.25
    db = MetaDB(tmp_path, "s3://one")
    try:
        with db.write() as tx:
            tx.put_inode(inode)
        assert db.listed_at(9) == 1234.25 == db.get_inode(9).listed_at  # type: ignore[union-attr]
        assert db.listed_at(10) is None
    finally:
        db.close()


def test_state_dir_of_another_bucket_is_refused(tmp_path: Path) -> None:
    MetaDB(tmp_path, "s3://one").close()
    with pytest.raises(SchemaMismatch, match="belongs to"):
        MetaDB(tmp_path, "s3://two")


def test_merge_keeps_inode_numbers_and_sweeps_vanished_names(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    merge(db, [ListedEntry(b"a", False, 1, "e1"), ListedEntry(b"d", True)])
    a = db.lookup(ROOT_INO, b"a")
    merge(db, [ListedEntry(b"a", False, 1, "e1"), ListedEntry(b"n", False, 2, "e2")])
    assert db.lookup(ROOT_INO, b"a") == a
    assert db.lookup(ROOT_INO, b"d") is None
    assert [name for _, name, _ in db.read_dir(ROOT_INO, 0, 100)] == [b"a", b"n"]


def test_changed_etag_drops_blocks_and_usage(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    merge(db, [ListedEntry(b"a", False, 10, "e1")])
    ino = db.lookup(ROOT_INO, b"a")
    assert ino is not None
    db.add_block(ino, 0, BlockRecord(tier=0, digest=1, nbytes=10))
    assert db.tier_usage(0).bytes == 10 and db.tier_usage(0).files == 1
    gen = db.begin_listing(ROOT_INO)
    result = db.merge_listing(
        ROOT_INO, gen, [ListedEntry(b"a", False, 10, "e2")], now=2.0, prefix="", **IDENT
    )
    assert result.changed == [(ino, [0])]
    assert db.get_blocks(ino) == {}
    assert db.tier_usage(0).bytes == 0 and db.tier_usage(0).files == 0


def test_a_file_unlinked_while_open_is_deleted_at_the_next_open(tmp_path: Path) -> None:
    """A daemon killed while an unlinked file was open never deleted its
    record: the next open of the database does, blocks and usage with it;
    a file unlinked and deleted normally leaves nothing to sweep."""
    db = MetaDB(tmp_path, "s3://b")
    merge(db, [ListedEntry(b"open", False, 10, "e1"), ListedEntry(b"kept", False, 5, "e2")])
    opened, kept = db.lookup(ROOT_INO, b"open"), db.lookup(ROOT_INO, b"kept")
    assert opened is not None and kept is not None
    db.add_block(opened, 0, BlockRecord(tier=0, digest=1, nbytes=10))
    db.add_block(kept, 0, BlockRecord(tier=0, digest=2, nbytes=5))
    with db.write() as tx:
        tx.unlink(ROOT_INO, b"open")
        tx.keep_unlinked(opened)
    db.close()  # (its record stays: the daemon is gone before the last close)

    db = MetaDB(tmp_path, "s3://b")
    assert db.swept_unlinked == 1
    assert db.get_inode(opened) is None and db.get_blocks(opened) == {}
    assert db.tier_usage(0).bytes == 5 and db.tier_usage(0).files == 1
    assert db.get_inode(kept) is not None
    with db.write() as tx:
        tx.unlink(ROOT_INO, b"kept")
        tx.keep_unlinked(kept)
    with db.write() as tx:
        tx.delete_inode(kept)  # its last close
    db.close()
    assert MetaDB(tmp_path, "s3://b").swept_unlinked == 0


block_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "drop_file", "drop_tier"]),
        st.integers(2, 5),  # ino
        st.integers(0, 3),  # block
        st.integers(0, 1),  # tier
        st.integers(1, 1000),  # nbytes
    ),
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(block_ops)
def test_usage_always_equals_the_sum_of_block_records(
    tmp_path_factory: pytest.TempPathFactory, ops: list
) -> None:
    db = MetaDB(tmp_path_factory.mktemp("meta"), "s3://b")
    try:
        for op, ino, blockno, tier, nbytes in ops:
            if op == "add":
                db.add_block(ino, blockno, BlockRecord(tier=tier, digest=0, nbytes=nbytes))
            elif op == "drop_file":
                db.drop_blocks(ino)
            else:
                db.drop_blocks(ino, tier)
        for tier in (0, 1):
            expected_bytes = 0
            expected_files = 0
            for ino in range(2, 6):
                on_tier = [r.nbytes for r in db.get_blocks(ino).values() if r.tier == tier]
                expected_bytes += sum(on_tier)
                expected_files += 1 if sum(on_tier) else 0
                assert db.residency(ino).get(tier, 0) == sum(on_tier)
            usage = db.tier_usage(tier)
            assert (usage.bytes, usage.files) == (expected_bytes, expected_files)
    finally:
        db.close()


# --- group commit ------------------------------------------------------------------------


def new_file_inode(tx_ino: int, name: bytes) -> Inode:
    return Inode(tx_ino, 0o100644, 0, 0, 0, 1, 1, ROOT_INO, name)


def create(db: MetaDB, name: bytes) -> int:
    with db.write() as tx:
        ino = tx.alloc_ino()
        root = tx.get_inode(ROOT_INO)
        assert root is not None
        tx.put_inode(new_file_inode(ino, name))
        tx.link(root, name, ino)
    return ino


def test_group_commit_reads_see_uncommitted_writes_and_a_failed_block_rolls_back(
    tmp_path: Path,
) -> None:
    db = MetaDB(tmp_path, "s3://b")
    db.group_commit = True
    a = create(db, b"a")
    assert db.uncommitted == 1
    assert db.lookup(ROOT_INO, b"a") == a  # visible before any commit
    with pytest.raises(RuntimeError, match="boom"), db.write() as tx:
        tx.put_inode(new_file_inode(a, b"renamed"))
        raise RuntimeError("boom")
    inode = db.get_inode(a)
    assert inode is not None and inode.name == b"a"  # only the failed block undone
    assert db.uncommitted == 1
    db.commit()
    assert db.uncommitted == 0
    db.close()
    db = MetaDB(tmp_path, "s3://b")
    assert not db.unclean_start
    assert db.lookup(ROOT_INO, b"a") == a
    db.close()


CRASHING_WRITER = """
import os, sys
from pathlib import Path
sys.path[:0] = [{root!r}]
from tests.unit.test_meta import create
from tierfs.meta import MetaDB
db = MetaDB(Path({path!r}), "s3://b")
db.group_commit = True
print(create(db, b"committed"), flush=True)
db.commit()
print(create(db, b"lost"), flush=True)
os._exit(9)  # killed: no commit, no close
"""


def test_a_killed_writer_loses_only_the_uncommitted_group_and_never_reuses_inodes(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    script = CRASHING_WRITER.format(root=root, path=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    committed, lost = (int(line) for line in done.stdout.split())
    db = MetaDB(tmp_path, "s3://b")
    try:
        assert db.unclean_start
        assert db.lookup(ROOT_INO, b"committed") == committed
        assert db.lookup(ROOT_INO, b"lost") is None
        again = create(db, b"new")
        assert again > lost, "an inode number of the lost group was handed out again"
    finally:
        db.close()
    assert not MetaDB(tmp_path, "s3://b").unclean_start


def test_sealed_dirty_block_record_round_trip_and_older_records() -> None:
    for rec in (
        BlockRecord(tier=1, digest=2**64 - 1, nbytes=4096, dirty=True, sealed=True),
        BlockRecord(tier=0, digest=0, nbytes=7, dirty=True),
        BlockRecord(tier=0, digest=5, nbytes=7),
    ):
        assert decode_block(encode_block(rec)) == rec
    # A dirty record written before seals existed (flags = 1): no digest.
    old = decode_block(_BLOCK.pack(1, 0, 0, 4096, 1))
    assert old.dirty and not old.sealed and not old.checkable
    # "sealed" means nothing on a clean record: its digest always holds.
    assert decode_block(encode_block(BlockRecord(0, 9, 1, dirty=False, sealed=True))).checkable


def test_recount_residency_re_derives_usage_from_the_block_map(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    merge(db, [ListedEntry(b"a", False, 30, "e1"), ListedEntry(b"b", False, 5, "e1")])
    a, b = db.lookup(ROOT_INO, b"a"), db.lookup(ROOT_INO, b"b")
    assert a is not None and b is not None
    db.add_block(a, 0, BlockRecord(tier=0, digest=1, nbytes=10))
    db.add_block(a, 1, BlockRecord(tier=1, digest=1, nbytes=20))
    db.add_block(b, 0, BlockRecord(tier=0, digest=1, nbytes=5))
    # A drift: a's block 0 vanished from the map but not from the accounting.
    with db.write() as w:
        w.txn.delete(block_key(a, 0), db=db._blocks)
    assert db.tier_usage(0).bytes == 15
    db.recount_residency(a)
    assert db.residency(a) == {1: 20}
    assert (db.tier_usage(0).bytes, db.tier_usage(0).files) == (5, 1)
    assert (db.tier_usage(1).bytes, db.tier_usage(1).files) == (20, 1)
    db.recount_residency(a)  # nothing to correct: nothing changes
    assert (db.tier_usage(0).bytes, db.tier_usage(1).bytes) == (5, 20)


def test_failed_files_are_recorded_until_the_inode_goes(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    merge(db, [ListedEntry(b"a", False, 30, "e1")])
    ino = db.lookup(ROOT_INO, b"a")
    assert ino is not None
    assert db.failed_blocks(ino) == [] and db.failed_files() == {}
    assert db.mark_failed(ino, 3) and db.mark_failed(ino, 1)
    assert not db.mark_failed(ino, 3)
    db.close()
    db = MetaDB(tmp_path, "s3://b")
    assert db.failed_blocks(ino) == [1, 3]
    assert db.failed_files() == {ino: [1, 3]}
    with db.write() as w:
        w.delete_inode(ino)
    assert db.failed_files() == {}


def test_pins_survive_a_reopen_and_go_with_their_inode(tmp_path: Path) -> None:
    db = MetaDB(tmp_path, "s3://b")
    merge(db, [ListedEntry(b"a", False, 30, "e1"), ListedEntry(b"b", False, 30, "e2")])
    a, b = db.lookup(ROOT_INO, b"a"), db.lookup(ROOT_INO, b"b")
    assert a is not None and b is not None
    assert db.pins() == {} and db.get_pin(a) is None
    db.set_pin(a, 0)
    db.set_pin(b, 1)
    db.set_pin(b, 0)  # re-pinning moves the pin
    db.close()
    db = MetaDB(tmp_path, "s3://b")
    assert db.pins() == {a: 0, b: 0}
    assert db.clear_pin(b) and not db.clear_pin(b)
    # A name the bucket no longer lists takes its pin with it.
    merge(db, [ListedEntry(b"b", False, 30, "e2")])
    assert db.lookup(ROOT_INO, b"a") is None
    assert db.pins() == {}
    # So does a deleted inode.
    c = create(db, b"c")
    db.set_pin(c, 1)
    assert db.pins() == {c: 1}
    with db.write() as w:
        w.unlink(ROOT_INO, b"c")
        w.delete_inode(c)
    assert db.pins() == {}
    db.close()


# --- tier usage in memory ------------------------------------------------------------------


def usage_from_records(db: MetaDB, inos: range, tier: int) -> tuple[int, int]:
    per_file = [
        sum(r.nbytes for r in db.get_blocks(ino).values() if r.tier == tier) for ino in inos
    ]
    return sum(per_file), sum(1 for n in per_file if n)


def test_usage_in_memory_forgets_an_aborted_block_and_matches_after_reopen(
    tmp_path: Path,
) -> None:
    db = MetaDB(tmp_path, "s3://b")
    db.group_commit = True
    db.add_block(2, 0, BlockRecord(tier=0, digest=0, nbytes=100))
    assert (db.tier_usage(0).bytes, db.tier_usage(0).files) == (100, 1)  # mirror loaded
    with pytest.raises(RuntimeError, match="boom"), db.write() as tx:
        tx.add_block(3, 0, BlockRecord(tier=0, digest=0, nbytes=50))
        tx.add_block(2, 1, BlockRecord(tier=1, digest=0, nbytes=7))
        assert db.tier_usage(0).bytes == 150  # read-your-writes inside the block
        raise RuntimeError("boom")
    assert (db.tier_usage(0).bytes, db.tier_usage(0).files) == (100, 1)
    assert db.tier_usage(1).bytes == 0
    db.add_block(3, 0, BlockRecord(tier=0, digest=0, nbytes=50))
    db.drop_block_list(2, [0])
    db.add_block(2, 1, BlockRecord(tier=1, digest=0, nbytes=7))
    for tier in (0, 1):
        got = db.tier_usage(tier)
        assert (got.bytes, got.files) == usage_from_records(db, range(2, 4), tier)
    db.close()
    db = MetaDB(tmp_path, "s3://b")
    try:
        assert (db.tier_usage(0).bytes, db.tier_usage(0).files) == (50, 1)
        assert (db.tier_usage(1).bytes, db.tier_usage(1).files) == (7, 1)
    finally:
        db.close()


KILLED_MID_BATCH = """
import os, sys
from pathlib import Path
sys.path[:0] = [{root!r}]
from tierfs.meta import BlockRecord, MetaDB
db = MetaDB(Path({path!r}), "s3://b")
db.group_commit = True
db.tier_usage(0)  # the mirror is loaded: the crash must not depend on it
for ino in range(2, 202):  # one batch of many small files' block records
    db.add_block(ino, 0, BlockRecord(tier=0, digest=ino, nbytes=1000 + ino))
db.commit()
for ino in range(202, 302):  # the next batch: killed before its commit
    db.add_block(ino, 0, BlockRecord(tier=0, digest=ino, nbytes=1000 + ino))
    db.add_block(ino - 200, 1, BlockRecord(tier=1, digest=ino, nbytes=10))
print(db.tier_usage(0).bytes, flush=True)
os._exit(9)
"""


def test_a_kill_mid_batch_leaves_block_records_and_usage_of_the_last_commit(
    tmp_path: Path,
) -> None:
    """The crash rule of batched bookkeeping: a group holds block records
    and tier usage together, so a kill -9 mid-batch loses the whole
    uncommitted batch and leaves usage equal to the records kept."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    script = KILLED_MID_BATCH.format(root=root, path=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert int(done.stdout) == sum(1000 + ino for ino in range(2, 302))
    db = MetaDB(tmp_path, "s3://b")
    try:
        assert db.unclean_start
        assert all(len(db.get_blocks(ino)) == 1 for ino in range(2, 202))
        assert all(not db.get_blocks(ino) for ino in range(202, 302))
        assert usage_from_records(db, range(2, 302), 0) == (
            sum(1000 + i for i in range(2, 202)),
            200,
        )
        for tier in (0, 1):
            got = db.tier_usage(tier)
            assert (got.bytes, got.files) == usage_from_records(db, range(2, 302), tier)
    finally:
        db.close()


def test_nth_cookie_after_agrees_with_read_dir(tmp_path: Path) -> None:
    """``nth_cookie_after`` answers from the readdir order alone what
    ``read_dir`` would: across gaps left by removed names, and never past
    the directory's last entry into the next directory's."""
    db = MetaDB(tmp_path, "s3://b")
    names = [f"f{i:02d}".encode() for i in range(20)]
    merge(db, [ListedEntry(n, False, 1, "e") for n in names] + [ListedEntry(b"sub", True)])
    sub = db.lookup(ROOT_INO, b"sub")
    assert sub is not None
    merge(db, [ListedEntry(b"x", False, 1, "e"), ListedEntry(b"y", False, 1, "e")], parent=sub)
    # Remove every name but f00, f05..f07 and f19 (and sub): gaps of 5 and 12.
    kept = {b"f00", b"f05", b"f06", b"f07", b"f19", b"sub"}
    merge(db, [ListedEntry(n, n == b"sub", 1, "e") for n in [*names, b"sub"] if n in kept])
    cookies = [cookie for cookie, _, _ in db.read_dir(ROOT_INO, 0, 100)]
    assert len(cookies) == 6
    assert cookies[1] - cookies[0] == 5
    for after in range(0, cookies[-1] + 2):
        following = [c for c in cookies if c > after]
        for n in range(1, 9):
            expected = following[n - 1] if n <= len(following) else None
            assert db.nth_cookie_after(ROOT_INO, after, n) == expected, (after, n)
    assert db.nth_cookie_after(sub, 0, 2) is not None
    assert db.nth_cookie_after(sub, 0, 3) is None
    assert db.nth_cookie_after(12345, 0, 1) is None
