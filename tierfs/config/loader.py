"""Loading a config file: TOML -> the dataclasses of ``schema``, with every
problem found reported at its file:line (see the package docstring for the
rules each key follows).

The loader reads the file with ``tomllib``, finds lines with
``TomlLocator``, and walks ``schema.SECTIONS``: each table's keys are
checked and converted by the same generic code (``_keys``), from the
schema's fields; what involves several keys is checked here, per table.
Problems are collected, never raised one by one: ``ConfigError`` holds them
all, sorted by file (in the order opened) and line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import tomllib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tierfs.errors import ConfigError
from tierfs.units import format_duration, format_size, toml_kind

from .schema import (
    SECTION,
    TOP_KEYS,
    AuditConfig,
    BackingConfig,
    Config,
    FetchConfig,
    MetricsConfig,
    QuotaConfig,
    RuleConfig,
    Section,
    SharedTierConfig,
    StateConfig,
    TierConfig,
    default_of,
    keys_of,
)
from .toml_lines import KeyPath, TomlLocator
from .values import conv_str, join_backing_url, quote, suggest

Problem = tuple[str, int, str]
T = TypeVar("T")

# --- reading files ------------------------------------------------------------------------


@dataclass
class _Doc:
    """One parsed file: the name used in messages, its data and its locator."""

    file: str
    path: Path  # absolute
    data: dict[str, Any]
    locator: TomlLocator

    def line(self, path: KeyPath) -> int:
        return self.locator.line(path)


class _Report:
    """Collects problems; sorts them by file (in the order opened), then line."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.files: list[str] = []

    def open(self, file: str) -> None:
        if file not in self.files:
            self.files.append(file)

    def add(self, doc: _Doc, path: KeyPath, sentence: str) -> None:
        self.problems.append((doc.file, doc.line(path), sentence))

    def add_at(self, file: str, line: int, sentence: str) -> None:
        self.problems.append((file, line, sentence))

    def sorted(self) -> list[Problem]:
        order = {f: i for i, f in enumerate(self.files)}
        return sorted(self.problems, key=lambda p: (order.get(p[0], len(order)), p[1]))


_SYNTAX_POS_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_SYNTAX_END_RE = re.compile(r"\s*\(at end of document\)\s*$")


def _syntax_problem(err: tomllib.TOMLDecodeError, text: str) -> tuple[int, str]:
    """tomllib's "Invalid value (at line 3, column 5)" -> (3, sentence)."""
    message = getattr(err, "msg", None) or str(err)
    last_line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
    line, column = 0, 0
    m = _SYNTAX_POS_RE.search(message)
    if m:
        line, column = int(m.group(1)), int(m.group(2))
        message = message[: m.start()]
    elif _SYNTAX_END_RE.search(message):
        line = last_line
        message = _SYNTAX_END_RE.sub("", message)
    lineno = getattr(err, "lineno", None)
    if isinstance(lineno, int) and lineno > 0:
        line = lineno
        colno = getattr(err, "colno", None)
        column = colno if isinstance(colno, int) else column
    message = message.strip().rstrip(".")
    message = message[:1].lower() + message[1:]
    sentence = f"this is not valid TOML: {message}"
    if column:
        sentence += f" (column {column})"
    return line or last_line, sentence


def _read(path: Path, file: str, report: _Report) -> _Doc | None:
    """Read and parse one TOML file; report why not and return None on failure."""
    report.open(file)
    try:
        raw = path.read_bytes()
    except OSError as err:
        report.add_at(file, 0, f"cannot read the file: {err.strerror or err}")
        return None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        report.add_at(file, line, "the file is not valid UTF-8 text")
        return None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        line, sentence = _syntax_problem(err, text)
        report.add_at(file, line, sentence)
        return None
    return _Doc(file, path, data, TomlLocator(text))


# --- keys -------------------------------------------------------------------------------

_SECRET_RE = re.compile(r"secret|password|passwd|token|credential|access_?key", re.I)


