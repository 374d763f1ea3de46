"""Property tests of LRU victim selection (pure policy code)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tierfs.policy.eviction import Candidate, bytes_to_reach, select_lru_victims

candidates = st.lists(
    st.builds(
        Candidate,
        ino=st.integers(1, 10**6),
        atime=st.floats(0, 1e9, allow_nan=False),
        nbytes=st.integers(0, 10**9),
    ),
    max_size=50,
    unique_by=lambda c: c.ino,
)


@given(candidates, st.integers(-10, 10**10))
def test_victims_are_the_oldest_and_just_enough(cands: list[Candidate], need: int) -> None:
    victims = select_lru_victims(cands, need)
    if need <= 0:
        assert victims == []
        return
    freed = sum(v.nbytes for v in victims)
    total = sum(c.nbytes for c in cands)
    assert freed >= need or freed == total
    # Dropping the last victim would not have been enough: no waste.
    if victims:
        assert freed - victims[-1].nbytes < need
    # Every victim is at least as old as every non-victim that has bytes.
    chosen = {v.ino for v in victims}
    rest = [c for c in cands if c.ino not in chosen and c.nbytes > 0]
    if victims and rest:
        assert max(v.atime for v in victims) <= min(c.atime for c in rest)


@given(st.integers(0, 10**12), st.integers(1, 10**12), st.floats(0, 1))
def test_bytes_to_reach(used: int, capacity: int, fraction: float) -> None:
    need = bytes_to_reach(used, capacity, fraction)
    assert need >= 0
    assert used - need <= int(fraction * capacity) or need == 0
