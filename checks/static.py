"""Static evaluators: one small function per ``static.check`` of ``rules.yaml``.

Each takes the rule's parameters and a :class:`StaticInputs` and returns an
:class:`~checks.results.Evidence`; none raises on what the deployment lacks — a missing
input is ``unknown`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from checks.catalog import load_flags
from checks.manifests import Bundle, EngineContainer
from checks.results import Evidence, worst
from pipeline.errors import LlmsloError
from slo.signals.catalog import SIGNALS
from slo.spec import load_spec

__all__ = ["STATIC_CHECKS", "Setting", "StaticInputs", "engine_setting"]

_OFF = {None, "false", "0", "no", "off", "unsupported"}
_RUNBOOKS = Path(__file__).resolve().parents[1] / "docs" / "runbooks"


@dataclass(frozen=True)
class StaticInputs:
    """What the static side reads: manifests / command line, llmslo's config, an SLO spec."""

    bundle: Bundle = field(default_factory=Bundle)
    config: Mapping[str, Any] | None = None
    spec_path: Path | None = None


@dataclass(frozen=True)
class Setting:
    """A feature's value in one engine container and how it was found."""

    value: str | None
    #: ``set`` (a flag or env var), ``default`` (nothing set), ``fixed`` (the engine has no
    #: setting), ``unsupported`` (the release cannot do it)
    how: Literal["set", "default", "fixed", "unsupported"]
    text: str

    @property
    def on(self) -> bool:
        return self.value not in _OFF

    @property
    def explicit(self) -> bool:
        return self.how == "set"


def _version_text(c: EngineContainer) -> str:
    return ".".join(map(str, c.version)) if c.version else "version unknown, assumed current"


def engine_setting(c: EngineContainer, feature: str) -> Setting | None:
    """The feature's setting per ``flags.yaml``; ``None`` when the table knows none."""
    entries = load_flags()[c.engine].features.get(feature)
    if not entries:
        return None
    entry = next((e for e in entries if e.holds(c.version)), entries[-1])
    head = f"{c.engine} {_version_text(c)}"
    if entry.unsupported:
        return Setting("unsupported", "unsupported", f"{head}: {entry.unsupported}")
    if entry.fixed is not None:
        return Setting(entry.fixed, "fixed", f"{head}: {entry.note or entry.fixed}")
    if entry.negate and entry.negate in c.flags:
        return Setting("false", "set", f"{head}: {entry.negate}")
    if entry.flag and entry.flag in c.flags:
        value = c.flags[entry.flag]
        shown = f"{head}: {entry.flag} {value}"
        return Setting("false" if value == entry.off_value else value, "set", shown)
    if entry.env and entry.env in c.env:
        return Setting(c.env[entry.env], "set", f"{head}: {entry.env}={c.env[entry.env]}")
    what = entry.flag or entry.env or entry.negate
    return Setting(entry.default, "default", f"{head}: {what} not set, default {entry.default}")


def _per_engine(inputs: StaticInputs, judge: Callable[[EngineContainer], Evidence]) -> Evidence:
    """One verdict per engine container, combined: any fail fails, all pass passes."""
    if not inputs.bundle.engines:
        reason = "; ".join(inputs.bundle.problems) or "no engine container (give -f or --command)"
        return Evidence("unknown", reason)
    verdicts = [(c, judge(c)) for c in inputs.bundle.engines]
    details = "; ".join(f"{c.where}: {e.detail}" for c, e in verdicts)
    return Evidence(worst(e.status for _, e in verdicts), details)


def _feature_on(c: EngineContainer, feature: str) -> Evidence:
    setting = engine_setting(c, feature)
    if setting is None:
        return Evidence("unknown", f"{c.engine}: no known setting for {feature}")
    return Evidence("pass" if setting.on else "fail", setting.text)


