"""Human units: sizes ("4MiB"), durations ("3d", "1h30m"), fractions ("80%").

Parsing
-------
``parse_size(value) -> int`` (bytes)
    An integer is a number of bytes.  A string is a number, optional spaces,
    and an optional unit; units are case-insensitive:

    * ``B`` or no unit: bytes (must then be a whole number);
    * ``KB``, ``MB``, ``GB``, ``TB``, ``PB``, ``EB``: decimal SI, 1000**n;
    * ``KiB``, ``MiB`` ... ``EiB`` and the Kubernetes spellings ``Ki``,
      ``Mi`` ... ``Ei``: binary, 1024**n;
    * a bare letter ``K``, ``M``, ``G``, ``T``, ``P``, ``E`` is **binary**, as
      in dd, fallocate and the rest of coreutils.  (A cache size written as
      "4G" almost always means GiB.)

    Fractions are allowed ("1.5TiB"); the result is rounded to the nearest
    byte.  Negative numbers, exponents, underscores and unknown units are
    rejected.

``parse_duration(value) -> float`` (seconds)
    A number (int or float) is seconds.  A string is either a plain number
    (seconds) or one or more ``<number><unit>`` parts with units ``ms``, ``s``,
    ``m``, ``h``, ``d``, ``w`` (lower case: "M" could mean month).  Parts go
    from the largest unit to the smallest, each unit at most once:
    "1h30m", "1d 12h", "1.5s", "250ms".

``parse_rate(value) -> int`` (bytes per second; 0 = no cap)
    A transfer rate: a size as for ``parse_size`` with an optional ``/s``
    suffix ("200MiB/s", "200MiB", "1.5GB/s", "200M/s"), or a TOML integer
    (bytes per second).  ``0`` / ``"0"`` means "no cap".  Other time bases
    ("/h", "/min") are rejected, since a cap per hour reads as a cap per
    second to most people.

``parse_fraction(value) -> float``
    A number (0.8) or a string: "0.8" or a percentage "80%".  Negative, NaN
    and infinite values are rejected; the caller checks the range it needs.

Every parser raises ``ValueError`` whose message is one plain sentence that
quotes the bad input and shows a good example, for wrong types too (TOML gives
us bools where numbers were meant, and the config loader wants one kind of
error).  The sentence never needs a key name: the config loader prefixes it.

Formatting
----------
``format_size(n)`` gives binary units with about three significant digits:
"512 B", "4 MiB", "1.5 GiB", "12.3 TiB".  ``parse_size`` reads it back within
0.5%.

``format_duration(s)`` gives "250ms", "1.25s", "12.5s", "1m30s", "2h13m",
"3d4h": at most two parts, rounded to the smaller part.  ``parse_duration``
reads it back.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Literal, NamedTuple, overload

__all__ = [
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_fraction",
    "parse_rate",
    "parse_size",
    "toml_kind",
]

# --- sizes -----------------------------------------------------------------------

_PREFIXES = "kmgtpe"

_SIZE_UNITS: dict[str, int] = {"": 1, "b": 1}
for _n, _p in enumerate(_PREFIXES, start=1):
    _SIZE_UNITS[_p] = 1024**_n
    _SIZE_UNITS[_p + "i"] = 1024**_n
    _SIZE_UNITS[_p + "ib"] = 1024**_n
    _SIZE_UNITS[_p + "b"] = 1000**_n
del _n, _p

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(rf"(?P<sign>-?)\s*(?P<num>{_NUMBER})\s*(?P<unit>[A-Za-z]*)")

_SIZE_HINT = "use a number with a unit like 4MiB, 512KiB or 1.5TiB"


def _quote(value: object) -> str:
    """Quote a user value for a message: strings in double quotes."""
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        escaped = escaped.replace("\n", "\\n").replace("\t", "\\t")
        return f'"{escaped}"'
    return repr(value)


def toml_kind(value: object) -> str:
    """'a boolean', 'an array', ...: the kind of a TOML value, for messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date or time" if type(value).__module__ == "datetime" else type(value).__name__


class _Problems(NamedTuple):
    """What ``_number_or_text`` says of a bad value of one kind."""

    expected: str  # not a number nor a string
    invalid: str  # after the number: NaN, infinite
    negative: str  # after the number


