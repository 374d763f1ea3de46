"""Fixtures for tests that mount tierfs for real (``tests/fuse``).

``mount`` is a factory: ``mount(objects={...}, nvme="16MiB", ...)`` puts the
objects into a fresh bucket (under the prefix ``data/``), writes a config
with two small tiers and short TTLs (and, if ``upload_delay=`` or
``write_mode=`` is given, a ``[write]`` table; ``endpoint_url=`` points the
daemon at another endpoint, e.g. the ``fault_proxy`` fixture's;
``watermarks={"nvme": (0.8, 0.5)}`` sets a tier's watermarks;
``extra_config=`` appends TOML such as ``[mover]`` or ``[[rules]]``) under
``tmp_path``, runs ``tierfs mount CONFIG MP`` as a new user would and
returns a ``Mount``.  ``Mount.umount()``
and ``Mount.remount()`` cycle the same config and state dir.  With
``backing_dir=PATH`` the backing is ``file://PATH`` instead of the bucket.

Teardown ALWAYS unmounts every mount point the factory created: ``tierfs
umount``, then ``fusermount3 -u``, then ``fusermount3 -uz``.  Then it stops
the daemons it started, by PID (recorded from ``tierfs status --json`` or
from the ``Popen`` of a foreground mount), and only if ``/proc/PID/cmdline``
still names ``tierfsd``.  The daemon log tail is printed, so that a failing
test shows it.

Every test here is skipped with a reason when ``/dev/fuse`` or
``fusermount3`` is missing or unusable.

The daemon inherits the fake AWS credentials that ``aws_test_env`` (in
``tests/conftest.py``) puts into the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PREFIX = "data"
#: The ``[fetch] block_size`` a config that does not set it gets.
DEFAULT_BLOCK_SIZE = "4MiB"
CLI_TIMEOUT = 60.0
LOG_TAIL_CHARS = 4000


# --- environment checks ----------------------------------------------------------------


def fuse_unavailable_reason() -> str | None:
    """Why real FUSE mounts cannot run here, or None if they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


@pytest.fixture(autouse=True)
def _require_fuse() -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"real FUSE mount not possible: {reason}")


# --- running the CLI -------------------------------------------------------------------


def tierfs_command() -> list[str]:
    """The ``tierfs`` command of the interpreter running the tests."""
    script = Path(sys.executable).parent / "tierfs"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "tierfs.cli"]


def daemon_env() -> dict[str, str]:
    """Environment for the CLI and daemon: the session's fake AWS credentials."""
    env = dict(os.environ)
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    return env


