"""MCP servers as a plugin source.

:class:`McpSource` connects to one MCP server (a local process over stdio, or a remote
endpoint over streamable HTTP) with the MCP Python SDK 2.x and offers the server's tools as
toolrelay tools::

    from toolrelay.sources.mcp import McpSource, McpSourceOptions

    time = McpSourceOptions(breaker_key="mcp-time")
    async with McpSource.stdio(["mcp-server-time"], time) as source:
        registry.register(source)
        ...  # dispatch as usual; the source closes the session and the process on exit

    docs = McpSourceOptions(breaker_key="docs", prefix="docs")
    async with McpSource.http("http://127.0.0.1:8000/mcp", docs,
                              headers={"Authorization": "Bearer …"}) as source:
        registry.register(source)

Options: :class:`~.options.McpSourceOptions`. How tools and results are mapped, the raw
lane for stdio ``tools/call`` (:mod:`.rawlane`) and how failures and reconnects look to a
call: ``docs/serve.md``. A server that is gone never makes an exception escape
``dispatch``: the call gets a retryable ``ToolError`` the breaker counts, and the next call
after the back-off reconnects (:mod:`.mcp_connection`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..contract import AuthContext, ErrorType, ToolDeclaration, ToolError
from .options import McpSourceOptions

try:
    import mcp.types as mcp_types
    from mcp import StdioServerParameters
    from mcp.client import Transport
    from mcp.types.version import MODERN_PROTOCOL_VERSIONS
    from opentelemetry.propagate import inject

    from .connection import Connection
    from .errors import (
        AnswerTooLarge,
        Disconnected,
        McpConnectError,
        NotAToolResult,
        Refused,
        Unreachable,
        cap,
        map_mcp_errors,
    )
    from .http import http_transport
    from .mcp_connection import Connector
    from .mcp_mapping import (
        ToolMap,
        call_result,
        error_text,
        object_schema,
        plain_text,
        result_data,
    )
    from .relay import CALL_CHANNEL, CallChannel, forwarded_meta
    from .stdio import capped_stdio_client
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolrelay.sources.mcp needs the MCP Python SDK 2.x: pip install 'toolrelay[mcp]'"
    ) from exc

__all__ = ["McpConnectError", "McpSource", "McpSourceOptions", "object_schema"]


class McpSource(Connector):
    """The tools of one MCP server, as a toolrelay plugin. Use :meth:`stdio` or :meth:`http`.

    Enter it with ``async with`` before registering (the first connection is made there and
    :class:`McpConnectError` is raised when it fails); leave it to close everything. Its
    connection's health and controls (``connection_state``, ``ping()``, ``refresh()``, …)
    are :class:`~.mcp_connection.Connector`'s.

    Args:
        transport: Builds a fresh SDK transport for every connection attempt.
        options: The breaker key and the rest (:class:`~.options.McpSourceOptions`).
    """

    def __init__(self, transport: Callable[[], Transport], options: McpSourceOptions) -> None:
        name = options.name or options.breaker_key
        self._tools = ToolMap(options, name)
        super().__init__(options, name, transport, self._tools.install)
        count = options.count_errors  # a pattern the options model has checked
        self._outage = re.compile(count) if isinstance(count, str) else count

    @property
    def new_tools(self) -> frozenset[str]:
        """The server's names of the tools that no ``tool_risk`` or ``tool_risk_override``
        rule names (renamed or added since: they get ``new_tool_risk``), so far."""
        return frozenset(self._tools.new)

    @classmethod
    def stdio(
        cls,
        command: Sequence[str],
        options: McpSourceOptions,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        errlog: TextIO | None = None,
    ) -> McpSource:
        """A server run as a local process, spoken to over its stdin and stdout.

        ``command`` is the program and its arguments. The process gets the SDK's safe
        default environment (``PATH``, ``HOME``, …) plus ``env``; its stderr goes to
        ``errlog`` (default: ``sys.stderr`` at connect time). It is respawned on reconnect.
        """
        if isinstance(command, str) or not command:
            raise ValueError("command must be a non-empty sequence: [program, *args]")
        program, *args = (str(part) for part in command)
        params = StdioServerParameters(
            command=program,
            args=args,
            env=dict(env) if env else None,
            cwd=None if cwd is None else Path(cwd),
        )
        max_bytes, max_values = options.max_message_bytes, options.max_message_values

        def transport() -> Transport:
            out = errlog if errlog is not None else sys.stderr
            return capped_stdio_client(params, max_bytes, max_values, errlog=out)

        return cls(transport, options)

    @classmethod
    def http(
        cls, url: str, options: McpSourceOptions, *, headers: Mapping[str, str] | None = None
    ) -> McpSource:
        """A server reached over streamable HTTP at ``url``, sending ``headers`` (e.g. auth)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError("url must be an http(s) URL")
        fixed = dict(headers or {})
        max_bytes, max_values = options.max_message_bytes, options.max_message_values

        def transport() -> Transport:
            return http_transport(url, fixed, max_bytes, max_values)

        return cls(transport, options)

    # -- the plugin -----------------------------------------------------------------------
    def describe(self) -> Sequence[ToolDeclaration]:
        """The server's tools as last listed (kept while the server is unreachable)."""
        return self._tools.decls

    def declaration(self, name: str) -> ToolDeclaration | None:
        """The declaration of one tool, by its toolrelay name (a dict lookup)."""
        entry = self._tools.entries.get(name)
        return None if entry is None else entry.decl

    def upstream_tool(self, name: str) -> mcp_types.Tool | None:
        """The tool as the server listed it, by its toolrelay name."""
        entry = self._tools.entries.get(name)
        return None if entry is None else entry.tool

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        """Call the tool on the server. ``ctx`` is not forwarded to the server; the
        call's channel to its client (:mod:`.relay`), when the host set one, is."""
        channel = CALL_CHANNEL.get()
        if channel is None:
            return await self._execute(name, args, None)
        with self.relay.attempt(channel) as attempt:
            try:
                return await self._execute(name, args, channel)
            except ToolError as exc:
                if not (attempt.asked and exc.retryable):
                    raise
                # the client was asked during this attempt: another would ask again
                final = ToolError(exc.message, error_type=exc.error_type, retryable=False)
                final.counts_as_failure = exc.counts_as_failure
                raise final from None

    async def _execute(self, name: str, args: dict[str, Any], channel: CallChannel | None) -> Any:
        entry = self._tools.entries.get(name)
        if entry is None:
            raise ToolError(
                f"{name} is no longer offered by {self.name}", error_type=ErrorType.UNKNOWN_TOOL
            )
        try:
            conn = await self.acquire()
        except Unreachable as gone:
            raise self._unreachable(gone.args[0]) from None
        try:
            with map_mcp_errors():
                result = await self._call(conn, entry.remote, args, channel)
        except Disconnected as exc:
            self.lost(conn, str(exc))
            raise self._unreachable(self.backoff.remaining()) from None
        except AnswerTooLarge:
            limits = self.options.max_message_bytes, self.options.max_message_values
            raise ToolError(
                f"{self.name} sent an answer too large to read (over {limits[0]} bytes or "
                f"{limits[1]} JSON values); it was refused",
                error_type=ErrorType.INVALID_OUTPUT,
                counts_as_failure=False,
            ) from None
        except NotAToolResult:
            raise ToolError(
                f"{self.name} sent an answer that is not a valid MCP tool result",
                error_type=ErrorType.INVALID_OUTPUT,
                counts_as_failure=True,
            ) from None
        except Refused as exc:
            if exc.stale:
                conn.refresh_wanted.set()  # our list may be stale (e.g. the tool was removed)
            raise ToolError(
                f"{self.name} refused the call: {cap(str(exc))}", counts_as_failure=exc.counted
            ) from None
        self.answered()
        if isinstance(result, str):
            return result
        if result.is_error:
            text = cap(error_text(result)) or f"{name} reported an error"
            outage = self._outage
            if outage is True or (outage is not False and outage.search(text)):
                raise ToolError(text, retryable=True)  # the server's own outage: counted
            raise ToolError(text)
        return result_data(result)

    async def _call(
        self, conn: Connection, remote: str, args: dict[str, Any], channel: CallChannel | None
    ) -> mcp_types.CallToolResult | str:
        """``tools/call`` on the raw lane when the connection has one (and the client asked
        for no progress), else the SDK's; a plain text answer comes back as its text."""
        client, lane = conn.client, conn.lane
        assert client is not None
        forwarded = None if channel is None else forwarded_meta(channel.meta)
        progress = None if channel is None or "progressToken" not in channel.meta else channel
        if lane is None or progress is not None:
            report = None if progress is None else progress.progress
            return await client.call_tool(remote, args, progress_callback=report, meta=forwarded)
        meta: dict[str, Any] = {**(forwarded or {}), **conn.call_meta}
        inject(meta)  # the caller's trace context, as the SDK's session injects it
        params: dict[str, Any] = {"name": remote, "arguments": args}
        if meta:
            params["_meta"] = meta
        try:
            raw = await lane.request("tools/call", params)
        except ValueError:  # nothing sent: not strict JSON (NaN): the SDK writes it its way
            return await client.call_tool(remote, args, meta=forwarded)
        version = client.protocol_version
        text = plain_text(raw, version in MODERN_PROTOCOL_VERSIONS)
        if text is not None:
            return text
        result = call_result(raw, version)
        if result is None:  # input_required: the SDK's client drives those rounds
            return await client.call_tool(remote, args, meta=forwarded)
        return result

    def _unreachable(self, retry_after_s: float | None) -> ToolError:
        if self.closed:
            return ToolError(f"{self.name} server is not connected: its source is closed")
        return ToolError(
            f"{self.name} server is not reachable", retryable=True, retry_after_s=retry_after_s
        )
