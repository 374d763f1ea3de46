"""Handing a warm file's tier file to a reader (``tierfs.client.open``).

``HandOut.hand_out(relpath, caller, connection)`` answers one request of a
reader outside the daemon: either a read-only descriptor of the file's one
tier file, with the file's size and a lease (``Handed``), or why not
(``NotHanded``: the reader then opens the path through the mount, which
serves it as it serves everyone).  The answer is the one an open through
the mount would give the same user at the same moment:

* rights: ``Permissions.readable``, search on every directory down the
  path and read on the file, as the kernel decides it (``default_permissions``
  with the attributes the mount shows);
* version: the name is looked up as the kernel's lookup would be
  (``list_ttl``), and a file whose ETag is older than ``revalidate_ttl``
  is revalidated first (one HEAD), as ``TierFS.open`` does; a changed
  object drops the cached blocks, so it is not handed out;
* only bytes that need nothing from the daemon: the file is CLEAN (nothing
  written here waits for the bucket), no handle has it open for writing,
  no write or truncate is in flight, and every block is present, clean,
  on ONE local tier.  Blocks not checked in this mount are checked now
  (``BlockCache.ensure``, xxh3 against the record, in threads), as the
  first read through the mount would; a damaged one is dropped and the
  file is not handed out.

Then the tier file is opened read-only (``Tier.open_for_reader``; one
longer than the file, whose tail would be readable with the raw
descriptor, is not handed out), a lease
is taken (``tierfs.core.state.leases``: what keeps its bytes from changing
under the reader), and the open counts as an open through the mount does
for the lifecycle and the prefetcher: an S3-FIFO access and the access time
(``SpaceManager.opened``, ``AccessTimes``) and the open observers
(``Handles.open_observers``: a prefetch order's cursor, the directory
readahead).  No reply names a tier path (``/proc/PID/fd`` shows the tier
file's name to its holder; it lies in the tier's ``data/``, mode 0700, so
the name opens nothing).

Not handed out (the reader goes through the mount): a file with any block
absent (cold, partly fetched, or larger than what its tiers hold), with
blocks on two tiers, empty, dirty or being written, or when a bound of
``ReaderLeases`` is reached.  All of this runs on the trio loop, except the
checks and the open, which are a thread hop (``BlockCache``) and one
``open`` + ``fstat``.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tierfs.errors import TierfsError
from tierfs.meta import BlockRecord, Inode, MetaDB, SyncState

from ..names.access import Caller, Permissions
from ..names.namespace import Namespace
from ..names.posix_attrs import AccessTimes
from ..state.journal import Journal
from ..state.openfiles import OpenFiles
from ..state.space import SpaceManager
from .blockcache import BlockCache
from .handles import Handles


@dataclass(frozen=True, slots=True)
class Handed:
    """A tier file handed out: the reader owns ``fd`` from now on."""

    fd: int
    size: int
    lease: int
    ino: int
    #: The ETag of the version handed out (a reader may check it).
    etag: str = ""


@dataclass(frozen=True, slots=True)
class NotHanded:
    why: str


class HandOut:
    """See the module docstring."""

    def __init__(
        self,
        meta: MetaDB,
        namespace: Namespace,
        permissions: Permissions,
        journal: Journal,
        open_files: OpenFiles,
        blocks: BlockCache,
        handles: Handles,
        space: SpaceManager,
        access_times: AccessTimes,
        *,
        block_size: int,
        revalidation_expired: Callable[[Inode], bool],
        invalidate_kernel_cache: Callable[[int, bool], Awaitable[None]],
    ) -> None:
        self.meta = meta
        self.namespace = namespace
        self.permissions = permissions
        self.journal = journal
        self.open_files = open_files
        self.leases = open_files.leases
        self.blocks = blocks
        self.handles = handles
        self.space = space
        self.access_times = access_times
        self.block_size = block_size
        self.revalidation_expired = revalidation_expired
        self.invalidate_kernel_cache = invalidate_kernel_cache

    async def hand_out(self, relpath: str, caller: Caller, connection: int) -> Handed | NotHanded:
        """The tier file of ``relpath`` for ``caller`` (see the module
        docstring).  A path the caller may not reach raises the error an
        open would (``PermissionDenied``, ``NotFound``...)."""
        inode = await self.permissions.readable(relpath, caller)
        return await self._hand_out_inode(inode, caller, connection)

    async def hand_out_ahead(
        self,
        inos: list[int],
        caller: Caller,
        connection: int,
        searchable: dict[int, bool] | None = None,
    ) -> list[tuple[str, Handed]]:
        """The files ``inos`` (a prefetch order's next files, for a reader
        that will open them soon) that can be handed out to ``caller``,
        with their paths; the others are left out.  Rights are checked
        from each file up to the root (``Permissions.readable_inode``; the
        caller may keep ``searchable``, the answers per directory, for a
        short while), the rest as for ``hand_out``."""
        if searchable is None:
            searchable = {}
        handed: list[tuple[str, Handed]] = []
        for ino in inos:
            try:
                inode = self.permissions.readable_inode(ino, caller, searchable)
                outcome = await self._hand_out_inode(inode, caller, connection)
                if isinstance(outcome, Handed):
                    handed.append((self.namespace.key_of(inode), outcome))
            except TierfsError:
                continue
        return handed

    async def _hand_out_inode(
        self, inode: Inode, caller: Caller, connection: int
    ) -> Handed | NotHanded:
        if not inode.is_file:
            return NotHanded("not a regular file")
        if not self.open_files.is_busy(inode.ino) and self.revalidation_expired(inode):
            inode, changed = await self.namespace.revalidate(inode)
            if changed:
                await self.invalidate_kernel_cache(inode.ino, False)
        place = self._one_tier(inode)
        if isinstance(place, NotHanded):
            return place
        tier, unchecked = place
        if unchecked:
            cf = self.open_files.acquire(inode)
            try:
                await self.blocks.ensure(cf, unchecked)
            finally:
                self.open_files.release(cf)
            inode = self.open_files.live_inode(inode.ino) or self.namespace.get(inode.ino)
            place = self._one_tier(inode)  # the loop ran meanwhile: look again
            if isinstance(place, NotHanded):
                return place
            tier, unchecked = place
            if unchecked:
                return NotHanded("its blocks changed while they were checked")
        refused = self.leases.refusal(caller.uid, connection, tier)
        if refused is not None:
            self.leases.refused += 1
            return NotHanded(refused)
        opened = self.open_files.tiers[tier].open_for_reader(inode.ino)
        if opened is None:
            return NotHanded("its tier file is gone")
        fd, st = opened
        if st.st_size > inode.size:
            # Bytes past the file's end (an older, longer content) would be
            # readable with the raw descriptor: never handed out.
            os.close(fd)
            return NotHanded("its tier file is longer than the file")
        lease = self.leases.take(
            tier, inode.ino, st.st_ino, st.st_blocks * 512, caller.uid, connection
        )
        self.space.opened(inode.ino)
        self.access_times.accessed(inode)
        for observer in self.handles.open_observers:
            observer(inode.ino)
        return Handed(fd, inode.size, lease.ident, inode.ino, inode.etag)

    def _one_tier(self, inode: Inode) -> tuple[int, list[int]] | NotHanded:
        """The tier that holds every block of the file, and the blocks not
        checked in this mount yet; or why the file cannot be handed out."""
        ino = inode.ino
        if inode.size == 0:
            return NotHanded("empty")
        if inode.state != SyncState.CLEAN or self.journal.pending_upload(ino):
            return NotHanded("it has changes not in the bucket yet")
        if self.handles.open_for_writing(ino):
            return NotHanded("it is open for writing")
        cf = self.open_files.files.get(ino)
        count = -(-inode.size // self.block_size)
        if cf is None:
            # Not in use: LMDB's per-tier bytes say where it is (a CLEAN
            # file has only clean blocks: an upload marks them clean and
            # the file CLEAN in one transaction), without decoding its
            # block map.
            residency = self.meta.residency(ino)
            if len(residency) != 1:
                if not residency or sum(residency.values()) < inode.size:
                    return NotHanded("not all of it is on a local tier")
                return NotHanded("its blocks are on two tiers")
            ((tier, nbytes),) = residency.items()
            if nbytes < inode.size:
                return NotHanded("not all of it is on a local tier")
            verified = self.open_files.verified
            return tier, [b for b in range(count) if not verified(ino, b)]
        if (
            cf.uncommitted
            or cf.writing
            or cf.transient
            or cf.inode_dirty
            or cf.unsharing is not None
            or cf.truncated_from is not None
        ):
            return NotHanded("it is being changed")
        blocks: dict[int, BlockRecord] = cf.blocks
        if len(blocks) < count:
            return NotHanded("not all of it is on a local tier")
        tiers: set[int] = set()
        unchecked: list[int] = []
        for blockno in range(count):
            rec = blocks.get(blockno)
            if rec is None:
                return NotHanded("not all of it is on a local tier")
            if rec.dirty:
                return NotHanded("it has changes not in the bucket yet")
            tiers.add(rec.tier)
            if not self.open_files.verified(ino, blockno):
                unchecked.append(blockno)
        if len(tiers) != 1:
            return NotHanded("its blocks are on two tiers")
        return tiers.pop(), unchecked
