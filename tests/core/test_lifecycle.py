"""The lifecycle part (``tierfs.core.tiering.lifecycle``) and one mover pass, over a
real bucket (moto), no mount: placement follows renames, pins cover files
created later, and a pass over a full tier demotes the files opened once
before the file opened again, down to the low watermark."""

from __future__ import annotations

import os
from typing import Any

from tests.core.conftest import MiB, put
from tierfs.config import RuleConfig, WriteConfig
from tierfs.errors import Busy
from tierfs.meta import ROOT_INO
from tierfs.workers.wiring import mover_for

NVME, HDD = 0, 1


def data(size: int, seed: int) -> bytes:
    return bytes((i * seed) % 251 for i in range(size))


async def full_first_tier(make_fs: Any, s3_store: Any) -> tuple[Any, dict[str, bytes]]:
    """A mount whose 8 MiB first tier holds eight 1 MiB files read once each
    (above its 90% high mark; low mark 50%), and the files' bodies."""
    bodies = {f"f{i}.bin": data(MiB, i + 2) for i in range(8)}
    for name, body in bodies.items():
        put(s3_store, name, body)
    mount = await make_fs(capacities=(8 * MiB, 32 * MiB), low_watermark=0.5)
    for name in bodies:
        assert await mount.read_file(name) == bodies[name]
    return mount, bodies


async def test_placement_follows_a_rename(make_fs: Any) -> None:
    rule = RuleConfig(match="scratch/**", source="policy.toml:1", place="hdd")
    mount = await make_fs(rules=[rule])
    fs = mount.fs
    for name in (b"scratch", b"other"):
        await fs.mkdir(ROOT_INO, name, 0o755, 0, 0)
    ino = await mount.write_file("scratch/a.bin", data(2 * MiB, 3))
    assert fs.meta.residency(ino) == {HDD: 2 * MiB}
    assert fs.policies.rule_of(ino) is not None

    scratch = await fs.namespace.resolve("scratch")
    other = await fs.namespace.resolve("other")
    await fs.rename(scratch.ino, b"a.bin", other.ino, b"a.bin", 0)
    assert fs.policies.rule_of(ino) is None  # the cached answer went with the rename
    await mount.write_file("other/a.bin", data(2 * MiB, 5))
    assert fs.meta.residency(ino) == {NVME: 2 * MiB}
    assert await mount.read_file("other/a.bin") == data(2 * MiB, 5)


async def test_a_pinned_directory_pins_what_is_created_in_it_later(
    make_fs: Any, s3_store: Any
) -> None:
    put(s3_store, "ds/x.bin", data(3 * MiB, 7))
    mount = await make_fs()
    fs = mount.fs
    pinned = await fs.lifecycle.pin_path("ds", None)
    assert pinned == {
        "path": "ds",
        "tier": "nvme",
        "files": 1,
        "bytes": 3 * MiB,
        "fetched_bytes": 3 * MiB,
    }
    x = await fs.namespace.resolve("ds/x.bin")
    assert fs.policies.pinned_tier(x.ino) == NVME
    assert fs.meta.residency(x.ino) == {NVME: 3 * MiB}
    new = await mount.write_file("ds/new.bin", b"later")
    assert fs.policies.pinned_tier(new) == NVME
    assert (await fs.lifecycle.unpin_path("ds"))["was_pinned"] is True
    assert fs.policies.pinned_tier(new) is None and fs.policies.pinned_tier(x.ino) is None


async def test_a_pass_over_a_full_tier_demotes_files_opened_once_first(
    make_fs: Any, s3_store: Any
) -> None:
    mount, bodies = await full_first_tier(make_fs, s3_store)
    fs = mount.fs
    assert await mount.read_file("f0.bin") == bodies["f0.bin"]  # opened twice: valuable
    assert fs.space.used(NVME) == 8 * MiB  # above the high mark (90%)

    plan = await fs.lifecycle.plan_report()
    demoted = [m["path"] for m in plan["moves"] if m["reason"] == "watermark"]
    assert [m["dst"] for m in plan["moves"]] == ["hdd"] * len(demoted)
    assert demoted == ["f1.bin", "f2.bin", "f3.bin", "f4.bin"], plan  # 8 MiB -> the low mark, 4 MiB
    assert "f0.bin" not in demoted

    mover = mover_for(fs)
    await mover.run_pass()
    assert fs.space.used(NVME) <= 4 * MiB, mover.status
    f0 = await fs.namespace.resolve("f0.bin")
    assert fs.meta.residency(f0.ino) == {NVME: MiB}
    status = mover.status
    assert status.files_moved == 4 and status.bytes_moved == 4 * MiB, status
    for name, body in bodies.items():
        assert await mount.read_file(name) == body


