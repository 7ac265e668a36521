"""Each autoscaler (HPA) of a kube-state-metrics target, paired with the workload it scales.

One kube-state-metrics target exports every HPA and Deployment of the cluster
(``kube_horizontalpodautoscaler_status_desired_replicas{namespace,horizontalpodautoscaler}``,
``kube_deployment_status_replicas_ready{namespace,deployment}``, …), so its replica gauges
are never summed: each HPA keeps its own series and is paired with its scale target's
ready replicas, in this order:

1. ``info``: ``kube_horizontalpodautoscaler_info``'s ``scaletargetref_name`` (kind
   ``Deployment``), in the HPA's namespace;
2. ``same_name``: without a usable info series (an older kube-state-metrics, or the family
   not allowed by ``--metric-allowlist``), a deployment of the HPA's namespace and name, the
   usual convention (HPAs named otherwise, like KEDA's ``keda-hpa-<name>``, need the info);
3. ``only_one``: the target exports one HPA and one deployment (a single-workload exporter,
   or series without those labels).

An HPA none of these pairs is not judged: it is listed in ``unpaired`` with the reason
(``info_without_target``, ``target_kind:<Kind>``, ``target_not_exported``, ``no_info``,
``no_desired_replicas``) and logged once per target, HPA and reason. Samples whose
``labels_json`` is not JSON (a third-party producer's) are dropped, counted in
``malformed_samples`` and logged once per target.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

import duckdb
import numpy as np

from slo.signals._series import Series

__all__ = ["AUTOSCALER_SIGNALS", "AutoscalerSeries", "Autoscalers", "load_autoscalers"]

log = logging.getLogger(__name__)

#: Signals of the kube-state-metrics dialect, by what they describe.
_HPA_SIGNALS = ("replicas_desired", "replicas_current", "replicas_max")
_DEPLOYMENT_SIGNALS = ("replicas_ready", "replicas_spec")
_INFO = "autoscaler_target"
AUTOSCALER_SIGNALS = (*_HPA_SIGNALS, *_DEPLOYMENT_SIGNALS, _INFO)
_logged: set[tuple[str, str, str]] = set()  # (target, autoscaler, reason) already logged

_Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class AutoscalerSeries:
    """One HPA's replica series and its scale target's, as one kube-state-metrics target
    exports them. ``name`` and ``deployment`` are ``namespace/name`` (``name`` alone when
    the series carry no namespace)."""

    name: str
    deployment: str
    paired_by: str  # info | same_name | only_one
    desired: Series
    ready: Series
    current: Series | None = None
    max_replicas: Series | None = None
    spec_replicas: Series | None = None  # what the deployment's spec asks for


@dataclass
class Autoscalers:
    """The paired HPAs of one target and the ones left unjudged (name → reason)."""

    paired: dict[str, AutoscalerSeries]
    unpaired: dict[str, str]
    pool: str = ""  # the target's (``targets[].pool``), '' when it fronts every pool
    malformed_samples: int = 0  # samples dropped: their labels_json is not JSON


def _name(key: _Key) -> str:
    namespace, name = key
    return f"{namespace}/{name}" if namespace else name


@dataclass
class _Target:
    """What one target exported, before pairing."""

    hpas: dict[_Key, dict[str, Series]]
    deployments: dict[_Key, dict[str, Series]]
    info: dict[_Key, tuple[int, str, str]]  # latest (ts_ms, scaletargetref kind, name)
    pool: str = ""
    malformed: int = 0


def _read(con: duckdb.DuckDBPyConnection, start_ms: int, end_ms: int) -> dict[str, _Target]:
    def label(*names: str) -> str:
        labels = "coalesce(labels_json, '{}')"
        found = ", ".join(f"json_extract_string({labels}, '$.{n}')" for n in names)
        # a third-party producer's malformed labels_json must not fail the whole snapshot
        return f"CASE WHEN json_valid({labels}) THEN coalesce({found}, '') END"

    rows = con.execute(
        f"""
        SELECT instance, any_value(coalesce(pool, model, '')), signal,
               {label("namespace")}, {label("horizontalpodautoscaler", "deployment")},
               {label("scaletargetref_kind")}, {label("scaletargetref_name")},
               list(ts_ms ORDER BY ts_ms), list(value ORDER BY ts_ms)
        FROM engine_samples
        WHERE ts_ms >= ? AND ts_ms <= ? AND value IS NOT NULL AND NOT isnan(value)
          AND signal IN ({", ".join(repr(s) for s in AUTOSCALER_SIGNALS)})
        GROUP BY instance, signal, 4, 5, 6, 7
        """,
        [start_ms, end_ms],
    ).fetchall()
    targets: dict[str, _Target] = defaultdict(lambda: _Target({}, {}, {}))
    for instance, pool, signal, namespace, name, kind, target_name, ts, values in rows:
        target, key = targets[instance], (namespace, name)
        target.pool = target.pool or pool
        if namespace is None:  # labels_json not JSON: whose series it is cannot be told
            target.malformed += len(ts)
            _log_once(instance, "", "malformed labels_json")
        elif signal == _INFO:
            latest = (int(ts[-1]), kind, target_name)
            target.info[key] = max(target.info.get(key, latest), latest)
        else:
            ts_ms, vals = np.array(ts, np.int64), np.array(values, float)
            # one value per scrape (a duplicated series keeps its last)
            last = np.append(ts_ms[1:] != ts_ms[:-1], True)
            group = target.hpas if signal in _HPA_SIGNALS else target.deployments
            group.setdefault(key, {})[signal] = Series(ts_ms[last], vals[last])
    return targets


def _scale_target(target: _Target, key: _Key) -> tuple[_Key | None, str]:
    """The deployment ``key``'s HPA scales and how it was found, or ``None`` and why not."""
    ready = {k for k, s in target.deployments.items() if "replicas_ready" in s}
    problem = "no_info"
    info = target.info.get(key)
    if info is not None:
        _, kind, name = info
        if kind and kind != "Deployment":
            return None, f"target_kind:{kind}"
        if name:
            found = (key[0], name)
            return (found, "info") if found in ready else (None, "target_not_exported")
        problem = "info_without_target"
    if key in ready:
        return key, "same_name"
    if len(target.hpas) == 1 and len(ready) == 1:
        return next(iter(ready)), "only_one"
    return None, problem