def _check_keys(
    report: _Report,
    doc: _Doc,
    table: dict[str, Any],
    path: KeyPath,
    allowed: Collection[str],
    where: str,
) -> None:
    """Report every key of ``table`` that is not in ``allowed``."""
    for key in table:
        if key in allowed:
            continue
        if _SECRET_RE.search(key):
            sentence = (
                f"unknown key {quote(key)} in {where}; credentials are never read from the "
                "config file: use the standard AWS chain (environment, ~/.aws, instance role)"
            )
        elif path and key in TOP_KEYS:
            sentence = (
                f"unknown key {quote(key)} in {where}; {quote(key)} is a top-level key: "
                "move it above the first [table] header"
            )
        else:
            hint = suggest(key, allowed) or "; valid keys are " + ", ".join(allowed)
            sentence = f"unknown key {quote(key)} in {where}{hint}"
        report.add(doc, (*path, key), sentence)


def _get(
    report: _Report,
    doc: _Doc,
    table: dict[str, Any],
    path: KeyPath,
    key: str,
    conv: Callable[[Any], T],
    default: T,
) -> T:
    """Convert ``table[key]``; on a problem report it at the key's line, return default."""
    if key not in table:
        return default
    try:
        return conv(table[key])
    except ValueError as err:
        report.add(doc, (*path, key), f"{key}: {err}")
        return default


def _table_of(report: _Report, doc: _Doc, section: Section) -> dict[str, Any] | None:
    """The table ``section`` of the file; None when absent (reported if it is
    required) or not a table (reported)."""
    value = doc.data.get(section.name)
    if value is None:
        if section.missing:
            report.add_at(doc.file, 0, section.missing)
        return None
    if not isinstance(value, dict):
        report.add(
            doc,
            (section.name,),
            f"{section.name} must be a table ({section.example}), not {toml_kind(value)}",
        )
        return None
    return value


def _array_of_tables(
    report: _Report, doc: _Doc, data: dict[str, Any], key: str
) -> list[tuple[KeyPath, dict[str, Any]]]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        report.add(
            doc,
            (key,),
            f"{key} must be an array of tables: write [[{key}]] (double brackets) "
            f"before each entry, not {toml_kind(value)}",
        )
        return []
    out: list[tuple[KeyPath, dict[str, Any]]] = []
    for index, item in enumerate(value):
        if isinstance(item, dict):
            out.append(((key, index), item))
        else:
            report.add(
                doc, (key, index), f"each entry of {key} must be a table, not {toml_kind(item)}"
            )
    return out


def _keys(
    report: _Report,
    doc: _Doc,
    table: dict[str, Any],
    path: KeyPath,
    cls: type,
    base: Path,
) -> tuple[dict[str, Any], bool]:
    """The keys of one table, checked and converted as ``cls``'s schema says
    (unknown keys, missing required ones, bad values: each reported at its
    line).  Returns the values (the default where a key is absent or bad)
    and whether every value present was good."""
    where = f"[[{path[0]}]]" if len(path) > 1 else f"[{path[0]}]"
    _check_keys(report, doc, table, path, [f.name for f, _k in keys_of(cls)], where)
    before = len(report.problems)
    values: dict[str, Any] = {}
    for f, spec in keys_of(cls):
        if spec.required and f.name not in table:
            owner = f"this {where} entry" if len(path) > 1 else where
            report.add(doc, path, f"{owner} is missing the required key {quote(f.name)}")
        convert = spec.convert(base) if spec.path else spec.convert
        values[f.name] = _get(report, doc, table, path, f.name, convert, default_of(f))
    return values, len(report.problems) == before


def _single(
    report: _Report, doc: _Doc, section: Section, base: Path
) -> tuple[dict[str, Any], dict[str, Any], bool] | None:
    """A one-table section: (its table, its values, all good), or None when
    the file has no such table (or it is not a table)."""
    table = _table_of(report, doc, section)
    if table is None:
        return None
    values, good = _keys(report, doc, table, (section.name,), section.cls, base)
    return table, values, good


# --- filesystem checks ---------------------------------------------------------------------


def _access(path: Path, mode: int) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)  # pragma: no cover


