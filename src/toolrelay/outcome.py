"""What a pipeline stage returns: an outcome, never an exception.

``Outcome`` is internal; the host sees :class:`toolrelay.ToolResult`, the model sees
``ToolResult.to_model()``.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .contract import ErrorType

MAX_MESSAGE_CHARS = 240


class Verdict(enum.Enum):
    """How a breaker should count an outcome."""

    SUCCESS = "success"
    FAILURE = "failure"
    IGNORE = "ignore"


@dataclass(slots=True)
class Outcome:
    ok: bool
    data: Any = None
    error_type: ErrorType | None = None
    message: str = ""
    retryable: bool = False
    retry_after_s: float | None = None
    verdict: Verdict = Verdict.SUCCESS
    final: bool = False
    """Set when no further attempt may be made (e.g. this failure opened the breaker)."""
    effect_unknown: bool = False
    """The tool (not idempotent) may have taken effect before it failed or was stopped."""
    served_by: str | None = None
    """The fallback tool that answered this call instead of the one called."""

    def __await__(self) -> Generator[Any, None, Outcome]:
        """An outcome is its own finished awaitable: a stage that answers at once (or
        passes the call on) can be a plain ``def`` returning an outcome or
        ``call_next(inv)``, and costs the call no coroutine frame of its own."""
        return self
        yield  # pragma: no cover - makes this a generator that never suspends


def success(data: Any) -> Outcome:
    return Outcome(True, data)


def failure(
    error_type: ErrorType,
    message: str,
    *,
    retryable: bool = False,
    retry_after_s: float | None = None,
    verdict: Verdict = Verdict.IGNORE,
) -> Outcome:
    return Outcome(
        False,
        None,
        error_type,
        short(message),
        retryable,
        retry_after_s,
        verdict,
    )


def short(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One line, capped: what the model may read of a message."""
    text = " ".join(str(message).split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text
