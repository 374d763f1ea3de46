"""Which live mount a snapshot mount trusts with its bytes
(``tierfs.snapshot.lender``): only one this daemon's own user mounted."""

from __future__ import annotations

import os
from pathlib import Path

from tierfs.snapshot.lender import LiveMountLender, _owned_by_us


def test_a_mount_of_another_user_is_never_asked(tmp_path: Path) -> None:
    """Any local user may run a FUSE daemon named like a live mount of the
    bucket (``fsname``, ``subtype=tierfs``): it is not even asked."""
    other = os.geteuid() + 1
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"50 23 0:41 / {tmp_path}/fake rw - fuse.tierfs s3://bkt/data "
        f"rw,user_id={other},group_id={other}\n"
    )
    lender = LiveMountLender("s3://bkt/data", ["/t"], mountinfo=mountinfo)
    assert lender._find() is None
    assert lender.lend("a.bin", "etag", 1) is None


def test_a_socket_of_another_user_or_in_a_shared_directory_is_not_ours(tmp_path: Path) -> None:
    place = tmp_path / "control"
    place.mkdir(mode=0o755)
    sock = place / "control.sock"
    sock.write_bytes(b"")
    assert _owned_by_us(str(sock))
    os.chmod(place, 0o777)  # anyone could have put it there
    assert not _owned_by_us(str(sock))
    os.chmod(place, 0o755)
    if os.geteuid() == 0:
        os.chown(sock, 4242, 4242)
        assert not _owned_by_us(str(sock))
