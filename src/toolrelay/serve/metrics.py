"""The gateway's own Prometheus metrics (calls, list changes, sessions, client limits),
next to the dispatcher's on one registry; the list is in ``docs/serve.md``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..telemetry.metrics import UNKNOWN_TOOL as UNKNOWN_TOOL

CANCELLED = "cancelled"


class GatewayMetrics:
    """Counters of the MCP gateway."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        counter = partial(Counter, namespace="toolrelay", registry=registry)
        gauge = partial(Gauge, namespace="toolrelay", registry=registry)
        self.calls = counter(
            "mcp_tool_calls",
            "MCP tools/call requests, by how they ended (an answer's outcome, or cancelled).",
            ("tool", "outcome"),
        )
        self.list_changed = counter(
            "mcp_list_changed",
            "Tool-list changes announced to MCP clients, by profile.",
            ("profile",),
        )
        self.sessions_open = gauge("mcp_sessions_open", "Open streamable HTTP sessions.")
        self.sessions_refused = counter(
            "mcp_sessions_refused",
            "Requests refused a new streamable HTTP session, by reason (client_limit, full).",
            ("reason",),
        )
        for reason in ("client_limit", "full"):
            self.sessions_refused.labels(reason)
        self.sessions_reaped = counter(
            "mcp_sessions_reaped", "Idle streamable HTTP sessions closed early to admit a new one."
        )
        self.client_rejections = counter(
            "mcp_client_rejected",
            "Requests refused for their client's limits, by client and reason (rate, concurrency).",
            ("client", "reason"),
        )
        self.client_inflight = gauge(
            "mcp_client_inflight", "MCP tools/call requests in flight, by client.", ("client",)
        )

    def track_clients(self, names: Sequence[str], in_flight: Callable[[str], int]) -> None:
        """Create every client's series; its in-flight gauge reads ``in_flight(name)``."""
        for name in names:
            for reason in ("rate", "concurrency"):
                self.client_rejections.labels(name, reason)
            self.client_inflight.labels(name).set_function(partial(in_flight, name))

    def call(self, tool: str, outcome: str) -> None:
        self.calls.labels(tool, outcome).inc()

    def announced(self, profile: str | None) -> None:
        self.list_changed.labels(profile or "").inc()
