"""The shared tier in the read path: blocks one node fetched, for every node.

A shared tier is a bucket on an S3-compatible cluster near the nodes
(``tierfs.store.shared.SharedBucket``).  It plugs into the fetcher's one
seam for where a block comes from: ``SharedOrigin`` is an ``Origin`` that
asks the shared tier for each block of a fetch before the bucket.

Layout: one immutable object per block::

    <prefix>blocks/<xxh3-128 of the object's URL, backing URL/key>/<ETag>/<block size>/<block no>

The key names the backing object (by a hash of its URL and key: keys may
be 1,024 bytes long), its ETag and the block, so a changed object can
never be served a stale shared block, and no node ever lists the shared
tier.  Each block object is the block's bytes followed by their xxh3 (8
bytes, ``TRAILER``), so one GET through any S3 engine brings both (user
metadata would need botocore's slower client, see ``SharedBucket``): a
block whose length or checksum is wrong is ignored (counted as
``corrupt``), read from the bucket and put again.

Per fetch (``SharedOrigin.get_range_into``, in a fetch thread), for the
blocks in order; a block is first *asked for* (GET), and once one was
absent, the next ones are *claimed* first (the run is probably cold):

    asked, in the shared tier, right length and checksum --> served (hit)
    asked, absent --> claimed (a PUT of ``claims/<block key>`` with
        If-None-Match: *; exactly one node creates it):
      won   --> this node fetches it; the next blocks it wins join one
                ranged GET of the bucket, and each block of it is put into
                the shared tier at once by a background thread
      held  --> another node fetches it: ``wait_for`` polls the block (``FIRST_POLL``
                growing to ``LAST_POLL``, jittered) and serves it when it appears;
                from the bucket instead after ``CLAIM_WAIT`` (4 s, under
                the 5 s foreground budget), or at once if the claim is older
                than ``CLAIM_STALE`` (60 s, by the cluster's clock: its node
                died or gave up)
    damaged, or the tier fails --> that block and the rest of the run from
        the bucket with one ranged GET, put in the background

So when many nodes read the same cold blocks at once (a checkpoint at a
job's start), each block is fetched from the bucket by about one node, and
the others read it from the shared tier a moment later.  A duplicate fetch
(a slow claimer, a stale claim) costs bucket bytes, never correctness: a
block is only ever served after its length and xxh3 were checked, and a
block's key names the object's ETag.  Claims are never deleted (the tier's
own expiry removes them with the blocks); a node never waits on one that
is older than ``CLAIM_STALE``.

A fetch without a known ETag (the object is being renamed in the journal)
skips the shared tier.  The shared tier never fails a read the bucket can
serve: any error of it is a miss (counted as ``errors``), its requests
have short timeouts and its own circuit breaker (``SharedBucket``).

Puts waiting for the background thread hold their bytes: at most
``PUT_BACKLOG_BYTES`` of unclaimed blocks; a put beyond is dropped
(``puts_dropped``), the next node that misses the block puts it.  Claimed
blocks are always queued (other nodes wait for them); their bytes are
bounded by the fetches in flight.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import random
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import trio
import xxhash

from tierfs.config.values import join_backing_url
from tierfs.errors import StoreError
from tierfs.meta import Inode
from tierfs.store import ObjectStore
from tierfs.store.shared import SharedTierUnusable

from ..state.digests import block_digest
from .fetcher import BACKGROUND_TRICKLE_BYTES, FETCH_RUN_BYTES, Origin, RangedGet

if TYPE_CHECKING:
    from tierfs.store.shared import SharedBucket

log = logging.getLogger(__name__)

#: Bytes of blocks waiting to be put into the shared tier, at most.
PUT_BACKLOG_BYTES = 256 * 1024 * 1024
#: Threads putting blocks into the shared tier.
PUT_THREADS = 4
#: Each block object ends with the block's xxh3 (64 bits, little-endian).
TRAILER = struct.Struct("<Q")

#: Claims are kept beside the blocks: ``<prefix>claims/blocks/...``.
CLAIMS = "claims/"
#: A node waits this long, at most, for a block another node claimed, then
#: fetches it from the bucket itself (under the foreground budget of 5 s).
CLAIM_WAIT = 4.0
#: A claim older than this is taken as dead (its node died or gave up): the
#: block is fetched from the bucket at once, without waiting.
CLAIM_STALE = 60.0
#: Seconds between two checks of a shared tier that did not answer at mount.
CHECK_INTERVAL = 30.0
#: The first and the longest pause before a poll of a claimed block.
FIRST_POLL = 0.02
LAST_POLL = 0.2
#: The poll after which the claim's age is checked (a HEAD): most claimed
#: blocks arrive before it (measured: a wave of 4 mounts needed 1-2 polls).
STALE_CHECK_POLL = 3

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
    "claims",
    "claims_held",
    "claims_stale",
    "waits",
    "wait_timeouts",
    "files_shared",
    "share_skipped",
)


class Lookup(enum.Enum):
    """What the shared tier said of a block (``SharedTier.read_block``)."""

    HIT = "hit"
    MISS = "miss"
    DAMAGED = "damaged"
    FAILED = "failed"


class Claim(enum.Enum):
    """The outcome of claiming a block (``SharedTier.claim``)."""

    WON = "won"
    HELD = "held"
    FAILED = "failed"


class SharedTier:
    """Block objects in the shared tier (see the module docstring)."""

    def __init__(
        self, name: str, bucket: SharedBucket, backing_url: str, block_size: int, node: str = ""
    ) -> None:
        """``node``: this node's name, written into its claims (for people
        looking into the shared tier)."""
        self.name = name
        self.node = node
        self.bucket = bucket
        self.backing_url = backing_url
        self.block_size = block_size
        #: Counts of ``STAT_NAMES`` (updated from the fetch and put threads).
        self.stats: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._backlog = 0
        self._puts = ThreadPoolExecutor(PUT_THREADS, thread_name_prefix="tierfs-shared-put")
        #: Why claims are off (``check``: the store has no conditional PUT);
        #: None while they are on.  Off, every node that misses a block
        #: fetches and puts it itself: correct, but no fetch-once.
        self.fan_out_off: str | None = None
        #: Has ``check`` had an answer from the tier (it was checked)?
        self.checked = False

    def close(self) -> None:
        self._puts.shutdown(wait=False, cancel_futures=True)
        self.bucket.close()

    def block_key(self, key: str, etag: str, blockno: int) -> str | None:
        """The shared object of block ``blockno`` of ``key`` at ``etag``;
        None when the ETag is not known (nothing shared then)."""
        if not etag:
            return None
        # The object's full location (an access point's URL names a directory
        # of the bucket and its keys are below it: the same object, the same name).
        name = xxhash.xxh3_128_hexdigest(join_backing_url(self.backing_url, key).encode())
        tag = etag if _ETAG_SAFE.fullmatch(etag) else xxhash.xxh3_64_hexdigest(etag.encode())
        return f"blocks/{name}/{tag}/{self.block_size}/{blockno}"

    def read_block(self, shared_key: str, into: memoryview) -> Lookup:
        """Thread: the block into ``into`` (its length is the block's) if
        the shared tier holds it whole and right."""
        try:
            found = self.bucket.get(shared_key, len(into) + TRAILER.size)
        except StoreError as exc:
            self.count(errors=1)
            log.debug("shared tier: %s: %s", shared_key, exc)
            return Lookup.FAILED
        if found is None:
            self.count(misses=1)
            return Lookup.MISS
        body = memoryview(found)
        data = body[: len(into)]
        if len(body) != len(into) + TRAILER.size or (
            TRAILER.unpack(body[len(into) :])[0] != block_digest(data)
        ):
            self.count(corrupt=1)
            log.warning("shared tier: block %s is damaged; reading it from the bucket", shared_key)
            return Lookup.DAMAGED
        into[:] = data
        self.count(hits=1, bytes_read=len(data))
        return Lookup.HIT

    def claim(self, shared_key: str) -> Claim:
        """Thread: claim the block before fetching it from the bucket.  WON:
        this node fetches and puts it; HELD: another node claimed it
        (``wait_for`` it); FAILED: the tier did not answer."""
        if self.fan_out_off is not None:
            return Claim.WON  # no claims: each node fetches what it misses
        try:
            won = self.bucket.put_if_absent(CLAIMS + shared_key, self.node.encode())
        except StoreError as exc:
            self.count(errors=1)
            log.debug("shared tier: claim of %s: %s", shared_key, exc)
            return Claim.FAILED
        self.count(**{"claims" if won else "claims_held": 1})
        return Claim.WON if won else Claim.HELD

    def holds(self, shared_key: str) -> bool:
        """Thread: is the block in the shared tier (a HEAD; not checked)?
        Raises StoreError when the tier does not answer."""
        return self.bucket.age(shared_key) is not None

    def claim_is_stale(self, shared_key: str) -> bool:
        """Thread: is the claim of the block gone or older than
        ``CLAIM_STALE`` (its node died or gave up)?"""
        age = self.bucket.age(CLAIMS + shared_key)
        if age is None or age > CLAIM_STALE:
            self.count(claims_stale=1)
            return True
        return False

    def wait_for(
        self, shared_key: str, into: memoryview, stop: Callable[[], bool] | None = None
    ) -> bool:
        """Thread: wait for a block another node claimed, polling with
        growing, jittered pauses, and read it into ``into``.  False, to
        fetch it from the bucket instead, once ``CLAIM_WAIT`` passed, when
        the claim is older than ``CLAIM_STALE`` (its node died or gave up),
        when the block is damaged or the tier fails, or when ``stop`` says
        to give way."""
        deadline = time.monotonic() + CLAIM_WAIT
        pause = FIRST_POLL
        polls = 0
        while True:
            # The claimer has just begun its GET of the bucket: pause first.
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop()):
                self.count(wait_timeouts=1)
                return False
            time.sleep(min(left, pause * random.uniform(0.5, 1.5)))
            pause = min(pause * 2, LAST_POLL)
            found = self.read_block(shared_key, into)
            if found is Lookup.HIT:
                self.count(waits=1)
                return True
            if found is not Lookup.MISS:
                return False
            polls += 1
            if polls == STALE_CHECK_POLL:  # still not there: is the claim alive?
                try:
                    if self.claim_is_stale(shared_key):
                        return False
                except StoreError:
                    self.count(errors=1)
                    return False

    def put_later(self, shared_key: str, data: bytes, *, claimed: bool = False) -> None:
        """Thread: put the block into the shared tier in the background.
        A block this node ``claimed`` is always queued (other nodes wait for
        it); another is dropped when the backlog is full."""
        with self._lock:
            if not claimed and self._backlog + len(data) > PUT_BACKLOG_BYTES:
                self.stats["puts_dropped"] += 1
                return
            self._backlog += len(data)
        try:
            self._puts.submit(self._put_queued, shared_key, data)
        except RuntimeError:  # shut down
            with self._lock:
                self._backlog -= len(data)

    def _put_queued(self, shared_key: str, data: bytes) -> None:
        try:
            self.put_now(shared_key, data)
        finally:
            with self._lock:
                self._backlog -= len(data)

    def put_each(self, blocks: Iterator[tuple[str, bytes]]) -> int:
        """Thread: put every (key, bytes) of ``blocks``, ``PUT_THREADS`` at
        a time (at most twice that many held in memory); how many were put.
        Not from a put thread."""
        running: collections.deque[Future[bool]] = collections.deque()
        done: list[bool] = []

        def wait_oldest() -> None:
            try:
                done.append(running.popleft().result())
            except CancelledError:  # shut down: the mount is going away
                done.append(False)

        try:
            for shared_key, data in blocks:
                if len(running) >= 2 * PUT_THREADS:
                    wait_oldest()
                try:
                    running.append(self._puts.submit(self.put_now, shared_key, data))
                except RuntimeError:  # shut down: the mount is going away
                    break
        finally:
            while running:
                wait_oldest()
        return sum(done)

    def put_now(self, shared_key: str, data: bytes) -> bool:
        """Thread: put the block into the shared tier now, with its xxh3;
        False if that failed (counted, never raised: a cache fill)."""
        try:
            self.bucket.put(shared_key, data + TRAILER.pack(block_digest(data)))
        except Exception as exc:
            self.count(puts_failed=1)
            log.debug("shared tier: putting %s failed: %s", shared_key, exc)
            return False
        self.count(puts=1, bytes_put=len(data))
        return True

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
            "fan_out": "on" if self.fan_out_off is None else f"OFF: {self.fan_out_off}",
            "checked": self.checked,
            **figures,
        }

    def check(self) -> bool:
        """Thread: ``SharedBucket.check``.  True once the tier answered
        (and claims are turned off if it has no conditional PUT, loudly);
        False while it does not answer."""
        try:
            self.bucket.check()
        except SharedTierUnusable as exc:
            self.fan_out_off = str(exc)
            log.error(
                "%s; the shared tier runs without fan-out: every node fetches what it misses", exc
            )
        except StoreError as exc:
            log.debug("shared tier check: %s", exc)
            return False
        self.checked = True
        return True

    async def check_until_answered(self, interval: float = CHECK_INTERVAL) -> None:
        """Check the tier (``check``) until it answers: for a node that
        mounted while its shared tier was away."""
        while not await trio.to_thread.run_sync(self.check):
            await trio.sleep(interval)


@dataclasses.dataclass(frozen=True, slots=True)
class WarmPace:
    """How ``SharedOrigin.warm`` shares the fetch slots with demand reads
    (called from its thread): ``take`` a BACKGROUND slot for one GET and
    learn whether demand is active (the GET is then a short one), ``give``
    it back; ``stop``: a GET gives way between two blocks."""

    take: Callable[[], tuple[object, bool]]
    give: Callable[[object], None]
    stop: Callable[[], bool]


class SharedOrigin(Origin):
    """An ``Origin`` that serves blocks from the shared tier before the
    bucket, claims the blocks it fetches from the bucket, waits for blocks
    another node claimed, and puts what the bucket served into the shared
    tier (module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        moving_from: Callable[[int], str | None],
        shared: SharedTier,
        shares: Callable[[int], bool] = lambda _ino: True,
    ) -> None:
        """``shares(ino)``: may the file's blocks be read from and put into
        the shared tier (no ``share = false`` rule over it)?"""
        super().__init__(store, moving_from)
        self.shared = shared
        self._shares = shares

    def shares(self, inode: Inode) -> bool:
        return self._shares(inode.ino)

    def get_range_into(
        self, get: RangedGet, views: list[memoryview], stop: Callable[[], bool] | None
    ) -> int:
        shared = self.shared
        count = sum(1 for view in views if view)  # empty views: past the origin's end
        if not get.shared:  # a share = false subtree: the bucket only, nothing put
            return Origin.get_range_into(self, get, views, stop)
        if not get.etag or get.offset % shared.block_size:
            return self._from_bucket(get, views, 0, count, stop)
        served = 0
        mine: int | None = None  # first block of the run this node claimed
        cold = False  # a block was absent: claim the next ones before asking for them
        index = 0
        while index < count:
            if stop is not None and index and stop():
                break  # give way; blocks claimed are fetched all the same
            shared_key = self._key(get, index)
            if not cold:
                found = shared.read_block(shared_key, views[index])
                if found is Lookup.HIT:
                    served += len(views[index])
                    index += 1
                    continue
                if found is not Lookup.MISS:
                    return served + self._rest(get, views, mine, index, count, stop)
                cold = True
            claim = shared.claim(shared_key)
            if claim is Claim.WON:
                mine = index if mine is None else mine
                index += 1
                continue
            if claim is Claim.FAILED:
                return served + self._rest(get, views, mine, index, count, stop)
            if mine is not None:  # another node's block ends this node's run
                got = self._from_bucket(get, views, mine, index, None, claimed=index)
                served += got
                if got < sum(len(view) for view in views[mine:index]):
                    return served
                mine = None
            if not shared.wait_for(shared_key, views[index], stop):
                return served + self._rest(get, views, mine, index, count, stop)
            served += len(views[index])
            index += 1
        if mine is not None:
            served += self._from_bucket(get, views, mine, index, None, claimed=index)
        return served

    def _key(self, get: RangedGet, index: int) -> str:
        key = self.shared.block_key(get.key, get.etag, get.offset // self.shared.block_size + index)
        assert key is not None  # the ETag is known
        return key

    def _rest(
        self,
        get: RangedGet,
        views: list[memoryview],
        mine: int | None,
        index: int,
        count: int,
        stop: Callable[[], bool] | None,
    ) -> int:
        """The blocks from this node's claimed run (or ``index``) to the
        end, from the bucket: the shared tier cannot give ``index``."""
        if mine is None:
            return self._from_bucket(get, views, index, count, stop)
        return self._from_bucket(get, views, mine, count, stop, claimed=index)

    def _from_bucket(
        self,
        get: RangedGet,
        views: list[memoryview],
        start: int,
        end: int,
        stop: Callable[[], bool] | None,
        *,
        claimed: int = 0,
    ) -> int:
        """Blocks ``start`` to ``end`` (indexes into ``views``) from the
        bucket with one ranged GET; each block received whole is put into
        the shared tier: at once those before ``claimed`` (this node claimed
        them: other nodes wait for them), the others when the put backlog
        has room.  How many bytes arrived."""
        shared = self.shared
        blocks = views[start:end]
        if not blocks:
            return 0
        offset = get.offset + sum(len(view) for view in views[:start])
        got = super().get_range_into(dataclasses.replace(get, offset=offset), blocks, stop)
        shared.count(bucket_bytes=got)
        if not get.etag or get.offset % shared.block_size:
            return got
        left = got
        for index, view in enumerate(blocks, start=start):
            if left < len(view):
                break
            left -= len(view)
            shared.put_later(self._key(get, index), bytes(view), claimed=index < claimed)
        return got

    def warm(
        self,
        key: str,
        etag: str,
        origin_size: int,
        blocks: range,
        pace: WarmPace | None = None,
    ) -> tuple[int, int]:
        """Thread (``tierfs preload --tier SHARED``): make ``blocks`` of the
        object ``key`` at ``etag`` present in the shared tier, without
        filling any local tier.  A block already there (a HEAD), or claimed
        by another node that puts it, is counted as present; the others are
        claimed, fetched from the bucket in runs of up to 16 MiB and put
        before this returns.  ``pace``: each run's GET holds a BACKGROUND
        fetch slot taken for it alone, is a short one (the trickle) while
        demand reads are active, and gives way between two blocks when one
        starts, as a local preload's fetches do
        (``tierfs.core.state.fetch_slots``).  Returns (bytes fetched from
        the bucket and put, bytes present already).  Raises StoreError when
        the shared tier fails (nothing could be warmed) or a put failed."""
        shared = self.shared
        size = shared.block_size
        fetched = present = 0
        run: list[int] = []
        trickle_blocks = max(1, BACKGROUND_TRICKLE_BYTES // size)

        def fetch_part(part: list[int], stop: Callable[[], bool] | None) -> int:
            """The blocks of ``part`` from the bucket, each put; how many
            blocks came whole (fewer when the GET gave way)."""
            views = [memoryview(bytearray(min(size, origin_size - b * size))) for b in part]
            get = RangedGet(key, etag, part[0] * size, sum(map(len, views)), [], [])
            got = Origin.get_range_into(self, get, views, stop)
            shared.count(bucket_bytes=got)
            whole = 0
            for view in views:
                if got < len(view):
                    break
                got -= len(view)
                whole += 1
            if not whole:
                raise StoreError(f"{key}: expected {get.length} bytes from the bucket, got none")
            for blockno, view in zip(part[:whole], views, strict=False):
                if not shared.put_now(self._key(get, blockno - part[0]), bytes(view)):
                    raise StoreError(f"shared tier: putting block {blockno} of {key} failed")
            return whole

        def fetch_run() -> int:
            done = 0
            while run:
                if pace is None:
                    whole = fetch_part(list(run), None)
                else:
                    taken, trickle = pace.take()
                    try:
                        part = run[:trickle_blocks] if trickle else list(run)
                        whole = fetch_part(part, pace.stop)
                    finally:
                        pace.give(taken)
                done += sum(min(size, origin_size - b * size) for b in run[:whole])
                del run[:whole]
            return done

        for blockno in blocks:
            nbytes = min(size, origin_size - blockno * size)
            shared_key = shared.block_key(key, etag, blockno)
            if nbytes <= 0 or shared_key is None:
                continue
            if shared.holds(shared_key):
                present += nbytes
                fetched += fetch_run()
                continue
            claim = shared.claim(shared_key)
            if claim is Claim.FAILED:
                raise StoreError(f"shared tier {shared.bucket.url}: it did not answer")
            if claim is Claim.HELD and not shared.claim_is_stale(shared_key):
                present += nbytes  # the claiming node puts it
                fetched += fetch_run()
                continue
            run.append(blockno)
            if len(run) * size >= FETCH_RUN_BYTES:
                fetched += fetch_run()
        return fetched + fetch_run(), present
