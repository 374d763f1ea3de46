"""The write-path contract of every ObjectStore: put_multipart, copy, uploads, delete_many.

The first part runs against both implementations (S3Store over the real moto
server, LocalStore) through the ``store`` fixture; then come the pure part
arithmetic and the bounded runner, and the behaviour that exists in only one
store.  Faults during uploads are in ``test_store_upload_faults.py``.

Sizes are kept small for speed: moto enforces S3's 5 MiB minimum for every
part but the last, so multipart objects are about 12 MiB in 5 MiB parts.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tierfs.errors import InvalidArgument, ObjectNotFound, StoreError
from tierfs.store import ObjectStore
from tierfs.store.base import UploadInfo, abort_stale_uploads
from tierfs.store.local import LocalStore
from tierfs.store.multipart import (
    GiB,
    MiB,
    Part,
    TiB,
    UploadCancelled,
    choose_part_size,
    multipart_etag,
    plan_parts,
    resolve_part_size,
    run_bounded,
)
from tierfs.store.s3 import S3Store

PART = 5 * MiB
DATA = random.Random(99).randbytes(12 * MiB + 123)  # 3 parts of 5 MiB: 5, 5, 2 MiB + 123
META = {"mode": "0100644", "uid": "1000", "gid": "1000", "mtime": "1700000000.5"}


@pytest.fixture(params=["s3", "local"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue(f"{request.param}_store")


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def expected_etag(data: bytes, part_size: int) -> str:
    """What S3 calls a multipart object made of these parts."""
    return multipart_etag(
        [hashlib.md5(data[o : o + part_size]).digest() for o in range(0, len(data), part_size)]
    )


class Source:
    """A read_part callback over ``data`` that records its calls (thread-safe)."""

    def __init__(self, data: bytes, delay: float = 0.0) -> None:
        self.data = data
        self.delay = delay
        self.calls: list[tuple[int, int]] = []
        self.events: list[str] = []
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()

    def __call__(self, offset: int, length: int) -> bytes:
        with self.lock:
            self.calls.append((offset, length))
            self.events.append(f"read {offset // PART + 1}")
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.delay:
                time.sleep(self.delay)
            return self.data[offset : offset + length]
        finally:
            with self.lock:
                self.active -= 1


def uploads(store: ObjectStore, prefix: str = "") -> list[UploadInfo]:
    """In-progress uploads, without leftovers of other kinds (key "")."""
    return [u for u in store.list_uploads(prefix) if u.key]


# --- put_multipart: both stores -------------------------------------------------------------


def test_multipart_round_trip(store: ObjectStore) -> None:
    source = Source(DATA)
    ids: list[str] = []

    def on_upload_id(upload_id: str) -> None:
        assert source.calls == []  # before any part is read, let alone sent
        assert [(u.key, u.upload_id) for u in uploads(store)] == [("dir/big.bin", upload_id)]
        ids.append(upload_id)

    etag = store.put_multipart(
        "dir/big.bin", len(DATA), source, META, part_size=PART, on_upload_id=on_upload_id
    )
    assert len(ids) == 1 and ids[0]
    assert etag == expected_etag(DATA, PART)  # both stores agree with S3's rule
    assert etag.endswith("-3") and '"' not in etag
    assert sorted(source.calls) == [(0, PART), (PART, PART), (2 * PART, len(DATA) - 2 * PART)]
    info = store.head("dir/big.bin")
    assert (info.size, info.etag, info.metadata) == (len(DATA), etag, META)
    assert info.mtime == 1700000000.5
    assert store.get_range("dir/big.bin", 0, len(DATA)) == DATA
    assert store.get_range("dir/big.bin", PART - 10, 20) == DATA[PART - 10 : PART + 10]
    assert uploads(store) == []


def test_multipart_exact_multiple_of_part_size(store: ObjectStore) -> None:
    data = DATA[: 2 * PART]
    etag = store.put_multipart("even", len(data), Source(data), part_size=PART)
    assert etag == expected_etag(data, PART) and etag.endswith("-2")
    assert store.get_range("even", 0, len(data)) == data


def test_default_part_size_is_8_mib(store: ObjectStore) -> None:
    data = DATA[: 9 * MiB]
    source = Source(data)
    etag = store.put_multipart("nine", len(data), source)
    assert sorted(source.calls) == [(0, 8 * MiB), (8 * MiB, MiB)]
    assert etag == expected_etag(data, 8 * MiB)
    assert store.head("nine").size == 9 * MiB


@pytest.mark.parametrize("size", [0, 1, 1000, PART])
def test_small_object_is_one_put(store: ObjectStore, size: int) -> None:
    data = DATA[:size]
    source = Source(data)
    ids: list[str] = []
    etag = store.put_multipart(
        "small", size, source, {"uid": "7"}, part_size=PART, on_upload_id=ids.append
    )
    assert etag == md5(data)
    assert ids == []
    assert source.calls == ([(0, size)] if size else [])
    info = store.head("small")
    assert (info.size, info.etag, info.metadata) == (size, etag, {"uid": "7"})
    assert store.get_range("small", 0, size + 10) == data


def test_multipart_overwrites_and_replaces_metadata(store: ObjectStore) -> None:
    store.put("k", b"old", {"uid": "1"})
    store.put_multipart("k", len(DATA), Source(DATA), {"gid": "2"}, part_size=PART)
    info = store.head("k")
    assert (info.size, info.metadata) == (len(DATA), {"gid": "2"})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"part_size": MiB},  # below S3's 5 MiB
        {"part_size": 6 * GiB},  # above S3's 5 GiB
        {"part_size": PART, "concurrency": 0},
        {"part_size": PART, "metadata": {"k": "caf\u00e9"}},
        {"part_size": "5MiB"},
    ],
)
def test_multipart_rejects_bad_arguments_before_any_io(
    store: ObjectStore, kwargs: dict[str, Any]
) -> None:
    source = Source(DATA)
    with pytest.raises(InvalidArgument):
        store.put_multipart("bad", len(DATA), source, **kwargs)
    assert source.calls == []
    assert uploads(store) == []
    with pytest.raises(ObjectNotFound):
        store.head("bad")


def test_multipart_rejects_too_many_parts(store: ObjectStore) -> None:
    with pytest.raises(InvalidArgument, match="10000 parts"):
        store.put_multipart("huge", 10_001 * PART, Source(b""), part_size=PART)
    with pytest.raises(InvalidArgument, match="5 TiB"):
        store.put_multipart("huge", 5 * TiB + 1, Source(b""))


def test_read_part_error_aborts_and_propagates(store: ObjectStore) -> None:
    """(c) the callback's own exception comes back unchanged, the upload is gone."""
    boom = OSError(5, "cache file unreadable")
    ids: list[str] = []

    def read_part(offset: int, length: int) -> bytes:
        if offset == PART:
            raise boom
        return DATA[offset : offset + length]

    with pytest.raises(OSError) as info:
        store.put_multipart(
            "failing", len(DATA), read_part, part_size=PART, on_upload_id=ids.append
        )
    assert info.value is boom
    assert len(ids) == 1
    assert uploads(store) == []
    with pytest.raises(ObjectNotFound):
        store.head("failing")


