"""The gateway's own Prometheus metrics, next to the dispatcher's on one registry.

``toolrelay_mcp_tool_calls_total{tool, outcome}`` counts every MCP ``tools/call`` by how it
ended: the answer's outcome (``ok`` or an ``error_type``), or ``cancelled`` when the client
cancelled it (the dispatcher never answered). ``toolrelay_mcp_list_changed_total{profile}``
counts tool-list changes announced to clients.

Streamable HTTP sessions: ``toolrelay_mcp_sessions_open`` is how many are open,
``toolrelay_mcp_sessions_refused_total{reason}`` counts ``initialize`` requests refused a
session (``reason`` is ``client_limit``: the client has ``max_sessions_per_client`` open, 429;
or ``full``: ``max_sessions`` are open and none is idle, 503), and
``toolrelay_mcp_sessions_reaped_total`` counts idle sessions closed early to admit a new one.

Clients (see :mod:`.client_limits`): ``toolrelay_mcp_client_rejected_total{client, reason}``
counts requests refused for a client's limits (``reason`` is ``rate`` or ``concurrency``),
``toolrelay_mcp_client_inflight{client}`` is each client's ``tools/call`` requests in flight.
``client`` is a configured client's name, ``default`` (no clients configured) or
``unauthenticated``: never more values than the config has clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..telemetry.metrics import UNKNOWN_TOOL

__all__ = ["CANCELLED", "UNKNOWN_TOOL", "ClientRejection", "GatewayMetrics", "RefusalReason"]

CANCELLED = "cancelled"
RefusalReason = Literal["client_limit", "full"]
ClientRejection = Literal["rate", "concurrency"]


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
        self.sessions_open = Gauge(
            "mcp_sessions_open",
            "Open streamable HTTP sessions.",
            namespace="toolrelay",
            registry=registry,
        )
        self.sessions_refused = Counter(
            "mcp_sessions_refused",
            "Requests refused a new streamable HTTP session, by reason (client_limit, full).",
            ("reason",),
            namespace="toolrelay",
            registry=registry,
        )
        for reason in ("client_limit", "full"):
            self.sessions_refused.labels(reason)
        self.sessions_reaped = Counter(
            "mcp_sessions_reaped",
            "Idle streamable HTTP sessions closed early to admit a new one.",
            namespace="toolrelay",
            registry=registry,
        )

        self.client_rejections = Counter(
            "mcp_client_rejected",
            "Requests refused for their client's limits, by client and reason (rate, concurrency).",
            ("client", "reason"),
            namespace="toolrelay",
            registry=registry,
        )
        self.client_inflight = Gauge(
            "mcp_client_inflight",
            "MCP tools/call requests in flight, by client.",
            ("client",),
            namespace="toolrelay",
            registry=registry,
        )

    def track_clients(self, names: Sequence[str], in_flight: Callable[[str], int]) -> None:
        """Create every client's series; its in-flight gauge reads ``in_flight(name)``."""
        for name in names:
            for reason in ("rate", "concurrency"):
                self.client_rejections.labels(name, reason)
            self.client_inflight.labels(name).set_function(partial(in_flight, name))

    def client_rejected(self, client: str, reason: ClientRejection) -> None:
        """Count one request refused for ``client``'s limits."""
        self.client_rejections.labels(client, reason).inc()

    def count_sessions(self, count: Callable[[], int]) -> None:
        """Read the open-session gauge from ``count`` at scrape time."""
        self.sessions_open.set_function(count)

    def refused(self, reason: RefusalReason) -> None:
        """Count one refused new session."""
        self.sessions_refused.labels(reason).inc()

    def reaped(self) -> None:
        """Count one idle session closed to admit a new one."""
        self.sessions_reaped.inc()

    def call(self, tool: str, outcome: str) -> None:
        """Count one ended ``tools/call``."""
        self.calls.labels(tool, outcome).inc()

    def announced(self, profile: str | None) -> None:
        """Count one announced tool-list change."""
        self.list_changed.labels(profile or "").inc()
