"""The registry: plugins in, compiled tools out.

Declarations are read through on every lookup, so a plugin that changes what ``describe()``
returns is seen at once by ``specs()`` and ``dispatch()``. Compiling a declaration (checking
it, building its JSON Schema validators: :mod:`toolrelay.compiled`) happens once per
declaration content. A plugin's optional capabilities (:mod:`toolrelay.capabilities`) are
read once, when it is registered.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from . import typed
from .capabilities import DeclaresOne, HasHandler, ProcessIsolatable
from .compiled import (
    DEFAULT_RESERVED,
    NAME_RE,
    CompiledTool,
    RegistrationError,
    ToolRefused,
    compile_tool,
)
from .contract import AuthContext, Isolation, Risk, ToolDeclaration, ToolPlugin
from .handler import Handler
from .isolation import ProcessTarget, target_of

__all__ = [
    "DEFAULT_RESERVED",
    "NAME_RE",
    "CompiledTool",
    "Gate",
    "RegistrationError",
    "ToolRefused",
    "ToolRegistry",
    "compile_tool",
]

log = logging.getLogger("toolrelay")

F = TypeVar("F", bound=Callable[..., Any])


class Gate(Protocol):
    """What decides whether a valid tool is offered (the tool catalog: ``docs/catalog.md``),
    asked once per declaration content, after operator overrides."""

    def __call__(self, decl: ToolDeclaration) -> ToolDeclaration:
        """The declaration to offer (``decl`` or a changed copy); raises
        :class:`ToolRefused` for a tool not offered now."""
        ...


class FunctionPlugin:
    """The plugin behind :meth:`ToolRegistry.tool`: plain functions, one declaration each.

    It offers every lookup capability: :class:`~toolrelay.capabilities.DeclaresOne`,
    :class:`~toolrelay.capabilities.HasHandler` and
    :class:`~toolrelay.capabilities.ProcessIsolatable`."""

    def __init__(self) -> None:
        self._tools: dict[
            str, tuple[ToolDeclaration, Callable[..., Any], Callable[[], ProcessTarget]]
        ] = {}

    def add(
        self, decl: ToolDeclaration, fn: Callable[..., Any], target: Callable[[], ProcessTarget]
    ) -> None:
        self._tools[decl.name] = (decl, fn, target)

    def process_target(self, name: str) -> Callable[[], ProcessTarget]:
        """The decorated function by name (not its typed caller: a worker rebuilds that)."""
        return self._tools[name][2]

    def describe(self) -> list[ToolDeclaration]:
        return [entry[0] for entry in self._tools.values()]

    def declaration(self, name: str) -> ToolDeclaration | None:
        entry = self._tools.get(name)
        return None if entry is None else entry[0]

    def handler(self, name: str) -> Handler:
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
        self._gate: Gate | None = None

    @property
    def gate(self) -> Gate | None:
        """What decides which valid tools are offered; a refused one is left out of
        :meth:`tools` and its calls answer as :class:`ToolRefused` says."""
        return self._gate

    @gate.setter
    def gate(self, gate: Gate | None) -> None:
        self._gate = gate
        self._compiled.clear()

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
        compiled = [self._build(plugin, d, gated=False) for d in decls]
        self._claim(names, plugin)
        entry = _Entry(plugin)
        self._plugins.append(entry)
        for tool in compiled:
            self._owner[tool.decl.name] = entry
            if self._gate is None:
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
        self._compiled.pop(decl.name, None)  # a refused change back is asked again
        compiled = self._compiled[decl.name] = self._build(plugin, decl)
        return compiled

    def _build(self, plugin: ToolPlugin, decl: ToolDeclaration, gated: bool = True) -> CompiledTool:
        if not isinstance(decl, ToolDeclaration):
            raise RegistrationError(
                f"describe() returned {type(decl).__name__}, not ToolDeclaration"
            )
        override = self._overrides.get(decl.name)
        effective = decl if override is None else dataclasses.replace(decl, **override)
        if gated and self._gate is not None:
            effective = self._gate(effective)
        name = decl.name
        handler: Handler = (
            plugin.handler(name)
            if isinstance(plugin, HasHandler)
            else functools.partial(plugin.execute, name)
        )
        # where a worker process finds the handler: the plugin's process_target(name) (the
        # decorated function for tool()), else the handler, then a module-level function
        target = (
            plugin.process_target(name)
            if isinstance(plugin, ProcessIsolatable)
            else functools.partial(target_of, handler, name, typed=False)
        )
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
            except ToolRefused:
                continue
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
