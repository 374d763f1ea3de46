"""``tierfs policy check``: errors at file:line, and rules that can never match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tierfs.cli import main
from tierfs.pin_sizes import literal_dir

MiB = 1 << 20


def test_a_shadowed_rule_is_a_warning_with_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rules]]\nmatch = "data/**"\npin = true\n\n[[rules]]\nmatch = "data/x/*"\npromote = "never"\n'
    )
    assert main(["policy", "check", str(policy)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok"
    assert f"{policy}:5: warning: this rule can never match" in err, err
    assert f"{policy}:1" in err


def test_a_broken_policy_file_fails_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nmatch = "data/**"\nevict_afterr = "3d"\n')
    assert main(["policy", "check", str(policy)]) == 1
    _, err = capsys.readouterr()
    assert f"{policy}:3:" in err and "evict_after" in err, err


def test_independent_rules_give_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rules]]\nmatch = "a/**"\npin = true\n\n[[rules]]\nmatch = "b/*"\ncache = false\n'
    )
    assert main(["policy", "check", str(policy)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok" and err == ""


CONFIG = """\
[backing]
url = "{url}"
{endpoint}
[state]
dir = "state"

[[tiers]]
name = "nvme"
path = "nvme"
capacity = "3MiB"

[[tiers]]
name = "hdd"
path = "hdd"
capacity = "64MiB"

[[rules]]
match = "ckpt/**"
pin = true

[[rules]]
match = "data/*/shard-*"
pin = true
place = "hdd"
"""


def _put(s3_client: Any, bucket: str, key: str, size: int) -> None:
    s3_client.put_object(Bucket=bucket, Key=key, Body=b"x" * size)


def test_a_pin_larger_than_its_tier_in_the_bucket_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket: tuple[str, str], s3_client: Any
) -> None:
    endpoint, name = bucket
    (tmp_path / "nvme").mkdir()
    (tmp_path / "hdd").mkdir()
    for i in range(4):  # 4 MiB under ckpt/: more than nvme's 3 MiB
        _put(s3_client, name, f"pre/ckpt/step-{i}/model.pt", MiB)
    _put(s3_client, name, "pre/data/a/shard-0", 2 * MiB)  # 2 MiB on hdd: fits
    _put(s3_client, name, "pre/other/big.bin", 8 * MiB)  # no pin
    config = tmp_path / "tierfs.toml"
    config.write_text(
        CONFIG.format(url=f"s3://{name}/pre/", endpoint=f'endpoint_url = "{endpoint}"')
    )
    assert main(["policy", "check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok"
    assert f"{config}:17: warning: the pin 'ckpt/**' covers" in err, err
    assert "more than tier nvme holds (3145728 bytes)" in err, err
    assert "shard" not in err, err  # the pin on hdd fits

    # The same files, with a first tier large enough: no warning.
    config.write_text(config.read_text().replace('capacity = "3MiB"', 'capacity = "5MiB"'))
    assert main(["policy", "check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok" and err == "", err


def test_pin_sizes_of_a_local_backing_and_an_unreachable_bucket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nvme").mkdir()
    (tmp_path / "hdd").mkdir()
    backing = tmp_path / "bucket"
    (backing / "ckpt").mkdir(parents=True)
    (backing / "ckpt" / "a.pt").write_bytes(b"x" * (4 * MiB))
    config = tmp_path / "tierfs.toml"
    config.write_text(CONFIG.format(url=backing.as_uri(), endpoint=""))
    assert main(["policy", "check", str(config)]) == 0
    _, err = capsys.readouterr()
    assert "the pin 'ckpt/**' covers 4194304 bytes" in err, err

    # A bucket that cannot be listed: a note, and the file is still valid.
    config.write_text(CONFIG.format(url=(tmp_path / "nowhere").as_uri(), endpoint=""))
    assert main(["policy", "check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "ok"
    assert "note: pin sizes not checked" in err, err


def test_literal_dir_of_globs() -> None:
    assert literal_dir("ckpt/**") == "ckpt/"
    assert literal_dir("data/*/shard-*") == "data/"
    assert literal_dir("**/*.pt") == ""
    assert literal_dir("datasets/imagenet") == "datasets/"
    assert literal_dir("a/b/c.bin") == "a/b/"


EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


def test_the_shipped_config_checks_offline_but_not_off_the_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Off the node the tier directories do not exist: a plain check says
    so at their lines; ``--offline`` checks the file alone."""
    config = EXAMPLES / "tierfs.toml"
    assert main(["policy", "check", str(config)]) == 1
    _, err = capsys.readouterr()
    assert "the tier path" in err and "does not exist" in err, err
    assert main(["policy", "check", "--offline", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok (offline") and err == "", (out, err)


def test_policy_check_json_gives_problems_and_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nmatch = "data/**"\nevict_afterr = "3d"\n')
    assert main(["policy", "check", "--json", str(policy)]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["ok"] is False and err == ""
    (problem,) = doc["problems"]
    assert (problem["file"], problem["line"]) == (str(policy), 3)
    assert "evict_after" in problem["message"]

    policy.write_text('[[rules]]\nmatch = "a/**"\npin = true\n\n[[rules]]\nmatch = "a/b"\n')
    assert main(["policy", "check", "--json", "--offline", str(policy)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["offline"] is True and doc["problems"] == []
    (warning,) = doc["warnings"]
    assert f"{policy}:5: warning: this rule can never match" in warning
