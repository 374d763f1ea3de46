"""Preload: whole files and trees fetched into a tier, in the daemon.

A ``PreloadJob`` is created by the control op ``preload`` (``tierfs
preload``) and run by the ``Preloader`` worker.  Its states:

    scanning --every path walked--> fetching --every file done--> done
    scanning/fetching --the CLI went away (no --detach/--ready-fraction),
                       or the worker stopped--> cancelled

Streaming, never the whole list in memory.  The paths of a job (the PATH
arguments, and the ``--from-file`` list that the CLI sends in chunks of
``PRELOAD_LIST_CHUNK`` lines after its request line) are validated one by one as
they arrive and written to a *path spool*: an unnamed temporary file in
the state directory (``PathSpool``).  Only once the whole list arrived and
no line was bad does the job start: a bad list fetches nothing.  The scan
then walks each path (``Namespace.walk``: directories listed lazily, one
page and one frame per level in memory, the next few listed ahead) and
writes one line per file (inode, size, path) to a second spool, the *file
spool*, while it sums files and bytes.  The fetch pass runs beside the
scan: it follows the file spool (``PathSpool.take``, woken by the scan),
so the first file is fetched as soon as it is found, not after the whole
tree was listed (a tree of many directories costs one LIST round trip
each; the fetch pass no longer waits for all of them).  The scan is not
held back by the fetches, so the totals (and ETA, and ``--ready-fraction``,
which counts only once they are final: ``PreloadJob.ready``) are known
long before the fetch pass ends.  Memory per job: the bounded channel
between the reader of the file spool and the fetch tasks, one
``TAKE_BYTES`` chunk of the spool, plus the failures kept for the report
(``FAILURES_KEPT``; more are counted).  The spools are deleted when the
job ends (unnamed files: also when the daemon dies).

"Larger than the tiers" is said as soon as the totals scanned so far show
it (``_warn_if_too_big``, every ``SPOOL_BATCH`` files and at the end of
the scan), against the tier's room when the job started: the fetch pass
has then fetched less than the scan found, so the warning comes before
the job filled the tier (the scan of 5,000 files in 10 directories
takes about a third of such a preload).

Bounded parallelism for both shapes: the fetch pass cuts each file into
block ranges of ``RANGE_BYTES`` and puts (file, range) items on a channel
of ``2 * tasks`` items, which ``tasks`` fetch tasks take from
(``DataMovement.fill(ino, tier, blocks=range)``).  Many small files: one
item each, several files at once.  A few huge ones: their ranges run in
parallel (each range is a few ranged GETs of the block cache).  The GETs
themselves are bounded by the block cache's fetch slots, where preload is
BACKGROUND work: demand reads go first, and while they are active the
preload shrinks to a trickle of one 8 MiB GET at a time (see
:mod:`tierfs.core.state.fetch_slots`); its fetch tasks then wait in ``fill``, so
no new file is started either (the channel fills, and the reader of the
file spool waits).  A demand read of a block being preloaded shares its
fetch.
An optional bandwidth cap (``Throttle``) is applied to the bytes fetched:
the worker's (shared by its jobs) and a job's own (``preload --bandwidth``).

Resident data is skipped: ranges whose blocks are all present are not
queued, a file with nothing to fetch counts as ``files_resident``, and the
bytes that were present at the scan count as ``bytes_resident``.  A rerun
of a preload that completed therefore fetches nothing and says so.  A file
that fails (gone, the bucket refused, no room on any tier to keep it) is
recorded with its reason and the job goes on.  Resident means present on
any local tier: ``--tier`` chooses where absent blocks go; blocks already
on another tier are not moved (the lifecycle does that).

Per-file cost.  Per file, the event loop reads the inode and block map
once (a file the scan found with nothing resident is queued whole, without
``movement.check``; ``FillOutcome.present`` keeps the counters exact if a
demand read came between), block records join the metadata group, and the
cache file is created in the fetch thread.  The profiles and measurements
behind these choices, dated: ``docs/benchmarks.md``, "Where a small file's
preload CPU goes".
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from tierfs.config import FetchConfig
from tierfs.core.names.access import READ, Caller
from tierfs.core.read.sharedtier import SharedTier
from tierfs.core.tiering.policies import FilePolicies
from tierfs.errors import Busy, InvalidArgument, TierfsError, describe
from tierfs.meta import MetaDB
from tierfs.tiers import Tier
from tierfs.workers.pathlists import SPOOL_BATCH, PathSpool, SpoolFull

from .fillparts import FillParts
from .throttle import Throttle

log = logging.getLogger(__name__)

#: A file is fetched in block ranges of this many bytes (in parallel).
RANGE_BYTES = 64 * 1024 * 1024
#: Failures named in a job's report; more are counted only.
FAILURES_KEPT = 1000
#: Finished jobs kept for ``status``.
FINISHED_KEPT = 8
#: Preloads one user (not root) may have running at once.
PRELOADS_PER_USER = 8


class _Wakeup:
    """Wakes one waiting task when something was added (no lost wake-up: a
    ``notify`` before ``wait`` makes the next ``wait`` return at once)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


