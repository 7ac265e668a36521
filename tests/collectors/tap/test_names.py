"""The tap names its engine as people do, and stamps revision/cohort on every record."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError

from collectors.tap.config import TapConfig
from llmslo.cli import build_parser
from llmslo.commands.tap import tap_config
from pipeline.config import load_config
from pipeline.errors import ConfigError
from tests.collectors.tap.fakes import CHAT, ScriptedUpstream, post, stream_script, tap_over


def run(coro):
    return asyncio.run(coro)


def _address(url: str) -> str:
    return urlsplit(url).netloc


def test_a_tap_named_pod_3_stamps_the_name_on_records_gauges_and_metrics() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([up], instance="pod-3") as (url, sink, proxy):
            status, _, _ = await post(url, {**CHAT, "stream": True})
            proxy.publish_gauges()
            rendered = proxy.metrics.registry.get_sample_value(
                "llmslo_tap_requests_total", {"instance": "pod-3", "outcome": "ok", "code": "200"}
            )
        assert status == 200
        [row] = sink.requests
        assert (row["instance"], row["address"]) == ("pod-3", _address(up.url))
        gauges = {(s["instance"], s["address"], s["signal"]) for s in sink.samples}
        assert ("pod-3", _address(up.url), "tap_in_flight") in gauges
        assert rendered == 1.0

    run(scenario())


def test_an_unnamed_tap_falls_back_to_host_port_for_both_columns() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(2))
        async with tap_over([up]) as (url, sink, _):
            await post(url, {**CHAT, "stream": True})
        [row] = sink.requests
        assert row["instance"] == row["address"] == _address(up.url)
        assert (row["revision"], row["cohort"]) == (None, None)

    run(scenario())


def test_revision_and_cohort_come_from_config_or_the_configured_header() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(2))
        async with tap_over(
            [up], revision="r41", cohort="baseline", cohort_header="x-llmslo-cohort"
        ) as (url, sink, proxy):
            await post(url, {**CHAT, "stream": True})
            await post(url, {**CHAT, "stream": True}, headers={"X-LLMSLO-Cohort": "canary"})
            # A hostile header value is not stamped: the configured cohort is, and it counts.
            await post(url, {**CHAT, "stream": True}, headers={"x-llmslo-cohort": "x" * 300})
            dropped = proxy.metrics.registry.get_sample_value(
                "llmslo_dropped_total", {"reason": "bad_cohort_header"}
            )
        stamped = [(r["revision"], r["cohort"]) for r in sink.requests]
        assert stamped == [("r41", "baseline"), ("r41", "canary"), ("r41", "baseline")]
        assert dropped == 1.0

    run(scenario())


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"instance": "pod-3\nFAKE L0 -> L3"}, "control characters"),
        ({"instance": "p" * 254}, "254 characters"),
        ({"cohort": ""}, "0 characters"),
        ({"revision": "r\x1b[31m"}, "control characters"),
        (
            {"instance": "pod-3", "upstreams": ["http://127.0.0.1:1", "http://127.0.0.1:2"]},
            "2 upstreams",
        ),
    ],
    ids=[
        "a newline in the name",
        "a name longer than 253 characters",
        "an empty cohort",
        "an escape sequence in the revision",
        "one name for two engines",
    ],
)
def test_hostile_names_are_refused_with_a_clear_config_error(
    overrides: dict, complaint: str
) -> None:
    config = {"upstreams": ["http://127.0.0.1:1"], **overrides}
    with pytest.raises(ValidationError) as refused:
        TapConfig(**config)
    assert complaint in str(refused.value)


def test_the_tap_command_names_the_engine_and_stamps_revision_and_cohort() -> None:
    argv = ["tap", "--upstream", "http://127.0.0.1:1", "--instance", "pod-3", "--revision", "r42"]
    config = tap_config(load_config(None), build_parser().parse_args([*argv, "--cohort", "c"]))
    assert (config.instance, config.revision, config.cohort) == ("pod-3", "r42", "c")
    with pytest.raises(ConfigError, match="control characters"):
        tap_config(load_config(None), build_parser().parse_args([*argv[:3], "--instance", "a\nb"]))
