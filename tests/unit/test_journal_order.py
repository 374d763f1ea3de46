"""``Journal.runnable``: the bucket's changes for one name apply in the order
the mount made them.  An entry never overtakes an earlier entry on
the same key, nor an earlier delete of a related name: the same name as
object or ``name/`` marker, a name above it, or a name under it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tierfs.core.state.journal import DeletedNames, Journal
from tierfs.meta import MetaDB


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    meta = MetaDB(tmp_path, "s3://b")
    try:
        yield Journal(meta)
    finally:
        meta.close()


def keys_of(seq: int, entry: dict[str, Any]) -> list[str]:
    return [entry["key"]]


async def test_a_marker_waits_for_the_delete_of_the_object_of_its_name(journal: Journal) -> None:
    with journal.write() as w:
        delete = w.append({"op": "delete", "key": "d/n0"})
        mkdir = w.append({"op": "mkdir", "key": "d/n0/", "ino": 7})
        other = w.append({"op": "mkdir", "key": "d/n1/", "ino": 8})
    ready, _ = journal.runnable(keys_of)
    assert ready == [delete, other]
    with journal.write() as w:
        w.remove(delete)
    assert journal.runnable(keys_of)[0] == [mkdir, other]


@pytest.mark.parametrize(
    ("deleted", "later", "waits"),
    [
        ("a/n0/", "a/n0", True),  # rmdir n0, then a file n0
        ("a/n0", "a/n0/x", True),  # rm n0, then mkdir n0 and a file in it
        ("a/n0/x", "a/n0", True),  # a file under n0 goes, then a file n0
        ("a/n0", "a/n00", False),  # another name that starts alike
        ("a/n0", "a/n1/n0", False),  # the same last name elsewhere
        ("a/n0/x", "a/n0/y", False),  # a sibling under the same directory
    ],
)
async def test_related_names_wait_for_an_earlier_delete(
    journal: Journal, deleted: str, later: str, waits: bool
) -> None:
    with journal.write() as w:
        first = w.append({"op": "delete", "key": deleted})
        second = w.append({"op": "upload", "ino": 1, "key": later})
    ready, _ = journal.runnable(keys_of)
    assert ready == ([first] if waits else [first, second])


async def test_a_running_delete_holds_related_names_too(journal: Journal) -> None:
    with journal.write() as w:
        delete = w.append({"op": "delete", "key": "n0"})
        marker = w.append({"op": "mkdir", "key": "n0/", "ino": 3})
    journal.running.add(delete)
    assert journal.runnable(keys_of)[0] == []
    journal.running.discard(delete)
    with journal.write() as w:
        w.remove(delete)
    assert journal.runnable(keys_of)[0] == [marker]


def test_deleted_names_relate_by_whole_segments() -> None:
    names = DeletedNames()
    assert not names
    names.add(["x/y/z/"])
    assert names
    for related in (["x/y/z"], ["x/y/z/w"], ["x/y"], ["x"], ["q", "x/y/"]):
        assert names.related(related), related
    for unrelated in (["x/y/zz"], ["x/yy"], ["y/z"], ["x/y/w"]):
        assert not names.related(unrelated), unrelated