def feature_on(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    return _per_engine(inputs, lambda c: _feature_on(c, params["feature"]))


def features_on(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    def judge(c: EngineContainer) -> Evidence:
        found = [_feature_on(c, feature) for feature in params["features"]]
        return Evidence(worst(e.status for e in found), ", ".join(e.detail for e in found))

    return _per_engine(inputs, judge)


def admission(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    ceiling = float(params["max_gpu_memory_utilization"])

    def judge(c: EngineContainer) -> Evidence:
        seqs = engine_setting(c, "max_num_seqs")
        memory = engine_setting(c, "gpu_memory_utilization")
        if seqs is None or memory is None:
            return Evidence("unknown", f"{c.engine}: no known admission settings")
        text = f"{seqs.text}, {memory.text}"
        if not seqs.explicit:
            return Evidence("fail", f"{text}: the concurrency limit is left to the default")
        try:
            fraction = float(memory.value or "")
        except ValueError:
            return Evidence("fail", f"{text}: memory fraction not set explicitly")
        ok = fraction <= ceiling
        return Evidence("pass" if ok else "fail", f"{text} (at most {ceiling:g})")

    return _per_engine(inputs, judge)


def preemption_policy(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    def judge(c: EngineContainer) -> Evidence:
        mode = engine_setting(c, "preemption_mode")
        if mode is None:
            return Evidence("unknown", f"{c.engine}: no known preemption setting")
        # a policy the engine fixes (V1, SGLang: recompute) is chosen; a default is not
        return Evidence("pass" if mode.how in ("set", "fixed") else "fail", mode.text)

    return _per_engine(inputs, judge)


def not_declarable(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    return Evidence("unknown", str(params["reason"]))


def _manifest_unknown(inputs: StaticInputs) -> Evidence | None:
    if inputs.bundle.manifests:
        return None
    reason = "; ".join(inputs.bundle.problems) or "no Kubernetes manifests given (-f)"
    return Evidence("unknown", reason)


def kinds_present(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    missing = _manifest_unknown(inputs)
    if missing:
        return missing
    found = [f"{m.kind}/{m.name}" for m in inputs.bundle.manifests if m.kind in params["kinds"]]
    if found:
        return Evidence("pass", ", ".join(found))
    return Evidence("fail", f"no {' / '.join(params['kinds'])} ({params['reason']})")


def images_present(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    missing = _manifest_unknown(inputs)
    if missing:
        return missing
    found = [
        f"{m.kind}/{m.name}"
        for m in inputs.bundle.manifests
        if any(image in str(m.body) for image in params["images"])
    ]
    if found:
        return Evidence("pass", ", ".join(found))
    return Evidence("fail", f"no {params['reason']} in the manifests")


def config_set(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    path = [str(part) for part in params["path"]]
    if inputs.config is None:
        return Evidence("unknown", f"no llmslo config given (--config) to read {'.'.join(path)}")
    node: Any = inputs.config
    for part in path:
        if not isinstance(node, Mapping) or node.get(part) is None:
            return Evidence("fail", f"{'.'.join(path)} not set ({params['reason']})")
        node = node[part]
    shown = "set" if isinstance(node, Mapping) else repr(node)
    return Evidence("pass", f"{'.'.join(path)} = {shown}")


def spec_slis(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    if inputs.spec_path is None:
        return Evidence("unknown", "no SLO spec given (--spec)")
    try:
        document = load_spec(inputs.spec_path)
    except LlmsloError as exc:
        return Evidence("unknown", f"{inputs.spec_path}: {exc}")
    metrics = {getattr(slo.sli, "metric", None) for slo in document.slos}
    missing = [kind for kind in params["kinds"] if kind not in metrics]
    if missing:
        return Evidence("fail", f"no latency SLO on {', '.join(missing)}")
    return Evidence("pass", f"latency SLOs on {', '.join(params['kinds'])}")


def catalog_signal(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    name = params["signal"]
    if name not in SIGNALS:
        return Evidence("fail", f"the signal catalog has no {name}")
    return Evidence("pass", f"signal {name} in the catalog, alert rules generated from it")


def _pods(inputs: StaticInputs) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    return [(c.where, c.pod, c.container) for c in inputs.bundle.engines if c.pod or c.container]


def _per_pod(
    inputs: StaticInputs, judge: Callable[[Mapping[str, Any], Mapping[str, Any]], Evidence]
) -> Evidence:
    if not _pods(inputs):
        reason = "; ".join(inputs.bundle.problems) or "no engine workload in the manifests (-f)"
        return Evidence("unknown", reason)
    return _per_engine(
        StaticInputs(Bundle(engines=[c for c in inputs.bundle.engines if c.pod or c.container])),
        lambda c: judge(c.pod, c.container),
    )


def autoscaler_cooldown(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    missing = _manifest_unknown(inputs)
    if missing:
        return missing
    floor_s = int(params["min_s"])
    found = []
    for m in inputs.bundle.manifests:
        spec = m.body.get("spec") or {}
        if m.kind == "HorizontalPodAutoscaler":
            down = ((spec.get("behavior") or {}).get("scaleDown")) or {}
            # the HPA's own default scale-down window is 300 s
            found.append((m, int(down.get("stabilizationWindowSeconds", 300))))
        elif m.kind == "ScaledObject":
            found.append((m, int(spec.get("cooldownPeriod", 300))))
    if not found:
        return Evidence("fail", "no HorizontalPodAutoscaler or KEDA ScaledObject")
    short = [f"{m.kind}/{m.name} {s}s" for m, s in found if s < floor_s]
    shown = ", ".join(f"{m.kind}/{m.name} {s}s" for m, s in found)
    return Evidence("fail" if short else "pass", f"{shown} (at least {floor_s}s)")


def graceful_shutdown(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    floor_s = int(params["min_grace_s"])

    def judge(pod: Mapping[str, Any], container: Mapping[str, Any]) -> Evidence:
        grace = int(pod.get("terminationGracePeriodSeconds", 30))
        hook = bool((container.get("lifecycle") or {}).get("preStop"))
        text = f"terminationGracePeriodSeconds {grace}, preStop {'set' if hook else 'missing'}"
        return Evidence("pass" if hook and grace >= floor_s else "fail", text)

    return _per_pod(inputs, judge)


def readiness_probe(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    def judge(pod: Mapping[str, Any], container: Mapping[str, Any]) -> Evidence:
        probe = container.get("readinessProbe")
        if not probe:
            return Evidence("fail", "no readinessProbe")
        path = (probe.get("httpGet") or {}).get("path")
        if path in params["paths"]:
            return Evidence("pass", f"readinessProbe httpGet {path}")
        return Evidence(
            "fail", f"readinessProbe does not ask the engine's health ({path or probe})"
        )

    return _per_pod(inputs, judge)


def nccl_watchdog(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    def judge(c: EngineContainer) -> Evidence:
        tp = engine_setting(c, "tensor_parallel")
        gpus = ((c.container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 1)
        tp_size = tp.value if tp and tp.value and tp.value.isdigit() else "1"
        ranks = max(int(gpus), int(tp_size))
        if ranks <= 1:
            return Evidence("pass", "one GPU: no NCCL collective to watch")
        found = [name for name in params["env"] if name in c.env]
        if found:
            return Evidence("pass", f"{ranks} ranks, {', '.join(found)} set")
        return Evidence("fail", f"{ranks} ranks and none of {', '.join(params['env'])}")

    return _per_engine(inputs, judge)


def auto_restart(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    def judge(pod: Mapping[str, Any], container: Mapping[str, Any]) -> Evidence:
        policy = pod.get("restartPolicy", "Always")
        live = bool(container.get("livenessProbe"))
        text = f"restartPolicy {policy}, livenessProbe {'set' if live else 'missing'}"
        return Evidence("pass" if policy != "Never" and live else "fail", text)

    return _per_pod(inputs, judge)


def zone_spread(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    zone = "topology.kubernetes.io/zone"

    def judge(pod: Mapping[str, Any], container: Mapping[str, Any]) -> Evidence:
        spread = any(
            (item or {}).get("topologyKey") == zone
            for item in pod.get("topologySpreadConstraints") or []
        )
        if spread or zone in str(pod.get("affinity") or {}):
            return Evidence("pass", f"spread over {zone}")
        return Evidence("fail", f"no topologySpreadConstraints or affinity on {zone}")

    return _per_pod(inputs, judge)


def runbooks(params: Mapping[str, Any], inputs: StaticInputs) -> Evidence:
    missing = [
        row.name for row in SIGNALS.values() if not (_RUNBOOKS / f"{row.runbook}.md").exists()
    ]
    if missing:
        return Evidence("fail", f"no runbook for {', '.join(missing)}")
    return Evidence("pass", f"{len(SIGNALS)} signals, each with docs/runbooks/<signal>.md")


StaticCheck = Callable[[Mapping[str, Any], StaticInputs], Evidence]
#: ``static.check`` of ``rules.yaml`` → evaluator.
STATIC_CHECKS: dict[str, StaticCheck] = {
    "feature_on": feature_on,
    "features_on": features_on,
    "admission": admission,
    "preemption_policy": preemption_policy,
    "not_declarable": not_declarable,
    "kinds_present": kinds_present,
    "images_present": images_present,
    "config_set": config_set,
    "spec_slis": spec_slis,
    "catalog_signal": catalog_signal,
    "autoscaler_cooldown": autoscaler_cooldown,
    "graceful_shutdown": graceful_shutdown,
    "readiness_probe": readiness_probe,
    "nccl_watchdog": nccl_watchdog,
    "auto_restart": auto_restart,
    "zone_spread": zone_spread,
    "runbooks": runbooks,
}
