"""Tiers and the lifecycle: where blocks live, and moving them on purpose.

* ``space``: which tier a new block goes to, the S3-FIFO trackers, the
  emergency eviction of a full tier.
* ``movement``: the data-movement API (fill, relocate, evict, check), the
  one way data moves between tiers on purpose.
* ``policies``: what the rules and pins say of each file: placement,
  ``cache = false``, write-through, promotion requests.
* ``lifecycle``: the plan of moves; pin, evict and reload commands.
* ``clock``: the lifecycle's clock (access times, rule ages).
"""
