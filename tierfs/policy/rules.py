"""Lifecycle rules compiled once into a matcher.  Pure and synchronous.

Glob semantics (the contract of ``[[rules]] match``)
----------------------------------------------------
* Patterns and paths are relative to the mount root, "/"-separated, without
  a leading "/".  A trailing "/" in a pattern is ignored.  Matching is
  case-sensitive and byte-for-byte (no Unicode normalisation).
* ``*`` matches any run of characters within one segment (also none, also a
  leading "."), ``?`` one character, ``[abc]`` / ``[a-z]`` / ``[!abc]``
  (or ``[^abc]``) one character of a class; ``]`` first in a class is
  literal, and a ``[`` without a closing ``]`` is a literal "[".  None of
  them ever matches "/".
* ``**`` as a whole segment crosses directories: in front or in the middle
  (``**/x``, ``a/**/x``) it matches zero or more segments; at the end
  (``a/**``) one or more.  Elsewhere in a segment (``a**b``) it is two
  ``*`` and stays within the segment.
* A rule that matches a directory covers its whole subtree: a path matches a
  pattern when the path itself or one of its ancestor directories matches
  it.  So ``checkpoints/*`` covers ``checkpoints/step-1/model.pt``.
* The *anchor* of a match is the shortest such prefix (the matched entry,
  e.g. ``checkpoints/step-3``), and ``anchor_parent`` its parent directory
  ("" for the mount root).  ``keep_newest`` counts entries per parent.
* Rules are tried in order; the first that matches wins.

Compilation
-----------
``fnmatch.translate`` cannot express the segment rules, so each pattern is
translated here into a regex ``^(?:P)(?=/|$)``: ``re.match`` of it answers
"does the path or an ancestor match" in one call.  Only for the winning rule
is the anchor searched, by trying the prefixes shortest first.  Results are
kept in a bounded LRU keyed by the path (callers also cache per inode and
call ``clear_cache`` when a path changes meaning, e.g. after a rename).

Shadowed rules
--------------
``shadowed_rules(rules)`` lists rules that can never match because an
earlier rule matches every path they match.  It is sound (no false
positives) and finds these cases:

1. the same pattern (after dropping a trailing "/");
2. an earlier ``**`` (it matches every path);
3. an earlier pattern without ``**`` except possibly a trailing one, whose
   k segments cover the first k segments of the later pattern one by one
   (the later one has at least k segments before any ``**``): for example
   ``data/**`` or ``data/*`` before ``data/x/*``, ``*.tmp`` before
   ``x.tmp/**``, ``logs/[0-9]*`` before ``logs/2024/**``.  A segment covers
   another when it is ``*``, the same text, or a glob that matches the
   other, literal, segment.

Anything else (say ``**/x`` before ``a/x``) is not reported, even when it
is in fact shadowed.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tierfs.config import RuleConfig

__all__ = [
    "CompiledRule",
    "RuleMatch",
    "RuleSet",
    "glob_to_regex",
    "pattern_segments",
    "shadowed_rules",
]

_GLOB_CHARS = frozenset("*?[")
DEFAULT_CACHE_SIZE = 1 << 16


def pattern_segments(pattern: str) -> list[str]:
    """The segments of a pattern, without a trailing "/" (and consecutive ``**`` merged)."""
    segments: list[str] = []
    for segment in pattern.rstrip("/").split("/"):
        if segment == "**" and segments and segments[-1] == "**":
            continue
        segments.append(segment)
    return segments


def _class_items(body: str) -> str:
    """The inside of a bracket class as regex class items.

    ``a-z`` is a range (a reversed one matches nothing); a "-" first or last
    is literal; every other character is literal, escaped for ``re``.
    """
    items: list[str] = []
    k, n = 0, len(body)
    while k < n:
        if k + 2 < n and body[k + 1] == "-":
            low, high = body[k], body[k + 2]
            if low <= high:
                items.append(f"{re.escape(low)}-{re.escape(high)}")
            k += 3
        else:
            items.append(re.escape(body[k]))
            k += 1
    return "".join(items)


def _segment_regex(segment: str) -> str:
    """One segment (not ``**``) as a regex that never crosses "/"."""
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i
            if j < n and segment[j] in "!^":
                j += 1
            if j < n and segment[j] == "]":
                j += 1
            while j < n and segment[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append(re.escape("["))
                continue
            body = segment[i:j]
            i = j + 1
            negate = body[:1] in ("!", "^")
            items = _class_items(body[1:] if negate else body)
            if not items:
                out.append("(?!)" if not negate else "[^/]")
            else:
                out.append(f"[^/{items}]" if negate else f"(?!/)[{items}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def glob_to_regex(pattern: str) -> str:
    """The regex (without anchors) for the paths that ``pattern`` matches exactly."""
    segments = pattern_segments(pattern)
    parts: list[str] = []
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment == "**":
            if index == last:
                # One or more whole segments; after a "/" already written.
                parts.append("[^/]+(?:/[^/]+)*")
            else:
                # Zero or more whole segments, each with its "/".
                parts.append("(?:[^/]+/)*")
        else:
            parts.append(_segment_regex(segment))
            if index != last:
                parts.append("/")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One rule with its effective settings (defaults filled in)."""

    index: int  # position in the rule list: first match wins
    match: str
    source: str  # "file:line"
    place: str | None  # tier name for new data; None = the first tier with room
    pin: bool
    keep_newest: int | None
    demote_after: float | None  # seconds
    evict_after: float | None  # seconds
    promote: str  # "on_access" | "never"
    cache: bool
    #: Files written here are copied into the shared tier after their upload.
    share: bool
    write: str  # "back" | "through"
    regex: re.Pattern[str] = field(repr=False, compare=False)
    exact: re.Pattern[str] = field(repr=False, compare=False)

    @classmethod
    def from_config(cls, index: int, rule: RuleConfig, default_write: str) -> CompiledRule:
        body = glob_to_regex(rule.match)
        return cls(
            index=index,
            match=rule.match,
            source=rule.source,
            place=rule.place,
            pin=bool(rule.pin),
            keep_newest=rule.keep_newest,
            demote_after=rule.demote_after,
            evict_after=rule.evict_after,
            promote=rule.promote or "on_access",
            cache=rule.cache is not False,
            share=rule.share is not False,
            write=rule.write or default_write,
            regex=re.compile(f"(?:{body})(?=/|$)", re.DOTALL),
            exact=re.compile(body, re.DOTALL),
        )


