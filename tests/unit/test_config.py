"""tierfs.config: loading, validation with file:line, the line locator, examples."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs import config as config_mod
from tierfs.config import (
    BackingURL,
    Config,
    RuleConfig,
    TomlLocator,
    check_file,
    load_config,
    load_policy,
    parse_backing_url,
)
from tierfs.config import loader as config_loader
from tierfs.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
MiB = 1024 * 1024


# --- helpers ------------------------------------------------------------------------------


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the ``nth`` line of ``text`` that contains ``needle``."""
    found = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(found) >= nth, f"{needle!r} not found {nth} times"
    return found[nth - 1]


@pytest.fixture
def tier_dirs(tmp_path: Path) -> dict[str, Path]:
    dirs = {name: tmp_path / "mnt" / name for name in ("nvme", "hdd", "state")}
    for name in ("nvme", "hdd"):
        dirs[name].mkdir(parents=True)
    return dirs


DESIGN_EXAMPLE = """\
[backing]
url = "s3://bucket/some/prefix"      # or "file:///srv/tierfs-bucket"
endpoint_url = "http://127.0.0.1:9000"  # optional; any S3-compatible endpoint
region = "us-east-1"                  # optional

[state]
dir = "{state}"          # LMDB; put it on NVMe

[[tiers]]                             # fastest first
name = "nvme"
path = "{nvme}"
capacity = "1.5TiB"                   # optional: default is the filesystem size
high_watermark = 0.80
low_watermark = 0.70

[[tiers]]
name = "hdd"
path = "{hdd}"
high_watermark = 0.90
low_watermark = 0.80

[fetch]                               # all optional
block_size = "4MiB"
readahead_max = "256MiB"
concurrency = 32

[namespace]                           # all optional
list_ttl = "60s"                      # re-list a directory from S3 after this
revalidate_ttl = "60s"                # HEAD a cached clean file on open after this
file_mode = "0644"                    # for objects that carry no x-amz-meta-mode
dir_mode = "0755"

[write]                               # all optional
mode = "back"                         # "back": upload after close; "through": fsync/close wait for S3
upload_delay = "5s"                   # wait after the last close before uploading

[mover]                               # all optional
interval = "5s"                       # how often tiers are checked when nothing wakes the mover
bandwidth = "0"                       # cap on the mover's copies, e.g. "200MiB/s"; "0" = none

[metrics]                             # optional; off by default
listen = "127.0.0.1:9567"             # Prometheus text at /metrics; every series is named tierfs_*

[[rules]]                             # lifecycle rules, first match wins; they may also
match = "checkpoints/*"               # live in policy files listed under `policy_files = [...]`
place = "nvme"                        # a rule that matches a directory covers its whole subtree
keep_newest = 2                       # per parent directory, the 2 newest matched entries (by mtime,
                                      # whole subtrees) stay on the first tier; older ones go first
demote_after = "3d"                   # untouched this long: leaves the first tier
write = "back"                        # "back" (default) or "through"

[[rules]]
match = "datasets/val/**"             # `**` crosses directories, `*` does not
pin = true                            # never demoted or evicted

[[rules]]
match = "datasets/**"
promote = "on_access"                 # "on_access" (default) or "never"
evict_after = "14d"                   # untouched this long: clean local copies are dropped

[[rules]]
match = "scratch/huge/**"
cache = false                         # read straight from S3; nothing is kept locally
"""


def design_text(dirs: dict[str, Path]) -> str:
    return DESIGN_EXAMPLE.format(**{k: str(v) for k, v in dirs.items()})


Write = Callable[..., Path]


