"""The shared tier in the read path: blocks one node fetched, for every node.

A shared tier is a bucket on an S3-compatible cluster near the nodes
(``tierfs.store.shared.SharedBucket``).  It plugs into the fetcher's one
seam for where a block comes from: ``SharedOrigin`` is an ``Origin`` that
asks the shared tier for each block of a fetch before the bucket.

Layout: one immutable object per block::

    <prefix>blocks/<xxh3-128 of backing URL and key>/<ETag>/<block size>/<block no>

The key names the backing object (by a hash of its URL and key: keys may
be 1,024 bytes long), its ETag and the block, so a changed object can
never be served a stale shared block, and no node ever lists the shared
tier.  Each block object carries its xxh3 (user metadata ``xxh3``, hex),
returned with the GET: a block whose length or checksum is wrong is
ignored (counted as ``corrupt``), read from the bucket and put again.

Per fetch (``SharedOrigin.get_range_into``, in a fetch thread), for the
blocks in order:

    in the shared tier, right length and checksum --> served from it (hit)
    first block that is not (absent, wrong, the tier fails) -->
        that block and every later one of the run from the bucket, with one
        ranged GET; each block received whole is then put into the shared
        tier by a background thread (never on the reader's path)

A fetch without a known ETag (the object is being renamed in the journal)
skips the shared tier.  The shared tier never fails a read the bucket can
serve: any error of it is a miss (counted as ``errors``), its requests
have short timeouts and its own circuit breaker (``SharedBucket``).

Puts waiting for the background thread hold their bytes: at most
``PUT_BACKLOG_BYTES``; a put beyond is dropped (``puts_dropped``), the next
node that misses the block puts it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import xxhash

from tierfs.errors import StoreError
from tierfs.store import ObjectStore

from .digests import block_digest
from .fetcher import Origin, RangedGet

if TYPE_CHECKING:
    from tierfs.store.shared import SharedBucket

log = logging.getLogger(__name__)

#: Bytes of blocks waiting to be put into the shared tier, at most.
PUT_BACKLOG_BYTES = 256 * 1024 * 1024
#: Threads putting blocks into the shared tier.
PUT_THREADS = 4
#: The user-metadata name of a block's checksum.
CHECKSUM_META = "xxh3"

_ETAG_SAFE = re.compile(r"[A-Za-z0-9-]{1,128}")


#: The figures ``SharedTier.stats`` counts (``tierfs status``, metrics):
#: blocks served (``hits``), absent (``misses``), ignored for a wrong length
#: or checksum (``corrupt``), failed requests (``errors``), bytes read and
#: put, puts done, failed and dropped, and the bytes of fetches the bucket
#: served while a shared tier was configured (``bucket_bytes``).
STAT_NAMES = (
    "hits",
    "misses",
    "corrupt",
    "errors",
    "bytes_read",
    "bytes_put",
    "puts",
    "puts_failed",
    "puts_dropped",
    "bucket_bytes",
)


class SharedTier:
    """Block objects in the shared tier (see the module docstring)."""

    def __init__(self, name: str, bucket: SharedBucket, backing_url: str, block_size: int) -> None:
        self.name = name
        self.bucket = bucket
        self.backing_url = backing_url
        self.block_size = block_size
        #: Counts of ``STAT_NAMES`` (updated from the fetch and put threads).
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._backlog = 0
        self._puts = ThreadPoolExecutor(PUT_THREADS, thread_name_prefix="tierfs-shared-put")

    def close(self) -> None:
        self._puts.shutdown(wait=False, cancel_futures=True)
        self.bucket.close()

    def block_key(self, key: str, etag: str, blockno: int) -> str | None:
        """The shared object of block ``blockno`` of ``key`` at ``etag``;
        None when the ETag is not known (nothing shared then)."""
        if not etag:
            return None
        name = xxhash.xxh3_128_hexdigest(f"{self.backing_url}\0{key}".encode())
        tag = etag if _ETAG_SAFE.fullmatch(etag) else xxhash.xxh3_64_hexdigest(etag.encode())
        return f"blocks/{name}/{tag}/{self.block_size}/{blockno}"

    def read_block(self, shared_key: str, into: memoryview) -> bool:
        """Thread: the block into ``into`` (its length is the block's);
        False if the shared tier does not hold it whole and right."""
        try:
            found = self.bucket.get(shared_key)
        except StoreError as exc:
            self.count(errors=1)
            log.debug("shared tier: %s: %s", shared_key, exc)
            return False
        if found is None:
            self.count(misses=1)
            return False
        data, metadata = found
        if len(data) != len(into) or metadata.get(CHECKSUM_META) != f"{block_digest(data):016x}":
            self.count(corrupt=1)
            log.warning("shared tier: block %s is damaged; reading it from the bucket", shared_key)
            return False
        into[:] = data
        self.count(hits=1, bytes_read=len(data))
        return True

    def put_later(self, shared_key: str, data: bytes) -> None:
        """Thread: put the block into the shared tier in the background."""
        with self._lock:
            if self._backlog + len(data) > PUT_BACKLOG_BYTES:
                self.stats["puts_dropped"] += 1
                return
            self._backlog += len(data)
        try:
            self._puts.submit(self._put, shared_key, data)
        except RuntimeError:  # shut down
            with self._lock:
                self._backlog -= len(data)

    def _put(self, shared_key: str, data: bytes) -> None:
        try:
            self.bucket.put(shared_key, data, {CHECKSUM_META: f"{block_digest(data):016x}"})
        except Exception as exc:
            self.count(puts_failed=1)
            log.debug("shared tier: putting %s failed: %s", shared_key, exc)
        else:
            self.count(puts=1, bytes_put=len(data))
        finally:
            with self._lock:
                self._backlog -= len(data)

    def count(self, **deltas: int) -> None:
        with self._lock:
            self.stats.update(deltas)

    def status(self) -> dict[str, object]:
        with self._lock:
            figures = {name: self.stats[name] for name in STAT_NAMES}
        snapshot = self.bucket.breaker.snapshot()
        return {
            "name": self.name,
            "url": self.bucket.url,
            "endpoint": snapshot.as_dict(),
            **figures,
        }


class SharedOrigin(Origin):
    """An ``Origin`` that serves blocks from the shared tier before the
    bucket, and puts what the bucket served into it (module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        moving_from: Callable[[int], str | None],
        shared: SharedTier,
    ) -> None:
        super().__init__(store, moving_from)
        self.shared = shared

    def get_range_into(
        self, get: RangedGet, views: list[memoryview], stop: Callable[[], bool] | None
    ) -> int:
        shared = self.shared
        block_size = shared.block_size
        if not get.etag or get.offset % block_size:
            got = super().get_range_into(get, views, stop)
            shared.count(bucket_bytes=got)
            return got
        first = get.offset // block_size
        served = 0
        index = 0
        for index, view in enumerate(views):
            if not view:
                continue
            shared_key = shared.block_key(get.key, get.etag, first + index)
            if shared_key is None or not shared.read_block(shared_key, view):
                break
            served += len(view)
        else:
            return served
        rest = views[index:]
        tail = dataclasses.replace(get, offset=get.offset + served)
        got = super().get_range_into(tail, rest, stop)
        shared.count(bucket_bytes=got)
        left = got
        for number, view in enumerate(rest, start=first + index):
            if left < len(view) or not view:
                break
            left -= len(view)
            shared_key = shared.block_key(get.key, get.etag, number)
            if shared_key is not None:
                shared.put_later(shared_key, bytes(view))
        return served + got
