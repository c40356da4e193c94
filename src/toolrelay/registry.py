"""The registry: plugins in, compiled tools out.

Declarations are read through on every lookup, so a plugin that changes what ``describe()``
returns is seen at once by ``specs()`` and ``dispatch()``. Compiling a declaration (checking
it, building its JSON Schema validators) happens once per declaration content.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import jsonschema_rs

from . import typed
from .capabilities import DeclaresOne, HasHandler, ProcessIsolatable
from .contract import ISOLATIONS, RISKS, AuthContext, Isolation, Risk, ToolDeclaration, ToolPlugin
from .handler import Handler, is_async
from .isolation import ProcessTarget, target_of

__all__ = ["CompiledTool", "RegistrationError", "ToolRegistry"]

log = logging.getLogger("toolrelay")

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_RESERVED = frozenset({"user_id", "tenant_id"})

F = TypeVar("F", bound=Callable[..., Any])
Validator = Any  # jsonschema_rs.Validator; the stubs name no common base


class RegistrationError(ValueError):
    """A plugin or declaration that cannot be accepted. The message names the tool."""


@dataclass(frozen=True, slots=True)
class CompiledTool:
    """A declaration checked once and made ready to run."""

    decl: ToolDeclaration
    """The declaration in force (the plugin's, with operator overrides applied)."""
    fn: Callable[[dict[str, Any], AuthContext], Any]
    is_async: bool
    validator: Validator
    output_validator: Validator | None
    source: ToolDeclaration
    """The declaration as the plugin gave it (the cache key)."""
    process_target: ProcessTarget | None = None
    """Where a worker process finds the handler, for ``isolation="process"``."""


def _compile_schema(tool: str, what: str, schema: Mapping[str, Any]) -> Validator:
    try:
        return jsonschema_rs.Draft202012Validator(dict(schema), mask="<value>", offline=True)
    except (jsonschema_rs.ValidationError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RegistrationError(
            f"tool {tool!r}: {what} is not a valid JSON Schema: {first}"
        ) from exc


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


def _named_by(schema: Any, reserved: frozenset[str]) -> set[str]:
    """Reserved names a ``propertyNames`` schema singles out: its ``const``, ``enum`` and
    ``pattern`` keywords (at any depth: ``anyOf`` branches included) that match them."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            const = node.get("const")
            if isinstance(const, str) and const in reserved:
                found.add(const)
            found.update(reserved.intersection(_names(node.get("enum"))))
            found.update(_pattern_matches(node.get("pattern"), reserved))
            stack.extend(v for k, v in node.items() if k not in ("const", "enum"))
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _identity_properties(schema: Any, reserved: frozenset[str]) -> set[str]:
    """Every reserved name the schema admits as a property, anywhere in it (nested objects,
    ``$defs`` and every other subschema included): named in ``properties``, ``required``,
    ``dependentRequired`` (keys or values), ``dependentSchemas`` or ``dependencies``,
    matched by a ``patternProperties`` regex, or singled out by ``propertyNames``."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
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
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def compile_tool(
    decl: ToolDeclaration,
    fn: Callable[[dict[str, Any], AuthContext], Any],
    reserved: frozenset[str],
    source: ToolDeclaration | None = None,
    target: Callable[[], ProcessTarget] | None = None,
) -> CompiledTool:
    """Check a declaration and build its validators; raise :class:`RegistrationError`.

    ``target()`` gives where a worker process finds the handler (``isolation="process"``);
    its ``ValueError`` says why there is no such place."""
    if not isinstance(decl, ToolDeclaration):
        raise RegistrationError(f"describe() returned {type(decl).__name__}, not ToolDeclaration")
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
    clash = _identity_properties(decl.parameters, reserved)
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


class FunctionPlugin:
    """The plugin behind :meth:`ToolRegistry.tool`: plain functions, one declaration each."""

    def __init__(self) -> None:
        self._tools: dict[str, tuple[ToolDeclaration, Callable[..., Any]]] = {}
        self._targets: dict[str, Callable[[], ProcessTarget]] = {}

    def add(
        self, decl: ToolDeclaration, fn: Callable[..., Any], target: Callable[[], ProcessTarget]
    ) -> None:
        self._tools[decl.name] = (decl, fn)
        self._targets[decl.name] = target

    def process_target(self, name: str) -> Callable[[], ProcessTarget]:
        """The decorated function by name (not its typed caller: a worker rebuilds that)."""
        return self._targets[name]

    def describe(self) -> list[ToolDeclaration]:
        return [decl for decl, _ in self._tools.values()]

    def declaration(self, name: str) -> ToolDeclaration | None:
        entry = self._tools.get(name)
        return None if entry is None else entry[0]

    def handler(self, name: str) -> Callable[..., Any]:
        return self._tools[name][1]

    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        return self._tools[name][1](args, ctx)


def _scan(plugin: ToolPlugin, name: str) -> ToolDeclaration | None:
    """A declaration by name, from ``describe()`` (for plugins without ``declaration``)."""
    for decl in plugin.describe():
        if decl.name == name:
            return decl
    return None


class _Entry:
    """A registered plugin, and how to find one of its declarations: chosen once, at
    registration, since lookups happen on every call."""

    __slots__ = ("find", "plugin")

    def __init__(self, plugin: ToolPlugin) -> None:
        self.plugin = plugin
        self.find: Callable[[str], ToolDeclaration | None] = (
            plugin.declaration
            if isinstance(plugin, DeclaresOne)
            else functools.partial(_scan, plugin)
        )


def _handler(plugin: ToolPlugin, name: str) -> Handler:
    """The tool's handler: the plugin's ``handler(name)``, else its ``execute`` for it."""
    if isinstance(plugin, HasHandler):
        return plugin.handler(name)
    return functools.partial(plugin.execute, name)


def _process_target(plugin: ToolPlugin, name: str, handler: Handler) -> Callable[[], ProcessTarget]:
    """Where a worker process finds the tool's handler: the plugin's
    ``process_target(name)`` (the decorated function for ``tool()``), else the handler,
    which must then be a module-level function."""
    if isinstance(plugin, ProcessIsolatable):
        return plugin.process_target(name)
    return functools.partial(target_of, handler, name, typed=False)


class ToolRegistry:
    """Holds plugins. Several dispatchers may share one registry."""

    def __init__(self, *, reserved_properties: Iterable[str] = DEFAULT_RESERVED) -> None:
        self.reserved_properties = frozenset(reserved_properties)
        self._plugins: list[_Entry] = []
        self._owner: dict[str, _Entry] = {}
        self._compiled: dict[str, CompiledTool] = {}
        self._functions: FunctionPlugin | None = None
        self._functions_entry: _Entry | None = None
        self._overrides: dict[str, dict[str, Any]] = {}

    # -- registration -------------------------------------------------------------------
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        risk: Risk = "read",
        timeout_s: float = 10.0,
        breaker_key: str | None = None,
        idempotent: bool | None = None,
        max_attempts: int | None = None,
        version: str = "1",
        tags: Iterable[str] = (),
        isolation: Isolation = "thread",
        fallback: Iterable[str] = (),
    ) -> Callable[[F], F]:
        """Register a function as a tool (``async def`` or ``def``).

        Without ``parameters`` the schema is inferred from a typed function's signature
        (``docs/typed-tools.md``); with it, or for a function shaped ``fn(args, ctx)``, the
        function gets the validated arguments as one dict and the ``AuthContext``.
        ``isolation="process"`` runs a sync function in a worker process, killed at the
        deadline; it must then be defined at the top level of its module
        (``docs/isolation.md``). ``fallback`` names the tools that answer instead when
        this one cannot (``docs/fallbacks.md``)."""
        if isinstance(fallback, str):
            raise RegistrationError(f"fallback must be a list of tool names, not {fallback!r}")
        fallbacks = tuple(fallback)

        def decorate(fn: F) -> F:
            tool_name = name or getattr(fn, "__name__", None)
            if not isinstance(tool_name, str):  # a functools.partial, a callable object
                raise RegistrationError(
                    f"a {type(fn).__name__} has no __name__: give name= to register it"
                )
            handler: Callable[..., Any] = fn
            inferred_output = None
            try:
                legacy = typed.is_legacy(fn, explicit_schema=parameters is not None)
                if legacy:
                    doc = description or inspect.getdoc(fn) or ""
                    schema = (
                        parameters
                        if parameters is not None
                        else {"type": "object", "properties": {}, "additionalProperties": False}
                    )
                else:
                    inferred = typed.typed_tool(fn, tool_name, description or None)
                    doc, schema = inferred.description, inferred.parameters
                    handler, inferred_output = inferred.call, inferred.output_schema
            except typed.SignatureError as exc:
                raise RegistrationError(f"tool {tool_name!r}: {exc}") from exc
            decl = ToolDeclaration(
                name=tool_name,
                description=doc,
                parameters=schema,
                output_schema=output_schema if output_schema is not None else inferred_output,
                risk=risk,
                timeout_s=timeout_s,
                breaker_key=breaker_key,
                idempotent=idempotent,
                max_attempts=max_attempts,
                version=version,
                tags=frozenset(tags),
                isolation=isolation,
                fallback=fallbacks,
            )
            target = functools.partial(target_of, fn, tool_name, typed=not legacy)
            # refuse a bad tool now
            compile_tool(decl, handler, self.reserved_properties, target=target)
            self._claim([decl.name], None)
            if self._functions is None or self._functions_entry is None:
                self._functions = FunctionPlugin()
                self._functions_entry = _Entry(self._functions)
                self._plugins.append(self._functions_entry)
            self._functions.add(decl, handler, target)
            self._owner[decl.name] = self._functions_entry
            self._compiled.pop(decl.name, None)
            return fn

        return decorate

    def register(self, plugin: ToolPlugin) -> ToolPlugin:
        """Add a plugin. Every declaration is checked now; duplicates and bad schemas fail."""
        if not callable(getattr(plugin, "describe", None)) or not callable(
            getattr(plugin, "execute", None)
        ):
            raise RegistrationError(
                f"{type(plugin).__name__} is not a plugin: it needs describe() and execute()"
            )
        if any(e.plugin is plugin for e in self._plugins):
            raise RegistrationError(f"{type(plugin).__name__} is registered already")
        decls = list(plugin.describe())
        names = [getattr(d, "name", None) for d in decls]
        compiled = [self._build(plugin, d) for d in decls]
        self._claim(names, plugin)
        entry = _Entry(plugin)
        self._plugins.append(entry)
        for tool in compiled:
            self._owner[tool.decl.name] = entry
            self._compiled[tool.decl.name] = tool
        return plugin

    def unregister(self, plugin: ToolPlugin) -> None:
        self._plugins = [e for e in self._plugins if e.plugin is not plugin]
        for name in [n for n, e in self._owner.items() if e.plugin is plugin]:
            del self._owner[name]
            self._compiled.pop(name, None)

    def _claim(self, names: Sequence[Any], plugin: ToolPlugin | None) -> None:
        seen: set[str] = set()
        for name in names:
            if name in seen or (name in self._owner and self._owner[name].plugin is not plugin):
                raise RegistrationError(f"tool name {name!r} is registered twice")
            seen.add(name)

    # -- lookup -------------------------------------------------------------------------
    def resolve(self, name: str) -> CompiledTool | None:
        """The tool as its plugin declares it right now, compiled; ``None`` if unknown.

        Raises :class:`RegistrationError` when the plugin now declares it invalidly.
        """
        entry = self._owner.get(name)
        decl = None if entry is None else entry.find(name)
        if entry is None or decl is None:
            entry, decl = self._find(name)
            if entry is None or decl is None:
                return None
        return self._compiled_for(entry.plugin, decl)

    def _compiled_for(self, plugin: ToolPlugin, decl: ToolDeclaration) -> CompiledTool:
        cached = self._compiled.get(decl.name)
        if cached is not None and (cached.source is decl or cached.source == decl):
            return cached
        compiled = self._compiled[decl.name] = self._build(plugin, decl)
        return compiled

    def _build(self, plugin: ToolPlugin, decl: ToolDeclaration) -> CompiledTool:
        if not isinstance(decl, ToolDeclaration):
            raise RegistrationError(
                f"describe() returned {type(decl).__name__}, not ToolDeclaration"
            )
        override = self._overrides.get(decl.name)
        effective = decl if override is None else dataclasses.replace(decl, **override)
        handler = _handler(plugin, decl.name)
        target = _process_target(plugin, decl.name, handler)
        return compile_tool(effective, handler, self.reserved_properties, decl, target)

    OVERRIDABLE = frozenset(
        {"timeout_s", "breaker_key", "max_attempts", "idempotent", "risk", "isolation", "fallback"}
    )

    def override(self, name: str, **fields: Any) -> None:
        """Operator overrides of a tool's declaration (``timeout_s``, ``breaker_key``,
        ``max_attempts``, ``idempotent``, ``risk``, ``isolation``, ``fallback``), applied
        whenever it is read. An ``isolation`` or ``fallback`` the tool cannot have is refused
        now (if the tool is known)."""
        unknown = set(fields) - self.OVERRIDABLE
        if unknown:
            raise RegistrationError(f"tool {name!r}: cannot override {sorted(unknown)}")
        if "fallback" in fields:  # a list from TOML; checked with the declaration
            names = fields["fallback"]
            if isinstance(names, str):
                raise RegistrationError(f"tool {name!r}: fallback must be a list of tool names")
            fields = {**fields, "fallback": tuple(names)}
        before = self._overrides.get(name)
        self._overrides[name] = {**(before or {}), **fields}
        self._compiled.pop(name, None)
        if ("isolation" in fields or "fallback" in fields) and name in self._owner:
            try:
                self.resolve(name)
            except RegistrationError:
                if before is None:
                    del self._overrides[name]
                else:
                    self._overrides[name] = before
                self._compiled.pop(name, None)
                raise

    def tools(self) -> Iterator[CompiledTool]:
        """Every valid tool now; a declaration a plugin changed into an invalid one is skipped."""
        for decl in self.declarations():
            try:
                yield self._compiled_for(self._owner[decl.name].plugin, decl)
            except RegistrationError as exc:
                log.warning("toolrelay: skipping %s", exc)

    def _find(self, name: str) -> tuple[_Entry | None, ToolDeclaration | None]:
        """Slow path: a name no known plugin owns (any more). Ask every plugin."""
        self._owner.pop(name, None)
        self._compiled.pop(name, None)
        if not isinstance(name, str) or not NAME_RE.match(name):
            return None, None
        for entry in self._plugins:
            decl = entry.find(name)
            if decl is not None:
                self._owner[name] = entry
                return entry, decl
        return None, None

    def plugins(self) -> list[ToolPlugin]:
        """The registered plugins (the function plugin behind ``tool()`` included)."""
        return [entry.plugin for entry in self._plugins]

    def owns(self, name: str) -> bool:
        """Is a plugin known to own ``name``? O(1), reads no declaration."""
        return name in self._owner

    def declarations(self) -> Iterator[ToolDeclaration]:
        """Every declaration, read through the plugins now, first owner winning a name."""
        seen: set[str] = set()
        for entry in list(self._plugins):
            try:
                decls = list(entry.plugin.describe())
            except Exception:
                log.exception("toolrelay: describe() of %s failed", type(entry.plugin).__name__)
                continue
            for decl in decls:
                if not isinstance(decl, ToolDeclaration) or decl.name in seen:
                    continue
                owner = self._owner.setdefault(decl.name, entry)
                if owner is entry:
                    seen.add(decl.name)
                    yield decl

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.resolve(name) is not None

    def __len__(self) -> int:
        return sum(1 for _ in self.declarations())