@pytest.fixture
def write(tmp_path: Path) -> Write:
    def _write(text: str, name: str = "tierfs.toml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return _write


MINIMAL = """\
[backing]
url = "s3://bucket"

[state]
dir = "state"

[[tiers]]
name = "nvme"
path = "nvme"
"""


@pytest.fixture
def minimal(tmp_path: Path) -> str:
    """A minimal valid config with relative paths; its tier dir exists."""
    (tmp_path / "nvme").mkdir()
    return MINIMAL


def problems_of(path: Path, **kwargs: bool) -> list[tuple[str, int, str]]:
    with pytest.raises(ConfigError) as info:
        load_config(path, **kwargs)
    # load_config and check_file agree on full configs.
    assert check_file(path, **kwargs) == info.value.problems
    return info.value.problems


def only_problem(path: Path, **kwargs: bool) -> tuple[str, int, str]:
    problems = problems_of(path, **kwargs)
    assert len(problems) == 1, problems
    return problems[0]


# --- the example of the config contract ------------------------------------------------------


def test_design_example_loads(write: Write, tier_dirs: dict[str, Path]) -> None:
    text = design_text(tier_dirs)
    path = write(text)
    cfg = load_config(path)
    assert check_file(path) == []

    assert isinstance(cfg, Config)
    assert cfg.source == path
    assert cfg.backing.url == "s3://bucket/some/prefix"
    assert cfg.backing.endpoint_url == "http://127.0.0.1:9000"
    assert cfg.backing.region == "us-east-1"
    assert cfg.state.dir == tier_dirs["state"]
    assert [t.name for t in cfg.tiers] == ["nvme", "hdd"]
    nvme, hdd = cfg.tiers
    assert nvme.path == tier_dirs["nvme"]
    assert nvme.capacity == 3 * 1024**4 // 2
    assert (nvme.high_watermark, nvme.low_watermark) == (0.80, 0.70)
    assert hdd.path == tier_dirs["hdd"]
    assert hdd.capacity is None
    assert (hdd.high_watermark, hdd.low_watermark) == (0.90, 0.80)
    assert cfg.fetch.block_size == 4 * MiB
    assert cfg.fetch.readahead_max == 256 * MiB
    assert cfg.fetch.concurrency == 32
    assert cfg.namespace.list_ttl == 60.0
    assert cfg.namespace.revalidate_ttl == 60.0
    assert cfg.namespace.file_mode == 0o644
    assert cfg.namespace.dir_mode == 0o755
    assert cfg.namespace.uid is None and cfg.namespace.gid is None
    assert cfg.write.mode == "back"
    assert cfg.write.upload_delay == 5.0
    assert cfg.mover == config_mod.MoverConfig(interval=5.0, bandwidth=0)
    assert cfg.metrics == config_mod.MetricsConfig(
        listen="127.0.0.1:9567", host="127.0.0.1", port=9567
    )
    assert cfg.metrics.enabled
    assert cfg.rules == (
        RuleConfig(
            match="checkpoints/*",
            source=f"{path}:{line_of(text, '[[rules]]', 1)}",
            place="nvme",
            keep_newest=2,
            demote_after=3 * 86400.0,
            write="back",
        ),
        RuleConfig(
            match="datasets/val/**",
            source=f"{path}:{line_of(text, '[[rules]]', 2)}",
            pin=True,
        ),
        RuleConfig(
            match="datasets/**",
            source=f"{path}:{line_of(text, '[[rules]]', 3)}",
            promote="on_access",
            evict_after=14 * 86400.0,
        ),
        RuleConfig(
            match="scratch/huge/**",
            source=f"{path}:{line_of(text, '[[rules]]', 4)}",
            cache=False,
        ),
    )
    assert cfg.policy_files == ()


def test_config_is_frozen(write: Write, minimal: str) -> None:
    cfg = load_config(write(minimal))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tiers = ()  # type: ignore[misc]


def test_minimal_config_gets_defaults(write: Write, minimal: str, tmp_path: Path) -> None:
    cfg = load_config(write(minimal))
    assert cfg.backing == config_mod.BackingConfig(url="s3://bucket")
    (tier,) = cfg.tiers
    assert (tier.high_watermark, tier.low_watermark) == (0.90, 0.80)
    assert tier.capacity is None
    assert cfg.fetch == config_mod.FetchConfig()
    assert cfg.namespace == config_mod.NamespaceConfig()
    assert cfg.write == config_mod.WriteConfig()
    assert cfg.mover == config_mod.MoverConfig(interval=5.0, bandwidth=0)
    assert cfg.metrics == config_mod.MetricsConfig()
    assert not cfg.metrics.enabled
    assert cfg.rules == ()
    # The state dir does not exist yet: fine, its parent is writable.
    assert cfg.state.dir == tmp_path / "state"
    assert not cfg.state.dir.exists()


# --- the cases the brief names ---------------------------------------------------------------


def test_misspelt_key_is_reported_at_its_line(write: Write, tier_dirs: dict[str, Path]) -> None:
    text = design_text(tier_dirs).replace("high_watermark = 0.90", "hihg_watermark = 0.90")
    path = write(text)
    file, line, sentence = only_problem(path)
    assert file == str(path)
    assert line == line_of(text, "hihg_watermark") == 19
    assert sentence == 'unknown key "hihg_watermark" in [[tiers]]; did you mean "high_watermark"?'


def test_low_not_below_high_is_reported_at_the_low_line(
    write: Write, tier_dirs: dict[str, Path]
) -> None:
    text = design_text(tier_dirs).replace("low_watermark = 0.70", "low_watermark = 0.85")
    path = write(text)
    assert only_problem(path) == (
        str(path),
        line_of(text, "low_watermark = 0.85"),
        "low_watermark 0.85 must be below high_watermark 0.8",
    )


def test_low_equal_to_high_is_an_error(write: Write, minimal: str) -> None:
    text = minimal + 'high_watermark = "80%"\nlow_watermark = 0.8\n'
    path = write(text)
    _, line, sentence = only_problem(path)
    assert line == line_of(text, "low_watermark")
    assert sentence == "low_watermark 0.8 must be below high_watermark 0.8"


def test_high_below_the_default_low_is_reported_at_the_high_line(
    write: Write, minimal: str
) -> None:
    text = minimal + "high_watermark = 0.7\n"
    path = write(text)
    _, line, sentence = only_problem(path)
    assert line == line_of(text, "high_watermark")
    assert sentence == "low_watermark 0.8 (the default) must be below high_watermark 0.7"


def test_duplicate_tier_names(write: Write, tier_dirs: dict[str, Path]) -> None:
    text = design_text(tier_dirs).replace('name = "hdd"', 'name = "nvme"')
    path = write(text)
    _, line, sentence = only_problem(path)
    assert line == line_of(text, 'name = "nvme"', 2)
    assert sentence == (
        f'the tier name "nvme" is already used by the tier at line '
        f"{line_of(text, 'name = ')}; tier names must be unique"
    )


def test_missing_tier_path(write: Write, tier_dirs: dict[str, Path]) -> None:
    shutil.rmtree(tier_dirs["hdd"])
    text = design_text(tier_dirs)
    path = write(text)
    assert only_problem(path) == (
        str(path),
        line_of(text, f'path = "{tier_dirs["hdd"]}"'),
        f'the tier path "{tier_dirs["hdd"]}" does not exist; create it or fix the path',
    )
    # Without filesystem checks the same file is fine.
    assert check_file(path, check_paths=False) == []
    assert load_config(path, check_paths=False).tiers[1].path == tier_dirs["hdd"]


def test_toml_syntax_error_carries_its_line(write: Write, tier_dirs: dict[str, Path]) -> None:
    text = design_text(tier_dirs).replace("concurrency = 32", "concurrency 32")
    path = write(text)
    file, line, sentence = only_problem(path)
    assert (file, line) == (str(path), line_of(text, "concurrency 32"))
    assert sentence.startswith("this is not valid TOML: ")
    assert "column" in sentence


def test_syntax_error_at_end_of_document(write: Write) -> None:
    path = write('[backing]\nurl = "s3://bucket\n')
    _, line, sentence = only_problem(path)
    assert line == 2
    assert "not valid TOML" in sentence


def test_duplicate_key_is_a_syntax_error(write: Write, minimal: str) -> None:
    text = minimal + 'name = "again"\n'
    _, line, sentence = only_problem(write(text))
    assert "not valid TOML" in sentence
    assert line == text.count("\n")


def test_multiple_errors_are_reported_together(write: Write, tier_dirs: dict[str, Path]) -> None:
    text = (
        design_text(tier_dirs)
        .replace('url = "s3://bucket/some/prefix"', 'url = "s3://Bad_Bucket"')
        .replace('capacity = "1.5TiB"', 'capacity = "1.5XB"')
        .replace("high_watermark = 0.90", "hihg_watermark = 0.90")
        .replace('name = "hdd"', 'name = "nvme"')
        .replace('block_size = "4MiB"', 'block_size = "3MiB"')
        .replace("concurrency = 32", "concurrency = 0")
        .replace('list_ttl = "60s"', 'list_ttl = "soon"')
        .replace('mode = "back"', 'mode = "bak"')
        .replace("keep_newest = 2", "keep_newest = 0")
        .replace("pin = true", 'pin = "no"')
        .replace('interval = "5s"', 'interval = "0s"')
        .replace('listen = "127.0.0.1:9567"', 'listen = "127.0.0.1"')
    )
    path = write(text)
    problems = problems_of(path)
    by_line = {line: sentence for _, line, sentence in problems}
    expected = {
        line_of(text, "Bad_Bucket"): "is not a valid bucket name",
        line_of(text, "1.5XB"): 'capacity: "1.5XB" is not a size',
        line_of(text, "hihg_watermark"): 'did you mean "high_watermark"',
        line_of(text, 'name = "nvme"', 2): "already used by the tier at line",
        line_of(text, "block_size"): "power of two",
        line_of(
            text, "concurrency"
        ): "concurrency: 0 is out of range; use an integer from 1 to 1024",
        line_of(text, "list_ttl"): 'list_ttl: "soon" is not a duration',
        line_of(
            text, '"bak"'
        ): 'mode: "bak" is not allowed; use "back" or "through"; did you mean "back"?',
        line_of(text, "keep_newest"): "keep_newest: 0 is out of range; use an integer at least 1",
        line_of(text, 'pin = "no"'): "pin: expected true or false, got a string",
        line_of(text, 'interval = "0s"'): "interval: must be more than zero",
        line_of(text, 'listen = "127.0.0.1"'): 'listen: "127.0.0.1" has no port',
    }
    assert len(problems) == len(expected), problems
    for line, fragment in expected.items():
        assert fragment in by_line[line], (line, by_line.get(line))
    assert all(file == str(path) for file, _, _ in problems)
    assert [line for _, line, _ in problems] == sorted(by_line)
    # The exception's text is one "file:line: sentence" per problem.
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines()[0] == f"{path}:{problems[0][1]}: {problems[0][2]}"


def test_policy_file_errors_carry_the_policy_file_and_line(
    write: Write, tier_dirs: dict[str, Path], tmp_path: Path
) -> None:
    policy = dedent(
        """
        # rules for checkpoints
        [[rules]]
        match = "ckpt/**"
        place = "ssd"

        [[rules]]
        match = "logs/**"
        demote_after = "soon"
        write = "through"
        """
    )
    write(policy, "policies/ckpt.toml")
    # One problem in the main file too: it comes first, then the policy file's.
    text = 'policy_files = ["policies/ckpt.toml"]\n' + design_text(tier_dirs).replace(
        "keep_newest = 2", "keep_newest = -2"
    )
    path = write(text)
    problems = problems_of(path)
    policy_file = str(tmp_path / "policies" / "ckpt.toml")
    assert problems == [
        (
            str(path),
            line_of(text, "keep_newest"),
            "keep_newest: -2 is out of range; use an integer at least 1",
        ),
        (
            policy_file,
            line_of(policy, "place"),
            'place: "ssd" is not a configured tier (the tiers are "nvme", "hdd")',
        ),
        (
            policy_file,
            line_of(policy, "demote_after"),
            'demote_after: "soon" is not a duration; use a number with a unit '
            "(ms, s, m, h, d or w) like 60s, 3d or 1h30m",
        ),
    ]


# --- policy files ------------------------------------------------------------------------------


def test_policy_rules_come_after_inline_rules(
    write: Write, tier_dirs: dict[str, Path], tmp_path: Path
) -> None:
    write('[[rules]]\nmatch = "a/**"\nplace = "hdd"\n', "p1.toml")
    write('[[rules]]\nmatch = "b/**"\npin = true\n', "sub/p2.toml")
    text = 'policy_files = ["p1.toml", "sub/p2.toml"]\n' + design_text(tier_dirs)
    cfg = load_config(write(text))
    assert [r.match for r in cfg.rules] == [
        "checkpoints/*",
        "datasets/val/**",
        "datasets/**",
        "scratch/huge/**",
        "a/**",
        "b/**",
    ]
    assert cfg.rules[4].source == f"{tmp_path / 'p1.toml'}:1"
    assert cfg.rules[5].source == f"{tmp_path / 'sub' / 'p2.toml'}:1"
    assert cfg.policy_files == (tmp_path / "p1.toml", tmp_path / "sub" / "p2.toml")


def test_missing_policy_file_is_reported_at_its_entry(
    write: Write, minimal: str, tmp_path: Path
) -> None:
    text = 'policy_files = [\n  "there.toml",\n  "gone.toml",\n  "sub",\n]\n' + minimal
    write("", "there.toml")
    (tmp_path / "sub").mkdir()
    path = write(text)
    assert problems_of(path) == [
        (
            str(path),
            3,
            f'the policy file "gone.toml" does not exist (looked for "{tmp_path / "gone.toml"}")',
        ),
        (
            str(path),
            4,
            f'the policy file "sub" is not a regular file (looked for "{tmp_path / "sub"}")',
        ),
    ]


def test_policy_file_names_are_shown_relative_to_how_the_config_was_named(
    write: Write, minimal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write('[[rules]]\nmatch = "/abs/**"\n', "conf/pol.toml")
    (tmp_path / "conf" / "nvme").mkdir(parents=True)
    write('policy_files = ["pol.toml"]\n' + MINIMAL, "conf/tierfs.toml")
    monkeypatch.chdir(tmp_path)
    problems = problems_of(Path("conf/tierfs.toml"))
    assert problems == [
        (
            os.path.join("conf", "pol.toml"),
            2,
            "match: \"/abs/**\" starts with '/'; patterns are relative to the mount root, "
            'write "abs/**"',
        )
    ]


def test_policy_file_may_hold_only_rules(write: Write, minimal: str, tmp_path: Path) -> None:
    policy = '[[rules]]\nmatch = "x/**"\n\n[[tiers]]\nname = "extra"\n\n[[rule]]\nmatch = "y"\n'
    write(policy, "pol.toml")
    path = write('policy_files = ["pol.toml"]\n' + minimal)
    problems = problems_of(path)
    pol = str(tmp_path / "pol.toml")
    assert problems == [
        (
            pol,
            4,
            "a policy file holds only [[rules]] and [[quotas]]; "
            '"tiers" belongs in the main config file',
        ),
        (
            pol,
            7,
            'unknown key "rule": a policy file holds only [[rules]] and [[quotas]]; '
            'did you mean "rules"?',
        ),
    ]


def test_policy_file_syntax_error(write: Write, minimal: str, tmp_path: Path) -> None:
    write('[[rules]]\nmatch = "x/**"\nplace = \n', "pol.toml")
    path = write('policy_files = ["pol.toml"]\n' + minimal)
    file, line, sentence = only_problem(path)
    assert (file, line) == (str(tmp_path / "pol.toml"), 3)
    assert sentence.startswith("this is not valid TOML")


def test_policy_files_listed_twice_or_self(write: Write, minimal: str) -> None:
    write('[[rules]]\nmatch = "x/**"\n', "pol.toml")
    text = 'policy_files = ["pol.toml", "./pol.toml", "tierfs.toml"]\n' + minimal
    path = write(text)
    problems = problems_of(path)
    assert [p[1] for p in problems] == [1, 1]
    assert problems[0][2] == 'the policy file "./pol.toml" is already listed at line 1'
    assert problems[1][2] == 'policy_files lists the config file itself ("tierfs.toml")'


def test_policy_files_must_be_an_array_of_strings(write: Write, minimal: str) -> None:
    path = write('policy_files = "pol.toml"\n' + minimal)
    assert only_problem(path)[2] == (
        'policy_files must be an array of paths like ["policy.toml"], not a string'
    )
    path = write("policy_files = [1]\n" + minimal)
    assert only_problem(path)[1:] == (1, "policy_files entry 1: expected a string, got an integer")


def test_policy_files_placed_after_a_table_get_a_hint(write: Write, minimal: str) -> None:
    text = minimal + 'policy_files = ["p.toml"]\n'
    path = write(text)
    assert only_problem(path)[1:] == (
        text.count("\n"),
        'unknown key "policy_files" in [[tiers]]; "policy_files" is a top-level key: '
        "move it above the first [table] header",
    )


def test_duplicate_rule_pattern_across_files(write: Write, minimal: str, tmp_path: Path) -> None:
    write('[[rules]]\nmatch = "a/**"\n', "pol.toml")
    text = 'policy_files = ["pol.toml"]\n' + minimal + '\n[[rules]]\nmatch = "a/**"\npin = true\n'
    path = write(text)
    rule_line = line_of(text, "[[rules]]")
    assert only_problem(path) == (
        str(tmp_path / "pol.toml"),
        2,
        f'this rule can never apply: the rule at {path}:{rule_line} has the same pattern "a/**" '
        "and comes first (first match wins)",
    )


def test_load_policy(write: Write) -> None:
    path = write('[[rules]]\nmatch = "a/**"\nplace = "nvme"\n\n[[rules]]\nmatch = "b"\n', "p.toml")
    rules = load_policy(path)
    assert [(r.match, r.place, r.source) for r in rules] == [
        ("a/**", "nvme", f"{path}:1"),
        ("b", None, f"{path}:5"),
    ]
    assert load_policy(path, tiers=["nvme"]) == rules
    with pytest.raises(ConfigError) as info:
        load_policy(path, tiers=["hdd"])
    assert info.value.problems == [
        (str(path), 3, 'place: "nvme" is not a configured tier (the tiers are "hdd")')
    ]


# --- check_file ------------------------------------------------------------------------------


def test_check_file_on_a_policy_file(write: Write) -> None:
    text = dedent(
        """
        [[rules]]
        match = "ckpt/**"
        place = "any-tier-name"     # not checkable without the main config
        keep_newest = 3

        [[rules]]
        match = "data/**"
        promote = "sometimes"
        """
    )
    path = write(text, "policy.toml")
    assert check_file(path) == [
        (
            str(path),
            line_of(text, "promote"),
            'promote: "sometimes" is not allowed; use "on_access" or "never"',
        )
    ]


def test_check_file_on_an_empty_policy_file(write: Write) -> None:
    assert check_file(write("# nothing yet\n", "p.toml")) == []


def test_check_file_on_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert check_file(path) == [(str(path), 0, "cannot read the file: No such file or directory")]


def test_check_file_on_invalid_utf8(write: Write, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b'[backing]\nurl = "s3://b\xff"\n')
    assert check_file(path) == [(str(path), 2, "the file is not valid UTF-8 text")]


def test_utf8_bom_is_accepted(write: Write, minimal: str, tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + minimal.encode())
    assert load_config(path).tiers[0].name == "nvme"


# --- examples in deploy/ ------------------------------------------------------------------------


def test_example_files_pass_check_file_without_path_checks() -> None:
    """The examples name node paths (/mnt/nvme0, ...) that do not exist here."""
    assert check_file(EXAMPLES / "tierfs.toml", check_paths=False) == []
    assert check_file(EXAMPLES / "policy.toml") == []
    cfg = load_config(EXAMPLES / "tierfs.toml", check_paths=False)
    assert [t.name for t in cfg.tiers] == ["nvme", "hdd"]
    assert cfg.policy_files == (EXAMPLES / "policy.toml",)
    assert len(cfg.rules) > 2


def test_example_config_passes_all_checks_with_paths_rewritten(tmp_path: Path) -> None:
    """Copy the example with its tier paths and state dir moved under tmp_path."""
    text = (EXAMPLES / "tierfs.toml").read_text()
    original = load_config(EXAMPLES / "tierfs.toml", check_paths=False)
    for tier in original.tiers:
        new = tmp_path / "tiers" / tier.name
        new.mkdir(parents=True)
        text = text.replace(f'"{tier.path}"', f'"{new}"')
    text = text.replace(f'"{original.state.dir}"', f'"{tmp_path / "state"}"')
    assert str(original.tiers[0].path) not in text
    (tmp_path / "tierfs.toml").write_text(text)
    shutil.copy(EXAMPLES / "policy.toml", tmp_path / "policy.toml")
    assert check_file(tmp_path / "tierfs.toml") == []
    cfg = load_config(tmp_path / "tierfs.toml")
    assert cfg.rules == tuple(
        dataclasses.replace(r, source=r.source.replace(str(EXAMPLES), str(tmp_path)))
        for r in original.rules
    )


# --- tables and keys -------------------------------------------------------------------------


def test_missing_tables(write: Write) -> None:
    path = write("# empty config\n[fetch]\nconcurrency = 4\n")
    assert problems_of(path) == [
        (str(path), 0, 'the [backing] table is missing; add [backing] with url = "s3://bucket"'),
        (str(path), 0, 'the [state] table is missing; add [state] with dir = "/var/lib/tierfs"'),
        (
            str(path),
            0,
            "no tiers are configured; add at least one [[tiers]] with a name and a path",
        ),
    ]
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines()[0] == (
        f'{path}: the [backing] table is missing; add [backing] with url = "s3://bucket"'
    )


def test_missing_required_keys_point_at_the_table(write: Write, tmp_path: Path) -> None:
    text = '[backing]\nregion = "x"\n\n[state]\n\n[[tiers]]\ncapacity = "1GiB"\n'
    path = write(text)
    assert problems_of(path) == [
        (str(path), 1, '[backing] is missing the required key "url"'),
        (str(path), 4, '[state] is missing the required key "dir"'),
        (str(path), 6, 'this [[tiers]] entry is missing the required key "name"'),
        (str(path), 6, 'this [[tiers]] entry is missing the required key "path"'),
    ]


def test_unknown_keys_everywhere(write: Write, tmp_path: Path) -> None:
    (tmp_path / "nvme").mkdir()
    text = dedent(
        """
        tiers_extra = 1
        [backing]
        url = "s3://bucket"
        regoin = "x"
        [state]
        dir = "state"
        dirs = "x"
        [[tiers]]
        name = "nvme"
        path = "nvme"
        [fetch]
        blocksize = "4MiB"
        [namespace]
        list_tl = "1s"
        [write]
        upload_dealy = "1s"
        [[rules]]
        match = "x"
        placee = "nvme"
        [[rules]]
        match = "y"
        zzz = 1
        [[rules]]
        match = "z"
        evict_afer = "1d"
        [mover]
        bandwith = "1MiB/s"
        [metrics]
        listem = "127.0.0.1:9567"
        """
    )
    path = write(text)
    problems = problems_of(path)
    assert [(line, sentence) for _, line, sentence in problems] == [
        (1, 'unknown key "tiers_extra" in the config file; did you mean "tiers"?'),
        (4, 'unknown key "regoin" in [backing]; did you mean "region"?'),
        (7, 'unknown key "dirs" in [state]; did you mean "dir"?'),
        (12, 'unknown key "blocksize" in [fetch]; did you mean "block_size"?'),
        (14, 'unknown key "list_tl" in [namespace]; did you mean "list_ttl"?'),
        (16, 'unknown key "upload_dealy" in [write]; did you mean "upload_delay"?'),
        (19, 'unknown key "placee" in [[rules]]; did you mean "place"?'),
        (
            22,
            'unknown key "zzz" in [[rules]]; valid keys are match, place, keep_newest, '
            "demote_after, evict_after, write, pin, promote, cache, share",
        ),
        (25, 'unknown key "evict_afer" in [[rules]]; did you mean "evict_after"?'),
        (27, 'unknown key "bandwith" in [mover]; did you mean "bandwidth"?'),
        (29, 'unknown key "listem" in [metrics]; did you mean "listen"?'),
    ]


def test_credential_keys_get_a_pointer_and_are_not_echoed(write: Write, minimal: str) -> None:
    text = minimal.replace(
        'url = "s3://bucket"',
        'url = "s3://bucket"\naws_secret_access_key = "hunter2-very-secret"',
    )
    path = write(text)
    _, line, sentence = only_problem(path)
    assert line == 3
    assert "AWS chain" in sentence
    assert "hunter2" not in sentence


def test_endpoint_with_credentials_is_not_echoed(write: Write, minimal: str) -> None:
    text = minimal.replace(
        'url = "s3://bucket"',
        'url = "s3://bucket"\nendpoint_url = "http://AKIA:hunter2@host:9000"',
    )
    _, line, sentence = only_problem(write(text))
    assert line == 3
    assert "hunter2" not in sentence and "AKIA" not in sentence
    assert sentence.startswith("endpoint_url: must not contain credentials")


def test_wrong_table_types(write: Write, tmp_path: Path) -> None:
    (tmp_path / "nvme").mkdir()
    text = dedent(
        """
        backing = "s3://bucket"
        state = { dir = "state" }
        fetch = 4
        [tiers]
        name = "nvme"
        path = "nvme"
        """
    )
    path = write(text)
    assert [(line, sentence) for _, line, sentence in problems_of(path)] == [
        (1, 'backing must be a table ([backing] with url = "s3://bucket/prefix"), not a string'),
        (3, "fetch must be a table ([fetch]), not an integer"),
        (
            4,
            "tiers must be an array of tables: write [[tiers]] (double brackets) "
            "before each entry, not a table",
        ),
    ]


def test_inline_tables_are_accepted_and_located(write: Write, tmp_path: Path) -> None:
    (tmp_path / "nvme").mkdir()
    text = dedent(
        """
        backing = { url = "s3://bucket" }
        state = { dir = "state" }
        tiers = [
          { name = "nvme", path = "nvme" },
          { name = "hdd", path = "nvme", high_watermark = 2 },
        ]
        """
    )
    path = write(text)
    problems = problems_of(path)
    assert [(line, s.split(";")[0]) for _, line, s in problems] == [
        (5, "high_watermark: 2 is outside (0, 1]"),
        (
            5,
            'the tier path "'
            + str(tmp_path / "nvme")
            + '" is already used by the tier "nvme" at line 4',
        ),
    ]


def test_empty_tiers_array(write: Write) -> None:
    text = 'tiers = []\n[backing]\nurl = "s3://bkt"\n[state]\ndir = "s"\n'
    assert only_problem(write(text))[1:] == (1, "tiers is empty; configure at least one [[tiers]]")


def test_tiers_entry_must_be_a_table(write: Write) -> None:
    text = 'tiers = ["nvme"]\n[backing]\nurl = "s3://bkt"\n[state]\ndir = "s"\n'
    assert only_problem(write(text))[1:] == (1, "each entry of tiers must be a table, not a string")


# --- backing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", BackingURL("s3", bucket="bucket")),
        ("s3://bucket/", BackingURL("s3", bucket="bucket")),
        ("s3://my.bucket-1/some/prefix/", BackingURL("s3", "my.bucket-1", "some/prefix")),
        ("file:///srv/tierfs-bucket", BackingURL("file", directory=Path("/srv/tierfs-bucket"))),
        ("file:///srv/x/../y/", BackingURL("file", directory=Path("/srv/y"))),
    ],
)
def test_parse_backing_url(url: str, expected: BackingURL) -> None:
    assert parse_backing_url(url) == expected


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://ab", "not a valid bucket name"),
        ("s3://Bucket", "not a valid bucket name"),
        ("s3://my_bucket", "not a valid bucket name"),
        ("s3://-bucket", "not a valid bucket name"),
        ("s3://a..b", "not a valid bucket name"),
        ("s3://192.168.1.1", "not a valid bucket name"),
        ("s3://" + "a" * 64, "not a valid bucket name"),
        ("s3://bucket/a//b", "empty, '.' or '..' segment"),
        ("s3://bucket/a/../b", "empty, '.' or '..' segment"),
        ("file://host/dir", "not an absolute file URL"),
        ("file:relative/dir", "not an absolute file URL"),
        ("http://127.0.0.1:9000/bucket", "put the endpoint in endpoint_url"),
        ("gs://bucket", "is not a backing url; use s3://bucket/prefix or file:///absolute/dir"),
        ("bucket", "is not a backing url"),
    ],
)
def test_parse_backing_url_rejects(url: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_backing_url(url)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('endpoint_url = "ftp://host"', 'endpoint_url: "ftp://host" is not an http(s) URL'),
        ('endpoint_url = "http://"', "is not an http(s) URL"),
        ('endpoint_url = "http://host:99999"', "endpoint_url: this is not a valid URL"),
        ("endpoint_url = 9000", "endpoint_url: expected a string, got an integer"),
        ('region = "us east"', 'region: "us east" contains spaces'),
        ('region = ""', "region: must not be empty"),
        ('url = "s3://Bad"', "url: "),
    ],
)
def test_backing_value_errors(write: Write, minimal: str, line: str, fragment: str) -> None:
    text = minimal.replace('url = "s3://bucket"', 'url = "s3://bucket"\n' + line)
    if line.startswith("url"):
        text = minimal.replace('url = "s3://bucket"', line)
    _, lineno, sentence = only_problem(write(text))
    assert lineno == line_of(text, line)
    assert fragment in sentence


