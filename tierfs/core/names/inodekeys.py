"""Inodes and their keys: which object key a file or directory has.

``InodeKeys`` reads an inode (the live one of a file in use, else LMDB's)
and works out its key from its parents' names.  The keys of directories
are remembered while the namespace's shape stays the same
(``Journal.namespace_gen`` changes before and after every change that moves
or removes a name), so a key costs one dictionary lookup on the warm path.
Both ``Listings`` (the prefix a directory is listed under) and ``Namespace``
use it; it asks the bucket nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from tierfs.errors import NotFound
from tierfs.meta import ROOT_INO, Inode, MetaDB

from ..state.journal import child_key

#: ``InodeKeys.key_of`` remembers the keys of at most this many directories.
DIR_KEYS_MAX = 65536


class InodeKeys:
    """Inodes by number, and their object keys (see the module docstring)."""

    def __init__(
        self,
        meta: MetaDB,
        *,
        live_inode: Callable[[int], Inode | None] | None = None,
        shape_generation: Callable[[], int] | None = None,
    ) -> None:
        """``live_inode``: the in-memory inode of an open file, if any.
        ``shape_generation``: a number that changes before and after every
        change that moves or removes a name; while it stays the same,
        ``key_of`` remembers the keys of directories.  Without it, every
        key is worked out from LMDB."""
        self.meta = meta
        self.live_inode: Callable[[int], Inode | None] = live_inode or (lambda ino: None)
        self._shape_generation = shape_generation
        #: Directory ino -> its key, valid while ``shape_generation()`` is
        #: ``_dir_keys_gen`` (see ``key_of``).
        self._dir_keys: dict[int, str] = {}
        self._dir_keys_gen = shape_generation() if shape_generation is not None else 0

    def get(self, ino: int) -> Inode:
        live = self.live_inode(ino)
        if live is not None:
            return live
        inode = self.meta.get_inode(ino)
        if inode is None:
            raise NotFound(f"inode {ino} does not exist")
        return inode

    def path_of(self, ino: int) -> str:
        """The file's path in the mount, for messages."""
        try:
            return self.key_of(self.get(ino))
        except (NotFound, KeyError):
            return f"<inode {ino}>"

    def key_of(self, inode: Inode) -> str:
        """The object key of a file or directory (relative to the store prefix).

        The keys of directories are remembered while ``shape_generation``
        stays the same: a key changes only with a rename (which moves every
        key under a directory) or a removal, and both change it before and
        after they change an inode.  Without the memo, every key cost an
        LMDB read and a decode per directory on its path, several times per
        upload (measured: a fifth of the event loop's time while small
        files were flushed), and once per file in every lifecycle plan."""
        if inode.ino == ROOT_INO:
            return ""
        if self._shape_generation is None:
            return self._key_from_records(inode)
        generation = self._shape_generation()
        if self._dir_keys_gen != generation or len(self._dir_keys) >= DIR_KEYS_MAX:
            self._dir_keys.clear()
            self._dir_keys_gen = generation
        parent_key = self._dir_keys.get(inode.parent)
        if parent_key is None:
            parent = self.get(inode.parent)
            parent_key = self._dir_keys[inode.parent] = self.key_of(parent)
        return child_key(parent_key, inode.name)

    def _key_from_records(self, inode: Inode) -> str:
        parts: list[bytes] = []
        while inode.ino != ROOT_INO:
            parts.append(inode.name)
            inode = self.get(inode.parent)
        return b"/".join(reversed(parts)).decode()

    def prefix_of(self, dir_inode: Inode) -> str:
        key = self.key_of(dir_inode)
        return key + "/" if key else ""
