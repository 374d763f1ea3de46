"""``[access]`` (an access point) and ``[audit]`` in the config: what loads,
and each bad value named at its line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.unit.test_config import line_of, only_problem
from tierfs.config import AccessConfig, AuditConfig, load_config

BASE = """\
[backing]
url = "{url}"

[state]
dir = "{state}"

[[tiers]]
name = "nvme"
path = "{nvme}"
"""


def write(tmp_path: Path, text: str, url: str = "s3://bucket/team") -> Path:
    (tmp_path / "nvme").mkdir(exist_ok=True)
    body = BASE.format(url=url, state=tmp_path / "state", nvme=tmp_path / "nvme") + text
    path = tmp_path / "tierfs.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("url", "effective"),
    [
        ("s3://bucket/team", "s3://bucket/team/users/alice"),
        ("s3://bucket", "s3://bucket/users/alice"),
        ("file:///srv/bucket", "file:///srv/bucket/users/alice"),
    ],
)
def test_an_access_root_is_added_to_the_backing_url(
    tmp_path: Path, url: str, effective: str
) -> None:
    text = '[access]\nroot = "users/alice/"\nuid = 1000\ngid = 100\numask = "0027"\n'
    config = load_config(write(tmp_path, text, url))
    assert config.backing.url == effective
    assert config.access == AccessConfig(
        root="users/alice", uid=1000, gid=100, umask=0o027, read_only=False
    )


def test_no_access_point_and_no_audit_by_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.backing.url == "s3://bucket/team"
    assert config.access == AccessConfig()
    assert config.audit == AuditConfig() and not config.audit.enabled


@pytest.mark.parametrize(
    ("text", "needle", "sentence"),
    [
        (
            '[access]\nroot = "users/../bob"\n',
            "root =",
            "root: the access root \"users/../bob\" has an empty, '.' or '..' segment; an "
            "access point must name one directory below the prefix",
        ),
        (
            '[access]\nroot = "/users/alice"\n',
            "root =",
            'root: "/users/alice" is not a directory of the bucket; write it relative to the '
            'backing url\'s prefix, like "users/alice"',
        ),
        (
            '[access]\nroot = "users/alice"\numask = "0999"\n',
            "umask =",
            None,
        ),
        (
            "[audit]\nreads = true\n",
            "[audit]",
            'the [audit] table has no path: add path = "/var/log/tierfs/NAME.audit.jsonl" '
            "to turn the audit log on, or remove the table",
        ),
    ],
)
def test_bad_values_are_named_at_their_line(
    tmp_path: Path, text: str, needle: str, sentence: str | None
) -> None:
    path = write(tmp_path, text)
    _file, line, message = only_problem(path)
    assert line == line_of(path.read_text(), needle)
    if sentence is not None:
        assert message == sentence


def test_an_audit_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[audit]\npath = "logs/a.jsonl"\nreads = true\n'))
    assert config.audit == AuditConfig(path=tmp_path / "logs/a.jsonl", reads=True)


def test_an_access_point_names_shared_blocks_as_a_full_mount_does() -> None:
    """A block in the shared tier is named by its object's full URL: an
    access point (its backing URL names a directory, its keys are below
    it) reads what full mounts of the bucket put there, and the reverse."""
    from tierfs.core.read.sharedtier import SharedTier

    def tier(url: str) -> SharedTier:
        return SharedTier("cluster", None, url, 4 << 20)  # type: ignore[arg-type]

    full = tier("s3://bucket/team").block_key("users/alice/x.bin", '"etag-1"', 3)
    access = tier("s3://bucket/team/users/alice").block_key("x.bin", '"etag-1"', 3)
    assert full is not None and full == access
    assert tier("s3://bucket/team").block_key("users/bob/x.bin", '"etag-1"', 3) != full
