"""``Journal.wait_done``: a waiter is narrowed by the journal as entries leave it."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from tierfs.core.state.journal import Journal
from tierfs.meta import MetaDB


async def test_waiters_wake_when_their_own_entries_are_gone_and_leave_nothing_behind(
    tmp_path: Path,
) -> None:
    meta = MetaDB(tmp_path, "s3://b")
    try:
        journal = Journal(meta)
        with journal.write() as w:
            seqs = [w.append({"op": "delete", "key": f"k{i}"}) for i in range(6)]
        done: list[str] = []

        async def wait(name: str, wanted: set[int]) -> None:
            await journal.wait_done(wanted)
            done.append(name)

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                # "gone" also names an entry that never was: it does not wait for it.
                nursery.start_soon(wait, "low", set(seqs[:3]))
                nursery.start_soon(wait, "all", set(seqs))
                nursery.start_soon(wait, "gone", {seqs[0], max(seqs) + 100})
                await trio.testing.wait_all_tasks_blocked()
                assert journal.waiters == 3
                with journal.write() as w:  # one transaction ends two entries
                    w.remove(seqs[0])
                    w.remove(seqs[1])
                await trio.testing.wait_all_tasks_blocked()
                assert done == ["gone"]
                with journal.write() as w:
                    w.remove(seqs[2])
                await trio.testing.wait_all_tasks_blocked()
                assert done == ["gone", "low"]
                for seq in seqs[3:]:
                    assert not done[2:]
                    with journal.write() as w:
                        w.remove(seq)
        assert done == ["gone", "low", "all"]
        assert journal.waiters == 0
        assert not journal._done_watchers
    finally:
        meta.close()


async def test_a_cancelled_waiter_is_forgotten(tmp_path: Path) -> None:
    meta = MetaDB(tmp_path, "s3://b")
    try:
        journal = Journal(meta)
        with journal.write() as w:
            seq = w.append({"op": "delete", "key": "k"})
        with trio.move_on_after(0.05):
            await journal.wait_done({seq})
        assert journal.waiters == 0
        assert not journal._done_watchers
        await journal.wait_done(set())  # nothing to wait for: returns at once
    finally:
        meta.close()
