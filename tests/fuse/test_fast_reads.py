"""Real mount: ``tierfs.client.open`` reads warm files from their tier files.

A warm file is handed out (the daemon passes a read-only descriptor of its
tier file) and reads the same bytes as through the mount; a cold or dirty
file is opened through the mount.  A reader holding a descriptor keeps the
bytes it opened while the file is evicted, replaced in the bucket, or
rewritten on this node; the daemon shows what such readers hold.  A user
gets no descriptor for a file they may not read, and one for a file they
may.  A forked child gets its own connection; with a prefetch order, the
descriptors of the next files come ahead, one round trip per run.
"""

from __future__ import annotations

import io
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import tierfs.client
import tierfs.torch
from tests.fuse.conftest import (
    Mount,
    MountFactory,
    as_user,
    run_as_user,
    run_tierfs,
    traversable,
    wait_until,
)
from tierfs.control.fastread import READERS, TierFile

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB


def handed(f: Any) -> bool:
    """Was ``f`` (what tierfs.client.open returned) handed out by the daemon?"""
    return isinstance(getattr(f, "raw", None), TierFile)


def readers(m: Mount) -> dict[str, Any]:
    section: dict[str, Any] = m.status()["readers"]
    return section


def warm(m: Mount, *names: str) -> None:
    """Read each file once through the mount (fetched and checked)."""
    for name in names:
        (m.path / name).read_bytes()


def test_a_warm_file_is_handed_out_and_reads_what_the_mount_reads(mount: MountFactory) -> None:
    body = os.urandom(3 * MiB + 12345)
    m = mount({"data/big.bin": body, "data/cold.bin": b"cold bytes" * 100})
    warm(m, "data/big.bin")
    before = readers(m)["handed_out"]
    with tierfs.client.open(m.path / "data/big.bin") as f:
        assert handed(f)
        # The raw descriptor reaches no byte past the file's end.
        assert os.fstat(f.fileno()).st_size == len(body)
        assert f.read(10) == body[:10]
        assert f.tell() == 10
        f.seek(-5, os.SEEK_END)
        assert f.read() == body[-5:]
        f.seek(MiB - 3)
        buffer = bytearray(7)
        assert f.readinto(buffer) == 7 and bytes(buffer) == body[MiB - 3 : MiB + 4]
        f.seek(0)
        assert f.read() == body
        assert f.read() == b""
    status = readers(m)
    assert status["handed_out"] == before + 1, status
    # Cold: opened through the mount, same bytes.
    with tierfs.client.open(m.path / "data/cold.bin") as f:
        assert not handed(f)
        assert f.read() == b"cold bytes" * 100
    # A missing file: the error an open through the mount gives.
    with pytest.raises(FileNotFoundError):
        tierfs.client.open(m.path / "data/none.bin")
    # A directory: the mount's answer too.
    with pytest.raises(IsADirectoryError):
        tierfs.client.open(m.path / "data")


def test_off_a_mount_it_is_a_plain_open(tmp_path: Path) -> None:
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"plain")
    with tierfs.client.open(plain) as f:
        assert not handed(f)
        assert isinstance(f, io.BufferedReader)
        assert f.read() == b"plain"


def test_the_reader_keeps_its_bytes_when_the_file_is_evicted(mount: MountFactory) -> None:
    body = os.urandom(2 * MiB)
    m = mount({"ckpt/a.pt": body})
    warm(m, "ckpt/a.pt")
    f = tierfs.client.open(m.path / "ckpt/a.pt")
    try:
        assert handed(f)
        assert f.read(1000) == body[:1000]
        evicted = run_tierfs("evict", str(m.path / "ckpt/a.pt"))
        assert evicted.returncode == 0, evicted.stderr
        assert sum(m.where_one("ckpt/a.pt")["tiers"].values()) == 0
        # The evicted tier file lives on for the reader, and the daemon
        # shows the bytes it holds.
        assert wait_until(lambda: readers(m)["held"]["nvme"]["bytes"] >= 2 * MiB, 5)
        shown = run_tierfs("status", str(m.path)).stdout
        assert "readers:" in shown and "evicted or replaced but still read: nvme" in shown, shown
        assert f.read() == body[1000:]
    finally:
        f.close()
    assert wait_until(lambda: readers(m)["held"]["nvme"]["bytes"] == 0, 5)
    assert readers(m)["leases"] == 0
    # Read again: fetched, and the mount and the client agree.
    assert (m.path / "ckpt/a.pt").read_bytes() == body