def _dir_problem(path: Path, what: str) -> str | None:
    """Why ``path`` is not a directory this process can write, or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{what} {quote(str(path))} does not exist; create it or fix the path"
    except OSError as err:
        return f"{what} {quote(str(path))} cannot be checked: {err.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} {quote(str(path))} is not a directory"
    if not _access(path, os.W_OK | os.X_OK):
        return f"{what} {quote(str(path))} is not writable by this user (uid {os.geteuid()})"
    return None


def _state_dir_problem(path: Path) -> str | None:
    """The state dir may not exist yet, but then its nearest parent must be writable."""
    if os.path.lexists(path):
        return _dir_problem(path, "the state dir")
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    problem = _dir_problem(parent, "its parent")
    if problem:
        return f"the state dir {quote(str(path))} does not exist and cannot be created: {problem}"
    return None


def _same_key(path: Path, check_paths: bool) -> Path:
    return Path(os.path.realpath(path)) if check_paths else path


# --- the tables ---------------------------------------------------------------------------


def _backing(report: _Report, doc: _Doc) -> BackingConfig | None:
    parsed = _single(report, doc, SECTION["backing"], doc.path.parent)
    if parsed is None:
        return None
    _table, values, _good = parsed
    if values["endpoint_url"] is not None and (values["url"] or "").startswith("file:"):
        report.add(
            doc,
            ("backing", "endpoint_url"),
            "endpoint_url only applies to an s3:// backing url; remove it for a file:// url",
        )
    return BackingConfig(**values)


def _state(report: _Report, doc: _Doc, check_paths: bool) -> StateConfig | None:
    parsed = _single(report, doc, SECTION["state"], doc.path.parent)
    if parsed is None:
        return None
    _table, values, _good = parsed
    directory = values["dir"]
    if directory is None:
        return None
    if check_paths:
        problem = _state_dir_problem(directory)
        if problem:
            report.add(doc, ("state", "dir"), problem)
    return StateConfig(dir=directory)


def _tiers(
    report: _Report, doc: _Doc, check_paths: bool
) -> tuple[list[TierConfig], SharedTierConfig | None]:
    section = SECTION["tiers"]
    entries = _array_of_tables(report, doc, doc.data, "tiers")
    if not entries and "tiers" not in doc.data:
        report.add_at(doc.file, 0, section.missing)
    elif doc.data.get("tiers") == []:
        report.add(doc, ("tiers",), "tiers is empty; configure at least one [[tiers]]")
    tiers: list[TierConfig] = []
    names: dict[str, int] = {}
    paths: dict[Path, tuple[str, int]] = {}
    shared: SharedTierConfig | None = None
    shared_line = 0
    for path, table in entries:
        if "url" in table:
            shared_line = _shared_tier_entry(report, doc, path, table, names, shared_line)
            if shared is None and shared_line:
                given = {k: v for k, v in table.items() if k != "path"}  # said once
                values, good = _keys(report, doc, given, path, SharedTierConfig, doc.path.parent)
                if good:
                    shared = SharedTierConfig(**values)
            continue
        if shared_line:
            report.add(
                doc,
                (*path, "path"),
                f"a local tier after the shared tier (line {shared_line}); "
                "the shared tier comes after the local tiers",
            )
        values, good = _keys(report, doc, table, path, TierConfig, doc.path.parent)
        name = values["name"] or ""
        if name:
            _unique_tier_name(report, doc, path, name, names)
        tier_path = values["path"]
        if tier_path is not None:
            problem = _dir_problem(tier_path, "the tier path") if check_paths else None
            if problem:
                report.add(doc, (*path, "path"), problem)
            _check_overlap(report, doc, path, tier_path, paths, check_paths)
            paths.setdefault(_same_key(tier_path, check_paths), (name, doc.line((*path, "path"))))
        high, low = values["high_watermark"], values["low_watermark"]
        if low >= high and good:
            at = "low_watermark" if "low_watermark" in table else "high_watermark"
            low_text = f"{low:g}" + ("" if "low_watermark" in table else " (the default)")
            high_text = f"{high:g}" + ("" if "high_watermark" in table else " (the default)")
            report.add(
                doc,
                (*path, at),
                f"low_watermark {low_text} must be below high_watermark {high_text}",
            )
        tiers.append(TierConfig(**{**values, "name": name, "path": tier_path or Path()}))
    if shared_line and not tiers:
        report.add_at(
            doc.file, shared_line, "a shared tier needs at least one local tier before it"
        )
    return tiers, shared


def _unique_tier_name(
    report: _Report, doc: _Doc, path: KeyPath, name: str, names: dict[str, int]
) -> None:
    """Report ``name`` if a tier before it has it; else remember its line."""
    if name in names:
        report.add(
            doc,
            (*path, "name"),
            f"the tier name {quote(name)} is already used by the tier at line "
            f"{names[name]}; tier names must be unique",
        )
    else:
        names[name] = doc.line((*path, "name"))


def _shared_tier_entry(
    report: _Report,
    doc: _Doc,
    path: KeyPath,
    table: dict[str, Any],
    names: dict[str, int],
    shared_line: int,
) -> int:
    """Checks of a ``[[tiers]]`` entry with ``url`` (the shared tier) that
    span entries; its line, or the earlier shared tier's when it is a
    second one (an error)."""
    line = doc.line((*path, "url"))
    if "path" in table:
        report.add(
            doc,
            (*path, "path"),
            "a tier has a path (a local tier) or a url (the shared tier), not both",
        )
    if shared_line:
        report.add(
            doc,
            (*path, "url"),
            f"a second shared tier; there is one at line {shared_line}, and at most one is allowed",
        )
        return shared_line
    name = table.get("name")
    if isinstance(name, str) and name:
        _unique_tier_name(report, doc, path, name, names)
    return line


def _check_overlap(
    report: _Report,
    doc: _Doc,
    path: KeyPath,
    tier_path: Path,
    seen: dict[Path, tuple[str, int]],
    check_paths: bool,
) -> None:
    key = _same_key(tier_path, check_paths)
    for other, (other_name, other_line) in seen.items():
        who = (
            f"the tier {quote(other_name)} at line {other_line}"
            if other_name
            else f"line {other_line}"
        )
        if key == other:
            report.add(
                doc,
                (*path, "path"),
                f"the tier path {quote(str(tier_path))} is already used by {who}; "
                "each tier needs its own directory",
            )
            return
        if key.is_relative_to(other) or other.is_relative_to(key):
            report.add(
                doc,
                (*path, "path"),
                f"the tier path {quote(str(tier_path))} overlaps the path of {who}; "
                "tier directories must not be inside each other",
            )
            return


def _fetch(report: _Report, doc: _Doc) -> FetchConfig:
    parsed = _single(report, doc, SECTION["fetch"], doc.path.parent)
    if parsed is None:
        return FetchConfig()
    table, values, good = parsed
    block, readahead = values["block_size"], values["readahead_max"]
    if readahead < block and good:
        at = "readahead_max" if "readahead_max" in table else "block_size"
        report.add(
            doc,
            ("fetch", at),
            f"readahead_max ({format_size(readahead)}) must be at least "
            f"block_size ({format_size(block)})",
        )
    return FetchConfig(**values)


def _plain(report: _Report, doc: _Doc, name: str) -> Any:
    """A table with no check across its keys."""
    section = SECTION[name]
    parsed = _single(report, doc, section, doc.path.parent)
    return section.cls() if parsed is None else section.cls(**parsed[1])


def _metrics(report: _Report, doc: _Doc) -> MetricsConfig:
    parsed = _single(report, doc, SECTION["metrics"], doc.path.parent)
    if parsed is None or parsed[1]["listen"] is None:
        return MetricsConfig()
    text, host, port = parsed[1]["listen"]
    return MetricsConfig(listen=text, host=host, port=port)


def _audit(report: _Report, doc: _Doc) -> AuditConfig:
    parsed = _single(report, doc, SECTION["audit"], doc.path.parent)
    if parsed is None:
        return AuditConfig()
    audit = AuditConfig(**parsed[1])
    if audit.path is None and parsed[0]:
        report.add(
            doc,
            ("audit",),
            'the [audit] table has no path: add path = "/var/log/tierfs/NAME.audit.jsonl" '
            "to turn the audit log on, or remove the table",
        )
    return audit


def _rule_conflicts(
    report: _Report,
    doc: _Doc,
    path: KeyPath,
    rule: RuleConfig,
    tier_names: Collection[str] | None,
) -> None:
    """Report settings of one rule that contradict each other (see the Rules list)."""

    def add(key: str, sentence: str) -> None:
        report.add(doc, (*path, key), f"{key}: {sentence}")

    if rule.pin:
        for key in ("demote_after", "evict_after"):
            if getattr(rule, key) is not None:
                add(key, "a pinned file (pin = true) is never demoted or evicted; remove one")
        if rule.keep_newest is not None:
            add(
                "keep_newest",
                "pin = true already keeps every entry where it is; remove one of them",
            )
    if rule.cache is False:
        kept = {
            "pin": rule.pin is True,
            "place": rule.place is not None,
            "keep_newest": rule.keep_newest is not None,
            "promote": rule.promote == "on_access",
            "demote_after": rule.demote_after is not None,
            "evict_after": rule.evict_after is not None,
        }
        for key, present in kept.items():
            if present:
                add(
                    key,
                    "this rule has cache = false, so nothing it matches is kept locally "
                    "and this setting can never act; remove one of them",
                )
    names = list(tier_names) if tier_names is not None else []
    if (
        rule.keep_newest is not None
        and rule.place is not None
        and names
        and rule.place in names
        and rule.place != names[0]
    ):
        add(
            "place",
            f"keep_newest keeps the newest entries on the first tier ({quote(names[0])}), "
            f"but place puts new data on {quote(rule.place)}; drop place or keep_newest",
        )
    if (
        rule.evict_after is not None
        and rule.demote_after is not None
        and rule.evict_after <= rule.demote_after
    ):
        add(
            "evict_after",
            f"{format_duration(rule.evict_after)} is not longer than demote_after "
            f"({format_duration(rule.demote_after)}), so the local copies would be dropped "
            "before they are demoted; make evict_after longer",
        )


class _RuleState:
    """Rules seen so far across files, to catch a pattern that repeats."""

    def __init__(self, tier_names: Collection[str] | None) -> None:
        self.tier_names = tier_names
        self.patterns: dict[str, str] = {}


def _rules(report: _Report, doc: _Doc, data: dict[str, Any], state: _RuleState) -> list[RuleConfig]:
    rules: list[RuleConfig] = []
    for path, table in _array_of_tables(report, doc, data, "rules"):
        source = f"{doc.file}:{doc.line(path)}"
        values, _good = _keys(report, doc, table, path, RuleConfig, doc.path.parent)
        match = values["match"]
        if match:
            if match in state.patterns:
                report.add(
                    doc,
                    (*path, "match"),
                    f"this rule can never apply: the rule at {state.patterns[match]} has the "
                    f"same pattern {quote(match)} and comes first (first match wins)",
                )
            else:
                state.patterns[match] = source
        place = values["place"]
        names = state.tier_names
        if place is not None and names is not None and place not in names:
            listed = ", ".join(quote(n) for n in names)
            known = f"the tiers are {listed}" if listed else "no valid tiers are configured"
            report.add(
                doc,
                (*path, "place"),
                f"place: {quote(place)} is not a configured tier ({known})" + suggest(place, names),
            )
        rule = RuleConfig(**{**values, "match": match or ""}, source=source)
        _rule_conflicts(report, doc, path, rule, names)
        rules.append(rule)
    return rules


#: The tables a policy file may hold.
POLICY_TABLES = ("rules", "quotas")


class _QuotaState:
    """Quotas seen so far across files, to catch a path given twice."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}


