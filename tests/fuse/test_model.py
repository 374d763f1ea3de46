"""Reference-model test: random operation sequences on a real mount and on a
plain local directory must leave the same tree.

A Hypothesis ``RuleBasedStateMachine`` applies every operation twice: to a
fresh tierfs mount (its own bucket prefix, tiers and state dir per example)
and to a reference directory under ``tmp_path``.  Each operation must give
the same outcome on both sides (the same return value, or the same errno),
and after every step the two trees must match: names, types, file sizes and
file contents.

Operations: create (random bytes, some crossing block boundaries), write at
an offset (also past EOF, also O_APPEND), truncate (grow and shrink), rename
of files and directories (onto existing names too), unlink, mkdir, rmdir,
fsync, ``tierfs flush``, remount (the reference is unchanged: everything must
persist), and changes made behind tierfs's back with boto3: a new object in
a known directory, an overwritten object and a deleted object.  Before an
external change the mount is flushed, so that no owed bucket change races
with it; after it, the test polls the mount (a listing of the parent, a
stat and a read of the name) until the change shows, and fails if it does
not within ``CHANGE_DEADLINE``: tierfs serves an expired listing while it
re-lists in the background, so a change shows within ``list_ttl`` plus one
re-listing, not at the first access past ``list_ttl``.  Then the same change
is applied to the reference.

At the end of each example the mount is flushed and the bucket itself is
compared with the reference: every file is an object with the same bytes,
every empty directory a ``dir/`` marker, nothing else is left (no stale keys
from renames or unlinks, no open multipart uploads), and the daemon log has
no unexpected exception.

Uploads start right after close (``upload_delay = 0s``) so that they race with
the operations that follow; ``list_ttl`` is short so that directories are
re-listed and merged with local changes often.  Block size is the minimum,
64 KiB, so that modest files cross many block boundaries.

The default run is small (CI): a few examples, each with at most
``DEFAULT_MAX_REMOUNTS`` remounts (a remount costs a daemon start);
``test_model_long`` (``--run-slow``) runs many more and longer examples, with
no limit on remounts.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import random
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.faults import FaultProxy
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    control_request,
    fusermount,
    is_tierfsd,
    run_tierfs,
    stop_daemon,
    write_config,
)
from tierfs.errors import ControlError

pytestmark = [pytest.mark.fuse, pytest.mark.long]

KiB = 1024
MiB = 1024 * KiB
BLOCK = 64 * KiB
LIST_TTL = 0.5
REVALIDATE_TTL = 0.5
#: Sleep past both TTLs (and the kernel's entry and attribute timeouts,
#: which tierfs sets to list_ttl).
SETTLE = max(LIST_TTL, REVALIDATE_TTL) + 0.4
#: An external change must show on the mount within this many seconds
#: (list_ttl plus one background re-listing, on a loaded machine).
CHANGE_DEADLINE = 10.0
UPLOAD_DELAY = "0s"
#: Remounts per example in the default run (``test_model_long``: no limit).
DEFAULT_MAX_REMOUNTS = 3
#: A flush of a few small files that takes longer than this hangs.
FLUSH_TIMEOUT = 30.0

#: Log lines that mean the daemon hit an error it did not expect.  The last:
#: the bucket's changes for one name ran out of order (a ``file://`` backing
#: refuses ``x/...`` while the object ``x`` is there).
LOG_ALARMS = (
    "Traceback",
    "failed unexpectedly",
    " ERROR ",
    " CRITICAL ",
    "cannot have both 'x' and 'x/...'",
)
#: Log lines of known tierfs bugs, each pinned by a strict xfail test: the
#: model tolerates them so that it keeps looking for new ones.  Remove an
#: entry when its xfail test starts passing.  (None at the moment.)
KNOWN_BUG_LOG_LINES: dict[str, str] = {}


# --- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    """Reproducible random bytes: short to print, cheap to shrink."""

    seed: int
    size: int

    def data(self) -> bytes:
        return random.Random(self.seed).randbytes(self.size)


_boundary_sizes = st.sampled_from(
    [BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 7, 4 * BLOCK - 3, MiB - 1, MiB, MiB + 1]
)
file_blobs = st.builds(
    Blob,
    seed=st.integers(0, 1000),
    size=st.one_of(st.integers(0, 4 * KiB), st.integers(0, 300 * KiB), _boundary_sizes),
)
write_blobs = st.builds(
    Blob,
    seed=st.integers(0, 1000),
    size=st.one_of(st.integers(0, 2 * KiB), st.integers(1, 160 * KiB)),
)
offsets = st.one_of(
    st.integers(0, 8 * KiB),
    st.integers(0, 400 * KiB),
    st.sampled_from([BLOCK - 1, BLOCK, 3 * BLOCK + 1]),
)
sizes = st.one_of(st.just(0), st.integers(0, 400 * KiB), st.sampled_from([BLOCK - 1, BLOCK + 1]))
# A small pool, so that names collide: renames onto existing files and
# directories, EEXIST, ENOTEMPTY, file-over-directory...
names = st.sampled_from(["a", "b", "c", "dd", "é x"])


# --- helpers ---------------------------------------------------------------------------


Outcome = tuple[str, Any]


def outcome(fn: Callable[[Path], Any], root: Path) -> Outcome:
    """``("ok", result)`` or ``("err", "ENOENT")``."""
    try:
        return ("ok", fn(root))
    except OSError as exc:
        return ("err", errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def at(root: Path, rel: str) -> Path:
    return root / rel if rel else root


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if offset is not None:
            offset += n
        view = view[n:]


def read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def snapshot(root: Path) -> dict[str, Any]:
    """rel path -> "dir" or (size from stat, content) for everything below root."""
    tree: dict[str, Any] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        for name in sorted(os.listdir(at(root, rel))):
            child = join(rel, name)
            st_ = os.lstat(at(root, child))
            if stat.S_ISDIR(st_.st_mode):
                tree[child] = "dir"
                pending.append(child)
            elif stat.S_ISREG(st_.st_mode):
                tree[child] = (st_.st_size, read_file(at(root, child)))
            else:
                tree[child] = f"mode {st_.st_mode:o}"
    return tree


def describe(value: Any) -> str:
    if isinstance(value, tuple):
        size, content = value
        return f"file st_size={size} read {len(content)} bytes sha256 {sha(content)[:12]}"
    return str(value)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def tree_diff(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = []
    for rel in sorted(expected.keys() | actual.keys()):
        want, got = expected.get(rel), actual.get(rel)
        if want == got:
            continue
        if want is None:
            problems.append(f"{rel!r}: unexpected on the mount ({describe(got)})")
        elif got is None:
            problems.append(f"{rel!r}: missing on the mount (expected {describe(want)})")
        elif isinstance(want, tuple) and isinstance(got, tuple):
            where = first_difference(want[1], got[1])
            problems.append(
                f"{rel!r}: expected {describe(want)}, mount has {describe(got)}; "
                f"content differs from byte {where}"
            )
        else:
            problems.append(f"{rel!r}: expected {describe(want)}, mount has {describe(got)}")
    return problems


def mounted(path: Path) -> bool:
    """Is something mounted at ``path``?  (``os.path.ismount`` says no for a
    mount whose daemon died: its stat fails with ENOTCONN.)"""
    target = os.fsencode(str(path.resolve())).replace(b" ", b"\\040")
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == target for line in f)


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Record each step as it runs, so that a failure (even a flaky one,
    which Hypothesis cannot replay) shows the sequence that led to it."""

    @functools.wraps(fn)
    def step(self: TierfsModel, **kwargs: Any) -> Any:
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "data")
        self.steps.append(f"{fn.__name__}({args})")
        return fn(self, **kwargs)

    return step


