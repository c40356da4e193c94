"""The first-party plugins' HTTP client (:class:`ServiceClient`, one per plugin instance)
and plugin shell (:class:`HttpPlugin`). What else they share has a module each: settings
(:mod:`._settings`), the failure mapping (:mod:`._failures`), redirect checks
(:mod:`._redirects`) and text cleaning (:mod:`._text`). Every bound on what a hostile
upstream can cost is listed in docs/security.md, "Hostile upstream".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from toolrelay._compat.httpcore import wrap_network_backend
from toolrelay.contract import ToolDeclaration, ToolError
from toolrelay.jsonlimits import json_values

from ._failures import malformed, status_error, too_large, transport_error
from ._redirects import MAX_REDIRECTS, PinnedBackend, check_redirect, host_port
from ._settings import HttpSettings

USER_AGENT = "toolrelay-plugins/0.1"
MAX_JSON_ITEMS = 50_000
"""A body with more JSON values is refused unread: decoding holds the GIL (and so the loop)."""


class Registrar(Protocol):
    """What ``register(registry, config)`` needs of a registry."""

    def register(self, plugin: Any) -> Any: ...


# -- the client ----------------------------------------------------------------------------
Params = Mapping[str, str | int | float]


class ServiceClient:
    """One ``httpx.AsyncClient`` for a plugin instance, created on first use; bodies are read
    up to ``max_response_bytes``."""

    def __init__(
        self, settings: HttpSettings, *, accept: str, follow_redirects: bool = False
    ) -> None:
        self.settings = settings
        self._accept = accept
        self._follow = follow_redirects
        self._client: httpx.AsyncClient | None = None
        self._pins: dict[tuple[str, int], str] = {}

    def pin(self, host: str, port: int, address: str) -> None:
        """Connect to ``address`` (an IP that was checked) for ``host:port`` from now on."""
        self._pins[(host.lower().rstrip("."), port)] = address

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            transport = httpx.AsyncHTTPTransport(trust_env=self.settings.trust_env)
            # httpx offers no public hook for the connect step; httpcore's pool does.
            wrap_network_backend(transport, lambda backend: PinnedBackend(backend, self._pins))
            self._client = httpx.AsyncClient(
                timeout=self.settings.httpx_timeout(),
                headers={"user-agent": USER_AGENT, "accept": self._accept},
                follow_redirects=False,  # followed by fetch(), which checks every hop
                trust_env=self.settings.trust_env,
                transport=transport,
            )
        return self._client

    async def fetch(
        self, service: str, url: str, params: Params | None = None
    ) -> tuple[bytes, str]:
        """The body and content type of ``GET url``; any failure is a :class:`ToolError`.
        With ``follow_redirects``, each redirect is checked by :func:`check_redirect`."""
        limit = self.settings.max_response_bytes
        try:
            client = self._http()
            request = client.build_request("GET", url, params=params)
            trusted = host_port(request.url)
            for _ in range(MAX_REDIRECTS + 1):
                response = await client.send(request, stream=True)
                try:
                    following = response.next_request
                    if self._follow and following is not None:
                        checked = await check_redirect(service, following.url, trusted)
                        if checked is not None:
                            host, port = host_port(following.url)
                            self.pin(host, port or 0, checked)
                        request = following
                        continue
                    problem = status_error(service, response)
                    if problem is not None:
                        raise problem
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limit:
                        raise too_large(service, limit)
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            raise too_large(service, limit)
                    return bytes(body), response.headers.get("content-type", "")
                finally:
                    await response.aclose()
            raise ToolError(f"{service} redirected too many times", counts_as_failure=True)
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise transport_error(service, exc) from exc

    async def get_json(self, service: str, url: str, params: Params | None = None) -> Any:
        """``GET url`` decoded as JSON (NaN and Infinity refused)."""
        body, _ = await self.fetch(service, url, params)
        if json_values(body, MAX_JSON_ITEMS) > MAX_JSON_ITEMS:
            raise malformed(service)
        try:
            return _loads(body)
        except (ValueError, RecursionError) as exc:
            raise malformed(service) from exc

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _loads(body: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(body.decode("utf-8"), parse_constant=refuse)


# -- the plugin shell ----------------------------------------------------------------------
class HttpPlugin:
    """Declarations by name, one :class:`ServiceClient`, and ``aclose()``; subclasses
    implement ``async def execute``."""

    def __init__(self, declarations: Sequence[ToolDeclaration], client: ServiceClient) -> None:
        self._decls = {decl.name: decl for decl in declarations}
        self.client = client

    def describe(self) -> list[ToolDeclaration]:
        return list(self._decls.values())

    def declaration(self, name: str) -> ToolDeclaration | None:
        return self._decls.get(name)

    async def aclose(self) -> None:
        """Close the HTTP client (a later call opens a new one)."""
        await self.client.aclose()
