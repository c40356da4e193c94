"""Redirects a following client may take: only to http(s) on the configured host:port or
to a host whose every address is global, and the connection then goes to the very
address that was checked (the name is not resolved again, so a rebinding DNS server cannot
swap in an internal address between the check and the connect; the ``Host`` header, TLS
SNI and certificate check keep the name)."""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable, Mapping

import anyio.to_thread
import httpcore
import httpx

from toolrelay.contract import ToolError

MAX_REDIRECTS = 3
"""Redirects a following client takes before it gives up."""

_METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


def host_port(url: httpx.URL) -> tuple[str, int | None]:
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
    host, port = host_port(url)
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


class PinnedBackend(httpcore.AsyncNetworkBackend):
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
