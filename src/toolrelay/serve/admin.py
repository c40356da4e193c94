"""The admin API: breakers, faults, tools, health and metrics of a running gateway.

A FastAPI app on its own port; every endpoint but ``/healthz`` needs the admin token (see
:mod:`.admin_http` for the checks every route gets and the error bodies). Its OpenAPI 3.1
document is generated from the routes and :mod:`.admin_models`. The app runs on the
dispatcher's event loop: breakers and the fault injector are not thread-safe.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from .._version import __version__
from ..breakers import Breakers
from ..catalog import Catalog
from ..dispatcher import Dispatcher
from . import admin_models as m
from .admin_http import (
    MAX_BODY_BYTES as MAX_BODY_BYTES,
)
from .admin_http import (
    AdminRoute,
    ApiError,
    HostCheck,
    authorized,
    http_error,
    invalid_request,
    known_query,
)
from .errors import ReloadRefused
from .health import UpstreamHealth
from .ui import status_ui

MAX_FAULTS = m.MAX_FAULTS
_MAX_SEED = 10**30 - 1
_INTEGER = re.compile(r"^-?[0-9]{1,30}(\.0+)?$")  # what JSON Schema calls an integer


@dataclass
class AdminState:
    """What the admin API acts on, and whether the gateway is ready."""

    dispatcher: Dispatcher
    registry: CollectorRegistry
    token: str = field(repr=False)
    ready: bool = False
    reason: str = "starting"
    upstreams: UpstreamHealth | None = None
    """The upstream MCP servers: the gateway is ready only when the required ones are up."""
    reload: Callable[[], Awaitable[m.Reloaded]] | None = None
    """Re-read and apply the config file (``POST /reload``); ``None``: not offered."""
    catalog: Catalog | None = None
    """The tool lock and its drift (``GET /tools/{name}/drift``); ``None``: no lock."""
    config_hash: Callable[[], str | None] = lambda: None
    """The content hash of the config file in force (``/readyz`` shows it)."""

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness as ``/readyz`` reports it."""
        self.ready, self.reason = ready, reason

    def breaker_keys(self) -> set[str]:
        """Keys of every registered tool and every breaker created so far."""
        keys = {tool.decl.key for tool in self.dispatcher.registry.tools()}
        return keys | set(self.dispatcher.breakers.keys())


async def _state(request: Request) -> AdminState:  # async: sync dependencies run in threads
    state: AdminState = request.app.state.admin
    return state


# -- the routes --------------------------------------------------------------------------------
State = Annotated[AdminState, Depends(_state)]
_ERROR: dict[str, Any] = {"model": m.Error}
_NO_BREAKER: dict[int | str, dict[str, Any]] = {
    404: {**_ERROR, "description": "No tool uses this breaker key."}
}
_REFUSED: dict[int | str, dict[str, Any]] = {
    "4XX": {**_ERROR, "description": "Refused; the message says why."}
}
public = APIRouter(
    route_class=AdminRoute,
    dependencies=[Depends(known_query)],
    responses=_REFUSED,
    strict_content_type=False,  # a body without a Content-Type is JSON
)
authed = APIRouter(
    route_class=AdminRoute,
    dependencies=[Depends(authorized), Depends(known_query)],
    responses={
        **_REFUSED,
        401: {
            **_ERROR,
            "description": "No valid bearer token.",
            "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
        },
    },
    strict_content_type=False,
)


def _decimal(value: Any) -> Any:
    if isinstance(value, str) and not _INTEGER.match(value):
        raise ValueError("must be an integer")
    return value


def _breaker(
    state: AdminState, key: str, act: Callable[[Breakers, str], None] | None = None
) -> m.BreakerWithKey:
    if key not in state.breaker_keys():
        raise ApiError(404, "unknown_breaker", f"no tool uses the breaker key {key!r}")
    if act is not None:
        act(state.dispatcher.breakers, key)
    snapshot = state.dispatcher.breakers.get(key).snapshot()
    return m.BreakerWithKey.model_validate({"key": key, **snapshot})


def _faults(state: AdminState) -> list[dict[str, Any]]:
    return [{"id": i, **f.to_dict()} for i, f in sorted(state.dispatcher.faults.list().items())]


@public.get("/healthz", summary="Liveness: the process answers.", openapi_extra={"security": []})
async def healthz() -> m.Health:
    return m.Health(status="ok")