def test_backing_file_url_and_https_endpoint(write: Write, minimal: str) -> None:
    text = minimal.replace('url = "s3://bucket"', 'url = "file:///srv/b"')
    assert load_config(write(text)).backing.url == "file:///srv/b"
    text = minimal.replace(
        'url = "s3://bucket"', 'url = "s3://bkt/p"\nendpoint_url = "https://s3.example:443/"'
    )
    cfg = load_config(write(text))
    assert cfg.backing.endpoint_url == "https://s3.example:443/"


def test_endpoint_with_a_file_url(write: Write, minimal: str) -> None:
    text = minimal.replace(
        'url = "s3://bucket"', 'url = "file:///srv/b"\nendpoint_url = "http://127.0.0.1:9000"'
    )
    assert only_problem(write(text))[1:] == (
        3,
        "endpoint_url only applies to an s3:// backing url; remove it for a file:// url",
    )


# --- tiers --------------------------------------------------------------------------------------


def two_tiers(nvme: str, hdd: str) -> str:
    return dedent(
        f"""
        [backing]
        url = "s3://bucket"
        [state]
        dir = "state"
        [[tiers]]
        name = "nvme"
        path = "{nvme}"
        [[tiers]]
        name = "hdd"
        path = "{hdd}"
        """
    )