def run_tierfs(*args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``tierfs ARGS...``; never raises on a non-zero exit."""
    return subprocess.run(
        [*tierfs_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=daemon_env(),
        stdin=subprocess.DEVNULL,
    )


def control_request(
    mountpoint: Path, op: str, args: dict[str, Any] | None = None, timeout: float = CLI_TIMEOUT
) -> Any:
    """One request to the control socket of the mount at ``mountpoint``, sent
    from the test process as the CLI sends it (``tierfs.control.client``).

    Cheaper than ``run_tierfs`` (a new interpreter per call), so that tests
    can poll ``status``; ``test_cli`` checks that the CLI's ``--json``
    output is this same document."""
    from tierfs.control.client import locate, request

    location = locate(mountpoint)
    assert location.mount_root == Path(os.path.abspath(mountpoint)), (
        f"{mountpoint} is not a tierfs mount point"
    )
    return request(location.socket_path, op, args, timeout=timeout)


def fusermount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["fusermount3", *args], capture_output=True, text=True, timeout=30, check=False
    )


def is_tierfsd(pid: int) -> bool:
    """True while ``pid`` is a live (non-zombie) tierfs daemon."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"tierfsd" in cmdline and state != "Z"


def daemons_using(config_path: Path) -> list[int]:
    """PIDs of live tierfs daemons started with ``config_path``."""
    needle = os.fsencode(str(config_path.resolve()))
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if needle in argv and is_tierfsd(int(entry)):
            pids.append(int(entry))
    return pids


def stop_daemon(pid: int) -> None:
    """SIGTERM, then SIGKILL, one daemon we started; only if it is still ours."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if not is_tierfsd(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and is_tierfsd(pid):
            time.sleep(0.05)


def drop_page_cache() -> bool:
    """Drop the kernel page cache (root only); True if it was dropped."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# --- the mount -------------------------------------------------------------------------


@dataclass
class Mount:
    """One tierfs mount made through the CLI, and the bucket behind it."""

    path: Path
    config_path: Path
    state_dir: Path
    tier_dirs: dict[str, Path]
    endpoint: str
    bucket: str
    prefix: str
    s3: Any
    list_ttl: float
    revalidate_ttl: float
    block_size: int
    #: ``-o`` options of ``tierfs mount`` (e.g. "allow_other"); "" for none.
    options: str = ""
    pids: list[int] = field(default_factory=list)

    # bucket side -------------------------------------------------------------------

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def put(self, name: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self.key(name), Body=body)

    def delete(self, name: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=self.key(name))

    # CLI side ----------------------------------------------------------------------

    def mount(self) -> None:
        """``tierfs mount CONFIG MP``; fails the test with stderr if it fails."""
        extra = ["-o", self.options] if self.options else []
        done = run_tierfs("mount", str(self.config_path), str(self.path), *extra)
        if done.returncode != 0:
            pytest.fail(
                f"tierfs mount exited {done.returncode}: {done.stderr.strip()}\n"
                f"log tail:\n{self.log_tail()}"
            )
        assert os.path.ismount(self.path), "tierfs mount returned 0 but nothing is mounted"
        self.pids.append(int(self.status()["pid"]))

    def umount(self) -> None:
        done = run_tierfs("umount", str(self.path))
        assert done.returncode == 0, f"tierfs umount failed: {done.stderr.strip()}"
        assert not os.path.ismount(self.path)

    def remount(self) -> None:
        self.umount()
        self.mount()

    def status(self) -> dict[str, Any]:
        """What ``tierfs status --json`` prints, asked over the control socket
        from this process (no interpreter start per call: tests poll it)."""
        result: dict[str, Any] = control_request(self.path, "status")
        return result

    def counters(self) -> dict[str, int]:
        counters: dict[str, int] = self.status()["counters"]
        return counters

    def where(self, *names: str) -> list[dict[str, Any]]:
        """What ``tierfs where --json NAMES...`` prints (over the control
        socket from this process); fails the test if a name has an error."""
        from tierfs.control.client import per_path

        result = per_path("where", [str(self.path / n) for n in names], timeout=CLI_TIMEOUT)
        failed = [item for item in result if "error" in item]
        assert not failed, f"tierfs where failed: {failed}"
        return result

    def where_one(self, name: str) -> dict[str, Any]:
        (item,) = self.where(name)
        return item

    # daemon side -------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.state_dir / "tierfsd.log"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self) -> str:
        return self.log_text()[-LOG_TAIL_CHARS:]

    # teardown ----------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Unmount by every means and stop our daemons; returns what went wrong."""
        problems: list[str] = []
        if os.path.ismount(self.path):
            with contextlib.suppress(subprocess.TimeoutExpired):
                run_tierfs("umount", str(self.path))
        if os.path.ismount(self.path):
            fusermount("-u", str(self.path))
        if os.path.ismount(self.path):
            problems.append(f"{self.path} needed a lazy unmount")
            fusermount("-uz", str(self.path))
        for pid in self.pids:
            if is_tierfsd(pid):
                stop_daemon(pid)
        return problems


MountFactory = Callable[..., Mount]


def write_config(
    path: Path,
    *,
    endpoint: str,
    bucket: str,
    prefix: str,
    state_dir: Path,
    tier_dirs: dict[str, Path],
    capacities: dict[str, str],
    block_size: str | None,
    readahead_max: str | None,
    list_ttl: str,
    revalidate_ttl: str,
    fetch_concurrency: int | None = 8,
    dir_readahead: int | None = 32,
    write: dict[str, str] | None = None,
    backing_dir: Path | None = None,
    watermarks: dict[str, tuple[float, float]] | None = None,
    extra: str = "",
) -> None:
    """A config the way an operator writes one (TOML strings via json.dumps).

    ``write`` (for example ``{"mode": "through", "upload_delay": "30s"}``)
    becomes a ``[write]`` table; without it the defaults apply.  With
    ``backing_dir`` the backing is ``file://backing_dir`` instead of the bucket.
    ``watermarks`` maps a tier name to its (high, low) watermarks; ``extra``
    is TOML appended as written (``[mover]``, ``[[rules]]``, ...).  A ``[fetch]`` key
    given as None is left out (its default applies); with all four None there is
    no ``[fetch]`` table, as in a config that sets none."""
    if backing_dir is not None:
        backing = [f"url = {json.dumps(backing_dir.resolve().as_uri())}"]
    else:
        backing = [
            f"url = {json.dumps(f's3://{bucket}/{prefix}')}",
            f"endpoint_url = {json.dumps(endpoint)}",
            'region = "us-east-1"',
        ]
    lines = [
        "[backing]",
        *backing,
        "",
        "[state]",
        f"dir = {json.dumps(str(state_dir))}",
        "",
    ]
    for name, tier_dir in tier_dirs.items():
        lines += [
            "[[tiers]]",
            f"name = {json.dumps(name)}",
            f"path = {json.dumps(str(tier_dir))}",
            f"capacity = {json.dumps(capacities[name])}",
        ]
        if watermarks and name in watermarks:
            high, low = watermarks[name]
            lines += [f"high_watermark = {high}", f"low_watermark = {low}"]
        lines.append("")
    fetch = {
        "block_size": block_size,
        "readahead_max": readahead_max,
        "concurrency": fetch_concurrency,
        "dir_readahead": dir_readahead,
    }
    fetch_lines = [
        f"{key} = {json.dumps(value)}" for key, value in fetch.items() if value is not None
    ]
    if fetch_lines:
        lines += ["[fetch]", *fetch_lines, ""]
    lines += [
        "[namespace]",
        f"list_ttl = {json.dumps(list_ttl)}",
        f"revalidate_ttl = {json.dumps(revalidate_ttl)}",
        "",
    ]
    if write:
        lines += ["[write]", *(f"{k} = {json.dumps(v)}" for k, v in write.items()), ""]
    if extra:
        lines.append(extra)
    path.write_text("\n".join(lines))


def put_objects(s3: Any, bucket: str, objects: dict[str, bytes], workers: int = 16) -> None:
    """Put many objects quickly (boto3 clients are thread-safe)."""
    if not objects:
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(objects))) as pool:
        futures = [
            pool.submit(s3.put_object, Bucket=bucket, Key=key, Body=body)
            for key, body in objects.items()
        ]
        for future in futures:
            future.result()