@authed.get(
    "/readyz",
    summary="Readiness: plugins are loaded, the MCP transport is serving and every "
    "upstream MCP server that is not optional is connected.",
    responses={503: {"model": m.Readiness, "description": "Not ready yet (or shutting down)."}},
    response_model_exclude_none=True,
)
async def readyz(state: State, response: Response) -> m.Readiness:
    health = state.upstreams
    upstreams = None if health is None else health.statuses() or None
    reason = None if state.ready else state.reason or "not ready"
    if reason is None and health is not None:
        reason = health.not_ready()
    config = state.config_hash()
    if reason is not None:
        response.status_code = 503
        return m.Readiness(ready=False, reason=reason, upstreams=upstreams, config_hash=config)
    tools = len(state.dispatcher.registry)
    return m.Readiness(ready=True, tools=tools, upstreams=upstreams, config_hash=config)


@authed.get(
    "/metrics",
    summary="The dispatcher's and the gateway's Prometheus metrics.",
    response_class=Response,  # no JSON: errors stay JSON, the 200 is documented here
    responses={
        200: {
            "description": "The Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(state: State) -> Response:
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)


@authed.get("/breakers", summary="Every breaker, by key.")
async def breakers(state: State) -> m.BreakersView:
    get = state.dispatcher.breakers.get
    return m.BreakersView.model_validate(
        {"breakers": {key: get(key).snapshot() for key in sorted(state.breaker_keys())}}
    )


@authed.get("/breakers/{key}", summary="One breaker.", responses=_NO_BREAKER)
async def breaker(state: State, key: str) -> m.BreakerWithKey:
    return _breaker(state, key)


def _action(name: str, summary: str, act: Callable[[Breakers, str], None]) -> None:
    async def breaker_action(state: State, key: str) -> m.BreakerWithKey:
        return _breaker(state, key, act)

    authed.post(f"/breakers/{{key}}/{name}", summary=summary, responses=_NO_BREAKER, name=name)(
        breaker_action
    )


_action(
    "open", "Force the breaker open: calls fail fast, no trials until closed.", Breakers.force_open
)
_action("close", "Close the breaker now (failure count cleared).", Breakers.force_close)
_action("reset", "Back to a fresh closed breaker.", Breakers.reset)


@authed.get("/faults", summary="The faults in force.", response_model_exclude_unset=True)
async def get_faults(state: State) -> m.Faults:
    return m.Faults.model_validate({"faults": _faults(state)})


@authed.put(
    "/faults",
    summary="Put one fault or a list of faults in force (all or none).",
    response_model_exclude_unset=True,
    responses={
        400: {**_ERROR, "description": "The body is not JSON, or a query parameter is malformed."},
        409: {**_ERROR, "description": f"More than {MAX_FAULTS} faults would be in force."},
        413: {**_ERROR, "description": "The body is too large."},
        415: {**_ERROR, "description": "The body is not sent as application/json."},
        422: {**_ERROR, "description": "A fault is not valid; the message names it."},
    },
)
async def put_faults(
    state: State,
    body: m.FaultsBody,
    seed: Annotated[
        int | None,
        BeforeValidator(_decimal),
        Query(ge=-_MAX_SEED, le=_MAX_SEED, description="Restart the fault dice with this seed."),
    ] = None,
    replace: Annotated[bool, Query(description="Clear the faults in force first.")] = False,
) -> m.FaultsAdded:
    faults = [spec.fault() for spec in (body if isinstance(body, list) else [body])]
    injector = state.dispatcher.faults
    if (0 if replace else len(injector.list())) + len(faults) > MAX_FAULTS:
        raise ApiError(
            409, "too_many_faults", f"at most {MAX_FAULTS} faults may be in force at once"
        )
    if replace:
        injector.clear()
    if seed is not None:
        injector.seed(seed)
    added = [injector.add(fault) for fault in faults]
    return m.FaultsAdded.model_validate({"added": added, "faults": _faults(state)})


@authed.delete("/faults", summary="Clear every fault.")
async def delete_faults(state: State) -> m.Removed:
    removed = len(state.dispatcher.faults.list())
    state.dispatcher.faults.clear()
    return m.Removed(removed=removed)


@authed.delete(
    "/faults/{id}",
    summary="Remove one fault.",
    responses={404: {**_ERROR, "description": "No fault with this id is in force."}},
)
async def delete_fault(state: State, fault_id: Annotated[int, Path(alias="id", ge=1)]) -> m.Removed:
    if not state.dispatcher.faults.remove(fault_id):
        raise ApiError(404, "unknown_fault", f"no fault {str(fault_id)!r} is in force")
    return m.Removed(removed=1)


@authed.get(
    "/tools",
    summary="Every registered tool, or those a profile permits.",
    responses={404: {**_ERROR, "description": "No profile of this name."}},
)
async def tools(state: State, profile: str | None = None) -> m.Tools:
    dispatcher = state.dispatcher
    if profile is not None and profile not in dispatcher.profiles:
        raise ApiError(404, "unknown_profile", f"no profile named {profile!r}")
    permits = None if profile is None else dispatcher.profiles[profile].permits
    decls = [tool.decl for tool in dispatcher.registry.tools()]
    listed = [
        m.ToolInfo(
            name=decl.name,
            description=decl.description,
            risk=decl.risk,
            breaker_key=decl.key,
            timeout_s=decl.timeout_s,
            idempotent=decl.is_idempotent,
            tags=sorted(decl.tags),
            version=decl.version,
            breaker_state=dispatcher.breakers.state(decl.key),
            offered=dispatcher.breakers.blocked_for(decl.key) is None,
        )
        for decl in decls
        if permits is None or permits(decl)
    ]
    return m.Tools(tools=listed)


@authed.get(
    "/tools/{name}/drift",
    summary="How a tool's live definition differs from its lock entry (docs/catalog.md).",
    responses={404: {**_ERROR, "description": "No lock file, or it names no such tool."}},
)
async def drift(state: State, name: str) -> dict[str, Any]:
    found = None if state.catalog is None else state.catalog.drift(name)
    if found is None:
        raise ApiError(404, "unknown_tool", f"the lock file knows no tool {name[:80]!r}")
    return found


@authed.post(
    "/reload",
    summary="Re-read the config file and apply it without dropping a session (all or "
    "nothing: on an error the old config keeps serving).",
    responses={
        400: {
            **_ERROR,
            "description": "Not applied: a change needs a restart, or applying "
            "it failed (an upstream cannot be reached, a plugin does not load).",
        },
        409: {**_ERROR, "description": "The gateway was started without a config file."},
        422: {**_ERROR, "description": "The config file cannot be used; the message says why."},
    },
)
async def reload(state: State) -> m.Reloaded:
    if state.reload is None:
        raise ApiError(409, "no_config_file", "this gateway has no config file to reload")
    try:
        return await state.reload()
    except ReloadRefused as refused:
        raise ApiError(refused.status, refused.error, refused.message) from None


@authed.get("/openapi.json", summary="This document.", response_model=dict[str, Any])
async def openapi(request: Request, state: State) -> JSONResponse:
    """The generated document (built once), with this server's breaker keys and profiles."""
    enums = {"key": sorted(state.breaker_keys()), "profile": sorted(state.dispatcher.profiles)}

    def with_enums(operation: dict[str, Any]) -> dict[str, Any]:
        params = [
            {**p, "schema": {"type": "string", "enum": enums[p["name"]]}}
            if enums.get(p["name"])
            else p
            for p in operation.get("parameters", ())
        ]
        return {**operation, "parameters": params} if params else operation

    doc = request.app.openapi()  # copied where it changes, never changed in place
    paths = {
        path: {method: with_enums(operation) for method, operation in operations.items()}
        for path, operations in doc["paths"].items()
    }
    return JSONResponse({**doc, "paths": paths})


def admin_app(state: AdminState, hosts: TransportSecuritySettings | None = None) -> FastAPI:
    """The admin API as an ASGI app; with ``hosts``, a request with another ``Host`` or
    ``Origin`` is refused (:class:`~toolrelay.serve.admin_http.HostCheck`)."""
    app = FastAPI(
        title="toolrelay admin API",
        version=__version__,
        description="Operate a running `toolrelay serve`: breakers, faults, tools, health "
        "and metrics. JSON in and out; errors are `{error, message}`.",
        servers=[{"url": "/"}],
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        routes=[*public.routes, *authed.routes],  # as they are: no lazy include_router copies
        exception_handlers={HTTPException: http_error, RequestValidationError: invalid_request},
    )
    app.state.admin = state
    app.mount("/ui", status_ui())  # the read-only status page (public files; data needs the token)
    if hosts is not None:
        app.add_middleware(HostCheck, security=hosts)
    return app
