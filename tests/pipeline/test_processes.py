"""A long-running process's startup heap, frozen out of the cyclic GC's scans."""

from __future__ import annotations

import gc

from pipeline.processes import freeze_startup_heap


def test_freeze_startup_heap_takes_live_objects_out_of_the_collectors_scans() -> None:
    startup_state = {"config": ["kept for the process lifetime"]}
    assert any(o is startup_state for o in gc.get_objects())
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert not any(o is startup_state for o in gc.get_objects())  # never rescanned
        created_later: dict[str, list[str]] = {"per_request": []}
        assert any(o is created_later for o in gc.get_objects())  # later objects still are
    finally:
        gc.unfreeze()
