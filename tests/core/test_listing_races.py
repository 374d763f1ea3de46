"""A listing that ran while this node put objects into the bucket must not
sweep them.

Found by the kill -9 loop (``tests/crashloop.py``): after a remount the
replayed uploads complete while the checker's lookups re-list the root; a
LIST sent just before an upload completed does not contain the object, and
the sweep at the end of that listing saw a *clean* file "missing from the
bucket" and dropped its name: a fsynced file gave ENOENT until the next
listing brought it back under a new inode number.  The same held for a
directory marker and for the copy of a rename.  Each test below opens a
listing, lets the bucket side complete, then finishes the listing with the
LIST that was taken before (``MetaTxn.mark_seen`` is the fix).
"""

from __future__ import annotations

import time
from typing import Any

from tests.core.conftest import CoreMount
from tierfs.config import WriteConfig
from tierfs.meta import ROOT_INO, ListedEntry

HELD = WriteConfig(mode="back", upload_delay=3600, part_size=8 * 1024 * 1024)


def listing_taken_now(mount: CoreMount, dir_ino: int, entries: list[ListedEntry]) -> Any:
    """Start a listing of ``dir_ino`` whose LIST answer is ``entries``
    (what the bucket held at this moment); returns a function that merges
    it and finishes the listing, as ``Namespace._list`` does."""
    fs = mount.fs
    watch = fs.journal.watch_deletes()
    deleted = watch.__enter__()  # before the LIST, as Namespace._list
    gen = fs.meta.begin_listing(dir_ino)
    ident = fs.identity

    def finish() -> None:
        fs.meta.merge_listing(
            dir_ino,
            gen,
            entries,
            prefix="",
            skip_new=lambda name, is_dir: deleted(name.decode() + ("/" if is_dir else "")),
            protects=fs.journal.protects,
            file_mode=ident.file_mode,
            dir_mode=ident.dir_mode,
            uid=ident.uid,
            gid=ident.gid,
            now=time.time(),
        )
        fs.meta.finish_listing(dir_ino, gen, time.time(), prefix="", protects=fs.journal.protects)
        watch.__exit__(None, None, None)

    return finish


async def test_upload_completing_during_a_listing_keeps_the_name(make_fs: Any) -> None:
    mount = await make_fs(write=HELD)
    ino = await mount.write_file("new.bin", b"promised by fsync")
    finish = listing_taken_now(mount, ROOT_INO, [])  # LIST before the upload
    await mount.flush()  # the upload completes: the file is clean now
    assert (await mount.fs.where("new.bin"))["state"] == "clean"
    finish()
    assert mount.fs.meta.lookup(ROOT_INO, b"new.bin") == ino, "the listing swept the file"
    assert await mount.read_file("new.bin") == b"promised by fsync"


async def test_marker_completing_during_a_listing_keeps_the_directory(make_fs: Any) -> None:
    mount = await make_fs(write=HELD)
    attrs = await mount.fs.mkdir(ROOT_INO, b"empty", 0o755, 0, 0)
    finish = listing_taken_now(mount, ROOT_INO, [])
    await mount.flush()  # the dir/ marker is put: the directory is clean
    finish()
    assert mount.fs.meta.lookup(ROOT_INO, b"empty") == attrs.ino, "the listing swept the dir"


async def test_copy_completing_during_a_listing_keeps_the_renamed_file(make_fs: Any) -> None:
    mount = await make_fs(write=HELD)
    ino = await mount.write_file("a.bin", b"x" * 1000)
    await mount.flush()  # a.bin is a clean object now
    await mount.fs.rename(ROOT_INO, b"a.bin", ROOT_INO, b"b.bin", 0)
    finish = listing_taken_now(mount, ROOT_INO, [ListedEntry(b"a.bin", False, 1000, "e")])
    await mount.flush()  # the copy to b.bin and the delete of a.bin complete
    finish()
    assert mount.fs.meta.lookup(ROOT_INO, b"b.bin") == ino, "the listing swept the file"
    assert await mount.read_file("b.bin") == b"x" * 1000


async def test_overwrite_completing_during_a_listing_is_not_reverted(
    make_fs: Any, s3_store: Any
) -> None:
    """The LIST still shows the object's previous version (size, ETag): the
    listing must not take it for a change in the bucket and drop the new
    content's blocks."""
    mount = await make_fs(write=HELD)
    await mount.write_file("f.bin", b"old")
    await mount.flush()
    old = s3_store.head("f.bin")
    await mount.write_file("f.bin", b"new content")
    finish = listing_taken_now(mount, ROOT_INO, [ListedEntry(b"f.bin", False, 3, old.etag)])
    await mount.flush()
    finish()
    where = await mount.fs.where("f.bin")
    assert where["size"] == len(b"new content") and where["cached_bytes"] == where["size"], where
    assert await mount.read_file("f.bin") == b"new content"


