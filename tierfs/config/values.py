"""Values of the config file: each converter takes a TOML value and returns
the converted value, or raises ``ValueError`` with a sentence that does not
name the key (the loader prefixes "key: " and adds the file:line).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from tierfs.units import parse_duration, parse_fraction, parse_rate, parse_size, toml_kind

MIN_BLOCK_SIZE = 64 * 1024
MAX_BLOCK_SIZE = 1024 * 1024 * 1024


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
            raise ValueError(f"{quote(url)} names no bucket; {_URL_HINT}")
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket or _IPV4_RE.fullmatch(bucket):
            raise ValueError(
                f"{quote(bucket)} is not a valid bucket name; use 3 to 63 lower-case "
                "letters, digits, dots and hyphens, starting and ending with a letter or digit"
            )
        prefix = prefix.rstrip("/")
        if prefix and has_bad_segment(prefix):
            raise ValueError(
                f"the prefix {quote(prefix)} has an empty, '.' or '..' segment, "
                "which cannot map to a directory"
            )
        return BackingURL("s3", bucket=bucket, prefix=prefix)
    if url.startswith("file:"):
        rest = url[5:]
        if not rest.startswith("///"):
            raise ValueError(
                f"{quote(url)} is not an absolute file URL; write file:///absolute/dir"
            )
        return BackingURL("file", directory=Path(os.path.normpath(rest[2:])))
    if url.startswith(("http://", "https://")):
        raise ValueError(
            f"{quote(url)} is an endpoint, not a backing url; write url = "
            '"s3://bucket/prefix" and put the endpoint in endpoint_url'
        )
    raise ValueError(f"{quote(url)} is not a backing url; {_URL_HINT}")


def quote(text: str) -> str:
    """Double-quote ``text`` for a message, escaping quotes and control chars."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    out = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", out)
    return f'"{out}"'


def conv_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {toml_kind(value)}")
    if not value.strip():
        raise ValueError("must not be empty")
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return value


def conv_size(value: Any) -> int:
    return parse_size(value)


def conv_size_in(low: int, high: int | None, problem: str) -> Callable[[Any], int]:
    """A size from ``low`` to ``high`` (None: no upper bound); else ``problem``."""

    def conv(value: Any) -> int:
        size = parse_size(value)
        if size < low or (high is not None and size > high):
            raise ValueError(problem)
        return size

    return conv


conv_positive_size = conv_size_in(1, None, "must be more than zero")
conv_part_size = conv_size_in(
    5 << 20, 5 << 30, "must be between 5MiB and 5GiB (the S3 limits for a part)"
)


def conv_duration(value: Any) -> float:
    return parse_duration(value)


def conv_watermark(value: Any) -> float:
    fraction = parse_fraction(value)
    if not 0 < fraction <= 1:
        shown = quote(value) if isinstance(value, str) else repr(value)
        raise ValueError(
            f'{shown} is outside (0, 1]; use a fraction like 0.8 or a percentage like "80%"'
        )
    return fraction


def conv_int(low: int, high: int | None = None) -> Callable[[Any], int]:
    def conv(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {toml_kind(value)}")
        if value < low or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"from {low} to {high}"
            raise ValueError(f"{value} is out of range; use an integer {span}")
        return value

    return conv


def conv_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {toml_kind(value)}")
    return value


def conv_choice(*choices: str) -> Callable[[Any], str]:
    listed = " or ".join(quote(c) for c in choices)

    def conv(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected {listed}, got {toml_kind(value)}")
        if value not in choices:
            raise ValueError(
                f"{quote(value)} is not allowed; use {listed}{suggest(value, choices)}"
            )
        return value

    return conv


_OCTAL_RE = re.compile(r"(?:0o|0)?([0-7]{1,4})")


def conv_mode(string_max: int) -> Callable[[Any], int]:
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
                f'{quote(value)} is not a permission mode; use an octal string like "0644"'
            )
        return mode

    return conv


def conv_endpoint(value: Any) -> str:
    from urllib.parse import urlsplit

    text = conv_str(value)
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
        raise ValueError(f"{quote(text)} is not an http(s) URL; use http(s)://host[:port]")
    return text


def conv_region(value: Any) -> str:
    text = conv_str(value)
    if any(c.isspace() for c in text):
        raise ValueError(f"{quote(text)} contains spaces; use a region name like us-east-1")
    return text


_TIER_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}")


def conv_simple_name(example: str) -> Callable[[Any], str]:
    """A name that may label metrics and appear in commands: a letter,
    then up to 62 letters, digits, '_' or '-' (``example`` for messages)."""

    def conv(value: Any) -> str:
        text = conv_str(value)
        if not _TIER_NAME_RE.fullmatch(text):
            raise ValueError(
                f"{quote(text)} is not a simple name; use a letter followed by up to 62 "
                f"letters, digits, '_' or '-', like {example}"
            )
        return text

    return conv


conv_tier_name = conv_simple_name("nvme")
conv_quota_name = conv_simple_name("alice")


