"""The lifecycle: the plan of moves, and the commands that move data.

This part decides; ``workers.mover`` carries the decisions out through the
data-movement API (``core.tiering.movement``), and so do the ``evict`` and ``pin``
commands here.  Nothing in this module touches block maps or tier files.
What the rules and pins say of each file (placement, ``cache = false``,
write-through, pins, promotion requests) is ``core.tiering.policies``, built
before the data path so that it can ask it directly; this part changes
them (``pin_path``, ``unpin_path``, ``reload``) and plans with them.

What it holds
-------------
* ``reload()`` rereads the config file and its policy files; a file with any
  problem is rejected as a whole (``ConfigError``, every problem at its
  file:line) and the rules in force stay.  Only the rules are reread: other
  changes of the config need a remount, and a reload says so in the log.
* Pins (``tierfs pin``): in LMDB (``MetaDB.pins``), so they survive
  remounts; a pinned directory pins everything below it, files created
  later included.  A rule with ``pin = true`` protects what it matches the
  same way, on the first tier (or the rule's ``place``).
* The ranking of files by value is ``SpaceManager``'s (one S3-FIFO tracker
  per tier, see ``core.state.space``); planning reads it with ``ranking_later()``,
  which changes nothing, and brings it in line with the residency first.
  The mover's passes first ``settle`` it (the S3-FIFO queue moves for what
  each tier must free); ``tierfs policy plan`` does not, and gets the same
  order.

Placement (``FilePolicies.placement``): the rule's ``place`` tier, else the first tier.
New data (fetches and writes) goes to the first tier with room at or after
it.  ``cache = false``: fetched blocks are served from memory and never
stored (writes still land locally: the planner drops the copies once they
are clean).  Promotion (``promote = "on_access"``, the default): a read
served from a tier slower than the file's placement tier queues the file
for promotion; the mover copies it up in the background, only while the
target tier stays below its high watermark, and never on the reader's path.

Planning (``plan``): facts are gathered from LMDB (residency, dirty bytes
of the files not yet uploaded, mtimes) and from memory (access times on the
lifecycle clock, open writers, pins), then ``policy.planner.plan_moves``
turns them into moves, in a thread.  Gathering is a pass over the residency
on the event loop that yields every ``_FACTS_BATCH`` files; it runs in the
mover's background pass (every ``[mover] interval``, and only when
``needs_pass``) and for ``tierfs policy plan``, never on a read.

Concurrency: every method is synchronous except the commands that move
data; between two awaits they are atomic with respect to other trio tasks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from tierfs.config import Config, load_config
from tierfs.errors import Busy, NoSpace, NotFound
from tierfs.meta import ROOT_INO, MetaDB, SyncState
from tierfs.policy.planner import FileFacts, Move, plan_moves, summarize
from tierfs.policy.rules import shadowed_rules
from tierfs.policy.watermarks import TierUsage
from tierfs.tiers import Tier

from ..names.namespace import Namespace
from ..state.clock import Clock
from ..state.journal import Journal
from ..state.space import SpaceManager
from .movement import DataMovement
from .policies import FilePolicies

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(
        self,
        config_file: Path,
        policy_files: tuple[Path, ...],
        meta: MetaDB,
        tiers: list[Tier],
        journal: Journal,
        namespace: Namespace,
        policies: FilePolicies,
        space: SpaceManager,
        movement: DataMovement,
        clock: Clock,
        *,
        open_for_write: Callable[[int], bool],
    ) -> None:
        #: The config file a reload reads again, and the policy files it named.
        self.config_file = config_file
        self.policy_files = policy_files
        self.meta = meta
        self.tiers = tiers
        self.journal = journal
        self.namespace = namespace
        self.policies = policies
        self.space = space
        self.movement = movement
        self.clock = clock
        self._open_for_write = open_for_write
        # Tiers seen above high and not yet seen at or below low (``tier_usage``).
        self._draining: set[int] = set()

    # --- planning -------------------------------------------------------------------------

    def tier_usage(self) -> list[TierUsage]:
        """Each tier's usage now, with its watermark hysteresis: a tier seen
        above its high mark stays ``draining`` until it is seen at or below
        its low mark, so that a pass whose moves were skipped (a file busy)
        does not leave it stuck between the marks."""
        usage = []
        for t in self.tiers:
            state = TierUsage(
                index=t.index,
                name=t.name,
                capacity=t.capacity,
                used=self.space.used(t.index),
                high=t.high_watermark,
                low=t.low_watermark,
                draining=t.index in self._draining,
            )
            if state.must_drain:
                self._draining.add(t.index)
            else:
                self._draining.discard(t.index)
            usage.append(state)
        return usage

    def needs_pass(self) -> bool:
        """Could a planning pass find work?  A tier above its high watermark
        (or on its way down from there to its low one),
        an explicit pin, or a rule that moves data by itself (ages, place,
        ``cache = false``).  Without any, the mover skips the pass: planning
        reads the whole residency."""
        if any(t.must_drain for t in self.tier_usage()) or self.policies.has_pins:
            return True
        return any(
            r.demote_after is not None or r.evict_after is not None or r.place or not r.cache
            for r in self.policies.rules.rules
        )

    async def facts(self) -> list[FileFacts]:
        """What the planner needs of every file with local data.  On the
        loop (LMDB), yielding to other tasks every ``_FACTS_BATCH`` files."""
        count = len(self.tiers)
        residency: dict[int, list[int]] = {}
        for ino, tier, nbytes in self.meta.iter_residency():
            if tier < count:
                residency.setdefault(ino, [0] * count)[tier] = nbytes
        self.space.reconcile(residency)
        atimes = self.space.atimes
        out: list[FileFacts] = []
        for done, (ino, resident) in enumerate(residency.items(), 1):
            if done % _FACTS_BATCH == 0:
                await trio.sleep(0)
            try:
                inode = self.namespace.get(ino)
                relpath = self.namespace.key_of(inode)
            except (NotFound, KeyError):
                continue  # unlinked while open: it goes when closed
            dirty = [0] * count
            if inode.state != SyncState.CLEAN:
                for rec in self.meta.get_blocks(ino).values():
                    if rec.dirty and rec.tier < count:
                        dirty[rec.tier] += rec.nbytes
            out.append(
                FileFacts(
                    ino=ino,
                    relpath=relpath,
                    size=inode.size,
                    resident=tuple(resident),
                    dirty=tuple(min(d, r) for d, r in zip(dirty, resident, strict=True)),
                    mtime=inode.mtime_ns / 1e9,
                    atime=atimes.get(ino, 0.0),
                    open_for_write=self._open_for_write(ino),
                    # A pin rule only protects; an explicit pin also fills.
                    pinned_tier=self.policies.policy_of(ino).explicit_pin,
                )
            )
        return out

    async def plan(self, *, settle: bool = False) -> list[Move]:
        """The moves to make now.  The planner (pure, O(n log n)) and the
        eviction ranking (``SpaceManager.ranking_later``, from copies of the
        trackers) run in a thread with their own copy of the rules, so that
        a plan over many files never holds up FUSE requests.

        ``settle`` (the mover's passes, not ``tierfs policy plan``): first
        make the trackers' S3-FIFO queue moves for what each tier must free
        (``SpaceManager.settle``); the order is the same either way."""
        tiers = self.tier_usage()
        if settle:
            self.space.settle([t.to_free for t in tiers])
        facts = await self.facts()
        rules = self.policies.rules.with_own_cache()  # compiled once, at load or reload
        ranking = self.space.ranking_later()
        now = self.clock.now()
        return await trio.to_thread.run_sync(
            lambda: plan_moves(tiers, facts, rules, ranking(), now)
        )

    async def plan_report(self) -> dict[str, Any]:
        """``tierfs policy plan``: the moves and their summary."""
        moves = await self.plan()
        tiers = self.tier_usage()
        names = [t.name for t in tiers]
        return {
            "time": time.time(),
            "tiers": [
                {
                    "name": t.name,
                    "capacity": t.capacity,
                    "used": t.used,
                    "high_watermark": t.high,
                    "low_watermark": t.low,
                    "above_high": t.above_high,
                    "draining": t.must_drain,
                }
                for t in tiers
            ],
            "moves": [
                {
                    "path": m.relpath,
                    "src": names[m.src_tier] if m.src_tier is not None else None,
                    "dst": names[m.dst_tier] if m.dst_tier is not None else None,
                    "bytes": m.nbytes,
                    "reason": m.reason,
                }
                for m in moves
            ],
            "summary": [
                {
                    "src": s.src,
                    "dst": s.dst,
                    "reason": s.reason,
                    "files": s.files,
                    "bytes": s.nbytes,
                }
                for s in summarize(moves, tiers)
            ],
        }

    # --- commands (control socket) --------------------------------------------------------------

    async def evict_path(self, relpath: str, tier_name: str | None) -> dict[str, Any]:
        tier = self.policies.tier_named(tier_name)
        top = await self.namespace.resolve(relpath)
        evicted = files = 0
        skipped: list[dict[str, str]] = []
        async for inode, path in self.namespace.walk(relpath, list_dirs=False, top=top):
            residency = self.meta.residency(inode.ino)
            if not residency or (tier is not None and tier not in residency):
                continue
            if self.policies.pinned_tier(inode.ino) is not None:
                skipped.append({"path": path, "reason": "pinned (`tierfs unpin` it first)"})
                continue
            if inode.state != SyncState.CLEAN or self.journal.pending_upload(inode.ino):
                skipped.append({"path": path, "reason": "holds changes not uploaded yet"})
                continue
            try:
                nbytes = self.movement.evict(inode.ino, tier)
            except Busy as exc:
                skipped.append({"path": path, "reason": str(exc)})
                continue
            if nbytes:
                evicted += nbytes
                files += 1
        return {"path": relpath, "evicted_bytes": evicted, "files": files, "skipped": skipped}

    async def pin_path(self, relpath: str, tier_name: str | None) -> dict[str, Any]:
        tier = self.policies.tier_named(tier_name)
        tier = 0 if tier is None else tier
        top = await self.namespace.resolve(relpath)
        inos: list[int] = []
        total = 0
        async for inode, _path in self.namespace.walk(relpath, list_dirs=True, top=top):
            inos.append(inode.ino)
            total += inode.size
        capacity = self.tiers[tier].capacity
        if total > capacity:
            raise NoSpace(
                f"{relpath or '/'}: {total} bytes do not fit on tier {self.tiers[tier].name} "
                f"({capacity} bytes); nothing was pinned"
            )
        self.policies.pin(top.ino, tier)
        fetched = 0
        for ino in inos:
            fetched += await self._bring_to(ino, tier)
        self.policies.wake_mover()
        return {
            "path": relpath,
            "tier": self.tiers[tier].name,
            "files": len(inos),
            "bytes": total,
            "fetched_bytes": fetched,
        }

    async def _bring_to(self, ino: int, tier: int) -> int:
        """Move the file's local blocks to ``tier`` and fetch the rest; the
        fetched bytes.  A busy file is left for the mover's next pass."""
        try:
            for src in sorted(self.meta.residency(ino)):
                if src != tier:
                    await self.movement.relocate(ino, src, tier)
            fetched = await self.movement.fill(ino, tier)
        except (Busy, NoSpace) as exc:
            log.info("pin: %s stays where it is for now: %s", self.namespace.path_of(ino), exc)
            return 0
        return fetched

    async def unpin_path(self, relpath: str) -> dict[str, Any]:
        top = await self.namespace.resolve(relpath)
        was = self.policies.unpin(top.ino)
        self.policies.wake_mover()
        return {"path": relpath, "was_pinned": was}

    async def show(self) -> dict[str, Any]:
        """``tierfs policy show``: the rules in force with their file:line,
        and warnings (rules that can never match, pins larger than their
        tier)."""
        rules = []
        for config_rule in self.policies.rule_configs:
            settings = {
                key: getattr(config_rule, key)
                for key in _RULE_SETTINGS
                if getattr(config_rule, key) is not None
            }
            rules.append(
                {"match": config_rule.match, "source": config_rule.source, "settings": settings}
            )
        return {
            "config": str(self.config_file),
            "policy_files": [str(p) for p in self.policy_files],
            "rules": rules,
            "warnings": self._warnings(self.policies.rule_configs) + await self._pin_warnings(),
        }

    async def _pin_warnings(self) -> list[str]:
        """Pins (``tierfs pin``, ``pin = true`` rules) that hold more bytes,
        among the files this node knows, than their tier can.  A walk of the
        known namespace (no listing), yielding between directory pages."""
        pinned = [0] * len(self.tiers)
        by_source: dict[str, int] = {}
        root = self.namespace.get(ROOT_INO)
        async for inode, _path in self.namespace.walk("", list_dirs=False, top=root):
            policy = self.policies.policy_of(inode.ino)
            tier, match = policy.pinned, policy.match
            if tier is None:
                continue
            pinned[tier] += inode.size
            source = match.rule.source if match is not None and match.rule.pin else "tierfs pin"
            by_source[source] = by_source.get(source, 0) + inode.size
        warnings = []
        for index, total in enumerate(pinned):
            capacity = self.tiers[index].capacity
            if total > capacity:
                sources = ", ".join(f"{src}: {n} bytes" for src, n in sorted(by_source.items()))
                warnings.append(
                    f"pinned files hold {total} bytes, more than tier {self.tiers[index].name} "
                    f"can ({capacity} bytes); they cannot all stay on it ({sources})"
                )
        return warnings

    @staticmethod
    def _warnings(rules: Any) -> list[str]:
        return [
            f"{later.source}: rule {later.match!r} can never match: the rule at "
            f"{earlier.source} ({earlier.match!r}) matches everything it does and comes first"
            for later, earlier in shadowed_rules(rules)
        ]

    def reload(self, fresh: Config | None = None) -> dict[str, Any]:
        """Reread the rules (``tierfs policy reload``, SIGHUP), or take those
        of ``fresh`` (the config file read again by the caller).  A file with
        any problem raises ``ConfigError`` and the rules in force stay."""
        if fresh is None:
            fresh = load_config(self.config_file, check_paths=False)
        names = [t.name for t in fresh.tiers]
        if names != [t.name for t in self.tiers]:
            log.warning(
                "policy reload: the [[tiers]] changed in %s; that needs a remount",
                self.config_file,
            )
        self.policies.set_rules(fresh.rules)
        warnings = self._warnings(fresh.rules)
        for warning in warnings:
            log.warning("policy: %s", warning)
        log.info("policy reloaded: %d rules in force", len(fresh.rules))
        self.policies.wake_mover()
        return {"rules": len(fresh.rules), "warnings": warnings}


#: Files whose facts are gathered between two yields to other tasks.
_FACTS_BATCH = 1000

_RULE_SETTINGS = (
    "place",
    "keep_newest",
    "demote_after",
    "evict_after",
    "pin",
    "promote",
    "cache",
    "write",
)
