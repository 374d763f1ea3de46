"""Text a user controls, made safe to show and checked where it is a label.

File names are bytes (any but ``/`` and NUL: newlines and terminal escape
sequences too) and arrive as ``str`` with ``surrogateescape`` for the bytes
that are not UTF-8.  Tags, job and session names are a user's free text.
Anything of these that reaches a terminal, a log line or a one-line record
goes through ``shown``: control characters, non-printable characters and
undecodable bytes become backslash escapes (``\\n``, ``\\x1b``,
``\\u0085``, ``\\u200b``; a byte that is not UTF-8 is ``\\xHH`` with HH at
least 80, a character never is) and a backslash is doubled, so the text
stays on one line, can drive no terminal, and reads back unambiguously (as
``ls -b`` shows names).
"""

from __future__ import annotations

from tierfs.errors import InvalidArgument

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def shown(text: str) -> str:
    """``text`` with every character that is not printable escaped."""
    if text.isprintable() and "\\" not in text:
        return text  # the common case, no copy
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:  # \xHH of 80 and above is a raw byte (above)
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def check_label(text: str, what: str, most: int) -> str:
    """``text`` if it is a fit label (a tag, a job name): at most ``most``
    characters, all printable; InvalidArgument saying so otherwise."""
    if len(text) > most or not text.isprintable():
        raise InvalidArgument(
            f"{what} is at most {most} printable characters (no control characters or "
            f"line breaks): {shown(text[: most + 1])!r} is not"
        )
    return text


def mount_source(url: str) -> str:
    """``url`` as a mount's source: the characters that would break the
    option string (commas, backslashes) or the mount table (white space,
    control characters) percent-encoded."""
    return "".join(
        f"%{ord(c):02X}" if c in ",\\%" or c.isspace() or not c.isprintable() else c for c in url
    )
