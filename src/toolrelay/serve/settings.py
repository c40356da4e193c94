"""The ``[serve]`` section of ``toolrelay.toml``: transport, callers, admin API, upstreams.

The core config schema does not know ``[serve]``, so :func:`load` reads the TOML file,
takes the section out, checks it against :data:`SERVE_SCHEMA` and hands the rest to
:func:`toolrelay.config.parse_config`. Every error is a
:class:`~toolrelay.config.ConfigError` naming the key path, like the core's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import jsonschema_rs

from ..config import Config, ConfigError, load_config, parse_config
from ..contract import Risk

__all__ = [
    "DEFAULT_ADMIN_TOKEN_ENV",
    "SERVE_SCHEMA",
    "UNAUTHENTICATED_PROFILE",
    "ClientSettings",
    "ServeSettings",
    "UpstreamSettings",
    "load",
    "parse_serve_section",
]

DEFAULT_ADMIN_TOKEN_ENV = "TOOLRELAY_ADMIN_TOKEN"
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
DEFAULT_MAX_SESSIONS = 1000
DEFAULT_SESSION_IDLE_S = 30 * 60.0
UNAUTHENTICATED_PROFILE = "toolrelay:unauthenticated"
"""The profile of an HTTP caller without a valid token when client tokens are configured:
a name :meth:`ServeSettings.check` refuses to see defined, so the dispatcher maps it to
``NOTHING`` (no tool listed or run)."""
Transport = Literal["stdio", "http"]

_NAME = {"type": "string", "minLength": 1, "maxLength": 128}
_ENV = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
_PORT = {"type": "integer", "minimum": 0, "maximum": 65535}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_SECRET = {"type": "string", "minLength": 1}
_RISK = {"enum": ["read", "write", "dangerous"]}
_CLIENT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "token_env": _ENV,
        "token": _SECRET,
        "profile": _NAME,
        "tenant": _NAME,
    },
    "oneOf": [{"required": ["token_env"]}, {"required": ["token"]}],
}
_UPSTREAM = {
    "type": "object",
    "additionalProperties": False,
    "required": ["breaker_key"],
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "url": {"type": "string", "pattern": "^https?://"},
        "breaker_key": _NAME,
        "prefix": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,32}$"},
        "timeout_s": _POSITIVE,
        "tool_timeouts": {"type": "object", "additionalProperties": _POSITIVE},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "cwd": {"type": "string"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "bearer_token_env": _ENV,
        "connect_timeout_s": _POSITIVE,
        "optional": {"type": "boolean"},
        "count_errors": {"type": ["boolean", "string"]},
        "risk": _RISK,
        "tool_risk": {"type": "object", "additionalProperties": _RISK},
        "max_message_bytes": {"type": "integer", "minimum": 1024},
        "max_message_values": {"type": "integer", "minimum": 100},
    },
    "oneOf": [{"required": ["command"]}, {"required": ["url"]}],
}

SERVE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "transport": {"enum": ["stdio", "http"]},
        "profile": _NAME,
        "allow_remote": {"type": "boolean"},
        "watch_interval_s": {"type": "number", "minimum": 0.05, "maximum": 3600},
        "max_request_bytes": {"type": "integer", "minimum": 1024, "maximum": 1 << 30},
        "http": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "host": {"type": "string", "minLength": 1},
                "port": _PORT,
                "path": {"type": "string", "pattern": "^/[A-Za-z0-9_./-]*$"},
                "clients": {"type": "object", "additionalProperties": _CLIENT},
                "max_sessions": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                "max_sessions_per_client": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                "session_idle_s": {"type": "number", "minimum": 1, "maximum": 7 * 86400},
                "json_response": {"type": "boolean"},
                "stateless": {"type": "boolean"},
            },
        },
        "admin": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "host": {"type": "string", "minLength": 1},
                "port": _PORT,
                "token_env": _ENV,
                "token": _SECRET,
            },
        },
        "upstreams": {"type": "object", "additionalProperties": _UPSTREAM},
    },
}

_VALIDATOR = jsonschema_rs.Draft202012Validator(SERVE_SCHEMA, offline=True)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """One MCP client of the HTTP transport: its bearer token decides its profile."""

    name: str
    token_env: str | None = None
    token: str | None = field(default=None, repr=False)
    profile: str | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """One MCP server behind the gateway (``[serve.upstreams.NAME]``), as an ``McpSource``."""

    name: str
    breaker_key: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    prefix: str | None = None
    timeout_s: float | None = None
    tool_timeouts: Mapping[str, float] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    bearer_token_env: str | None = None
    connect_timeout_s: float | None = None
    optional: bool = False
    count_errors: bool | str = False
    risk: Risk | None = None
    """A floor for the risk of every tool of the upstream (its hints cannot lower it)."""
    tool_risk: Mapping[str, Risk] = field(default_factory=dict)
    """Floors per tool, by the tool's MCP name or its toolrelay name."""
    max_message_bytes: int | None = None
    """The largest message read from the upstream (``McpSource`` default: 4 MiB)."""
    max_message_values: int | None = None
    """The most JSON values in one message (``McpSource`` default: 50,000)."""


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything ``toolrelay serve`` needs besides the dispatcher's own config.

    ``profile`` is the profile of stdio callers and of HTTP callers when no ``clients``
    are configured; with ``clients``, every HTTP request needs one of their bearer tokens
    and gets that client's profile. ``admin_port=None`` runs no admin API.
    """

    transport: Transport = "stdio"
    profile: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    path: str = "/mcp"
    allow_remote: bool = False
    clients: tuple[ClientSettings, ...] = ()
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None
    admin_token_env: str = DEFAULT_ADMIN_TOKEN_ENV
    admin_token: str | None = field(default=None, repr=False)
    upstreams: tuple[UpstreamSettings, ...] = ()
    watch_interval_s: float = 1.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """The largest MCP request read: a stdio line or an HTTP body (a JSON-RPC error beyond)."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """Open streamable HTTP sessions at most; when full, the least recently used idle one is
    closed to admit a new one (503 when none is idle)."""
    max_sessions_per_client: int | None = None
    """Open sessions per client (its token's name, or its address without tokens) at most
    (429 beyond); ``None`` is a tenth of ``max_sessions`` (at least 1)."""
    session_idle_s: float = DEFAULT_SESSION_IDLE_S
    """A session with no request in flight for this long is closed."""
    json_response: bool = False
    """Answer each HTTP request with one JSON body instead of an SSE stream (faster; no
    progress notifications or server requests during a call, and a client that goes away
    is not noticed until the call ends)."""
    stateless: bool = False
    """Serve every HTTP request on its own, with no ``Mcp-Session-Id`` session (no
    ``tools/list_changed`` notifications; the session limits do not apply)."""

    @property
    def client_session_cap(self) -> int:
        """``max_sessions_per_client``, or its default, never above ``max_sessions``."""
        cap = self.max_sessions_per_client
        if cap is None:
            cap = max(1, self.max_sessions // 10)
        return min(cap, self.max_sessions)

    def override(self, **changes: Any) -> ServeSettings:
        """A copy with the given fields changed; ``None`` values leave a field as it is."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def profiles(self) -> set[str | None]:
        """Every profile a caller of this server can have."""
        found: set[str | None] = {self.profile}
        found.update(client.profile for client in self.clients)
        return found

    def check(self, config: Config) -> None:
        """Cross-checks against the dispatcher config: every named profile exists."""
        where = config.path or "config"
        if UNAUTHENTICATED_PROFILE in config.profiles:
            raise ConfigError(
                f"{where}: profiles: the name {UNAUTHENTICATED_PROFILE!r} is reserved "
                "(the profile of unauthenticated callers: no tools)"
            )
        if self.profile is not None and self.profile not in config.profiles:
            raise ConfigError(f"{where}: serve.profile: no profile named {self.profile!r}")
        for client in self.clients:
            if client.profile is not None and client.profile not in config.profiles:
                raise ConfigError(
                    f"{where}: serve.http.clients.{client.name}.profile: "
                    f"no profile named {client.profile!r}"
                )


def _where(path: list[str | int]) -> str:
    return ".".join(["serve", *(str(p) for p in path)])


def parse_serve_section(data: Mapping[str, Any], path: Path | None = None) -> ServeSettings:
    """Check a decoded ``[serve]`` table and turn it into :class:`ServeSettings`."""
    errors = [
        f"{_where(list(error.instance_path))}: {error.message}"
        for error in _VALIDATOR.iter_errors(dict(data))
    ]
    if errors:
        shown = "; ".join(errors[:5]) + ("; …" if len(errors) > 5 else "")
        raise ConfigError(f"{path or 'config'}: {shown}")
    for name, table in data.get("upstreams", {}).items():
        pattern = table.get("count_errors")
        if isinstance(pattern, str):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    f"{path or 'config'}: serve.upstreams.{name}.count_errors: "
                    f"not a valid regular expression ({exc})"
                ) from None
    http = dict(data.get("http", {}))
    admin = dict(data.get("admin", {}))
    clients = tuple(
        ClientSettings(name=name, **table) for name, table in http.pop("clients", {}).items()
    )
    upstreams = tuple(
        UpstreamSettings(
            name=name,
            **{
                **table,
                "command": tuple(table["command"]) if "command" in table else None,
                "tags": tuple(table.get("tags", ())),
            },
        )
        for name, table in data.get("upstreams", {}).items()
    )
    settings = ServeSettings(
        clients=clients,
        upstreams=upstreams,
        admin_token=admin.get("token"),
    )
    return settings.override(
        transport=data.get("transport"),
        profile=data.get("profile"),
        allow_remote=data.get("allow_remote"),
        watch_interval_s=data.get("watch_interval_s"),
        max_request_bytes=data.get("max_request_bytes"),
        max_sessions=http.get("max_sessions"),
        max_sessions_per_client=http.get("max_sessions_per_client"),
        session_idle_s=http.get("session_idle_s"),
        json_response=http.get("json_response"),
        stateless=http.get("stateless"),
        host=http.get("host"),
        port=http.get("port"),
        path=http.get("path"),
        admin_host=admin.get("host"),
        admin_port=admin.get("port"),
        admin_token_env=admin.get("token_env"),
    )


def load(
    path: str | Path | None, defaults: Mapping[str, Any] | None = None
) -> tuple[Config, ServeSettings]:
    """Read ``path`` (or ``./toolrelay.toml``, or ``defaults`` when neither exists).

    Returns the dispatcher's :class:`~toolrelay.config.Config` and the ``[serve]``
    settings; raises :class:`~toolrelay.config.ConfigError` with one clear line.
    """
    if path is None and not Path("toolrelay.toml").exists():
        config = parse_config(dict(defaults or {}))
    else:
        config = load_config("toolrelay.toml" if path is None else path)
    return config, parse_serve_section(config.serve, config.path)
