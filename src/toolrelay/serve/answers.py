"""A toolrelay answer as an MCP ``CallToolResult``.

A success carries the tool's data as text (a string as it is, anything else as JSON) and,
when the data is a JSON object, as ``structuredContent`` too. A failure is an
``isError: true`` result carrying the answer envelope (``ToolResult.to_model()``) both as
JSON text and as ``structuredContent``, so a model reads the same envelope over MCP as
through the Python API, and a host can branch on ``error_type`` without parsing text.
"""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types

from ..result import ToolResult

__all__ = ["call_tool_result"]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def call_tool_result(result: ToolResult) -> types.CallToolResult:
    """The MCP result for one answered call."""
    if result.ok:
        data = result.data
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(data))],
            structured_content=data if isinstance(data, dict) else None,
            is_error=False,
        )
    envelope = result.to_model()
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_text(envelope))],
        structured_content=envelope,
        is_error=True,
    )
