"""S3Store: the ObjectStore protocol over boto3, for AWS or any S3-compatible endpoint.

Invariants:

- One boto3 client per store, created in ``__init__`` from a private
  ``boto3.session.Session``.  botocore clients are thread-safe (sessions are
  not), so worker threads share it; ``max_pool_connections`` bounds the HTTP
  connection pool and must be at least the number of parallel ranged GETs.
- botocore's own retries are OFF (``total_max_attempts=1``).  All retrying
  happens in :mod:`tierfs.store.retry`, once per operation, so that attempts
  and the time budget are counted in one place.  botocore also never retries
  a body that is reset or truncated mid-read; we must, and a second retry
  layer underneath would only multiply the worst case.
- Every botocore failure is turned into a ``tierfs.errors.StoreError``
  subclass by ONE function, :func:`map_s3_error`.  Messages name the
  operation, ``s3://bucket/key``, the endpoint and the S3 error code; never
  credentials (they come only from the standard AWS chain and are never
  read, stored or logged here).  User info in an endpoint URL is stripped
  from messages.
- Path-style addressing is used whenever an ``endpoint_url`` is given
  (moto, MinIO, Ceph, s3rver have no virtual-host DNS).
- Checksums: ``request_checksum_calculation``/``response_checksum_validation``
  are ``when_required`` because many S3-compatible servers reject or mangle
  the newer flexible-checksum headers; a PUT carries ``Content-MD5`` instead,
  which every implementation verifies.
- Keys given to this class are relative to the URL's prefix; the prefix is
  added on the way out and stripped on the way in.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    PartialCredentialsError,
)

from tierfs.errors import (
    BucketNotFound,
    InvalidArgument,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
)
from tierfs.store.base import ListPage, ObjectInfo
from tierfs.store.local import metadata_mtime, validate_metadata
from tierfs.store.retry import (
    CHECK_POLICY,
    DEFAULT_POLICY,
    RETRYABLE_EXCEPTIONS,
    RetryPolicy,
    TruncatedBody,
    error_code,
    http_status,
    run_with_retry,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
MAX_KEY_BYTES = 1024

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchVersion"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
    }
)
_REDIRECT_CODES = frozenset({"PermanentRedirect", "301", "AuthorizationHeaderMalformed"})
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix/")``.

    The prefix is "" or ends in "/"; leading and trailing slashes are
    normalised away.  InvalidArgument for anything else.
    """
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise InvalidArgument(f"not an s3:// URL: {url!r}")
    if parts.query or parts.fragment:
        raise InvalidArgument(f"s3 URL must be s3://bucket[/prefix], got {url!r}")
    bucket = parts.netloc  # not .hostname: that would lower-case it
    if not bucket or not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", bucket):
        raise InvalidArgument(f"s3 URL has no valid bucket name: {url!r}")
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise InvalidArgument(f"s3 URL prefix may not contain '.' or '..': {url!r}")
    prefix = "/".join(segments)
    return bucket, (prefix + "/" if prefix else "")


def _strip_etag(etag: str | None) -> str:
    return (etag or "").strip().strip('"')


def _safe_endpoint(endpoint: str) -> str:
    """The endpoint URL without any user info, for messages."""
    parts = urlsplit(endpoint)
    if parts.username is None and parts.password is None:
        return endpoint
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def map_s3_error(
    exc: BaseException,
    *,
    op: str,
    bucket: str,
    key: str | None,
    endpoint: str,
    bucket_level: bool = False,
) -> StoreError | None:
    """THE mapping from a botocore failure to a StoreError.

    ``key`` is the full S3 key (with prefix) or None for bucket-level calls;
    ``bucket_level`` makes a bare 404 mean "no such bucket" (HeadBucket has no
    body to say which).  Returns None for exceptions that are not store
    failures at all (programming errors): the caller re-raises those as they
    are.
    """
    where = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    code = error_code(exc)
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        s3_code = str(err.get("Code") or "")
        status = http_status(exc) or 0
        if s3_code == "NoSuchBucket" or (bucket_level and status == 404):
            return BucketNotFound(f"bucket '{bucket}' does not exist at {endpoint}")
        if s3_code in _NOT_FOUND_CODES or status == 404:
            return ObjectNotFound(f"{op} {where}: no such key")
        if s3_code in _DENIED_CODES or status == 403:
            return StoreAccessDenied(
                f"{op} {where}: access denied at {endpoint} ({code}); check the AWS "
                "credentials (environment, ~/.aws, instance role) and the bucket policy"
            )
        if s3_code == "PreconditionFailed" or status == 412:
            return PreconditionFailed(f"{op} {where}: object changed (ETag no longer matches)")
        if s3_code in _REDIRECT_CODES or status == 301:
            headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
            region = headers.get("x-amz-bucket-region") or err.get("Region")
            hint = f"; the bucket is in region {region!r}" if region else ""
            return StoreError(f"{op} {where}: wrong region or endpoint ({code}){hint}")
        return StoreError(f"{op} {where}: {code}")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return StoreAccessDenied(
            f"{op} {where}: no usable AWS credentials ({code}); set them in the "
            "environment, ~/.aws or an instance role"
        )
    if isinstance(exc, RETRYABLE_EXCEPTIONS | TruncatedBody):
        return StoreUnavailable(f"{op} {where}: cannot reach {endpoint} ({code})")
    if isinstance(exc, BotoCoreError):
        return StoreError(f"{op} {where}: {code}")
    return None


