"""The native request engine of :class:`tierfs.store.s3.S3Store`: obstore.

obstore (Rust ``object_store`` over reqwest/hyper, with a tokio runtime of
its own) sends a request for about a tenth of the client CPU that botocore
spends on one (request building, signing, parsing), which is what a small
object costs.  ``S3Store`` routes through this engine the requests where
that per-request cost dominates: ranged GETs up to ``NATIVE_GET_MAX`` bytes
and single PUTs up to ``NATIVE_PUT_MAX`` bytes.  Everything else stays on
botocore (see the module docstring of :mod:`tierfs.store.s3`).  Only
``s3.py`` uses this module.

Invariants:

- obstore never retries: ``max_retries`` is 0 and its retry timeout tiny,
  so each call here is exactly one HTTP request; the caller runs it inside
  ``S3Store._call`` (the one retry loop, the same breaker).
- Every failure of a request is raised as the botocore exception it equals
  (:func:`tierfs.store.s3.botocore_equivalent`), so retry classification,
  the breaker and :func:`~tierfs.store.s3.map_s3_error` treat both engines
  alike.
- Every request is reported once to ``on_request(operation, seconds,
  status)`` with the S3 operation name botocore would use (``GetObject``,
  ``PutObject``), its latency and its HTTP status (None: no answer).
- Bounded waits: ``connect_timeout``; ``read_timeout`` (each read, the
  answer head included) is the store's read timeout for GETs and its upload
  read timeout for PUTs; a total timeout bounds each request as a whole.
- Credentials come only from the botocore session's chain (the one the
  botocore client uses): obstore asks :class:`BotocoreCredentials` for them
  and caches them for at most ``CREDENTIALS_TTL`` minus its own five-minute
  refresh margin, so rotated credentials are picked up.  obstore's own
  environment lookups never supply them.
- Each PUT's payload is signed (``unsigned_payload`` off): its
  ``x-amz-content-sha256`` is the SHA-256 of the body, which the server
  checks, over http and https alike.  (The shared tier's engine is the
  exception: its blocks carry their own xxh3, checked on every read, so it
  sends ``UNSIGNED-PAYLOAD`` and saves the client about 0.9 CPU s per GiB
  put, measured on SeaweedFS.)
- Keys go out exactly as given: a key that obstore's ``Path`` would
  normalise (a leading, trailing or doubled ``/``, a ``.`` or ``..``
  segment, a control character) is not eligible (:func:`native_key_ok`) and
  the caller uses botocore for it.  So is a PUT whose user metadata has a
  name that obstore would send as a standard header (``content-type`` ...).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

import obstore
from botocore.exceptions import NoCredentialsError
from obstore.store import S3Store as ObstoreS3Store

#: Largest ranged GET sent through obstore (bytes); bigger ones use botocore's
#: ``readinto`` path, which copies nothing (see the s3.py docstring).
NATIVE_GET_MAX = 2 * 1024 * 1024
#: Largest single PUT sent through obstore (bytes).
NATIVE_PUT_MAX = 16 * 1024 * 1024
#: How long obstore may cache credentials before it asks botocore again.
CREDENTIALS_TTL = datetime.timedelta(minutes=10)
#: Whole-request bound of a GET and of a PUT, on top of the per-read timeout.
GET_TOTAL_TIMEOUT = datetime.timedelta(seconds=30)
PUT_TOTAL_TIMEOUT = datetime.timedelta(minutes=5)

#: User metadata names obstore turns into standard headers instead of x-amz-meta-*.
_HEADER_ATTRIBUTES = frozenset(
    {"content-type", "content-disposition", "content-encoding", "content-language", "cache-control"}
)

#: Called once per request: (S3 operation, seconds, HTTP status or None).
RequestHook = Callable[[str, float, int | None], None]
#: Turns an obstore failure into the botocore exception it equals.
ErrorTranslator = Callable[[BaseException, str], BaseException]


def native_key_ok(full_key: str) -> bool:
    """True if obstore sends ``full_key`` unchanged (see the module docstring)."""
    if full_key.startswith("/") or full_key.endswith("/") or "//" in full_key:
        return False
    if any(ord(c) < 32 or ord(c) == 127 for c in full_key):
        return False
    return not any(segment in (".", "..") for segment in full_key.split("/"))


def native_metadata_ok(metadata: Mapping[str, str]) -> bool:
    """True if every name in (lower-cased) ``metadata`` becomes an x-amz-meta-* header."""
    return not any(name in _HEADER_ATTRIBUTES for name in metadata)


class BotocoreCredentials:
    """obstore credential provider over a botocore session's credentials."""

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    @property
    def available(self) -> bool:
        return self._credentials is not None

    def __call__(self) -> dict[str, Any]:
        if self._credentials is None:
            raise NoCredentialsError()
        frozen = self._credentials.get_frozen_credentials()  # refreshes when due
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.datetime.now(datetime.UTC) + CREDENTIALS_TTL,
        }


