"""The ``tierfs`` command.

Human output goes to stdout, diagnostics to stderr; ``--json`` prints one
JSON document on stdout.  Every failure is one sentence on stderr and exit
status 1 (2 for a usage error, from argparse).

``mount`` starts the daemon (``python -m tierfsd``) in its own session and
waits on a pipe until the daemon reports READY or an error, so it returns
only once the mount is usable.  With ``-f`` it becomes the daemon (exec,
same PID) for systemd ``Type=notify``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

from tierfs import __version__, pin_sizes
from tierfs.config import Config, check_file, load_config, load_policy
from tierfs.config.loader import Problem
from tierfs.control.client import Location, by_mount, locate, per_path, request
from tierfs.control.protocol import list_chunks
from tierfs.errors import ConfigError, ControlError, SharedTierUnusable, StoreError, TierfsError
from tierfs.policy.rules import shadowed_rules
from tierfs.text import shown
from tierfs.units import format_size, parse_rate

MOUNT_TIMEOUT = 60.0
UMOUNT_TIMEOUT = 60.0


class CliError(Exception):
    """One sentence for stderr; exit 1.  ``errno`` goes into the ``--json``
    error document (EINVAL, an argument the command cannot use, unless the
    raiser names a closer one)."""

    def __init__(self, message: str, errno_: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.errno = errno_


# --- mount / umount -------------------------------------------------------------------


#: The modules the daemon needs beyond the client's (``tierfs[daemon]``).
DAEMON_MODULES = ("pyfuse3", "trio", "boto3", "obstore", "lmdb", "xxhash", "prometheus_client")


def _check_daemon_installed() -> None:
    """A client-only install (``pip install tierfs``) cannot mount: say what to install."""
    missing = [name for name in DAEMON_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(
            f"this install of tierfs has only the client: the daemon needs {', '.join(missing)}; "
            "install the daemon's dependencies with: pip install 'tierfs[daemon]' "
            "(pyfuse3 needs libfuse3-dev, pkg-config and a C compiler to build)"
        )


def cmd_mount(args: argparse.Namespace) -> int:
    config_path = Path(args.config)
    mountpoint = Path(args.mountpoint)
    config = load_config(config_path)  # fail here, with file:line, before forking
    _check_daemon_installed()
    if not mountpoint.is_dir():
        raise CliError(f"mount point {mountpoint} does not exist or is not a directory")
    if os.path.ismount(mountpoint):
        raise CliError(
            f"mount point {mountpoint} is busy: something is already mounted there", errno.EBUSY
        )
    argv = [sys.executable, "-m", "tierfsd", str(config_path.resolve()), str(mountpoint.resolve())]
    if args.options:
        argv += ["-o", args.options]
    if args.foreground:
        argv.append("--foreground")
        sys.stdout.flush()
        os.execv(sys.executable, argv)
    config.state.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = config.state.dir / "tierfsd.log"
    read_fd, write_fd = os.pipe()
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [*argv, "--ready-fd", str(write_fd)],
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    os.close(write_fd)
    try:
        line = _read_ready_line(read_fd, proc)
    finally:
        os.close(read_fd)
    if line.startswith("READY"):
        return 0
    if line.startswith("ERROR "):
        raise CliError(line[len("ERROR ") :])
    raise CliError(f"the daemon exited before the mount was ready; see {log_path}", errno.EIO)


def _read_ready_line(fd: int, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + MOUNT_TIMEOUT
    buf = b""
    # READY is one line; an ERROR may span lines and ends when the daemon exits.
    while not buf.startswith(b"READY\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            proc.terminate()
            raise CliError(
                f"the mount was not ready after {MOUNT_TIMEOUT:.0f} s; daemon stopped",
                errno.ETIMEDOUT,
            )
        readable, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def cmd_umount(args: argparse.Namespace) -> int:
    mountpoint = Path(os.path.abspath(args.mountpoint))
    if not os.path.ismount(mountpoint):
        raise CliError(f"{mountpoint} is not mounted")
    pid = None
    try:
        location = locate(mountpoint)
        if location.mount_root != mountpoint:
            raise CliError(
                f"{mountpoint} is not a mount point (it is inside {location.mount_root})"
            )
        pid = int(request(location.socket_path, "ping", timeout=10)["pid"])
        if args.flush:
            request(location.socket_path, "flush", {"paths": [""]}, timeout=None)
    except ControlError as exc:
        if args.flush:
            raise CliError(f"cannot flush before unmounting: {exc}", exc.errno) from None
        # a dead daemon: the unmount below still cleans up
    fusermount = shutil.which("fusermount3") or "fusermount3"
    done = subprocess.run([fusermount, "-u", str(mountpoint)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = done.stderr.strip() or f"{fusermount} exited {done.returncode}"
        raise CliError(f"cannot unmount {mountpoint}: {reason}", errno.EBUSY)
    if pid is not None:
        deadline = time.monotonic() + UMOUNT_TIMEOUT
        while _alive(pid):
            if time.monotonic() > deadline:
                raise CliError(
                    f"unmounted, but the daemon (pid {pid}) has not exited yet", errno.ETIMEDOUT
                )
            time.sleep(0.05)
    if args.json:
        _print_json({"unmounted": str(mountpoint), "pid": pid, "flushed": bool(args.flush)})
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --- status / where ------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    mountpoint = Path(os.path.abspath(args.mountpoint))
    location = locate(mountpoint)
    if location.mount_root != mountpoint:
        raise CliError(f"{mountpoint} is not a tierfs mount point")
    if args.watch:
        from tierfs.watch import watch_status  # rich: only for --watch

        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the watch
            watch_status(lambda: _for_humans(request(location.socket_path, "status")))
        return 0
    status = request(location.socket_path, "status")
    if args.json:
        _print_json(status)
        return 0
    status = _for_humans(status)
    version = f", tierfs {status['version']}" if status.get("version") else ""
    print(f"mount:    {status['mountpoint']}  (pid {status['pid']}{version})")
    print(f"backing:  {status['backing']}")
    snapshot = status.get("snapshot")
    if snapshot:
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot["created"]))
        print(
            f"snapshot: {snapshot['name']} (read-only), taken {taken} by uid "
            f"{snapshot['creator_uid']}: {snapshot['objects']:,} objects, "
            f"{format_size(snapshot['bytes'])}"
        )
    print(f"{'tier':<10} {'capacity':>10} {'used':>10} {'use%':>6} {'files':>8}  watermarks")
    for tier in status["tiers"]:
        print(
            f"{tier['name']:<10} {format_size(tier['capacity']):>10} {format_size(tier['used']):>10} "
            f"{tier['used_ratio'] * 100:>5.1f}% {tier['files']:>8}  "
            f"low {tier['low_watermark']:.0%} / high {tier['high_watermark']:.0%}"
        )
    mover = status.get("mover")
    if mover:
        print(f"mover:    {_mover_line(mover)}")
    for job in status.get("preloads", []):
        print(f"preload:  {_preload_line(job)}")
    prefetch = status.get("prefetch")
    for order in prefetch["orders"] if prefetch else []:
        print(f"prefetch: {_prefetch_line(order)}")
    for quota in status.get("quotas", []):
        print(f"quota:    {_quota_line(quota)}")
    control = status.get("control")
    if control and control["refused"]:
        print(
            f"control:  {control['connections']} connections open; {control['refused']:,} "
            f"refused past a bound (per user {control['per_user']}, in all {control['total']})"
        )
    readers = status.get("readers")
    if readers and readers["handed_out"]:
        held = [
            f"{name} {format_size(h['bytes'])} in {h['files']} files"
            for name, h in readers["held"].items()
            if h["files"]
        ]
        print(
            f"readers:  {readers['leases']:,} tier files held by {readers['users']} users; "
            f"{readers['handed_out']:,} handed out, {readers['refused']:,} refused, "
            f"{readers['unshared']:,} copied before a write"
            + (f"; evicted or replaced but still read: {', '.join(held)}" if held else "")
        )
    audit = status.get("audit")
    if audit:
        print(
            f"audit:    {audit['path']} ({'changes and reads' if audit['reads'] else 'changes'}): "
            f"{audit['records']:,} records, {audit['dropped']:,} dropped, "
            f"{audit['write_errors']:,} write errors"
        )
    dir_readahead = status.get("dir_readahead")
    if dir_readahead and dir_readahead["files_fetched"]:
        print(
            f"dir readahead: {dir_readahead['files_fetched']} files "
            f"({format_size(dir_readahead['bytes_fetched'])}) fetched ahead of readers in "
            f"listing order, {dir_readahead['hits']} opened, "
            f"{dir_readahead['wrong_guesses']} wrong guesses"
        )
    hit = status["hit_ratio"]
    counters = status["counters"]
    print(
        f"dirty:    {format_size(status['dirty_bytes'])}, {status['pending_uploads']} uploads pending"
    )
    if status.get("failed_files"):
        print(
            f"FAILED:   {status['failed_files']} files are not uploaded: damaged local changes, "
            "or refused by the bucket (`tierfs where` shows them as failed; see the daemon log)"
        )
        for item in status.get("failed", []):
            print(f"  {item['path']}: {item['reason']}")
    print(
        f"reads:    hit ratio {'-' if hit is None else f'{hit:.1%}'}, "
        f"fetched {format_size(counters['fetched_bytes'])} in {counters['gets']} GETs"
    )
    print(f"endpoint: {_endpoint_line(status.get('endpoint') or {})}")
    shared = status.get("shared_tier")
    if shared:
        print(f"shared:   {_shared_line(shared)}")
    failing = {n: w for n, w in status.get("workers", {}).items() if w["errors"]}
    if failing:
        print(f"workers:  {status['worker_restarts']} restarts after errors")
        for name, worker in sorted(failing.items()):
            print(f"  {name}: {worker['errors']} errors, last: {worker['last_error']}")
    return 0


def _shared_line(shared: dict[str, Any]) -> str:
    """``cluster s3://near/x reachable; 12 hits, 3 misses, read 48 MiB, put 12 MiB,
    bucket served 12 MiB``."""
    state = (shared.get("endpoint") or {}).get("state", "reachable")
    text = (
        f"{shared['name']} {shared['url']} {'reachable' if state == 'reachable' else 'UNREACHABLE'}"
        f"; {shared['hits']} hits, {shared['misses']} misses, "
        f"read {format_size(shared['bytes_read'])}, put {format_size(shared['bytes_put'])}, "
        f"bucket served {format_size(shared['bucket_bytes'])}, "
        f"{shared.get('claims', 0)} claimed, {shared.get('waits', 0)} waited for"
    )
    problems = [
        f"{shared[k]} {label}"
        for k, label in (
            ("errors", "errors"),
            ("corrupt", "damaged blocks"),
            ("wait_timeouts", "waits timed out"),
        )
        if shared.get(k)
    ]
    fan_out = str(shared.get("fan_out", "on"))
    if fan_out != "on":  # claims off: no fetch-once (said loudly)
        problems.insert(0, f"FAN-OUT {fan_out}")
    return text + (f" ({', '.join(problems)})" if problems else "")


def _mover_line(mover: dict[str, Any]) -> str:
    """``moving hdd <- nvme ckpt/step-3 (40%) at 180 MiB/s; moved 2 GiB in 10 files``."""
    cap = int(mover.get("bandwidth") or 0)
    capped = f", cap {format_size(cap)}/s" if cap else ""
    done = (
        f"moved {format_size(mover['bytes_moved'])} in {mover['files_moved']} files, "
        f"dropped {format_size(mover['bytes_dropped'])} in {mover['files_dropped']} files"
    )
    current = mover.get("current")
    if not current:
        return f"{mover['state']}{capped}; {done}"
    share = current["done"] / current["bytes"] if current["bytes"] else 1.0
    return (
        f"{mover['state']} {current['src']} -> {current['dst'] or 'drop'} "
        f"{current['path'] or '(a file you may not list)'} "
        f"({share:.0%}) at {format_size(int(mover.get('rate') or 0))}/s{capped}; {done}"
    )


def _preload_line(job: dict[str, Any]) -> str:
    """``p12-1 fetching: 40/100 files, 1.2 GiB/3.0 GiB resident (40%), 200 MiB/s,
    ETA 9 s, 0 failed``."""
    if job["state"] == "scanning":  # the totals are not known yet
        return (
            f"{job['id']} scanning: {job['files_total']} files, "
            f"{format_size(job['bytes_total'])} found so far"
        )
    eta = job.get("eta")
    eta_text = "-" if eta is None else f"{eta:.0f} s"
    resident = min(job["bytes_total"], job["bytes_resident"] + job["bytes_fetched"])
    return (
        f"{job['id']} {job['state']}: {job['files_done']}/{job['files_total']} files "
        f"({job['files_resident']} already resident), {format_size(resident)}/"
        f"{format_size(job['bytes_total'])} resident ({job['ready_fraction']:.0%}), "
        f"fetched {format_size(job['bytes_fetched'])} at {format_size(int(job['rate']))}/s, "
        f"ETA {eta_text}, {job['files_failed']} failed"
    )


def _endpoint_line(endpoint: dict[str, Any]) -> str:
    """``reachable`` or ``UNREACHABLE since ... (for ...), last error ...; N bytes waiting``."""
    waiting = format_size(int(endpoint.get("bytes_waiting") or 0))
    since = endpoint.get("since")
    if endpoint.get("state", "reachable") == "reachable":
        return f"reachable; {waiting} waiting for upload"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    lasted = f" (for {time.time() - since:.0f} s)" if since else ""
    return (
        f"UNREACHABLE since {when}{lasted}, last error: {endpoint.get('last_error') or '?'}; "
        f"{waiting} waiting for upload"
    )


def _report_errors(results: list[dict[str, Any]]) -> int:
    failed = [r for r in results if "error" in r]
    for item in failed:
        print(f"tierfs: {item['path']}: {item['error']}", file=sys.stderr)
    return 1 if failed else 0


def cmd_where(args: argparse.Namespace) -> int:
    results = per_path("where", args.paths)
    if args.json:
        _print_json(results)
    else:
        results = _for_humans(results)
        _print_where(results)
    return _report_errors(results)


def _print_where(results: list[dict[str, Any]]) -> None:
    tier_names: list[str] = []
    for item in results:
        for name in item.get("tiers", {}):
            if name not in tier_names:
                tier_names.append(name)
    if all("error" in item for item in results):
        return  # only errors: stderr has them, no empty table
    header = f"{'size':>10} {'cached':>10} " + " ".join(f"{n:>10}" for n in tier_names)
    print(f"{header} {'state':<9} path")
    for item in results:
        if "error" in item:
            continue
        tiers = " ".join(f"{format_size(item['tiers'].get(n, 0)):>10}" for n in tier_names)
        if item["type"] == "directory":
            state = item["state"]
            path = f"{item['path'] or '.'}/ ({item['files']} files"
            if item["dirty_files"]:
                path += f", {item['dirty_files']} dirty: {format_size(item['dirty_bytes'])}"
            if item["pinned_files"]:
                path += f", {item['pinned_files']} pinned"
            path += ")"
        else:
            state = item["state"] + (f",pinned:{item['pin_tier']}" if item.get("pinned") else "")
            path = item["path"]
            if item.get("failed_reason"):
                path += f"  ({item['failed_reason']})"
        print(
            f"{format_size(item['size']):>10} {format_size(item['cached_bytes']):>10} {tiers} "
            f"{state:<9} {path}"
        )


def cmd_flush(args: argparse.Namespace) -> int:
    waited = others = open_elsewhere = 0
    for sock, relpaths in by_mount(args.paths).values():
        result = request(sock, "flush", {"paths": relpaths}, timeout=None)
        waited += result["entries"]
        left = result.get("left") or {}
        others += left.get("others", 0)
        open_elsewhere += left.get("open_elsewhere", 0)
    if args.json:
        document: dict[str, Any] = {"flushed": args.paths, "entries_waited_for": waited}
        if others or open_elsewhere:
            document["left"] = {"others": others, "open_elsewhere": open_elsewhere}
        _print_json(document)
    elif others or open_elsewhere:
        print(
            f"tierfs flush: left to their own schedule: {others} change(s) of other users' "
            f"files, {open_elsewhere} of files another user's process has open for writing "
            "(root's flush covers them)",
            file=sys.stderr,
        )
    return 0


# --- preload -------------------------------------------------------------------------------

#: Seconds between two progress lines when stdout is not a terminal.
PLAIN_PROGRESS_INTERVAL = 5.0


def _list_lines(stream: IO[str]) -> Iterator[str]:
    """The paths of a list file: one per line, blank lines skipped."""
    for line in stream:
        path = line.rstrip("\n").removesuffix("\r")
        if path:
            yield path


def _preload_mount(paths: list[str], first_line: str | None) -> tuple[Location, list[str]]:
    """The mount of the preload (that of the PATHs; else of an absolute
    first list line; else of the current directory) and the PATHs relative
    to its root."""
    anchor = paths[0] if paths else first_line if first_line and first_line[0] == "/" else "."
    mount = locate(anchor)
    relpaths = []
    for path in paths:
        location = locate(path)
        if location.mount_root != mount.mount_root:
            raise CliError(f"{path} is not on the mount {mount.mount_root}: one mount per preload")
        relpaths.append(location.relpath)
    return mount, relpaths


class _PreloadView:
    """Shows the events of a preload: a rich progress bar when stderr is a
    terminal (on stderr, with the warnings and failures printed above it,
    so that they stay diagnostics and stdout keeps only the summary), plain
    progress lines on stdout otherwise, one JSON object per line with
    ``--json``.  Warnings and failures go to stderr, each failure once."""

    def __init__(self, root: Path, as_json: bool) -> None:
        self.root = root
        self.as_json = as_json
        self.failed_named = 0
        self._last_plain = 0.0
        self._progress: Any = None
        self._task: Any = None
        if not as_json and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]preload"),
                BarColumn(),
                DownloadColumn(binary_units=True),
                TextColumn("{task.fields[files]} files"),
                TextColumn("{task.fields[rate]}/s"),
                TextColumn("ETA {task.fields[eta]}"),
                TextColumn("[red]{task.fields[failed]} failed"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._progress.add_task(
                "preload", total=None, files="0/0", rate="0 B", eta="-", failed=0
            )

    def __enter__(self) -> _PreloadView:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _stderr(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def failure(self, path: str, reason: str) -> None:
        self.failed_named += 1
        self._stderr(f"tierfs: {self.root / path if path != '/' else self.root}: {reason}")

    def event(self, event: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps(event), flush=True)
        event = _for_humans(event)
        kind = event.get("event")
        if kind == "warning":
            self._stderr(f"tierfs: warning: {event['message']}")
        elif kind == "failed":
            self.failure(event["path"], event["reason"])
        elif kind == "progress" and not self.as_json:
            self._show(event)

    def _show(self, job: dict[str, Any]) -> None:
        if self._progress is not None:
            eta = job.get("eta")
            resident = min(job["bytes_total"], job["bytes_resident"] + job["bytes_fetched"])
            self._progress.update(
                self._task,
                total=job["bytes_total"] if job["state"] != "scanning" else None,
                completed=resident,
                files=f"{job['files_done']}/{job['files_total']}",
                rate=format_size(int(job["rate"])),
                eta="-" if eta is None else f"{eta:.0f}s",
                failed=job["files_failed"],
            )
            return
        now = time.monotonic()
        if now - self._last_plain >= PLAIN_PROGRESS_INTERVAL:
            self._last_plain = now
            print(f"preload {_preload_line(job)}", flush=True)

    def summary(self, result: dict[str, Any], *, returned_early: bool) -> None:
        for failure in _for_humans(result.get("failures", []))[self.failed_named :]:
            self.failure(failure["path"], failure["reason"])
        if self.as_json:
            print(json.dumps({"event": "summary", **result}), flush=True)
            return
        if self._progress is not None:
            self._show(result)
            self._progress.stop()
            self._progress = None
        print(f"preload {_preload_line(result)}")
        if returned_early:
            print(
                f"{result['ready_fraction']:.0%} of the bytes are resident; preload "
                f"{result['id']} goes on in the daemon (`tierfs status {self.root}` shows it)"
            )
        elif (
            result["state"] == "done" and not result["bytes_fetched"] and not result["files_failed"]
        ):
            print("nothing to fetch: every file was already resident")


def _rate_argument(text: str) -> int:
    """An argparse type: a rate such as ``200MiB/s``, in bytes per second."""
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rank(text: str) -> int:
    """An argparse type: a rank, a whole number from 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a rank is a whole number from 0, not {text!r}")
    return int(text)


