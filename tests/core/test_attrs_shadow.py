"""Stored attributes hold on a fresh node, from the first access, without a
HEAD per file (tierfs.core.names.shadow, "Attributes of listed names" in
tierfs.core.names.namespace).  TierFS over a real S3 server, no mount."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.core.conftest import CoreMount, CountingStore, _start, make_config, put, wait_listed
from tierfs.errors import StoreError, TierfsError
from tierfs.meta import ROOT_INO

SHADOW = ".tierfs-attrs"


def all_keys(s3_store: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    pending = [prefix]
    while pending:
        p = pending.pop()
        for page in s3_store.list_pages(p):
            out.update(o.key for o in page.objects)
            pending.extend(page.prefixes)
    return out


def shadow_keys(s3_store: Any) -> set[str]:
    return all_keys(s3_store, f"{SHADOW}/")


async def fresh_node(node: CoreMount, tmp_path: Path, name: str, store: Any = None) -> CoreMount:
    """Another node on the same bucket: its own state dir and tiers."""
    base = tmp_path / name
    base.mkdir()
    config = make_config(base, node.store.url)
    return await _start(config, store or node.store, node.nursery, node.registry)


async def create_file(
    node: CoreMount, path: str, data: bytes, mode: int, uid: int, gid: int
) -> int:
    parent_path, _, name = path.rpartition("/")
    parent = await node.fs.namespace.resolve(parent_path)
    opened, attrs = await node.fs.create(parent.ino, name.encode(), mode, os.O_WRONLY, uid, gid)
    await node.fs.write(opened.fh, 0, data)
    await node.fs.fsync(opened.fh, False)
    await node.fs.release(opened.fh)
    return int(attrs.ino)


async def make_dir(node: CoreMount, path: str, mode: int, uid: int, gid: int) -> int:
    parent_path, _, name = path.rpartition("/")
    parent = await node.fs.namespace.resolve(parent_path)
    return int((await node.fs.mkdir(parent.ino, name.encode(), mode, uid, gid)).ino)


def calls(node: CoreMount) -> dict[str, int]:
    return dict(node.store.inner.calls)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Calls made in between, without the mount's one-off cleanup of stale
    multipart uploads (it runs in the background at start)."""
    return {
        k: v - before.get(k, 0)
        for k, v in after.items()
        if v - before.get(k, 0) and k != "ListMultipartUploads"
    }


