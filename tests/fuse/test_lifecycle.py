"""Real mount: the lifecycle rules and the mover, through the CLI.

Small tiers (configured capacities, 1 MiB blocks) and the lifecycle's test
clock (``TIERFS_TEST_CLOCK_FILE``, see ``tierfs.core.state.clock``): a test moves
the daemon's lifecycle clock days ahead instead of sleeping.  Each rule key
of the contract (``place``, ``keep_newest``, ``demote_after``,
``evict_after``, ``pin``, ``promote``, ``cache``) shows its effect here, and
the ``evict``, ``pin``, ``unpin`` and ``policy show|plan|reload`` commands
are run as an operator runs them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.fuse.conftest import Mount, MountFactory, drop_page_cache, run_tierfs, wait_until

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
DAY = 86400.0
#: The mover checks the tiers every second.
FAST_MOVER = '[mover]\ninterval = "1s"\n'
#: The mover's periodic check never comes during a test.
IDLE_MOVER = '[mover]\ninterval = "1h"\n'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_sha(path: Path) -> str:
    return sha(path.read_bytes())


def on_tier(m: Mount, name: str, tier: str) -> int:
    return int(m.where_one(name)["tiers"][tier])


def tier_status(m: Mount, tier: str) -> dict[str, Any]:
    (found,) = [t for t in m.status()["tiers"] if t["name"] == tier]
    return found


def cli_json(*args: str) -> Any:
    done = run_tierfs(*args, "--json")
    assert done.returncode == 0, f"tierfs {' '.join(args)} failed: {done.stderr.strip()}"
    return json.loads(done.stdout)


class LifecycleClock:
    """The daemon's lifecycle clock, moved by writing an offset file."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self.offset = 0.0
        monkeypatch.setenv("TIERFS_TEST_CLOCK_FILE", str(path))

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        self.path.write_text(f"{self.offset}\n")


@pytest.fixture
def lifecycle_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LifecycleClock:
    return LifecycleClock(tmp_path / "clock-offset", monkeypatch)


def set_mover_interval(m: Mount, interval: str) -> None:
    text = m.config_path.read_text()
    start = text.index("[mover]")
    end = text.index("\n", text.index("interval", start))
    m.config_path.write_text(text[:start] + f'[mover]\ninterval = "{interval}"' + text[end:])


# --- watermarks ---------------------------------------------------------------------------------


def test_watermark_demotion_reaches_the_low_mark_least_valuable_first(mount: MountFactory) -> None:
    bodies = {f"f{i}.bin": os.urandom(MiB) for i in range(7)}  # 7 of 8 MiB: above 80%
    # The reads in listing order set the LRU order: no directory readahead.
    m = mount(
        bodies,
        nvme="8MiB",
        hdd="64MiB",
        watermarks={"nvme": (0.8, 0.5)},
        extra_config=IDLE_MOVER,
        dir_readahead=0,
    )
    for name in sorted(bodies):  # f0 is the least recently used
        assert read_sha(m.path / name) == sha(bodies[name])
    nvme = tier_status(m, "nvme")
    assert nvme["used"] == 7 * MiB, nvme

    # The dry run names the moves before the mover makes them.
    plan = cli_json("policy", "plan", str(m.path))
    watermark = [r for r in plan["summary"] if r["reason"] == "watermark"]
    assert watermark and all(r["src"] == "nvme" and r["dst"] == "hdd" for r in watermark), plan
    planned = {Path(move["path"]).name for move in plan["moves"] if move["reason"] == "watermark"}
    assert {"f0.bin", "f1.bin", "f2.bin"} <= planned, plan
    assert "f6.bin" not in planned, plan
    assert sum(r["bytes"] for r in watermark) >= 3 * MiB, plan
    assert on_tier(m, "f0.bin", "nvme") == MiB  # nothing moved yet: it was a dry run

    set_mover_interval(m, "1s")
    m.remount()
    assert wait_until(lambda: tier_status(m, "nvme")["used"] <= 4 * MiB, 30), m.status()
    assert on_tier(m, "f0.bin", "hdd") == MiB and on_tier(m, "f0.bin", "nvme") == 0
    assert on_tier(m, "f6.bin", "nvme") == MiB
    mover = m.status()["mover"]
    assert mover["bytes_moved"] >= 3 * MiB and mover["files_moved"] >= 3, mover
    drop_page_cache()
    for name, body in bodies.items():
        assert read_sha(m.path / name) == sha(body), name
    for item in m.where(*bodies):
        assert sum(item["tiers"].values()) == item["cached_bytes"] <= item["size"], item


# --- age rules and promotion -----------------------------------------------------------------------


