"""The admin API's HTTP plumbing: what every request gets before it is routed (its ``Host``
and ``Origin``), what every route gets before it runs (the bearer token, known query
parameters, a JSON body within bounds) and the ``{"error", "message"}`` bodies of its
refusals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from ..jsonlimits import too_big
from .admin_models import MAX_FAULTS
from .auth import token_matches

MAX_BODY_BYTES = 256 * 1024
MAX_BODY_DEPTH = 66
"""A list of faults whose outputs are as deep as a fault's output may be (64 levels)."""


class ApiError(HTTPException):
    """A request answered with a 4xx ``{"error": code, "message": sentence}``."""

    def __init__(
        self, status: int, error: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, message[:240], headers)
        self.error = error


def _error(status: int, error: str, message: str, headers: Any = None) -> JSONResponse:
    return JSONResponse({"error": error, "message": message[:240]}, status, headers=headers)


class HostCheck:
    """ASGI middleware: a request whose ``Host`` the server is not reached by is answered 421
    (``misdirected_request``), one from a foreign page's ``Origin`` 403 (``forbidden_origin``):
    the MCP transport's DNS-rebinding checks, before any route (or redirect) runs."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings) -> None:
        self.app = app
        self._check = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = await self._check.validate_request(Request(scope))
            if refused is not None:
                status = refused.status_code
                error = "misdirected_request" if status == 421 else "forbidden_origin"
                message = bytes(refused.body).decode()
                await _error(status, error, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- auth, query and body: what every route gets before it runs ------------------------------
_BEARER = HTTPBearer(
    scheme_name="bearerAuth",
    description="The admin token (TOOLRELAY_ADMIN_TOKEN, or the variable named by "
    "--admin-token-env).",
    auto_error=False,
)


async def authorized(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
) -> None:
    """The dependency of every route but ``/healthz``: a 401 without the admin token."""
    token = request.app.state.admin.token
    if credentials is None or not token_matches(credentials.credentials, token):
        raise ApiError(
            401,
            "unauthorized",
            "send Authorization: Bearer <admin token>",
            {"WWW-Authenticate": 'Bearer realm="toolrelay-admin"'},
        )


async def known_query(request: Request) -> None:
    """Refuse query parameters the route does not declare (its dependencies declare none),
    and repeated ones."""
    route = request.scope["route"]
    assert isinstance(route, APIRoute)
    declared = {param.alias for param in route.dependant.query_params}
    seen = set()
    for name, _ in request.query_params.multi_items():
        if name not in declared:
            raise ApiError(400, "invalid_query", f"unknown query parameter {name[:40]!r}")
        if name in seen:
            raise ApiError(400, "invalid_query", f"query parameter {name!r} given twice")
        seen.add(name)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media[-5:] == "+json"
    )


class _AdminRequest(Request):
    """A request whose body is JSON within :data:`MAX_BODY_BYTES` and :data:`MAX_BODY_DEPTH`.

    FastAPI reads a route's body before it runs the route's dependencies, so the token is
    checked here first: no byte of an unauthenticated body is read.
    """

    _read: bytes | None = None

    async def body(self) -> bytes:
        if self._read is None:
            await authorized(self, await _BEARER(self))
            content_type = self.headers.get("content-type")
            if content_type is not None and not _is_json(content_type):
                raise ApiError(415, "unsupported_media_type", "send the body as application/json")
            too_large = ApiError(
                413, "payload_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes"
            )
            declared = self.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                raise too_large
            body = bytearray()
            async for chunk in self.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise too_large
            if not body:
                raise ApiError(400, "invalid_json", "the body is not valid JSON (it is empty)")
            self._read = bytes(body)
        return self._read

    async def json(self) -> Any:
        try:
            value = json.loads(await self.body(), parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, "invalid_json", f"the body is not valid JSON ({exc})") from None
        problem = too_big(value, MAX_BODY_DEPTH, MAX_BODY_BYTES)
        if problem is not None:  # before any validator walks it (they recurse)
            raise ApiError(400, "invalid_json", f"the body is refused: {problem}")
        return value


class AdminRoute(APIRoute):
    """A route that sees an :class:`_AdminRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def admin_handler(request: Request) -> Response:
            return await handler(_AdminRequest(request.scope, request.receive))

        return admin_handler


# -- errors ------------------------------------------------------------------------------------
_CODES = {404: "not_found", 405: "method_not_allowed"}


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = getattr(exc, "error", None) or _CODES.get(exc.status_code, "http_error")
    headers = exc.headers
    if exc.status_code == 405:  # every method of the path, not only the first route's
        routes = [route for route in request.app.routes if isinstance(route, APIRoute)]
        matching = [route for route in routes if route.matches(request.scope)[0] != Match.NONE]
        methods = {method for route in matching for method in route.methods or ()}
        headers = {"Allow": ", ".join(sorted(methods))}
    return _error(exc.status_code, error, str(exc.detail), headers)


def _fault_problem(loc: tuple[Any, ...], kind: str, problem: str) -> str:
    """A sentence naming the fault that is not valid, from a body validation error."""
    if not loc:
        return f"the body {problem}"
    tag, *rest = loc
    if tag == "many" and not rest:
        return (
            "the list of faults is empty"
            if kind == "too_short"
            else f"at most {MAX_FAULTS} faults at once"
        )
    where = f"fault {rest.pop(0)}" if tag == "many" else "the fault"
    at = f" at {'.'.join(map(str, rest))}" if rest else ""
    return f"{where}{at}: {problem}"


async def invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    source, *loc = first["loc"]
    problem = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
    if source == "query":
        return _error(400, "invalid_query", f"query parameter {loc[0]!r}: {problem}")
    if source == "path":  # the one typed path parameter: a fault id that names no fault
        return _error(404, "unknown_fault", f"no fault {str(first['input'])[:40]!r} is in force")
    return _error(422, "invalid_fault", _fault_problem(tuple(loc), first["type"], problem))
