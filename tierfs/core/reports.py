"""What ``tierfs status``, ``tierfs where`` and ``statfs`` show.

``Reports`` only reads: it gathers the figures each part keeps (the tiers'
usage from LMDB, the read counters of the open-file table, the bucket side
from ``Sync``, the mover from ``Lifecycle``, the workers from the
supervisor) into the plain JSON replies of the control server, and into
``statfs`` for the kernel.  It changes no state and awaits only to resolve
or walk a path (``where``).

Extra sections (``status_sections``): a worker that runs for a while (the
prefetcher, the directory readahead) or the daemon's metrics attach a
function returning plain JSON data under a name; it is called on the trio
loop at each ``status``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tierfs.meta import Inode, MetaDB, SyncState
from tierfs.store import ObjectStore
from tierfs.tiers import Tier

from .names.namereads import NameReads
from .names.namespace import Namespace
from .names.quotas import Quotas
from .read.fetcher import Fetcher
from .read.sharedtier import SharedTier
from .state.journal import Journal
from .state.openfiles import OpenFiles
from .state.results import FsStats
from .state.space import SpaceManager
from .state.supervisor import Supervisor
from .tiering.lifecycle import Lifecycle
from .tiering.movement import DataMovement
from .tiering.policies import FilePolicies
from .write.damage import DamageLog
from .write.sync import Sync


@dataclass(eq=False, kw_only=True)
class Reports:
    """The status, ``where`` and statfs replies (see the module docstring)."""

    block_size: int
    store: ObjectStore
    tiers: list[Tier]
    meta: MetaDB
    journal: Journal
    supervisor: Supervisor
    open_files: OpenFiles
    namespace: Namespace
    names: NameReads
    damage: DamageLog
    policies: FilePolicies
    space: SpaceManager
    fetcher: Fetcher
    sync: Sync
    movement: DataMovement
    lifecycle: Lifecycle
    quotas: Quotas
    shared_tier: SharedTier | None = None
    #: Extra sections of ``status()``: name -> a function returning plain
    #: JSON data, called on the trio loop at each ``status``.
    status_sections: dict[str, Callable[[], object]] = field(default_factory=dict)

    def statfs(self) -> FsStats:
        total = free = 0
        for tier in self.tiers:
            cap = tier.capacity
            total += cap
            free += tier.usable_bytes(self.space.used(tier.index))
        return FsStats(
            block_size=self.block_size,
            total_bytes=total,
            free_bytes=free,
            files=sum(self.meta.tier_usage(t.index).files for t in self.tiers),
        )

    async def where(
        self, relpath: str, *, enter: Callable[[Inode, str], bool] | None = None
    ) -> dict[str, object]:
        """One file's figures, or a directory's totals (``enter``: which
        directories of it to count, as ``Namespace.walk``; the others are
        counted in ``dirs_not_listed``)."""
        inode = await self.namespace.resolve(relpath)
        if inode.is_dir:
            return await self._where_tree(inode, relpath, enter)
        residency = self.meta.residency(inode.ino)
        pin = self.policies.pinned_tier(inode.ino)
        open_file = self.open_files.files.get(inode.ino)
        damaged = self.meta.failed_blocks(inode.ino)
        refused = self.sync.refusal_of(inode.ino)
        if damaged or refused:
            state = "failed"
        elif self.journal.uploading(inode.ino):
            state = "uploading"
        else:
            state = "clean" if inode.state == SyncState.CLEAN else "dirty"
        bs = self.block_size
        blocks = self.meta.get_blocks(inode.ino)
        return {
            "path": relpath,
            "type": "file",
            "size": inode.size,
            "cached_bytes": sum(residency.values()),
            "blocks_total": (inode.size + bs - 1) // bs,
            "blocks_cached": len(blocks),
            "tiers": {t.name: residency.get(t.index, 0) for t in self.tiers},
            "state": state,
            "damaged_blocks": damaged,
            "failed_reason": refused
            or (f"{len(damaged)} damaged block(s) of local changes" if damaged else None),
            "pinned": pin is not None,
            "pin_tier": self.tiers[pin].name if pin is not None else None,
            "fetching_blocks": len(open_file.flights) if open_file else 0,
        }

    async def _where_tree(
        self, top: Inode, relpath: str, enter: Callable[[Inode, str], bool] | None
    ) -> dict[str, object]:
        """``where`` of a directory: the totals of its subtree (listed from
        the bucket where this node has no fresh listing).  Dirty bytes count
        whole files, as ``status`` does."""
        per_tier = [0] * len(self.tiers)
        files = size = dirty_files = dirty = pinned = failed = not_listed = 0

        def counted(inode: Inode, path: str) -> bool:
            nonlocal not_listed
            if enter is None or enter(inode, path):
                return True
            not_listed += 1
            return False

        walk = self.namespace.walk(relpath, list_dirs=True, top=top, enter=counted)
        async for inode, _path in walk:
            files += 1
            size += inode.size
            for tier, nbytes in self.meta.residency(inode.ino).items():
                per_tier[tier] += nbytes
            if inode.state != SyncState.CLEAN or self.journal.pending_upload(inode.ino):
                dirty_files += 1
                dirty += inode.size
            if self.policies.pinned_tier(inode.ino) is not None:
                pinned += 1
            if self.meta.failed_blocks(inode.ino) or self.sync.refusal_of(inode.ino):
                failed += 1
        return {
            "path": relpath,
            "type": "directory",
            "files": files,
            "size": size,
            "cached_bytes": sum(per_tier),
            "tiers": {t.name: per_tier[t.index] for t in self.tiers},
            "state": "failed" if failed else ("dirty" if dirty_files else "clean"),
            "dirty_files": dirty_files,
            "dirty_bytes": dirty,
            "pinned_files": pinned,
            "failed_files": failed,
            "dirs_not_listed": not_listed,
        }

    def status(self, *, sections: bool = True) -> dict[str, object]:
        """What ``tierfs status`` shows; ``sections=False`` leaves out the
        ``status_sections`` (the metrics collector reads those itself)."""
        tiers = []
        for tier in self.tiers:
            usage = self.meta.tier_usage(tier.index)
            cap = tier.capacity
            tiers.append(
                {
                    "name": tier.name,
                    "path": str(tier.path),
                    "capacity": cap,
                    "used": usage.bytes,
                    "files": usage.files,
                    "used_ratio": usage.bytes / cap if cap else 0.0,
                    "high_watermark": tier.high_watermark,
                    "low_watermark": tier.low_watermark,
                    "hit_blocks": self.open_files.stats.tier_hit_blocks[tier.index],
                }
            )
        stats = self.open_files.stats
        lookups = stats.hit_blocks + stats.miss_blocks
        return {
            "backing": self.store.url,
            "block_size": self.block_size,
            "tiers": tiers,
            "dirty_bytes": self.sync.dirty_bytes(),
            "pending_uploads": len(self.journal),
            "uploading": len(self.journal.running),
            "last_sync_error": self.sync.last_sync_error,
            "endpoint": self.sync.endpoint_report(),
            "failed_files": len(self.meta.failed_files()) + len(self.journal.refused),
            "failed": self.sync.refused_files(),
            "worker_restarts": self.supervisor.restarts,
            "workers": self.supervisor.status(),
            "shared_tier": self.shared_tier.status() if self.shared_tier is not None else None,
            "quotas": self.quotas.status(),
            "hit_ratio": stats.hit_blocks / lookups if lookups else None,
            "open_files": len(self.open_files.files),
            "queues": self._queue_depths(),
            "counters": {
                "read_requests": stats.read_requests,
                "read_bytes": stats.read_bytes,
                "hit_blocks": stats.hit_blocks,
                "miss_blocks": stats.miss_blocks,
                "fetched_bytes": stats.fetched_bytes,
                "gets": stats.gets,
                "verify_failures": stats.verify_failures,
                "uncached_blocks": stats.uncached_blocks,
                "fetch_buffers_mapped": self.fetcher.buffers.created,
                "fetch_buffers_dropped_in_use": self.fetcher.buffers.dropped_in_use,
                "evicted_files": self.space.evicted_files,
                "evicted_bytes": self.space.evicted_bytes,
                "listings": self.namespace.listings.listings_done,
                "uploaded_bytes": self.sync.stats_uploaded_bytes,
                "relocated_bytes": self.movement.relocated_bytes,
                "stale_opens": self.namespace.stale_opens,
                "damaged_dirty_blocks": self.damage.dirty_blocks,
                "damaged_clean_blocks": self.damage.clean_blocks,
                "readdir_entries": self.names.readdir_entries,
            },
            # Requests sent to the bucket per S3 operation (stores that count).
            "store_calls": dict(getattr(self.store, "calls", {})),
            **{name: section() for name, section in self.status_sections.items() if sections},
            "time": time.time(),
        }

    def _queue_depths(self) -> dict[str, int]:
        """Work waiting or running now: journal entries owed to the bucket,
        files queued for promotion, blocks being fetched."""
        return {
            "journal_entries": len(self.journal),
            "uploads_running": len(self.journal.running),
            "promotions_queued": self.policies.promotion_send.statistics().current_buffer_used,
            "fetches_in_flight": sum(len(cf.flights) for cf in self.open_files.files.values()),
        }