class S3Store:
    """ObjectStore over boto3.  Thread-safe; share one instance.

    ``client`` is public so tests can register botocore event hooks on it.
    """

    url: str

    def __init__(
        self,
        url: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        retry: RetryPolicy | None = None,
        max_pool_connections: int = 64,
        *,
        check_retry: RetryPolicy | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix.rstrip('/')}".rstrip("/")
        self.retry = retry or DEFAULT_POLICY
        self.check_retry = check_retry or CHECK_POLICY
        if max_pool_connections < 1:
            raise InvalidArgument("max_pool_connections must be >= 1")
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"} if endpoint_url else None,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            tcp_keepalive=True,
            user_agent_extra="tierfs",
        )
        session = boto3.session.Session(region_name=region)
        self.client: Any = session.client("s3", endpoint_url=endpoint_url, config=config)
        self.endpoint = _safe_endpoint(str(self.client.meta.endpoint_url))

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    def close(self) -> None:
        """Close the client's connection pool.  The store is unusable afterwards."""
        self.client.close()

    # --- helpers -----------------------------------------------------------

    def _full_key(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"empty or non-string key: {key!r}")
        full = self.prefix + key
        if len(full.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise InvalidArgument(f"key longer than {MAX_KEY_BYTES} bytes: {full[:64]!r}...")
        return full

    def _rel_key(self, full: str) -> str:
        if not full.startswith(self.prefix):
            raise StoreError(
                f"s3://{self.bucket}: listing returned {full!r} outside {self.prefix!r}"
            )
        return full[len(self.prefix) :]

    def _call(
        self,
        op: str,
        full_key: str | None,
        fn: Callable[[], T],
        *,
        policy: RetryPolicy | None = None,
        bucket_level: bool = False,
    ) -> T:
        def mapper(exc: BaseException) -> StoreError:
            mapped = map_s3_error(
                exc,
                op=op,
                bucket=self.bucket,
                key=full_key,
                endpoint=self.endpoint,
                bucket_level=bucket_level,
            )
            if mapped is None:
                raise exc
            return mapped

        target = f"s3://{self.bucket}/{full_key}" if full_key is not None else f"s3://{self.bucket}"
        if bucket_level:
            target = f"{target} at {self.endpoint}"
        return run_with_retry(policy or self.retry, fn, op=op, target=target, map_error=mapper)

    # --- ObjectStore ---------------------------------------------------------

    def check(self) -> None:
        """HeadBucket with the short CHECK policy: fails within a few seconds."""
        self._call(
            "check",
            None,
            lambda: self.client.head_bucket(Bucket=self.bucket),
            policy=self.check_retry,
            bucket_level=True,
        )

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[ListPage]:
        """ListObjectsV2 with Delimiter="/", one request per page.

        Empty pages are not yielded, so an empty listing yields nothing.
        ``page_size`` above 1000 is clamped to 1000 (S3's limit).
        """
        if prefix and not prefix.endswith("/"):
            raise InvalidArgument(f"list prefix must be '' or end in '/': {prefix!r}")
        if page_size < 1:
            raise InvalidArgument(f"page_size must be >= 1, got {page_size}")
        page_size = min(page_size, 1000)  # S3's own ceiling for MaxKeys
        full_prefix = self.prefix + prefix
        token: str | None = None
        while True:
            params: dict[str, Any] = {
                "Bucket": self.bucket,
                "Prefix": full_prefix,
                "Delimiter": "/",
                "MaxKeys": page_size,
            }
            if token is not None:
                params["ContinuationToken"] = token
            resp = self._call(
                "list", full_prefix, lambda p=params: self.client.list_objects_v2(**p)
            )
            objects = [
                ObjectInfo(
                    key=self._rel_key(c["Key"]),
                    size=int(c.get("Size", 0)),
                    etag=_strip_etag(c.get("ETag")),
                    mtime=c["LastModified"].timestamp() if c.get("LastModified") else 0.0,
                )
                for c in resp.get("Contents", []) or []
            ]
            prefixes = [self._rel_key(p["Prefix"]) for p in resp.get("CommonPrefixes", []) or []]
            if objects or prefixes:
                yield ListPage(objects=objects, prefixes=prefixes)
            if not resp.get("IsTruncated"):
                return
            token = resp.get("NextContinuationToken")
            if not token:
                raise StoreError(
                    f"list s3://{self.bucket}/{full_prefix}: truncated listing without a "
                    "continuation token"
                )

    def head(self, key: str) -> ObjectInfo:
        full = self._full_key(key)
        resp = self._call(
            "head", full, lambda: self.client.head_object(Bucket=self.bucket, Key=full)
        )
        metadata = {str(k).lower(): str(v) for k, v in (resp.get("Metadata") or {}).items()}
        last_modified = resp.get("LastModified")
        fallback = last_modified.timestamp() if last_modified is not None else 0.0
        return ObjectInfo(
            key=key,
            size=int(resp.get("ContentLength", 0)),
            etag=_strip_etag(resp.get("ETag")),
            mtime=metadata_mtime(metadata, fallback),
            metadata=metadata,
        )

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes:
        full = self._full_key(key)
        if start < 0 or length < 0:
            raise InvalidArgument(f"get_range {key!r}: negative start or length")
        if length == 0:
            return b""
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": full,
            "Range": f"bytes={start}-{start + length - 1}",
        }
        if etag:
            params["IfMatch"] = f'"{_strip_etag(etag)}"'

        def attempt() -> bytes:
            try:
                resp = self.client.get_object(**params)
            except ClientError as exc:
                code = str((exc.response.get("Error", {}) or {}).get("Code") or "")
                if http_status(exc) == 416 or code == "InvalidRange":
                    return b""  # start is at or beyond the end of the object
                raise
            body = resp["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            return _checked_range_body(data, resp, start, length, full)

        return self._call("get_range", full, attempt)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        full = self._full_key(key)
        meta = validate_metadata(metadata)
        payload = bytes(data)
        md5 = base64.b64encode(hashlib.md5(payload, usedforsecurity=False).digest()).decode()
        resp = self._call(
            "put",
            full,
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=full, Body=payload, Metadata=meta, ContentMD5=md5
            ),
        )
        return _strip_etag(resp.get("ETag"))

    def delete(self, key: str) -> None:
        full = self._full_key(key)
        with contextlib.suppress(ObjectNotFound):  # S3 itself says 204 for a missing key
            self._call(
                "delete", full, lambda: self.client.delete_object(Bucket=self.bucket, Key=full)
            )


