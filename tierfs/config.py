"""Config file (TOML) -> frozen dataclasses, with every problem at its file:line.

The dataclasses below are the interface the rest of tierfs codes against.

Entry points
------------
``load_config(path, *, check_paths=True) -> Config``
    Parses and validates a config file and the policy files it lists.  Raises
    ``ConfigError`` holding *all* problems found, each as ``(file, line,
    sentence)``; line 0 means "no single line" (a missing table).
``check_file(path, *, check_paths=True) -> list[(file, line, sentence)]``
    What ``tierfs policy check FILE`` runs.  Accepts a full config or a policy
    file (a file that holds only ``[[rules]]``); an empty list means OK.
``load_policy(path, *, tiers=None) -> tuple[RuleConfig, ...]``
    Loads one policy file (used for policy reloads).
``parse_backing_url(url) -> BackingURL``
    Splits ``s3://bucket/prefix`` / ``file:///dir`` (for the store layer).

``check_paths=False`` skips the checks that look at the local filesystem
(tier directories exist and are writable, the state dir can be created, two
tiers are the same directory after resolving symlinks).  Policy files are
always read, since their rules are part of the config.

Rules
-----
* Parsed with ``tomllib``; a UTF-8 BOM is allowed.  A TOML syntax error is
  reported at the line tomllib names.  tomllib gives no positions for valid
  documents, so ``TomlLocator`` re-scans the text (valid TOML only) and maps
  key paths such as ``("tiers", 1, "high_watermark")`` to lines: table and
  array-of-tables headers, ``key =`` lines, dotted and quoted keys, array
  elements and inline tables.  A problem with a missing key is reported at
  the header of the table that lacks it.
* Unknown keys are errors, anywhere, with a "did you mean" suggestion; their
  values are never echoed (they could be secrets).  Credentials are never read
  from the config: a key that looks like one gets a pointer to the AWS chain.
* ``[backing]``: ``url`` required, ``s3://bucket[/prefix]`` (AWS bucket-name
  rules, no empty/``.``/``..`` prefix segments) or ``file:///absolute/dir``;
  ``endpoint_url`` optional ``http(s)://host[:port]`` without credentials;
  ``region`` optional.
* ``[state]``: ``dir`` required.  It must be a writable directory, or not
  exist yet under a writable parent (the daemon creates it), and must not be a
  tier directory.
* ``[[tiers]]``, fastest first, at least one: ``name`` required, unique,
  ``[A-Za-z][A-Za-z0-9_-]*`` up to 63 chars; ``path`` required, an existing
  writable directory (``os.access(W_OK | X_OK)``), not the same as or nested
  in another tier's; ``capacity`` optional size > 0; ``high_watermark`` /
  ``low_watermark`` default 0.90 / 0.80, written ``0.8`` or ``"80%"``, each in
  (0, 1], low < high.
* ``[fetch]``: ``block_size`` a **power of two** from 64 KiB to 1 GiB (so a
  block is a whole number of pages and of 128 KiB FUSE requests, and block
  arithmetic is shifts); ``readahead_max`` >= ``block_size``; ``concurrency``
  1..1024; ``dir_readahead`` (files) 0..1024, 0 = off.
* ``[namespace]``: ``list_ttl`` / ``revalidate_ttl`` durations >= 0;
  ``file_mode`` / ``dir_mode`` an octal string ("0644", "644", "0o644") or a
  TOML integer (``0o644``).  An integer must be <= 0o777, which catches 644
  written in decimal; the string form of ``dir_mode`` may add the sticky bit
  ("1777").  ``uid`` / ``gid`` optional integers in 0..2**32-2.
* ``[write]``: ``mode`` "back" | "through"; ``upload_delay`` duration >= 0;
  ``space_wait`` duration >= 0 (how long a writer waits for uploads to free
  tier space before ENOSPC); ``part_size`` size in 5 MiB..5 GiB, the smallest
  multipart part (files up to it go up in one PUT; larger parts are used when
  10,000 would not hold the file).
* ``[mover]``: ``interval`` duration > 0 (default "5s"): how often the tiers
  are checked when nothing wakes the mover; ``bandwidth`` a rate that caps
  the mover's copies, default "0" = no cap.  A rate is a size per second:
  "200MiB/s", "1.5GB/s", "200M/s" or "200MiB" (the "/s" may be left out;
  size units as for sizes, so "M" is binary); other time bases ("/h") are
  rejected.  A TOML integer is bytes per second.
* ``[metrics]``: ``listen`` = "host:port" (Prometheus text at /metrics); no
  ``listen`` (or no table) means metrics are off.  The host is an IPv4
  address, a bracketed IPv6 address ("[::1]:9567") or a host name; the port
  1..65535.  A non-loopback host such as "0.0.0.0" is allowed: the metrics
  carry no file names and no credentials, but then anyone who can reach the
  node can read them, so put such a port behind a firewall.
* ``[[rules]]``: ``match`` glob required (relative to the mount root, no
  leading "/", no "." or ".." segment, no empty segment; a trailing "/" is
  ignored); ``place`` must name a configured tier; ``keep_newest`` integer
  >= 1; ``demote_after`` / ``evict_after`` durations; ``write`` "back" |
  "through"; ``pin`` boolean; ``promote`` "on_access" | "never"; ``cache``
  boolean.  First match wins, so a rule whose pattern repeats an earlier one
  is an error.  (Wider shadowing, such as "data/**" before "data/x/*", is
  found by ``tierfs.policy.rules.shadowed_rules`` for ``policy check``.)
  Contradictions inside one rule are errors, reported at the line of the
  second key named:

  - ``pin = true`` with ``demote_after`` or ``evict_after``: a pinned file
    is never demoted or evicted;
  - ``pin = true`` with ``keep_newest``: every pinned entry stays anyway;
  - ``cache = false`` with ``pin = true``, ``place``, ``keep_newest``,
    ``promote = "on_access"``, ``demote_after`` or ``evict_after``: nothing
    is kept locally, so none of them can act (``write`` is allowed: new data
    is staged on the first tier with room until it is uploaded);
  - ``keep_newest`` with ``place`` naming a tier other than the first: the
    newest entries are kept on the first tier (checked when the tiers are
    known, i.e. not for a policy file checked alone);
  - ``evict_after`` not longer than ``demote_after``: the local copies would
    be dropped before the demotion could happen.
* ``policy_files = [...]``: paths relative to the config file's directory;
  each file holds only ``[[rules]]`` and its problems carry ITS file:line.
  Their rules come after the inline rules, in list order.
* Relative paths resolve against the config file's directory; ``~`` expands.
  ``Config.source`` and all paths in the result are absolute (not
  symlink-resolved).  Messages name a file the way the caller spelled it.
"""