async def test_a_pass_whose_move_was_skipped_is_followed_down_to_the_low_mark(
    make_fs: Any, s3_store: Any
) -> None:
    """The first pass finds one file busy (as an upload running after a
    remount would make it) and skips it, which leaves the tier between its
    marks.  The tier is still draining, so the next pass goes on down to the
    low mark instead of stopping because it is no longer above high."""
    mount, bodies = await full_first_tier(make_fs, s3_store)
    fs = mount.fs
    assert fs.space.used(NVME) == 8 * MiB  # above the high mark (90%)

    mover = mover_for(fs)
    relocate = mover.movement.relocate
    busy_once: list[int] = []

    async def busy_for_the_first_file(ino: int, *args: Any, **kwargs: Any) -> int:
        if not busy_once:
            busy_once.append(ino)
            raise Busy("an upload of it is running")
        return await relocate(ino, *args, **kwargs)

    mover.movement.relocate = busy_for_the_first_file  # type: ignore[method-assign]
    await mover.run_pass()
    assert len(busy_once) == 1 and mover.status.skipped == 1
    assert 4 * MiB < fs.space.used(NVME) <= int(0.9 * 8 * MiB)  # between the marks
    assert fs.lifecycle.needs_pass()
    assert fs.lifecycle.tier_usage()[NVME].must_drain

    await mover.run_pass()
    assert fs.space.used(NVME) <= 4 * MiB, mover.status
    assert fs.meta.residency(busy_once[0]) == {HDD: MiB}  # planned again, moved this time
    assert not fs.lifecycle.tier_usage()[NVME].must_drain
    for name, body in bodies.items():
        assert await mount.read_file(name) == body


async def test_show_warns_about_pins_larger_than_their_tier(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "val/big.bin", data(3 * MiB, 11))
    put(s3_store, "val/more.bin", data(6 * MiB, 13))
    rules = [
        RuleConfig(match="val/**", source="policy.toml:1", pin=True),
        RuleConfig(match="val/x/*", source="policy.toml:4", cache=False),
    ]
    mount = await make_fs(rules=rules)
    fs = mount.fs
    await fs.namespace.resolve("val/big.bin")  # the node knows both files now
    shown = await fs.lifecycle.show()
    assert [(r["match"], r["source"]) for r in shown["rules"]] == [
        ("val/**", "policy.toml:1"),
        ("val/x/*", "policy.toml:4"),
    ]
    assert shown["rules"][0]["settings"] == {"pin": True}
    warnings = shown["warnings"]
    assert any("policy.toml:4" in w and "can never match" in w for w in warnings), warnings
    assert any(
        "9437184 bytes" in w and "tier nvme" in w and "policy.toml:1" in w for w in warnings
    ), warnings


async def test_where_of_a_directory_totals_its_subtree(make_fs: Any, s3_store: Any) -> None:
    put(s3_store, "ds/a/x.bin", data(2 * MiB, 3))
    put(s3_store, "ds/a/deeper/y.bin", data(MiB, 5))
    put(s3_store, "ds/z.bin", data(3 * MiB, 7))
    put(s3_store, "elsewhere.bin", data(MiB, 9))
    mount = await make_fs(
        capacities=(16 * MiB, 16 * MiB),
        write=WriteConfig(mode="back", upload_delay=600.0, part_size=8 * MiB),
    )
    fs = mount.fs
    # Nothing listed or read yet: the totals come from the bucket's listing.
    tree = await fs.where("ds")
    assert tree == {
        "path": "ds",
        "type": "directory",
        "files": 3,
        "size": 6 * MiB,
        "cached_bytes": 0,
        "tiers": {"nvme": 0, "hdd": 0},
        "state": "clean",
        "dirty_files": 0,
        "dirty_bytes": 0,
        "pinned_files": 0,
        "failed_files": 0,
        "dirs_not_listed": 0,
    }
    assert await mount.read_file("ds/a/x.bin") == data(2 * MiB, 3)
    await mount.write_file("ds/a/new.bin", b"n" * 1000)  # not uploaded (upload_delay)
    await fs.lifecycle.pin_path("ds/a/deeper", None)
    tree = await fs.where("ds")
    assert tree["files"] == 4 and tree["size"] == 6 * MiB + 1000
    assert tree["tiers"] == {"nvme": 3 * MiB + 1000, "hdd": 0}, tree
    assert tree["cached_bytes"] == 3 * MiB + 1000
    assert (tree["state"], tree["dirty_files"], tree["dirty_bytes"]) == ("dirty", 1, 1000)
    assert tree["pinned_files"] == 1
    root = await fs.where("")
    assert root["files"] == 5 and root["size"] == 7 * MiB + 1000


async def test_pin_of_a_file_open_for_writing_names_it_and_leaves_it(
    make_fs: Any, caplog: Any
) -> None:
    """A pin cannot move a file a writer holds open: the pin still applies,
    the log names the file by its path, and the mover brings it up later."""
    rule = RuleConfig(match="ds/**", source="policy.toml:1", place="hdd")
    mount = await make_fs(rules=[rule])
    fs = mount.fs
    await fs.mkdir(ROOT_INO, b"ds", 0o755, 0, 0)
    ino = await mount.write_file("ds/w.bin", data(MiB, 3))
    assert fs.meta.residency(ino) == {HDD: MiB}
    opened = await fs.open(ino, os.O_WRONLY)
    try:
        caplog.set_level("INFO", logger="tierfs.core.tiering.lifecycle")
        pinned = await fs.lifecycle.pin_path("ds", "nvme")
        assert pinned["files"] == 1 and fs.policies.pinned_tier(ino) == NVME
        assert fs.meta.residency(ino) == {HDD: MiB}
        assert any(
            "pin: ds/w.bin stays where it is for now" in r.getMessage() for r in caplog.records
        )
    finally:
        await fs.release(opened.fh)
