"""The OpenAPI 3.1 document of the admin API (served at ``/openapi.json``).

Built per request from the running server, so the ``enum`` of breaker keys and profile
names is the one the server answers to. The fault schema is the core config's
(``[[faults]]`` in ``toolrelay.toml``), so the admin API and the config accept the same.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from .. import __version__
from ..config import CONFIG_SCHEMA

__all__ = ["FAULT_SCHEMA", "MAX_FAULTS", "openapi_document"]

MAX_FAULTS = 100
"""The most faults in force at once (and in one ``PUT /faults``)."""

FAULT_SCHEMA: dict[str, Any] = copy.deepcopy(CONFIG_SCHEMA["properties"]["faults"]["items"])

_NULLABLE_NUMBER = {"type": ["number", "null"]}
_BREAKER: dict[str, Any] = {
    "type": "object",
    "required": [
        "state",
        "failures",
        "trials_in_flight",
        "retry_after_s",
        "pinned_open",
        "failure_rate",
        "slow_call_rate",
        "break_s",
    ],
    "properties": {
        "state": {"enum": ["closed", "open", "half_open"]},
        "failures": {"type": "integer", "minimum": 0},
        "trials_in_flight": {"type": "integer", "minimum": 0},
        "retry_after_s": {
            **_NULLABLE_NUMBER,
            "description": "Seconds until a trial call is admitted (open breakers only).",
        },
        "pinned_open": {
            "type": "boolean",
            "description": "Forced open: no trial calls until closed or reset.",
        },
        "failure_rate": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "Failed share of the calls in the window (rate windows only).",
        },
        "slow_call_rate": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "Slow share of the calls in the window (rate windows only).",
        },
        "break_s": {
            "type": "number",
            "minimum": 0,
            "description": "The current break: how long an opening lasts before a trial.",
        },
    },
}
_FAULT_IN_FORCE: dict[str, Any] = {
    "type": "object",
    "required": [
        "id",
        "kind",
        "rate",
        "latency_s",
        "jitter_s",
        "error_type",
        "message",
        "retryable",
    ],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        **FAULT_SCHEMA["properties"],
    },
}
_TOOL: dict[str, Any] = {
    "type": "object",
    "required": [
        "name",
        "description",
        "risk",
        "breaker_key",
        "timeout_s",
        "idempotent",
        "tags",
        "version",
        "breaker_state",
        "offered",
    ],
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "risk": {"enum": ["read", "write", "dangerous"]},
        "breaker_key": {"type": "string"},
        "timeout_s": {"type": "number"},
        "idempotent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "version": {"type": "string"},
        "breaker_state": {"enum": ["closed", "open", "half_open"]},
        "offered": {
            "type": "boolean",
            "description": "Listed to MCP clients now (false while its breaker blocks calls).",
        },
    },
}
_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "A stable, machine-readable code."},
        "message": {"type": "string", "description": "One sentence for a person."},
    },
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_UNAUTHORIZED = {
    **_error("No valid bearer token."),
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
}


def _operation(
    summary: str,
    responses: dict[str, Any],
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    public: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": dict(responses)}
    op["responses"].setdefault("400", _error("An unknown or repeated query parameter."))
    if not public:
        op["responses"]["401"] = _UNAUTHORIZED
    else:
        op["security"] = []
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    return op


def _key_parameter(keys: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if keys:
        schema["enum"] = keys
    return {"name": "key", "in": "path", "required": True, "schema": schema}


def _breaker_action(action: str, summary: str, keys: list[str]) -> dict[str, Any]:
    return {
        "post": _operation(
            summary,
            {
                "200": _json(_ref("BreakerWithKey"), f"The breaker after {action}."),
                "404": _error("No tool uses this breaker key."),
            },
            parameters=[_key_parameter(keys)],
        )
    }


def openapi_document(breaker_keys: Iterable[str], profiles: Iterable[str]) -> dict[str, Any]:
    """The admin API's OpenAPI 3.1 document for a server with these keys and profiles."""
    keys = sorted(set(breaker_keys))
    profile_schema: dict[str, Any] = {"type": "string"}
    names = sorted(set(profiles))
    if names:
        profile_schema["enum"] = names
    fault_body = {
        "oneOf": [
            _ref("FaultSpec"),
            {
                "type": "array",
                "items": _ref("FaultSpec"),
                "minItems": 1,
                "maxItems": MAX_FAULTS,
            },
        ]
    }
    faults_list = {
        "type": "object",
        "required": ["faults"],
        "properties": {"faults": {"type": "array", "items": _ref("Fault")}},
    }
    paths: dict[str, Any] = {
        "/healthz": {
            "get": _operation(
                "Liveness: the process answers.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {"status": {"const": "ok"}},
                        },
                        "Alive.",
                    )
                },
                public=True,
            )
        },
        "/readyz": {
            "get": _operation(
                "Readiness: plugins and upstream MCP servers are loaded and the MCP transport "
                "is serving.",
                {
                    "200": _json(_ref("Readiness"), "Ready."),
                    "503": _json(_ref("Readiness"), "Not ready yet (or shutting down)."),
                },
            )
        },
        "/metrics": {
            "get": _operation(
                "The dispatcher's and the gateway's Prometheus metrics.",
                {
                    "200": {
                        "description": "The Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            )
        },
        "/breakers": {
            "get": _operation(
                "Every breaker, by key.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["breakers"],
                            "properties": {
                                "breakers": {
                                    "type": "object",
                                    "additionalProperties": _ref("Breaker"),
                                }
                            },
                        },
                        "The breakers.",
                    )
                },
            )
        },
        "/breakers/{key}": {
            "get": _operation(
                "One breaker.",
                {
                    "200": _json(_ref("BreakerWithKey"), "The breaker."),
                    "404": _error("No tool uses this breaker key."),
                },
                parameters=[_key_parameter(keys)],
            )
        },
        "/breakers/{key}/open": _breaker_action(
            "opening", "Force the breaker open: calls fail fast, no trials until closed.", keys
        ),
        "/breakers/{key}/close": _breaker_action(
            "closing", "Close the breaker now (failure count cleared).", keys
        ),
        "/breakers/{key}/reset": _breaker_action(
            "the reset", "Back to a fresh closed breaker.", keys
        ),
        "/faults": {
            "get": _operation("The faults in force.", {"200": _json(faults_list, "The faults.")}),
            "put": _operation(
                "Put one fault or a list of faults in force (all or none).",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["added", "faults"],
                            "properties": {
                                "added": {"type": "array", "items": {"type": "integer"}},
                                "faults": {"type": "array", "items": _ref("Fault")},
                            },
                        },
                        "The faults were added; their ids and every fault in force.",
                    ),
                    "400": _error("The body is not JSON, or a query parameter is malformed."),
                    "409": _error(f"More than {MAX_FAULTS} faults would be in force."),
                    "413": _error("The body is too large."),
                    "422": _error("A fault is not valid; the message names it."),
                },
                parameters=[
                    {
                        "name": "seed",
                        "in": "query",
                        "required": False,
                        "description": "Restart the fault dice with this seed.",
                        "schema": {"type": "integer"},
                    },
                    {
                        "name": "replace",
                        "in": "query",
                        "required": False,
                        "description": "Clear the faults in force first.",
                        "schema": {"type": "boolean", "default": False},
                    },
                ],
                body={"required": True, "content": {"application/json": {"schema": fault_body}}},
            ),
            "delete": _operation(
                "Clear every fault.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["removed"],
                            "properties": {"removed": {"type": "integer", "minimum": 0}},
                        },
                        "How many faults were removed.",
                    )
                },
            ),
        },
        "/faults/{id}": {
            "delete": _operation(
                "Remove one fault.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["removed"],
                            "properties": {"removed": {"const": 1}},
                        },
                        "Removed.",
                    ),
                    "404": _error("No fault with this id is in force."),
                },
                parameters=[
                    {
                        "name": "id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1},
                    }
                ],
            )
        },
        "/tools": {
            "get": _operation(
                "Every registered tool, or those a profile permits.",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["tools"],
                            "properties": {"tools": {"type": "array", "items": _ref("Tool")}},
                        },
                        "The tools.",
                    ),
                    "404": _error("No profile of this name."),
                },
                parameters=[
                    {
                        "name": "profile",
                        "in": "query",
                        "required": False,
                        "schema": profile_schema,
                    }
                ],
            )
        },
        "/openapi.json": {
            "get": _operation(
                "This document.",
                {"200": _json({"type": "object"}, "The OpenAPI 3.1 document.")},
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "toolrelay admin API",
            "version": __version__,
            "description": "Operate a running `toolrelay serve`: breakers, faults, tools, "
            "health and metrics. JSON in and out; errors are `{error, message}`.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin token (TOOLRELAY_ADMIN_TOKEN, or the variable "
                    "named by --admin-token-env).",
                }
            },
            "schemas": {
                "Error": _ERROR,
                "Breaker": _BREAKER,
                "BreakerWithKey": {
                    **_BREAKER,
                    "required": ["key", *_BREAKER["required"]],
                    "properties": {"key": {"type": "string"}, **_BREAKER["properties"]},
                },
                "FaultSpec": FAULT_SCHEMA,
                "Fault": _FAULT_IN_FORCE,
                "Tool": _TOOL,
                "Readiness": {
                    "type": "object",
                    "required": ["ready"],
                    "properties": {
                        "ready": {"type": "boolean"},
                        "tools": {"type": "integer", "minimum": 0},
                        "reason": {"type": "string"},
                    },
                },
            },
        },
    }
