"""``Tally``: amounts per key (per user) that come and go, with no key left
at zero; what the bounds between users count with (connections, unfinished
lines, spooled bytes)."""

from __future__ import annotations


class Tally(dict[int, int]):
    """key -> a positive amount; a key whose amount falls to 0 is dropped."""

    def add(self, key: int, amount: int) -> None:
        self[key] = self.get(key, 0) + amount

    def take(self, key: int, amount: int) -> None:
        left = self.get(key, 0) - amount
        if left > 0:
            self[key] = left
        else:
            self.pop(key, None)
