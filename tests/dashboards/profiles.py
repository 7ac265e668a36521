"""Summaries of what :meth:`tests.dashboards.browser.HeadlessChromium.record` records, for
``bench/dashboard.py --profile``: where a page load's browser time goes.

- :func:`js_self_ms`: the page's JavaScript by self time, per function or per script file
  (a ``.cpuprofile``: each sample's time is the delta to the next sample);
- :func:`trace_self_ms`: trace events' self time (their duration less their children's on
  the same thread) per DevTools category (scripting, style & layout, paint & composite,
  GC, loading, other task time), per process and thread;
- :func:`timeline`: the renderer's main thread, slice by slice from the navigation: the
  websocket frames received (Streamlit's deltas) and the time spent, per category, then.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Span", "category", "js_self_ms", "spans", "timeline", "trace_self_ms"]

#: DevTools' timeline categories, by event name (exact, or a prefix ending in ``*``; the first
#: category that matches), and the profiler's own work.
_CATEGORIES = {
    "profiler": ("CpuProfiler::*", "V8.CpuProfiler*", "TracingStartedInBrowser"),
    "gc": ("MinorGC", "MajorGC", "BlinkGC.*", "V8.GC*", "CppGC.*", "ThreadState::*", "GCEvent"),
    "ipc": ("Receive mojo message", "Receive mojo reply", "Closed mojo endpoint"),
    # A script's first run on an origin: fetched, parsed, compiled, its code cache written,
    # its hot functions compiled again by the optimising tiers.
    "compile": (
        "v8.compile", "v8.compileModule", "v8.produceCache", "v8.produceModuleCache",
        "CompileScript", "CompileCode", "v8.parseOnBackground*", "V8.BytecodeBudgetInterrupt*",
        "V8.Compile*", "V8.OptimizeConcurrent*", "V8.Maglev*", "V8.Turbofan*", "V8.Deoptimize*",
    ),
    "scripting": (
        "FunctionCall", "EvaluateScript", "v8.evaluateModule", "v8.run", "V8.Execute",
        "TimerFire", "EventDispatch", "FireAnimationFrame", "RunMicrotasks", "v8.callFunction",
        "XHRReadyStateChange", "FireIdleCallback", "v8.newInstance", "RunTask.JS", "V8.*",
    ),
    "style & layout": (
        "UpdateLayoutTree", "RecalculateStyles", "Layout", "HitTest", "PrePaint",
        "UpdateLayerTree", "IntersectionObserverController::computeIntersections",
        "ParseAuthorStyleSheet", "LayoutShift", "ScheduleStyleRecalculation",
    ),
    "paint & composite": (
        "Paint", "PaintImage", "CompositeLayers", "Layerize", "Commit", "RasterTask",
        "ImageDecodeTask", "Decode", "DrawFrame", "Draw", "ActivateLayerTree",
        "UpdateLayer", "Rasterize", "GPUTask", "Display::DrawAndSwap", "Graphics.Pipeline",
    ),
    "loading": ("ParseHTML", "ResourceSendRequest", "ResourceReceiveResponse",
                "ResourceReceivedData", "ResourceFinish"),
}  # fmt: skip
#: Events a thread runs its work in: their self time is work no finer event names.
_TASKS = ("ThreadControllerImpl::RunTask", "RunTask", "ThreadPool_RunTask")


def category(name: str) -> str:
    """The DevTools category of a trace event's name (``other`` for task overhead and
    unknown events)."""
    for label, names in _CATEGORIES.items():
        if name in names or any(n[-1] == "*" and name.startswith(n[:-1]) for n in names):
            return label
    return "other"


@dataclass(frozen=True)
class Span:
    """One trace event with a duration, its self time (less its children's on the same
    thread), in microseconds."""

    pid: int
    tid: int
    name: str
    start_us: float
    dur_us: float
    self_us: float
    top: bool  # not inside another event of its thread


def _intervals(events: Iterable[dict[str, Any]]) -> Iterator[tuple[int, int, str, float, float]]:
    """(pid, tid, name, start, duration) of the complete events and the begin/end pairs."""
    open_: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        ph = e.get("ph")
        if ph == "X" and "dur" in e:
            yield e["pid"], e["tid"], e["name"], float(e["ts"]), float(e["dur"])
        elif ph == "B":
            open_[e["pid"], e["tid"]].append(e)
        elif ph == "E" and open_[e["pid"], e["tid"]]:
            begin = open_[e["pid"], e["tid"]].pop()
            ts = float(begin["ts"])
            yield e["pid"], e["tid"], begin["name"], ts, float(e["ts"]) - ts


def spans(trace: list[dict[str, Any]]) -> list[Span]:
    """Every event with a duration, nested per thread to give each its self time."""
    by_thread: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for pid, tid, name, start, dur in _intervals(sorted(trace, key=lambda e: e.get("ts", 0))):
        by_thread[pid, tid].append((start, dur, name))
    return [span for (pid, tid), events in by_thread.items() for span in _nest(pid, tid, events)]


def _nest(pid: int, tid: int, events: list[tuple[float, float, str]]) -> Iterator[Span]:
    """One thread's events (start, duration, name) with their self times."""
    events.sort(key=lambda e: (e[0], -e[1]))  # parents first: earlier start, then longer
    stack: list[list[Any]] = []  # [start, end, name, children's time]

    def closed(item: list[Any]) -> Span:
        dur = item[1] - item[0]
        return Span(pid, tid, item[2], item[0], dur, max(dur - item[3], 0.0), not stack)

    for start, dur, name in events:
        while stack and stack[-1][1] <= start:
            done = stack.pop()
            yield closed(done)
        if stack:
            stack[-1][3] += dur
        stack.append([start, start + dur, name, 0.0])
    while stack:
        done = stack.pop()
        yield closed(done)