def cmd_preload(args: argparse.Namespace) -> int:
    if args.list or args.cancel or args.cancel_tag:
        return _preload_jobs(args)
    fraction = args.ready_fraction
    if fraction is not None and not 0 <= fraction <= 1:
        raise CliError("--ready-fraction must be a number from 0 to 1")
    if not args.paths and not args.from_file:
        raise CliError("nothing to preload: give PATHs, --from-file, or both")
    list_file: IO[str] | None = None
    if args.from_file == "-":
        list_file = sys.stdin
    elif args.from_file:
        try:
            list_file = open(args.from_file, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
        except OSError as exc:
            raise CliError(f"{args.from_file}: {exc.strerror}", exc.errno or errno.EIO) from None
    try:
        lines = _list_lines(list_file) if list_file is not None else iter(())
        first = next(lines, None)
        mount, relpaths = _preload_mount(args.paths, first)
        listed = list_chunks(_prepend(first, lines)) if list_file is not None else iter(())
        request_args = {
            "paths": relpaths,
            "tier": args.tier,
            "ready_fraction": fraction,
            "bandwidth": args.bandwidth,
            "detach": args.detach,
            "from_list": list_file is not None,
            "tag": args.tag,
        }
        with _PreloadView(mount.mount_root, args.json) as view:
            result = request(
                mount.socket_path,
                "preload",
                request_args,
                on_event=None if args.detach else view.event,
                more=listed,
            )
            if args.detach:
                if args.json:
                    print(json.dumps({"event": "detached", **result}), flush=True)
                else:
                    print(
                        f"preload {result['id']} started in the daemon; "
                        f"`tierfs status {mount.mount_root}` shows its progress"
                    )
                return 0
            view.summary(
                result, returned_early=result["state"] not in ("done", "cancelled", "failed")
            )
    finally:
        if list_file is not None and list_file is not sys.stdin:
            list_file.close()
    if result["state"] in ("failed", "cancelled"):
        return 1
    return 1 if result["files_failed"] else 0


def _preload_jobs(args: argparse.Namespace) -> int:
    """``--list``, ``--cancel ID``, ``--cancel-tag TAG``: on the mount of
    the one PATH given (else of the current directory)."""
    if sum(map(bool, (args.list, args.cancel, args.cancel_tag))) != 1:
        raise CliError("give one of --list, --cancel ID, --cancel-tag TAG")
    if len(args.paths) > 1 or args.from_file:
        raise CliError("--list and --cancel take at most one PATH: the mount to ask")
    mount = locate(args.paths[0] if args.paths else os.getcwd())
    if args.list:
        jobs = request(mount.socket_path, "preload_list")
        if args.json:
            _print_json(jobs)
        elif not jobs:
            print(f"no preloads on {mount.mount_root}")
        for job in [] if args.json else _for_humans(jobs):
            tag = f" tag {job['tag']}" if job.get("tag") else ""
            print(f"{_preload_line(job)}; uid {job['owner']}{tag}; {' '.join(job['paths'])}")
        return 0
    target = {"id": args.cancel} if args.cancel else {"tag": args.cancel_tag}
    result = request(mount.socket_path, "preload_cancel", target)
    if args.json:
        _print_json(result)
    elif result["cancelled"]:
        print(f"cancelled {', '.join(result['cancelled'])}")
    else:
        print(f"no running preload tagged {args.cancel_tag!r}")
    return 0


def _prepend(first: str | None, rest: Iterator[str]) -> Iterator[str]:
    if first is not None:
        yield first
    yield from rest


# --- prefetch ------------------------------------------------------------------------------


def cmd_prefetch(args: argparse.Namespace) -> int:
    mount = locate(args.mountpoint)
    if args.clear or args.all:
        return _prefetch_clear(args, mount.socket_path, mount.mount_root)
    if args.order is None:
        raise CliError("give --order FILE (the read order), or --clear to end an order")
    if args.order == "-":
        order_file: IO[str] = sys.stdin
    else:
        try:
            order_file = open(args.order, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
        except OSError as exc:
            raise CliError(f"{args.order}: {exc.strerror}", exc.errno or errno.EIO) from None
    session: dict[str, Any] = {"job": args.job or ""}
    if args.rank is not None:
        session["rank"] = args.rank
    try:
        result = request(
            mount.socket_path, "prefetch", session, more=list_chunks(_list_lines(order_file))
        )
    finally:
        if order_file is not sys.stdin:
            order_file.close()
    if args.json:
        _print_json(result)
        return 1 if result["missing"] else 0
    result = _for_humans(result)
    for line in result.get("missing_named", []):
        print(f"tierfs prefetch: left out: {line}", file=sys.stderr)
    if result["missing"] > len(result.get("missing_named", [])):
        print(
            f"tierfs prefetch: ... and {result['missing'] - len(result['missing_named'])} more",
            file=sys.stderr,
        )
    if not result["order_files"]:
        print(f"prefetch: no order for {_session_name(session)} on {mount.mount_root}")
    else:
        print(
            f"prefetch: order {result['id']} ({_session_name(result)}) of "
            f"{result['order_files']} files on {mount.mount_root}; window "
            f"{result['window_files']} files / {format_size(result['window_bytes'])}"
            + (f"; {result['missing']} missing files left out" if result["missing"] else "")
        )
    return 1 if result["missing"] else 0


def _prefetch_clear(args: argparse.Namespace, socket_path: str, mount_root: Path) -> int:
    clear: dict[str, Any] = {}
    if args.job:  # every session of that job
        clear["job"] = args.job
    elif not args.all:  # the unnamed order
        clear.update(job="", session="")
    if args.rank is not None:
        clear["rank"] = args.rank
    result = request(socket_path, "prefetch_clear", clear)
    if args.json:
        _print_json(result)
    else:
        ended = ", ".join(str(ident) for ident in result["ended"]) or "none"
        print(f"prefetch: orders ended on {mount_root}: {ended}")
    return 0


def _session_name(order: dict[str, Any]) -> str:
    """An order's session for people: its owner (when known), job and rank."""
    parts = [f"uid {order['owner']}"] if "owner" in order else []
    if order.get("job"):
        parts.append(f"job {order['job']}")
    if order.get("rank") is not None:
        parts.append(f"rank {order['rank']}")
    if order.get("session"):
        parts.append(f"session {order['session']}")
    if len(parts) == ("owner" in order):
        parts.append("unnamed")
    return ", ".join(parts)


def _prefetch_line(order: dict[str, Any]) -> str:
    return (
        f"order {order['id']} ({_session_name(order)}) of {order['order_files']} files, cursor "
        f"{order['cursor']} (slowest {order['slowest']}), window {order['window']}/"
        f"{order['window_files']} files ({order['in_flight']} fetching), prefetched "
        f"{order['files_prefetched']} files ({format_size(order['bytes_prefetched'])}), "
        f"hits {order['hits']} of {order['opens']} opens"
    )


# --- evict / pin / unpin ----------------------------------------------------------------------


def cmd_evict(args: argparse.Namespace) -> int:
    results = per_path("evict", args.paths, {"tier": args.tier})
    if args.json:
        _print_json(results)
    else:
        results = _for_humans(results)
    for item in results:
        if "error" in item:
            continue
        if not args.json:
            print(f"evicted {format_size(item['evicted_bytes']):>10}  {item['path']}")
        for skipped in item.get("skipped", []):
            print(f"tierfs: {skipped['path']}: kept: {skipped['reason']}", file=sys.stderr)
    return _report_errors(results)


def cmd_pin(args: argparse.Namespace) -> int:
    # Pinning fetches the files to the tier: that may take long.
    results = per_path("pin", args.paths, {"tier": args.tier}, timeout=None)
    if args.json:
        _print_json(results)
    else:
        results = _for_humans(results)
        for item in results:
            if "error" not in item:
                print(
                    f"pinned to {item['tier']}: {item['path']} ({item['files']} files, "
                    f"{format_size(item['bytes'])}, fetched {format_size(item['fetched_bytes'])})"
                )
    return _report_errors(results)


def cmd_unpin(args: argparse.Namespace) -> int:
    results = per_path("unpin", args.paths)
    if args.json:
        _print_json(results)
    else:
        results = _for_humans(results)
        for item in results:
            if "error" not in item:
                state = "unpinned" if item["was_pinned"] else "was not pinned"
                print(f"{state}: {item['path']}")
    return _report_errors(results)


# --- policy check ------------------------------------------------------------------------


def cmd_policy_check(args: argparse.Namespace) -> int:
    """Errors at file:line (exit 1), warnings, then "ok".  ``--offline``
    checks the file alone: not the tier and state directories, nor the
    bucket (the pin sizes), which only the node can see."""
    problems = check_file(args.file, check_paths=not args.offline)
    warnings: list[str] = []
    if not problems:
        config = _config_of(args.file)
        rules = config.rules if config is not None else load_policy(args.file)
        warnings += [
            f"{later.source}: warning: this rule can never match: the rule at {earlier.source} "
            f"({earlier.match!r}) matches every path that {later.match!r} matches, and the "
            "first match wins"
            for later, earlier in shadowed_rules(rules)
        ]
        if config is not None and not args.offline:  # a policy file has no tiers, no bucket
            warnings += pin_sizes.warnings(config)
            problems += _shared_tier_problems(config, args.file, warnings)
    if args.json:
        document: dict[str, Any] = {
            "ok": not problems,
            "offline": args.offline,
            "problems": [
                {"file": file, "line": line, "message": sentence}
                for file, line, sentence in problems
            ],
            "warnings": warnings,
        }
        if problems:  # as in every other error document
            document["errno"] = errno.EINVAL
            document["error"] = f"{len(problems)} problem(s); the first: {problems[0][2]}"
        _print_json(document)
        return 1 if problems else 0
    for problem in problems:
        print(ConfigError.format_problem(problem), file=sys.stderr)
    if problems:
        return 1
    for warning in warnings:
        print(warning, file=sys.stderr)
    print(
        "ok (offline: tier and state directories and the bucket not checked)"
        if args.offline
        else "ok"
    )
    return 0


def _shared_tier_problems(config: Config, file: str, warnings: list[str]) -> list[Problem]:
    """The shared tier's check (``SharedBucket.check``), on the node: one
    that answers but cannot serve is a problem (the mount would refuse it);
    one that does not answer, a warning (the mount goes on without it)."""
    if config.shared_tier is None:
        return []
    from tierfs.store import open_shared_tier

    try:
        shared = open_shared_tier(config.shared_tier)
    except ImportError as exc:  # a client-only install: no S3 engine
        warnings.append(f"note: the shared tier not checked: {exc}")
        return []
    try:
        shared.check()
    except SharedTierUnusable as exc:
        return [(file, 0, str(exc))]
    except StoreError as exc:
        warnings.append(f"warning: {exc}; a mount would read from the bucket until it answers")
    finally:
        shared.close()
    return []


def _config_of(path: str) -> Config | None:
    """The config in ``path``; None if it is a policy file (rules only)."""
    try:
        return load_config(path, check_paths=False)
    except ConfigError:
        return None


def _mount_socket(mountpoint: str) -> str:
    path = Path(os.path.abspath(mountpoint))
    location = locate(path)
    if location.mount_root != path:
        raise CliError(f"{path} is not a tierfs mount point")
    return location.socket_path


def cmd_policy_show(args: argparse.Namespace) -> int:
    policy = request(_mount_socket(args.mountpoint), "policy_show")
    if args.json:
        _print_json(policy)
        return 0
    policy = _for_humans(policy)
    for warning in policy.get("warnings", []):
        print(f"tierfs: warning: {warning}", file=sys.stderr)
    if not policy["rules"]:
        print("no [[rules]]: every file gets the defaults (place on the first tier with room,")
        print("watermark demotion, promote on access, cache)")
    for number, rule in enumerate(policy["rules"], 1):
        settings = ", ".join(f"{k} = {_toml_value(v)}" for k, v in rule["settings"].items())
        print(f"{number:>3}. {rule['match']!r:<30} {settings or '(defaults)'}   [{rule['source']}]")
    return 0


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def cmd_policy_plan(args: argparse.Namespace) -> int:
    plan = request(_mount_socket(args.mountpoint), "policy_plan", timeout=None)
    if args.json:
        _print_json(plan)
        return 0
    if not plan["summary"]:
        print("nothing to move: every tier is within its watermarks and no rule applies now")
        return 0
    print(f"{'from':<8} {'to':<8} {'reason':<12} {'files':>8} {'bytes':>10}")
    for row in plan["summary"]:
        print(
            f"{row['src'] or 's3':<8} {row['dst'] or 'drop':<8} {row['reason']:<12} "
            f"{row['files']:>8} {format_size(row['bytes']):>10}"
        )
    return 0


def cmd_policy_reload(args: argparse.Namespace) -> int:
    reloaded = request(_mount_socket(args.mountpoint), "policy_reload")
    if args.json:
        _print_json(reloaded)
    else:
        print(f"reloaded: {reloaded['rules']} rules and {reloaded['quotas']} quotas in force")
    return 0


# --- quotas ------------------------------------------------------------------------------------


def cmd_quota(args: argparse.Namespace) -> int:
    answer = request(_mount_socket(args.mountpoint), "quota", {"walk": args.walk}, timeout=None)
    if args.json:
        _print_json(answer)
        return 0
    answer = _for_humans(answer)
    quotas: list[dict[str, Any]] = answer["quotas"]
    if answer.get("note"):
        print(f"tierfs quota: {answer['note']}", file=sys.stderr)
    if not quotas:
        print("no [[quotas]] on this mount")
        return 0
    print(
        f"{'path':<28} {'bytes used':>11} {'limit':>10} {'use%':>6} {'names':>10} "
        f"{'limit':>10} {'use%':>6}  state"
    )
    for quota in quotas:
        print(_quota_line(quota))
    return 0


def cmd_snapshot_create(args: argparse.Namespace) -> int:
    socket_path = _mount_socket(args.mountpoint)
    progress = sys.stderr.isatty() and not args.json

    def on_event(event: dict[str, Any]) -> None:
        if progress and event.get("event") == "progress":
            print(
                f"\rrecording: {event['objects']:,} objects, {format_size(event['bytes'])}",
                end="",
                file=sys.stderr,
                flush=True,
            )

    try:
        result = request(
            socket_path,
            "snapshot_create",
            {"name": args.name, "paths": args.paths},
            timeout=None,
            on_event=on_event,
        )
    finally:
        if progress:
            print(file=sys.stderr)
    if args.json:
        _print_json(result)
        return 0
    result = _for_humans(result)
    for warning in result.get("warnings", []):
        print(f"tierfs: warning: {warning}", file=sys.stderr)
    print(
        f"snapshot {result['name']}: {result['objects']:,} objects, "
        f"{format_size(result['bytes'])}; mount it with "
        f"`tierfs mount CONFIG MOUNTPOINT -o snapshot={result['name']}`"
    )
    return 0


def cmd_snapshot_list(args: argparse.Namespace) -> int:
    answer = request(_mount_socket(args.mountpoint), "snapshot_list", timeout=None)
    if args.json:
        _print_json(answer)
        return 0
    answer = _for_humans(answer)
    if not answer["snapshots"]:
        print("no snapshots")
    else:
        print(f"{'name':<28} {'created':<19} {'by uid':>7} {'objects':>12} {'bytes':>10}  paths")
        for item in answer["snapshots"]:
            print(_snapshot_line(item))
    for name in answer["leftovers"]:
        print(
            f"tierfs: {name}: the parts of a create that did not finish (not a snapshot); "
            f"`tierfs snapshot delete {args.mountpoint} {name}` as root removes them",
            file=sys.stderr,
        )
    return 0


def _snapshot_line(item: dict[str, Any]) -> str:
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item["created"]))
    if "paths" in item:
        paths = " ".join(p or "/" for p in item["paths"])
    else:
        paths = f"({item['paths_hidden']} paths, shown to their creator)"
    return (
        f"{item['name']:<28} {created:<19} {item['creator_uid']:>7} {item['objects']:>12,} "
        f"{format_size(item['bytes']):>10}  {paths}"
    )


