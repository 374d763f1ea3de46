"""TierFS: POSIX semantics over tiers and a bucket, with no pyfuse3.

``fs.TierFS`` builds the parts and wires them; the FUSE layer and the
control server call ``TierFS``.  The parts are grouped in subpackages that
depend one way, bottom first (``tests/unit/test_import_rules.py`` holds the
order):

* ``state/``: what every path shares: the journal, the files in use with
  their buffers, digests, fetch slots and reader leases, the space
  accounting and the clock, plain results, store threads, the supervisor.
* ``names/``: the namespace: lookups, listings from the bucket, keys,
  readdir, attributes.
* ``read/``: the read path: handles, serving reads from the tiers, filling
  absent blocks (``read/fetcher.py``), hand-outs to fast readers.
* ``tiering/``: placement, the data-movement API, rules, pins and the
  lifecycle's plan.
* ``write/``: the write path: writes, the blocks of writes, carrying the
  journal to the bucket.
* Here, composing the parts (no subpackage imports them): ``fs`` (the
  composition), ``reports`` (``status``, ``where``, statfs) and ``upkeep``
  (group commits, access times, orphaned cache files).

Each subpackage's ``__init__`` names what each of its files does.
"""

from tierfs.core.fs import Attributes, DirEntry, FsStats, OpenResult, TierFS

__all__ = ["Attributes", "DirEntry", "FsStats", "OpenResult", "TierFS"]