# --- one mount per example ---------------------------------------------------------------


class ModelEnv:
    """Makes a fresh mount (own prefix, tiers, state) per example; cleans up."""

    def __init__(
        self, endpoint: str, bucket: str, s3: Any, base: Path, backing: str = "s3"
    ) -> None:
        self.endpoint = endpoint
        self.bucket = bucket
        self.s3 = s3
        self.base = base
        #: "s3" (the moto bucket) or "file" (a ``file://`` directory per example).
        self.backing = backing
        self.backing_dirs: dict[str, Path] = {}
        self.mounts: list[Mount] = []
        self.examples = 0

    def new_example(self) -> tuple[Mount, Path]:
        self.examples += 1
        base = self.base / f"ex{self.examples}"
        mountpoint, ref, state_dir = base / "mnt", base / "ref", base / "state"
        tier_dirs = {"nvme": base / "nvme", "hdd": base / "hdd"}
        for d in (mountpoint, ref, *tier_dirs.values()):
            d.mkdir(parents=True)
        prefix = f"model-{self.examples}-{uuid.uuid4().hex[:8]}"
        config_path = base / "tierfs.toml"
        backing_dir = None
        if self.backing == "file":
            backing_dir = base / "backing"
            backing_dir.mkdir()
            self.backing_dirs[prefix] = backing_dir
        write_config(
            config_path,
            endpoint=self.endpoint,
            bucket=self.bucket,
            prefix=prefix,
            state_dir=state_dir,
            tier_dirs=tier_dirs,
            capacities={"nvme": "64MiB", "hdd": "128MiB"},
            block_size=f"{BLOCK // KiB}KiB",
            readahead_max="256KiB",
            list_ttl=f"{LIST_TTL}s",
            revalidate_ttl=f"{REVALIDATE_TTL}s",
            backing_dir=backing_dir,
        )
        with open(config_path, "a") as f:
            f.write(f'\n[write]\nupload_delay = "{UPLOAD_DELAY}"\n')
        m = Mount(
            path=mountpoint,
            config_path=config_path,
            state_dir=state_dir,
            tier_dirs=tier_dirs,
            endpoint=self.endpoint,
            bucket=self.bucket,
            prefix=prefix,
            s3=self.s3,
            list_ttl=LIST_TTL,
            revalidate_ttl=REVALIDATE_TTL,
            block_size=BLOCK,
        )
        self.mounts.append(m)
        m.mount()
        return m, ref

    def cleanup(self) -> list[str]:
        problems = []
        for m in self.mounts:
            if mounted(m.path):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run_tierfs("umount", str(m.path))
            if mounted(m.path):
                fusermount("-u", str(m.path))
            if mounted(m.path):
                problems.append(f"{m.path} needed a lazy unmount")
                fusermount("-uz", str(m.path))
            for pid in m.pids:
                if is_tierfsd(pid):
                    stop_daemon(pid)
        return problems