def test_the_reader_keeps_its_bytes_when_the_bucket_replaces_the_file(
    mount: MountFactory,
) -> None:
    old = os.urandom(MiB + 77)
    new = os.urandom(MiB + 99)
    m = mount({"d/x.bin": old})
    warm(m, "d/x.bin")
    f = tierfs.client.open(m.path / "d/x.bin")
    try:
        assert handed(f)
        m.put("d/x.bin", new)
        time.sleep(m.revalidate_ttl + 0.2)
        # An open through the mount revalidates: the new object's bytes.
        assert wait_until(lambda: (m.path / "d/x.bin").read_bytes() == new, 10)
        # The reader still reads the object it opened, whole.
        assert f.read() == old
    finally:
        f.close()
    warm(m, "d/x.bin")
    with tierfs.client.open(m.path / "d/x.bin") as g:
        assert g.read() == new


def test_the_reader_keeps_its_bytes_when_the_file_is_rewritten_here(
    mount: MountFactory,
) -> None:
    body = os.urandom(3 * MiB)
    m = mount({"w/f.bin": body})
    warm(m, "w/f.bin")
    f = tierfs.client.open(m.path / "w/f.bin")
    try:
        assert handed(f)
        unshared = readers(m)["unshared"]
        with open(m.path / "w/f.bin", "r+b") as w:
            w.seek(MiB)
            w.write(b"X" * 4096)
        changed = body[:MiB] + b"X" * 4096 + body[MiB + 4096 :]
        assert (m.path / "w/f.bin").read_bytes() == changed
        assert readers(m)["unshared"] == unshared + 1
        assert f.read() == body
    finally:
        f.close()
    # Dirty: opened through the mount, which has the new bytes.
    with tierfs.client.open(m.path / "w/f.bin") as g:
        assert not handed(g)
        assert g.read() == changed
    # Truncated to nothing while a reader holds it: the reader keeps it all.
    done = run_tierfs("flush", str(m.path / "w/f.bin"))
    assert done.returncode == 0, done.stderr
    with tierfs.client.open(m.path / "w/f.bin") as h:
        assert handed(h)
        with open(m.path / "w/f.bin", "wb") as w:
            w.write(b"short")
        assert h.read() == changed
    assert (m.path / "w/f.bin").read_bytes() == b"short"


def test_a_user_gets_no_descriptor_for_a_file_they_may_not_read(
    mount: MountFactory, other_uid: int
) -> None:
    m = mount(
        {"open/ok.bin": b"anyone" * 1000, "closed/secret.bin": b"root only" * 1000},
        options="allow_other",
    )
    warm(m, "open/ok.bin", "closed/secret.bin")
    os.chmod(m.path / "closed/secret.bin", 0o600)
    os.chmod(m.path / "open/ok.bin", 0o644)
    before = readers(m)["handed_out"]

    def read_both() -> str:
        out = []
        with tierfs.client.open(m.path / "open/ok.bin") as f:
            out.append(f"ok {handed(f)} {f.read() == b'anyone' * 1000}")
        try:
            tierfs.client.open(m.path / "closed/secret.bin")
            out.append("secret opened")
        except PermissionError:
            out.append("secret refused")
        return "; ".join(out)

    with traversable(m.path):
        said = as_user(other_uid, read_both)
    assert said == "ok: ok True True; secret refused", said
    assert readers(m)["handed_out"] == before + 1
    assert stat.S_IMODE((m.path / "closed/secret.bin").stat().st_mode) == 0o600


def test_a_forked_child_gets_its_own_connection(mount: MountFactory) -> None:
    files = {f"c/{i}.bin": bytes([i]) * (50 * KiB) for i in range(4)}
    m = mount(files)
    warm(m, *files)
    with tierfs.client.open(m.path / "c/0.bin") as f:
        assert handed(f)
    parent = READERS.connection(str(m.path))
    assert parent is not None

    def child() -> str:
        with tierfs.client.open(m.path / "c/1.bin") as g:
            mine = READERS.connection(str(m.path))
            return f"{handed(g)} {g.read() == files['c/1.bin']} {mine is not parent}"

    assert run_as_user(0, child) == "True True True"
    # The parent's connection still serves it.
    with tierfs.client.open(m.path / "c/2.bin") as f:
        assert handed(f) and f.read() == files["c/2.bin"]


