"""S3Store: the ObjectStore protocol over boto3, for AWS or any S3-compatible endpoint.

Two request engines sit behind the one public API: the botocore client,
and a native one, obstore (:mod:`tierfs.store.s3_fast`), for the requests
whose cost is mostly per request: ranged GETs of up to ``native_get_max``
bytes (``get_range`` and ``get_range_into``) and single PUTs of up to
``native_put_max`` bytes.  HEAD, LIST, multipart, copy, delete, the
breaker's probe and bigger GETs stay on botocore; so do keys that obstore
would rewrite and PUTs whose metadata names a standard header (see
``s3_fast``).  Every invariant below holds for both; where the native
engine keeps it another way, the bullet says how.

Invariants:

- One S3 client per store, created in ``__init__`` from a private botocore
  session (what ``boto3.client`` builds too).  botocore clients are
  thread-safe (sessions are not), so worker threads share it;
  ``max_pool_connections`` bounds the HTTP connection pool and must be at
  least the number of parallel ranged GETs.  The sessions of all stores in a
  process share one botocore data loader (a read-only cache of the service
  model JSON), so a second store costs a fraction of the first; credentials
  and config are still resolved per store.  The native engine is one
  obstore store per timeout class (GETs, PUTs), made with the store and
  shared by all threads (its connection pool and tokio runtime are its own;
  the calls release the GIL).
- botocore's own retries are OFF (``total_max_attempts=1``).  All retrying
  happens in :mod:`tierfs.store.retry`, once per operation, so that attempts
  and the time budget are counted in one place.  botocore also never retries
  a body that is reset or truncated mid-read; we must, and a second retry
  layer underneath would only multiply the worst case.  The native engine
  runs with obstore's ``max_retries`` 0 inside the same ``_call``, so it
  shares the loop, the budget and the breaker.
- Every botocore failure is turned into a ``tierfs.errors.StoreError``
  subclass by ONE function, :func:`map_s3_error`.  Messages name the
  operation, ``s3://bucket/key``, the endpoint and the S3 error code; never
  credentials (they come only from the standard AWS chain and are never
  read, stored or logged here).  User info in an endpoint URL is stripped
  from messages.  A native-engine failure is first turned into the botocore
  exception it equals by ONE function, :func:`botocore_equivalent` (HTTP
  status and S3 code parsed from obstore's text; no answer becomes
  EndpointConnectionError, Connect/ReadTimeoutError or
  ConnectionClosedError), so the same classification and mapping apply.
  Its credentials come from the same botocore session (an obstore
  ``credential_provider`` over the session's credentials, asked again every
  few minutes so refreshed ones are used).
- Timeouts are bounded so that no FUSE request waits long on a dead or
  black-holed endpoint: ``CONNECT_TIMEOUT`` and ``READ_TIMEOUT`` (the wait
  for the next bytes of an answer) are a few seconds, and foreground
  requests (``head``, ``list_pages``, ``get_range*``, ``check``) run with
  ``foreground_retry``: the store's policy with its budget cut to
  ``FOREGROUND_BUDGET``.  Requests that carry or assemble large bodies
  (PutObject, UploadPart, CompleteMultipartUpload, CopyObject,
  UploadPartCopy) run in the background (uploader) and may legitimately
  wait longer for their answer: they get ``UPLOAD_READ_TIMEOUT`` through
  botocore's per-request ``read_timeout`` (request context; older botocore
  ignores it and they get ``READ_TIMEOUT``, which only means more retries).
  A LIST gets ``LIST_READ_TIMEOUT`` the same way: the server builds a whole
  page before it sends a byte, which can take longer than ``READ_TIMEOUT``
  for a large prefix, and then every retry would time out as well.  The
  native engine has the same connect timeout and per-read timeouts
  (``read_timeout`` for GETs, ``upload_read_timeout`` for PUTs) in
  reqwest's ``client_options``, plus a bound on the whole request.
- One :class:`~tierfs.store.breaker.CircuitBreaker` (``self.breaker``) sits
  in the one retry path: every request asks it first, and while the
  endpoint is unreachable every call fails at once with
  EndpointUnreachable; its probe is a bare HeadBucket (no retries, the
  short timeouts), and any HTTP answer to it counts as "reachable".
- Every request sent (retries and breaker probes included) is counted
  once per S3 operation in ``calls`` (botocore ``before-call``) and, with a
  ``request_observer``, reported with its latency and outcome
  (``after-call`` / ``after-call-error``): the metrics' one source, since
  this client is the one place requests are made.  The observer gets the
  operation name only, never a key.  The native engine counts its requests
  under the same names (``GetObject``, ``PutObject``) and tells the observer
  each one once it ended (its latency includes the small body).
- Path-style addressing is used whenever an ``endpoint_url`` is given
  (moto, MinIO, Ceph, s3rver have no virtual-host DNS), by both engines;
  the native one takes its region from the botocore client.
- Checksums: ``request_checksum_calculation``/``response_checksum_validation``
  are ``when_required`` because many S3-compatible servers reject or mangle
  the newer flexible-checksum headers.  Every body we send carries exactly
  one end-to-end checksum: over ``http://`` botocore always signs the
  payload's SHA-256 (``x-amz-content-sha256``, verified by the server); over
  ``https://`` it does not, so a PUT or part carries ``Content-MD5``, which
  every implementation verifies.  (An MD5 on top of the SHA-256 cost a CPU
  second per GiB uploaded.)  The native engine signs every payload
  (``unsigned_payload`` off), over https too: a native PUT carries
  ``x-amz-content-sha256`` of its body and nothing else.  A GET with an
  ETag carries ``If-Match`` on both engines; ETags come back stripped of
  their quotes.
- Keys given to this class are relative to the URL's prefix; the prefix is
  added on the way out and stripped on the way in.
- Listings are parsed by botocore with our ``parse_timestamp``: botocore's
  default hands every ``LastModified`` to dateutil, which was most of the
  parse of a page; ISO 8601 goes to ``datetime.fromisoformat`` and every
  other form to botocore's own.

Read engine.  Small requests go native, bulk ranged GETs stay on botocore.
botocore costs several times obstore's client CPU per request whatever its
size (building, signing, parsing, under the GIL; obstore works in Rust with
the GIL released), so for small objects the engine decides the daemon's CPU.
Past ``NATIVE_GET_MAX`` (2 MiB) the native engine no longer wins: its body
arrives as a new buffer that is copied into the block cache's, where
botocore's ``readinto`` copies nothing, and for 16 MiB ranges it costs as
much client CPU as botocore or more.  A receive low-water mark on big
bodies (``SO_RCVLOWAT``) was tried and left out: less client CPU, more
S3-server CPU, no clear gain in MB/s.  The measurements behind these
rules, dated, with their commands: ``docs/benchmarks.md``, "Native engine
for small GETs and PUTs".

Write path (see :mod:`tierfs.store.multipart` for why multipart is
hand-written rather than delegated to s3transfer):

- Part uploads and part copies run on ONE ThreadPoolExecutor per store
  (``upload_workers`` threads, created on first use), shared by all uploads;
  each upload keeps at most ``concurrency`` parts in flight, and each part's
  bytes are read by ``read_part`` inside the worker, so memory is bounded by
  ``min(upload_workers, sum of concurrency) * part_size``.  HTTP connections
  come from the client's pool, which fetches share: size
  ``max_pool_connections`` for both.  Never call ``put_multipart``/``copy``
  from a thread of that executor.
- Every request (create, each part, complete, abort, list) is one
  ``run_with_retry`` call with the store's policy.  Each part carries
  Content-MD5.  A retried part simply replaces the earlier copy of that part
  number, so part retries never duplicate data.
- CompleteMultipartUpload is the only request whose repetition is not
  obviously harmless: if an attempt completed the upload but its answer was
  lost, S3 may answer the retry with NoSuchUpload.  Then we HEAD the key and
  accept the object iff its ETag is the multipart ETag computed from our part
  MD5s (same parts, same order), so nothing is uploaded twice and nothing
  foreign is accepted.
- CreateMultipartUpload is not idempotent: if its answer is lost, the retry
  creates a second upload and the first one leaks.  So after a create that
  needed more than one attempt we abort every other upload of exactly that key
  that this store object did not start itself (``_active``).  Two writers
  uploading the same key at the same time are a conflict anyway (last
  complete wins); the one whose upload was aborted fails with StoreError and
  retries from its journal.
- On any failure after the create (a part, ``read_part``, ``on_upload_id``,
  complete) the running parts are stopped and waited for, then the upload is
  aborted (best effort, with a short retry policy; an abort that fails is
  logged and left to the caller's journal / ``list_uploads`` cleanup), then
  the error is raised: a StoreError, or the callback's own exception as it
  was.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import datetime
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import botocore.loaders
import botocore.session
import botocore.utils
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from tierfs.errors import (
    BucketNotFound,
    InvalidArgument,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from tierfs.store.base import (
    ORDINARY_ERROR_STATUSES,
    Bufs,
    CopyJob,
    ListPage,
    Match,
    ObjectInfo,
    ObjectStore,
    ObjectVersion,
    PartsUpload,
    RequestObserver,
    Stop,
    UploadInfo,
    metadata_mtime,
    validate_metadata,
)
from tierfs.store.breaker import CircuitBreaker
from tierfs.store.multipart import (
    Part,
    UploadCancelled,
    etag_digest,
    md5_digest,
    multipart_etag,
    plan_parts,
    read_exact,
    resolve_part_size,
    run_bounded,
)
from tierfs.store.retry import (
    CHECK_POLICY,
    DEFAULT_POLICY,
    RETRYABLE_CODES,
    RETRYABLE_EXCEPTIONS,
    UNREACHABLE_STATUSES,
    RetryPolicy,
    Transient,
    TruncatedBody,
    error_code,
    http_status,
    run_with_retry,
)
from tierfs.store.s3_fast import (
    NATIVE_GET_MAX,
    NATIVE_PUT_MAX,
    BotocoreCredentials,
    NativeEngine,
    native_key_ok,
    native_metadata_ok,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds to establish a TCP connection (and TLS) to the endpoint.
CONNECT_TIMEOUT = 2.0
#: Seconds without a byte of an answer after which a request gives up.
READ_TIMEOUT = 3.0
#: The same for requests whose answer may come late after a large body
#: (see the module docstring); they run in the background.
UPLOAD_READ_TIMEOUT = 30.0
#: The same for a LIST: the server computes the whole page before its
#: first byte, and a large prefix legitimately takes longer than
#: ``READ_TIMEOUT`` (s3rver with 10,000 keys under one prefix: 3.3 s per
#: page, measured); under ``READ_TIMEOUT`` every retry would time out too.
LIST_READ_TIMEOUT = 15.0
#: Time budget of the retries of one foreground request (seconds).
FOREGROUND_BUDGET = 5.0
#: Keys this store adds to botocore's per-request context (request metrics).
_SENT_AT = "tierfs_sent_at"
_OPERATION = "tierfs_operation"
#: Operations that get ``UPLOAD_READ_TIMEOUT``.
UPLOAD_OPERATIONS = (
    "PutObject",
    "UploadPart",
    "CompleteMultipartUpload",
    "CopyObject",
    "UploadPartCopy",
)
MAX_KEY_BYTES = 1024
DEFAULT_UPLOAD_WORKERS = 16
DELETE_BATCH = 1000  # DeleteObjects' limit
#: Aborting after a failure is best effort: do not spend another full budget on it.
ABORT_MAX_ATTEMPTS = 3
ABORT_MAX_BUDGET = 10.0

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
#: Client errors that no retry fixes (``StoreRefused``), by code and by status.
_REFUSED_CODES = frozenset(
    {
        "KeyTooLongError",
        "InvalidArgument",
        "InvalidRequest",
        "InvalidObjectName",
        "InvalidURI",
        "EntityTooLarge",
        "MetadataTooLarge",
        "MaxMessageLengthExceeded",
        "InvalidStorageClass",
    }
)
_REFUSED_STATUSES = frozenset({400, 405, 411, 413, 414})
#: 400s that a later attempt may not meet (a slow or damaged transfer, a clock).
_TRANSIENT_CLIENT_CODES = frozenset(
    {"RequestTimeout", "RequestTimeTooSkewed", "BadDigest", "IncompleteBody", "InvalidDigest"}
)
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")

_loader_lock = threading.Lock()
_loader: Any = None


def _shared_loader() -> Any:
    """The process-wide botocore data loader (service models), created on first use."""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        return _loader


def client_config(
    *,
    connect_timeout: float,
    read_timeout: float,
    max_pool_connections: int,
    endpoint_url: str | None,
    user_agent: str = "tierfs",
) -> Config:
    """The botocore settings of tierfs's S3 clients: one attempt per call
    (retries are the caller's policy), path-style addressing for a custom
    endpoint, checksums only where S3 requires them, TCP keepalive."""
    return Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint_url else None,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        tcp_keepalive=True,
        user_agent_extra=user_agent,
    )


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


def parse_timestamp(value: Any) -> Any:
    """botocore's timestamp parser, without dateutil for the ISO 8601 form
    with a zone that listings carry (``2026-11-26T18:30:11.000Z``).

    Anything else (a HEAD's RFC 1123 ``Last-Modified``, a naive or numeric
    value) goes to botocore's own parser, so every result is what botocore
    would have returned (an aware datetime of the same instant)."""
    if isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if parsed.tzinfo is not None:
                return parsed
    return botocore.utils.parse_timestamp(value)


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
        if s3_code == "NoSuchUpload":
            return StoreError(
                f"{op} {where}: the multipart upload no longer exists ({code}); "
                "aborted by another client or a lifecycle rule?"
            )
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
        if s3_code in _REFUSED_CODES or (
            status in _REFUSED_STATUSES and s3_code not in _TRANSIENT_CLIENT_CODES
        ):
            return StoreRefused(f"{op} {where}: refused by the bucket ({code})")
        return StoreError(f"{op} {where}: {code}")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return StoreAccessDenied(
            f"{op} {where}: no usable AWS credentials ({code}); set them in the "
            "environment, ~/.aws or an instance role"
        )
    if isinstance(exc, (*RETRYABLE_EXCEPTIONS, TruncatedBody)):
        return StoreUnavailable(f"{op} {where}: cannot reach {endpoint} ({code})")
    if isinstance(exc, BotoCoreError):
        return StoreError(f"{op} {where}: {code}")
    return None


_STATUS_IN_TEXT = re.compile(r"status code: (\d{3})")
_CODE_IN_TEXT = re.compile(r"<Code>([^<]{1,64})</Code>")
#: reqwest's failure kind in obstore's text (``HttpError { kind: Timeout, ...``).
_HTTP_KIND_IN_TEXT = re.compile(r"HttpError\s*\{\s*kind:\s*(\w+)")
#: Status an obstore exception class stands for when its text names none.
_OBSTORE_CLASS_STATUS = {
    "FileNotFoundError": 404,
    "NotFoundError": 404,
    "PermissionDeniedError": 403,
    "UnauthenticatedError": 403,
    "PreconditionError": 412,
    "AlreadyExistsError": 412,
    "NotModifiedError": 304,
}


def botocore_equivalent(exc: BaseException, operation: str, endpoint: str) -> BaseException:
    """THE mapping of an obstore failure (the native engine, :mod:`.s3_fast`):
    the botocore exception that the same failure raises on the botocore
    path, so that :func:`~tierfs.store.retry.classify`, the breaker and
    :func:`map_s3_error` (hence the StoreError subclass and its message)
    treat both engines alike.

    obstore tells an HTTP answer only in its message text: the status
    (``status code: 503``) and the S3 error document (``<Code>SlowDown
    </Code>``) become a ClientError with that status and code (so 404
    NoSuchBucket gives BucketNotFound, 403 StoreAccessDenied, 412
    PreconditionFailed, 416 InvalidRange the caller's "past the end", 5xx
    and SlowDown a retry; ``Retry-After`` is not available).  No answer at
    all becomes what botocore raises for it: a refused or failed connect
    EndpointConnectionError, a timeout Connect/ReadTimeoutError (both count
    towards the breaker), anything else on the wire (a reset, a body cut
    short) ConnectionClosedError, retried like botocore's resets.
    Anything that is not an obstore failure is returned unchanged (the
    caller re-raises it as it was).
    """
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    if not (module.startswith("obstore") or isinstance(exc, FileNotFoundError)):
        return exc
    text = str(exc)
    status_match = _STATUS_IN_TEXT.search(text)
    status = int(status_match.group(1)) if status_match else _OBSTORE_CLASS_STATUS.get(name)
    if status is None and "redirect" in text.lower():
        status = 301
    if status is not None:
        code_match = _CODE_IN_TEXT.search(text)
        code = code_match.group(1) if code_match else str(status)
        response: dict[str, Any] = {
            "Error": {"Code": code, "Message": f"HTTP {status} from {endpoint}"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
        }
        return ClientError(response, operation)  # type: ignore[arg-type]
    kind_match = _HTTP_KIND_IN_TEXT.search(text)
    kind = kind_match.group(1) if kind_match else ""
    if kind == "Timeout" or (kind == "Connect" and "TimedOut" in text):
        if kind == "Connect":
            return ConnectTimeoutError(endpoint_url=endpoint)
        return ReadTimeoutError(endpoint_url=endpoint)
    if kind == "Connect":
        return EndpointConnectionError(endpoint_url=endpoint)
    if kind or name == "GenericError":  # reset, cut short, undecodable: the wire failed
        return ConnectionClosedError(endpoint_url=endpoint)
    return exc


class S3Store(ObjectStore):
    """ObjectStore over boto3 (and obstore for small GETs and PUTs).  Thread-safe;
    share one instance.

    ``client`` is public so tests can register botocore event hooks on it;
    the native engine's requests do not pass through it (set
    ``native_get_max``/``native_put_max`` to 0 to send everything through
    botocore, or inject faults on the wire with tests/faults.py).
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
        upload_read_timeout: float = UPLOAD_READ_TIMEOUT,
        upload_workers: int = DEFAULT_UPLOAD_WORKERS,
        circuit_breaker: bool = True,
        request_observer: RequestObserver | None = None,
        native_get_max: int = NATIVE_GET_MAX,
        native_put_max: int = NATIVE_PUT_MAX,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix.rstrip('/')}".rstrip("/")
        self.retry = retry or DEFAULT_POLICY
        self.check_retry = check_retry or CHECK_POLICY
        self.foreground_retry = dataclasses.replace(
            self.retry,
            budget=min(self.retry.budget, FOREGROUND_BUDGET),
            max_retry_after=min(self.retry.max_retry_after, FOREGROUND_BUDGET / 2),
        )
        self.abort_retry = dataclasses.replace(
            self.retry,
            max_attempts=min(self.retry.max_attempts, ABORT_MAX_ATTEMPTS),
            budget=min(self.retry.budget, ABORT_MAX_BUDGET),
        )
        if max_pool_connections < 1:
            raise InvalidArgument("max_pool_connections must be >= 1")
        if upload_workers < 1:
            raise InvalidArgument("upload_workers must be >= 1")
        self.upload_workers = upload_workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False
        self._active: set[str] = set()  # upload ids this store started and still runs
        config = client_config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            endpoint_url=endpoint_url,
        )
        session = botocore.session.get_session()
        session.register_component("data_loader", _shared_loader())
        session.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=parse_timestamp
        )
        self.client: Any = session.create_client(
            "s3", region_name=region, endpoint_url=endpoint_url, config=config
        )
        self.endpoint = _safe_endpoint(str(self.client.meta.endpoint_url))
        #: Requests sent, per S3 operation name (``GetObject``, ``HeadObject``,
        #: ``ListObjectsV2``...), retries included: what ``status`` reports as
        #: ``store_calls`` and what tests count S3 calls with.
        self.calls: collections.Counter[str] = collections.Counter()
        self._calls_lock = threading.Lock()
        self.client.meta.events.register("before-call.s3", self._count_call)
        #: Told about each request (operation, seconds, failed): metrics.
        #: May be set later; None tells nobody.
        self.request_observer = request_observer
        self.client.meta.events.register("after-call.s3", self._request_answered)
        self.client.meta.events.register("after-call-error.s3", self._request_unanswered)
        self.upload_read_timeout = upload_read_timeout
        for operation in UPLOAD_OPERATIONS:
            self.client.meta.events.register(
                f"before-call.s3.{operation}", self._lengthen_read_timeout
            )
        self.client.meta.events.register(
            "before-call.s3.ListObjectsV2", self._lengthen_list_read_timeout
        )
        self.breaker: CircuitBreaker | None = (
            CircuitBreaker(self.endpoint, self._probe) if circuit_breaker else None
        )
        #: Over plain HTTP botocore signs each payload's SHA-256 already.
        self._send_md5 = str(self.client.meta.endpoint_url).startswith("https")
        #: Ranged GETs up to this many bytes, and single PUTs up to
        #: ``native_put_max``, go through the native engine (0: never).
        self.native_get_max = native_get_max
        self.native_put_max = native_put_max
        self._native = NativeEngine(
            bucket=self.bucket,
            endpoint_url=self.endpoint if endpoint_url else None,
            region=str(self.client.meta.region_name or "us-east-1"),
            credentials=BotocoreCredentials(session.get_credentials()),
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            upload_read_timeout=upload_read_timeout,
            on_request=self._native_request_done,
            translate_error=lambda exc, operation: botocore_equivalent(
                exc, operation, self.endpoint
            ),
        )

    def _count_call(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        with self._calls_lock:
            self.calls[model.name] += 1
        context[_OPERATION] = model.name
        context[_SENT_AT] = time.perf_counter()

    def _request_answered(
        self, http_response: Any, model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        """botocore hook: an answer head arrived (any status)."""
        if self.request_observer is None:
            return
        status = int(getattr(http_response, "status_code", 0) or 0)
        failed = status >= 400 and status not in ORDINARY_ERROR_STATUSES
        self._observe(model.name, context, failed)

    def _request_unanswered(self, context: dict[str, Any], **_: Any) -> None:
        """botocore hook: the request got no answer (connect error, timeout, reset)."""
        self._observe(context.get(_OPERATION, "unknown"), context, True)

    def _observe(self, operation: str, context: dict[str, Any], failed: bool) -> None:
        observer = self.request_observer
        sent = context.get(_SENT_AT)
        if observer is None or sent is None:
            return
        try:
            observer(operation, time.perf_counter() - sent, failed)
        except Exception:  # metrics must never fail a request
            log.exception("request observer failed")

    def _native_request_done(self, operation: str, seconds: float, status: int | None) -> None:
        """The native engine sent a request: count it and tell the observer.

        ``seconds`` covers the whole answer (a small body included);
        ``status`` None means no answer at all.
        """
        with self._calls_lock:
            self.calls[operation] += 1
        observer = self.request_observer
        if observer is None:
            return
        failed = status is None or (status >= 400 and status not in ORDINARY_ERROR_STATUSES)
        try:
            observer(operation, seconds, failed)
        except Exception:  # metrics must never fail a request
            log.exception("request observer failed")

    def _lengthen_read_timeout(self, context: dict[str, Any], **_: Any) -> None:
        """botocore hook: upload requests wait ``upload_read_timeout`` for their answer."""
        context["read_timeout"] = self.upload_read_timeout

    def _lengthen_list_read_timeout(self, context: dict[str, Any], **_: Any) -> None:
        """botocore hook: a LIST waits ``LIST_READ_TIMEOUT`` for its answer."""
        context["read_timeout"] = LIST_READ_TIMEOUT

    def _probe(self) -> None:
        """The breaker's probe: one bare HeadBucket; returns if the endpoint answered."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            status = http_status(exc) or 0
            if status in UNREACHABLE_STATUSES:
                raise
            # Any other answer (403, 404, 500, 503 ...): the endpoint is there.

    def _body_checksum(self, data: bytes) -> dict[str, str]:
        """Extra arguments that give a body its end-to-end checksum."""
        if not self._send_md5:
            return {}
        return {"ContentMD5": base64.b64encode(md5_digest(data)).decode()}

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    def close(self) -> None:
        """Stop the part workers and close the connection pool.  The store is unusable afterwards."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self.breaker is not None:
            self.breaker.close()
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
        sleep: Callable[[float], object] | None = None,
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
        return run_with_retry(
            policy or self.retry,
            fn,
            op=op,
            target=target,
            map_error=mapper,
            sleep=sleep or time.sleep,
            breaker=self.breaker,
            foreground=policy is self.foreground_retry,
        )

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

    def key_fits(self, key: str) -> bool:
        try:
            self._full_key(key)
        except InvalidArgument:
            return False
        return True

    def reserved(self, key: str) -> bool:
        return False  # a bucket keeps no names for itself

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
                "list",
                full_prefix,
                lambda p=params: self.client.list_objects_v2(**p),
                policy=self.foreground_retry,
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
            "head",
            full,
            lambda: self.client.head_object(Bucket=self.bucket, Key=full),
            policy=self.foreground_retry,
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

    def _ranged_get(
        self,
        full: str,
        start: int,
        length: int,
        match: Match,
        read: Callable[[Any, dict[str, Any]], T],
        past_end: T,
    ) -> T:
        """One ranged GetObject of ``length > 0`` bytes, retried as a whole;
        ``read(body, response)`` consumes the body and closes or releases
        it.  A start at or beyond the object's end gives ``past_end``."""
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": full,
            "Range": f"bytes={start}-{start + length - 1}",
        }
        if match.etag:
            params["IfMatch"] = f'"{_strip_etag(match.etag)}"'
        if match.version:
            params["VersionId"] = match.version

        def attempt() -> T:
            try:
                resp = self.client.get_object(**params)
            except ClientError as exc:
                if http_status(exc) == 416 or _s3_code(exc) == "InvalidRange":
                    return past_end
                raise
            return read(resp["Body"], resp)

        return self._call("get_range", full, attempt, policy=self.foreground_retry)

    def _native_get(self, full: str, start: int, length: int, match: Match) -> Any | None:
        """A ranged GET of ``length > 0`` bytes through the native engine,
        retried as a whole: a buffer of the bytes there are, or None when
        ``start`` is at or beyond the object's end."""
        if_match = _strip_etag(match.etag) if match.etag else None

        def attempt() -> Any | None:
            try:
                body, size = self._native.get(full, start, length, if_match, match.version)
            except ClientError as exc:
                if http_status(exc) == 416 or _s3_code(exc) == "InvalidRange":
                    return None
                raise
            expected = max(0, min(length, size - start))
            if len(body) < expected:
                raise TruncatedBody(len(body), expected)
            if len(body) > length:
                raise StoreError(f"get_range {full}: body longer than the range asked for")
            return body

        return self._call("get_range", full, attempt, policy=self.foreground_retry)

    def get_range(
        self,
        key: str,
        start: int,
        length: int,
        etag: str | None = None,
        *,
        version: str | None = None,
    ) -> bytes:
        full = self._full_key(key)
        if start < 0 or length < 0:
            raise InvalidArgument(f"get_range {key!r}: negative start or length")
        if length == 0:
            return b""
        match = Match(etag, version)
        if length <= self.native_get_max and native_key_ok(full):
            body = self._native_get(full, start, length, match)
            return b"" if body is None else bytes(body)
        return self._ranged_get(
            full,
            start,
            length,
            match,
            lambda body, resp: _read_range_body(body, resp, start, length, full),
            b"",
        )

    def _read_into(self, key: str, start: int, bufs: Bufs, match: Match, stop: Stop) -> int:
        full = self._full_key(key)
        length = sum(len(b) for b in bufs)
        if length == 0:
            return 0
        if length <= self.native_get_max and native_key_ok(full):
            body = self._native_get(full, start, length, match)
            return 0 if body is None else _scatter(memoryview(body), bufs)

        def read(body: Any, resp: dict[str, Any]) -> int:
            try:
                promised = _promised_range_length(resp, start, length, full)
                if promised is not None and promised > length:
                    raise StoreError(f"get_range {full}: Content-Range longer than asked for")
            except BaseException:
                body.close()
                raise
            if promised is None:  # the server ignored Range: rare, copy from the whole body
                return _scatter(_read_range_body(body, resp, start, length, full), bufs)
            return _read_body_into(body, bufs, promised, stop)

        return self._ranged_get(full, start, length, match, read, 0)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        full = self._full_key(key)
        meta = validate_metadata(metadata)
        payload = bytes(data)
        if len(payload) <= self.native_put_max and native_key_ok(full) and native_metadata_ok(meta):
            etag = self._call("put", full, lambda: self._native.put(full, payload, meta))
            return _strip_etag(etag)
        checksum = self._body_checksum(payload)
        resp = self._call(
            "put",
            full,
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=full, Body=payload, Metadata=meta, **checksum
            ),
        )
        return _strip_etag(resp.get("ETag"))

    def delete(self, key: str) -> None:
        full = self._full_key(key)
        with contextlib.suppress(ObjectNotFound):  # S3 itself says 204 for a missing key
            self._call(
                "delete", full, lambda: self.client.delete_object(Bucket=self.bucket, Key=full)
            )

    def delete_many(self, keys: Iterable[str]) -> None:
        """DeleteObjects in batches of 1000 (quiet mode); missing keys are fine.

        Keys that S3 reports with a transient code (InternalError, SlowDown,
        ...) are sent again inside the retry budget; any other per-key error
        raises StoreError naming the first failed key after all batches ran.
        """
        fulls = [self._full_key(k) for k in keys]  # validate every key before deleting any
        hard: list[tuple[str, str]] = []
        for start in range(0, len(fulls), DELETE_BATCH):
            pending = fulls[start : start + DELETE_BATCH]

            def attempt() -> None:
                nonlocal pending
                resp = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in pending], "Quiet": True},
                )
                retry: list[str] = []
                codes: list[str] = []
                for err in resp.get("Errors") or []:
                    code = str(err.get("Code") or "")
                    if code in RETRYABLE_CODES:
                        retry.append(str(err.get("Key")))
                        codes.append(code)
                    elif code not in ("NoSuchKey", "NoSuchVersion"):
                        hard.append((str(err.get("Key")), code or "unknown error"))
                if retry:
                    pending = retry
                    raise Transient(f"{len(retry)} keys not deleted", code=codes[0])

            target = f"{pending[0]} (+{len(pending) - 1} more)" if len(pending) > 1 else pending[0]
            self._call("delete_many", target, attempt)
        if hard:
            key, code = hard[0]
            raise StoreError(
                f"delete_many s3://{self.bucket}: {len(hard)} of {len(fulls)} keys not deleted; "
                f"first: {key} ({code})"
            )

    # --- write path: multipart --------------------------------------------------

    def _put_parts(self, job: PartsUpload) -> str:
        """The multipart upload of :meth:`tierfs.store.base.ObjectStore.put_multipart`."""
        full = self._full_key(job.key)
        parts, read_part, meta = job.parts, job.read_part, job.metadata
        concurrency, on_upload_id = job.concurrency, job.on_upload_id
        total = len(parts)

        def send(part: Part, upload_id: str, stop: threading.Event) -> str:
            if stop.is_set():
                raise UploadCancelled
            data = read_exact(read_part, part)
            checksum = self._body_checksum(data)

            def attempt() -> str:
                if stop.is_set():
                    raise UploadCancelled
                resp = self.client.upload_part(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    PartNumber=part.number,
                    Body=data,
                    **checksum,
                )
                return _strip_etag(resp.get("ETag"))

            return self._call(
                f"put_multipart part {part.number}/{total}", full, attempt, sleep=stop.wait
            )

        return self._multipart("put_multipart", full, meta, parts, send, concurrency, on_upload_id)

    def _copy(self, job: CopyJob) -> str:
        """The copy of :meth:`tierfs.store.base.ObjectStore.copy`.

        HEADs the source first (its size picks CopyObject or UploadPartCopy;
        its metadata goes on a multipart copy, which cannot copy it by
        itself).  Every copy request carries ``x-amz-copy-source-if-match``
        with that ETag, so a source replaced during the copy gives
        PreconditionFailed instead of a mix of two versions.
        """
        src_key, dst_key, meta = job.src_key, job.dst_key, job.metadata
        full_src = self._full_key(src_key)
        full_dst = self._full_key(dst_key)
        src = self.head(src_key)
        source = {"Bucket": self.bucket, "Key": full_src}
        if_match = f'"{src.etag}"'
        where = f"{full_src} -> {full_dst}"
        if src.size <= job.multipart_threshold:
            params: dict[str, Any] = {
                "Bucket": self.bucket,
                "Key": full_dst,
                "CopySource": source,
                "CopySourceIfMatch": if_match,
                "MetadataDirective": "COPY" if meta is None else "REPLACE",
            }
            if meta is not None:
                params["Metadata"] = meta
            resp = self._call("copy", where, lambda: self.client.copy_object(**params))
            return _strip_etag((resp.get("CopyObjectResult") or {}).get("ETag"))

        parts = plan_parts(src.size, resolve_part_size(src.size, job.part_size))
        total = len(parts)

        def send(part: Part, upload_id: str, stop: threading.Event) -> str:
            def attempt() -> str:
                if stop.is_set():
                    raise UploadCancelled
                resp = self.client.upload_part_copy(
                    Bucket=self.bucket,
                    Key=full_dst,
                    UploadId=upload_id,
                    PartNumber=part.number,
                    CopySource=source,
                    CopySourceIfMatch=if_match,
                    CopySourceRange=f"bytes={part.offset}-{part.end - 1}",
                )
                return _strip_etag((resp.get("CopyPartResult") or {}).get("ETag"))

            return self._call(f"copy part {part.number}/{total}", where, attempt, sleep=stop.wait)

        new_meta = src.metadata if meta is None else meta
        return self._multipart(
            "copy", full_dst, new_meta, parts, send, job.concurrency, job.on_upload_id
        )

    def versioning(self) -> bool:
        resp = self._call(
            "versioning",
            None,
            lambda: self.client.get_bucket_versioning(Bucket=self.bucket),
            policy=self.foreground_retry,
            bucket_level=True,
        )
        return resp.get("Status") == "Enabled"

    def current_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        """Each key's current version (``versions``), unless it is a delete marker."""
        return (version for version in self.versions(prefix) if version.current)

    def versions(self, prefix: str) -> Iterator[ObjectVersion]:
        """ListObjectVersions under the store prefix + ``prefix``, all pages
        (delete markers are listed apart by S3, and left out)."""
        pages = self._marker_pages(
            "list_versions",
            self.prefix + prefix,
            self.client.list_object_versions,
            "VersionIdMarker",
            policy=self.foreground_retry,
        )
        for resp in pages:
            for version in resp.get("Versions") or []:
                modified = version.get("LastModified")
                yield ObjectVersion(
                    key=self._rel_key(str(version["Key"])),
                    version_id=str(version.get("VersionId") or "null"),
                    size=int(version.get("Size", 0)),
                    etag=_strip_etag(version.get("ETag")),
                    mtime=modified.timestamp() if modified is not None else 0.0,
                    current=bool(version.get("IsLatest")),
                )

    def _marker_pages(
        self,
        op: str,
        full_prefix: str,
        call: Callable[..., dict[str, Any]],
        id_marker: str,
        *,
        policy: RetryPolicy | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The pages of a listing that goes on from ``KeyMarker`` and an id
        marker (``UploadIdMarker``: ListMultipartUploads; ``VersionIdMarker``:
        ListObjectVersions)."""
        key_marker: str | None = None
        id_value: str | None = None
        while True:
            params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if key_marker is not None:
                params["KeyMarker"] = key_marker
                if id_value:
                    params[id_marker] = id_value
            resp = self._call(op, full_prefix, lambda p=params: call(**p), policy=policy)
            yield resp
            if not resp.get("IsTruncated"):
                return
            key_marker = resp.get("NextKeyMarker")
            id_value = resp.get(f"Next{id_marker}")
            if not key_marker:
                raise StoreError(
                    f"{op} s3://{self.bucket}/{full_prefix}: truncated listing without a "
                    "next marker"
                )

    def list_uploads(self, prefix: str = "") -> list[UploadInfo]:
        """ListMultipartUploads under the store prefix + ``prefix``, all pages."""
        if not isinstance(prefix, str):
            raise InvalidArgument(f"prefix must be str, got {type(prefix).__name__}")
        out: list[UploadInfo] = []
        pages = self._marker_pages(
            "list_uploads",
            self.prefix + prefix,
            self.client.list_multipart_uploads,
            "UploadIdMarker",
        )
        for resp in pages:
            for upload in resp.get("Uploads") or []:
                initiated = upload.get("Initiated")
                out.append(
                    UploadInfo(
                        key=self._rel_key(str(upload.get("Key", ""))),
                        upload_id=str(upload.get("UploadId", "")),
                        initiated=initiated.timestamp() if initiated is not None else 0.0,
                    )
                )
        return out

    def abort_upload(self, key: str, upload_id: str) -> None:
        """AbortMultipartUpload; NoSuchUpload (unknown, finished or aborted) is fine."""
        full = self._full_key(key)
        self._abort(full, upload_id, self.retry)

    # --- multipart helpers ---------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._closed:
                raise StoreError(f"{self.url}: store is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.upload_workers, thread_name_prefix="tierfs-s3-part"
                )
            return self._pool

    def _multipart(
        self,
        op: str,
        full: str,
        meta: dict[str, str],
        parts: list[Part],
        send: Callable[[Part, str, threading.Event], str],
        concurrency: int,
        on_upload_id: Callable[[str], None] | None,
    ) -> str:
        """Create, run ``send`` for every part, complete; abort on any failure."""
        executor = self._executor()
        upload_id = self._create(op, full, meta)
        try:
            if on_upload_id is not None:
                on_upload_id(upload_id)
            stop = threading.Event()
            etags = run_bounded(
                executor, parts, lambda part: send(part, upload_id, stop), concurrency, stop
            )
            return self._complete(op, full, upload_id, [p.number for p in parts], etags)
        except UploadCancelled as exc:
            self._abort_quietly(op, full, upload_id)
            raise StoreError(
                f"{op} s3://{self.bucket}/{full}: upload stopped because the store was closed"
            ) from exc
        except BaseException:
            self._abort_quietly(op, full, upload_id)
            raise
        finally:
            with self._pool_lock:
                self._active.discard(upload_id)

    def _create(self, op: str, full: str, meta: dict[str, str]) -> str:
        attempts = 0

        def attempt() -> str:
            nonlocal attempts
            attempts += 1
            resp = self.client.create_multipart_upload(Bucket=self.bucket, Key=full, Metadata=meta)
            upload_id = str(resp["UploadId"])
            with self._pool_lock:
                self._active.add(upload_id)
            return upload_id

        upload_id = self._call(f"{op} create", full, attempt)
        if attempts > 1:
            self._abort_lost_creates(op, full, upload_id)
        return upload_id

    def _abort_lost_creates(self, op: str, full: str, keep: str) -> None:
        """Abort uploads of ``full`` that a create whose answer was lost may have left.

        Best effort: a failure here is logged, the caller's upload goes on.
        """
        try:
            uploads = self.list_uploads(self._rel_key(full))
        except StoreError as exc:
            log.warning(
                "%s s3://%s/%s: cannot look for leaked uploads: %s", op, self.bucket, full, exc
            )
            return
        for upload in uploads:
            with self._pool_lock:
                ours = upload.upload_id in self._active
            if self.prefix + upload.key != full or ours or upload.upload_id == keep:
                continue
            log.info(
                "%s s3://%s/%s: aborting upload %s left by a create whose answer was lost",
                op,
                self.bucket,
                full,
                upload.upload_id,
            )
            self._abort_quietly(op, full, upload.upload_id)

    def _complete(
        self, op: str, full: str, upload_id: str, numbers: list[int], etags: list[str]
    ) -> str:
        digests = [etag_digest(e) for e in etags]
        expected = (
            multipart_etag([d for d in digests if d is not None])
            if all(d is not None for d in digests)
            else None
        )
        body = {
            "Parts": [
                {"PartNumber": n, "ETag": f'"{e}"'} for n, e in zip(numbers, etags, strict=True)
            ]
        }
        attempts = 0

        def attempt() -> str:
            nonlocal attempts
            attempts += 1
            try:
                resp = self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload=body
                )
            except ClientError as exc:
                # An earlier attempt may have completed it and lost the answer.
                if (
                    attempts > 1
                    and _s3_code(exc) == "NoSuchUpload"
                    and expected is not None
                    and self._object_etag(full) == expected
                ):
                    log.info(
                        "%s s3://%s/%s: upload %s was completed by an earlier attempt",
                        op,
                        self.bucket,
                        full,
                        upload_id,
                    )
                    return expected
                raise
            return _strip_etag(resp.get("ETag")) or (expected or "")

        return self._call(f"{op} complete", full, attempt)

    def _object_etag(self, full: str) -> str | None:
        """ETag of ``full`` now, or None if it does not exist (raw call, inside a retry)."""
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if http_status(exc) == 404:
                return None
            raise
        return _strip_etag(resp.get("ETag"))

    def _abort(self, full: str, upload_id: str, policy: RetryPolicy) -> None:
        if not isinstance(upload_id, str) or not upload_id:
            raise InvalidArgument(f"empty or non-string upload id: {upload_id!r}")

        def attempt() -> None:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            except ClientError as exc:
                if _s3_code(exc) != "NoSuchUpload":
                    raise

        self._call("abort_upload", full, attempt, policy=policy)

    def _abort_quietly(self, op: str, full: str, upload_id: str) -> None:
        try:
            self._abort(full, upload_id, self.abort_retry)
        except StoreError as exc:
            log.warning(
                "%s s3://%s/%s: could not abort upload %s (%s); it stays until a cleanup",
                op,
                self.bucket,
                full,
                upload_id,
                exc,
            )


def _s3_code(exc: ClientError) -> str:
    return str((exc.response.get("Error", {}) or {}).get("Code") or "")


def _promised_range_length(
    resp: dict[str, Any], start: int, length: int, full_key: str
) -> int | None:
    """The body length a ranged GetObject answer promises (checked against
    the request), or None when it has no Content-Range (the server ignored
    Range and sends the whole object)."""
    content_range = resp.get("ContentRange")
    if not content_range:
        return None
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
    if total is not None and promised < min(length, total - start):
        raise TruncatedBody(promised, min(length, total - start))
    return promised


def _scatter(data: bytes | memoryview, bufs: Sequence[memoryview]) -> int:
    """Copy ``data`` into ``bufs`` in order; returns the bytes copied."""
    pos = 0
    for buf in bufs:
        if pos >= len(data):
            break
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos : pos + n]
        pos += n
    return pos


def _read_body_into(
    body: Any, bufs: Sequence[memoryview], promised: int, stop: Callable[[], bool] | None = None
) -> int:
    """Read ``promised`` body bytes straight into ``bufs`` (socket to buffer,
    no intermediate copy) and give the connection back to the pool.
    ``stop()`` is asked each time a buffer is full and bytes are left: True
    ends the read there (the connection is closed, the rest of the body
    never read) and the bytes read so far are returned.

    botocore's StreamingBody and urllib3 2.x's ``readinto`` both read into a
    new bytes object first, which on a cold read cost a page-faulted copy
    per byte (perf: clearing fresh pages was 12 % of the daemon's CPU).
    http.client's response under them reads into the caller's buffer, so
    we use it when it is there (botocore 1.3x, urllib3 2.x) and fall back
    to ``body.read`` otherwise.  A short body raises TruncatedBody
    (retried); the connection is returned to the pool only when its
    response was read to the end, else it is closed.
    """
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    readinto = getattr(fp, "readinto", None)
    if readinto is None or not callable(getattr(raw, "release_conn", None)):
        try:
            data = body.read()
        finally:
            body.close()
        if len(data) < promised:
            raise TruncatedBody(len(data), promised)
        return _scatter(memoryview(data)[:promised], bufs)
    got = 0
    released = False
    try:
        for buf in bufs:
            view = buf[: min(len(buf), promised - got)]
            while view:
                n = readinto(view)
                if not n:
                    raise TruncatedBody(got, promised)
                got += n
                view = view[n:]
            if got >= promised or (stop is not None and stop()):
                break
        if fp.isclosed():  # read to its end: the connection may serve the next request
            raw.release_conn()
            released = True
    finally:
        if not released:
            body.close()
    return got


def _read_range_body(
    body: Any, resp: dict[str, Any], start: int, length: int, full_key: str
) -> bytes:
    """Read a ranged GetObject body whole, close it, and check it."""
    try:
        data = body.read()
    finally:
        body.close()
    return _checked_range_body(data, resp, start, length, full_key)


def _checked_range_body(
    data: bytes, resp: dict[str, Any], start: int, length: int, full_key: str
) -> bytes:
    """Verify a GetObject body against its Content-Range / Content-Length.

    Raises TruncatedBody (retryable) when the server sent fewer bytes than it
    promised, or fewer than requested although the object is long enough.
    """
    promised = _promised_range_length(resp, start, length, full_key)
    if promised is not None:
        if len(data) < promised:
            raise TruncatedBody(len(data), promised)
        if len(data) > promised:
            raise StoreError(f"get_range {full_key}: body longer than its Content-Range")
        return data[:length]
    # No Content-Range: the server ignored Range and sent the whole object.
    expected = resp.get("ContentLength")
    if expected is not None and len(data) < int(expected):
        raise TruncatedBody(len(data), int(expected))
    return data[start : start + length]