def _model_env(
    bucket: tuple[str, str], s3_client: Any, tmp_path: Path, backing: str
) -> Iterator[ModelEnv]:
    endpoint, name = bucket
    env = ModelEnv(endpoint, name, s3_client, tmp_path, backing=backing)
    try:
        yield env
    finally:
        problems = env.cleanup()
        still = [str(m.path) for m in env.mounts if mounted(m.path)]
        assert not still, f"still mounted after teardown: {still}"
        assert not problems, "; ".join(problems)


@pytest.fixture
def model_env(bucket: tuple[str, str], s3_client: Any, tmp_path: Path) -> Iterator[ModelEnv]:
    """A ``ModelEnv`` over the moto bucket (the minimal repros read it with boto3)."""
    yield from _model_env(bucket, s3_client, tmp_path, "s3")


@pytest.fixture(params=["s3", "file"])
def any_backing_env(
    bucket: tuple[str, str], s3_client: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ModelEnv]:
    """A ``ModelEnv`` over the moto bucket, and one over a ``file://`` backing."""
    yield from _model_env(bucket, s3_client, tmp_path, request.param)


# --- the state machine -----------------------------------------------------------------------


class TierfsModel(RuleBasedStateMachine):
    """See the module docstring.  ``env`` is set by the test function."""

    env: ModelEnv
    #: Remounts allowed per example (None: no limit).  A remount costs two
    #: CLI runs and a daemon start, and Hypothesis's swarm testing sometimes
    #: enables few rules, so that an unlimited example can be little else
    #: than twenty remounts.
    max_remounts: int | None = None

    files = Bundle("files")
    dirs = Bundle("dirs")
    fifos = Bundle("fifos")
    parents = st.one_of(st.just(""), dirs)  # "" is the mount root

    def __init__(self) -> None:
        super().__init__()
        self.m, self.ref = self.env.new_example()
        self.log_start = len(self.m.log_text())
        self.steps: list[str] = []
        self.remounts = 0

    def context(self) -> str:
        """The steps so far and the daemon log of this example, for a failure."""
        log = self.m.log_text()[self.log_start :].splitlines()
        return (
            "\nsteps of this example:\n  "
            + "\n  ".join(self.steps)
            + f"\ndaemon log ({self.m.log_path.name}), last lines:\n  "
            + "\n  ".join(log[-40:])
        )

    # applying one operation to both sides ----------------------------------------

    def both(self, what: str, fn: Callable[[Path], Any]) -> Outcome:
        expected = outcome(fn, self.ref)
        actual = outcome(fn, self.m.path)
        assert actual == expected, (
            f"{what}: reference gave {expected}, tierfs gave {actual}" + self.context()
        )
        return expected

    # namespace -------------------------------------------------------------------------

    @rule(target=files, parent=parents, name=names, blob=file_blobs, sync=st.booleans())
    @logged
    def create_file(self, parent: str, name: str, blob: Blob, sync: bool) -> str:
        path = join(parent, name)
        data = blob.data()

        def op(root: Path) -> None:
            # O_NONBLOCK: a fifo of that name answers ENXIO on both sides
            # instead of waiting for a reader (no effect on a regular file).
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK
            fd = os.open(at(root, path), flags, 0o644)
            try:
                write_all(fd, data)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)

        self.both(f"create {path!r}", op)
        return path

    @rule(target=dirs, parent=parents, name=names)
    @logged
    def mkdir(self, parent: str, name: str) -> str:
        path = join(parent, name)
        self.both(f"mkdir {path!r}", lambda root: os.mkdir(at(root, path)))
        return path

    def unlinked(self, path: str) -> Any:
        """Unlink ``path`` on both sides; what goes back into its bundle."""
        result = self.both(f"unlink {path!r}", lambda root: os.unlink(at(root, path)))
        return multiple() if result[0] == "ok" else path

    @rule(target=files, path=consumes(files))
    @logged
    def unlink(self, path: str) -> Any:
        return self.unlinked(path)

    @rule(target=dirs, path=consumes(dirs))
    @logged
    def rmdir(self, path: str) -> Any:
        result = self.both(f"rmdir {path!r}", lambda root: os.rmdir(at(root, path)))
        return multiple() if result[0] == "ok" else path

    @rule(target=files, src=consumes(files), parent=parents, name=names)
    @logged
    def rename_file(self, src: str, parent: str, name: str) -> str:
        dst = join(parent, name)
        result = self.both(
            f"rename {src!r} -> {dst!r}", lambda root: os.rename(at(root, src), at(root, dst))
        )
        return dst if result[0] == "ok" else src

    @rule(target=dirs, src=consumes(dirs), parent=parents, name=names)
    @logged
    def rename_dir(self, src: str, parent: str, name: str) -> str:
        dst = join(parent, name)
        result = self.both(
            f"rename {src!r} -> {dst!r}", lambda root: os.rename(at(root, src), at(root, dst))
        )
        return dst if result[0] == "ok" else src

    @rule(target=fifos, parent=parents, name=names)
    @logged
    def mkfifo(self, parent: str, name: str) -> str:
        """A fifo (an empty object whose metadata carries the type).  Fifos
        have a bundle of their own: an open of one for data would block."""
        path = join(parent, name)
        self.both(f"mkfifo {path!r}", lambda root: os.mkfifo(at(root, path), 0o644))
        return path

    @rule(target=fifos, path=consumes(fifos))
    @logged
    def unlink_fifo(self, path: str) -> Any:
        return self.unlinked(path)

    @rule(target=files, parent=parents, name=names, first=file_blobs, last=file_blobs)
    @logged
    def reuse_name_across_types(self, parent: str, name: str, first: Blob, last: Blob) -> Any:
        """One name as a file, then a directory, then a fifo, then a file
        again, with chmods, and pauses past ``list_ttl`` so that the parent
        is re-listed in the background between the steps (a
        delete still owed must go before the later creates of that name,
        and no listing may bring the old object back meanwhile)."""
        path = join(parent, name)
        if self.both(f"lstat {path!r}", lambda root: os.lstat(at(root, path)).st_mode)[0] == "ok":
            return multiple()  # the name is taken: nothing to reuse
        pause = LIST_TTL + 0.1

        def create(data: bytes, mode: int) -> Callable[[Path], None]:
            def op(root: Path) -> None:
                fd = os.open(at(root, path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    write_all(fd, data)
                finally:
                    os.close(fd)
                os.chmod(at(root, path), mode)

            return op

        def kind(root: Path) -> str:
            st_ = os.lstat(at(root, path))
            return f"{stat.S_IFMT(st_.st_mode):o} {stat.S_IMODE(st_.st_mode):o}"

        def unlink_open_then_mkdir(root: Path) -> None:
            # Still open when unlinked: the delete of its object waits for
            # the close, and the directory of the same name comes first.
            fd = os.open(at(root, path), os.O_RDONLY)
            try:
                os.unlink(at(root, path))
                os.mkdir(at(root, path), 0o755)
                time.sleep(0.2)  # the uploader looks at the marker meanwhile
            finally:
                os.close(fd)

        steps: list[tuple[str, Callable[[Path], Any]]] = [
            ("create", create(first.data(), 0o111)),
            ("unlink (open), mkdir", unlink_open_then_mkdir),
            ("chmod", lambda root: os.chmod(at(root, path), 0o700)),
            ("rmdir", lambda root: os.rmdir(at(root, path))),
            ("mkfifo", lambda root: os.mkfifo(at(root, path), 0o644)),
            ("unlink", lambda root: os.unlink(at(root, path))),
            ("create", create(last.data(), 0o644)),
        ]
        for index, (what, op) in enumerate(steps):
            self.both(f"{what} {path!r}", op)
            if index in (0, 2, 4):  # uploaded, then listings come and go
                time.sleep(pause)
                self.both(f"lstat {path!r}", kind)
                self.both(f"listdir {parent!r}", lambda root: sorted(os.listdir(at(root, parent))))
        return path

    # data ----------------------------------------------------------------------------

    @rule(path=files, offset=offsets, blob=write_blobs, append=st.booleans(), sync=st.booleans())
    @logged
    def write_at(self, path: str, offset: int, blob: Blob, append: bool, sync: bool) -> None:
        data = blob.data()

        def op(root: Path) -> None:
            flags = os.O_WRONLY | os.O_NONBLOCK | (os.O_APPEND if append else 0)
            fd = os.open(at(root, path), flags)
            try:
                write_all(fd, data, None if append else offset)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)

        how = "append" if append else f"write at {offset}"
        self.both(f"{how} {len(data)} bytes to {path!r}", op)

    @rule(path=files, size=sizes)
    @logged
    def truncate(self, path: str, size: int) -> None:
        self.both(f"truncate {path!r} to {size}", lambda root: os.truncate(at(root, path), size))

    @rule(path=files)
    @logged
    def fsync(self, path: str) -> None:
        def op(root: Path) -> None:
            fd = os.open(at(root, path), os.O_RDWR)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        self.both(f"fsync {path!r}", op)

    # tierfs itself ------------------------------------------------------------------------

    def flush_all(self) -> None:
        """``tierfs flush MP``: the request the CLI sends, sent from this
        process (an interpreter start per flush made up much of the run)."""
        try:
            control_request(self.m.path, "flush", {"paths": [""]}, timeout=FLUSH_TIMEOUT)
        except TimeoutError:
            status = run_tierfs("status", "--json", str(self.m.path)).stdout
            raise AssertionError(
                f"tierfs flush still waiting after {FLUSH_TIMEOUT:.0f} s; status: {status}"
                + self.context()
            ) from None
        except ControlError as exc:
            raise AssertionError(f"tierfs flush failed: {exc}" + self.context()) from None

    @rule()
    @logged
    def flush(self) -> None:
        self.flush_all()

    def may_remount(self) -> bool:
        return self.max_remounts is None or self.remounts < self.max_remounts

    @precondition(may_remount)
    @rule()
    @logged
    def remount(self) -> None:
        self.remounts += 1
        self.m.remount()

    # changes behind tierfs's back ------------------------------------------------------------

    def ref_entries(self, want_dirs: bool) -> list[str]:
        """Directories ("" the root), or regular files (fifos left out: an
        open of one for data would block)."""
        out = [""] if want_dirs else []
        for dirpath, dirnames, filenames in os.walk(self.ref):
            rel = os.path.relpath(dirpath, self.ref)
            rel = "" if rel == "." else rel
            if want_dirs:
                out += [join(rel, n) for n in dirnames]
            else:
                out += [
                    join(rel, n)
                    for n in filenames
                    if stat.S_ISREG(os.lstat(os.path.join(dirpath, n)).st_mode)
                ]
        return sorted(out)

    def mount_view(self, path: str) -> Any:
        """What the mount shows at ``path``: None if its parent's listing
        lacks it, else (size from stat, content) as ``snapshot`` has it."""
        parent, _, name = path.rpartition("/")
        try:
            if name not in os.listdir(at(self.m.path, parent)):
                return None
            st_ = os.lstat(at(self.m.path, path))
            if not stat.S_ISREG(st_.st_mode):
                return f"mode {st_.st_mode:o}"  # never opened: a fifo's open blocks
            return (st_.st_size, read_file(at(self.m.path, path)))
        except FileNotFoundError:
            return None

    def await_external_change(self, path: str, body: bytes | None) -> None:
        """Poll until the mount shows ``body`` at ``path`` (None: the name is
        gone); fail if it does not within ``CHANGE_DEADLINE`` seconds."""
        want = None if body is None else (len(body), body)
        deadline = time.monotonic() + CHANGE_DEADLINE
        while (seen := self.mount_view(path)) != want:
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"external change of {path!r} not shown after {CHANGE_DEADLINE:.0f} s: "
                    f"expected {describe(want)}, mount has {describe(seen)}" + self.context()
                )
            time.sleep(0.1)

    def external_write(self, path: str, body: bytes) -> None:
        """Another tool writes the object at ``path`` (a put, or a plain
        write into a ``file://`` backing)."""
        backing_dir = self.env.backing_dirs.get(self.m.prefix)
        if backing_dir is None:
            self.m.s3.put_object(Bucket=self.m.bucket, Key=self.m.key(path), Body=body)
            return
        target = backing_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.external"
        temp.write_bytes(body)
        temp.rename(target)

    def external_remove(self, path: str) -> None:
        """Another tool deletes the object at ``path``."""
        backing_dir = self.env.backing_dirs.get(self.m.prefix)
        if backing_dir is None:
            self.m.s3.delete_object(Bucket=self.m.bucket, Key=self.m.key(path))
        else:
            (backing_dir / path).unlink()

    @rule(data=st.data(), blob=file_blobs)
    @logged
    def external_put(self, data: st.DataObject, blob: Blob) -> None:
        """Another tool puts a new object into a directory tierfs knows."""
        parent = data.draw(st.sampled_from(self.ref_entries(want_dirs=True)), label="parent")
        taken = set(os.listdir(at(self.ref, parent)))
        free = [n for n in ["a", "b", "c", "dd", "é x", "new"] if n not in taken]
        free = free or [f"new{len(taken)}"]
        name = data.draw(st.sampled_from(free), label="name")
        path = join(parent, name)
        self.steps.append(f"  # external put of {path!r}")
        body = blob.data()
        self.flush_all()  # nothing owed to the bucket races with the change
        self.external_write(path, body)
        self.await_external_change(path, body)
        at(self.ref, path).write_bytes(body)

    def _pick_file(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.ref_entries(want_dirs=False)), label="file")

    def has_files(self) -> bool:
        return bool(self.ref_entries(want_dirs=False))

    @precondition(has_files)
    @rule(data=st.data(), blob=file_blobs)
    @logged
    def external_overwrite(self, data: st.DataObject, blob: Blob) -> None:
        """Another tool replaces an object tierfs has uploaded."""
        path = self._pick_file(data)
        self.steps.append(f"  # external overwrite of {path!r}")
        body = blob.data()
        self.flush_all()
        self.external_write(path, body)
        self.await_external_change(path, body)
        at(self.ref, path).write_bytes(body)

    @precondition(has_files)
    @rule(data=st.data())
    @logged
    def external_delete(self, data: st.DataObject) -> None:
        """Another tool deletes an object tierfs has uploaded (and is clean)."""
        path = self._pick_file(data)
        self.steps.append(f"  # external delete of {path!r}")
        self.flush_all()
        self.external_remove(path)
        self.await_external_change(path, None)
        at(self.ref, path).unlink()

    # checks ------------------------------------------------------------------------------------

    @invariant()
    def trees_match(self) -> None:
        expected = snapshot(self.ref)
        try:
            actual = snapshot(self.m.path)
        except OSError as exc:
            raise AssertionError(f"reading the mount failed: {exc!r}" + self.context()) from exc
        problems = tree_diff(expected, actual)
        assert not problems, (
            "mount differs from the reference:\n  " + "\n  ".join(problems) + self.context()
        )

    def bucket_objects(self) -> dict[str, Callable[[], bytes]]:
        """Key (under the mount's prefix) -> a reader of its bytes, of every
        object of the backing, attribute shadows left out."""
        backing_dir = self.env.backing_dirs.get(self.m.prefix)
        if backing_dir is not None:  # the ``file://`` layout (tierfs.store.local)
            objects: dict[str, Callable[[], bytes]] = {}
            for dirpath, dirnames, filenames in os.walk(backing_dir):
                rel = os.path.relpath(dirpath, backing_dir)
                rel = "" if rel == "." else rel
                dirnames[:] = [d for d in dirnames if not d.startswith(".tierfs-")]
                for name in filenames:
                    if name == ".tierfs-dirmarker":
                        objects[rel + "/"] = lambda: b""
                    elif not name.startswith(".tierfs-"):
                        objects[join(rel, name)] = functools.partial(
                            read_file, Path(dirpath) / name
                        )
            return objects
        s3, prefix = self.m.s3, self.m.prefix + "/"
        keys: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.m.bucket, Prefix=prefix
        ):
            keys += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
        return {
            rel: functools.partial(
                lambda key: s3.get_object(Bucket=self.m.bucket, Key=key)["Body"].read(),
                prefix + rel,
            )
            for rel in keys
            if not rel.startswith(".tierfs-attrs/")
        }

    def bucket_problems(self) -> list[str]:
        """The bucket (after a flush) against the reference tree.  A special
        file (a fifo) is an empty object."""
        objects = self.bucket_objects()
        keys = sorted(objects)
        expected = snapshot(self.ref)
        problems = []
        for rel in keys:
            if rel.endswith("/"):
                if rel[:-1] and expected.get(rel[:-1]) != "dir":
                    problems.append(f"stale directory marker {rel!r}")
                continue
            want = expected.get(rel)
            if isinstance(want, str) and want.startswith("mode "):
                want = (0, b"")  # a special file: an empty object
            if not isinstance(want, tuple):
                problems.append(f"stale object {rel!r} (reference: {want})")
                continue
            body = objects[rel]()
            if body != want[1]:
                problems.append(
                    f"object {rel!r}: {len(body)} bytes sha256 {sha(body)[:12]}, expected "
                    f"{describe(want)}; differs from byte {first_difference(body, want[1])}"
                )
        present = set(keys)
        for rel, want in expected.items():
            if isinstance(want, str) and want.startswith("mode ") and rel not in present:
                problems.append(f"object {rel!r} of a special file is missing ({want})")
            elif isinstance(want, tuple) and rel not in present:
                problems.append(f"object {rel!r} is missing ({describe(want)})")
            elif (
                want == "dir"
                and rel + "/" not in present
                and not any(k.startswith(rel + "/") for k in keys)
            ):
                problems.append(f"directory {rel!r} has neither a marker nor objects")
        if self.m.prefix not in self.env.backing_dirs:
            s3, prefix = self.m.s3, self.m.prefix + "/"
            uploads = s3.list_multipart_uploads(Bucket=self.m.bucket, Prefix=prefix)
            problems += [
                f"multipart upload left open for {u['Key']!r}" for u in uploads.get("Uploads", [])
            ]
        return problems

    def log_alarms(self) -> list[str]:
        """Alarming log lines, each with the traceback that follows it (its
        indented lines and the exception line), so that a failure report
        shows where the daemon raised."""
        lines = self.m.log_text()[self.log_start :].splitlines()
        alarms: list[str] = []
        in_traceback = False
        for line in lines:
            if in_traceback and (line.startswith((" ", "Traceback")) or not line[:4].isdigit()):
                alarms.append(line)  # a frame, or the exception line that ends it
                continue
            in_traceback = False
            if any(a in line for a in LOG_ALARMS) and not any(
                known in line for known in KNOWN_BUG_LOG_LINES
            ):
                alarms.append(line)
                in_traceback = True
        return alarms

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is None:  # the example passed so far
                self.flush_all()
                self.trees_match()
                problems = self.bucket_problems()
                assert not problems, "bucket differs from the reference:\n  " + "\n  ".join(
                    problems
                )
                alarms = self.log_alarms()
                assert not alarms, "daemon log:\n" + "\n".join(alarms[:60])
        finally:
            if mounted(self.m.path):
                done = run_tierfs("umount", str(self.m.path))
                if done.returncode != 0 and mounted(self.m.path):
                    fusermount("-u", str(self.m.path))


