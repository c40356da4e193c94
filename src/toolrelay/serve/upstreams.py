"""MCP servers behind the gateway: ``[serve.upstreams.NAME]`` as :class:`McpSource` plugins.

Each upstream is entered (connected, its tools listed) and registered in the dispatcher's
registry before the gateway serves, so its tools run through the whole pipeline (their own
breaker key, deadline, retries, faults) like any other. ``optional = true`` lets the gateway
start without an upstream that cannot be reached (logged); otherwise that is an error.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from ..registry import ToolRegistry
from .auth import resolve_secret
from .errors import ServeError
from .settings import UpstreamSettings

if TYPE_CHECKING:
    from ..sources.mcp import McpSource

__all__ = ["build_source", "open_upstreams"]

log = logging.getLogger("toolrelay.serve")


def _options(upstream: UpstreamSettings) -> dict[str, Any]:
    """The ``McpSource`` options an upstream sets (unset ones keep McpSource's defaults)."""
    options: dict[str, Any] = {"name": upstream.name, "tags": upstream.tags}
    for name in (
        "prefix",
        "timeout_s",
        "connect_timeout_s",
        "risk",
        "max_message_bytes",
        "max_message_values",
    ):
        value = getattr(upstream, name)
        if value is not None:
            options[name] = value
    for name in ("tool_timeouts", "tool_risk"):
        if getattr(upstream, name):
            options[name] = dict(getattr(upstream, name))
    if upstream.count_errors is not False:
        options["count_errors"] = upstream.count_errors
    return options


def build_source(upstream: UpstreamSettings, environ: Mapping[str, str]) -> McpSource:
    """The (not yet entered) source for one upstream."""
    try:
        from ..sources.mcp import McpSource
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ServeError(f"upstream {upstream.name!r}: {exc}") from None
    options = _options(upstream)
    try:
        if upstream.command is not None:
            return McpSource.stdio(
                list(upstream.command),
                breaker_key=upstream.breaker_key,
                env=dict(upstream.env) or None,
                cwd=upstream.cwd,
                errlog=sys.stderr,
                **options,
            )
        assert upstream.url is not None
        headers = dict(upstream.headers)
        if upstream.bearer_token_env is not None:
            token = resolve_secret(
                upstream.bearer_token_env, None, environ, f"upstream {upstream.name!r}"
            )
            headers["Authorization"] = f"Bearer {token}"
        return McpSource.http(
            upstream.url, breaker_key=upstream.breaker_key, headers=headers, **options
        )
    except ValueError as exc:
        raise ServeError(f"upstream {upstream.name!r}: {exc}") from None


async def open_upstreams(
    stack: AsyncExitStack,
    registry: ToolRegistry,
    upstreams: Sequence[UpstreamSettings],
    environ: Mapping[str, str],
) -> list[str]:
    """Connect every upstream (closed with ``stack``) and register it; returns their names."""
    if not upstreams:
        return []
    from ..registry import RegistrationError
    from ..sources.mcp import McpConnectError

    opened = []
    for upstream in upstreams:
        source = build_source(upstream, environ)
        try:
            await stack.enter_async_context(source)
        except McpConnectError as exc:
            if upstream.optional:
                log.warning(
                    "toolrelay serve: skipping optional upstream %s: %s", upstream.name, exc
                )
                continue
            raise ServeError(f"upstream {upstream.name!r}: {exc}") from None
        try:
            registry.register(source)
        except RegistrationError as exc:
            raise ServeError(f"upstream {upstream.name!r}: {exc}") from None
        opened.append(upstream.name)
    return opened
