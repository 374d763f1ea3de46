"""Part arithmetic and the bounded parallel part runner, shared by both stores.

Why tierfs hand-writes multipart uploads instead of using s3transfer
(``boto3``'s ``upload_fileobj``/``TransferManager``):

- The bytes of a dirty file do not sit in one file object.  Blocks of one
  inode may live on NVMe or HDD (spilled writes, demotions), so the caller
  supplies a ``read_part(offset, length)`` callback that gathers a part from
  whichever cache files hold it, and each worker reads its own part when it
  is about to send it.  s3transfer reads one file object sequentially.
- Every request must go through the ONE retry policy
  (:mod:`tierfs.store.retry`): attempts, backoff, Retry-After and the time
  budget are counted in one place.  s3transfer leans on botocore's retry
  handler (switched off in our client) and adds retries of its own for some
  streaming errors; it offers no hook to run each request through our
  policy, and two stacked loops would multiply attempts and break the
  budget.
- The caller needs the upload id *before* any part is sent (to journal it,
  so that a crash can be cleaned up with AbortMultipartUpload), the part
  size rule of the design (a 5 TiB object fits in 10,000 parts), a bound on
  memory per upload, and an abort on any failure.  s3transfer exposes none
  of that.

Invariants of :func:`run_bounded` (used for part uploads and part copies):

- At most ``concurrency`` tasks of one call are submitted to the shared
  executor at any time; a task produces its part's bytes itself (lazily, in
  the worker thread), so at most ``concurrency`` parts of one upload are in
  memory.  The executor's worker count bounds the total across uploads.
- At the first failure no new task is submitted, queued tasks are
  cancelled, the ``stop`` event is set (running tasks check it between
  attempts and while backing off), and the call waits for the running tasks
  to end before it raises.  So when it returns or raises, no task of this
  call is running any more: an AbortMultipartUpload sent afterwards cannot
  race a part upload of the same upload.
- The first exception is re-raised unchanged (the very object), so a
  ``read_part`` failure reaches the caller as it was raised.  If the
  executor is shut down under a running call (the store was closed), it
  raises :class:`UploadCancelled`; the stores turn that into a StoreError.
- Never call it from a thread of the same executor: a full pool would then
  wait on itself.
"""

from __future__ import annotations

import hashlib
import math
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TypeVar

from tierfs.errors import InvalidArgument

T = TypeVar("T")
R = TypeVar("R")

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

#: S3 limits.
MIN_PART_SIZE = 5 * MiB  # every part but the last
MAX_PART_SIZE = 5 * GiB
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 * TiB
MAX_SINGLE_COPY_SIZE = 5 * GiB  # CopyObject refuses bigger sources

#: tierfs defaults.
DEFAULT_MIN_PART_SIZE = 8 * MiB
DEFAULT_CONCURRENCY = 8
PART_SIZE_ALIGN = MiB

#: ``read_part(offset, length) -> bytes``: the source's bytes ``[offset, offset+length)``.
ReadPart = Callable[[int, int], bytes]


class UploadCancelled(Exception):
    """Raised inside a part task when a sibling task already failed.

    Never escapes :func:`run_bounded` (the sibling's exception does).
    """


@dataclass(frozen=True, slots=True)
class Part:
    """One part: ``number`` counts from 1; bytes ``[offset, offset+length)``."""

    number: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        """Offset one past the last byte."""
        return self.offset + self.length


