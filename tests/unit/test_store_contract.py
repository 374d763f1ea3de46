"""One contract for every ObjectStore: S3Store (over a real moto server) and LocalStore.

Each test in the first part runs against both implementations through the
``store`` fixture.  The later parts cover behaviour that exists in only one of
them (S3 prefixes and other tools, local paths), the equivalence of the two
on the same keys, and the ``open_store`` factory.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierfs.config import BackingConfig
from tierfs.errors import (
    BucketNotFound,
    ConfigError,
    InvalidArgument,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
)
from tierfs.store import ListPage, ObjectInfo, ObjectStore, open_store
from tierfs.store.local import LocalStore
from tierfs.store.s3 import S3Store, parse_s3_url


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def listing(store: ObjectStore, prefix: str, page_size: int = 1000) -> list[ListPage]:
    return list(store.list_pages(prefix, page_size=page_size))


def flat(pages: list[ListPage]) -> tuple[list[str], list[str]]:
    """(object keys, common prefixes) over all pages."""
    keys = [o.key for p in pages for o in p.objects]
    prefixes = [pfx for p in pages for pfx in p.prefixes]
    return keys, prefixes


def merged(pages: list[ListPage]) -> list[str]:
    """All entries in listing order: within a page, objects and prefixes interleave by key."""
    out: list[str] = []
    for p in pages:
        out.extend(sorted([o.key for o in p.objects] + p.prefixes, key=lambda k: k.encode()))
    return out


def model_listing(keys: set[str], prefix: str) -> tuple[list[str], list[str]]:
    """What a delimiter='/' listing of ``keys`` under ``prefix`` must return."""
    objects: set[str] = set()
    prefixes: set[str] = set()
    for key in keys:
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix) :]
        if "/" in rest:
            prefixes.add(prefix + rest[: rest.index("/") + 1])
        else:
            objects.add(key)
    by_bytes = lambda k: k.encode()  # noqa: E731
    return sorted(objects, key=by_bytes), sorted(prefixes, key=by_bytes)


# --- protocol conformance -------------------------------------------------------------


def test_implements_protocol(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert store.url
    store.check()


# --- put / head / delete ----------------------------------------------------------------


def test_put_head_roundtrip_with_metadata(store: ObjectStore) -> None:
    data = b"hello tierfs\n" * 100
    etag = store.put(
        "dir/file.bin", data, {"Mode": "0100644", "uid": "1000", "mtime": "1700000000.25"}
    )
    assert etag == md5(data)
    assert not etag.startswith('"')
    info = store.head("dir/file.bin")
    assert isinstance(info, ObjectInfo)
    assert info.key == "dir/file.bin"
    assert info.size == len(data)
    assert info.etag == etag
    assert info.mtime == 1700000000.25
    assert info.metadata == {"mode": "0100644", "uid": "1000", "mtime": "1700000000.25"}


@pytest.mark.parametrize("meta", [None, {"mtime": "not-a-number"}, {"mtime": "nan"}])
def test_head_mtime_falls_back_to_last_modified(
    store: ObjectStore, meta: dict[str, str] | None
) -> None:
    store.put("f", b"x", meta)
    info = store.head("f")
    assert abs(info.mtime - time.time()) < 120


def test_overwrite_replaces_data_etag_and_metadata(store: ObjectStore) -> None:
    first = store.put("k", b"one", {"uid": "1"})
    second = store.put("k", b"two!", {"gid": "2"})
    assert first != second
    info = store.head("k")
    assert (info.size, info.etag, info.metadata) == (4, second, {"gid": "2"})
    assert store.get_range("k", 0, 100) == b"two!"


def test_empty_object(store: ObjectStore) -> None:
    assert store.put("empty", b"") == md5(b"")
    assert store.head("empty").size == 0
    assert store.get_range("empty", 0, 10) == b""


def test_missing_key(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.head("nope")
    with pytest.raises(ObjectNotFound):
        store.get_range("nope", 0, 10)
    with pytest.raises(ObjectNotFound):
        store.head("no/such/deep/key")


def test_directory_prefix_is_not_an_object(store: ObjectStore) -> None:
    store.put("d/child", b"x")
    with pytest.raises(ObjectNotFound):
        store.head("d")
    with pytest.raises(ObjectNotFound):
        store.head("d/")


def test_delete(store: ObjectStore) -> None:
    store.put("a/b/c", b"data")
    store.delete("a/b/c")
    with pytest.raises(ObjectNotFound):
        store.head("a/b/c")
    assert listing(store, "") == []
    store.delete("a/b/c")  # idempotent
    store.delete("never/existed")


def test_delete_marker_keeps_children(store: ObjectStore) -> None:
    store.put("d/", b"")
    store.put("d/x", b"1")
    store.delete("d/")
    assert flat(listing(store, "d/")) == (["d/x"], [])
    assert flat(listing(store, "")) == ([], ["d/"])


def test_delete_child_keeps_marker(store: ObjectStore) -> None:
    store.put("d/", b"")
    store.put("d/x", b"1")
    store.delete("d/x")
    assert flat(listing(store, "")) == ([], ["d/"])
    assert flat(listing(store, "d/")) == (["d/"], [])


@pytest.mark.parametrize(
    "meta",
    [{"k": "caf\u00e9"}, {"k": "line\nbreak"}, {"bad key": "v"}, {"k\u00e9y": "v"}],
)
def test_metadata_must_be_ascii(store: ObjectStore, meta: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        store.put("m", b"x", meta)
    with pytest.raises(ObjectNotFound):
        store.head("m")


# --- get_range ---------------------------------------------------------------------------

DATA = bytes(range(256)) * 40  # 10240 bytes, every offset distinguishable


@pytest.mark.parametrize(
    ("start", "length", "expected"),
    [
        (0, len(DATA), DATA),
        (100, 50, DATA[100:150]),  # middle
        (0, 1, DATA[:1]),
        (len(DATA) - 10, 100, DATA[-10:]),  # tail clipped at the end
        (0, 10 * len(DATA), DATA),  # longer than the object
        (len(DATA), 10, b""),  # exactly at EOF
        (len(DATA) + 5000, 10, b""),  # beyond EOF
        (123, 0, b""),  # empty range
    ],
)
def test_get_range(store: ObjectStore, start: int, length: int, expected: bytes) -> None:
    store.put("blob", DATA)
    assert store.get_range("blob", start, length) == expected


def _read_into(store: ObjectStore, start: int, sizes: list[int], **kw: str) -> tuple[int, bytes]:
    """get_range_into over fresh buffers of ``sizes``, pre-filled with 0xEE."""
    bufs = [bytearray(b"\xee" * n) for n in sizes]
    got = store.get_range_into("blob", start, [memoryview(b) for b in bufs], **kw)
    return got, b"".join(bufs)


@pytest.mark.parametrize(
    ("start", "sizes"),
    [
        (0, [len(DATA)]),
        (100, [7, 0, 4096, 13]),  # several buffers, an empty one among them
        (len(DATA) - 10, [4, 4, 100]),  # the object ends in the second buffer
        (len(DATA), [10]),  # exactly at EOF
        (len(DATA) + 5000, [10]),  # beyond EOF
        (5, []),  # nothing asked
    ],
)
def test_get_range_into(store: ObjectStore, start: int, sizes: list[int]) -> None:
    store.put("blob", DATA)
    got, filled = _read_into(store, start, sizes)
    expected = DATA[start : start + sum(sizes)]
    assert got == len(expected)
    assert filled[:got] == expected
    assert filled[got:] == b"\xee" * (sum(sizes) - got), "bytes past the object stay untouched"


def test_get_range_into_stops_between_buffers(store: ObjectStore) -> None:
    """``stop`` is asked once per full buffer with more to come; True ends
    the read there: the bytes of the buffers filled so far, the others
    untouched.  The store then serves the next read correctly (the
    dropped body left nothing behind).  3 MiB: past the native engine's
    size, so S3 reads the body itself."""
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB
    store.put("blob", big)
    sizes = [1 << 20] * 3
    for stop_after in (1, 2):
        asked = 0

        def stop() -> bool:
            nonlocal asked
            asked += 1
            return asked >= stop_after  # noqa: B023 (called before the loop moves on)

        bufs = [bytearray(b"\xee" * n) for n in sizes]
        got = store.get_range_into("blob", 100, [memoryview(b) for b in bufs], stop=stop)
        assert got == stop_after << 20
        assert asked == stop_after
        filled = b"".join(bufs)
        assert filled[:got] == big[100 : 100 + got]
        assert filled[got:] == b"\xee" * (sum(sizes) - got)
    asked_whole = 0

    def never() -> bool:
        nonlocal asked_whole
        asked_whole += 1
        return False

    bufs = [bytearray(n) for n in sizes]
    got = store.get_range_into("blob", 0, [memoryview(b) for b in bufs], stop=never)
    assert (got, asked_whole) == (len(big), 2)  # not asked after the last buffer
    assert b"".join(bufs) == big


def test_get_range_into_if_match(store: ObjectStore) -> None:
    etag = store.put("blob", DATA)
    assert _read_into(store, 10, [20], etag=etag) == (20, DATA[10:30])
    store.put("blob", DATA[::-1])
    with pytest.raises(PreconditionFailed):
        _read_into(store, 10, [20], etag=etag)
    with pytest.raises(InvalidArgument):
        _read_into(store, -1, [20])
    with pytest.raises(ObjectNotFound):
        store.get_range_into("nope", 0, [memoryview(bytearray(4))])


def test_get_range_if_match(store: ObjectStore) -> None:
    etag = store.put("blob", DATA)
    assert store.get_range("blob", 10, 20, etag=etag) == DATA[10:30]
    assert store.get_range("blob", 10, 20, etag=f'"{etag}"') == DATA[10:30]
    store.put("blob", DATA[::-1])
    with pytest.raises(PreconditionFailed) as info:
        store.get_range("blob", 10, 20, etag=etag)
    assert "blob" in str(info.value)
    assert info.value.errno != 0


def test_get_range_if_match_wrong_etag(store: ObjectStore) -> None:
    store.put("blob", DATA)
    with pytest.raises(PreconditionFailed):
        store.get_range("blob", 0, 10, etag="0" * 32)


def test_get_range_rejects_negative(store: ObjectStore) -> None:
    store.put("blob", DATA)
    with pytest.raises(InvalidArgument):
        store.get_range("blob", -1, 10)
    with pytest.raises(InvalidArgument):
        store.get_range("blob", 0, -1)


# --- list_pages ------------------------------------------------------------------------------


def put_all(store: ObjectStore, keys: list[str]) -> dict[str, bytes]:
    contents = {}
    for key in keys:
        contents[key] = key.encode() * 3
        store.put(key, contents[key])
    return contents


def test_list_delimiter(store: ObjectStore) -> None:
    put_all(store, ["top.txt", "a/x", "a/y/z", "a/", "b/", "c/d/e/f", "zz"])
    assert flat(listing(store, "")) == (["top.txt", "zz"], ["a/", "b/", "c/"])
    assert flat(listing(store, "a/")) == (["a/", "a/x"], ["a/y/"])
    assert flat(listing(store, "a/y/")) == (["a/y/z"], [])
    assert flat(listing(store, "b/")) == (["b/"], [])
    assert flat(listing(store, "c/")) == ([], ["c/d/"])
    assert flat(listing(store, "c/d/e/")) == (["c/d/e/f"], [])
    assert listing(store, "missing/") == []
    assert listing(store, "top.txt/") == []


def test_list_empty_store(store: ObjectStore) -> None:
    assert listing(store, "") == []


def test_list_entries_carry_size_and_etag(store: ObjectStore) -> None:
    contents = put_all(store, ["d/one", "d/two", "d/"])
    for info in (o for p in listing(store, "d/") for o in p.objects):
        assert info.size == len(contents[info.key])
        assert info.etag == md5(contents[info.key])
        assert info.metadata == {}
        assert abs(info.mtime - time.time()) < 120


def test_list_rejects_prefix_without_slash(store: ObjectStore) -> None:
    with pytest.raises(InvalidArgument):
        listing(store, "a")


TRICKY = [
    "a",
    "a b",  # space
    "a-b",  # '-' (0x2d) sorts before '/' (0x2f)
    "a.b",
    "a/c",  # -> prefix "a/"
    "a0",  # '0' (0x30) sorts after '/'
    "A",
    "B/x",
    "~tilde",
    "z+plus",
    "caf\u00e9",  # é: two UTF-8 bytes
    "\u65e5\u672c/\u30c7\u30fc\u30bf.bin",  # 日本/データ.bin
    "\U0001f600 emoji",  # four UTF-8 bytes
    "dir with space/file \u00fc.txt",
]


def test_list_byte_order_unicode_and_spaces(store: ObjectStore) -> None:
    # "a" and "a/c" cannot coexist in a local directory; drop the file "a".
    keys = [k for k in TRICKY if k != "a"]
    put_all(store, keys)
    objects, prefixes = model_listing(set(keys), "")
    pages = listing(store, "")
    assert flat(pages) == (objects, prefixes)
    entries = merged(pages)
    assert entries == sorted(objects + prefixes, key=lambda k: k.encode())
    # Unicode and spaces survive the round trip in both directions.
    assert flat(listing(store, "dir with space/")) == (["dir with space/file \u00fc.txt"], [])
    assert flat(listing(store, "\u65e5\u672c/")) == (["\u65e5\u672c/\u30c7\u30fc\u30bf.bin"], [])
    assert store.get_range("caf\u00e9", 0, 100) == "caf\u00e9".encode() * 3
    assert (
        store.head("dir with space/file \u00fc.txt").size
        == len("dir with space/file \u00fc.txt".encode()) * 3
    )


@pytest.mark.parametrize("page_size", [1, 2, 3, 1000])
def test_list_paging(store: ObjectStore, page_size: int) -> None:
    keys = ["p/", "p/a", "p/b/x", "p/c", "p/d/y", "p/e", "p/f/", "p/g"]
    put_all(store, keys)
    pages = listing(store, "p/", page_size=page_size)
    for page in pages:
        assert 0 < len(page.objects) + len(page.prefixes) <= page_size
    assert flat(pages) == (["p/", "p/a", "p/c", "p/e", "p/g"], ["p/b/", "p/d/", "p/f/"])
    assert merged(pages) == sorted(
        ["p/", "p/a", "p/c", "p/e", "p/g", "p/b/", "p/d/", "p/f/"], key=lambda k: k.encode()
    )
    if page_size == 2:
        assert len(pages) == 4


def test_list_pages_is_lazy(store: ObjectStore) -> None:
    put_all(store, [f"lazy/{i:03d}" for i in range(7)])
    it = store.list_pages("lazy/", page_size=2)
    first = next(it)
    assert [o.key for o in first.objects] == ["lazy/000", "lazy/001"]
    rest = list(it)
    assert [o.key for p in rest for o in p.objects] == [f"lazy/{i:03d}" for i in range(2, 7)]


KEY_SEGMENT = st.text(alphabet="ab\u00e9 -.", min_size=1, max_size=3).filter(
    lambda s: s not in (".", "..")
)
KEY = st.lists(KEY_SEGMENT, min_size=1, max_size=3).map("/".join)


def consistent(keys: set[str]) -> bool:
    """No key is also a 'directory' of another key (a local directory cannot hold both)."""
    return not any(other.startswith(k + "/") for k in keys for other in keys)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(keys=st.sets(KEY, min_size=1, max_size=8).filter(consistent), page_size=st.integers(1, 4))
def test_list_matches_model(store: ObjectStore, keys: set[str], page_size: int) -> None:
    """Listing every directory of a random key set agrees with the pure model."""
    base = f"h{uuid.uuid4().hex[:8]}/"
    full = {base + k for k in keys}
    for key in full:
        store.put(key, b"x")
    dirs = {base} | {k[: i + 1] for k in full for i, c in enumerate(k) if c == "/"}
    for prefix in sorted(dirs):
        pages = listing(store, prefix, page_size=page_size)
        assert flat(pages) == model_listing(full, prefix), prefix
        assert merged(pages) == sorted(merged(pages), key=lambda k: k.encode())
        assert all(len(p.objects) + len(p.prefixes) <= page_size for p in pages)


# --- S3 specifics: prefixes and other tools --------------------------------------------------


def test_s3_prefix_isolation(s3_store: S3Store, s3_client: Any) -> None:
    bucket = s3_store.bucket
    assert s3_store.prefix == "pre/"
    s3_store.put("mine", b"1")
    assert s3_client.get_object(Bucket=bucket, Key="pre/mine")["Body"].read() == b"1"
    s3_client.put_object(Bucket=bucket, Key="outside", Body=b"2")
    s3_client.put_object(Bucket=bucket, Key="prefix-lookalike/x", Body=b"2")
    s3_client.put_object(Bucket=bucket, Key="pre/sub/theirs", Body=b"3")
    assert flat(listing(s3_store, "")) == (["mine"], ["sub/"])
    assert flat(listing(s3_store, "sub/")) == (["sub/theirs"], [])
    with pytest.raises(ObjectNotFound):
        s3_store.head("../outside")
    s3_store.delete("mine")
    assert "Contents" in s3_client.list_objects_v2(Bucket=bucket, Prefix="outside")


def test_s3_reads_what_other_tools_wrote(s3_store: S3Store, s3_client: Any) -> None:
    s3_client.put_object(
        Bucket=s3_store.bucket,
        Key="pre/theirs.bin",
        Body=b"0123456789",
        Metadata={"MTime": "1600000000.5", "Mode": "0100600"},
    )
    info = s3_store.head("theirs.bin")
    assert info.metadata == {"mtime": "1600000000.5", "mode": "0100600"}
    assert info.mtime == 1600000000.5
    assert s3_store.get_range("theirs.bin", 3, 4, etag=info.etag) == b"3456"


def test_s3_writes_plain_objects(s3_store: S3Store, s3_client: Any) -> None:
    s3_store.put("plain/obj", b"plain bytes", {"mtime": "5"})
    resp = s3_client.get_object(Bucket=s3_store.bucket, Key="pre/plain/obj")
    assert resp["Body"].read() == b"plain bytes"
    assert resp["Metadata"] == {"mtime": "5"}


def test_s3_root_marker_lists_as_empty_key(s3_store: S3Store, s3_client: Any) -> None:
    s3_client.put_object(Bucket=s3_store.bucket, Key="pre/", Body=b"")
    assert flat(listing(s3_store, "")) == ([""], [])


def test_s3_missing_bucket_on_data_calls(moto_server: str) -> None:
    store = S3Store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", endpoint_url=moto_server)
    with pytest.raises(BucketNotFound):
        listing(store, "")
    with pytest.raises(BucketNotFound):
        store.get_range("k", 0, 1)


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://bkt", "bkt", ""),
        ("s3://bkt/", "bkt", ""),
        ("s3://bkt/pre", "bkt", "pre/"),
        ("s3://bkt/pre/", "bkt", "pre/"),
        ("s3://bkt//a//b/", "bkt", "a/b/"),
        ("s3://My_Old.Bucket-1/x", "My_Old.Bucket-1", "x/"),
    ],
)
def test_parse_s3_url(url: str, bucket: str, prefix: str) -> None:
    assert parse_s3_url(url) == (bucket, prefix)


@pytest.mark.parametrize(
    "url", ["s3://", "http://bkt/x", "s3://bkt/a/../b", "s3://bkt?x=1", "s3://user:pw@bkt/"]
)
def test_parse_s3_url_rejects(url: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_s3_url(url)


# --- LocalStore specifics ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "../escape",
        "a/../../escape",
        "a/./b",
        "a//b",
        "/abs",
        ".",
        "..",
        "../",
        "a\0b",
        ".tierfs-meta/x",
        "d/.tierfs-dirmarker",
        "x" * 256,
    ],
)
def test_local_rejects_bad_keys(local_store: LocalStore, key: str) -> None:
    with pytest.raises(InvalidArgument):
        local_store.put(key, b"x")
    with pytest.raises(InvalidArgument):
        local_store.head(key)
    with pytest.raises(InvalidArgument):
        local_store.get_range(key, 0, 1)
    assert not (local_store.root.parent / "escape").exists()


def test_local_symlink_cannot_escape(local_store: LocalStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    os.symlink(outside, local_store.root / "link")
    os.symlink(outside / "secret", local_store.root / "filelink")
    with pytest.raises(InvalidArgument):
        local_store.get_range("link/secret", 0, 10)
    with pytest.raises(InvalidArgument):
        local_store.put("link/new", b"x")
    with pytest.raises(ObjectNotFound):
        local_store.get_range("filelink", 0, 10)
    assert not (outside / "new").exists()
    assert listing(local_store, "") == []  # symlinks are not objects


def test_local_layout_and_hidden_files(local_store: LocalStore) -> None:
    local_store.put("d/", b"")
    local_store.put("d/f", b"data", {"uid": "7"})
    root = local_store.root
    assert (root / "d" / "f").read_bytes() == b"data"
    assert (root / "d" / ".tierfs-dirmarker").exists()
    assert (root / "d" / ".tierfs-meta" / "f").exists()
    assert flat(listing(local_store, "")) == ([], ["d/"])
    assert flat(listing(local_store, "d/")) == (["d/", "d/f"], [])
    assert os.listdir(root / ".tierfs-tmp") == []


def test_local_external_files(local_store: LocalStore) -> None:
    """Files dropped in by other tools are objects with a stat-derived ETag."""
    (local_store.root / "ext").mkdir()
    path = local_store.root / "ext" / "file"
    path.write_bytes(b"external")
    info = local_store.head("ext/file")
    assert (info.size, info.metadata) == (8, {})
    assert info.etag == local_store.head("ext/file").etag  # stable
    assert flat(listing(local_store, "ext/")) == (["ext/file"], [])
    assert local_store.get_range("ext/file", 0, 100, etag=info.etag) == b"external"
    path.write_bytes(b"changed!!")
    assert local_store.head("ext/file").etag != info.etag
    with pytest.raises(PreconditionFailed):
        local_store.get_range("ext/file", 0, 100, etag=info.etag)


def test_local_stale_sidecar_is_ignored(local_store: LocalStore) -> None:
    etag = local_store.put("f", b"mine", {"uid": "1"})
    (local_store.root / "f").write_bytes(b"theirs")  # rewritten by another tool
    info = local_store.head("f")
    assert info.etag != etag
    assert info.metadata == {}


def test_local_delete_prunes_empty_dirs(local_store: LocalStore) -> None:
    local_store.put("a/b/c/d", b"x")
    local_store.put("a/keep", b"x")
    local_store.delete("a/b/c/d")
    assert not (local_store.root / "a" / "b").exists()
    assert (local_store.root / "a" / "keep").exists()
    local_store.delete("a/keep")
    assert sorted(os.listdir(local_store.root)) == [".tierfs-tmp"]


def test_local_empty_dirs_are_not_prefixes(local_store: LocalStore) -> None:
    (local_store.root / "empty" / "deeper").mkdir(parents=True)
    (local_store.root / "full" / "deeper").mkdir(parents=True)
    (local_store.root / "full" / "deeper" / "f").write_bytes(b"x")
    assert flat(listing(local_store, "")) == ([], ["full/"])


def test_local_file_dir_conflict(local_store: LocalStore) -> None:
    local_store.put("a", b"file")
    with pytest.raises(StoreError):
        local_store.put("a/b", b"x")
    local_store.put("d/x", b"x")
    with pytest.raises(StoreError):
        local_store.put("d", b"file")
    assert local_store.get_range("a", 0, 10) == b"file"
    assert local_store.get_range("d/x", 0, 10) == b"x"


def test_local_non_utf8_names_are_skipped(local_store: LocalStore) -> None:
    os.close(
        os.open(os.path.join(os.fsencode(local_store.root), b"bad\xff"), os.O_CREAT | os.O_WRONLY)
    )
    local_store.put("good", b"x")
    assert flat(listing(local_store, "")) == (["good"], [])


def test_local_missing_root(tmp_path: Path) -> None:
    store = LocalStore((tmp_path / "nope").as_uri())
    for call in (
        store.check,
        lambda: listing(store, ""),
        lambda: store.head("k"),
        lambda: store.put("k", b""),
    ):
        with pytest.raises(BucketNotFound):
            call()


def test_local_url_parsing(tmp_path: Path) -> None:
    assert LocalStore(tmp_path.as_uri()).root == tmp_path
    assert LocalStore("file://localhost" + str(tmp_path)).root == tmp_path
    assert LocalStore("file:///tmp/with%20space").root == Path("/tmp/with space")
    for bad in ("file://host/dir", "file:relative", "s3://bkt", "file:///x?y=1"):
        with pytest.raises(InvalidArgument):
            LocalStore(bad)


def test_local_concurrent_puts_and_deletes(local_store: LocalStore) -> None:
    """Parallel writers and deleters never leave a torn object or a failed put."""
    from concurrent.futures import ThreadPoolExecutor

    def work(i: int) -> None:
        for j in range(20):
            key = f"c/{i % 3}/k{j % 4}"
            local_store.put(key, f"{i}:{j}".encode() * 10, {"n": str(j)})
            if j % 3 == 0:
                local_store.delete(key)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(16)))
    for page in local_store.list_pages("c/"):
        for pfx in page.prefixes:
            for sub in local_store.list_pages(pfx):
                for obj in sub.objects:
                    body = local_store.get_range(obj.key, 0, 1 << 20)
                    assert body == body[: len(body) // 10] * 10


# --- equivalence: the two stores agree on the same keys ---------------------------------------


def test_stores_agree(s3_store: S3Store, local_store: LocalStore) -> None:
    keys = [k for k in TRICKY if k != "a"] + ["m/", "m/n/", "m/n/o", "m/p"]
    put_all(s3_store, keys)
    put_all(local_store, keys)
    for prefix in ["", "m/", "m/n/", "B/", "dir with space/"]:
        for page_size in (2, 1000):
            s3_pages = listing(s3_store, prefix, page_size)
            local_pages = listing(local_store, prefix, page_size)
            assert [[(o.key, o.size, o.etag) for o in p.objects] for p in s3_pages] == [
                [(o.key, o.size, o.etag) for o in p.objects] for p in local_pages
            ]
            assert [p.prefixes for p in s3_pages] == [p.prefixes for p in local_pages]


# --- open_store ---------------------------------------------------------------------------------


def test_open_store_s3(moto_server: str) -> None:
    store = open_store(BackingConfig(url="s3://bkt/some/prefix", endpoint_url=moto_server))
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.url) == (
        "bkt",
        "some/prefix/",
        "s3://bkt/some/prefix",
    )


def test_open_store_pool_size(moto_server: str) -> None:
    store = open_store(
        BackingConfig(url="s3://bkt", endpoint_url=moto_server), max_pool_connections=7
    )
    assert isinstance(store, S3Store)
    assert store.client.meta.config.max_pool_connections == 7
    assert store.client.meta.config.retries["total_max_attempts"] == 1


def test_s3_page_size_above_limit_is_clamped(s3_store: S3Store) -> None:
    put_all(s3_store, ["big/a", "big/b"])
    assert flat(listing(s3_store, "big/", page_size=5000)) == (["big/a", "big/b"], [])


def test_local_planted_meta_symlink_cannot_escape(local_store: LocalStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside-meta"
    outside.mkdir()
    (local_store.root / "d").mkdir()
    os.symlink(outside, local_store.root / "d" / ".tierfs-meta")
    with pytest.raises(InvalidArgument):
        local_store.put("d/f", b"x", {"uid": "1"})
    assert os.listdir(outside) == []


def test_open_store_file(tmp_path: Path) -> None:
    store = open_store(BackingConfig(url=tmp_path.as_uri()))
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path


@pytest.mark.parametrize(
    "backing",
    [
        BackingConfig(url="gs://bucket/x"),
        BackingConfig(url="/just/a/path"),
        BackingConfig(url="s3://"),
        BackingConfig(url="file://host/dir"),
        BackingConfig(url="file:///dir", endpoint_url="http://127.0.0.1:9000"),
    ],
)
def test_open_store_rejects(backing: BackingConfig) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(backing, source="/etc/tierfs/main.toml")
    assert info.value.problems[0][0] == "/etc/tierfs/main.toml"
    assert "url" in str(info.value)
