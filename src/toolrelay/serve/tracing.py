"""Server spans and ``mcp.server.operation.duration`` after the OTel MCP conventions.

:class:`McpServerTelemetry` is server middleware in place of the MCP SDK's own
``OpenTelemetryMiddleware`` (which uses only the global tracer provider and leaves out the
session and transport). A request's span continues the context the client sent in
``params._meta``, even when no tracer provider records, so upstream servers still see the
client's trace. Names, attributes and errors: ``docs/telemetry.md``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, RequestId
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import context, propagate, trace
from opentelemetry.metrics import MeterProvider
from pydantic import ValidationError
from starlette.types import Scope

from .._version import __version__
from ..telemetry.semconv import mcp_server_duration

_TARGETS = {"tools/call": "gen_ai.tool.name", "prompts/get": "gen_ai.prompt.name"}
_MAX_TARGET = 128


class McpServerTelemetry:
    """Server middleware: a ``SERVER`` span and a duration observation per request.

    ``tracer_provider`` and ``meter_provider`` default to the global ones (the dispatcher's
    tracer provider is what ``toolrelay serve`` passes).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer("toolrelay.serve", __version__, tracer_provider)
        self.durations = mcp_server_duration(meter_provider)
        self._provider = tracer_provider
        self._tracing = False
        self._checked_at = float("-inf")

    def tracing(self, now: float) -> bool:
        """Is anyone collecting spans? Re-checked at most once a second (``now``: a
        ``perf_counter()`` reading) until a provider that records is found."""
        if self._tracing or now - self._checked_at < 1.0:
            return self._tracing
        self._checked_at = now
        provider = self._provider or trace.get_tracer_provider()
        self._tracing = not isinstance(
            provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
        )
        return self._tracing

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        method = ctx.method
        request = ctx.request  # the HTTP request on streamable HTTP; None on stdio
        scope = getattr(request, "scope", None)
        headers = getattr(request, "headers", None)
        session_id = None if headers is None else headers.get("mcp-session-id")
        name = ctx.params.get("name") if ctx.params and method in _TARGETS else None
        with self.serving(
            method,
            ctx.protocol_version,
            ctx.request_id,
            scope if isinstance(scope, dict) else None,
            session_id,
            name,
            ctx.meta,
        ) as served:
            result = await call_next(ctx)
            if method == "tools/call" and isinstance(result, dict) and result.get("isError"):
                served.tool_error = True
            elif method == "initialize" and isinstance(result, dict):
                version = result.get("protocolVersion")  # negotiated just now
                if isinstance(version, str):
                    served.set("mcp.protocol.version", version)
            return result

    @contextlib.contextmanager
    def serving(
        self,
        method: str,
        protocol_version: str,
        request_id: RequestId | None,
        scope: Scope | None,
        session_id: str | None,
        name: Any,
        meta: Any,
    ) -> Iterator[Served]:
        """The span and duration of one request served in the ``with`` block (``scope``:
        the ASGI scope, ``None`` on stdio; ``name``: ``params.name``; ``meta``:
        ``params._meta``). An exception is recorded as the SDK answers it; cancellation is
        not an error."""
        started = time.perf_counter()
        durations = self.durations
        if durations.histogram is None and started >= durations.next_check:
            durations.check(started)
        if (
            durations.histogram is None
            and not self.tracing(started)
            and not (isinstance(meta, dict) and "traceparent" in meta)
        ):
            # nobody records and there is no client context to continue: nothing to do
            yield Served(trace.INVALID_SPAN, {})
            return
        attributes = request_attributes(method, protocol_version, request_id, scope, session_id)
        target = name[:_MAX_TARGET] if isinstance(name, str) and method in _TARGETS else None
        if target is not None:
            attributes[_TARGETS[method]] = target
        parent = _client_context(meta)
        span = self.tracer.start_span(
            f"{method} {target}" if target else method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes=attributes,
            links=None if parent is None else _ambient_link(),
        )
        served = Served(span, attributes)
        token = context.attach(trace.set_span_in_context(span))
        # (error.type, the JSON-RPC error code if one is answered, the status description)
        error: tuple[str, str | None, str | None] | None = None
        try:
            yield served
        except MCPError as exc:
            code = str(exc.error.code)
            error = (code, code, exc.error.message)
            raise
        except ValidationError:  # answered as invalid params; its text carries client input
            code = str(INVALID_PARAMS)
            error = (code, code, "Invalid request parameters")
            raise
        except Exception as exc:  # the SDK answers it as an internal error
            error = (type(exc).__qualname__, None, None)
            raise
        else:
            if served.tool_error:
                error = ("tool_error", None, None)
        finally:
            context.detach(token)
            # cancellation (the client's notifications/cancelled) is not an error
            if error is not None:
                error_type, rpc_code, message = error
                served.set("error.type", error_type)
                if rpc_code is not None:
                    served.set("rpc.response.status_code", rpc_code)
                span.set_status(trace.StatusCode.ERROR, message)
            span.end()
            ended = time.perf_counter()
            durations = self.durations
            histogram = durations.histogram
            if histogram is None and ended >= durations.next_check:
                histogram = durations.check(ended)
            if histogram is not None:
                kept = {key: attributes[key] for key in _METRIC_KEYS if key in attributes}
                histogram.record(ended - started, kept)


