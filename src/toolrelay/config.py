"""One TOML file for what an operator tunes without code.

The file is checked against a JSON Schema (``CONFIG_SCHEMA``) before anything is built, so
every error names its key path and what was expected, and unknown keys are errors.
``Dispatcher.from_config(path)`` and ``toolrelay check CONFIG`` use :func:`load_config`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema_rs

from .breakers import BreakerConfig
from .contract import ErrorType
from .pipeline.faults import Fault
from .policy import Profile
from .registry import ToolRegistry

__all__ = [
    "CONFIG_SCHEMA",
    "Config",
    "ConfigError",
    "dispatcher_arguments",
    "load_config",
    "load_configured_plugins",
    "parse_config",
]

_NUMBER = {"type": "number", "minimum": 0}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_COUNT = {"type": "integer", "minimum": 1}
_NAMES = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
_RISK = {"enum": ["read", "write", "dangerous"]}
_BREAKER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "fail_max": _COUNT,
        "reset_timeout_s": _NUMBER,
        "reset_timeout_max_s": _NUMBER,
        "success_threshold": _COUNT,
        "half_open_max_calls": _COUNT,
        "slow_call_s": _POSITIVE,
        "window": {"enum": ["consecutive", "count", "time"]},
        "window_size": _COUNT,
        "minimum_calls": _COUNT,
        "failure_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "slow_call_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "max_concurrent": _COUNT,
        "max_concurrent_per_tenant": _COUNT,
        "bulkhead_wait_s": _NUMBER,
        "max_attempts": _COUNT,
        "backoff_initial_s": _NUMBER,
        "backoff_max_s": _NUMBER,
    },
}

CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "plugins": {
            "type": "object",
            "description": "name → {module | entry_point, enabled, …plugin settings}",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "module": {"type": "string", "minLength": 1},
                    "entry_point": {"type": "string", "minLength": 1},
                    "enabled": {"type": "boolean"},
                },
                "not": {"required": ["module", "entry_point"]},
            },
        },
        "tools": {
            "type": "object",
            "description": "tool name → overrides of its declaration",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "timeout_s": _POSITIVE,
                    "breaker_key": {"type": "string", "minLength": 1},
                    "max_attempts": _COUNT,
                    "idempotent": {"type": "boolean"},
                    "risk": _RISK,
                },
            },
        },
        "breakers": {
            "type": "object",
            "description": "breaker key (or 'default') → BreakerConfig settings",
            "additionalProperties": _BREAKER,
        },
        "breaker_storage": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url"],
            "properties": {
                "url": {"type": "string", "pattern": "^(redis|rediss|unix)://"},
                "timeout_s": _POSITIVE,
                "probe_interval_s": _POSITIVE,
                "sync_interval_s": _POSITIVE,
            },
        },
        "profiles": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "allow": _NAMES,
                    "deny": _NAMES,
                    "allow_tags": _NAMES,
                    "deny_tags": _NAMES,
                    "max_risk": _RISK,
                    "require_approval": {"type": "array", "items": _RISK, "uniqueItems": True},
                },
            },
        },
        "faults": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind"],
                "properties": {
                    "kind": {"enum": ["latency", "error", "exception", "hang", "bad_output"]},
                    "tool": {"type": "string"},
                    "breaker_key": {"type": "string"},
                    "rate": {"type": "number", "minimum": 0, "maximum": 1},
                    "latency_s": _NUMBER,
                    "jitter_s": _NUMBER,
                    "error_type": {"enum": [str(e) for e in ErrorType]},
                    "message": {"type": "string", "maxLength": 240},
                    "retryable": {"type": "boolean"},
                    "output": {},
                },
                "oneOf": [{"required": ["tool"]}, {"required": ["breaker_key"]}],
            },
        },
        "dispatcher": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_argument_bytes": _COUNT,
                "max_argument_depth": _COUNT,
                "max_output_bytes": _COUNT,
                "truncate_output": {"type": "boolean"},
                "fault_seed": {"type": "integer"},
                "reserved_properties": _NAMES,
                "secret_patterns": _NAMES,
                "audit": {"type": "boolean"},
                "audit_arguments": {"type": "boolean"},
            },
        },
        "serve": {
            "type": "object",
            "description": "toolrelay serve's own settings; checked by toolrelay.serve.settings",
        },
        "telemetry": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": "boolean"},
                "metrics_port": {"type": "integer", "minimum": 0, "maximum": 65535},
                "metrics_host": {"type": "string"},
                "otlp_endpoint": {"type": "string"},
                "capture_content": {"type": "boolean"},
            },
        },
    },
}

_VALIDATOR = jsonschema_rs.Draft202012Validator(CONFIG_SCHEMA, offline=True)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the key path."""


