"""LMDB metadata: the only module that imports lmdb.

Sub-databases (keys big-endian, see ``records``):

=============  ======================================  ===============================
name           key                                     value
=============  ======================================  ===============================
``meta``       ``b"schema"``, ``b"next_ino"``, ...     schema version, counters, url
``inodes``     ino                                     encoded Inode
``dentries``   parent ino + name bytes                 ino, readdir cookie, list gen
``dirseq``     parent ino + cookie                     name bytes (readdir order)
``blocks``     ino + block no                          tier, xxh3_64 digest, length
``residency``  ino + tier                              bytes of the file on that tier
``usage``      tier                                    bytes and files on that tier
``atimes``     ino                                     last access, float seconds
``journal``    sequence number                         one S3 mutation still owed (JSON)
``xattrs``     ino + name                              value of a ``user.*`` attribute
``shadows``    ino                                     attribute shadow objects believed
                                                       to be in the bucket for this
                                                       inode: JSON ``[[key, perm, uid,
                                                       gid], ...]`` (the *ledger*)
``failed``     ino                                     JSON: damaged dirty blocks of a
                                                       file that must not be uploaded
``pins``       ino                                     tier index (u8) the file or
                                                       directory is pinned to
``unlinked``   ino                                     empty: a file unlinked (or
                                                       renamed over) while open, whose
                                                       record lives on until its
                                                       last close
=============  ======================================  ===============================

Invariants (each public method, and each ``with db.write() as tx`` block, is
ONE write transaction, so they hold after every commit and after a crash):

* Every dentry has a ``dirseq`` twin with the same cookie, and vice versa.
* ``residency[(ino, t)]`` is the sum of ``nbytes`` of ino's blocks on tier t;
  an entry exists only while that sum is > 0.
* ``usage[t]`` is the sum of ``residency[(*, t)]`` and the count of those
  entries.  It is changed only in the transaction that changes a block map, so
  usage never drifts from the block maps.  ``recount_residency`` re-derives
  one inode's share from its block records (after a block was dropped for
  damage), correcting ``usage`` by the difference.
* ``pins[ino]`` exists only while ``ino`` exists (``tierfs pin``; a pinned
  directory pins its subtree, which the lifecycle code resolves).  It goes
  with the inode, so a pin survives remounts and renames but not a delete.
* ``failed[ino]`` exists only while ``ino`` exists: a file whose dirty block
  failed its checksum (see ``core.read.blockcache``, damage).  It goes when the inode is
  deleted or when the file is uploaded again from bytes that all verify.
* A block record exists only after its bytes were written to the cache file
  (the caller's duty: write, then ``add_block``).  The reverse is allowed: a
  cache file may hold bytes that no record mentions (a crash between write and
  commit); they are never served and are freed when the file is dropped.
* ``nsubdirs`` of a directory inode is the number of its dentries that
  name directories: ``MetaTxn.link``/``unlink`` and the listing's merge and
  sweep keep it (so ``MetaTxn.unlink`` rewrites the parent's record: a
  caller holding that parent's Inode reads it again before writing it).
* ``unlinked[ino]`` exists only while ``ino`` exists and no dentry names
  it: the unlink that keeps an open file's record sets it
  (``MetaTxn.keep_unlinked``), ``delete_inode`` clears it.  The daemon
  deletes such a record at the last close; after a crash nothing is open
  any more, so opening the database deletes every inode it lists
  (``swept_unlinked``; their cache files go with the orphan cleanup of the
  mount).  Without it, a killed daemon would leave the record, its blocks
  counted in the tier usage, and its replayed upload entry putting the
  old bytes to a key that another file now owns.
* Inode numbers are never reused: ``next_ino`` only grows, and a start after
  an unclean stop skips ``INO_CRASH_GAP`` numbers (see "Group commit").
* A namespace change and the journal entries that carry it to the bucket
  commit in the same transaction: after a crash the bucket is behind, never
  silently different.
* An inode a listing created gets *provisional* attributes (``validated_at
  == PROVISIONAL``, permission bits cut to the owner's, owner = the mount's
  identity) until ``settle_attrs`` gives it its final ones from the
  attribute shadow; a listing that fails before that leaves it provisional
  (restrictive), and the next listing settles it.
* The shadow ledger of an inode (``shadows``) lists every shadow object a
  write of this node may have put, or a listing has seen, and that no
  journal entry has deleted yet: an entry adds to it BEFORE it puts a shadow
  object and removes from it AFTER it deleted one, so a crash leaves it a
  superset of the bucket's shadow objects of the inode.  It outlives the
  inode until the delete entries of that inode's objects have run.

Group commit
------------
The environment is opened with ``metasync=False``: a commit fsyncs its data
pages (about 0.3 ms here) but not the meta page, so a system crash can at
worst undo the last commit, never corrupt the database.  A commit per
operation would cost that fsync on every create and close, on the event
loop.  So writes are grouped:

* ``write()`` opens a *nested* transaction inside one long-lived outer
  transaction (the group).  Leaving the block commits the nested one into the
  group (microseconds, no I/O); an exception aborts only the nested one, so a
  block is still all or nothing.
* ``commit()`` commits the group: from then on the writes survive a crash of
  the daemon.  With ``group_commit`` off (the default, for tools and tests)
  every ``write()`` block commits at once, as a plain transaction would.
  ``core.upkeep`` turns it on and commits every ``COMMIT_INTERVAL``, before the
  uploader acts on a journal entry queued since the last commit, and in
  ``sync()`` (fsync).
* ``sync()`` commits and also flushes the meta page: the durability point of
  fsync.
* Reads see the innermost open transaction, so everything written, committed
  or not, is visible at once (read-your-writes on the loop).
* A daemon killed between commits loses the writes of the last interval, as
  an unsynced file loses its last writes in a crash; nothing that was synced
  is lost.  Inode numbers handed out in that interval may still name cache
  files, so a start after an unclean stop (the ``open`` flag is still set)
  moves ``next_ino`` on by ``INO_CRASH_GAP``, and a group never holds more
  than ``INO_CRASH_GAP // 2`` allocations.

Tier usage in memory
--------------------
``tier_usage`` is asked for every block placed (``SpaceManager.reserve``)
and was one LMDB read each; on the loop thread that is a GIL release and
re-take per block, which costs most when fetch threads keep the GIL busy
(a small-file preload).  So the ``usage`` table is mirrored in memory: the
mirror is loaded on first use from the innermost open transaction, and
``_put_usage`` (the only writer of that table) updates table and mirror
together.  The mirror therefore always equals what the innermost open
transaction would read, with one exception it handles by forgetting
itself (``None``, reloaded on the next call): an aborted ``write()``
block, or a group commit that failed, throws away writes the mirror
holds.  Nothing else writes the table while a MetaDB is open (one daemon
per state directory).

Concurrency: callers run on the trio loop thread (LMDB write transactions
belong to their thread); a method never awaits, so each is atomic with
respect to other trio tasks.  Nothing holds a read transaction across an
await.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import stat
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from tierfs.errors import SchemaMismatch
from tierfs.meta.records import (
    ROOT_INO,
    U8,
    U64,
    BlockRecord,
    Inode,
    SyncState,
    block_key,
    decode_block,
    decode_dentry,
    decode_inode,
    dentry_key,
    dirseq_key,
    encode_block,
    encode_dentry,
    encode_inode,
    ino_key,
    patch_atime,
    patch_attrs,
    raw_is_v2,
    raw_listed_at,
    raw_mode,
    raw_validated_at,
    residency_key,
    unpack_block_key,
    unpack_residency_key,
)

SCHEMA_VERSION = 3
#: Older schemas this tierfs upgrades in place when it opens their state
#: directory (see ``_upgrade_from_2``).
UPGRADABLE_SCHEMAS = (2,)
#: ``validated_at`` of an inode whose attributes a listing has not settled.
PROVISIONAL = -1.0
#: Inode numbers skipped after an unclean stop; see "Group commit".
INO_CRASH_GAP = 1 << 20
_USAGE = struct.Struct(">QQ")  # bytes, files
_F64 = struct.Struct(">d")


def prefixed(txn: lmdb.Transaction, db: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs of ``db`` whose key starts with ``prefix``, in key order."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    for key, value in cur:
        if not key.startswith(prefix):
            return
        yield key, value


@dataclass(frozen=True, slots=True)
class ListedEntry:
    """One name from a bucket listing, already validated as a file name."""

    name: bytes
    is_dir: bool
    size: int = 0
    etag: str = ""
    mtime_ns: int = 0


@dataclass(slots=True)
class MergeResult:
    """What a listing page changed.

    ``changed`` are files whose ETag differs from the cached one (their blocks
    were dropped: the caller deletes cache files and invalidates the kernel
    cache); ``removed`` are inodes that left the namespace, each with the tiers
    it had bytes on; ``conflicts`` are names where a file and a directory
    collided (the directory won).
    """

    changed: list[tuple[int, list[int]]]
    removed: list[tuple[int, list[int]]]
    conflicts: list[bytes]
    dirty_overwritten: list[bytes] = dataclasses.field(default_factory=list)
    #: (name, ino) of inodes whose attributes are provisional (see
    #: ``settle_attrs``): created by this page, or left so by an earlier
    #: listing that did not finish.
    unsettled: list[tuple[bytes, int]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TierUsage:
    bytes: int
    files: int


class MetaDB:
    """All persistent metadata of one mount's state directory: the LMDB
    schema above and every transaction on it.

    One job, kept whole on purpose: the rules that decide what a listing
    page may change (``merge_listing``, ``settle_attrs``, ``finish_listing``)
    read and write inodes, dentries, blocks and residency in the one write
    transaction that makes the page atomic, so they live beside the
    records.  The namespace decides when to list (``core.names.listings``);
    this class decides nothing about the bucket."""

    def __init__(
        self,
        path: Path,
        backing_url: str,
        *,
        default_dir_mode: int = 0o755,
        uid: int = 0,
        gid: int = 0,
        map_size: int = 1 << 36,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=16,
            metasync=False,
            sync=True,
            readahead=False,
        )
        self._meta = self.env.open_db(b"meta")
        self._inodes = self.env.open_db(b"inodes")
        self._dentries = self.env.open_db(b"dentries")
        self._dirseq = self.env.open_db(b"dirseq")
        self._blocks = self.env.open_db(b"blocks")
        self._residency = self.env.open_db(b"residency")
        self._usage = self.env.open_db(b"usage")
        self._atimes = self.env.open_db(b"atimes")
        self._journal = self.env.open_db(b"journal")
        self._xattrs = self.env.open_db(b"xattrs")
        self._shadows = self.env.open_db(b"shadows")
        self._failed = self.env.open_db(b"failed")
        self._pins = self.env.open_db(b"pins")
        self._unlinked = self.env.open_db(b"unlinked")
        #: The group transaction, then nested write() transactions, innermost last.
        self._stack: list[lmdb.Transaction] = []
        #: Batch commits (see "Group commit"); ``core.upkeep`` turns it on.
        self.group_commit = False
        #: write() blocks and inode allocations in the group since its last commit.
        self.uncommitted = 0
        #: Called (on the loop thread, synchronously) when a group gets its
        #: first write block since the last commit: the group committer
        #: sleeps until then instead of waking every interval for nothing.
        self.on_first_uncommitted: Callable[[], None] | None = None
        self._allocs = 0
        #: Number of group commits so far (a write made while it was N is
        #: committed once it is N + 1).
        self.commits = 0
        #: True if the last user of this state directory did not close it.
        self.unclean_start = False
        #: tier -> (bytes, files): the ``usage`` table as the innermost open
        #: transaction has it (see "Tier usage in memory"); None: not loaded.
        self._usage_mirror: dict[int, tuple[int, int]] | None = None
        self._init_schema(path, backing_url, default_dir_mode, uid, gid)
        #: Inodes unlinked while open that the last run left (see ``unlinked``).
        self.swept_unlinked = self._sweep_unlinked()

    # --- lifecycle -----------------------------------------------------------------

    def _init_schema(self, path: Path, backing_url: str, dir_mode: int, uid: int, gid: int) -> None:
        with self.env.begin(write=True) as txn:
            raw = txn.get(b"schema", db=self._meta)
            if raw is None:
                txn.put(b"schema", U64.pack(SCHEMA_VERSION), db=self._meta)
                txn.put(b"next_ino", U64.pack(ROOT_INO + 1), db=self._meta)
                txn.put(b"backing", backing_url.encode(), db=self._meta)
                now = time.time_ns()
                root = Inode(
                    ino=ROOT_INO,
                    mode=0o040000 | dir_mode,
                    uid=uid,
                    gid=gid,
                    size=0,
                    mtime_ns=now,
                    ctime_ns=now,
                    parent=ROOT_INO,
                    name=b"",
                )
                txn.put(ino_key(ROOT_INO), encode_inode(root), db=self._inodes)
                txn.put(b"open", b"1", db=self._meta)
                return
            version = U64.unpack(raw)[0]
            if version in UPGRADABLE_SCHEMAS:
                self._upgrade_from_2(txn)
                txn.put(b"schema", U64.pack(SCHEMA_VERSION), db=self._meta)
                version = SCHEMA_VERSION
            if version != SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"state directory {path} has metadata schema {version}, this tierfs "
                    f"uses {SCHEMA_VERSION}; move the directory away to start with an "
                    "empty cache"
                )
            stored_url = bytes(txn.get(b"backing", db=self._meta) or b"").decode()
            if stored_url != backing_url:
                raise SchemaMismatch(
                    f"state directory {path} belongs to {stored_url!r}, not "
                    f"{backing_url!r}; use a separate state dir per bucket"
                )
            if bytes(txn.get(b"open", db=self._meta) or b"0") == b"1":
                self.unclean_start = True
                next_ino = U64.unpack(txn.get(b"next_ino", db=self._meta))[0]
                txn.put(b"next_ino", U64.pack(next_ino + INO_CRASH_GAP), db=self._meta)
            txn.put(b"open", b"1", db=self._meta)

    def _sweep_unlinked(self) -> int:
        """Delete the inodes that were unlinked while open when the last run
        stopped (nothing is open now); returns how many."""
        with self.env.begin(write=True) as txn:
            inos = [U64.unpack(key)[0] for key, _ in txn.cursor(db=self._unlinked)]
            for ino in inos:
                MetaTxn(self, txn).delete_inode(ino)
        return len(inos)

    def _upgrade_from_2(self, txn: lmdb.Transaction) -> None:
        """Schema 2 -> 3: inode records gained ``atime_ns`` and ``nsubdirs``.

        File records stay in format 2 (read with atime = mtime) until they
        are next written.  Every directory record is rewritten in format 3
        with its subdirectory count, taken from its dentries, so that a
        count is exact from the first mount of this version: one pass over
        the inodes (mode and parent of each) in this one transaction.
        """
        subdirs: dict[int, int] = {}
        dirs: list[int] = []
        for key, raw in txn.cursor(db=self._inodes):
            if not stat.S_ISDIR(raw_mode(raw)):
                continue
            ino = U64.unpack(key)[0]
            dirs.append(ino)
            inode = decode_inode(ino, raw)
            if ino == ROOT_INO:
                continue
            linked = txn.get(dentry_key(inode.parent, inode.name), db=self._dentries)
            if linked is not None and decode_dentry(linked)[0] == ino:
                subdirs[inode.parent] = subdirs.get(inode.parent, 0) + 1
        for ino in dirs:
            inode = self._get_inode_txn(txn, ino)
            inode.nsubdirs = subdirs.get(ino, 0)
            txn.put(ino_key(ino), encode_inode(inode), db=self._inodes)

    def close(self) -> None:
        """Commit, mark the state directory cleanly closed, flush, close."""
        self.commit()
        with self.env.begin(write=True) as txn:
            txn.put(b"open", b"0", db=self._meta)
        self.env.sync(True)
        self.env.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[MetaTxn]:
        """One all-or-nothing write block (see "Group commit" for when it
        reaches the disk); blocks may nest."""
        if not self._stack:
            self._stack.append(self.env.begin(write=True))
        txn = self.env.begin(write=True, parent=self._stack[-1])
        self._stack.append(txn)
        ok = False
        try:
            yield MetaTxn(self, txn)
            ok = True
        finally:
            self._stack.pop()
            if ok:
                txn.commit()
                self.uncommitted += 1
                if self.uncommitted == 1 and self.on_first_uncommitted is not None:
                    self.on_first_uncommitted()
            else:
                txn.abort()
                self._usage_mirror = None  # it may hold the aborted block's usage
            if len(self._stack) == 1 and (
                not self.group_commit or self._allocs >= INO_CRASH_GAP // 2
            ):
                self.commit()

    def commit(self) -> None:
        """Commit the group: its writes now survive a crash of the daemon."""
        if len(self._stack) > 1:
            raise RuntimeError("MetaDB.commit() inside a write() block")
        if self._stack:
            group = self._stack.pop()
            self.uncommitted = 0
            self._allocs = 0
            try:
                group.commit()
            except BaseException:
                self._usage_mirror = None  # the group is lost: so is its usage
                raise
            self.commits += 1

    def sync(self) -> None:
        """Commit and flush: the writes so far survive a system crash too."""
        self.commit()
        self.env.sync(True)

    def _read(self) -> contextlib.AbstractContextManager[lmdb.Transaction]:
        """The innermost open write transaction, or a new read transaction."""
        if self._stack:
            return contextlib.nullcontext(self._stack[-1])
        return self.env.begin()

    # --- inodes --------------------------------------------------------------------

    def get_inode(self, ino: int) -> Inode | None:
        with self._read() as txn:
            raw = txn.get(ino_key(ino), db=self._inodes)
            return None if raw is None else decode_inode(ino, raw)

    def listed_at(self, ino: int) -> float | None:
        """The ``listed_at`` of inode ``ino`` (None: no such inode), read
        without decoding the record: a lookup that misses asks for it (the
        negative entry's timeout) right after it decoded the directory."""
        with self._read() as txn:
            raw = txn.get(ino_key(ino), db=self._inodes)
            return None if raw is None else raw_listed_at(raw)

    def put_inode(self, inode: Inode) -> None:
        with self.write() as w:
            w.put_inode(inode)

    def lookup(self, parent: int, name: bytes) -> int | None:
        with self._read() as txn:
            raw = txn.get(dentry_key(parent, name), db=self._dentries)
            return None if raw is None else decode_dentry(raw)[0]

    def dentry_cookie(self, parent: int, name: bytes) -> int | None:
        """The readdir cookie of ``name`` in ``parent`` (its place in listing
        order), or None when there is no such name."""
        with self._read() as txn:
            raw = txn.get(dentry_key(parent, name), db=self._dentries)
            return None if raw is None else decode_dentry(raw)[1]

    def count_children(self, parent: int) -> int:
        prefix = U64.pack(parent)
        with self._read() as txn:
            return sum(1 for _ in prefixed(txn, self._dentries, prefix))

    def read_dir(self, parent: int, after_cookie: int, limit: int) -> list[tuple[int, bytes, int]]:
        """Up to ``limit`` entries ``(cookie, name, ino)`` with cookie > after_cookie."""
        with self._read() as txn:
            return list(itertools.islice(self._children_after(txn, parent, after_cookie), limit))

    def read_dir_records(
        self, parent: int, after_cookie: int, limit: int
    ) -> list[tuple[int, bytes, int, bytes]]:
        """``read_dir`` with each child's inode record as stored (undecoded:
        ``decode_inode`` it, or compare it with one seen before), all in
        one read transaction.  A child without a record is left out."""
        out: list[tuple[int, bytes, int, bytes]] = []
        with self._read() as txn:
            for cookie, name, ino in self._children_after(txn, parent, after_cookie):
                if len(out) >= limit:
                    break
                record = txn.get(ino_key(ino), db=self._inodes)
                if record is not None:
                    out.append((cookie, name, ino, record))
        return out

    def _children_after(
        self, txn: lmdb.Transaction, parent: int, after_cookie: int
    ) -> Iterator[tuple[int, bytes, int]]:
        """The entries ``(cookie, name, ino)`` of ``parent`` with cookie >
        after_cookie, in cookie (readdir) order."""
        prefix = U64.pack(parent)
        cur = txn.cursor(db=self._dirseq)
        if not cur.set_range(dirseq_key(parent, after_cookie + 1)):
            return
        for key, name in cur:
            if not key.startswith(prefix):
                return
            raw = txn.get(dentry_key(parent, name), db=self._dentries)
            if raw is None:  # cannot happen while the invariant holds
                continue
            yield U64.unpack_from(key, 8)[0], name, decode_dentry(raw)[0]

    # --- listing merge ---------------------------------------------------------------

    def begin_listing(self, dir_ino: int) -> int:
        """Start a listing of ``dir_ino``; returns its generation number."""
        with self.write() as w:
            inode = self._get_inode_txn(w.txn, dir_ino)
            inode.list_gen += 1
            w.put_inode(inode)
            return inode.list_gen

    def merge_listing(
        self,
        dir_ino: int,
        gen: int,
        entries: Iterable[ListedEntry],
        *,
        prefix: str,
        skip_new: Callable[[bytes, bool], bool] = lambda name, is_dir: False,
        protects: Callable[[int], bool] = lambda ino: False,
        file_mode: int,
        dir_mode: int,
        uid: int,
        gid: int,
        now: float,
    ) -> MergeResult:
        """Merge one page of a listing of ``dir_ino`` (one transaction).

        New names get new inode numbers; known names keep theirs.  A name seen
        as a directory in this generation wins over a file of the same name.

        A listed name whose type differs from the local one replaces it only
        if the local name is a plain clean copy of the bucket: not when the
        listed key is one this node still owes a delete for (``skip_new``:
        a directory renamed away whose ``c/...`` objects are not deleted
        yet), nor when the local name holds what the bucket lacks
        (``_holds_local_data``: a file renamed onto ``c``, dirty or with its
        copy pending).  A model run once lost such a file: the LIST still
        showed the old ``c/``, the merge dropped the local file as "became a
        directory", and then skipped the directory as being deleted.
        """
        result = MergeResult(changed=[], removed=[], conflicts=[])
        # Names listed as directories in this page: an object of the same
        # name (it sorts before its ``name/`` prefix) must not replace the
        # directory before the prefix entry marks it seen.
        entries = list(entries)
        listed_dirs = {entry.name for entry in entries if entry.is_dir}
        with self.write() as w:
            txn = w.txn
            parent = self._get_inode_txn(txn, dir_ino)
            for entry in entries:
                dkey = dentry_key(dir_ino, entry.name)
                raw = txn.get(dkey, db=self._dentries)
                if raw is not None:
                    ino, cookie, seen_gen = decode_dentry(raw)
                    inode = self._get_inode_txn(txn, ino)
                    if inode.is_dir != entry.is_dir:
                        if skip_new(entry.name, entry.is_dir) or self._holds_local_data(
                            txn, ino, prefix + entry.name.decode(), protects
                        ):
                            # The listed name is a leftover this node is still
                            # deleting (a directory renamed away, a file the
                            # local name replaced), or the local name holds
                            # what the bucket does not have yet: the local
                            # name wins, its entries will make the bucket agree.
                            continue
                        if seen_gen == gen or (inode.is_dir and entry.name in listed_dirs):
                            # Both `a` and `a/...` exist in this listing.
                            result.conflicts.append(entry.name)
                            if inode.is_dir:
                                continue  # the directory wins (and keeps its inode)
                        # A file became a directory (or the reverse): replace.
                        self._remove_subtree(txn, ino, result)
                        self._unlink_dentry(txn, dir_ino, entry.name, cookie)
                        if inode.is_dir:
                            parent.nsubdirs = max(0, parent.nsubdirs - 1)
                        raw = None
                    else:
                        txn.put(dkey, encode_dentry(ino, cookie, gen), db=self._dentries)
                        provisional = inode.validated_at == PROVISIONAL
                        if provisional:
                            result.unsettled.append((entry.name, ino))
                        if not entry.is_dir and protects(ino):
                            pass  # its object is being moved or replaced: not the truth
                        elif not entry.is_dir and seen_gen == gen:
                            # ``mark_seen``: this node put the object while the
                            # listing ran; the LIST entry may be older than it.
                            pass
                        elif not entry.is_dir and (
                            inode.etag != entry.etag or inode.size != entry.size
                        ):
                            if inode.state != SyncState.CLEAN:
                                # The local write wins when it is uploaded.
                                if inode.origin_key == prefix + entry.name.decode():
                                    result.dirty_overwritten.append(entry.name)
                            elif inode.origin_key in ("", prefix + entry.name.decode()):
                                # Clean: the bucket is the truth.
                                tiers = self._drop_blocks_txn(txn, ino, None)
                                result.changed.append((ino, tiers))
                                inode.etag = entry.etag
                                inode.origin_key = prefix + entry.name.decode()
                                inode.origin_size = entry.size
                                inode.size = entry.size
                                inode.mtime_ns = entry.mtime_ns
                                inode.ctime_ns = time.time_ns()
                                inode.validated_at = PROVISIONAL if provisional else now
                                txn.put(ino_key(ino), encode_inode(inode), db=self._inodes)
                        elif not entry.is_dir and not provisional:
                            inode.validated_at = now
                            txn.put(ino_key(ino), encode_inode(inode), db=self._inodes)
                        continue
                if raw is None:
                    if skip_new(entry.name, entry.is_dir):
                        continue
                    ino = self._alloc_ino(txn)
                    cookie = parent.next_cookie
                    parent.next_cookie += 1
                    mtime_ns = entry.mtime_ns or int(now * 1e9)
                    # Provisional until settle_attrs: owner-only, never wider
                    # than what the attribute shadow may say.
                    perm = (dir_mode if entry.is_dir else file_mode) & 0o700
                    inode = Inode(
                        ino=ino,
                        mode=(0o040000 | perm) if entry.is_dir else (0o100000 | perm),
                        uid=uid,
                        gid=gid,
                        size=0 if entry.is_dir else entry.size,
                        mtime_ns=mtime_ns,
                        ctime_ns=mtime_ns,
                        parent=dir_ino,
                        name=entry.name,
                        etag=entry.etag,
                        origin_key="" if entry.is_dir else prefix + entry.name.decode(),
                        origin_size=0 if entry.is_dir else entry.size,
                        validated_at=PROVISIONAL,
                    )
                    result.unsettled.append((entry.name, ino))
                    if entry.is_dir:
                        parent.nsubdirs += 1
                    txn.put(ino_key(ino), encode_inode(inode), db=self._inodes)
                    txn.put(dkey, encode_dentry(ino, cookie, gen), db=self._dentries)
                    txn.put(dirseq_key(dir_ino, cookie), entry.name, db=self._dirseq)
            txn.put(ino_key(dir_ino), encode_inode(parent), db=self._inodes)
        return result

    def settle_attrs(
        self,
        dir_ino: int,
        unsettled: Iterable[int],
        attrs: dict[bytes, tuple[int, int, int]],
        seen: dict[bytes, list[tuple[int, int, int]]],
        *,
        prefix: str,
        keep_provisional: set[int],
        keeps_attrs: Callable[[int], bool],
        live_inode: Callable[[int], Inode | None] = lambda ino: None,
        file_mode: int,
        dir_mode: int,
        uid: int,
        gid: int,
        now: float,
    ) -> list[bytes]:
        """Give the children of ``dir_ino`` their attributes from the shadow
        listing (one transaction); returns the shadow names that match no
        child (orphans).

        ``attrs``: name -> (perm, uid, gid) in effect (the combined shadow
        entries, or a HEAD's metadata for names too long for a shadow);
        ``seen``: name -> the shadow objects found, recorded in the ledger.
        Provisional inodes (``unsettled``) not in ``attrs`` get the mount's
        defaults, those in ``keep_provisional`` stay provisional.  A settled
        inode takes the shadow's attributes only while it is clean and
        ``keeps_attrs`` (a local change owed to the bucket) is false; one
        with no shadow keeps what it has (a HEAD may have set it).
        """
        orphans: list[bytes] = []
        with self.write() as w:
            txn = w.txn
            for ino in unsettled:
                if ino in keep_provisional:
                    continue
                key = ino_key(ino)
                raw = txn.get(key, db=self._inodes)
                if raw is None or raw_validated_at(raw) != PROVISIONAL:
                    continue
                mode = raw_mode(raw)
                is_dir = stat.S_ISDIR(mode)
                if attrs and decode_inode(ino, raw).name in attrs:
                    continue  # the shadow's, below
                perm = dir_mode if is_dir else file_mode
                mode = stat.S_IFMT(mode) | (perm & 0o7777)
                validated_at = 0.0 if is_dir else now
                txn.put(key, patch_attrs(raw, mode, uid, gid, validated_at), db=self._inodes)
                live = live_inode(ino)
                if live is not None:  # an open file: its in-memory inode too
                    live.mode, live.uid, live.gid = mode, uid, gid
                    live.validated_at = validated_at
            for name in attrs.keys() | seen.keys():
                raw = txn.get(dentry_key(dir_ino, name), db=self._dentries)
                if raw is None:
                    orphans.append(name)
                    continue
                ino = decode_dentry(raw)[0]
                inode = self._get_inode_txn(txn, ino)
                key = prefix + name.decode()
                if name in seen:
                    ledger = w.shadow_ledger(ino)
                    for perm, s_uid, s_gid in seen[name]:
                        if (key, perm, s_uid, s_gid) not in ledger:
                            ledger.append((key, perm, s_uid, s_gid))
                    w.set_shadow_ledger(ino, ledger)
                if name not in attrs:
                    continue
                provisional = inode.validated_at == PROVISIONAL
                if not provisional and (inode.state != SyncState.CLEAN or keeps_attrs(ino)):
                    continue
                if stat.S_ISLNK(inode.mode):
                    continue
                perm, inode.uid, inode.gid = attrs[name]
                inode.mode = stat.S_IFMT(inode.mode) | (perm & 0o7777)
                if provisional:
                    inode.validated_at = 0.0 if inode.is_dir else now
                w.put_inode(inode)
                live = live_inode(ino)
                if live is not None:  # an open file: its in-memory inode too
                    live.mode, live.uid, live.gid = inode.mode, inode.uid, inode.gid
                    if provisional:
                        live.validated_at = inode.validated_at
        return orphans

    def settle_one(
        self,
        ino: int,
        attrs: tuple[int, int, int] | None,
        seen: list[tuple[str, int, int, int]],
        *,
        file_mode: int,
        dir_mode: int,
        uid: int,
        gid: int,
        now: float,
    ) -> Inode | None:
        """Settle ONE provisional inode as a listing's ``settle_attrs`` would
        (one transaction): ``attrs`` (perm, uid, gid) from its shadow (or a
        HEAD), else the mount's defaults; ``seen``: the shadow objects found
        for its key, ``(key, perm, uid, gid)``, added to its ledger.
        Returns the settled inode, or None if it is gone or no longer
        provisional (a listing settled it meanwhile: nothing is changed)."""
        with self.write() as w:
            raw = w.txn.get(ino_key(ino), db=self._inodes)
            if raw is None or raw_validated_at(raw) != PROVISIONAL:
                return None
            inode = decode_inode(ino, raw)
            if seen:
                ledger = w.shadow_ledger(ino)
                w.set_shadow_ledger(ino, ledger + [item for item in seen if item not in ledger])
            if not stat.S_ISLNK(inode.mode):
                if attrs is None:
                    attrs = (dir_mode if inode.is_dir else file_mode, uid, gid)
                perm, inode.uid, inode.gid = attrs
                inode.mode = stat.S_IFMT(inode.mode) | (perm & 0o7777)
            inode.validated_at = 0.0 if inode.is_dir else now
            w.put_inode(inode)
            return inode

    def shadow_ledger(self, ino: int) -> list[tuple[str, int, int, int]]:
        with self._read() as txn:
            return _decode_ledger(txn.get(ino_key(ino), db=self._shadows))

    def finish_listing(
        self,
        dir_ino: int,
        gen: int,
        now: float,
        *,
        prefix: str,
        protects: Callable[[int], bool] = lambda ino: False,
    ) -> MergeResult:
        """Drop names not seen in listing ``gen`` and stamp the directory listed.

        A vanished name is swept only if nothing local depends on it: see
        ``_holds_local_data``.  A name whose object this node created while
        the listing ran (an upload that made a dirty file clean, a copy, a
        marker) was stamped ``gen`` by ``MetaTxn.mark_seen``: the LIST may
        predate the object, so its absence proves nothing.
        The sweep reads the dentries in pages, so a huge directory is never in
        memory whole.
        """
        result = MergeResult(changed=[], removed=[], conflicts=[])
        dir_key = U64.pack(dir_ino)
        stale: list[tuple[bytes, int, int]] = []
        with self._read() as txn:
            for key, raw in prefixed(txn, self._dentries, dir_key):
                ino, cookie, seen_gen = decode_dentry(raw)
                if seen_gen != gen:
                    stale.append((key[8:], ino, cookie))
        with self.write() as w:
            txn = w.txn
            swept_dirs = 0
            for name, ino, cookie in stale:
                if self._holds_local_data(txn, ino, prefix + name.decode(), protects):
                    continue
                raw = txn.get(ino_key(ino), db=self._inodes)
                if raw is not None and stat.S_ISDIR(raw_mode(raw)):
                    swept_dirs += 1
                self._remove_subtree(txn, ino, result)
                self._unlink_dentry(txn, dir_ino, name, cookie)
            parent = self._get_inode_txn(txn, dir_ino)
            parent.nsubdirs = max(0, parent.nsubdirs - swept_dirs)
            parent.listed_at = now
            txn.put(ino_key(dir_ino), encode_inode(parent), db=self._inodes)
        return result

    def _holds_local_data(
        self, txn: lmdb.Transaction, top: int, key: str, protects: Callable[[int], bool]
    ) -> bool:
        """True if ``top`` (at ``key``) or anything below it is not simply a
        clean copy of the bucket object at its own key: dirty files, local
        directories not yet in the bucket, files whose origin is still at
        another key (a rename whose copy is pending)."""
        pending = [(top, key)]
        while pending:
            ino, path = pending.pop()
            inode = self._get_inode_txn(txn, ino)
            if inode.state != SyncState.CLEAN or protects(ino):
                return True
            if not inode.is_dir:
                if inode.origin_key != path:
                    return True
                continue
            for child_key, raw in prefixed(txn, self._dentries, U64.pack(ino)):
                pending.append((decode_dentry(raw)[0], path + "/" + bytes(child_key[8:]).decode()))
        return False

    def _remove_subtree(self, txn: lmdb.Transaction, top: int, result: MergeResult) -> None:
        """Delete inode ``top`` and everything below it (not its own dentry)."""
        pending = [top]
        while pending:
            ino = pending.pop()
            inode = self._get_inode_txn(txn, ino)
            if inode.is_dir:
                children: list[tuple[bytes, int, int]] = []
                for key, raw in prefixed(txn, self._dentries, U64.pack(ino)):
                    child, cookie, _ = decode_dentry(raw)
                    children.append((key[8:], child, cookie))
                for name, child, cookie in children:
                    pending.append(child)
                    self._unlink_dentry(txn, ino, name, cookie)
            tiers = self._drop_blocks_txn(txn, ino, None)
            txn.delete(ino_key(ino), db=self._inodes)
            txn.delete(ino_key(ino), db=self._atimes)
            # Gone from the bucket: its shadow objects are another writer's
            # business now (they are harmless orphans, see tierfs.core.names.shadow).
            txn.delete(ino_key(ino), db=self._shadows)
            txn.delete(ino_key(ino), db=self._failed)
            txn.delete(ino_key(ino), db=self._pins)
            result.removed.append((ino, tiers))

    def _unlink_dentry(self, txn: lmdb.Transaction, parent: int, name: bytes, cookie: int) -> None:
        txn.delete(dentry_key(parent, name), db=self._dentries)
        txn.delete(dirseq_key(parent, cookie), db=self._dirseq)

    def _alloc_ino(self, txn: lmdb.Transaction) -> int:
        ino = U64.unpack(txn.get(b"next_ino", db=self._meta))[0]
        txn.put(b"next_ino", U64.pack(ino + 1), db=self._meta)
        self._allocs += 1
        return ino

    def _get_inode_txn(self, txn: lmdb.Transaction, ino: int) -> Inode:
        raw = txn.get(ino_key(ino), db=self._inodes)
        if raw is None:
            raise KeyError(f"inode {ino} missing from metadata")
        return decode_inode(ino, raw)

    # --- blocks ---------------------------------------------------------------------------

    def get_blocks(self, ino: int) -> dict[int, BlockRecord]:
        with self._read() as txn:
            return self._block_map(txn, ino)

    def _block_map(self, txn: lmdb.Transaction, ino: int) -> dict[int, BlockRecord]:
        """Block number -> record of ``ino``'s blocks, as ``txn`` sees them."""
        return {
            unpack_block_key(key)[1]: decode_block(raw)
            for key, raw in prefixed(txn, self._blocks, U64.pack(ino))
        }

    def add_block(self, ino: int, blockno: int, rec: BlockRecord) -> None:
        """Record a block whose bytes are already in the tier's cache file."""
        with self.write() as w:
            w.add_block(ino, blockno, rec)

    def drop_blocks(self, ino: int, tier: int | None = None) -> list[int]:
        """Forget all blocks of ``ino`` (on ``tier`` only, if given).

        Returns the tiers that held any of them; the caller then deletes or
        punches the cache files.
        """
        with self.write() as w:
            return self._drop_blocks_txn(w.txn, ino, tier)

    def drop_block_list(self, ino: int, blocknos: Iterable[int]) -> None:
        with self.write() as w:
            txn = w.txn
            for blockno in blocknos:
                key = block_key(ino, blockno)
                old = txn.get(key, db=self._blocks)
                if old is not None:
                    self._account(txn, ino, decode_block(old), -1)
                    txn.delete(key, db=self._blocks)

    def _drop_blocks_txn(self, txn: lmdb.Transaction, ino: int, tier: int | None) -> list[int]:
        prefix = U64.pack(ino)
        victims: list[tuple[bytes, BlockRecord]] = []
        for key, raw in prefixed(txn, self._blocks, prefix):
            rec = decode_block(raw)
            if tier is None or rec.tier == tier:
                victims.append((bytes(key), rec))
        tiers: set[int] = set()
        for key, rec in victims:
            txn.delete(key, db=self._blocks)
            self._account(txn, ino, rec, -1)
            tiers.add(rec.tier)
        return sorted(tiers)

    def _drop_blocks_from_txn(self, txn: lmdb.Transaction, ino: int, first: int) -> None:
        cur = txn.cursor(db=self._blocks)
        victims: list[tuple[bytes, BlockRecord]] = []
        if cur.set_range(block_key(ino, first)):
            prefix = U64.pack(ino)
            for key, raw in cur:
                if not key.startswith(prefix):
                    break
                victims.append((bytes(key), decode_block(raw)))
        for key, rec in victims:
            txn.delete(key, db=self._blocks)
            self._account(txn, ino, rec, -1)

    def _account(self, txn: lmdb.Transaction, ino: int, rec: BlockRecord, sign: int) -> None:
        rkey = residency_key(ino, rec.tier)
        raw = txn.get(rkey, db=self._residency)
        before = U64.unpack(raw)[0] if raw is not None else 0
        after = before + sign * rec.nbytes
        if after < 0:
            raise AssertionError(f"residency of inode {ino} on tier {rec.tier} below zero")
        if after:
            txn.put(rkey, U64.pack(after), db=self._residency)
        else:
            txn.delete(rkey, db=self._residency)
        ukey = U8.pack(rec.tier)
        raw = txn.get(ukey, db=self._usage)
        used, files = _USAGE.unpack(raw) if raw is not None else (0, 0)
        used += sign * rec.nbytes
        files += (1 if before == 0 and after > 0 else 0) - (1 if before > 0 and after == 0 else 0)
        self._put_usage(txn, rec.tier, used, files)

    def recount_residency(self, ino: int) -> None:
        """Re-derive ``residency[(ino, *)]`` from ino's block records and
        correct ``usage`` by the difference (one transaction)."""
        with self.write() as w:
            txn = w.txn
            actual: dict[int, int] = {}
            prefix = U64.pack(ino)
            for _key, raw in prefixed(txn, self._blocks, prefix):
                rec = decode_block(raw)
                actual[rec.tier] = actual.get(rec.tier, 0) + rec.nbytes
            recorded: dict[int, int] = {}
            for key, raw in prefixed(txn, self._residency, prefix):
                recorded[unpack_residency_key(key)[1]] = U64.unpack(raw)[0]
            for tier in set(actual) | set(recorded):
                before, after = recorded.get(tier, 0), actual.get(tier, 0)
                if before == after:
                    continue
                if after:
                    txn.put(residency_key(ino, tier), U64.pack(after), db=self._residency)
                else:
                    txn.delete(residency_key(ino, tier), db=self._residency)
                ukey = U8.pack(tier)
                raw = txn.get(ukey, db=self._usage)
                used, files = _USAGE.unpack(raw) if raw is not None else (0, 0)
                used = max(0, used + after - before)
                files += (1 if not before and after else 0) - (1 if before and not after else 0)
                self._put_usage(txn, tier, used, max(0, files))

    def residency(self, ino: int) -> dict[int, int]:
        out: dict[int, int] = {}
        prefix = U64.pack(ino)
        with self._read() as txn:
            for key, raw in prefixed(txn, self._residency, prefix):
                out[unpack_residency_key(key)[1]] = U64.unpack(raw)[0]
        return out

    def iter_residency(self) -> list[tuple[int, int, int]]:
        """All ``(ino, tier, bytes)``, for choosing eviction victims."""
        with self._read() as txn:
            return [
                (*unpack_residency_key(key), U64.unpack(raw)[0])
                for key, raw in txn.cursor(db=self._residency)
            ]

    def _put_usage(self, txn: lmdb.Transaction, tier: int, used: int, files: int) -> None:
        """The one writer of the ``usage`` table (and its mirror)."""
        txn.put(U8.pack(tier), _USAGE.pack(used, files), db=self._usage)
        if self._usage_mirror is not None:
            self._usage_mirror[tier] = (used, files)

    def tier_usage(self, tier: int) -> TierUsage:
        """From memory (see "Tier usage in memory"): no LMDB read per call."""
        mirror = self._usage_mirror
        if mirror is None:
            with self._read() as txn:
                mirror = {
                    U8.unpack(key)[0]: _USAGE.unpack(raw) for key, raw in txn.cursor(db=self._usage)
                }
            self._usage_mirror = mirror
        used, files = mirror.get(tier, (0, 0))
        return TierUsage(bytes=used, files=files)

    # --- access times (batched by the caller) -------------------------------------------------

    def put_atimes(self, atimes: dict[int, float]) -> None:
        with self.write() as w:
            for ino, atime in atimes.items():
                w.txn.put(ino_key(ino), _F64.pack(atime), db=self._atimes)

    def get_atimes(self) -> dict[int, float]:
        with self._read() as txn:
            return {U64.unpack(k)[0]: _F64.unpack(v)[0] for k, v in txn.cursor(db=self._atimes)}

    def write_posix_atimes(self, atimes: dict[int, int]) -> None:
        """Store the POSIX access times (ino -> atime_ns) of many inodes in
        one write block (``core.names.posix_attrs`` batches them); inodes gone meanwhile
        are skipped.  A format 3 record is patched in place."""
        with self.write() as w:
            txn = w.txn
            for ino, atime_ns in atimes.items():
                key = ino_key(ino)
                raw = txn.get(key, db=self._inodes)
                if raw is None:
                    continue
                if raw_is_v2(raw):
                    inode = decode_inode(ino, raw)
                    inode.atime_ns = atime_ns
                    txn.put(key, encode_inode(inode), db=self._inodes)
                else:
                    txn.put(key, patch_atime(raw, atime_ns), db=self._inodes)

    # --- extended attributes ----------------------------------------------------------------

    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        with self._read() as txn:
            raw = txn.get(U64.pack(ino) + name, db=self._xattrs)
            return None if raw is None else bytes(raw)

    def list_xattrs(self, ino: int) -> list[bytes]:
        prefix = U64.pack(ino)
        out: list[bytes] = []
        with self._read() as txn:
            for key, _ in prefixed(txn, self._xattrs, prefix):
                out.append(bytes(key[8:]))
        return out

    def xattr_bytes(self, ino: int | None = None, *, entry_min: int = 0) -> int:
        """Bytes of names and values of ``ino``'s extended attributes (None:
        of every inode's), each attribute counted as at least ``entry_min``."""
        total = 0
        with self._read() as txn:
            if ino is None:
                with txn.cursor(db=self._xattrs) as cursor:
                    for key, value in cursor:
                        total += max(entry_min, len(key) - 8 + len(value))
            else:
                for key, value in prefixed(txn, self._xattrs, U64.pack(ino)):
                    total += max(entry_min, len(key) - 8 + len(value))
        return total

    # --- files that failed their checksums ---------------------------------------------------

    def mark_failed(self, ino: int, blockno: int) -> bool:
        """Record that dirty block ``blockno`` of ``ino`` is damaged; True if
        it was not recorded yet."""
        with self.write() as w:
            raw = w.txn.get(ino_key(ino), db=self._failed)
            record = json.loads(raw) if raw is not None else {"blocks": [], "since": time.time()}
            if blockno in record["blocks"]:
                return False
            record["blocks"] = sorted([*record["blocks"], blockno])
            w.txn.put(ino_key(ino), json.dumps(record).encode(), db=self._failed)
            return True

    def failed_blocks(self, ino: int) -> list[int]:
        """The damaged blocks of ``ino`` (empty: the file is not failed)."""
        with self._read() as txn:
            raw = txn.get(ino_key(ino), db=self._failed)
            return [] if raw is None else list(json.loads(raw)["blocks"])

    def failed_files(self) -> dict[int, list[int]]:
        """Every failed file: ino -> its damaged blocks."""
        with self._read() as txn:
            return {
                U64.unpack(k)[0]: list(json.loads(v)["blocks"])
                for k, v in txn.cursor(db=self._failed)
            }

    # --- pins ------------------------------------------------------------------------------------

    def set_pin(self, ino: int, tier: int) -> None:
        """Pin ``ino`` (a file or a directory) to ``tier``."""
        with self.write() as w:
            w.txn.put(ino_key(ino), U8.pack(tier), db=self._pins)

    def clear_pin(self, ino: int) -> bool:
        """Unpin ``ino``; False if it was not pinned."""
        with self.write() as w:
            return bool(w.txn.delete(ino_key(ino), db=self._pins))

    def get_pin(self, ino: int) -> int | None:
        """The tier ``ino`` itself is pinned to (not its ancestors), or None."""
        with self._read() as txn:
            raw = txn.get(ino_key(ino), db=self._pins)
            return None if raw is None else U8.unpack(raw)[0]

    def pins(self) -> dict[int, int]:
        """Every pin: ino -> tier index."""
        with self._read() as txn:
            return {U64.unpack(k)[0]: U8.unpack(v)[0] for k, v in txn.cursor(db=self._pins)}

    # --- journal -------------------------------------------------------------------------------

    def journal_entries(self) -> list[tuple[int, dict[str, Any]]]:
        """Every S3 mutation still owed, oldest first."""
        with self._read() as txn:
            return [(U64.unpack(k)[0], json.loads(v)) for k, v in txn.cursor(db=self._journal)]

    # --- readdir positions ----------------------------------------------------------------------

    def nth_cookie_after(self, parent: int, after_cookie: int, n: int) -> int | None:
        """The cookie of the ``n``-th entry (from 1) of ``parent`` whose
        cookie is > ``after_cookie``, in readdir order; None when fewer
        than ``n`` follow.  Reads at most ``n`` keys of ``dirseq`` and no
        dentry: "is cookie c among the next n entries?" is ``c <= nth``
        (or None) for a c that exists."""
        if n <= 0:
            return after_cookie
        prefix = U64.pack(parent)
        with self._read() as txn:
            cur = txn.cursor(db=self._dirseq)
            if not cur.set_range(dirseq_key(parent, after_cookie + 1)):
                return None
            for _ in range(n - 1):
                if not cur.next():
                    return None
            key = cur.key()  # keys sort: this one is the parent's, so are those before
            if not key.startswith(prefix):
                return None
            return int(U64.unpack_from(key, 8)[0])

    def get_inode_and_blocks(self, ino: int) -> tuple[Inode, dict[int, BlockRecord]] | None:
        """``get_inode`` and ``get_blocks`` in one read transaction (an
        open of a file not in use needs both); None if there is no inode."""
        with self._read() as txn:
            raw = txn.get(ino_key(ino), db=self._inodes)
            if raw is None:
                return None
            return decode_inode(ino, raw), self._block_map(txn, ino)


def _decode_ledger(raw: bytes | None) -> list[tuple[str, int, int, int]]:
    if raw is None:
        return []
    return [(str(k), int(p), int(u), int(g)) for k, p, u, g in json.loads(bytes(raw))]


class MetaTxn:
    """Typed operations inside one write transaction (see ``MetaDB.write``)."""

    def __init__(self, db: MetaDB, txn: lmdb.Transaction) -> None:
        self.db = db
        self.txn = txn

    # inodes
    def get_inode(self, ino: int) -> Inode | None:
        raw = self.txn.get(ino_key(ino), db=self.db._inodes)
        return None if raw is None else decode_inode(ino, raw)

    def put_inode(self, inode: Inode) -> None:
        self.txn.put(ino_key(inode.ino), encode_inode(inode), db=self.db._inodes)

    def alloc_ino(self) -> int:
        return self.db._alloc_ino(self.txn)

    def delete_inode(self, ino: int) -> list[int]:
        """Forget an inode, its blocks, access time and xattrs; returns the
        tiers that held blocks (the caller deletes the cache files)."""
        tiers = self.db._drop_blocks_txn(self.txn, ino, None)
        self.txn.delete(ino_key(ino), db=self.db._inodes)
        self.txn.delete(ino_key(ino), db=self.db._atimes)
        self.txn.delete(ino_key(ino), db=self.db._pins)
        self.txn.delete(ino_key(ino), db=self.db._unlinked)
        self.clear_failed(ino)
        for name in self._xattr_names(ino):
            self.txn.delete(U64.pack(ino) + name, db=self.db._xattrs)
        return tiers

    def keep_unlinked(self, ino: int) -> None:
        """``ino`` lost its last dentry but stays open: its record lives on
        until its last close, or until the next open of this database."""
        self.txn.put(ino_key(ino), b"", db=self.db._unlinked)

    # dentries
    def lookup(self, parent: int, name: bytes) -> int | None:
        raw = self.txn.get(dentry_key(parent, name), db=self.db._dentries)
        return None if raw is None else decode_dentry(raw)[0]

    def link(self, parent: Inode, name: bytes, ino: int) -> None:
        """Add the dentry ``name`` -> ino under ``parent`` (whose inode record,
        with its bumped cookie counter and, for a directory ``ino``, its
        subdirectory count, is written too).  ``ino``'s record is written
        before."""
        cookie = parent.next_cookie
        parent.next_cookie += 1
        child = self.txn.get(ino_key(ino), db=self.db._inodes)
        if child is not None and stat.S_ISDIR(raw_mode(child)):
            parent.nsubdirs += 1
        gen = parent.list_gen
        self.txn.put(
            dentry_key(parent.ino, name), encode_dentry(ino, cookie, gen), db=self.db._dentries
        )
        self.txn.put(dirseq_key(parent.ino, cookie), name, db=self.db._dirseq)
        self.put_inode(parent)

    def mark_seen(self, inode: Inode) -> None:
        """This node just put ``inode``'s object into the bucket (an upload,
        a copy, a directory marker): count its dentry as seen by the
        parent's current listing.  A listing whose LIST ran before the
        object existed would otherwise sweep the name as vanished from the
        bucket the moment the inode became clean (see ``finish_listing``)."""
        key = dentry_key(inode.parent, inode.name)
        raw = self.txn.get(key, db=self.db._dentries)
        parent = self.get_inode(inode.parent)
        if raw is None or parent is None:
            return
        ino, cookie, _gen = decode_dentry(raw)
        if ino == inode.ino:
            self.txn.put(key, encode_dentry(ino, cookie, parent.list_gen), db=self.db._dentries)

    def unlink(self, parent: int, name: bytes) -> int | None:
        """Remove the dentry; for a directory, also count it out of the
        parent's record (read and written here).  The child's record must
        still exist."""
        raw = self.txn.get(dentry_key(parent, name), db=self.db._dentries)
        if raw is None:
            return None
        ino, cookie, _gen = decode_dentry(raw)
        self.db._unlink_dentry(self.txn, parent, name, cookie)
        child = self.txn.get(ino_key(ino), db=self.db._inodes)
        if child is not None and stat.S_ISDIR(raw_mode(child)):
            parent_inode = self.get_inode(parent)
            if parent_inode is not None:
                parent_inode.nsubdirs = max(0, parent_inode.nsubdirs - 1)
                self.put_inode(parent_inode)
        return ino

    def children(self, parent: int) -> list[tuple[bytes, int]]:
        prefix = U64.pack(parent)
        out: list[tuple[bytes, int]] = []
        for key, raw in prefixed(self.txn, self.db._dentries, prefix):
            out.append((bytes(key[8:]), decode_dentry(raw)[0]))
        return out

    # blocks
    def add_block(self, ino: int, blockno: int, rec: BlockRecord) -> None:
        key = block_key(ino, blockno)
        old = self.txn.get(key, db=self.db._blocks)
        if old is not None:
            self.db._account(self.txn, ino, decode_block(old), -1)
        self.txn.put(key, encode_block(rec), db=self.db._blocks)
        self.db._account(self.txn, ino, rec, +1)

    def drop_blocks_from(self, ino: int, first: int) -> None:
        self.db._drop_blocks_from_txn(self.txn, ino, first)

    def clear_failed(self, ino: int) -> None:
        self.txn.delete(ino_key(ino), db=self.db._failed)

    # journal
    def journal_append(self, entry: dict[str, Any]) -> int:
        raw = self.txn.get(b"next_seq", db=self.db._meta)
        seq = U64.unpack(raw)[0] if raw is not None else 1
        self.txn.put(b"next_seq", U64.pack(seq + 1), db=self.db._meta)
        self.journal_put(seq, entry)
        return seq

    def journal_put(self, seq: int, entry: dict[str, Any]) -> None:
        self.txn.put(
            U64.pack(seq), json.dumps(entry, separators=(",", ":")).encode(), db=self.db._journal
        )

    def journal_delete(self, seq: int) -> None:
        self.txn.delete(U64.pack(seq), db=self.db._journal)

    # shadow ledger (see the module docstring)
    def shadow_ledger(self, ino: int) -> list[tuple[str, int, int, int]]:
        return _decode_ledger(self.txn.get(ino_key(ino), db=self.db._shadows))

    def set_shadow_ledger(self, ino: int, items: list[tuple[str, int, int, int]]) -> None:
        if items:
            raw = json.dumps([list(i) for i in items], separators=(",", ":")).encode()
            self.txn.put(ino_key(ino), raw, db=self.db._shadows)
        else:
            self.txn.delete(ino_key(ino), db=self.db._shadows)

    # xattrs
    def set_xattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.txn.put(U64.pack(ino) + name, value, db=self.db._xattrs)

    def remove_xattr(self, ino: int, name: bytes) -> bool:
        return bool(self.txn.delete(U64.pack(ino) + name, db=self.db._xattrs))

    def _xattr_names(self, ino: int) -> list[bytes]:
        prefix = U64.pack(ino)
        names: list[bytes] = []
        for key, _ in prefixed(self.txn, self.db._xattrs, prefix):
            names.append(bytes(key[8:]))
        return names