@overload
def _number_or_text(value: object, problems: _Problems, *, whole: Literal[True]) -> int | str: ...
@overload
def _number_or_text(value: object, problems: _Problems) -> float | str: ...
def _number_or_text(value: object, problems: _Problems, *, whole: bool = False) -> float | str:
    """A number given as a number: finite and not negative, as a float (an
    int if ``whole``: then only ints are numbers); a string: stripped, for
    the caller to parse.  Anything else (a bool, a table) raises
    ``ValueError``, as does a bad number (``problems``)."""
    kinds = (int, str) if whole else (int, float, str)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"{problems.expected}, not {toml_kind(value)}")
    if isinstance(value, str):
        return value.strip()
    assert isinstance(value, int | float)
    if not math.isfinite(value):
        raise ValueError(f"{value} {problems.invalid}")
    if value < 0:
        raise ValueError(f"{value} {problems.negative}")
    return value if whole else float(value)


_DURATION_HINT = "use a number with a unit (ms, s, m, h, d or w) like 60s, 3d or 1h30m"
_FRACTION_HINT = 'use a number like 0.8 or a percentage like "80%"'
#: What each kind of value says when it is not one.
_PROBLEMS = {
    "size": _Problems(
        'a size must be a whole number of bytes or a string like "4MiB"',
        "is not a size",
        "is negative; a size must be zero or more",
    ),
    "rate": _Problems(
        'a rate must be a string like "200MiB/s" or a whole number of bytes per second',
        "is not a rate",
        "is negative; a rate must be zero (no cap) or more",
    ),
    "duration": _Problems(
        'a duration must be a number of seconds or a string like "60s"',
        f"is not a duration; {_DURATION_HINT}",
        "is negative; a duration must be zero or more",
    ),
    "fraction": _Problems(
        "a fraction must be a number or a percentage string",
        f"is not a fraction; {_FRACTION_HINT}",
        f"is negative; {_FRACTION_HINT}",
    ),
}


def parse_size(value: str | int) -> int:
    """Parse a size such as ``"4MiB"``, ``"1.5TiB"``, ``"512KB"`` or ``4096``; bytes."""
    text = _number_or_text(value, _PROBLEMS["size"], whole=True)
    if isinstance(text, int):
        return text
    if not text:
        raise ValueError(f"an empty string is not a size; {_SIZE_HINT}")
    m = _SIZE_RE.fullmatch(text)
    if m is None or m["unit"].lower() not in _SIZE_UNITS:
        raise ValueError(f"{_quote(value)} is not a size; {_SIZE_HINT}")
    if m["sign"] == "-":
        raise ValueError(f"{_quote(value)} is negative; a size must be zero or more")
    unit = m["unit"].lower()
    exact = Fraction(m["num"]) * _SIZE_UNITS[unit]
    if unit in ("", "b") and exact.denominator != 1:
        raise ValueError(f"{_quote(value)} is not a whole number of bytes; {_SIZE_HINT}")
    return math.floor(exact + Fraction(1, 2))


_RATE_HINT = 'use a size per second like "200MiB/s" or "1.5GB/s", or "0" for no cap'
_RATE_SUFFIX_RE = re.compile(r"\s*/\s*([A-Za-z]+)\s*$")


def parse_rate(value: str | int) -> int:
    """Parse a rate such as ``"200MiB/s"``, ``"1.5GB/s"`` or ``"0"``; bytes per second."""
    text = _number_or_text(value, _PROBLEMS["rate"], whole=True)
    if isinstance(text, int):
        return text
    suffix = _RATE_SUFFIX_RE.search(text)
    if suffix is not None:
        if suffix.group(1).lower() not in ("s", "sec"):
            raise ValueError(f"{_quote(value)} is not a rate per second; {_RATE_HINT}")
        text = text[: suffix.start()]
    try:
        return parse_size(text)
    except ValueError:
        raise ValueError(f"{_quote(value)} is not a rate; {_RATE_HINT}") from None


_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _three_digits(v: float) -> str:
    """About three significant digits, no exponent, trailing zeros dropped."""
    decimals = 2 if v < 10 else 1 if v < 100 else 0
    text = f"{v:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_size(n: int | float) -> str:
    """``1610612736 -> "1.5 GiB"``; binary units, about three significant digits."""
    if isinstance(n, float) and not math.isfinite(n):
        return str(n)
    if n < 0:
        return "-" + format_size(-n)
    if n < 1024:
        return f"{round(n)} B"
    index = 0
    scaled = float(n)
    while scaled >= 1024 and index < len(_BINARY_UNITS) - 1:
        scaled /= 1024
        index += 1
    text = _three_digits(scaled)
    if float(text) >= 1024 and index < len(_BINARY_UNITS) - 1:
        # 1023.7 MiB rounds to "1024"; say "1 GiB" instead.
        text, index = "1", index + 1
    return f"{text} {_BINARY_UNITS[index]}"


