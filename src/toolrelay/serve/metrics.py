"""The gateway's own Prometheus metrics, next to the dispatcher's on one registry.

``toolrelay_mcp_tool_calls_total{tool, outcome}`` counts every MCP ``tools/call`` by how it
ended: the answer's outcome (``ok`` or an ``error_type``), or ``cancelled`` when the client
cancelled it (the dispatcher never answered). ``toolrelay_mcp_list_changed_total{profile}``
counts tool-list changes announced to clients.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from ..telemetry.metrics import UNKNOWN_TOOL

__all__ = ["CANCELLED", "GatewayMetrics", "UNKNOWN_TOOL"]

CANCELLED = "cancelled"


class GatewayMetrics:
    """Counters of the MCP gateway."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.calls = Counter(
            "mcp_tool_calls",
            "MCP tools/call requests, by how they ended (an answer's outcome, or cancelled).",
            ("tool", "outcome"),
            namespace="toolrelay",
            registry=registry,
        )
        self.list_changed = Counter(
            "mcp_list_changed",
            "Tool-list changes announced to MCP clients, by profile.",
            ("profile",),
            namespace="toolrelay",
            registry=registry,
        )

    def call(self, tool: str, outcome: str) -> None:
        """Count one ended ``tools/call``."""
        self.calls.labels(tool, outcome).inc()

    def announced(self, profile: str | None) -> None:
        """Count one announced tool-list change."""
        self.list_changed.labels(profile or "").inc()
