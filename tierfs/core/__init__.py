"""TierFS: POSIX semantics over tiers and a bucket, with no pyfuse3.

How the files of this package relate, by job (``fs.TierFS`` builds the parts
and wires them; the FUSE layer and the control server call ``TierFS``):

* The namespace: ``namespace`` (lookups, paths, walks, revalidation on
  open; what a reader sees of other writers), ``listings`` (directories
  listed lazily from the bucket into LMDB, re-listing, the attributes of
  listed names), ``inodekeys`` (inodes and their object keys), ``shadow``
  (non-default attributes in the bucket), ``namereads`` (what the kernel
  reads of names: lookups, attributes, readdir) with ``attrcache`` and
  ``dirhandles``, ``posix_attrs`` (permission and attribute rules).
* The read side: ``handles`` (open handles), ``openfiles`` (the files in
  use: ``CachedFile``, their fds, which blocks were checked),
  ``blockcache`` (serving reads from the tiers, first-read checks,
  readahead), ``fetcher`` (filling absent blocks from where they come
  from: single-flight, priorities, the GET threads; ``Origin`` is the
  seam), with ``fetch_slots`` (which GET may start), ``thread_hop`` (the
  GET threads), ``buffers`` (block buffers and the recent blocks),
  ``readahead`` (the window of one handle) and ``digests`` (block
  checksums).
* The write side: ``writes`` (create, write, truncate, unlink, rename),
  ``blockwrites`` (the blocks of a write: write, truncate, seal, commit),
  ``journal`` (the bucket's changes still owed, durable), ``sync`` (carrying
  them out), ``upload_source`` (reading a file's bytes for an upload),
  ``damage`` (a dirty block that failed its checksum).
* Tiers and lifecycle: ``space`` (placement, the S3-FIFO trackers, the
  emergency eviction), ``movement`` (fill, relocate, evict, check: the one
  API that moves data on purpose), ``lifecycle`` (rules, pins, the plan of
  moves), ``clock`` (the lifecycle's clock).
* Plumbing: ``results`` (plain results), ``store_threads`` (background store
  calls), ``supervisor`` (workers that restart on failure), ``upkeep``
  (group commits, access times, orphaned cache files) and ``reports``
  (``status``, ``where``, statfs).
"""

from tierfs.core.fs import Attributes, DirEntry, FsStats, OpenResult, TierFS

__all__ = ["Attributes", "DirEntry", "FsStats", "OpenResult", "TierFS"]
