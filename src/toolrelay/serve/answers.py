"""A toolrelay answer as an MCP ``CallToolResult``.

A failure is always the envelope (``ToolResult.to_model()``) as the text of an
``isError: true`` result, so a model reads the same envelope over MCP as through the
Python API. When ``structuredContent`` is sent, and why an ``outputSchema`` rules it out
for failures (strict clients validate it even when ``isError`` is true): the table in
``docs/serve.md``.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import mcp.types as types

from ..contract import ErrorType
from ..jsonlimits import TRUNCATION_MARKER
from ..registry import CompiledTool
from ..result import ToolResult
from ..sources.mcp_mapping import upstream_result


class Answer(NamedTuple):
    """What the client gets, and the outcome it is counted as (``ok`` or an error type)."""

    result: types.CallToolResult
    outcome: str


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _is_truncation(data: Any) -> bool:
    """Is ``data`` the marker the pipeline puts in place of an oversized output?"""
    return (
        isinstance(data, dict)
        and data.get("truncated") is True
        and isinstance(data.get("text"), str)
        and data["text"].endswith(TRUNCATION_MARKER)
    )


def _failure(envelope: dict[str, Any], structured: bool, *extra: str) -> types.CallToolResult:
    texts = [_text(envelope), *extra]
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text) for text in texts],
        structured_content=envelope if structured else None,
        is_error=True,
    )


def answer(result: ToolResult, tool: CompiledTool | None) -> Answer:
    """The MCP result for one answered call of ``tool`` (``None``: a name not known now)."""
    schema = None if tool is None else tool.output_validator
    if not result.ok:
        envelope = result.to_model()
        structured = tool is not None and schema is None
        return Answer(_failure(envelope, structured), str(result.error_type))
    data = result.data
    if schema is not None and not schema.is_valid(data):
        name = tool.decl.name if tool is not None else result.tool
        if _is_truncation(data):
            message = (
                f"{name} returned {data.get('original_bytes')} bytes, over the output cap; "
                "cut to fit, the output no longer matches the tool's output schema. "
                "The part that fits follows as text."
            )
            extra = [_text(data)]
        else:
            message = f"{name} returned output that breaks the output schema listed for it"
            extra = []
        refused = ToolResult(
            ok=False,
            tool=result.tool,
            call_id=result.call_id,
            error_type=ErrorType.INVALID_OUTPUT,
            message=message,
        )
        return Answer(_failure(refused.to_model(), False, *extra), str(ErrorType.INVALID_OUTPUT))
    upstream = upstream_result(data)
    if upstream is not None and (schema is None or upstream.structured_content is not None):
        return Answer(upstream, "ok")
    return Answer(
        types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(data))],
            structured_content=data if isinstance(data, dict) else None,
            is_error=False,
        ),
        "ok",
    )