def _checked_range_body(
    data: bytes, resp: dict[str, Any], start: int, length: int, full_key: str
) -> bytes:
    """Verify a GetObject body against its Content-Range / Content-Length.

    Raises TruncatedBody (retryable) when the server sent fewer bytes than it
    promised, or fewer than requested although the object is long enough.
    """
    content_range = resp.get("ContentRange")
    if content_range:
        m = _CONTENT_RANGE.match(content_range)
        if not m:
            raise StoreError(f"get_range {full_key}: bad Content-Range {content_range!r}")
        first, last = int(m.group(1)), int(m.group(2))
        total = int(m.group(3)) if m.group(3) != "*" else None
        if first != start:
            raise StoreError(
                f"get_range {full_key}: asked for offset {start}, got Content-Range {content_range!r}"
            )
        promised = last - first + 1
        if len(data) < promised:
            raise TruncatedBody(len(data), promised)
        if len(data) > promised:
            raise StoreError(f"get_range {full_key}: body longer than its Content-Range")
        if total is not None and promised < min(length, total - start):
            raise TruncatedBody(promised, min(length, total - start))
        return data[:length]
    # No Content-Range: the server ignored Range and sent the whole object.
    expected = resp.get("ContentLength")
    if expected is not None and len(data) < int(expected):
        raise TruncatedBody(len(data), int(expected))
    return data[start : start + length]
