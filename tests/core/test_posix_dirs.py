"""Directory handles and stale-while-revalidate
listings (section 4), without a mount: ``.`` and ``..``, offsets that stay
stable under renames, seeks that read from the offset, lookups that never
wait for a re-listing (nor send a HEAD for a name the stale listing
lacks), names a re-listing adds shown with settled attributes, and the LIST
and HEAD counts all that costs."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, put, wait_listed
from tierfs.config import NamespaceConfig
from tierfs.core.names import namespace
from tierfs.core.names.dirhandles import DOT, DOTDOT
from tierfs.core.names.listings import RELIST_CONCURRENCY
from tierfs.core.names.namereads import READDIR_BATCH
from tierfs.core.names.shadow import SHADOW_ROOT, shadow_dir_prefix
from tierfs.core.state.results import Attributes, DirEntry
from tierfs.errors import NotFound, StoreError
from tierfs.meta import PROVISIONAL, ROOT_INO

SHORT_TTL = NamespaceConfig(list_ttl=0.3, revalidate_ttl=60)


async def read_handle(mount: CoreMount, fh: int, offset: int = 0) -> list[DirEntry]:
    out: list[DirEntry] = []
    while entries := await mount.fs.names.readdir_handle(fh, offset):
        out += entries
        offset = entries[-1].cookie
    return out


async def make_files(mount: CoreMount, parent: int, names: list[str]) -> dict[str, int]:
    inos = {}
    for name in names:
        opened, attrs = await mount.fs.create(parent, name.encode(), 0o644, os.O_WRONLY, 0, 0)
        await mount.fs.release(opened.fh)
        inos[name] = attrs.ino
    return inos


def is_data_prefix(prefix: str) -> bool:
    return not prefix.startswith(SHADOW_ROOT)


def data_lists(prefixes: list[str]) -> list[str]:
    """The listings of data prefixes among ``prefixes`` (not of the shadow)."""
    return [p for p in prefixes if is_data_prefix(p)]


# --- section 3: readdir ------------------------------------------------------------------


async def test_readdir_returns_dot_and_dotdot_with_their_inode_numbers(make_fs: Any) -> None:
    mount = await make_fs()
    sub = await mount.fs.mkdir(ROOT_INO, b"sub", 0o755, 0, 0)
    await make_files(mount, sub.ino, ["a"])
    root_fh = await mount.fs.opendir(ROOT_INO)
    root = await read_handle(mount, root_fh)
    assert [(e.name, e.attrs.ino, e.cookie) for e in root[:2]] == [
        (b".", ROOT_INO, DOT),
        (b"..", ROOT_INO, DOTDOT),  # the root is its own parent
    ]
    sub_fh = await mount.fs.opendir(sub.ino)
    entries = await read_handle(mount, sub_fh)
    assert [(e.name, e.attrs.ino) for e in entries] == [
        (b".", sub.ino),
        (b"..", ROOT_INO),
        (b"a", entries[2].attrs.ino),
    ]
    assert all(e.attrs.mode & 0o040000 for e in entries[:2])
    # Resuming after "." gives "..", after ".." the first entry.
    assert [e.name for e in await mount.fs.names.readdir_handle(sub_fh, DOT)] == [b"..", b"a"]
    assert [e.name for e in await mount.fs.names.readdir_handle(sub_fh, DOTDOT)] == [b"a"]
    mount.fs.releasedir(sub_fh)
    mount.fs.releasedir(root_fh)
    assert len(mount.fs.names.dir_handles) == 0


async def test_renames_during_a_readdir_never_return_an_entry_twice(make_fs: Any) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    names = [f"f{i:04}" for i in range(300)]
    inos = await make_files(mount, d.ino, names)
    fh = await mount.fs.opendir(d.ino)
    first = await mount.fs.names.readdir_handle(fh, DOTDOT)
    seen = [e.name for e in first]
    # Rename every entry: those already returned, and those still ahead; one
    # rename replaces a name still ahead.
    for name in names[:-1]:
        await mount.fs.rename(d.ino, name.encode(), d.ino, f"r{name}".encode(), 0)
    await mount.fs.rename(d.ino, b"rf0000", d.ino, names[-1].encode(), 0)
    await make_files(mount, d.ino, ["late"])
    seen += [e.name for e in await read_handle(mount, fh, first[-1].cookie)]
    returned = [inos[n.decode()] for n in seen if n.decode() in inos]
    assert len(seen) == len(set(seen)) == len(returned) == len(set(returned))
    assert set(seen) == {n.encode() for n in names[: len(first)]}, "only names seen before"
    # A new handle (or a rewind) shows the directory as it is now.
    now = {e.name for e in await read_handle(mount, fh)} - {b".", b".."}
    assert len(now) == 300 and b"late" in now and b"rf0000" not in now


async def test_a_seek_reads_from_its_offset_without_walking_the_directory(
    make_fs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"big", 0o755, 0, 0)
    await make_files(mount, d.ino, [f"n{i:05}" for i in range(1500)])
    fh = await mount.fs.opendir(d.ino)
    everything = await read_handle(mount, fh)
    assert len(everything) == 1502
    read_rows: list[int] = []
    real_read_dir = mount.fs.meta.read_dir_records

    def counting_read_dir(
        parent: int, after: int, limit: int
    ) -> list[tuple[int, bytes, int, bytes]]:
        rows = real_read_dir(parent, after, limit)
        read_rows.append(len(rows))
        return rows

    monkeypatch.setattr(mount.fs.meta, "read_dir_records", counting_read_dir)
    # seekdir to every offset telldir gave, from the end back to the start.
    offsets = [0] + [e.cookie for e in everything[:-1]]
    for offset, expected in reversed(list(zip(offsets, everything, strict=True))):
        (got, *_rest) = await mount.fs.names.readdir_handle(fh, offset)
        assert got.name == expected.name
    assert len(read_rows) == len(offsets)  # one bounded read per seek, never a walk
    assert max(read_rows) <= READDIR_BATCH


class KernelBuffer:
    """Stands in for ``pyfuse3.readdir_reply``: takes up to ``room`` entries."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken: list[DirEntry] = []

    def __call__(self, entry: DirEntry) -> bool:
        if len(self.taken) >= self.room:
            return False
        self.taken.append(entry)
        return True


