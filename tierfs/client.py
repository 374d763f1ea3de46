"""A small Python API for training scripts: hand tierfs the read order.

Importable without the daemon's dependencies (no trio, lmdb, boto3 or
pyfuse3): it speaks the control protocol over the mount's Unix socket,
found through the mount root's xattr (``tierfs.control.client.locate``).
Any local user may set an order (the mount needs ``allow_other`` for users
other than the one who mounted): each file is checked against the caller's
rights as the kernel would, and a file it may not read is left out and
named, not fetched.

    import tierfs.client
    tierfs.client.set_order("/mnt/data", ["train/0007.jpg", "train/0001.jpg", ...])

The daemon then keeps the next files of that order resident ahead of the
reader (see ``tierfs.workers.prefetch``).  A new order replaces the previous
one of that mount; an empty order stops prefetching.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tierfs.control.client import locate, request
from tierfs.control.protocol import list_chunks

__all__ = ["clear_order", "set_epoch_order", "set_order"]


def set_order(
    mountpoint: str | Path,
    paths: Iterable[str],
    *,
    window_files: int | None = None,
    window_bytes: int | None = None,
) -> dict[str, Any]:
    """Make ``paths`` (relative to the mount root, or absolute inside the
    mount; in the order they will be opened) the mount's prefetch order.

    ``paths`` is streamed in chunks (a generator of a million paths is never
    held in memory here).  A bad path (``..``, NUL, absolute outside the
    mount) rejects the whole order and the previous one stays
    (``tierfs.errors.ControlError``); a missing file is named in the result
    (``missing``, ``missing_named``) and the rest goes on.  ``window_files``
    and ``window_bytes`` size the window (default: 64 files, 2 GiB).
    Returns the prefetcher's status (``order_files``, ``window_files``...)."""
    location = locate(mountpoint)
    args = {"window_files": window_files, "window_bytes": window_bytes}
    result: dict[str, Any] = request(
        location.socket_path, "prefetch", args, more=list_chunks(_lines(paths))
    )
    return result


def clear_order(mountpoint: str | Path) -> dict[str, Any]:
    """Stop prefetching on the mount (an empty order)."""
    return set_order(mountpoint, ())


def set_epoch_order(
    mountpoint: str | Path,
    files: Sequence[str],
    indices: Iterable[int],
    *,
    window_files: int | None = None,
    window_bytes: int | None = None,
) -> dict[str, Any]:
    """For a sampler, once per epoch: ``files[i]`` for each index ``i`` the
    sampler will yield, in that order, becomes the prefetch order."""
    return set_order(
        mountpoint,
        (files[index] for index in indices),
        window_files=window_files,
        window_bytes=window_bytes,
    )


def _lines(paths: Iterable[str]) -> Iterator[str]:
    for path in paths:
        yield str(path)
