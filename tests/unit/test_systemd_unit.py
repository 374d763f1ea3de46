"""``systemd/tierfs@.service``: valid for systemd, and what an operator
expects of it (allow_other, reload, ordering, hardening that keeps the
host's mount namespace)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "tierfs@.service"
#: Options that give the service a mount namespace of its own: the FUSE
#: mount would be invisible to the host.
NAMESPACING = (
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ReadOnlyPaths",
    "ReadWritePaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "BindPaths",
    "PrivateMounts",
    "MountFlags",
)


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_unit_mounts_for_user_jobs_reloads_and_comes_before_slurmd() -> None:
    parsed = unit()
    service = parsed["Service"]
    assert "-o allow_other" in service["ExecStart"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Type"] == "notify"
    assert "slurmd.service" in parsed["Unit"]["Before"]
    assert service["NoNewPrivileges"] == "yes"
    present = [key for key in NAMESPACING if key in service]
    assert not present, f"{present} would hide the mount from the host"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """The unit, with this checkout's ``tierfs`` in place of
    /usr/local/bin/tierfs (verify checks that the command exists)."""
    tierfs = Path(sys.executable).parent / "tierfs"
    (tmp_path / UNIT.name).write_text(
        UNIT.read_text().replace("/usr/local/bin/tierfs", str(tierfs))
    )
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "tierfs@data.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
