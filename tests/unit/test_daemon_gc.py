"""The daemon's garbage collector settings (``tierfsd.main.tune_garbage_collector``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from tierfsd.main import GC_THRESHOLDS, tune_garbage_collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    enabled = gc.isenabled()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        if enabled:
            gc.enable()


def test_startup_objects_are_frozen_and_thresholds_set(restored_gc: None) -> None:
    gc.unfreeze()
    tune_garbage_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.isenabled()


def test_cycles_made_later_are_still_collected_automatically(restored_gc: None) -> None:
    tune_garbage_collector()
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    assert alive() is not None  # only a collection frees a cycle
    keep = [[] for _ in range(3 * GC_THRESHOLDS[0])]  # allocations that trigger one
    assert len(keep) == 3 * GC_THRESHOLDS[0]
    assert alive() is None