class NativeEngine:
    """Small GETs and single PUTs of one bucket through obstore.  Thread-safe."""

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None,
        region: str,
        credentials: BotocoreCredentials,
        connect_timeout: float,
        read_timeout: float,
        upload_read_timeout: float,
        on_request: RequestHook,
        translate_error: ErrorTranslator,
        unsigned_payload: bool = False,
    ) -> None:
        """``unsigned_payload``: PUTs send ``UNSIGNED-PAYLOAD`` instead of
        the body's SHA-256 (for a caller that checks its objects itself:
        the shared tier's blocks carry their xxh3)."""
        self._credentials = credentials
        self._unsigned_payload = unsigned_payload
        self._on_request = on_request
        self._translate = translate_error
        self._get_store = self._make_store(
            bucket, endpoint_url, region, connect_timeout, read_timeout, GET_TOTAL_TIMEOUT
        )
        self._put_store = self._make_store(
            bucket, endpoint_url, region, connect_timeout, upload_read_timeout, PUT_TOTAL_TIMEOUT
        )

    def _make_store(
        self,
        bucket: str,
        endpoint_url: str | None,
        region: str,
        connect_timeout: float,
        read_timeout: float,
        total_timeout: datetime.timedelta,
    ) -> ObstoreS3Store:
        config: dict[str, Any] = {
            "region": region,
            "unsigned_payload": self._unsigned_payload,
            "skip_signature": False,
        }
        if endpoint_url:
            config["endpoint"] = endpoint_url
            config["virtual_hosted_style_request"] = False
        else:
            config["virtual_hosted_style_request"] = True
        client_options: dict[str, Any] = {
            "allow_http": bool(endpoint_url and endpoint_url.startswith("http://")),
            "connect_timeout": datetime.timedelta(seconds=connect_timeout),
            "read_timeout": datetime.timedelta(seconds=read_timeout),
            "timeout": total_timeout,
            "user_agent": "tierfs",
        }
        retry_config: dict[str, Any] = {
            "max_retries": 0,
            "retry_timeout": datetime.timedelta(milliseconds=1),
            "backoff": {
                "init_backoff": datetime.timedelta(milliseconds=1),
                "max_backoff": datetime.timedelta(milliseconds=1),
                "base": 2,
            },
        }
        return ObstoreS3Store(
            bucket,
            config=config,  # type: ignore[arg-type]
            client_options=client_options,  # type: ignore[arg-type]
            retry_config=retry_config,  # type: ignore[arg-type]
            credential_provider=self._credentials,  # type: ignore[arg-type]
        )

    def _request(self, operation: str, send: Callable[[], Any]) -> Any:
        """One request: reported to ``on_request``; a failure raised translated."""
        if not self._credentials.available:
            raise NoCredentialsError()
        started = time.perf_counter()
        try:
            result = send()
        except Exception as exc:
            translated = self._translate(exc, operation)
            status = _status_of(translated)
            self._on_request(operation, time.perf_counter() - started, status)
            if translated is exc:
                raise
            raise translated from exc
        self._on_request(operation, time.perf_counter() - started, 200)
        return result

    def get(
        self, full_key: str, start: int, length: int, etag: str | None, version: str | None = None
    ) -> Any:
        """GetObject of bytes ``[start, start + length)``, If-Match ``etag`` if
        given, of the version ``version`` if given.

        Returns ``(body, object_size)`` where ``body`` is a buffer (obstore
        ``Bytes``) of at most ``length`` bytes: fewer when the object ends
        first.  Raises the botocore equivalent of any failure (a start past
        the end is a 416 ClientError).
        """
        options: dict[str, Any] = {"range": (start, start + length)}
        if etag:
            options["if_match"] = f'"{etag}"'
        if version:
            options["version"] = version

        def send() -> tuple[Any, int]:
            result = obstore.get(self._get_store, full_key, options=options)  # type: ignore[arg-type]
            body = result.bytes()
            return body, int(result.meta["size"])

        return self._request("GetObject", send)

    def put(
        self, full_key: str, data: bytes, metadata: Mapping[str, str], *, create: bool = False
    ) -> str:
        """PutObject of ``data`` with user ``metadata``; returns the raw ETag.
        ``create``: only if no object is there (``If-None-Match: *``; a 412
        ClientError otherwise)."""

        def send() -> str:
            result = obstore.put(
                self._put_store,
                full_key,
                data,
                attributes=dict(metadata),  # type: ignore[arg-type]
                use_multipart=False,
                mode="create" if create else None,
            )
            return str(result.get("e_tag") or "")

        return str(self._request("PutObject", send))


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None
