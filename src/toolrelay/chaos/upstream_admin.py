"""The stand-in upstream's admin endpoint (``/_admin/faults``, ``/_admin/stats``,
``/_admin/seed``) and the checks that keep a web page from reaching it."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..net import is_loopback
from ._upstream_replies import Reply, json_reply
from .upstream_faults import FaultError, FaultTable, UpstreamFault

MAX_ADMIN_BODY = 64 * 1024


def refusal(
    host: str, port: int, method: str, headers: dict[bytes, bytes], body: bytes
) -> Reply | None:
    """Why an admin request is refused (403/415), or ``None``: the endpoint has no
    authentication, so a web page the developer opens must not reach it (the rules:
    docs/chaos.md). A DNS-rebinding page has its own name in ``Host``; browsers send
    ``Origin`` with every cross-site POST and DELETE; a form or ``text/plain`` POST is what
    a page can send without asking. ``Host`` is not checked under ``allow_remote``."""
    named = headers.get(b"host", b"").decode("latin-1").strip().lower()
    if is_loopback(host) and not _names_us(named, port):
        return json_reply({"error": "the admin endpoint answers only its loopback Host"}, 403)
    origin = headers.get(b"origin")
    if origin is not None:
        parts = urlsplit(origin.decode("latin-1").strip().lower())
        if parts.scheme != "http" or parts.netloc != named or parts.path not in ("", "/"):
            return json_reply({"error": "cross-origin admin requests are refused"}, 403)
    if body or method in ("POST", "PUT", "PATCH"):
        content_type = headers.get(b"content-type")
        if content_type is None and origin is None:
            return None
        kind = (content_type or b"").split(b";", 1)[0].strip().lower()
        if kind != b"application/json":
            return json_reply({"error": "admin requests with a body must be JSON"}, 415)
    return None


def _names_us(host: str, port: int) -> bool:
    """Is ``host`` (a Host header) a loopback address with the port we listen on?"""
    parts = urlsplit(f"//{host}")
    try:
        named_port = 80 if parts.port is None else parts.port
    except ValueError:
        return False
    return is_loopback(parts.hostname or "") and named_port == port


def answer(table: FaultTable, method: str, path: str, query: str, body: bytes) -> Reply:
    try:
        if path == "/_admin/faults":
            if method == "GET":
                return json_reply({"faults": [f.to_json() for f in table.faults]})
            if method == "POST":
                fault = UpstreamFault.parse(_json_object(body))
                table.put(fault)
                return json_reply({"fault": fault.to_json()})
            if method == "DELETE":
                prefix = parse_qs(query).get("path")
                table.clear_faults(prefix[-1] if prefix else None)
                return json_reply({"faults": [f.to_json() for f in table.faults]})
            return _not_allowed("GET, POST, DELETE")
        if path == "/_admin/stats":
            if method == "GET":
                return json_reply(table.stats)
            if method == "DELETE":
                table.reset_stats()
                return json_reply(table.stats)
            return _not_allowed("GET, DELETE")
        if path == "/_admin/seed":
            if method != "POST":
                return _not_allowed("POST")
            seed = _json_object(body).get("seed")
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise FaultError("'seed' must be an integer")
            table.seed(seed)
            return json_reply({"seed": seed})
        return json_reply({"error": "no such admin endpoint"}, 404)
    except FaultError as exc:
        return json_reply({"error": str(exc)}, 400)


def _json_object(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_ADMIN_BODY:
        raise FaultError("the request body is too large")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FaultError("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise FaultError("the request body must be a JSON object")
    return data


def _not_allowed(allow: str) -> Reply:
    return json_reply({"error": "method not allowed"}, 405, (("allow", allow),))
