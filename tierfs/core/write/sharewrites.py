"""Files this node uploaded, copied into the shared tier for the other nodes.

A checkpoint written on one node is read by every node of the next job.
Once its upload completed (``Sync`` marked the file clean with the ETag
the bucket returned), ``SharedWrites.uploaded`` queues it, and this
worker puts its blocks into the shared tier under that ETag, read from
the node's own copy: the other nodes then read it from the cluster, not
the bucket.  The bucket stays the durable copy; this is a cache fill.

Per queued file, in the worker (one file at a time, off the write path):

    the inode is still clean with that ETag and key --> its cached blocks
        are read through an ``UploadSource`` (each whole block checked
        against the digest its clean record carries) and put, one by one,
        under ``<ETag>/<block size>/<n>`` (``SharedTier.block_key``)
    anything else (changed, removed, renamed meanwhile) --> nothing

Invariants:

* Only bytes that match the uploaded object are put: each block read must
  match the digest recorded when the upload marked it clean; a block
  rewritten (or dropped) since fails that check and ends the file's copy
  (``BlockDamaged``).  Blocks the node no longer holds are skipped: their
  first reader fetches them from the bucket and puts them.
* Never on the writer's path: ``uploaded`` is O(1) on the loop; the queue
  is bounded (``QUEUE``) and a file that does not fit is skipped (counted
  as ``share_skipped``).
* ``share = false`` rules (``FilePolicies.shares``) keep a subtree
  out; symlinks are never copied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import trio

from tierfs.errors import BlockDamaged, TierfsError
from tierfs.meta import MetaDB, SyncState

from ..read.sharedtier import SharedTier
from ..state.openfiles import OpenFiles
from ..tiering.policies import FilePolicies
from .blockwrites import BlockWrites
from .upload_source import UploadSource

log = logging.getLogger(__name__)

#: Uploaded files waiting to be copied, at most.
QUEUE = 1024


class SharedWrites:
    """Copies uploaded files into the shared tier (module docstring)."""

    def __init__(
        self,
        shared: SharedTier,
        meta: MetaDB,
        open_files: OpenFiles,
        block_writes: BlockWrites,
        policies: FilePolicies,
    ) -> None:
        self.shared = shared
        self.meta = meta
        self.open_files = open_files
        self.block_writes = block_writes
        self.policies = policies
        self._send, self._receive = trio.open_memory_channel[tuple[int, str, str]](QUEUE)

    def uploaded(self, ino: int, key: str, etag: str) -> None:
        """On the loop: ``ino`` is in the bucket at ``key`` with ``etag``."""
        if not etag or not self.policies.shares(ino):
            return
        try:
            self._send.send_nowait((ino, key, etag))
        except trio.WouldBlock:
            self.shared.count(share_skipped=1)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for ino, key, etag in self._receive:
            try:
                await self._share(ino, key, etag)
            except TierfsError as exc:
                log.info("shared tier: %r not copied after its upload: %s", key, exc)

    async def _share(self, ino: int, key: str, etag: str) -> None:
        inode = self.meta.get_inode(ino)
        if inode is None or inode.state != SyncState.CLEAN or inode.etag != etag:
            return
        cf = self.open_files.acquire(inode)
        try:
            current = cf.inode
            if (
                current.state != SyncState.CLEAN
                or current.etag != etag
                or current.origin_key != key
            ):
                return
            source = self.block_writes.upload_source(cf, 1)
            blocks = sorted(b for b, (_digest, _n, dirty) in source.expected.items() if not dirty)
            try:
                copied = await trio.to_thread.run_sync(self._put_blocks, source, key, etag, blocks)
            finally:
                source.close()
        finally:
            self.open_files.release(cf)
        self.shared.count(files_shared=1 if copied == len(blocks) else 0)

    def _put_blocks(self, source: UploadSource, key: str, etag: str, blocks: list[int]) -> int:
        """Thread: put ``blocks`` of the file, ``PUT_THREADS`` at a time
        (``SharedTier.put_each``); how many were put."""
        size = self.shared.block_size

        def each_block() -> Iterator[tuple[str, bytes]]:
            for blockno in blocks:
                nbytes = min(size, source.size - blockno * size)
                shared_key = self.shared.block_key(key, etag, blockno)
                if nbytes <= 0 or shared_key is None:
                    continue
                try:
                    data = source.read(blockno * size, nbytes)
                except BlockDamaged:
                    log.info("shared tier: %r changed after its upload; not copied further", key)
                    return
                except OSError as exc:
                    log.info("shared tier: %r: reading block %d failed: %s", key, blockno, exc)
                    return
                yield shared_key, bytes(data)

        return self.shared.put_each(each_block())
