"""Shared fixtures for every test package (unit, core, fuse).

Fixture names below are a stable interface: other test packages use them.

Session scope:

- ``aws_test_env`` (autouse): fake credentials in the environment
  (``AWS_ACCESS_KEY_ID=testing``, ``AWS_SECRET_ACCESS_KEY=testing``,
  ``AWS_DEFAULT_REGION=us-east-1``); ``AWS_PROFILE``, session tokens and
  endpoint overrides removed; ``~/.aws`` files hidden; the EC2 metadata
  service disabled.  Nothing can reach real AWS.
- ``moto_server``: endpoint URL (``http://127.0.0.1:PORT``) of a
  ``moto_server`` subprocess on loopback, started once per session and
  killed by PID at the end.

Function scope:

- ``bucket``: ``(endpoint_url, bucket_name)`` of a fresh, uniquely named,
  empty bucket on ``moto_server``.
- ``s3_client``: a plain boto3 S3 client for ``moto_server``, to put or read
  objects "as another tool" would.
- ``s3_store``: an ``S3Store`` on a fresh bucket with the prefix ``pre/``
  (``s3_store.bucket`` / ``s3_store.prefix`` name them) and a short retry
  policy so that a broken test fails in seconds.
- ``local_store``: a ``LocalStore`` on an empty directory under ``tmp_path``
  (``local_store.root`` is its path).
- ``fault_proxy``: a ``tests.faults.FaultProxy`` in front of ``moto_server``
  (``fault_proxy.endpoint`` is its URL): inject resets and truncations, or
  take the endpoint away (``refuse()``, ``black_hole()``) and bring it back
  (``restore()``).  Closed at teardown.

- ``seaweed``: a ``tests.seaweed_cluster.SeaweedCluster`` (a master, two
  volume servers, a filer and the S3 gateway, separate processes on
  loopback), started once per session for the shared-tier tests and
  stopped by PID at the end.

Helpers: ``start_moto(log_path, extra_env=None)`` starts another moto server
(for example one that enforces credentials) and returns ``(process,
endpoint)``; ``stop_process(process)`` stops it by PID.

Options: ``--run-slow`` runs tests marked ``slow`` (skipped by default).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)
MOTO_START_TIMEOUT = 60.0


# --- options -------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def _start_rank(item: pytest.Item) -> int:
    """Longest first: ``long`` tests, then the other mounts, then the rest.
    Worker processes (``scripts/test.sh`` runs 3) take tests in collection
    order, so a long test never starts last and ends the run alone, and the
    quick unit tests fill the workers' gaps at the end."""
    if "long" in item.keywords:
        return 0
    if "fuse" in item.keywords:
        return 1
    return 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: the order within each rank stays
    if config.getoption("--run-slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow test: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


# --- environment ---------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def aws_test_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fake AWS credentials for the whole session; real ones can never leak in."""
    empty = tmp_path_factory.mktemp("aws-home")
    with pytest.MonkeyPatch.context() as mp:
        for name in CLEARED_ENV:
            mp.delenv(name, raising=False)
        for name, value in FAKE_CREDENTIALS.items():
            mp.setenv(name, value)
        mp.setenv("AWS_CONFIG_FILE", str(empty / "config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty / "credentials"))
        yield


# --- moto server ---------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto_command(port: int) -> list[str]:
    script = Path(sys.executable).parent / "moto_server"
    if script.exists():
        return [str(script), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Terminate one process we started, by its PID; kill it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def start_moto(
    log_path: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[Any], str]:
    """Start a moto server on a free loopback port; wait until it answers."""
    env = dict(os.environ)
    env.update(extra_env or {})
    last_error: str = ""
    for _ in range(3):  # the free port may be taken between probe and bind
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            _moto_command(port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + MOTO_START_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2):
                    return proc, endpoint
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
                time.sleep(0.1)
        stop_process(proc)
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    raise RuntimeError(f"moto server did not start ({last_error}); log tail:\n{tail}")


@pytest.fixture(scope="session")
def moto_server(aws_test_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of a session-wide moto S3 server on 127.0.0.1."""
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    proc, endpoint = start_moto(log_path)
    try:
        yield endpoint
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def seaweed(aws_test_env: None) -> Iterator[Any]:
    """A SeaweedFS cluster on loopback for the session (``tests.seaweed_cluster``)."""
    from tests.seaweed_cluster import SeaweedCluster

    cluster = SeaweedCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


def make_s3_client(endpoint: str) -> Any:
    """A plain boto3 client for a loopback endpoint (path-style, no retries)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


@pytest.fixture(scope="session")
def _bucket_admin(moto_server: str) -> Any:
    return make_s3_client(moto_server)


@pytest.fixture
def bucket(moto_server: str, _bucket_admin: Any) -> tuple[str, str]:
    """``(endpoint_url, bucket_name)`` of a fresh empty bucket."""
    name = f"tierfs-test-{uuid.uuid4().hex[:16]}"
    _bucket_admin.create_bucket(Bucket=name)
    return moto_server, name


@pytest.fixture(scope="session")
def _shared_s3_client(moto_server: str) -> Iterator[Any]:
    client = make_s3_client(moto_server)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def s3_client(_shared_s3_client: Any) -> Any:
    """A boto3 S3 client for the moto server, standing in for other tools.

    One client for the session (making one costs a fraction of a second of
    CPU, in every test that mounts); tests must not register event hooks on
    it or close it (they do so on their own stores' clients)."""
    return _shared_s3_client


@contextlib.contextmanager
def open_s3_store(bucket_name: str, endpoint: str) -> Iterator[Any]:
    """An S3Store of prefix ``pre/`` in ``bucket_name`` through ``endpoint``,
    with the short retry budget of the tests; closed on exit."""
    from tierfs.store.retry import RetryPolicy
    from tierfs.store.s3 import S3Store

    store = S3Store(
        f"s3://{bucket_name}/pre/",
        endpoint_url=endpoint,
        region="us-east-1",
        retry=RetryPolicy(max_attempts=4, budget=10.0, base_delay=0.05, max_delay=0.5),
    )
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def s3_store(bucket: tuple[str, str]) -> Iterator[Any]:
    """S3Store on a fresh bucket, prefix ``pre/``, short retry budget."""
    endpoint, name = bucket
    with open_s3_store(name, endpoint) as store:
        yield store


@pytest.fixture
def local_store(tmp_path: Path) -> Any:
    """LocalStore on an empty directory ``tmp_path / "bucket"``."""
    from tierfs.store.local import LocalStore

    root = tmp_path / "bucket"
    root.mkdir()
    return LocalStore(root.as_uri())


@pytest.fixture(params=["s3", "local"])
def store(request: pytest.FixtureRequest) -> Any:
    """Each store in turn: ``s3_store`` (moto), then ``local_store`` (file://)."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def fault_proxy(moto_server: str) -> Iterator[Any]:
    """A FaultProxy in front of the session's moto server (see tests/faults.py)."""
    from urllib.parse import urlsplit

    from tests.faults import FaultProxy

    parts = urlsplit(moto_server)
    proxy = FaultProxy(parts.hostname or "127.0.0.1", int(parts.port or 80))
    try:
        yield proxy
    finally:
        proxy.close()
