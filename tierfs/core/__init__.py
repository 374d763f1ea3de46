"""TierFS: POSIX semantics over tiers and a bucket, with no pyfuse3.

``fs.TierFS`` builds the parts and wires them; the FUSE layer and the
control server call ``TierFS``.  The parts are grouped by path:

* ``names/``: the namespace: lookups, listings from the bucket, keys,
  readdir, attributes.
* ``read/``: the read path: handles, the files in use, serving reads from
  the tiers, filling absent blocks (``read/fetcher.py``).
* ``write/``: the write path: mutations, the blocks of writes, the journal
  and carrying it to the bucket.
* ``tiering/``: placement, the data-movement API, rules, pins and the
  lifecycle's plan.
* Here: ``fs`` (the composition), ``reports`` (``status``, ``where``,
  statfs), ``upkeep`` (group commits, access times, orphaned cache files),
  ``supervisor`` (workers that restart on failure), ``store_threads``
  (background store calls) and ``results`` (plain results).

Each subpackage's ``__init__`` names what each of its files does.
"""

from tierfs.core.fs import Attributes, DirEntry, FsStats, OpenResult, TierFS

__all__ = ["Attributes", "DirEntry", "FsStats", "OpenResult", "TierFS"]