def cmd_snapshot_show(args: argparse.Namespace) -> int:
    answer = request(
        _mount_socket(args.mountpoint), "snapshot_show", {"name": args.name}, timeout=None
    )
    if args.json:
        _print_json(answer)
        return 0
    answer = _for_humans(answer)
    created = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(answer["created"]))
    print(f"snapshot: {answer['name']}")
    print(f"created:  {created} by uid {answer['creator_uid']}")
    if "paths" in answer:
        print(f"paths:    {' '.join(p or '/' for p in answer['paths'])}")
    print(f"objects:  {answer['objects']:,} ({format_size(answer['bytes'])})")
    kept = "version IDs" if answer["versioned"] else "ETags only (the bucket keeps no versions)"
    print(f"recorded: {kept}")
    if answer["versioned"]:
        print(f"gone:     {answer['versions_gone']:,} recorded versions the bucket no longer keeps")
    for warning in answer.get("warnings", []):
        print(f"tierfs: warning: {warning}", file=sys.stderr)
    return 0


def cmd_snapshot_diff(args: argparse.Namespace) -> int:
    answer = request(
        _mount_socket(args.mountpoint),
        "snapshot_diff",
        {"name": args.name, "other": args.other},
        timeout=None,
    )
    if args.json:
        _print_json(answer)
        return 0
    answer = _for_humans(answer)
    for change, mark in (("added", "+"), ("removed", "-"), ("changed", "M")):
        for name in answer[change]:
            print(f"{mark} {name}")
    counts = answer["counts"]
    against = answer["other"] or "the bucket now"
    print(
        f"{answer['name']} -> {against}: {counts['added']:,} added, "
        f"{counts['removed']:,} removed, {counts['changed']:,} changed"
        + (" (names shown: the first of each kind)" if answer["truncated"] else ""),
        file=sys.stderr,
    )
    return 0