def _parse_seconds(text: str) -> float:
    from tierfs.units import parse_duration

    return float(parse_duration(text))


def _parse_size(text: str) -> int:
    from tierfs.units import parse_size

    return int(parse_size(text))


@pytest.fixture
def mount(bucket: tuple[str, str], s3_client: Any, tmp_path: Path) -> Iterator[MountFactory]:
    """Factory: put objects into a fresh bucket and mount it with ``tierfs mount``."""
    endpoint, bucket_name = bucket
    made: list[Mount] = []

    def factory(
        objects: dict[str, bytes] | None = None,
        *,
        nvme: str = "16MiB",
        hdd: str = "64MiB",
        block_size: str | None = "1MiB",
        readahead_max: str | None = "4MiB",
        fetch_concurrency: int | None = 8,
        dir_readahead: int | None = 32,
        list_ttl: str = "2s",
        revalidate_ttl: str = "1s",
        upload_delay: str | None = None,
        write_mode: str | None = None,
        space_wait: str | None = None,
        part_size: str | None = None,
        options: str = "",
        endpoint_url: str | None = None,
        backing_dir: Path | None = None,
        watermarks: dict[str, tuple[float, float]] | None = None,
        extra_config: str = "",
        do_mount: bool = True,
    ) -> Mount:
        base = tmp_path / f"m{len(made)}"
        mountpoint = base / "mnt"
        state_dir = base / "state"
        tier_dirs = {"nvme": base / "nvme", "hdd": base / "hdd"}
        for d in (mountpoint, *tier_dirs.values()):
            d.mkdir(parents=True)
        config_path = base / "tierfs.toml"
        write_config(
            config_path,
            endpoint=endpoint_url or endpoint,
            bucket=bucket_name,
            prefix=PREFIX,
            state_dir=state_dir,
            tier_dirs=tier_dirs,
            capacities={"nvme": nvme, "hdd": hdd},
            block_size=block_size,
            readahead_max=readahead_max,
            fetch_concurrency=fetch_concurrency,
            dir_readahead=dir_readahead,
            list_ttl=list_ttl,
            revalidate_ttl=revalidate_ttl,
            write={
                k: v
                for k, v in (
                    ("mode", write_mode),
                    ("upload_delay", upload_delay),
                    ("space_wait", space_wait),
                    ("part_size", part_size),
                )
                if v is not None
            },
            backing_dir=backing_dir,
            watermarks=watermarks,
            extra=extra_config,
        )
        m = Mount(
            path=mountpoint,
            config_path=config_path,
            state_dir=state_dir,
            tier_dirs=tier_dirs,
            endpoint=endpoint,
            bucket=bucket_name,
            prefix=PREFIX,
            s3=s3_client,
            list_ttl=_parse_seconds(list_ttl),
            revalidate_ttl=_parse_seconds(revalidate_ttl),
            block_size=_parse_size(block_size or DEFAULT_BLOCK_SIZE),
            options=options,
        )
        made.append(m)
        put_objects(s3_client, bucket_name, {m.key(k): v for k, v in (objects or {}).items()})
        if do_mount:
            m.mount()
        return m

    try:
        yield factory
    finally:
        problems: list[str] = []
        for m in made:
            problems += m.cleanup()
            tail = m.log_tail()
            if tail:
                print(f"--- daemon log tail of {m.path} ---\n{tail}")
        still = [str(m.path) for m in made if os.path.ismount(m.path)]
        assert not still, f"still mounted after teardown: {still}"
        assert not problems, "; ".join(problems)


