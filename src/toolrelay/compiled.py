"""Compiling a tool: a declaration checked once and made ready to run.

:func:`compile_tool` refuses what cannot be a tool (a bad name, risk, timeout, isolation or
fallback list; identity properties among its arguments; a schema that is no JSON Schema)
with a :class:`RegistrationError` naming the tool, and builds its validators.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema_rs

from .contract import ISOLATIONS, RISKS, ToolDeclaration
from .handler import Handler, is_async
from .isolation.target import ProcessTarget
from .schemas import identity_properties

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_RESERVED = frozenset({"user_id", "tenant_id"})
Validator = Any  # jsonschema_rs.Validator; the stubs name no common base


class RegistrationError(ValueError):
    """A plugin or declaration that cannot be accepted. The message names the tool."""


class ToolRefused(RegistrationError):
    """A valid tool that a registry's gate does not offer now (the tool catalog:
    ``docs/catalog.md``): a call answers ``error_type`` with this message."""

    def __init__(self, message: str, error_type: str = "tool_policy") -> None:
        super().__init__(message)
        self.message, self.error_type = message, error_type


@dataclass(frozen=True, slots=True)
class CompiledTool:
    """A declaration checked once and made ready to run."""

    decl: ToolDeclaration
    """The declaration in force (the plugin's, with operator overrides applied)."""
    fn: Handler
    is_async: bool
    validator: Validator
    output_validator: Validator | None
    source: ToolDeclaration
    """The declaration as the plugin gave it (the cache key)."""
    process_target: ProcessTarget | None = None
    """Where a worker process finds the handler, for ``isolation="process"``."""
    timed: list[bool] = field(default_factory=lambda: [True], compare=False, repr=False)
    """Are the steps of the async handler's next call timed (``pipeline/invoke.py``)? Its
    one item is what the handler's last call showed, the one thing here that changes."""


def _compile_schema(tool: str, what: str, schema: Mapping[str, Any]) -> Validator:
    try:
        return jsonschema_rs.Draft202012Validator(dict(schema), mask="<value>", offline=True)
    except (jsonschema_rs.ValidationError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RegistrationError(
            f"tool {tool!r}: {what} is not a valid JSON Schema: {first}"
        ) from exc


def compile_tool(
    decl: ToolDeclaration,
    fn: Handler,
    reserved: frozenset[str],
    source: ToolDeclaration | None = None,
    target: Callable[[], ProcessTarget] | None = None,
) -> CompiledTool:
    """Check a declaration and build its validators; raise :class:`RegistrationError`.

    ``target()`` gives where a worker process finds the handler (``isolation="process"``);
    its ``ValueError`` says why there is no such place."""
    name = decl.name
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise RegistrationError(f"tool name {name!r} must match {NAME_RE.pattern}")
    if decl.risk not in RISKS:
        raise RegistrationError(f"tool {name!r}: risk must be one of {RISKS}")
    if not (isinstance(decl.timeout_s, int | float) and 0 < decl.timeout_s < math.inf):
        raise RegistrationError(f"tool {name!r}: timeout_s must be a positive number")
    if decl.max_attempts is not None and decl.max_attempts < 1:
        raise RegistrationError(f"tool {name!r}: max_attempts must be at least 1")
    if not isinstance(decl.parameters, Mapping) or decl.parameters.get("type") != "object":
        raise RegistrationError(f"tool {name!r}: parameters must be an object schema")
    process_target = _isolation(decl, fn, target)
    _check_fallback(decl)
    clash = identity_properties(decl.parameters, reserved)
    if clash:
        raise RegistrationError(
            f"tool {name!r} declares identity properties {sorted(clash)}; "
            "identity comes from AuthContext, never from model arguments"
        )
    validator = _compile_schema(name, "parameters", decl.parameters)
    output = (
        None
        if decl.output_schema is None
        else _compile_schema(name, "output_schema", decl.output_schema)
    )
    return CompiledTool(decl, fn, is_async(fn), validator, output, source or decl, process_target)


def _check_fallback(decl: ToolDeclaration) -> None:
    """``fallback`` is a tuple of distinct tool names, not the tool's own. Names are
    resolved when a call falls back (plugins come and go); one that is unknown then is
    skipped. A fallback's own fallbacks are never followed, so no cycle can run."""
    name = decl.name
    names = decl.fallback
    if not isinstance(names, tuple):
        raise RegistrationError(f"tool {name!r}: fallback must be a tuple of tool names")
    for other in names:
        if not isinstance(other, str) or not NAME_RE.match(other):
            raise RegistrationError(f"tool {name!r}: fallback {other!r} is not a tool name")
        if other == name:
            raise RegistrationError(f"tool {name!r}: a tool cannot be its own fallback")
    if len(set(names)) != len(names):
        raise RegistrationError(f"tool {name!r}: fallback names a tool twice")


def _isolation(
    decl: ToolDeclaration,
    fn: Callable[..., Any],
    target: Callable[[], ProcessTarget] | None,
) -> ProcessTarget | None:
    """Check ``decl.isolation``; for ``"process"``, where a worker process finds ``fn``."""
    name = decl.name
    if decl.isolation not in ISOLATIONS:
        raise RegistrationError(f"tool {name!r}: isolation must be one of {ISOLATIONS}")
    if decl.isolation == "thread":
        return None
    if is_async(fn):
        raise RegistrationError(
            f"tool {name!r}: isolation='process' is for sync handlers; an async one is "
            "cancelled at its deadline already"
        )
    try:
        if target is None:
            raise ValueError("needs a module-level function, and this tool has none")
        return target()
    except ValueError as exc:
        raise RegistrationError(f"tool {name!r}: isolation='process' {exc}") from None
