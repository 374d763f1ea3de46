"""``core.names.access.permits``: the kernel's rule for owner, group,
other and root, from the stored mode."""

from __future__ import annotations

import stat

from hypothesis import given
from hypothesis import strategies as st

from tierfs.core.names.access import READ, SEARCH, WRITE, Caller, permits
from tierfs.meta import Inode


def inode(mode: int, uid: int = 1000, gid: int = 100) -> Inode:
    return Inode(
        ino=2, mode=stat.S_IFREG | mode, uid=uid, gid=gid, size=0, mtime_ns=0, ctime_ns=0,
        parent=1, name=b"f",
    )  # fmt: skip


def test_owner_group_and_other_bits_decide_and_root_may_do_anything() -> None:
    owner, member = Caller(1000, frozenset({1000})), Caller(2000, frozenset({100}))
    stranger = Caller(3000, frozenset({3000}))
    private = inode(0o640)
    assert permits(private, owner, READ | WRITE)
    assert permits(private, member, READ) and not permits(private, member, WRITE)
    assert not permits(private, stranger, READ)
    assert permits(private, Caller(0, frozenset({0})), READ | WRITE | SEARCH)
    # The owner's bits apply to the owner even when the group's are wider.
    assert not permits(inode(0o070, uid=1000, gid=100), Caller(1000, frozenset({100})), READ)


@given(st.integers(0, 0o777), st.integers(0, 7), st.sampled_from(["owner", "group", "other"]))
def test_permits_is_the_class_bits_of_the_mode(mode: int, want: int, who: str) -> None:
    caller = {
        "owner": Caller(1000, frozenset({5})),
        "group": Caller(2000, frozenset({100, 7})),
        "other": Caller(3000, frozenset({3000})),
    }[who]
    shift = {"owner": 6, "group": 3, "other": 0}[who]
    assert permits(inode(mode), caller, want) == ((mode >> shift) & 7 & want == want)
