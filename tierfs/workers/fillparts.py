"""The parts a worker that fills files on a caller's behalf takes.

Preload and prefetch both resolve a caller's paths (``namespace``), check
what the caller may read (``permissions``), fill through the data-movement
API (``movement``), look at the tiers' room (``space``), and spool the
caller's lists within one budget that they share (``spools``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierfs.core.names.access import Permissions
from tierfs.core.names.namespace import Namespace
from tierfs.core.state.space import SpaceManager
from tierfs.core.tiering.movement import DataMovement

from .pathlists import SpoolBudget


@dataclass(frozen=True, slots=True)
class FillParts:
    movement: DataMovement
    namespace: Namespace
    permissions: Permissions
    space: SpaceManager
    #: What the spools of every user may hold (one budget for both workers).
    spools: SpoolBudget
