"""The bottom layer: what every path of the core shares.

Nothing here imports another subpackage of ``tierfs.core``; ``names``,
``read``, ``tiering`` and ``write`` build on it.

* ``journal``: the bucket's changes still owed, durable in LMDB, and the
  order they may run in.
* ``openfiles``: the files in use (``CachedFile``): live inode, block map,
  cache-file fds, flights, which blocks were checked in this mount; with
  its helpers ``buffers`` (block buffers, the recent blocks), ``digests``
  (block checksums), ``fetch_slots`` (the fetch priorities and slots) and
  ``leases`` (tier files handed to readers outside the daemon).
* ``space``: which tier a new block goes to, the S3-FIFO trackers, the
  emergency eviction of a full tier; ``clock``: the lifecycle's clock.
* ``results``: the plain results the FUSE layer turns into replies.
* ``store_threads``: background store calls; ``supervisor``: workers that
  restart on failure.
"""
