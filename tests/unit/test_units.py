"""tierfs.units: sizes, durations and fractions, parsing and formatting."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tierfs.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
    toml_kind,
)

KiB, MiB, GiB, TiB, PiB, EiB = (1024**n for n in range(1, 7))

BINARY = {"K": KiB, "M": MiB, "G": GiB, "T": TiB, "P": PiB, "E": EiB}
DECIMAL = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18}
UNITS: dict[str, int] = {"B": 1, "": 1}
for _letter, _mult in BINARY.items():
    UNITS[_letter] = _mult
    UNITS[_letter + "i"] = _mult
    UNITS[_letter + "iB"] = _mult
UNITS.update(DECIMAL)


# --- parse_size ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("4096B", 4096),
        ("4MiB", 4 * MiB),
        ("4 MiB", 4 * MiB),
        ("  4MiB  ", 4 * MiB),
        ("4mib", 4 * MiB),
        ("4M", 4 * MiB),
        ("4Mi", 4 * MiB),
        ("4MB", 4_000_000),
        ("4mb", 4_000_000),
        ("512KiB", 512 * KiB),
        ("512k", 512 * KiB),
        ("512KB", 512_000),
        ("1.5TiB", 3 * TiB // 2),
        ("1.5 GiB", 3 * GiB // 2),
        (".5KiB", 512),
        ("2.KiB", 2048),
        ("1.1KiB", 1126),  # 1126.4 rounds to the nearest byte
        ("0.5B", None),
        ("2PiB", 2 * PiB),
        ("1EiB", EiB),
        ("1EB", 10**18),
        ("3TB", 3 * 10**12),
    ],
)
def test_parse_size_examples(text: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="whole number of bytes"):
            parse_size(text)
    else:
        assert parse_size(text) == expected


def test_parse_size_integers_are_bytes() -> None:
    assert parse_size(0) == 0
    assert parse_size(123) == 123


def test_parse_size_message_is_a_plain_sentence() -> None:
    with pytest.raises(ValueError) as info:
        parse_size("4XB")
    assert str(info.value) == (
        '"4XB" is not a size; use a number with a unit like 4MiB, 512KiB or 1.5TiB'
    )


@pytest.mark.parametrize(
    "text",
    ["4XB", "MiB", "4 M i B", "4MiBs", "1e6", "1_000", "4..5MiB", "four", "4 MiB 2", "0x10", "∞"],
)
def test_parse_size_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size; use a number with a unit"):
        parse_size(text)


@pytest.mark.parametrize("text", ["", "   "])
def test_parse_size_rejects_empty(text: str) -> None:
    with pytest.raises(ValueError, match="an empty string is not a size"):
        parse_size(text)


@pytest.mark.parametrize("value", ["-1", "-4MiB", "- 4MiB", -1])
def test_parse_size_rejects_negative(value: str | int) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_size(value)


@pytest.mark.parametrize("value", [True, False, 1.5, 4.0, None, [1], {"a": 1}])
def test_parse_size_rejects_other_types(value: object) -> None:
    with pytest.raises(ValueError, match="a size must be a whole number of bytes"):
        parse_size(value)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=2**80))
def test_parse_size_plain_integers(n: int) -> None:
    assert parse_size(n) == n
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n
    assert parse_size(f"{n} b") == n


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(sorted(UNITS)),
    st.sampled_from(["", " "]),
    st.booleans(),
)
def test_parse_size_number_and_unit(k: int, unit: str, space: str, lower: bool) -> None:
    text = f"{k}{space}{unit.lower() if lower else unit}"
    assert parse_size(text) == k * UNITS[unit]


@given(
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=1, max_value=999),
    st.sampled_from(["K", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB"]),
)
def test_parse_size_fractions_round_to_nearest_byte(whole: int, milli: int, unit: str) -> None:
    exact_thousandths = (whole * 1000 + milli) * UNITS[unit]
    got = parse_size(f"{whole}.{milli:03d}{unit}")
    assert abs(got * 1000 - exact_thousandths) <= 500


# --- format_size -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (4 * MiB, "4 MiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (int(1.25 * GiB), "1.25 GiB"),
        (int(12.3 * TiB), "12.3 TiB"),
        (123 * GiB, "123 GiB"),
        (1023 * MiB, "1023 MiB"),
        (GiB - 1, "1 GiB"),  # 1023.99999 MiB rounds up to the next unit
        (3 * PiB, "3 PiB"),
        (2048 * EiB, "2048 EiB"),
        (-3 * GiB // 2, "-1.5 GiB"),
    ],
)
def test_format_size_examples(n: int, text: str) -> None:
    assert format_size(n) == text


@given(st.integers(min_value=0, max_value=2**70))
@example(GiB - 1)
@example(10 * MiB - 1)
@example(100 * MiB - 1)
def test_format_size_round_trips_within_half_a_percent(n: int) -> None:
    text = format_size(n)
    assert parse_size(text) == pytest.approx(n, rel=0.005, abs=0.5)


@given(
    st.integers(min_value=1, max_value=999),
    st.sampled_from([1, KiB, MiB, GiB, TiB, PiB, EiB]),
)
def test_format_size_exact_for_whole_units(k: int, unit: int) -> None:
    assert parse_size(format_size(k * unit)) == k * unit


# --- parse_duration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (60, 60.0),
        (1.5, 1.5),
        ("0", 0.0),
        ("90", 90.0),
        ("2.5", 2.5),
        ("250ms", 0.25),
        ("1s", 1.0),
        ("1.5s", 1.5),
        ("60s", 60.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("3d", 259200.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1d12h", 129600.0),
        ("1w2d3h4m5s6ms", 604800 + 2 * 86400 + 3 * 3600 + 4 * 60 + 5.006),
        (" 3 d ", 259200.0),
        ("0.5d", 43200.0),
        ("1m30s", 90.0),
    ],
)
def test_parse_duration_examples(value: str | float, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(
    "text", ["3x", "d", "3 days", "1h30", "3D", "1M", "1e3s", "h1", "1.2.3s", "3d-1h"]
)
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == (
        f'"{text}" is not a duration; use a number with a unit (ms, s, m, h, d or w) '
        "like 60s, 3d or 1h30m"
    )


@pytest.mark.parametrize("text", ["30m1h", "1h1h", "1s5ms1s", "5s1m"])
def test_parse_duration_wants_units_largest_first(text: str) -> None:
    with pytest.raises(ValueError, match="from the largest to the smallest"):
        parse_duration(text)


@pytest.mark.parametrize("value", ["-1", "-3d", "-1h30m", -1, -0.5])
def test_parse_duration_rejects_negative(value: str | float) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_duration(value)


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_parse_duration_rejects_non_finite(value: float) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(value)


@pytest.mark.parametrize("value", ["", " "])
def test_parse_duration_rejects_empty(value: str) -> None:
    with pytest.raises(ValueError, match="an empty string is not a duration"):
        parse_duration(value)


@pytest.mark.parametrize("value", [True, None, [1]])
def test_parse_duration_rejects_other_types(value: object) -> None:
    with pytest.raises(ValueError, match="a duration must be a number of seconds"):
        parse_duration(value)  # type: ignore[arg-type]


@given(
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=6, max_size=6),
    st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_parse_duration_sums_parts(counts: list[int], used: list[bool]) -> None:
    units = [("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001)]
    parts = [(count, unit) for count, unit, keep in zip(counts, units, used, strict=True) if keep]
    if not parts:
        return
    text = "".join(f"{c}{name}" for c, (name, _) in parts)
    expected = sum(c * size for c, (_, size) in parts)
    assert parse_duration(text) == pytest.approx(expected, rel=1e-12, abs=1e-9)


# --- format_duration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (0.0015, "1.5ms"),
        (0.9996, "1s"),
        (1, "1s"),
        (1.25, "1.25s"),
        (12.5, "12.5s"),
        (59.96, "1m"),
        (60, "1m"),
        (90, "1m30s"),
        (3599.6, "1h"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400, "1d"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (30 * 86400, "30d"),
        (-90, "-1m30s"),
        (math.inf, "inf"),
        (math.nan, "nan"),
    ],
)
def test_format_duration_examples(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(min_value=0.001, max_value=10**9, allow_nan=False))
@example(59.999)
@example(3599.5)
@example(86399.9)
def test_format_duration_round_trips(seconds: float) -> None:
    text = format_duration(seconds)
    # Two parts, rounded to the smaller one: hours within a day is the coarsest
    # step (1/2 h out of 24 h, about 2.1%); sub-minute values keep 3 digits.
    assert parse_duration(text) == pytest.approx(seconds, rel=0.022, abs=0.0005)


@given(
    st.sampled_from([("d", None, "h", 24), ("h", 24, "m", 60), ("m", 60, "s", 60)]),
    st.data(),
)
def test_format_duration_exact_for_two_whole_parts(
    units: tuple[str, int | None, str, int], data: st.DataObject
) -> None:
    big_name, big_limit, small_name, ratio = units
    big = data.draw(st.integers(min_value=1, max_value=(big_limit or 1000) - 1))
    small = data.draw(st.integers(min_value=0, max_value=ratio - 1))
    text = f"{big}{big_name}{small}{small_name}" if small else f"{big}{big_name}"
    assert format_duration(parse_duration(text)) == text


# --- parse_fraction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.8, 0.8),
        (1, 1.0),
        (0, 0.0),
        ("0.8", 0.8),
        ("80%", 0.8),
        ("80 %", 0.8),
        ("12.5%", 0.125),
        ("100%", 1.0),
        ("150%", 1.5),  # the range is the caller's business
    ],
)
def test_parse_fraction_examples(value: str | float, expected: float) -> None:
    assert parse_fraction(value) == expected


def test_percent_is_the_same_float_as_the_fraction() -> None:
    assert parse_fraction("80%") == 0.8
    assert parse_fraction("70%") == 0.7
    assert parse_fraction("90%") == 0.9


@pytest.mark.parametrize("value", ["eighty", "", "%", "80%%", "0.8.1", "1e-1", "80 percent"])
def test_parse_fraction_rejects_garbage(value: str) -> None:
    with pytest.raises(
        ValueError, match=r'is not a fraction; use a number like 0.8 or a percentage like "80%"'
    ):
        parse_fraction(value)


@pytest.mark.parametrize("value", ["-80%", "-0.5", -0.1])
def test_parse_fraction_rejects_negative(value: str | float) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_fraction(value)


@pytest.mark.parametrize("value", [True, None, math.nan, math.inf])
def test_parse_fraction_rejects_other_values(value: object) -> None:
    with pytest.raises(ValueError):
        parse_fraction(value)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=100))
def test_percent_and_fraction_agree(p: int) -> None:
    assert parse_fraction(f"{p}%") == pytest.approx(p / 100)
    assert parse_fraction(f"{p}%") == parse_fraction(str(p / 100)) == p / 100


def test_toml_kind_names() -> None:
    import datetime

    assert toml_kind(True) == "a boolean"
    assert toml_kind(1) == "an integer"
    assert toml_kind(1.0) == "a float"
    assert toml_kind("x") == "a string"
    assert toml_kind([1]) == "an array"
    assert toml_kind({}) == "a table"
    assert toml_kind(datetime.date(2024, 1, 1)) == "a date or time"


# --- parse_rate -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        (0, 0),
        (1000, 1000),
        ("200MiB/s", 200 * 1024**2),
        ("200MiB", 200 * 1024**2),
        ("200 MiB / s", 200 * 1024**2),
        ("1.5GB/s", 1_500_000_000),
        ("200M/s", 200 * 1024**2),
        ("10MB/sec", 10_000_000),
    ],
)
def test_parse_rate_examples(text: str | int, expected: int) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("200MiB/h", "is not a rate per second"),
        ("fast", "is not a rate;"),
        ("-1MiB/s", "is not a rate;"),
        (-5, "is negative"),
        (True, "not a boolean"),
        (1.5, "not a float"),
        ("/s", "is not a rate;"),
    ],
)
def test_parse_rate_rejects(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_rate(value)  # type: ignore[arg-type]
