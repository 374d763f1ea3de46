"""Persistent metadata in LMDB.  The only package that imports lmdb."""

from tierfs.meta.db import PROVISIONAL, ListedEntry, MergeResult, MetaDB, MetaTxn, TierUsage
from tierfs.meta.records import ROOT_INO, BlockRecord, Inode, SyncState

__all__ = [
    "PROVISIONAL",
    "ROOT_INO",
    "BlockRecord",
    "Inode",
    "ListedEntry",
    "MergeResult",
    "MetaDB",
    "MetaTxn",
    "SyncState",
    "TierUsage",
]
