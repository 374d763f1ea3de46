"""Real mount: the bucket's namespace as files and directories.

Acceptance checks 3, 4, 5, 8 and 11: objects that appear, vanish and change
in the bucket while mounted; keys that cannot be names; a large directory;
stat and statvfs.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import pytest

from tests.fuse.conftest import MountFactory, put_objects, wait_until

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
MARGIN = 3.0  # seconds on top of a TTL for kernel caches and scheduling


def walk_files(root: Path) -> set[str]:
    """Every regular file under ``root``, relative, with "/" separators."""
    out: set[str] = set()
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


# --- 3: objects put or deleted while mounted -----------------------------------------------


def test_new_object_appears_and_deleted_object_disappears(mount: MountFactory) -> None:
    m = mount({"old.txt": b"old"})
    assert sorted(os.listdir(m.path)) == ["old.txt"]

    m.put("new.txt", b"fresh")
    m.put("newdir/inner.txt", b"inner")
    start = time.monotonic()
    appeared = wait_until(
        lambda: {"new.txt", "newdir"} <= set(os.listdir(m.path)), m.list_ttl + MARGIN
    )
    assert appeared, f"new objects not listed after {m.list_ttl + MARGIN:.0f} s"
    assert time.monotonic() - start <= m.list_ttl + MARGIN
    assert (m.path / "new.txt").read_bytes() == b"fresh"
    assert (m.path / "newdir" / "inner.txt").read_bytes() == b"inner"

    m.delete("old.txt")
    gone = wait_until(lambda: "old.txt" not in os.listdir(m.path), m.list_ttl + MARGIN)
    assert gone, f"deleted object still listed after {m.list_ttl + MARGIN:.0f} s"
    assert wait_until(lambda: not (m.path / "old.txt").exists(), m.list_ttl + MARGIN)
    with pytest.raises(FileNotFoundError):
        (m.path / "old.txt").read_bytes()
    assert sorted(os.listdir(m.path)) == ["new.txt", "newdir"]


# --- 4: objects overwritten in the bucket ------------------------------------------------------


def test_overwritten_object_is_detected_on_open(mount: MountFactory) -> None:
    old = os.urandom(2 * MiB)
    new = os.urandom(2 * MiB)  # same size: only the ETag tells them apart
    m = mount({"f.bin": old})
    path = m.path / "f.bin"
    assert path.read_bytes() == old
    assert path.read_bytes() == old  # now also in the kernel page cache
    m.put("f.bin", new)
    time.sleep(m.revalidate_ttl + 0.5)
    assert path.read_bytes() == new, "stale cached bytes served after the object changed"
    assert m.where_one("f.bin")["cached_bytes"] == len(new)


def test_overwritten_object_with_new_size_is_detected_on_open(mount: MountFactory) -> None:
    # list_ttl is long, so only the revalidation on open can notice the change.
    old = os.urandom(MiB)
    new = os.urandom(MiB + MiB // 2)
    m = mount({"g.bin": old}, list_ttl="30s", revalidate_ttl="1s")
    path = m.path / "g.bin"
    assert path.read_bytes() == old
    m.put("g.bin", new)
    time.sleep(m.revalidate_ttl + 0.5)
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == len(new), f"read {len(data)} bytes, the object now has {len(new)}"
    assert data == new
    assert path.stat().st_size == len(new)


# --- 5: keys that cannot be names --------------------------------------------------------------

LONG = "n" * 300
#: key -> the fragment its warning must name (the log quotes keys with repr)
ODD_KEYS = {
    "a//b": "'a//",
    "./x": "'./",
    "x/../y": "'x/../",
    LONG: LONG,
}


def test_odd_keys_are_skipped_with_one_warning_each(mount: MountFactory) -> None:
    objects = {key: b"odd" for key in ODD_KEYS}
    objects |= {"ok.txt": b"fine", "d": b"hidden file", "d/inner": b"inner"}
    m = mount(objects)

    for _ in range(2):  # the second walk re-lists (list_ttl expired): no new warnings
        files = walk_files(m.path)
        assert files == {"ok.txt", "d/inner"}, files
        root = set(os.listdir(m.path))
        assert "ok.txt" in root and "d" in root
        assert not root & {".", "..", "y", LONG}, root
        time.sleep(m.list_ttl + 0.2)

    st = os.stat(m.path / "d")
    assert stat.S_ISDIR(st.st_mode), "object d plus d/inner: d must be a directory"
    assert os.listdir(m.path / "d") == ["inner"]
    assert (m.path / "d" / "inner").read_bytes() == b"inner"

    # The mount stays healthy.
    assert (m.path / "ok.txt").read_bytes() == b"fine"
    os.statvfs(m.path)
    assert m.status()["pid"] in m.pids
    with pytest.raises(OSError) as info:
        os.stat(m.path / LONG)
    assert info.value.errno in (errno.ENOENT, errno.ENAMETOOLONG)

    log_lines = m.log_text().splitlines()
    warnings = [line for line in log_lines if " WARNING " in line]
    for key, fragment in ODD_KEYS.items():
        hits = [line for line in warnings if fragment in line and "skipping" in line]
        assert len(hits) == 1, f"key {key[:20]!r}: {len(hits)} warnings: {hits}"
    conflict = [line for line in warnings if "'d'" in line and "'d/inner'" not in line]
    assert len(conflict) == 1, conflict
    assert not [line for line in log_lines if "Traceback" in line or " ERROR " in line]


# --- 8: a directory with many objects ----------------------------------------------------------


@pytest.mark.long
def test_large_directory_lists_completely(mount: MountFactory) -> None:
    # Three LIST pages (S3 returns at most 1000 keys a page), the last one
    # partial; each object is a PUT to the test's S3 server, the bulk of the
    # test's time.
    count = 2100
    m = mount(do_mount=False)
    names = {f"f{i:05d}.dat" for i in range(count)}
    put_objects(m.s3, m.bucket, {m.key(f"many/{n}"): b"" for n in names}, workers=8)
    m.put("many/zz-marker.txt", b"1")
    names.add("zz-marker.txt")
    m.mount()

    listed = os.listdir(m.path / "many")
    assert len(listed) == len(names)
    assert set(listed) == names

    first = {e.name for e in os.scandir(m.path / "many")}
    second = {e.name for e in os.scandir(m.path / "many")}
    assert first == second == names

    time.sleep(m.list_ttl + 0.2)  # a re-listing merges into the same entries
    with os.scandir(m.path / "many") as it:
        entries = list(it)
    assert {e.name for e in entries} == names
    assert all(e.is_file() for e in entries)
    assert (m.path / "many" / "zz-marker.txt").read_bytes() == b"1"


# --- 11: stat and statvfs ----------------------------------------------------------------------


def test_stat_sizes_modes_and_statvfs(mount: MountFactory) -> None:
    sizes = {"empty": 0, "one": 1, "sub/block_plus_one": MiB + 1, "sub/deeper/x": 4321}
    m = mount({name: os.urandom(size) for name, size in sizes.items()})

    for name, size in sizes.items():
        st = os.stat(m.path / name)
        assert stat.S_ISREG(st.st_mode), name
        assert st.st_size == size, name
        assert stat.S_IMODE(st.st_mode) == 0o644, oct(st.st_mode)
        assert st.st_uid == os.getuid()
        head = m.s3.head_object(Bucket=m.bucket, Key=m.key(name))
        assert abs(st.st_mtime - head["LastModified"].timestamp()) < 2.0, name

    for name in ("", "sub", "sub/deeper"):
        st = os.stat(m.path / name)
        assert stat.S_ISDIR(st.st_mode), name
        assert stat.S_IMODE(st.st_mode) == 0o755, (name, oct(st.st_mode))

    assert sorted(os.listdir(m.path)) == ["empty", "one", "sub"]
    assert (m.path / "empty").read_bytes() == b""

    vfs = os.statvfs(m.path)
    assert vfs.f_namemax == 255
    assert vfs.f_bsize > 0 and vfs.f_frsize > 0
    assert vfs.f_blocks > 0
    assert 0 <= vfs.f_bavail <= vfs.f_blocks
    assert vfs.f_blocks * vfs.f_frsize <= (16 + 64) * MiB
