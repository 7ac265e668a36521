"""Verdict history follows the read-route contract too: rows in ``data``/``count``, or
Arrow, beside the full documents the history endpoint always had."""

from __future__ import annotations

import pyarrow as pa

from api.reads import ARROW_STREAM
from api.verdicts import HISTORY_SCHEMA
from tests.api.conftest import argo_params, auth


def test_history_rows_match_the_stored_documents_as_json_and_arrow(client, fill) -> None:
    fill(300, canary={"ttft_factor": 1.3})
    for window in ("1h", "30m"):
        made = client.get("/api/v1/verdict", params=argo_params(window=window), headers=auth())
        assert made.status_code == 200
    body = client.get("/api/v1/verdicts").json()
    assert body["count"] == 2 == len(body["verdicts"])
    for row, document in zip(body["data"], body["verdicts"], strict=True):
        assert row["verdict_id"] == document["id"]
        assert row["verdict"] == document["summary"]["verdict"] == "fail"
        assert row["canary_requests"] == document["summary"]["canaryRequests"]
    arrow = client.get("/api/v1/verdicts", headers={"Accept": ARROW_STREAM})
    table = pa.ipc.open_stream(arrow.content).read_all()
    assert table.schema == HISTORY_SCHEMA
    assert table.to_pylist() == body["data"]
    assert client.get("/api/v1/verdicts", params={"verdict": "pass"}).json()["count"] == 0
