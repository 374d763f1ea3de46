"""``[[quotas]]`` in the config and in policy files: what loads, and each
bad entry named at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_config import problems_of
from tests.unit.test_config_access_audit import write
from tierfs.config import QuotaConfig, check_file, load_config


def test_quotas_load_from_the_config_and_its_policy_files(tmp_path: Path) -> None:
    (tmp_path / "quotas.toml").write_text(
        '[[quotas]]\npath = "users/bob"\nfiles = 1000\n\n[[rules]]\nmatch = "ckpt/**"\n'
        "keep_newest = 2\n",
        encoding="utf-8",
    )
    text = (
        'policy_files = ["quotas.toml"]\n'
        '[[quotas]]\npath = "/users/alice/"\nbytes = "500GiB"\nname = "alice"\n'
        '[[quotas]]\npath = ""\nbytes = "2TiB"\nwarn_at = "90%"\n'
    )
    # policy_files is a top-level key: it goes before the first table.
    path = write(tmp_path, "")
    path.write_text(text + path.read_text(encoding="utf-8"), encoding="utf-8")
    config = load_config(path)
    assert [(q.path, q.name, q.bytes, q.files, q.warn_at) for q in config.quotas] == [
        ("users/alice", "alice", 500 << 30, None, 0.8),
        ("", None, 2 << 40, None, 0.9),
        ("users/bob", None, None, 1000, 0.8),
    ]
    assert config.quotas[2].source.endswith("quotas.toml:1")
    assert check_file(tmp_path / "quotas.toml") == []


def test_no_quotas_by_default(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).quotas == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('path = "a"', 'the quota on "a" sets no limit: add bytes = "500GiB"'),
        ('path = "a/../b"\nbytes = 5', "has an empty, '.' or '..' segment"),
        ("bytes = 5", 'missing the required key "path"'),
        ('path = "a"\nbytes = 0', "bytes: must be more than zero"),
        ('path = "a"\nfiles = -1', "files: -1 is out of range"),
        ('path = "a"\nfiles = 3\nwarn_at = 1.5', "warn_at: 1.5 is outside (0, 1]"),
        ('path = "a"\nfiles = 3\nname = "a b"', '"a b" is not a simple name'),
        ('path = "a"\nfiles = 3\nlimit = 4', 'unknown key "limit"'),
    ],
)
def test_a_bad_quota_is_named_at_its_line(tmp_path: Path, entry: str, message: str) -> None:
    path = write(tmp_path, f"\n[[quotas]]\n{entry}\n")
    problems = problems_of(path)
    assert len(problems) == 1, problems
    _file, line, sentence = problems[0]
    assert message in sentence
    assert line >= 10


def test_a_directory_has_one_quota_across_files(tmp_path: Path) -> None:
    (tmp_path / "more.toml").write_text('[[quotas]]\npath = "team"\nfiles = 5\n', encoding="utf-8")
    path = write(tmp_path, '\n[[quotas]]\npath = "team/"\nbytes = "1GiB"\n')
    path.write_text('policy_files = ["more.toml"]\n' + path.read_text(encoding="utf-8"))
    (problem,) = problems_of(path)
    assert problem[0].endswith("more.toml")
    assert '"team" already has a quota at' in problem[2]


def test_quota_config_defaults() -> None:
    quota = QuotaConfig(path="x", bytes=1)
    assert (quota.files, quota.warn_at, quota.name) == (None, 0.8, None)