async def test_a_sequential_reader_gets_a_full_buffer_per_request(make_fs: Any) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"seq", 0o755, 0, 0)
    await make_files(mount, d.ino, [f"s{i:04}" for i in range(300)])
    fh = await mount.fs.opendir(d.ino)
    room = 3 * READDIR_BATCH + 5  # a buffer of several batches
    built_before = mount.fs.names.readdir_entries
    first = KernelBuffer(room)
    await mount.fs.readdir_into(fh, 0, first)
    assert len(first.taken) == room
    # Four batches (the first with "." and ".."); built in vain: what the
    # refused batch held beyond the buffer.
    assert mount.fs.names.readdir_entries - built_before == 2 + 4 * READDIR_BATCH
    assert mount.fs.names.dir_handles.get(fh).resume_at == first.taken[-1].cookie
    # The next request starts where the reply ended: it reads on, to the end.
    rest = KernelBuffer(10_000)
    await mount.fs.readdir_into(fh, first.taken[-1].cookie, rest)
    names = [e.name for e in first.taken + rest.taken]
    assert len(names) == 302 and len(set(names)) == 302
    mount.fs.releasedir(fh)


async def test_a_request_after_a_seek_gets_one_batch(make_fs: Any) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"seek", 0o755, 0, 0)
    await make_files(mount, d.ino, [f"k{i:04}" for i in range(300)])
    fh = await mount.fs.opendir(d.ino)
    everything = await read_handle(mount, fh)
    seek_to = everything[100].cookie
    built_before = mount.fs.names.readdir_entries
    buffer = KernelBuffer(10_000)
    await mount.fs.readdir_into(fh, seek_to, buffer)
    assert [e.name for e in buffer.taken] == [e.name for e in everything[101 : 101 + READDIR_BATCH]]
    assert mount.fs.names.readdir_entries - built_before == READDIR_BATCH
    # The reader now goes on from where that reply ended: a whole buffer.
    more = KernelBuffer(10_000)
    await mount.fs.readdir_into(fh, buffer.taken[-1].cookie, more)
    assert len(more.taken) == 302 - 101 - READDIR_BATCH
    mount.fs.releasedir(fh)


async def test_a_reply_the_kernel_refuses_at_once_leaves_the_resume_offset(make_fs: Any) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"full", 0o755, 0, 0)
    await make_files(mount, d.ino, [f"f{i:03}" for i in range(100)])
    fh = await mount.fs.opendir(d.ino)
    head = KernelBuffer(10)
    await mount.fs.readdir_into(fh, 0, head)
    resume_at = head.taken[-1].cookie
    await mount.fs.readdir_into(fh, head.taken[3].cookie, KernelBuffer(0))  # a seek, refused
    assert mount.fs.names.dir_handles.get(fh).resume_at == resume_at
    # Still sequential from where the kernel last took entries.
    built_before = mount.fs.names.readdir_entries
    tail = KernelBuffer(10_000)
    await mount.fs.readdir_into(fh, resume_at, tail)
    assert len(tail.taken) == 102 - 10
    assert mount.fs.names.readdir_entries - built_before == 102 - 10
    mount.fs.releasedir(fh)


