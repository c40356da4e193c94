"""The stand-in upstream's replies: one HTTP response before any fault, the errors the
real services send, and the query-string helpers its routes share."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = "application/json; charset=utf-8"
RSS = "application/rss+xml; charset=utf-8"
ATOM = "application/atom+xml; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

Query = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP response, before any fault is applied to it."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


class BadRequest(ValueError):
    """A request the real service would refuse with HTTP 400."""


def json_reply(data: Any, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return Reply(status, body, JSON, headers)


def error_reply(status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    """An error in Open-Meteo's shape, ``{"error": true, "reason": …}``."""
    return json_reply({"error": True, "reason": reason}, status, headers)


def malformed(reply: Reply) -> Reply:
    """The same answer with a body that does not parse as its content type claims."""
    if "xml" in reply.content_type:
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0"><channel>'
            b"<title>Stand-in News</title><item><title>Unclosed</channel></rss>"
        )
    else:
        body = b'{"latitude": 59.91, "current": {"temperature_2m": 21.5,, "results": ['
    return Reply(200, body, reply.content_type, reply.headers)


# -- query helpers ---------------------------------------------------------------------
def one(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def number(query: Query, name: str, low: float, high: float) -> float:
    raw = one(query, name)
    if raw is None or raw == "":
        raise BadRequest(f"Parameter '{name}' is missing")
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"Parameter '{name}' must be a number") from None
    if not low <= value <= high:
        raise BadRequest(f"Parameter '{name}' must be in range of {low:g} to {high:g}")
    return value


def integer(query: Query, name: str, low: int, high: int, default: int) -> int:
    raw = one(query, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"Parameter '{name}' must be an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"Parameter '{name}' must be between {low} and {high}")
    return value


def noise(*parts: object) -> int:
    return zlib.crc32("|".join(str(p) for p in parts).encode())