def test_read_part_error_on_single_put_propagates(store: ObjectStore) -> None:
    class CacheGone(Exception):
        pass

    def read_part(offset: int, length: int) -> bytes:
        raise CacheGone

    with pytest.raises(CacheGone):
        store.put_multipart("one", 100, read_part, part_size=PART)
    with pytest.raises(ObjectNotFound):
        store.head("one")


def test_short_read_part_is_refused(store: ObjectStore) -> None:
    def read_part(offset: int, length: int) -> bytes:
        return DATA[offset : offset + length - (1 if offset else 0)]

    with pytest.raises(InvalidArgument, match="changed size"):
        store.put_multipart("short", len(DATA), read_part, part_size=PART)
    assert uploads(store) == []
    with pytest.raises(ObjectNotFound):
        store.head("short")


def test_on_upload_id_error_aborts_and_propagates(store: ObjectStore) -> None:
    class JournalFull(Exception):
        pass

    source = Source(DATA)

    def on_upload_id(upload_id: str) -> None:
        raise JournalFull(upload_id)

    with pytest.raises(JournalFull):
        store.put_multipart("j", len(DATA), source, part_size=PART, on_upload_id=on_upload_id)
    assert source.calls == []
    assert uploads(store) == []
    with pytest.raises(ObjectNotFound):
        store.head("j")


