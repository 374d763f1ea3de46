"""``scripts/link-mount-helper.sh`` (the last step of ``scripts/install.sh``):
it links the checkout's mount helper where none is, or where a checkout's
link is, and never touches a node's own helper."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "link-mount-helper.sh"
#: The helper the script links: the checkout's own venv's.
OURS = SCRIPT.parents[1].resolve() / ".venv" / "bin" / "mount.fuse.tierfs"

pytestmark = pytest.mark.skipif(
    not OURS.exists(),
    reason="no .venv/bin/mount.fuse.tierfs in this checkout: run scripts/install.sh",
)


def link(helper: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(helper)], capture_output=True, text=True, timeout=30
    )


def ours() -> str:
    return str(OURS)


def test_a_missing_helper_is_linked(tmp_path: Path) -> None:
    helper = tmp_path / "mount.fuse.tierfs"
    done = link(helper)
    assert done.returncode == 0, done.stderr
    assert os.readlink(helper) == ours()


def test_a_dangling_link_and_another_checkouts_link_are_replaced(tmp_path: Path) -> None:
    helper = tmp_path / "mount.fuse.tierfs"
    helper.symlink_to(tmp_path / "gone" / ".venv" / "bin" / "mount.fuse.tierfs")
    assert link(helper).returncode == 0
    assert os.readlink(helper) == ours()
    other = tmp_path / "other" / ".venv" / "bin" / "mount.fuse.tierfs"
    other.parent.mkdir(parents=True)
    other.write_text("#!/bin/sh\n")
    helper.unlink()
    helper.symlink_to(other)
    assert link(helper).returncode == 0
    assert os.readlink(helper) == ours()


def test_a_nodes_own_helper_link_is_left_alone(tmp_path: Path) -> None:
    """The README's node setup links /opt/tierfs/bin/mount.fuse.tierfs."""
    node_helper = tmp_path / "opt" / "tierfs" / "bin" / "mount.fuse.tierfs"
    node_helper.parent.mkdir(parents=True)
    node_helper.write_text("#!/bin/sh\n")
    helper = tmp_path / "mount.fuse.tierfs"
    helper.symlink_to(node_helper)
    done = link(helper)
    assert done.returncode == 0, done.stderr
    assert os.readlink(helper) == str(node_helper), "a node's helper was re-pointed"
    assert "left as it is" in done.stderr


def test_a_helper_file_is_left_alone(tmp_path: Path) -> None:
    helper = tmp_path / "mount.fuse.tierfs"
    helper.write_text("#!/bin/sh\n# a package's helper\n")
    done = link(helper)
    assert done.returncode == 0, done.stderr
    assert not helper.is_symlink()
    assert helper.read_text().endswith("a package's helper\n")
