"""The admin API: breakers, faults, tools, health and metrics of a running gateway.

A Starlette app, served on its own port (loopback by default). Every endpoint but
``/healthz`` needs ``Authorization: Bearer <admin token>``. JSON in and out; bad input is
a 4xx with ``{"error": code, "message": sentence}``, never a 5xx. The OpenAPI 3.1 document
is at ``/openapi.json`` (see :mod:`toolrelay.serve.openapi`).

The app runs on the dispatcher's event loop: breakers and the fault injector are not
thread-safe, and are only touched from that loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema_rs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..dispatcher import Dispatcher
from ..pipeline.decode import too_big
from ..pipeline.faults import Fault
from .auth import token_matches
from .openapi import FAULT_SCHEMA, MAX_FAULTS, openapi_document

__all__ = ["AdminState", "admin_app"]

MAX_BODY_BYTES = 256 * 1024
MAX_BODY_DEPTH = 66
"""A list of faults whose outputs are as deep as a fault's output may be (64 levels)."""
_FAULT_VALIDATOR = jsonschema_rs.Draft202012Validator(FAULT_SCHEMA, offline=True)
_INTEGER = re.compile(r"^-?[0-9]{1,30}$")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
_ACTIONS = ("open", "close", "reset")

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class AdminState:
    """What the admin API acts on, and whether the gateway is ready."""

    dispatcher: Dispatcher
    registry: CollectorRegistry
    token: str = field(repr=False)
    ready: bool = False
    reason: str = "starting"

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness as ``/readyz`` reports it."""
        self.ready, self.reason = ready, reason

    def breaker_keys(self) -> set[str]:
        """Keys of every registered tool and every breaker created so far."""
        keys = {tool.decl.key for tool in self.dispatcher.registry.tools()}
        return keys | set(self.dispatcher.breakers.keys())


class _Refused(Exception):
    """A request answered with a 4xx JSON error."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def _error(status: int, error: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status, headers=headers or None)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def _json_body(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _Refused(413, "payload_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _Refused(
                413, "payload_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes"
            )
    try:
        value = json.loads(bytes(body), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _Refused(400, "invalid_json", f"the body is not valid JSON ({exc})"[:240]) from None
    problem = too_big(value, MAX_BODY_DEPTH, MAX_BODY_BYTES)
    if problem is not None:  # before any validator walks it (they recurse)
        raise _Refused(400, "invalid_json", f"the body is refused: {problem}")
    return value


def _check_query(request: Request, *allowed: str) -> None:
    """Refuse query parameters the endpoint does not take, and repeated ones."""
    seen = set()
    for name, _ in request.query_params.multi_items():
        if name not in allowed:
            raise _Refused(400, "invalid_query", f"unknown query parameter {name[:40]!r}")
        if name in seen:
            raise _Refused(400, "invalid_query", f"query parameter {name!r} given twice")
        seen.add(name)


def _query_int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not _INTEGER.match(raw):
        raise _Refused(400, "invalid_query", f"{name} must be an integer")
    return int(raw)


def _query_bool(request: Request, name: str) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return False
    value = _BOOLEANS.get(raw.lower())
    if value is None:
        raise _Refused(400, "invalid_query", f"{name} must be true or false")
    return value


def _faults(state: AdminState) -> list[dict[str, Any]]:
    return [{"id": i, **f.to_dict()} for i, f in sorted(state.dispatcher.faults.list().items())]


def _parse_faults(body: Any) -> list[Fault]:
    items = body if isinstance(body, list) else [body]
    if not items:
        raise _Refused(422, "invalid_fault", "the list of faults is empty")
    if len(items) > MAX_FAULTS:
        raise _Refused(422, "invalid_fault", f"at most {MAX_FAULTS} faults at once")
    faults = []
    for index, item in enumerate(items):
        where = f"fault {index}" if isinstance(body, list) else "the fault"
        error = next(iter(_FAULT_VALIDATOR.iter_errors(item)), None)
        if error is not None:
            path = ".".join(str(p) for p in error.instance_path)
            at = f" at {path}" if path else ""
            raise _Refused(422, "invalid_fault", f"{where}{at}: {error.message}"[:240])
        try:
            faults.append(Fault.from_dict(item))
        except (TypeError, ValueError) as exc:
            raise _Refused(422, "invalid_fault", f"{where}: {exc}"[:240]) from None
    return faults


class _Api:
    """The endpoints, bound to one :class:`AdminState`."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    def authed(self, endpoint: Endpoint) -> Endpoint:
        async def guarded(request: Request) -> Response:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token_matches(given.strip(), self.state.token):
                return _error(
                    401,
                    "unauthorized",
                    "send Authorization: Bearer <admin token>",
                    **{"WWW-Authenticate": 'Bearer realm="toolrelay-admin"'},
                )
            try:
                return await endpoint(request)
            except _Refused as refused:
                return _error(refused.status, refused.error, refused.message)

        return guarded

    def _known_key(self, request: Request) -> str:
        key = str(request.path_params["key"])
        if key not in self.state.breaker_keys():
            raise _Refused(404, "unknown_breaker", f"no tool uses the breaker key {key!r}"[:240])
        return key

    def _breaker(self, key: str) -> dict[str, Any]:
        return {"key": key, **self.state.dispatcher.breakers.get(key).snapshot()}

    async def healthz(self, request: Request) -> Response:
        try:
            _check_query(request)
        except _Refused as refused:
            return _error(refused.status, refused.error, refused.message)
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        _check_query(request)
        state = self.state
        if not state.ready:
            return JSONResponse({"ready": False, "reason": state.reason or "not ready"}, 503)
        return JSONResponse({"ready": True, "tools": len(state.dispatcher.registry)})

    async def metrics(self, request: Request) -> Response:
        _check_query(request)
        return Response(generate_latest(self.state.registry), media_type=CONTENT_TYPE_LATEST)

    async def breakers(self, request: Request) -> Response:
        _check_query(request)
        breakers = self.state.dispatcher.breakers
        return JSONResponse(
            {
                "breakers": {
                    key: breakers.get(key).snapshot() for key in sorted(self.state.breaker_keys())
                }
            }
        )

    async def breaker(self, request: Request) -> Response:
        _check_query(request)
        return JSONResponse(self._breaker(self._known_key(request)))

    async def breaker_action(self, request: Request) -> Response:
        _check_query(request)
        action = request.path_params["action"]
        if action not in _ACTIONS:
            raise _Refused(
                404, "not_found", f"no breaker action {action[:40]!r}; use open, close or reset"
            )
        key = self._known_key(request)
        breakers = self.state.dispatcher.breakers
        if action == "open":
            breakers.force_open(key)
        elif action == "close":
            breakers.force_close(key)
        else:
            breakers.reset(key)
        return JSONResponse(self._breaker(key))

    async def faults(self, request: Request) -> Response:
        if request.method == "PUT":
            return await self.put_faults(request)
        if request.method == "DELETE":
            return await self.delete_faults(request)
        return await self.get_faults(request)

    async def get_faults(self, request: Request) -> Response:
        _check_query(request)
        return JSONResponse({"faults": _faults(self.state)})

    async def put_faults(self, request: Request) -> Response:
        _check_query(request, "seed", "replace")
        seed = _query_int(request, "seed")
        replace = _query_bool(request, "replace")
        faults = _parse_faults(await _json_body(request))
        injector = self.state.dispatcher.faults
        in_force = 0 if replace else len(injector.list())
        if in_force + len(faults) > MAX_FAULTS:
            raise _Refused(
                409, "too_many_faults", f"at most {MAX_FAULTS} faults may be in force at once"
            )
        if replace:
            injector.clear()
        if seed is not None:
            injector.seed(seed)
        added = [injector.add(fault) for fault in faults]
        return JSONResponse({"added": added, "faults": _faults(self.state)})

    async def delete_faults(self, request: Request) -> Response:
        _check_query(request)
        injector = self.state.dispatcher.faults
        removed = len(injector.list())
        injector.clear()
        return JSONResponse({"removed": removed})

    async def delete_fault(self, request: Request) -> Response:
        _check_query(request)
        raw = str(request.path_params["id"])
        if not _INTEGER.match(raw) or not self.state.dispatcher.faults.remove(int(raw)):
            raise _Refused(404, "unknown_fault", f"no fault {raw[:40]!r} is in force")
        return JSONResponse({"removed": 1})

    async def tools(self, request: Request) -> Response:
        _check_query(request, "profile")
        dispatcher = self.state.dispatcher
        name = request.query_params.get("profile")
        if name is not None and name not in dispatcher.profiles:
            raise _Refused(404, "unknown_profile", f"no profile named {name!r}"[:240])
        profile = None if name is None else dispatcher.profiles[name]
        tools = []
        for tool in dispatcher.registry.tools():
            decl = tool.decl
            if profile is not None and not profile.permits(decl):
                continue
            tools.append(
                {
                    "name": decl.name,
                    "description": decl.description,
                    "risk": decl.risk,
                    "breaker_key": decl.key,
                    "timeout_s": decl.timeout_s,
                    "idempotent": decl.is_idempotent,
                    "tags": sorted(decl.tags),
                    "version": decl.version,
                    "breaker_state": dispatcher.breakers.state(decl.key),
                    "offered": dispatcher.breakers.blocked_for(decl.key) is None,
                }
            )
        return JSONResponse({"tools": tools})

    async def openapi(self, request: Request) -> Response:
        _check_query(request)
        doc = openapi_document(self.state.breaker_keys(), self.state.dispatcher.profiles)
        return JSONResponse(doc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    error = codes.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    response = _error(exc.status_code, error, str(exc.detail))
    response.headers.update(headers)
    return response


def admin_app(state: AdminState) -> Starlette:
    """The admin API as an ASGI app."""
    api = _Api(state)
    guard = api.authed
    action = "{action:str}"
    routes = [
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/readyz", guard(api.readyz), methods=["GET"]),
        Route("/metrics", guard(api.metrics), methods=["GET"]),
        Route("/breakers", guard(api.breakers), methods=["GET"]),
        Route("/breakers/{key}", guard(api.breaker), methods=["GET"]),
        Route("/breakers/{key}/" + action, guard(api.breaker_action), methods=["POST"]),
        Route("/faults", guard(api.faults), methods=["GET", "PUT", "DELETE"]),
        Route("/faults/{id}", guard(api.delete_fault), methods=["DELETE"]),
        Route("/tools", guard(api.tools), methods=["GET"]),
        Route("/openapi.json", guard(api.openapi), methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