def choose_part_size(size: int, minimum: int = DEFAULT_MIN_PART_SIZE) -> int:
    """Part size for an object of ``size`` bytes.

    At least ``minimum`` (which must be at least S3's 5 MiB), large enough
    that the object fits in 10,000 parts (``ceil(size / 10000)``: 525 MiB for
    5 TiB), rounded up to a multiple of 1 MiB.  Up to 80,000 MiB that is
    ``minimum`` (rounded up).
    """
    if size < 0:
        raise InvalidArgument(f"object size must be >= 0, got {size}")
    if minimum < MIN_PART_SIZE:
        raise InvalidArgument(f"minimum part size must be >= {MIN_PART_SIZE}, got {minimum}")
    needed = max(minimum, math.ceil(size / MAX_PARTS))
    return -(-needed // PART_SIZE_ALIGN) * PART_SIZE_ALIGN


def resolve_part_size(size: int, part_size: int | None) -> int:
    """Validate ``size`` and the caller's ``part_size`` (or choose one).

    InvalidArgument unless ``0 <= size <= 5 TiB``, ``5 MiB <= part_size <=
    5 GiB`` and the object needs at most 10,000 parts.  The last part may be
    shorter than ``part_size``; that is the only part allowed below 5 MiB.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidArgument(f"object size must be an int >= 0, got {size!r}")
    if size > MAX_OBJECT_SIZE:
        raise InvalidArgument(f"object of {size} bytes is larger than S3's 5 TiB limit")
    if part_size is None:
        return choose_part_size(size)
    if not isinstance(part_size, int) or isinstance(part_size, bool):
        raise InvalidArgument(f"part_size must be an int, got {part_size!r}")
    if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
        raise InvalidArgument(
            f"part_size must be between {MIN_PART_SIZE} (5 MiB) and {MAX_PART_SIZE} (5 GiB), "
            f"got {part_size}"
        )
    if math.ceil(size / part_size) > MAX_PARTS:
        raise InvalidArgument(
            f"part_size {part_size} is too small for {size} bytes: more than {MAX_PARTS} parts"
        )
    return part_size


def plan_parts(size: int, part_size: int) -> list[Part]:
    """The parts of an object of ``size`` bytes; empty for size 0."""
    if part_size <= 0:
        raise InvalidArgument(f"part_size must be > 0, got {part_size}")
    return [
        Part(number=i + 1, offset=off, length=min(part_size, size - off))
        for i, off in enumerate(range(0, size, part_size))
    ]


def check_concurrency(concurrency: int) -> int:
    """``concurrency`` if it is an int >= 1, else InvalidArgument."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise InvalidArgument(f"concurrency must be an int >= 1, got {concurrency!r}")
    return concurrency


def read_exact(read_part: ReadPart, part: Part) -> bytes:
    """Call ``read_part`` for ``part`` and check the length of what it returned.

    The callback's own exceptions pass through unchanged; a short or long
    answer (the source changed size under the upload) is InvalidArgument.
    """
    data = read_part(part.offset, part.length)
    if len(data) != part.length:
        raise InvalidArgument(
            f"read_part({part.offset}, {part.length}) returned {len(data)} bytes; "
            "the source changed size during the upload"
        )
    return data


def md5_digest(data: bytes) -> bytes:
    """Binary MD5 (for Content-MD5 and multipart ETags, not for security)."""
    return hashlib.md5(data, usedforsecurity=False).digest()


def multipart_etag(part_digests: Sequence[bytes]) -> str:
    """The ETag S3 gives a completed multipart upload (unencrypted / SSE-S3).

    ``hex(md5(md5(part 1) + md5(part 2) + ...)) + "-" + number of parts``.
    """
    joined = hashlib.md5(b"".join(part_digests), usedforsecurity=False).hexdigest()
    return f"{joined}-{len(part_digests)}"


def etag_digest(etag: str) -> bytes | None:
    """The binary MD5 in a plain (single-part) ETag, or None if it is not one."""
    etag = etag.strip().strip('"')
    if len(etag) != 32:
        return None
    try:
        return bytes.fromhex(etag)
    except ValueError:
        return None


def run_bounded(
    executor: Executor,
    items: Sequence[T],
    fn: Callable[[T], R],
    concurrency: int,
    stop: threading.Event,
) -> list[R]:
    """Run ``fn(item)`` for every item on ``executor``; results in item order.

    See the module docstring for the invariants (window of ``concurrency``
    tasks, stop at the first failure, wait for running tasks, re-raise the
    first exception unchanged).
    """
    results: list[R | None] = [None] * len(items)
    pending: dict[Future[R], int] = {}
    # Completion is signalled through done-callbacks, not concurrent.futures.wait():
    # a future cancelled by Executor.shutdown(cancel_futures=True) never wakes
    # wait(), but it does run its callbacks.
    finished: queue.SimpleQueue[Future[R]] = queue.SimpleQueue()
    next_index = 0
    first_error: BaseException | None = None

    def fail(exc: BaseException) -> None:
        nonlocal first_error
        if first_error is None:
            first_error = exc
            stop.set()
            for other in pending:
                other.cancel()

    try:
        while next_index < len(items) or pending:
            while first_error is None and next_index < len(items) and len(pending) < concurrency:
                try:
                    future = executor.submit(fn, items[next_index])
                except RuntimeError as exc:  # the executor was shut down (store closed)
                    fail(UploadCancelled(f"cannot start a part: {exc}"))
                    break
                pending[future] = next_index
                next_index += 1
                future.add_done_callback(finished.put)
            if not pending:
                break
            future = finished.get()
            index = pending.pop(future)
            if future.cancelled():
                # Cancelled by us after a failure, or by an executor shutdown.
                fail(UploadCancelled("a part was cancelled (store closed?)"))
                continue
            exc = future.exception()
            if exc is None:
                results[index] = future.result()
            else:
                fail(exc)  # ignored if an earlier failure is already recorded
    except BaseException:
        # KeyboardInterrupt / SystemExit in the waiting thread: stop the tasks
        # and wait for the running ones before letting it through.
        stop.set()
        for future in pending:
            future.cancel()
        while pending:
            pending.pop(finished.get(), None)
        raise
    if first_error is not None:
        raise first_error
    if stop.is_set():
        raise UploadCancelled("upload cancelled")
    return results  # type: ignore[return-value]
