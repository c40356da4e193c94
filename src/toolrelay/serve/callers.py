"""Who is calling: the profile and identity a request runs with.

Over stdio (and over HTTP without configured clients) every caller is the default caller,
with the server's ``--profile``. With ``[serve.http.clients]`` the bearer token the SDK's
auth middleware verified names the client, and the client names its profile and identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcp.server.auth.middleware.auth_context import get_access_token

from ..contract import AuthContext
from .settings import ClientSettings

__all__ = ["Caller", "Callers"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A caller as the dispatcher sees it: a profile name and an :class:`AuthContext`."""

    name: str
    profile: str | None
    ctx: AuthContext


class Callers:
    """Maps the current request to its :class:`Caller`."""

    def __init__(self, profile: str | None, clients: Sequence[ClientSettings] = ()) -> None:
        self.default = Caller("default", profile, AuthContext())
        self._clients = {
            client.name: Caller(
                client.name,
                client.profile,
                AuthContext(user_id=client.name, tenant_id=client.tenant),
            )
            for client in clients
        }

    def current(self) -> Caller:
        """The caller of the request being handled (reads the SDK's auth context)."""
        token = get_access_token()
        if token is None:
            return self.default
        return self._clients.get(token.client_id, self.default)

    def all(self) -> list[Caller]:
        """The default caller and every configured client."""
        return [self.default, *self._clients.values()]
