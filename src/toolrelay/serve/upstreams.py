"""MCP servers behind the gateway: ``[serve.upstreams.NAME]`` as :class:`McpSource` plugins,
connected and registered before the gateway serves (``optional = true``: start without one
that cannot be reached) and reported to :class:`~toolrelay.serve.health.UpstreamHealth`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import anyio.abc

from ..registry import RegistrationError, ToolRegistry
from ..sources.mcp import McpConnectError, McpSource
from .auth import resolve_secret
from .errors import ServeError
from .health import UpstreamHealth
from .settings import UpstreamSettings

log = logging.getLogger("toolrelay.serve")


def build_source(upstream: UpstreamSettings, environ: Mapping[str, str]) -> McpSource:
    """The (not yet entered) source for one upstream."""
    try:
        if upstream.command is not None:
            return McpSource.stdio(
                list(upstream.command),
                upstream,  # the upstream's settings are its source's options
                env=dict(upstream.env) or None,
                cwd=upstream.cwd,
                errlog=sys.stderr,
            )
        assert upstream.url is not None
        headers = dict(upstream.headers)
        if upstream.bearer_token_env is not None:
            token = resolve_secret(
                upstream.bearer_token_env, None, environ, f"upstream {upstream.name!r}"
            )
            headers["Authorization"] = f"Bearer {token}"
        return McpSource.http(upstream.url, upstream, headers=headers)
    except ValueError as exc:
        raise ServeError(f"upstream {upstream.name!r}: {exc}") from None


class Upstreams:
    """The upstream MCP servers of a running gateway (``async with``), each held open by a
    task of its own, so a hot reload can add, replace or remove one while the gateway
    serves: :meth:`connect` only connects, and a reload registers once all it needs is
    ready."""

    def __init__(
        self,
        registry: ToolRegistry,
        environ: Mapping[str, str],
        health: UpstreamHealth | None = None,
    ) -> None:
        self.registry = registry
        self.environ = environ
        self.health = health
        self.open: dict[str, tuple[UpstreamSettings, McpSource]] = {}
        """The registered upstreams by name: their settings and their source."""
        self._stops: dict[int, anyio.Event] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Upstreams:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        for stop in self._stops.values():
            stop.set()
        assert self._tg is not None
        return await self._tg.__aexit__(*exc_info)

    async def start(self, upstreams: Iterable[UpstreamSettings]) -> list[str]:
        """Connect and register every upstream; returns the names of those opened."""
        for upstream in upstreams:
            source = await self.connect(upstream)
            if source is not None:
                self.register(upstream, source)
        return list(self.open)

    async def connect(self, upstream: UpstreamSettings) -> McpSource | None:
        """Connect one upstream (not yet registered); ``None`` when it is optional and
        cannot be reached (logged, reported to ``health``). Raises :class:`ServeError`."""
        assert self._tg is not None, "use Upstreams as an async context manager"
        source = build_source(upstream, self.environ)
        stop = anyio.Event()
        try:
            await self._tg.start(self._hold, source, stop)
        except McpConnectError as exc:
            if upstream.optional:
                log.warning(
                    "toolrelay serve: skipping optional upstream %s: %s", upstream.name, exc
                )
                if self.health is not None:
                    self.health.skipped(upstream.name, str(exc))
                return None
            raise ServeError(f"upstream {upstream.name!r}: {exc}") from None
        self._stops[id(source)] = stop
        return source

    async def _hold(
        self,
        source: McpSource,
        stop: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with source:  # entered and left in this task, whoever asks for it
            task_status.started()
            await stop.wait()

    def register(self, upstream: UpstreamSettings, source: McpSource) -> None:
        """Put a connected upstream's tools in the registry (raises :class:`ServeError`)."""
        try:
            self.registry.register(source)
        except RegistrationError as exc:
            raise ServeError(f"upstream {upstream.name!r}: {exc}") from None
        self.open[upstream.name] = (upstream, source)
        if self.health is not None:
            self.health.add(upstream.name, source, optional=upstream.optional)

    def unregister(self, name: str) -> McpSource | None:
        """Take an upstream's tools out of the registry (still connected: see :meth:`retire`)."""
        if self.health is not None:
            self.health.remove(name)
        _, source = self.open.pop(name, (None, None))
        if source is not None:
            self.registry.unregister(source)
        return source

    def close(self, source: McpSource) -> None:
        """Close a connected source now (its calls still in flight answer as failures)."""
        stop = self._stops.pop(id(source), None)
        if stop is not None:
            stop.set()
