"""File policies: what the rules in force and the pins say of each file.

The data path asks this part, on every fetch, write and slow-tier read,
and it answers from memory:

* ``store_tier(ino)``: where new blocks of the file go first (the rule's
  ``place`` tier, else the first tier); None for ``cache = false``
  (fetched blocks are served from memory and never stored);
* ``write_through(ino)``: does a close or fsync wait for the bucket (the
  rule's ``write``, else ``[write] mode``);
* ``shares(ino)``: does the file take part in the shared tier: its blocks
  read from there and put there, the file copied there once it is
  uploaded (no ``share = false`` rule);
* ``pinned_tier(ino)``: the tier the file must stay on (``tierfs pin`` of
  it or of a directory above it, or a ``pin = true`` rule);
* ``slow_tier_read(ino, tier)``: a read was served from a tier slower than
  the file's placement: queue the file for promotion (``promote =
  "on_access"``, the default) for the mover, O(1), never on the reader's
  path beyond a queue put.

Invariants:

* Per-inode answers (``InodePolicy``) are computed once per inode and
  cached; the cache is dropped whole when the namespace changes shape
  (``Journal.namespace_gen``: rename, unlink, rmdir), when the rules are
  replaced (``set_rules``) and on a pin or unpin.  A read never globs:
  after the first access of a file its rule costs one dict lookup.
* Pins are in LMDB (``MetaDB.pins``), so they survive remounts; this part
  keeps the copy in memory that the answers use.
* A file is queued for promotion at most once at a time (until
  ``promotion_done``), and the queue is bounded (``PROMOTION_QUEUE``): a
  request that does not fit is dropped, and the next slow read asks again.

``core.tiering.lifecycle`` plans the moves and runs the commands (pin, evict,
reload) on top of this part; ``workers.mover`` takes the promotions.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from tierfs.config import RuleConfig
from tierfs.errors import InvalidArgument, NotFound
from tierfs.meta import ROOT_INO, Inode, MetaDB
from tierfs.policy.rules import RuleMatch, RuleSet
from tierfs.tiers import Tier

from ..names.namespace import Namespace
from ..state.journal import Journal

#: Files waiting for promotion at most; more requests are dropped (the next
#: read of the file asks again).
PROMOTION_QUEUE = 256


@dataclass(frozen=True, slots=True)
class InodePolicy:
    """What the rules and pins say about one inode (cached per inode)."""

    match: RuleMatch | None
    place: int  # the tier new data goes to first
    pinned: int | None  # the tier it must stay on (an explicit pin or a pin rule)
    explicit_pin: int | None  # the ``tierfs pin`` of it or an ancestor: this one fills


_NO_POLICY = InodePolicy(None, 0, None, None)


@dataclass(frozen=True, slots=True)
class Promotion:
    ino: int
    src: int
    dst: int


class FilePolicies:
    """The rules in force and the pins, answered per file (see the module
    docstring)."""

    def __init__(
        self,
        rules: tuple[RuleConfig, ...],
        tiers: list[Tier],
        meta: MetaDB,
        journal: Journal,
        namespace: Namespace,
        *,
        write_mode: str,
    ) -> None:
        """``meta`` keeps the pins; ``namespace`` gives the paths rules match;
        ``write_mode``: ``[write] mode``, for the files no rule's ``write``
        decides."""
        self.write_mode = write_mode
        self.rule_configs = rules
        self.rules = RuleSet(rules, default_write=write_mode)
        self.tier_names = [t.name for t in tiers]
        self._tier_index = {t.name: t.index for t in tiers}
        self.meta = meta
        self._pins: dict[int, int] = meta.pins()
        self.journal = journal
        self.namespace = namespace
        # Per-inode cache: ino -> (rule match, placement tier, pinned tier).
        self._per_inode: dict[int, InodePolicy] = {}
        self._cache_gen = journal.namespace_gen
        self._wake = trio.Event()
        self.promotion_send, self.promotion_receive = trio.open_memory_channel[Promotion](
            PROMOTION_QUEUE
        )
        self._promoting: set[int] = set()

    # --- per-inode answers --------------------------------------------------------------

    def _relpath(self, inode: Inode) -> str:
        return self.namespace.key_of(inode)

    def policy_of(self, ino: int) -> InodePolicy:
        """What the rules and pins say of ``ino`` (cached, see the module docstring)."""
        if self._cache_gen != self.journal.namespace_gen:
            self._per_inode.clear()
            self._cache_gen = self.journal.namespace_gen
        found = self._per_inode.get(ino)
        if found is not None:
            return found
        try:
            inode = self.namespace.get(ino)
            match = self.rules.match_path(self._relpath(inode)) if self.rules.rules else None
            explicit = self._explicit_pin(inode)
        except (NotFound, KeyError):
            return _NO_POLICY
        rule = match.rule if match is not None else None
        place = self._tier_index.get(rule.place, 0) if rule and rule.place else 0
        pinned = explicit if explicit is not None else (place if rule and rule.pin else None)
        found = InodePolicy(match, place, pinned, explicit)
        self._per_inode[ino] = found
        return found

    def _explicit_pin(self, inode: Inode) -> int | None:
        """The pin of the inode or of its nearest pinned ancestor."""
        if not self._pins:
            return None
        while True:
            tier = self._pins.get(inode.ino)
            if tier is not None:
                return tier
            if inode.ino == ROOT_INO:
                return None
            inode = self.namespace.get(inode.parent)

    def rule_of(self, ino: int) -> RuleMatch | None:
        return self.policy_of(ino).match

    def placement(self, ino: int) -> int:
        """The tier new data of ``ino`` goes to first."""
        return self.policy_of(ino).place

    def store_tier(self, ino: int) -> int | None:
        """Where new blocks of ``ino`` go first; None: fetched blocks are
        not kept (``cache = false``)."""
        policy = self.policy_of(ino)
        if policy.match is not None and not policy.match.rule.cache:
            return None
        return policy.place

    def write_through(self, ino: int) -> bool:
        match = self.policy_of(ino).match
        if match is None:
            return self.write_mode == "through"
        return match.rule.write == "through"

    def shares(self, ino: int) -> bool:
        """Does the file take part in the shared tier (no ``share = false``
        rule): its blocks read from and put into it, and the file copied
        there once it is uploaded?"""
        match = self.policy_of(ino).match
        return match is None or match.rule.share

    def pinned_tier(self, ino: int) -> int | None:
        """The tier the file must stay on (``tierfs pin`` or a ``pin`` rule)."""
        return self.policy_of(ino).pinned

    def _invalidate(self) -> None:
        self._per_inode.clear()
        self.rules.clear_cache()

    # --- events from the data path ------------------------------------------------------

    def slow_tier_read(self, ino: int, tier: int) -> None:
        """A read of ``ino`` was served from ``tier`` (not the first): O(1).
        If that is below the file's placement tier and its rule promotes on
        access, queue the file for promotion (``workers.mover``)."""
        if ino in self._promoting:
            return
        policy = self.policy_of(ino)
        if tier <= policy.place or policy.pinned is not None:
            return
        if policy.match is not None and policy.match.rule.promote == "never":
            return
        try:
            self.promotion_send.send_nowait(Promotion(ino, tier, policy.place))
        except trio.WouldBlock:
            return
        self._promoting.add(ino)

    def promotion_done(self, ino: int) -> None:
        self._promoting.discard(ino)

    def wake_mover(self) -> None:
        self._wake.set()

    async def wait_for_work(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            await self._wake.wait()
        self._wake = trio.Event()

    # --- changes -------------------------------------------------------------------------

    def set_rules(self, rule_configs: tuple[RuleConfig, ...]) -> None:
        """Put these rules in force (a reload)."""
        self.rule_configs = rule_configs
        self.rules = RuleSet(rule_configs, default_write=self.write_mode)
        self._invalidate()

    def pin(self, ino: int, tier: int) -> None:
        """Pin ``ino`` (and all below it) to ``tier``, in LMDB and here."""
        self.meta.set_pin(ino, tier)
        self._pins[ino] = tier
        self._invalidate()

    def unpin(self, ino: int) -> bool:
        """Drop the pin of ``ino``; was it pinned?"""
        was = self.meta.clear_pin(ino)
        self._pins.pop(ino, None)
        self._invalidate()
        return was

    @property
    def has_pins(self) -> bool:
        return bool(self._pins)

    def tier_named(self, name: str | None) -> int | None:
        if name is None:
            return None
        index = self._tier_index.get(name)
        if index is None:
            known = ", ".join(self.tier_names)
            raise InvalidArgument(f"no tier named {name!r}; the tiers are {known}")
        return index
