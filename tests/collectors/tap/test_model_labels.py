"""Bounded label cardinality: the client-supplied ``model`` becomes a
metrics label only when configured or announced by an upstream (``/v1/models``); anything
else is ``other``, the number of distinct values is capped, and records keep the raw name."""

from __future__ import annotations

import asyncio

import aiohttp
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.tap.labels import OTHER_MODEL, ModelLabels
from collectors.tap.telemetry import GenAiTelemetry
from tests.collectors.tap.fakes import CHAT, ScriptedUpstream, stream_script, tap_over, wait_for


def model_labels_in(text: str) -> set[str]:
    return {
        s.labels["model"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "model" in s.labels
    }


def test_6000_client_model_names_keep_metrics_small_and_records_raw() -> None:
    names = [f"attacker-{i:05d}-" + "x" * 40 for i in range(6000)]

    async def scenario() -> tuple[bytes, list[dict], set[str]]:
        reader = InMemoryMetricReader()
        genai = GenAiTelemetry(MeterProvider(metric_readers=[reader]))
        up = ScriptedUpstream(lambda req: stream_script(2), models=["llama-3-8b"])
        async with tap_over([up], genai=genai, models=["configured-7b"]) as (url, sink, proxy):
            await wait_for(lambda: proxy.model_labels.announced == {"llama-3-8b"})
            gate = asyncio.Semaphore(32)
            async with aiohttp.ClientSession() as session:

                async def one(model: str) -> None:
                    async with (
                        gate,
                        session.post(
                            url + "/v1/chat/completions", json={**CHAT, "model": model}
                        ) as resp,
                    ):
                        await resp.read()

                await asyncio.gather(*(one(m) for m in [*names, "llama-3-8b", "configured-7b"]))
            text = generate_latest(proxy.metrics.registry)
        data = reader.get_metrics_data()
        assert data is not None
        otel_models = {
            str(dict(point.attributes or {}).get("gen_ai.request.model"))
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            for point in metric.data.data_points
        }
        return text, list(sink.requests), otel_models

    text, rows, otel_models = asyncio.run(scenario())
    assert len(text) < 100_000, f"/metrics is {len(text)} bytes"
    assert model_labels_in(text.decode()) == {"llama-3-8b", "configured-7b", OTHER_MODEL}
    assert otel_models == {"llama-3-8b", "configured-7b", OTHER_MODEL}
    assert len(rows) == 6002 and {r["model"] for r in rows} >= set(names)


def test_the_number_of_distinct_labels_is_capped() -> None:
    labels = ModelLabels(configured=["a"], max_labels=3)
    labels.announce("up-1", [f"m{i}" for i in range(100)])
    got = {labels.label(f"m{i}") for i in range(100)} | {labels.label("a")}
    assert len(got) <= 4 and OTHER_MODEL in got and "a" in got
    assert labels.label(None) == OTHER_MODEL and labels.label("unknown") == OTHER_MODEL


def test_an_upstream_without_a_model_list_is_tolerated_and_refreshed() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(2))  # GET /v1/models: not a model list
        async with tap_over([up], models=["configured-7b"], models_refresh_s=0.2) as (
            _url,
            _,
            proxy,
        ):
            await asyncio.sleep(0.5)
            assert proxy.model_labels.announced == set()
            assert proxy.model_labels.label("configured-7b") == "configured-7b"
            up.models = ["late-model"]  # the engine loads a model later: picked up
            await wait_for(lambda: proxy.model_labels.label("late-model") == "late-model")

    asyncio.run(scenario())
