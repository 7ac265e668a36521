"""Scenario timelines: faults set and cleared at given offsets, from a YAML file.

Example (``config/simulator.scenario.example.yaml``)::

    events:
      - {at_s: 10, pod: pod-0, fault: stall}
      - {at_s: 70, pod: pod-0, fault: stall, action: clear}
      - {at_s: 20, pod: pod-1, fault: kv_leak, params: {blocks_per_s: 20}}
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from pipeline.config import STRICT, load_yaml
from pipeline.errors import ConfigError
from simulator.faults import validate_fault

__all__ = ["Scenario", "ScenarioEvent", "ScenarioRunner", "load_scenario"]


class ScenarioEvent(BaseModel):
    """At ``at_s`` seconds after start, set or clear ``fault`` on ``pod``."""

    model_config = STRICT
    at_s: float = Field(ge=0)
    pod: str = Field(min_length=1)
    fault: str
    action: Literal["set", "clear"] = "set"
    params: dict[str, Any] = Field(default_factory=dict)


class Scenario(BaseModel):
    """A validated timeline, events sorted by time."""

    model_config = STRICT
    events: list[ScenarioEvent] = Field(default_factory=list)


def load_scenario(source: Path | str | dict[str, Any], pods: list[str] | None = None) -> Scenario:
    """Validate a timeline (file or dict); fault names, params and pod names are checked.

    Raises :class:`ConfigError` naming the event, e.g. ``events[2].params.factor: ...``.
    """
    if isinstance(source, dict):
        data: Any = source
    else:
        try:
            data = load_yaml(Path(source).read_text(encoding="utf-8"), str(source))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{source}: cannot read scenario: {exc}") from exc
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(".".join(str(p) for p in first["loc"]) + f": {first['msg']}") from exc
    for i, event in enumerate(scenario.events):
        try:
            validate_fault(event.fault, event.params)
        except ConfigError as exc:
            raise ConfigError(f"events[{i}].{exc}") from exc
        if pods is not None and event.pod not in pods:
            raise ConfigError(f"events[{i}].pod: unknown pod {event.pod!r}")
    return Scenario(events=sorted(scenario.events, key=lambda e: e.at_s))


class ScenarioRunner:
    """Plays a scenario against a running fleet in a background thread.

    ``fleet`` needs ``set_fault(pod, fault, **params)`` and ``clear_fault(pod, fault)``.
    ``applied`` lists ``(offset_s, event)`` as they happen.
    """

    def __init__(self, fleet: Any, scenario: Scenario, *, time_scale: float = 1.0) -> None:
        self.fleet = fleet
        self.scenario = scenario
        self.time_scale = time_scale
        self.applied: list[tuple[float, ScenarioEvent]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scenario", daemon=True)

    def start(self) -> ScenarioRunner:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every event was applied; returns False on timeout."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        for event in self.scenario.events:
            due = self._t0 + event.at_s / self.time_scale
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            if event.action == "set":
                self.fleet.set_fault(event.pod, event.fault, **event.params)
            else:
                self.fleet.clear_fault(event.pod, event.fault)
            self.applied.append((time.monotonic() - self._t0, event))