def test_same_path_for_two_tiers(write: Write, tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    path = write(two_tiers("t", "./t/"))
    assert only_problem(path) == (
        str(path),
        10,
        f'the tier path "{tmp_path / "t"}" is already used by the tier "nvme" at line 7; '
        "each tier needs its own directory",
    )


def test_same_path_through_a_symlink(write: Write, tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "t")
    path = write(two_tiers("t", "link"))
    assert "is already used by the tier" in only_problem(path)[2]
    # Without filesystem checks the symlink is not resolved.
    assert check_file(path, check_paths=False) == []


def test_nested_tier_paths(write: Write, tmp_path: Path) -> None:
    (tmp_path / "t" / "inner").mkdir(parents=True)
    path = write(two_tiers("t/inner", "t"))
    _, line, sentence = only_problem(path)
    assert line == 10
    assert 'overlaps the path of the tier "nvme" at line 7' in sentence


def test_tier_path_is_a_file(write: Write, tmp_path: Path) -> None:
    (tmp_path / "nvme").write_text("")
    _, line, sentence = only_problem(write(MINIMAL))
    assert line == 9
    assert sentence == f'the tier path "{tmp_path / "nvme"}" is not a directory'


def test_tier_path_not_writable(
    write: Write, minimal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() == 0:
        # root passes every access() check: simulate the answer instead.
        monkeypatch.setattr(config_loader, "_access", lambda path, mode: False)
    else:
        (tmp_path / "nvme").chmod(0o500)
    try:
        problems = problems_of(write(minimal))
    finally:
        (tmp_path / "nvme").chmod(0o700)
    tier_problems = [(line, s) for _, line, s in problems if s.startswith("the tier path")]
    assert tier_problems == [
        (
            9,
            f'the tier path "{tmp_path / "nvme"}" is not writable by this user (uid {os.geteuid()})',
        )
    ]


def test_tier_name_must_be_simple(write: Write, minimal: str) -> None:
    text = minimal.replace('name = "nvme"', 'name = "fast disk"')
    _, line, sentence = only_problem(write(text))
    assert line == 8
    assert sentence.startswith('name: "fast disk" is not a simple name')


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('capacity = "0"', "capacity: must be more than zero"),
        ('capacity = "-1GiB"', 'capacity: "-1GiB" is negative'),
        ("capacity = 1.5", "capacity: a size must be a whole number of bytes"),
        ("high_watermark = 0", "high_watermark: 0 is outside (0, 1]"),
        ('high_watermark = "120%"', 'high_watermark: "120%" is outside (0, 1]'),
        ("low_watermark = -0.1", "low_watermark: -0.1 is negative"),
        ("low_watermark = true", "low_watermark: a fraction must be a number"),
        ('low_watermark = "lots"', 'low_watermark: "lots" is not a fraction'),
    ],
)
def test_tier_value_errors(write: Write, minimal: str, line: str, fragment: str) -> None:
    text = minimal + line + "\n"
    _, lineno, sentence = only_problem(write(text))
    assert lineno == line_of(text, line)
    assert sentence.startswith(fragment)


