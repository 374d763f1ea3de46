"""The lifecycle planner: tier states + file facts + rules -> a list of moves.  Pure.

The planner decides; it does not move anything.  The mover (``workers/``)
gathers the facts, calls ``plan_moves``, and carries the moves out in list
order through the core's data-movement API; ``tierfs policy plan`` prints
``summarize(moves, tiers)``.

Input
-----
* ``tiers``: one ``TierUsage`` per local tier, fastest first, ``index`` =
  position (capacity, used bytes, high and low watermarks).
* ``files``: one ``FileFacts`` per file with data on some tier (or pinned):
  bytes and dirty bytes per tier, size, mtime, atime, open for writing,
  explicit pin tier (``tierfs pin``) or None.
* ``rules``: a compiled ``RuleSet`` (first match wins, per path).
* ``eviction_order``: inodes, least valuable first (``victims`` order of
  the eviction algorithm, or any order the caller trusts).  Files it does
  not list are taken as less valuable than all listed ones (nothing has
  vouched for them) and ordered by atime, oldest first.
* ``now``: the clock (seconds, same base as mtime/atime), so tests can
  speed time up.

Output
------
``Move(ino, relpath, src_tier, dst_tier, nbytes, reason)``; ``src_tier`` None
means "fetch from the bucket", ``dst_tier`` None means "drop the clean local
copy" (``nbytes`` is then the clean bytes).  Reasons, in planning order:

1. ``"cache"``: a ``cache = false`` rule: clean local copies are dropped.
2. ``"evict_after"``: idle (now - max(atime, mtime)) for at least
   ``evict_after``: clean copies on every local tier are dropped.
3. ``"age"``: idle for at least ``demote_after``: the first tier's bytes go
   to the second tier (if it has room; with one tier only, the clean bytes
   are dropped).
4. ``"place"``: data on a tier faster than the rule's ``place`` tier is
   relocated down to it (``place`` never pulls data up: that is promotion's
   job, on access).
5. ``"pin"``: a file pinned to tier P (``tierfs pin``) gets its bytes from
   the other local tiers relocated to P, then the rest fetched
   (``src_tier`` None).  A rule's ``pin = true`` only protects (it has no
   tier to fill).
6. ``"keep_newest"`` and ``"watermark"``: each tier above its high mark
   (or still draining from above it: ``TierUsage.must_drain``), fastest
   first, is brought down to its low mark: candidates in order,
   first the entries that ``keep_newest`` does not keep (oldest entry
   first: reason ``"keep_newest"``), then the least valuable (eviction
   order; reason ``"watermark"``).  A tier with a next tier demotes into
   it; when the next tier has no room for a file, its clean bytes are
   dropped instead.  The last tier drops clean bytes only: dirty data is
   never dropped.  Files that moved into the tier in this plan are not
   candidates (no move-then-drop in one plan).

Protection: a file open for writing is never moved.  A pinned file (``tierfs
pin``, or a rule with ``pin = true``) is never demoted or dropped.
``keep_newest = N``: per rule and parent directory of the matched entries
(``RuleMatch.anchor_parent``), the N entries with the newest mtime (an
entry's mtime is the newest of the files below it; ties break on the entry
path) are never demoted or dropped by age, placement or watermarks.

Room: a move into a tier is planned only if the tier's planned usage plus
the bytes stays within its capacity (not its high mark: going above high
makes that tier's own watermark pass, which runs next, free room below).
Each file leaves a given tier at most once per plan.  ``used`` is updated
as moves are planned, so later steps see the effect of earlier ones.

Output order is deterministic: the steps in the order above; within a step,
files by path (or by the candidate order for watermarks).  Cost: one rule
match per file (cached by the ``RuleSet``), a sort per step; O(n log n) for
n files.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tierfs.policy.rules import RuleMatch, RuleSet
from tierfs.policy.watermarks import TierUsage

__all__ = [
    "REASONS",
    "FileFacts",
    "Move",
    "MoveSummary",
    "plan_moves",
    "summarize",
]

REASONS = ("cache", "evict_after", "age", "place", "pin", "keep_newest", "watermark")
BUCKET = "bucket"  # the name of a None source in summaries
DROP = "drop"  # the name of a None destination in summaries


@dataclass(frozen=True, slots=True)
class FileFacts:
    ino: int
    relpath: str
    size: int
    resident: tuple[int, ...]  # bytes on each local tier, by tier index
    dirty: tuple[int, ...]  # dirty bytes on each local tier (<= resident)
    mtime: float
    atime: float
    open_for_write: bool = False
    pinned_tier: int | None = None  # an explicit pin (tierfs pin): fill to this tier


@dataclass(frozen=True, slots=True)
class Move:
    ino: int
    relpath: str
    src_tier: int | None  # None = fetch from the bucket
    dst_tier: int | None  # None = drop the clean local copy
    nbytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class MoveSummary:
    src: str  # tier name, or "bucket"
    dst: str  # tier name, or "drop"
    reason: str
    files: int
    nbytes: int


class _File:
    """Planning state of one file: what is still where."""

    __slots__ = ("arrived", "dirty", "facts", "kept", "left", "match", "older_rank", "resident")

    def __init__(self, facts: FileFacts, match: RuleMatch | None, tiers: int) -> None:
        if len(facts.resident) != tiers or len(facts.dirty) != tiers:
            raise ValueError(
                f"{facts.relpath}: resident and dirty need one entry per tier ({tiers})"
            )
        self.facts = facts
        self.match = match
        self.resident = list(facts.resident)
        self.dirty = list(facts.dirty)
        self.left: set[int] = set()  # tiers this file already leaves in this plan
        self.arrived: set[int] = set()  # tiers it moves into in this plan
        self.kept = False  # one of the newest N of a keep_newest group
        self.older_rank: tuple[float, str] | None = None  # keep_newest: not kept, by age

    @property
    def pinned(self) -> bool:
        return self.facts.pinned_tier is not None or bool(self.match and self.match.rule.pin)

    @property
    def movable(self) -> bool:
        """May be demoted or dropped by age, placement or watermarks."""
        return not (self.facts.open_for_write or self.pinned or self.kept)

    def idle(self, now: float) -> float:
        return now - max(self.facts.atime, self.facts.mtime)

    def clean(self, tier: int) -> int:
        return max(0, self.resident[tier] - self.dirty[tier])


class _Planner:
    def __init__(self, tiers: Sequence[TierUsage], now: float) -> None:
        for position, tier in enumerate(tiers):
            if tier.index != position:
                raise ValueError(f"tier {tier.name!r} has index {tier.index}, not {position}")
        self.tiers = list(tiers)
        self.used = [t.used for t in tiers]
        self.now = now
        self.moves: list[Move] = []

    def room(self, tier: int) -> int:
        return max(0, self.tiers[tier].capacity - self.used[tier])

    def drop(self, f: _File, tier: int, reason: str) -> int:
        """Drop the clean bytes of ``f`` on ``tier``; the bytes freed."""
        nbytes = f.clean(tier)
        if nbytes <= 0 or tier in f.left:
            return 0
        f.left.add(tier)
        f.resident[tier] -= nbytes
        self.used[tier] -= nbytes
        self.moves.append(Move(f.facts.ino, f.facts.relpath, tier, None, nbytes, reason))
        return nbytes

    def relocate(self, f: _File, src: int, dst: int, reason: str) -> int:
        """Move all of ``f``'s bytes on ``src`` to ``dst`` if they fit; the bytes moved."""
        nbytes = f.resident[src]
        if nbytes <= 0 or src in f.left or nbytes > self.room(dst):
            return 0
        f.left.add(src)
        f.arrived.add(dst)
        f.resident[src] = 0
        f.resident[dst] += nbytes
        f.dirty[dst] += f.dirty[src]
        f.dirty[src] = 0
        self.used[src] -= nbytes
        self.used[dst] += nbytes
        self.moves.append(Move(f.facts.ino, f.facts.relpath, src, dst, nbytes, reason))
        return nbytes

    def fetch(self, f: _File, dst: int, nbytes: int, reason: str) -> int:
        nbytes = min(nbytes, self.room(dst))
        if nbytes <= 0:
            return 0
        f.arrived.add(dst)
        f.resident[dst] += nbytes
        self.used[dst] += nbytes
        self.moves.append(Move(f.facts.ino, f.facts.relpath, None, dst, nbytes, reason))
        return nbytes