# --- a name that changed type locally while the LIST still shows the old type ----------------
#
# Found while chasing a flaky model run (a file missing after renames): a
# directory ``c`` is renamed away and a file is renamed to ``c``.  Until the
# deletes of ``c/...`` have run, a LIST still shows the prefix ``c/``; the
# merge took it for "the file became a directory in the bucket" (or, when the
# file was linked during the listing, for "both ``c`` and ``c/`` exist") and
# dropped the local file, dirty data and all, then skipped the new directory
# because its delete was pending: ``c`` was gone.


async def _setup_dir_c_and_dirty_y(mount: CoreMount) -> int:
    fs = mount.fs
    await fs.mkdir(ROOT_INO, b"c", 0o755, 0, 0)
    await mount.write_file("c/x", b"in the old directory")
    await mount.flush()  # c/ and c/x are in the bucket, clean
    return await mount.write_file("y", b"not uploaded yet")  # dirty, upload held


async def test_listing_from_before_a_rename_keeps_the_file_renamed_over_a_directory(
    make_fs: Any,
) -> None:
    """LIST taken before both renames: it shows the prefix ``c/`` and the file
    linked at ``c`` during the listing must not give way to it."""
    mount = await make_fs(write=HELD)
    fs = mount.fs
    ino = await _setup_dir_c_and_dirty_y(mount)
    finish = listing_taken_now(mount, ROOT_INO, [ListedEntry(b"c", True)])
    await fs.rename(ROOT_INO, b"c", ROOT_INO, b"d", 0)
    await fs.rename(ROOT_INO, b"y", ROOT_INO, b"c", 0)
    finish()
    assert fs.meta.lookup(ROOT_INO, b"c") == ino, "the listing replaced the file by the old dir"
    assert await mount.read_file("c") == b"not uploaded yet"
    await mount.flush()
    assert await mount.read_file("c") == b"not uploaded yet"
    assert await mount.read_file("d/x") == b"in the old directory"


async def test_listing_during_the_old_directorys_deletes_keeps_the_renamed_file(
    make_fs: Any,
) -> None:
    """LIST taken after both renames, while the old directory's objects are
    still in the bucket: ``c/`` is not "the file became a directory"."""
    mount = await make_fs(write=HELD)
    fs = mount.fs
    ino = await _setup_dir_c_and_dirty_y(mount)
    await fs.rename(ROOT_INO, b"c", ROOT_INO, b"d", 0)
    await fs.rename(ROOT_INO, b"y", ROOT_INO, b"c", 0)
    finish = listing_taken_now(mount, ROOT_INO, [ListedEntry(b"c", True), ListedEntry(b"d", True)])
    finish()
    assert fs.meta.lookup(ROOT_INO, b"c") == ino, "the listing replaced the file by the old dir"
    assert await mount.read_file("c") == b"not uploaded yet"
    await mount.flush()
    assert await mount.read_file("c") == b"not uploaded yet"


async def test_delete_completing_during_a_listing_does_not_bring_the_name_back(
    make_fs: Any,
) -> None:
    """The LIST was sent before the unlink's delete reached the bucket: it
    still shows the name, whose delete is no longer pending when the page
    is merged (``Journal.watch_deletes``)."""
    mount = await make_fs(write=HELD)
    fs = mount.fs
    await mount.write_file("a.bin", b"x" * 10)
    await mount.write_file("b.bin", b"y" * 10)
    await mount.flush()
    finish = listing_taken_now(
        mount,
        ROOT_INO,
        [ListedEntry(b"a.bin", False, 10, "e"), ListedEntry(b"b.bin", False, 10, "e")],
    )
    await fs.unlink(ROOT_INO, b"a.bin")
    await fs.rename(ROOT_INO, b"b.bin", ROOT_INO, b"c.bin", 0)
    await mount.flush()  # the deletes of a.bin and b.bin are done
    assert not fs.journal.being_deleted("a.bin") and not fs.journal.being_deleted("b.bin")
    finish()
    names = sorted(name for _cookie, name, _ino in fs.meta.read_dir(ROOT_INO, 0, 100))
    assert names == [b"c.bin"], f"the listing brought deleted names back: {names}"


async def test_overlapping_listings_each_end_their_own_delete_watch(make_fs: Any) -> None:
    """Two listings at once (a background re-listing and a lookup's) whose
    watches end in the other order: each ends its own.  ``list.remove``
    compared the watchers' sets by value, so the later listing, ending
    first, removed the earlier one's (equal) set: that one then missed the
    deletes that completed after, and its own end failed with ValueError
    (the model test saw it in the daemon log)."""
    mount = await make_fs(write=HELD)
    journal = mount.fs.journal
    first, second = journal.watch_deletes(), journal.watch_deletes()
    seen_by_first = first.__enter__()
    second.__enter__()
    second.__exit__(None, None, None)
    delete = {"op": "delete", "key": "gone.bin"}
    journal._count_delete(delete, +1)  # a delete enters the journal...
    journal._count_delete(delete, -1)  # ...and completes during the first listing
    assert seen_by_first("gone.bin")
    first.__exit__(None, None, None)
    assert journal._delete_watchers == []