@pytest.fixture
def unique_name() -> str:
    return f"tierfs-missing-{uuid.uuid4().hex[:12]}"


#: The unprivileged user of ``other_uid``.
OTHER_USER = "tierfs-test-other"


@pytest.fixture
def other_uid() -> Iterator[int]:
    """An unprivileged user created for the test (and deleted after it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a user")
    created = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
        capture_output=True,
        text=True,
    )
    assert created.returncode in (0, 9), created.stderr  # 9: it exists already
    try:
        yield pwd.getpwnam(OTHER_USER).pw_uid
    finally:
        if created.returncode == 0:
            subprocess.run(["userdel", OTHER_USER], capture_output=True)


def run_as_user(uid: int, fn: Callable[[], str]) -> str:
    """``fn()`` in a forked child running as ``uid`` (its own group only, no
    supplementary groups); the text it returned.  ``fn`` reports its own
    errors in that text; the child failing otherwise fails the test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.write(write_end, fn().encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        text = reader.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def as_user(uid: int, fn: Callable[[], str]) -> str:
    """``fn()`` in a forked child running as ``uid`` (no groups); its result
    or the error it raised, as text."""

    def child() -> str:
        try:
            return f"ok: {fn()}"
        except Exception as exc:  # reported to the parent
            return f"{type(exc).__name__}: {exc}"

    return run_as_user(uid, child)


@contextlib.contextmanager
def traversable(path: Path) -> Iterator[None]:
    """The directories above ``path`` (pytest's, 0700) searchable by every
    user meanwhile, as a mount point's parents are on a node."""
    changed = []
    for parent in path.parents:
        if parent == Path(tempfile.gettempdir()) or parent == parent.parent:
            break
        mode = parent.stat().st_mode & 0o7777
        if mode & 0o001 == 0:
            changed.append((parent, mode))
            os.chmod(parent, mode | 0o001)
    try:
        yield
    finally:
        for parent, mode in changed:
            os.chmod(parent, mode)