# --- the tests ---------------------------------------------------------------------------------


def run_model(
    env: ModelEnv, *, max_examples: int, steps: int, max_remounts: int | None = None
) -> None:
    class Model(TierfsModel):
        pass

    Model.env = env
    Model.max_remounts = max_remounts
    Model.__name__ = Model.__qualname__ = "TierfsModel"
    run_state_machine_as_test(
        Model,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            print_blob=True,
        ),
    )


def test_model(any_backing_env: ModelEnv) -> None:
    run_model(any_backing_env, max_examples=6, steps=25, max_remounts=DEFAULT_MAX_REMOUNTS)


@pytest.mark.slow
def test_model_long(any_backing_env: ModelEnv) -> None:
    run_model(any_backing_env, max_examples=150, steps=60)


# --- minimal repros of bugs the model found ------------------------------------------------------


def test_block_of_file_grown_by_truncate_verifies_after_remount(model_env: ModelEnv) -> None:
    m, _ref = model_env.new_example()
    path = m.path / "f"
    path.write_bytes(b"x")
    os.truncate(path, 10)  # grows inside block 0
    done = run_tierfs("flush", str(m.path))
    assert done.returncode == 0, done.stderr
    start = len(m.log_text())
    m.remount()
    assert path.read_bytes() == b"x" + bytes(9)
    log = m.log_text()[start:]
    assert "checksum mismatch" not in log, log
    assert m.status()["counters"]["verify_failures"] == 0


