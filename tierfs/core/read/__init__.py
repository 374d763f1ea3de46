"""The read path: open handles, the files in use, and filling their blocks.

* ``handles``: open file handles and writers, the kernel's page cache.
* ``openfiles``: the files in use (``CachedFile``): live inode, block map,
  cache-file fds, flights, which blocks were checked in this mount.
* ``blockcache``: serving reads from the tiers, first-read checks,
  readahead (with ``readahead``, the window of one handle).
* ``fetcher``: filling absent blocks from where they come from (``Origin``
  is the seam): single flight, priorities (``fetch_slots``), the GET
  threads (``thread_hop``), storing and checksumming (``digests``).
* ``sharedtier``: the shared tier as an ``Origin``: blocks other nodes
  fetched, read before the bucket, cold blocks claimed so that one node
  fetches each for all, what the bucket served put there, and the warm-up
  of ``tierfs preload --tier`` (``SharedOrigin.warm``).
* ``buffers``: block buffers and the recent blocks.
"""
