"""What the simulated gateway and router expose on ``/metrics``, under real names where they exist.

A real inference gateway's router is the Gateway API Inference Extension's endpoint picker
(EPP); its metrics (ALPHA in the project's docs) are the model here:

* ``inference_objective_request_total{model_name,target_model_name}`` — requests the router
  scheduled (older releases: ``inference_model_request_total``);
* ``inference_objective_request_error_total{model_name,target_model_name,error_code}`` —
  with the EPP's error codes: ``ServiceUnavailable`` (no candidate pod: 503) and
  ``InferencePoolResourceExhausted`` (shed for lack of capacity: 429);
* ``inference_objective_running_requests{model_name}`` — forwarded and not finished;
* ``inference_pool_ready_pods{name}`` — ready endpoints of the pool;
* ``inference_extension_flow_control_queue_size{fairness_id,priority}`` — requests held in
  the router's queue (the EPP's flow-control layer; our bounded admission queue).

A down EPP cannot count its own failures, so what only the gateway in front of it sees keeps
the simulator's prefix: ``llmslo_sim_gateway_requests_total{code,reason}`` (every answer,
including ``router_unavailable``), ``llmslo_sim_gateway_router_up``,
``llmslo_sim_gateway_routing_decisions_total{mode}`` (``fail_open`` while the router is
down), ``llmslo_sim_gateway_queue_depth`` and the locality counters
``llmslo_sim_router_prefix_*``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ERROR_CODES", "GatewayMetrics"]

#: The EPP error code of each refusal the router itself makes (none for router_unavailable:
#: a router that is down does not answer, the gateway does).
ERROR_CODES = {
    "no_eligible_endpoint": "ServiceUnavailable",
    "queue_full": "InferencePoolResourceExhausted",
}
_FAIRNESS = ("default", "0")  # fairness_id, priority: one flow, one priority band


class GatewayMetrics:
    """The gateway's registry and the updates its request path makes (never raises)."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
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
        self.objective_requests = Counter(
            "inference_objective_request",
            "The counter of requests broken out for each model.",
            ["model_name", "target_model_name"],
            registry=r,
        )
        self.objective_errors = Counter(
            "inference_objective_request_error",
            "The counter of requests errors broken out for each model.",
            ["model_name", "target_model_name", "error_code"],
            registry=r,
        )
        self.running = Gauge(
            "inference_objective_running_requests",
            "Number of running requests for each model.",
            ["model_name"],
            registry=r,
        )
        self.ready_pods = Gauge(
            "inference_pool_ready_pods",
            "The number of ready pods for an inference server pool.",
            ["name"],
            registry=r,
        )
        self.flow_queue = Gauge(
            "inference_extension_flow_control_queue_size",
            "The current number of requests being actively managed by the flow control layer.",
            ["fairness_id", "priority"],
            registry=r,
        )
        self.flow_queue.labels(*_FAIRNESS).set(0)

    def queued(self, waiting: int) -> None:
        self.queue_depth.set(waiting)
        self.flow_queue.labels(*_FAIRNESS).set(waiting)

    def refused(self, code: int, reason: str, model: str) -> None:
        """An answer the gateway or router made itself (429/502/503)."""
        self.answers.labels(str(code), reason).inc()
        error_code = ERROR_CODES.get(reason)
        if error_code is not None:  # the router scheduled (and refused) it
            self.objective_requests.labels(model, model).inc()
            self.objective_errors.labels(model, model, error_code).inc()

    def scheduled(self, mode: str, model: str) -> None:
        """The router (or fail-open) picked an endpoint for a request of ``model``."""
        self.decisions.labels(mode).inc()
        if mode != "fail_open":  # fail-open bypasses the router: it sees nothing
            self.objective_requests.labels(model, model).inc()

    def set_ready_pods(self, count: int) -> None:
        self.ready_pods.labels(self.pool).set(count)