@dataclass(slots=True)
class PreloadFailure:
    path: str
    reason: str


@dataclass(slots=True)
class PreloadJob:
    id: str
    roots: list[str]
    tier: int | None
    tier_name: str | None
    #: Into the shared tier (``--tier`` named it): no local tier is filled.
    shared: bool = False
    #: Who started it (None: the daemon itself, root's rights) and its tag
    #: (``--tag``: the scheduler's job id, so that the job's epilog can
    #: cancel it).  Only paths the caller may read are fetched.
    caller: Caller | None = None
    tag: str = ""
    state: str = "scanning"
    files_total: int = 0
    files_done: int = 0
    files_resident: int = 0
    files_failed: int = 0
    bytes_total: int = 0
    bytes_resident: int = 0
    bytes_fetched: int = 0
    started: float = field(default_factory=time.time)
    fetch_started: float | None = None
    finished: float | None = None
    failures: list[PreloadFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: Set once the scan is over (the totals are final).
    scanned: trio.Event = field(default_factory=trio.Event)
    #: The "larger than every tier" / "no room on the tier" warnings were given.
    too_big_warned: bool = False
    no_room_warned: bool = False
    #: This job's own cap, bytes per second (0: none).
    bandwidth: int = 0
    throttle: Throttle = field(init=False)

    def __post_init__(self) -> None:
        self.throttle = Throttle(self.bandwidth)

    @property
    def owner(self) -> int:
        """The uid that started the job (0: the daemon itself)."""
        return self.caller.uid if self.caller is not None else 0

    def fail(self, path: str, reason: str) -> None:
        self.files_failed += 1
        if len(self.failures) < FAILURES_KEPT:
            self.failures.append(PreloadFailure(path, reason))
            log.warning("preload %s: %s: %s", self.id, path, reason)

    @property
    def ready_bytes(self) -> int:
        return min(self.bytes_total, self.bytes_resident + self.bytes_fetched)

    def ready(self, fraction: float) -> bool:
        """Are ``fraction`` of the job's bytes resident (totals final)?"""
        if self.done.is_set():
            return True
        if not self.scanned.is_set():
            return False
        return self.ready_bytes >= fraction * self.bytes_total

    @property
    def rate(self) -> float:
        """Bytes fetched per second since the fetch pass started."""
        if self.fetch_started is None:
            return 0.0
        elapsed = (self.finished or time.time()) - self.fetch_started
        return self.bytes_fetched / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every byte is resident, at the current rate."""
        if self.done.is_set():
            return 0.0
        rate = self.rate
        if not self.scanned.is_set() or rate <= 0:
            return None
        return (self.bytes_total - self.ready_bytes) / rate

    def snapshot(self) -> dict[str, Any]:
        """The job's figures for events, ``status`` and the final summary."""
        return {
            "id": self.id,
            "owner": self.owner,
            "tag": self.tag,
            "paths": self.roots,
            "tier": self.tier_name,
            "bandwidth": self.bandwidth,
            "state": self.state,
            "files_total": self.files_total,
            "files_done": self.files_done,
            "files_resident": self.files_resident,
            "files_failed": self.files_failed,
            "bytes_total": self.bytes_total,
            "bytes_resident": self.bytes_resident,
            "bytes_fetched": self.bytes_fetched,
            "ready_fraction": self.ready_bytes / self.bytes_total if self.bytes_total else 1.0,
            "rate": self.rate,
            "eta": self.eta,
            "elapsed": (self.finished or time.time()) - self.started,
        }


@dataclass(frozen=True, slots=True)
class _FileWork:
    ino: int
    path: str
    #: None: the whole file, in one fill (a small file that the scan found
    #: with nothing resident: see "Per-file cost").
    blocks: range | None


class _FileProgress:
    """Ranges of one file still running, whether one failed, and the later
    entries of the same file that wait for this fetch (a path listed twice,
    or a file under two listed directories)."""

    __slots__ = (
        "duplicate_bytes",
        "duplicates",
        "failed",
        "incomplete",
        "left",
        "ranges",
        "was_resident",
    )

    def __init__(self, left: int) -> None:
        self.left = left
        self.ranges = left
        self.failed = False
        #: A whole-file fill found every block resident already.
        self.was_resident = False
        #: A range's fill left some of its blocks absent (no room to keep them).
        self.incomplete = False
        self.duplicates: list[str] = []
        self.duplicate_bytes = 0


class Preloader:
    """The preload worker: runs jobs in its own nursery (``run``)."""

    def __init__(
        self,
        parts: FillParts,
        meta: MetaDB,
        policies: FilePolicies,
        tiers: list[Tier],
        shared_tier: SharedTier | None,
        *,
        fetch: FetchConfig,
        spool_dir: Path,
        bandwidth: int = 0,
        tasks: int | None = None,
    ) -> None:
        self.parts = parts
        self.spools = parts.spools
        self.movement = parts.movement
        self.meta = meta
        self.policies = policies
        self.tiers = tiers
        self.shared_tier = shared_tier
        self.block_size = fetch.block_size
        self.range_blocks = max(1, RANGE_BYTES // self.block_size)
        #: Fetch tasks per job: enough to keep the fetch slots busy with
        #: small files, which each take one GET.
        self.tasks = tasks or max(4, fetch.concurrency)
        self.throttle = Throttle(bandwidth)
        self.spool_dir = spool_dir
        self.jobs: dict[str, PreloadJob] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def admit(self, caller: Caller | None) -> None:
        """Busy if ``caller`` may start no more preloads now (checked before
        its list is taken, and again at the start)."""
        if self._nursery is None:
            raise InvalidArgument("the preload worker is not running")
        if caller is not None and not caller.is_root:
            mine = [job for job in self.running() if job.owner == caller.uid]
            if len(mine) >= PRELOADS_PER_USER:
                raise Busy(
                    f"uid {caller.uid} has {len(mine)} preloads running, the most one user "
                    f"may ({', '.join(job.id for job in mine)}); cancel one or wait"
                )

    def new_spool(self, owner: int = 0) -> PathSpool:
        """A spool whose bytes count against ``owner`` (``SpoolBudget``)."""
        return PathSpool(self.spool_dir, budget=self.spools, owner=owner)

    def start(
        self,
        spool: PathSpool,
        roots: list[str],
        tier_name: str | None,
        *,
        bandwidth: int = 0,
        caller: Caller | None = None,
        tag: str = "",
    ) -> PreloadJob:
        """Start a job over the relpaths in ``spool`` (which it now owns),
        capped at ``bandwidth`` bytes per second (0: no cap of its own),
        for ``caller`` (only what it may read is fetched; at most
        ``PRELOADS_PER_USER`` running per user but root), tagged ``tag``."""
        try:
            self.admit(caller)
        except TierfsError:
            spool.close()
            raise
        shared = self.shared_tier
        into_shared = shared is not None and tier_name == shared.name
        try:
            tier = None if into_shared else self.policies.tier_named(tier_name)
        except TierfsError as exc:
            spool.close()
            if shared is not None:
                raise InvalidArgument(f"{exc}, and the shared tier {shared.name}") from exc
            raise
        job = PreloadJob(
            id=f"p{os.getpid()}-{next(self._ids)}",
            roots=roots[:8],
            tier=tier,
            tier_name=tier_name if into_shared else self._tier_name(tier),
            shared=into_shared,
            bandwidth=bandwidth,
            caller=caller,
            tag=tag,
        )
        self._forget_finished()
        self.jobs[job.id] = job
        self._nursery.start_soon(self._run_job, job, spool)
        return job

    def _tier_name(self, tier: int | None) -> str | None:
        return self.tiers[tier].name if tier is not None else None

    def cancel(self, job: PreloadJob) -> None:
        job.cancel_scope.cancel()

    def running(self, *, job_id: str | None = None, tag: str | None = None) -> list[PreloadJob]:
        """The jobs not finished yet with that id, or that tag."""
        return [
            job
            for job in self.jobs.values()
            if not job.done.is_set()
            and (job_id is None or job.id == job_id)
            and (tag is None or job.tag == tag)
        ]

    def status(self) -> list[dict[str, Any]]:
        return [job.snapshot() for job in self.jobs.values()]

    def _forget_finished(self) -> None:
        finished = [j for j in self.jobs.values() if j.done.is_set()]
        for job in finished[: max(0, len(finished) - FINISHED_KEPT + 1)]:
            del self.jobs[job.id]

    # --- one job -----------------------------------------------------------------------

    async def _run_job(self, job: PreloadJob, spool: PathSpool) -> None:
        files = self.new_spool(job.owner)
        try:
            with job.cancel_scope:
                room = self._room(job)
                scanned = _Wakeup()
                job.fetch_started = time.time()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._fetch_all, job, files, scanned)
                    await self._scan(job, spool, files, scanned, room)
                    job.scanned.set()
                    scanned.notify()
                    self._warn_if_too_big(job, room)
                    job.state = "fetching"
                job.state = "done"
            if job.state != "done":
                job.state = "cancelled"
        except Exception:
            # A bug must not take the worker (and every other job) down.
            log.exception("preload %s failed", job.id)
            job.state = "failed"
            job.warnings.append("the preload stopped on an internal error (see the daemon log)")
        except BaseException:
            job.state = "cancelled"
            raise
        finally:
            job.finished = time.time()
            job.scanned.set()
            job.done.set()
            spool.close()
            files.close()
            log.info("preload %s %s: %s", job.id, job.state, job.snapshot())

    async def _scan(
        self,
        job: PreloadJob,
        spool: PathSpool,
        files: PathSpool,
        scanned: _Wakeup,
        room: int | None,
    ) -> None:
        """Walk every path of the job; totals, and one line per file (the
        fetch pass follows, woken by ``scanned``)."""
        caller = job.caller
        permissions = self.parts.permissions

        def not_listed(path: str) -> None:
            job.fail(path or "/", f"Permission denied: {path or '/'} (not listed)")

        enter = permissions.lister(caller, not_listed)
        for count, relpath in enumerate(spool.lines()):
            if count % SPOOL_BATCH == 0:
                await trio.sleep(0)
            try:
                if caller is not None and not caller.is_root:  # root: no second lookup
                    await permissions.readable(relpath, caller)
                async for inode, path in self.parts.namespace.walk(relpath, enter=enter):
                    if caller is not None and not permissions.permits(inode, caller, READ):
                        job.fail(path, f"Permission denied: {path}")
                        continue
                    size = inode.size
                    resident = (
                        0  # the shared tier is asked per block, by the fetch pass
                        if job.shared
                        else min(size, sum(self.meta.residency(inode.ino).values()))
                    )
                    origin_blocks = -(-min(size, inode.origin_size) // self.block_size)
                    files.add(f"{inode.ino} {resident} {origin_blocks} {path}")
                    scanned.notify()
                    job.files_total += 1
                    job.bytes_total += size
                    job.bytes_resident += resident
                    if files.count % SPOOL_BATCH == 0:
                        self._warn_if_too_big(job, room)
            except SpoolFull as exc:
                # The scan cannot write down more files: the files found so
                # far are fetched, the rest is said to be left out.
                job.fail(relpath or "/", f"{describe(exc)} (the scan stopped here)")
                return
            except TierfsError as exc:
                job.fail(relpath or "/", describe(exc))

    def _room(self, job: PreloadJob) -> int | None:
        """Free bytes of the job's tier as the job starts (None: no tier named)."""
        if job.tier is None:
            return None
        return self.tiers[job.tier].usable_bytes(self.parts.space.used(job.tier))

    def _warn_if_too_big(self, job: PreloadJob, room: int | None) -> None:
        """Say as soon as the totals scanned so far show that the job cannot
        all stay resident (each warning once): while the fetch pass has
        fetched less than the scan found, so before the job filled the
        tier.  ``room``: the tier's free bytes when the job started."""
        if job.shared:
            return  # the shared tier's capacity is its engine's (expiry, quota)
        missing = job.bytes_total - job.bytes_resident
        everywhere = sum(t.capacity for t in self.tiers)
        warning = None
        if job.bytes_total > everywhere and not job.too_big_warned:
            job.too_big_warned = True
            warning = (
                f"the preload ({job.bytes_total} bytes so far) is larger than every tier "
                f"together ({everywhere} bytes): not all of it can stay resident"
            )
        elif (
            job.tier is not None
            and room is not None
            and missing > room
            and not (job.too_big_warned or job.no_room_warned)
        ):
            job.no_room_warned = True
            warning = (
                f"the preload needs {missing} bytes (so far) but tier "
                f"{self.tiers[job.tier].name} had room for {room}: the rest goes to "
                "the next tiers"
            )
        if warning is not None:
            job.warnings.append(warning)
            log.warning("preload %s: %s", job.id, warning)

    async def _fetch_all(self, job: PreloadJob, files: PathSpool, scanned: _Wakeup) -> None:
        """The fetch pass: follows the file spool while the scan writes it,
        until the scan is over and every line was taken."""
        send, receive = trio.open_memory_channel[tuple[_FileWork, _FileProgress]](2 * self.tasks)
        #: Files with ranges queued or running (bounded by the channel and tasks).
        in_flight: dict[int, _FileProgress] = {}
        async with trio.open_nursery() as nursery:
            for _ in range(self.tasks):
                nursery.start_soon(self._fetch_task, job, receive.clone(), in_flight)
            receive.close()
            async with send:
                while True:
                    scan_over = job.scanned.is_set()
                    lines = files.take()
                    if not lines:
                        if scan_over:
                            return
                        await scanned.wait()
                        continue
                    for count, line in enumerate(lines, start=1):
                        ino_text, resident_text, blocks_text, path = line.split(" ", 3)
                        work = self._file_work(
                            job,
                            int(ino_text),
                            int(resident_text),
                            int(blocks_text),
                            path,
                            in_flight,
                        )
                        for item in work:
                            await send.send(item)
                        if count % SPOOL_BATCH == 0:
                            await trio.sleep(0)

    def _file_work(
        self,
        job: PreloadJob,
        ino: int,
        scanned_resident: int,
        scanned_blocks: int,
        path: str,
        in_flight: dict[int, _FileProgress],
    ) -> list[tuple[_FileWork, _FileProgress]]:
        """The ranges of the file that still have absent blocks (none: the
        file is resident, and counted so).  Bytes that became resident
        since the scan (a demand read, the same file listed twice) count
        as resident.  A file of at most one range that the scan found with
        nothing resident is queued whole without a look at LMDB here: its
        fill says what was resident meanwhile (``FillOutcome.present``)."""
        if ino not in in_flight and scanned_resident == 0:
            if scanned_blocks == 0:  # empty, or holes only: nothing to fetch
                job.files_resident += 1
                job.files_done += 1
                return []
            if scanned_blocks <= self.range_blocks:
                progress = in_flight[ino] = _FileProgress(1)
                return [(_FileWork(ino, path, None), progress)]
        if job.shared:  # every range: the shared tier says per block what it holds
            running = in_flight.get(ino)
            if running is not None:
                running.duplicates.append(path)
                return []
            starts = range(0, scanned_blocks, self.range_blocks)
            progress = in_flight[ino] = _FileProgress(len(starts))
            return [
                (
                    _FileWork(ino, path, range(b, min(b + self.range_blocks, scanned_blocks))),
                    progress,
                )
                for b in starts
            ]
        try:
            residency = self.movement.check(ino)
        except TierfsError as exc:
            job.fail(path, describe(exc))
            return []
        nblocks = residency.origin_blocks
        present = {place.blockno for place in residency.blocks}
        now_resident = min(residency.size, sum(residency.bytes_per_tier.values()))
        job.bytes_resident += max(0, now_resident - scanned_resident)
        running = in_flight.get(ino)
        if running is not None:  # settled with the fetch already queued
            running.duplicates.append(path)
            running.duplicate_bytes += residency.size - now_resident
            return []
        ranges = []
        for start in range(0, nblocks, self.range_blocks):
            blocks = range(start, min(start + self.range_blocks, nblocks))
            if any(b not in present for b in blocks):
                ranges.append(blocks)
        if not ranges:
            job.files_resident += 1
            job.files_done += 1
            return []
        progress = in_flight[ino] = _FileProgress(len(ranges))
        return [(_FileWork(ino, path, blocks), progress) for blocks in ranges]

    async def _fetch_task(
        self,
        job: PreloadJob,
        receive: trio.MemoryReceiveChannel[tuple[_FileWork, _FileProgress]],
        in_flight: dict[int, _FileProgress],
    ) -> None:
        async with receive:
            async for work, progress in receive:
                if not progress.failed:
                    try:
                        outcome = (
                            await self.movement.fill_shared(work.ino, work.blocks)
                            if job.shared
                            else await self.movement.fill_range(
                                work.ino, job.tier, blocks=work.blocks
                            )
                        )
                    except TierfsError as exc:
                        progress.failed = True
                        job.fail(work.path, describe(exc))
                    else:
                        job.bytes_fetched += outcome.nbytes
                        progress.incomplete |= not outcome.complete
                        if work.blocks is None or job.shared:  # the scan saw none resident
                            job.bytes_resident += outcome.present
                            progress.was_resident = outcome.complete and not outcome.nbytes
                        await self.throttle(outcome.nbytes)
                        await job.throttle(outcome.nbytes)
                progress.left -= 1
                if progress.left == 0:
                    del in_flight[work.ino]
                    self._file_finished(job, work, progress)

    def _file_finished(self, job: PreloadJob, work: _FileWork, progress: _FileProgress) -> None:
        """Every range of the file was filled: is all of it resident now?
        The file's duplicates share its outcome.  A file of one range that
        its fill left complete is (no second look at LMDB per small file);
        one of several ranges is checked again, as a later range may have
        pushed an earlier one out of a full tier."""
        recheck = (progress.incomplete or progress.ranges > 1) and not job.shared
        reason = self._not_resident_reason(work) if recheck and not progress.failed else None
        if progress.failed or reason is not None:
            if reason is not None:
                job.fail(work.path, reason)
            for path in progress.duplicates:
                job.fail(path, reason or f"failed (see {work.path})")
            return
        job.files_done += 1 + len(progress.duplicates)
        job.files_resident += len(progress.duplicates) + progress.was_resident
        job.bytes_resident += progress.duplicate_bytes

    def _not_resident_reason(self, work: _FileWork) -> str | None:
        try:
            residency = self.movement.check(work.ino)
        except TierfsError as exc:
            return describe(exc)
        present = {place.blockno for place in residency.blocks}
        if any(b not in present for b in range(residency.origin_blocks)):
            kept = sum(residency.bytes_per_tier.values())
            return f"only {kept} of {residency.size} bytes could be kept: the tiers are full"
        return None