from __future__ import annotations

import bisect
import contextlib
import difflib
import os
import re
import stat
import tomllib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from tierfs.errors import ConfigError
from tierfs.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
    toml_kind,
)

__all__ = [
    "BackingConfig",
    "BackingURL",
    "Config",
    "FetchConfig",
    "KeyPath",
    "MetricsConfig",
    "MoverConfig",
    "NamespaceConfig",
    "Problem",
    "RuleConfig",
    "StateConfig",
    "TierConfig",
    "TomlLocator",
    "WriteConfig",
    "check_file",
    "load_config",
    "load_policy",
    "parse_backing_url",
]


@dataclass(frozen=True, slots=True)
class BackingConfig:
    url: str  # "s3://bucket/prefix" or "file:///dir"
    endpoint_url: str | None = None
    region: str | None = None


@dataclass(frozen=True, slots=True)
class StateConfig:
    dir: Path


@dataclass(frozen=True, slots=True)
class TierConfig:
    name: str
    path: Path
    capacity: int | None  # bytes; None = size of the filesystem holding `path`
    high_watermark: float  # 0 < low < high <= 1
    low_watermark: float


@dataclass(frozen=True, slots=True)
class FetchConfig:
    block_size: int = 4 * 1024 * 1024
    readahead_max: int = 256 * 1024 * 1024
    concurrency: int = 32
    #: Files fetched ahead of a reader that opens a directory's files in
    #: listing order (``tierfs.workers.dirahead``); 0 turns it off.
    dir_readahead: int = 32


@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    list_ttl: float = 60.0  # seconds
    revalidate_ttl: float = 60.0  # seconds
    file_mode: int = 0o644
    dir_mode: int = 0o755
    uid: int | None = None  # None = the daemon's uid
    gid: int | None = None


@dataclass(frozen=True, slots=True)
class WriteConfig:
    mode: str = "back"  # "back" | "through"
    upload_delay: float = 5.0
    space_wait: float = 60.0
    part_size: int = 32 << 20


@dataclass(frozen=True, slots=True)
class RuleConfig:
    match: str
    source: str  # "file:line" where the rule starts, for messages
    place: str | None = None
    keep_newest: int | None = None
    demote_after: float | None = None  # seconds
    write: str | None = None
    pin: bool | None = None
    promote: str | None = None
    evict_after: float | None = None  # seconds
    cache: bool | None = None


@dataclass(frozen=True, slots=True)
class MoverConfig:
    interval: float = 5.0  # seconds, > 0
    bandwidth: int = 0  # bytes per second; 0 = no cap


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen: str | None = None  # "host:port" as written; None = metrics off
    host: str = ""  # without the brackets of an IPv6 address
    port: int = 0

    @property
    def enabled(self) -> bool:
        return self.listen is not None