def cmd_snapshot_delete(args: argparse.Namespace) -> int:
    answer = request(
        _mount_socket(args.mountpoint), "snapshot_delete", {"name": args.name}, timeout=None
    )
    if args.json:
        _print_json(answer)
    else:
        print(
            f"deleted snapshot {shown(answer['name'])} ({answer['deleted']} objects of its record)"
        )
    return 0


def _quota_line(quota: dict[str, Any]) -> str:
    def limit(value: int | None, size: bool) -> str:
        if value is None:
            return "-"
        return format_size(value) if size else f"{value:,}"

    def percent(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}%"

    if quota["full"]:
        state = "FULL (EDQUOT)"
    elif quota["warning"]:
        state = f"WARNING (over {quota['warn_at']:.0%})"
    else:
        state = "ok"
    if not quota["walked"]:
        state += ", bucket not counted yet"
    elif quota["walk_error"]:
        state += f", last count failed: {quota['walk_error']}"
    return (
        f"{quota['path']:<28} {format_size(quota['bytes_used']):>11} "
        f"{limit(quota['bytes_limit'], True):>10} {percent(quota['bytes_percent']):>6} "
        f"{quota['files_used']:>10,} {limit(quota['files_limit'], False):>10} "
        f"{percent(quota['files_percent']):>6}  {state}"
    )


