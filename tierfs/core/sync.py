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
   parallel parts; the upload id is written to the entry before any part;
4. back on the loop: if the file's content ``version`` did not change, it is
   still linked and still at the uploaded key, its blocks become clean with
   the digests computed while uploading, its origin becomes the new object
   and the entry is removed, in one transaction.  Otherwise the file stays
   dirty and the entry is tried again later: a file is marked clean only if
   it did not change during the upload.

Metadata travels as ``x-amz-meta-mode`` (decimal st_mode, as s3fs-fuse
writes it), ``uid``, ``gid`` and ``mtime`` (seconds, decimal).  Symlinks are
objects whose body is the target, with S_IFLNK in their mode (s3fs-style).
"""

from __future__ import annotations

import logging
import stat
import time
import traceback
from typing import TYPE_CHECKING, Any

import trio

from tierfs.errors import ObjectNotFound, StoreError, TierfsError
from tierfs.meta import BlockRecord, Inode, SyncState
from tierfs.store import abort_stale_uploads

from .journal import Entry

if TYPE_CHECKING:
    from .fs import TierFS

log = logging.getLogger(__name__)

RETRY_BASE = 1.0
RETRY_MAX = 60.0
#: The backoff doubles at most this often (2**failures overflowed a float
#: after ~1,000 failures: that exception stopped the uploader).
RETRY_DOUBLINGS = 16
#: While a flush waits for an entry that failed, it is retried this soon
#: (seconds) instead of after its backoff.
FLUSH_RETRY_WITHIN = 1.0


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


def object_metadata(inode: Inode) -> dict[str, str]:
    return {
        "mode": str(inode.mode),
        "uid": str(inode.uid),
        "gid": str(inode.gid),
        "mtime": f"{inode.mtime_ns / 1e9:.9f}",
    }


class SyncOps:
    """Mixed into TierFS; see the module docstring."""

    def entry_keys(self: TierFS, seq: int, entry: Entry) -> list[str] | None:
        """The keys an entry touches, for ordering; None if it is obsolete."""
        op = entry["op"]
        if op == "upload":
            if seq in self.journal.running and "running_key" in entry:
                # Even if the file was unlinked meanwhile: its PUT is on the
                # wire, and a later delete of that key must wait for it.
                return [entry["running_key"]]
            inode = self._linked_inode(entry["ino"])
            if inode is None:
                return None
            return [self.namespace.key_of(inode)]
        if op == "copy":
            return [entry["src"], entry["dst"]]
        return [entry["key"]]

    def _linked_inode(self: TierFS, ino: int) -> Inode | None:
        if ino in self._orphans:
            return None
        live = self.namespace.live_inode(ino)
        return live if live is not None else self.meta.get_inode(ino)

    async def run_entry(self: TierFS, seq: int) -> None:
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
                self._finish(seq)
            elif op == "mkdir":
                await self._run_mkdir(seq, entry)
            elif op == "setmeta":
                await self._run_setmeta(seq, entry)
            else:
                log.error("unknown journal entry %d: %r; dropping it", seq, entry)
                self._finish(seq)
        except (StoreError, TierfsError) as exc:
            failures = self.journal.failures.get(seq, 0)
            delay = min(RETRY_MAX, RETRY_BASE * 2 ** min(failures, RETRY_DOUBLINGS))
            self.last_sync_error = f"{entry['op']}: {exc}"
            log.warning(
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
            self.journal.running.discard(seq)
            self.journal.wake()

    async def _store_call(self: TierFS, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(
            lambda: fn(*args, **kwargs), limiter=self.store_limiter
        )

    def _finish(self: TierFS, seq: int) -> None:
        with self.journal.write() as w:
            w.remove(seq)

    # --- upload -----------------------------------------------------------------------------

    async def _run_upload(self: TierFS, seq: int, entry: Entry) -> None:
        ino = entry["ino"]
        if entry.get("upload_id"):
            # A multipart upload of an earlier attempt (or mount): abort it
            # first, whatever became of the file, so its parts never leak.
            await self._store_call(self.store.abort_upload, entry["upload_key"], entry["upload_id"])
            entry.pop("upload_id")
            entry.pop("upload_key")
            with self.meta.write() as tx:
                tx.journal_put(seq, entry)
        inode = self._linked_inode(ino)
        if inode is None or inode.state == SyncState.CLEAN:
            self._finish(seq)
            return
        key = self.namespace.key_of(inode)
        entry["running_key"] = key
        cf = self.blocks.acquire(inode)
        try:
            version = cf.version
            metadata = object_metadata(cf.inode)
            if stat.S_ISLNK(cf.inode.mode):
                etag = await self._store_call(
                    self.store.put, key, cf.inode.symlink_target, metadata
                )
                digests: dict[int, int] = {}
                size = len(cf.inode.symlink_target)
            else:
                await self.blocks.make_local(cf)
                if version != cf.version:
                    self.journal.retry_later(seq, self.config.write.upload_delay)
                    return
                source = self.blocks.upload_source(cf, self.upload_part_concurrency)
                size = source.size
                try:
                    etag = await trio.to_thread.run_sync(
                        lambda: self.store.put_multipart(
                            key,
                            size,
                            source.read,
                            metadata,
                            part_size=self._part_size(size),
                            concurrency=self.upload_part_concurrency,
                            on_upload_id=lambda upload_id: trio.from_thread.run_sync(
                                self._record_upload_id, seq, key, upload_id
                            ),
                        ),
                        limiter=self.upload_limiter,
                    )
                finally:
                    source.close()  # no part stays in memory, whatever happened
                digests = source.digests
            self.stats_uploaded_bytes += size
            current = self._linked_inode(ino)
            unchanged = (
                current is not None
                and version == cf.version
                and self.namespace.key_of(current) == key
                and seq in self.journal.entries
            )
            if not unchanged:
                log.info("%r changed during its upload; it stays dirty and goes up again", key)
                if ino not in self.journal.held:
                    self.journal.retry_later(seq, self.config.write.upload_delay)
                    self.journal.failures.pop(seq, None)
                return
            self._mark_clean(seq, cf, key, etag, size, digests)
        finally:
            self.blocks.release(cf)

    def _part_size(self: TierFS, size: int) -> int:
        """Parts are whole blocks, at least ``[write] part_size``, and 10,000
        of them hold the file."""
        bs = self.config.fetch.block_size
        part = max(self.config.write.part_size, -(-size // 10_000))
        return -(-part // bs) * bs

    def _record_upload_id(self: TierFS, seq: int, key: str, upload_id: str) -> None:
        entry = self.journal.entries.get(seq)
        if entry is None:
            return
        entry["upload_id"] = upload_id
        entry["upload_key"] = key
        with self.meta.write() as tx:
            tx.journal_put(seq, {k: v for k, v in entry.items() if k != "running_key"})

    def _mark_clean(
        self: TierFS, seq: int, cf: Any, key: str, etag: str, size: int, digests: dict[int, int]
    ) -> None:
        inode = cf.inode
        with self.journal.write() as w:
            for blockno, rec in list(cf.blocks.items()):
                if rec.dirty:
                    clean = BlockRecord(
                        tier=rec.tier, digest=digests.get(blockno, 0), nbytes=rec.nbytes
                    )
                    cf.blocks[blockno] = clean
                    w.tx.add_block(inode.ino, blockno, clean)
                    self.blocks.mark_verified(inode.ino, blockno)
            if cf.truncated_from is not None:
                w.tx.drop_blocks_from(inode.ino, cf.truncated_from)
            inode.state = SyncState.CLEAN
            inode.etag = etag
            inode.origin_key = key
            inode.origin_size = size
            inode.validated_at = time.time()
            w.tx.put_inode(inode)
            w.remove(seq)
        self.blocks.committed(cf)

    # --- other entries ----------------------------------------------------------------------------

    async def _run_copy(self: TierFS, seq: int, entry: Entry) -> None:
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
        with self.journal.write() as w:
            inode = self._linked_inode(entry["ino"])
            last_copy = self.journal.copies.get(entry["ino"], []) == [seq]
            if inode is not None and last_copy and inode.origin_key == entry["dst"]:
                inode.etag = etag  # a multipart copy has a new ETag
                w.tx.put_inode(inode)
            w.remove(seq)

    async def _run_mkdir(self: TierFS, seq: int, entry: Entry) -> None:
        inode = self._linked_inode(entry["ino"])
        metadata = object_metadata(inode) if inode is not None else None
        await self._store_call(self.store.put, entry["key"], b"", metadata)
        with self.journal.write() as w:
            inode = self._linked_inode(entry["ino"])
            if (
                inode is not None
                and inode.is_dir
                and inode.state != SyncState.CLEAN
                and self.namespace.key_of(inode) + "/" == entry["key"]
            ):
                inode.state = SyncState.CLEAN
                w.tx.put_inode(inode)
            w.remove(seq)

    async def _run_setmeta(self: TierFS, seq: int, entry: Entry) -> None:
        """Rewrite the metadata of the object at the entry's key (pinned when
        it was queued; a later rename's copy carries the new metadata on)."""
        inode = self._linked_inode(entry["ino"])
        if inode is None or inode.state != SyncState.CLEAN:
            self._finish(seq)  # gone, or an upload carries the metadata instead
            return
        key = entry["key"]
        try:
            etag = await self._store_call(self.store.copy, key, key, object_metadata(inode))
        except ObjectNotFound:
            log.warning("cannot update the metadata of %r: it is gone from the bucket", key)
            self._finish(seq)
            return
        with self.journal.write() as w:
            current = self._linked_inode(entry["ino"])
            if (
                current is not None
                and current.origin_key == key
                and current.ino not in self.journal.copies
            ):
                current.etag = etag
                w.tx.put_inode(current)
            w.remove(seq)

    # --- waiting for the bucket ---------------------------------------------------------------------

    async def wait_uploaded(self: TierFS, ino: int) -> None:
        seq = self.journal.upload_seq.get(ino)
        if seq is not None:
            await self._wait_entries({seq})

    async def _wait_entries(self: TierFS, seqs: set[int]) -> None:
        """Hurry ``seqs`` and wait for them; fail (not hang) if they keep failing.

        Only attempts of this wait count: failures from before it (an
        outage that is over by now) neither fail it nor delay it (their
        backoff is cut short), and the error it reports is that of its own
        last attempt.  An attempt already running when the wait begins
        started before it: its failure does not count either.
        """
        journal = self.journal
        before = {s: journal.failures.get(s, 0) + (s in journal.running) for s in seqs}
        journal.hurry(seqs)
        while pending := seqs & journal.entries.keys():
            failed = {s for s in pending if journal.failures.get(s, 0) > before[s]}
            for seq in failed:
                if journal.failures[seq] - before[seq] >= self.flush_max_failures:
                    error = journal.errors.get(seq, self.last_sync_error)
                    raise StoreError(f"the bucket keeps refusing the writes: {error}")
            journal.retry_sooner(failed, FLUSH_RETRY_WITHIN)
            with trio.move_on_after(1.0):
                await journal.wait_done(seqs)

    async def flush_path(self: TierFS, relpath: str) -> int:
        """Wait until everything under ``relpath`` is durable in the bucket;
        returns the number of journal entries waited for."""
        inode = await self.namespace.resolve(relpath)
        prefix = self.namespace.key_of(inode) if inode.ino != 1 else ""
        for cf in list(self.blocks.files.values()):
            if cf.inode.state != SyncState.CLEAN:
                await self._commit(cf, sync=False)
        seqs: set[int] = set()
        for seq, entry in list(self.journal.entries.items()):
            keys = self.entry_keys(seq, entry)
            if (
                keys is None
                or not prefix
                or any(k == prefix or k.startswith(prefix + "/") for k in keys)
            ):
                seqs.add(seq)
        await self._wait_entries(seqs)
        return len(seqs)

    async def abort_stale_uploads(self: TierFS, older_than: float = 24 * 3600) -> int:
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