async def test_private_file_and_directory_hold_on_a_fresh_node_without_head(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    writer = await make_fs()
    await make_dir(writer, "team", 0o700, 1000, 1000)
    await create_file(writer, "team/secret.bin", b"s" * 5000, 0o600, 1000, 1000)
    await create_file(writer, "public.txt", b"p" * 10, 0o644, 0, 0)
    await writer.flush()
    assert shadow_keys(s3_store) == {
        f"{SHADOW}/team@m0700,u1000,g1000",
        f"{SHADOW}/team/secret.bin@m0600,u1000,g1000",
    }
    meta = s3_store.head("team/secret.bin").metadata  # the object metadata stays too
    assert int(meta["mode"]) & 0o7777 == 0o600 and meta["uid"] == "1000"

    node = await fresh_node(writer, tmp_path, "node2")
    before, heads = calls(node), node.store.heads
    team = await node.fs.lookup(ROOT_INO, b"team")
    assert stat.S_IMODE(team.mode) == 0o700 and (team.uid, team.gid) == (1000, 1000)
    secret = await node.fs.lookup(team.ino, b"secret.bin")
    assert stat.S_IMODE(secret.mode) == 0o600 and (secret.uid, secret.gid) == (1000, 1000)
    public = await node.fs.lookup(ROOT_INO, b"public.txt")
    assert stat.S_IMODE(public.mode) == 0o644 and (public.uid, public.gid) == (0, 0)
    # readdir (readdirplus) hands out the same attributes
    listed = {e.name: e.attrs for e in await node.fs.names.readdir(ROOT_INO, 0)}
    assert SHADOW.encode() not in listed
    assert stat.S_IMODE(listed[b"team"].mode) == 0o700
    assert await node.read_file("team/secret.bin") == b"s" * 5000
    # root + team listed: 2 data LISTs + 2 shadow LISTs; the read: ONE GET.
    assert delta(calls(node), before) == {"ListObjectsV2": 4, "GetObject": 1}
    assert node.store.heads == heads


async def test_objects_of_other_tools_keep_the_configured_modes(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    put(s3_store, "data/a.bin", b"a")
    node = await make_fs()
    data = await node.fs.lookup(ROOT_INO, b"data")
    a = await node.fs.lookup(data.ino, b"a.bin")
    ident = node.fs.identity
    assert stat.S_IMODE(data.mode) == ident.dir_mode
    assert stat.S_IMODE(a.mode) == ident.file_mode
    assert (a.uid, a.gid) == (ident.uid, ident.gid)


async def test_chmod_chown_rename_unlink_keep_the_shadow_in_step(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    writer = await make_fs()
    ino = await create_file(writer, "f.bin", b"x" * 100, 0o600, 0, 0)
    dir_ino = await make_dir(writer, "d", 0o750, 0, 0)
    await create_file(writer, "d/in.bin", b"y", 0o640, 1000, 0)
    await writer.flush()
    assert shadow_keys(s3_store) == {
        f"{SHADOW}/f.bin@m0600,u0,g0",
        f"{SHADOW}/d@m0750,u0,g0",
        f"{SHADOW}/d/in.bin@m0640,u1000,g0",
    }
    # chmod of a clean file: metadata rewritten, the shadow follows
    await writer.fs.setattr(ino, mode=0o640)
    await writer.flush()
    assert f"{SHADOW}/f.bin@m0640,u0,g0" in shadow_keys(s3_store)
    assert f"{SHADOW}/f.bin@m0600,u0,g0" not in shadow_keys(s3_store)
    # chown to 0:0 and chmod 0644: canonical, no shadow at all
    await writer.fs.setattr(ino, mode=0o644)
    await writer.flush()
    assert not any(k.startswith(f"{SHADOW}/f.bin") for k in shadow_keys(s3_store))
    await writer.fs.setattr(ino, mode=0o600, uid=1000)
    await writer.flush()
    # directory chmod: its marker and its shadow
    await writer.fs.setattr(dir_ino, mode=0o700)
    await writer.flush()
    assert int(s3_store.head("d/").metadata["mode"]) & 0o7777 == 0o700
    # rename of a file and of a directory: every shadow key below moves
    await writer.fs.rename(ROOT_INO, b"f.bin", ROOT_INO, b"g.bin", 0)
    await writer.fs.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0)
    await writer.flush()
    assert shadow_keys(s3_store) == {
        f"{SHADOW}/g.bin@m0600,u1000,g0",
        f"{SHADOW}/e@m0700,u0,g0",
        f"{SHADOW}/e/in.bin@m0640,u1000,g0",
    }
    node = await fresh_node(writer, tmp_path, "node2")
    g = await node.fs.lookup(ROOT_INO, b"g.bin")
    assert stat.S_IMODE(g.mode) == 0o600 and g.uid == 1000
    e = await node.fs.lookup(ROOT_INO, b"e")
    assert stat.S_IMODE(e.mode) == 0o700
    assert stat.S_IMODE((await node.fs.lookup(e.ino, b"in.bin")).mode) == 0o640
    # unlink and rmdir take their shadow entries with them
    await writer.fs.unlink(ROOT_INO, b"g.bin")
    e_writer = await writer.fs.lookup(ROOT_INO, b"e")
    await writer.fs.unlink(e_writer.ino, b"in.bin")
    await writer.fs.rmdir(ROOT_INO, b"e")
    await writer.flush()
    assert shadow_keys(s3_store) == set()
    assert writer.fs.meta.shadow_ledger(ino) == []


async def test_the_reserved_name_is_refused_and_never_listed(make_fs: Any, s3_store: Any) -> None:
    node = await make_fs()
    with pytest.raises(TierfsError) as info:
        await node.fs.mkdir(ROOT_INO, SHADOW.encode(), 0o755, 0, 0)
    assert info.value.errno == errno.EPERM
    with pytest.raises(TierfsError) as info:
        await node.fs.create(ROOT_INO, SHADOW.encode(), 0o644, os.O_WRONLY, 0, 0)
    assert info.value.errno == errno.EPERM
    await create_file(node, "x", b"1", 0o600, 0, 0)
    with pytest.raises(TierfsError) as info:
        await node.fs.rename(ROOT_INO, b"x", ROOT_INO, SHADOW.encode(), 0)
    assert info.value.errno == errno.EPERM
    # below the root the name is an ordinary one
    sub = await make_dir(node, "sub", 0o755, 0, 0)
    await node.fs.mkdir(sub, SHADOW.encode(), 0o755, 0, 0)
    await node.flush()
    assert any(k.startswith(f"{SHADOW}/") for k in all_keys(s3_store))
    names = [e.name for e in await node.fs.names.readdir(ROOT_INO, 0)]
    assert SHADOW.encode() not in names and b"x" in names


async def test_a_name_too_long_for_a_shadow_falls_back_to_one_head(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    writer = await make_fs()
    # data keys fit S3's 1024 bytes (with the "pre/" prefix); their shadow keys do not
    path = ""
    for i in range(4):
        path += ("/" if path else "") + f"{i}" * 200
        await make_dir(writer, path, 0o755, 0, 0)
    long_name = "n" * 200
    assert len(f"pre/{path}/{long_name}") <= 1024
    await create_file(writer, f"{path}/{long_name}", b"z", 0o600, 1000, 1000)
    await writer.flush()
    assert not any(long_name in k for k in shadow_keys(s3_store))
    node = await fresh_node(writer, tmp_path, "node2")
    heads = node.store.heads
    inode = await node.fs.namespace.resolve(f"{path}/{long_name}")
    assert stat.S_IMODE(inode.mode) == 0o600 and inode.uid == 1000
    assert node.store.heads == heads + 1


class ShadowListFails:
    """The real store, except that listing the attribute shadow fails."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.heads = 0
        self.fail = True

    def list_pages(self, prefix: str, page_size: int = 1000) -> Any:
        if self.fail and prefix.startswith(f"{SHADOW}/"):
            raise StoreError("injected: shadow listing refused")
        result: Any = self.inner.list_pages(prefix, page_size)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_names_stay_private_while_their_shadow_cannot_be_listed(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    writer = await make_fs()
    await create_file(writer, "open.txt", b"o", 0o644, 0, 0)
    await writer.flush()
    failing = ShadowListFails(writer.store)
    node = await fresh_node(writer, tmp_path, "node2", store=failing)
    with pytest.raises(TierfsError):
        await node.fs.lookup(ROOT_INO, b"open.txt")
    # the data listing was merged, but nothing wider than owner-only is shown
    ino = node.fs.meta.lookup(ROOT_INO, b"open.txt")
    assert ino is not None
    assert stat.S_IMODE(node.fs.namespace.get(ino).mode) & 0o077 == 0
    failing.fail = False
    attrs = await node.fs.lookup(ROOT_INO, b"open.txt")
    assert stat.S_IMODE(attrs.mode) == 0o644


async def test_orphaned_shadow_entries_are_cleaned_by_a_new_file_there(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    # A crash of another node left a shadow entry without its object.
    s3_store.put(f"{SHADOW}/ghost@m0666,u1000,g1000", b"")
    node = await make_fs()
    names = [e.name for e in await node.fs.names.readdir(ROOT_INO, 0)]
    assert b"ghost" not in names
    await create_file(node, "ghost", b"new", 0o644, 0, 0)
    await node.flush()
    assert shadow_keys(s3_store) == set()
    other = await fresh_node(node, tmp_path, "node2")
    ghost = await other.fs.lookup(ROOT_INO, b"ghost")
    assert stat.S_IMODE(ghost.mode) == 0o644 and ghost.uid == 0


async def test_the_shadow_works_on_a_local_directory_backing(
    local_store: Any, tmp_path: Path
) -> None:
    registry: list[CoreMount] = []
    store = CountingStore(local_store)
    async with trio.open_nursery() as nursery:
        bases = [tmp_path / "writer", tmp_path / "reader"]
        for base in bases:
            base.mkdir()
        writer = await _start(make_config(bases[0], store.url), store, nursery, registry)
        await make_dir(writer, "d", 0o700, 1000, 1000)
        await create_file(writer, "d/f.bin", b"f", 0o600, 1000, 1000)
        await writer.flush()
        root = Path(local_store.root)
        assert (root / SHADOW / "d@m0700,u1000,g1000").is_file()
        assert (root / SHADOW / "d" / "f.bin@m0600,u1000,g1000").is_file()
        reader = await _start(make_config(bases[1], store.url), store, nursery, registry)
        heads = store.heads
        d = await reader.fs.lookup(ROOT_INO, b"d")
        f = await reader.fs.lookup(d.ino, b"f.bin")
        assert (stat.S_IMODE(d.mode), d.uid) == (0o700, 1000)
        assert (stat.S_IMODE(f.mode), f.uid, f.gid) == (0o600, 1000, 1000)
        assert SHADOW.encode() not in [e.name for e in await reader.fs.names.readdir(ROOT_INO, 0)]
        assert store.heads == heads
        for node in registry:
            await node.aclose()
        nursery.cancel_scope.cancel()


class RefusingStore:
    """The real store, except that the operations named in ``refuse`` fail
    (as an endpoint that breaks between two steps of an entry would)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.heads = 0
        self.refuse: set[str] = set()

    def _guard(self, op: str) -> None:
        if op in self.refuse:
            raise StoreError(f"injected: {op} refused")

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        self._guard("copy")
        return self.inner.copy(*args, **kwargs)

    def delete(self, key: str) -> None:
        self._guard("delete")
        self.inner.delete(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


@pytest.mark.parametrize("direction", ["narrower", "wider"])
async def test_a_change_stuck_halfway_is_never_wider_than_either_side(
    make_fs: Any, s3_store: Any, tmp_path: Path, direction: str
) -> None:
    """chmod 0644 -> 0600 with the metadata rewrite failing after the new
    shadow is in: other nodes already see 0600.  chmod 0600 -> 0644 with the
    delete of the old shadow failing: other nodes still see 0600."""
    first = await make_fs()
    refusing = RefusingStore(first.store)
    start, end = (0o644, 0o600) if direction == "narrower" else (0o600, 0o644)
    await create_file(first, "f.bin", b"f", start, 0, 0)
    await first.flush()
    await first.aclose()
    writer = await fresh_node(first, tmp_path, "writer", store=refusing)
    ino = (await writer.fs.lookup(ROOT_INO, b"f.bin")).ino
    refusing.refuse = {"copy"} if direction == "narrower" else {"delete"}
    await writer.fs.setattr(ino, mode=end)
    if direction == "narrower":
        await wait_for(lambda: f"{SHADOW}/f.bin@m0600,u0,g0" in shadow_keys(s3_store))
        assert int(s3_store.head("f.bin").metadata["mode"]) & 0o7777 == 0o644  # not rewritten
    else:
        await wait_for(lambda: int(s3_store.head("f.bin").metadata["mode"]) & 0o7777 == 0o644)
        assert f"{SHADOW}/f.bin@m0600,u0,g0" in shadow_keys(s3_store)  # not deleted yet
    other = await fresh_node(first, tmp_path, "other")
    seen = await other.fs.lookup(ROOT_INO, b"f.bin")
    assert stat.S_IMODE(seen.mode) == 0o600
    refusing.refuse = set()
    await writer.flush()
    assert shadow_keys(s3_store) == ({f"{SHADOW}/f.bin@m0600,u0,g0"} if end == 0o600 else set())


async def test_a_private_directory_implied_only_by_keys_stays_private(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    writer = await make_fs()
    await make_dir(writer, "vault", 0o700, 1000, 1000)
    await create_file(writer, "vault/k.bin", b"k", 0o644, 1000, 1000)
    await writer.flush()
    s3_store.delete("vault/")  # another tool removed the marker: only keys imply it now
    assert "vault/" not in all_keys(s3_store)
    node = await fresh_node(writer, tmp_path, "node2")
    before = calls(node)
    vault = await node.fs.lookup(ROOT_INO, b"vault")
    assert (stat.S_IMODE(vault.mode), vault.uid, vault.gid) == (0o700, 1000, 1000)
    k = await node.fs.lookup(vault.ino, b"k.bin")
    assert (stat.S_IMODE(k.mode), k.uid) == (0o644, 1000)
    assert "HeadObject" not in delta(calls(node), before)


async def test_another_nodes_chmod_reaches_an_open_file_at_the_next_listing(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    from tierfs.config import NamespaceConfig

    writer = await make_fs()
    ino = await create_file(writer, "f.bin", b"f", 0o644, 0, 0)
    await writer.flush()
    base = tmp_path / "reader"
    base.mkdir()
    config = make_config(
        base, writer.store.url, namespace=NamespaceConfig(list_ttl=0.2, revalidate_ttl=60)
    )
    reader = await _start(config, writer.store, writer.nursery, writer.registry)
    seen = await reader.fs.lookup(ROOT_INO, b"f.bin")
    assert stat.S_IMODE(seen.mode) == 0o644
    opened = await reader.fs.open(seen.ino, os.O_RDONLY)
    try:
        await writer.fs.setattr(ino, mode=0o600)
        await writer.flush()
        await trio.sleep(0.3)
        done = reader.fs.namespace.listings.listings_done
        await reader.fs.lookup(ROOT_INO, b"f.bin")  # starts the next listing
        await wait_listed(reader, done)
        assert stat.S_IMODE((await reader.fs.getattr(seen.ino)).mode) == 0o600
    finally:
        await reader.fs.release(opened.fh)
    assert stat.S_IMODE((await reader.fs.getattr(seen.ino)).mode) == 0o600


async def test_provisional_attributes_never_reach_the_bucket(
    make_fs: Any, s3_store: Any, tmp_path: Path
) -> None:
    """A name a listing merged but never settled keeps provisional,
    owner-only attributes (here the shadow listing failed; on a mount, a
    lookup whose wait for the re-listing ran out, or readdirplus of a
    running re-listing).  A write over it, a chmod of it and a rename of it
    must not upload those as a shadow or as object metadata: each first
    settles the name as a listing would (its shadow, else the defaults)."""
    writer = await make_fs()
    for name, perm, owner in (
        ("private.bin", 0o640, 1000),
        ("plain.bin", 0o644, 0),
        ("chmodded.bin", 0o644, 0),
        ("moved.bin", 0o600, 1000),
    ):
        await create_file(writer, name, b"old " + name.encode(), perm, owner, owner)
    await writer.flush()
    before = shadow_keys(s3_store)
    assert before == {
        f"{SHADOW}/private.bin@m0640,u1000,g1000",
        f"{SHADOW}/moved.bin@m0600,u1000,g1000",
    }
    failing = ShadowListFails(writer.store)
    node = await fresh_node(writer, tmp_path, "node2", store=failing)
    with pytest.raises(TierfsError):
        await node.fs.lookup(ROOT_INO, b"private.bin")
    fs = node.fs
    inos = {name: fs.meta.lookup(ROOT_INO, name.encode()) for name in ("private.bin", "plain.bin")}
    inos["chmodded.bin"] = fs.meta.lookup(ROOT_INO, b"chmodded.bin")
    inos["moved.bin"] = fs.meta.lookup(ROOT_INO, b"moved.bin")
    for name, ino in inos.items():
        assert ino is not None and fs.listings.is_provisional(fs.namespace.get(ino)), name
    failing.fail = False  # the bucket answers again; no listing has run since
    for name in ("private.bin", "plain.bin"):  # by inode, as the kernel does after readdirplus
        ino = inos[name]
        assert ino is not None
        opened = await fs.open(ino, os.O_WRONLY | os.O_TRUNC)
        await fs.write(opened.fh, 0, b"new " + name.encode())
        await fs.release(opened.fh)
    chmodded = inos["chmodded.bin"]
    assert chmodded is not None
    await fs.setattr(chmodded, mode=0o604)
    await fs.rename(ROOT_INO, b"moved.bin", ROOT_INO, b"renamed.bin", 0)
    await node.flush()
    assert shadow_keys(s3_store) == {
        f"{SHADOW}/private.bin@m0640,u1000,g1000",
        f"{SHADOW}/chmodded.bin@m0604,u0,g0",
        f"{SHADOW}/renamed.bin@m0600,u1000,g1000",
    }
    for key, perm, owner in (
        ("private.bin", 0o640, "1000"),
        ("plain.bin", 0o644, "0"),
        ("chmodded.bin", 0o604, "0"),
        ("renamed.bin", 0o600, "1000"),
    ):
        metadata = s3_store.head(key).metadata
        assert (int(metadata["mode"]) & 0o7777, metadata["uid"]) == (perm, owner), key
    ident = fs.identity
    expected = {
        "private.bin": (0o640, 1000, 1000),
        "plain.bin": (ident.file_mode, ident.uid, ident.gid),
        "chmodded.bin": (0o604, ident.uid, ident.gid),
        "moved.bin": (0o600, 1000, 1000),
    }
    for name, (perm, uid, gid) in expected.items():
        ino = inos[name]
        assert ino is not None
        inode = fs.namespace.get(ino)
        assert not fs.listings.is_provisional(inode), name
        assert (stat.S_IMODE(inode.mode), inode.uid, inode.gid) == (perm, uid, gid), name


async def test_the_snapshots_root_is_reserved_too(make_fs: Any, s3_store: Any) -> None:
    """``.tierfs-snapshots`` (the snapshots' records) is never listed as a
    directory of the mount, nor made in its root; below the root it is an
    ordinary name."""
    put(s3_store, ".tierfs-snapshots/run-1/manifest.json", b"{}")
    put(s3_store, "data/a.bin", b"a")
    node = await make_fs()
    data = await node.fs.lookup(ROOT_INO, b"data")  # the root is listed
    names = [e.name for e in await node.fs.names.readdir(ROOT_INO, 0)]
    assert names == [b"data"]
    with pytest.raises(TierfsError) as info:
        await node.fs.lookup(ROOT_INO, b".tierfs-snapshots")
    assert info.value.errno == errno.ENOENT
    for make in (
        lambda: node.fs.mkdir(ROOT_INO, b".tierfs-snapshots", 0o755, 0, 0),
        lambda: node.fs.create(ROOT_INO, b".tierfs-snapshots", 0o644, os.O_WRONLY, 0, 0),
    ):
        with pytest.raises(TierfsError) as info:
            await make()
        assert info.value.errno == errno.EPERM
    await node.fs.mkdir(data.ino, b".tierfs-snapshots", 0o755, 0, 0)
