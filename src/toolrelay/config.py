"""One TOML file for what an operator tunes without code, as one :class:`Settings` model.

The models (here, the dispatcher's :mod:`toolrelay.options` with each strategy's options,
:class:`~toolrelay.policy.Profile`, :class:`~toolrelay.faults.Fault`) are the only
statement of what a setting may be. The file's JSON Schema (``CONFIG_SCHEMA``, printed by
``toolrelay config schema`` for editors) is generated from them; a file is checked against
it first, so every error names its key path and what was expected, and then built into the
models, whose validators check what a schema cannot say (one fault target, a rate that
needs ``slow_call_s``). An extension adds its own tables with :func:`extend` (the gateway's
``[serve]``). ``Dispatcher.from_config(path)`` and ``toolrelay check CONFIG`` use
:func:`load_config`; :meth:`Settings.dispatcher_options` is what the dispatcher is told.

Deprecated (0.1 names, read until 0.3 with a ``DeprecationWarning`` naming the new key):
the flat ``[breakers.NAME]`` tables (now ``[keys.NAME.breaker]``, ``.retry``, ``.hedge``,
``.bulkhead``, ``.budget``, see :data:`RENAMED`) and ``[breaker_storage]`` (now
``[storage]``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, Strict
from pydantic import model_validator as _model_validator
from pydantic.dataclasses import dataclass

from .contract import Isolation, Risk
from .faults import Fault
from .options import DispatcherOptions, KeyPolicy, Limits, StorageOptions
from .policy import Profile
from .registry import RegistrationError, ToolRegistry
from .settings import (
    DATACLASS,
    MODEL,
    Count,
    Flag,
    Name,
    Port,
    Positive,
    Text,
    TomlTable,
    diff,
    read_toml,
)
from .settings import (
    ConfigError as ConfigError,
)


class PluginSettings(BaseModel):
    """``[plugins.NAME]``: where the plugin comes from (``module``, default
    ``toolrelay_plugins.NAME``, or ``entry_point``); every other key is the plugin's own
    setting (:attr:`settings`), checked by the plugin when it registers."""

    model_config = ConfigDict(**{**MODEL, "extra": "allow"})

    module: Name | None = None
    entry_point: Name | None = None
    enabled: Flag = True

    @_model_validator(mode="after")
    def _one_source(self) -> PluginSettings:
        if self.module is not None and self.entry_point is not None:
            raise ValueError("module and entry_point exclude each other")
        return self

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ToolOverride(BaseModel):
    """``[tools.NAME]``: operator overrides of one tool's declaration."""

    model_config = MODEL

    timeout_s: Positive | None = None
    breaker_key: Name | None = None
    max_attempts: Count | None = None
    idempotent: Flag | None = None
    risk: Risk | None = None
    fallback: list[Name] | None = None
    """Tools that may answer in its place (docs/fallbacks.md)."""
    isolation: Isolation | None = None
    """``"process"``: run the sync handler in a worker process, killed at its deadline
    (docs/isolation.md)."""


@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class DispatcherSection(Limits):
    """``[dispatcher]``: the dispatcher's :class:`~toolrelay.options.Limits`, its faults'
    seed, audit and redaction, worker processes' ``isolation_env``, and the registry's
    ``reserved_properties``."""

    fault_seed: Annotated[int, Strict()] | None = None
    reserved_properties: frozenset[str] | None = None
    secret_patterns: frozenset[str] = frozenset()
    isolation_env: frozenset[str] = frozenset()
    audit: Flag = True
    audit_arguments: Flag = False

    @property
    def limits(self) -> Limits:
        return Limits(**{name: getattr(self, name) for name in Limits.__dataclass_fields__})


class TelemetrySettings(BaseModel):
    """``[telemetry]``: ``enabled`` and ``capture_content`` reach the dispatcher; the
    metrics endpoint and the OTLP exporter are ``toolrelay serve``'s."""

    model_config = MODEL

    enabled: Flag = True
    capture_content: Flag = False
    metrics_port: Port = 0
    metrics_host: Text = "127.0.0.1"
    otlp_endpoint: Text | None = None
    otlp_metrics_endpoint: Text | None = None


