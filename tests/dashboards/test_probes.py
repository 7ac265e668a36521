"""The pages show the users' requests without the prober's, and the prober's apart: the
Requests page's "Probes (entry points)" section (AppTest on real DuckDB files)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import SOURCE_ENV
from tests.dashboards.test_pages import _page
from tests.slo.test_request_sources import END_MS, ENTRY, START_MS, files  # noqa: F401

RANGE = {"from": str(START_MS), "to": str(END_MS)}
Render = Callable[[str, str], AppTest]


@pytest.fixture
def render(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Render:  # noqa: F811
    """Render a page (``path``) on one of the files (``name``: ``tap``, ``mixed-rolled``…)."""

    def _render(name: str, path: str) -> AppTest:
        monkeypatch.setenv(SOURCE_ENV, f"db:{files[name]}")
        app = _page(path, **RANGE)
        assert not app.exception, [e.value for e in app.exception]
        return app

    return _render


@pytest.mark.parametrize("kind", ["", "-rolled"], ids=["raw records", "rollups"])
@pytest.mark.parametrize("path", ["requests", "latency", "fleet"])
def test_the_numbers_shown_are_those_of_the_users_requests_alone(
    render: Render, path: str, kind: str
) -> None:
    def shown(app: AppTest) -> dict[str, str]:
        return {m.label: m.value for m in app.metric}

    with_probes, without = shown(render("mixed" + kind, path)), shown(render("tap" + kind, path))
    assert with_probes and with_probes == without


def test_the_requests_page_shows_each_entry_point_as_the_prober_sees_it(
    render: Render,
    files: dict[str, Path],  # noqa: F811
) -> None:
    app = render("mixed-rolled", "requests")
    assert "Probes (entry points)" in [h.value for h in app.subheader]
    (table,) = [df.value for df in app.dataframe if "entry point" in df.value.columns]
    with duckdb.connect(str(files["mixed"]), read_only=True) as con:
        probes, failed = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE outcome <> 'ok') FROM requests "
            "WHERE source = 'probe' AND received_ts_ms >= ? AND received_ts_ms < ?",
            [START_MS, END_MS],
        ).fetchone() or (0, 0)
    assert failed > 0
    row = table.iloc[0]
    assert list(table["entry point"]) == [ENTRY]
    assert (row["probes"], row["failed"]) == (f"{probes:,}", f"{failed:,}")
    assert row["ok share"] == f"{100 * (probes - failed) / probes:.2f} %"
    assert row["TTFT p50 (median bucket)"].endswith("s")  # probes' TTFT ~1.2 s


def test_without_probe_records_the_section_says_how_to_get_them(render: Render) -> None:
    app = render("tap", "requests")
    assert any("No probe records in this range" in str(c.value) for c in app.caption)
