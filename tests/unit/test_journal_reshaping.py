"""``Journal.reshaping``: the namespace generation changes before a rename or
removal and again after it, so a key worked out while the change ran (as a
rename's own transaction may) is not taken for a current one afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierfs.core.state.journal import Journal
from tierfs.meta import MetaDB


def test_the_generation_changes_before_and_after_the_change(tmp_path: Path) -> None:
    meta = MetaDB(tmp_path, "s3://b")
    try:
        journal = Journal(meta)
        before = journal.namespace_gen
        with journal.reshaping() as writer:
            during = journal.namespace_gen
            assert during != before
            writer.append({"op": "delete", "key": "a/b"})
        assert journal.namespace_gen not in (before, during)
        assert len(journal.entries) == 1  # an ordinary journal write otherwise
    finally:
        meta.close()


def test_a_failed_change_still_changes_the_generation_after_it(tmp_path: Path) -> None:
    meta = MetaDB(tmp_path, "s3://b")
    try:
        journal = Journal(meta)
        with pytest.raises(RuntimeError), journal.reshaping():
            during = journal.namespace_gen
            raise RuntimeError("the change failed half-way")
        assert journal.namespace_gen != during
    finally:
        meta.close()