def test_rename_of_uploaded_file_then_write_keeps_new_key(model_env: ModelEnv) -> None:
    m, _ref = model_env.new_example()
    (m.path / "a").write_bytes(b"hello")
    assert run_tierfs("flush", str(m.path)).returncode == 0  # "a" is clean, in the bucket
    os.rename(m.path / "a", m.path / "c")
    assert run_tierfs("flush", str(m.path)).returncode == 0
    with open(m.path / "c", "ab") as f:
        f.write(b" world")
    assert run_tierfs("flush", str(m.path)).returncode == 0
    keys = sorted(
        o["Key"][len(m.prefix) + 1 :]
        for o in m.s3.list_objects_v2(Bucket=m.bucket, Prefix=m.prefix + "/").get("Contents", [])
    )
    time.sleep(SETTLE)
    names = sorted(os.listdir(m.path))
    assert keys == ["c"], f"bucket keys {keys} (the upload went to the old key)"
    assert names == ["c"], f"mount shows {names}"
    assert m.s3.get_object(Bucket=m.bucket, Key=m.key("c"))["Body"].read() == b"hello world"


def test_file_renamed_over_a_directory_survives_the_old_directorys_listing(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    """A directory ``c`` is renamed away and a dirty file renamed to ``c``;
    while the deletes of ``c/...`` are still owed (the proxy refuses every
    DELETE), re-listings of the root see the prefix ``c/``.  The file must
    stay a file with its bytes, and reach the bucket at ``c`` afterwards.
    (The model once lost ``c`` this way: the merge took ``c/`` for "the file
    became a directory in the bucket" and dropped the local file.)"""
    m = mount(endpoint_url=fault_proxy.endpoint, list_ttl="0.3s", upload_delay="1h")
    (m.path / "c").mkdir()
    (m.path / "c" / "x").write_bytes(b"in the old directory")
    (m.path / "y").write_bytes(b"not uploaded yet")
    assert run_tierfs("flush", str(m.path / "c")).returncode == 0
    fault_proxy.refuse_requests(1_000_000, status="403", match=lambda line: "DELETE" in line)
    os.rename(m.path / "c", m.path / "d")
    os.rename(m.path / "y", m.path / "c")
    listings_before = m.status()["counters"]["listings"]
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        time.sleep(0.4)  # past list_ttl: the next readdir re-lists the root
        assert sorted(os.listdir(m.path)) == ["c", "d"]
        assert stat.S_ISREG(os.lstat(m.path / "c").st_mode)
        assert (m.path / "c").read_bytes() == b"not uploaded yet"
    assert m.status()["counters"]["listings"] > listings_before, "no re-listing ran"
    assert fault_proxy.faults_injected > 0, "no DELETE was refused"
    assert "c/x" in [
        o["Key"][len(m.prefix) + 1 :]
        for o in m.s3.list_objects_v2(Bucket=m.bucket, Prefix=m.prefix + "/").get("Contents", [])
    ], "the old directory's object was deleted: the listing never saw c/"
    fault_proxy.clear_faults()
    done = run_tierfs("flush", str(m.path), timeout=FLUSH_TIMEOUT)
    assert done.returncode == 0, done.stderr
    keys = sorted(
        o["Key"][len(m.prefix) + 1 :]
        for o in m.s3.list_objects_v2(Bucket=m.bucket, Prefix=m.prefix + "/").get("Contents", [])
    )
    assert [k for k in keys if not k.startswith(".tierfs-attrs/")] == ["c", "d/", "d/x"], keys
    assert m.s3.get_object(Bucket=m.bucket, Key=m.key("c"))["Body"].read() == b"not uploaded yet"


class ScriptedDraws:
    """Stands in for Hypothesis's ``st.data()`` in a replayed sequence: each
    ``draw`` returns the next scripted value."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.values.pop(0)


def replay(model_env: ModelEnv, script: Callable[[TierfsModel], None]) -> None:
    """Run ``script`` on a fresh model (the trees compared after every step,
    as Hypothesis does), then its teardown checks (bucket, daemon log)."""

    class Model(TierfsModel):
        pass

    Model.env = model_env
    model = Model()
    try:
        script(model)
        model.trees_match()
    finally:
        model.teardown()


def test_model_replay_root_relisted_while_names_come_and_go(model_env: ModelEnv) -> None:
    """The sequence of a CI failure ("background re-listing of directory
    inode 1 failed" in the daemon log), replayed step by step."""

    def script(m: TierfsModel) -> None:
        steps: list[Callable[[], Any]] = [
            lambda: m.mkdir(parent="", name="a"),
            lambda: m.remount(),
            lambda: m.rmdir(path="a"),
            lambda: m.mkdir(parent="", name="b"),
            lambda: m.remount(),
            lambda: m.mkdir(parent="b", name="c"),
            lambda: m.create_file(parent="b", name="é x", blob=Blob(1, 3000), sync=True),
            lambda: m.mkdir(parent="", name="a"),
            lambda: m.external_overwrite(data=ScriptedDraws("b/é x"), blob=Blob(2, 700)),
            lambda: m.external_put(data=ScriptedDraws("", "c"), blob=Blob(3, 10)),
            lambda: m.truncate(path="b/é x", size=BLOCK + 1),
            lambda: m.create_file(parent="b/c", name="a", blob=Blob(4, 100), sync=False),
            lambda: m.external_put(data=ScriptedDraws("b/c", "b"), blob=Blob(5, 20)),
            lambda: m.external_overwrite(data=ScriptedDraws("b/c/a"), blob=Blob(6, 5)),
            lambda: m.external_delete(data=ScriptedDraws("c")),
        ]
        for step in steps:
            step()
            m.trees_match()

    replay(model_env, script)


def test_model_replay_name_reused_across_types(any_backing_env: ModelEnv) -> None:
    """A name reused across types: an uploaded file (mode 0111), a directory, a
    fifo and a file again, with chmods and pauses past ``list_ttl`` (so the
    parent is re-listed in the background between the steps), at the root
    and in a subdirectory, on both backings; then the bucket and the daemon
    log are checked (``teardown``).  Before the fix, the marker of ``mkdir
    n0`` reached the bucket before the delete of the object ``n0``."""

    def script(m: TierfsModel) -> None:
        m.mkdir(parent="", name="b")
        for parent in ("", "b", ""):
            m.reuse_name_across_types(parent=parent, name="a", first=Blob(1, 0), last=Blob(2, 900))
            m.trees_match()
            m.flush()
            m.unlink(path=join(parent, "a"))
            m.trees_match()

    replay(any_backing_env, script)
