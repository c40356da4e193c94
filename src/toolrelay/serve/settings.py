"""The ``[serve]`` section of ``toolrelay.toml``: transport, callers, admin API, upstreams.

:class:`ServeSection` is both the section as written and what ``toolrelay serve`` runs with.
The core config knows no ``[serve]``: :class:`GatewaySettings` extends its
:class:`~toolrelay.config.Settings` with the section (:func:`toolrelay.config.extend`, done
when this module is imported, as ``import toolrelay`` does), so every reader of the file
checks it and the generated JSON Schema covers it. Every error is a
:class:`~toolrelay.config.ConfigError` naming the key path, like the core's.
"""

from __future__ import annotations

import inspect
import ipaddress
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    model_validator,
)
from pydantic import dataclasses as pydantic_dataclasses
from pydantic.json_schema import SkipJsonSchema

from ..catalog import CatalogSettings
from ..config import Settings, extend, load_config, parse_config
from ..settings import (
    DATACLASS,
    MODEL,
    ConfigError,
    Flag,
    Name,
    Port,
    Text,
    one_line_errors,
)
from ..sources.options import McpSourceOptions

DEFAULT_ADMIN_TOKEN_ENV = "TOOLRELAY_ADMIN_TOKEN"
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
DEFAULT_MAX_SESSIONS = 1000
DEFAULT_SESSION_IDLE_S = 30 * 60.0
UNAUTHENTICATED_PROFILE = "toolrelay:unauthenticated"
"""The profile of an HTTP caller without a valid token when client tokens are configured:
a name :meth:`ServeSection.check` refuses to see defined, so the dispatcher maps it to
``NOTHING`` (no tool listed or run)."""
DEFAULT_APPROVAL_TIMEOUT_S = 60.0

