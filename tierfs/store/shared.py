"""The shared tier's bucket: blocks kept on an S3-compatible cluster near
the nodes, for every node.

``SharedBucket`` is a small client of that bucket, separate from the
backing's ``S3Store`` on purpose: its own connection pool, short timeouts
(the tier's ``timeout`` to connect and between bytes, one attempt, no
retries) and its own circuit breaker.  A shared tier that is slow or gone
must cost a read at most one short timeout, after which the breaker sends
every request straight to the bucket until a probe gets an answer again
(``tierfs.store.breaker``).  Nothing here retries: a block the shared tier
cannot give is read from the bucket, which is always right.

What it stores is decided by ``tierfs.core.read.sharedtier``: one object
per block, whose key names the backing object, its ETag and the block, and
whose last 8 bytes are the block's xxh3.  This module only moves bytes:
``get``, ``put``,
``put_if_absent`` (a PUT with ``If-None-Match: *``: exactly one of many
racing nodes creates the object; a node's claim of a block), ``delete``
(a claim given up) and ``age``
(how long ago an object was written, by the cluster's own clock: the
``Date`` of the answer minus the object's ``Last-Modified``, so the
nodes' clocks do not matter).

GETs and PUTs of blocks, and claims (a PUT with ``If-None-Match: *``), go
through obstore (``tierfs.store.s3_fast``), whose errors are translated to
botocore's, so the breaker and the error handling are the same for both
engines: measured on a loopback SeaweedFS, 2,000 GETs of 256 KiB cost the
client 1.2-1.5 CPU s through obstore against 5.4-5.7 s through botocore
(wall 2.6-3.0 s against 6.7-6.9 s, 8 threads).  HEADs stay on botocore
(``age`` needs the answer's ``Date`` header, which obstore does not give),
and so do the deletes and the check's probe.

Thread-safe: the fetch threads call it concurrently.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import boto3
import botocore.exceptions

from tierfs.errors import SharedTierUnusable, StoreError, StoreUnavailable

from .breaker import CircuitBreaker
from .s3 import botocore_equivalent, client_config, parse_s3_url
from .s3_fast import BotocoreCredentials, NativeEngine, native_key_ok

if TYPE_CHECKING:
    from tierfs.config import SharedTierConfig

log = logging.getLogger(__name__)

#: Connections kept to the shared tier (as many as fetches may run).
MAX_CONNECTIONS = 64
#: Seconds the two racing probe claims of ``check`` wait for each other.
CHECK_TIMEOUT = 10.0


_TRANSPORT_ERRORS = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    # A body shorter than its Content-Length (the connection closed early).
    botocore.exceptions.IncompleteReadError,
)


class SharedBucket:
    """Blocks in the shared tier's bucket (see the module docstring)."""

    def __init__(self, config: SharedTierConfig) -> None:
        """Does no I/O: a node mounts, and reads from the bucket, while its
        shared tier is away."""
        self.url = config.url
        self.bucket, self.prefix = parse_s3_url(config.url)
        session = boto3.session.Session(profile_name=config.profile)
        self._client: Any = session.client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            config=client_config(
                connect_timeout=config.timeout,
                read_timeout=config.timeout,
                max_pool_connections=MAX_CONNECTIONS,
                endpoint_url=config.endpoint_url,
                user_agent="tierfs-shared",
            ),
        )
        self.endpoint = config.endpoint_url or config.url
        self.breaker = CircuitBreaker(self.endpoint, self._probe)
        #: GETs and PUTs of blocks: obstore (a tenth of botocore's client
        #: CPU per request; see the module docstring).  None: a prefix that
        #: obstore would rewrite, so botocore sends them.
        self._native: NativeEngine | None = None
        if native_key_ok(self.prefix + "blocks/0"):
            self._native = NativeEngine(
                bucket=self.bucket,
                endpoint_url=config.endpoint_url,
                region=str(self._client.meta.region_name or "us-east-1"),
                credentials=BotocoreCredentials(session.get_credentials()),
                connect_timeout=config.timeout,
                read_timeout=config.timeout,
                upload_read_timeout=config.timeout,
                on_request=_ignore_request,
                translate_error=lambda exc, op: botocore_equivalent(exc, op, self.endpoint),
                unsigned_payload=True,  # each block carries its xxh3, checked on every read
            )

    def close(self) -> None:
        self.breaker.close()

    def _probe(self) -> None:
        self._client.head_bucket(Bucket=self.bucket)

    def check(self) -> None:
        """Does the tier answer, may these credentials read and write it,
        and does it honour ``If-None-Match: *`` (the claims that let one
        node fetch each block for all)?  Two conditional PUTs of one new
        probe key race, from two threads: exactly one may win, and a third
        after them must lose.  ``StoreUnavailable`` if the tier does not
        answer; ``SharedTierUnusable`` naming what is wrong otherwise.
        The probe objects are deleted afterwards where the credentials
        allow (a few bytes each, under ``probe/``)."""
        where = f"shared tier {self.url} at {self.endpoint}"
        probe = f"probe/{uuid.uuid4().hex}"
        answered = False
        try:
            self._client.head_bucket(Bucket=self.bucket)
            answered = True
            self._client.put_object(Bucket=self.bucket, Key=f"{self.prefix}{probe}/w", Body=b"w")
            got = self._client.get_object(Bucket=self.bucket, Key=f"{self.prefix}{probe}/w")
            got["Body"].read()
            claim = f"{self.prefix}{probe}/claim"
            start = threading.Barrier(2)

            def race() -> bool:
                start.wait(CHECK_TIMEOUT)
                return self._put_once(claim)

            with ThreadPoolExecutor(2) as pool:
                winners = sum(pool.map(lambda _i: race(), range(2)))
            late = self._put_once(claim)
        except botocore.exceptions.ClientError as exc:
            code = _code(exc)
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise SharedTierUnusable(
                    f"{where}: access denied ({code}): its credentials must list the bucket "
                    "and read, write and conditionally write objects under its prefix"
                ) from None
            if code in ("NoSuchBucket", "404"):
                raise SharedTierUnusable(f"{where}: no such bucket {self.bucket!r}") from None
            raise SharedTierUnusable(f"{where}: {code}: {exc}") from None
        except _TRANSPORT_ERRORS as exc:
            raise StoreUnavailable(f"{where} does not answer: {exc}") from None
        finally:
            if answered:
                self._delete_quietly(f"{self.prefix}{probe}/w", f"{self.prefix}{probe}/claim")
        if winners != 1 or late:
            raise SharedTierUnusable(
                f"{where} does not honour If-None-Match: * on PUT ({winners} of 2 racing "
                f"conditional PUTs of one new key succeeded, and a third after them "
                f"{'also did' if late else 'did not'}): the shared tier needs it so that one "
                "node fetches each block for all (S3's conditional writes); use a store that "
                "has them, or remove the [[tiers]] entry with url"
            )

    def _put_once(self, key: str) -> bool:
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=b"c", IfNoneMatch="*")
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _ALREADY_THERE:
                return False
            raise
        return True

    def _delete_quietly(self, *keys: str) -> None:
        for key in keys:
            with contextlib.suppress(
                botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError
            ):
                self._client.delete_object(Bucket=self.bucket, Key=key)

    def _call(self, op: str, key: str, **kwargs: Any) -> Any:
        """One botocore request, through the breaker (``_send``)."""
        return self._send(
            op,
            key,
            lambda: getattr(self._client, op)(Bucket=self.bucket, Key=self.prefix + key, **kwargs),
        )

    def _send(self, op: str, key: str, send: Callable[[], Any]) -> Any:
        """One request, through the breaker; StoreUnavailable when the
        shared tier gave no answer (or the breaker is open).  ``send``
        raises botocore's exceptions (the native engine's are translated)."""
        self.breaker.before_attempt(op, key)
        try:
            result = send()
        except botocore.exceptions.ClientError:
            self.breaker.record_success()  # an answer: the tier is there
            raise
        except _TRANSPORT_ERRORS as exc:
            timed_out = isinstance(
                exc,
                (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError),
            )
            self.breaker.record_failure(type(exc).__name__, timed_out=timed_out)
            raise StoreUnavailable(f"shared tier {self.endpoint}: {exc}") from exc
        self.breaker.record_success()
        return result

    def get(self, key: str, size: int) -> bytes | memoryview | None:
        """The object's bytes (at most ``size``: a longer object is cut, and
        its caller finds it damaged); None if there is none.  Raises
        StoreError when the tier cannot answer."""
        try:
            if self._native is not None:
                native = self._native
                body, _whole = self._send(
                    "get_object", key, lambda: native.get(self.prefix + key, 0, size, None)
                )
                return memoryview(body)
            # The body is read inside the request: one that breaks off after
            # its headers is a failure the breaker is told of.
            data: bytes = self._send(
                "get_object",
                key,
                lambda: self._client.get_object(
                    Bucket=self.bucket, Key=self.prefix + key, Range=f"bytes=0-{size - 1}"
                )["Body"].read(),
            )
            return data
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _NOT_THERE:
                return None
            raise StoreError(f"shared tier GET {key}: {_code(exc)}") from exc

    def put(self, key: str, data: bytes) -> None:
        try:
            self._put(key, data, create=False)
        except botocore.exceptions.ClientError as exc:
            raise StoreError(f"shared tier PUT {key}: {_code(exc)}") from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` unless an object is there (``If-None-Match: *``):
        True for the one caller that created it, False if it was there."""
        try:
            self._put(key, data, create=True)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _ALREADY_THERE:
                return False
            raise StoreError(f"shared tier conditional PUT {key}: {_code(exc)}") from exc
        return True

    def _put(self, key: str, data: bytes, *, create: bool) -> None:
        """One PUT through the native engine when there is one, else
        botocore; ``create``: with ``If-None-Match: *``."""
        native = self._native
        if native is not None:
            self._send(
                "put_object", key, lambda: native.put(self.prefix + key, data, {}, create=create)
            )
        elif create:
            self._call("put_object", key, Body=data, IfNoneMatch="*")
        else:
            self._call("put_object", key, Body=data)

    def delete(self, key: str) -> None:
        """Remove ``key`` (a claim given up); no error if it is not there."""
        try:
            self._call("delete_object", key)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) not in _NOT_THERE:
                raise StoreError(f"shared tier DELETE {key}: {_code(exc)}") from exc

    def age(self, key: str) -> float | None:
        """Seconds since ``key`` was written, by the cluster's clock; None if
        there is no such object."""
        try:
            answer = self._call("head_object", key)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _NOT_THERE:
                return None
            raise StoreError(f"shared tier HEAD {key}: {_code(exc)}") from exc
        written = answer.get("LastModified")
        sent = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if written is None or not sent:
            return 0.0  # no clock to tell by: taken as just written
        try:
            now = email.utils.parsedate_to_datetime(sent)
        except (TypeError, ValueError):
            return 0.0
        return max(0.0, (now - written).total_seconds())


#: Error codes of a GET or HEAD of a key that is not there.
_NOT_THERE = ("NoSuchKey", "404", "NotFound")
#: Error codes of a conditional PUT that found the object there (S3 says
#: 412 PreconditionFailed; 409 ConditionalRequestConflict while another
#: conditional PUT of the key is in flight).
_ALREADY_THERE = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")


def _ignore_request(_operation: str, _seconds: float, _status: int | None) -> None:
    """The shared tier's requests are counted by ``SharedTier``, not per request."""


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "unknown"))
