"""The ``alertmanager`` section of the llmslo config file: where path B pushes, and how.

Without ``url`` the SLO jobs still compute their alerts and record every state change in
the ``alerts`` topic and table (``llmslo alerts`` lists them); with it they also post them
to that Alertmanager's ``/api/v2/alerts``.
"""

from __future__ import annotations

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from slo.signals.catalog import RUNBOOK_BASE_URL

__all__ = ["AlertmanagerConfig"]


class AlertmanagerConfig(BaseModel):
    """Push target, re-send cadence, the client's bounds, and the dashboard for deep links."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: AnyHttpUrl | None = Field(
        default=None,
        description="Alertmanager base URL, e.g. http://127.0.0.1:9093 (none: no push)",
    )
    dashboard_url: AnyHttpUrl | None = Field(
        default=None,
        description="dashboards base URL for each alert's generatorURL, e.g. http://127.0.0.1:8501",
    )
    resend_s: float = Field(
        default=60.0, gt=0, description="seconds between re-sends of a firing alert"
    )
    timeout_s: float = Field(default=5.0, gt=0, description="HTTP timeout of one POST")
    retries: int = Field(default=3, ge=0, le=10, description="retries of one POST")
    backoff_s: float = Field(default=0.5, gt=0, description="first retry delay (doubles)")
    max_queue: int = Field(
        default=10_000, ge=1, description="payloads kept through an outage (oldest dropped)"
    )
    runbook_base_url: str = Field(
        default=RUNBOOK_BASE_URL,
        min_length=1,
        description="base of each alert's runbook_url ({base}/{signal}.md), e.g. "
        "https://github.com/org/llmslo/blob/main/docs/runbooks",
    )
    include_info: bool = Field(
        default=False, description="also push findings of severity info (default: page, ticket)"
    )
