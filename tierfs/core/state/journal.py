"""The write-back journal: S3 mutations still owed, durable in LMDB.

Entries (JSON in the ``journal`` sub-database, keyed by a growing sequence
number):

=============================================  ==========================================
``{"op": "upload", "ino": N}``                 put the file's current bytes at its
                                               current key (multipart when large);
                                               ``upload_id``/``upload_key`` are added
                                               while a multipart upload is open
``{"op": "copy", "src": K, "dst": K2, "ino"}``  server-side copy.  The rename that
                                               queues it sets the inode's origin
                                               to K2 at once; reads use K (see
                                               ``read_origin``) until it is done
``{"op": "delete", "key": K}``                 delete one object (or ``dir/`` marker);
                                               with ``"ino"``, not before that
                                               unlinked file's last close
``{"op": "mkdir", "key": "dir/", "ino": N}``   put an empty directory marker
``{"op": "setmeta", "ino": N, "key": K}``      rewrite the metadata of the clean object at K
=============================================  ==========================================

Attribute shadow (``tierfs.core.names.shadow``): the entries that put data or
metadata at a key (upload, copy's ``dst``, setmeta, mkdir) first put the
shadow object of the inode's attributes (if they are not canonical) and,
once their change is in the bucket, delete the other shadow objects of that
key that the inode's ledger (``MetaDB`` ``shadows``) lists.  A delete entry
with ``"shadow_ino": N`` deletes, after the object, every shadow object of
that key in N's ledger.  A ``mkdir`` entry also serves a chmod/chown of a
directory (its marker is put again, with the new metadata).

Invariants:

* An entry is appended in the same LMDB transaction as the namespace change
  it carries (``Journal.write``), and deleted in the same transaction as the
  state change its completion causes (uploads that end together share one
  such transaction: ``Sync._mark_clean_batched``).  A crash therefore
  replays it: every op is idempotent (a PUT, COPY or DELETE repeated gives
  the same bucket).
* At most one upload entry per inode (``upload_seq``): writing a dirty file
  again does not add entries.
* Ordering: two entries that touch the same key run in sequence order; an
  entry never overtakes an earlier one on a shared key (``runnable``).  An
  entry never overtakes an earlier *delete* of a related name either: the
  same name as object or marker (``n0`` and ``n0/``), a name above it or a
  name under it (``DeletedNames``).  So the bucket's changes for one name
  apply in the order the mount made them: ``rm n0; mkdir n0`` deletes the
  object ``n0`` before it puts the marker ``n0/`` (a store with real
  directories cannot hold both; on S3 both existed for a while, and a
  listing then showed the directory and reported the file), and
  ``rmdir d; touch d`` deletes ``d/`` before it puts ``d``.  A
  rename moves the file's upload entry behind the rename's copy/delete.
  An upload's key is the file's *current* key, so a rename changes the
  keys of its upload entry: the entry must then sit behind every entry the
  rename queued, or its next attempt would PUT the new key before the
  delete of the object it replaces (and that delete would remove it).
  This holds for a running upload too (``requeue_upload``): its entry is
  replaced at once, in the rename's transaction (durable: a replay runs
  the new entry in its new place), and the attempt still on the wire is
  *superseded*: it keeps blocking the key it PUTs (``running_key``) until
  it ends, is never retried, never marks the file clean, and leaves no
  trace in the journal.
* A local change of attributes that the bucket does not have yet (a
  pending upload, setmeta or mkdir of the inode: ``attrs_owed``) wins over
  the attribute shadow that a listing finds.
* Upload entries become due ``upload_delay`` after the last close or fsync
  (``schedule``); an open file that was never fsynced is not uploaded yet.
  After a remount everything is due at once.

Refused entries.  An entry whose attempt the bucket refused in a way no
retry can fix (``StoreRefused``: a 4xx such as a key too long, an invalid
argument, an object too large; or a key the store rejects before sending)
is *refused* (``refuse``): it stays in the journal, durable, with the
reason, but is not retried on its own, and it is never dropped behind the
user's back: its file's changes exist nowhere else.  Its file shows as
``failed`` with the reason in ``tierfs where`` and ``status``.  It runs
again (one attempt each):

* when a ``tierfs flush`` names it (so that a flush after the operator
  fixed the cause, a bucket policy say, completes; a flush meanwhile fails
  after that one attempt, naming the file and the reason);
* after a remount (refusals are kept in memory only);
* when the file changes (new content: the next close schedules it) or is
  renamed (the rename replaces the entry, ``requeue_upload``).

To drop it, remove the file (``rm``: its upload entry goes with it) or
rename it to a name the bucket takes (``mv``).  ``tierfs evict`` never drops
it (dirty data is never evicted).  A refused entry keeps blocking later
entries on the same key (ordering above); a flush that waits for those
names them as waiting behind the failed one instead of waiting forever.
Other files are never held up: the uploader runs every entry that does
not share a key with it.

The uploader worker (``tierfs.workers.uploader``) picks runnable entries and
calls ``Sync.run_entry``; this module holds no I/O.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from tierfs.meta import MetaDB, MetaTxn

Entry = dict[str, Any]

#: How far into the queue the scheduler looks for runnable entries.
SCAN_WINDOW = 2000

#: A ``hurry`` counts as someone waiting for the bucket for this long
#: (seconds); a writer short of space hurries every 50 ms while it waits.
HURRY_WAIT = 1.0
#: A hurried entry that failed before runs again this soon (seconds).
HURRY_FAILED_RETRY = 2.0


def child_key(parent_key: str, name: bytes) -> str:
    """The key of ``name`` in the directory whose key is ``parent_key`` ("": the root)."""
    return (parent_key + "/" if parent_key else "") + name.decode()


class DeletedNames:
    """The names of the pending deletes seen so far by one ``runnable`` scan.

    A key is normalised to its name (``a/b/`` and ``a/b`` are ``a/b``); a
    later entry is related to an earlier delete when one of its names is
    that name, lies under it, or lies above it.  O(depth) per key."""

    __slots__ = ("_above", "_names")

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._above: set[str] = set()  # proper ancestors of the names

    def __bool__(self) -> bool:
        return bool(self._names)

    def add(self, keys: list[str]) -> None:
        for key in keys:
            name = key.rstrip("/")
            self._names.add(name)
            self._above.update(_ancestors(name))

    def related(self, keys: list[str]) -> bool:
        for key in keys:
            name = key.rstrip("/")
            if name in self._names or name in self._above:
                return True
            if any(above in self._names for above in _ancestors(name)):
                return True
        return False


def _ancestors(name: str) -> Iterator[str]:
    """``a/b/c`` -> ``a/b``, ``a``."""
    cut = name.rfind("/")
    while cut > 0:
        name = name[:cut]
        yield name
        cut = name.rfind("/")


@dataclass(slots=True)
class JournalWriter:
    """Stages journal changes inside one metadata transaction."""

    tx: MetaTxn
    journal: Journal
    added: list[tuple[int, Entry]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    #: new seq -> the seq it replaces (its due time carries over)
    moved: dict[int, int] = field(default_factory=dict)
    #: running upload entries replaced in this transaction (seq -> entry)
    superseded: dict[int, Entry] = field(default_factory=dict)

    def append(self, entry: Entry) -> int:
        seq = self.tx.journal_append(entry)
        self.added.append((seq, entry))
        self.journal.queued_in[seq] = self.journal.meta.commits
        return seq

    def remove(self, seq: int) -> None:
        self.tx.journal_delete(seq)
        self.removed.append(seq)

    def ensure_upload(self, ino: int) -> None:
        """Queue an upload of ``ino`` unless one is queued (or staged) already."""
        if ino in self.journal.upload_seq or any(
            e["op"] == "upload" and e["ino"] == ino for _, e in self.added
        ):
            return
        self.append({"op": "upload", "ino": ino})

    def cancel_upload(self, ino: int) -> None:
        seq = self.journal.upload_seq.get(ino)
        if seq is not None and seq not in self.journal.running:
            self.remove(seq)

    def requeue_upload(self, ino: int) -> None:
        """Move the upload of ``ino`` behind entries appended so far.

        A running upload is moved as well: its attempt becomes superseded
        (see the module docstring, ordering)."""
        seq = self.journal.upload_seq.get(ino)
        if seq is None:
            return
        if seq in self.journal.running:
            self.superseded[seq] = self.journal.entries[seq]
        self.remove(seq)
        self.moved[self.append({"op": "upload", "ino": ino})] = seq


class Journal:
    def __init__(self, meta: MetaDB) -> None:
        self.meta = meta
        self.entries: dict[int, Entry] = dict(meta.journal_entries())
        self.upload_seq: dict[int, int] = {
            e["ino"]: seq for seq, e in self.entries.items() if e["op"] == "upload"
        }
        #: ino -> its pending copy entries, oldest first.
        self.copies: dict[int, list[int]] = {}
        for seq, entry in self.entries.items():
            if entry["op"] == "copy":
                self.copies.setdefault(entry["ino"], []).append(seq)
        #: seq -> time (trio clock) before which the entry must not run.
        self.not_before: dict[int, float] = {}
        #: inodes whose upload waits for a close or fsync.
        self.held: set[int] = set()
        #: unlinked inodes still open: the delete of their object waits, so
        #: that blocks not yet cached stay readable through the open handles.
        self.orphans: set[int] = set()
        self.running: set[int] = set()
        #: seq -> entry of running upload attempts whose entry was replaced
        #: (``requeue_upload``); dropped when the attempt ends (``run_ended``).
        self.superseded: dict[int, Entry] = {}
        #: moved seq -> the entry that replaced it (while that one is
        #: pending), and back: a flush follows its entries when they move.
        self._moved_to: dict[int, int] = {}
        self._moved_from: dict[int, set[int]] = {}
        #: Tasks in ``wait_done`` (a flush, a write-through fsync or close).
        self.waiters = 0
        #: The last ``hurry`` (trio clock).
        self.hurried_at = -math.inf
        #: seq -> ``MetaDB.commits`` when it was appended (this mount only).
        self.queued_in: dict[int, int] = {}
        #: seq -> failed attempts so far, and the error of the last one.
        self.failures: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        #: seq -> reason, for entries the bucket refused for good (see
        #: "Refused entries"): not retried on their own.
        self.refused: dict[int, str] = {}
        self._deleting: dict[str, int] = {}
        #: One set per open ``watch_deletes``, by the identity of the set:
        #: the keys and prefixes whose delete left the journal since it was
        #: opened.  (A list removed from by equality once dropped another
        #: watcher's empty set: that listing missed the deletes completed
        #: while it ran, and the close of its own raised ValueError.)
        self._delete_watchers: dict[int, set[str]] = {}
        #: ino -> pending setmeta/mkdir entries of it.
        self._attr_entries: dict[int, int] = {}
        for entry in self.entries.values():
            self._count_delete(entry, +1)
            self._count_attrs(entry, +1)
        #: Bumped before and after every rename and removal (``reshaping``)
        #: and when an orphan's inode goes: cached keys are then stale.
        self.namespace_gen = 0
        self._keys: dict[int, tuple[int, list[str] | None]] = {}
        self._changed = trio.Event()
        self._done = trio.Event()
        #: The pending sets of the tasks in ``wait_done``, by identity: an
        #: entry that leaves the journal is taken out of each (O(waiters) per
        #: entry, instead of each waiter re-checking all of its entries at
        #: every wake: a flush of N files cost O(N) per completed batch).
        self._done_watchers: dict[int, set[int]] = {}
        #: When the uploader looks at the queue next on its own (trio clock);
        #: a change that makes nothing due before then need not wake it.
        self.next_look = 0.0

    # --- writing ---------------------------------------------------------------------

    @contextlib.contextmanager
    def write(self) -> Iterator[JournalWriter]:
        """A metadata transaction that may also add or remove entries."""
        with self.meta.write() as tx:
            writer = JournalWriter(tx, self)
            yield writer
        self._publish(writer)

    @contextlib.contextmanager
    def reshaping(self) -> Iterator[JournalWriter]:
        """``write()`` for a change of the namespace's shape (a rename, an
        unlink, an rmdir): ``namespace_gen`` is bumped before it and again
        after it, so that no key remembered before the change, nor one
        computed while it ran, outlives it."""
        self.namespace_gen += 1
        try:
            with self.write() as writer:
                yield writer
        finally:
            self.namespace_gen += 1

    def _publish(self, writer: JournalWriter) -> None:
        self.superseded.update(writer.superseded)
        for new, old in writer.moved.items():
            if old in self.not_before:
                self.not_before[new] = self.not_before[old]
            olds = self._moved_from.pop(old, set()) | {old}
            for moved in olds:
                self._moved_to[moved] = new
            self._moved_from[new] = olds
        for seq in writer.removed:
            self._forget(seq)
        for seq, entry in writer.added:
            self.entries[seq] = entry
            if entry["op"] == "upload":
                self.upload_seq[entry["ino"]] = seq
            elif entry["op"] == "copy":
                self.copies.setdefault(entry["ino"], []).append(seq)
            self._count_delete(entry, +1)
            self._count_attrs(entry, +1)
        # A new upload entry waits for a close or fsync (``schedule``) or
        # for the uploader's next look; other entries are due at once.
        if writer.removed or any(e["op"] != "upload" for _, e in writer.added):
            self.wake()

    def _forget(self, seq: int) -> None:
        entry = self.entries.pop(seq, None)
        if entry is None:
            return
        if entry["op"] == "upload" and self.upload_seq.get(entry["ino"]) == seq:
            del self.upload_seq[entry["ino"]]
        elif entry["op"] == "copy":
            pending = self.copies.get(entry["ino"], [])
            if seq in pending:
                pending.remove(seq)
            if not pending:
                self.copies.pop(entry["ino"], None)
        self.not_before.pop(seq, None)
        self.queued_in.pop(seq, None)
        self.failures.pop(seq, None)
        self.errors.pop(seq, None)
        self.refused.pop(seq, None)
        self._keys.pop(seq, None)
        for moved in self._moved_from.pop(seq, ()):
            self._moved_to.pop(moved, None)
        self._count_delete(entry, -1)
        self._count_attrs(entry, -1)
        for pending in self._done_watchers.values():
            pending.discard(seq)
        self._done.set()
        self._done = trio.Event()

    def _count_attrs(self, entry: Entry, sign: int) -> None:
        if entry["op"] not in ("setmeta", "mkdir"):
            return
        ino: int = entry["ino"]
        count = self._attr_entries.get(ino, 0) + sign
        if count:
            self._attr_entries[ino] = count
        else:
            self._attr_entries.pop(ino, None)

    def _count_delete(self, entry: Entry, sign: int) -> None:
        if entry["op"] != "delete":
            return
        key: str = entry["key"]
        parts = key.rstrip("/").split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i]) + ("/" if i < len(parts) or key.endswith("/") else "")
            count = self._deleting.get(prefix, 0) + sign
            if sign < 0:
                for done in self._delete_watchers.values():
                    done.add(prefix)
            if count:
                self._deleting[prefix] = count
            else:
                self._deleting.pop(prefix, None)

    # --- queries ----------------------------------------------------------------------

    def being_deleted(self, key_or_prefix: str) -> bool:
        """Is a delete pending for this key, or for a key under this prefix?

        The namespace uses it so that a re-listing does not bring back a name
        that was deleted or renamed away locally before the bucket caught up.
        """
        return key_or_prefix in self._deleting

    @contextlib.contextmanager
    def watch_deletes(self) -> Iterator[Callable[[str], bool]]:
        """``being_deleted`` for a listing: while the block runs, the predicate
        it yields is also true for a key or prefix whose delete left the
        journal since the block began.  A LIST sent before such a delete
        completed still shows the name; without this, the listing would
        bring the deleted name back until the next listing swept it."""
        done: set[str] = set()
        self._delete_watchers[id(done)] = done
        try:
            yield lambda key_or_prefix: key_or_prefix in self._deleting or key_or_prefix in done
        finally:
            del self._delete_watchers[id(done)]

    def read_origin(self, ino: int) -> str | None:
        """Where the bytes of ``ino``'s origin are *now*, if a rename moved
        its origin key ahead of the server-side copy: the source of the
        oldest pending copy.  None: at the inode's ``origin_key``."""
        pending = self.copies.get(ino)
        return self.entries[pending[0]]["src"] if pending else None

    def protects(self, ino: int) -> bool:
        """Must a listing leave this inode alone (its bucket object is not
        where the namespace says, yet)?"""
        return ino in self.copies or ino in self.upload_seq

    def attrs_owed(self, ino: int) -> bool:
        """Does the bucket still owe a local change of ``ino``'s attributes?"""
        return ino in self.upload_seq or ino in self._attr_entries

    def successors(self, seqs: set[int]) -> set[int]:
        """``seqs`` with each moved entry replaced by the entry that now
        carries its change (``requeue_upload``)."""
        return {self._moved_to.get(seq, seq) for seq in seqs}

    def is_superseded(self, seq: int) -> bool:
        """Was the entry of this running attempt replaced meanwhile?"""
        return seq in self.superseded

    def run_ended(self, seq: int) -> None:
        """An attempt of ``seq`` is over (whatever its outcome)."""
        self.running.discard(seq)
        self.superseded.pop(seq, None)

    def pending_upload(self, ino: int) -> bool:
        return ino in self.upload_seq

    def uploading(self, ino: int) -> bool:
        seq = self.upload_seq.get(ino)
        return seq is not None and seq in self.running

    def committed(self, seq: int) -> bool:
        """Is the transaction that queued ``seq`` committed?"""
        return self.queued_in.get(seq, -1) < self.meta.commits

    def __len__(self) -> int:
        return len(self.entries)

    def inodes_pending(self) -> set[int]:
        """Every inode an entry still carries a change of (its ``ino`` or
        ``shadow_ino``): an inode outside this set has its last change in
        the bucket (entries leave the journal only once done)."""
        pending: set[int] = set()
        for entry in self.entries.values():
            for field_name in ("ino", "shadow_ino"):
                ino = entry.get(field_name)
                if ino is not None:
                    pending.add(ino)
        return pending

    # --- scheduling --------------------------------------------------------------------

    def hold(self, ino: int) -> None:
        """The file is open for writing: do not upload it yet."""
        self.held.add(ino)

    def schedule(self, ino: int, delay: float) -> None:
        """Upload ``ino`` after ``delay`` seconds (after a close or fsync)."""
        self.held.discard(ino)
        seq = self.upload_seq.get(ino)
        if seq is not None:
            due = self.not_before[seq] = trio.current_time() + delay
            if due < self.next_look:
                self.wake()

    def hurry(self, seqs: set[int] | None = None) -> None:
        """Make entries (all, or ``seqs``) due now, held files included.

        Without ``seqs`` (a writer short of space hurries every 50 ms),
        an entry that failed runs again within HURRY_FAILED_RETRY seconds,
        not at once: at once made it fail every 50 ms, a storm of requests
        against a bucket that refuses them.  A flush names its entries."""
        now = self.hurried_at = trio.current_time()
        for seq, entry in self.entries.items():
            if seqs is None and seq in self.refused:
                continue  # refused for good: a writer short of space cannot change that
            if seqs is None and seq in self.failures:
                self.not_before[seq] = min(self.not_before.get(seq, 0.0), now + HURRY_FAILED_RETRY)
                continue
            if seqs is None or seq in seqs:
                self.not_before[seq] = 0.0
                if entry["op"] == "upload":
                    self.held.discard(entry["ino"])
        self.wake()

    def someone_waits(self) -> bool:
        """Is anyone waiting for the bucket: a flush, a write-through fsync or
        close, or a writer short of space (which hurries, see ``HURRY_WAIT``)?"""
        return self.waiters > 0 or trio.current_time() - self.hurried_at < HURRY_WAIT

    def retry_failed_now(self) -> None:
        """The bucket answers again: entries that failed meanwhile are due now,
        and their failure counts (which a flush judges) start over."""
        for seq in self.failures:
            if seq not in self.refused:
                self.not_before[seq] = 0.0
        self.failures = {s: n for s, n in self.failures.items() if s in self.refused}
        self.wake()

    def retry_later(self, seq: int, delay: float, error: str = "") -> None:
        """An attempt of ``seq`` failed (with ``error``): try again after ``delay``.

        Nothing to do if the entry is gone (done, or superseded)."""
        if seq not in self.entries:
            return
        self.failures[seq] = self.failures.get(seq, 0) + 1
        if error:
            self.errors[seq] = error
        self.not_before[seq] = trio.current_time() + delay

    def refuse(self, seq: int, reason: str) -> None:
        """The bucket refused an attempt of ``seq`` for good: keep the entry,
        but do not run it again on its own (see "Refused entries")."""
        if seq not in self.entries:
            return
        self.failures[seq] = self.failures.get(seq, 0) + 1
        self.errors[seq] = self.refused[seq] = reason
        self.not_before[seq] = math.inf

    def unrefuse(self, seq: int, *, due: float = math.inf) -> None:
        """Give a refused entry another attempt, ``due`` on the trio clock
        (``inf``: when its file is next closed or fsynced, ``schedule``)."""
        if self.refused.pop(seq, None) is not None:
            self.not_before[seq] = due
            self.wake()

    def retry_sooner(self, seqs: set[int], within: float) -> None:
        """Entries of ``seqs`` waiting for a retry run again within ``within``
        seconds (someone waits for them: no long backoff)."""
        latest = trio.current_time() + within
        for seq in seqs:
            if self.not_before.get(seq, 0.0) > latest:
                self.not_before[seq] = latest
                self.wake()

    def runnable(
        self, keys_of: Callable[[int, Entry], list[str] | None], limit: int = SCAN_WINDOW
    ) -> tuple[list[int], float]:
        """Up to ``limit`` entries that may start now, in order, and when to
        look again (``inf``: not before the next change).

        ``keys_of(seq, entry)`` returns the keys an entry touches (None: the
        entry is obsolete and may run at once, to be dropped).  An entry runs
        only if no earlier pending or running entry shares a key with it,
        and no earlier delete touches a related name (``DeletedNames``).
        The scan stops at ``limit`` ready entries: the caller is woken when
        one of them ends, and looks again.
        """
        now = trio.current_time()
        # A superseded attempt is older than every entry: its PUT blocks its key.
        blocked = {e["running_key"] for e in self.superseded.values() if "running_key" in e}
        deleted = DeletedNames()
        ready: list[int] = []
        next_due = math.inf
        for i, (seq, entry) in enumerate(self.entries.items()):
            if i >= SCAN_WINDOW:
                break
            cached = self._keys.get(seq)
            if cached is not None and cached[0] == self.namespace_gen and seq not in self.running:
                keys = cached[1]
            else:
                keys = keys_of(seq, entry)
                self._keys[seq] = (self.namespace_gen, keys)
            if seq in self.running:
                blocked.update(keys or ())
                if keys and entry["op"] == "delete":
                    deleted.add(keys)
                continue
            if keys is None:
                ready.append(seq)
            else:
                due = self.not_before.get(seq, 0.0)
                if self._waits_for_close(entry):
                    due = math.inf
                free = blocked.isdisjoint(keys) and not (deleted and deleted.related(keys))
                if free and due <= now:
                    ready.append(seq)
                elif due > now:
                    next_due = min(next_due, due)
                blocked.update(keys)
                if entry["op"] == "delete":
                    deleted.add(keys)
            if len(ready) >= limit:
                return ready, math.inf
        return ready, next_due

    def _waits_for_close(self, entry: Entry) -> bool:
        """An upload of a file open for writing, or the delete of an unlinked
        file that is still open, waits for the last close."""
        if entry["op"] == "upload":
            return entry["ino"] in self.held
        return entry["op"] == "delete" and entry.get("ino") in self.orphans

    # --- waiting -----------------------------------------------------------------------

    def wake(self) -> None:
        self._changed.set()

    async def wait_changed(self, timeout: float) -> None:
        event = self._changed
        with trio.move_on_after(timeout):
            await event.wait()
        if event is self._changed and event.is_set():
            self._changed = trio.Event()

    async def wait_done(self, seqs: set[int]) -> None:
        """Wait until every entry in ``seqs`` has completed."""
        self.waiters += 1
        pending = seqs & self.entries.keys()
        self._done_watchers[id(pending)] = pending  # ``_forget`` narrows it
        try:
            while pending:
                await self._done.wait()
        finally:
            del self._done_watchers[id(pending)]
            self.waiters -= 1
