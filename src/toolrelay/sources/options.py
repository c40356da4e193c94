"""What an :class:`~toolrelay.sources.mcp.McpSource` is told: one frozen options model,
which ``[serve.upstreams.NAME]`` is read into too (``UpstreamSettings`` adds how to reach
the server). A bad value raises one line naming it, a ``ValueError``. Importing it needs
no MCP SDK.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Annotated

from pydantic import Field, Strict, field_validator
from pydantic import dataclasses as pydantic_dataclasses

from ..contract import Risk
from ..registry import DEFAULT_RESERVED
from ..settings import DATACLASS, Flag, Name, Positive, Text, one_line_errors
from .limits import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_VALUES

Key = Annotated[str, Strict(), Field(min_length=1, max_length=128)]
Prefix = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
Protocol = Annotated[str, Strict(), Field(pattern=r"^(auto|legacy|\d{4}-\d{2}-\d{2})$")]


@one_line_errors("McpSourceOptions.{}:")
@pydantic_dataclasses.dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class McpSourceOptions:
    """The options of one :class:`~toolrelay.sources.mcp.McpSource` (only ``breaker_key``
    is required)."""

    breaker_key: Key
    """The breaker key of every tool of the source."""
    prefix: Prefix | None = None
    """Prefix for the tool names (``prefix="time"`` → ``time__get_current_time``)."""
    name: Name | None = None
    """How logs and messages name the server (default: ``breaker_key``)."""
    timeout_s: Positive = 30.0
    """``timeout_s`` of every tool."""
    tool_timeouts: dict[str, Positive] = field(default_factory=dict)
    """Timeouts per tool, by its MCP name (as the server names it)."""
    tags: tuple[Text, ...] = ()
    """Tags for every tool, besides ``"mcp"``."""
    protocol: Protocol = "auto"
    """The connect mode: ``"auto"`` (over stdio the 2025 handshake first, the 2026-era
    protocol when the server refuses it; over HTTP the 2026-era protocol when the server
    speaks it, otherwise the handshake), ``"legacy"`` (always the handshake), or a
    2026-era protocol version (always that)."""
    connect_timeout_s: Positive = 10.0
    """Bound on connecting, and on each ``tools/list`` refresh (and the gateway's pings)."""
    close_timeout_s: Positive = 5.0
    """Bound on closing a session gracefully."""
    backoff_initial_s: Positive = 1.0
    """Wait before reconnecting after the connection is lost; doubled after every failed
    attempt, up to ``backoff_max_s``."""
    backoff_max_s: Positive = 30.0
    reserved_properties: frozenset[Text] = DEFAULT_RESERVED
    """Identity properties no tool schema may declare (as the registry's
    ``reserved_properties``); such tools are skipped."""
    count_errors: Flag | Text = False
    """Which ``isError`` results are the server reporting its own outage (a retryable
    failure the breaker counts) rather than a business answer: ``False`` (none: the
    default), ``True`` (all), or a regular expression searched in the error text (at most
    200 characters of it), e.g. ``"(?i)unavailable|timed? ?out|503"``."""
    risk: Risk | None = None
    """A floor for the risk of every tool: a tool's risk is the higher of what its hints
    say and this (``read`` < ``write`` < ``dangerous``)."""
    tool_risk: dict[str, Risk] = field(default_factory=dict)
    """Floors per tool, by its MCP name or its toolrelay name, e.g.
    ``{"delete_repo": "dangerous"}``, matched ignoring case and with ``-``, ``.`` and spaces
    read as ``_`` (``Delete-Repo`` is ``delete_repo``); combined with ``risk``. A ``"read"``
    floor raises nothing but names a tool as known (see ``new_tool_risk``)."""
    risk_override: Risk | None = None
    """The risk of every tool, whatever its hints and the floors say: the operator's word,
    which may also lower it (e.g. ``"read"`` for a server whose read-only tools carry no
    annotations)."""
    tool_risk_override: dict[str, Risk] = field(default_factory=dict)
    """Overrides per tool (its exact MCP or toolrelay name: an override may lower the risk,
    so a look-alike name never gets it); they win over ``risk_override``. Precedence: a
    tool's override, the source's override, then the higher of the floors and the hints."""
    new_tool_risk: Risk | None = None
    """The lowest risk of a tool no per-tool rule (``tool_risk``, ``tool_risk_override``)
    names: one the server renamed or added after the rules were written. Nothing lowers it,
    ``risk_override`` included. ``None`` (default): ``"dangerous"`` when any per-tool rule
    is set, else none. Each such tool is logged once and counted (``new_tools``)."""
    max_message_bytes: Annotated[int, Strict(), Field(ge=1024)] = DEFAULT_MAX_MESSAGE_BYTES
    """The largest message read from the server (4 MiB), bounded while it is read by the
    ``McpSource.stdio`` and ``.http`` transports (:mod:`toolrelay.sources.stdio`,
    :mod:`~toolrelay.sources.http`). A larger answer is refused: the call gets a non-retryable
    ``invalid_output`` that the breaker does not count."""
    max_message_values: Annotated[int, Strict(), Field(ge=100)] = DEFAULT_MAX_MESSAGE_VALUES
    """The most JSON values one message may hold (50,000; commas, brackets and braces
    outside strings are counted), checked before it is parsed; a message with more is
    refused in the same way (not checked inside SSE events, whose size
    ``max_message_bytes`` bounds)."""

    @field_validator("protocol")
    @classmethod
    def _a_protocol(cls, value: str) -> str:
        if value in ("auto", "legacy"):
            return value
        try:  # imported here: the gateway's settings are read without the SDK's import cost
            from mcp.types.version import MODERN_PROTOCOL_VERSIONS
        except ImportError:  # pragma: no cover - without the mcp extra nothing connects
            return value
        if value not in MODERN_PROTOCOL_VERSIONS:
            known = ", ".join(["auto", "legacy", *MODERN_PROTOCOL_VERSIONS])
            raise ValueError(f"not a protocol the SDK speaks (one of {known})")
        return value

    @field_validator("count_errors")
    @classmethod
    def _a_pattern(cls, value: bool | str) -> bool | str:
        if isinstance(value, str):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc})") from None
        return value