def test_bad_watermark_does_not_add_a_comparison_error(write: Write, minimal: str) -> None:
    text = minimal + 'high_watermark = "lots"\nlow_watermark = 0.95\n'
    _, line, sentence = only_problem(write(text))
    assert (line, sentence.split(";")[0]) == (10, 'high_watermark: "lots" is not a fraction')


def test_bad_block_size_does_not_add_a_readahead_error(write: Write, minimal: str) -> None:
    text = minimal + '[fetch]\nblock_size = "2GiB"\nreadahead_max = "1GiB"\n'
    assert only_problem(write(text))[1] == 11


def test_tier_values_that_are_fine(write: Write, minimal: str) -> None:
    text = minimal + 'capacity = 1000000\nhigh_watermark = 1\nlow_watermark = "50%"\n'
    (tier,) = load_config(write(text)).tiers
    assert (tier.capacity, tier.high_watermark, tier.low_watermark) == (1_000_000, 1.0, 0.5)


# --- paths --------------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_config_dir(
    write: Write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf" / "nvme").mkdir(parents=True)
    write(MINIMAL, "conf/tierfs.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("..") / "conf" / "tierfs.toml")
    assert cfg.source == tmp_path / "conf" / "tierfs.toml"
    assert cfg.source.is_absolute()
    assert cfg.tiers[0].path == tmp_path / "conf" / "nvme"
    assert cfg.state.dir == tmp_path / "conf" / "state"


def test_tilde_expands(write: Write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "nvme").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    text = MINIMAL.replace('path = "nvme"', 'path = "~/nvme"').replace(
        'dir = "state"', 'dir = "~/state"'
    )
    cfg = load_config(write(text))
    assert cfg.tiers[0].path == home / "nvme"
    assert cfg.state.dir == home / "state"


def test_state_dir_problems(write: Write, minimal: str, tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    _, line, sentence = only_problem(write(minimal))
    assert (line, sentence) == (5, f'the state dir "{tmp_path / "state"}" is not a directory')

    text = minimal.replace('dir = "state"', 'dir = "state/deeper/lmdb"')
    _, line, sentence = only_problem(write(text))
    assert line == 5
    assert sentence.startswith(f'the state dir "{tmp_path / "state/deeper/lmdb"}" does not exist')
    assert sentence.endswith(f'its parent "{tmp_path / "state"}" is not a directory')


def test_state_dir_must_not_be_a_tier(write: Write, minimal: str) -> None:
    text = minimal.replace('dir = "state"', 'dir = "nvme"')
    assert only_problem(write(text))[1:] == (
        5,
        'the state dir is the directory of the tier "nvme"; give it its own directory',
    )


# --- fetch / namespace / write -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('[fetch]\nblock_size = "64KiB"\nreadahead_max = "64KiB"', (64 * 1024, 64 * 1024, 32)),
        ('[fetch]\nblock_size = "1GiB"\nreadahead_max = "2GiB"', (1024**3, 2 * 1024**3, 32)),
        ("[fetch]\nblock_size = 8388608\nconcurrency = 1024", (8 * MiB, 256 * MiB, 1024)),
        ("[fetch]\nconcurrency = 1", (4 * MiB, 256 * MiB, 1)),
    ],
)
def test_fetch_values(
    write: Write, minimal: str, table: str, expected: tuple[int, int, int]
) -> None:
    fetch = load_config(write(minimal + table + "\n")).fetch
    assert (fetch.block_size, fetch.readahead_max, fetch.concurrency) == expected
    assert fetch.dir_readahead == 32


