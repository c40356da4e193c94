"""Breaking or compatible: the changes between two lock entries, decided by explicit rules.

No maintained JSON Schema diff library exists for Python (getsentry's ``json-schema-diff`` is
Rust and marked work in progress; ``json-schema-diff-validator`` is JavaScript), so the rules
are ours, kept small and table-tested (``tests/test_catalog_diff.py``). Each rule says
whether a change *narrows* what a schema admits or *widens* it: narrowing an input schema
breaks callers (arguments they send are refused), widening an output schema breaks them
(answers they read may not fit). A keyword no rule knows counts as breaking. The table of
rules is in ``docs/catalog.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contract import RISK_ORDER

_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_TEXT = ("pattern", "format", "const", "multipleOf")
_NOTES = frozenset({"description", "title", "default", "examples", "$comment", "deprecated"})
_RULED = frozenset(
    {"type", "enum", "properties", "required", "additionalProperties", "items"}
    | set(_UPPER + _LOWER + _TEXT)
    | _NOTES
)


@dataclass(frozen=True, slots=True)
class Change:
    """One change of one tool: where (``inputSchema.properties.city``), what, and whether
    it breaks a caller written against the old definition."""

    tool: str
    where: str
    what: str
    breaking: bool

    def line(self) -> str:
        mark = "BREAKING" if self.breaking else "compatible"
        where = f" {self.where}:" if self.where else ""
        return f"{mark:10} {self.tool}:{where} {self.what}"


def diff_locks(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The changes from one catalog's tools (name → lock entry) to another's."""
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            changes.append(Change(name, "", "tool removed", True))
        elif name not in old:
            changes.append(Change(name, "", "tool added", False))
        else:
            changes += diff_entries(name, old[name], new[name])
    return changes


def diff_entries(tool: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The changes from one lock entry of ``tool`` to another."""
    out: list[Change] = []
    was, now = RISK_ORDER.get(old.get("risk", ""), 0), RISK_ORDER.get(new.get("risk", ""), 0)
    if was != now:
        out.append(Change(tool, "risk", f"{old.get('risk')} → {new.get('risk')}", now > was))
    if old.get("version") != new.get("version"):
        out.append(Change(tool, "version", f"{old.get('version')} → {new.get('version')}", False))
    od, nd = old.get("definition", {}), new.get("definition", {})
    if od.get("description") != nd.get("description"):
        out.append(Change(tool, "description", "changed", False))
    hints = ("idempotentHint",)  # read/destructive hints are the risk, compared above
    for hint in hints:
        before, after = od.get("annotations", {}).get(hint), nd.get("annotations", {}).get(hint)
        if before != after:
            out.append(Change(tool, f"annotations.{hint}", f"{before} → {after}", False))
    _schema(tool, "inputSchema", od.get("inputSchema", {}), nd.get("inputSchema", {}), out, False)
    before, after = od.get("outputSchema"), nd.get("outputSchema")
    if before is not None and after is None:
        out.append(Change(tool, "outputSchema", "removed", True))
    elif before is None and after is not None:
        out.append(Change(tool, "outputSchema", "added", False))
    elif before is not None:
        _schema(tool, "outputSchema", before, after, out, True)
    return out


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    kinds = {kind} if isinstance(kind, str) else set(kind)
    return kinds | {"integer"} if "number" in kinds else kinds


def _schema(tool: str, where: str, old: Any, new: Any, out: list[Change], output: bool) -> None:
    """Compare two schemas at ``where``; ``output``: the tool's answer, not its arguments."""

    def narrowed(what: str, narrows: bool = True) -> None:
        out.append(Change(tool, where, what, narrows != output))

    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        if old != new:
            narrowed("schema replaced", not output)  # breaking either way
        return
    before, after = _types(old), _types(new)
    if before != after:
        lost = (before or {"any"}) - (after or {"any"}) if after is not None else set()
        gained = (after or {"any"}) - (before or {"any"}) if before is not None else set()
        if lost:
            narrowed(f"type narrowed: no longer {'/'.join(sorted(lost))}")
        if gained or (after is None):
            narrowed(f"type widened: also {'/'.join(sorted(gained)) or 'any'}", False)
    _enum(old.get("enum"), new.get("enum"), narrowed)
    for key in _UPPER + _LOWER:
        a, b = old.get(key), new.get(key)
        if a != b:
            tighter = b is not None and (a is None or (b < a if key in _UPPER else b > a))
            narrowed(f"{key} {a} → {b}", tighter)
    for key in _TEXT:
        if old.get(key) != new.get(key):
            narrowed(f"{key} {old.get(key)!r} → {new.get(key)!r}", new.get(key) is not None)
    _object(tool, where, old, new, out, output, narrowed)
    if old.get("items") != new.get("items"):
        _schema(tool, f"{where}[]", old.get("items", {}), new.get("items", {}), out, output)
    for key in sorted((old.keys() | new.keys()) - _RULED):
        if old.get(key) != new.get(key):
            out.append(Change(tool, where, f"{key} changed (no rule: breaking)", True))
    for key in sorted(_NOTES & (old.keys() | new.keys())):
        if old.get(key) != new.get(key):
            out.append(Change(tool, f"{where}.{key}", "changed", False))


def _enum(old: Any, new: Any, narrowed: Any) -> None:
    if old == new:
        return
    if new is None:
        narrowed("enum removed (any value)", False)
    elif old is None:
        narrowed("enum added")
    else:
        for value in [v for v in old if v not in new]:
            narrowed(f"enum value {value!r} removed")
        for value in [v for v in new if v not in old]:
            narrowed(f"enum value {value!r} added", False)


def _object(
    tool: str,
    where: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    out: list[Change],
    output: bool,
    narrowed: Any,
) -> None:
    props_a, props_b = old.get("properties") or {}, new.get("properties") or {}
    req_a, req_b = set(old.get("required") or ()), set(new.get("required") or ())
    for name in sorted(props_a.keys() - props_b.keys()):
        what = "output field removed" if output else "parameter removed (or renamed)"
        out.append(Change(tool, f"{where}.properties.{name}", what, True))
    for name in sorted(props_b.keys() - props_a.keys()):
        required = name in req_b and not output
        what = "required parameter added" if required else "optional parameter added"
        what = "output field added" if output else what
        out.append(Change(tool, f"{where}.properties.{name}", what, required))
    for name in sorted(props_a.keys() & props_b.keys()):
        path = f"{where}.properties.{name}"
        _schema(tool, path, props_a[name], props_b[name], out, output)
        if name in req_b and name not in req_a:
            out.append(Change(tool, path, "became required", not output))
        elif name in req_a and name not in req_b:
            out.append(Change(tool, path, "no longer required", output))
    open_a = old.get("additionalProperties", True) is not False
    open_b = new.get("additionalProperties", True) is not False
    if open_a and not open_b:
        narrowed("additionalProperties closed")
    elif open_b and not open_a:
        narrowed("additionalProperties opened", False)
    extra_a, extra_b = old.get("additionalProperties"), new.get("additionalProperties")
    either = isinstance(extra_a, Mapping) or isinstance(extra_b, Mapping)
    if either and open_a and open_b and extra_a != extra_b:
        path = f"{where}.additionalProperties"
        _schema(tool, path, extra_a or {}, extra_b or {}, out, output)
