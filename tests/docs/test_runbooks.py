"""The runbooks under ``docs/runbooks/`` follow the code: one per signal the detectors emit
(each XID class its own), every section an on-call engineer looks for, every threshold they
quote named by its real config key with its real default, the alert name and dashboard page
the pushed alert carries, the alert's one-line ``runbook`` annotation, and an index row each."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from alerts.active import FLAG_ALERT, RUNBOOKS, active_alerts
from dashboards.views import PAGES
from slo.flags import FlagPolicy
from slo.signals.detectors import DETECTORS, DetectorConfig, Finding
from slo.signals.xid import XID_CLASSES, XID_CODES

RUNBOOK_DIR = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
SECTIONS = (
    "What it means",
    "Evidence fields",
    "What to check first",
    "Safe response",
    "Related signals",
    "Dashboard",
)
#: Signals every finding can carry: the detectors' names, the XID detector by its classes.
SIGNALS = sorted(
    [name for name in DETECTORS if name != "xid"] + [c.signal for c in XID_CLASSES.values()]
)
#: Runbooks that are no finding: SLO burn per SLI kind and the degradation flags.
OTHERS = {
    "slo-latency": "slo:latency",
    "slo-availability": "slo:availability",
    "slo-goodput": "slo:goodput",
    "degradation-level": "flag:L3",
}
ALL = SIGNALS + sorted(OTHERS)
#: ``slo.<section>.<key>`` as a runbook names a threshold, optionally ``(default <value>)``.
CONFIG_KEY = re.compile(r"`slo\.(detectors|flags)\.([a-z0-9_]+)`(?: \(default ([^)]+)\))?")
MODELS: dict[str, Any] = {"detectors": DetectorConfig(), "flags": FlagPolicy()}


def _text(name: str) -> str:
    return (RUNBOOK_DIR / f"{name}.md").read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """Level-2 heading → its body."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def _flat(text: str) -> str:
    return " ".join(text.replace("> ", " ").split())


def _alert(signal: str) -> tuple[str, str]:
    """(alertname, dashboard page) of the alert a finding of ``signal`` is pushed as."""
    finding = Finding(0, signal, "instance", "pod-0", "pool-a", "page", "basis", {})
    (alert,) = active_alerts(0, findings=[finding], dashboard_url="http://dash")
    page = alert.generator_url.removeprefix("http://dash/").split("?")[0]
    return alert.labels["alertname"], page


def test_every_emitted_signal_has_a_runbook_and_no_runbook_is_orphaned() -> None:
    present = sorted(p.stem for p in RUNBOOK_DIR.glob("*.md") if p.stem != "README")
    assert present == sorted(ALL)


@pytest.mark.parametrize("name", ALL)
def test_a_runbook_has_every_section_in_order(name: str) -> None:
    titles = list(_sections(_text(name)))
    assert titles == list(SECTIONS), f"{name}.md sections"
    assert all(body.strip() for body in _sections(_text(name)).values()), f"{name}.md empty section"


@pytest.mark.parametrize("name", ALL)
def test_every_config_key_a_runbook_names_exists_with_the_default_it_quotes(name: str) -> None:
    for section, key, default in CONFIG_KEY.findall(_text(name)):
        model = MODELS[section]
        assert key in type(model).model_fields, f"{name}.md names slo.{section}.{key}"
        if default:
            actual = getattr(model, key)
            quoted: Any = default
            if isinstance(actual, bool | int | float):
                quoted = float(default.replace("_", "").replace(" ", ""))
            else:
                actual = str(actual)
            assert quoted == actual, f"{name}.md: slo.{section}.{key} default {default}"


@pytest.mark.parametrize("signal", SIGNALS)
def test_a_signal_runbook_names_its_alert_and_the_page_its_alert_links_to(signal: str) -> None:
    alertname, page = _alert(signal)
    text = _text(signal)
    assert f"`{alertname}`" in text
    assert page in PAGES
    assert f"**{page}**" in _sections(text)["Dashboard"]


@pytest.mark.parametrize("name", ["slo-latency", "slo-availability", "slo-goodput"])
def test_an_slo_runbook_opens_the_slo_page(name: str) -> None:
    assert "**slo**" in _sections(_text(name))["Dashboard"]


def test_the_degradation_runbook_names_its_alert_and_page() -> None:
    text = _text("degradation-level")
    assert f"`{FLAG_ALERT}`" in text
    assert "**flags**" in _sections(text)["Dashboard"]


@pytest.mark.parametrize("key", sorted(RUNBOOKS))
def test_the_alerts_one_line_runbook_is_quoted_in_its_runbook(key: str) -> None:
    name = next((n for n, k in OTHERS.items() if k == key), key)
    if key == "flag:L2":
        name = "degradation-level"
    assert _flat(RUNBOOKS[key]) in _flat(_text(name)), f"{name}.md quotes RUNBOOKS[{key!r}]"


@pytest.mark.parametrize("xid_class", sorted(XID_CLASSES))
def test_an_xid_runbook_lists_every_code_of_its_class(xid_class: str) -> None:
    text = _text(XID_CLASSES[xid_class].signal)
    codes = [c for c in XID_CODES.values() if c.xid_class == xid_class]
    for code in codes:
        assert re.search(rf"\b{code.code}\b", text), f"XID {code.code} ({code.name})"
    assert f"**Severity** {XID_CLASSES[xid_class].severity}" in text


def test_the_index_links_every_runbook_once_with_its_scope_and_severity() -> None:
    index = (RUNBOOK_DIR / "README.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^\| (.+?) \| (.+?) \| (.+?) \| (.+?) \| \[[^]]+\]\(([^)]+)\.md\) \|$", index, re.MULTILINE
    )
    linked = [row[4] for row in rows]
    assert sorted(linked) == sorted(ALL)
    for signal, scope, severity, _meaning, link in rows:
        if link in SIGNALS:
            assert signal == f"`{link}`", f"index row {link}"
        header = _text(link)
        assert f"**Scope** {scope}" in header, f"{link}: scope in the index and the runbook"
        assert f"**Severity** {severity}" in header, (
            f"{link}: severity in the index and the runbook"
        )
