"""Span attributes and events, after the OpenTelemetry GenAI conventions (API only)."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from ..events import (
    AttemptEnded,
    BreakerTransition,
    Event,
    FaultInjected,
    RetryScheduled,
    WorkerAbandoned,
)

OPERATION = "gen_ai.operation.name"
TOOL_NAME = "gen_ai.tool.name"
CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
DESCRIPTION = "gen_ai.tool.description"
ARGUMENTS = "gen_ai.tool.call.arguments"
RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
BREAKER_KEY = "toolrelay.breaker_key"
ATTEMPTS = "toolrelay.attempts"
OUTCOME = "toolrelay.outcome"

MAX_CONTENT_CHARS = 8192


def _content(value: Any) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = "<not JSON>"
    return text[:MAX_CONTENT_CHARS]


def finish(
    span: Span,
    name: str,
    call_id: str | None,
    description: str | None,
    key: str | None,
    attempts: int,
    outcome: str,
    message: str,
    content: tuple[Any, Any] | None,
) -> None:
    """Set the attributes known once the call has its answer (recording spans only)."""
    span.set_attribute(OPERATION, "execute_tool")
    span.set_attribute(TOOL_NAME, name[:128])
    span.set_attribute(TOOL_TYPE, "function")
    if call_id is not None:
        span.set_attribute(CALL_ID, call_id)
    if description:
        span.set_attribute(DESCRIPTION, description[:1024])
    if key is not None:
        span.set_attribute(BREAKER_KEY, key)
    span.set_attribute(ATTEMPTS, attempts)
    span.set_attribute(OUTCOME, outcome)
    if content is not None:
        span.set_attribute(ARGUMENTS, _content(content[0]))
        if content[1] is not None:
            span.set_attribute(RESULT, _content(content[1]))
    if outcome != "ok":
        span.set_attribute(ERROR_TYPE, outcome)
        span.set_status(Status(StatusCode.ERROR, message))


def add_event(span: Span, event: Event) -> None:
    """Record a stage event on the call's span."""
    if isinstance(event, RetryScheduled):
        span.add_event(
            "toolrelay.retry",
            {
                "toolrelay.attempt": event.attempt,
                "toolrelay.retry.delay_s": event.delay_s,
                ERROR_TYPE: event.error_type,
            },
        )
    elif isinstance(event, BreakerTransition):
        span.add_event(
            "toolrelay.breaker.transition",
            {BREAKER_KEY: event.breaker_key, "toolrelay.breaker.from": event.from_state,
             "toolrelay.breaker.to": event.to_state},
        )  # fmt: skip
    elif isinstance(event, FaultInjected):
        span.add_event("toolrelay.fault", {"toolrelay.fault": event.fault})
    elif isinstance(event, WorkerAbandoned):
        span.add_event("toolrelay.worker.abandoned", {BREAKER_KEY: event.breaker_key})
    elif isinstance(event, AttemptEnded) and event.number > 1:
        span.add_event(
            "toolrelay.attempt", {"toolrelay.attempt": event.number, OUTCOME: event.result}
        )
