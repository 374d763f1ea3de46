"""``mount.fuse.tierfs``: mount(8)'s arguments turned into ``tierfs mount``."""

from __future__ import annotations

import pytest

from tierfs.mounthelper import HelperError, parse


def test_fstab_options_that_are_not_the_daemons_are_dropped() -> None:
    config, mountpoint, options = parse(
        [
            "/etc/tierfs/data.toml",
            "/mnt/data",
            "-o",
            "rw,allow_other,_netdev,nofail,x-systemd.requires=network-online.target,"
            "nosuid,nodev,defaults,comment=x",
        ]
    )
    assert (config, mountpoint, options) == ("/etc/tierfs/data.toml", "/mnt/data", ["allow_other"])


def test_read_only_from_ro_or_minus_r_and_the_daemons_options_pass() -> None:
    assert parse(["c", "m", "-o", "ro,allow_root,debug"])[2] == ["ro", "allow_root", "debug"]
    assert parse(["-r", "c", "m", "-n", "-t", "fuse.tierfs"])[2] == ["ro"]
    assert parse(["c", "m", "-oro", "-o", "ro"])[2] == ["ro"]


def test_an_unknown_option_or_a_missing_argument_is_named() -> None:
    with pytest.raises(HelperError, match="unknown mount option 'cache_size=1G'"):
        parse(["c", "m", "-o", "allow_other,cache_size=1G"])
    with pytest.raises(HelperError, match="usage"):
        parse(["c"])
    with pytest.raises(HelperError, match="-o needs a value"):
        parse(["c", "m", "-o"])


def test_a_snapshot_passes_to_the_daemon_from_fstab() -> None:
    """``/etc/tierfs/data.toml /mnt/run-42 fuse.tierfs snapshot=run-42,allow_other 0 0``."""
    line = ["/etc/tierfs/data.toml", "/mnt/run-42", "-o", "rw,snapshot=run-42,allow_other,_netdev"]
    assert parse(line)[2] == ["snapshot=run-42", "allow_other"]
    with pytest.raises(HelperError, match="unknown mount option 'snapshot'"):
        parse(["c", "m", "-o", "snapshot"])  # a snapshot needs its name