def _quotas(report: _Report, doc: _Doc, state: _QuotaState) -> list[QuotaConfig]:
    quotas: list[QuotaConfig] = []
    for path, table in _array_of_tables(report, doc, doc.data, "quotas"):
        source = f"{doc.file}:{doc.line(path)}"
        values, good = _keys(report, doc, table, path, QuotaConfig, doc.path.parent)
        where = values["path"]
        if where is None:
            continue  # reported as missing
        shown = quote(where) if where else "the whole mount"
        if where in state.paths:
            report.add(
                doc,
                (*path, "path"),
                f"{shown} already has a quota at {state.paths[where]}; "
                "give each directory one [[quotas]] entry with both limits",
            )
            continue
        state.paths[where] = source
        if values["bytes"] is None and values["files"] is None and good:
            report.add(
                doc,
                path,
                f'the quota on {shown} sets no limit: add bytes = "500GiB" and/or files = 1000000',
            )
            continue
        quotas.append(QuotaConfig(**values, source=source))
    return quotas


def _policy_tables(
    report: _Report, doc: _Doc, state: _RuleState, quota_state: _QuotaState
) -> tuple[list[RuleConfig], list[QuotaConfig]]:
    """The rules and quotas of a policy file: a file that holds only
    [[rules]] and [[quotas]]."""
    for key in doc.data:
        if key in POLICY_TABLES:
            continue
        if key in TOP_KEYS:
            sentence = (
                "a policy file holds only [[rules]] and [[quotas]]; "
                f"{quote(key)} belongs in the main config file"
            )
        else:
            sentence = (
                f"unknown key {quote(key)}: a policy file holds only [[rules]] and [[quotas]]"
                + suggest(key, POLICY_TABLES)
            )
        report.add(doc, (key,), sentence)
    return _rules(report, doc, doc.data, state), _quotas(report, doc, quota_state)


