"""``map_s3_error`` (the one botocore -> StoreError mapping) on exceptions
that are not ClientErrors: a reset or a short body is "unavailable" (retried),
anything else that is not the store's failure is left for the caller to re-raise."""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError

from tierfs.errors import StoreUnavailable
from tierfs.store.retry import TruncatedBody
from tierfs.store.s3 import map_s3_error

WHERE = {"op": "GetObject", "bucket": "b", "key": "k", "endpoint": "http://127.0.0.1:1"}


@pytest.mark.parametrize(
    "exc",
    [
        TruncatedBody(got=10, expected=20),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ],
)
def test_connection_failures_are_unavailable(exc: BaseException) -> None:
    mapped = map_s3_error(exc, **WHERE)
    assert isinstance(mapped, StoreUnavailable)
    assert "s3://b/k" in str(mapped)


@pytest.mark.parametrize("exc", [ValueError("a bug"), OSError(28, "No space left on device")])
def test_foreign_exceptions_are_not_mapped(exc: BaseException) -> None:
    # Before: ``tuple | type`` in the isinstance check raised TypeError here.
    assert map_s3_error(exc, **WHERE) is None
