"""Tool declarations in the shapes model APIs and MCP expect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .contract import ToolDeclaration
from .schemas import strict_form

__all__ = [
    "FORMATS",
    "formatter",
    "to_anthropic",
    "to_mcp",
    "to_openai",
    "to_openai_responses",
]


def _openai_parameters(decl: ToolDeclaration) -> dict[str, Any]:
    """``parameters``, and ``strict: true`` with the strict form of a schema that has one
    (:func:`~toolrelay.schemas.strict_form`: toolrelay accepts all a strict model sends)."""
    strict = strict_form(decl.parameters)
    if strict is None:
        return {"parameters": dict(decl.parameters)}
    return {"parameters": strict, "strict": True}


def to_openai(decl: ToolDeclaration, description: str) -> dict[str, Any]:
    """OpenAI Chat Completions ``tools`` entry."""
    return {
        "type": "function",
        "function": {"name": decl.name, "description": description, **_openai_parameters(decl)},
    }


def to_openai_responses(decl: ToolDeclaration, description: str) -> dict[str, Any]:
    """OpenAI Responses API ``tools`` entry."""
    return {
        "type": "function",
        "name": decl.name,
        "description": description,
        **_openai_parameters(decl),
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