@dataclass(frozen=True, slots=True)
class RuleMatch:
    """The rule that governs a path, and the entry it matched."""

    rule: CompiledRule
    anchor: str  # the shortest matching prefix of the path: the matched entry
    anchor_parent: str  # its parent directory ("" = the mount root)


class RuleSet:
    """Rules in order, compiled once; ``match_path`` is first-match-wins with a cache."""

    def __init__(
        self,
        rules: Iterable[RuleConfig],
        *,
        default_write: str = "back",
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self.rules: tuple[CompiledRule, ...] = tuple(
            CompiledRule.from_config(index, rule, default_write) for index, rule in enumerate(rules)
        )
        self._cache: OrderedDict[str, RuleMatch | None] = OrderedDict()
        self._cache_size = cache_size

    def __len__(self) -> int:
        return len(self.rules)

    def with_own_cache(self) -> RuleSet:
        """The same compiled rules with an empty cache of its own: for a
        thread (the lifecycle's planner) beside the event loop's matcher,
        whose cache is not shared across threads.  Nothing is compiled."""
        twin = RuleSet((), cache_size=self._cache_size)
        twin.rules = self.rules
        return twin

    def clear_cache(self) -> None:
        self._cache.clear()

    def match_path(self, relpath: str) -> RuleMatch | None:
        """The first rule that matches ``relpath`` or one of its ancestors; None if none."""
        cache = self._cache
        if relpath in cache:
            cache.move_to_end(relpath)
            return cache[relpath]
        result = self._match(relpath)
        cache[relpath] = result
        if len(cache) > self._cache_size:
            cache.popitem(last=False)
        return result

    def _match(self, relpath: str) -> RuleMatch | None:
        path = relpath.strip("/")
        if not path:
            return None
        for rule in self.rules:
            if rule.regex.match(path) is None:
                continue
            end = path.find("/")
            while True:
                prefix = path if end < 0 else path[:end]
                if rule.exact.fullmatch(prefix):
                    return RuleMatch(rule, prefix, prefix.rpartition("/")[0])
                if end < 0:  # pragma: no cover - the regex promised a match
                    raise AssertionError(f"{rule.match!r} matched {path!r} but no prefix did")
                end = path.find("/", end + 1)
        return None


# --- shadowed rules ---------------------------------------------------------------------------


def _is_literal(segment: str) -> bool:
    return not (_GLOB_CHARS & set(segment))


def _segment_covers(earlier: str, later: str) -> bool:
    """Every segment matching ``later`` also matches ``earlier`` (sound, not complete)."""
    if earlier == "*" or earlier == later:
        return True
    return _is_literal(later) and re.fullmatch(_segment_regex(earlier), later) is not None


def _covers(earlier: str, later: str) -> bool:
    """Every path that ``later`` matches is matched by ``earlier`` (sound, not complete)."""
    first = pattern_segments(earlier)
    second = pattern_segments(later)
    if first == second or first == ["**"]:
        return True
    if first[-1] == "**":
        # "a/**" matches a path when "a/<one segment>" is a prefix of it: the same as "a/*".
        first = [*first[:-1], "*"]
    if "**" in first:
        return False
    if second[-1] == "**":
        second = [*second[:-1], "*"]
    head = second[: len(first)]
    if len(head) < len(first) or "**" in head:
        return False
    return all(_segment_covers(a, b) for a, b in zip(first, head, strict=True))


def shadowed_rules(rules: Sequence[RuleConfig]) -> list[tuple[RuleConfig, RuleConfig]]:
    """``(rule, earlier_rule)`` for each rule that an earlier rule shadows entirely.

    The earliest shadowing rule is named.  See the module docstring for the
    cases that are detected.
    """
    out: list[tuple[RuleConfig, RuleConfig]] = []
    for index, rule in enumerate(rules):
        for earlier in rules[:index]:
            if _covers(earlier.match, rule.match):
                out.append((rule, earlier))
                break
    return out