def conv_glob(value: Any) -> str:
    text = conv_str(value)
    if text.startswith("/"):
        raise ValueError(
            f"{quote(text)} starts with '/'; patterns are relative to the mount root, "
            f"write {quote(text.lstrip('/'))}"
        )
    segments = text.rstrip("/").split("/")
    if ".." in segments:
        raise ValueError(f"{quote(text)} has a '..' segment, which can never match")
    if "." in segments:
        raise ValueError(f"{quote(text)} has a '.' segment, which can never match; remove it")
    if "" in segments:
        raise ValueError(f"{quote(text)} has an empty segment ('//'), which can never match")
    return text


def conv_positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be more than zero")
    return seconds


def conv_rate(value: Any) -> int:
    return parse_rate(value)


_HOSTNAME_RE = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_LISTEN_HINT = 'use "host:port" like "127.0.0.1:9581" or "[::1]:9581"'


def conv_listen(value: Any) -> tuple[str, str, int]:
    """``"host:port"`` -> (as written, host, port); IPv6 hosts in brackets."""
    import ipaddress

    text = conv_str(value).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"{quote(text)} has no port; {_LISTEN_HINT}")
    if not host:
        raise ValueError(
            f"{quote(text)} has no host; write 127.0.0.1{text} for this node only, "
            f"or 0.0.0.0{text} for every interface"
        )
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{quote(text)}: the port must be a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{quote(text)}: {quote(host)} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f'{quote(text)}: write an IPv6 address in brackets, like "[::1]:9581"')
    elif re.fullmatch(r"[\d.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{quote(text)}: {quote(host)} is not an IPv4 address") from None
    elif not _HOSTNAME_RE.fullmatch(host):
        raise ValueError(f"{quote(text)}: {quote(host)} is not a host name; {_LISTEN_HINT}")
    return text, host, int(port_text)


def conv_path(base: Path) -> Callable[[Any], Path]:
    def conv(value: Any) -> Path:
        text = os.path.expanduser(conv_str(value))
        return Path(os.path.normpath(os.path.join(base, text)))

    return conv


def suggest(word: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f'; did you mean "{lowered[match[0]]}"?' if match else ""


def conv_block_size(value: Any) -> int:
    size = parse_size(value)
    if size < MIN_BLOCK_SIZE or size > MAX_BLOCK_SIZE or size & (size - 1):
        raise ValueError(
            f"{size} bytes is not allowed; use a power of two from 64KiB to 1GiB, like 4MiB"
        )
    return size


def conv_backing_url(value: Any) -> str:
    text = conv_str(value)
    parse_backing_url(text)
    return text


def has_bad_segment(path: str) -> bool:
    """Does a "/"-separated path have an empty, '.' or '..' segment (or a
    NUL), so that it cannot name one directory?"""
    return "\0" in path or any(s in ("", ".", "..") for s in path.split("/"))


def conv_access_root(value: Any) -> str:
    """A directory of the bucket below the backing prefix: relative, no
    empty, '.' or '..' segment (a trailing '/' is dropped)."""
    text = conv_str(value).rstrip("/")
    if not text or text.startswith("/"):
        raise ValueError(
            f"{quote(text)} is not a directory of the bucket; write it relative to the "
            'backing url\'s prefix, like "users/alice"'
        )
    if has_bad_segment(text):
        raise ValueError(
            f"the access root {quote(text)} has an empty, '.' or '..' segment; an access "
            "point must name one directory below the prefix"
        )
    return text


def conv_quota_path(value: Any) -> str:
    """A directory from the mount root ("" or "/" is the whole mount):
    relative, no empty, '.' or '..' segment (a leading or trailing '/' is
    dropped)."""
    text = "" if value == "" else conv_str(value).strip("/")
    if not text:
        return ""
    if has_bad_segment(text):
        raise ValueError(
            f"the quota path {quote(text)} has an empty, '.' or '..' segment; write the "
            'directory from the mount root, like "users/alice"'
        )
    return text


def join_backing_url(url: str, below: str) -> str:
    """The backing URL of directory ``below`` of ``url``'s prefix."""
    return f"{url.rstrip('/')}/{below}"


def backing_url_above(url: str, below: str) -> str:
    """The URL ``join_backing_url`` joined ``below`` to (``url`` is the joined one)."""
    suffix = f"/{below}"
    if not url.endswith(suffix):
        raise ValueError(f"{url!r} does not end in {suffix!r}")
    return url[: -len(suffix)]


def conv_shared_url(value: Any) -> str:
    """The shared tier's bucket: s3:// only (a local directory is a tier
    with a ``path``, and a node's own)."""
    text = conv_str(value)
    if not text.startswith("s3://"):
        raise ValueError(
            f"{quote(text)} is not an s3:// URL; a shared tier is a bucket: "
            'url = "s3://bucket/prefix" (a local tier has a path instead)'
        )
    parse_backing_url(text)
    return text


def conv_profile(value: Any) -> str:
    text = conv_str(value)
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{quote(text)} is not a profile name of ~/.aws/config")
    return text
