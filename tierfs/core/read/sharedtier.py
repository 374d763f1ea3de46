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
                the shared tier at once by a background thread.  Until the
                block is put, its claim is *alive*: written again every
                ``HEARTBEAT`` (1 s) once held that long (``_heartbeat``); a
                claim whose fetch or put failed is deleted (``release``)
      held  --> another node fetches it: ``wait_for`` polls the block and
                serves it when it appears; the next block is then asked for
                again before it is claimed (the claimer's run most likely
                goes on, and its blocks arrive together)
    no answer to the claim (a loaded tier: it may have been made) -->
        waited for as a held one, forgiven once (``may_wait_on``): the
        claim's check sorts it out
    damaged, or the tier fails (its breaker open, or a second request
        without an answer) --> that block and the rest of the run from
        the bucket with one ranged GET, put in the background

While it waits, a node checks the claim (a HEAD: its age by the cluster's
clock) at the third poll and at each poll past ``CLAIM_WAIT`` (2 s):

    alive (age <= ``alive_for``: 3 s plus three times the slowest request
        to the tier of the last ~10 s) --> wait on
    gone (given up) --> claim it again
    dead (older: its node died, or is too slow to write it again) -->
        claim its next *generation* (``claims/<block key>.<n>``, again
        with If-None-Match: *)
    either claim won --> this node fetches the block (as a block it won)
    either claim held --> another waiting node took it over: wait for that
        one; past ``LAST_GENERATION``, or ``CLAIM_WAIT_LIMIT`` (60 s) of
        waiting, the block is read from the bucket (that block alone:
        the next ones are most likely claimed by other nodes)

So a dead or given-up claimer costs one more fetch of its blocks, by one
node, never a fetch by every node that waited.  Measured with 256
simulated nodes whose shared cluster was slow under their load: when each
waiting node read a block whose claim looked dead from the bucket itself,
the bucket served 9-17 times the file; with the takeover, 1.03 times.
A node learns how long claimed blocks take to arrive, and polls first
after three quarters of that (``first_pause``: a node reading a file meets
one claimed run after another, each about as slow as the last), later
after pauses growing from ``FIRST_POLL`` to ``LAST_POLL`` and then to half
the time waited, all jittered: it asks about once or twice per claimed run,
whatever the bucket's speed or the number of nodes
(``tests/bench/bench_fanout.py``; figures in docs/shared-tier.md).

