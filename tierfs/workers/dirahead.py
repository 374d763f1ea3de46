"""Directory readahead: when a directory's files are opened in listing
order, fetch the next ones before they are opened; stop when the guess is
wrong.

Why.  A reader that walks a directory of small files one after the other
(``cat dir/*``, ``tar``, ``cp -r``, a sequential sampler) waits for one cold
GET per file, one at a time: the bucket's latency, not its bandwidth, sets
the pace.  Nobody told the daemon the order (that is what the order-aware
``Prefetcher`` is for), but the listing order is the natural guess, and the
opens show whether it is right.

Listing order is readdir order: the dentry *cookies* of a directory
(``MetaDB.read_dir``), which a listing assigns in key order.  So a position
in a directory is a cookie, and the next files are one ``read_dir`` away.

One ``_Stream`` per directory (at most ``MAX_STREAMS``, least recently
used dropped).  An open of a file (by any process: several readers taking
turns, such as a DataLoader's workers over a sequential sampler, make one
stream) at cookie ``c`` of directory ``d``:

* continues the stream if ``c`` is among the ``slack`` entries that follow
  the furthest open (``high``): ``high`` moves to ``c`` and ``streak``
  grows;
* is a straggler if ``low <= c <= high`` (``low``: the oldest of the last
  ``slack`` opens): a slower reader of the same stream, or the same file
  opened again; nothing changes;
* otherwise is a wrong guess: the stream starts again at ``c`` with
  ``streak`` 1 and a new ``generation``.  Queued fills of older
  generations are dropped when they come up (fills already running end:
  each is one GET of at most one block).

While ``streak >= START_STREAK`` the stream keeps the next
``window = min(max_files, WINDOW_PER_STREAK * streak)`` entries after
``high`` scheduled (``ahead`` is the furthest cookie scheduled; only the
entries past it are new work).  A scheduled entry that is a regular file
with a bucket origin becomes one fill of its first block at AHEAD priority
(``DataMovement.fill``, shared with demand reads, which always go first,
see ``tierfs.core.state.fetch_slots``): a small file whole, a big one its first
block, the rest of it is the handle's readahead once opened.

Bytes ahead.  What one stream keeps scheduled past ``high`` is bounded in
bytes too, by ``max_bytes`` = the first tier's capacity /
``FIRST_TIER_SHARE`` (16): an entry counts what its fill fetches, its size
up to one block (0 when resident or not a regular file), and an entry
that would take the stream past ``max_bytes`` waits (the window stops
before it) until the reader's opens move ``high`` past entries and make
room.  So a stream never brings in more than 1/16 of the first tier ahead
of its reader, whatever ``max_files`` and the block size (32 files of one
1 MiB block each flooded a 12 MiB tier), and a file whose first block
alone is more than that is never fetched ahead.  The sizes come with the
entries (``MetaDB.read_dir_records``: one transaction, no decode).

The observer (``opened``) is synchronous and runs inside ``Handles.open``,
on every open, so it must cost next to nothing when the guess is wrong (a
shuffled reader, a warm epoch): the dentry's cookie, one LMDB read the
first time, then from memory (``_cookies``: ino -> (directory, name,
cookie), at most ``COOKIES_KEPT``, all dropped when full; an entry counts
only while the inode's directory and name are the ones it was read for,
so a rename reads the cookie again.  A dentry keeps its cookie while it
exists, and a name that comes back is a new inode: a stale cookie is not
expected, and would only make a wrong guess).
Cookies only grow (a new entry takes the directory's ``next_cookie``), so
``high < c <= high + slack`` proves that ``c`` is among the next ``slack``
entries and ``c < recent[0]`` that it is not, with no read; only an open
past ``high + slack`` (gaps left by deletions may still put it within
``slack`` entries) reads at most ``slack`` keys of the readdir order
(``MetaDB.nth_cookie_after``, no dentry).  Only a stream that moves with
a streak reads entries (``read_dir``): those past ``ahead``, usually one
per open in order.  A scheduled entry that the eviction trackers know as
resident (in memory) is not queued.  Opens for writing are ignored.  Work
goes to the fill tasks through a bounded channel; when it is full, entries
are dropped (counted), never waited for.

It stands down (``opened`` does nothing) while ``[fetch] dir_readahead``
is 0, while ``[namespace] revalidate_ttl`` is 0 (every open checks the
bucket then, so a file fetched ahead would cost a GET and a HEAD instead
of one GET), and while ``defer()`` says so: the daemon passes "the
order-aware prefetcher follows an order", which knows the order instead of
guessing it.

Figures: ``status()`` is the file system's status section ``STATUS_SECTION``
while ``run`` runs: streams, files fetched ahead, hits (opens of files this
worker fetched or was fetching), wrong guesses, dropped entries.
"""

