"""Real mount: until the write path lands, every mutation is EROFS (check 7)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fuse.conftest import Mount, MountFactory

pytestmark = pytest.mark.fuse


@pytest.fixture
def ro_mount(mount: MountFactory) -> Mount:
    return mount({"file.txt": b"content", "dir/inner.txt": b"inner", "emptydir/": b""})


def _open_for_write(path: Path, mode: str) -> None:
    with open(path, mode) as f:
        f.write(b"x")


OPERATIONS: dict[str, Callable[[Path], object]] = {
    "open existing wb": lambda mp: _open_for_write(mp / "file.txt", "wb"),
    "open existing r+b": lambda mp: _open_for_write(mp / "file.txt", "r+b"),
    "open existing ab": lambda mp: _open_for_write(mp / "file.txt", "ab"),
    "create new file": lambda mp: _open_for_write(mp / "new.txt", "wb"),
    "os.open O_CREAT|O_EXCL": lambda mp: os.open(
        mp / "new2.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644
    ),
    "mkdir": lambda mp: os.mkdir(mp / "newdir"),
    "mkdir nested": lambda mp: os.mkdir(mp / "dir" / "sub"),
    "unlink": lambda mp: os.unlink(mp / "file.txt"),
    "rmdir": lambda mp: os.rmdir(mp / "emptydir"),
    "rename file": lambda mp: os.rename(mp / "file.txt", mp / "renamed.txt"),
    "rename dir": lambda mp: os.rename(mp / "dir", mp / "dir2"),
    "touch existing": lambda mp: os.utime(mp / "file.txt"),
    "touch new": lambda mp: (mp / "touched").touch(),
    "truncate": lambda mp: os.truncate(mp / "file.txt", 0),
    "chmod": lambda mp: os.chmod(mp / "file.txt", 0o600),
    "symlink": lambda mp: os.symlink("file.txt", mp / "link"),
    "hard link": lambda mp: os.link(mp / "file.txt", mp / "hardlink"),
    "setxattr": lambda mp: os.setxattr(mp / "file.txt", "user.x", b"1"),
}


def test_every_mutation_is_erofs(ro_mount: Mount) -> None:
    wrong: dict[str, str] = {}
    for name, operation in OPERATIONS.items():
        try:
            operation(ro_mount.path)
        except OSError as exc:
            if exc.errno != errno.EROFS:
                wrong[name] = f"errno {errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc}"
        else:
            wrong[name] = "succeeded"
    assert not wrong, wrong

    # Nothing changed, on the mount or in the bucket.
    assert sorted(os.listdir(ro_mount.path)) == ["dir", "emptydir", "file.txt"]
    assert (ro_mount.path / "file.txt").read_bytes() == b"content"
    listed = ro_mount.s3.list_objects_v2(Bucket=ro_mount.bucket).get("Contents", [])
    keys = sorted(o["Key"] for o in listed)
    assert keys == [ro_mount.key(k) for k in ("dir/inner.txt", "emptydir/", "file.txt")]
