"""Reading JSON Schemas: one walker over a schema's every part, and the rule that keeps
identity out of a tool's arguments (its reserved properties).

:func:`nodes` is the only JSON walker of the registry and of typed tools; it never
recurses, so no nesting is too deep to walk.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema_rs


def nodes(
    document: Any, *, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[Mapping[str, Any] | list[Any], int]]:
    """Every mapping and list in a JSON document (the document included), each with its
    depth (the document's is 1), depth first. The values of keys in ``skip`` (data, not
    schemas: ``const``, ``enum``) are not entered."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            yield node, depth
            stack.extend((v, depth + 1) for k, v in node.items() if k not in skip)
        elif isinstance(node, list):
            yield node, depth
            stack.extend((v, depth + 1) for v in node)


def _names(value: Any) -> set[str]:
    """The strings of a JSON array (``required``, a ``dependentRequired`` entry)."""
    if isinstance(value, list):
        return {item for item in value if isinstance(item, str)}
    return set()


def _pattern_matches(pattern: Any, reserved: frozenset[str]) -> set[str]:
    """The reserved names ``pattern`` matches, by the validator's own regex engine (so
    ECMA-262 syntax the ``re`` module lacks is read as validation reads it)."""
    if not isinstance(pattern, str):
        return set()
    try:
        validator = jsonschema_rs.Draft202012Validator({"pattern": pattern}, offline=True)
    except (jsonschema_rs.ValidationError, ValueError, TypeError):
        return set()  # not a valid pattern: compiling the schema refuses it anyway
    return {name for name in reserved if validator.is_valid(name)}


_DATA = frozenset({"const", "enum"})


def _named_by(schema: Any, reserved: frozenset[str]) -> set[str]:
    """Reserved names a ``propertyNames`` schema singles out: its ``const``, ``enum`` and
    ``pattern`` keywords (at any depth: ``anyOf`` branches included) that match them."""
    found: set[str] = set()
    for node, _ in nodes(schema, skip=_DATA):
        if isinstance(node, Mapping):
            const = node.get("const")
            if isinstance(const, str) and const in reserved:
                found.add(const)
            found.update(reserved.intersection(_names(node.get("enum"))))
            found.update(_pattern_matches(node.get("pattern"), reserved))
    return found


def identity_properties(schema: Any, reserved: frozenset[str]) -> set[str]:
    """Every reserved name the schema admits as a property, anywhere in it (nested objects,
    ``$defs`` and every other subschema included): named in ``properties``, ``required``,
    ``dependentRequired`` (keys or values), ``dependentSchemas`` or ``dependencies``,
    matched by a ``patternProperties`` regex, or singled out by ``propertyNames``."""
    found: set[str] = set()
    for node, _ in nodes(schema):
        if not isinstance(node, Mapping):
            continue
        props = node.get("properties")
        if isinstance(props, Mapping):  # ``"user_id": false`` forbids it: not admitted
            found.update(n for n in reserved.intersection(props) if props[n] is not False)
        named = node.get("dependentSchemas")
        if isinstance(named, Mapping):
            found.update(reserved.intersection(named))
        found.update(reserved.intersection(_names(node.get("required"))))
        for keyword in ("dependentRequired", "dependencies"):
            named = node.get(keyword)
            if isinstance(named, Mapping):
                found.update(reserved.intersection(named))
                for needed in named.values():
                    found.update(reserved.intersection(_names(needed)))
        patterns = node.get("patternProperties")
        if isinstance(patterns, Mapping):
            for pattern, sub in patterns.items():
                if sub is not False:
                    found.update(_pattern_matches(pattern, reserved))
        if "propertyNames" in node:
            found.update(_named_by(node["propertyNames"], reserved))
    return found