@dataclass(slots=True)
class Served:
    """What a request served under :meth:`McpServerTelemetry.serving` turned out to be."""

    span: trace.Span
    attributes: dict[str, Any]
    tool_error: bool = False
    """Set when a ``tools/call`` is answered with ``isError``."""

    def set(self, key: str, value: Any) -> None:
        """Set an attribute on the span and the duration observation."""
        self.attributes[key] = value
        self.span.set_attribute(key, value)


def request_attributes(
    method: str,
    protocol_version: str,
    request_id: RequestId | None,
    scope: Scope | None,
    session_id: str | None,
) -> dict[str, Any]:
    """A request's attributes known before it is served."""
    attributes: dict[str, Any] = {
        "mcp.method.name": method,
        "mcp.protocol.version": protocol_version,
    }
    if request_id is not None:
        attributes["jsonrpc.request.id"] = str(request_id)
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
    if scope is None:
        attributes["network.transport"] = "pipe"
        return attributes
    attributes["network.transport"] = "tcp"
    attributes["network.protocol.name"] = "http"
    if isinstance(scope.get("http_version"), str):
        attributes["network.protocol.version"] = scope["http_version"]
    client = scope.get("client")
    if client:
        attributes["client.address"] = str(client[0])
        attributes["client.port"] = int(client[1])
    # a session exists only in the 2025-era handshake (2026-era requests stand alone)
    if session_id and protocol_version not in MODERN_PROTOCOL_VERSIONS:
        attributes["mcp.session.id"] = str(session_id)
    return attributes


_METRIC_KEYS = (
    "mcp.method.name", "mcp.protocol.version", "error.type", "gen_ai.tool.name",
    "gen_ai.prompt.name", "gen_ai.operation.name", "rpc.response.status_code",
    "network.transport", "network.protocol.name", "network.protocol.version",
)  # fmt: skip
"""What ``mcp.server.operation.duration`` carries (no ids, addresses or ports)."""


def _client_context(meta: Any) -> context.Context | None:
    """The client's context from ``params._meta``, or ``None`` (then the span's parent is
    the current context) when it sent none or an invalid one."""
    if not isinstance(meta, dict) or "traceparent" not in meta:
        return None
    try:
        extracted = propagate.extract(meta)
    except (TypeError, ValueError):
        return None
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        return None
    return extracted


def _ambient_link() -> list[trace.Link] | None:
    """A link to the transport's span (an instrumented HTTP server's), when there is one:
    the conventions parent the server span on the client's MCP context and link this one."""
    ambient = trace.get_current_span().get_span_context()
    return [trace.Link(ambient)] if ambient.is_valid else None
