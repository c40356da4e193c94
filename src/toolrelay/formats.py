"""Tool declarations in the shapes model APIs and MCP expect."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, cast, get_args

from .contract import ToolDeclaration

__all__ = [
    "FORMATS",
    "Unavailable",
    "checked_unavailable",
    "formatter",
    "strict_form",
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


def _openai_parameters(decl: ToolDeclaration) -> dict[str, Any]:
    """``parameters``, and ``strict: true`` with the strict form of a schema that has one
    (:func:`strict_form`: toolrelay accepts all a strict model sends)."""
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


class _NotStrict(Exception):
    pass


_NOT_STRICT = frozenset({"oneOf", "allOf", "not", "if", "patternProperties", "prefixItems",
                         "dependentSchemas", "propertyNames", "unevaluatedProperties"})  # fmt: skip


def strict_form(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` as OpenAI's strict mode wants it — every object closed, every property
    required — when that changes nothing toolrelay accepts: each optional property already
    admits ``null`` (a typed tool's defaulted parameter does: ``null`` means the default).
    ``None`` when it cannot be (an open object, an optional property that refuses ``null``,
    a keyword strict mode lacks)."""
    try:
        return _strict(schema)
    except _NotStrict:
        return None


def _strict(node: Any) -> dict[str, Any]:
    if not isinstance(node, Mapping) or _NOT_STRICT & node.keys():
        raise _NotStrict
    out = dict(node)
    properties = node.get("properties", {})
    if "properties" in node or node.get("type") == "object":
        required = node.get("required", ())
        if node.get("additionalProperties") is not False or any(
            name not in required and not _admits_null(sub) for name, sub in properties.items()
        ):
            raise _NotStrict
        if properties:
            out["properties"] = {name: _strict(sub) for name, sub in properties.items()}
            out["required"] = list(properties)
    if "items" in node:
        out["items"] = _strict(node["items"])
    if "anyOf" in node:
        out["anyOf"] = [_strict(sub) for sub in node["anyOf"]]
    if "$defs" in node:
        out["$defs"] = {name: _strict(sub) for name, sub in node["$defs"].items()}
    return out


def _admits_null(node: Any) -> bool:
    kind = node.get("type") if isinstance(node, Mapping) else None
    return (
        kind == "null"
        or (isinstance(kind, list) and "null" in kind)
        or any(_admits_null(sub) for sub in node.get("anyOf", ()))
    )
