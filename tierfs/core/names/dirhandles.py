"""Open directory handles: readdir offsets that are keys, and stay stable.

Offsets (what the kernel hands back to ``readdir``, and what ``telldir`` and
``seekdir`` carry):

    0                 the start of the directory
    1 (``DOT``)       just after ``.``
    2 (``DOTDOT``)    just after ``..``
    cookie + 2        just after the entry with that ``dirseq`` cookie

A cookie is given to a name once, when it is linked into the directory, from
the directory's ``next_cookie``, which only grows (``MetaDB``).  An offset is
therefore a key: reading from any offset is one ordered seek in LMDB
(``MetaDB.read_dir``), never a walk of the entries before it, so ``seekdir``
costs the same at the start and at the end of a huge directory.

A rename (also within one directory, also one that replaces a name) links
the name again, with a new cookie.  Each handle keeps a *horizon*: the
directory's ``next_cookie`` when the handle was opened or read again from
offset 0 (``rewinddir``).  Entries whose cookie is at or past the horizon
were linked after that moment and are not returned by this handle.  A name
renamed while a reader walks the directory is therefore returned at most
once: under its old name if the reader passed it before the rename, not at
all otherwise (POSIX leaves entries added or removed after ``opendir`` or
``rewinddir`` unspecified; a name under two names is never right).

Sequential readers.  A handle also remembers ``resume_at``: the offset just
after the last entry the kernel took from it (0 before the first).  A
request at offset 0 or at ``resume_at`` comes from a reader that goes on
where the last request stopped (``ls``, ``find``, ``os.scandir``): it is
given entries until the kernel's buffer refuses one or the directory ends
(``NameReads.readdir_into``).  A request at any other offset follows a
``seekdir`` and is given one batch only: a reader that seeks reads an entry
or two there, and must not pay for a whole buffer.  ``resume_at`` changes
only when the kernel took at least one entry (``replied``).

Memory: a handle holds three integers, whatever the size of its directory;
nothing of the directory is copied at ``opendir``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

#: Offset just after ``.``; entries of the directory follow ``DOTDOT``.
DOT = 1
#: Offset just after ``..``; an entry's offset is its cookie + ``DOTDOT``.
DOTDOT = 2


def offset_of(cookie: int) -> int:
    """The readdir offset just after the entry with ``cookie``."""
    return cookie + DOTDOT


def cookie_after(offset: int) -> int:
    """Entries after readdir ``offset`` have cookies above this one."""
    return max(offset - DOTDOT, 0)


@dataclass(slots=True)
class DirHandle:
    ino: int
    #: The directory's ``next_cookie`` when read from the start: entries with
    #: a cookie at or above it are not returned by this handle.
    horizon: int
    #: The offset just after the last entry the kernel took (0: none yet).
    resume_at: int = 0

    def continues(self, offset: int) -> bool:
        """Whether a request at ``offset`` reads on sequentially: from the
        start, or where the last request's reply ended."""
        return offset == 0 or offset == self.resume_at

    def replied(self, offset: int) -> None:
        """The kernel took the entries up to ``offset`` (the last one's)."""
        self.resume_at = offset


class DirHandles:
    """Handle number -> ``DirHandle`` of every open directory."""

    def __init__(self) -> None:
        self._handles: dict[int, DirHandle] = {}
        self._numbers = itertools.count(1)

    def open(self, ino: int, next_cookie: int) -> int:
        fh = next(self._numbers)
        self._handles[fh] = DirHandle(ino, next_cookie)
        return fh

    def get(self, fh: int) -> DirHandle:
        return self._handles[fh]

    def release(self, fh: int) -> None:
        self._handles.pop(fh, None)

    def __len__(self) -> int:
        return len(self._handles)
