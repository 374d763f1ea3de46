"""Real mount: prefetch orders per session, side by side, and ``tierfs.torch``.

Two sessions (two ranks of one job) hand their own orders; both are
followed at once and both readers hit; closing a session, its process
exiting, or being killed ends its order, and a forked child (a DataLoader
worker) does not keep it alive.  Then PyTorch itself: two ranks, each a
process with a ``DataLoader`` of 2 workers over a ``DistributedSampler``
wrapped in ``tierfs.torch.PrefetchSampler``, read the data set once; each
rank's order is its own slice, both are listed while they run, the workers'
opens hit, and the orders end with the ranks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tierfs.client
from tests.fuse.conftest import Mount, MountFactory, daemon_env, run_tierfs, wait_until

pytestmark = pytest.mark.fuse

KiB = 1024
FILES = 24


def name(i: int) -> str:
    return f"ds/{i:03d}.bin"


def dataset() -> dict[str, bytes]:
    return {name(i): bytes([i]) * (20 * KiB + i) for i in range(FILES)}


def orders(m: Mount) -> list[dict[str, Any]]:
    orders: list[dict[str, Any]] = m.status()["prefetch"]["orders"]
    return orders


def read(m: Mount, path: str) -> bytes:
    with open(m.path / path, "rb") as f:
        return f.read()


def settled(m: Mount) -> bool:
    prefetch = m.status()["prefetch"]
    return prefetch["in_flight"] == 0


def test_two_sessions_orders_side_by_side_both_hit_and_end_with_their_sessions(
    mount: MountFactory,
) -> None:
    data = dataset()
    m = mount(data)
    evens = [name(i) for i in range(0, FILES, 2)]
    odds = [name(i) for i in range(1, FILES, 2)]
    rank0 = tierfs.client.PrefetchSession(m.path, job="train", rank=0, window_files=3)
    rank1 = tierfs.client.PrefetchSession(m.path, job="train", rank=1, window_files=3)
    try:
        first = rank0.set_order(evens)
        second = rank1.set_order(odds)
        assert (first["order_files"], second["order_files"]) == (12, 12)
        assert wait_until(lambda: settled(m) and m.status()["prefetch"]["window"] == 6, 10)
        for step in range(6):  # the two readers take turns, each in its order
            for path in (evens[step], odds[step]):
                assert wait_until(lambda path=path: m.where_one(path)["cached_bytes"] > 0, 10)
                assert read(m, path) == data[path]
        by_rank = {o["rank"]: o for o in orders(m)}
        assert sorted(by_rank) == [0, 1]
        for order in by_rank.values():
            assert order["job"] == "train" and order["bound"]
            assert (order["opens"], order["hits"]) == (6, 6), order
        status_text = run_tierfs("status", str(m.path)).stdout
        assert status_text.count("prefetch: order") == 2, status_text
        assert f"uid {os.getuid()}, job train, rank 1, session {rank1.name}" in status_text

        # A new order of rank 1's session replaces its own only.
        rank1.set_order(odds[::-1])
        assert sorted((o["rank"], o["order_files"]) for o in orders(m)) == [(0, 12), (1, 12)]
        assert [o["id"] for o in orders(m) if o["rank"] == 0] == [first["id"]]

        # A forked child (a DataLoader worker) does not hold rank 0's order:
        # when the parent closes its session, the order ends at once.
        child = os.fork()
        if child == 0:  # pragma: no cover - the child only waits to be killed
            time.sleep(30)
            os._exit(0)
        try:
            rank0.close()
            assert wait_until(lambda: [o["rank"] for o in orders(m)] == [1], timeout=5)
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        # Cleared from elsewhere (the Slurm epilog's way): the daemon ends
        # the order and closes the session's connection, its final answer.
        (rank1_id,) = [o["id"] for o in orders(m)]
        assert tierfs.client.clear_order(m.path, job="train", rank=1) == [rank1_id]
        assert rank1._bound is not None
        connection = rank1._bound._connection
        assert connection is not None
        connection.sock.settimeout(5)
        (answer,) = list(connection.messages())
        assert answer["result"]["id"] == rank1_id
    finally:
        rank0.close()
        rank1.close()
    assert wait_until(lambda: orders(m) == [], timeout=5)


SESSION_HOLDER = """
import sys, time, tierfs.client
session = tierfs.client.PrefetchSession(sys.argv[1], job="held")
print(session.set_order(sys.argv[2:])["id"], flush=True)
time.sleep(60)
"""


def test_a_killed_process_takes_its_order_with_it(mount: MountFactory) -> None:
    m = mount(dataset())
    proc = subprocess.Popen(
        [sys.executable, "-c", SESSION_HOLDER, str(m.path), name(0), name(1)],
        stdout=subprocess.PIPE,
        text=True,
        env=daemon_env(),
    )
    try:
        assert proc.stdout is not None
        ident = int(proc.stdout.readline())
        assert [o["id"] for o in orders(m)] == [ident]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: orders(m) == [], timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


RANK = """
import hashlib, json, os, sys, time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import tierfs.client
from tierfs.control.client import locate, request
from tierfs.torch import PrefetchSampler

mountpoint, rank, files, barrier = sys.argv[1], int(sys.argv[2]), sys.argv[3:-1], Path(sys.argv[-1])


class Files(Dataset):
    def __len__(self):
        return len(files)

    def __getitem__(self, index):
        with open(os.path.join(mountpoint, files[index]), "rb") as f:
            data = f.read()
        time.sleep(0.02)  # a training step's work on the sample
        return files[index], hashlib.sha256(data).hexdigest()