def _policy_files(
    report: _Report, doc: _Doc, base: Path, state: _RuleState, quota_state: _QuotaState
) -> tuple[list[Path], list[RuleConfig], list[QuotaConfig]]:
    value = doc.data.get("policy_files")
    if value is None:
        return [], [], []
    if not isinstance(value, list):
        report.add(
            doc,
            ("policy_files",),
            f'policy_files must be an array of paths like ["policy.toml"], not {toml_kind(value)}',
        )
        return [], [], []
    display_dir = os.path.dirname(doc.file)
    files: list[Path] = []
    rules: list[RuleConfig] = []
    quotas: list[QuotaConfig] = []
    seen: dict[Path, int] = {}
    for index, entry in enumerate(value):
        at: KeyPath = ("policy_files", index)
        try:
            text = os.path.expanduser(conv_str(entry))
        except ValueError as err:
            report.add(doc, at, f"policy_files entry {index + 1}: {err}")
            continue
        path = Path(os.path.normpath(os.path.join(base, text)))
        if path == doc.path:
            report.add(doc, at, f"policy_files lists the config file itself ({quote(entry)})")
            continue
        if path in seen:
            report.add(
                doc, at, f"the policy file {quote(entry)} is already listed at line {seen[path]}"
            )
            continue
        seen[path] = doc.line(at)
        files.append(path)
        display = os.path.normpath(os.path.join(display_dir, text))
        if not path.is_file():
            what = "does not exist" if not os.path.lexists(path) else "is not a regular file"
            report.add(
                doc, at, f"the policy file {quote(entry)} {what} (looked for {quote(str(path))})"
            )
            continue
        policy = _read(path, display, report)
        if policy is not None:
            more_rules, more_quotas = _policy_tables(report, policy, state, quota_state)
            rules.extend(more_rules)
            quotas.extend(more_quotas)
    return files, rules, quotas


