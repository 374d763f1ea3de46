"""Small files and metadata through a real mount, counted in FUSE
requests (``status`` ``fuse_requests``) and S3 requests, not timed.

* An absent name of a freshly listed directory is a negative entry the
  kernel keeps while the listing is fresh: asked again, it costs no
  request; a file then made through the mount shows at once.
* A listing that expired gives no negative entry (timeout 0): every
  lookup asks again, so the re-listing's names show at the next access.
* Warm open+read+close of a resident file reaches the daemon as OPEN,
  FLUSH and RELEASE (and the GETATTR of an fstat), never READ (the kernel
  keeps its pages), and sends nothing to the bucket.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any

import pytest

from tests.fuse.conftest import MountFactory
from tests.fuse.test_modes import delta, store_calls


def fuse_requests(m: Any) -> dict[str, int]:
    summary: dict[str, dict[str, float]] = m.status()["fuse_requests"]
    return {op: int(row["requests"]) for op, row in summary.items()}


def stat_errno(path: os.PathLike[str] | str) -> int:
    with pytest.raises(OSError) as caught:
        os.stat(path)
    return caught.value.errno or 0


def test_an_absent_name_is_remembered_while_the_listing_is_fresh(mount: MountFactory) -> None:
    m = mount({"d/a.txt": b"a"}, list_ttl="60s")
    assert os.listdir(m.path / "d") == ["a.txt"]
    before = fuse_requests(m)
    for _ in range(3):
        assert stat_errno(m.path / "d" / "missing.txt") == errno.ENOENT
    assert delta(fuse_requests(m), before).get("lookup", 0) == 1
    # Made through the mount: the kernel replaces its negative entry.
    (m.path / "d" / "missing.txt").write_bytes(b"now here")
    assert (m.path / "d" / "missing.txt").read_bytes() == b"now here"
    assert sorted(os.listdir(m.path / "d")) == ["a.txt", "missing.txt"]


def test_an_expired_listing_gives_no_negative_entry(mount: MountFactory) -> None:
    m = mount({"d/a.txt": b"a"}, list_ttl="1s")
    assert os.listdir(m.path / "d") == ["a.txt"]
    time.sleep(1.2)  # expired: every answer from it has timeout 0
    before = fuse_requests(m)
    for _ in range(3):
        assert stat_errno(m.path / "d" / "missing.txt") == errno.ENOENT
    assert delta(fuse_requests(m), before).get("lookup", 0) >= 3


def test_warm_open_read_close_is_open_flush_release_and_no_s3_request(
    mount: MountFactory,
) -> None:
    objects = {f"w/f{i}.bin": os.urandom(1000 + 3000 * i) for i in range(8)}
    m = mount(objects, list_ttl="60s", revalidate_ttl="60s")
    for name, body in objects.items():  # cold: fetched, and in the page cache
        assert (m.path / name).read_bytes() == body
    before, calls = fuse_requests(m), store_calls(m)
    for name, body in objects.items():
        assert (m.path / name).read_bytes() == body
    seen = delta(fuse_requests(m), before)
    assert "read" not in seen, "the kernel's pages were kept: no READ reaches the daemon"
    for op in ("open", "flush", "release"):
        assert seen[op] == len(objects)
    # ``read_bytes`` fstats the file: a read-write mount's kernel marks the
    # atime stale after every read, so that costs one GETATTR (a read-only
    # mount's does not); nothing else reaches the daemon.
    assert set(seen) <= {"open", "flush", "release", "getattr", "getxattr"}
    assert seen.get("getattr", 0) <= len(objects)
    assert delta(store_calls(m), calls) == {}


def test_a_directory_read_in_listing_order_is_fetched_ahead(mount: MountFactory) -> None:
    """One reader walks a cold directory in listing order (``cat dir/*``):
    each file is one GET and no HEAD, and the daemon fetches the next files
    before they are opened, so most opens find their file resident."""
    objects = {f"seq/f{i:03d}.bin": os.urandom(2000 + 37 * i) for i in range(60)}
    m = mount(objects, list_ttl="60s", revalidate_ttl="60s")
    names = os.listdir(m.path / "seq")
    assert sorted(names) == names, "readdir gives listing (key) order"
    calls = store_calls(m)
    for name in names:
        assert (m.path / "seq" / name).read_bytes() == objects[f"seq/{name}"]
    seen = delta(store_calls(m), calls)
    assert seen.get("GetObject") == len(objects), seen
    assert "HeadObject" not in seen, seen
    readahead = m.status()["dir_readahead"]
    assert readahead["wrong_guesses"] == 0
    # The first two opens start the stream; a fill still queued when its
    # file is opened is the reader's own GET, so allow a few of those.
    assert readahead["hits"] >= len(objects) - 10, readahead
