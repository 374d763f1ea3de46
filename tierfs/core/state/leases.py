"""Reader leases: the tier files handed out to readers, and what they hold.

``tierfs.client.open`` reads a warm file from its tier file directly: the
daemon opens the tier file read-only and passes the descriptor over the
control socket (``TierFS.hand_out``).  From then on the reader's reads
never reach the daemon, so the daemon can no longer guarantee what they
see by serving them; it guarantees it by never changing a handed-out
file's bytes in place.  A ``Lease`` records one hand-out: which tier file
(tier, inode, and the tier file's own ``st_ino``, so that a later file at
the same path is told from it), its size on disk, and who holds it (uid,
connection).

Invariants (each is kept by the part named):

* A tier file that a live lease names is never written, truncated or
  punched in place:
  - a local write or truncate first turns the file from CLEAN to DIRTY
    (``FileWrites._make_dirty``), which replaces a leased tier file with a
    copy (``OpenFiles.unshare``: copy the file's blocks on that tier to a
    new file, rename it over the old path) before the first byte changes;
    the reader keeps the old file, with the bytes it opened;
  - a changed object in the bucket (``OpenFiles.content_changed``) unlinks
    a leased tier file instead of truncating it;
  - a relocate whose source still holds other blocks leaves the moved
    ranges of a leased file unpunched (``DataMovement``);
  - eviction and a relocate of the whole file unlink it, as always.
  An unlinked file keeps its bytes for as long as a reader holds it open.
* What readers hold outside the tiers' accounting (tier files unlinked
  while leased: *detached*; counted with a stat per leased file, at most
  every ``HELD_RECOUNT`` seconds and less often the more leases there are)
  is bounded: a new hand-out is refused (the
  reader then opens through the mount) while the detached bytes of a tier
  are above ``held_limit`` of it.  ``status`` shows them (``held``).
* Leases are bounded per connection (``PER_CONNECTION``), per user
  (``PER_USER``) and in all (``TOTAL``): past them a hand-out is refused,
  never an error.
* A lease ends when its reader says it closed the descriptor, or when its
  connection closes (the process exited): ``end_connection``.  A reader
  that kept a copy of the descriptor past that (a ``dup`` it did not
  report) still reads a file that is never rewritten in place while a
  lease is live; after that it may see later bytes of the same file (never
  another file's: inode numbers are never reused).  A daemon that
  restarts starts with no leases: descriptors handed out by the one
  before are no longer protected against rewrites in place.

Everything here runs on the trio loop, except ``Tier`` file-system calls
the callers make in threads.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tierfs.tally import Tally
from tierfs.tiers import Tier

#: Leases at most per reader connection, per user, and in all.
PER_CONNECTION = 2048
PER_USER = 8192
TOTAL = 65536
#: Detached bytes a tier may hold for readers, as a share of its capacity.
HELD_SHARE = 0.1
#: The detached bytes are counted again (a stat per lease) at most this often.
HELD_RECOUNT = 1.0
#: ... and at most every this many seconds per live lease.
HELD_RECOUNT_PER_LEASE = 1e-4


@dataclass(slots=True, eq=False)
class Lease:
    ident: int
    tier: int
    ino: int
    #: The tier file's own inode number when it was handed out.
    file_id: int
    #: Bytes of it on disk (its blocks), what it holds if it is unlinked.
    disk_bytes: int
    uid: int
    connection: int
    since: float = field(default_factory=time.monotonic)


class ReaderLeases:
    """The live leases (see the module docstring)."""

    def __init__(self, tiers: list[Tier]) -> None:
        self.tiers = tiers
        self._ids = itertools.count(1)
        self.leases: dict[int, Lease] = {}
        #: (tier, ino) -> its leases.
        self._by_file: dict[tuple[int, int], set[int]] = {}
        self._per_user = Tally()
        self._per_connection = Tally()
        #: Tier -> detached bytes, as last counted, and when.
        self._held: list[int] = [0] * len(tiers)
        self._held_files: list[int] = [0] * len(tiers)
        self._held_at = -1.0
        #: Since the daemon started.
        self.handed_out = 0
        self.refused = 0
        self.unshared = 0

    # --- taking and ending ------------------------------------------------------------

    def refusal(self, uid: int, connection: int, tier: int) -> str | None:
        """Why a new lease on ``tier`` may not be taken now (None: it may)."""
        if len(self.leases) >= TOTAL:
            return f"{TOTAL} descriptors are handed out, the most the daemon keeps track of"
        if self._per_user.get(uid, 0) >= PER_USER:
            return f"uid {uid} holds {PER_USER} descriptors, the most one user may"
        if self._per_connection.get(connection, 0) >= PER_CONNECTION:
            return f"this connection holds {PER_CONNECTION} descriptors, the most one may"
        held = self.held_bytes()[tier]
        limit = self.held_limit(tier)
        if held > limit:
            return (
                f"readers hold {held} bytes of files evicted or replaced on tier "
                f"{self.tiers[tier].name}, more than {limit}"
            )
        return None

    def take(
        self, tier: int, ino: int, file_id: int, disk_bytes: int, uid: int, connection: int
    ) -> Lease:
        lease = Lease(next(self._ids), tier, ino, file_id, disk_bytes, uid, connection)
        self.leases[lease.ident] = lease
        self._by_file.setdefault((tier, ino), set()).add(lease.ident)
        self._per_user.add(uid, 1)
        self._per_connection.add(connection, 1)
        self.handed_out += 1
        return lease

    def end(self, ident: int, connection: int) -> bool:
        """End lease ``ident`` of ``connection`` (a lease of another
        connection, or one already ended, is left alone: False)."""
        lease = self.leases.get(ident)
        if lease is None or lease.connection != connection:
            return False
        del self.leases[ident]
        key = (lease.tier, lease.ino)
        idents = self._by_file.get(key)
        if idents is not None:
            idents.discard(ident)
            if not idents:
                del self._by_file[key]
        self._per_user.take(lease.uid, 1)
        self._per_connection.take(lease.connection, 1)
        return True

    def end_connection(self, connection: int) -> int:
        """The connection closed: every lease it held ends."""
        idents = [i for i, lease in self.leases.items() if lease.connection == connection]
        for ident in idents:
            self.end(ident, connection)
        return len(idents)

    # --- what the guards ask ----------------------------------------------------------

    def leased(self, tier: int, ino: int) -> bool:
        """Does a live lease name the tier file now at the path of ``ino``
        on ``tier``?  (A lease of an older file there, unlinked since,
        does not count.)"""
        idents = self._by_file.get((tier, ino))
        if not idents:
            return False
        current = self.tiers[tier].file_id(ino)
        return current is not None and any(self.leases[i].file_id == current for i in idents)

    def leased_tiers(self, ino: int) -> list[int]:
        return [t for t in range(len(self.tiers)) if self.leased(t, ino)]

    def file_leases(self, ino: int) -> Iterator[Lease]:
        for tier in range(len(self.tiers)):
            for ident in self._by_file.get((tier, ino), ()):
                yield self.leases[ident]

    # --- what readers hold ------------------------------------------------------------

    def held_limit(self, tier: int) -> int:
        return int(self.tiers[tier].capacity * HELD_SHARE)

    def held_bytes(self) -> list[int]:
        """Per tier: bytes of tier files unlinked (evicted, moved, replaced)
        while a lease still holds them (counted at most every
        ``HELD_RECOUNT`` seconds)."""
        now = time.monotonic()
        # One stat per leased file, on the loop: the more leases, the rarer
        # (65,536 leases: every 6.5 s, about 2 % of the loop).
        if now - self._held_at >= max(HELD_RECOUNT, len(self.leases) * HELD_RECOUNT_PER_LEASE):
            self._held_at = now
            held = [0] * len(self.tiers)
            files = [0] * len(self.tiers)
            current: dict[tuple[int, int], int | None] = {}
            for lease in self.leases.values():
                key = (lease.tier, lease.ino)
                if key not in current:
                    current[key] = self.tiers[lease.tier].file_id(lease.ino)
                if current[key] != lease.file_id:
                    held[lease.tier] += lease.disk_bytes
                    files[lease.tier] += 1
            self._held, self._held_files = held, files
        return self._held

    def status(self) -> dict[str, object]:
        held = self.held_bytes()
        return {
            "leases": len(self.leases),
            "users": len(self._per_user),
            "handed_out": self.handed_out,
            "refused": self.refused,
            "unshared": self.unshared,
            "held": {
                self.tiers[t].name: {
                    "bytes": held[t],
                    "files": self._held_files[t],
                    "limit": self.held_limit(t),
                }
                for t in range(len(self.tiers))
            },
        }
