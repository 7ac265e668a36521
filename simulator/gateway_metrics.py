"""What the simulated gateway and router expose on ``/metrics``, under real names where they exist.

The router in front of the pool speaks one of three name sets (``GatewayConfig.router_names``):

* ``inference-extension`` — the Gateway API Inference Extension's endpoint picker (EPP,
  ALPHA): ``inference_objective_request_total{model_name,target_model_name}`` (requests the
  router scheduled), ``inference_objective_request_error_total{…,error_code}`` with
  ``ServiceUnavailable`` (no candidate pod: 503) and ``InferencePoolResourceExhausted``
  (shed for lack of capacity: 429), ``inference_objective_running_requests{model_name}``,
  ``inference_pool_ready_pods{name}``, ``inference_extension_flow_control_queue_size
  {fairness_id,priority}`` (the flow-control layer; our bounded admission queue),
  ``inference_objective_request_slo_violation_total{…,type}`` (requests that carried
  ``x-llm-d-slo-ttft-ms`` / ``-tpot-ms`` and missed them by the router's clock:
  :mod:`simulator.own_targets`);
* ``llm-d-router`` — llm-d's EPP during its rename: every series under its ``llm_d_epp_``
  name (``request_total``, ``request_error_total`` with ``ResourceExhausted`` for a shed,
  ``request_running``, ``ready_endpoints``, ``flow_control_queue_size``,
  ``request_slo_violation_total``) *and* its deprecated twin above, as llm-d-router emits
  them side by side;
* ``dynamo`` — NVIDIA Dynamo's HTTP frontend: ``dynamo_frontend_requests_total{model,…}``,
  ``dynamo_frontend_queued_requests{model}`` (the gateway's admission queue),
  ``dynamo_frontend_inflight_requests{model}``. Dynamo's frontend has no refusal counter by
  error code (refusals show in the gateway's own answers below) and no counter of missed
  per-request targets.

A down router cannot count its own failures, so what only the gateway in front of it sees
keeps the simulator's prefix: ``llmslo_sim_gateway_requests_total{code,reason}`` (every
answer, including ``router_unavailable``), ``llmslo_sim_gateway_router_up``,
``llmslo_sim_gateway_routing_decisions_total{mode}`` (``fail_open`` while the router is
down), ``llmslo_sim_gateway_queue_depth`` and the locality counters
``llmslo_sim_router_prefix_*``.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ERROR_CODES", "ROUTER_NAMES", "GatewayMetrics", "RouterNames"]

#: The name set the router's metrics use.
RouterNames = Literal["inference-extension", "llm-d-router", "dynamo"]
ROUTER_NAMES: tuple[RouterNames, ...] = get_args(RouterNames)

#: The EPP error code of each refusal the router itself makes, per EPP generation (none for
#: router_unavailable: a router that is down does not answer, the gateway does).
ERROR_CODES: dict[str, dict[str, str]] = {
    "inference-extension": {
        "no_eligible_endpoint": "ServiceUnavailable",
        "queue_full": "InferencePoolResourceExhausted",
    },
    "llm-d-router": {
        "no_eligible_endpoint": "ServiceUnavailable",
        "queue_full": "ResourceExhausted",
    },
    "dynamo": {},
}
_FAIRNESS = ("default", "0")  # fairness_id, priority: one flow, one priority band
# (request, error, running, ready, queue, SLO violation) of each EPP generation emitted
_EPP_NAMES = {
    "old": (
        "inference_objective_request",
        "inference_objective_request_error",
        "inference_objective_running_requests",
        "inference_pool_ready_pods",
        "inference_extension_flow_control_queue_size",
        "inference_objective_request_slo_violation",
    ),
    "new": (
        "llm_d_epp_request",
        "llm_d_epp_request_error",
        "llm_d_epp_request_running",
        "llm_d_epp_ready_endpoints",
        "llm_d_epp_flow_control_queue_size",
        "llm_d_epp_request_slo_violation",
    ),
}


class _Epp:
    """One EPP generation's series."""

    def __init__(self, names: tuple[str, ...], registry: CollectorRegistry) -> None:
        request, error, running, ready, queue, violation = names
        model_labels = ["model_name", "target_model_name"]
        self.requests = Counter(request, "Requests scheduled.", model_labels, registry=registry)
        self.errors = Counter(
            error, "Request errors.", [*model_labels, "error_code"], registry=registry
        )
        self.violations = Counter(
            violation,
            "Counter of SLO violations for each model, target model, and violation type.",
            [*model_labels, "type"],
            registry=registry,
        )
        self.running = Gauge(running, "Running requests.", ["model_name"], registry=registry)
        self.ready = Gauge(ready, "Ready endpoints of the pool.", ["name"], registry=registry)
        self.queue = Gauge(
            queue, "Requests held by flow control.", ["fairness_id", "priority"], registry=registry
        )
        self.queue.labels(*_FAIRNESS).set(0)