def _mark_keep_newest(files: Sequence[_File]) -> None:
    """Set ``kept`` / ``older_rank`` for files under a ``keep_newest`` rule."""
    # (rule index, keep, parent) -> anchor -> newest mtime in the anchor's subtree
    groups: dict[tuple[int, int, str], dict[str, float]] = defaultdict(dict)
    for f in files:
        match = f.match
        if match is None or match.rule.keep_newest is None:
            continue
        entries = groups[(match.rule.index, match.rule.keep_newest, match.anchor_parent)]
        entries[match.anchor] = max(entries.get(match.anchor, f.facts.mtime), f.facts.mtime)
    kept: set[tuple[int, str]] = set()
    entry_mtime: dict[tuple[int, str], float] = {}
    for (rule_index, keep, _parent), entries in groups.items():
        newest_first = sorted(entries.items(), key=lambda item: (-item[1], item[0]))
        for anchor, _mtime in newest_first[:keep]:
            kept.add((rule_index, anchor))
        for anchor, mtime in newest_first[keep:]:
            entry_mtime[(rule_index, anchor)] = mtime
    for f in files:
        match = f.match
        if match is None or match.rule.keep_newest is None:
            continue
        key = (match.rule.index, match.anchor)
        if key in kept:
            f.kept = True
        else:
            f.older_rank = (entry_mtime[key], match.anchor)