# --- durations -------------------------------------------------------------------

_DURATION_UNITS: dict[str, Fraction] = {
    "w": Fraction(7 * 86400),
    "d": Fraction(86400),
    "h": Fraction(3600),
    "m": Fraction(60),
    "s": Fraction(1),
    "ms": Fraction(1, 1000),
}
_DURATION_ORDER = list(_DURATION_UNITS)  # largest first

_PART = rf"(?P<num>{_NUMBER})\s*(?P<unit>ms|s|m|h|d|w)"
_PART_RE = re.compile(_PART)
_PARTS_RE = re.compile(rf"(?:{_NUMBER}\s*(?:ms|s|m|h|d|w)\s*)+")
_PLAIN_RE = re.compile(_NUMBER)


def parse_duration(value: str | int | float) -> float:
    """Parse a duration such as ``"3d"``, ``"1h30m"``, ``"250ms"`` or ``60``; seconds."""
    text = _number_or_text(value, _PROBLEMS["duration"])
    if isinstance(text, float):
        return text
    if not text:
        raise ValueError(f"an empty string is not a duration; {_DURATION_HINT}")
    if text.startswith("-") and (
        _PLAIN_RE.fullmatch(text[1:].strip()) or _PARTS_RE.fullmatch(text[1:].strip())
    ):
        raise ValueError(f"{_quote(value)} is negative; a duration must be zero or more")
    if _PLAIN_RE.fullmatch(text):
        return float(Fraction(text))
    if not _PARTS_RE.fullmatch(text):
        raise ValueError(f"{_quote(value)} is not a duration; {_DURATION_HINT}")
    total = Fraction(0)
    last = -1
    for part in _PART_RE.finditer(text):
        rank = _DURATION_ORDER.index(part["unit"])
        if rank <= last:
            raise ValueError(
                f"{_quote(value)} is not a duration; give each unit once, "
                f"from the largest to the smallest, like 1h30m"
            )
        last = rank
        total += Fraction(part["num"]) * _DURATION_UNITS[part["unit"]]
    return float(total)


def _trim(v: float, significant: int = 3) -> str:
    """``v`` with about ``significant`` digits, at most 3 decimals, no exponent."""
    digits = 1 if v < 1 else math.floor(math.log10(v)) + 1
    decimals = min(3, max(0, significant - digits))
    text = f"{v:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


_FORMAT_UNITS: tuple[tuple[str, int], ...] = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds: float) -> str:
    """``5400 -> "1h30m"``, ``0.25 -> "250ms"``, ``12.5 -> "12.5s"``; at most two parts.

    Days are the largest unit ("10d", not "1w3d").  Non-finite input gives
    ``"inf"``/``"nan"``, handy for an ETA that is not known yet.
    """
    if not math.isfinite(seconds):
        return "nan" if math.isnan(seconds) else ("-inf" if seconds < 0 else "inf")
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = _trim(seconds * 1000)
        if float(ms) < 1000:
            return "0s" if float(ms) == 0 else f"{ms}ms"
        seconds = 1.0
    if seconds < 60:
        text = _trim(seconds)
        if float(text) < 60:
            return f"{text}s"
        seconds = 60.0
    for index, (name, size) in enumerate(_FORMAT_UNITS[:-1]):
        if seconds >= size:
            small_name, small = _FORMAT_UNITS[index + 1]
            ticks = math.floor(seconds / small + 0.5)
            big, rest = divmod(ticks * small, size)
            if index > 0 and big * size >= _FORMAT_UNITS[index - 1][1]:
                # 59m59.6s rounded up to exactly one hour.
                return format_duration(float(big * size))
            rest //= small
            return f"{big}{name}{rest}{small_name}" if rest else f"{big}{name}"
    raise AssertionError("unreachable")  # pragma: no cover


# --- fractions -------------------------------------------------------------------


def parse_fraction(value: str | int | float) -> float:
    """Parse ``0.8``, ``"0.8"`` or ``"80%"`` into a float; the range is the caller's job."""
    text = _number_or_text(value, _PROBLEMS["fraction"])
    if isinstance(text, float):
        return text
    percent = text.endswith("%")
    number = text[:-1].rstrip() if percent else text
    negative = number.startswith("-")
    if negative:
        number = number[1:].lstrip()
    if not _PLAIN_RE.fullmatch(number):
        raise ValueError(f"{_quote(value)} is not a fraction; {_FRACTION_HINT}")
    if negative:
        raise ValueError(f"{_quote(value)} is negative; {_FRACTION_HINT}")
    result = Fraction(number)
    if percent:
        result /= 100
    return float(result)
