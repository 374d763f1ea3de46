"""``tierfs policy check``: are there pin rules that cover more than their tier holds?

A pin rule (``pin = true``) keeps every file it matches on its tier (its
``place``, else the first tier).  When the files it matches in the bucket
add up to more than that tier's capacity, the pin cannot be kept, and the
operator should hear it before the mount, not when NVMe is full.  Without a
mount, the bucket is what tells the sizes: this module lists it.

Bounded work, since a check must not take an hour on a bucket of a billion
keys: only the subtrees that a pin rule can match are listed (from the
literal directory prefix of its glob: ``ckpt/**`` lists ``ckpt/``,
``**/*.pt`` lists everything), and the walk stops after ``MAX_OBJECTS``
objects or ``MAX_SECONDS``, or once every pin rule is known to be too
large.  A walk that stopped early says so: its totals are lower bounds.
The bucket unreachable is a note, not an error: the file itself is valid.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from tierfs.config import Config
from tierfs.errors import TierfsError
from tierfs.policy.rules import RuleSet
from tierfs.store import open_store

#: Objects listed at most.
MAX_OBJECTS = 200_000
#: Seconds of listing at most.
MAX_SECONDS = 15.0

_WILDCARDS = frozenset("*?[")


@dataclass(slots=True)
class PinSizes:
    """Bytes in the bucket matched by each pin rule (by its file:line)."""

    totals: dict[str, int] = field(default_factory=dict)
    objects: int = 0
    complete: bool = True
    error: str = ""


def literal_dir(glob: str) -> str:
    """The deepest directory (``""`` or ending in ``/``) below which every
    path the glob matches lies: its segments before the first wildcard,
    minus the last one (which may name a file)."""
    segments = glob.strip("/").split("/")
    literal: list[str] = []
    for segment in segments[:-1]:
        if _WILDCARDS & set(segment):
            break
        literal.append(segment)
    return "".join(f"{s}/" for s in literal)


def _roots(prefixes: list[str]) -> list[str]:
    """The prefixes that are not below another one (each subtree listed once)."""
    roots: list[str] = []
    for prefix in sorted(set(prefixes)):
        if not any(prefix.startswith(root) for root in roots):
            roots.append(prefix)
    return roots


def tier_capacity(config: Config, index: int) -> int | None:
    tier = config.tiers[index]
    if tier.capacity is not None:
        return tier.capacity
    try:
        st = os.statvfs(tier.path)
    except OSError:
        return None  # the tier's directory does not exist here: unknown
    return st.f_blocks * st.f_frsize


def measure(config: Config) -> PinSizes:
    """List the bucket under the pin rules and add up what each matches."""
    result = PinSizes()
    pin_rules = [rule for rule in config.rules if rule.pin]
    if not pin_rules:
        return result
    rules = RuleSet(config.rules, default_write=config.write.mode)
    limits = {rule.source: _limit(config, rule.place) for rule in pin_rules}
    result.totals = dict.fromkeys(limits, 0)
    deadline = time.monotonic() + MAX_SECONDS
    try:
        store = open_store(config.backing, source=str(config.source))
        pending = _roots([literal_dir(rule.match) for rule in pin_rules])
        while pending:
            prefix = pending.pop()
            for page in store.list_pages(prefix):
                pending.extend(page.prefixes)
                for obj in page.objects:
                    if obj.key.endswith("/"):
                        continue  # a directory marker
                    result.objects += 1
                    match = rules.match_path(obj.key)
                    if match is not None and match.rule.pin:
                        result.totals[match.rule.source] += obj.size
                if all(
                    limit is not None and result.totals[src] > limit
                    for src, limit in limits.items()
                ):
                    result.complete = False
                    return result  # every pin is too large already
                if result.objects >= MAX_OBJECTS or time.monotonic() > deadline:
                    result.complete = False
                    return result
    except (TierfsError, OSError) as exc:
        result.complete = False
        result.error = str(exc)
    except ImportError as exc:  # a client-only install: no S3 engine
        result.complete = False
        result.error = (
            f"this install of tierfs has only the client "
            f"({(exc.name or str(exc)).split('.')[0]} is missing); "
            "the bucket is listed by a node's install: pip install 'tierfs[daemon]'"
        )
    return result


def _limit(config: Config, place: str | None) -> int | None:
    names = [t.name for t in config.tiers]
    index = names.index(place) if place in names else 0
    return tier_capacity(config, index)


def warnings(config: Config) -> list[str]:
    """Sentences for ``policy check``: pins larger than their tier, and how
    far the bucket was seen."""
    sizes = measure(config)
    out: list[str] = []
    if sizes.error:
        out.append(f"note: pin sizes not checked: the bucket could not be listed: {sizes.error}")
        return out
    names = [t.name for t in config.tiers]
    for rule in config.rules:
        if not rule.pin or rule.source not in sizes.totals:
            continue
        total = sizes.totals[rule.source]
        place = rule.place if rule.place in names else names[0]
        limit = _limit(config, rule.place)
        if limit is not None and total > limit:
            bound = "" if sizes.complete else "at least "
            out.append(
                f"{rule.source}: warning: the pin {rule.match!r} covers {bound}{total} bytes in "
                f"the bucket, more than tier {place} holds ({limit} bytes): it cannot all stay "
                "pinned"
            )
    if not sizes.complete and not out:
        out.append(
            f"note: pin sizes checked over the first {sizes.objects} objects of the bucket only"
        )
    return out
