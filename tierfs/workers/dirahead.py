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
see ``tierfs.core.fetch_slots``): a small file whole, a big one its first
block, the rest of it is the handle's readahead once opened.  So the bytes
a stream brings in ahead are at most ``max_files`` blocks.

The observer (``opened``) is synchronous and runs inside ``Handles.open``:
two LMDB reads (the dentry's cookie, and ``read_dir`` of the window when
``high`` moves) and one inode read per newly scheduled entry.  Opens for
writing are ignored.  Work goes to the fill tasks through a bounded
channel; when it is full, entries are dropped (counted), never waited for.

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
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from tierfs.core import TierFS
from tierfs.core.fetch_slots import FetchPriority
from tierfs.errors import TierfsError

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


@dataclass(slots=True)
class _Stream:
    high: int
    generation: int
    streak: int = 1
    #: The furthest cookie scheduled ahead (``high`` when nothing is).
    ahead: int = 0
    recent: collections.deque[int] = field(default_factory=collections.deque)


class DirectoryReadahead:
    """The directory readahead worker (see the module docstring)."""

    def __init__(
        self,
        fs: TierFS,
        *,
        max_files: int | None = None,
        slack: int = DEFAULT_SLACK,
        tasks: int | None = None,
        defer: Callable[[], bool] = lambda: False,
    ) -> None:
        self.fs = fs
        self.meta = fs.meta
        #: Most files kept ahead of one stream (``[fetch] dir_readahead``).
        self.max_files = fs.config.fetch.dir_readahead if max_files is None else max_files
        self.enabled = self.max_files > 0 and fs.config.namespace.revalidate_ttl > 0
        self.defer = defer
        self.slack = slack
        #: Fills at once: a quarter of ``fetch.concurrency`` (8 of 32), so
        #: that readers' misses and the order-aware prefetcher keep most
        #: of the slots.
        self.tasks = tasks or max(2, fs.config.fetch.concurrency // 4)
        self._streams: collections.OrderedDict[int, _Stream] = collections.OrderedDict()
        self._generations = 0
        self._send, self._receive = trio.open_memory_channel[tuple[int, int, int]](QUEUE_DEPTH)
        self._filled: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.files_fetched = 0
        self.bytes_fetched = 0
        self.hits = 0
        self.wrong_guesses = 0
        self.dropped = 0
        self.failed = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.fs.following_opens(self.opened, STATUS_SECTION, self.status):
                async with trio.open_nursery() as nursery:
                    for _ in range(self.tasks):
                        nursery.start_soon(self._fill_task)
                    task_status.started()
        finally:
            self._streams.clear()

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
        if not self.enabled or self.defer() or self.fs.handles.open_for_writing(ino):
            return
        if ino in self._filled:
            del self._filled[ino]
            self.hits += 1
        inode = self.fs.blocks.live_inode(ino)
        if inode is None or not inode.is_file:
            return
        cookie = self.meta.dentry_cookie(inode.parent, inode.name)
        if cookie is None:
            return
        dir_ino = inode.parent
        stream = self._streams.get(dir_ino)
        if stream is None:
            self._start(dir_ino, cookie)
            return
        self._streams.move_to_end(dir_ino)
        if stream.recent[0] <= cookie <= stream.high:
            return  # a slower reader of the same stream, or the same file again
        window = min(self.max_files, WINDOW_PER_STREAK * (stream.streak + 1))
        following = self.meta.read_dir(dir_ino, stream.high, max(self.slack, window + self.slack))
        reach = [entry_cookie for entry_cookie, _, _ in following[: self.slack]]
        if cookie not in reach:
            if stream.streak >= START_STREAK:
                self.wrong_guesses += 1
            self._start(dir_ino, cookie)
            return
        stream.high = cookie
        stream.streak += 1
        stream.recent.append(cookie)
        if stream.streak < START_STREAK:
            return
        ahead = [entry for entry in following if entry[0] > cookie][:window]
        for entry_cookie, _, entry_ino in ahead:
            if entry_cookie <= stream.ahead:
                continue
            stream.ahead = entry_cookie
            try:
                self._send.send_nowait((dir_ino, stream.generation, entry_ino))
            except trio.WouldBlock:
                self.dropped += 1

    def _start(self, dir_ino: int, cookie: int) -> None:
        self._generations += 1
        self._streams[dir_ino] = _Stream(
            high=cookie,
            generation=self._generations,
            ahead=cookie,
            recent=collections.deque([cookie], maxlen=self.slack),
        )
        self._streams.move_to_end(dir_ino)
        while len(self._streams) > MAX_STREAMS:
            self._streams.popitem(last=False)

    # --- the fills -------------------------------------------------------------------

    async def _fill_task(self) -> None:
        async for dir_ino, generation, ino in self._receive:
            stream = self._streams.get(dir_ino)
            if stream is None or stream.generation != generation:
                continue
            inode = self.fs.blocks.live_inode(ino) or self.meta.get_inode(ino)
            if inode is None or not inode.is_file or not inode.origin_key:
                continue
            # Remembered from the start of the fill: an open while it runs
            # shares its GET, which is a hit as well.
            self._filled[ino] = None
            while len(self._filled) > HITS_KEPT:
                self._filled.popitem(last=False)
            try:
                fetched = await self.fs.movement.fill(
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