class Settings(BaseModel):
    """A checked ``toolrelay.toml``, ready to build a dispatcher from.

    ``[keys.default]`` is :attr:`default_key`; :attr:`path` is the file it was read from
    (``None`` when built from a mapping). Two settings values compare with ``==`` (which
    also compares :attr:`path`) and :meth:`diff` says what changed, key by key.
    """

    model_config = MODEL

    plugins: dict[str, PluginSettings] = {}
    tools: dict[str, ToolOverride] = {}
    keys: dict[str, KeyPolicy] = {}
    """Breaker key (or ``default``) → its policy: ``[keys.NAME.breaker]``, ``.retry``, …"""
    storage: StorageOptions | None = None
    profiles: dict[str, Profile] = {}
    faults: tuple[Fault, ...] = ()
    dispatcher: DispatcherSection = DispatcherSection()
    telemetry: TelemetrySettings = TelemetrySettings()
    _path: Path | None = PrivateAttr(default=None)

    @_model_validator(mode="before")
    @classmethod
    def _deprecated(cls, data: Any) -> Any:
        return translate_deprecated(data) if isinstance(data, Mapping) else data

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def default_key(self) -> KeyPolicy:
        """The policy of every key ``[keys]`` does not name."""
        return self.keys.get("default", KeyPolicy())

    def dispatcher_options(self) -> DispatcherOptions:
        """What a dispatcher built from this file is told."""
        section = self.dispatcher
        return DispatcherOptions(
            profiles=self.profiles,
            keys={key: policy for key, policy in self.keys.items() if key != "default"},
            default_key=self.default_key,
            storage=self.storage,
            limits=section.limits,
            faults=self.faults,
            fault_seed=section.fault_seed,
            secret_patterns=section.secret_patterns,
            isolation_env=section.isolation_env,
            audit=section.audit,
            audit_arguments=section.audit_arguments,
            telemetry=self.telemetry.enabled,
            capture_content=self.telemetry.capture_content,
        )

    def diff(self, other: Settings) -> dict[str, tuple[Any, Any]]:
        """What differs in ``other``: dotted key (``keys.searxng.breaker.fail_max``,
        ``profiles.support``) → ``(old, new)``; a table on one side only has ``None`` on the
        other; lists (``faults``) are compared whole."""
        return diff(self, other)


_table = TomlTable(Settings)
"""What a ``toolrelay.toml`` is read into: :class:`Settings`, or the model that
:func:`extend` put in its place."""
if TYPE_CHECKING:
    CONFIG_SCHEMA: dict[str, Any]
    """The JSON Schema of ``toolrelay.toml``, generated from its model on first use."""


def __getattr__(name: str) -> Any:
    if name == "CONFIG_SCHEMA":  # the JSON Schema of toolrelay.toml, generated on first use
        return _table.schema
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def extend(model: type[Settings]) -> None:
    """Read every ``toolrelay.toml`` into ``model`` from now on: a subclass of the model in
    force that adds an extension's own tables (the core knows none). The gateway's
    ``[serve]`` (:class:`toolrelay.serve.settings.GatewaySettings`) is added when
    :mod:`toolrelay` is imported, so every reader of the file checks it (the CLI,
    ``Dispatcher.from_config``, ``toolrelay serve``) and :data:`CONFIG_SCHEMA` covers it."""
    global _table
    if not issubclass(model, _table.model):
        raise TypeError(f"{model.__name__} does not extend {_table.model.__name__}")
    _table = TomlTable[Settings](model)


RENAMED: dict[str, tuple[str, str]] = {
    **{
        name: ("breaker", name)
        for name in (
            *("fail_max", "reset_timeout_s", "reset_timeout_max_s", "success_threshold"),
            *("half_open_max_calls", "slow_call_s", "window", "window_size", "minimum_calls"),
            *("failure_rate", "slow_call_rate"),
        )
    },
    **{name: ("retry", name) for name in ("max_attempts", "backoff_initial_s", "backoff_max_s")},
    "hedge_after_s": ("hedge", "after_s"),
    "hedge_after_min_s": ("hedge", "after_min_s"),
    "max_hedges": ("hedge", "max_hedges"),
    **{
        name: ("bulkhead", name)
        for name in ("max_concurrent", "max_concurrent_per_tenant", "adaptive_min", "adaptive_max")
    },
    "bulkhead_wait_s": ("bulkhead", "wait_s"),
    "retry_budget": ("budget", "share"),
    "retry_budget_min_per_s": ("budget", "min_per_s"),
}
"""A deprecated ``[breakers.NAME]`` key → its ``[keys.NAME.PART]`` table and key."""


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=4)