So when many nodes read the same cold blocks at once (a checkpoint at a
job's start), each block is fetched from the bucket by about one node, and
the others read it from the shared tier a moment later.  A duplicate fetch
(a claim taken for dead, a claimer slower than ``CLAIM_WAIT_LIMIT``) costs
bucket bytes, never correctness: a block is only ever served after its
length and xxh3 were checked, and a block's key names the object's ETag.
Claims of blocks that were put are left in place (the tier's own expiry
removes them with the blocks); a node never waits on a dead one.

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
import contextlib
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
#: Past this much waiting for a block another node claimed, the claim is
#: checked (its age, a HEAD) at every poll, not only at ``STALE_CHECK_POLL``.
CLAIM_WAIT = 2.0
#: A claim not written again for this long (by the cluster's clock, plus
#: three times the slowest recent answer: ``alive_for``) is dead: its node
#: died, and one waiting node takes it over.  A live claimer writes its
#: claims again every ``HEARTBEAT``.
CLAIM_ALIVE = 3.0
#: Seconds between two writes of a claim its node still works on (only
#: claims held this long are written again: most are done sooner).
HEARTBEAT = 1.0
#: Seconds over which the slowest request to the tier is remembered.
LATENCY_WINDOW = 10.0
#: A dead claim is taken over by claiming its next generation (exactly one
#: waiting node wins it); past this many, the waiting nodes fetch the block.
LAST_GENERATION = 3
#: Requests of one wait that may get no answer before the block is read
#: from the bucket (``may_wait_on``).
FORGIVEN_FAILURES = 1
#: Threads writing claims again (``HEARTBEAT``).
RENEW_THREADS = 4
#: The longest wait for a block whose claimer is alive but slow (a job's
#: start on hundreds of nodes over a loaded shared cluster: the waiting is
#: what keeps them from all reading the bucket): then it is read from the
#: bucket all the same.
CLAIM_WAIT_LIMIT = 60.0
#: A claim this node still holds after this long is forgotten (no longer
#: written again): a bug's claim must not stay alive for ever.
CLAIM_HOLD_LIMIT = 120.0
#: Seconds between two checks of a shared tier that did not answer at mount.
CHECK_INTERVAL = 30.0
#: The first pause before a poll of a claimed block (until this node has
#: learnt how long claimed blocks take to arrive), the shortest pause
#: after it, and the longest first pause a learnt arrival time may give.
FIRST_POLL = 0.02
LAST_POLL = 0.2
LONGEST_FIRST_POLL = 1.0
#: The poll after which the claim's age is checked (a HEAD): most claimed
#: blocks arrive before it.
STALE_CHECK_POLL = 3


def claim_key(shared_key: str, generation: int = 0) -> str:
    """The claim of a block, in its ``generation`` (a dead claim's next
    generation takes it over)."""
    suffix = f".{generation}" if generation else ""
    return f"{CLAIMS}{shared_key}{suffix}"


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
    "claims_renewed",
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


class Wait(enum.Enum):
    """How a wait for a claimed block ended (``SharedTier.wait_for``)."""

    #: The block arrived and was read.
    SERVED = "served"
    #: Its claimer gave the claim up and this node claimed it: fetch it, as
    #: a block this node won.
    CLAIMED = "claimed"
    #: Fetch it from the bucket (a dead claim, the tier failed, ...).
    FETCH = "fetch"


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
        #: Claims this node won and has not put the block of yet: block key
        #: -> (claim key, when claimed, when last written), monotonic
        #: (``_heartbeat``).
        self._holding: dict[str, tuple[str, float, float]] = {}
        self._heartbeat_thread: threading.Thread | None = None
        self._closed = threading.Event()
        #: Seconds claimed blocks took to arrive lately (``first_pause``).
        self._arrival = 0.0
        #: The slowest request to the tier in this half window and the one
        #: before (``_took``, ``alive_for``).
        self._slowest = self._slowest_before = 0.0
        self._window_start = time.monotonic()
        #: Writes claims again, apart from the puts of blocks (which may
        #: all be busy with slow PUTs): see ``_heartbeat``.
        self._renewals = ThreadPoolExecutor(RENEW_THREADS, thread_name_prefix="tierfs-shared-renew")

    def close(self) -> None:
        self._closed.set()
        self._puts.shutdown(wait=False, cancel_futures=True)
        self._renewals.shutdown(wait=False, cancel_futures=True)
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
        started = time.monotonic()
        try:
            found = self.bucket.get(shared_key, len(into) + TRAILER.size)
        except StoreError as exc:
            self.count(errors=1)
            log.debug("shared tier: %s: %s", shared_key, exc)
            return Lookup.FAILED
        self._took(time.monotonic() - started)
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

    def claim(self, shared_key: str, generation: int = 0) -> Claim:
        """Thread: claim the block before fetching it from the bucket.  WON:
        this node fetches and puts it (and keeps the claim alive until then,
        ``_heartbeat``); HELD: another node claimed it (``wait_for`` it);
        FAILED: the tier did not answer."""
        if self.fan_out_off is not None:
            return Claim.WON  # no claims: each node fetches what it misses
        try:
            won = self.bucket.put_if_absent(claim_key(shared_key, generation), self.node.encode())
        except StoreError as exc:
            self.count(errors=1)
            log.debug("shared tier: claim of %s: %s", shared_key, exc)
            return Claim.FAILED
        self.count(**{"claims" if won else "claims_held": 1})
        if won:
            now = time.monotonic()
            with self._lock:
                self._holding[shared_key] = (claim_key(shared_key, generation), now, now)
                self._start_heartbeat()
        return Claim.WON if won else Claim.HELD

    def release(self, shared_keys: list[str]) -> None:
        """Thread: give up the claims of blocks this node will not put after
        all (their fetch failed): deleted, so that nodes waiting for them
        fetch them at once."""
        for shared_key in shared_keys:
            with self._lock:
                held = self._holding.pop(shared_key, None)
            if held is not None:
                with contextlib.suppress(StoreError):
                    self.bucket.delete(held[0])

    def _done_with(self, shared_key: str) -> None:
        with self._lock:
            self._holding.pop(shared_key, None)

    def _start_heartbeat(self) -> None:
        """Under the lock: the thread that keeps this node's claims alive."""
        if self._heartbeat_thread is None and not self._closed.is_set():
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat, name="tierfs-shared-heartbeat", daemon=True
            )
            self._heartbeat_thread.start()

    def _heartbeat(self) -> None:
        """Thread: every half ``HEARTBEAT``, write again (``RENEW_THREADS``
        at a time) each claim this node has held for ``HEARTBEAT`` since
        it last wrote it, without putting its block yet (a fetch from a
        slow bucket, a slow put): nodes waiting for it see it alive
        (``alive_for``).  A claim is written again only once its last
        write is done."""
        renewing: set[str] = set()

        def renew(key: str, claim: str) -> None:
            try:
                self.bucket.put(claim, self.node.encode())
            except StoreError as exc:
                log.debug("shared tier: renewing %s: %s", claim, exc)
            else:
                self.count(claims_renewed=1)
            with self._lock:
                renewing.discard(key)
                held = self._holding.get(key)
                if held is not None and held[0] == claim:
                    self._holding[key] = (claim, held[1], time.monotonic())

        while not self._closed.wait(HEARTBEAT / 2):
            now = time.monotonic()
            with self._lock:
                for key, (_claim, since, _written) in list(self._holding.items()):
                    if now - since > CLAIM_HOLD_LIMIT:
                        del self._holding[key]
                due = [
                    (key, claim)
                    for key, (claim, _since, written) in self._holding.items()
                    if now - written >= HEARTBEAT and key not in renewing
                ]
                renewing.update(key for key, _claim in due)
            for key, claim in due:
                try:
                    self._renewals.submit(renew, key, claim)
                except RuntimeError:  # shut down
                    return

    def holds(self, shared_key: str) -> bool:
        """Thread: is the block in the shared tier (a HEAD; not checked)?
        Raises StoreError when the tier does not answer."""
        return self.bucket.age(shared_key) is not None

    def claim_is_stale(self, shared_key: str) -> bool:
        """Thread: is the claim of the block gone, or dead (its node died
        or gave up)?"""
        return self.claim_alive(shared_key) is not True

    def claim_alive(self, shared_key: str, generation: int = 0) -> bool | None:
        """Thread: True while the claim of the block is alive, False once
        it is dead (not written for ``alive_for``: its node died), None if
        it is gone (given up, ``release``).  Raises StoreError."""
        started = time.monotonic()
        age = self.bucket.age(claim_key(shared_key, generation))
        self._took(time.monotonic() - started)
        if age is not None and age <= self.alive_for():
            return True
        self.count(claims_stale=1)
        return None if age is None else False

    def alive_for(self) -> float:
        """How old a claim may be and still be alive: ``CLAIM_ALIVE``, plus
        three times the time this tier's requests take lately (a loaded
        cluster, a job's start on many nodes: the claimer's writes of its
        claim queue there too, and are late)."""
        with self._lock:
            return CLAIM_ALIVE + 3 * max(self._slowest, self._slowest_before)

    def _took(self, seconds: float) -> None:
        """A request to the tier took ``seconds`` (``alive_for`` goes by the
        slowest of the last ``LATENCY_WINDOW`` seconds or so)."""
        now = time.monotonic()
        with self._lock:
            if now - self._window_start > LATENCY_WINDOW / 2:
                self._slowest_before, self._slowest = self._slowest, 0.0
                self._window_start = now
            self._slowest = max(self._slowest, seconds)

    def first_pause(self) -> float:
        """The pause before the first poll of a claimed block: three
        quarters of how long claimed blocks took to arrive lately (a node
        reading a file meets one claimed run after the other, each about as
        slow as the last), so that a waiting node asks about once or twice
        per block, whatever the bucket's speed or the number of nodes."""
        with self._lock:
            expected = self._arrival
        return min(LONGEST_FIRST_POLL, max(FIRST_POLL, 0.75 * expected))

    def _learn_arrival(self, seconds: float) -> None:
        with self._lock:
            self._arrival = 0.5 * self._arrival + 0.5 * seconds

    def wait_for(
        self,
        shared_key: str,
        into: memoryview,
        stop: Callable[[], bool] | None = None,
        *,
        failed: int = 0,
    ) -> Wait:
        """Thread: wait for a block another node claimed, and read it into
        ``into``.  Polls: first after ``first_pause``, then with pauses
        growing from ``FIRST_POLL`` to ``LAST_POLL`` (and to half the time
        waited, past that), jittered.  The claim's age is checked at
        ``STALE_CHECK_POLL`` and at every poll past ``CLAIM_WAIT``.
        ``failed``: requests about the block that got no answer already
        (its claim).

        SERVED once the block is read into ``into``.  A claim that is gone
        (its claimer gave up) is claimed again, a dead one (``alive_for``)
        in its next generation: CLAIMED if this node won it (and fetches
        the block), and the wait goes on if another did.  FETCH, to fetch
        it from the bucket, past ``LAST_GENERATION`` or
        ``CLAIM_WAIT_LIMIT``, when the block is damaged, when the tier does
        not answer twice (``may_wait_on``), or when ``stop`` says to give
        way."""
        started = time.monotonic()
        pause = self.first_pause()
        polls = 0
        generation = 0
        while True:
            waited = time.monotonic() - started
            left = CLAIM_WAIT_LIMIT - waited
            if left <= 0 or (stop is not None and stop()):
                self.count(wait_timeouts=1)
                return Wait.FETCH
            # The claimer has just begun its GET of the bucket: pause first.
            time.sleep(min(left, pause * random.uniform(0.75, 1.25)))
            pause = max(FIRST_POLL, min(pause * 2, max(LAST_POLL, waited / 2)))
            found = self.read_block(shared_key, into)
            if found is Lookup.HIT:
                self._learn_arrival(time.monotonic() - started)
                self.count(waits=1)
                return Wait.SERVED
            if found is Lookup.FAILED and self.may_wait_on(failed := failed + 1):
                continue  # no answer once (a loaded tier): not yet a reason to go to the bucket
            if found is not Lookup.MISS:
                return Wait.FETCH
            polls += 1
            if polls == STALE_CHECK_POLL or time.monotonic() - started >= CLAIM_WAIT:
                try:  # still not there: is the claim alive?
                    alive = self.claim_alive(shared_key, generation)
                except StoreError:
                    self.count(errors=1)
                    if self.may_wait_on(failed := failed + 1):
                        continue
                    return Wait.FETCH
                if alive is not True:
                    # Given up (gone), or dead: one of the waiting nodes takes
                    # it over, by claiming it again, or its next generation.
                    if alive is False:
                        generation += 1
                    if generation > LAST_GENERATION:
                        return Wait.FETCH
                    claim = self.claim(shared_key, generation)
                    if claim is Claim.WON:
                        return Wait.CLAIMED
                    if claim is Claim.FAILED:
                        return Wait.FETCH
                    polls = 0  # another node took it over: wait for that one

    def may_wait_on(self, failed: int) -> bool:
        """After ``failed`` requests of one wait got no answer: wait on?
        One is forgiven (a loaded tier answers late now and then); a second,
        or an open breaker, sends the block to the bucket, so a tier that
        stopped answering costs a wait at most two ``timeout``s."""
        return failed <= FORGIVEN_FAILURES and not self.bucket.breaker.is_open

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
        started = time.monotonic()
        try:
            self.bucket.put(shared_key, data + TRAILER.pack(block_digest(data)))
            self._took(time.monotonic() - started)
        except Exception as exc:
            self.count(puts_failed=1)
            log.debug("shared tier: putting %s failed: %s", shared_key, exc)
            self.release([shared_key])
            return False
        self._done_with(shared_key)
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
            unanswered = claim is Claim.FAILED
            if unanswered and not shared.may_wait_on(1):
                return served + self._rest(get, views, mine, index, count, stop)
            # Held, or the claim got no answer (a loaded tier: it may have
            # been made, by this node or another): wait, and the claim's
            # check sorts it out (a claim gone or dead is taken over).
            if mine is not None:  # another node's block ends this node's run
                got = self._from_bucket(get, views, mine, index, None, claimed=index)
                served += got
                if got < sum(len(view) for view in views[mine:index]):
                    return served
                mine = None
            waited = shared.wait_for(shared_key, views[index], stop, failed=int(unanswered))
            if waited is Wait.CLAIMED:  # its claimer gave up, and this node took it
                mine = index
                index += 1
                continue
            if waited is Wait.FETCH:
                if shared.bucket.breaker.is_open:  # the tier is gone: the rest from the bucket
                    return served + self._rest(get, views, mine, index, count, stop)
                # This block from the bucket; the next ones are most likely
                # claimed by other nodes, which put them: go on as before.
                got = self._from_bucket(get, views, index, index + 1, None)
                served += got
                if got < len(views[index]):
                    return served
                index += 1
                continue
            served += len(views[index])
            index += 1
            # The claimer's run most likely goes on: ask for the next block
            # (it is probably there already) before claiming it.
            cold = False
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
        try:
            got = super().get_range_into(dataclasses.replace(get, offset=offset), blocks, stop)
        except BaseException:
            if get.etag and not get.offset % shared.block_size:
                shared.release([self._key(get, i) for i in range(start, min(end, claimed))])
            raise
        shared.count(bucket_bytes=got)
        if not get.etag or get.offset % shared.block_size:
            return got
        left = got
        for index, view in enumerate(blocks, start=start):
            if left < len(view):  # this block and the next ones did not come
                shared.release([self._key(get, i) for i in range(index, min(end, claimed))])
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

        try:
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
            fetched += fetch_run()
        except BaseException:  # the claims of blocks not put: for others to fetch
            shared.release([k for b in run if (k := shared.block_key(key, etag, b)) is not None])
            raise
        return fetched, present
