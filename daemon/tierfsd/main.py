"""The tierfs daemon: wiring and process lifecycle.

Start-up order (each step fails fast with a clear sentence):

1. config -> 2. mount point checks (exists, a directory, not mounted) ->
3. object store ``check()`` (missing bucket, bad credentials, dead endpoint)
-> 4. LMDB state dir, tiers -> 5. control socket bound -> 6. ``pyfuse3.init``
(the mount exists from here) -> 7. the first request answered (the kernel's
INIT handshake is done; it resets the bdi readahead, so tuning must come
after it) -> 8. kernel tuning (root only: bdi ``read_ahead_kb``, fusectl
``max_background``) -> 9. readiness: a line on
``--ready-fd`` for ``tierfs mount``, ``READY=1`` to systemd's NOTIFY_SOCKET.

Shutdown: the mount goes away (``tierfs umount`` runs ``fusermount3 -u``) and
``pyfuse3.main`` returns; or SIGTERM/SIGINT asks pyfuse3 to stop and the
daemon unmounts itself: requests still in flight after SHUTDOWN_GRACE (a
writer waiting for tier space, say) are cancelled and the store is closed,
so that SIGTERM ends the daemon in seconds even while uploads fail.  Then
workers are cancelled without waiting for store calls still on the network
(``TierFS.store_threads.abandon()``, see :mod:`tierfs.core.state.store_threads`:
a black-holed upload would hold its thread for its whole read timeout),
access times are flushed, LMDB synced and closed, the FUSE session closed,
and the process exits at once even if such threads remain
(``exit_without_stuck_threads``); the journal stays, and the next mount
resumes it.

Every background task runs under the supervisor
(:mod:`tierfs.core.state.supervisor`): a failure is logged, counted in ``status``
and the task restarts; only the FUSE session itself is not restartable.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import gc
import logging
import logging.handlers
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pyfuse3
import trio

from tierfs import __version__
from tierfs.config import Config, load_config
from tierfs.config.values import backing_url_above
from tierfs.control.limits import ControlLimits, raise_open_file_limit
from tierfs.control.protocol import socket_path_for
from tierfs.control.server import ControlServer
from tierfs.core import TierFS
from tierfs.core.write.sync import SMALL_UPLOAD_CONCURRENCY
from tierfs.errors import ConfigError, TierfsError
from tierfs.meta import MetaDB
from tierfs.metrics import Metrics, MetricsServer
from tierfs.snapshot.lender import LiveMountLender
from tierfs.snapshot.mount import OPTION as SNAPSHOT_OPTION
from tierfs.snapshot.mount import (
    open_snapshot_store,
    snapshot_config,
    snapshot_source,
    snapshot_status,
)
from tierfs.snapshot.record import check_name
from tierfs.snapshot.view import SnapshotStore
from tierfs.store import ObjectStore, open_shared_tier, open_store
from tierfs.text import mount_source, shown
from tierfs.tiers import Tier
from tierfs.workers.audit import STATUS_SECTION as AUDIT_SECTION
from tierfs.workers.audit import AuditLog, AuditWriter
from tierfs.workers.pathlists import SpoolBudget
from tierfs.workers.wiring import (
    dir_readahead_for,
    mover_for,
    prefetcher_for,
    preloader_for,
    snapshots_for,
    uploader_for,
)
from tierfsd.fuse_ops import TierfsOperations

log = logging.getLogger("tierfsd")

READ_AHEAD_KB = 1024
MAX_BACKGROUND = 64
#: allow_other/allow_root: passed to FUSE (always with default_permissions);
#: debug: debug logging; no_kernel_tuning: leave read_ahead_kb and
#: max_background at the kernel defaults (to measure what tuning gains).
ALLOWED_OPTIONS = {"allow_other", "allow_root", "debug", "no_kernel_tuning", "ro"}
#: Options with a value: ``snapshot=NAME`` mounts that snapshot, read-only
#: (``tierfs.snapshot.mount``).
VALUE_OPTIONS = {SNAPSHOT_OPTION}


@dataclasses.dataclass(frozen=True, slots=True)
class MountOptions:
    """What ``-o`` asked for: the flags (``ALLOWED_OPTIONS``) and a snapshot."""

    flags: set[str]
    snapshot: str | None = None


class StartupError(Exception):
    """A problem the user must fix; reported as one sentence, exit 1."""


#: After SIGTERM, requests in flight get this long (seconds) to finish
#: before they are cancelled (see Daemon._signals).
SHUTDOWN_GRACE = 1.0

#: sys.setswitchinterval for the daemon (seconds); see main().
GIL_SWITCH_INTERVAL = 0.001

#: The cyclic garbage collector's thresholds while the daemon serves; see
#: tune_garbage_collector().
GC_THRESHOLDS = (20_000, 20, 10)


def tune_garbage_collector() -> None:
    """Fewer and smaller cyclic collections while the daemon serves.

    What a collection costs grows with the objects it looks at, and about
    80,000 of the daemon's objects are made while it starts (modules,
    config, the object graph of ``TierFS``) and live until it exits.
    ``gc.freeze()`` moves them out of every collection.  A collection of
    the youngest objects then runs every ``GC_THRESHOLDS[0]`` allocations
    instead of Python's 700: most objects of a request or a fetch die before
    it comes, and the older generations follow less often.  Reference
    counting frees everything that is not in a cycle, as before; cyclic
    garbage waits a little longer (at most that many allocations).

    Measured (``gc.callbacks`` around each collection; a 10,000-file
    preload from s3rver, three interleaved runs each): collections took
    0.40-0.52 s of the daemon's CPU with the defaults, 0.16-0.19 s with the
    freeze alone, 0.01-0.03 s with both; the daemon's CPU per run went from
    6.5-6.8 s to 5.6-6.2 s.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tierfsd",
        description="The tierfs daemon. Normally started by `tierfs mount`.",
    )
    parser.add_argument("config", type=Path, help="config file (TOML)")
    parser.add_argument("mountpoint", type=Path, help="empty directory to mount on")
    parser.add_argument("-f", "--foreground", action="store_true", help="log to stderr")
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"tierfsd {__version__}")
    parser.add_argument(
        "-o",
        dest="options",
        default="",
        help="mount options: allow_other, allow_root, ro, debug, no_kernel_tuning, "
        "snapshot=NAME (mount that snapshot, read-only)",
    )
    return parser.parse_args(argv)


