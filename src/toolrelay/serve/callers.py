"""Who is calling: the profile and identity a request runs with.

Over stdio (and over HTTP without configured clients) every caller is the default caller,
with the server's ``--profile``. With ``[serve.http.clients]`` the bearer token the SDK's
auth middleware verified names the client, and the client names its profile and identity;
a request without a verified token of a configured client then fails closed: it is the
``unauthenticated`` caller, whose profile no config defines, so it gets no tool at all
(the SDK's auth middleware answers such requests ``401`` before they get here anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcp.server.auth.middleware.auth_context import get_access_token

from ..contract import AuthContext
from .settings import UNAUTHENTICATED_PROFILE, ClientSettings

__all__ = ["UNAUTHENTICATED_PROFILE", "Caller", "Callers"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A caller as the dispatcher sees it: a profile name and an :class:`AuthContext`."""

    name: str
    profile: str | None
    ctx: AuthContext


class Callers:
    """Maps the current request to its :class:`Caller`."""

    def __init__(self, profile: str | None, clients: Sequence[ClientSettings] = ()) -> None:
        self.update(profile, clients)

    def update(self, profile: str | None, clients: Sequence[ClientSettings] = ()) -> None:
        """Take on new settings (hot reload): requests handled from now on see them."""
        self.default = (
            Caller("default", profile, AuthContext())
            if not clients
            else Caller("unauthenticated", UNAUTHENTICATED_PROFILE, AuthContext())
        )
        """The caller of a request without a client's token: with clients configured, the
        ``unauthenticated`` caller (no tools); otherwise everyone, with ``profile``."""
        self._clients = {
            client.name: Caller(
                client.name,
                client.profile,
                AuthContext(user_id=client.name, tenant_id=client.tenant),
            )
            for client in clients
        }

    def current(self) -> Caller:
        """The caller of the request being handled (reads the SDK's auth context). With
        clients configured, a request without a token, or with one naming no configured
        client, is the ``unauthenticated`` caller: it fails closed."""
        token = get_access_token()
        if token is None:
            return self.default
        return self._clients.get(token.client_id, self.default)

    def all(self) -> list[Caller]:
        """The default (or unauthenticated) caller and every configured client."""
        return [self.default, *self._clients.values()]

    def profiles(self) -> dict[str, str | None]:
        """Every caller's name and profile."""
        return {caller.name: caller.profile for caller in self.all()}
