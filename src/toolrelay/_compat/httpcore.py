"""httpx's connection pool and httpcore's network backend, for DNS pinning.

The first-party plugins check every address a host resolves to (no loopback, private or
metadata address) and then connect to the address they checked, not to a second lookup's
answer (a DNS-rebinding attacker answers the check and the connect differently). httpx has
no public hook for the connect step; httpcore's pool has one, its network backend.
"""

from __future__ import annotations

from collections.abc import Callable

import httpcore
import httpx

Wrap = Callable[[httpcore.AsyncNetworkBackend], httpcore.AsyncNetworkBackend]


def wrap_network_backend(transport: httpx.AsyncHTTPTransport, wrap: Wrap) -> bool:
    """Replace the network backend of ``transport``'s pool with ``wrap(backend)``; whether
    it could (``False`` when a release no longer has the pool where it was).

    Relies on httpx's ``AsyncHTTPTransport._pool`` (an ``httpcore.AsyncConnectionPool``) and
    httpcore's ``AsyncConnectionPool._network_backend`` (what every connection connects
    with): the one place the connect step can be pinned to a checked address.
    """
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool):
        return False
    pool._network_backend = wrap(pool._network_backend)
    return True
