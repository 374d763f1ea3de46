"""Carrying journal entries to the bucket (the uploader's work, per entry).

``run_entry`` executes one entry (see ``journal`` for the list) and removes
it in the same transaction as the state change it completes.  On a store
error the entry stays and is retried with backoff; nothing is dropped.

Upload of a dirty file, step by step:

1. a multipart upload left open by a crash (its id is in the entry) is
   aborted;
2. blocks that still live only in the origin object are fetched, so the
   file's bytes are all local (the origin may be deleted by a later entry);
3. the bytes are read from the cache files (``UploadSource``) and sent with
   parallel parts; the upload id is written to the entry before any part.
   A file of at most one part is one PUT: up to ``SMALL_UPLOAD_CONCURRENCY``
   of those run at once (``small_upload_limiter``), beside at most four
   multipart uploads (``upload_limiter``, four parts each): many small
   files are bound by the round trip of each PUT, not by bandwidth;
4. back on the loop: if the file's content ``version`` did not change, it is
   still linked and still at the uploaded key, its blocks become clean with
   the digests computed while uploading, its origin becomes the new object
   and the entry is removed, in one transaction.  Uploads that end close
   together share that transaction (``_mark_clean_batched``: the first one
   waits ``CLEAN_BATCH_WAIT`` for others, then one LMDB write marks every
   one of them clean and removes their entries; each is checked, at that
   moment, as above).  The bucket already has every object of a batch, so
   a crash before its commit only sends them again.  Otherwise the file stays
   dirty and the entry is tried again later: a file is marked clean only if
   it did not change during the upload.  If a rename replaced the entry
   meanwhile (the attempt is *superseded*, see ``journal``), the attempt
   just ends: the new entry, behind the rename's entries, uploads the file.
   (Known gap: a superseded multipart attempt's upload id is not recorded,
   so a crash during it leaves its parts for the bucket's lifecycle rules.)

Attribute shadow (``tierfs.core.names.shadow``): upload, copy, setmeta and mkdir
bracket their change with ``_put_shadow`` (before: the shadow object of the
inode's attributes, recorded in its ledger first) and ``_drop_shadows``
(after: the other shadow objects the ledger lists for that key); a delete
entry with ``shadow_ino`` drops that key's shadow objects after the object.
So the bucket never shows a name wider than what its inode allows, and an
upload whose attributes changed while it ran goes again, like one whose
content changed.  Before either, an inode whose attributes are still
provisional (a listing added it and has not settled them) gets the ones a
listing would give it (``Listings.settle_provisional``): owner-only
placeholders never become a shadow object or object metadata.

Wrong bytes never reach the bucket: ``UploadSource`` checks every block
that has a digest (clean ones, and dirty ones sealed at commit) as it reads
it, and a mismatch aborts the upload before the object is completed.  If
the file did not change meanwhile, that is damage: a clean block is dropped
(refetched on the next attempt); a dirty one makes the file ``failed``
(``TierFS.block_damaged``) and its upload is *refused*: the entry stays in
the journal, but is not retried (no loop re-reading the file) until the
file's content changes (``content_changed_locally``); a ``flush`` that
waits for it fails at once, naming the file.  A clean upload clears
``failed``.

An entry the bucket refuses for good (``StoreRefused``, or a key the store
rejects before sending) is *refused* (``Journal.refuse``; see ``journal``,
"Refused entries"): kept, not retried on its own, its file ``failed`` with
the reason in ``where`` and ``status``, and dropped only by removing or
renaming the file.

A flush (``_wait_entries``) gives each refused entry it waits for one
attempt, and gives up on an entry after ``flush_max_failures`` attempts of
its own (at once for a refused or damaged one).  It goes on waiting for
every other entry (each other file becomes durable), skipping those that
wait behind a given-up entry on the same key, and then fails naming each
failed file with its reason.  Attempts refused by the open circuit breaker
do not count: with the breaker open the flush waits ``FLUSH_OUTAGE_WAIT``
for the endpoint to come back, then fails with EndpointUnreachable naming
the outage (since when, the last error) and what waits.  The entries stay.

Cost per small file on the event loop.  Uploads of many small files were
bound by the trio loop, not by the PUTs (those run in worker threads,
through obstore); so the keys of directories are remembered
(``InodeKeys.key_of``, dropped with every rename or removal), a flush of
the whole mount works out no keys, a flush's wait is narrowed by the
journal as entries end (``Journal.wait_done``), and the shadow ledger is
read inside the batch's transaction (``_mark_clean``).  The profiles
behind these, dated: ``docs/benchmarks.md``, "Where an upload's loop time
goes".  So the time until a burst is in the bucket is the write loop plus a
flush as long as ``s5cmd cp``; whether uploads should overlap the burst:
see ``tierfs.workers.uploader``.

Metadata travels as ``x-amz-meta-mode`` (decimal st_mode, as s3fs-fuse
writes it), ``uid``, ``gid`` and ``mtime`` (seconds, decimal).  Symlinks are
objects whose body is the target, with S_IFLNK in their mode (s3fs-style).
"""

from __future__ import annotations

import logging
import math
import stat
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio

from tierfs.config import WriteConfig
from tierfs.errors import (
    BlockDamaged,
    EndpointUnreachable,
    InvalidArgument,
    ObjectNotFound,
    StoreError,
    StoreRefused,
    TierfsError,
)
from tierfs.meta import BlockRecord, Inode, MetaDB, SyncState
from tierfs.store import ObjectStore, abort_stale_uploads
from tierfs.store.breaker import CircuitBreaker
from tierfs.tiers import Tier

