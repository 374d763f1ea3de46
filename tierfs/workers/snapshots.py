"""The snapshot worker: ``tierfs snapshot create|list|show|diff|delete``.

Every operation reads or writes the record in the bucket
(``tierfs.snapshot``) through the mount's store, in a thread (each is a
walk or a read of many objects); the control server's handlers call the
methods here and shape nothing else.

Jobs: a create or a diff is a ``SnapshotJob`` run in the worker's nursery,
not in the connection that asked for it; the connection follows its
progress and sets ``stop`` when the client goes away, which ends the
job's thread at its next object.  A create that ends early (stopped, a
refusal, a store error, a killed daemon) leaves no snapshot, since its
manifest is written last, and what it wrote is deleted at once (a killed
daemon's leftovers are named by ``snapshot list``'s ``leftovers`` and go
with ``snapshot delete``).

Who may do what (every request is hostile input):

- **create**: the caller must be able to read every path named (search
  down to it, read on it: ``Permissions.readable``), and everything below
  it, as the mount shows it: every directory recorded readable and
  searchable, every file readable, by its stored attributes or the mount's
  defaults.  The first one that is not refuses the whole snapshot
  (``PermissionDenied`` naming it), and nothing is left.
- **list**, **show**: every user; a snapshot's paths are shown to its
  creator and root only, the others see how many.
- **diff**: the creator (of both snapshots) or root: it names objects.
- **delete**: the creator or root.

Bounds: an ordinary user runs one job at a time (any of these operations:
each reads the bucket), and at most ``MAX_JOBS`` run in all; a diff returns at most ``MAX_DIFF_NAMES``
names per kind of change, with the counts of all.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from tierfs.config import NamespaceConfig
from tierfs.core.names.access import READ, SEARCH, Caller, Permissions, permits
from tierfs.core.names.shadow import ShadowPlace
from tierfs.errors import (
    Busy,
    InvalidArgument,
    PermissionDenied,
    ReadOnly,
    TierfsError,
    describe,
)
from tierfs.meta import Inode
from tierfs.snapshot.check import gone_versions
from tierfs.snapshot.diff import diff_entries
from tierfs.snapshot.record import (
    Manifest,
    RecordStore,
    SnapshotEntry,
    SnapshotNotFound,
    check_name,
)
from tierfs.snapshot.walk import normalised_paths, take_snapshot, walk_entries
from tierfs.store import ObjectStore

log = logging.getLogger(__name__)

#: Snapshot jobs (creates and diffs) running at once, all users together.
MAX_JOBS = 4
#: Names a diff returns per kind of change (the counts are of all).
MAX_DIFF_NAMES = 1000
#: Finished jobs kept for ``status``.
KEPT_FINISHED = 8


class Stopped(TierfsError):
    """A job's client went away (or the daemon stops): the job ends."""


@dataclass
class SnapshotJob:
    """One create or diff, as ``status`` and the progress events show it."""

    id: str
    kind: str
    name: str
    owner: int
    paths: list[str]
    started: float = field(default_factory=time.time)
    state: str = "running"
    objects: int = 0
    bytes: int = 0
    error: str | None = None
    result: dict[str, Any] | None = None
    done: trio.Event = field(default_factory=trio.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "owner": self.owner,
            "state": self.state,
            "objects": self.objects,
            "bytes": self.bytes,
            "seconds": round(time.time() - self.started, 3),
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True, slots=True)
class ShownAttrs:
    """What the mount shows an object without stored attributes: its
    modes and owner (``[namespace]``), and an access point's fixed owner."""

    file_mode: int
    dir_mode: int
    uid: int
    gid: int
    fixed_uid: int | None = None
    fixed_gid: int | None = None

    @classmethod
    def of(
        cls,
        namespace: NamespaceConfig,
        default_uid: int,
        default_gid: int,
        fixed_uid: int | None,
        fixed_gid: int | None,
    ) -> ShownAttrs:
        return cls(
            namespace.file_mode,
            namespace.dir_mode,
            namespace.uid if namespace.uid is not None else default_uid,
            namespace.gid if namespace.gid is not None else default_gid,
            fixed_uid,
            fixed_gid,
        )

    def readable(self, entry: SnapshotEntry, caller: Caller) -> bool:
        is_dir = entry.key.endswith("/")
        mode = (
            entry.mode if entry.mode is not None else (self.dir_mode if is_dir else self.file_mode)
        )
        inode = Inode(
            0,
            mode & 0o7777,
            entry.uid if entry.uid is not None else self.uid,
            entry.gid if entry.gid is not None else self.gid,
            0,
            0,
            0,
            0,
            b"",
        )
        want = READ | SEARCH if is_dir else READ
        return permits(inode, caller, want, uid=self.fixed_uid, gid=self.fixed_gid)


