"""tierfs.policy.rules: glob semantics against a reference, anchors, shadowed rules."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.config import RuleConfig
from tierfs.policy.rules import RuleSet, glob_to_regex, shadowed_rules

# --- a reference implementation of the contract's glob semantics ---------------------------------
# Written independently of the regex translation: recursion over segments, with
# fnmatchcase for one segment (segments never contain "/", so fnmatch's "*" cannot
# cross one).


def ref_exact(pattern: list[str], path: list[str]) -> bool:
    """``pattern`` (segments) matches exactly ``path`` (segments)."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        least = 0 if rest else 1  # at the end: one or more segments; elsewhere zero or more
        return any(ref_exact(rest, path[k:]) for k in range(least, len(path) + 1))
    return bool(path) and fnmatchcase(path[0], head) and ref_exact(rest, path[1:])


def ref_first_match(patterns: list[str], path: str) -> tuple[int, str] | None:
    """(rule index, anchor) of the first pattern matching the path or an ancestor."""
    segments = path.split("/")
    for index, pattern in enumerate(patterns):
        pattern_segments = pattern.rstrip("/").split("/")
        for k in range(1, len(segments) + 1):
            if ref_exact(pattern_segments, segments[:k]):
                return index, "/".join(segments[:k])
    return None


PATH_SEGMENTS = st.sampled_from(["a", "b", "ab", "ba", ".a", "c.tmp", "step-1", "step-22"])
PATTERN_SEGMENTS = st.one_of(
    PATH_SEGMENTS,
    st.sampled_from(["*", "**", "?", "a*", "*b", "[ab]", "[!a]", "[a-c]*", "step-?", "*.tmp"]),
)
patterns = st.lists(PATTERN_SEGMENTS, min_size=1, max_size=4).map("/".join)
paths = st.lists(PATH_SEGMENTS, min_size=1, max_size=6).map("/".join)


def rules_of(*matches: str) -> list[RuleConfig]:
    return [RuleConfig(match=m, source=f"test:{i + 1}") for i, m in enumerate(matches)]


@settings(max_examples=600)
@given(st.lists(patterns, min_size=1, max_size=5), st.lists(paths, min_size=1, max_size=10))
def test_match_path_agrees_with_the_reference(
    pattern_list: list[str], path_list: list[str]
) -> None:
    rule_set = RuleSet(rules_of(*pattern_list))
    for path in path_list:
        got = rule_set.match_path(path)
        want = ref_first_match(pattern_list, path)
        if want is None:
            assert got is None, (pattern_list, path, got)
            continue
        assert got is not None, (pattern_list, path, want)
        assert (got.rule.index, got.anchor) == want, (pattern_list, path)
        assert got.anchor_parent == want[1].rpartition("/")[0]
        assert got.rule.match == pattern_list[want[0]]


@settings(max_examples=300)
@given(patterns, paths)
def test_the_exact_regex_agrees_with_the_reference(pattern: str, path: str) -> None:
    exact = re.fullmatch(glob_to_regex(pattern), path) is not None
    assert exact == ref_exact(pattern.split("/"), path.split("/"))


@pytest.mark.parametrize(
    ("pattern", "path", "anchor"),
    [
        # The contract's examples.
        ("checkpoints/*", "checkpoints/step-1/model.pt", "checkpoints/step-1"),
        ("checkpoints/*", "checkpoints/step-1", "checkpoints/step-1"),
        ("checkpoints/*", "checkpoints", None),  # the directory itself is not an entry
        ("datasets/val/**", "datasets/val/x/y.tar", "datasets/val/x"),
        ("datasets/val/**", "datasets/val", None),
        ("datasets/**", "datasets/train/shard-0.tar", "datasets/train"),
        ("scratch/huge/**", "scratch/huge/a", "scratch/huge/a"),
        # "*" does not cross "/", "**" does.
        ("*.pt", "a/model.pt", None),
        ("*.pt", "model.pt", "model.pt"),
        ("**/*.pt", "a/b/model.pt", "a/b/model.pt"),
        ("**/*.pt", "model.pt", "model.pt"),
        ("a/**/b", "a/b", "a/b"),
        ("a/**/b", "a/x/y/b/z", "a/x/y/b"),
        ("a*b", "axb", "axb"),
        ("a**b", "ax/yb", None),  # "**" inside a segment is two "*"
        ("a?c", "abc", "abc"),
        ("a?c", "a/c", None),
        ("[!a]x", "bx", "bx"),
        ("[!a]x", "ax", None),
        ("[^a]x", "ax", None),
        ("[]a]x", "]x", "]x"),
        ("[a-c]x", "bx", "bx"),
        ("[c-a]x", "bx", None),  # a reversed range matches nothing
        ("[ax", "[ax", "[ax"),  # no closing bracket: literal
        ("a/[!b]/c", "a//c", None),
        ("data/", "data/x", "data"),  # a trailing "/" is ignored
        (".*", ".hidden/x", ".hidden"),
        ("*", ".hidden", ".hidden"),  # "*" matches a leading dot
        ("Data/*", "data/x", None),  # case-sensitive
        ("a+b(c)/*", "a+b(c)/x", "a+b(c)/x"),  # regex characters are literal
    ],
)
def test_glob_examples(pattern: str, path: str, anchor: str | None) -> None:
    match = RuleSet(rules_of(pattern)).match_path(path)
    assert (match.anchor if match else None) == anchor


