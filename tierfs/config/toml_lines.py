"""TOML positions: which line of a config file holds a key.

tomllib gives no positions for valid documents, so ``TomlLocator`` scans
the text again (valid TOML only: tomllib accepted it first) and maps key
paths such as ``("tiers", 1, "high_watermark")`` to lines: table and
array-of-tables headers, ``key =`` lines, dotted and quoted keys, array
elements and inline tables.  A path it does not know maps to the line of
its nearest known ancestor (a missing key: the header of its table).
"""

from __future__ import annotations

import bisect
import contextlib
import re
import tomllib
from collections.abc import Iterable

KeyPath = tuple[str | int, ...]


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
