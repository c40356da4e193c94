"""Who is calling: the profile and identity a request runs with.

Without ``[serve.http.clients]`` every caller is the default caller, with the server's
``--profile``. With them, the verified bearer token names the client, and the client its
profile and identity; any other request fails closed as the ``unauthenticated`` caller,
whose profile no config defines (no tools).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcp.server.auth.middleware.auth_context import get_access_token

from ..contract import AuthContext
from .settings import UNAUTHENTICATED_PROFILE, ClientSettings


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
        self._clients = {
            client.name: Caller(
                client.name,
                client.profile,
                AuthContext(user_id=client.name, tenant_id=client.tenant),
            )
            for client in clients
        }

    def current(self) -> Caller:
        """The caller of the request being handled (from the SDK's auth context)."""
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
