"""AttributeCache: served only for the very record it was built from, and
bounded."""

from __future__ import annotations

from tierfs.core.names.attrcache import AttributeCache
from tierfs.core.state.results import Attributes
from tierfs.meta import Inode
from tierfs.meta.records import encode_inode


def record(ino: int, size: int, mode: int = 0o100644) -> bytes:
    return encode_inode(
        Inode(
            ino=ino, mode=mode, uid=0, gid=0, size=size, mtime_ns=1, ctime_ns=1, parent=1, name=b"f"
        )
    )


def build_counting(built: list[int]) -> AttributeCache:
    def build(inode: Inode) -> Attributes:
        built.append(inode.ino)
        return Attributes(inode.ino, inode.mode, 1, 0, 0, inode.size, 4096, 1, 1, 1, 60.0)

    return AttributeCache(build, capacity=3)


def test_the_same_record_is_served_from_the_cache_and_a_changed_one_is_decoded() -> None:
    built: list[int] = []
    cache = build_counting(built)
    first = cache.attributes(5, record(5, 10))
    assert cache.attributes(5, record(5, 10)) is first
    changed = cache.attributes(5, record(5, 11))
    assert changed.size == 11 and built == [5, 5]
    assert cache.attributes(5, record(5, 11)) is changed
    assert (cache.hits, cache.misses) == (2, 2)


def test_a_full_cache_starts_over_and_never_holds_more_than_its_capacity() -> None:
    built: list[int] = []
    cache = build_counting(built)
    for ino in range(2, 9):
        cache.attributes(ino, record(ino, 1))
        assert len(cache) <= 3
    cache.attributes(8, record(8, 1))
    assert built == [2, 3, 4, 5, 6, 7, 8]  # 8 was kept after the last start-over