@pytest.mark.parametrize("files", [0, 1, 1024])
def test_dir_readahead_values(write: Write, minimal: str, files: int) -> None:
    fetch = load_config(write(minimal + f"[fetch]\ndir_readahead = {files}\n")).fetch
    assert fetch.dir_readahead == files


@pytest.mark.parametrize(
    ("table", "key", "fragment"),
    [
        ('block_size = "32KiB"', "block_size", "block_size: 32768 bytes is not allowed"),
        ('block_size = "3MiB"', "block_size", "use a power of two from 64KiB to 1GiB"),
        ('block_size = "2GiB"', "block_size", "is not allowed"),
        (
            'block_size = "512MiB"',
            "block_size",
            "readahead_max (256 MiB) must be at least block_size (512 MiB)",
        ),
        ('readahead_max = "1MiB"', "readahead_max", "must be at least block_size (4 MiB)"),
        ("concurrency = 1025", "concurrency", "1025 is out of range"),
        ("concurrency = true", "concurrency", "expected an integer, got a boolean"),
        ('concurrency = "8"', "concurrency", "expected an integer, got a string"),
        ("dir_readahead = -1", "dir_readahead", "-1 is out of range"),
        ("dir_readahead = 1025", "dir_readahead", "1025 is out of range"),
    ],
)
def test_fetch_errors(write: Write, minimal: str, table: str, key: str, fragment: str) -> None:
    text = minimal + "[fetch]\n" + table + "\n"
    _, line, sentence = only_problem(write(text))
    assert line == line_of(text, key)
    assert fragment in sentence


@pytest.mark.parametrize(
    ("value", "mode"),
    [('"0644"', 0o644), ('"644"', 0o644), ('"0o600"', 0o600), ("0o640", 0o640), ("420", 0o644)],
)
def test_file_mode_forms(write: Write, minimal: str, value: str, mode: int) -> None:
    cfg = load_config(write(minimal + f"[namespace]\nfile_mode = {value}\n"))
    assert cfg.namespace.file_mode == mode


def test_dir_mode_string_may_carry_the_sticky_bit(write: Write, minimal: str) -> None:
    cfg = load_config(write(minimal + '[namespace]\ndir_mode = "1777"\n'))
    assert cfg.namespace.dir_mode == 0o1777


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("file_mode = 644", "file_mode: 644 is not a permission mode; write it as a string"),
        ('file_mode = "1777"', 'file_mode: "1777" is not a permission mode'),
        ('file_mode = "0x1a4"', 'file_mode: "0x1a4" is not a permission mode; use an octal'),
        ('file_mode = "rw-r--r--"', 'file_mode: "rw-r--r--" is not a permission mode'),
        ("dir_mode = 755", "dir_mode: 755 is not a permission mode"),
        ("dir_mode = 1.5", "dir_mode: expected an octal string"),
        ("uid = -1", "uid: -1 is out of range; use an integer from 0 to 4294967294"),
        ('gid = "100"', "gid: expected an integer, got a string"),
        ('list_ttl = "-1s"', 'list_ttl: "-1s" is negative'),
        ("revalidate_ttl = false", "revalidate_ttl: a duration must be a number of seconds"),
    ],
)
def test_namespace_errors(write: Write, minimal: str, line: str, fragment: str) -> None:
    text = minimal + "[namespace]\n" + line + "\n"
    _, lineno, sentence = only_problem(write(text))
    assert lineno == line_of(text, line)
    assert sentence.startswith(fragment)


def test_namespace_values(write: Write, minimal: str) -> None:
    text = minimal + '[namespace]\nlist_ttl = 0\nrevalidate_ttl = "1h30m"\nuid = 1000\ngid = 0\n'
    ns = load_config(write(text)).namespace
    assert (ns.list_ttl, ns.revalidate_ttl, ns.uid, ns.gid) == (0.0, 5400.0, 1000, 0)


def test_write_table(write: Write, minimal: str) -> None:
    cfg = load_config(write(minimal + '[write]\nmode = "through"\nupload_delay = "250ms"\n'))
    assert cfg.write == config_mod.WriteConfig(mode="through", upload_delay=0.25)
    text = minimal + '[write]\nmode = 1\nupload_delay = "5 sec"\n'
    problems = problems_of(write(text))
    assert [p[2] for p in problems] == [
        'mode: expected "back" or "through", got an integer',
        'upload_delay: "5 sec" is not a duration; use a number with a unit '
        "(ms, s, m, h, d or w) like 60s, 3d or 1h30m",
    ]


