"""A real Alertmanager for the drill: started on loopback, watched, and read for alert times.

When the ``prometheus-alertmanager`` binary (Debian's package; ``alertmanager`` upstream)
is installed, each drill fleet gets its own Alertmanager with the generated routing and
inhibitions (:func:`alerts.alertmanager_config`, ``group_wait`` 1 s), the pipeline's alert
pusher posts to it, and :class:`AlertWatch` polls its ``/api/v2/alerts`` every
``poll_s``. The time an alert was received is Alertmanager's own ``updatedAt``: it stamps
every alert it accepts with its clock at that POST. The watch keeps the first sighting of
each firing (fingerprint, ``startsAt``), so later re-sends do not move it; polling only has
to be faster than the pusher's re-send interval (60 s). Without the binary the drill says
"not run"; with ``LLMSLO_REQUIRE_TOOLS=1`` that is an error instead.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from alerts import alertmanager_config, render_yaml
from pipeline.errors import ConfigError
from pipeline.processes import stop_process

__all__ = [
    "BINARIES",
    "AlertWatch",
    "Alertmanager",
    "ReceivedAlert",
    "find_alertmanager",
]

log = logging.getLogger(__name__)

#: Names the Alertmanager binary goes by (Debian's package, then upstream's).
BINARIES = ("prometheus-alertmanager", "alertmanager")


def find_alertmanager() -> str | None:
    """Path of the Alertmanager binary, or ``None`` when it is not installed.

    Raises :class:`ConfigError` when it is missing and ``LLMSLO_REQUIRE_TOOLS=1``.
    """
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("LLMSLO_REQUIRE_TOOLS") == "1":
        raise ConfigError(
            "drill: LLMSLO_REQUIRE_TOOLS=1 but prometheus-alertmanager is not installed "
            "(apt-get install prometheus-alertmanager)"
        )
    return None


#: Alertmanager's (exporter-toolkit's) log line naming the address it listens on.
_LISTENING = re.compile(rb'msg="Listening on" address=127\.0\.0\.1:(\d+)')


class Alertmanager:
    """One Alertmanager process on 127.0.0.1 (context manager); its log is in ``directory``.

    It listens on a port the kernel picks (port 0), read from its log, so Alertmanagers
    started at once (parallel drill fleets) never race for one: ``port`` and ``url`` are
    set once it is entered. Raises :class:`ConfigError` when it does not become ready
    within ``ready_timeout_s``.
    """

    def __init__(self, binary: str, directory: Path, ready_timeout_s: float = 30.0) -> None:
        self.binary = binary
        self.directory = directory
        self.ready_timeout_s = ready_timeout_s
        self.port = 0
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Alertmanager:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "alertmanager.yml"
        config.write_text(render_yaml(alertmanager_config(group_wait="1s"), header=""))
        log_path = self.directory / "alertmanager.log"
        offset = log_path.stat().st_size if log_path.exists() else 0  # earlier runs' lines
        with log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.path={self.directory / 'data'}",
                    "--web.listen-address=127.0.0.1:0",
                    "--cluster.listen-address=",  # no gossip: one instance, loopback only
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if not self.port:
                found = _LISTENING.search(log_path.read_bytes()[offset:])
                if found is None:
                    time.sleep(0.1)
                    continue
                self.port = int(found.group(1))
                self.url = f"http://127.0.0.1:{self.port}"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise ConfigError(
            f"drill: Alertmanager did not become ready on {self.url or 'any port'} (see {log_path})"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            stop_process(self._process, timeout_s=10)
            self._process = None


@dataclass(frozen=True)
class ReceivedAlert:
    """One firing alert as Alertmanager first listed it."""

    received_ts_ms: int  # Alertmanager's updatedAt at first sighting: when it received it
    starts_ts_ms: int
    labels: dict[str, str]

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


def _epoch_ms(stamp: str) -> int:
    """Alertmanager's RFC 3339 time (fractions up to nanoseconds, ``Z`` or an offset) as
    Unix epoch ms; raises ValueError on anything else."""
    text = _FRACTION.sub(lambda m: m.group(0)[:7], stamp)  # datetime takes microseconds
    return int(datetime.fromisoformat(text).timestamp() * 1000)


_FRACTION = re.compile(r"\.\d+")


class AlertWatch:
    """Polls ``{url}/api/v2/alerts`` on a thread and keeps each firing alert's first sighting.

    A failed poll is logged once and retried at the next tick (the drill goes on; a missed
    alert then shows as no alert).
    """

    def __init__(self, url: str, poll_s: float = 0.5) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.poll_s = poll_s
        self._seen: dict[tuple[str, str], ReceivedAlert] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failing = False
        # One client for every poll: a new one builds a TLS context each time (~20 ms of
        # CPU, every 0.5 s), a fifth of the drill process's CPU, beside the taps it times.
        self._http = httpx.Client(timeout=5)
        self._thread = threading.Thread(target=self._run, name="drill-alert-watch", daemon=True)

    def __enter__(self) -> AlertWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.poll()  # what arrived since the last tick
        self._http.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        """One look at Alertmanager's alerts (also called by the thread)."""
        try:
            response = self._http.get(self.url)
            response.raise_for_status()
            alerts: list[dict[str, Any]] = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            if not self._failing:
                log.warning("drill: cannot read %s: %s", self.url, exc)
            self._failing = True
            return
        self._failing = False
        with self._lock:
            for alert in alerts:
                key = (str(alert.get("fingerprint")), str(alert.get("startsAt")))
                if key in self._seen:
                    continue
                try:
                    self._seen[key] = ReceivedAlert(
                        _epoch_ms(alert["updatedAt"]),
                        _epoch_ms(alert["startsAt"]),
                        {str(k): str(v) for k, v in alert.get("labels", {}).items()},
                    )
                except (KeyError, ValueError) as exc:
                    log.warning("drill: alert without readable times skipped: %s", exc)

    def received(self) -> list[ReceivedAlert]:
        """Every firing alert seen so far, oldest receipt first."""
        with self._lock:
            return sorted(self._seen.values(), key=lambda a: (a.received_ts_ms, a.name))
