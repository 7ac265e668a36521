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
from collections.abc import Callable
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


def _explained_by(cause: Finding, finding: Finding) -> bool:
    """Whether ``finding`` is a symptom ``cause``'s catalog row explains (same instance)."""
    row = SIGNALS.get(cause.signal)
    if row is None or finding.scope != "instance" or finding.scope_id != cause.scope_id:
        return False
    return finding.signal in row.explains or f"{finding.signal}:{finding.basis}" in row.explains


def fold_symptoms(findings: list[Finding]) -> list[Finding]:
    """Findings with the symptoms a cause on the same instance explains (catalog
    ``explains``) folded into the cause's evidence under ``explained``: a stalled engine's
    queue grows with its KV free, which is neither fragmentation nor load to scale for."""
    causes = [
        f
        for f in findings
        if f.scope == "instance" and f.signal in SIGNALS and SIGNALS[f.signal].explains
    ]
    if not causes:
        return findings
    folded: dict[int, list[Finding]] = defaultdict(list)
    kept = []
    for f in findings:
        cause = next((c for c in causes if c is not f and _explained_by(c, f)), None)
        if cause is None:
            kept.append(f)
        else:
            folded[id(cause)].append(f)
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
    """Run every detector, fold the symptoms a cause explains into it
    (:func:`fold_symptoms`), then the pool roll-up; sorted by (signal, scope, scope id).

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
    findings = fold_symptoms(findings)
    findings += pool_findings(snap, findings, cfg)
    return sorted(findings, key=lambda f: f.key)
