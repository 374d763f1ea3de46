"""Damaged blocks: what TierFS does when a block fails its checksum.

A dirty block that fails (BlockWrites "Dirty-block digests") was the only
copy of its bytes: the file becomes ``failed`` in LMDB (so it survives a
remount; ``tierfs where`` and ``status`` show it) and the log says loudly,
once per block per mount, what was lost and what to do.  Clean blocks that
fail are only counted here: they are dropped and fetched again by the
caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tierfs.meta import MetaDB
from tierfs.tiers import Tier

log = logging.getLogger(__name__)


class DamageLog:
    def __init__(
        self,
        meta: MetaDB,
        tiers: Sequence[Tier],
        block_size: int,
        path_of: Callable[[int], str],
    ) -> None:
        self.meta = meta
        self.tiers = tiers
        self.block_size = block_size
        self.path_of = path_of
        self._logged: set[tuple[int, int]] = set()
        self.dirty_blocks = 0
        self.clean_blocks = 0

    def block_damaged(self, ino: int, blockno: int, tier: int, during: str) -> None:
        """A dirty block failed its checksum during ``during``."""
        self.meta.mark_failed(ino, blockno)
        if (ino, blockno) in self._logged:
            return
        self._logged.add((ino, blockno))
        self.dirty_blocks += 1
        bs = self.block_size
        log.error(
            "DAMAGED DATA in %r (inode %d): block %d (bytes %d-%d) on tier %s failed its "
            "checksum during %s.  It holds changes not uploaded yet, so this was the only "
            "copy: reads of that block get EIO and the file is NOT uploaded (state 'failed' "
            "in `tierfs where`).  Restore the file from a good copy (rewrite it through the "
            "mount) or delete it; a rewritten file is uploaded again.",
            self.path_of(ino),
            ino,
            blockno,
            blockno * bs,
            (blockno + 1) * bs - 1,
            self.tiers[tier].name if 0 <= tier < len(self.tiers) else "?",
            during,
        )
