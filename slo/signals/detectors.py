"""Failure-signature detectors (DESIGN §3): each reads a :class:`Snapshot`, returns findings.

Every finding names its signal, scope (instance or pool), severity, the *basis* it rests
on and the evidence (numbers and thresholds) so an on-call engineer can check it.
Detectors are data: :data:`DETECTORS` derives from the signal catalog
(:mod:`slo.signals.catalog`), so adding a signal is writing one function and one catalog row
(see ``slo/README.md``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace

from slo.signals._serving import by_pool
from slo.signals.catalog import SIGNALS, detectors_of
from slo.signals.config import Detector, DetectorConfig
from slo.signals.findings import Finding, gini
from slo.signals.snapshot import Snapshot

__all__ = [
    "DETECTORS",
    "DetectorConfig",
    "Finding",
    "detect_all",
    "fold_symptoms",
    "gini",
    "pool_findings",
    "suspected_causes",
]

log = logging.getLogger(__name__)


#: Detector name → detector, derived from the signal catalog (:mod:`slo.signals.catalog`).
DETECTORS: dict[str, Detector] = detectors_of(SIGNALS)


def _pooled(signal: str) -> bool:
    row = SIGNALS.get(signal)
    return row is None or row.pooled


def pool_findings(snap: Snapshot, findings: list[Finding], cfg: DetectorConfig) -> list[Finding]:
    """A per-instance signal held by more than ``pool_share`` of a pool's instances, on the pool."""
    sizes = {pool: len(instances) for pool, instances in by_pool(snap).items()}
    hit: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in findings:
        if f.scope == "instance" and _pooled(f.signal):
            hit[(f.signal, f.pool)].append(f.scope_id)
    out = []
    for (signal, pool), instances in sorted(hit.items()):
        size = sizes.get(pool, 0)
        if size >= 2 and len(instances) / size > cfg.pool_share:
            severity = next(f.severity for f in findings if f.signal == signal)
            evidence = {
                "instances": sorted(instances),
                "pool_instances": size,
                "pool_share": cfg.pool_share,
            }
            out.append(
                Finding(snap.now_ms, signal, "pool", pool, pool, severity, "instances", evidence)
            )
    return out


def _explains(cause: str, finding: Finding) -> bool:
    """Whether ``cause``'s catalog row names ``finding`` (an instance's) among its symptoms."""
    row = SIGNALS.get(cause)
    if row is None or finding.scope != "instance":
        return False
    return finding.signal in row.explains or f"{finding.signal}:{finding.basis}" in row.explains


def _explained_by(cause: Finding, finding: Finding) -> bool:
    """Whether ``finding`` is a symptom ``cause``'s catalog row explains (same instance)."""
    return finding.scope_id == cause.scope_id and _explains(cause.signal, finding)


def suspected_causes(
    snap: Snapshot, cfg: DetectorConfig, on_error: Callable[[str], None] | None = None
) -> dict[str, dict[str, str]]:
    """Cause signal → instances where it explains symptoms without a finding in this cycle
    (catalog ``suspects``: pending, or cleared less than its hold ago). One that raises is
    logged and skipped (``on_error(name)`` is told): its symptoms are then reported."""
    out = {}
    for name, row in SIGNALS.items():
        if row.suspects is None or not row.explains:
            continue
        try:
            out[name] = row.suspects(snap, cfg)
        except Exception:
            log.exception("suspects of %s failed at %d; its symptoms stand", name, snap.now_ms)
            if on_error is not None:
                on_error(f"{row.detector_key}:suspects")
    return out


def _suspected(finding: Finding, suspected: Mapping[str, Mapping[str, str]]) -> str | None:
    """The cause suspected on ``finding``'s instance that explains it, if any."""
    return next(
        (
            cause
            for cause, instances in sorted(suspected.items())
            if finding.scope_id in instances and _explains(cause, finding)
        ),
        None,
    )


def fold_symptoms(
    findings: list[Finding], suspected: Mapping[str, Mapping[str, str]] | None = None
) -> list[Finding]:
    """Findings with the symptoms a cause on the same instance explains (catalog
    ``explains``) folded into the cause's evidence under ``explained``: a stalled engine's
    queue grows with its KV free, which is neither fragmentation nor load to scale for.

    Where the cause has no finding in this cycle but is ``suspected`` there
    (:func:`suspected_causes`: about to be confirmed, or just cleared), the symptom is no
    finding either: the cycles that hold the cause's finding carry it as evidence, and a
    symptom that outlives the suspicion is reported then.
    """
    causes = [
        f
        for f in findings
        if f.scope == "instance" and f.signal in SIGNALS and SIGNALS[f.signal].explains
    ]
    if not causes and not suspected:
        return findings
    folded: dict[int, list[Finding]] = defaultdict(list)
    kept = []
    for f in findings:
        cause = next((c for c in causes if c is not f and _explained_by(c, f)), None)
        if cause is not None:
            folded[id(cause)].append(f)
        elif (suspect := _suspected(f, suspected or {})) is not None:
            log.debug(
                "%s on %s at %d: explained by %s (%s)",
                f.signal,
                f.scope_id,
                f.ts_ms,
                suspect,
                (suspected or {})[suspect][f.scope_id],
            )
        else:
            kept.append(f)
    out = []
    for f in kept:
        symptoms = folded.get(id(f))
        if symptoms:
            explained = {s.signal: {"basis": s.basis, **s.evidence} for s in symptoms}
            f = replace(f, evidence={**f.evidence, "explained": explained})
        out.append(f)
    return out


def detect_all(
    snap: Snapshot, cfg: DetectorConfig, on_error: Callable[[str], None] | None = None
) -> list[Finding]:
    """Run every detector, fold the symptoms a cause explains into it, or leave them out
    where the cause is suspected without a finding (:func:`fold_symptoms`), then the pool
    roll-up; sorted by (signal, scope, scope id).

    A detector that raises on odd data is logged and skipped (``on_error(name)`` is told),
    so one broken detector never costs the cycle the others' findings, flags and alerts.
    """
    findings: list[Finding] = []
    for name, detector in DETECTORS.items():
        try:
            findings += detector(snap, cfg)
        except Exception:
            log.exception("detector %s failed at %d; its findings are skipped", name, snap.now_ms)
            if on_error is not None:
                on_error(name)
    findings = fold_symptoms(findings, suspected_causes(snap, cfg, on_error))
    findings += pool_findings(snap, findings, cfg)
    return sorted(findings, key=lambda f: f.key)