def _build_config(report: _Report, doc: _Doc, check_paths: bool) -> Config | None:
    _check_keys(report, doc, doc.data, (), TOP_KEYS, "the config file")
    backing = _backing(report, doc)
    state = _state(report, doc, check_paths)
    tiers, shared_tier = _tiers(report, doc, check_paths)
    if state is not None and tiers:
        state_key = _same_key(state.dir, check_paths)
        for tier in tiers:
            if tier.name and _same_key(tier.path, check_paths) == state_key:
                report.add(
                    doc,
                    ("state", "dir"),
                    f"the state dir is the directory of the tier {quote(tier.name)}; "
                    "give it its own directory",
                )
    fetch = _fetch(report, doc)
    namespace = _plain(report, doc, "namespace")
    write = _plain(report, doc, "write")
    mover = _plain(report, doc, "mover")
    metrics = _metrics(report, doc)
    audit = _audit(report, doc)
    access = _plain(report, doc, "access")
    if backing is not None and access.root is not None:
        # An access point is the bucket below its root: every key the daemon
        # uses is under it, and the mount's source names it.
        backing = dataclasses.replace(backing, url=join_backing_url(backing.url, access.root))
    rule_state = _RuleState([t.name for t in tiers if t.name])
    rules = _rules(report, doc, doc.data, rule_state)
    quota_state = _QuotaState()
    quotas = _quotas(report, doc, quota_state)
    policy_paths, policy_rules, policy_quotas = _policy_files(
        report, doc, doc.path.parent, rule_state, quota_state
    )
    if backing is None or state is None or report.problems:
        return None
    return Config(
        source=doc.path,
        backing=backing,
        state=state,
        tiers=tuple(tiers),
        shared_tier=shared_tier,
        fetch=fetch,
        namespace=namespace,
        write=write,
        mover=mover,
        metrics=metrics,
        audit=audit,
        access=access,
        rules=tuple(rules + policy_rules),
        quotas=tuple(quotas + policy_quotas),
        policy_files=tuple(policy_paths),
    )


