"""Each worker built from a ``TierFS``: the one place that knows which of
its parts a worker takes.

A worker is a class given its parts at construction (the journal, the
data-movement API, the namespace, a config section, ...), never the whole
``TierFS``, so that what it depends on is in its signature.  The daemon
(``tierfsd.main``) and the tests build workers through these functions; a
worker's own options (``tasks``, ``window_files``, ...) pass through.
"""

from __future__ import annotations

import os
from typing import Any

from tierfs.core import TierFS
from tierfs.store import ObjectStore

from .dirahead import DirectoryReadahead
from .fillparts import FillParts
from .mover import STATUS_SECTION as MOVER_SECTION
from .mover import Mover
from .pathlists import SpoolBudget
from .prefetch import Prefetcher
from .preload import Preloader
from .snapshots import ShownAttrs, Snapshots
from .uploader import Uploader


def uploader_for(fs: TierFS, **options: Any) -> Uploader:
    return Uploader(fs.journal, fs.sync, fs.meta, fs, **options)


def mover_for(fs: TierFS) -> Mover:
    """The mover, its status shown by ``tierfs status`` as ``mover``."""
    mover = Mover(fs.lifecycle, fs.policies, fs.movement, fs.space, fs.tiers, fs.config.mover, fs)
    fs.status_sections[MOVER_SECTION] = mover.status.as_dict
    return mover


def fill_parts(fs: TierFS, spools: SpoolBudget | None = None) -> FillParts:
    """The parts of the preloader and the prefetcher; the daemon gives both
    one ``spools`` budget."""
    spools = spools if spools is not None else SpoolBudget()
    return FillParts(fs.movement, fs.namespace, fs.permissions, fs.space, spools)


def preloader_for(fs: TierFS, spools: SpoolBudget | None = None, **options: Any) -> Preloader:
    return Preloader(
        fill_parts(fs, spools),
        fs.meta,
        fs.policies,
        fs.tiers,
        fs.shared_tier,
        fetch=fs.config.fetch,
        spool_dir=fs.config.state.dir / "preload",
        **options,
    )


def snapshots_for(
    fs: TierFS, store: ObjectStore | None = None, *, mounted: str | None = None
) -> Snapshots:
    """The snapshot worker over ``store`` (the mount's own by default; a
    snapshot mount gives the bucket's, and ``mounted``, its snapshot's
    name: it creates none)."""
    namespace = fs.config.namespace
    shown = ShownAttrs.of(
        namespace, os.getuid(), os.getgid(), fs.config.access.uid, fs.config.access.gid
    )
    return Snapshots(
        store if store is not None else fs.store,
        fs.permissions,
        shown,
        fs.store_limiter,
        shadows=None if mounted is not None else fs.listings.shadows,
        mounted=mounted,
    )


def _following(fs: TierFS) -> dict[str, Any]:
    """What a worker that follows the readers' opens takes (the prefetcher,
    the directory readahead)."""
    return {
        "follow_opens": fs.following_opens,
        "fetch": fs.config.fetch,
        "revalidate_ttl": fs.config.namespace.revalidate_ttl,
    }


def prefetcher_for(fs: TierFS, spools: SpoolBudget | None = None, **options: Any) -> Prefetcher:
    return Prefetcher(
        fill_parts(fs, spools),
        spool_dir=fs.config.state.dir / "prefetch",
        **_following(fs),
        **options,
    )


def dir_readahead_for(fs: TierFS, **options: Any) -> DirectoryReadahead:
    return DirectoryReadahead(
        fs.meta, fs.movement, fs.handles, fs.space, fs.tiers, **_following(fs), **options
    )
