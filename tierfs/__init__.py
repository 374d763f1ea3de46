"""tierfs: one namespace over local cache tiers and an S3 bucket."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    #: The installed package's version (``tierfs --version``, ``tierfs status``).
    __version__ = version("tierfs")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