def _absolute(path: str | os.PathLike[str]) -> tuple[str, Path]:
    """(name for messages, absolute path)."""
    given = os.fspath(path)
    return given, Path(os.path.abspath(os.path.expanduser(given)))


# --- public API -------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str], *, check_paths: bool = True) -> Config:
    """Load and validate a config file and its policy files.

    Raises ``ConfigError`` with every problem found, as ``(file, line,
    sentence)``.  ``check_paths=False`` skips the local filesystem checks
    (see the module docstring).
    """
    file, absolute = _absolute(path)
    report = _Report()
    doc = _read(absolute, file, report)
    config = _build_config(report, doc, check_paths) if doc is not None else None
    if report.problems or config is None:
        raise ConfigError(report.sorted())
    return config


def load_policy(
    path: str | os.PathLike[str], *, tiers: Collection[str] | None = None
) -> tuple[RuleConfig, ...]:
    """Load the rules of one policy file (``[[rules]]`` and ``[[quotas]]``);
    ``ConfigError`` lists its problems.

    With ``tiers`` (the configured tier names), each rule's ``place`` is
    checked against them; with None it is not.
    """
    file, absolute = _absolute(path)
    report = _Report()
    doc = _read(absolute, file, report)
    rules = (
        _policy_tables(report, doc, _RuleState(tiers), _QuotaState())[0] if doc is not None else []
    )
    if report.problems:
        raise ConfigError(report.sorted())
    return tuple(rules)


def check_file(path: str | os.PathLike[str], *, check_paths: bool = True) -> list[Problem]:
    """Validate a config file or a policy file; return its problems (empty = OK).

    This is ``tierfs policy check FILE``.  A file with any of the config
    tables (``backing``, ``state``, ``tiers``, ``fetch``, ``namespace``,
    ``write``, ``mover``, ``metrics``, ``policy_files``) is checked as a full config, including the
    policy files it lists.  Any other file is checked as a policy file, which
    holds only ``[[rules]]`` and ``[[quotas]]``; the tiers are then unknown, so a rule's
    ``place`` is only checked to be a string, not that it names a configured
    tier (check the main config for that).

    ``check_paths=False`` skips the local filesystem checks of tier paths and
    the state dir, for checking a config on a machine other than the node.
    """
    file, absolute = _absolute(path)
    report = _Report()
    doc = _read(absolute, file, report)
    if doc is not None:
        if any(key in doc.data for key in TOP_KEYS if key not in POLICY_TABLES):
            _build_config(report, doc, check_paths)
        else:
            _policy_tables(report, doc, _RuleState(None), _QuotaState())
    return report.sorted()
