from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pipeline import ingest_helpers


@pytest.fixture(autouse=True)
def _no_ingest_process_outlives_its_test() -> Iterator[None]:
    yield
    while ingest_helpers.STARTED:
        process = ingest_helpers.STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()
