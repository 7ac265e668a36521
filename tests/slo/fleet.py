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

from tests.slo.factories import T0_MS, engine_sample, gpu_sample, health_row, labels, request

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
    probe_every: int = 2  # a readiness probe every this many scrapes (target_health rows)
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
        requests, engine, gpu, _ = self.all_rows()
        return requests, engine, gpu

    def all_rows(
        self,
    ) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]
    ]:
        """Requests, engine samples, GPU samples and target_health rows."""
        rng = random.Random(self.seed)
        requests: list[dict[str, Any]] = []
        engine: list[dict[str, Any]] = []
        gpu: list[dict[str, Any]] = []
        health: list[dict[str, Any]] = []
        states = [self._initial(i) for i in range(self.instances)]
        for n, t in enumerate(range(0, self.seconds + 1, self.scrape_s)):
            ts = T0_MS + t * 1000
            for i, state in enumerate(states):
                self._advance(state, rng)
                start_fault = self.faults.get(i)
                if start_fault and t >= start_fault[0]:
                    start_fault[1](state, t - start_fault[0])
                health.append(self._health_row(ts, state, probe=n % self.probe_every == 0))
                if state["up"]:
                    engine += self._engine_rows(ts, state)
                gpu += self._gpu_rows(ts, state)
                requests += [
                    request(
                        ts - rng.randrange(self.scrape_s * 1000),
                        instance=state["instance"],
                        pool=self.pool,
                        model=self.pool,
                        **self._request_fields(state, rng),
                    )
                    for _ in range(state["requests"])
                ]
        return requests, engine, gpu, health

    def _request_fields(self, s: State, rng: random.Random) -> dict[str, Any]:
        """A request's latencies: log-normal around the state's medians, then overrides."""
        ttft = s["ttft_s"] * rng.lognormvariate(0, 0.3)
        tpot = s["tpot_s"] * rng.lognormvariate(0, 0.2)
        return {"ttft_s": ttft, "tpot_s": tpot, **s["request"]}

    def _health_row(self, ts: int, s: State, *, probe: bool) -> dict[str, Any]:
        row = health_row(
            ts,
            instance=s["instance"],
            target=f"http://{s['instance']}/metrics",
            up=s["up"],
            process_start_s=s["process_start_s"] if s["up"] else None,
            counter_resets=s.pop("resets_now", 0),
        )
        if not s["up"]:
            row.update(http_status=None, error_kind="connect", error="connection refused")
        elif probe:
            row.update(
                ready=s["ready"],
                ready_source="health",
                ready_status=200 if s["ready"] else 503,
                models=s["models"],
            )
        return row

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
            "up": True,
            "ready": True,
            "models": 1,
            "process_start_s": T0_MS / 1000 - 3600,
            "ttft_s": 0.3,
            "tpot_s": 0.03,
            "ranks": None,  # DP ranks: relative token throughput of each, e.g. [1, 1, 1, 1]
            "rank_tokens": None,
        }

    def _advance(self, s: State, rng: random.Random) -> None:
        s["running"] = float(rng.randint(4, 8))
        s["tap_in_flight"] = s["running"]
        s["kv_usage"] = rng.uniform(0.3, 0.5)
        s["generation_tokens"] += s["tokens_per_s"] * self.scrape_s
        if s["ranks"] is not None:
            weights = s["ranks"]
            if s["rank_tokens"] is None or len(s["rank_tokens"]) != len(weights):
                s["rank_tokens"] = [0.0] * len(weights)
            for k, w in enumerate(weights):
                produced = s["tokens_per_s"] * self.scrape_s * w / sum(weights)
                s["rank_tokens"][k] += produced * rng.uniform(0.9, 1.1)
        if rng.random() < 0.3:  # clients leave now and then; the engine aborts them promptly
            s["tap_disconnects"] += 1
            s["aborts"] += 1
        s["gpu_util"] = rng.uniform(60, 90)
        s["engine_active"] = s["gpu_util"] / 100

    def _rank_rows(self, ts: int, s: State) -> list[dict[str, Any]]:
        inst = {"instance": s["instance"], "pool": self.pool, "model": self.pool}
        rows = []
        weights = s["ranks"]
        if s["rank_tokens"] is None or len(s["rank_tokens"]) != len(weights):
            s["rank_tokens"] = [0.0] * len(weights)
        for k, w in enumerate(weights):
            share = w / sum(weights)
            rank = {**inst, "engine": str(k), "dialect": "sglang"}
            rows.append(
                engine_sample(ts, "generation_tokens", s["rank_tokens"][k], kind="counter", **rank)
            )
            rows.append(engine_sample(ts, "running", round(s["running"] * share), **rank))
            rows.append(engine_sample(ts, "waiting", s["waiting"] * share, **rank))
        return rows

    def _engine_rows(self, ts: int, s: State) -> list[dict[str, Any]]:
        inst = {"instance": s["instance"], "pool": self.pool, "model": self.pool}
        if s["ranks"] is not None:
            rows = self._rank_rows(ts, s)
            rows.append(engine_sample(ts, "kv_usage", s["kv_usage"], **inst))
            return rows
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