def setup_logging(config: Config | None, foreground: bool, debug: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    fmt = OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: logging.Handler
    if foreground or config is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.handlers.RotatingFileHandler(
            config.state.dir / "tierfsd.log", maxBytes=16 << 20, backupCount=3
        )
    handler.setFormatter(fmt)
    root.handlers[:] = [handler]
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def parse_options(raw: str) -> MountOptions:
    flags: set[str] = set()
    values: dict[str, str] = {}
    for option in filter(None, (o.strip() for o in raw.split(","))):
        name, sep, value = option.partition("=")
        if sep and name in VALUE_OPTIONS:
            if name in values:
                raise StartupError(f"mount option {name}= given twice")
            values[name] = value
        elif not sep and option in ALLOWED_OPTIONS:
            flags.add(option)
        else:
            known = sorted(ALLOWED_OPTIONS | {f"{v}=NAME" for v in VALUE_OPTIONS})
            raise StartupError(f"unknown mount option {option!r}; known: {', '.join(known)}")
    snapshot = values.get(SNAPSHOT_OPTION)
    if snapshot is not None:
        try:
            check_name(snapshot)
        except TierfsError as exc:
            raise StartupError(f"-o snapshot={snapshot}: {exc}") from None
        flags.add("ro")  # a snapshot is immutable: the kernel refuses every change
    return MountOptions(flags, snapshot)


def check_mountpoint(mountpoint: Path) -> Path:
    if not mountpoint.exists():
        raise StartupError(f"mount point {mountpoint} does not exist")
    if not mountpoint.is_dir():
        raise StartupError(f"mount point {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise StartupError(f"mount point {mountpoint} is busy: something is already mounted there")
    return mountpoint.resolve()


def fuse_options(options: set[str], source: str = "tierfs") -> set[str]:
    """The FUSE mount options; ``source`` (the backing URL) is the mount's
    source in ``df``, ``findmnt`` and ``/proc/mounts``, its type
    ``fuse.tierfs``."""
    opts = set(pyfuse3.default_options)
    opts.discard("default_permissions")
    opts |= {f"fsname={mount_source(source)}", "subtype=tierfs", "default_permissions"}
    # allow_other is only ever given together with default_permissions (above):
    # the kernel then checks modes, so other users cannot bypass them.
    opts |= options & {"allow_other", "allow_root"}
    # ro: the kernel refuses every change with EROFS before it reaches us.
    opts |= options & {"ro"}
    return opts


def tune_kernel(mountpoint: Path) -> None:
    """Raise readahead and background requests of this FUSE connection (root only)."""
    if os.geteuid() != 0:
        return
    dev = _mount_device(mountpoint)
    if dev is None:
        log.info("kernel tuning skipped: %s not found in mountinfo", mountpoint)
        return
    major, minor = dev
    _write_sysfs(Path(f"/sys/class/bdi/{major}:{minor}/read_ahead_kb"), READ_AHEAD_KB)
    conn = Path("/sys/fs/fuse/connections")
    if conn.is_dir() and not any(conn.iterdir()) and not os.path.ismount(conn):
        os.system("mount -t fusectl fusectl /sys/fs/fuse/connections >/dev/null 2>&1")
    _write_sysfs(conn / str(minor) / "max_background", MAX_BACKGROUND)
    _write_sysfs(conn / str(minor) / "congestion_threshold", MAX_BACKGROUND * 3 // 4)


def _mount_device(mountpoint: Path) -> tuple[int, int] | None:
    target = str(mountpoint)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                major, minor = fields[2].split(":")
                return int(major), int(minor)
    return None


def _write_sysfs(path: Path, value: int) -> None:
    try:
        path.write_text(f"{value}\n")
        log.info("set %s = %d", path, value)
    except OSError as exc:
        log.info("could not set %s: %s", path, exc.strerror)


def sd_notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


class OneLineFormatter(logging.Formatter):
    """Each record's message on one line: the names and labels users choose
    (a file name may hold a newline or a terminal escape) are escaped
    (``tierfs.text.shown``), so no user can forge or hide a log line.  A
    traceback that follows the message keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = shown(record.message)
        return super().formatMessage(record)


class Daemon:
    def __init__(
        self, config: Config, mountpoint: Path, options: set[str], snapshot: str | None = None
    ) -> None:
        """``snapshot``: mount that snapshot (``config`` is already the
        snapshot mount's, ``tierfs.snapshot.mount.snapshot_config``)."""
        self.config = config
        self.mountpoint = mountpoint
        self.options = options
        #: The one metrics registry; its parts go to the store, the FUSE
        #: layer and TierFS.  Served over HTTP only with ``[metrics] listen``.
        self.metrics = Metrics()
        self.store = open_store(
            config.backing,
            source=str(config.source),
            # Fetches, plus uploads: single PUTs of small files
            # (SMALL_UPLOAD_CONCURRENCY) beside four multipart uploads of four parts.
            max_pool_connections=config.fetch.concurrency + SMALL_UPLOAD_CONCURRENCY + 16,
            request_observer=self.metrics.s3_request,
        )
        self.store.check()
        self.source = config.backing.url
        self.snapshot: SnapshotStore | None = None
        self.lender: LiveMountLender | None = None
        if snapshot is not None:
            self.snapshot = self.store = open_snapshot_store(self.store, config, snapshot)
            self.source = snapshot_source(config.backing.url, snapshot)
            live_tiers = [str(tier.path.parent.parent) for tier in config.tiers]
            self.lender = LiveMountLender(config.backing.url, live_tiers)
        self.metrics_server: MetricsServer | None = None
        if config.metrics.enabled:  # a port in use fails here, before anything is opened
            self.metrics_server = MetricsServer(self.metrics, config.metrics)
            self.metrics_server.bind()
        self.audit: AuditLog | None = None
        self.audit_writer: AuditWriter | None = None
        if config.audit.enabled:  # a path the daemon cannot write fails here
            self.audit = AuditLog(config.audit)
            self.audit_writer = AuditWriter(self.audit)
            self.audit_writer.open()
        self.meta = MetaDB(
            config.state.dir / "meta",
            self.store.url,
            default_dir_mode=config.namespace.dir_mode,
            uid=config.namespace.uid if config.namespace.uid is not None else os.getuid(),
            gid=config.namespace.gid if config.namespace.gid is not None else os.getgid(),
        )
        if self.meta.swept_unlinked:
            log.info(
                "deleted %d files that were unlinked while open when the daemon stopped",
                self.meta.swept_unlinked,
            )
        self.tiers = [Tier(i, t) for i, t in enumerate(config.tiers)]
        sock_path = socket_path_for(mountpoint, config.state.dir)
        self.fs = TierFS(
            config,
            self.meta,
            self.store,
            self.tiers,
            control_socket=str(sock_path),
            invalidate_kernel_cache=self._invalidate,
            shared=open_shared_tier(config.shared_tier) if config.shared_tier else None,
            shadow_store=self.snapshot or self._shadow_store(config),
            # A snapshot mount reads in place what the live mount holds at
            # the same version (``tierfs.snapshot.lender``).
            lender=self.lender,
        )
        self._shared_answered = self._check_shared_tier()
        if self.snapshot is not None:
            section = snapshot_status(self.snapshot.index.manifest)
            self.fs.status_sections["snapshot"] = lambda: section
        self.metrics.watch(self.fs)
        # Every local user may connect: the connections leave descriptors
        # for the file system's own work (``tierfs.control.limits``).
        open_files = raise_open_file_limit()
        self.control = ControlServer(
            self.fs,
            sock_path,
            mountpoint=mountpoint,
            limits=ControlLimits.for_open_files(open_files),
            audit=self.audit,
        )
        log.info(
            "open-file limit %d; control connections: %d per user, %d in all (root %d more)",
            open_files,
            self.control.limits.per_user,
            self.control.limits.total,
            self.control.limits.root,
        )
        #: What users' lists and orders may hold on the state disk (both workers).
        self.spools = SpoolBudget()
        self._fuse_stopped = trio.Event()

    def _check_shared_tier(self) -> bool:
        """The shared tier's check (``SharedBucket.check``) before the
        mount: a tier that answers but cannot serve (credentials refused,
        no conditional PUT) refuses the mount, naming why.  One that does
        not answer does not: the node mounts and reads from the bucket, and
        the check runs again until it answers (``run``).  True once checked."""
        shared = self.fs.shared_tier
        if shared is None:
            return True
        if not shared.check():
            log.warning(
                "shared tier %s does not answer at mount: reads go to the bucket until it "
                "does; it will be checked then",
                shared.bucket.url,
            )
            return False
        if shared.fan_out_off is not None:
            raise StartupError(shared.fan_out_off)
        return True

    def _shadow_store(self, config: Config) -> ObjectStore | None:
        """For an access point, a store of the backing URL without its root:
        the attribute shadow is one per object of the bucket, shared with
        every mount of it (``tierfs.core.names.shadow``)."""
        if not config.access.root:
            return None
        above = backing_url_above(config.backing.url, config.access.root.strip("/"))
        return open_store(
            dataclasses.replace(config.backing, url=above),
            source=str(config.source),
            max_pool_connections=8,
            request_observer=self.metrics.s3_request,
        )

    @staticmethod
    async def _invalidate(ino: int, data: bool) -> None:
        """Drop the kernel's cached attributes (and pages) of an inode.

        In a thread: the notification may wait for kernel locks that an
        in-flight request holds, and the loop must keep answering requests.
        """
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino, not data)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # the kernel had forgotten it: fine
                log.warning("invalidating inode %d: %s", ino, exc)

    def mount(self) -> None:
        self._listen_sock: trio.socket.SocketType | None = self.control.bind()
        ops = TierfsOperations(self.fs, self.metrics, self.audit)
        pyfuse3.init(ops, str(self.mountpoint), fuse_options(self.options, self.source))

    async def run(self, on_ready: Callable[[], None]) -> None:
        # Every background task runs under the supervisor (one failure
        # restarts it, see tierfs.core.state.supervisor); only the FUSE session
        # itself is not restartable: its end is the end of the mount.
        supervisor = self.fs.supervisor
        async with trio.open_nursery() as nursery:
            await nursery.start(self.fs.run_workers)
            if self.audit_writer is not None:
                self.fs.status_sections[AUDIT_SECTION] = self.audit_writer.status
                await supervisor.start(nursery, "audit", self.audit_writer.run)
            await supervisor.start(nursery, "uploader", uploader_for(self.fs).run)
            await supervisor.start(nursery, "mover", mover_for(self.fs).run)
            self.control.preloader = preloader_for(self.fs, spools=self.spools)
            self.metrics.watch_preloads(self.control.preloader.status)
            await supervisor.start(nursery, "preload", self.control.preloader.run)
            self.control.prefetcher = prefetcher_for(self.fs, spools=self.spools)
            await supervisor.start(nursery, "prefetch", self.control.prefetcher.run)
            if not self._shared_answered and self.fs.shared_tier is not None:
                supervisor.start_soon(
                    nursery, "shared-check", self.fs.shared_tier.check_until_answered
                )
            if self.snapshot is not None:  # list, show and diff the bucket's snapshots
                snapshots = snapshots_for(self.fs, self.snapshot.inner, mounted=self.snapshot.name)
            else:
                snapshots = snapshots_for(self.fs)
            self.control.snapshots = snapshots
            await supervisor.start(nursery, "snapshots", snapshots.run)
            prefetcher = self.control.prefetcher
            dir_readahead = dir_readahead_for(self.fs, defer=lambda: prefetcher.has_order)
            await supervisor.start(nursery, "dir-readahead", dir_readahead.run)
            if self.metrics_server is not None:
                await supervisor.start(nursery, "metrics", self.metrics_server.serve)
            await supervisor.start(nursery, "control", self._serve_control)
            supervisor.start_soon(nursery, "signals", self._signals, nursery.cancel_scope)
            nursery.start_soon(self._serve_fuse, nursery.cancel_scope)
            # A stat of the root answers only after the kernel's INIT handshake,
            # which resets the bdi readahead: tune after it, then announce.
            await trio.to_thread.run_sync(os.stat, self.mountpoint)
            if "no_kernel_tuning" not in self.options:
                tune_kernel(self.mountpoint)
            on_ready()

    async def _serve_control(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The control server; a restart after a failure binds the socket again."""
        sock = self._listen_sock if self._listen_sock is not None else self.control.bind()
        self._listen_sock = None
        try:
            await self.control.serve(sock, task_status=task_status)
        finally:
            sock.close()

    async def _serve_fuse(self, scope: trio.CancelScope) -> None:
        await pyfuse3.main()
        self._fuse_stopped.set()
        log.info("file system unmounted; shutting down")
        scope.cancel()
        self.fs.store_threads.abandon()

    async def _signals(self, scope: trio.CancelScope) -> None:
        """SIGTERM/SIGINT: stop taking requests, give those in flight
        SHUTDOWN_GRACE seconds, then cancel what still runs (writers waiting
        for tier space, uploads) and close the store so that its threads
        stop too.  Nothing is lost: the journal is in LMDB and the next
        mount resumes it (an upload cut short is aborted and sent again)."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    self._reload_policy()
                    continue
                log.info("received %s: unmounting", name)
                pyfuse3.terminate()
                with trio.move_on_after(SHUTDOWN_GRACE):
                    await self._fuse_stopped.wait()
                if not self._fuse_stopped.is_set():
                    log.warning(
                        "requests still running %.0f s after %s: cancelling them",
                        SHUTDOWN_GRACE,
                        name,
                    )
                    # In a thread: close() waits for the part workers' current part.
                    threading.Thread(
                        target=self.store.close, name="store-close", daemon=True
                    ).start()
                    scope.cancel()
                    self.fs.store_threads.abandon()
                return

    def _reload_policy(self) -> None:
        """SIGHUP: reread the lifecycle rules and quotas, as ``tierfs policy
        reload`` does; a broken file is logged with file:line and the rules
        and quotas in force stay."""
        try:
            self.fs.reload_policy()
        except ConfigError as exc:
            log.error("SIGHUP: policy not reloaded, the rules in force stay:\n%s", exc)

    def close(self, *, unmount: bool) -> None:
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.lender is not None:
            self.lender.close()
        try:
            self.fs.close()
        finally:
            try:
                pyfuse3.close(unmount=unmount)
            finally:
                self.meta.close()
                for tier in self.tiers:
                    tier.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ready = os.fdopen(args.ready_fd, "w") if args.ready_fd is not None else None

    def report(line: str) -> None:
        if ready is not None:
            try:
                ready.write(line + "\n")
                ready.flush()
            except OSError:
                pass

    config: Config | None = None
    made_state_dir: Path | None = None
    try:
        mount_options = parse_options(args.options)
        options = mount_options.flags
        config = load_config(args.config)
        if config.access.read_only:
            options.add("ro")  # an access point for reading only
        if mount_options.snapshot is not None:
            config = snapshot_config(config, mount_options.snapshot)
            made_state_dir = first_missing(config.state.dir)  # removed if the mount fails
        config.state.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        setup_logging(config, args.foreground, "debug" in options)
        mountpoint = check_mountpoint(args.mountpoint)
        daemon = Daemon(config, mountpoint, options, mount_options.snapshot)
    except (StartupError, TierfsError) as exc:
        message = str(exc)
        print(f"tierfsd: {message}", file=sys.stderr)
        report("ERROR " + message.replace("\n", "\n      "))
        if made_state_dir is not None:  # a snapshot that could not be mounted leaves nothing
            logging.shutdown()
            shutil.rmtree(made_state_dir, ignore_errors=True)
        return 1

    try:
        daemon.mount()
    except Exception as exc:
        daemon.meta.close()
        message = f"cannot mount on {mountpoint}: {exc}"
        print(f"tierfsd: {message}", file=sys.stderr)
        report("ERROR " + message)
        return 1

    def on_ready() -> None:
        log.info("mounted %s on %s", daemon.source, mountpoint)
        report("READY")
        if ready is not None:
            ready.close()
        sd_notify("READY=1")

    # FUSE handlers on the trio loop share the GIL with the S3 worker threads.
    # With the default 5 ms switch interval, a request that waits for the GIL
    # behind a busy worker may wait up to 5 ms.  It was 0.1 ms while boto3 ran
    # every GET; small GETs now go through obstore, and 0.1 ms made the 32
    # fetch threads of a small-file preload hand the GIL around so often that
    # they spent two thirds of their CPU in the kernel (strace: about 190
    # futex calls per file).  1 ms: the fetch threads' CPU fell by about a
    # quarter (3.0 to 2.3 s for 5,000 files), and a demand read during a
    # preload stayed at 0.96x its idle
    # latency (bench_preload --cases latency; 0.88x at 0.1 ms, 0.86x at 5 ms).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    tune_garbage_collector()
    try:
        trio.run(daemon.run, on_ready)
    except BaseException:
        log.exception("daemon stopped by an error")
        raise
    finally:
        # Unmounting an already unmounted point is a no-op; after a crash it
        # keeps a dead mount from being left behind.
        daemon.close(unmount=True)
    exit_without_stuck_threads(0)
    return 0


def first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (None: it does)."""
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def exit_without_stuck_threads(code: int) -> None:
    """Exit now if threads still wait on the network (a black-holed upload
    part waits up to its read timeout): the metadata is committed and closed,
    the FUSE session is closed, and the journal keeps what they were sending.
    Python would otherwise join them (the store's part workers are not daemon
    threads) before the process ends.  Returns if no such thread is left."""
    stuck = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if not stuck:
        return
    log.warning(
        "exiting without waiting for %d thread(s) still on the network (%s); "
        "the journal keeps their work for the next mount",
        len(stuck),
        ", ".join(sorted({t.name for t in stuck})),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
