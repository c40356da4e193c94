"""The MCP SDK's client-side internals toolrelay relies on (the source, :mod:`toolrelay.sources`).

Each name says what it relies on and why toolrelay needs it; ``tests/test_compat.py`` checks
that each still exists, with the shape used here, in the installed SDK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

# A type only: the tuple of streams a transport yields. The SDK's public ``mcp.client.Transport``
# is built on it, but the alias itself is not exported.
from mcp.client._transport import TransportStreams

# The raw lane reads a ``tools/call`` result from the wire as the SDK's session does:
# fields of a later protocol revision than the negotiated one are dropped before parsing.
from mcp.client.session import _later_revision_fields as later_revision_fields

# The stdio transport: the SDK's stdio reader joins and splits its whole buffer on every
# chunk (quadratic in the message size) and has no size limit, so toolrelay reads stdout
# itself (sources/stdio.py) but spawns, drains and stops the process as the SDK does, and
# parses each line as the SDK does.
from mcp.client.stdio import (
    _create_platform_compatible_process as create_platform_compatible_process,
)
from mcp.client.stdio import _drain_stdout as drain_stdout
from mcp.client.stdio import _get_executable_command as get_executable_command
from mcp.client.stdio import _parse_line as parse_line
from mcp.client.stdio import _stop_server_process as stop_server_process

__all__ = [
    "TransportStreams",
    "create_platform_compatible_process",
    "drain_stdout",
    "get_executable_command",
    "later_revision_fields",
    "parse_line",
    "replace_tool_result_check",
    "session_stamp",
    "stop_server_process",
]

Stamp = Callable[[dict[str, Any], Any], None]
ResultCheck = Callable[[str, Any], Awaitable[None]]


def session_stamp(session: object) -> Stamp | None:
    """The function the SDK's client session stamps every outgoing request with (its
    ``_meta`` on 2026-era connections), or ``None`` if a release moved it.

    Relies on ``ClientSession._stamp(data, opts)``: the raw lane writes ``tools/call`` itself
    (a large answer is read without the SDK's models) and must send the same ``_meta``.
    """
    stamp = getattr(session, "_stamp", None)
    return stamp if callable(stamp) else None


def replace_tool_result_check(session: object, check: ResultCheck) -> None:
    """Make ``session`` call ``check`` where it re-checks a tool result against the tool's
    ``outputSchema``.

    Relies on ``ClientSession.call_tool`` calling ``self.validate_tool_result(name, result)``
    (public, but not meant to be replaced): the SDK checks with pure-Python jsonschema on the
    event loop, whose backtracking regex engine held the loop for seconds on an upstream's
    ``"^(a+)+$"``; toolrelay checks the same schema with jsonschema-rs in its shape stage.
    """
    session.validate_tool_result = check  # type: ignore[attr-defined]