def translate_deprecated(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with the deprecated tables (``[breakers.NAME]``, ``[breaker_storage]``)
    moved to their new keys, a ``DeprecationWarning`` naming each new key; a key set in
    both places keeps the new one. Anything else is returned as it is."""
    if "breakers" not in data and "breaker_storage" not in data:
        return data
    data = dict(data)
    if "breaker_storage" in data:
        _deprecated("[breaker_storage]", "[storage]")
        old_storage = data.pop("breaker_storage")
        data.setdefault("storage", old_storage)
    old_keys = data.pop("breakers", None)
    if not isinstance(old_keys, Mapping):
        if old_keys is not None:
            data["breakers"] = old_keys  # not a table: the schema says so
        return data
    keys = {name: dict(table) for name, table in dict(data.get("keys") or {}).items()}
    for name, table in old_keys.items():
        if not isinstance(table, Mapping):
            keys.setdefault(name, table)
            continue
        policy = keys.setdefault(name, {})
        for old, value in table.items():
            part, new = RENAMED.get(old, ("breaker", old))
            _deprecated(f"breakers.{name}.{old}", f"keys.{name}.{part}.{new}")
            section = policy.setdefault(part, {})
            if isinstance(section, dict):
                section.setdefault(new, value)
    data["keys"] = keys
    return data


def parse_config(data: Mapping[str, Any], path: Path | None = None) -> Settings:
    """Check a decoded config and turn it into :class:`Settings` (or the model an
    extension put in its place: :func:`extend`), deprecated tables translated first, with a
    warning."""
    settings = _table(translate_deprecated(data), path)
    settings._path = path
    return settings


def load_config(path: str | os.PathLike[str]) -> Settings:
    """Read and check a ``toolrelay.toml``; raise :class:`ConfigError` with a clear line."""
    file = Path(path)
    return parse_config(read_toml(file), file)


_CHECKED_NOW = ("isolation", "fallback")
"""Overrides ``ToolRegistry.override`` refuses at once for a tool that cannot have them."""


def load_configured_plugins(registry: ToolRegistry, config: Settings) -> dict[str, list[Any]]:
    """Load the enabled ``[plugins.NAME]`` tables, each with its own settings, and apply
    the ``[tools.NAME]`` overrides; returns the plugin objects each table registered (a
    reload of ``toolrelay serve`` replaces them by name)."""
    from .loading import load_entry_points, load_plugins

    loaded = {}
    for name, table in config.plugins.items():
        if not table.enabled:
            continue
        before = {id(plugin) for plugin in registry.plugins()}
        if table.entry_point is not None:
            load_entry_points(registry, [table.entry_point], {table.entry_point: table.settings})
        else:
            module = table.module or f"toolrelay_plugins.{name}"
            load_plugins(registry, [module], {module: table.settings})
        loaded[name] = [plugin for plugin in registry.plugins() if id(plugin) not in before]
    where = config.path or "config"
    for tool, override in config.tools.items():
        if not registry.owns(tool):
            raise ConfigError(f"{where}: tools.{tool}: no tool named {tool!r}")
        fields = override.model_dump(exclude_none=True)
        checked = {key: fields.pop(key) for key in _CHECKED_NOW if key in fields}
        for key, value in checked.items():  # one at a time, first: the refusal names its key
            try:
                registry.override(tool, **{key: value})
            except RegistrationError as exc:
                reason = str(exc).removeprefix(f"tool {tool!r}: ")
                raise ConfigError(f"{where}: tools.{tool}.{key}: {reason}") from None
        registry.override(tool, **fields)
    return loaded