def _pair(instance: str, target: _Target) -> Autoscalers:
    out = Autoscalers({}, {}, target.pool, target.malformed)
    for key, signals in sorted(target.hpas.items()):
        name = _name(key)
        deployment, how = _scale_target(target, key)
        if "replicas_desired" not in signals:
            deployment, how = None, "no_desired_replicas"
        if deployment is None:
            out.unpaired[name] = how
            _log_once(instance, name, how)
            continue
        if key in target.info and how != "info":  # malformed info, paired by a fallback
            _log_once(instance, name, "info_without_target")
        workload = target.deployments[deployment]
        out.paired[name] = AutoscalerSeries(
            name,
            _name(deployment),
            how,
            signals["replicas_desired"],
            workload["replicas_ready"],
            signals.get("replicas_current"),
            signals.get("replicas_max"),
            workload.get("replicas_spec"),
        )
    return out


def _log_once(instance: str, name: str, reason: str) -> None:
    if (instance, name, reason) in _logged:
        return
    _logged.add((instance, name, reason))
    if not name:
        log.warning("%s: autoscaler samples dropped: %s", instance, reason)
        return
    log.warning(
        "%s: autoscaler %r not paired with the workload it scales (%s); "
        "autoscaler_lag does not judge it",
        instance,
        name,
        reason,
    )


def load_autoscalers(
    con: duckdb.DuckDBPyConnection, start_ms: int, end_ms: int
) -> dict[str, Autoscalers]:
    """Every target's HPAs with their series between ``start_ms`` and ``end_ms`` (ms),
    paired with their scale targets (module docstring); by target instance."""
    return {
        instance: _pair(instance, target)
        for instance, target in sorted(_read(con, start_ms, end_ms).items())
    }
