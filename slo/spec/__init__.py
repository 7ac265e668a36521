"""SLO specs: the formats a user writes, how they are read, and the validated model they become.

:mod:`slo.spec.document` is the ``llmslo/v1`` format (pydantic models of the YAML),
:mod:`slo.spec.openslo` converts OpenSLO documents into it, :mod:`slo.spec.loader` reads a file
of any supported format, and :mod:`slo.spec.model` validates a document into the
:class:`SloModel` every evaluator and generator consumes. A new input format is a module here
that converts into :class:`SloDocument`; the formats whose SLIs are PromQL (Sloth's CRD,
OpenSLO v1alpha, Pyrra), read by the rule generator only, live in :mod:`slo.spec.formats`
with the table of every format and how a document is recognised.
"""

from __future__ import annotations

from slo.spec.document import (
    GROUP_DIMENSIONS,
    LATENCY_METRICS,
    MAX_OBJECTIVE,
    AlertingSpec,
    AvailabilitySpec,
    GoodputSpec,
    LatencySpec,
    SelectorSpec,
    SloDocument,
    SloSpec,
    format_spec_error,
    parse_spec,
)
from slo.spec.loader import (
    load_spec,
)
from slo.spec.model import (
    Slo,
    SloModel,
    build_model,
)
from slo.spec.openslo import (
    is_openslo,
    openslo_to_spec,
)

__all__ = [
    "GROUP_DIMENSIONS",
    "LATENCY_METRICS",
    "MAX_OBJECTIVE",
    "AlertingSpec",
    "AvailabilitySpec",
    "GoodputSpec",
    "LatencySpec",
    "SelectorSpec",
    "Slo",
    "SloDocument",
    "SloModel",
    "SloSpec",
    "build_model",
    "format_spec_error",
    "is_openslo",
    "load_spec",
    "openslo_to_spec",
    "parse_spec",
]
