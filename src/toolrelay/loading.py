"""Loading plugins by name: modules listed explicitly, or entry points chosen by name.

Nothing loads by itself: an installed package that declares an entry point in the
``toolrelay.plugins`` group is only imported when its name is asked for, so installing a
package never adds tools to a model's reach.

A plugin is a module (or an entry point naming a module or a function) with
``register(registry, config)``. Loading is all or nothing: when one plugin fails to
import or register, the plugins this call registered are unregistered again and
:class:`PluginLoadError` names the plugin and the cause in one line. (Tools a plugin adds
with ``registry.tool(...)`` rather than ``registry.register(plugin)`` are not rolled back.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .contract import ToolPlugin
from .registry import ToolRegistry

ENTRY_POINT_GROUP = "toolrelay.plugins"
MAX_CAUSE_CHARS = 200

Config = Mapping[str, Mapping[str, Any]]
Register = Callable[[Any, Mapping[str, Any]], Any]


class PluginLoadError(RuntimeError):
    """A plugin could not be loaded; the message names it and the cause, in one line."""


def load_plugins(
    registry: ToolRegistry, modules: Sequence[str], config: Config | None = None
) -> list[str]:
    """Import each module by dotted name and call its ``register(registry, config)``.

    A module's configuration is ``config[module]``, else ``config[short name]`` (the last
    dotted part: ``"weather"`` for ``toolrelay_plugins.weather``), else ``{}``.
    Returns the module names, in order.
    """
    if isinstance(modules, str):
        raise TypeError("modules must be a sequence of module names, not one string")
    config = config or {}
    with _Recording(registry) as recorder:
        for module_name in modules:
            short = module_name.rpartition(".")[2]
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:
                raise PluginLoadError(
                    f"plugin {module_name!r} could not be imported: {_cause(exc)}"
                ) from exc
            settings = config.get(module_name, config.get(short, {}))
            _register(module_name, module, recorder, settings)
    return list(modules)


def load_entry_points(
    registry: ToolRegistry, names: Sequence[str], config: Config | None = None
) -> list[str]:
    """Load only the ``toolrelay.plugins`` entry points named in ``names``.

    A plugin's configuration is ``config[name]``. An unknown name, a name listed twice, or
    a name two installed packages claim for different objects raises
    :class:`PluginLoadError` before anything is imported.
    """
    if isinstance(names, str):
        raise TypeError("names must be a sequence of entry point names, not one string")
    config = config or {}
    available: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        same = available.setdefault(entry_point.name, [])
        if all(e.value != entry_point.value for e in same):
            same.append(entry_point)
    chosen: list[importlib.metadata.EntryPoint] = []
    for name in names:
        candidates = available.get(name)
        if not candidates:
            listing = ", ".join(sorted(available)) or "none"
            raise PluginLoadError(
                f"no toolrelay plugin named {name!r} is installed; available: {listing}"
            )
        if len(candidates) > 1:
            values = ", ".join(sorted(e.value for e in candidates))
            raise PluginLoadError(f"plugin {name!r} is claimed by several packages: {values}")
        if candidates[0] in chosen:
            raise PluginLoadError(f"plugin {name!r} is listed twice")
        chosen.append(candidates[0])
    with _Recording(registry) as recorder:
        for entry_point in chosen:
            try:
                target = entry_point.load()
            except Exception as exc:
                raise PluginLoadError(
                    f"plugin {entry_point.name!r} could not be imported: {_cause(exc)}"
                ) from exc
            _register(entry_point.name, target, recorder, config.get(entry_point.name, {}))
    return [entry_point.name for entry_point in chosen]


def _register(name: str, target: Any, registry: Any, settings: Mapping[str, Any]) -> None:
    is_module = isinstance(target, types.ModuleType)
    register: Register | None = getattr(target, "register", None) if is_module else target
    if not callable(register):
        raise PluginLoadError(f"plugin {name!r} has no register(registry, config) function")
    if not isinstance(settings, Mapping):
        raise PluginLoadError(
            f"plugin {name!r} could not be registered: its config is not a mapping"
        )
    try:
        register(registry, settings)
    except Exception as exc:
        raise PluginLoadError(f"plugin {name!r} could not be registered: {_cause(exc)}") from exc


def _cause(exc: BaseException) -> str:
    """``Type: first line of the message``, capped: enough to act on, no traceback."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if len(text) > MAX_CAUSE_CHARS:
        text = text[: MAX_CAUSE_CHARS - 1] + "…"
    return text


class _Recording:
    """The registry as plugins see it while loading: what they register is unregistered
    again when the block fails."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._registry = registry
        self.added: list[ToolPlugin] = []

    def register(self, plugin: ToolPlugin) -> ToolPlugin:
        result = self._registry.register(plugin)
        self.added.append(plugin)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)

    def __enter__(self) -> _Recording:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            for plugin in reversed(self.added):
                self._registry.unregister(plugin)
