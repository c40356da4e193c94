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
    StorageJoined,
    WorkerAbandoned,
    WorkerKilled,
)

ERROR_TYPE = "error.type"
BREAKER_KEY = "toolrelay.breaker_key"
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
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name[:128],
        "gen_ai.tool.type": "function",
        "toolrelay.attempts": attempts,
        OUTCOME: outcome,
    }
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    if description:
        attributes["gen_ai.tool.description"] = description[:1024]
    if key is not None:
        attributes[BREAKER_KEY] = key
    if content is not None:
        attributes["gen_ai.tool.call.arguments"] = _content(content[0])
        if content[1] is not None:
            attributes["gen_ai.tool.call.result"] = _content(content[1])
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
    elif isinstance(event, StorageJoined):
        span.set_attribute("toolrelay.breaker.joined", "alone" if event.alone else "fleet")
        span.set_attribute("toolrelay.breaker.join_s", event.waited_s)
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