from __future__ import annotations

import collections
import logging
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from tierfs.config import FetchConfig
from tierfs.core.read.handles import Handles
from tierfs.core.state.fetch_slots import FetchPriority
from tierfs.core.state.space import SpaceManager
from tierfs.core.tiering.movement import DataMovement
from tierfs.errors import TierfsError
from tierfs.meta import MetaDB
from tierfs.meta.records import raw_mode, raw_size
from tierfs.tiers import Tier

from .foreground import FollowOpens

log = logging.getLogger(__name__)

#: The name of this worker's section of ``TierFS.status()`` (while it runs).
STATUS_SECTION = "dir_readahead"
#: Directories followed at once.
MAX_STREAMS = 64
#: In-order opens in a row before anything is fetched ahead.
START_STREAK = 2
#: Files ahead per in-order open of the streak, up to ``max_files``.
WINDOW_PER_STREAK = 4
#: Default reach of a continuing open past the furthest one (and how many
#: recent opens define a straggler).
DEFAULT_SLACK = 8
#: Inodes whose fill started, remembered to count hits.
HITS_KEPT = 4096
#: Entries waiting for a fill task, at most.
QUEUE_DEPTH = 512
#: Dentry cookies of opened files kept in memory, at most.
COOKIES_KEPT = 16384
#: One stream keeps at most 1/FIRST_TIER_SHARE of the first tier ahead.
FIRST_TIER_SHARE = 16


@dataclass(slots=True)
class _Stream:
    high: int
    generation: int
    streak: int = 1
    #: The furthest cookie scheduled ahead (``high`` when nothing is).
    ahead: int = 0
    recent: collections.deque[int] = field(default_factory=collections.deque)
    #: ``(cookie, bytes its fill fetches)`` of the entries scheduled ahead
    #: past ``high`` (at most the window).
    scheduled: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)
    #: The sum of ``scheduled``'s bytes (at most ``max_bytes``).
    bytes_ahead: int = 0


