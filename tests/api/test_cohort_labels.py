"""Cohorts chosen by the labels the tap stamps: real tap records (revision from the tap's
config, cohort from the request header) written through ``Store``, selected by the judge's
cohort loader."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from api.cohorts import Cohort, TimeRange, load_samples
from collectors.tap.sinks import ListSink, rows_to_table
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from tests.collectors.tap.fakes import CHAT, ScriptedUpstream, post, stream_script, tap_over


async def _serve(
    first_s: float, requests: int, instance: str, revision: str, cohort_header: bool
) -> ListSink:
    up = ScriptedUpstream(lambda req: stream_script(4, first_s=first_s))
    extra = {"cohort_header": "x-llmslo-cohort"} if cohort_header else {}
    async with tap_over([up], instance=instance, revision=revision, **extra) as (url, sink, _):
        for i in range(requests):
            headers = {"x-llmslo-cohort": "canary" if i % 2 else "baseline"}
            status, _, _ = await post(url, {**CHAT, "stream": True}, headers=headers)
            assert status == 200
    return sink


def test_a_cohort_selected_by_revision_gets_exactly_that_revisions_requests(
    store: Store,
) -> None:
    async def scenario() -> tuple[ListSink, ListSink]:
        stable = await _serve(0.0, 12, "pod-0", "r41", cohort_header=False)
        canary = await _serve(0.05, 8, "pod-1", "r42", cohort_header=True)
        return stable, canary

    start_ms = int(time.time() * 1000) - 1000
    stable, canary = asyncio.run(scenario())
    rows = stable.requests + canary.requests
    store.commit_batch(
        {"requests": [rows_to_table(REQUEST_RECORDS, rows)]}, group_id="t", offsets={}, now_ts_ms=0
    )
    window = TimeRange(start_ms=start_ms, end_ms=int(time.time() * 1000) + 1000)

    new = load_samples(store.con, Cohort(labels={"revision": "r42"}), window)
    old = load_samples(store.con, Cohort(labels={"revision": "r41"}), window)
    assert (new.requests, old.requests) == (8, 12)
    # The canary revision's engine answers 50 ms later: its TTFTs, and only its, show it.
    assert np.min(new.latency["ttft_s"]) >= 0.05 > np.max(old.latency["ttft_s"])
    # The header-stamped cohort narrows it further, combined with the revision.
    header = Cohort(labels={"revision": "r42", "cohort": "canary"})
    assert load_samples(store.con, header, window).requests == 4
    assert load_samples(store.con, Cohort(labels={"cohort": "canary"}), window).requests == 4