async def test_a_listing_again_decodes_only_the_inodes_that_changed(make_fs: Any) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"warm", 0o755, 0, 0)
    inos = await make_files(mount, d.ino, [f"w{i:03}" for i in range(100)])
    mount.fs.access_times.flush()  # no access time left pending in memory
    cache = mount.fs.names.attribute_cache

    async def listing() -> dict[bytes, Attributes]:
        fh = await mount.fs.opendir(d.ino)
        try:
            return {e.name: e.attrs for e in await read_handle(mount, fh)}
        finally:
            mount.fs.releasedir(fh)

    first = await listing()
    hits, misses = cache.hits, cache.misses
    second = await listing()
    assert (cache.hits - hits, cache.misses - misses) == (100, 0)
    assert all(second[name] is first[name] for name in first if name not in (b".", b".."))
    # Changes through the mount are seen by the next listing, which decodes
    # the records of those inodes only.
    await mount.fs.setattr(inos["w007"], mode=0o600)
    opened = await mount.fs.open(inos["w008"], os.O_WRONLY)
    await mount.fs.write(opened.fh, 0, b"grown")
    await mount.fs.release(opened.fh)
    hits, misses = cache.hits, cache.misses
    third = await listing()
    assert stat.S_IMODE(third[b"w007"].mode) == 0o600
    assert third[b"w008"].size == 5
    assert (cache.hits - hits, cache.misses - misses) == (98, 2)
    # An access time still pending in memory is shown, though LMDB lacks it.
    opened = await mount.fs.open(inos["w009"], os.O_RDONLY)
    await mount.fs.read(opened.fh, 0, 1)
    await mount.fs.release(opened.fh)
    pending = mount.fs.access_times.pending.get(inos["w009"])
    assert pending is not None and pending != third[b"w009"].atime_ns
    assert (await listing())[b"w009"].atime_ns == pending


async def test_a_directory_removed_while_open_reads_as_empty(make_fs: Any) -> None:
    mount = await make_fs()
    d = await mount.fs.mkdir(ROOT_INO, b"gone", 0o755, 0, 0)
    fh = await mount.fs.opendir(d.ino)
    await mount.fs.rmdir(ROOT_INO, b"gone")
    assert await mount.fs.names.readdir_handle(fh, 0) == []


# --- section 4: stale-while-revalidate -----------------------------------------------------


class HeldLists:
    """Forwards to a store; a listing of a prefix that ``holds`` (by default
    the data prefixes, not the shadow's) waits in its thread until
    ``release`` is set, and the most listings held at once is kept."""

    def __init__(self, inner: Any, holds: Callable[[str], bool] = is_data_prefix) -> None:
        self.inner = inner
        self.holds = holds
        self.release = threading.Event()
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[Any]:
        pages = self.inner.list_pages(prefix, page_size)  # counted when started
        if not self.holds(prefix):
            yield from pages
            return
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            self.release.wait(30)
            yield from pages
        finally:
            with self._lock:
                self.running -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_lookups_in_an_expired_directory_do_not_wait_and_start_one_relisting(
    make_fs: Any, s3_store: Any
) -> None:
    for i in range(5):
        put(s3_store, f"d/f{i}", b"x" * i)
    mount = await make_fs(namespace=SHORT_TTL)
    d = await mount.fs.lookup(ROOT_INO, b"d")
    await mount.fs.opendir(d.ino)
    held = HeldLists(mount.fs.namespace.listings.store)
    mount.fs.namespace.listings.store = held
    await trio.sleep(0.35)  # every listing is expired now
    lists_before, heads_before = len(mount.store.lists), mount.store.heads
    with trio.fail_after(20):  # a re-listing waited for would hold until released (30 s)
        for _ in range(3):
            for i in range(5):
                attrs = await mount.fs.lookup(d.ino, f"f{i}".encode())
                # Served from the expired listing: the kernel must not keep it.
                assert (attrs.size, attrs.timeout) == (i, 0.0)
        fh = await mount.fs.opendir(d.ino)
        entries = await read_handle(mount, fh)
        assert len(entries) == 7 and {e.attrs.timeout for e in entries[2:]} == {0.0}
        await trio.sleep(0.2)  # the background tasks start their LISTs
    assert mount.store.lists[lists_before:] == ["d/"]  # one re-listing, in the background
    assert mount.store.heads == heads_before  # every name was in the stale listing
    held.release.set()


