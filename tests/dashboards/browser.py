"""Headless Debian Chromium driven over the Chrome DevTools protocol (websocket), for the
dashboards' browser test and benchmark: load a page, wait until Streamlit has rendered it
(script finished, every chart drawn), read what it shows, take a screenshot."""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from PIL import Image, ImageStat
from websockets.sync.client import ClientConnection, connect

__all__ = ["HeadlessChromium", "RenderState", "blank"]

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1440,2200",  # tall: Streamlit scrolls inside its own pane
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)

#: What the page shows now: Streamlit's test ids (stable across versions since 1.2x).
_STATE_JS = """(() => {
  const q = (s) => document.querySelectorAll(s);
  const h1 = document.querySelector('[data-testid="stMain"] h1, section.main h1, h1');
  const charts = q('[data-testid="stVegaLiteChart"]').length;
  const drawn = q('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg.marks').length;
  const app = document.querySelector('[data-testid="stApp"]');
  return {
    title: h1 ? h1.innerText.trim() : null,
    script: app ? app.getAttribute('data-test-script-state') : null,
    running: q('[data-testid="stStatusWidget"]').length > 0,
    skeletons: q('[data-testid="stSkeleton"]').length,
    charts: charts, drawn: drawn,
    exceptions: Array.from(q('[data-testid="stException"]')).map(e => e.innerText.slice(0, 500)),
    errors: Array.from(q('[data-testid="stAlertContentError"]')).map(e => e.innerText.slice(0, 300)),
    text: document.body ? document.body.innerText.slice(0, 20000) : '',
    url: location.href,
    stale: window.__llmsloStale === true,
  };
})()"""


#: What :meth:`HeadlessChromium.record` traces: DevTools' Performance panel's categories
#: (tasks, scripting, style, layout, paint, GC), without its JavaScript sampling (the
#: ``Profiler`` domain samples the page's scripts instead).
TRACE_CATEGORIES = (
    "devtools.timeline",
    "disabled-by-default-devtools.timeline",
    "disabled-by-default-devtools.timeline.frame",
    "toplevel",
    "blink.user_timing",
    "v8.execute",
    "v8",
    "loading",
    "latencyInfo",
)


def _frame_event(frame: dict[str, Any]) -> dict[str, Any]:
    """A websocket frame the page received as an instant trace event (``Network``'s
    timestamps are the trace clock's, in seconds): when Streamlit's deltas arrived."""
    payload = frame["response"]["payloadData"]
    size = len(payload) * 3 // 4 if frame["response"].get("opcode") == 2 else len(payload)
    return {
        "name": "llmslo.frame",
        "ph": "i",
        "s": "g",
        "pid": 0,
        "tid": 0,
        "ts": frame["timestamp"] * 1e6,
        "args": {"bytes": size},
    }


class RenderState(dict[str, Any]):
    """The page state read by :data:`_STATE_JS` (title, script, charts, drawn, exceptions,
    text, url)."""

    @property
    def rendered(self) -> bool:
        """Script done (the app says so, no running widget, no skeleton), a title, and
        every chart drawn. The running widget alone is not enough: Streamlit shows it only
        after a delay, so on a busy machine a page half-way through its script looked done."""
        return (
            not self.get("stale", True)
            and self.get("script") == "notRunning"
            and bool(self.get("title"))
            and not self["running"]
            and self["skeletons"] == 0
            and self["drawn"] >= self["charts"]
        )


