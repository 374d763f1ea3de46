"""PyTorch glue: a sampler that hands each epoch's read order to tierfs.

    from torch.utils.data import DataLoader, DistributedSampler
    from tierfs.torch import PrefetchSampler

    sampler = PrefetchSampler(
        DistributedSampler(dataset),     # or any sampler: RandomSampler, ...
        files=dataset.files,             # files[i]: the path sample i reads
        mountpoint="/mnt/data",
    )
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)         # passed on to the DistributedSampler
        for batch in loader:
            ...

At the start of each epoch (``__iter__``) the wrapper draws the wrapped
sampler's indices once, hands ``files[i]`` for each of them, in that order,
to the daemon as this session's prefetch order, and then yields the same
indices.  The order is exactly what the DataLoader's workers will open,
because a map-style DataLoader draws its sampler in the main process and
sends the indices to its workers: the daemon follows the workers' opens,
wherever they run.  Under ``DistributedSampler`` each rank draws only its
own slice, so each rank hands over its own order; the ranks' orders are
followed side by side (sessions: ``tierfs.client.PrefetchSession``).

Each wrapper holds one ``PrefetchSession``: its order ends when the
training process exits (or ``close()``), never outliving the job.  The
session's ``job`` name defaults to ``slurm-<SLURM_JOB_ID>`` under Slurm
(so the epilog's ``tierfs prefetch --clear --job`` ends it too) and its
``rank`` to the wrapped sampler's ``rank`` (``DistributedSampler``), else
``torch.distributed``'s rank when it is initialised, else ``$RANK``.

If the daemon cannot take the order (the mount is gone, the order is
refused), the epoch runs without prefetch: the error is logged once per
epoch and the indices are yielded as usual.  Prefetch is a speed-up, never
a reason for a training run to stop.

Fast reads with one changed line (``tierfs.client.open``: a warm file is
read from the node's tier file, not through FUSE):

    checkpoint = tierfs.torch.load("/mnt/data/ckpt/last.pt", map_location="cpu")
    dataset = torchvision.datasets.ImageFolder(root, loader=tierfs.torch.image_loader)
    dataset = torchvision.datasets.DatasetFolder(root, loader=tierfs.torch.bytes_loader, ...)

and a ``Dataset`` that opens its files itself opens them with
``tierfs.client.open(path)`` instead of ``open(path, "rb")``.  Each
DataLoader worker (forked or spawned) gets its own connection to the daemon
on its first open.

Importing ``tierfs`` imports neither this module nor torch.  This module
imports torch (it is a ``torch.utils.data.Sampler``) and otherwise only
``tierfs.client``: none of the daemon's dependencies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.distributed
from torch.utils.data import Sampler

import tierfs.client
from tierfs.client import PrefetchSession
from tierfs.errors import TierfsError

__all__ = ["PrefetchSampler", "bytes_loader", "image_loader", "load"]

log = logging.getLogger(__name__)


class PrefetchSampler(Sampler[int]):
    """Wraps ``sampler``: yields its indices, and hands the files they
    read to the tierfs mount at ``mountpoint`` as each epoch's order."""

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        files: Sequence[str | os.PathLike[str]],
        mountpoint: str | os.PathLike[str],
        *,
        job: str | None = None,
        rank: int | None = None,
        window_files: int | None = None,
        window_bytes: int | None = None,
    ) -> None:
        self.sampler = sampler
        self.files = files
        self.mountpoint = Path(mountpoint)
        #: None when ``mountpoint`` is no tierfs mount this process can reach:
        #: every epoch then runs without prefetch (said once, here).
        self.session: PrefetchSession | None = None
        try:
            self.session = PrefetchSession(
                self.mountpoint,
                job=job if job is not None else _default_job(),
                rank=rank if rank is not None else _default_rank(sampler),
                window_files=window_files,
                window_bytes=window_bytes,
            )
        except (TierfsError, OSError) as exc:
            log.warning("tierfs prefetch: the epochs run without prefetch: %s", exc)
        #: The daemon's answer to the last order (None: none taken yet).
        self.last_order: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[int]:
        indices = [int(index) for index in self.sampler]
        if self.session is None:
            return iter(indices)
        try:
            self.last_order = self.session.set_order(
                os.fspath(self.files[index]) for index in indices
            )
        except (TierfsError, OSError) as exc:
            self.last_order = None
            log.warning("tierfs prefetch: this epoch runs without an order: %s", exc)
        else:
            if self.last_order.get("missing"):
                log.warning(
                    "tierfs prefetch: %d files of the order were left out, e.g. %s",
                    self.last_order["missing"],
                    "; ".join(self.last_order.get("missing_named", [])[:3]),
                )
        return iter(indices)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the wrapped sampler (``DistributedSampler`` shuffles
        by epoch)."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def close(self) -> None:
        """End the current order (the process's exit does it too)."""
        if self.session is not None:
            self.session.close()


def load(path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``torch.load(path, **kwargs)``, reading the file through
    ``tierfs.client.open``."""
    with tierfs.client.open(path) as f:
        return torch.load(f, **kwargs)


def bytes_loader(path: str | os.PathLike[str]) -> bytes:
    """A ``DatasetFolder`` loader: the file's bytes."""
    with tierfs.client.open(path) as f:
        return f.read()


def image_loader(path: str | os.PathLike[str]) -> Any:
    """An ``ImageFolder`` loader: torchvision's default (PIL, converted to
    RGB), reading the file through ``tierfs.client.open``."""
    from PIL import Image  # torchvision's dependency; imported when used

    with tierfs.client.open(path) as f:
        image = Image.open(f)
        return image.convert("RGB")


def _default_job() -> str | None:
    job_id = os.environ.get("SLURM_JOB_ID")
    return f"slurm-{job_id}" if job_id else None


def _default_rank(sampler: object) -> int | None:
    rank = getattr(sampler, "rank", None)
    if isinstance(rank, int):
        return rank
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    env_rank = os.environ.get("RANK", "")
    return int(env_rank) if env_rank.isdigit() else None