def unexpected_shadows(s3_store: Any, dir_prefix: str) -> list[str]:
    """Shadow objects of the children of ``dir_prefix`` that do not carry
    the default file mode (the mount's identity may need a shadow)."""
    pages = s3_store.list_pages(shadow_dir_prefix(dir_prefix))
    return [o.key for page in pages for o in page.objects if "@m0644," not in o.key]


async def test_a_name_missing_from_an_expired_listing_waits_for_the_relisting(
    make_fs: Any, s3_store: Any
) -> None:
    """Visibility: another writer's new name is found at the first lookup after
    ``list_ttl``, with the attributes of a listed name; it costs the
    re-listing of its directory, no HEAD, and an absent name nothing more."""
    put(s3_store, "d/old", b"old")
    mount = await make_fs(namespace=SHORT_TTL)
    d = await mount.fs.lookup(ROOT_INO, b"d")
    await mount.fs.opendir(d.ino)
    put(s3_store, "d/new", b"new!")
    await trio.sleep(0.35)
    lists_before, heads_before = len(mount.store.lists), mount.store.heads
    with trio.fail_after(20):
        attrs = await mount.fs.lookup(d.ino, b"new")  # waits for d's re-listing
        assert (attrs.size, stat.S_IMODE(attrs.mode)) == (4, 0o644)
        assert mount.fs.meta.get_inode(attrs.ino).validated_at != PROVISIONAL
        with pytest.raises(NotFound):
            await mount.fs.lookup(d.ino, b"absent")  # fresh listing now: at once
    assert mount.store.heads == heads_before  # no HEAD for a missing name
    assert mount.store.lists[lists_before:].count("d/") == 1  # one re-listing of d
    # A write over it uploads no shadow: its attributes are the canonical ones.
    await mount.write_file("d/new", b"rewritten")
    await mount.flush()
    assert s3_store.get_range("d/new", 0, 100) == b"rewritten"
    assert unexpected_shadows(s3_store, "d/") == []


