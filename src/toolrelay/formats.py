"""Tool declarations in the shapes model APIs and MCP expect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast, get_args

from .contract import ToolDeclaration

__all__ = [
    "FORMATS",
    "Unavailable",
    "checked_unavailable",
    "formatter",
    "to_anthropic",
    "to_mcp",
    "to_openai",
    "to_openai_responses",
]


Unavailable = Literal["hide", "mark", "show"]
"""What a listing (``Dispatcher.specs``, every adapter) does with a tool whose breaker is open:
leave it out, say so in its description, or list it as it is."""


def checked_unavailable(value: object) -> Unavailable:
    """``value`` if it is one of :data:`Unavailable`'s values; ``ValueError`` otherwise."""
    if value not in get_args(Unavailable):
        raise ValueError(f"unavailable must be 'hide', 'mark' or 'show', not {value!r}")
    return cast(Unavailable, value)


def to_openai(decl: ToolDeclaration, description: str) -> dict[str, Any]:
    """OpenAI Chat Completions ``tools`` entry."""
    return {
        "type": "function",
        "function": {
            "name": decl.name,
            "description": description,
            "parameters": dict(decl.parameters),
        },
    }


def to_openai_responses(decl: ToolDeclaration, description: str) -> dict[str, Any]:
    """OpenAI Responses API ``tools`` entry."""
    return {
        "type": "function",
        "name": decl.name,
        "description": description,
        "parameters": dict(decl.parameters),
    }


def to_anthropic(decl: ToolDeclaration, description: str) -> dict[str, Any]:
    """Anthropic Messages API ``tools`` entry."""
    return {"name": decl.name, "description": description, "input_schema": dict(decl.parameters)}


def to_mcp(decl: ToolDeclaration, description: str) -> dict[str, Any]:
    """MCP ``tools/list`` entry, with annotations derived from risk and idempotency."""
    entry: dict[str, Any] = {
        "name": decl.name,
        "description": description,
        "inputSchema": dict(decl.parameters),
        "annotations": {
            "readOnlyHint": decl.risk == "read",
            "destructiveHint": decl.risk == "dangerous",
            "idempotentHint": decl.is_idempotent,
        },
    }
    if decl.output_schema is not None:
        entry["outputSchema"] = dict(decl.output_schema)
    return entry


FORMATS: dict[str, Callable[[ToolDeclaration, str], dict[str, Any]]] = {
    "openai": to_openai,
    "openai-responses": to_openai_responses,
    "anthropic": to_anthropic,
    "mcp": to_mcp,
}


def formatter(format: str) -> Callable[[ToolDeclaration, str], dict[str, Any]]:
    """The renderer of ``format``; a ``ValueError`` naming the formats if there is none."""
    try:
        return FORMATS[format]
    except KeyError:
        raise ValueError(f"unknown format {format!r}; choose from {sorted(FORMATS)}") from None
