"""The generated rules and Alertmanager routes as Prometheus Operator objects.

The Operator loads rules only from ``PrometheusRule`` objects (``monitoring.coreos.com/v1``)
whose labels match a Prometheus' ``ruleSelector``, and routes from ``AlertmanagerConfig``
objects (``v1alpha1``). :func:`prometheus_rule` wraps the plain rule file unchanged (same
groups, same order), so ``spec`` is what ``promtool check rules`` reads;
:func:`alertmanager_config_object` spells the snippet of :mod:`alerts.alertmanager` in the
CRD's camelCase, with matchers as ``{name, value, matchType}`` objects. Object names and
label values are checked here, at the boundary, as the API server would check them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["alertmanager_config_object", "parse_labels", "prometheus_rule"]

#: RFC 1123 subdomain: what the API server accepts as an object name or namespace.
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')

#: Labels every object carries; a Prometheus ``ruleSelector`` usually matches one of them.
DEFAULT_LABELS = {"app.kubernetes.io/part-of": "llmslo"}


def _name(field: str, value: str) -> str:
    if len(value) > 253 or not _DNS_1123.match(value):
        raise ConfigError(f"{field}: {value!r} is not a DNS-1123 name (a-z, 0-9, '-', '.')")
    return value


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """``["k=v", …]`` as a dict of Kubernetes labels; ConfigError naming a bad pair."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _LABEL_NAME.match(key) or len(value) > 63:
            raise ConfigError(f"--label {pair!r}: expected NAME=VALUE with a Kubernetes label name")
        if not _LABEL_VALUE.match(value):
            raise ConfigError(f"--label {pair!r}: {value!r} is not a Kubernetes label value")
        labels[key] = value
    return labels


def _metadata(name: str, namespace: str | None, labels: Mapping[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": _name("--name", name)}
    if namespace is not None:
        metadata["namespace"] = _name("--namespace", namespace)
    metadata["labels"] = {**DEFAULT_LABELS, **labels}
    return metadata


def prometheus_rule(
    rules: Mapping[str, Any],
    name: str,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ``PrometheusRule`` whose ``spec`` is the rule file ``rules`` (``{"groups": [...]}``)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(name, namespace, labels or {}),
        "spec": {"groups": list(rules["groups"])},
    }


def _matchers(texts: list[str]) -> list[dict[str, str]]:
    objects = []
    for text in texts:
        found = _MATCHER.match(text)
        if found is None:  # the snippet is ours: a matcher we cannot parse is a bug here
            raise ConfigError(f'alertmanager matcher {text!r}: expected name<op>"value"')
        objects.append({"name": found[1], "value": found[3], "matchType": found[2]})
    return objects


def _route(route: Mapping[str, Any]) -> dict[str, Any]:
    spelled: dict[str, Any] = {"receiver": route["receiver"]}
    for plain, camel in (
        ("group_by", "groupBy"),
        ("group_wait", "groupWait"),
        ("group_interval", "groupInterval"),
        ("repeat_interval", "repeatInterval"),
    ):
        if plain in route:
            spelled[camel] = route[plain]
    if "matchers" in route:
        spelled["matchers"] = _matchers(route["matchers"])
    if "routes" in route:
        spelled["routes"] = [_route(child) for child in route["routes"]]
    return spelled


def alertmanager_config_object(
    config: Mapping[str, Any],
    name: str,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Alertmanager ``config`` (:func:`alerts.alertmanager.alertmanager_config`) as an
    ``AlertmanagerConfig``. The Operator scopes its routes to the object's namespace (it
    adds a ``namespace`` matcher), so apply it where the alerts' PrometheusRule lives."""
    inhibit = [
        {
            "sourceMatch": _matchers(rule["source_matchers"]),
            "targetMatch": _matchers(rule["target_matchers"]),
            "equal": list(rule["equal"]),
        }
        for rule in config["inhibit_rules"]
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": _metadata(name, namespace, labels or {}),
        "spec": {
            "route": _route(config["route"]),
            "receivers": [dict(receiver) for receiver in config["receivers"]],
            "inhibitRules": inhibit,
        },
    }