class _DynamoFrontend:
    """Dynamo's HTTP frontend series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dynamo_frontend_requests",
            "Total number of LLM requests processed",
            ["model", "endpoint", "request_type", "status", "error_type"],
            registry=registry,
        )
        self.queued = Gauge(
            "dynamo_frontend_queued_requests",
            "Number of requests in HTTP processing queue",
            ["model"],
            registry=registry,
        )
        self.inflight = Gauge(
            "dynamo_frontend_inflight_requests",
            "Number of inflight requests",
            ["model"],
            registry=registry,
        )


class GatewayMetrics:
    """The gateway's registry and the updates its request path makes (never raises).

    ``names``: the router's name set (:data:`ROUTER_NAMES`).
    """

    def __init__(self, pool: str, names: RouterNames = "inference-extension") -> None:
        self.pool = pool
        self.names = names
        self.registry = CollectorRegistry()
        r = self.registry
        self.answers = Counter(
            "llmslo_sim_gateway_requests", "Requests answered", ["code", "reason"], registry=r
        )
        self.decisions = Counter(
            "llmslo_sim_gateway_routing_decisions", "Endpoints picked", ["mode"], registry=r
        )
        self.queue_depth = Gauge("llmslo_sim_gateway_queue_depth", "Requests waiting", registry=r)
        self.router_up = Gauge(
            "llmslo_sim_gateway_router_up", "1 when the router answers", registry=r
        )
        self.router_up.set(1)
        generations = {"inference-extension": ("old",), "llm-d-router": ("new", "old")}
        self._epp = [_Epp(_EPP_NAMES[g], r) for g in generations.get(names, ())]
        self._dynamo = _DynamoFrontend(r) if names == "dynamo" else None

    def queued(self, waiting: int) -> None:
        self.queue_depth.set(waiting)
        for epp in self._epp:
            epp.queue.labels(*_FAIRNESS).set(waiting)
        if self._dynamo is not None:  # the gateway's queue is the pool's, its model the pool's
            self._dynamo.queued.labels(self.pool).set(waiting)

    def refused(self, code: int, reason: str, model: str) -> None:
        """An answer the gateway or router made itself (429/502/503)."""
        self.answers.labels(str(code), reason).inc()
        error_code = ERROR_CODES[self.names].get(reason)
        if error_code is not None:  # the router scheduled (and refused) it
            for epp in self._epp:
                epp.requests.labels(model, model).inc()
                epp.errors.labels(model, model, error_code).inc()
        if self._dynamo is not None:
            error_type = "overload" if code in (429, 503) else "internal"
            self._dynamo.requests.labels(
                model, "chat_completions", "stream", "error", error_type
            ).inc()

    def scheduled(self, mode: str, model: str) -> None:
        """The router (or fail-open) picked an endpoint for a request of ``model``."""
        self.decisions.labels(mode).inc()
        if mode == "fail_open":  # fail-open bypasses the router: it sees nothing
            return
        for epp in self._epp:
            epp.requests.labels(model, model).inc()
        if self._dynamo is not None:
            self._dynamo.requests.labels(model, "chat_completions", "stream", "success", "").inc()

    def missed_target(self, model: str, kind: str) -> None:
        """The router judged a request of ``model`` to have missed its own ``kind`` target
        (``ttft`` or ``tpot``; :mod:`simulator.own_targets`). Dynamo's frontend has no such
        counter."""
        for epp in self._epp:
            epp.violations.labels(model, model, kind).inc()

    def forwarding(self, model: str, delta: int) -> None:
        """A request of ``model`` was forwarded (+1) or finished (−1)."""
        for epp in self._epp:
            epp.running.labels(model).inc(delta)
        if self._dynamo is not None:
            self._dynamo.inflight.labels(model).inc(delta)

    def set_ready_pods(self, count: int) -> None:
        for epp in self._epp:
            epp.ready.labels(self.pool).set(count)
