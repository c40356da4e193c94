"""What the first-party plugins share: settings, one HTTP client each, one failure mapping.

Every upstream failure becomes a :class:`~toolrelay.contract.ToolError` here and nowhere
else. Messages are one short sentence naming the service; they never carry a response
body, a URL or an exception's text.

==========================================  ==========  =========  =================
upstream                                    error_type  retryable  counts as failure
==========================================  ==========  =========  =================
HTTP 429, HTTP 503                          tool_error  yes        yes (+ Retry-After)
other HTTP 5xx                              tool_error  yes        yes
connect error, reset, broken or cut body    tool_error  yes        yes
httpx timeout (toolrelay's deadline first)  timeout     yes        yes
malformed or oversized body, odd shape      tool_error  no         yes
redirect to an internal address (feeds)     tool_error  no         yes
other HTTP 4xx, unfollowed 3xx              tool_error  no         no
a URL httpx cannot use (configuration)      tool_error  no         no
==========================================  ==========  =========  =================

A malformed body is a fault of the service, so it counts towards opening the breaker;
but it is not retryable: a service that sends garbage (a broken deploy, an HTML error
page from a proxy) usually sends the same garbage a moment later, so an immediate retry
would only spend the call's deadline. An httpx timeout is answered as ``timeout``, the
envelope's name for "the tool did not answer in time".

Hostile upstreams (see docs/security.md, "Hostile upstream"): bodies are capped at
``max_response_bytes``; a JSON body with more than :data:`MAX_JSON_ITEMS` values is
refused before it is decoded (decoding runs on the event loop, holding the GIL, so it
must stay short); :func:`clean_text` cuts its input to ``TEXT_WINDOW_FACTOR * limit +
TEXT_WINDOW_SLACK`` characters before a linear-time strip; redirects (followed only
when a plugin asks, at most :data:`MAX_REDIRECTS`) may not lead to a loopback, private,
link-local or otherwise non-global address unless they stay on the configured host:port,
and the connection then goes to the very address that was checked (the name is not
resolved again, so a rebinding DNS server cannot swap in an internal address between the
check and the connect; the ``Host`` header, TLS SNI and certificate check keep the name).
"""

from __future__ import annotations

import functools
import html
import ipaddress
import json
import math
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Annotated, Any, Protocol, Self, get_args
from urllib.parse import urlsplit

import anyio.to_thread
import httpcore
import httpx
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import ErrorDetails

from toolrelay.contract import ErrorType, ToolDeclaration, ToolError

__all__ = [
    "MAX_JSON_ITEMS",
    "MAX_REDIRECTS",
    "HttpPlugin",
    "HttpSettings",
    "Must",
    "Registrar",
    "Seconds",
    "ServiceClient",
    "check_redirect",
    "clean_text",
    "internal_address",
    "json_items",
    "malformed",
    "retry_after_seconds",
    "safe_url",
    "status_error",
    "transport_error",
    "Url",
]

USER_AGENT = "toolrelay-plugins/0.1"
MAX_RETRY_AFTER_S = 3600.0
DEFAULT_MAX_BYTES = 2 * 1024 * 1024
MAX_REDIRECTS = 3
"""Redirects a following client takes before it gives up."""
MAX_JSON_ITEMS = 50_000
"""At most this many JSON values (counted as ``,``, ``[`` and ``{`` bytes, so an
over-estimate) are decoded; a larger body is refused unread. Decoding 50,000 values takes
a few milliseconds; a 2 MiB body of ``[[],[],…]`` (700,000 lists) holds the event loop
for over 100 ms, and a worker thread would not help: the C decoder never releases the GIL."""
TEXT_WINDOW_FACTOR = 8
TEXT_WINDOW_SLACK = 1024
""":func:`clean_text` reads at most ``TEXT_WINDOW_FACTOR * limit + TEXT_WINDOW_SLACK``
characters of its input."""


