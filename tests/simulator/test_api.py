"""The OpenAI-compatible surface: SSE shape, usage chunk, non-streaming, hostile bodies."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Fleet, FleetConfig, PodConfig
from tests.simulator.conftest import MODEL, completion, post, scrape, value


def _events(body: bytes) -> list[str]:
    assert body.endswith(b"\n\n")
    return [e.decode() for e in body.split(b"\n\n") if e]


def test_chat_stream_role_chunk_tokens_usage_done(make_fleet):
    pod = make_fleet(["vllm"]).pods[0]
    status, body = post(
        pod.url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200
    events = _events(body)
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = [c for c in chunks[1:] if c["choices"]]
    assert len(tokens) == 4 and all(c["choices"][0]["delta"]["content"] for c in tokens)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert len({c["id"] for c in chunks}) == 1


def test_no_usage_chunk_unless_asked(make_fleet):
    pod = make_fleet(["vllm"]).pods[0]
    status, body = post(pod.url + "/v1/completions", completion(3, stream=True))
    assert status == 200 and b'"usage"' not in body
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in _events(body)[:-1]]
    assert len(texts) == 3 and all(texts)


def test_non_streaming_chat_has_message_and_usage(make_fleet):
    pod = make_fleet(["vllm"]).pods[0]
    status, body = post(
        pod.url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x" * 40}],
            "max_completion_tokens": 5,
            "ignore_eos": True,
        },
    )
    data = json.loads(body)
    assert status == 200 and data["object"] == "chat.completion"
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert data["choices"][0]["message"]["content"].strip()


def test_natural_stop_ends_before_max_tokens_sometimes(make_fleet):
    pod = make_fleet(["vllm"], mean_output_tokens=5).pods[0]
    reasons = set()
    for _ in range(10):
        body = json.loads(
            post(pod.url + "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 8})[1]
        )
        reasons.add(body["choices"][0]["finish_reason"])
        assert body["usage"]["completion_tokens"] <= 8
    assert "stop" in reasons


@pytest.mark.parametrize(
    ("route", "body", "status"),
    [
        ("/v1/completions", {"model": "other", "prompt": "x"}, 404),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * 200_000}, 400),
    ],
)
def test_invalid_requests_get_openai_errors(make_fleet, route, body, status):
    pod = make_fleet(["vllm"]).pods[0]
    got, raw = post(pod.url + route, body)
    assert got == status and "message" in json.loads(raw)["error"]
    assert value(scrape(pod.url), "vllm:request_success_total") == 0


@pytest.fixture(scope="module")
def api_fleet():
    with Fleet(FleetConfig(pods=[PodConfig(name="pod-0")], speed=50)) as fleet:
        yield fleet


@settings(max_examples=60, deadline=None)
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.fixed_dictionaries(
            {},
            optional={
                "model": st.one_of(st.just(MODEL), st.text(max_size=10), st.integers()),
                "prompt": st.one_of(
                    st.text(max_size=50), st.lists(st.text(max_size=5), max_size=3), st.integers()
                ),
                "messages": st.lists(
                    st.dictionaries(st.sampled_from(["role", "content"]), st.text(max_size=10)),
                    max_size=3,
                ),
                "max_tokens": st.one_of(st.integers(-5, 6), st.none(), st.text(max_size=3)),
                "stream": st.one_of(st.booleans(), st.text(max_size=3)),
                "stream_options": st.one_of(
                    st.none(), st.dictionaries(st.text(max_size=15), st.booleans(), max_size=2)
                ),
            },
        ).map(lambda d: json.dumps(d).encode()),
    )
)
def test_hostile_request_bodies_never_cause_a_500(api_fleet, body):
    pod = api_fleet.pods[0]
    for route in ("/v1/completions", "/v1/chat/completions"):
        req = urllib.request.Request(pod.url + route, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status = resp.status
                resp.read()
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status in (200, 400, 404)