def test_write_part_size(write: Write, minimal: str) -> None:
    cfg = load_config(write(minimal + '[write]\npart_size = "64MiB"\n'))
    assert cfg.write.part_size == 64 << 20
    assert load_config(write(minimal)).write.part_size == 32 << 20
    text = minimal + '[write]\npart_size = "1MiB"\n'
    _, lineno, sentence = only_problem(write(text))
    assert lineno == line_of(text, "part_size")
    assert sentence == "part_size: must be between 5MiB and 5GiB (the S3 limits for a part)"


# --- rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('place = "nvme"', 'this [[rules]] entry is missing the required key "match"'),
        ('match = ""', "match: must not be empty"),
        ('match = "a/../b"', "match: \"a/../b\" has a '..' segment"),
        ("match = 3", "match: expected a string, got an integer"),
        ('match = "x"\nplace = 1', "place: expected a string, got an integer"),
        (
            'match = "x"\nplace = "nvm"',
            'place: "nvm" is not a configured tier (the tiers are "nvme"); did you mean "nvme"?',
        ),
        ('match = "x"\nkeep_newest = "2"', "keep_newest: expected an integer, got a string"),
        ('match = "x"\ndemote_after = "3 days"', 'demote_after: "3 days" is not a duration'),
        ('match = "x"\nwrite = "thru"', 'write: "thru" is not allowed; use "back" or "through"'),
        ('match = "x"\npin = 1', "pin: expected true or false, got an integer"),
        (
            'match = "x"\npromote = "always"',
            'promote: "always" is not allowed; use "on_access" or "never"',
        ),
        ('match = "x"\nevict_after = "2 weeks"', 'evict_after: "2 weeks" is not a duration'),
        ('match = "x"\ncache = "no"', "cache: expected true or false, got a string"),
        ('match = "a/./b"', "match: \"a/./b\" has a '.' segment"),
        ('match = "a//b"', 'match: "a//b" has an empty segment'),
    ],
)
def test_rule_errors(write: Write, minimal: str, body: str, fragment: str) -> None:
    text = minimal + "\n[[rules]]\n" + body + "\n"
    _, line, sentence = only_problem(write(text))
    key = body.splitlines()[-1].split(" =")[0]
    expected_line = (
        line_of(text, "[[rules]]") if "missing" in fragment else line_of(text, key + " =")
    )
    assert line == expected_line
    assert sentence.startswith(fragment), sentence


def test_rules_as_an_array_of_inline_tables(write: Write, minimal: str) -> None:
    text = 'rules = [\n  { match = "a/**", pin = true },\n  { match = "b/**", place = "x" },\n]\n'
    path = write(text + minimal)
    _, line, sentence = only_problem(path)
    assert line == 3
    assert sentence.startswith('place: "x" is not a configured tier')
    cfg = load_config(write(text.replace('"x"', '"nvme"') + minimal))
    assert [(r.match, r.source) for r in cfg.rules] == [
        ("a/**", f"{path}:2"),
        ("b/**", f"{path}:3"),
    ]


# --- the locator ----------------------------------------------------------------------------------


LOCATOR_DOC = '''\
# comment with [fake] header and key = 1
top = 1
"quoted key" = 'x'
dotted.inner.leaf = true   # [not] a header
arr = [
  1,
  [2, 3],   # nested arrays start with [
  { k = "v" },
]
multi = """
[not_a_table]
fake = 1
"""
lit = \'\'\'
[[also_not]]
\'\'\'

[table]
a = "x = 1 # not a comment"
"b.c" = 2
  indented = 3

[table.sub]
d = 4

[[aot]]
name = "first"

[[aot]]
name = "second"
inline = { x = 1, y = { z = 2 } }

[[aot.children]]
c = 1

[[aot.children]]
c = 2

[ spaced . "header" ]
e = 5

['literal key header']
f = 6
'''


@pytest.mark.parametrize(
    ("path", "line"),
    [
        (("top",), 2),
        (("quoted key",), 3),
        (("dotted",), 4),
        (("dotted", "inner"), 4),
        (("dotted", "inner", "leaf"), 4),
        (("arr",), 5),
        (("arr", 0), 6),
        (("arr", 1), 7),
        (("arr", 1, 1), 7),
        (("arr", 2), 8),
        (("arr", 2, "k"), 8),
        (("multi",), 10),
        (("lit",), 14),
        (("table",), 18),
        (("table", "a"), 19),
        (("table", "b.c"), 20),
        (("table", "indented"), 21),
        (("table", "sub"), 23),
        (("table", "sub", "d"), 24),
        (("aot",), 26),
        (("aot", 0), 26),
        (("aot", 0, "name"), 27),
        (("aot", 1), 29),
        (("aot", 1, "name"), 30),
        (("aot", 1, "inline"), 31),
        (("aot", 1, "inline", "y", "z"), 31),
        (("aot", 1, "children", 0), 33),
        (("aot", 1, "children", 0, "c"), 34),
        (("aot", 1, "children", 1, "c"), 37),
        (("spaced", "header"), 39),
        (("spaced", "header", "e"), 40),
        (("literal key header", "f"), 43),
        # Fallback to the nearest ancestor, then 0.
        (("aot", 1, "missing"), 29),
        (("table", "sub", "nope", 3), 23),
        (("not_a_table",), 0),
        (("also_not",), 0),
        (("fake",), 0),
    ],
)
def test_locator(path: tuple[str | int, ...], line: int) -> None:
    import tomllib

    tomllib.loads(LOCATOR_DOC)  # the fixture itself is valid TOML
    assert TomlLocator(LOCATOR_DOC).line(path) == line


def test_locator_crlf_and_escapes() -> None:
    text = 'a = "q\\"uote [x]"\r\n"k\\u0041" = 1\r\n[t]\r\nb = """x\\"""\r\n"""\r\nc = 2\r\n'
    locator = TomlLocator(text)
    assert locator.line(("a",)) == 1
    assert locator.line(("kA",)) == 2
    assert locator.line(("t", "b")) == 4
    assert locator.line(("t", "c")) == 6


def test_locator_survives_invalid_input() -> None:
    locator = TomlLocator('a = 1\nb = [1, 2\n[t]\nc = "unterminated\n')
    assert locator.line(("a",)) == 1
    assert locator.line(("zzz",)) == 0


_KEY = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True),
    st.text(alphabet="ab =#[]'.{}\\\"", min_size=1, max_size=6),
)
_TRICKY = st.text(alphabet="ab =#[]{},'\\\"\n", max_size=12)


def _toml_key(key: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: str, multiline: bool) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    if multiline:
        return '"""' + escaped + '"""'
    return '"' + escaped.replace("\n", "\\n") + '"'


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            _KEY,
            st.booleans(),
            st.lists(st.tuples(_KEY, _TRICKY, st.booleans()), max_size=4, unique_by=lambda t: t[0]),
        ),
        max_size=5,
    )
)
def test_locator_matches_generated_documents(
    tables: list[tuple[str, bool, list[tuple[str, str, bool]]]],
) -> None:
    """Emit TOML from random tables with tricky strings; every path gets its line."""
    import tomllib

    chunks: list[str] = []
    expected: dict[tuple[str | int, ...], int] = {}
    plain: set[str] = set()
    aot_counts: dict[str, int] = {}

    def next_line() -> int:
        return "".join(chunks).count("\n") + 1

    for name, is_array, items in tables:
        if name in plain or (not is_array and name in aot_counts):
            continue
        if is_array:
            index = aot_counts.get(name, 0)
            aot_counts[name] = index + 1
            base: tuple[str | int, ...] = (name, index)
            header = f"[[{_toml_key(name)}]]  # [comment] x = 1"
        else:
            plain.add(name)
            base = (name,)
            header = f"[ {_toml_key(name)} ]"
        expected[base] = next_line()
        chunks.append(header + "\n")
        for key, value, multiline in items:
            expected[(*base, key)] = next_line()
            chunks.append(f"{_toml_key(key)} = {_toml_value(value, multiline)}\n")
    text = "".join(chunks)
    tomllib.loads(text)  # the generator emits valid TOML
    locator = TomlLocator(text)
    assert {path: locator.line(path) for path in expected} == expected