from ..names.listings import Listings
from ..names.namespace import Namespace
from ..names.shadow import ShadowAttrs, attrs_of, needs_shadow
from ..state.journal import Entry, Journal
from ..state.openfiles import CachedFile, OpenFiles
from ..state.store_threads import StoreThreads
from .blockwrites import BlockWrites
from .damage import DamageLog
from .sharewrites import SharedWrites

log = logging.getLogger(__name__)

RETRY_BASE = 1.0
RETRY_MAX = 60.0
#: The backoff doubles at most this often (2**failures overflowed a float
#: after ~1,000 failures: that exception stopped the uploader).
RETRY_DOUBLINGS = 16
#: While a flush waits for an entry that failed, it is retried this soon
#: (seconds) instead of after its backoff.
FLUSH_RETRY_WITHIN = 1.0
#: A flush that finds the circuit breaker open waits this long (seconds:
#: the prober's interval and a bit) for the endpoint to come back, then
#: fails with the outage instead of counting attempts refused without a request.
FLUSH_OUTAGE_WAIT = 3.0
#: ``status`` lists at most this many refused files with their reasons.
FAILED_LISTED = 20
#: Single-PUT uploads (files of at most one part) in flight at once.  Many
#: small files are bound by each PUT's round trip: measured against s3rver,
#: boto3 PUTs of 64 KiB reached 102 files/s with 4 threads, 150 with 8 and
#: 162 with 16 (``s5cmd cp`` 190 on the same busy machine).
SMALL_UPLOAD_CONCURRENCY = 16
#: An upload that ends waits this long (seconds) for others to end, so that
#: one transaction marks them all clean (``_mark_clean_batched``).
CLEAN_BATCH_WAIT = 0.01
#: An upload drops the stale shadow entries of its key and tries to be
#: marked clean again at most this often (a listing may record more of them
#: meanwhile); then it stays dirty and goes up again later.
CLEAN_SHADOW_ROUNDS = 3


def forget_frames(exc: BaseException) -> None:
    """Clear the local variables of the finished frames in ``exc``'s
    tracebacks (its cause, context and group members too).

    A failed upload's traceback reaches the frames that held its data (the
    part buffers, a PUT's payload), and such tracebacks sit in reference
    cycles (through trio's thread hand-off) that only the cyclic garbage
    collector frees, long after: measured, most of the daemon's Python
    memory while uploads kept failing was such garbage.  Clearing the
    frames frees that data as soon as the failure is handled.  Frames still
    running (the handler's own) are left alone."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            todo += list(current.exceptions)


@dataclass(slots=True)
class _Uploaded:
    """An upload whose object is in the bucket, waiting for the transaction
    of its batch to mark the file clean (``Sync._mark_clean_batched``)."""

    seq: int
    cf: CachedFile
    key: str
    etag: str
    size: int
    digests: dict[int, int]
    #: Is the file still what was uploaded (checked in the batch's transaction)?
    unchanged: Callable[[], bool]
    #: The shadow entry the object carries now (``Sync._put_shadow``): the
    #: one entry of its key that the file's ledger may keep.
    shadow: ShadowAttrs | None = None
    #: Set by the batch: the file is clean now, or the batch's transaction
    #: failed (the entry stays and is retried).
    marked: bool = False
    failed: bool = False
    #: Set by the batch instead of ``marked``: the file's shadow ledger lists
    #: other entries of the key, to be dropped before the file is clean.
    stale_shadows: bool = False


def _nobody(ino: int) -> set[int]:
    return set()


@dataclass(slots=True)
class FlushOutcome:
    """What a flush waited for, and what it left to its own schedule."""

    #: Journal entries waited for (each is durable in the bucket now).
    entries: int = 0
    #: Entries of files of other users (a user's flush hurries its own).
    others: int = 0
    #: Entries of files another user's process has open for writing.
    open_elsewhere: int = 0


def stale_shadows(
    ledger: list[tuple[str, int, int, int]], key: str, keep: ShadowAttrs | None
) -> list[tuple[str, int, int, int]]:
    """The items of a shadow ledger for ``key`` (no trailing slash) other
    than ``keep``: shadow objects to delete once the object at ``key``
    carries ``keep``'s attributes."""
    kept = None if keep is None else (key, keep.perm, keep.uid, keep.gid)
    return [item for item in ledger if item[0] == key and item != kept]


def object_metadata(inode: Inode) -> dict[str, str]:
    return {
        "mode": str(inode.mode),
        "uid": str(inode.uid),
        "gid": str(inode.gid),
        "mtime": f"{inode.mtime_ns / 1e9:.9f}",
    }


