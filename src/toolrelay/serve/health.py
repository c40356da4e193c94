"""Health of the upstream MCP servers: their state, ``/readyz``, metrics and pings (what they
mean: docs/serve.md, "Upstream health"); and which config a replica runs (:class:`ConfigInfo`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .admin_models import UpstreamView

if TYPE_CHECKING:
    from ..sources.mcp import McpSource


class ConfigInfo(Collector):
    """``toolrelay_config_info{hash}`` = 1: the content hash of the config file in force
    (``current()``), so that a fleet's replica whose reload failed stands out."""

    def __init__(self, registry: CollectorRegistry, current: Callable[[], str | None]) -> None:
        self.current = current
        registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "toolrelay_config_info",
            "The SHA-256 of the config file this gateway runs (a failed reload keeps the old).",
            labels=("hash",),
        )
        digest = self.current()
        if digest is not None:
            info.add_metric((digest,), 1.0)
        yield info


@dataclass(slots=True)
class _Entry:
    name: str
    optional: bool
    source: McpSource | None
    skipped: tuple[float, str] | None = None  # when and why an optional one was skipped at start


class UpstreamHealth(Collector):
    """The upstreams of one gateway: their status, readiness, metrics (collected from
    ``registry`` at scrape time) and pings."""

    def __init__(self, registry: CollectorRegistry, *, ping_interval_s: float) -> None:
        self.ping_interval_s = ping_interval_s
        self._entries: dict[str, _Entry] = {}
        registry.register(self)

    def add(self, name: str, source: McpSource, *, optional: bool = False) -> None:
        """Watch ``source``, a connected upstream."""
        self._entries[name] = _Entry(name, optional, source)

    def skipped(self, name: str, error: str) -> None:
        """An optional upstream that could not be reached at start (down, not retried)."""
        self._entries[name] = _Entry(name, True, None, (time.time(), error))

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    def statuses(self) -> list[UpstreamView]:
        """Every upstream's status, by name."""
        return [self._status(entry) for _, entry in sorted(self._entries.items())]

    def _status(self, entry: _Entry) -> UpstreamView:
        source = entry.source  # None: skipped at start, down and not retried
        at, error = (entry.skipped if source is None else source.last_error) or (None, None)
        return UpstreamView(
            name=entry.name,
            state="down" if source is None else source.connection_state,
            optional=entry.optional,
            failures=1 if source is None else source.connection_failures,
            last_error=error,
            last_error_at=at,
        )

    def not_ready(self) -> str | None:
        """Why the gateway is not ready (a required upstream is not connected), or None."""
        down = [s.name for s in self.statuses() if not s.optional and s.state != "connected"]
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
                        tg.start_soon(entry.source.ping, entry.source.options.connect_timeout_s)

    def _due(self, source: McpSource) -> bool:
        state = source.connection_state
        # a ping answered at the start of the last round is ping_interval_s old by now
        # (the sleep starts when the round ends): tolerate a clock's early wake-up
        idle = source.idle_s >= self.ping_interval_s * 0.99
        return state == "down" or (state == "connected" and idle)

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
        for name, entry in sorted(self._entries.items()):
            status = self._status(entry)
            up.add_metric((name,), 1.0 if status.state == "connected" else 0.0)
            failures.add_metric((name,), float(status.failures))
            new.add_metric((name,), 0.0 if entry.source is None else len(entry.source.new_tools))
        yield up
        yield failures
        yield new
