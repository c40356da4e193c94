"""One TOML file for what an operator tunes without code, as one :class:`Settings` model.

The models (here and :class:`~toolrelay.breakers.BreakerConfig`,
:class:`~toolrelay.policy.Profile`, :class:`~toolrelay.pipeline.faults.Fault`) are the only
statement of what a setting may be. The file's JSON Schema (``CONFIG_SCHEMA``, printed by
``toolrelay config schema`` for editors) is generated from them; a file is checked against
it first, so every error names its key path and what was expected, and then built into the
models, whose validators check what a schema cannot say (one fault target, a rate that
needs ``slow_call_s``). An extension adds its own tables with :func:`extend` (the gateway's
``[serve]``). ``Dispatcher.from_config(path)`` and ``toolrelay check CONFIG`` use
:func:`load_config`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, Strict
from pydantic import model_validator as _model_validator

from .breakers import BreakerConfig
from .contract import Isolation, Risk
from .faults import Fault
from .policy import Profile
from .registry import RegistrationError, ToolRegistry
from .settings import MODEL, ConfigError, Count, Flag, Name, Port, Positive, Text, TomlTable, diff

__all__ = [
    "CONFIG_SCHEMA",
    "BreakerStorageSettings",
    "Config",
    "ConfigError",
    "DispatcherSettings",
    "PluginSettings",
    "Settings",
    "TelemetrySettings",
    "ToolOverride",
    "dispatcher_arguments",
    "extend",
    "load_config",
    "load_configured_plugins",
    "parse_config",
]


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


class BreakerStorageSettings(BaseModel):
    """``[breaker_storage]``: Redis shared by the replicas' breakers."""

    model_config = MODEL  # dumped by alias: the Dispatcher's keyword arguments

    url: Annotated[str, Strict(), Field(pattern=r"^(redis|rediss|unix)://")] = Field(
        serialization_alias="breaker_storage"
    )
    timeout_s: Positive | None = Field(None, serialization_alias="breaker_storage_timeout_s")
    probe_interval_s: Positive | None = Field(None, serialization_alias="breaker_storage_probe_s")
    sync_interval_s: Positive | None = Field(None, serialization_alias="breaker_storage_sync_s")


class DispatcherSettings(BaseModel):
    """``[dispatcher]``: ``Dispatcher`` keyword arguments; unset keys keep its defaults."""

    model_config = MODEL

    max_argument_bytes: Count | None = None
    max_argument_depth: Count | None = None
    max_output_bytes: Count | None = None
    truncate_output: Flag | None = None
    fault_seed: Annotated[int, Strict()] | None = None
    reserved_properties: frozenset[str] | None = None
    secret_patterns: frozenset[str] | None = None
    audit: Flag | None = None
    audit_arguments: Flag | None = None


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

    ``[breakers.default]`` is :attr:`default_breaker`; :attr:`path` is the file it was read
    from (``None`` when built from a mapping). Two settings values compare with ``==``
    (which also compares :attr:`path`) and :meth:`diff` says what changed, key by key.
    """

    model_config = MODEL

    plugins: dict[str, PluginSettings] = {}
    tools: dict[str, ToolOverride] = {}
    breakers: dict[str, BreakerConfig] = Field(
        default={}, description="breaker key (or 'default') → BreakerConfig settings"
    )
    breaker_storage: BreakerStorageSettings | None = None
    profiles: dict[str, Profile] = {}
    faults: tuple[Fault, ...] = ()
    dispatcher: DispatcherSettings = DispatcherSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    _path: Path | None = PrivateAttr(default=None)

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def default_breaker(self) -> BreakerConfig | None:
        return self.breakers.get("default")

    def diff(self, other: Settings) -> dict[str, tuple[Any, Any]]:
        """What differs in ``other``: dotted key (``breakers.searxng.fail_max``,
        ``profiles.support``) → ``(old, new)``; a table on one side only has ``None`` on the
        other; lists (``faults``) are compared whole."""
        return diff(self, other)


Config = Settings
"""The name :class:`Settings` had before it was a model."""


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


def parse_config(data: Mapping[str, Any], path: Path | None = None) -> Settings:
    """Check a decoded config and turn it into :class:`Settings` (or the model an
    extension put in its place: :func:`extend`)."""
    settings = _table(data, path)
    settings._path = path
    return settings


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a ``toolrelay.toml``; raise :class:`ConfigError` with a clear line."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_config(data, file)


_CHECKED_NOW = ("isolation", "fallback")
"""Overrides ``ToolRegistry.override`` refuses at once for a tool that cannot have them."""


def load_configured_plugins(registry: ToolRegistry, config: Settings) -> list[str]:
    """Load the enabled ``[plugins.NAME]`` tables, each with its own settings, and apply
    the ``[tools.NAME]`` overrides."""
    from .loading import load_entry_points, load_plugins

    loaded = []
    for name, table in config.plugins.items():
        if not table.enabled:
            continue
        if table.entry_point is not None:
            load_entry_points(registry, [table.entry_point], {table.entry_point: table.settings})
        else:
            module = table.module or f"toolrelay_plugins.{name}"
            load_plugins(registry, [module], {module: table.settings})
        loaded.append(name)
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


def dispatcher_arguments(config: Settings) -> dict[str, Any]:
    """The ``Dispatcher`` keyword arguments a config file sets."""
    kwargs: dict[str, Any] = {
        "profiles": config.profiles,
        "breakers": {key: value for key, value in config.breakers.items() if key != "default"},
        "default_breaker": config.default_breaker,
        "faults": config.faults,
        "telemetry": config.telemetry.enabled,
        "capture_content": config.telemetry.capture_content,
    }
    settings = config.dispatcher.model_dump(exclude_none=True, exclude={"reserved_properties"})
    if settings.pop("audit", True) is False:
        kwargs["audit"] = None
    kwargs.update(settings)
    if config.breaker_storage is not None:
        kwargs.update(config.breaker_storage.model_dump(by_alias=True, exclude_none=True))
    return kwargs
