"""Health of the upstream MCP servers: their state, ``/readyz``, metrics, and pings.

Each upstream is in one of three states:

* ``connected``: its connection is live;
* ``reconnecting``: a connection attempt is under way;
* ``down``: no connection and none being attempted (the next attempt comes after the
  back-off, on a call or a ping; an optional upstream that could not be reached at start
  stays down: it was never registered).

:meth:`UpstreamHealth.run` pings every upstream that said nothing for ``ping_interval_s``
(:meth:`McpSource.ping <toolrelay.sources.mcp.McpSource.ping>`: MCP ``ping``, answered
within the upstream's ``connect_timeout_s``; an upstream that is down is connected again
first, once its back-off allows): a ping that fails or times out marks the connection lost,
like a failed call — so a dead or hung upstream is noticed, and a recovered one comes back,
without a client's call.

The gateway is ready (``/readyz``) when every upstream that is not ``optional`` is
connected. Metrics, read at scrape time: ``toolrelay_mcp_upstream_up{upstream}`` (1 when
connected) and ``toolrelay_mcp_upstream_connection_failures_total{upstream}`` (connection
attempts that failed and connections lost, counted by the source where they happen: in a
client's call, a ping, or the connection itself) and ``toolrelay_mcp_upstream_new_tools_total``
(tools no per-tool risk rule names: :attr:`McpSource.new_tools`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..sources.mcp import McpSource

__all__ = ["DEFAULT_PING_INTERVAL_S", "UpstreamHealth", "UpstreamStatus"]

DEFAULT_PING_INTERVAL_S = 30.0

UpstreamState = Literal["connected", "reconnecting", "down"]


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """One upstream as ``/readyz`` shows it."""

    name: str
    state: UpstreamState
    optional: bool
    failures: int
    last_error: str | None = None
    last_error_at: float | None = None
    """When the last error happened (seconds since the epoch)."""


@dataclass(slots=True)
class _Entry:
    name: str
    optional: bool
    source: McpSource | None
    error: str | None = None  # why an optional upstream was skipped at start
    error_at: float | None = None


class UpstreamHealth:
    """The upstreams of one gateway: their status, readiness, metrics and pings."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        ping_interval_s: float = DEFAULT_PING_INTERVAL_S,
    ) -> None:
        if not 0 < ping_interval_s < float("inf"):
            raise ValueError("ping_interval_s must be a positive number")
        self.ping_interval_s = ping_interval_s
        self._entries: dict[str, _Entry] = {}
        if registry is not None:
            registry.register(_UpstreamCollector(self))

    def add(self, name: str, source: McpSource, *, optional: bool = False) -> None:
        """Watch ``source``, a connected upstream."""
        self._entries[name] = _Entry(name, optional, source)

    def skipped(self, name: str, error: str) -> None:
        """An optional upstream that could not be reached at start (down, not retried)."""
        self._entries[name] = _Entry(name, True, None, error, time.time())

    def remove(self, name: str) -> None:
        """Stop watching an upstream (removed by a reload)."""
        self._entries.pop(name, None)

    def statuses(self) -> list[UpstreamStatus]:
        """Every upstream's status, by name."""
        return [self._status(entry) for _, entry in sorted(self._entries.items())]

    def _status(self, entry: _Entry) -> UpstreamStatus:
        source = entry.source
        if source is None:
            return UpstreamStatus(entry.name, "down", True, 1, entry.error, entry.error_at)
        at, error = source.last_error or (None, None)
        return UpstreamStatus(
            entry.name,
            source.connection_state,
            entry.optional,
            source.connection_failures,
            error,
            at,
        )

    def not_ready(self) -> str | None:
        """Why the gateway is not ready (a required upstream is not connected), or None."""
        down = [
            status.name
            for status in self.statuses()
            if not status.optional and status.state != "connected"
        ]
        if not down:
            return None
        return f"upstream MCP server(s) not connected: {', '.join(down)}"

    async def run(self) -> None:
        """Every ``ping_interval_s``, ping the upstreams idle that long (and retry those
        down), until cancelled."""
        while True:
            await anyio.sleep(self.ping_interval_s)
            async with anyio.create_task_group() as tg:
                for entry in list(self._entries.values()):
                    if entry.source is not None and self._due(entry.source):
                        tg.start_soon(entry.source.ping, entry.source.connect_timeout_s)

    def _due(self, source: McpSource) -> bool:
        state = source.connection_state
        # a ping answered at the start of the last round is ping_interval_s old by now
        # (the sleep starts when the round ends): tolerate a clock's early wake-up
        idle = source.idle_s >= self.ping_interval_s * 0.99
        return state == "down" or (state == "connected" and idle)


class _UpstreamCollector(Collector):
    def __init__(self, health: UpstreamHealth) -> None:
        self._health = health

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily(
            "toolrelay_mcp_upstream_up",
            "Whether the upstream MCP server is connected (1) or not (0).",
            labels=("upstream",),
        )
        failures = CounterMetricFamily(
            "toolrelay_mcp_upstream_connection_failures",
            "Connection attempts to the upstream MCP server that failed, and connections "
            "lost (failed pings included).",
            labels=("upstream",),
        )
        new = CounterMetricFamily(
            "toolrelay_mcp_upstream_new_tools",
            "Tools of the upstream MCP server that no tool_risk or tool_risk_override rule "
            "names (renamed or new since the rules were written; each counted once).",
            labels=("upstream",),
        )
        for name, entry in sorted(self._health._entries.items()):
            status = self._health._status(entry)
            up.add_metric((name,), 1.0 if status.state == "connected" else 0.0)
            failures.add_metric((name,), float(status.failures))
            new.add_metric((name,), 0.0 if entry.source is None else len(entry.source.new_tools))
        yield up
        yield failures
        yield new