class DirectoryReadahead:
    """The directory readahead worker (see the module docstring)."""

    def __init__(
        self,
        meta: MetaDB,
        movement: DataMovement,
        handles: Handles,
        space: SpaceManager,
        tiers: list[Tier],
        *,
        follow_opens: FollowOpens,
        fetch: FetchConfig,
        revalidate_ttl: float,
        max_files: int | None = None,
        slack: int = DEFAULT_SLACK,
        tasks: int | None = None,
        defer: Callable[[], bool] = lambda: False,
    ) -> None:
        self.meta = meta
        self.movement = movement
        self.handles = handles
        self.space = space
        self.follow_opens = follow_opens
        #: Most files kept ahead of one stream (``[fetch] dir_readahead``).
        self.max_files = fetch.dir_readahead if max_files is None else max_files
        self.enabled = self.max_files > 0 and revalidate_ttl > 0
        #: Most bytes kept ahead of one stream (see "Bytes ahead").
        self.max_bytes = tiers[0].capacity // FIRST_TIER_SHARE if tiers else 0
        self.block_size = fetch.block_size
        self.defer = defer
        self.slack = slack
        #: Fills at once: a quarter of ``fetch.concurrency`` (8 of 32), so
        #: that readers' misses and the order-aware prefetcher keep most
        #: of the slots.
        self.tasks = tasks or max(2, fetch.concurrency // 4)
        self._streams: collections.OrderedDict[int, _Stream] = collections.OrderedDict()
        self._generations = 0
        self._send, self._receive = trio.open_memory_channel[tuple[int, int, int]](QUEUE_DEPTH)
        self._filled: collections.OrderedDict[int, None] = collections.OrderedDict()
        #: ino -> (directory, name, dentry cookie) of files opened (see the docstring).
        self._cookies: dict[int, tuple[int, bytes, int]] = {}
        self.files_fetched = 0
        self.bytes_fetched = 0
        self.hits = 0
        self.wrong_guesses = 0
        self.dropped = 0
        self.failed = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.follow_opens(self.opened, STATUS_SECTION, self.status):
                async with trio.open_nursery() as nursery:
                    for _ in range(self.tasks):
                        nursery.start_soon(self._fill_task)
                    task_status.started()
        finally:
            self._streams.clear()
            self._cookies.clear()

    def status(self) -> dict[str, int]:
        return {
            "streams": len(self._streams),
            "files_fetched": self.files_fetched,
            "bytes_fetched": self.bytes_fetched,
            "hits": self.hits,
            "wrong_guesses": self.wrong_guesses,
            "dropped": self.dropped,
            "failed": self.failed,
        }

    def idle(self) -> bool:
        """Nothing queued (fills may still run)."""
        return self._receive.statistics().current_buffer_used == 0

    # --- following the opens ---------------------------------------------------------

    def opened(self, ino: int) -> None:
        """An open of ``ino`` (synchronous, from ``Handles.open``)."""
        if not self.enabled or self.defer() or self.handles.open_for_writing(ino):
            return
        if ino in self._filled:
            del self._filled[ino]
            self.hits += 1
        inode = self.movement.inode(ino)
        if inode is None or not inode.is_file:
            return
        dir_ino = inode.parent
        cookie = self._cookie(ino, dir_ino, inode.name)
        if cookie is None:
            return
        stream = self._streams.get(dir_ino)
        if stream is None:
            self._start(dir_ino, cookie)
            return
        self._streams.move_to_end(dir_ino)
        if not self._continues(dir_ino, stream, cookie):
            return
        stream.high = cookie
        stream.streak += 1
        stream.recent.append(cookie)
        if stream.streak >= START_STREAK:
            self._schedule(dir_ino, stream)

    def _cookie(self, ino: int, dir_ino: int, name: bytes) -> int | None:
        """The readdir cookie of ``ino``, entry ``name`` of ``dir_ino``:
        from memory if it was read for that directory and name."""
        known = self._cookies.get(ino)
        if known is not None and known[0] == dir_ino and known[1] == name:
            return known[2]
        cookie = self.meta.dentry_cookie(dir_ino, name)
        if cookie is not None:
            if len(self._cookies) >= COOKIES_KEPT:
                self._cookies.clear()
            self._cookies[ino] = (dir_ino, name, cookie)
        return cookie

    def _continues(self, dir_ino: int, stream: _Stream, cookie: int) -> bool:
        """Does the open at ``cookie`` continue ``stream`` (else it is a
        straggler, nothing changes, or a wrong guess, the stream starts
        again at ``cookie``)?  Cookies only grow (``MetaDB``: a new entry
        takes ``next_cookie``), so arithmetic decides all but an open past
        ``high + slack``, which may still be within ``slack`` entries when
        deletions left gaps: that one reads at most ``slack`` keys."""
        high = stream.high
        if cookie > high:
            if cookie <= high + self.slack:
                return True
            reach_end = self.meta.nth_cookie_after(dir_ino, high, self.slack)
            if reach_end is None or cookie <= reach_end:
                return True
        elif cookie >= stream.recent[0]:
            return False  # a slower reader of the same stream, or the same file again
        if stream.streak >= START_STREAK:
            self.wrong_guesses += 1
        self._start(dir_ino, cookie)
        return False

    def _schedule(self, dir_ino: int, stream: _Stream) -> None:
        """Keep the ``window`` entries after ``high`` scheduled, within
        ``max_bytes``: only those past ``ahead`` are read (usually one per
        open in order) and queued, unless resident already."""
        scheduled = stream.scheduled
        while scheduled and scheduled[0][0] <= stream.high:
            stream.bytes_ahead -= scheduled.popleft()[1]
        wanted = min(self.max_files, WINDOW_PER_STREAK * stream.streak) - len(scheduled)
        if wanted <= 0:
            return
        for entry_cookie, _, entry_ino, record in self.meta.read_dir_records(
            dir_ino, max(stream.ahead, stream.high), wanted
        ):
            nbytes = 0 if self._resident(entry_ino) else self._fill_bytes(record)
            if nbytes and stream.bytes_ahead + nbytes > self.max_bytes:
                return  # waits for room (see "Bytes ahead")
            stream.ahead = entry_cookie
            scheduled.append((entry_cookie, nbytes))
            stream.bytes_ahead += nbytes
            if not nbytes:
                continue
            try:
                self._send.send_nowait((dir_ino, stream.generation, entry_ino))
            except trio.WouldBlock:
                self.dropped += 1

    def _fill_bytes(self, record: bytes) -> int:
        """What a fill of the entry with this inode record fetches: its
        first block (0 for what is not a regular file)."""
        if not stat.S_ISREG(raw_mode(record)):
            return 0
        return min(raw_size(record), self.block_size)

    def _resident(self, ino: int) -> bool:
        """Has ``ino`` bytes on a tier (the eviction trackers, in memory)?
        For a file of one block that is the whole file; a bigger one with
        some other block resident is not fetched ahead either (its
        handle's readahead fetches what is missing once it is opened)."""
        return self.space.tracks(ino)

    def _start(self, dir_ino: int, cookie: int) -> None:
        """A stream of ``dir_ino`` starts at ``cookie`` (a wrong guess
        starts the directory's stream again, in place: on a shuffled
        reader's path this runs at nearly every open)."""
        self._generations += 1
        stream = self._streams.get(dir_ino)
        if stream is not None:
            stream.high = stream.ahead = cookie
            stream.generation = self._generations
            stream.streak = 1
            stream.recent.clear()
            stream.recent.append(cookie)
            stream.scheduled.clear()
            stream.bytes_ahead = 0
            return  # the caller moved it to the end already
        self._streams[dir_ino] = _Stream(
            high=cookie,
            generation=self._generations,
            ahead=cookie,
            recent=collections.deque([cookie], maxlen=self.slack),
        )
        while len(self._streams) > MAX_STREAMS:
            self._streams.popitem(last=False)

    # --- the fills -------------------------------------------------------------------

    async def _fill_task(self) -> None:
        async for dir_ino, generation, ino in self._receive:
            stream = self._streams.get(dir_ino)
            if stream is None or stream.generation != generation:
                continue
            inode = self.movement.inode(ino)
            if inode is None or not inode.is_file or not inode.origin_key:
                continue
            # Remembered from the start of the fill: an open while it runs
            # shares its GET, which is a hit as well.
            self._filled[ino] = None
            while len(self._filled) > HITS_KEPT:
                self._filled.popitem(last=False)
            try:
                fetched = await self.movement.fill(
                    ino, blocks=range(1), priority=FetchPriority.AHEAD
                )
            except TierfsError as exc:
                self.failed += 1
                self._filled.pop(ino, None)
                log.debug("directory readahead of inode %d: %s", ino, exc)
                continue
            if fetched:
                self.files_fetched += 1
                self.bytes_fetched += fetched
