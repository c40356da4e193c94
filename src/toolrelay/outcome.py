"""What a pipeline stage returns: an outcome, never an exception.

``Outcome`` is internal; the host sees :class:`toolrelay.ToolResult`, the model sees
``ToolResult.to_model()``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from .contract import ErrorType, ToolDeclaration, ToolError
from .redact import Redactor, describe_exception

log = logging.getLogger("toolrelay")

MAX_MESSAGE_CHARS = 240
MAX_REDACTED_CHARS = 16384
"""How much of a ``ToolError`` message is redacted (and the rest dropped): the model reads
at most 240 characters of it, and a huge message must not make redaction slow."""
UNKNOWN_EFFECT = "; it may still have taken effect: check before calling it again"
_DEFAULT_REDACTOR = Redactor()


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


def timeout_outcome(decl: ToolDeclaration, slot_elapsed_s: float | None = None) -> Outcome:
    """The ``timeout`` answer (built directly: this runs for every call of a hung flood);
    ``slot_elapsed_s`` when the model slot's budget set the deadline (its hold so far).

    A tool that is not idempotent was stopped after it may have started its effect (an
    abandoned thread or a sent request may still commit it): its timeout is not retryable
    and says so."""
    if slot_elapsed_s is not None:
        message = (
            f"{decl.name} was stopped after {slot_elapsed_s:.1f} s: the model's time budget ran out"
        )
        verdict = Verdict.IGNORE
    else:
        message = f"{decl.name} did not answer within its {decl.timeout_s:g} s deadline"
        verdict = Verdict.FAILURE
    if decl.is_idempotent:
        return Outcome(False, None, ErrorType.TIMEOUT, message, True, None, verdict)
    message = short(message + UNKNOWN_EFFECT)
    return Outcome(False, None, ErrorType.TIMEOUT, message, False, None, verdict, False, True)


def error_outcome(
    decl: ToolDeclaration, exc: Exception, redact: Callable[[str], str] | None = None
) -> Outcome:
    """The answer for an exception; a plugin's own message is redacted (it may quote an
    upstream, credentials and all) before it is cut to the message cap, so a secret is
    never shown in part. Any other exception is logged with its traceback, redacted too;
    the model reads only its type. ``redact`` defaults to the default patterns."""
    if redact is None:
        redact = _DEFAULT_REDACTOR
    if isinstance(exc, ToolError):
        text = str(exc.message)
        if len(text) > MAX_REDACTED_CHARS:  # the model reads 240 characters of it at most
            text = text[:MAX_REDACTED_CHARS]
        message = short(redact(text)) or f"{decl.name} failed and gave no reason"
        return Outcome(
            False,
            None,
            exc.error_type,
            message,
            exc.retryable,
            exc.retry_after_s,
            Verdict.FAILURE if exc.counts_as_failure else Verdict.IGNORE,
        )
    # Not exc_info: a handler would format the traceback (the exception's text, which may
    # quote a secret) out of reach of redaction. The redacted traceback is the message.
    return raised_outcome(decl, type(exc).__name__, describe_exception(exc, redact))


def raised_outcome(decl: ToolDeclaration, name: str, details: str) -> Outcome:
    """The answer for a handler that raised ``name`` (``details``: its redacted
    traceback, logged; the model reads only the type)."""
    log.warning("toolrelay: tool %s raised %s\n%s", decl.name, name, details)
    return unexpected(decl, f"{decl.name} failed unexpectedly ({name})")


def unexpected(decl: ToolDeclaration, message: str) -> Outcome:
    """A ``tool_error`` the breaker counts; for a tool that is not idempotent, its effect
    may be done (it failed part-way)."""
    if decl.is_idempotent:
        return failure(ErrorType.TOOL_ERROR, message, verdict=Verdict.FAILURE)
    message = short(message + UNKNOWN_EFFECT)
    return Outcome(False, None, ErrorType.TOOL_ERROR, message, False, None, Verdict.FAILURE,
                   False, True)  # fmt: skip


class _BreakerSettings(Protocol):
    @property
    def reset_timeout_s(self) -> float: ...


class OpenBreaker(Protocol):
    """What :func:`circuit_open` reads of a key's breaker."""

    @property
    def key(self) -> str: ...
    @property
    def config(self) -> _BreakerSettings: ...
    @property
    def pinned_open(self) -> bool: ...
    def retry_after(self) -> float: ...


def circuit_open(name: str, breaker: OpenBreaker, wait: float | None = None) -> Outcome:
    """The ``circuit_open`` answer for tool ``name``, with when to try again (``wait``, if
    already known).

    A breaker pinned open by an operator (``force_open``) is due no trial: the answer says
    so instead of promising one, and ``retry_after_s`` is the break, as an interval at
    which to ask again."""
    if wait is None:
        wait = breaker.retry_after()
    if breaker.pinned_open:
        message = (
            f"{name} is paused: an operator paused {breaker.key}; "
            "calls are refused until it is released"
        )
        return Outcome(False, None, ErrorType.CIRCUIT_OPEN, short(message), True, wait)
    if wait > 0:
        hint = f"try again in {wait:.1f} s" if wait < 10 else f"try again in {wait:.0f} s"
    else:  # half-open, with every trial place taken
        wait = min(1.0, breaker.config.reset_timeout_s)
        hint = "a trial call is testing it; try again in a moment"
    message = f"{name} is paused because {breaker.key} is failing; {hint}"
    return Outcome(False, None, ErrorType.CIRCUIT_OPEN, short(message), True, wait)
