"""Prometheus metrics of a real mount: ``[metrics] listen`` serves /metrics over HTTP.

A read and a write through the mount, then a scrape parsed with
prometheus-client's parser: the series are there, agree with ``tierfs status``,
and carry no path, bucket or mount point.  The prefetcher's figures
(``tierfs_prefetch_*``) after ``tierfs prefetch --order`` and a reader in
that order match ``tierfs status``.  Without ``[metrics]`` the daemon
listens on no TCP port; with a port already taken, ``tierfs mount`` fails at
once with the reason.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.fuse.conftest import MountFactory, daemon_env, run_tierfs, tierfs_command, wait_until

MiB = 1024 * 1024

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_config(port: int) -> str:
    return f'[metrics]\nlisten = "127.0.0.1:{port}"\n'


def scrape(port: int) -> tuple[str, Samples]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("tierfs_"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def listening_tcp_ports(pid: int) -> set[int]:
    """TCP ports on which process ``pid`` has a listening socket."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def test_scrape_after_a_read_and_a_write(mount: MountFactory) -> None:
    port = free_port()
    data = os.urandom(2 * MiB)
    m = mount({"private-dir/private-name.bin": data}, extra_config=metrics_config(port))
    assert port in listening_tcp_ports(m.pids[0])
    assert (m.path / "private-dir" / "private-name.bin").read_bytes() == data
    written = os.urandom(300_000)
    with open(m.path / "written-name.bin", "wb") as f:
        f.write(written)
        f.flush()
        os.fsync(f.fileno())

    text, samples = scrape(port)
    for operation in ("lookup", "open", "read", "create", "write", "fsync", "release"):
        assert value(samples, "tierfs_fuse_request_seconds_count", operation=operation) >= 1, (
            operation
        )
    assert value(samples, "tierfs_fuse_request_seconds_bucket", operation="read", le="+Inf") >= 1
    assert value(samples, "tierfs_cache_miss_blocks_total") == 2
    assert value(samples, "tierfs_fetched_bytes_total") == len(data)
    assert value(samples, "tierfs_s3_request_seconds_count", operation="GetObject") >= 1
    assert value(samples, "tierfs_s3_requests_total", operation="ListObjectsV2") >= 1
    assert value(samples, "tierfs_tier_capacity_bytes", tier="nvme") == 16 * MiB
    assert value(samples, "tierfs_endpoint_reachable") == 1

    # The same figures as `tierfs status` (nothing moves between the two).
    status = m.status()
    for tier in status["tiers"]:
        assert value(samples, "tierfs_tier_used_bytes", tier=tier["name"]) == tier["used"]
    assert value(samples, "tierfs_fetched_bytes_total") == status["counters"]["fetched_bytes"]
    fuse = status["fuse_requests"]
    assert fuse["read"]["requests"] >= value(
        samples, "tierfs_fuse_request_seconds_count", operation="read"
    )

    for secret in ("private", "written-name", str(m.path), m.bucket, str(m.state_dir)):
        assert secret not in text, f"{secret!r} leaked into the metrics"


def test_metrics_are_off_by_default(mount: MountFactory) -> None:
    m = mount({"a.bin": b"a"})
    assert (m.path / "a.bin").read_bytes() == b"a"
    assert listening_tcp_ports(m.pids[0]) == set()
    assert "fuse_requests" in m.status(), "status has the figures even without HTTP"


def test_port_in_use_fails_the_mount(mount: MountFactory) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        m = mount({"a.bin": b"a"}, extra_config=metrics_config(port), do_mount=False)
        done = run_tierfs("mount", str(m.config_path), str(m.path), timeout=30)
    assert done.returncode == 1, done
    assert f"127.0.0.1:{port}" in done.stderr and "address already in use" in done.stderr
    assert not os.path.ismount(m.path)


def test_status_watch_refreshes_a_table(mount: MountFactory) -> None:
    data = os.urandom(MiB)
    m = mount({"a.bin": data})
    assert (m.path / "a.bin").read_bytes() == data
    proc = subprocess.Popen(
        [*tierfs_command(), "status", str(m.path), "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**daemon_env(), "COLUMNS": "160"},
    )
    try:
        time.sleep(2.5)  # two refreshes or more
        assert proc.poll() is None, "--watch keeps running until interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "nvme" in out and "hdd" in out
    assert "FUSE requests" in out and "read" in out and "GetObject" in out


def test_prefetcher_figures_in_a_scrape_match_status(mount: MountFactory, tmp_path: Path) -> None:
    """``tierfs prefetch --order``, a reader in that order, then a scrape: the
    ``tierfs_prefetch_*`` series carry what ``tierfs status`` shows."""
    port = free_port()
    files = {f"ds/{i:02d}.bin": os.urandom(3000) for i in range(10)}
    m = mount(files, extra_config=metrics_config(port))
    _text, samples = scrape(port)
    assert value(samples, "tierfs_prefetch_order_files") == 0  # the prefetcher runs, no order
    order = tmp_path / "order.txt"
    order.write_text("".join(f"{name}\n" for name in sorted(files)))
    done = run_tierfs("prefetch", str(m.path), "--order", str(order))
    assert done.returncode == 0, done.stderr

    def settled() -> bool:
        prefetch = m.status()["prefetch"]
        return prefetch["in_flight"] == 0 and prefetch["files_prefetched"] == 10

    assert wait_until(settled, timeout=30)  # the default window holds all 10 files
    for name in sorted(files)[:4]:
        assert (m.path / name).read_bytes() == files[name]
    assert wait_until(lambda: m.status()["prefetch"]["opens"] == 4, timeout=10)
    status = m.status()["prefetch"]
    _text, samples = scrape(port)
    for key, name in (
        ("order_count", "tierfs_prefetch_orders"),
        ("order_files", "tierfs_prefetch_order_files"),
        ("window", "tierfs_prefetch_window_files"),
        ("in_flight", "tierfs_prefetch_fills_in_flight"),
        ("files_prefetched", "tierfs_prefetch_files_total"),
        ("bytes_prefetched", "tierfs_prefetch_bytes_total"),
        ("opens", "tierfs_prefetch_opens_total"),
        ("hits", "tierfs_prefetch_hits_total"),
    ):
        assert value(samples, name) == status[key], name
    assert value(samples, "tierfs_prefetch_order_files") == 10
    assert value(samples, "tierfs_prefetch_hits_total") == 4
    assert value(samples, "tierfs_prefetch_bytes_total") == 10 * 3000
