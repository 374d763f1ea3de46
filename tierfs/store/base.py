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
credentials.  Bad arguments (keys, metadata, part sizes) are
``InvalidArgument`` and are detected before any request is sent.  The one
exception to "only StoreError": an exception raised by a caller's callback
(``read_part``, ``on_upload_id``) is re-raised unchanged, after the upload it
interrupted has been aborted.

Write path (``put_multipart``): the caller's bytes come from a
``read_part(offset, length)`` callback over its cache files (which may be
spread over several tiers); see :mod:`tierfs.store.multipart` for why this is
hand-written instead of using s3transfer.  Multipart upload ids are handed to
the caller through ``on_upload_id`` before any part is sent, so that a journal
can abort them after a crash (``abort_upload``); ``list_uploads`` finds
uploads nobody journaled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tierfs.errors import InvalidArgument
from tierfs.store.multipart import (
    DEFAULT_CONCURRENCY,
    MAX_SINGLE_COPY_SIZE,
    Part,
    ReadPart,
    check_concurrency,
    plan_parts,
    read_exact,
    resolve_part_size,
)

#: Top-level key prefix of the attribute shadow (``tierfs.core.names.shadow``).
#: Stores treat it as an ordinary prefix; a store that reserves names of its
#: own (the local store's ``.tierfs-*``) lets this one through as the first
#: segment of a key.
SHADOW_ROOT = ".tierfs-attrs"
#: Top-level key prefix of the snapshots' records (``tierfs.snapshot.record``).
SNAPSHOT_ROOT = ".tierfs-snapshots"
#: Every top-level name tierfs keeps for itself in a bucket: mounts never
#: list one, never let one be made in their root, and the local store lets
#: each through as the first segment of a key.
RESERVED_ROOTS = frozenset({SHADOW_ROOT, SNAPSHOT_ROOT})


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
class ObjectVersion:
    """The current version of one object, from a listing of versions:
    ``key`` relative to the store prefix, ``version_id`` the bucket's."""

    key: str
    version_id: str
    size: int
    etag: str
    mtime: float
    #: The key's current version (not an older one the bucket keeps).
    current: bool = True


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a delimited listing.

    ``objects`` are the keys directly under the prefix (the marker object for
    the prefix itself, if any, is included; callers skip it).  ``prefixes`` are
    the common prefixes, relative to the store prefix and ending in ``/``.
    """

    objects: list[ObjectInfo]
    prefixes: list[str]


@dataclass(frozen=True, slots=True)
class UploadInfo:
    """One multipart upload in progress (started and neither completed nor aborted).

    ``key`` is relative to the store prefix; ``initiated`` is seconds since
    the epoch as the store reports it (some S3-compatible servers report a
    fixed or coarse time: treat it as a hint).
    """

    key: str
    upload_id: str
    initiated: float


class RequestObserver(Protocol):
    """Told about every request a store sends (``S3Store(request_observer=...)``).

    ``operation`` is the S3 API name (``GetObject``, ``HeadObject``...),
    ``seconds`` the time from sending the request to its parsed answer head
    (a GetObject body streams after that), ``failed`` whether it is counted
    as an error (see :data:`ORDINARY_ERROR_STATUSES`).  Called from the
    store's worker threads: it must be thread-safe and cheap, and it must
    never raise.  Operation names are the only thing it learns: no keys.
    """

    def __call__(self, operation: str, seconds: float, failed: bool) -> None: ...


#: HTTP answers that are ordinary replies rather than failures: a missing
#: key (a lookup's "no") and a range past the object's end.
ORDINARY_ERROR_STATUSES = frozenset({404, 416})


def validate_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """Check user metadata and lower-case its keys.

    Metadata travels as HTTP headers in S3, so keys must be ASCII letters,
    digits and ``-_.``, values printable ASCII; anything else is refused up
    front (InvalidArgument) rather than mangled or rejected by a server.
    """
    out: dict[str, str] = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgument(f"metadata keys and values must be str: {k!r}={v!r}")
        if not k or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in k):
            raise InvalidArgument(f"metadata key {k!r} must be ASCII letters, digits, '-_.'")
        if not all(32 <= ord(c) < 127 for c in v):
            raise InvalidArgument(f"metadata value for {k!r} must be printable ASCII")
        out[k.lower()] = v
    return out


def metadata_mtime(metadata: dict[str, str], fallback: float) -> float:
    """``float(metadata["mtime"])`` if present and finite, else ``fallback``."""
    raw = metadata.get("mtime")
    if raw is not None:
        try:
            value = float(raw)
        except ValueError:
            return fallback
        if math.isfinite(value):
            return value
    return fallback


@dataclass(frozen=True, slots=True)
class Match:
    """Which bytes of an object a GET wants: the version ``version`` (None:
    the current one), and only if its ETag is ``etag`` (None: any)."""

    etag: str | None = None
    version: str | None = None


#: The buffers a ranged GET fills, in order.
Bufs = Sequence[memoryview]
#: Asked whether a GET should give way (``get_range_into``'s ``stop``).
Stop = Callable[[], bool] | None


@dataclass(frozen=True, slots=True)
class PartsUpload:
    """A multipart upload, its arguments checked (``ObjectStore.put_multipart``):
    more than one part."""

    key: str
    parts: list[Part]
    read_part: ReadPart
    metadata: dict[str, str]
    concurrency: int
    on_upload_id: Callable[[str], None] | None


@dataclass(frozen=True, slots=True)
class CopyJob:
    """A server-side copy, its arguments checked (``ObjectStore.copy``);
    ``metadata`` None keeps the source's."""

    src_key: str
    dst_key: str
    metadata: dict[str, str] | None
    multipart_threshold: int
    part_size: int | None
    concurrency: int
    on_upload_id: Callable[[str], None] | None


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

    def key_fits(self, key: str) -> bool:
        """Could ``key`` name an object in this store (length limits, reserved
        names)?  Pure: no request is sent."""
        ...

    def reserved(self, key: str) -> bool:
        """Does ``key`` use a name this store keeps for itself (the local
        store's ``.tierfs-*``)?  Such a key does not fit either; the layers
        above refuse it with EPERM, not as too long.  Pure."""
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

    def get_range(
        self,
        key: str,
        start: int,
        length: int,
        etag: str | None = None,
        *,
        version: str | None = None,
    ) -> bytes:
        """Return bytes ``[start, start+length)`` of the object, clipped at its end.

        The whole body is read before returning; a reset or truncated body is
        retried (as a new ranged GET) inside the retry budget.  If ``etag`` is
        given the GET carries ``If-Match`` and a changed object raises
        PreconditionFailed instead of returning mixed content.  ``version``
        reads that version of the object (``GetObject`` with ``VersionId``),
        whatever the current one is: ``ObjectNotFound`` once the bucket no
        longer keeps it; a store without versions refuses one
        (``InvalidArgument``).
        """
        ...

    def get_range_into(
        self,
        key: str,
        start: int,
        bufs: Sequence[memoryview],
        etag: str | None = None,
        *,
        stop: Callable[[], bool] | None = None,
        version: str | None = None,
    ) -> int:
        """Like ``get_range`` (``etag``, ``version`` as there) for ``sum(len(b) for b in bufs)`` bytes, but the
        bytes go into ``bufs``, filled in order, with no intermediate copy
        where the store allows.  Returns how many bytes were read: fewer
        where the object ends; the rest of ``bufs`` is left as it was.

        ``stop`` (a GET that may give way to more urgent work) is called
        each time a buffer is full and more are left; if it returns True the
        read ends there (the rest of the body is dropped) and the bytes of
        the buffers filled so far are returned.  A store may fill a short
        range whole without asking.
        """
        if start < 0:
            raise InvalidArgument(f"get_range_into {key!r}: negative start")
        return self._read_into(key, start, bufs, Match(etag, version), stop)

    def _read_into(self, key: str, start: int, bufs: Bufs, match: Match, stop: Stop) -> int:
        """``get_range_into`` with ``start`` checked: each store's own."""
        ...

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        """Single PUT of a whole object; returns its ETag."""
        ...

    def delete(self, key: str) -> None:
        """Delete one object; deleting a missing key is not an error."""
        ...

    def put_multipart(
        self,
        key: str,
        size: int,
        read_part: ReadPart,
        metadata: dict[str, str] | None = None,
        *,
        part_size: int | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        on_upload_id: Callable[[str], None] | None = None,
    ) -> str:
        """Upload ``size`` bytes produced by ``read_part``; return the ETag (no quotes).

        ``read_part(offset, length)`` returns exactly the source bytes
        ``[offset, offset+length)``.  It is called lazily from worker threads,
        at most ``concurrency`` parts at a time, never for the whole object at
        once; it may raise, and then the upload is aborted and that exception
        re-raised unchanged.  A store is done with the bytes of one part
        (sent or copied) before the same thread calls ``read_part`` again,
        so a source may reuse one buffer per thread.

        ``part_size`` defaults to :func:`~tierfs.store.multipart.choose_part_size`
        (at least 8 MiB, a 5 TiB object fits in 10,000 parts); a caller's value
        must be between 5 MiB and 5 GiB.  If ``size <= part_size`` this is one
        PUT and ``on_upload_id`` is not called.  Otherwise a multipart upload
        is created, ``on_upload_id(upload_id)`` is called before any part is
        sent (so that the caller can journal it), parts go up in parallel, and
        the upload is completed.  On any failure the upload is aborted (best
        effort) before the error is raised.  ``metadata`` becomes the object's
        user metadata (``x-amz-meta-*``) as in ``put``.
        """
        meta = validate_metadata(metadata)
        part_size = resolve_part_size(size, part_size)
        check_concurrency(concurrency)
        if size <= part_size:
            data = read_exact(read_part, Part(1, 0, size)) if size else b""
            return self.put(key, data, meta)
        parts = plan_parts(size, part_size)
        return self._put_parts(PartsUpload(key, parts, read_part, meta, concurrency, on_upload_id))

    def _put_parts(self, job: PartsUpload) -> str:
        """The multipart upload of ``put_multipart``: each store's own."""
        ...

    def copy(
        self,
        src_key: str,
        dst_key: str,
        metadata: dict[str, str] | None = None,
        *,
        multipart_threshold: int = MAX_SINGLE_COPY_SIZE,
        part_size: int | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        on_upload_id: Callable[[str], None] | None = None,
    ) -> str:
        """Server-side copy; returns the new object's ETag (no quotes).

        ``metadata=None`` keeps the source's user metadata, a dict replaces it.
        ObjectNotFound if ``src_key`` does not exist.  Sources larger than
        ``multipart_threshold`` (default 5 GiB, CopyObject's limit) are copied
        as a multipart upload of ranged part copies, with the same part rules,
        ``on_upload_id`` and abort-on-failure as ``put_multipart``.
        """
        meta = None if metadata is None else validate_metadata(metadata)
        check_concurrency(concurrency)
        if not isinstance(multipart_threshold, int) or not (
            0 <= multipart_threshold <= MAX_SINGLE_COPY_SIZE
        ):
            raise InvalidArgument(
                f"multipart_threshold must be between 0 and {MAX_SINGLE_COPY_SIZE}, "
                f"got {multipart_threshold!r}"
            )
        return self._copy(
            CopyJob(
                src_key, dst_key, meta, multipart_threshold, part_size, concurrency, on_upload_id
            )
        )

    def _copy(self, job: CopyJob) -> str:
        """The copy of ``copy``: each store's own."""
        ...

    def list_uploads(self, prefix: str = "") -> list[UploadInfo]:
        """Multipart uploads in progress whose key starts with ``prefix``."""
        ...

    def versioning(self) -> bool:
        """Does the bucket keep the versions of its objects (versioning
        enabled)?  A store without versions answers False."""
        ...

    def current_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        """The current version of every object whose key starts with
        ``prefix`` (no delimiter: the whole subtree), in key order; objects
        whose current version is a delete marker are left out.  Nothing on a
        store without versions."""
        ...

    def versions(self, prefix: str) -> Iterator[ObjectVersion]:
        """Every version the bucket keeps of the objects whose key starts
        with ``prefix``, in key order and newest first within a key (delete
        markers left out).  Nothing on a store without versions."""
        ...

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort one multipart upload; an unknown or finished upload is not an error."""
        ...

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete several objects (missing ones are fine); StoreError if any failed."""
        ...


def abort_stale_uploads(store: ObjectStore, older_than: float, prefix: str = "") -> int:
    """Abort every upload under ``prefix`` initiated before ``older_than``; return the count.

    For cleanup at mount time.  On S3 an upload of *another* client sharing the
    prefix looks exactly like a stale one of ours: give an ``older_than`` well
    in the past (a day, say) unless this node owns the prefix, and prefer
    aborting the ids in the journal.  A StoreError from listing or aborting
    propagates (uploads aborted before it stay aborted).
    """
    count = 0
    for upload in store.list_uploads(prefix):
        if upload.initiated < older_than:
            store.abort_upload(upload.key, upload.upload_id)
            count += 1
    return count
