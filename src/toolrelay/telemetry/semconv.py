"""Histograms after the OpenTelemetry GenAI and MCP semantic conventions (metrics API only).

``gen_ai.execute_tool.duration`` (every dispatch) and ``mcp.server.operation.duration``
(``toolrelay serve``) are recorded through ``opentelemetry.metrics``, beside the Prometheus
metrics, for backends that read the conventions' names. toolrelay never configures the
SDK: the host does (a global ``MeterProvider``, or one passed in). Until one is configured
nothing is recorded, and finding that out costs a comparison per call: the provider is
looked at again at most once a second (it can be set later, once).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import metrics
from opentelemetry.util.types import Attributes

from .._version import __version__

TOOL_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                40.96, 81.92)  # fmt: skip
"""The buckets the GenAI conventions advise for ``gen_ai.execute_tool.duration``."""

MCP_SERVER_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
"""The buckets the MCP conventions advise for ``mcp.server.operation.duration``."""

CHECK_INTERVAL_S = 1.0


@dataclass(slots=True)
class LazyHistogram:
    """A histogram created once a meter provider records (``provider``, else the global
    one). ``histogram`` is ``None`` until then; callers call :meth:`check` only when
    ``histogram`` is ``None`` and ``now >= next_check``, so a process without an SDK pays a
    comparison per observation.
    """

    name: str
    description: str
    buckets: Sequence[float]
    provider: metrics.MeterProvider | None = None
    histogram: metrics.Histogram | None = None
    next_check: float = float("-inf")

    def check(self, now: float) -> metrics.Histogram | None:
        """The histogram if a provider records now (looked at once a ``CHECK_INTERVAL_S``)."""
        self.next_check = now + CHECK_INTERVAL_S
        provider = self.provider or metrics.get_meter_provider()
        # the API's no-op, or its placeholder until set_meter_provider() (not exported)
        if isinstance(provider, metrics.NoOpMeterProvider) or (
            type(provider).__name__ == "_ProxyMeterProvider"
        ):
            return None
        meter = provider.get_meter("toolrelay", __version__)
        self.histogram = meter.create_histogram(
            self.name,
            unit="s",
            description=self.description,
            explicit_bucket_boundaries_advisory=self.buckets,
        )
        return self.histogram


def execute_tool_duration(provider: metrics.MeterProvider | None = None) -> LazyHistogram:
    """``gen_ai.execute_tool.duration``: one observation per dispatch, the span's duration."""
    return LazyHistogram(
        "gen_ai.execute_tool.duration", "The duration of a single tool execution.",
        TOOL_BUCKETS, provider,
    )  # fmt: skip


def mcp_server_duration(provider: metrics.MeterProvider | None = None) -> LazyHistogram:
    """``mcp.server.operation.duration``: one observation per MCP request served."""
    return LazyHistogram(
        "mcp.server.operation.duration",
        "MCP request or notification duration as observed on the receiver from the time it "
        "was received until the result or ack is sent.",
        MCP_SERVER_BUCKETS, provider,
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def tool_attributes(tool: str, outcome: str) -> Attributes:
    """The attributes of a ``gen_ai.execute_tool.duration`` observation (``tool`` is the
    bounded metrics label: a name nobody registered is ``_unknown``)."""
    attributes = {"gen_ai.tool.name": tool, "gen_ai.tool.type": "function"}
    if outcome != "ok":
        attributes["error.type"] = outcome
    return attributes
