"""The kill -9 loop: what fsync promised must survive a killed daemon.

One round (``CrashLoop.round``):

1. one or more *writer processes* (this module run as a script, see
   ``writer_main``) create files on the mount, some of them in directories
   they have just made (as ``torch.save`` into a new ``step-N/`` does, with
   no fsync of the directory), write random bytes through write-only or
   read-write handles, ``fsync`` the file, and only AFTER fsync returned
   append ``path<TAB>size<TAB>sha256`` to their manifest (a file outside the
   mount, itself flushed and fsynced per line); then they close the file and
   go on;
2. once every writer has fsynced at least ``min_files`` files, and after a
   further random pause, the round records what was still owed to the
   bucket (``pending_uploads`` from ``tierfs status``: the proof that the
   kill cuts something), SIGKILLs the daemon (the PID ``tierfs status``
   reports, which the ``mount`` fixture started), lazily unmounts the dead
   mount (``fusermount3 -uz``) and waits for the writers to fail and exit;
3. it remounts on the same config, state dir and tiers and checks every
   manifest entry of the round: the name is there and the bytes are equal.
   What is missing or different is reported by path.  ``check_all`` checks
   the promises of every round (call it at the end: a later crash must not
   lose an earlier file either).

Writers are *pinned* to the mount (``writer_main``): a writer that used
plain paths would, after ``fusermount3 -uz`` of the dead mount, go on
creating and fsyncing files in the bare mount point directory and promise
files tierfs never saw: the "last file fsynced before the kill is lost" of
a naive loop.  Each round lists (and removes) what it finds under the bare
mount point before remounting (``RoundResult.stray``), so such a loop shows
where its "lost" files went.

``CrashLoop`` keeps the totals (files fsynced, files lost, files damaged)
over its rounds, for the regression test and the long opt-in loop alike.

Processes: the loop kills only the daemon PID of its own mount, after
checking that it is a tierfs daemon started by the fixture, and only its
own writer processes (by their ``Popen``).  Nothing else is signalled.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuse.conftest import Mount, fusermount, is_tierfsd, wait_until

#: The checkout, so that the writer script can import ``tests``.
REPO_ROOT = Path(__file__).resolve().parent.parent

KiB = 1024
MiB = 1024 * KiB


# --- the writer process ------------------------------------------------------------------


def _file_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.1:
        return 0
    if roll < 0.5:
        return rng.randrange(1, 64 * KiB)
    if roll < 0.9:
        return rng.randrange(64 * KiB, 512 * KiB)
    return rng.randrange(512 * KiB, 2 * MiB + 7)


def _write_all(fd: int, data: bytes, rng: random.Random) -> None:
    view = memoryview(data)
    while view:
        chunk = rng.choice((4 * KiB, 128 * KiB, 1 * MiB))
        view = view[os.write(fd, view[:chunk]) :]


def writer_main(root: Path, manifest: Path, tag: str, seed: int, *, pinned: bool = True) -> int:
    """Create, write and fsync files under ``root`` until an error (the
    daemon died), appending each fsynced file to ``manifest``.

    ``pinned`` (the default): every call resolves its path from an fd of
    the mount's root taken at start, and a file is promised only if
    ``fstat`` shows it on the mount's device.  Unpinned, it uses plain paths
    under ``root``, as most programs do: once the dead mount is lazily
    unmounted, those resolve to the bare mount point directory, and the
    writer goes on creating files THERE, fsyncing and promising them.  Those
    are the "lost" files of a naive kill -9 loop: never seen by tierfs.
    """
    rng = random.Random(seed)
    dirs = [""]
    count = 0
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    root_dev = os.fstat(root_fd).st_dev
    dir_fd = root_fd if pinned else None
    base = Path() if pinned else root
    with open(manifest, "a", encoding="utf-8") as out:
        while True:
            try:
                roll = rng.random()
                if roll < 0.25:
                    # A new directory (sometimes two levels), and the file
                    # goes right into it: nobody fsyncs the directory.
                    parent = "/".join(p for p in (rng.choice(dirs), f"{tag}-d{count}") if p)
                    if rng.random() < 0.3:
                        parent += f"/{tag}-e{count}"
                    parts = parent.split("/")
                    for depth in range(1, len(parts) + 1):
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(base / "/".join(parts[:depth]), dir_fd=dir_fd)
                    dirs.append(parent)
                else:
                    parent = rng.choice(dirs)
                name = "/".join(p for p in (parent, f"{tag}-f{count}") if p)
                data = rng.randbytes(_file_size(rng))
                access = rng.choice((os.O_WRONLY, os.O_RDWR))
                fd = os.open(base / name, access | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
                try:
                    _write_all(fd, data, rng)
                    os.fsync(fd)
                    if pinned and os.fstat(fd).st_dev != root_dev:
                        print(f"writer {tag}: {name} is not on the mount", file=sys.stderr)
                        return 1
                    # fsync returned: from here on the file is promised.
                    out.write(f"{name}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n")
                    out.flush()
                    os.fsync(out.fileno())
                finally:
                    os.close(fd)
                count += 1
            except OSError as exc:
                print(f"writer {tag}: stopped after {count} files: {exc}", file=sys.stderr)
                return 0


# --- the loop ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Promise:
    """One fsynced file: its path relative to the mount, size and sha256."""

    path: str
    size: int
    sha256: str


def read_manifest(path: Path) -> list[Promise]:
    """The complete lines of a manifest (a line cut by the kill is not a promise:
    the writer appends it only after fsync returned, and fsyncs it before
    the next file)."""
    promises: list[Promise] = []
    if not path.exists():
        return promises
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.endswith("\n"):
            continue
        name, size, digest = line.rstrip("\n").split("\t")
        promises.append(Promise(name, int(size), digest))
    return promises


def mounted(path: Path) -> bool:
    """Is something mounted at ``path``?  ``os.path.ismount`` says no for a
    mount whose daemon died (stat fails with ENOTCONN); mountinfo knows."""
    target = os.fsencode(str(path.resolve())).replace(b" ", b"\\040")
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == target for line in f)


def kill9(m: Mount, pid: int) -> None:
    """SIGKILL the daemon of ``m`` (its PID from ``tierfs status``), then
    lazily unmount the dead mount."""
    assert pid in m.pids, f"daemon pid {pid} was not started by this test"
    assert is_tierfsd(pid), f"pid {pid} is not a live tierfs daemon"
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not is_tierfsd(pid), timeout=10), f"pid {pid} survived SIGKILL"
    done = fusermount("-uz", str(m.path))
    assert done.returncode == 0, f"fusermount3 -uz failed: {done.stderr.strip()}"
    assert wait_until(lambda: not mounted(m.path), timeout=10), "the dead mount is still there"


@dataclass(slots=True)
class RoundResult:
    fsynced: int  # promises of this round
    pending_at_kill: int  # journal entries still owed to the bucket at the kill
    lost: list[str]  # promises of this round: names gone after the remount
    damaged: list[str]  # promises of this round: names present with other bytes
    #: Files found under the bare mount point after the unmount: written
    #: after the mount was gone, by a writer that was not pinned to it.
    stray: list[str]


@dataclass
class CrashLoop:
    """Runs kill -9 rounds against one mount (see the module docstring)."""

    mount: Mount
    workdir: Path
    writers: int = 2
    min_files: int = 3
    max_pause: float = 1.0
    seed: int = 0
    #: Writers resolve paths from an fd of the mount (see ``writer_main``).
    pinned: bool = True
    rounds: list[RoundResult] = field(default_factory=list)
    _manifests: list[Path] = field(default_factory=list)

    @property
    def fsynced(self) -> int:
        return sum(r.fsynced for r in self.rounds)

    @property
    def lost(self) -> list[str]:
        return [name for r in self.rounds for name in r.lost]

    @property
    def damaged(self) -> list[str]:
        return [name for r in self.rounds for name in r.damaged]

    def _start_writer(self, n: int, manifest: Path, tag: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                str(self.mount.path),
                str(manifest),
                tag,
                str(self.seed * 1000 + n),
                "pinned" if self.pinned else "paths",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=str(self.workdir),
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )

    def round(self) -> RoundResult:
        m = self.mount
        index = len(self.rounds)
        rng = random.Random(self.seed * 7919 + index)
        manifests = [self.workdir / f"manifest-r{index}-w{n}.tsv" for n in range(self.writers)]
        procs = [
            self._start_writer(index * 100 + n, path, f"r{index}w{n}")
            for n, path in enumerate(manifests)
        ]
        self._manifests += manifests
        try:
            started = wait_until(
                lambda: (
                    all(len(read_manifest(p)) >= self.min_files for p in manifests)
                    or any(p.poll() is not None for p in procs)
                ),
                timeout=120,
                interval=0.02,
            )
            died = [p.stderr.read().decode() for p in procs if p.poll() is not None and p.stderr]
            assert started and not died, f"writers did not get going: {died}\n{m.log_tail()}"
            time.sleep(rng.uniform(0.0, self.max_pause))
            pid = int(m.status()["pid"])
            pending = int(m.status()["pending_uploads"])
            kill9(m, pid)
        finally:
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()  # our own writer, stuck on the dead mount
                    proc.wait(timeout=10)
                if proc.stderr is not None:
                    proc.stderr.close()
        fsynced = sum(len(read_manifest(p)) for p in manifests)
        stray = self._remove_strays()
        m.mount()
        lost, damaged = self.check(manifests)
        result = RoundResult(fsynced, pending, lost, damaged, stray)
        self.rounds.append(result)
        return result

    def _remove_strays(self) -> list[str]:
        """Files under the bare (unmounted) mount point: listed, then removed
        so that the remount starts on an empty directory."""
        m = self.mount
        assert not mounted(m.path)
        stray = sorted(str(p.relative_to(m.path)) for p in m.path.rglob("*") if not p.is_dir())
        for child in list(m.path.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        return stray

    def check_all(self) -> tuple[list[str], list[str]]:
        """Every promise of every round so far: (lost names, damaged names)."""
        return self.check(self._manifests)

    def check(self, manifests: list[Path]) -> tuple[list[str], list[str]]:
        """The promises in ``manifests``: (lost names, damaged names)."""
        lost: list[str] = []
        damaged: list[str] = []
        for manifest in manifests:
            for promise in read_manifest(manifest):
                try:
                    data = (self.mount.path / promise.path).read_bytes()
                except FileNotFoundError:
                    lost.append(promise.path)
                    continue
                if len(data) != promise.size or hashlib.sha256(data).hexdigest() != promise.sha256:
                    damaged.append(promise.path)
        return lost, damaged

    def summary(self) -> str:
        pending = [r.pending_at_kill for r in self.rounds]
        return (
            f"{len(self.rounds)} rounds, {self.fsynced} files fsynced, "
            f"{len(self.lost)} lost, {len(self.damaged)} damaged, "
            f"{sum(len(r.stray) for r in self.rounds)} written beside the dead mount; "
            f"pending uploads at each kill: {pending}; lost: {self.lost[:10]}; "
            f"damaged: {self.damaged[:10]}"
        )


if __name__ == "__main__":
    sys.exit(
        writer_main(
            Path(sys.argv[1]),
            Path(sys.argv[2]),
            sys.argv[3],
            int(sys.argv[4]),
            pinned=sys.argv[5] == "pinned",
        )
    )
