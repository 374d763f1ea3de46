"""The attribute shadow's key encoding (tierfs.core.names.shadow): pure functions."""

from __future__ import annotations

import stat

import pytest

from tierfs.core.names.shadow import (
    LONGEST_SUFFIX,
    SHADOW_ROOT,
    ShadowAttrs,
    attrs_from_metadata,
    combine,
    needs_shadow,
    parse_shadow_name,
    shadow_dir_prefix,
    shadow_key,
)
from tierfs.store.local import LocalStore
from tierfs.store.s3 import S3Store

NAMES = [
    "plain",
    "with space",
    "a@b",
    "x@m0600,u0,g0",  # a name that looks like a suffix itself
    "@leading",
    "trailing@",
    "ünïcødé-名前",
    "dots...",
    "-",
    "a" * 200,
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "attrs", [ShadowAttrs(0o600, 0, 0), ShadowAttrs(0o7777, 4294967295, 4294967295)]
)
def test_every_name_round_trips(name: str, attrs: ShadowAttrs) -> None:
    key = shadow_key(f"dir/sub/{name}", attrs)
    prefix = shadow_dir_prefix("dir/sub/")
    assert key.startswith(prefix)
    assert parse_shadow_name(key[len(prefix) :]) == (name, attrs)


def test_directory_keys_drop_their_slash() -> None:
    attrs = ShadowAttrs(0o700, 1000, 1000)
    assert shadow_key("a/b/", attrs) == f"{SHADOW_ROOT}/a/b@m0700,u1000,g1000"
    assert shadow_dir_prefix("") == f"{SHADOW_ROOT}/"


@pytest.mark.parametrize(
    "entry",
    [
        "noattrs",
        "x@",
        "x@m600,u0,g0",
        "x@m0600,u0",
        "x@m0800,u0,g0",
        "@m0600,u0,g0",
        "x@m0600,u-1,g0",
    ],
)
def test_malformed_entries_are_not_attributes(entry: str) -> None:
    assert parse_shadow_name(entry) is None


def test_uid_beyond_32_bits_is_refused() -> None:
    assert parse_shadow_name("x@m0600,u4294967296,g0") is None


def test_longest_suffix_is_the_longest() -> None:
    assert len(ShadowAttrs(0o7777, 4294967295, 4294967295).suffix()) == len(LONGEST_SUFFIX)


def test_only_non_canonical_attributes_need_a_shadow() -> None:
    assert not needs_shadow(stat.S_IFREG | 0o644, 0, 0)
    assert not needs_shadow(stat.S_IFDIR | 0o755, 0, 0)
    assert not needs_shadow(stat.S_IFLNK | 0o777, 1000, 1000)
    assert needs_shadow(stat.S_IFREG | 0o600, 0, 0)
    assert needs_shadow(stat.S_IFREG | 0o644, 1000, 0)
    assert needs_shadow(stat.S_IFREG | 0o644, 0, 1000)
    assert needs_shadow(stat.S_IFDIR | 0o700, 0, 0)
    assert needs_shadow(stat.S_IFREG | 0o755, 0, 0)
    assert needs_shadow(stat.S_IFIFO | 0o600, 0, 0)


def test_combine_is_never_wider_than_any_entry() -> None:
    assert combine([]) is None
    one = ShadowAttrs(0o640, 1000, 100)
    assert combine([one]) == one
    assert combine([ShadowAttrs(0o640, 1000, 100), ShadowAttrs(0o604, 1000, 100)]) == ShadowAttrs(
        0o600, 1000, 100
    )
    # Owners disagree: the owner bits go (whoever it is, it gets nothing).
    mixed = combine([ShadowAttrs(0o640, 1000, 100), ShadowAttrs(0o640, 2000, 100)])
    assert mixed is not None and mixed.perm == 0o040
    groups = combine([ShadowAttrs(0o640, 1000, 100), ShadowAttrs(0o640, 1000, 200)])
    assert groups is not None and groups.perm == 0o600


def test_attributes_from_object_metadata() -> None:
    assert attrs_from_metadata({"mode": str(0o100600), "uid": "7", "gid": "8"}) == ShadowAttrs(
        0o600, 7, 8
    )
    assert attrs_from_metadata({}) is None
    assert attrs_from_metadata({"mode": "junk"}) is None
    assert attrs_from_metadata({"mode": "33188", "uid": "-1"}) is None


def test_store_key_limits_decide_what_fits(tmp_path: object) -> None:
    s3 = S3Store("s3://bkt/pre", endpoint_url="http://127.0.0.1:9")
    assert s3.key_fits("a" * (1024 - len("pre/")))
    assert not s3.key_fits("a" * (1025 - len("pre/")))
    local = LocalStore("file:///nonexistent-tierfs-test-root")
    assert local.key_fits(f"{SHADOW_ROOT}/a/b@m0600,u0,g0")
    assert not local.key_fits("a/.tierfs-attrs/b")  # reserved below the top
    assert local.reserved("a/.tierfs-attrs/b") and local.reserved(".tierfs-meta/")
    assert not local.reserved(f"{SHADOW_ROOT}/a/b@m0600,u0,g0") and not local.reserved("a/b")
    assert not s3.reserved("a/.tierfs-x") and not local.reserved("a/" + "b" * 256)
    assert not local.key_fits("a/" + "b" * 256)  # one segment over 255 bytes


def test_patching_attributes_in_an_encoded_inode_changes_only_them() -> None:
    from tierfs.meta.records import (
        Inode,
        SyncState,
        decode_inode,
        encode_inode,
        patch_attrs,
        raw_mode,
        raw_validated_at,
    )

    inode = Inode(
        ino=7,
        mode=stat.S_IFREG | 0o600,
        uid=1,
        gid=2,
        size=12345,
        mtime_ns=111,
        ctime_ns=222,
        parent=3,
        name=b"n\xc3\xa4me",
        etag="abc",
        origin_key="d/n\u00e4me",
        origin_size=12345,
        state=SyncState.CLEAN,
        validated_at=-1.0,
        listed_at=5.5,
        list_gen=9,
        next_cookie=4,
    )
    raw = encode_inode(inode)
    assert raw_validated_at(raw) == -1.0 and raw_mode(raw) == stat.S_IFREG | 0o600
    patched = decode_inode(7, patch_attrs(raw, stat.S_IFREG | 0o644, 1000, 1001, 42.0))
    inode.mode, inode.uid, inode.gid, inode.validated_at = stat.S_IFREG | 0o644, 1000, 1001, 42.0
    assert patched == inode