# --- new rule keys, conflicts, [mover] and [metrics] -----------------------------------------------


def test_rule_evict_after_and_cache(write: Write, minimal: str) -> None:
    text = minimal + '[[rules]]\nmatch = "a/**"\nevict_after = "14d"\n'
    text += '[[rules]]\nmatch = "b/**"\ncache = false\nwrite = "through"\n'
    a, b = load_config(write(text)).rules
    assert (a.evict_after, a.cache) == (14 * 86400.0, None)
    assert (b.evict_after, b.cache, b.write) == (None, False, "through")


def test_rule_match_may_end_with_a_slash(write: Write, minimal: str) -> None:
    (rule,) = load_config(write(minimal + '[[rules]]\nmatch = "data/"\npin = true\n')).rules
    assert rule.match == "data/"


TWO_TIERS = """\
[backing]
url = "s3://bucket"

[state]
dir = "state"

[[tiers]]
name = "nvme"
path = "nvme"

[[tiers]]
name = "hdd"
path = "hdd"
"""


@pytest.mark.parametrize(
    ("body", "key", "fragment"),
    [
        ("pin = true\ndemote_after = '1d'", "demote_after", "a pinned file (pin = true) is never"),
        ("pin = true\nevict_after = '1d'", "evict_after", "a pinned file (pin = true) is never"),
        ("pin = true\nkeep_newest = 2", "keep_newest", "pin = true already keeps every entry"),
        ("cache = false\npin = true", "pin", "this rule has cache = false"),
        ("cache = false\nplace = 'nvme'", "place", "this rule has cache = false"),
        ("cache = false\nkeep_newest = 1", "keep_newest", "this rule has cache = false"),
        ("cache = false\npromote = 'on_access'", "promote", "this rule has cache = false"),
        ("cache = false\ndemote_after = '1h'", "demote_after", "this rule has cache = false"),
        ("cache = false\nevict_after = '1h'", "evict_after", "this rule has cache = false"),
        (
            "keep_newest = 2\nplace = 'hdd'",
            "place",
            'keep_newest keeps the newest entries on the first tier ("nvme"), but place puts '
            'new data on "hdd"',
        ),
        (
            "demote_after = '3d'\nevict_after = '1d'",
            "evict_after",
            "evict_after: 1d is not longer than demote_after (3d)",
        ),
        (
            "demote_after = '3d'\nevict_after = '3d'",
            "evict_after",
            "evict_after: 3d is not longer than demote_after (3d)",
        ),
    ],
)
def test_rule_conflicts_are_errors_at_the_second_key(
    write: Write, tmp_path: Path, body: str, key: str, fragment: str
) -> None:
    for name in ("nvme", "hdd"):
        (tmp_path / name).mkdir()
    text = TWO_TIERS + '\n[[rules]]\nmatch = "x/**"\n' + body + "\n"
    _, line, sentence = only_problem(write(text))
    assert line == line_of(text, key + " =")
    assert sentence.startswith(f"{key}: ") and fragment in sentence, sentence


@pytest.mark.parametrize(
    "body",
    [
        "pin = false\ndemote_after = '1d'",  # not pinned: fine
        "cache = false\npin = false\npromote = 'never'\nwrite = 'through'",
        "keep_newest = 2\nplace = 'nvme'\ndemote_after = '3d'\nevict_after = '14d'",
        "cache = true\npin = true",
    ],
)
def test_rule_combinations_that_are_fine(write: Write, tmp_path: Path, body: str) -> None:
    for name in ("nvme", "hdd"):
        (tmp_path / name).mkdir()
    load_config(write(TWO_TIERS + '\n[[rules]]\nmatch = "x/**"\n' + body + "\n"))


def test_keep_newest_place_conflict_needs_the_tiers(write: Write) -> None:
    """A policy file checked alone does not know which tier is first."""
    path = write('[[rules]]\nmatch = "c/*"\nkeep_newest = 2\nplace = "hdd"\n', "p.toml")
    assert check_file(path) == []


def test_mover_table(write: Write, minimal: str) -> None:
    cfg = load_config(write(minimal + '[mover]\ninterval = "250ms"\nbandwidth = "200MiB/s"\n'))
    assert cfg.mover == config_mod.MoverConfig(interval=0.25, bandwidth=200 * MiB)
    cfg = load_config(write(minimal + '[mover]\nbandwidth = "1.5GB/s"\n'))
    assert cfg.mover.bandwidth == 1_500_000_000
    cfg = load_config(write(minimal + "[mover]\nbandwidth = 0\n"))
    assert cfg.mover.bandwidth == 0


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('interval = "0s"', "interval: must be more than zero"),
        ("interval = 0", "interval: must be more than zero"),
        ('interval = "soon"', 'interval: "soon" is not a duration'),
        ('bandwidth = "200MiB/h"', 'bandwidth: "200MiB/h" is not a rate per second'),
        ('bandwidth = "fast"', 'bandwidth: "fast" is not a rate'),
        ("bandwidth = -1", "bandwidth: -1 is negative"),
    ],
)
def test_mover_errors(write: Write, minimal: str, line: str, fragment: str) -> None:
    text = minimal + "[mover]\n" + line + "\n"
    _, lineno, sentence = only_problem(write(text))
    assert lineno == line_of(text, line)
    assert sentence.startswith(fragment), sentence


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:9567", "127.0.0.1", 9567),
        ("0.0.0.0:1", "0.0.0.0", 1),
        ("[::1]:65535", "::1", 65535),
        ("localhost:9567", "localhost", 9567),
        ("node-1.example.org:80", "node-1.example.org", 80),
    ],
)
def test_metrics_listen(write: Write, minimal: str, listen: str, host: str, port: int) -> None:
    cfg = load_config(write(minimal + f'[metrics]\nlisten = "{listen}"\n'))
    assert cfg.metrics == config_mod.MetricsConfig(listen=listen, host=host, port=port)


def test_metrics_table_without_listen_is_off(write: Write, minimal: str) -> None:
    assert not load_config(write(minimal + "[metrics]\n")).metrics.enabled


@pytest.mark.parametrize(
    ("listen", "fragment"),
    [
        ("9567", "has no port"),
        (":9567", "has no host; write 127.0.0.1:9567"),
        ("127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:65536", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:http", "the port must be a number from 1 to 65535"),
        ("::1:9567", "write an IPv6 address in brackets"),
        ("[::g]:9567", "is not an IPv6 address"),
        ("300.1.1.1:9567", "is not an IPv4 address"),
        ("bad_host:9567", "is not a host name"),
    ],
)
def test_metrics_listen_errors(write: Write, minimal: str, listen: str, fragment: str) -> None:
    text = minimal + f'[metrics]\nlisten = "{listen}"\n'
    _, lineno, sentence = only_problem(write(text))
    assert lineno == line_of(text, "listen =")
    assert sentence.startswith("listen: ") and fragment in sentence, sentence


def test_metrics_listen_must_be_a_string(write: Write, minimal: str) -> None:
    _, _, sentence = only_problem(write(minimal + "[metrics]\nlisten = 9567\n"))
    assert sentence == "listen: expected a string, got an integer"