async def test_the_wait_for_a_missing_name_is_bounded_and_skipped_while_the_bucket_is_slow(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-listing that does not come: ENOENT after ``MISSING_NAME_WAIT``
    from its start, and at once for the next lookups while the endpoint is
    suspect; the name shows once the re-listing is done."""
    monkeypatch.setattr(namespace, "MISSING_NAME_WAIT", 0.5)
    put(s3_store, "d/old", b"old")
    mount = await make_fs(namespace=SHORT_TTL)
    d = await mount.fs.lookup(ROOT_INO, b"d")
    await mount.fs.opendir(d.ino)
    held = HeldLists(mount.fs.namespace.listings.store)
    mount.fs.namespace.listings.store = held
    put(s3_store, "d/new", b"new!")
    await trio.sleep(0.35)
    heads_before = mount.store.heads
    with trio.fail_after(20):  # a LIST that was waited for would hold 30 s
        start = trio.current_time()
        with pytest.raises(NotFound):
            await mount.fs.lookup(d.ino, b"new")  # d's re-listing starts, held
        waited = trio.current_time() - start
        assert 0.4 <= waited < 5, waited
        start = trio.current_time()
        for name in (b"new", b"absent"):
            with pytest.raises(NotFound):
                await mount.fs.lookup(d.ino, name)
        assert trio.current_time() - start < 0.4  # the wait ran out: no more waits
    assert mount.store.heads == heads_before
    done = mount.fs.namespace.listings.listings_done
    held.release.set()
    await wait_listed(mount, done, 1)
    attrs = await mount.fs.lookup(d.ino, b"new")
    assert (attrs.size, stat.S_IMODE(attrs.mode)) == (4, 0o644)


async def test_a_name_a_relisting_adds_is_looked_up_with_its_settled_attributes(
    make_fs: Any, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the merge of a re-listing's data pages and its shadow listing,
    a new name is provisional (owner-only).  A lookup of it waits for the
    settling; one of a name of the listing served does not; an open (its
    revalidation HEAD) does not make the provisional attributes permanent."""
    # Outcomes, not times: a loaded machine may take long for the shadow LIST.
    monkeypatch.setattr(namespace, "STALE_LISTING_WAIT", 30.0)
    put(s3_store, "d/old", b"old")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=0.3, revalidate_ttl=0))
    d = await mount.fs.lookup(ROOT_INO, b"d")
    await mount.fs.lookup(d.ino, b"old")
    held = HeldLists(
        mount.fs.namespace.listings.store, holds=lambda p: p == shadow_dir_prefix("d/")
    )
    mount.fs.namespace.listings.store = held
    put(s3_store, "d/new", b"new!")
    await trio.sleep(0.35)
    with trio.fail_after(20):
        await mount.fs.lookup(d.ino, b"old")  # d's re-listing starts
        while (new_ino := mount.fs.meta.lookup(d.ino, b"new")) is None:
            await trio.sleep(0.01)  # merged, its shadow listing held
        assert mount.fs.meta.get_inode(new_ino).validated_at == PROVISIONAL
        assert (await mount.fs.lookup(d.ino, b"old")).size == 3  # served at once
        opened = await mount.fs.open(new_ino, os.O_RDONLY)  # revalidated by a HEAD
        await mount.fs.release(opened.fh)
        assert mount.fs.meta.get_inode(new_ino).validated_at == PROVISIONAL
        looked_up: list[Attributes] = []

        async def look() -> None:
            looked_up.append(await mount.fs.lookup(d.ino, b"new"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(look)
            await trio.sleep(0.3)
            assert looked_up == [], "served before its attributes were settled"
            held.release.set()
    assert looked_up[0].ino == new_ino
    assert stat.S_IMODE(looked_up[0].mode) == 0o644
    await mount.write_file("d/new", b"rewritten")
    await mount.flush()
    assert unexpected_shadows(s3_store, "d/") == []


async def test_relistings_of_many_directories_are_bounded(make_fs: Any, s3_store: Any) -> None:
    dirs = [f"d{i:02}" for i in range(12)]
    for name in dirs:
        put(s3_store, f"{name}/f", b"f")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=2.0, revalidate_ttl=60))
    inos = {}
    for name in dirs:
        inos[name] = (await mount.fs.lookup(ROOT_INO, name.encode())).ino
        await mount.fs.lookup(inos[name], b"f")
    held = HeldLists(mount.fs.namespace.listings.store)
    mount.fs.namespace.listings.store = held
    await trio.sleep(2.05)
    lists_before = len(mount.store.lists)
    done = mount.fs.namespace.listings.listings_done
    # A shuffled sweep, three times over, while the re-listings are held (30 s).
    with trio.fail_after(20):
        for _ in range(3):
            for name in reversed(dirs):
                await mount.fs.lookup(inos[name], b"f")
        await trio.sleep(0.2)
    started = data_lists(mount.store.lists[lists_before:])
    assert held.running == held.most_running == RELIST_CONCURRENCY
    assert len(started) == RELIST_CONCURRENCY  # the others wait for a slot
    held.release.set()
    await wait_listed(mount, done, len(dirs))
    # One re-listing per directory, whatever the number of lookups.
    relisted = data_lists(mount.store.lists[lists_before:])
    assert sorted(relisted) == sorted(f"{n}/" for n in dirs)
    assert held.most_running == RELIST_CONCURRENCY
    for name in dirs:  # fresh again: no LIST
        await mount.fs.lookup(inos[name], b"f")
    assert data_lists(mount.store.lists[lists_before:]) == relisted


class FailingLists:
    """Forwards to a store; every listing of ``prefix`` fails."""

    def __init__(self, inner: Any, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.failed = 0

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[Any]:
        pages = self.inner.list_pages(prefix, page_size)
        if prefix == self.prefix:
            self.failed += 1
            raise StoreError("listing refused by the test")
        yield from pages

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_failed_relisting_is_not_retried_before_list_ttl(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "d/f", b"f")
    mount = await make_fs(namespace=NamespaceConfig(list_ttl=2.0, revalidate_ttl=60))
    d = await mount.fs.lookup(ROOT_INO, b"d")
    await mount.fs.lookup(d.ino, b"f")
    failing = FailingLists(mount.fs.namespace.listings.store, "d/")
    mount.fs.namespace.listings.store = failing
    await trio.sleep(2.05)
    with trio.fail_after(10):
        await mount.fs.lookup(d.ino, b"f")  # served stale; the re-listing fails
        while failing.failed == 0:
            await trio.sleep(0.01)
        for _ in range(20):
            assert (await mount.fs.lookup(d.ino, b"f")).size == 1
            await trio.sleep(0.01)
    assert failing.failed == 1
    await trio.sleep(2.0)  # list_ttl after the failure: one more try
    await mount.fs.lookup(d.ino, b"f")
    with trio.fail_after(10):
        while failing.failed < 2:
            await trio.sleep(0.01)