def test_with_an_order_the_next_files_come_ahead_one_round_trip_per_run(
    mount: MountFactory,
) -> None:
    names = [f"o/{i:03d}.bin" for i in range(40)]
    files = {n: os.urandom(20 * KiB + i) for i, n in enumerate(names)}
    m = mount(files)
    warm(m, *names)
    # Two "workers" of 4-file batches: this process reads batches 0, 2, 4...
    with tierfs.client.PrefetchSession(m.path) as session:
        session.set_order(names)
        mine = [n for b in range(0, 10, 2) for n in names[4 * b : 4 * b + 4]]
        connection = None
        for n in mine:
            with tierfs.client.open(m.path / n) as f:
                assert handed(f)
                assert f.read() == files[n]
            connection = READERS.connection(str(m.path))
        assert connection is not None
    # 20 opens; once the run length (4) is learnt, one request per run.
    assert connection.asked <= 6, (connection.asked, connection.hits)
    assert connection.hits >= 14, (connection.asked, connection.hits)
    opened = [o for o in m.status()["prefetch"]["orders"]]
    assert opened == [] or all(o["files"] == 40 for o in opened)


def test_the_torch_side_reads_through_the_client(mount: MountFactory) -> None:
    import torch
    from PIL import Image

    image = io.BytesIO()
    Image.new("RGB", (17, 9), (200, 10, 30)).save(image, format="PNG")
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    saved = io.BytesIO()
    torch.save(state, saved)
    m = mount({"img/a/1.png": image.getvalue(), "ckpt/s.pt": saved.getvalue()})
    warm(m, "img/a/1.png", "ckpt/s.pt")
    before = readers(m)["handed_out"]
    loaded = tierfs.torch.load(m.path / "ckpt/s.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"])
    picture = tierfs.torch.image_loader(m.path / "img/a/1.png")
    assert picture.mode == "RGB" and picture.size == (17, 9)
    assert picture.getpixel((3, 3)) == (200, 10, 30)
    assert tierfs.torch.bytes_loader(m.path / "img/a/1.png") == image.getvalue()
    assert readers(m)["handed_out"] == before + 3


def test_dataloader_workers_read_through_their_own_connections(mount: MountFactory) -> None:
    from torch.utils.data import DataLoader, RandomSampler

    names = [f"ds/{i:03d}.bin" for i in range(96)]
    files = {n: os.urandom(10 * KiB + i) for i, n in enumerate(names)}
    m = mount(files)
    warm(m, *names)

    class Files:
        def __len__(self) -> int:
            return len(names)

        def __getitem__(self, index: int) -> tuple[int, bool, bool]:
            with tierfs.client.open(m.path / names[index]) as f:
                return index, f.read() == files[names[index]], handed(f)

    before = readers(m)["handed_out"]
    sampler = tierfs.torch.PrefetchSampler(
        RandomSampler(range(len(names))), [str(m.path / n) for n in names], m.path
    )
    loader = DataLoader(
        Files(), batch_size=8, sampler=sampler, num_workers=2, collate_fn=lambda b: b
    )
    seen = [item for batch in loader for item in batch]
    sampler.close()
    assert sorted(i for i, _same, _handed in seen) == list(range(len(names)))
    assert all(same for _i, same, _handed in seen)
    assert all(was_handed for _i, _same, was_handed in seen)
    status = readers(m)
    # Every file handed out once, a few more ahead that no worker opened.
    assert status["handed_out"] - before >= len(names), status
    assert wait_until(lambda: readers(m)["leases"] == 0, 10), readers(m)


def test_the_audit_log_records_a_handed_out_open(mount: MountFactory, tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    m = mount(
        {"a/x.bin": b"x" * 5000},
        extra_config=f'[audit]\npath = "{log}"\nreads = true\n',
    )
    warm(m, "a/x.bin")
    with tierfs.client.open(m.path / "a/x.bin") as f:
        assert handed(f)

    def recorded() -> list[dict[str, Any]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [r for r in map(json.loads, lines) if r.get("op") == "open"]

    # The mount's read records one open, the hand-out another.
    assert wait_until(lambda: len(recorded()) >= 2, 5), recorded()
    last = recorded()[-1]
    assert last["path"] == "a/x.bin" and last["uid"] == os.getuid() and last["errno"] == 0