def test_parts_are_read_in_parallel_and_bounded(store: ObjectStore) -> None:
    parallel = Source(DATA, delay=0.2)
    store.put_multipart("par", len(DATA), parallel, part_size=PART, concurrency=3)
    assert parallel.max_active >= 2
    serial = Source(DATA, delay=0.05)
    store.put_multipart("ser", len(DATA), serial, part_size=PART, concurrency=1)
    assert serial.max_active == 1
    assert store.get_range("par", 0, len(DATA)) == store.get_range("ser", 0, len(DATA)) == DATA


# --- copy: both stores ------------------------------------------------------------------------


def test_copy_keeps_or_replaces_metadata(store: ObjectStore) -> None:
    data = DATA[:10000]
    src_etag = store.put("src/a", data, META)
    etag = store.copy("src/a", "dst/a")
    info = store.head("dst/a")
    assert (info.size, info.etag, info.metadata) == (len(data), etag, META)
    assert etag == src_etag == md5(data)
    assert store.get_range("dst/a", 0, len(data)) == data

    etag2 = store.copy("src/a", "dst/b", {"mode": "0100600"})
    info = store.head("dst/b")
    assert (info.etag, info.metadata) == (etag2, {"mode": "0100600"})
    assert store.head("src/a").metadata == META  # the source is untouched

    store.copy("src/a", "src/a", {"uid": "0"})  # in place: a metadata change
    assert store.head("src/a").metadata == {"uid": "0"}
    assert store.get_range("src/a", 0, len(data)) == data