def test_first_match_wins_and_effective_settings() -> None:
    rules = [
        RuleConfig(match="datasets/val/**", source="f:1", pin=True),
        RuleConfig(
            match="datasets/**", source="f:5", evict_after=60.0, promote="never", write="through"
        ),
        RuleConfig(match="scratch/**", source="f:9", cache=False),
    ]
    rule_set = RuleSet(rules, default_write="back")
    val = rule_set.match_path("datasets/val/a")
    train = rule_set.match_path("datasets/train/a")
    scratch = rule_set.match_path("scratch/x")
    assert val is not None and train is not None and scratch is not None
    assert (val.rule.index, val.rule.source, val.rule.pin, val.rule.cache) == (0, "f:1", True, True)
    assert (val.rule.promote, val.rule.write, val.rule.evict_after) == ("on_access", "back", None)
    assert (train.rule.index, train.rule.pin, train.rule.evict_after) == (1, False, 60.0)
    assert (train.rule.promote, train.rule.write) == ("never", "through")
    assert (scratch.rule.cache, scratch.rule.place, scratch.rule.keep_newest) == (False, None, None)
    assert rule_set.match_path("other/x") is None
    assert rule_set.match_path("") is None


def test_match_path_caches_and_stays_bounded() -> None:
    rule_set = RuleSet(rules_of("a/*"), cache_size=4)
    first = rule_set.match_path("a/b/c")
    assert rule_set.match_path("a/b/c") is first
    for i in range(10):
        rule_set.match_path(f"a/{i}")
    assert len(rule_set._cache) == 4
    rule_set.clear_cache()
    assert len(rule_set._cache) == 0
    assert rule_set.match_path("a/b/c") == first


def test_a_twin_shares_the_compiled_rules_and_not_the_cache() -> None:
    """The lifecycle's planner thread takes a twin of the loop's rules:
    nothing is compiled again, and neither sees the other's cache."""
    rule_set = RuleSet(rules_of("a/*", "b/**"))
    rule_set.match_path("a/x")
    twin = rule_set.with_own_cache()
    assert twin.rules is rule_set.rules
    assert len(twin._cache) == 0 and len(rule_set._cache) == 1
    assert twin.match_path("b/y/z") == rule_set.match_path("b/y/z")
    assert twin.match_path("a/x") == rule_set.match_path("a/x")
    assert twin.match_path("c") is None


# --- shadowed rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("data/x/*", "data/x/*"),
        ("data/x/*", "data/x/*/"),
        ("**", "anything/at/all"),
        ("**", "**/x"),
        ("data/**", "data/x/*"),
        ("data/*", "data/x/*"),
        ("data/*", "data/x"),
        ("data/**", "data/x/**/y"),
        ("*.tmp", "x.tmp/**"),
        ("logs/[0-9]*", "logs/2024/**"),
        ("*/*", "a/b/c"),
        ("a/**", "a/b/**"),
    ],
)
def test_shadowed_cases(earlier: str, later: str) -> None:
    rules = rules_of("unrelated/*", earlier, later)
    assert shadowed_rules(rules) == [(rules[2], rules[1])]


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("data/x/*", "data/**"),  # narrower first: the normal order
        ("data/*", "data"),  # "data" itself (a file) is not matched by "data/*"
        ("data/**", "data"),
        ("a/*/c", "a/**/c"),  # "a/c" matches the later one only
        ("**/x", "a/x"),  # shadowed, but not a detected case
        ("*.tmp", "*/x.tmp"),
        ("a/[!b]", "a/b"),
        ("a/[^b]", "a/b"),  # "^" negates here, unlike fnmatch
        ("a/?", "a/bc"),
        ("data/*", "dat?/x"),
    ],
)
def test_not_shadowed(earlier: str, later: str) -> None:
    assert shadowed_rules(rules_of(earlier, later)) == []


def test_shadowed_names_the_earliest_rule() -> None:
    rules = rules_of("a/**", "**", "a/b")
    assert shadowed_rules(rules) == [(rules[2], rules[0])]


@settings(max_examples=400)
@given(patterns, patterns, st.data())
def test_shadowed_rules_has_no_false_positives(
    earlier: str, later: str, data: st.DataObject
) -> None:
    """When a rule is reported as shadowed, every path it matches also matches the earlier one."""
    rules = rules_of(earlier, later)
    if not shadowed_rules(rules):
        return
    # Paths that the later pattern matches (exactly, plus a subtree below).
    path_strategy = st.from_regex(
        rf"\A{glob_to_regex(later)}(?:/[a-z]{{1,3}}){{0,2}}\Z", fullmatch=True
    ).filter(lambda p: "" not in p.split("/"))
    for path in data.draw(st.lists(path_strategy, min_size=1, max_size=10)):
        assert ref_first_match([later], path) is not None, (later, path)
        assert ref_first_match([earlier], path) is not None, (earlier, later, path)
