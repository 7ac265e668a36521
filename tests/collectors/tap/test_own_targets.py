"""A request carrying the router's ``x-llm-d-slo-*`` headers is judged against its own
targets: through a real tap in front of a scripted engine on loopback, its rows hold the
targets and whether it met them; unusable header values are ignored and counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from collectors.tap.targets import OwnTargets, met_own_targets, parse_own_targets
from tests.collectors.tap.fakes import CHAT, ScriptedUpstream, post, stream_script, tap_over

TTFT, TPOT = "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"

#: Per ``user`` of the request body: (first token after s, gap between tokens s).
_PACE = {"fast": (0.02, 0.0), "slow-first": (0.4, 0.0), "slow-decode": (0.02, 0.06)}


def _script(body: dict[str, Any]) -> Any:
    first_s, gap_s = _PACE[body["user"]]
    return stream_script(4, gap_s=gap_s, first_s=first_s)


def dropped(proxy: Any, reason: str) -> float:
    value = proxy.metrics.registry.get_sample_value("llmslo_dropped_total", {"reason": reason})
    return value or 0.0


def test_requests_are_judged_against_their_own_targets() -> None:
    cases = {
        "met": ("fast", {TTFT: "1000", TPOT: "200"}),
        "missed-ttft": ("slow-first", {TTFT: "100"}),
        "missed-tpot": ("slow-decode", {TTFT: "1000", TPOT: "5"}),
        "garbage": ("slow-first", {TTFT: "NaN", TPOT: "1e9"}),
        "none": ("slow-first", {}),
    }

    async def scenario() -> tuple[dict[str, dict], dict[str, float]]:
        async with tap_over([ScriptedUpstream(_script)]) as (url, sink, proxy):
            for rid, (user, headers) in cases.items():
                status, _, error = await post(
                    url, {**CHAT, "user": user}, headers={"x-request-id": rid, **headers}
                )
                assert (status, error) == (200, None), "a target header failed the client"
            counts = {r: dropped(proxy, r) for r in ("bad_slo_ttft_header", "bad_slo_tpot_header")}
        return {row["request_id"]: row for row in sink.requests}, counts

    rows, counts = asyncio.run(scenario())
    judged = {
        rid: (row["slo_ttft_s"], row["slo_tpot_s"], row["slo_met"]) for rid, row in rows.items()
    }
    assert judged == {
        "met": (1.0, 0.2, True),
        "missed-ttft": (0.1, None, False),
        "missed-tpot": (1.0, 0.005, False),
        "garbage": (None, None, None),
        "none": (None, None, None),
    }
    assert rows["missed-ttft"]["ttft_s"] > 0.1 and rows["missed-tpot"]["tpot_s"] > 0.005
    assert counts == {"bad_slo_ttft_header": 1, "bad_slo_tpot_header": 1}
    # a target is a column, never a grouping key: every row is in the tap's one pool
    assert {row["pool"] for row in rows.values()} == {rows["none"]["pool"]}


@pytest.mark.parametrize(
    "raw",
    ["", "abc", "nan", "inf", "-inf", "0", "-5", "600000.5", "1e9", "1_000", "0x10"],
    ids=lambda raw: f"value {raw!r} is no target",
)
def test_an_unusable_target_is_ignored_and_reported(raw: str) -> None:
    targets, problems = parse_own_targets({TTFT: raw}, ttft_header=TTFT, tpot_header=TPOT)
    assert targets == OwnTargets() and problems == ("bad_slo_ttft_header",)


def test_a_target_at_the_bound_is_accepted_in_seconds() -> None:
    targets, problems = parse_own_targets(
        {TTFT: " 600000 ", TPOT: "12.5"}, ttft_header=TTFT, tpot_header=TPOT
    )
    assert targets == OwnTargets(600.0, 0.0125) and problems == ()


@pytest.mark.parametrize(
    ("ttft_s", "tpot_s", "met"),
    [
        (0.5, 0.02, True),
        (0.5, 0.2, False),
        (2.0, 0.02, False),
        (0.5, None, True),  # one token: no TPOT, judged on TTFT alone
        (None, None, None),  # failed before its first token: the outcome judges it
    ],
    ids=["both within", "tpot over", "ttft over", "no tpot measured", "nothing measured"],
)
def test_each_target_is_judged_where_measured(
    ttft_s: float | None, tpot_s: float | None, met: bool | None
) -> None:
    assert met_own_targets(OwnTargets(1.0, 0.05), ttft_s, tpot_s) is met


def test_a_request_without_targets_is_not_judged() -> None:
    assert met_own_targets(OwnTargets(), 9.0, 9.0) is None
