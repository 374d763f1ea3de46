"""The core's upkeep: group commits, housekeeping, orphaned cache files.

Three tasks, started by ``Upkeep.start`` under the supervisor (a failure
restarts the task, except the group commit's, which ends the daemon):

* ``commit``: batches metadata commits (MetaDB "Group commit"): at most
  ``COMMIT_INTERVAL`` after the first write since the last commit, and no
  wake-up at all while nothing is written.
* ``housekeeping``: every ``HOUSEKEEPING_INTERVAL`` seconds, write access
  times back and unmap idle fetch buffers.
* ``orphan_cleanup``: once, at mount, delete cache files that no block
  record refers to.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from tierfs.meta import MetaDB
from tierfs.tiers import Tier

from .names.posix_attrs import AccessTimes
from .state.buffers import BlockBuffers
from .state.openfiles import OpenFiles
from .state.space import SpaceManager
from .state.supervisor import FatalWorkerError, Supervisor

log = logging.getLogger(__name__)

#: Metadata written since the last commit is at most this old (see MetaDB,
#: "Group commit"): what a killed daemon can lose of writes not fsynced.
COMMIT_INTERVAL = 0.2
#: Seconds between two writes of access times back to LMDB.
HOUSEKEEPING_INTERVAL = 5.0


@dataclass(eq=False)
class Upkeep:
    """The core's periodic tasks (see the module docstring)."""

    meta: MetaDB
    tiers: list[Tier]
    open_files: OpenFiles
    space: SpaceManager
    access_times: AccessTimes
    fetch_buffers: BlockBuffers

    def start(self, nursery: trio.Nursery, supervisor: Supervisor) -> None:
        supervisor.start_soon(nursery, "housekeeping", self._housekeep_periodically)
        supervisor.start_soon(nursery, "commit", self._commit_periodically)
        supervisor.start_soon(nursery, "orphan_cleanup", self._remove_orphan_cache_files)

    def flush(self) -> None:
        """Write what is kept in memory back to LMDB (at unmount)."""
        self.space.flush_atimes()
        self.access_times.flush()

    async def _commit_periodically(self) -> None:
        """Batch metadata commits while the workers run (MetaDB "Group commit").

        A failed commit ends the daemon (``FatalWorkerError``, the one
        failure the supervisor does not restart): LMDB has dropped the group,
        so the in-memory state (journal, caches) is ahead of the metadata on
        disk, and only a restart from disk makes them agree again.  The disk
        holds the last commit, as after a crash, and the next mount goes on
        from there.  Any other failure of this loop restarts it; meanwhile
        (``group_commit`` off) every write transaction commits by itself.

        With nothing written since the last commit it sleeps until the next
        write (``MetaDB.on_first_uncommitted``), then commits
        ``COMMIT_INTERVAL`` later, as often as before while writes go on:
        it used to wake five times a second on an idle mount (a third of an
        idle daemon's wake-ups, counted with a trio instrument).
        """
        written = trio.Event()

        def first_write() -> None:
            written.set()

        self.meta.group_commit = True
        self.meta.on_first_uncommitted = first_write
        try:
            while True:
                if not self.meta.uncommitted:
                    written = trio.Event()
                    await written.wait()
                await trio.sleep(COMMIT_INTERVAL)
                if self.meta.uncommitted:
                    try:
                        self.meta.commit()
                    except Exception as exc:
                        raise FatalWorkerError(f"metadata group commit failed: {exc}") from exc
        finally:
            self.meta.on_first_uncommitted = None
            self.meta.group_commit = False

    async def _housekeep_periodically(self) -> None:
        """Every few seconds: write access times back, unmap idle fetch buffers."""
        while True:
            await trio.sleep(HOUSEKEEPING_INTERVAL)
            self.flush()
            self.fetch_buffers.trim()

    async def _remove_orphan_cache_files(self) -> None:
        """Delete cache files that no block record refers to.

        They are left by a crash between dropping blocks in LMDB and deleting
        the file (eviction, a changed object), or by a relocate: the copy on
        the destination before the switch, the source after it (see
        ``movement``, "Crash safety").  A file with any block recorded on
        its tier is kept.  Runs once, at mount.
        """
        removed = 0
        for tier in self.tiers:
            inos = await trio.to_thread.run_sync(tier.iter_cached_inodes)
            for ino in inos:
                if tier.index not in self.meta.residency(ino) and not self.open_files.is_busy(ino):
                    tier.remove_file(ino)
                    removed += 1
        if removed:
            log.info("removed %d orphaned cache files", removed)
