"""Bearer tokens, bind addresses and host names: who may talk to the gateway and its admin API.

Tokens come from environment variables (or, discouraged, the config file) and are compared
in constant time. A non-loopback bind address is refused unless remote access is allowed, and
a wildcard one (``0.0.0.0``, ``::``) unless the names clients use are listed
(``[serve] allowed_hosts``): both servers check ``Host`` and ``Origin`` against them.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping, Sequence

from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from ..net import is_loopback
from .errors import ServeError
from .settings import ClientSettings


def _wildcard(host: str) -> bool:
    try:
        return host == "" or ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def check_bind(
    host: str, allow_remote: bool, what: str, allowed_hosts: Sequence[str] | None = None
) -> None:
    """Refuse a non-loopback ``host`` for ``what`` unless ``allow_remote``; and, for a
    server that checks ``Host`` (``allowed_hosts`` given), a wildcard one without names."""
    if not allow_remote and not is_loopback(host):
        raise ServeError(
            f"refusing to bind the {what} to {host!r}: it is not a loopback address "
            "(pass --allow-remote to expose it)"
        )
    if allowed_hosts is not None and not allowed_hosts and _wildcard(host):
        raise ServeError(
            f"refusing to bind the {what} to the wildcard address {host!r} without "
            "serve.allowed_hosts: list the names clients reach it by (its Host header is "
            "checked against them)"
        )


def transport_security(host: str, allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """DNS-rebinding protection for a server bound to ``host``: the ``Host`` (and ``Origin``)
    name loopback or ``host`` itself (unless a wildcard) at any port or none, or one of
    ``allowed_hosts``."""
    names = ["127.0.0.1", "localhost", "[::1]"]
    if not is_loopback(host) and not _wildcard(host):
        names.append(f"[{host}]" if ":" in host else host)
    hosts = [entry for name in names for entry in (name, f"{name}:*")]
    for name in allowed_hosts:  # a name without a port: any port, or none (a proxy's Host)
        hosts += [name] if ":" in name.rpartition("]")[2] else [name, f"{name}:*"]
    origins = [f"{scheme}://{entry}" for entry in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def resolve_secret(
    env_name: str | None, literal: str | None, environ: Mapping[str, str], what: str
) -> str:
    """The token for ``what``: the literal from the config, else ``environ[env_name]``."""
    if literal:
        return literal
    value = environ.get(env_name, "") if env_name else ""
    if not value.strip():
        raise ServeError(
            f"the {what} needs a bearer token: set the environment variable {env_name}"
        )
    return value.strip()


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of two tokens."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class StaticTokenVerifier:
    """The SDK's ``TokenVerifier`` over fixed tokens: one token per configured client.

    A valid token yields an ``AccessToken`` whose ``client_id`` is the client's name, which
    the gateway maps back to the client's profile and identity.
    """

    def __init__(self, clients: Sequence[ClientSettings], environ: Mapping[str, str]) -> None:
        self._names: dict[str, str] = {}  # by token
        for client in clients:
            token = resolve_secret(
                client.token_env, client.token, environ, f"MCP client {client.name!r}"
            )
            if token in self._names:
                raise ServeError(
                    f"MCP clients {self._names[token]!r} and {client.name!r} have the same token"
                )
            self._names[token] = client.name

    async def verify_token(self, token: str) -> AccessToken | None:
        """The client owning ``token``, or ``None``; every candidate is compared in full."""
        found = None
        for expected, name in self._names.items():
            if token_matches(token, expected):
                found = name
        if found is None:
            return None
        return AccessToken(token=token, client_id=found, scopes=[])
