"""Tiers and the lifecycle: where blocks live, and moving them on purpose.

* ``movement``: the data-movement API (fill, relocate, evict, check), the
  one way data moves between tiers on purpose.
* ``policies``: what the rules and pins say of each file: placement,
  ``cache = false``, write-through, promotion requests.
* ``lifecycle``: the plan of moves; pin, evict and reload commands.

The space accounting (``state/space``) and the clock (``state/clock``) are
in the bottom layer: every path uses them.
"""