@dataclass(frozen=True, slots=True)
class Config:
    source: Path
    backing: BackingConfig
    state: StateConfig
    tiers: tuple[TierConfig, ...]
    fetch: FetchConfig = field(default_factory=FetchConfig)
    namespace: NamespaceConfig = field(default_factory=NamespaceConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    mover: MoverConfig = field(default_factory=MoverConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    rules: tuple[RuleConfig, ...] = ()
    policy_files: tuple[Path, ...] = ()


Problem = tuple[str, int, str]
KeyPath = tuple[str | int, ...]
T = TypeVar("T")

DEFAULT_HIGH_WATERMARK = 0.90
DEFAULT_LOW_WATERMARK = 0.80
MIN_BLOCK_SIZE = 64 * 1024
MAX_BLOCK_SIZE = 1024 * 1024 * 1024
MAX_CONCURRENCY = 1024
MAX_DIR_READAHEAD = 1024
MAX_ID = 2**32 - 2


# --- backing URL -----------------------------------------------------------------


class BackingURL(NamedTuple):
    """A parsed ``[backing] url``.

    ``scheme`` is ``"s3"`` (then ``bucket`` and ``prefix`` are set; ``prefix``
    has no leading or trailing "/", "" for the bucket root) or ``"file"``
    (then ``directory`` is the absolute directory).
    """

    scheme: str
    bucket: str = ""
    prefix: str = ""
    directory: Path | None = None


_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_RE = re.compile(r"\d+\.\d+\.\d+\.\d+")
_URL_HINT = "use s3://bucket/prefix or file:///absolute/dir"


def parse_backing_url(url: str) -> BackingURL:
    """Split and check a backing URL; ``ValueError`` with a sentence if it is bad."""
    if not isinstance(url, str):
        raise ValueError(f"the backing url must be a string, not {toml_kind(url)}")
    if "\0" in url:
        raise ValueError("the backing url contains a NUL character")
    if url.startswith("s3://"):
        bucket, _, prefix = url[5:].partition("/")
        if not bucket:
            raise ValueError(f"{_q(url)} names no bucket; {_URL_HINT}")
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket or _IPV4_RE.fullmatch(bucket):
            raise ValueError(
                f"{_q(bucket)} is not a valid bucket name; use 3 to 63 lower-case "
                "letters, digits, dots and hyphens, starting and ending with a letter or digit"
            )
        prefix = prefix.rstrip("/")
        if prefix:
            bad = [s for s in prefix.split("/") if s in ("", ".", "..")]
            if bad:
                raise ValueError(
                    f"the prefix {_q(prefix)} has an empty, '.' or '..' segment, "
                    "which cannot map to a directory"
                )
        return BackingURL("s3", bucket=bucket, prefix=prefix)
    if url.startswith("file:"):
        rest = url[5:]
        if not rest.startswith("///"):
            raise ValueError(f"{_q(url)} is not an absolute file URL; write file:///absolute/dir")
        return BackingURL("file", directory=Path(os.path.normpath(rest[2:])))
    if url.startswith(("http://", "https://")):
        raise ValueError(
            f"{_q(url)} is an endpoint, not a backing url; write url = "
            '"s3://bucket/prefix" and put the endpoint in endpoint_url'
        )
    raise ValueError(f"{_q(url)} is not a backing url; {_URL_HINT}")


def _q(text: str) -> str:
    """Double-quote ``text`` for a message, escaping quotes and control chars."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    out = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", out)
    return f'"{out}"'


# --- line locator ------------------------------------------------------------------


class _ScanError(Exception):
    pass


_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


class TomlLocator:
    """Maps key paths to 1-based line numbers in a TOML text tomllib accepted.

    A key path is a tuple of table keys and array indexes, as in the parsed
    data: ``("tiers", 1, "high_watermark")``.  Recorded are: the header line of
    each ``[table]`` and ``[[array]]`` element (the array itself gets the line
    of its first header), the line of each ``key =`` (also for the implicit
    tables of a dotted key), each array element, and each key of an inline
    table.  ``line(path)`` falls back to the nearest recorded ancestor, and to
    0 when there is none.

    The scanner assumes valid TOML (parse with tomllib first).  It never
    raises: on anything unexpected it stops and keeps what it found.
    """

    def __init__(self, text: str) -> None:
        self.lines: dict[KeyPath, int] = {}
        self._s = text
        self._i = 0
        self._newlines = [m.start() for m in re.finditer("\n", text)]
        self._aot_counts: dict[KeyPath, int] = {}
        with contextlib.suppress(
            _ScanError, IndexError, ValueError, RecursionError, tomllib.TOMLDecodeError
        ):
            self._document()
        del self._s

    def line(self, path: Iterable[str | int]) -> int:
        """The line of ``path``, else of its nearest recorded ancestor, else 0."""
        key = tuple(path)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return 0

    # The scanner ----------------------------------------------------------------

    def _lineno(self) -> int:
        return bisect.bisect_left(self._newlines, self._i) + 1

    def _peek(self, token: str) -> bool:
        return self._s.startswith(token, self._i)

    def _expect(self, token: str) -> None:
        if not self._peek(token):
            raise _ScanError(token)
        self._i += len(token)

    def _skip(self, *, newlines: bool = False) -> None:
        """Skip spaces and tabs; with ``newlines`` also line ends and comments."""
        s, n = self._s, len(self._s)
        while self._i < n:
            c = s[self._i]
            if c in " \t" or (newlines and c in "\r\n"):
                self._i += 1
            elif newlines and c == "#":
                end = s.find("\n", self._i)
                self._i = n if end < 0 else end
            else:
                break

    def _document(self) -> None:
        current: KeyPath = ()
        n = len(self._s)
        while True:
            self._skip(newlines=True)
            if self._i >= n:
                return
            line = self._lineno()
            if self._peek("[["):
                self._i += 2
                keys = self._key()
                self._skip()
                self._expect("]]")
                array = (*self._concrete(keys[:-1]), keys[-1])
                index = self._aot_counts.get(array, 0)
                self._aot_counts[array] = index + 1
                current = (*array, index)
                self.lines.setdefault(array, line)
                self.lines[current] = line
            elif self._peek("["):
                self._i += 1
                keys = self._key()
                self._skip()
                self._expect("]")
                current = self._concrete(keys)
                self.lines[current] = line
            else:
                self._key_value(current, line)

    def _concrete(self, keys: KeyPath) -> KeyPath:
        """Header keys -> data path, entering the last element of arrays of tables."""
        out: KeyPath = ()
        for key in keys:
            out = (*out, key)
            if out in self._aot_counts:
                out = (*out, self._aot_counts[out] - 1)
        return out

    def _key_value(self, base: KeyPath, line: int) -> None:
        keys = self._key()
        self._skip()
        self._expect("=")
        for depth in range(1, len(keys)):
            self.lines.setdefault(base + keys[:depth], line)
        self.lines[base + keys] = line
        self._skip()
        self._value(base + keys)

    def _key(self) -> KeyPath:
        parts: list[str] = []
        while True:
            self._skip()
            start = self._i
            if self._peek('"'):
                self._basic_string()
                raw = self._s[start : self._i]
                parts.append(next(iter(tomllib.loads(raw + " = 0"))))
            elif self._peek("'"):
                self._literal_string()
                parts.append(self._s[start + 1 : self._i - 1])
            else:
                m = _BARE_KEY_RE.match(self._s, self._i)
                if m is None:
                    raise _ScanError("key")
                parts.append(m.group())
                self._i = m.end()
            self._skip()
            if not self._peek("."):
                return tuple(parts)
            self._i += 1

    def _basic_string(self) -> None:
        s = self._s
        self._i += 1
        while s[self._i] != '"':
            self._i += 2 if s[self._i] == "\\" else 1
        self._i += 1

    def _literal_string(self) -> None:
        end = self._s.index("'", self._i + 1)
        self._i = end + 1

    def _multiline(self, quote: str) -> None:
        s = self._s
        self._i += 3
        while not s.startswith(quote * 3, self._i):
            if quote == '"' and s[self._i] == "\\":
                self._i += 1
            self._i += 1
            if self._i >= len(s):
                raise _ScanError("unterminated string")
        self._i += 3
        for _ in range(2):  # up to two quotes may end the content: """a"""""
            if self._peek(quote):
                self._i += 1

    def _value(self, path: KeyPath) -> None:
        s = self._s
        if self._peek('"""'):
            self._multiline('"')
        elif self._peek("'''"):
            self._multiline("'")
        elif self._peek('"'):
            self._basic_string()
        elif self._peek("'"):
            self._literal_string()
        elif self._peek("["):
            self._array(path)
        elif self._peek("{"):
            self._inline_table(path)
        else:
            start = self._i
            while self._i < len(s) and s[self._i] not in ",]}#\r\n":
                self._i += 1
            if self._i == start:
                raise _ScanError("value")

    def _array(self, path: KeyPath) -> None:
        self._i += 1
        index = 0
        while True:
            self._skip(newlines=True)
            if self._peek("]"):
                self._i += 1
                return
            self.lines[(*path, index)] = self._lineno()
            self._value((*path, index))
            self._skip(newlines=True)
            if self._peek(","):
                self._i += 1
                index += 1
            elif not self._peek("]"):
                raise _ScanError("array")

    def _inline_table(self, path: KeyPath) -> None:
        self._i += 1
        while True:
            self._skip(newlines=True)
            if self._peek("}"):
                self._i += 1
                return
            self._key_value(path, self._lineno())
            self._skip(newlines=True)
            if self._peek(","):
                self._i += 1
            elif not self._peek("}"):
                raise _ScanError("inline table")


# --- reading files -----------------------------------------------------------------


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


# --- value converters ----------------------------------------------------------------
# Each takes a TOML value and returns the converted value or raises ValueError
# with a sentence that does not name the key (the caller prefixes "key: ").


def _conv_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {toml_kind(value)}")
    if not value.strip():
        raise ValueError("must not be empty")
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _conv_size(value: Any) -> int:
    return parse_size(value)


def _conv_positive_size(value: Any) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError("must be more than zero")
    return size


def _conv_part_size(value: Any) -> int:
    size = parse_size(value)
    if not 5 << 20 <= size <= 5 << 30:
        raise ValueError("must be between 5MiB and 5GiB (the S3 limits for a part)")
    return size


def _conv_duration(value: Any) -> float:
    return parse_duration(value)


def _conv_watermark(value: Any) -> float:
    fraction = parse_fraction(value)
    if not 0 < fraction <= 1:
        shown = _q(value) if isinstance(value, str) else repr(value)
        raise ValueError(
            f'{shown} is outside (0, 1]; use a fraction like 0.8 or a percentage like "80%"'
        )
    return fraction


def _conv_int(low: int, high: int | None = None) -> Callable[[Any], int]:
    def conv(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {toml_kind(value)}")
        if value < low or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"from {low} to {high}"
            raise ValueError(f"{value} is out of range; use an integer {span}")
        return value

    return conv


def _conv_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {toml_kind(value)}")
    return value


def _conv_choice(*choices: str) -> Callable[[Any], str]:
    listed = " or ".join(_q(c) for c in choices)

    def conv(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected {listed}, got {toml_kind(value)}")
        if value not in choices:
            raise ValueError(f"{_q(value)} is not allowed; use {listed}{_suggest(value, choices)}")
        return value

    return conv


_OCTAL_RE = re.compile(r"(?:0o|0)?([0-7]{1,4})")


def _conv_mode(string_max: int) -> Callable[[Any], int]:
    def conv(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f'expected an octal string like "0644", got {toml_kind(value)}')
        if isinstance(value, int):
            if not 0 <= value <= 0o777:
                raise ValueError(
                    f"{value} is not a permission mode; write it as a string like "
                    '"0644" or as an octal TOML integer like 0o644'
                )
            return value
        m = _OCTAL_RE.fullmatch(value.strip())
        mode = int(m.group(1), 8) if m else -1
        if not 0 <= mode <= string_max:
            raise ValueError(
                f'{_q(value)} is not a permission mode; use an octal string like "0644"'
            )
        return mode

    return conv


def _conv_endpoint(value: Any) -> str:
    from urllib.parse import urlsplit

    text = _conv_str(value)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        raise ValueError("this is not a valid URL; use http(s)://host[:port]") from None
    if parts.username is not None or parts.password is not None:
        # Do not echo the value: it holds credentials.
        raise ValueError(
            "must not contain credentials; they come from the standard AWS chain "
            "(environment, ~/.aws, instance role)"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{_q(text)} is not an http(s) URL; use http(s)://host[:port]")
    return text


def _conv_region(value: Any) -> str:
    text = _conv_str(value)
    if any(c.isspace() for c in text):
        raise ValueError(f"{_q(text)} contains spaces; use a region name like us-east-1")
    return text


_TIER_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}")


def _conv_tier_name(value: Any) -> str:
    text = _conv_str(value)
    if not _TIER_NAME_RE.fullmatch(text):
        raise ValueError(
            f"{_q(text)} is not a simple name; use a letter followed by up to 62 "
            "letters, digits, '_' or '-', like nvme"
        )
    return text


def _conv_glob(value: Any) -> str:
    text = _conv_str(value)
    if text.startswith("/"):
        raise ValueError(
            f"{_q(text)} starts with '/'; patterns are relative to the mount root, "
            f"write {_q(text.lstrip('/'))}"
        )
    segments = text.rstrip("/").split("/")
    if ".." in segments:
        raise ValueError(f"{_q(text)} has a '..' segment, which can never match")
    if "." in segments:
        raise ValueError(f"{_q(text)} has a '.' segment, which can never match; remove it")
    if "" in segments:
        raise ValueError(f"{_q(text)} has an empty segment ('//'), which can never match")
    return text


def _conv_positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be more than zero")
    return seconds


def _conv_rate(value: Any) -> int:
    return parse_rate(value)


_HOSTNAME_RE = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_LISTEN_HINT = 'use "host:port" like "127.0.0.1:9567" or "[::1]:9567"'


def _conv_listen(value: Any) -> tuple[str, str, int]:
    """``"host:port"`` -> (as written, host, port); IPv6 hosts in brackets."""
    import ipaddress

    text = _conv_str(value).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"{_q(text)} has no port; {_LISTEN_HINT}")
    if not host:
        raise ValueError(
            f"{_q(text)} has no host; write 127.0.0.1{text} for this node only, "
            f"or 0.0.0.0{text} for every interface"
        )
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{_q(text)}: the port must be a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{_q(text)}: {_q(host)} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f'{_q(text)}: write an IPv6 address in brackets, like "[::1]:9567"')
    elif re.fullmatch(r"[\d.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{_q(text)}: {_q(host)} is not an IPv4 address") from None
    elif not _HOSTNAME_RE.fullmatch(host):
        raise ValueError(f"{_q(text)}: {_q(host)} is not a host name; {_LISTEN_HINT}")
    return text, host, int(port_text)


def _path_conv(base: Path) -> Callable[[Any], Path]:
    def conv(value: Any) -> Path:
        text = os.path.expanduser(_conv_str(value))
        return Path(os.path.normpath(os.path.join(base, text)))

    return conv


# --- field helpers ---------------------------------------------------------------------


_SECRET_RE = re.compile(r"secret|password|passwd|token|credential|access_?key", re.I)


def _suggest(word: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f'; did you mean "{lowered[match[0]]}"?' if match else ""


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
                f"unknown key {_q(key)} in {where}; credentials are never read from the "
                "config file: use the standard AWS chain (environment, ~/.aws, instance role)"
            )
        elif path and key in _TOP_KEYS:
            sentence = (
                f"unknown key {_q(key)} in {where}; {_q(key)} is a top-level key: "
                "move it above the first [table] header"
            )
        else:
            hint = _suggest(key, allowed) or "; valid keys are " + ", ".join(allowed)
            sentence = f"unknown key {_q(key)} in {where}{hint}"
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


def _require(
    report: _Report, doc: _Doc, table: dict[str, Any], path: KeyPath, key: str, where: str
) -> bool:
    if key in table:
        return True
    report.add(doc, path, f"{where} is missing the required key {_q(key)}")
    return False


def _table(
    report: _Report, doc: _Doc, data: dict[str, Any], key: str, example: str
) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        report.add(doc, (key,), f"{key} must be a table ({example}), not {toml_kind(value)}")
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
        return f"{what} {_q(str(path))} does not exist; create it or fix the path"
    except OSError as err:
        return f"{what} {_q(str(path))} cannot be checked: {err.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} {_q(str(path))} is not a directory"
    if not _access(path, os.W_OK | os.X_OK):
        return f"{what} {_q(str(path))} is not writable by this user (uid {os.geteuid()})"
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
        return f"the state dir {_q(str(path))} does not exist and cannot be created: {problem}"
    return None


def _same_key(path: Path, check_paths: bool) -> Path:
    return Path(os.path.realpath(path)) if check_paths else path


# --- sections -------------------------------------------------------------------------------

_TOP_KEYS = (
    "backing",
    "state",
    "tiers",
    "fetch",
    "namespace",
    "write",
    "mover",
    "metrics",
    "rules",
    "policy_files",
)
_BACKING_KEYS = ("url", "endpoint_url", "region")
_STATE_KEYS = ("dir",)
_TIER_KEYS = ("name", "path", "capacity", "high_watermark", "low_watermark")
_FETCH_KEYS = ("block_size", "readahead_max", "concurrency", "dir_readahead")
_NAMESPACE_KEYS = ("list_ttl", "revalidate_ttl", "file_mode", "dir_mode", "uid", "gid")
_WRITE_KEYS = ("mode", "upload_delay", "space_wait", "part_size")
_MOVER_KEYS = ("interval", "bandwidth")
_METRICS_KEYS = ("listen",)
_RULE_KEYS = (
    "match",
    "place",
    "keep_newest",
    "demote_after",
    "evict_after",
    "write",
    "pin",
    "promote",
    "cache",
)

_WRITE_MODES = ("back", "through")
_PROMOTE_MODES = ("on_access", "never")


def _backing(report: _Report, doc: _Doc) -> BackingConfig | None:
    table = _table(report, doc, doc.data, "backing", '[backing] with url = "s3://bucket/prefix"')
    if table is None:
        if "backing" not in doc.data:
            report.add_at(
                doc.file,
                0,
                'the [backing] table is missing; add [backing] with url = "s3://bucket"',
            )
        return None
    path: KeyPath = ("backing",)
    _check_keys(report, doc, table, path, _BACKING_KEYS, "[backing]")
    url = ""
    if _require(report, doc, table, path, "url", "[backing]"):
        url = _get(report, doc, table, path, "url", _conv_backing_url, "")
    endpoint = _get(report, doc, table, path, "endpoint_url", _conv_endpoint, None)
    region = _get(report, doc, table, path, "region", _conv_region, None)
    if endpoint is not None and url.startswith("file:"):
        report.add(
            doc,
            (*path, "endpoint_url"),
            "endpoint_url only applies to an s3:// backing url; remove it for a file:// url",
        )
    return BackingConfig(url=url, endpoint_url=endpoint, region=region)


def _conv_backing_url(value: Any) -> str:
    text = _conv_str(value)
    parse_backing_url(text)
    return text


def _state(report: _Report, doc: _Doc, base: Path, check_paths: bool) -> StateConfig | None:
    table = _table(report, doc, doc.data, "state", '[state] with dir = "/var/lib/tierfs"')
    if table is None:
        if "state" not in doc.data:
            report.add_at(
                doc.file,
                0,
                'the [state] table is missing; add [state] with dir = "/var/lib/tierfs"',
            )
        return None
    path: KeyPath = ("state",)
    _check_keys(report, doc, table, path, _STATE_KEYS, "[state]")
    if not _require(report, doc, table, path, "dir", "[state]"):
        return None
    directory = _get(report, doc, table, path, "dir", _path_conv(base), None)
    if directory is None:
        return None
    if check_paths:
        problem = _state_dir_problem(directory)
        if problem:
            report.add(doc, (*path, "dir"), problem)
    return StateConfig(dir=directory)


def _tiers(report: _Report, doc: _Doc, base: Path, check_paths: bool) -> list[TierConfig]:
    entries = _array_of_tables(report, doc, doc.data, "tiers")
    if not entries and "tiers" not in doc.data:
        report.add_at(
            doc.file,
            0,
            "no tiers are configured; add at least one [[tiers]] with a name and a path",
        )
    elif doc.data.get("tiers") == []:
        report.add(doc, ("tiers",), "tiers is empty; configure at least one [[tiers]]")
    tiers: list[TierConfig] = []
    names: dict[str, int] = {}
    paths: dict[Path, tuple[str, int]] = {}
    for path, table in entries:
        _check_keys(report, doc, table, path, _TIER_KEYS, "[[tiers]]")
        has_name = _require(report, doc, table, path, "name", "this [[tiers]] entry")
        has_path = _require(report, doc, table, path, "path", "this [[tiers]] entry")
        name = _get(report, doc, table, path, "name", _conv_tier_name, "") if has_name else ""
        if name:
            if name in names:
                report.add(
                    doc,
                    (*path, "name"),
                    f"the tier name {_q(name)} is already used by the tier at line {names[name]}; "
                    "tier names must be unique",
                )
            else:
                names[name] = doc.line((*path, "name"))
        tier_path = _get(report, doc, table, path, "path", _path_conv(base), None)
        if has_path and tier_path is not None:
            problem = _dir_problem(tier_path, "the tier path") if check_paths else None
            if problem:
                report.add(doc, (*path, "path"), problem)
            _check_overlap(report, doc, path, tier_path, paths, check_paths)
            paths.setdefault(_same_key(tier_path, check_paths), (name, doc.line((*path, "path"))))
        capacity = _get(report, doc, table, path, "capacity", _conv_positive_size, None)
        before = len(report.problems)
        high = _get(
            report, doc, table, path, "high_watermark", _conv_watermark, DEFAULT_HIGH_WATERMARK
        )
        low = _get(
            report, doc, table, path, "low_watermark", _conv_watermark, DEFAULT_LOW_WATERMARK
        )
        if low >= high and len(report.problems) == before:  # both values are good
            at = "low_watermark" if "low_watermark" in table else "high_watermark"
            low_text = f"{low:g}" + ("" if "low_watermark" in table else " (the default)")
            high_text = f"{high:g}" + ("" if "high_watermark" in table else " (the default)")
            report.add(
                doc,
                (*path, at),
                f"low_watermark {low_text} must be below high_watermark {high_text}",
            )
        tiers.append(
            TierConfig(
                name=name,
                path=tier_path if tier_path is not None else Path(),
                capacity=capacity,
                high_watermark=high,
                low_watermark=low,
            )
        )
    return tiers


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
            f"the tier {_q(other_name)} at line {other_line}"
            if other_name
            else f"line {other_line}"
        )
        if key == other:
            report.add(
                doc,
                (*path, "path"),
                f"the tier path {_q(str(tier_path))} is already used by {who}; "
                "each tier needs its own directory",
            )
            return
        if key.is_relative_to(other) or other.is_relative_to(key):
            report.add(
                doc,
                (*path, "path"),
                f"the tier path {_q(str(tier_path))} overlaps the path of {who}; "
                "tier directories must not be inside each other",
            )
            return


def _fetch(report: _Report, doc: _Doc) -> FetchConfig:
    table = _table(report, doc, doc.data, "fetch", "[fetch]")
    if table is None:
        return FetchConfig()
    path: KeyPath = ("fetch",)
    _check_keys(report, doc, table, path, _FETCH_KEYS, "[fetch]")
    defaults = FetchConfig()
    before = len(report.problems)
    block = _get(report, doc, table, path, "block_size", _conv_block_size, defaults.block_size)
    readahead = _get(report, doc, table, path, "readahead_max", _conv_size, defaults.readahead_max)
    concurrency = _get(
        report, doc, table, path, "concurrency", _conv_int(1, MAX_CONCURRENCY), defaults.concurrency
    )
    dir_readahead = _get(
        report,
        doc,
        table,
        path,
        "dir_readahead",
        _conv_int(0, MAX_DIR_READAHEAD),
        defaults.dir_readahead,
    )
    if readahead < block and len(report.problems) == before:
        at = "readahead_max" if "readahead_max" in table else "block_size"
        report.add(
            doc,
            (*path, at),
            f"readahead_max ({format_size(readahead)}) must be at least "
            f"block_size ({format_size(block)})",
        )
    return FetchConfig(
        block_size=block,
        readahead_max=readahead,
        concurrency=concurrency,
        dir_readahead=dir_readahead,
    )


def _conv_block_size(value: Any) -> int:
    size = parse_size(value)
    if size < MIN_BLOCK_SIZE or size > MAX_BLOCK_SIZE or size & (size - 1):
        raise ValueError(
            f"{size} bytes is not allowed; use a power of two from 64KiB to 1GiB, like 4MiB"
        )
    return size


def _namespace(report: _Report, doc: _Doc) -> NamespaceConfig:
    table = _table(report, doc, doc.data, "namespace", "[namespace]")
    if table is None:
        return NamespaceConfig()
    path: KeyPath = ("namespace",)
    _check_keys(report, doc, table, path, _NAMESPACE_KEYS, "[namespace]")
    d = NamespaceConfig()
    return NamespaceConfig(
        list_ttl=_get(report, doc, table, path, "list_ttl", _conv_duration, d.list_ttl),
        revalidate_ttl=_get(
            report, doc, table, path, "revalidate_ttl", _conv_duration, d.revalidate_ttl
        ),
        file_mode=_get(report, doc, table, path, "file_mode", _conv_mode(0o777), d.file_mode),
        dir_mode=_get(report, doc, table, path, "dir_mode", _conv_mode(0o1777), d.dir_mode),
        uid=_get(report, doc, table, path, "uid", _conv_int(0, MAX_ID), None),
        gid=_get(report, doc, table, path, "gid", _conv_int(0, MAX_ID), None),
    )


def _write(report: _Report, doc: _Doc) -> WriteConfig:
    table = _table(report, doc, doc.data, "write", "[write]")
    if table is None:
        return WriteConfig()
    path: KeyPath = ("write",)
    _check_keys(report, doc, table, path, _WRITE_KEYS, "[write]")
    d = WriteConfig()
    return WriteConfig(
        mode=_get(report, doc, table, path, "mode", _conv_choice(*_WRITE_MODES), d.mode),
        upload_delay=_get(report, doc, table, path, "upload_delay", _conv_duration, d.upload_delay),
        space_wait=_get(report, doc, table, path, "space_wait", _conv_duration, d.space_wait),
        part_size=_get(report, doc, table, path, "part_size", _conv_part_size, d.part_size),
    )


def _mover(report: _Report, doc: _Doc) -> MoverConfig:
    table = _table(report, doc, doc.data, "mover", "[mover]")
    if table is None:
        return MoverConfig()
    path: KeyPath = ("mover",)
    _check_keys(report, doc, table, path, _MOVER_KEYS, "[mover]")
    d = MoverConfig()
    return MoverConfig(
        interval=_get(report, doc, table, path, "interval", _conv_positive_duration, d.interval),
        bandwidth=_get(report, doc, table, path, "bandwidth", _conv_rate, d.bandwidth),
    )


def _metrics(report: _Report, doc: _Doc) -> MetricsConfig:
    table = _table(report, doc, doc.data, "metrics", '[metrics] with listen = "127.0.0.1:9567"')
    if table is None:
        return MetricsConfig()
    path: KeyPath = ("metrics",)
    _check_keys(report, doc, table, path, _METRICS_KEYS, "[metrics]")
    listen = _get(report, doc, table, path, "listen", _conv_listen, None)
    if listen is None:
        return MetricsConfig()
    text, host, port = listen
    return MetricsConfig(listen=text, host=host, port=port)


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
            f"keep_newest keeps the newest entries on the first tier ({_q(names[0])}), "
            f"but place puts new data on {_q(rule.place)}; drop place or keep_newest",
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
        _check_keys(report, doc, table, path, _RULE_KEYS, "[[rules]]")
        match = ""
        if _require(report, doc, table, path, "match", "this [[rules]] entry"):
            match = _get(report, doc, table, path, "match", _conv_glob, "")
        if match:
            if match in state.patterns:
                report.add(
                    doc,
                    (*path, "match"),
                    f"this rule can never apply: the rule at {state.patterns[match]} has the "
                    f"same pattern {_q(match)} and comes first (first match wins)",
                )
            else:
                state.patterns[match] = source
        place = _get(report, doc, table, path, "place", _conv_str, None)
        names = state.tier_names
        if place is not None and names is not None and place not in names:
            listed = ", ".join(_q(n) for n in names)
            known = f"the tiers are {listed}" if listed else "no valid tiers are configured"
            report.add(
                doc,
                (*path, "place"),
                f"place: {_q(place)} is not a configured tier ({known})" + _suggest(place, names),
            )
        rule = RuleConfig(
            match=match,
            source=source,
            place=place,
            keep_newest=_get(report, doc, table, path, "keep_newest", _conv_int(1), None),
            demote_after=_get(report, doc, table, path, "demote_after", _conv_duration, None),
            write=_get(report, doc, table, path, "write", _conv_choice(*_WRITE_MODES), None),
            pin=_get(report, doc, table, path, "pin", _conv_bool, None),
            promote=_get(report, doc, table, path, "promote", _conv_choice(*_PROMOTE_MODES), None),
            evict_after=_get(report, doc, table, path, "evict_after", _conv_duration, None),
            cache=_get(report, doc, table, path, "cache", _conv_bool, None),
        )
        _rule_conflicts(report, doc, path, rule, names)
        rules.append(rule)
    return rules


def _policy_rules(report: _Report, doc: _Doc, state: _RuleState) -> list[RuleConfig]:
    """The rules of a policy file: a file that holds only [[rules]]."""
    for key in doc.data:
        if key == "rules":
            continue
        if key in _TOP_KEYS:
            sentence = (
                f"a policy file holds only [[rules]]; {_q(key)} belongs in the main config file"
            )
        else:
            sentence = f"unknown key {_q(key)}: a policy file holds only [[rules]]" + _suggest(
                key, ("rules",)
            )
        report.add(doc, (key,), sentence)
    return _rules(report, doc, doc.data, state)


def _policy_files(
    report: _Report, doc: _Doc, base: Path, state: _RuleState
) -> tuple[list[Path], list[RuleConfig]]:
    value = doc.data.get("policy_files")
    if value is None:
        return [], []
    if not isinstance(value, list):
        report.add(
            doc,
            ("policy_files",),
            f'policy_files must be an array of paths like ["policy.toml"], not {toml_kind(value)}',
        )
        return [], []
    display_dir = os.path.dirname(doc.file)
    files: list[Path] = []
    rules: list[RuleConfig] = []
    seen: dict[Path, int] = {}
    for index, entry in enumerate(value):
        at: KeyPath = ("policy_files", index)
        try:
            text = os.path.expanduser(_conv_str(entry))
        except ValueError as err:
            report.add(doc, at, f"policy_files entry {index + 1}: {err}")
            continue
        path = Path(os.path.normpath(os.path.join(base, text)))
        if path == doc.path:
            report.add(doc, at, f"policy_files lists the config file itself ({_q(entry)})")
            continue
        if path in seen:
            report.add(
                doc, at, f"the policy file {_q(entry)} is already listed at line {seen[path]}"
            )
            continue
        seen[path] = doc.line(at)
        files.append(path)
        display = os.path.normpath(os.path.join(display_dir, text))
        if not path.is_file():
            what = "does not exist" if not os.path.lexists(path) else "is not a regular file"
            report.add(doc, at, f"the policy file {_q(entry)} {what} (looked for {_q(str(path))})")
            continue
        policy = _read(path, display, report)
        if policy is not None:
            rules.extend(_policy_rules(report, policy, state))
    return files, rules


def _build_config(report: _Report, doc: _Doc, check_paths: bool) -> Config | None:
    base = doc.path.parent
    _check_keys(report, doc, doc.data, (), _TOP_KEYS, "the config file")
    backing = _backing(report, doc)
    state = _state(report, doc, base, check_paths)
    tiers = _tiers(report, doc, base, check_paths)
    if state is not None and tiers:
        state_key = _same_key(state.dir, check_paths)
        for tier in tiers:
            if tier.name and _same_key(tier.path, check_paths) == state_key:
                report.add(
                    doc,
                    ("state", "dir"),
                    f"the state dir is the directory of the tier {_q(tier.name)}; "
                    "give it its own directory",
                )
    fetch = _fetch(report, doc)
    namespace = _namespace(report, doc)
    write = _write(report, doc)
    mover = _mover(report, doc)
    metrics = _metrics(report, doc)
    rule_state = _RuleState([t.name for t in tiers if t.name])
    rules = _rules(report, doc, doc.data, rule_state)
    policy_paths, policy_rules = _policy_files(report, doc, base, rule_state)
    if backing is None or state is None or report.problems:
        return None
    return Config(
        source=doc.path,
        backing=backing,
        state=state,
        tiers=tuple(tiers),
        fetch=fetch,
        namespace=namespace,
        write=write,
        mover=mover,
        metrics=metrics,
        rules=tuple(rules + policy_rules),
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
    """Load one policy file (only ``[[rules]]``); ``ConfigError`` lists its problems.

    With ``tiers`` (the configured tier names), each rule's ``place`` is
    checked against them; with None it is not.
    """
    file, absolute = _absolute(path)
    report = _Report()
    doc = _read(absolute, file, report)
    rules = _policy_rules(report, doc, _RuleState(tiers)) if doc is not None else []
    if report.problems:
        raise ConfigError(report.sorted())
    return tuple(rules)


def check_file(path: str | os.PathLike[str], *, check_paths: bool = True) -> list[Problem]:
    """Validate a config file or a policy file; return its problems (empty = OK).

    This is ``tierfs policy check FILE``.  A file with any of the config
    tables (``backing``, ``state``, ``tiers``, ``fetch``, ``namespace``,
    ``write``, ``mover``, ``metrics``, ``policy_files``) is checked as a full config, including the
    policy files it lists.  Any other file is checked as a policy file, which
    holds only ``[[rules]]``; the tiers are then unknown, so a rule's
    ``place`` is only checked to be a string, not that it names a configured
    tier (check the main config for that).

    ``check_paths=False`` skips the local filesystem checks of tier paths and
    the state dir, for checking a config on a machine other than the node.
    """
    file, absolute = _absolute(path)
    report = _Report()
    doc = _read(absolute, file, report)
    if doc is not None:
        if any(key in doc.data for key in _TOP_KEYS if key != "rules"):
            _build_config(report, doc, check_paths)
        else:
            _policy_rules(report, doc, _RuleState(None))
    return report.sorted()
