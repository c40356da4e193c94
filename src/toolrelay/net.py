"""Network addresses: what toolrelay's servers (the gateway, its admin API, the chaos
stand-in upstream) need to know of the address they bind or are reached at."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Is ``host`` a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