def plan_moves(
    tiers: Sequence[TierUsage],
    files: Iterable[FileFacts],
    rules: RuleSet,
    eviction_order: Sequence[int],
    now: float,
) -> list[Move]:
    """The moves the mover should make now; see the module docstring."""
    planner = _Planner(tiers, now)
    count = len(tiers)
    if count == 0:
        return []
    states = sorted(
        (_File(facts, rules.match_path(facts.relpath), count) for facts in files),
        key=lambda f: (f.facts.relpath, f.facts.ino),
    )
    _mark_keep_newest(states)
    active = [f for f in states if not f.facts.open_for_write]

    # 1. cache = false: nothing is kept locally.
    for f in active:
        if f.match and not f.match.rule.cache and not f.pinned:
            for tier in range(count):
                planner.drop(f, tier, "cache")

    # 2. evict_after: drop clean local copies of files idle that long.
    for f in active:
        limit = f.match.rule.evict_after if f.match else None
        if limit is not None and f.movable and f.idle(now) >= limit:
            for tier in range(count):
                planner.drop(f, tier, "evict_after")

    # 3. demote_after: leave the first tier.
    for f in active:
        limit = f.match.rule.demote_after if f.match else None
        if limit is None or not f.movable or f.idle(now) < limit or f.resident[0] <= 0:
            continue
        if count > 1:
            planner.relocate(f, 0, 1, "age")
        else:
            planner.drop(f, 0, "age")

    # 4. place: data above its placement tier goes down to it.
    names = {t.name: t.index for t in tiers}
    for f in active:
        place = names.get(f.match.rule.place or "") if f.match else None
        if place is None or not f.movable:
            continue
        for tier in range(place):
            planner.relocate(f, tier, place, "place")

    # 5. explicit pins: fill the pin tier.
    for f in active:
        pin = f.facts.pinned_tier
        if pin is None or not 0 <= pin < count:
            continue
        for tier in range(count):
            if tier != pin:
                planner.relocate(f, tier, pin, "pin")
        missing = f.facts.size - sum(f.resident)
        if missing > 0:
            planner.fetch(f, pin, missing, "pin")

    # 6. watermarks, fastest tier first.
    rank = {ino: position for position, ino in enumerate(eviction_order)}

    def candidate_order(f: _File) -> tuple[int, float, str, int, float, str, int]:
        older_mtime, older_anchor = f.older_rank or (0.0, "")
        position = rank.get(f.facts.ino)
        value = f.facts.atime if position is None else float(position)
        return (
            0 if f.older_rank is not None else 1,  # keep_newest's older entries first,
            older_mtime,  # oldest entry first;
            older_anchor,
            0 if position is None else 1,  # then files the eviction order does not vouch for,
            value,  # by atime; then the eviction order
            f.facts.relpath,
            f.facts.ino,
        )

    for tier in range(count):
        state = tiers[tier].with_used(max(0, planner.used[tier]))
        if not state.must_drain:
            continue
        need = state.to_free
        candidates = [
            f
            for f in active
            if f.resident[tier] > 0 and f.movable and tier not in f.left and tier not in f.arrived
        ]
        candidates.sort(key=candidate_order)
        freed = 0
        for f in candidates:
            if freed >= need:
                break
            reason = "keep_newest" if f.older_rank is not None else "watermark"
            moved = 0
            if tier + 1 < count:
                moved = planner.relocate(f, tier, tier + 1, reason)
            if moved == 0:
                moved = planner.drop(f, tier, reason)
            freed += moved
    return planner.moves


def summarize(moves: Iterable[Move], tiers: Sequence[TierUsage]) -> list[MoveSummary]:
    """Files and bytes per (source, destination, reason), in a stable order."""
    totals: dict[tuple[int, int, int], list[int]] = {}
    order = {reason: position for position, reason in enumerate(REASONS)}
    none_src, none_dst = -1, len(tiers)
    for move in moves:
        key = (
            none_src if move.src_tier is None else move.src_tier,
            none_dst if move.dst_tier is None else move.dst_tier,
            order.get(move.reason, len(order)),
        )
        entry = totals.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += move.nbytes
    reasons = {position: reason for reason, position in order.items()}
    out: list[MoveSummary] = []
    for (src, dst, reason), (count, nbytes) in sorted(totals.items()):
        out.append(
            MoveSummary(
                src=BUCKET if src == none_src else tiers[src].name,
                dst=DROP if dst == none_dst else tiers[dst].name,
                reason=reasons.get(reason, "other"),
                files=count,
                nbytes=nbytes,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class MoveAdmission:
    """How many moves of a plan run at once (the mover starts them in plan order).

    ``min_at_once`` moves may always run, whatever their size; beyond that,
    up to ``max_at_once``, a move starts only while the running moves and it
    hold at most ``max_bytes`` in all.  So many small files move in parallel
    (one at a time leaves the disk idle while the loop opens, switches and
    deletes), and a few huge ones do not flood the page cache.
    """

    min_at_once: int
    max_at_once: int
    max_bytes: int

    def may_start(self, running_nbytes: Sequence[int], nbytes: int) -> bool:
        """May a move of ``nbytes`` start beside running moves of these sizes?"""
        running = len(running_nbytes)
        if running < self.min_at_once:
            return True
        if running >= self.max_at_once:
            return False
        return sum(running_nbytes) + nbytes <= self.max_bytes