def thread_names(trace: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    """(pid, tid) → ``process/thread`` from the trace's metadata events."""
    process = {e["pid"]: e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    return {
        (e["pid"], e["tid"]): f"{process.get(e['pid'], e['pid'])}/{e['args']['name']}"
        for e in trace
        if e.get("name") == "thread_name"
    }


def trace_self_ms(trace: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per ``process/thread`` (those that ran tasks): milliseconds of self time per
    category, with ``busy`` the time inside top-level events."""
    names = thread_names(trace)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for span in spans(trace):
        thread = names.get((span.pid, span.tid), f"{span.pid}/{span.tid}")
        out[thread][category(span.name)] += span.self_us / 1000
        if span.top:
            out[thread]["busy"] += span.dur_us / 1000
    return {t: {k: round(v, 1) for k, v in _largest(c)} for t, c in out.items()}


def main_thread(trace: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The renderer main thread that was busiest (the page's, not an old document's)."""
    names = thread_names(trace)
    busy: dict[tuple[int, int], float] = defaultdict(float)
    for span in spans(trace):
        if span.top and names.get((span.pid, span.tid), "").endswith("/CrRendererMain"):
            busy[span.pid, span.tid] += span.dur_us
    return max(busy, key=busy.__getitem__) if busy else None


def timeline(trace: list[dict[str, Any]], slice_ms: float = 250.0) -> list[dict[str, Any]]:
    """The page's main thread slice by slice from the navigation (the trace's first
    ``navigationStart``, else its first event): per slice, the frames received (count, kB) and the
    milliseconds of self time per category."""
    thread = main_thread(trace)
    timed = [e for e in trace if e.get("ph") != "M" and "ts" in e]
    if thread is None or not timed:
        return []
    starts = [float(e["ts"]) for e in timed if e.get("name") == "navigationStart"]
    origin = min(starts or [float(e["ts"]) for e in timed])
    rows: dict[int, dict[str, Any]] = defaultdict(lambda: {"frames": 0, "kB": 0.0})
    for e in trace:
        if e.get("name") == "llmslo.frame":
            row = rows[int((e["ts"] - origin) / 1000 // slice_ms)]
            row["frames"] += 1
            row["kB"] += e["args"]["bytes"] / 1000
    for span in spans(trace):
        if (span.pid, span.tid) == thread and span.start_us >= origin:
            row = rows[int((span.start_us - origin) / 1000 // slice_ms)]
            label = category(span.name)
            row[label] = row.get(label, 0.0) + span.self_us / 1000
    return [
        {"from_ms": i * slice_ms, **{k: round(v, 1) for k, v in rows[i].items()}}
        for i in sorted(rows)
    ]


def js_self_ms(profile: dict[str, Any], by: str = "function") -> list[tuple[str, float]]:
    """The profile's self time in milliseconds per function (``name file:line``) or per
    script ``file``, largest first; ``(idle)`` and ``(program)`` included as they come."""
    nodes = {node["id"]: node for node in profile["nodes"]}
    deltas = profile.get("timeDeltas", [])
    totals: dict[str, float] = defaultdict(float)
    samples = profile.get("samples", [])
    for i, node_id in enumerate(samples):
        # A sample stands for the time until the next one.
        dur = deltas[i + 1] if i + 1 < len(deltas) else 0
        frame = nodes[node_id]["callFrame"]
        file = frame.get("url", "").rsplit("/", 1)[-1].split("?")[0] or "(native)"
        if by == "file":
            key = file if frame.get("url") else frame.get("functionName") or "(native)"
        else:
            key = f"{frame.get('functionName') or '(anonymous)'} {file}:{frame.get('lineNumber', -1) + 1}"
        totals[key] += dur / 1000
    return [(key, round(ms, 1)) for key, ms in _largest(totals)]


def _largest(values: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(values.items(), key=lambda item: -item[1])