class Snapshots:
    """The snapshots of one mount's bucket (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        permissions: Permissions,
        shown: ShownAttrs,
        limiter: trio.CapacityLimiter,
        *,
        shadows: ShadowPlace | None = None,
        mounted: str | None = None,
    ) -> None:
        """``shadows``: where the mount's attribute shadow is (None:
        ``store``'s own); ``mounted``: the snapshot this daemon mounts (it
        creates none)."""
        self.shadows = shadows
        self.mounted = mounted
        self.store = store
        self.records = RecordStore(store)
        self.permissions = permissions
        self.shown = shown
        self.limiter = limiter
        self.jobs: dict[str, SnapshotJob] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery jobs run in, until the daemon stops."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for job in self.jobs.values():
                job.stop.set()

    def status(self) -> list[dict[str, Any]]:
        return [job.snapshot() for job in self.jobs.values()]

    # -- jobs ------------------------------------------------------------

    def _admit(self, caller: Caller, kind: str, name: str, paths: list[str]) -> SnapshotJob:
        running = [job for job in self.jobs.values() if job.state == "running"]
        if len(running) >= MAX_JOBS:
            raise Busy(f"{len(running)} snapshot jobs are running; try again when one ends")
        if not caller.is_root and any(job.owner == caller.uid for job in running):
            raise Busy("you have a snapshot job running already; one at a time")
        if self._nursery is None:
            raise InvalidArgument("this daemon runs no snapshot worker")
        job = SnapshotJob(f"s{next(self._ids)}", kind, name, caller.uid, paths)
        finished = [j for j in self.jobs.values() if j.state != "running"]
        for old in finished[: max(0, len(finished) - KEPT_FINISHED + 1)]:
            del self.jobs[old.id]
        self.jobs[job.id] = job
        return job

    async def _run_now(
        self, caller: Caller, kind: str, name: str, work: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """``work()`` in a thread, as a job of ``caller`` (counted against
        the same bounds as a create: a ``show`` of a large snapshot lists
        every version of its paths)."""
        job = self._admit(caller, kind, name, [])
        try:
            result = await trio.to_thread.run_sync(work, limiter=self.limiter)
            job.state = "done"
            return result
        except BaseException as exc:
            job.state, job.error = "failed", str(exc)
            raise
        finally:
            job.done.set()

    def _start(self, job: SnapshotJob, work: Callable[[], dict[str, Any]]) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._run_job, job, work)

    async def _run_job(self, job: SnapshotJob, work: Callable[[], dict[str, Any]]) -> None:
        try:
            job.result = await trio.to_thread.run_sync(work, limiter=self.limiter)
            job.state = "done"
        except TierfsError as exc:
            job.state, job.error = "failed", describe(exc)
            job.result = {"ok": False, "error": describe(exc), "errno": exc.errno}
        except Exception as exc:  # a bug: logged, reported, never the daemon's end
            log.exception("snapshot %s %s failed", job.kind, job.name)
            job.state, job.error = "failed", f"internal error: {exc}"
            job.result = {"ok": False, "error": job.error, "errno": 5}
        finally:
            job.done.set()

    # -- create ----------------------------------------------------------

    async def create(self, caller: Caller, name: str, paths: list[str]) -> SnapshotJob:
        """Check the request and start the create (``job.done`` ends it)."""
        check_name(name)
        if self.mounted is not None:
            raise ReadOnly(
                f"this is a mount of snapshot {self.mounted!r}; create snapshots on a "
                "mount of the bucket"
            )
        roots = normalised_paths(paths)
        if not caller.is_root:
            for root in roots:
                await self.permissions.readable(root, caller)
        job = self._admit(caller, "create", name, roots)
        self._start(job, lambda: self._create(job, caller))
        return job

    def _create(self, job: SnapshotJob, caller: Caller) -> dict[str, Any]:
        def observe(entry: SnapshotEntry) -> None:
            if job.stop.is_set():
                raise Stopped(f"snapshot {job.name!r}: stopped; nothing was kept")
            if not caller.is_root and not self.shown.readable(entry, caller):
                raise PermissionDenied(
                    f"snapshot {job.name!r}: you may not read {entry.key.rstrip('/')}; "
                    "a snapshot holds only what its creator may read (nothing was kept)"
                )
            job.objects += 1
            job.bytes += entry.size

        try:
            manifest = take_snapshot(
                self.store,
                job.name,
                job.paths,
                creator_uid=caller.uid,
                observe=observe,
                shadows=self.shadows,
            )
        except BaseException:
            self._discard_leftovers(job.name)
            raise
        log.info(
            "snapshot %s created by uid %d: %d objects, %d bytes",
            job.name,
            caller.uid,
            manifest.objects,
            manifest.bytes,
        )
        result = self._described(manifest, caller)
        if not manifest.versioned:
            result["warnings"] = [
                f"{self.store.url} keeps no object versions: a snapshot mount reads each "
                "object only while it is unchanged (its ETag is checked); turn versioning "
                "on to keep the recorded bytes readable after they are overwritten"
            ]
        return result

    def _discard_leftovers(self, name: str) -> None:
        """Delete what a create that failed wrote (never a whole snapshot)."""
        try:
            if name not in self.records.leftovers():
                return
            self.records.delete(name)
        except TierfsError as exc:
            log.warning("snapshot %s: could not delete the parts of a failed create: %s", name, exc)

    # -- list, show ------------------------------------------------------

    async def list(self, caller: Caller) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            found = []
            names, leftovers = self.records.survey()
            for name in names:
                with contextlib.suppress(SnapshotNotFound):  # deleted meanwhile
                    found.append(self._described(self.records.manifest(name), caller))
            return {"snapshots": found, "leftovers": leftovers}

        return await self._run_now(caller, "list", "", work)

    async def show(self, caller: Caller, name: str) -> dict[str, Any]:
        check_name(name)

        def work() -> dict[str, Any]:
            manifest = self.records.manifest(name)
            described = self._described(manifest, caller)
            gone = 0
            first_gone: list[str] = []
            if manifest.versioned:
                for entry in gone_versions(
                    self.store, manifest.paths, self.records.entries(manifest)
                ):
                    gone += 1
                    if len(first_gone) < 10 and self._may_see_names(manifest, caller):
                        first_gone.append(entry.key)
            described["versions_gone"] = gone
            if gone:
                named = f" (first: {', '.join(first_gone)})" if first_gone else ""
                described["warnings"] = [
                    f"the bucket no longer keeps the recorded version of {gone} object(s)"
                    f"{named}: reading them through a mount of this snapshot fails; the "
                    "bucket's lifecycle rules (noncurrent version expiry) removed them"
                ]
            elif not manifest.versioned:
                described["warnings"] = [
                    "recorded on a bucket that keeps no versions: an object changed since "
                    "cannot be read through a mount of this snapshot"
                ]
            return described

        return await self._run_now(caller, "show", name, work)

    def _described(self, manifest: Manifest, caller: Caller) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "name": manifest.name,
            "created": manifest.created,
            "creator_uid": manifest.creator_uid,
            "objects": manifest.objects,
            "bytes": manifest.bytes,
            "versioned": manifest.versioned,
        }
        if self._may_see_names(manifest, caller):
            shown["paths"] = manifest.paths
        else:
            shown["paths_hidden"] = len(manifest.paths)
        return shown

    @staticmethod
    def _may_see_names(manifest: Manifest, caller: Caller) -> bool:
        return caller.is_root or caller.uid == manifest.creator_uid

    # -- diff ------------------------------------------------------------

    async def diff(self, caller: Caller, name: str, other: str | None) -> SnapshotJob:
        check_name(name)
        if other is not None:
            check_name(other)
        job = self._admit(caller, "diff", name, [])
        self._start(job, lambda: self._diff(job, caller, name, other))
        return job

    def _diff(
        self, job: SnapshotJob, caller: Caller, name: str, other: str | None
    ) -> dict[str, Any]:
        older = self.records.manifest(name)
        newer = None if other is None else self.records.manifest(other)
        for manifest in (older, newer):
            if manifest is not None and not self._may_see_names(manifest, caller):
                raise PermissionDenied(
                    f"snapshot {manifest.name!r} belongs to uid {manifest.creator_uid}; "
                    "only its creator or root may diff it"
                )
        if newer is None:
            new_entries: Iterator[SnapshotEntry] = walk_entries(
                self.store, older.paths, self.shadows
            )
        else:
            new_entries = self.records.entries(newer)
        counts = {"added": 0, "removed": 0, "changed": 0}
        names: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
        for difference in diff_entries(self.records.entries(older), new_entries):
            if job.stop.is_set():
                raise Stopped(f"snapshot diff {name}: stopped")
            job.objects += 1
            counts[difference.change] += 1
            if len(names[difference.change]) < MAX_DIFF_NAMES:
                names[difference.change].append(difference.key)
        return {
            "name": name,
            "other": other,
            "counts": counts,
            **names,
            "truncated": any(counts[k] > len(names[k]) for k in counts),
        }

    # -- delete ----------------------------------------------------------

    async def delete(self, caller: Caller, name: str) -> dict[str, Any]:
        check_name(name)

        def work() -> dict[str, Any]:
            try:
                manifest = self.records.manifest(name)
            except SnapshotNotFound:
                if name in self.records.leftovers():  # a create that never finished
                    if not caller.is_root:
                        raise PermissionDenied(
                            f"{name!r} is what a create left behind; only root may delete it"
                        ) from None
                    return {"name": name, "deleted": self.records.delete(name)}
                raise
            if not caller.is_root and caller.uid != manifest.creator_uid:
                raise PermissionDenied(
                    f"snapshot {name!r} belongs to uid {manifest.creator_uid}; "
                    "only its creator or root may delete it"
                )
            deleted = self.records.delete(name)
            log.info("snapshot %s deleted by uid %d", name, caller.uid)
            return {"name": name, "deleted": deleted}

        return await self._run_now(caller, "delete", name, work)
