"""The ObjectStore protocol: what the rest of tierfs needs from a bucket.

All methods are synchronous and may block: callers on the trio loop run them
through ``trio.to_thread.run_sync`` with the shared store CapacityLimiter.
Implementations are thread-safe.

Keys are full keys inside the backing URL's prefix *as seen by the caller*:
the implementation adds and strips the configured prefix, so ``key="a/b"``
with ``url="s3://bkt/pre"`` is the object ``pre/a/b``.

Errors: every failure is a ``tierfs.errors.StoreError`` subclass, raised only
after the implementation's retry budget is spent (5xx, SlowDown, throttling,
connection resets, truncated bodies).  ``ObjectNotFound`` for a missing key,
``BucketNotFound`` / ``StoreAccessDenied`` for a missing bucket or bad
credentials.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object, from LIST or HEAD.

    ``key`` is relative to the store prefix.  ``mtime`` is seconds since the
    epoch (float): the ``x-amz-meta-mtime`` value when HEAD returned one, else
    LastModified.  ``metadata`` holds the user metadata (``x-amz-meta-*``
    without the prefix, lower-case keys); LIST results carry an empty dict.
    """

    key: str
    size: int
    etag: str
    mtime: float
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a delimited listing.

    ``objects`` are the keys directly under the prefix (the marker object for
    the prefix itself, if any, is included; callers skip it).  ``prefixes`` are
    the common prefixes, relative to the store prefix and ending in ``/``.
    """

    objects: list[ObjectInfo]
    prefixes: list[str]


@runtime_checkable
class ObjectStore(Protocol):
    """A bucket (or a local directory standing in for one)."""

    #: Human-readable location for messages, e.g. ``s3://bkt/pre`` (no secrets).
    url: str

    def check(self) -> None:
        """Verify the bucket exists and the credentials work.

        Fails fast (within seconds, no long retry loop) with BucketNotFound,
        StoreAccessDenied or StoreUnavailable and a message a user can act on.
        """
        ...

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[ListPage]:
        """ListObjectsV2 with ``Delimiter="/"`` under ``prefix``, one page at a time.

        ``prefix`` is "" for the root or ends in "/".  Pages are yielded as
        they arrive, so a directory of 100,000 keys never sits in memory whole.
        Keys come in lexicographic (UTF-8 byte) order within the objects of a
        page and across pages, like S3.
        """
        ...

    def head(self, key: str) -> ObjectInfo:
        """HEAD one object, with its user metadata.  ObjectNotFound if absent."""
        ...

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes:
        """Return bytes ``[start, start+length)`` of the object, clipped at its end.

        The whole body is read before returning; a reset or truncated body is
        retried (as a new ranged GET) inside the retry budget.  If ``etag`` is
        given the GET carries ``If-Match`` and a changed object raises
        PreconditionFailed instead of returning mixed content.
        """
        ...

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        """Single PUT of a whole object; returns its ETag."""
        ...

    def delete(self, key: str) -> None:
        """Delete one object; deleting a missing key is not an error."""
        ...
