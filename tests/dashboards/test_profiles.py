"""What ``bench/dashboard.py --profile`` prints from a recorded load: self times per
thread and category, the main thread's timeline, JavaScript per function and script."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dashboards import profiles

_META = [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "Renderer"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "CrRendererMain"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "Compositor"}},
]


def _x(name: str, ts: float, dur: float, tid: int = 7) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


#: A task of 100 ms holding a script call (50 ms, of which a 10-ms layout it forced), then
#: a paint in a begin/end pair; a compositor task; the navigation at 0 and two frames.
TRACE = [
    *_META,
    {"ph": "R", "name": "navigationStart", "pid": 1, "tid": 7, "ts": 0},
    _x("ThreadControllerImpl::RunTask", 0, 100_000),
    _x("FunctionCall", 10_000, 50_000),
    _x("Layout", 20_000, 10_000),
    {"ph": "B", "name": "Paint", "pid": 1, "tid": 7, "ts": 300_000},
    {"ph": "E", "name": "Paint", "pid": 1, "tid": 7, "ts": 304_000},
    _x("ThreadControllerImpl::RunTask", 5_000, 2_000, tid=8),
    {"ph": "i", "name": "llmslo.frame", "pid": 0, "tid": 0, "ts": 1_000, "args": {"bytes": 500}},
    {"ph": "i", "name": "llmslo.frame", "pid": 0, "tid": 0, "ts": 260_000, "args": {"bytes": 1500}},
]


def test_self_time_is_an_events_time_less_its_childrens_per_thread_and_category() -> None:
    threads = profiles.trace_self_ms(TRACE)
    assert threads["Renderer/CrRendererMain"] == {
        "busy": 104.0,  # the task and the paint: top-level events
        "other": 50.0,  # the task's own time
        "scripting": 40.0,
        "style & layout": 10.0,
        "paint & composite": 4.0,
    }
    assert threads["Renderer/Compositor"] == {"busy": 2.0, "other": 2.0}


def test_the_timeline_puts_frames_and_work_in_the_slice_they_started() -> None:
    rows = profiles.timeline(TRACE, slice_ms=250)
    assert rows == [
        {"from_ms": 0.0, "frames": 1, "kB": 0.5, "other": 50.0, "scripting": 40.0,
         "style & layout": 10.0},
        {"from_ms": 250.0, "frames": 1, "kB": 1.5, "paint & composite": 4.0},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("V8.GC_SCAVENGER_SCAVENGE_PARALLEL", "gc"),
        ("v8.parseOnBackgroundParsing", "compile"),
        ("V8.StackGuard", "scripting"),
        ("CpuProfiler::StartProfiling", "profiler"),
        ("UpdateLayoutTree", "style & layout"),
        ("ThreadPool_RunTask", "other"),
    ],
    ids=["V8's GC is not scripting", "background parsing is compiling", "other V8 work is "
         "scripting", "the profiler's own work is set apart", "style", "task overhead"],
)  # fmt: skip
def test_trace_events_fall_in_devtools_categories(name: str, label: str) -> None:
    assert profiles.category(name) == label


def test_a_samples_time_is_the_delta_to_the_next_sample() -> None:
    def node(ident: int, function: str, url: str) -> dict[str, Any]:
        return {"id": ident, "callFrame": {"functionName": function, "url": url, "lineNumber": 4}}

    cpu_profile = {
        "nodes": [
            node(1, "(root)", ""),
            node(2, "render", "http://127.0.0.1:1/static/js/vega.abc.js?x=1"),
            node(3, "", "http://127.0.0.1:1/static/js/react-dom.def.js"),
        ],
        "samples": [2, 2, 3, 1],
        "timeDeltas": [0, 3_000, 1_000, 500],
    }
    assert profiles.js_self_ms(cpu_profile) == [
        ("render vega.abc.js:5", 4.0),
        ("(anonymous) react-dom.def.js:5", 0.5),
        ("(root) (native):5", 0.0),
    ]
    assert profiles.js_self_ms(cpu_profile, by="file")[:2] == [
        ("vega.abc.js", 4.0),
        ("react-dom.def.js", 0.5),
    ]
