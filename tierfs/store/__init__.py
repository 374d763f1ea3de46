"""Object stores: the only package that imports boto3.

``open_store`` picks the implementation from the backing URL's scheme.  The
implementations are imported lazily so that ``import tierfs.store`` (for the
protocol and dataclasses) does not pay for importing boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tierfs.errors import ConfigError
from tierfs.store.base import (
    RESERVED_ROOTS,
    SHADOW_ROOT,
    SNAPSHOT_ROOT,
    ListPage,
    ObjectInfo,
    ObjectStore,
    ObjectVersion,
    RequestObserver,
    UploadInfo,
    abort_stale_uploads,
)

if TYPE_CHECKING:
    from tierfs.config import BackingConfig, SharedTierConfig
    from tierfs.store.shared import SharedBucket

__all__ = [
    "RESERVED_ROOTS",
    "SHADOW_ROOT",
    "SNAPSHOT_ROOT",
    "ListPage",
    "ObjectInfo",
    "ObjectStore",
    "ObjectVersion",
    "RequestObserver",
    "UploadInfo",
    "abort_stale_uploads",
    "open_shared_tier",
    "open_store",
]

SUPPORTED_SCHEMES = ("s3", "file")


def open_store(
    backing: BackingConfig,
    *,
    source: str = "backing.url",
    max_pool_connections: int | None = None,
    request_observer: RequestObserver | None = None,
) -> ObjectStore:
    """Build the store for ``backing``: S3Store for ``s3://``, LocalStore for ``file://``.

    Does no I/O (call ``store.check()`` for that).  A URL with another scheme,
    or one the store cannot parse, raises ConfigError with ``source`` (the
    config file name, when the caller knows it) as the file.
    ``max_pool_connections`` sizes the S3 HTTP pool: give it at least the
    number of S3 calls that may run at once (fetch concurrency plus uploads);
    None keeps S3Store's default.  ``request_observer`` is told about every
    request sent to S3 (metrics); a ``file://`` store sends none.
    """
    from tierfs.errors import InvalidArgument

    scheme = urlsplit(backing.url).scheme.lower()
    try:
        if scheme == "s3":
            from tierfs.store.s3 import S3Store

            pool = (
                {}
                if max_pool_connections is None
                else {"max_pool_connections": max_pool_connections}
            )
            return S3Store(
                backing.url,
                endpoint_url=backing.endpoint_url,
                region=backing.region,
                request_observer=request_observer,
                **pool,
            )
        if scheme == "file":
            if backing.endpoint_url:
                raise InvalidArgument("endpoint_url makes no sense with a file:// backing URL")
            from tierfs.store.local import LocalStore

            return LocalStore(backing.url)
    except InvalidArgument as exc:
        raise ConfigError([(source, 0, f"[backing] url: {exc}")]) from None
    raise ConfigError(
        [
            (
                source,
                0,
                f"[backing] url {backing.url!r}: unsupported scheme {scheme or '(none)'!r}; "
                "use s3://bucket/prefix or file:///dir",
            )
        ]
    )


def open_shared_tier(shared: SharedTierConfig) -> SharedBucket:
    """The client of the shared tier's bucket (``tierfs.store.shared``).
    Does no I/O."""
    from tierfs.store.shared import SharedBucket

    return SharedBucket(shared)