def test_copy_missing_source(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.copy("nope", "dst")
    with pytest.raises(ObjectNotFound):
        store.head("dst")


def test_copy_empty_object(store: ObjectStore) -> None:
    store.put("e", b"")
    assert store.copy("e", "e2", multipart_threshold=0) == md5(b"")
    assert store.head("e2").size == 0


def test_multipart_copy(store: ObjectStore) -> None:
    data = DATA[: 12 * MiB]
    store.put("big", data, META)
    ids: list[str] = []
    etag = store.copy("big", "copy1", multipart_threshold=MiB, on_upload_id=ids.append)
    assert len(ids) == 1
    assert etag == expected_etag(data, 8 * MiB)  # default parts: 8 MiB + 4 MiB
    info = store.head("copy1")
    assert (info.size, info.etag, info.metadata) == (len(data), etag, META)
    assert store.get_range("copy1", 0, len(data)) == data

    etag = store.copy(
        "big", "copy2", {"uid": "5"}, multipart_threshold=MiB, part_size=PART, concurrency=2
    )
    assert etag == expected_etag(data, PART)
    info = store.head("copy2")
    assert (info.etag, info.metadata) == (etag, {"uid": "5"})
    assert store.get_range("copy2", 0, len(data)) == data
    assert uploads(store) == []


@pytest.mark.parametrize("threshold", [-1, 6 * GiB])
def test_copy_rejects_bad_threshold(store: ObjectStore, threshold: int) -> None:
    store.put("s", b"x")
    with pytest.raises(InvalidArgument):
        store.copy("s", "d", multipart_threshold=threshold)


# --- delete_many: both stores ---------------------------------------------------------------------


def test_delete_many(store: ObjectStore) -> None:
    for key in ["a/1", "a/2", "a/3", "b/1", "keep"]:
        store.put(key, key.encode())
    store.delete_many(["a/1", "a/2", "a/3", "b/1", "never/existed", "a/1"])
    assert [o.key for p in store.list_pages("") for o in p.objects] == ["keep"]
    assert list(store.list_pages("a/")) == []
    store.delete_many([])


def test_delete_many_validates_every_key_first(store: ObjectStore) -> None:
    store.put("x", b"1")
    with pytest.raises(InvalidArgument):
        store.delete_many(["x", ""])
    assert store.head("x").size == 1


def test_delete_many_batches(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import tierfs.store.s3 as s3_module

    monkeypatch.setattr(s3_module, "DELETE_BATCH", 2)
    sent: list[str] = []
    s3_store.client.meta.events.register(
        "before-send.s3.DeleteObjects", lambda **kw: sent.append(kw["event_name"])
    )
    keys = [f"m/{i}" for i in range(5)]
    for key in keys:
        s3_store.put(key, b"x")
    s3_store.delete_many(keys)
    assert len(sent) == 3
    assert list(s3_store.list_pages("")) == []


# --- uploads: list and abort --------------------------------------------------------------------


def test_s3_list_and_abort_upload_started_by_hand(s3_store: S3Store, s3_client: Any) -> None:
    bkt = s3_store.bucket
    upload_id = s3_client.create_multipart_upload(Bucket=bkt, Key="pre/x/y")["UploadId"]
    s3_client.create_multipart_upload(Bucket=bkt, Key="outside/z")
    s3_client.create_multipart_upload(Bucket=bkt, Key="prefix-lookalike")
    found = s3_store.list_uploads()
    assert [(u.key, u.upload_id) for u in found] == [("x/y", upload_id)]
    assert isinstance(found[0].initiated, float) and found[0].initiated > 0
    assert [u.key for u in s3_store.list_uploads("x/")] == ["x/y"]
    assert s3_store.list_uploads("nope/") == []
    s3_store.abort_upload("x/y", upload_id)
    assert s3_store.list_uploads() == []
    s3_store.abort_upload("x/y", upload_id)  # already gone: fine
    s3_store.abort_upload("x/y", "no-such-upload-id")
    with pytest.raises(InvalidArgument):
        s3_store.abort_upload("x/y", "")
    assert len(s3_client.list_multipart_uploads(Bucket=bkt).get("Uploads", [])) == 2


def test_s3_abort_stale_uploads(s3_store: S3Store, s3_client: Any) -> None:
    for key in ("pre/a", "pre/b/c"):
        s3_client.create_multipart_upload(Bucket=s3_store.bucket, Key=key)
    assert abort_stale_uploads(s3_store, time.time() + 3600, prefix="b/") == 1
    assert [u.key for u in s3_store.list_uploads()] == ["a"]
    assert abort_stale_uploads(s3_store, 0.0) == 0  # nothing initiated before 1970
    assert abort_stale_uploads(s3_store, time.time() + 3600) == 1
    assert s3_store.list_uploads() == []


def test_local_leftover_temp_files_are_uploads(local_store: LocalStore) -> None:
    tmp = local_store.root / ".tierfs-tmp"
    tmp.mkdir()
    (tmp / "w.leftover").write_bytes(b"half a put")
    os.utime(tmp / "w.leftover", (1000.0, 1000.0))
    found = local_store.list_uploads()
    assert found == [UploadInfo(key="", upload_id="w.leftover", initiated=1000.0)]
    assert local_store.list_uploads("a/") == []
    local_store.abort_upload("some/key", "w.leftover")  # wrong key: not this upload
    assert (tmp / "w.leftover").exists()
    local_store.abort_upload("", "w.leftover")
    assert os.listdir(tmp) == []
    local_store.abort_upload("", "w.leftover")  # already gone: fine
    for bad in ("", "../escape", ".hidden", "a/b"):
        with pytest.raises(InvalidArgument):
            local_store.abort_upload("", bad)


def test_local_abort_stale_uploads_keeps_fresh_ones(local_store: LocalStore) -> None:
    tmp = local_store.root / ".tierfs-tmp"
    tmp.mkdir()
    for name in ("w.old", "mpu.deadbeef"):  # a data file whose manifest is gone
        (tmp / name).write_bytes(b"x")
        os.utime(tmp / name, (1000.0, 1000.0))
    (tmp / "mpu.0123.json").write_text('{"v": 1, "key": "k/v", "initiated": 2000.0}')
    (tmp / "mpu.0123").write_bytes(b"partial")
    (tmp / "w.fresh").write_bytes(b"x")
    assert [(u.key, u.upload_id) for u in local_store.list_uploads("k/")] == [("k/v", "0123")]
    assert abort_stale_uploads(local_store, time.time() - 60) == 3
    assert os.listdir(tmp) == ["w.fresh"]


def test_local_upload_leaves_no_temp_files(local_store: LocalStore) -> None:
    local_store.put_multipart("a", len(DATA), Source(DATA), part_size=PART)
    local_store.copy("a", "b", multipart_threshold=MiB)
    assert os.listdir(local_store.root / ".tierfs-tmp") == []
    assert local_store.list_uploads() == []


def test_local_abort_while_running_fails_the_upload(local_store: LocalStore) -> None:
    def on_upload_id(upload_id: str) -> None:
        local_store.abort_upload("k", upload_id)

    with pytest.raises(StoreError, match="aborted"):
        local_store.put_multipart(
            "k", len(DATA), Source(DATA), part_size=PART, on_upload_id=on_upload_id
        )
    with pytest.raises(ObjectNotFound):
        local_store.head("k")
    assert local_store.list_uploads() == []


def test_s3_parts_are_read_lazily(s3_store: S3Store) -> None:
    """With concurrency 1 a part is read only after the previous one was sent."""
    source = Source(DATA)

    def on_send(**kwargs: Any) -> None:
        number = kwargs["request"].url.split("partNumber=")[1].split("&")[0]
        with source.lock:
            source.events.append(f"send {number}")

    s3_store.client.meta.events.register("before-send.s3.UploadPart", on_send)
    s3_store.put_multipart("lazy", len(DATA), source, part_size=PART, concurrency=1)
    assert source.events == ["read 1", "send 1", "read 2", "send 2", "read 3", "send 3"]


def test_s3_multipart_is_plain_for_other_tools(s3_store: S3Store, s3_client: Any) -> None:
    s3_store.put_multipart("plain", len(DATA), Source(DATA), META, part_size=PART)
    resp = s3_client.get_object(Bucket=s3_store.bucket, Key="pre/plain")
    assert resp["Body"].read() == DATA
    assert resp["Metadata"] == META


def test_s3_store_close_stops_workers(bucket: tuple[str, str]) -> None:
    endpoint, name = bucket
    store = S3Store(f"s3://{name}/pre/", endpoint_url=endpoint)
    store.put_multipart("k", len(DATA), Source(DATA), part_size=PART)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.put_multipart("k", len(DATA), Source(DATA), part_size=PART)


# --- part arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, 8 * MiB),
        (1, 8 * MiB),
        (80_000 * MiB, 8 * MiB),
        (80_000 * MiB + 1, 9 * MiB),
        (5 * TiB, 525 * MiB),
    ],
)
def test_choose_part_size(size: int, expected: int) -> None:
    part = choose_part_size(size)
    assert part == expected
    assert part % MiB == 0
    assert -(-size // part) <= 10_000


def test_choose_part_size_minimum() -> None:
    assert choose_part_size(100, minimum=16 * MiB) == 16 * MiB
    assert choose_part_size(100, minimum=5 * MiB + 1) == 6 * MiB
    with pytest.raises(InvalidArgument):
        choose_part_size(100, minimum=4 * MiB)
    with pytest.raises(InvalidArgument):
        choose_part_size(-1)


def test_resolve_part_size() -> None:
    assert resolve_part_size(12 * MiB, None) == 8 * MiB
    assert resolve_part_size(12 * MiB, 5 * MiB) == 5 * MiB
    assert resolve_part_size(50_000 * MiB, 5 * MiB) == 5 * MiB  # exactly 10,000 parts
    for size, part in [(12 * MiB, 5 * MiB - 1), (1, 5 * GiB + 1), (50_000 * MiB + 1, 5 * MiB)]:
        with pytest.raises(InvalidArgument):
            resolve_part_size(size, part)
    for size in (-1, 5 * TiB + 1, True):
        with pytest.raises(InvalidArgument):
            resolve_part_size(size, None)  # type: ignore[arg-type]


def test_plan_parts() -> None:
    assert plan_parts(0, 5) == []
    assert plan_parts(12, 5) == [Part(1, 0, 5), Part(2, 5, 5), Part(3, 10, 2)]
    assert plan_parts(10, 5) == [Part(1, 0, 5), Part(2, 5, 5)]
    assert Part(3, 10, 2).end == 12


def test_multipart_etag_matches_s3_rule() -> None:
    digests = [hashlib.md5(b"a").digest(), hashlib.md5(b"b").digest()]
    assert multipart_etag(digests) == hashlib.md5(b"".join(digests)).hexdigest() + "-2"


# --- the bounded runner ------------------------------------------------------------------------------


def counting_task(
    state: dict[str, int], lock: threading.Lock, delay: float
) -> Callable[[int], int]:
    def task(i: int) -> int:
        with lock:
            state["active"] += 1
            state["max"] = max(state["max"], state["active"])
        time.sleep(delay)
        with lock:
            state["active"] -= 1
            state["done"] += 1
        return i * i

    return task


def test_run_bounded_window_and_order() -> None:
    state = {"active": 0, "max": 0, "done": 0}
    with ThreadPoolExecutor(16) as pool:
        out = run_bounded(
            pool,
            list(range(20)),
            counting_task(state, threading.Lock(), 0.01),
            3,
            threading.Event(),
        )
    assert out == [i * i for i in range(20)]
    assert state["max"] <= 3
    assert state["max"] >= 2


def test_run_bounded_stops_at_first_failure() -> None:
    boom = ValueError("boom")
    started: list[int] = []
    running = {"n": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def task(i: int) -> int:
        with lock:
            started.append(i)
            running["n"] += 1
        try:
            if i == 2:
                raise boom
            stop.wait(0.2)  # a slow part: ends early once stop is set
            if stop.is_set():
                raise UploadCancelled
            return i
        finally:
            with lock:
                running["n"] -= 1

    with ThreadPoolExecutor(8) as pool, pytest.raises(ValueError) as info:
        run_bounded(pool, list(range(50)), task, 4, stop)
    assert info.value is boom
    assert running["n"] == 0  # every started task had ended when it raised
    assert len(started) <= 4 + 1
    assert stop.is_set()


def test_run_bounded_executor_shut_down() -> None:
    """Closing the store (its executor) mid-upload stops the run with UploadCancelled."""
    pool = ThreadPoolExecutor(1)
    entered = threading.Event()
    go = threading.Event()

    def task(i: int) -> int:
        entered.set()
        go.wait(5)
        return i

    def close_soon() -> None:
        entered.wait(5)
        pool.shutdown(wait=False, cancel_futures=True)
        go.set()

    closer = threading.Thread(target=close_soon)
    closer.start()
    with pytest.raises(UploadCancelled):
        run_bounded(pool, list(range(5)), task, 3, threading.Event())
    closer.join()


def test_s3_close_during_upload(bucket: tuple[str, str], s3_client: Any) -> None:
    endpoint, name = bucket
    store = S3Store(f"s3://{name}/pre/", endpoint_url=endpoint)
    entered = threading.Event()
    go = threading.Event()

    def read_part(offset: int, length: int) -> bytes:
        if offset == 0:
            entered.set()
            go.wait(5)
        return DATA[offset : offset + length]

    def close_soon() -> None:
        entered.wait(5)
        threading.Timer(0.2, go.set).start()
        store.close()  # waits for the running part

    closer = threading.Thread(target=close_soon)
    closer.start()
    with pytest.raises(StoreError, match="closed"):
        store.put_multipart("k", len(DATA), read_part, part_size=PART, concurrency=1)
    closer.join()
    with pytest.raises(ObjectNotFound):
        S3Store(f"s3://{name}/pre/", endpoint_url=endpoint).head("k")
