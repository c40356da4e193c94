"""Span attributes and events, after the OpenTelemetry GenAI conventions (API only)."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from ..events import (
    AttemptEnded,
    BreakerTransition,
    ConcurrencyLimited,
    Event,
    FaultInjected,
    HedgeEnded,
    RetryBudgetExhausted,
    RetryScheduled,
    WorkerAbandoned,
    WorkerKilled,
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
    attributes: dict[str, Any] = {
        OPERATION: "execute_tool",
        TOOL_NAME: name[:128],
        TOOL_TYPE: "function",
        ATTEMPTS: attempts,
        OUTCOME: outcome,
    }
    if call_id is not None:
        attributes[CALL_ID] = call_id
    if description:
        attributes[DESCRIPTION] = description[:1024]
    if key is not None:
        attributes[BREAKER_KEY] = key
    if content is not None:
        attributes[ARGUMENTS] = _content(content[0])
        if content[1] is not None:
            attributes[RESULT] = _content(content[1])
    if outcome != "ok":
        attributes[ERROR_TYPE] = outcome
        span.set_status(Status(StatusCode.ERROR, message))
    span.set_attributes(attributes)


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
    elif isinstance(event, WorkerKilled):
        span.add_event("toolrelay.worker.killed", {BREAKER_KEY: event.breaker_key})
    elif isinstance(event, ConcurrencyLimited):
        span.set_attribute("toolrelay.concurrency.limit", event.limit)
        span.set_attribute("toolrelay.concurrency.in_flight", event.in_flight)
    elif isinstance(event, AttemptEnded) and event.attempt > 1:
        span.add_event(
            "toolrelay.attempt", {"toolrelay.attempt": event.attempt, OUTCOME: event.result}
        )
    elif isinstance(event, HedgeEnded):
        span.add_event(
            "toolrelay.hedge",
            {"toolrelay.attempt": event.attempt, "toolrelay.hedge.result": event.result,
             "toolrelay.hedge.winner": event.winner},
        )  # fmt: skip
    elif isinstance(event, RetryBudgetExhausted):
        span.add_event(
            "toolrelay.retry_budget.exhausted",
            {BREAKER_KEY: event.breaker_key, "toolrelay.retry_budget.kind": event.kind},
        )
