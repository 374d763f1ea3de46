"""The read path: open handles, serving reads, and filling absent blocks.

* ``handles``: open file handles and writers, the kernel's page cache.
* ``blockcache``: serving reads from the tiers, first-read checks,
  readahead (with ``readahead``, the window of one handle).
* ``fetcher``: filling absent blocks from where they come from (``Origin``
  is the seam): single flight, priorities (``state/fetch_slots``), the GET
  threads (``thread_hop``), storing and checksumming (``state/digests``).
* ``sharedtier``: the shared tier as an ``Origin``: blocks other nodes
  fetched, read before the bucket, cold blocks claimed so that one node
  fetches each for all, what the bucket served put there, and the warm-up
  of ``tierfs preload --tier`` (``SharedOrigin.warm``).
* ``handout``: tier files handed to readers outside the daemon
  (``tierfs.client``), under the leases of ``state/leases``.
* ``lender``: the other way round: files another cache on this node holds
  at the same version (a snapshot mount's live mount), borrowed at open
  and read in place.

The files in use themselves (``state/openfiles``) are in the bottom layer.
"""