def test_demote_after_and_promotion_on_access(
    mount: MountFactory, lifecycle_clock: LifecycleClock
) -> None:
    rules = (
        FAST_MOVER
        + '[[rules]]\nmatch = "cold/**"\ndemote_after = "3d"\npromote = "never"\n\n'
        + '[[rules]]\nmatch = "**"\ndemote_after = "3d"\n'
    )
    bodies = {"cold/a.bin": os.urandom(2 * MiB), "warm/b.bin": os.urandom(2 * MiB)}
    m = mount(bodies, nvme="16MiB", hdd="64MiB", extra_config=rules)
    for name, body in bodies.items():
        assert read_sha(m.path / name) == sha(body)
        assert on_tier(m, name, "nvme") == 2 * MiB

    lifecycle_clock.advance(2 * DAY)  # younger than demote_after: nothing moves
    plan = cli_json("policy", "plan", str(m.path))
    assert not [mv for mv in plan["moves"] if mv["reason"] == "age"], plan

    lifecycle_clock.advance(2 * DAY)
    for name in bodies:
        assert wait_until(lambda n=name: on_tier(m, n, "hdd") == 2 * MiB, 30), m.where(name)
        assert on_tier(m, name, "nvme") == 0

    drop_page_cache()
    for name, body in bodies.items():
        assert read_sha(m.path / name) == sha(body)
    # promote = "on_access" (the default) copies the read file back up, in the
    # background; promote = "never" leaves it where it is.
    assert wait_until(lambda: on_tier(m, "warm/b.bin", "nvme") == 2 * MiB, 30), m.where(
        "warm/b.bin"
    )
    assert on_tier(m, "warm/b.bin", "hdd") == 0
    assert on_tier(m, "cold/a.bin", "hdd") == 2 * MiB
    assert on_tier(m, "cold/a.bin", "nvme") == 0


def test_evict_after_drops_clean_copies_and_the_file_still_reads(
    mount: MountFactory, lifecycle_clock: LifecycleClock
) -> None:
    rules = FAST_MOVER + '[[rules]]\nmatch = "datasets/**"\nevict_after = "14d"\n'
    body = os.urandom(3 * MiB)
    m = mount({"datasets/x.bin": body, "other.bin": body}, extra_config=rules)
    for name in ("datasets/x.bin", "other.bin"):
        assert read_sha(m.path / name) == sha(body)
    (m.path / "datasets" / "new.bin").write_bytes(b"not uploaded yet")
    lifecycle_clock.advance(15 * DAY)
    assert wait_until(lambda: m.where_one("datasets/x.bin")["cached_bytes"] == 0, 30)
    assert m.where_one("other.bin")["cached_bytes"] == 3 * MiB  # no rule: kept
    drop_page_cache()
    assert read_sha(m.path / "datasets" / "x.bin") == sha(body)
    assert (m.path / "datasets" / "new.bin").read_bytes() == b"not uploaded yet"


# --- keep_newest ------------------------------------------------------------------------------------


