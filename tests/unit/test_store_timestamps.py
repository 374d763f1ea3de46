"""S3Store parses the timestamps of its answers without dateutil where it can
(``tierfs.store.s3.parse_timestamp``; the module docstring has the measurement).

1. Every form botocore accepts gives the same instant and the same kind of
   datetime (aware or naive) as botocore's own parser.
2. Against the real moto server: a listing's ``LastModified`` values never
   reach dateutil, and its mtimes are those a HEAD reports; a HEAD's
   RFC 1123 header still parses.
"""

from __future__ import annotations

import datetime
from typing import Any

import botocore.utils
import dateutil.parser
import pytest

from tierfs.store.s3 import S3Store, parse_timestamp

FORMS = [
    "2026-11-26T18:30:11.000Z",
    "2026-11-26T18:30:11Z",
    "2026-11-26T18:30:11.123456Z",
    "2026-11-26T18:30:11+02:00",
    "2026-11-26T18:30:11",  # naive: botocore's rules, not ours
    "Thu, 26 Nov 2026 18:30:11 GMT",
    "1764181811",
    1764181811,
    1764181811.5,
]


@pytest.mark.parametrize("value", FORMS, ids=[repr(v) for v in FORMS])
def test_every_form_gives_what_botocore_gives(value: Any) -> None:
    ours, theirs = parse_timestamp(value), botocore.utils.parse_timestamp(value)
    assert isinstance(ours, datetime.datetime)
    assert (ours.tzinfo is None) == (theirs.tzinfo is None)
    if theirs.tzinfo is None:
        assert ours == theirs
    else:
        assert ours.timestamp() == theirs.timestamp()


def test_garbage_fails_as_it_does_in_botocore() -> None:
    with pytest.raises(ValueError):
        botocore.utils.parse_timestamp("not a time")
    with pytest.raises(ValueError):
        parse_timestamp("not a time")


def test_a_listing_does_not_use_dateutil_and_agrees_with_head(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3_store
    for i in range(30):
        store.put(f"d/f{i:02d}", b"x" * i)
    calls = []
    real_parse = dateutil.parser.parse

    def counting_parse(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(dateutil.parser, "parse", counting_parse)
    listed = [obj for page in store.list_pages("d/") for obj in page.objects]
    assert len(listed) == 30
    assert calls == []  # 30 LastModified values, none through dateutil
    heads = {obj.key: store.head(obj.key) for obj in listed[:3]}
    assert calls, "a HEAD's RFC 1123 Last-Modified goes to botocore's parser"
    for obj in listed[:3]:
        # tierfs objects carry x-amz-meta-mtime; these have none, so both
        # mtimes are the object's LastModified (whole seconds in a header).
        assert int(obj.mtime) == int(heads[obj.key].mtime)
        assert obj.mtime > 1_600_000_000