# --- plumbing ----------------------------------------------------------------------------------


def _for_humans(value: Any) -> Any:
    """Every string of a daemon's answer escaped for a terminal (``shown``):
    paths, tags and job names are other users' text and may hold newlines
    or escape sequences.  (``--json`` needs none: JSON escapes them.)"""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, list):
        return [_for_humans(item) for item in value]
    if isinstance(value, dict):
        return {key: _for_humans(item) for key, item in value.items()}
    return value


def _print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


_MOUNTPOINT_HELP = "the directory a tierfs mount is on"
_PATH_HELP = "a file or directory on a tierfs mount"
_SNAPSHOT_NAME_HELP = "a snapshot's name: letters, digits, '.', '_', '-' (up to 128)"
USAGE_EXIT = 2
_EXIT_STATUS = (
    "exit status: 0 success; 1 failure (one sentence on stderr, or with --json one "
    '{"ok": false, "error": ..., "errno": N} document on stdout); 2 bad usage (the same '
    "JSON document with --json); 130 interrupted (Ctrl-C)."
)


def _add_mountpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help=_MOUNTPOINT_HELP)


def _add_json(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")


class UsageError(Exception):
    """A command line argparse refuses: raised by ``_Parser.error`` instead
    of exiting there, so that ``main`` prints it as text or as JSON."""

    def __init__(self, message: str, usage: str, prog: str) -> None:
        super().__init__(message)
        self.usage = usage
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors raised (``UsageError``) rather than
    printed and exited on; its subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage(), self.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tierfs",
        description=(
            "tierfs: one namespace over an NVMe cache tier, an HDD tier and an S3 bucket. "
            "Files are fetched lazily, block by block, and cached on the tiers."
        ),
        epilog=_EXIT_STATUS,
    )
    parser.add_argument("--version", action="version", version=f"tierfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "mount",
        help="mount a bucket (returns once the mount is ready)",
        description="Mount the bucket of CONFIG on MOUNTPOINT, with its tiers. Returns once "
        "the mount is ready; a bad config, a missing bucket, bad credentials or a busy mount "
        "point gives one sentence on stderr and exit status 1 within seconds. With -f the "
        "daemon stays in the foreground and logs to stderr (systemd, a DaemonSet).",
    )
    p.add_argument(
        "config", metavar="CONFIG", help="config file (TOML), see deploy/examples/tierfs.toml"
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="empty directory to mount on")
    p.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay in the foreground (systemd Type=notify)",
    )
    p.add_argument(
        "-o",
        dest="options",
        default="",
        metavar="OPT[,OPT]",
        help="mount options: allow_other, allow_root (other users may read, as the stored modes "
        "allow), ro (read-only: every change fails with EROFS), snapshot=NAME (mount that "
        "snapshot, read-only: exactly the recorded names at their recorded bytes), debug",
    )
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser(
        "umount",
        help="unmount cleanly and wait for the daemon to exit",
        description="Unmount. Uploads still pending stay in the journal and resume at the "
        "next mount, unless --flush is given.",
    )
    _add_mountpoint(p)
    p.add_argument(
        "--flush",
        action="store_true",
        help="wait until every pending upload is in the bucket first",
    )
    _add_json(p)
    p.set_defaults(func=cmd_umount)

    p = sub.add_parser(
        "status",
        help="per tier: capacity, used, watermarks, files; hit ratio",
        description="The state of a mount: per tier its capacity, use, watermarks and files; "
        "dirty bytes and pending uploads; the hit ratio; the preloads, prefetch orders, "
        "quotas and the bucket's health.",
    )
    _add_mountpoint(p)
    shown = p.add_mutually_exclusive_group()
    _add_json(shown)
    shown.add_argument(
        "--watch",
        action="store_true",
        help="a live table refreshed every second: tiers, hits, rates, queues, "
        "FUSE and S3 requests, preloads (Ctrl-C to stop)",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "where",
        help="per file: size, bytes on each tier, sync state",
        description="Where the bytes of each PATH are: its size, the bytes on each tier and "
        "its sync state (clean, dirty, uploading). For a directory: the totals of its "
        "subtree (files, bytes, bytes on each tier, dirty bytes).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=_PATH_HELP)
    _add_json(p)
    p.set_defaults(func=cmd_where)

    p = sub.add_parser(
        "flush",
        help="wait until PATH is durable in the bucket",
        description="Block until every change under each PATH (a file, a directory, or the "
        "mount root) is in the bucket. Fails, instead of waiting forever, if the bucket keeps "
        "refusing the uploads.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=_PATH_HELP)
    _add_json(p)
    p.set_defaults(func=cmd_flush)

    p = sub.add_parser(
        "evict",
        help="drop clean local copies of files (they stay in the bucket)",
        description="Drop the cached copies of each PATH (a file or a directory tree) from "
        "tier NAME, or from every local tier. Data not yet uploaded is never dropped: such "
        "files are named on stderr and kept. Pinned files are kept too (unpin them first).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=_PATH_HELP)
    p.add_argument("--tier", metavar="NAME", help="only this tier (default: every tier)")
    _add_json(p)
    p.set_defaults(func=cmd_evict)

    p = sub.add_parser(
        "preload",
        help="fetch files or trees to a tier before a job reads them",
        description="Fetch every file at or below each PATH (and each path of --from-file) "
        "from the bucket to the local tiers, in the daemon, with a progress bar: files, bytes, "
        "rate, ETA, failures. Data already resident is skipped (a rerun fetches nothing and "
        "says so). Demand reads of running jobs go before preload fetches. A bad list (a "
        "'..' component, a NUL byte, an absolute path outside the mount) is rejected before "
        "anything is fetched; a missing file is named and the rest goes on. Ctrl-C cancels "
        "the preload, unless --detach or --ready-fraction was given. Exit status 1 if any "
        "file failed (each is named on stderr).",
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a file or directory on a tierfs mount (every PATH on the same mount)",
    )
    p.add_argument(
        "--from-file",
        metavar="F",
        help="also preload the paths listed in F, one per line ('-': stdin); a path is "
        "absolute (inside the mount) or relative to the mount root; blank lines are skipped. "
        "Without PATHs, the mount is that of the first line if it is absolute, else that of "
        "the current directory. The list is streamed to the daemon, never held in memory whole",
    )
    p.add_argument(
        "--tier",
        metavar="NAME",
        help="tier to fetch absent blocks to (default: the normal placement, usually the "
        "first tier); blocks already on another tier stay there. The shared tier's name "
        "warms the shared tier once for every node, and fills no local tier",
    )
    p.add_argument(
        "--ready-fraction",
        metavar="X",
        type=float,
        help="return once X (0 to 1, e.g. 0.3) of the bytes are resident; the preload goes "
        "on in the daemon (`tierfs status` shows it), and Ctrl-C no longer cancels it",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="return at once with the preload's id; it runs on in the daemon",
    )
    p.add_argument(
        "--tag",
        metavar="TAG",
        help="a tag for the preload, e.g. the scheduler's job id; --cancel-tag TAG cancels it",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the mount's preloads (id, owner, tag, paths, progress, state) and exit",
    )
    p.add_argument("--cancel", metavar="ID", help="cancel the running preload ID and exit")
    p.add_argument(
        "--cancel-tag", metavar="TAG", help="cancel every running preload tagged TAG and exit"
    )
    p.add_argument(
        "--bandwidth",
        metavar="RATE",
        type=_rate_argument,
        default=0,
        help='cap on the bytes this preload fetches per second, e.g. "200MiB/s" (default '
        '"0": no cap beyond the fetch slots; demand reads always go first either way)',
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON event per line on stdout (progress, warning, failed), then a final "
        '{"event": "summary", ...} line',
    )
    p.set_defaults(func=cmd_preload)

    p = sub.add_parser(
        "prefetch",
        help="hand the daemon the order in which a job will read files",
        description="Order-aware prefetch: the daemon keeps the next files of the order "
        "resident ahead of the reader (by default the next 64 files or 2 GiB, whichever is "
        "smaller), following the reader's position from its opens (several readers, e.g. a "
        "DataLoader's workers, and jumps too). Files already read are the first to leave "
        "the first tier under pressure. Each order belongs to a session: your user, and the "
        "--job and --rank you name (none: your one unnamed order). Orders of different "
        "sessions run side by side and share the fetches fairly; a new order replaces its "
        "session's previous one, an empty order or --clear ends it. A bad line (a '..' "
        "component, a NUL byte, an absolute path outside the mount) rejects the whole order, "
        "and the previous one stays; a missing file, or one you may not read, is named on "
        "stderr and left out, the rest goes on (exit status 1). 'tierfs status' lists the "
        "orders. From Python: tierfs.client.set_order(MOUNTPOINT, paths), or "
        "tierfs.client.PrefetchSession for an order that ends with its process.",
    )
    _add_mountpoint(p)
    p.add_argument(
        "--order",
        metavar="FILE",
        help="the read order: one path per line ('-': stdin), relative to the mount root or "
        "absolute inside the mount; blank lines are skipped. Streamed to the daemon",
    )
    p.add_argument(
        "--job",
        metavar="NAME",
        help="the session's job name (e.g. slurm-$SLURM_JOB_ID); with --clear: end every "
        "order of that job (as root: of every user)",
    )
    p.add_argument(
        "--rank",
        metavar="N",
        type=_rank,
        help="the session's rank within its job (e.g. a DDP rank)",
    )
    p.add_argument(
        "--clear",
        action="store_true",
        help="end the session's order (with --job and no --rank: every rank of the job)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="end every order of yours on the mount (as root: every order)",
    )
    _add_json(p)
    p.set_defaults(func=cmd_prefetch)

    p = sub.add_parser(
        "pin",
        help="fetch files to a tier and keep them there",
        description="Pin each PATH (a file or a directory tree): its data is fetched to tier "
        "NAME (default: the first tier) and is never demoted or evicted. Files created later "
        "under a pinned directory are pinned too. Pins survive remounts and renames.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=_PATH_HELP)
    p.add_argument("--tier", metavar="NAME", help="tier to keep the data on (default: the first)")
    _add_json(p)
    p.set_defaults(func=cmd_pin)

    p = sub.add_parser(
        "unpin",
        help="undo `tierfs pin`: the lifecycle rules apply again",
        description="Unpin each PATH (a file or a directory tree): its data stays where it "
        "is, and the lifecycle rules may move or evict it again.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=_PATH_HELP)
    _add_json(p)
    p.set_defaults(func=cmd_unpin)

    p = sub.add_parser(
        "policy",
        help="lifecycle rules and quotas: check, show, plan, reload",
        description="Lifecycle rules and quotas: check a file before it goes live, show the "
        "rules a mount has in force, plan (a dry run of the mover), reload a mount's files.",
    )
    policy = p.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    c = policy.add_parser(
        "check",
        help="validate a config or policy file; errors as file:line",
        description="Validate a config file (with the policy files it names) or one policy "
        "file: every problem is reported as file:line, and the exit status is 1 if there is "
        "any. On the node it also checks the tier and state directories and the bucket.",
    )
    c.add_argument("file", metavar="FILE", help="a config file or a policy file (TOML)")
    c.add_argument(
        "--offline",
        action="store_true",
        help="check the file alone, off the node (in CI, on a laptop): not the tier and "
        "state directories, nor the bucket",
    )
    c.add_argument(
        "--json", action="store_true", help="one JSON document on stdout: ok, problems, warnings"
    )
    c.set_defaults(func=cmd_policy_check)
    c = policy.add_parser(
        "show",
        help="the rules in effect on a mount, in order, with file:line",
        description="The lifecycle rules a mount has in force, in the order they apply, each "
        "with the file:line it came from.",
    )
    _add_mountpoint(c)
    _add_json(c)
    c.set_defaults(func=cmd_policy_show)
    c = policy.add_parser(
        "plan",
        help="dry run: the moves the mover would make now",
        description="What the mover would do now, per source and target tier and reason "
        "(watermark, age, evict_after, keep_newest, pin), in files and bytes. Moves nothing.",
    )
    _add_mountpoint(c)
    _add_json(c)
    c.set_defaults(func=cmd_policy_plan)
    c = policy.add_parser(
        "reload",
        help="reread the rules and quotas of a mount (as SIGHUP does)",
        description="Reread the config file's [[rules]] and [[quotas]] and its policy files. A "
        "broken file is rejected with file:line and the rules and quotas in force stay. With "
        "quotas, it returns once the bucket is counted for them.",
    )
    _add_mountpoint(c)
    _add_json(c)
    c.set_defaults(func=cmd_policy_reload)

    p = sub.add_parser(
        "quota",
        help="directory quotas: used, limit and percent of bytes and names, per quota",
        description="The [[quotas]] of a mount and their usage: what the bucket held at the "
        "last count (a walk at mount and every list_ttl) plus this node's changes since. A "
        "change that would pass a limit fails with EDQUOT (Disk quota exceeded); at warn_at "
        "the quota shows WARNING and the daemon logs it once.",
    )
    _add_mountpoint(p)
    p.add_argument(
        "--walk",
        action="store_true",
        help="count the bucket again first and wait for it (other nodes' uploads show)",
    )
    _add_json(p)
    p.set_defaults(func=cmd_quota)
    p = sub.add_parser(
        "snapshot",
        help="dataset snapshots: create, list, show, diff, delete",
        description="A snapshot records the objects under some paths of a mount as the bucket "
        "holds them now (key, size, ETag, version ID, mode, owner), in the bucket. "
        "`tierfs mount CONFIG MOUNTPOINT -o snapshot=NAME` then mounts exactly those names at "
        "their recorded bytes, read-only, on any node.",
    )
    snapshot = p.add_subparsers(dest="snapshot_command", required=True, metavar="SUBCOMMAND")
    c = snapshot.add_parser(
        "create",
        help="record the objects under PATHs (default: the whole mount)",
        description="Record the objects under each PATH as the bucket holds them now. A user "
        "may snapshot only what they may read. Ctrl-C stops it, and nothing is kept. On a "
        "bucket without versioning the snapshot stays readable only while its objects are "
        "unchanged (a warning says so).",
    )
    _add_mountpoint(c)
    c.add_argument("--name", required=True, metavar="NAME", help=_SNAPSHOT_NAME_HELP)
    c.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a file or directory of the mount, absolute or relative to MOUNTPOINT",
    )
    _add_json(c)
    c.set_defaults(func=cmd_snapshot_create, paths_after_options=True)
    c = snapshot.add_parser(
        "list",
        help="every snapshot of the mount's bucket",
        description="Every snapshot of the mount's bucket: name, when, by whom, objects, "
        "bytes, paths (shown to the creator and root).",
    )
    _add_mountpoint(c)
    _add_json(c)
    c.set_defaults(func=cmd_snapshot_list)
    c = snapshot.add_parser(
        "show",
        help="one snapshot, and whether the bucket still keeps its versions",
        description="One snapshot: when, by whom, which paths, objects and bytes; on a "
        "versioned bucket, how many recorded versions the bucket no longer keeps (a warning "
        "if any: reading those through a snapshot mount fails).",
    )
    _add_mountpoint(c)
    c.add_argument("name", metavar="NAME", help=_SNAPSHOT_NAME_HELP)
    _add_json(c)
    c.set_defaults(func=cmd_snapshot_show)
    c = snapshot.add_parser(
        "diff",
        help="names added, removed and changed since a snapshot",
        description="Names added (+), removed (-) and changed (M) from snapshot NAME to "
        "snapshot OTHER, or to the bucket as it is now. The creator or root may diff a "
        "snapshot.",
    )
    _add_mountpoint(c)
    c.add_argument("name", metavar="NAME", help=_SNAPSHOT_NAME_HELP)
    c.add_argument("other", metavar="OTHER", nargs="?", help="another snapshot (default: now)")
    _add_json(c)
    c.set_defaults(func=cmd_snapshot_diff)
    c = snapshot.add_parser(
        "delete",
        help="delete a snapshot's record (its creator or root)",
        description="Delete a snapshot's record. The objects themselves stay (the bucket's "
        "versioning and lifecycle rules decide how long old versions are kept). Mounts of it "
        "keep reading what they have listed.",
    )
    _add_mountpoint(c)
    c.add_argument("name", metavar="NAME", help=_SNAPSHOT_NAME_HELP)
    _add_json(c)
    c.set_defaults(func=cmd_snapshot_delete)
    return parser


def _parse(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """``parser.parse_args(words)``, except that a command whose PATHs may
    follow its options (``snapshot create MP --name N PATH...``; argparse
    takes positionals only before the first option) gets them."""
    args, extra = parser.parse_known_args(words)
    late_paths = extra and not any(word.startswith("-") for word in extra)
    if late_paths and getattr(args, "paths_after_options", False):
        args.paths = [*args.paths, *extra]
        extra = []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        args = _parse(build_parser(), words)
    except UsageError as exc:
        if "--json" in words:
            _print_json(
                {"ok": False, "error": str(exc), "errno": errno.EINVAL, "usage": exc.usage.strip()}
            )
        else:
            sys.stderr.write(exc.usage)
            print(f"{exc.prog}: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    try:
        return int(args.func(args))
    except ConfigError as exc:
        if getattr(args, "json", False):
            _print_json({"ok": False, "error": str(exc), "errno": errno.EINVAL})
        else:
            print(str(exc), file=sys.stderr)
        return 1
    except (CliError, TierfsError) as exc:
        if getattr(args, "json", False):  # one JSON document, the error too
            _print_json({"ok": False, "error": str(exc), "errno": exc.errno})
        else:
            # A daemon's sentence may name other users' paths: escaped.
            text = shown(str(exc)) if isinstance(exc, ControlError) else str(exc)
            print(f"tierfs: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
