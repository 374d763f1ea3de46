"""A small Python API for training scripts: hand tierfs the read order.

Importable without the daemon's dependencies (no trio, lmdb, boto3, obstore
or pyfuse3; a test holds it to that): it speaks the control protocol over
the mount's Unix socket, found through the mount root's xattr
(``tierfs.control.client.locate``).  Any local user may set an order (the
mount needs ``allow_other`` for users other than the one who mounted): each
file is checked against the caller's rights as the kernel would, and a file
it may not read is left out and named, not fetched.

Each order belongs to a *session*: the calling user, and a ``job`` and
``rank`` name.  Orders of different sessions run side by side (the eight
DDP ranks of a node, two jobs on one node) and share the daemon's fetches
fairly; a new order replaces only its own session's.

    import tierfs.client

    # An order that lasts while this process holds the session (it ends
    # when the process exits, or at close()):
    with tierfs.client.PrefetchSession("/mnt/data", job="run-42", rank=3) as session:
        for epoch in range(epochs):
            session.set_order(my_files_in_read_order)
            ...

    # Or one-shot: the order stays until replaced or cleared.
    tierfs.client.set_order("/mnt/data", ["train/0007.jpg", "train/0001.jpg", ...])
    tierfs.client.clear_order("/mnt/data")

For PyTorch, ``tierfs.torch.PrefetchSampler`` wraps a sampler and does the
above once per epoch.  See ``tierfs.workers.prefetch`` for what the daemon
does with an order.

Fast reads: ``tierfs.client.open(path)`` is ``open(path, "rb")`` for
readers that want the speed of the node.  For a warm file on a tierfs
mount the daemon hands over a read-only descriptor of the file's tier file
and the reads never pass through FUSE or the daemon; any other file is
opened through the mount (or, off a mount, as a plain file).  Same rights,
same version, same bytes as an open through the mount::

    with tierfs.client.open("/mnt/data/train/0001.jpg") as f:
        data = f.read()

With a prefetch order set (``PrefetchSampler``), each process gets the
descriptors of its next files in one round trip per batch
(``tierfs.control.fastread``).
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tierfs.control.client import BoundRequest, locate, request
from tierfs.control.fastread import READERS
from tierfs.control.protocol import list_chunks

__all__ = ["PrefetchSession", "clear_order", "open", "set_epoch_order", "set_order"]


def open(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, binary: from the node's tier file when
    the daemon hands it out, else through the mount, else (off a mount) as
    a plain file.  A context manager with ``read``, ``readinto``, ``seek``
    and ``tell``; errors are those of ``open(path, "rb")``."""
    return READERS.open(path)


def set_order(
    mountpoint: str | Path,
    paths: Iterable[str],
    *,
    job: str | None = None,
    rank: int | None = None,
    window_files: int | None = None,
    window_bytes: int | None = None,
) -> dict[str, Any]:
    """Make ``paths`` (relative to the mount root, or absolute inside the
    mount; in the order they will be opened) the prefetch order of the
    session ``job``/``rank`` of this user (default: the user's unnamed
    order).  The order stays until a new order of that session replaces it
    or ``clear_order`` ends it.

    ``paths`` is streamed in chunks (a generator of a million paths is never
    held in memory here).  A bad path (``..``, NUL, absolute outside the
    mount) rejects the whole order and the previous one stays
    (``tierfs.errors.ControlError``); a missing file is named in the result
    (``missing``, ``missing_named``) and the rest goes on.  ``window_files``
    and ``window_bytes`` size the window (default: 64 files, 2 GiB).
    Returns the order's status (``id``, ``order_files``, ``window_files``...)."""
    location = locate(mountpoint)
    result: dict[str, Any] = request(
        location.socket_path,
        "prefetch",
        _order_args(job, rank, window_files, window_bytes),
        more=list_chunks(_lines(paths)),
    )
    return result