class HeadlessChromium:
    """One headless Chromium with one page, on loopback only; a context manager."""

    def __init__(self, binary: str, profile: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(
            prefix="llmslo-chromium-", ignore_cleanup_errors=True
        )
        self.profile = profile or Path(self._tmp.name)
        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._ids = itertools.count(1)
        #: Bytes of the websocket frames the page received (see :meth:`call`).
        self.received_bytes = 0
        #: DevTools events kept while :meth:`call` waits (method → their params, in order):
        #: only the methods named here are kept (see :meth:`record`).
        self.events: dict[str, list[dict[str, Any]]] = {}
        self._stack = contextlib.ExitStack()
        self._ws = self._stack.enter_context(self._attach())

    def _attach(self) -> ClientConnection:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
            targets = json.load(answer)
        page = next(t for t in targets if t["type"] == "page")
        # No keepalive pings: on a loaded host Chromium answered one late and the ping timeout
        # closed a healthy loopback connection mid-benchmark.
        return connect(
            page["webSocketDebuggerUrl"], max_size=None, open_timeout=10, ping_interval=None
        )

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its ``result`` (events in between are skipped, but the
        websocket frames the page received are counted in :attr:`received_bytes` once
        ``Network.enable`` was called, and the events named in :attr:`events` are kept)."""
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=60))
            self._event(message)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def _event(self, message: dict[str, Any]) -> None:
        event = message.get("method")
        if event == "Network.webSocketFrameReceived":
            frame = message["params"]["response"]
            # Binary frames (Streamlit's protobuf) arrive base64-encoded.
            size = len(frame["payloadData"])
            self.received_bytes += size * 3 // 4 if frame.get("opcode") == 2 else size
        if event in self.events:
            self.events[event].append(message["params"])

    def _wait_event(self, method: str, timeout_s: float) -> dict[str, Any]:
        """The params of the next ``method`` event (kept events are kept meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = json.loads(self._ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            self._event(message)
            if message.get("method") == method:
                params: dict[str, Any] = message.get("params", {})
                return params
        raise TimeoutError(f"no {method} within {timeout_s:.0f} s")

    def record(
        self, url: str, timeout_s: float = 30.0, interval_us: int = 200
    ) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
        """:meth:`open` ``url`` while DevTools records: a JavaScript CPU profile of the page
        (``Profiler``, sampled every ``interval_us``) and a trace of every Chromium process
        (``Tracing``, the categories DevTools' Performance panel records, without its
        sampling, with the page's websocket frames as ``llmslo.frame`` instant events).
        Returns the seconds :meth:`open` took, the profile (``.cpuprofile`` JSON) and the
        trace events (a ``.json`` trace's ``traceEvents``)."""
        self.call("Network.enable")  # the websocket frames
        self.call("Profiler.enable")
        self.call("Profiler.setSamplingInterval", interval=interval_us)
        self.events = {"Tracing.dataCollected": [], "Network.webSocketFrameReceived": []}
        self.call(
            "Tracing.start",
            traceConfig={"includedCategories": list(TRACE_CATEGORIES)},
            transferMode="ReportEvents",
        )
        self.call("Profiler.start")
        try:
            seconds = self.open(url, timeout_s)
        finally:
            cpu_profile: dict[str, Any] = self.call("Profiler.stop")["profile"]
            self.call("Tracing.end")
            self._wait_event("Tracing.tracingComplete", 60)
            self.call("Profiler.disable")
            kept, self.events = self.events, {}
        trace = [e for chunk in kept["Tracing.dataCollected"] for e in chunk["value"]]
        frames = kept["Network.webSocketFrameReceived"]
        trace += [_frame_event(f) for f in frames]
        return seconds, cpu_profile, trace

    def state(self) -> RenderState:
        """What the page shows now."""
        answer = self.call("Runtime.evaluate", expression=_STATE_JS, returnByValue=True)
        return RenderState(answer["result"].get("value") or {"running": True, "skeletons": 1})

    def open(self, url: str, timeout_s: float = 30.0, settle_s: float = 0.25) -> float:
        """Load ``url`` and wait until rendered (stable for ``settle_s``); seconds it took
        from the request to the first rendered state. Raises TimeoutError."""
        # Marks the old document so that its rendered state is never taken for the new one's.
        self.call("Runtime.evaluate", expression="window.__llmsloStale = true")
        started = time.perf_counter()
        self.call("Page.navigate", url=url)
        first: float | None = None
        while time.perf_counter() - started < timeout_s:
            state = self.state()
            if state.rendered:
                first = first if first is not None else time.perf_counter() - started
                if time.perf_counter() - started - first >= settle_s:
                    return first
            else:
                first = None
            time.sleep(0.05)
        raise TimeoutError(f"{url} not rendered within {timeout_s:.0f} s: {self.state()}")

    def screenshot(self, path: Path, settle_s: float = 1.0) -> bytes:
        """Full-page PNG written to ``path`` after ``settle_s`` (the sidebar slides in);
        returns its bytes."""
        time.sleep(settle_s)
        data = self.call("Page.captureScreenshot", format="png")
        png = base64.b64decode(data["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png

    def close(self) -> None:
        self._stack.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._remove_profile()

    def _remove_profile(self) -> None:
        """Chromium's helper processes (crashpad, the zygote's children) can still write to
        the profile for a moment after the browser exits, so one ``rmtree`` could fail with
        "Directory not empty" on a busy machine: retry for up to 5 s, then leave the rest."""
        deadline = time.monotonic() + 5
        while True:
            try:
                shutil.rmtree(self._tmp.name)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        self._tmp.cleanup()

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def blank(png: bytes) -> bool:
    """A screenshot with (almost) one colour: nothing was drawn."""
    image = Image.open(io.BytesIO(png)).convert("L")
    return max(ImageStat.Stat(image).stddev) < 3.0 or len(image.getcolors(1 << 16) or []) < 8
