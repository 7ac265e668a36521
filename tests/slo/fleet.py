"""A synthetic fleet timeline in the spine's schemas: healthy by default, with fault overlays.

Every ``scrape_s`` each instance yields its canonical engine samples (vLLM dialect, one
engine rank), its tap gauges and its GPU samples; requests complete at a steady rate. A
fault is a function that edits one instance's state from ``start_s`` on, so a test states
the fault pattern in a few lines and compares with the healthy run of the same length.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.slo.factories import T0_MS, engine_sample, gpu_sample, labels, request

State = dict[str, Any]
Fault = Callable[[State, float], None]  # (state, seconds since the fault started)


@dataclass
class FleetTimeline:
    instances: int = 3
    seconds: int = 900
    scrape_s: int = 15
    pool: str = "llama-3-8b"
    seed: int = 0
    requests_per_scrape: int = 8
    faults: dict[int, tuple[float, Fault]] = field(
        default_factory=dict
    )  # instance index → (start_s, fault)

    def instance(self, index: int) -> str:
        return f"10.0.0.{index + 1}:8000"

    @property
    def end_ms(self) -> int:
        return T0_MS + self.seconds * 1000

    def add_fault(self, index: int, start_s: float, fault: Fault) -> FleetTimeline:
        self.faults[index] = (start_s, fault)
        return self

    def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        rng = random.Random(self.seed)
        requests: list[dict[str, Any]] = []
        engine: list[dict[str, Any]] = []
        gpu: list[dict[str, Any]] = []
        states = [self._initial(i) for i in range(self.instances)]
        for t in range(0, self.seconds + 1, self.scrape_s):
            ts = T0_MS + t * 1000
            for i, state in enumerate(states):
                self._advance(state, rng)
                start_fault = self.faults.get(i)
                if start_fault and t >= start_fault[0]:
                    start_fault[1](state, t - start_fault[0])
                engine += self._engine_rows(ts, state)
                gpu += self._gpu_rows(ts, state)
                requests += [
                    request(
                        ts - rng.randrange(self.scrape_s * 1000),
                        instance=state["instance"],
                        pool=self.pool,
                        model=self.pool,
                        **state["request"],
                    )
                    for _ in range(state["requests"])
                ]
        return requests, engine, gpu

    def _initial(self, index: int) -> State:
        return {
            "instance": self.instance(index),
            "running": 6.0,
            "waiting": 0.0,
            "kv_usage": 0.4,
            "generation_tokens": 0.0,
            "preemptions": 0.0,
            "tap_in_flight": 6.0,
            "tap_disconnects": 0.0,
            "aborts": 0.0,
            "corrupted": 0.0,
            "finished_error": 0.0,
            "gpu_util": 75.0,
            "engine_active": 0.7,
            "fb_used": 72_000.0,
            "fb_free": 8_000.0,
            "xid": 0.0,
            "tokens_per_s": 180.0,
            "requests": self.requests_per_scrape,
            "request": {},
            "kv_free_blocks": None,
            "kv_largest_free_run": None,
        }

    def _advance(self, s: State, rng: random.Random) -> None:
        s["running"] = float(rng.randint(4, 8))
        s["tap_in_flight"] = s["running"]
        s["kv_usage"] = rng.uniform(0.3, 0.5)
        s["generation_tokens"] += s["tokens_per_s"] * self.scrape_s
        if rng.random() < 0.3:  # clients leave now and then; the engine aborts them promptly
            s["tap_disconnects"] += 1
            s["aborts"] += 1
        s["gpu_util"] = rng.uniform(60, 90)
        s["engine_active"] = s["gpu_util"] / 100

    def _engine_rows(self, ts: int, s: State) -> list[dict[str, Any]]:
        inst = {"instance": s["instance"], "pool": self.pool, "model": self.pool}
        rows = [
            engine_sample(ts, name, s[key], **inst)
            for name, key in (
                ("running", "running"),
                ("waiting", "waiting"),
                ("kv_usage", "kv_usage"),
            )
        ]
        rows += [
            engine_sample(ts, name, s[key], kind="counter", **inst)
            for name, key in (
                ("generation_tokens", "generation_tokens"),
                ("preemptions", "preemptions"),
                ("corrupted_requests", "corrupted"),
            )
        ]
        rows.append(
            engine_sample(
                ts,
                "requests_finished",
                s["aborts"],
                kind="counter",
                labels_json=labels(finished_reason="abort"),
                **inst,
            )
        )
        rows.append(
            engine_sample(
                ts,
                "requests_finished",
                s["finished_error"],
                kind="counter",
                labels_json=labels(finished_reason="error"),
                **inst,
            )
        )
        for name in ("kv_free_blocks", "kv_largest_free_run"):
            if s[name] is not None:
                rows.append(engine_sample(ts, name, s[name], **inst))
        tap = {**inst, "dialect": "tap", "engine": ""}
        rows.append(
            engine_sample(
                ts, "tap_in_flight", s["tap_in_flight"], metric="llmslo_tap_in_flight", **tap
            )
        )
        rows.append(
            engine_sample(
                ts,
                "tap_disconnects",
                s["tap_disconnects"],
                kind="counter",
                metric="llmslo_tap_disconnects_total",
                **tap,
            )
        )
        return rows

    def _gpu_rows(self, ts: int, s: State) -> list[dict[str, Any]]:
        pod = {"pod": s["instance"]}
        rows = [
            gpu_sample(ts, name, s[key], **pod)
            for name, key in (
                ("gpu_util", "gpu_util"),
                ("engine_active", "engine_active"),
                ("fb_used_mib", "fb_used"),
                ("fb_free_mib", "fb_free"),
            )
        ]
        rows.append(
            gpu_sample(ts, "xid", s["xid"], labels_json=labels(err_code=str(int(s["xid"]))), **pod)
        )
        return rows