sampler = PrefetchSampler(
    DistributedSampler(Files(), num_replicas=2, rank=rank, shuffle=True, seed=7),
    files,
    mountpoint,
    window_files=4,
)
loader = DataLoader(Files(), sampler=sampler, batch_size=None, num_workers=2)
sampler.set_epoch(0)
read = [item for item in loader]
# Both ranks are done reading: look at the orders while both still hold theirs.
(barrier / f"done-{rank}").touch()
while len(list(barrier.iterdir())) < 2:
    time.sleep(0.05)
orders = request(locate(mountpoint).socket_path, "status")["prefetch"]["orders"]
mine = [order for order in orders if order["id"] == sampler.last_order["id"]]
print(json.dumps({"read": read, "order": mine[0], "orders": len(orders),
                  "slice": [files[i] for i in sampler.sampler]}))
(barrier / f"exit-{rank}").touch()
while len([p for p in barrier.iterdir() if p.name.startswith("exit")]) < 2:
    time.sleep(0.05)
"""


def test_torch_ranks_hand_their_own_slices_and_their_workers_hit(
    mount: MountFactory, tmp_path: Path
) -> None:
    pytest.importorskip("torch")  # installed with the test extras (tierfs[torch])
    data = dataset()
    m = mount(data)
    files = sorted(data)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = daemon_env()
    env["SLURM_JOB_ID"] = "990"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(m.path), str(rank), *files, str(barrier)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [proc.communicate(timeout=120) for proc in ranks]
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for proc, (out, err) in zip(ranks, outputs, strict=True):
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    read_by_all: list[str] = []
    for rank, result in enumerate(results):
        order = result["order"]
        # The rank's order is its own slice, in the sampler's order, named
        # after the Slurm job and the sampler's rank.
        assert (order["job"], order["rank"], order["bound"]) == ("slurm-990", rank, True)
        assert order["order_files"] == len(result["slice"]) == FILES // 2
        assert [path for path, _digest in result["read"]] == result["slice"]
        for path, digest in result["read"]:
            assert digest == hashlib.sha256(data[path]).hexdigest()
        # The DataLoader's workers opened each file once; most were
        # resident already (the window is 4 files ahead of 2 workers).
        assert order["opens"] == FILES // 2
        assert order["hits"] >= FILES // 4, order
        assert result["orders"] == 2
        read_by_all += result["slice"]
    assert sorted(read_by_all) == files
    # The ranks exited: their orders ended with them.
    assert wait_until(lambda: orders(m) == [], timeout=5)


def test_a_sampler_runs_its_epoch_without_prefetch_when_the_daemon_refuses(
    mount: MountFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused order (here: a '..' path rejects it whole) leaves a
    warning; the epoch's indices come as usual."""
    pytest.importorskip("torch")
    from tierfs.torch import PrefetchSampler

    m = mount(dataset())
    sampler = PrefetchSampler(list(range(FILES)), ["../outside"] * FILES, m.path)
    try:
        with caplog.at_level(logging.WARNING, logger="tierfs.torch"):
            assert list(sampler) == list(range(FILES))
        assert sampler.last_order is None
        assert "this epoch runs without an order" in caplog.text
        assert "'..' component" in caplog.text
        assert orders(m) == []
    finally:
        sampler.close()


ITERABLE = """
import hashlib, json, os, sys

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import tierfs.client
from tierfs.control.client import locate, request

mountpoint, files = sys.argv[1], sys.argv[2:]


class Shards(IterableDataset):
    # The docs' recipe: each worker hands its own shard, in the order it
    # will read it, through a session that ends with the worker.
    def __iter__(self):
        worker = get_worker_info()
        mine = files[worker.id :: worker.num_workers]
        with tierfs.client.PrefetchSession(mountpoint, job="iterable", rank=worker.id,
                                           window_files=4) as session:
            order = session.set_order(mine)
            for path in mine:
                with tierfs.client.open(os.path.join(mountpoint, path)) as f:
                    yield path, hashlib.sha256(f.read()).hexdigest()
            orders = request(locate(mountpoint).socket_path, "status")["prefetch"]["orders"]
            (status,) = [o for o in orders if o["id"] == order["id"]]
            yield "status", json.dumps(status)


loader = DataLoader(Shards(), batch_size=None, num_workers=2)
print(json.dumps([item for item in loader]))
"""


def test_an_iterable_dataset_hands_each_workers_shard_as_its_order(mount: MountFactory) -> None:
    """``IterableDataset`` has no sampler: each worker opens a
    ``PrefetchSession`` in ``__iter__`` for its own shard (docs/ml.md)."""
    pytest.importorskip("torch")
    data = dataset()
    m = mount(data)
    files = sorted(data)
    done = subprocess.run(
        [sys.executable, "-c", ITERABLE, str(m.path), *files],
        capture_output=True,
        text=True,
        env=daemon_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)
    statuses = [json.loads(value) for key, value in items if key == "status"]
    read = {key: value for key, value in items if key != "status"}
    assert sorted(read) == files
    for path, digest in read.items():
        assert digest == hashlib.sha256(data[path]).hexdigest()
    assert sorted(s["rank"] for s in statuses) == [0, 1]
    for status in statuses:
        assert status["job"] == "iterable" and status["order_files"] == FILES // 2
        assert status["opens"] == FILES // 2, status
    assert wait_until(lambda: orders(m) == [], timeout=5), "the workers' orders ended with them"
