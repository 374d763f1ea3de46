"""TierFS: POSIX semantics over tiers and a bucket, with no pyfuse3."""

from tierfs.core.fs import Attributes, DirEntry, FsStats, OpenResult, TierFS

__all__ = ["Attributes", "DirEntry", "FsStats", "OpenResult", "TierFS"]