class Registrar(Protocol):
    """What ``register(registry, config)`` needs of a registry."""

    def register(self, plugin: Any) -> Any: ...


# -- settings ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Must:
    """What a setting must be, as a verb phrase ("be a number from 1 to 9"): the message of
    every error of the field but a validator's own (``ValueError("must …")``)."""

    text: str


Seconds = Annotated[float, Strict(), Field(ge=0.01, le=600), Must("be a number from 0.01 to 600")]


def _http_url(value: Any) -> str:
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise ValueError("must be an http(s) URL without a query")
    return str(value).rstrip("/")


Url = Annotated[
    str, BeforeValidator(_http_url), WithJsonSchema({"type": "string", "pattern": "^https?://"})
]
"""An http(s) base URL without a query, kept without its trailing slash."""


class HttpSettings(BaseModel):
    """A plugin's deadline and HTTP limits; each plugin's settings model extends it.

    ``timeout_s`` is the tools' deadline in toolrelay; ``read_timeout_s`` (default: the
    same) bounds each read from the service, as a backstop: the deadline usually fires
    first, because it started earlier. :meth:`parse` reads a plugin's config table.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    timeout_s: Seconds = 10.0
    connect_timeout_s: Seconds = 3.0
    read_timeout_s: Seconds | None = None
    max_response_bytes: Annotated[
        int, Strict(), Field(ge=1024, le=64 << 20), Must("be an integer from 1024 to 67108864")
    ] = DEFAULT_MAX_BYTES
    trust_env: Annotated[bool, Strict(), Must("be true or false")] = True

    @classmethod
    def parse(cls, plugin: str, config: Mapping[str, Any]) -> Self:
        """``config`` checked, or a ``ValueError`` of one line: ``"weather: 'timeout_s' must
        be a number from 0.01 to 600"`` (an unknown key first: it explains a missing one)."""
        try:
            return cls.model_validate(dict(config) if isinstance(config, Mapping) else config)
        except ValidationError as exc:
            first = min(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
            raise ValueError(f"{plugin}: {cls._complaint(first)}") from None

    @classmethod
    def _complaint(cls, error: ErrorDetails) -> str:
        path = [str(part) for part in error["loc"] if part != "[key]"]
        key = ".".join(path)
        if not path:
            return "the configuration must be a mapping"
        if error["type"] == "extra_forbidden":
            return f"unknown setting {key!r}"
        if error["type"] == "value_error":
            return f"{key!r} {error['ctx']['error']}"
        field = cls.model_fields[path[0]]
        if error["type"] == "missing" and field.description:
            return f"{key!r} ({field.description}) is required"
        inner = (m for arg in get_args(field.annotation) for m in getattr(arg, "__metadata__", ()))
        must = next((m for m in (*field.metadata, *inner) if isinstance(m, Must)), None)
        return f"{key!r}: {error['msg']}" if must is None else f"{key!r} must {must.text}"

    def httpx_timeout(self) -> httpx.Timeout:
        read = self.timeout_s if self.read_timeout_s is None else self.read_timeout_s
        return httpx.Timeout(read, connect=min(self.connect_timeout_s, read))


# -- failure mapping -----------------------------------------------------------------------
def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header in seconds (delay-seconds or HTTP-date form), capped."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


def status_error(service: str, response: httpx.Response) -> ToolError | None:
    """The answer to a non-2xx response; ``None`` for a success."""
    code = response.status_code
    if 200 <= code < 300:
        return None
    if code in (429, 503):
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        what = "is limiting requests" if code == 429 else "is unavailable"
        return ToolError(
            f"{service} {what} (HTTP {code})", retryable=True, retry_after_s=retry_after
        )
    if code >= 500:
        return ToolError(f"{service} failed (HTTP {code})", retryable=True)
    if 300 <= code < 400:
        return ToolError(f"{service} answered with a redirect (HTTP {code})")
    if code >= 400:
        return ToolError(f"{service} refused the request (HTTP {code})")
    return ToolError(f"{service} gave an unexpected answer (HTTP {code})", counts_as_failure=True)


def transport_error(service: str, exc: Exception) -> ToolError:
    """The answer to an exception raised by httpx."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.ProxyError):
        return ToolError(f"{service} could not be reached", retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        return ToolError(
            f"{service} did not answer in time", error_type=ErrorType.TIMEOUT, retryable=True
        )
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return ToolError(f"{service} broke off the connection", retryable=True)
    if isinstance(exc, httpx.DecodingError):
        return malformed(service)
    if isinstance(exc, httpx.TooManyRedirects):
        return ToolError(f"{service} redirected too many times", counts_as_failure=True)
    return ToolError(f"{service} could not be called; check the plugin's configuration")


def malformed(service: str) -> ToolError:
    """A body that cannot be read, or does not have the expected shape."""
    return ToolError(f"{service} sent an answer that could not be read", counts_as_failure=True)


# -- the client ----------------------------------------------------------------------------
Params = Mapping[str, str | int | float]


class ServiceClient:
    """One ``httpx.AsyncClient`` for a plugin instance, created on first use.

    Bodies are read up to ``max_response_bytes`` (decoded), so a huge or endless answer
    cannot exhaust memory.
    """

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
            pool = getattr(transport, "_pool", None)
            if isinstance(pool, httpcore.AsyncConnectionPool):
                # httpx offers no public hook for the connect step; httpcore's pool does.
                pool._network_backend = _PinnedBackend(pool._network_backend, self._pins)
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

        With ``follow_redirects``, at most :data:`MAX_REDIRECTS` redirects are followed,
        each checked by :func:`check_redirect` before it is sent.
        """
        limit = self.settings.max_response_bytes
        try:
            client = self._http()
            request = client.build_request("GET", url, params=params)
            trusted = _host_port(request.url)
            for _ in range(MAX_REDIRECTS + 1):
                response = await client.send(request, stream=True)
                try:
                    following = response.next_request
                    if self._follow and following is not None:
                        checked = await check_redirect(service, following.url, trusted)
                        if checked is not None:
                            host, port = _host_port(following.url)
                            self.pin(host, port or 0, checked)
                        request = following
                        continue
                    problem = status_error(service, response)
                    if problem is not None:
                        raise problem
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limit:
                        raise _too_large(service, limit)
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            raise _too_large(service, limit)
                    return bytes(body), response.headers.get("content-type", "")
                finally:
                    await response.aclose()
            raise ToolError(f"{service} redirected too many times", counts_as_failure=True)
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise transport_error(service, exc) from exc

    async def get_json(self, service: str, url: str, params: Params | None = None) -> Any:
        """``GET url`` decoded as JSON (NaN and Infinity refused)."""
        body, _ = await self.fetch(service, url, params)
        if json_items(body) > MAX_JSON_ITEMS:
            raise malformed(service)
        try:
            return _loads(body)
        except (ValueError, RecursionError) as exc:
            raise malformed(service) from exc

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def json_items(body: bytes) -> int:
    """An upper bound on the number of values in a JSON document (linear, in C)."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


# -- redirects -----------------------------------------------------------------------------
_METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


def _host_port(url: httpx.URL) -> tuple[str, int | None]:
    port = url.port
    if port is None:
        port = {"http": 80, "https": 443}.get(url.scheme)
    return url.host.lower().rstrip("."), port


def internal_address(address: str) -> bool:
    """Whether ``address`` (an IP literal) is loopback, private, link-local, metadata or
    otherwise not globally routable; an unparsable address counts as internal."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None and internal_address(str(mapped)):
            return True
    return ip in _METADATA or not ip.is_global or ip.is_multicast


def _refused(service: str) -> ToolError:
    return ToolError(f"{service} redirected to an address it may not use", counts_as_failure=True)


async def check_redirect(
    service: str, url: httpx.URL, trusted: tuple[str, int | None]
) -> str | None:
    """Refuse a redirect to anything but http(s) on the configured host:port (``trusted``)
    or on a host whose every address is global. The name is resolved (off the event
    loop), so ``localhost`` or a name in /etc/hosts pointing inward is refused too.
    Returns the checked address to connect to (``None`` on the configured host)."""
    if url.scheme not in ("http", "https") or not url.host:
        raise _refused(service)
    host, port = _host_port(url)
    if (host, port) == trusted:
        return None
    try:
        infos = await anyio.to_thread.run_sync(
            functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM),
            abandon_on_cancel=True,
        )
    except (OSError, UnicodeError) as exc:
        raise _refused(service) from exc
    if not infos or any(internal_address(str(info[4][0])) for info in infos):
        raise _refused(service)
    return str(infos[0][4][0])


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting a pinned ``host:port`` to its checked address
    (TLS still names the host: httpcore passes the origin's name as SNI)."""

    def __init__(
        self, inner: httpcore.AsyncNetworkBackend, pins: Mapping[tuple[str, int], str]
    ) -> None:
        self._inner = inner
        self._pins = pins

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = self._pins.get((host.lower().rstrip("."), port), host)
        return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _loads(body: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(body.decode("utf-8"), parse_constant=refuse)


def _too_large(service: str, limit: int) -> ToolError:
    return ToolError(f"{service} sent more than {limit} bytes", counts_as_failure=True)


# -- the plugin shell ----------------------------------------------------------------------
class HttpPlugin:
    """Declarations by name, one :class:`ServiceClient`, and ``aclose()``.

    Subclasses build their declarations and implement ``async def execute``.
    """

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


# -- text from upstreams -------------------------------------------------------------------
_BLOCK = frozenset({"p", "div", "br", "li", "ul", "ol", "tr", "td", "h1", "h2", "h3", "h4"})
_HIDDEN = ("script", "style", "template", "noscript")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f]")
# One pass, linear: every alternative either fails within a few characters or matches
# everything it scanned (an unterminated comment, tag or hidden element runs to the end),
# so no position is scanned twice. No nested quantifiers.
_MARKUP = re.compile(
    r"<!--.*?(?:-->|\Z)"  # comment
    rf"|<(?P<hidden>{'|'.join(_HIDDEN)})\b[^>]*(?:>|\Z).*?(?:</(?P=hidden)\s*>|\Z)"  # with content
    r"|</?(?P<tag>[A-Za-z][A-Za-z0-9]*)[^>]*(?:>|\Z)"  # tag (block tags become a space)
    r"|<[!?/][^>]*(?:>|\Z)",  # declaration, CDATA, processing instruction, bogus end tag
    re.DOTALL | re.IGNORECASE,
)


def _markup(match: re.Match[str]) -> str:
    tag = match.group("tag")
    return " " if tag is not None and tag.lower() in _BLOCK else ""


def clean_text(value: Any, limit: int) -> str | None:
    """Plain text from an upstream's text or HTML: tags and control characters removed,
    whitespace collapsed, at most ``limit`` characters (cut ones end with "…").

    Linear time and never raises: the input is cut to ``TEXT_WINDOW_FACTOR * limit +
    TEXT_WINDOW_SLACK`` characters first, then tags, comments and hidden elements are
    removed in one regular-expression pass, then character references are decoded.
    """
    if not isinstance(value, str) or not value:
        return None
    window = value[: TEXT_WINDOW_FACTOR * max(limit, 1) + TEXT_WINDOW_SLACK]
    text = html.unescape(_MARKUP.sub(_markup, window))
    text = " ".join(_CONTROL.sub(" ", text).split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text or None


def safe_url(value: Any) -> str | None:
    """An absolute http(s) URL without credentials, or ``None``."""
    if not isinstance(value, str) or not 0 < len(value) <= 2048 or _CONTROL.search(value):
        return None
    if any(ch.isspace() for ch in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    return value