def clear_order(
    mountpoint: str | Path, *, job: str | None = None, rank: int | None = None
) -> list[int]:
    """End this user's orders of ``job`` and ``rank`` (a ``job`` without
    ``rank``: every rank of it, every session; neither: the unnamed order
    of ``set_order``).  Returns the ids of the orders that ended."""
    location = locate(mountpoint)
    args: dict[str, Any] = {"job": job} if job else {"job": "", "session": ""}
    if rank is not None:
        args["rank"] = rank
    result = request(location.socket_path, "prefetch_clear", args)
    ended: list[int] = result["ended"]
    return ended


def set_epoch_order(
    mountpoint: str | Path,
    files: Sequence[str],
    indices: Iterable[int],
    *,
    job: str | None = None,
    rank: int | None = None,
    window_files: int | None = None,
    window_bytes: int | None = None,
) -> dict[str, Any]:
    """For a sampler, once per epoch: ``files[i]`` for each index ``i`` the
    sampler will yield, in that order, becomes the session's order."""
    return set_order(
        mountpoint,
        (files[index] for index in indices),
        job=job,
        rank=rank,
        window_files=window_files,
        window_bytes=window_bytes,
    )


#: Sessions of this process: a forked child (a DataLoader worker) closes
#: its copies of their connections, so that the parent's close, or its
#: exit, still ends their orders.
_SESSIONS: weakref.WeakSet[PrefetchSession] = weakref.WeakSet()
_SESSION_NUMBERS = itertools.count(1)


class PrefetchSession:
    """Orders that last while this object (and so this process) holds them.

    Each ``set_order`` replaces the session's previous order; ``close()``,
    the end of a ``with`` block, or the process's exit ends it: the daemon
    sees the session's connection close.  Sessions never replace each
    other's orders, even of one ``job`` and ``rank``; those names show in
    ``tierfs status`` and let ``clear_order(job=...)`` or ``tierfs prefetch
    --clear --job`` (the Slurm epilog) end the job's orders from elsewhere."""

    def __init__(
        self,
        mountpoint: str | Path,
        *,
        job: str | None = None,
        rank: int | None = None,
        window_files: int | None = None,
        window_bytes: int | None = None,
    ) -> None:
        self._bound: BoundRequest | None = None  # before anything that may raise (``__del__``)
        self.location = locate(mountpoint)
        self.job = job
        self.rank = rank
        #: Tells this session's orders from others of the same job and rank.
        self.name = f"pid-{os.getpid()}-{next(_SESSION_NUMBERS)}"
        self.window_files = window_files
        self.window_bytes = window_bytes
        #: The last order's status (None before the first).
        self.last: dict[str, Any] | None = None
        _SESSIONS.add(self)

    def set_order(self, paths: Iterable[str]) -> dict[str, Any]:
        """Make ``paths`` (as for ``set_order``) the session's order, in
        place of its previous one; an empty ``paths`` ends it.  Returns
        the order's status, with the files left out (``missing_named``)."""
        args = _order_args(self.job, self.rank, self.window_files, self.window_bytes)
        args.update(bound=True, session=self.name)
        bound = BoundRequest(
            self.location.socket_path, "prefetch", args, more=list_chunks(_lines(paths))
        )
        # The new order replaced the previous one: closing that connection
        # now ends nothing (the daemon checks which order a close ends).
        self._drop()
        self._bound = bound if bound.open else None
        self.last = bound.result
        return bound.result

    def close(self) -> None:
        """End the session's order (nothing if it has none)."""
        self._drop()

    def _drop(self) -> None:
        if self._bound is not None:
            self._bound.close()
            self._bound = None

    def __enter__(self) -> PrefetchSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._drop()


def _after_fork_in_child() -> None:
    # Closing the child's copy of a descriptor leaves the parent's open.
    for session in list(_SESSIONS):
        session._drop()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _order_args(
    job: str | None, rank: int | None, window_files: int | None, window_bytes: int | None
) -> dict[str, Any]:
    args: dict[str, Any] = {"window_files": window_files, "window_bytes": window_bytes}
    if job:
        args["job"] = job
    if rank is not None:
        args["rank"] = rank
    return args


def _lines(paths: Iterable[str]) -> Iterator[str]:
    for path in paths:
        yield str(path)