def test_keep_newest_keeps_the_latest_checkpoints_on_nvme(mount: MountFactory) -> None:
    rules = IDLE_MOVER + '[[rules]]\nmatch = "checkpoints/*"\nkeep_newest = 2\n'
    other = os.urandom(MiB)
    m = mount(
        {"other.bin": other},
        nvme="8MiB",
        hdd="64MiB",
        watermarks={"nvme": (0.8, 0.5)},
        extra_config=rules,
        upload_delay="0.2s",
    )
    assert read_sha(m.path / "other.bin") == sha(other)  # read first: LRU would drop it first
    checkpoints = {}
    for step in range(1, 5):
        directory = m.path / "checkpoints" / f"step-{step}"
        directory.mkdir(parents=True)
        body = os.urandom(3 * MiB // 2)
        (directory / "model.pt").write_bytes(body)
        os.utime(directory / "model.pt", (1_700_000_000 + step * 3600,) * 2)
        checkpoints[f"checkpoints/step-{step}/model.pt"] = body
    assert tier_status(m, "nvme")["used"] == 7 * MiB

    plan = cli_json("policy", "plan", str(m.path))
    moved = {mv["path"] for mv in plan["moves"] if mv["src"] == "nvme"}
    assert any("step-1" in p for p in moved) and any("step-2" in p for p in moved), plan
    assert not any("step-3" in p or "step-4" in p or "other.bin" in p for p in moved), plan
    assert {mv["reason"] for mv in plan["moves"] if "step-1" in mv["path"]} == {"keep_newest"}

    set_mover_interval(m, "1s")
    m.remount()
    assert wait_until(lambda: tier_status(m, "nvme")["used"] <= 4 * MiB, 30), m.status()
    for step, tier in ((1, "hdd"), (2, "hdd"), (3, "nvme"), (4, "nvme")):
        name = f"checkpoints/step-{step}/model.pt"
        assert on_tier(m, name, tier) == 3 * MiB // 2, (name, m.where_one(name))
    assert on_tier(m, "other.bin", "nvme") == MiB
    drop_page_cache()
    for name, body in checkpoints.items():
        assert read_sha(m.path / name) == sha(body), name


# --- pins ---------------------------------------------------------------------------------------------


def test_pin_fetches_keeps_under_pressure_and_survives_a_remount(mount: MountFactory) -> None:
    bodies = {"pinned/big.bin": os.urandom(3 * MiB)}
    bodies.update({f"fill{i}.bin": os.urandom(MiB) for i in range(5)})
    m = mount(
        bodies, nvme="8MiB", hdd="64MiB", watermarks={"nvme": (0.8, 0.5)}, extra_config=FAST_MOVER
    )

    pinned = cli_json("pin", str(m.path / "pinned"))
    assert pinned[0]["tier"] == "nvme" and pinned[0]["fetched_bytes"] == 3 * MiB, pinned
    item = m.where_one("pinned/big.bin")
    assert item["pinned"] is True and item["tiers"]["nvme"] == 3 * MiB, item

    for i in range(5):  # 8 MiB on an 8 MiB tier: the mover must demote
        assert read_sha(m.path / f"fill{i}.bin") == sha(bodies[f"fill{i}.bin"])
    assert wait_until(lambda: tier_status(m, "nvme")["used"] <= 4 * MiB, 30), m.status()
    assert on_tier(m, "pinned/big.bin", "nvme") == 3 * MiB

    evicted = run_tierfs("evict", str(m.path / "pinned" / "big.bin"))
    assert evicted.returncode == 0, evicted.stderr
    assert "pinned" in evicted.stderr and "big.bin" in evicted.stderr, evicted.stderr
    assert on_tier(m, "pinned/big.bin", "nvme") == 3 * MiB

    m.remount()
    item = m.where_one("pinned/big.bin")
    assert item["pinned"] is True and item["tiers"]["nvme"] == 3 * MiB, item

    unpinned = cli_json("unpin", str(m.path / "pinned"))
    assert unpinned[0]["was_pinned"] is True, unpinned
    assert m.where_one("pinned/big.bin")["pinned"] is False
    done = cli_json("evict", str(m.path / "pinned"))
    assert done[0]["evicted_bytes"] == 3 * MiB, done
    assert m.where_one("pinned/big.bin")["cached_bytes"] == 0
    assert read_sha(m.path / "pinned" / "big.bin") == sha(bodies["pinned/big.bin"])


def test_evict_drops_clean_copies_and_names_dirty_files(mount: MountFactory) -> None:
    body = os.urandom(2 * MiB)
    m = mount({"clean.bin": body}, upload_delay="600s", extra_config=IDLE_MOVER)
    assert read_sha(m.path / "clean.bin") == sha(body)
    (m.path / "dirty.bin").write_bytes(b"only here")
    done = run_tierfs("evict", "--json", str(m.path))
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["evicted_bytes"] == 2 * MiB, result
    assert [Path(s["path"]).name for s in result["skipped"]] == ["dirty.bin"], result
    assert "dirty.bin" in done.stderr and "not uploaded" in done.stderr, done.stderr
    assert m.where_one("clean.bin")["cached_bytes"] == 0
    assert (m.path / "dirty.bin").read_bytes() == b"only here"

    bad = run_tierfs("evict", "--tier", "ssd", str(m.path / "clean.bin"))
    assert bad.returncode == 1 and "ssd" in bad.stderr and "nvme" in bad.stderr, bad.stderr


# --- placement and cache = false ----------------------------------------------------------------------


def test_place_puts_new_and_fetched_data_on_the_named_tier(mount: MountFactory) -> None:
    rules = IDLE_MOVER + '[[rules]]\nmatch = "scratch/**"\nplace = "hdd"\n'
    fetched = os.urandom(2 * MiB)
    m = mount(
        {"scratch/old.bin": fetched, "normal.bin": fetched}, extra_config=rules, upload_delay="600s"
    )
    written = os.urandom(3 * MiB)
    (m.path / "scratch" / "new.bin").write_bytes(written)
    assert read_sha(m.path / "scratch" / "old.bin") == sha(fetched)
    assert read_sha(m.path / "normal.bin") == sha(fetched)
    assert (
        on_tier(m, "scratch/new.bin", "hdd") == 3 * MiB
        and on_tier(m, "scratch/new.bin", "nvme") == 0
    )
    assert (
        on_tier(m, "scratch/old.bin", "hdd") == 2 * MiB
        and on_tier(m, "scratch/old.bin", "nvme") == 0
    )
    assert on_tier(m, "normal.bin", "nvme") == 2 * MiB


def test_cache_false_streams_and_keeps_nothing(mount: MountFactory) -> None:
    rules = IDLE_MOVER + '[[rules]]\nmatch = "stream/**"\ncache = false\n'
    body = os.urandom(5 * MiB + 123)
    m = mount({"stream/big.bin": body}, extra_config=rules)
    before = m.counters()["fetched_bytes"]
    assert read_sha(m.path / "stream" / "big.bin") == sha(body)
    assert m.where_one("stream/big.bin")["cached_bytes"] == 0
    assert m.counters()["fetched_bytes"] - before >= len(body)
    assert all(t["used"] == 0 for t in m.status()["tiers"]), m.status()


# --- policy show / reload ---------------------------------------------------------------------------


def test_policy_reload_rejects_a_broken_file_and_keeps_the_old_rules(mount: MountFactory) -> None:
    m = mount(do_mount=False, extra_config=IDLE_MOVER)
    # policy_files is a top-level key: it comes before the first table.
    m.config_path.write_text('policy_files = ["policy.toml"]\n' + m.config_path.read_text())
    policy = m.config_path.parent / "policy.toml"
    policy.write_text('[[rules]]\nmatch = "datasets/**"\npin = true\n')
    m.mount()

    shown = cli_json("policy", "show", str(m.path))
    assert [(r["match"], r["source"]) for r in shown["rules"]] == [
        ("datasets/**", f"{policy}:1")
    ], shown

    policy.write_text('[[rules]]\nmatch = "datasets/**"\npinn = true\n')
    done = run_tierfs("policy", "reload", str(m.path))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"{policy}:3:" in done.stderr and "pinn" in done.stderr, done.stderr
    shown = cli_json("policy", "show", str(m.path))
    assert [r["match"] for r in shown["rules"]] == ["datasets/**"], shown  # old rules stay

    policy.write_text('[[rules]]\nmatch = "checkpoints/*"\nkeep_newest = 3\n')
    os.kill(m.pids[-1], signal.SIGHUP)
    assert wait_until(
        lambda: (
            [r["match"] for r in cli_json("policy", "show", str(m.path))["rules"]]
            == ["checkpoints/*"]
        ),
        10,
    ), m.log_tail()
    done = run_tierfs("policy", "reload", str(m.path))
    assert done.returncode == 0 and "1 rules" in done.stdout, (done.stdout, done.stderr)


def test_pin_rule_protects_under_pressure(mount: MountFactory) -> None:
    rules = FAST_MOVER + '[[rules]]\nmatch = "val/**"\npin = true\n'
    bodies = {"val/v.bin": os.urandom(3 * MiB)}
    bodies.update({f"fill{i}.bin": os.urandom(MiB) for i in range(5)})
    m = mount(bodies, nvme="8MiB", hdd="64MiB", watermarks={"nvme": (0.8, 0.5)}, extra_config=rules)
    assert read_sha(m.path / "val" / "v.bin") == sha(bodies["val/v.bin"])  # the oldest access
    for i in range(5):
        assert read_sha(m.path / f"fill{i}.bin") == sha(bodies[f"fill{i}.bin"])
    assert wait_until(lambda: tier_status(m, "nvme")["used"] <= 4 * MiB, 30), m.status()
    item = m.where_one("val/v.bin")
    assert item["pinned"] is True and item["tiers"]["nvme"] == 3 * MiB, item


def test_write_through_rule_makes_close_wait_for_the_bucket(mount: MountFactory) -> None:
    rules = IDLE_MOVER + '[[rules]]\nmatch = "important/**"\nwrite = "through"\n'
    m = mount(upload_delay="600s", extra_config=rules)
    (m.path / "important").mkdir()
    body = os.urandom(MiB + 17)
    (m.path / "important" / "ckpt.pt").write_bytes(body)  # returns after the upload
    got = m.s3.get_object(Bucket=m.bucket, Key=m.key("important/ckpt.pt"))["Body"].read()
    assert sha(got) == sha(body)
    (m.path / "other.bin").write_bytes(b"not yet")  # no rule: upload_delay applies
    assert m.where_one("other.bin")["state"] == "dirty"
    listed = m.s3.list_objects_v2(Bucket=m.bucket, Prefix=m.key("other.bin"))
    assert listed.get("KeyCount", 0) == 0
