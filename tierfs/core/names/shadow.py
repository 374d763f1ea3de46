"""The attribute shadow: non-default mode, uid and gid where a LIST finds them.

Why it exists (see also the ``listings`` docstring): LIST returns no user
metadata, so a name that only a LIST has seen would get ``file_mode`` and
the daemon's identity, and the kernel checks permissions against those.  A
HEAD per name (what s3fs does) would cost a HEAD per file on every cold read
and ``find``.  Instead, every object whose attributes differ from the
canonical ones has an empty *shadow object* whose key carries them::

    <store prefix>/.tierfs-attrs/<dir path>/<name>@m<perm octal>,u<uid>,g<gid>
    e.g.  .tierfs-attrs/ckpt/step10.pt@m0600,u1000,g1000

so that one LIST of ``.tierfs-attrs/<dir path>/`` (delimiter ``/``) returns the
attributes of every child of the directory that has any.

Encoding:

* ``CANONICAL`` attributes (files and FIFOs/sockets 0644, directories 0755,
  owner 0:0) get no shadow: the common case costs no extra object.  Symlinks
  never get one (their permissions mean nothing).
* The name is kept verbatim; the attributes follow the LAST ``@``.  A name
  may contain ``@`` (or look like a suffix itself): it round-trips because
  the suffix is split off from the right, and a suffix never contains ``@``.
* Only the permission bits (``& 0o7777``) travel; the type comes from the
  data key, as for ``x-amz-meta-mode``.
* A name whose shadow key would not fit the store (S3: 1024 bytes with the
  store prefix; a local store: 255 bytes per segment) has none.  Reader and
  writer decide this with the same test (``shadow_fits``, with the longest
  possible suffix), so the reader knows when to fall back to a HEAD of that
  one entry.
* Several shadow objects for one name (a change in flight, or one left by
  a crash) combine to the most restrictive reading: the permission bits are
  ANDed, and where they disagree on the owner (group) the owner (group)
  bits are dropped.  A shadow never widens what another shadow says.

Ordering (what keeps the shadow from exposing data): a shadow is written
BEFORE the data or metadata it describes (upload, metadata rewrite, server
side copy, directory marker), and old shadows are deleted only AFTER the
change they describe is in the bucket (and after the data object itself is
deleted).  A reader lists the data first and the shadow afterwards, so a
shadow that guards an object it saw is in its shadow listing (S3 listings
are strongly consistent).  At every instant, a reader therefore sees the
attributes tierfs stored or more restrictive ones.

One shadow per object of the bucket, whatever prefix a mount starts at.
The shadow tree lives at the top of the BACKING URL's prefix, never below
an access point's root: an access point rooted at ``users/alice`` keeps the
shadow of its ``x`` at ``.tierfs-attrs/users/alice/x@...``, exactly where a
full mount of the same backing looks for the shadow of ``users/alice/x``.
So a mode or owner set through either mount is the one the other shows
(``ShadowPlace``: the store of the backing URL's prefix, and the access
root as the first segments below ``.tierfs-attrs``).  Shadows an access
point wrote under its own root before this rule (``users/alice/.tierfs-attrs``)
are moved to the shared tree at its next mount
(``Listings.adopt_legacy_shadows``: put there, then deleted here).

The reserved name ``.tierfs-attrs`` exists only at the top of the mount: a
listing of the root never shows it, and creating or renaming something to
it there fails with EPERM.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierfs.store.base import SHADOW_ROOT as STORE_SHADOW_ROOT

if TYPE_CHECKING:
    from tierfs.store import ObjectStore

#: The shadow tree's top-level name (reserved in the root of the mount, with
#: the store's other ``RESERVED_ROOTS``).
SHADOW_ROOT = STORE_SHADOW_ROOT
#: Attributes that need no shadow object.
CANONICAL_FILE_PERM = 0o644
CANONICAL_DIR_PERM = 0o755
CANONICAL_OWNER = (0, 0)
#: The longest suffix an entry can carry, for the "does it fit" test.
LONGEST_SUFFIX = "@m7777,u4294967295,g4294967295"

_SUFFIX = re.compile(r"m([0-7]{4}),u([0-9]{1,10}),g([0-9]{1,10})")


@dataclass(frozen=True, slots=True)
class ShadowAttrs:
    """Permission bits, owner and group as tierfs stored them."""

    perm: int
    uid: int
    gid: int

    def suffix(self) -> str:
        return f"@m{self.perm:04o},u{self.uid},g{self.gid}"

    def as_list(self) -> list[int]:
        return [self.perm, self.uid, self.gid]

    @classmethod
    def from_list(cls, raw: Iterable[int]) -> ShadowAttrs:
        perm, uid, gid = raw
        return cls(int(perm) & 0o7777, int(uid), int(gid))


def attrs_of(mode: int, uid: int, gid: int) -> ShadowAttrs:
    return ShadowAttrs(mode & 0o7777, uid, gid)


def needs_shadow(mode: int, uid: int, gid: int) -> bool:
    """Does an object with these attributes need a shadow entry?"""
    if stat.S_ISLNK(mode):
        return False
    canonical = CANONICAL_DIR_PERM if stat.S_ISDIR(mode) else CANONICAL_FILE_PERM
    return (mode & 0o7777, uid, gid) != (canonical, *CANONICAL_OWNER)


def shadow_dir_prefix(dir_prefix: str) -> str:
    """The shadow LIST prefix for a directory whose data prefix is
    ``dir_prefix`` ("" for the root, else ending in "/")."""
    return f"{SHADOW_ROOT}/{dir_prefix}"


def shadow_key(data_key: str, attrs: ShadowAttrs) -> str:
    """The shadow object of the object (or directory) at ``data_key``
    (a directory's key without its trailing "/")."""
    return f"{SHADOW_ROOT}/{data_key.rstrip('/')}{attrs.suffix()}"


def longest_shadow_key(data_key: str) -> str:
    return f"{SHADOW_ROOT}/{data_key.rstrip('/')}{LONGEST_SUFFIX}"


@dataclass(frozen=True, slots=True)
class ShadowPlace:
    """Where the shadow objects of a mount's keys live: ``store`` is a
    store of the backing URL's own prefix (a full mount's store; for an
    access point, a second store without its root), ``below`` the access
    root with a trailing "/" ("" for a full mount).  Data keys given here
    are the mount's (relative to its root)."""

    store: ObjectStore
    below: str = ""

    def key(self, data_key: str, attrs: ShadowAttrs) -> str:
        return shadow_key(self.below + data_key, attrs)

    def dir_prefix(self, dir_prefix: str) -> str:
        return shadow_dir_prefix(self.below + dir_prefix)

    def fits(self, data_key: str) -> bool:
        """Would the longest shadow entry of ``data_key`` fit the store?"""
        return self.store.key_fits(longest_shadow_key(self.below + data_key))


def parse_shadow_name(entry: str) -> tuple[str, ShadowAttrs] | None:
    """``"name@m0600,u0,g0"`` -> ("name", attrs); None if it is not one."""
    name, sep, suffix = entry.rpartition("@")
    if not sep or not name:
        return None
    match = _SUFFIX.fullmatch(suffix)
    if match is None:
        return None
    perm, uid, gid = (int(match[1], 8), int(match[2]), int(match[3]))
    if uid >= 1 << 32 or gid >= 1 << 32:
        return None
    return name, ShadowAttrs(perm, uid, gid)


def combine(found: Iterable[ShadowAttrs]) -> ShadowAttrs | None:
    """The most restrictive reading of several shadow entries for one name."""
    items = list(found)
    if not items:
        return None
    perm = 0o7777
    for item in items:
        perm &= item.perm
    first = items[0]
    if any(item.uid != first.uid for item in items):
        perm &= ~0o4700
    if any(item.gid != first.gid for item in items):
        perm &= ~0o2070
    return ShadowAttrs(perm, first.uid, first.gid)


def attrs_from_metadata(metadata: dict[str, str]) -> ShadowAttrs | None:
    """Attributes from ``x-amz-meta-mode/uid/gid`` (a HEAD), None if absent
    or malformed."""
    try:
        mode = int(metadata["mode"], 10)
        uid = int(metadata.get("uid", "0"))
        gid = int(metadata.get("gid", "0"))
    except (KeyError, ValueError):
        return None
    if not (0 <= uid < 1 << 32 and 0 <= gid < 1 << 32):
        return None
    return ShadowAttrs(mode & 0o7777, uid, gid)