@dataclass(frozen=True)
class Config:
    """A checked config file, ready to build a dispatcher from."""

    path: Path | None
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    breakers: dict[str, BreakerConfig] = field(default_factory=dict)
    default_breaker: BreakerConfig | None = None
    breaker_storage: dict[str, Any] | None = None
    profiles: dict[str, Profile] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    dispatcher: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)


def _where(path: list[str | int]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def parse_config(data: Mapping[str, Any], path: Path | None = None) -> Config:
    """Check a decoded config and turn it into a :class:`Config`."""
    errors = []
    for error in _VALIDATOR.iter_errors(dict(data)):
        errors.append(f"{_where(list(error.instance_path))}: {error.message}")
    if errors:
        shown = "; ".join(errors[:5]) + ("; …" if len(errors) > 5 else "")
        raise ConfigError(f"{path or 'config'}: {shown}")
    if "serve" in data:  # one file for every command: its [serve] section is checked here too
        from .serve.settings import parse_serve_section

        parse_serve_section(data["serve"], path)
    breakers = dict(data.get("breakers", {}))
    default = breakers.pop("default", None)
    try:
        built_breakers = {key: BreakerConfig(**value) for key, value in breakers.items()}
        profiles = {name: Profile(**value) for name, value in data.get("profiles", {}).items()}
        faults = [Fault.from_dict(item) for item in data.get("faults", [])]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None
    return Config(
        path=path,
        plugins={name: dict(value) for name, value in data.get("plugins", {}).items()},
        tools={name: dict(value) for name, value in data.get("tools", {}).items()},
        breakers=built_breakers,
        default_breaker=None if default is None else BreakerConfig(**default),
        breaker_storage=data.get("breaker_storage"),
        profiles=profiles,
        faults=faults,
        dispatcher=dict(data.get("dispatcher", {})),
        telemetry=dict(data.get("telemetry", {})),
        serve=dict(data.get("serve", {})),
    )


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


PLUGIN_KEYS = frozenset({"module", "entry_point", "enabled"})


def load_configured_plugins(registry: ToolRegistry, config: Config) -> list[str]:
    """Load the enabled ``[plugins.NAME]`` tables: ``module`` (default
    ``toolrelay_plugins.NAME``) or ``entry_point``; the other keys are the plugin's settings."""
    from .loading import load_entry_points, load_plugins

    loaded = []
    for name, table in config.plugins.items():
        if not table.get("enabled", True):
            continue
        settings = {k: v for k, v in table.items() if k not in PLUGIN_KEYS}
        if "entry_point" in table:
            point = table["entry_point"]
            load_entry_points(registry, [point], {point: settings})
        else:
            module = table.get("module", f"toolrelay_plugins.{name}")
            load_plugins(registry, [module], {module: settings})
        loaded.append(name)
    for tool, fields in config.tools.items():
        if not registry.owns(tool):
            raise ConfigError(f"{config.path or 'config'}: tools.{tool}: no tool named {tool!r}")
        registry.override(tool, **fields)
    return loaded


def dispatcher_arguments(config: Config) -> dict[str, Any]:
    """The ``Dispatcher`` keyword arguments a config file sets."""
    kwargs: dict[str, Any] = {
        "profiles": config.profiles,
        "breakers": config.breakers,
        "default_breaker": config.default_breaker,
        "faults": config.faults,
    }
    settings = {k: v for k, v in config.dispatcher.items() if k != "reserved_properties"}
    if settings.pop("audit", True) is False:
        kwargs["audit"] = None
    kwargs.update(settings)
    if config.breaker_storage is not None:
        storage = config.breaker_storage
        kwargs["breaker_storage"] = storage["url"]
        if "timeout_s" in storage:
            kwargs["breaker_storage_timeout_s"] = storage["timeout_s"]
        if "probe_interval_s" in storage:
            kwargs["breaker_storage_probe_s"] = storage["probe_interval_s"]
        if "sync_interval_s" in storage:
            kwargs["breaker_storage_sync_s"] = storage["sync_interval_s"]
    telemetry = config.telemetry
    if "enabled" in telemetry:
        kwargs["telemetry"] = telemetry["enabled"]
    if "capture_content" in telemetry:
        kwargs["capture_content"] = telemetry["capture_content"]
    return kwargs
