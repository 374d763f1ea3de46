"""Through a real mount: a rename onto an existing clean name while the
renamed file's upload runs keeps the file, on the mount and in the bucket.

The daemon talks to moto through the ``fault_proxy``, which holds the PUT
of ``dd`` until the rename is done and the DELETE of the replaced ``é x``
long enough for a retried upload to overtake it.  Before the fix the
retried upload (still at its old place in the journal) PUT ``é x`` first
and the delete then removed it: the bucket lost the file, and the next
listing swept it from the mount (found by ``test_model.py``).  The core
test of the journal ordering is ``tests/core/test_rename_race.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.faults import FaultProxy
from tests.fuse.conftest import MountFactory, run_tierfs, wait_until

pytestmark = pytest.mark.fuse

TARGET = "é x"
NEW_BODY = b"n" * 65535


def _path_of(request_line: str) -> str:
    return request_line.split(" ")[1].split("?")[0]


def test_rename_onto_a_clean_name_during_the_upload_keeps_the_file(
    mount: MountFactory, fault_proxy: FaultProxy
) -> None:
    m = mount(
        {TARGET: b"o" * 1000, "dd": b"d" * 5000},
        endpoint_url=fault_proxy.endpoint,
        upload_delay="0s",
    )
    assert sorted(os.listdir(m.path)) == sorted(["dd", TARGET])
    put_gate = fault_proxy.hold_requests(
        lambda line: line.startswith("PUT ") and _path_of(line).endswith("/dd")
    )
    delete_gate = fault_proxy.hold_requests(
        lambda line: (
            line.startswith("DELETE ") and _path_of(line).endswith("/" + quote(TARGET, safe=""))
        )
    )
    try:
        Path(m.path / "dd").write_bytes(NEW_BODY)  # truncate + write: dirty, uploads at once
        assert wait_until(lambda: fault_proxy.held >= 1, 10), m.log_tail()
        os.rename(m.path / "dd", m.path / TARGET)
        put_gate.set()  # the first attempt ends "changed": the file moved
        # Time for a retried upload to overtake the held delete (before the
        # fix it did, within a fraction of a second).
        time.sleep(1.5)
    finally:
        put_gate.set()
        delete_gate.set()
    done = run_tierfs("flush", str(m.path))
    assert done.returncode == 0, f"tierfs flush failed: {done.stderr.strip()}\n{m.log_tail()}"

    keys = {
        o["Key"][len(m.prefix) + 1 :]
        for o in m.s3.list_objects_v2(Bucket=m.bucket, Prefix=m.prefix + "/").get("Contents", [])
    }
    assert keys == {TARGET}, (keys, m.log_tail())
    body = m.s3.get_object(Bucket=m.bucket, Key=m.key(TARGET))["Body"].read()
    assert body == NEW_BODY
    time.sleep(2.5)  # list_ttl (2 s): the next listing must find the file
    assert os.listdir(m.path) == [TARGET]
    assert Path(m.path / TARGET).read_bytes() == NEW_BODY