Label = Annotated[str, Strict(), Field(min_length=1, max_length=128)]
EnvName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Secret = Name
Sessions = Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
PerSecond = Annotated[float, Strict(), Field(gt=0, le=1_000_000)]
Burst = Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
HostName = Annotated[
    str, Strict(), Field(pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$")
]
"""A name clients reach a server by: a host name or IP (IPv6 in brackets), maybe ``:port``."""
T = TypeVar("T")


def _network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise ValueError("must be an IP address or network (CIDR)") from None


Network = Annotated[str, Strict(), AfterValidator(_network)]
TableName = SkipJsonSchema[str]
"""The table's own name (``[….NAME]``), not a key of it."""


def _named(table: dict[str, T]) -> dict[str, T]:
    return {name: replace(item, name=name) for name, item in table.items()}  # type: ignore[type-var]


Table = Annotated[dict[str, T], AfterValidator(_named)]
"""Tables by name (``[serve.upstreams.NAME]``), each knowing its ``name``."""


@one_line_errors("ClientSettings.{}")
@pydantic_dataclasses.dataclass(frozen=True, slots=True, config=DATACLASS)
class ClientSettings:
    """One MCP client of the HTTP transport (``[serve.http.clients.NAME]``): its bearer
    token (``token_env`` or ``token``) decides its profile."""

    name: TableName = ""
    token_env: EnvName | None = None
    token: Secret | None = field(default=None, repr=False)
    profile: Label | None = None
    tenant: Label | None = None
    rate_per_s: PerSecond | None = None
    """This client's requests per second (``[serve.http] rate_per_s`` when unset)."""
    burst: Burst | None = None
    """Requests this client may make at once above its rate (``[serve.http] burst``)."""
    max_concurrent_calls: Burst | None = None
    """This client's ``tools/call`` requests in flight at most (``[serve.http]``'s)."""

    @model_validator(mode="after")
    def _one_token(self) -> ClientSettings:
        if (self.token_env is None) == (self.token is None):
            raise ValueError("a client has exactly one of token_env and token")
        return self


@one_line_errors("UpstreamSettings.{}")
@pydantic_dataclasses.dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class UpstreamSettings(McpSourceOptions):
    """One MCP server behind the gateway (``[serve.upstreams.NAME]``): the options of its
    :class:`~toolrelay.sources.mcp.McpSource` (:class:`McpSourceOptions`, named by the
    table), and how to reach it: exactly one of ``command`` (stdio) and ``url``
    (streamable HTTP)."""

    name: TableName = ""
    command: Annotated[tuple[Text, ...], Field(min_length=1)] | None = None
    url: Annotated[str, Strict(), Field(pattern=r"^https?://")] | None = None
    env: dict[str, Text] = field(default_factory=dict)
    cwd: Text | None = None
    headers: dict[str, Text] = field(default_factory=dict)
    bearer_token_env: EnvName | None = None
    optional: Flag = False

    @model_validator(mode="after")
    def _one_transport(self) -> UpstreamSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("an upstream has exactly one of command and url")
        return self


class HttpSection(BaseModel):
    """``[serve.http]``: the streamable HTTP transport.

    Without ``clients`` every HTTP caller has ``[serve] profile``; with them, every request
    needs one of their bearer tokens and gets that client's profile."""

    model_config = MODEL

    host: Name = "127.0.0.1"
    port: Port = 8000
    path: Annotated[str, Strict(), Field(pattern=r"^/[A-Za-z0-9_./-]*$")] = "/mcp"
    clients: Table[ClientSettings] = {}
    max_sessions: Sessions = DEFAULT_MAX_SESSIONS
    """Open streamable HTTP sessions at most; when full, the least recently used idle one is
    closed to admit a new one (503 when none is idle)."""
    max_sessions_per_client: Sessions | None = None
    """Open sessions per client (its token's name, or its address without tokens) at most
    (429 beyond); ``None`` is a tenth of ``max_sessions`` (at least 1)."""
    session_idle_s: Annotated[float, Strict(), Field(ge=1, le=7 * 86400)] = DEFAULT_SESSION_IDLE_S
    """A session with no request in flight for this long is closed."""
    json_response: Flag = False
    """Answer each HTTP request with one JSON body instead of an SSE stream (no server
    requests such as an approval's elicitation during a call, and a client that goes away
    is not noticed until the call ends)."""
    stateless: Flag = False
    """Serve every HTTP request on its own, with no ``Mcp-Session-Id`` session (no
    ``tools/list_changed`` notifications; the session limits do not apply)."""
    rate_per_s: PerSecond | None = None
    """Requests per second per HTTP client (``tools/call`` and ``tools/list``; a token
    bucket); ``None``: no limit. A client's own ``rate_per_s`` overrides it."""
    burst: Burst | None = None
    """Requests a client may make at once above its rate; ``None``: one second's worth."""
    max_concurrent_calls: Burst | None = None
    """``tools/call`` requests in flight per HTTP client at most; ``None``: no limit."""
    trusted_proxies: tuple[Network, ...] = ()
    """Addresses or networks of the reverse proxies in front: only a request from one of
    them has its ``X-Forwarded-For`` (and ``-Proto``) honoured. Default none: a client is
    the address it connects from, whatever headers it sends."""

    @property
    def client_session_cap(self) -> int:
        """``max_sessions_per_client``, or its default, never above ``max_sessions``."""
        cap = self.max_sessions_per_client
        if cap is None:
            cap = max(1, self.max_sessions // 10)
        return min(cap, self.max_sessions)


class AdminSection(BaseModel):
    """``[serve.admin]``: the admin API (none without a ``port``)."""

    model_config = MODEL

    host: Name = "127.0.0.1"
    port: Port | None = None
    token_env: EnvName = DEFAULT_ADMIN_TOKEN_ENV
    token: Secret | None = Field(default=None, repr=False)


class ServeSection(BaseModel):
    """``[serve]``: everything ``toolrelay serve`` needs besides the dispatcher's own config.

    ``profile`` is the profile of stdio callers and of HTTP callers when no
    ``[serve.http.clients]`` are configured.
    """

    model_config = MODEL

    transport: Literal["stdio", "http"] = "stdio"
    profile: Label | None = None
    allow_remote: Flag = False
    watch_interval_s: Annotated[float, Strict(), Field(ge=0.05, le=3600)] = 1.0
    max_request_bytes: Annotated[int, Strict(), Field(ge=1024, le=1 << 30)] = (
        DEFAULT_MAX_REQUEST_BYTES
    )
    """The largest MCP request read: a stdio line or an HTTP body (a JSON-RPC error beyond)."""
    drain_s: Annotated[float, Strict(), Field(ge=0, le=600)] = 0.0
    """After SIGTERM or SIGINT: how long ``/readyz`` says 503 while the server still serves
    (a load balancer's health check moves new calls away), before it stops."""
    ping_interval_s: Annotated[float, Strict(), Field(ge=0.05, le=86400)] = 30.0
    """An upstream MCP server that said nothing for this long is pinged."""
    reload_watch_s: Annotated[float, Strict(), Field(ge=0.1, le=3600)] | None = None
    """Check the config file this often and reload it when it changed (its modification
    time and content); ``None``: reload on SIGHUP or ``POST /reload`` only."""
    approvals: Literal["elicit", "none"] = "elicit"
    """Who approves risky calls: the human behind the calling MCP client, asked through
    elicitation when the client can be asked (``elicit``), or nobody (``none``): such calls
    answer ``needs_approval``. See :mod:`toolrelay.serve.approvals`."""
    approval_timeout_s: Annotated[float, Strict(), Field(ge=0.01, le=86400)] = (
        DEFAULT_APPROVAL_TIMEOUT_S
    )
    """The longest wait for the human's answer; then the call is ``denied``."""
    allowed_hosts: tuple[HostName, ...] = ()
    """Names (``host`` or ``host:port``) clients reach the MCP transport and the admin API
    by, besides loopback and their bind addresses: every other ``Host`` is answered 421 and
    ``Origin`` 403. A wildcard bind (``0.0.0.0``, ``::``) needs them."""
    http: HttpSection = HttpSection()
    admin: AdminSection = AdminSection()
    upstreams: Table[UpstreamSettings] = {}
    catalog: CatalogSettings = CatalogSettings()
    """The tool lock and its drift policies (``docs/catalog.md``)."""

    def override(self, **flat: Any) -> ServeSection:
        """A copy with the command line's settings: keys of ``[serve]``, of ``[serve.http]``
        (``port``) and of ``[serve.admin]`` with ``admin_`` (``admin_port``); ``None``
        leaves a setting as it is."""
        given = {key: value for key, value in flat.items() if value is not None}
        http = {key: given.pop(key) for key in [*given] if key in HttpSection.model_fields}
        admin = {key[6:]: given.pop(key) for key in [*given] if key.startswith("admin_")}
        given["http"] = self.http.model_copy(update=http)
        given["admin"] = self.admin.model_copy(update=admin)
        return self.model_copy(update=given)

    def check(self, config: Settings) -> None:
        """Cross-checks against the dispatcher config: every named profile exists."""
        where = config.path or "config"
        if UNAUTHENTICATED_PROFILE in config.profiles:
            raise ConfigError(
                f"{where}: profiles: the name {UNAUTHENTICATED_PROFILE!r} is reserved "
                "(the profile of unauthenticated callers: no tools)"
            )
        if self.profile is not None and self.profile not in config.profiles:
            raise ConfigError(f"{where}: serve.profile: no profile named {self.profile!r}")
        for client in self.http.clients.values():
            if client.profile is not None and client.profile not in config.profiles:
                raise ConfigError(
                    f"{where}: serve.http.clients.{client.name}.profile: "
                    f"no profile named {client.profile!r}"
                )


class GatewaySettings(Settings):
    """A checked ``toolrelay.toml`` with its ``[serve]`` section: what ``toolrelay serve``
    runs with, and what every ``toolrelay.toml`` is read into (:func:`load`)."""

    model_config = ConfigDict(  # the JSON Schema of toolrelay.toml reads as the core's
        **MODEL, title="Settings", json_schema_extra={"description": inspect.getdoc(Settings)}
    )

    serve: ServeSection = ServeSection()


extend(GatewaySettings)  # from now on every toolrelay.toml is read into a GatewaySettings


def parse_serve_section(
    data: Mapping[str, Any] | ServeSection, path: Path | None = None
) -> ServeSection:
    """Check a decoded ``[serve]`` table (or take a checked one)."""
    if isinstance(data, ServeSection):
        return data
    return cast(GatewaySettings, parse_config({"serve": data}, path)).serve


def load(
    path: str | Path | None, defaults: Mapping[str, Any] | None = None, **overrides: Any
) -> tuple[GatewaySettings, ServeSection]:
    """Read ``path`` (or ``./toolrelay.toml``, or ``defaults`` when neither exists).

    Returns the file's :class:`GatewaySettings` and its ``[serve]`` section, both with the
    command line's ``overrides`` (see :meth:`ServeSection.override`); raises
    :class:`~toolrelay.config.ConfigError` with one clear line.
    """
    if path is None and not Path("toolrelay.toml").exists():
        config = cast(GatewaySettings, parse_config(dict(defaults or {})))
    else:
        config = cast(GatewaySettings, load_config("toolrelay.toml" if path is None else path))
    serve = config.serve.override(**overrides)
    return config.model_copy(update={"serve": serve}), serve
