"""The shared tier in the config: a ``[[tiers]]`` entry with ``url``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.unit.test_config import line_of, only_problem
from tierfs.config import SharedTierConfig, check_file, load_config

LOCAL = """\
[backing]
url = "s3://bucket"

[state]
dir = "{state}"

[[tiers]]
name = "nvme"
path = "{nvme}"
"""

SHARED = """
[[tiers]]
name = "cluster"
url = "s3://near-bucket/tierfs"
endpoint_url = "http://10.0.0.5:8333"
"""


@pytest.fixture
def local(tmp_path: Path) -> str:
    (tmp_path / "nvme").mkdir()
    return LOCAL.format(state=tmp_path / "state", nvme=tmp_path / "nvme")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tierfs.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_shared_tier_after_the_local_ones_loads(tmp_path: Path, local: str) -> None:
    text = local + SHARED + 'region = "eu-west-1"\nprofile = "near"\ntimeout = "500ms"\n'
    config = load_config(write(tmp_path, text))
    assert [t.name for t in config.tiers] == ["nvme"]
    assert config.shared_tier == SharedTierConfig(
        name="cluster",
        url="s3://near-bucket/tierfs",
        endpoint_url="http://10.0.0.5:8333",
        region="eu-west-1",
        profile="near",
        timeout=0.5,
    )


def test_no_shared_tier_by_default(tmp_path: Path, local: str) -> None:
    assert load_config(write(tmp_path, local)).shared_tier is None


@pytest.mark.parametrize(
    ("extra", "needle", "sentence"),
    [
        (
            '[[tiers]]\nname = "c"\nurl = "file:///srv/x"\n',
            "url =",
            'url: "file:///srv/x" is not an s3:// URL; a shared tier is a bucket: '
            'url = "s3://bucket/prefix" (a local tier has a path instead)',
        ),
        (
            '[[tiers]]\nname = "c"\nurl = "s3://near"\npath = "/tmp"\n',
            'path = "/tmp"',
            "a tier has a path (a local tier) or a url (the shared tier), not both",
        ),
        (
            '[[tiers]]\nname = "nvme"\nurl = "s3://near"\n',
            'name = "nvme"',
            'the tier name "nvme" is already used by the tier at line 8; tier names must be unique',
        ),
        (
            '[[tiers]]\nname = "c"\nurl = "s3://near"\ncapacity = "1TiB"\n',
            "capacity",
            None,  # an unknown key of a shared tier: named, with the keys it has
        ),
    ],
)
def test_bad_shared_tiers_are_reported_at_their_line(
    tmp_path: Path, local: str, extra: str, needle: str, sentence: str | None
) -> None:
    text = local + "\n" + extra
    path = write(tmp_path, text)
    _file, line, said = only_problem(path)
    assert line == line_of(text, needle, text.count(needle)), said
    if sentence is not None:
        assert said == sentence
    else:
        assert "capacity" in said


def test_at_most_one_shared_tier_and_after_the_local_ones(tmp_path: Path, local: str) -> None:
    second = SHARED.replace("cluster", "other")
    text = local + SHARED + second
    problems = check_file(write(tmp_path, text))
    assert [p[2] for p in problems] == [
        f"a second shared tier; there is one at line {line_of(text, 'near-bucket')}, "
        "and at most one is allowed"
    ]
    late = local.replace("[[tiers]]", SHARED.strip() + "\n\n[[tiers]]", 1)
    problems = check_file(write(tmp_path, late))
    assert [p[2] for p in problems] == [
        f"a local tier after the shared tier (line {line_of(late, 'near-bucket')}); "
        "the shared tier comes after the local tiers"
    ]