class Sync:
    """The bucket side of writes: carrying journal entries to the bucket
    (uploads, copies, markers, metadata) and waiting for them (``flush``);
    see the module docstring.  Local commits are ``BlockWrites.commit``."""

    def __init__(
        self,
        write: WriteConfig,
        meta: MetaDB,
        store: ObjectStore,
        tiers: list[Tier],
        journal: Journal,
        namespace: Namespace,
        listings: Listings,
        open_files: OpenFiles,
        block_writes: BlockWrites,
        damage: DamageLog,
        store_threads: StoreThreads,
        *,
        store_limiter: trio.CapacityLimiter,
        upload_limiter: trio.CapacityLimiter,
        endpoint: CircuitBreaker | None,
        shared_writes: SharedWrites | None = None,
        block_size: int,
        access_uid: int | None,
    ) -> None:
        """``write``: ``[write]`` (``upload_delay``, ``part_size``);
        ``access_uid``: an access point's fixed owner (``[access] uid``);
        ``shared_writes``: told of each file uploaded, to copy it into the
        shared tier (None: no shared tier)."""
        self.write_config = write
        self.block_size = block_size
        self.access_uid = access_uid
        self.meta = meta
        self.store = store
        self.tiers = tiers
        self.journal = journal
        self.namespace = namespace
        self.listings = listings
        self.open_files = open_files
        self.block_writes = block_writes
        self.damage = damage
        self.store_threads = store_threads
        self.store_limiter = store_limiter
        self.upload_limiter = upload_limiter
        #: Single-PUT uploads (see the module docstring, step 3).
        self.small_upload_limiter = trio.CapacityLimiter(SMALL_UPLOAD_CONCURRENCY)
        self.endpoint = endpoint
        self.shared_writes = shared_writes
        # Parts of one multipart upload in flight.  Four keep a loopback
        # server busy: with eight, s3rver spent about 13% more CPU per
        # uploaded GiB than with four (and than s5cmd's five), and the
        # upload of a 2 GiB file took that much longer.
        self.upload_part_concurrency = 4
        self.flush_max_failures = 5
        self.last_sync_error = ""
        self.stats_uploaded_bytes = 0
        #: Unlinked files still in use (their upload entries are obsolete).
        self._orphans = journal.orphans
        #: Files whose upload found a damaged dirty block: not retried until
        #: their content changes (``content_changed_locally``).
        self._upload_refused: set[int] = set()
        #: Uploads waiting for the transaction of their batch, and the event
        #: that batch sets once it committed (None: no batch is collecting).
        self._uploaded: list[_Uploaded] = []
        self._batch_committed: trio.Event | None = None

    # --- local changes ------------------------------------------------------------------------

    def content_changed_locally(self, ino: int) -> None:
        """New bytes: an upload refused for damage, or by the bucket, may be
        tried again (by the bucket: when the file is next closed or fsynced)."""
        seq = self.journal.upload_seq.get(ino)
        if ino in self._upload_refused:
            self._upload_refused.discard(ino)
            if seq is not None:
                self.journal.failures.pop(seq, None)
        if seq is not None and seq in self.journal.refused:
            self.journal.unrefuse(seq)
            self.journal.failures.pop(seq, None)

    # --- refused entries (see ``journal``, "Refused entries") -----------------------------

    def entry_subject(self, entry: Entry) -> str:
        """What an entry is about, for messages: the file's path for an
        upload, else the key."""
        if entry["op"] == "upload":
            inode = self.linked_inode(entry["ino"])
            return self.namespace.key_of(inode) if inode is not None else f"<inode {entry['ino']}>"
        return str(entry["dst"] if entry["op"] == "copy" else entry["key"])

    def refusal_of(self, ino: int) -> str | None:
        """Why the bucket refused an upload or copy of ``ino`` for good, if it did."""
        journal = self.journal
        for seq in (journal.upload_seq.get(ino), *journal.copies.get(ino, ())):
            if seq is not None and seq in journal.refused:
                return journal.refused[seq]
        return None

    def refused_files(self, limit: int = FAILED_LISTED) -> list[dict[str, str]]:
        """Up to ``limit`` refused entries: ``{"path", "reason"}`` each."""
        journal = self.journal
        return [
            {"path": self.entry_subject(journal.entries[seq]), "reason": reason}
            for seq, reason in list(journal.refused.items())[:limit]
            if seq in journal.entries
        ]

    def _entry_refused(self, seq: int, entry: Entry, exc: TierfsError) -> None:
        # A StoreRefused says "refused by the bucket (code)" itself.
        reason = str(exc) if isinstance(exc, StoreRefused) else f"refused by the store: {exc}"
        self.last_sync_error = f"{entry['op']} of {self.entry_subject(entry)!r}: {reason}"
        if seq not in self.journal.refused and seq in self.journal.entries:
            log.warning(
                "%s.  Kept in the journal, not retried until a flush names it, a remount or a "
                "change of the file; remove or rename the file to drop it",
                self.last_sync_error,
            )
        self.journal.refuse(seq, reason)

    # --- journal entries ----------------------------------------------------------------------

    def entry_keys(self, seq: int, entry: Entry) -> list[str] | None:
        """The keys an entry touches, for ordering; None if it is obsolete."""
        op = entry["op"]
        if op == "upload":
            if seq in self.journal.running and "running_key" in entry:
                # Even if the file was unlinked meanwhile: its PUT is on the
                # wire, and a later delete of that key must wait for it.
                return [entry["running_key"]]
            inode = self.linked_inode(entry["ino"])
            if inode is None:
                return None
            return [self.namespace.key_of(inode)]
        if op == "copy":
            return [entry["src"], entry["dst"]]
        return [entry["key"]]

    def dirty_bytes(self) -> int:
        """Bytes written here that the bucket does not hold yet (whole
        files: the size of each file with an upload owed)."""
        total = 0
        for ino in self.journal.upload_seq:
            inode = self.linked_inode(ino)
            if inode is not None:
                total += inode.size
        return total

    def endpoint_report(self) -> dict[str, object]:
        """Can the bucket be reached: state, since when (wall clock), the last
        transport error, and the bytes written here that wait for it."""
        if self.endpoint is None:  # a local directory: always there
            health: dict[str, object] = {"state": "reachable", "since": None, "last_error": ""}
        else:
            health = self.endpoint.snapshot().as_dict()
        health["bytes_waiting"] = self.dirty_bytes()
        health["uploads_waiting"] = len(self.journal)
        return health

    def linked_inode(self, ino: int) -> Inode | None:
        if ino in self._orphans:
            return None
        live = self.open_files.live_inode(ino)
        return live if live is not None else self.meta.get_inode(ino)

    async def run_entry(self, seq: int) -> None:
        entry = self.journal.entries.get(seq)
        if entry is None:
            self.journal.running.discard(seq)
            return
        self.journal.running.add(seq)
        try:
            op = entry["op"]
            if op == "upload":
                await self._run_upload(seq, entry)
            elif op == "copy":
                await self._run_copy(seq, entry)
            elif op == "delete":
                await self._store_call(self.store.delete, entry["key"])
                if "shadow_ino" in entry:
                    await self._drop_shadows(entry["shadow_ino"], entry["key"], None)
                self._finish(seq)
            elif op == "mkdir":
                await self._run_mkdir(seq, entry)
            elif op == "setmeta":
                await self._run_setmeta(seq, entry)
            else:
                log.error("unknown journal entry %d: %r; dropping it", seq, entry)
                self._finish(seq)
        except (StoreRefused, InvalidArgument) as exc:
            # A 4xx that no retry fixes, or a key the store rejects unsent.
            self._entry_refused(seq, entry, exc)
            forget_frames(exc)
        except (StoreError, TierfsError) as exc:
            failures = self.journal.failures.get(seq, 0)
            delay = min(RETRY_MAX, RETRY_BASE * 2 ** min(failures, RETRY_DOUBLINGS))
            self.last_sync_error = f"{entry['op']}: {exc}"
            # While the endpoint is unreachable every entry fails at once: the
            # breaker logs the outage once, the entries only at debug level.
            level = logging.DEBUG if isinstance(exc, EndpointUnreachable) else logging.WARNING
            log.log(
                level,
                "%s failed (attempt %d), retrying in %.0f s: %s",
                entry["op"],
                failures + 1,
                delay,
                exc,
            )
            self.journal.retry_later(seq, delay, self.last_sync_error)
            forget_frames(exc)
        except Exception as exc:
            log.exception("journal entry %d (%s) failed unexpectedly", seq, entry.get("op"))
            self.journal.retry_later(seq, RETRY_MAX, f"{entry.get('op')}: internal error: {exc!r}")
            forget_frames(exc)
        finally:
            entry.pop("running_key", None)
            self.journal.run_ended(seq)
            self.journal.wake()

    async def _store_call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self.store_threads.run(lambda: fn(*args, **kwargs), limiter=self.store_limiter)

    def _finish(self, seq: int) -> None:
        with self.journal.write() as w:
            w.remove(seq)

    # --- attribute shadow -------------------------------------------------------------------

    def _wanted_shadow(self, key: str, inode: Inode | None) -> ShadowAttrs | None:
        """The shadow entry the object at ``key`` needs for ``inode``'s attributes."""
        if inode is None or not needs_shadow(inode.mode, inode.uid, inode.gid):
            return None
        if not self.listings.shadow_fits(key.rstrip("/")):
            return None  # readers HEAD such names instead
        return attrs_of(inode.mode, inode.uid, inode.gid)

    async def _put_shadow(self, ino: int, key: str, inode: Inode | None) -> ShadowAttrs | None:
        """Before a change at ``key``: put the shadow entry of ``inode``'s
        attributes (ledger first, committed, so that no crash forgets it)."""
        want = self._wanted_shadow(key, inode)
        if want is None:
            return None
        item = (key.rstrip("/"), want.perm, want.uid, want.gid)
        if item not in self.meta.shadow_ledger(ino):
            with self.meta.write() as tx:
                tx.set_shadow_ledger(ino, [*tx.shadow_ledger(ino), item])
            self.meta.commit()
        shadows = self.listings.shadows
        await self._store_call(shadows.store.put, shadows.key(key, want), b"")
        return want

    async def _drop_shadows(self, ino: int, key: str, keep: ShadowAttrs | None) -> None:
        """After a change at ``key`` is in the bucket: delete the shadow
        entries of that key in ``ino``'s ledger, except ``keep``."""
        key = key.rstrip("/")
        stale = stale_shadows(self.meta.shadow_ledger(ino), key, keep)
        shadows = self.listings.shadows
        for item in stale:
            await self._store_call(shadows.store.delete, shadows.key(key, ShadowAttrs(*item[1:])))
        if stale:
            with self.meta.write() as tx:
                tx.set_shadow_ledger(ino, [i for i in tx.shadow_ledger(ino) if i not in stale])

    # --- upload -----------------------------------------------------------------------------

    async def _run_upload(self, seq: int, entry: Entry) -> None:
        ino = entry["ino"]
        if entry.get("upload_id"):
            # A multipart upload of an earlier attempt (or mount): abort it
            # first, whatever became of the file, so its parts never leak.
            await self._store_call(self.store.abort_upload, entry["upload_key"], entry["upload_id"])
            entry.pop("upload_id")
            entry.pop("upload_key")
            if self.journal.is_superseded(seq):
                return  # a rename replaced the entry (durably) while the abort ran
            with self.meta.write() as tx:
                tx.journal_put(seq, entry)
        inode = self.linked_inode(ino)
        if inode is None or inode.state == SyncState.CLEAN:
            self._finish(seq)
            return
        if ino in self._upload_refused:
            self._refuse_upload(seq, ino)
            return
        key = self.namespace.key_of(inode)
        # Keys change only with a rename or a removal, which bump this.
        namespace_gen = self.journal.namespace_gen
        entry["running_key"] = key
        cf = self.open_files.acquire(inode)
        try:
            # Provisional attributes never go up (``Listings.settle_provisional``).
            await self.listings.settle_provisional(cf.inode, self.journal.read_origin(ino))
            version = cf.version
            attrs = (cf.inode.mode, cf.inode.uid, cf.inode.gid)
            shadow = await self._put_shadow(ino, key, cf.inode)
            metadata = object_metadata(cf.inode)
            if stat.S_ISLNK(cf.inode.mode):
                etag = await self._store_call(
                    self.store.put, key, cf.inode.symlink_target, metadata
                )
                digests: dict[int, int] = {}
                size = len(cf.inode.symlink_target)
            else:
                await self.block_writes.make_local(cf)
                if version != cf.version:
                    self._retry_changed(seq)
                    return
                source = self.block_writes.upload_source(cf, self.upload_part_concurrency)
                size = source.size
                part_size = self._part_size(size)
                one_put = size <= part_size
                try:
                    etag = await self.store_threads.run(
                        lambda: self.store.put_multipart(
                            key,
                            size,
                            source.read,
                            metadata,
                            part_size=part_size,
                            concurrency=self.upload_part_concurrency,
                            on_upload_id=lambda upload_id: trio.from_thread.run_sync(
                                self._record_upload_id, seq, key, upload_id
                            ),
                        ),
                        limiter=self.small_upload_limiter if one_put else self.upload_limiter,
                    )
                except BlockDamaged as exc:
                    self._upload_found_damage(seq, cf, version, exc)
                    return
                finally:
                    source.close()  # no part stays in memory, whatever happened
                digests = source.digests
            self.stats_uploaded_bytes += size

            def unchanged() -> bool:
                current = self.linked_inode(ino)
                return (
                    current is not None
                    and version == cf.version
                    and not cf.writing  # a write in flight has not bumped the version yet
                    and (cf.inode.mode, cf.inode.uid, cf.inode.gid) == attrs
                    and (
                        self.journal.namespace_gen == namespace_gen
                        or self.namespace.key_of(current) == key
                    )
                    and seq in self.journal.entries
                )

            done = _Uploaded(seq, cf, key, etag, size, digests, unchanged, shadow)
            if not await self._mark_clean_unless_stale(done):
                log.info("%r changed during its upload; it stays dirty and goes up again", key)
                if ino not in self.journal.held:
                    self._retry_changed(seq)
                return
            if self.shared_writes is not None and not stat.S_ISLNK(cf.inode.mode):
                self.shared_writes.uploaded(ino, key, etag)
        finally:
            self.open_files.release(cf)

    def _retry_changed(self, seq: int) -> None:
        """The file changed under its upload: go again after ``upload_delay``,
        or at once if a flush (or a write-through close) waits for it: it
        hurried the entry before this attempt ended, and would otherwise
        wait out the delay."""
        self.journal.retry_later(
            seq, 0.0 if self.journal.waiters else self.write_config.upload_delay
        )
        self.journal.failures.pop(seq, None)  # a change is not a failure of the bucket

    def _upload_found_damage(
        self, seq: int, cf: CachedFile, version: int, exc: BlockDamaged
    ) -> None:
        """The upload source read a block that failed its checksum (the
        upload was aborted; nothing reached the bucket)."""
        rec = cf.blocks.get(exc.blockno)
        if version != cf.version or cf.writing or rec is None:
            log.info("%r changed during its upload; it stays dirty and goes up again", cf.key)
            self._retry_changed(seq)
            return
        if not rec.dirty:
            # A clean copy of origin bytes: drop it, the next attempt refetches it.
            self.damage.clean_blocks += 1
            log.error(
                "checksum mismatch in cached block %d of inode %d on tier %s while uploading: "
                "dropped, it is fetched again",
                exc.blockno,
                cf.ino,
                self.tiers[rec.tier].name,
            )
            self.open_files.drop_damaged_clean(cf, exc.blockno)
            self.journal.retry_later(seq, RETRY_BASE)
            return
        self.damage.block_damaged(cf.ino, exc.blockno, rec.tier, "its upload")
        self._refuse_upload(seq, cf.ino)

    def _refuse_upload(self, seq: int, ino: int) -> None:
        """Keep the entry of a failed file, but do not run it again until the
        file changes; a flush waiting for it fails at once (``_wait_entries``)."""
        self._upload_refused.add(ino)
        self.journal.not_before[seq] = math.inf
        self.last_sync_error = (
            f"upload: {self.damage.path_of(ino)!r} is failed: a block of it failed its checksum "
            "on the tier; it is not uploaded (see `tierfs where`)"
        )
        self.journal.errors[seq] = self.last_sync_error

    def _part_size(self, size: int) -> int:
        """Parts are whole blocks, at least ``[write] part_size``, and 10,000
        of them hold the file."""
        bs = self.block_size
        part = max(self.write_config.part_size, -(-size // 10_000))
        return -(-part // bs) * bs

    def _record_upload_id(self, seq: int, key: str, upload_id: str) -> None:
        """Journal the id of a multipart upload just created, and commit the
        metadata group at once: the upload thread sends its first part when
        this returns, and a daemon killed before the next group commit would
        otherwise leave an open upload that no replay knows to abort."""
        entry = self.journal.entries.get(seq)
        if entry is None:
            return
        entry["upload_id"] = upload_id
        entry["upload_key"] = key
        with self.meta.write() as tx:
            tx.journal_put(seq, {k: v for k, v in entry.items() if k != "running_key"})
        self.meta.commit()

    async def _mark_clean_unless_stale(self, done: _Uploaded) -> bool:
        """Mark ``done``'s file clean (``_mark_clean_batched``) once no other
        shadow entry of its key is left; False if it changed meanwhile.

        Only once the object has these attributes may the other shadow
        entries of the key go (``tierfs.core.names.shadow``, ordering), and they
        go before the file is clean (no crash forgets them).  Most files
        have none: their batch's transaction reads the ledger and marks them
        clean at once; a file with some comes back here, drops them
        (``_drop_shadows``) and joins the next batch."""
        for _attempt in range(CLEAN_SHADOW_ROUNDS):
            if not done.unchanged():
                return False
            if await self._mark_clean_batched(done):
                return True
            if not done.stale_shadows:
                return False
            done.stale_shadows = False
            if not done.unchanged():
                return False
            await self._drop_shadows(done.cf.ino, done.key, done.shadow)
        return False

    async def _mark_clean_batched(self, done: _Uploaded) -> bool:
        """Mark ``done``'s file clean and remove its entry, in one transaction
        with the other uploads that end within ``CLEAN_BATCH_WAIT``; False if
        the file changed meanwhile (it stays dirty).

        The first upload of a batch collects it: it waits, then commits every
        upload queued by then and wakes the others.  The wait is shielded, so
        that no task leaves while its file is in a batch (the task holds the
        file's CachedFile until the batch has run)."""
        self._uploaded.append(done)
        with trio.CancelScope(shield=True):
            if self._batch_committed is not None:  # another upload collects this batch
                committed = self._batch_committed
                await committed.wait()
            else:
                self._batch_committed = committed = trio.Event()
                try:
                    await trio.sleep(CLEAN_BATCH_WAIT)
                finally:
                    batch, self._uploaded = self._uploaded, []
                    self._batch_committed = None
                    try:
                        self._mark_clean(batch)
                    except BaseException:
                        for other in batch:
                            other.failed = other is not done
                        raise  # this task's entry is retried by ``run_entry``
                    finally:
                        committed.set()
        if done.failed:
            raise RuntimeError(f"the transaction that marks {done.key!r} clean failed")
        return done.marked

    def _mark_clean(self, batch: list[_Uploaded]) -> None:
        """In one transaction: every upload of ``batch`` whose file is still
        what was uploaded becomes clean, and its entry goes."""
        now = time.time()
        marked: list[_Uploaded] = []
        with self.journal.write() as w:
            for done in batch:
                if not done.unchanged():
                    continue
                cf, inode = done.cf, done.cf.inode
                ledger = w.tx.shadow_ledger(inode.ino)  # nearly always empty
                if ledger and stale_shadows(ledger, done.key.rstrip("/"), done.shadow):
                    done.stale_shadows = True  # dropped first (_mark_clean_unless_stale)
                    continue
                for blockno, rec in list(cf.blocks.items()):
                    if rec.dirty:
                        clean = BlockRecord(
                            tier=rec.tier, digest=done.digests.get(blockno, 0), nbytes=rec.nbytes
                        )
                        cf.blocks[blockno] = clean
                        w.tx.add_block(inode.ino, blockno, clean)
                        self.open_files.mark_verified(inode.ino, blockno)
                if cf.truncated_from is not None:
                    w.tx.drop_blocks_from(inode.ino, cf.truncated_from)
                inode.state = SyncState.CLEAN
                inode.etag = done.etag
                inode.origin_key = done.key
                inode.origin_size = done.size
                inode.validated_at = now
                w.tx.put_inode(inode)
                w.tx.mark_seen(inode)  # a listing running now may predate the object
                w.tx.clear_failed(inode.ino)  # every block it holds passed its check
                w.remove(done.seq)
                marked.append(done)
        for done in marked:
            done.marked = True
            self.block_writes.committed(done.cf)

    # --- other entries ----------------------------------------------------------------------------

    async def _run_copy(self, seq: int, entry: Entry) -> None:
        moved = self.linked_inode(entry["ino"])
        if moved is not None:  # provisional attributes never go up
            await self.listings.settle_provisional(moved, entry["src"])
        shadow = await self._put_shadow(entry["ino"], entry["dst"], moved)
        try:
            etag = await self._store_call(self.store.copy, entry["src"], entry["dst"])
        except ObjectNotFound:
            log.warning(
                "cannot move %r to %r: the source is gone from the bucket",
                entry["src"],
                entry["dst"],
            )
            self._finish(seq)
            return
        if moved is not None:
            await self._drop_shadows(entry["ino"], entry["dst"], shadow)
        with self.journal.write() as w:
            inode = self.linked_inode(entry["ino"])
            last_copy = self.journal.copies.get(entry["ino"], []) == [seq]
            if inode is not None and last_copy and inode.origin_key == entry["dst"]:
                inode.etag = etag  # a multipart copy has a new ETag
                w.tx.put_inode(inode)
                w.tx.mark_seen(inode)  # a listing running now may predate the copy
            w.remove(seq)

    async def _run_mkdir(self, seq: int, entry: Entry) -> None:
        inode = self.linked_inode(entry["ino"])
        if inode is not None:  # provisional attributes never go up
            await self.listings.settle_provisional(inode, entry["key"])
        metadata = object_metadata(inode) if inode is not None else None
        shadow = await self._put_shadow(entry["ino"], entry["key"], inode)
        await self._store_call(self.store.put, entry["key"], b"", metadata)
        if inode is not None:
            await self._drop_shadows(entry["ino"], entry["key"], shadow)
        with self.journal.write() as w:
            inode = self.linked_inode(entry["ino"])
            if (
                inode is not None
                and inode.is_dir
                and inode.state != SyncState.CLEAN
                and self.namespace.key_of(inode) + "/" == entry["key"]
            ):
                inode.state = SyncState.CLEAN
                w.tx.put_inode(inode)
                w.tx.mark_seen(inode)  # a listing running now may predate the marker
            w.remove(seq)

    async def _run_setmeta(self, seq: int, entry: Entry) -> None:
        """Rewrite the metadata of the object at the entry's key (pinned when
        it was queued; a later rename's copy carries the new metadata on)."""
        inode = self.linked_inode(entry["ino"])
        if inode is None or inode.state != SyncState.CLEAN:
            self._finish(seq)  # gone, or an upload carries the metadata instead
            return
        key = entry["key"]
        await self.listings.settle_provisional(inode, key)  # provisional attributes never go up
        shadow = await self._put_shadow(inode.ino, key, inode)
        try:
            etag = await self._store_call(self.store.copy, key, key, object_metadata(inode))
        except ObjectNotFound:
            log.warning("cannot update the metadata of %r: it is gone from the bucket", key)
            self._finish(seq)
            return
        await self._drop_shadows(inode.ino, key, shadow)
        with self.journal.write() as w:
            current = self.linked_inode(entry["ino"])
            if (
                current is not None
                and current.origin_key == key
                and current.ino not in self.journal.copies
            ):
                current.etag = etag
                w.tx.put_inode(current)
            w.remove(seq)

    # --- waiting for the bucket ---------------------------------------------------------------------

    async def wait_uploaded(self, ino: int) -> None:
        seq = self.journal.upload_seq.get(ino)
        if seq is not None:
            await self._wait_entries({seq})

    async def _wait_entries(self, seqs: set[int]) -> None:
        """Hurry ``seqs`` and wait for them; fail (not hang) if some keep failing.

        Only attempts of this wait count: failures from before it (an
        outage that is over by now) neither fail it nor delay it (their
        backoff is cut short), and the error it reports is that of its own
        last attempt.  An attempt already running when the wait begins
        started before it: its failure does not count either.  An entry is
        given up after ``flush_max_failures`` attempts of this wait, or at
        once when the bucket refused it for good (each refused entry gets
        one attempt of this wait first) or its file is damaged
        (``_refuse_upload``).  The wait goes on for the other entries
        (except those queued behind a given-up one on the same key, which
        cannot run) and then fails, naming each given-up entry.
        """
        journal = self.journal
        for seq in seqs & journal.refused.keys():
            journal.unrefuse(seq, due=0.0)  # the operator may have fixed the cause
        before = {s: journal.failures.get(s, 0) + (s in journal.running) for s in seqs}
        journal.hurry(seqs)
        open_since: float | None = None  # trio time this wait first saw the breaker open
        given_up: dict[int, str] = {}
        # A rename meanwhile may move an upload entry (``requeue_upload``):
        # the wait follows it to its new place.
        while pending := (seqs := journal.successors(seqs)) & journal.entries.keys():
            given_up = {s: why for s, why in given_up.items() if s in pending}
            for ino in self._upload_refused:
                seq = journal.upload_seq.get(ino)
                if seq in pending:  # a failed file: no attempt can succeed
                    given_up[seq] = journal.errors.get(seq, self.last_sync_error)
            for seq in pending & journal.refused.keys():
                if journal.failures.get(seq, 0) > before.get(seq, 0):  # refused again
                    given_up[seq] = journal.refused[seq]
                else:  # by an attempt that began before this wait: one of its own
                    journal.unrefuse(seq, due=0.0)
            if self.endpoint is not None and self.endpoint.is_open:
                # Attempts refused by the open breaker are not attempts of
                # this wait; give the prober FLUSH_OUTAGE_WAIT to see the
                # endpoint back, then fail with the outage, not a retry count.
                before.update({s: journal.failures.get(s, 0) for s in pending})
                now = trio.current_time()
                if open_since is None:
                    open_since = now
                elif now - open_since >= FLUSH_OUTAGE_WAIT:
                    raise EndpointUnreachable(self._outage_message(pending))
            else:
                open_since = None
            failed = {
                s
                for s in pending - given_up.keys()
                if journal.failures.get(s, 0) > before.get(s, 0)
            }
            for seq in failed:
                if journal.failures[seq] - before.get(seq, 0) >= self.flush_max_failures:
                    given_up[seq] = journal.errors.get(seq, self.last_sync_error)
            waiting = pending - given_up.keys()
            behind = self._queued_behind(given_up.keys(), waiting) if given_up else set()
            waiting -= behind
            if not waiting:
                raise StoreError(self._given_up_message(given_up, behind))
            journal.retry_sooner(failed - given_up.keys(), FLUSH_RETRY_WITHIN)
            with trio.move_on_after(1.0):
                await journal.wait_done(waiting)

    def _queued_behind(self, given_up: Iterable[int], waiting: set[int]) -> set[int]:
        """The entries of ``waiting`` that cannot run before a given-up entry
        does: queued after one on a shared key (or after such an entry)."""
        journal = self.journal
        stuck_keys: set[str] = set()
        behind: set[int] = set()
        for seq in sorted({*given_up, *waiting}):
            entry = journal.entries.get(seq)
            keys = set(self.entry_keys(seq, entry) or ()) if entry is not None else set()
            if seq in waiting:
                if seq in journal.running or stuck_keys.isdisjoint(keys):
                    continue
                behind.add(seq)
            stuck_keys |= keys
        return behind

    def _given_up_message(self, given_up: dict[int, str], behind: set[int]) -> str:
        """Why a flush fails: each given-up entry with its reason."""
        entries = self.journal.entries
        lines = [
            f"  {self.entry_subject(entries[seq])}: {reason}"
            for seq, reason in sorted(given_up.items())
            if seq in entries
        ]
        if behind:
            lines.append(f"  and {len(behind)} more change(s) queued behind them on the same keys")
        return (
            f"the bucket keeps refusing the writes of {len(given_up)} change(s); "
            "everything else is durable:\n" + "\n".join(lines)
        )

    def _outage_message(self, pending: set[int]) -> str:
        """Why a flush fails while the breaker is open: since when, what waits."""
        assert self.endpoint is not None
        snapshot = self.endpoint.snapshot()
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.since))
        entries = self.journal.entries
        files = sum(1 for s in pending if s in entries and entries[s].get("op") == "upload")
        return (
            f"endpoint {self.endpoint.endpoint} unreachable since {since} "
            f"(last error: {snapshot.last_error}); {files} file(s) waiting for upload, "
            f"{len(pending)} changes in all; they stay queued and go up when it is back"
        )

    async def flush_path(
        self,
        relpath: str,
        *,
        uid: int | None = None,
        writing: dict[int, set[int]] | None = None,
        wrote_by: Callable[[int], set[int]] | None = None,
    ) -> FlushOutcome:
        """Wait until everything under ``relpath`` is durable in the bucket.

        ``uid`` None (root, the daemon): every change under it.  A user's
        flush (``uid``) hurries only that user's changes: the entries of
        files it owns (as the mount shows them) or wrote (``wrote_by``: the
        uids that opened a file for writing), and those of no file (a delete
        of a removed name, a directory marker); and never a file another
        user's process still has open for writing (``writing``: ino -> the
        uids of its writable handles; it is not uploaded mid-write on
        someone else's request).  What it leaves is counted in the outcome,
        not named."""
        inode = await self.namespace.resolve(relpath)
        prefix = self.namespace.key_of(inode) if inode.ino != 1 else ""
        writing = writing or {}
        for cf in list(self.open_files.files.values()):
            if cf.inode.state != SyncState.CLEAN and (uid is None or cf.inode.uid == uid):
                await self.block_writes.commit(cf, sync=False)
        if not prefix:  # the whole mount: every entry, no keys to work out
            seqs = set(self.journal.entries)
        else:
            seqs = set()
            for seq, entry in list(self.journal.entries.items()):
                keys = self.entry_keys(seq, entry)
                if keys is None or any(k == prefix or k.startswith(prefix + "/") for k in keys):
                    seqs.add(seq)
        outcome = FlushOutcome()
        if uid is not None:
            seqs = self._users_entries(seqs, uid, writing, wrote_by or _nobody, outcome)
        await self._wait_entries(seqs)
        outcome.entries = len(seqs)
        return outcome

    def _users_entries(
        self,
        seqs: set[int],
        uid: int,
        writing: dict[int, set[int]],
        wrote_by: Callable[[int], set[int]],
        outcome: FlushOutcome,
    ) -> set[int]:
        """The entries of ``seqs`` a flush by ``uid`` may hurry (see ``flush_path``)."""
        shown_owner = self.access_uid  # an access point's fixed owner
        mine = set()
        for seq in seqs:
            entry = self.journal.entries.get(seq)
            ino = entry.get("ino") if entry is not None else None
            if ino is None:
                mine.add(seq)
                continue
            writers = writing.get(ino, set())
            if writers - {uid}:
                outcome.open_elsewhere += 1
                continue
            inode = self.open_files.live_inode(ino) or self.meta.get_inode(ino)
            owner = None if inode is None else shown_owner if shown_owner is not None else inode.uid
            if owner is not None and owner != uid and uid not in wrote_by(ino):
                outcome.others += 1
                continue
            mine.add(seq)
        return mine

    async def abort_stale_uploads(self, older_than: float = 24 * 3600) -> int:
        """At mount, before any upload starts: abort multipart uploads under
        our prefix that nobody will complete.

        Uploads recorded in the journal are aborted when their entry runs
        again; this catches older ones (a node whose state dir was lost, a
        writer that died).  Only uploads older than ``older_than`` seconds
        go: the prefix may be shared with other nodes' live uploads.
        """
        try:
            aborted = await self._store_call(
                abort_stale_uploads, self.store, time.time() - older_than
            )
        except StoreError as exc:
            log.warning("cannot clean up stale multipart uploads: %s", exc)
            return 0
        if aborted:
            log.info("aborted %d stale multipart uploads", aborted)
        return aborted
