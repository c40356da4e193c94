"""What a pipeline stage returns: an outcome, never an exception; and the outcomes
several stages build (timeouts, a handler's exception, an open breaker).

``Outcome`` is internal; the host sees :class:`toolrelay.ToolResult`, the model sees
``ToolResult.to_model()``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from .contract import ErrorType, ToolError
from .invocation import Invocation
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
    """An answer. Immutable: every field is ``Final`` (mypy refuses an assignment); a
    stage that changes one returns ``dataclasses.replace(out, …)``. Not frozen at run
    time: every call builds at least one, and a frozen dataclass's ``__init__`` costs five
    times as much (it sets each field through ``object.__setattr__``)."""

    ok: Final[bool]
    data: Final[Any] = None
    error_type: Final[ErrorType | None] = None
    message: Final[str] = ""
    retryable: Final[bool] = False
    retry_after_s: Final[float | None] = None
    verdict: Final[Verdict] = Verdict.SUCCESS
    final: Final[bool] = False
    """No further attempt may be made (this failure opened the breaker)."""
    effect_unknown: Final[bool] = False
    """The tool (not idempotent) may have taken effect before it failed or was stopped."""
    served_by: Final[str | None] = None
    """The fallback tool that answered this call instead of the one called."""
    request: Final[Invocation | None] = None
    """The invocation this answers (``None`` for an unknown tool): what the outer stages
    and the dispatcher read of the call's tool, key, arguments, deadline and attempts.
    After a fallback answered, the primary's."""
    queued_s: Final[float] = 0.0
    """How long the attempt waited for its bulkhead place (not the service's time)."""
    attempts: Final[int] = 0
    """The attempts this answer counts itself, when its request made none: fast-fail's one
    refused attempt (``0``: the request's ``attempts`` say)."""

    def __await__(self) -> Generator[Any, None, Outcome]:
        """An outcome is its own finished awaitable: a stage that answers at once (or
        passes the call on) can be a plain ``def`` returning an outcome or
        ``call_next(inv)``, and costs the call no coroutine frame of its own."""
        return self
        yield  # pragma: no cover - makes this a generator that never suspends


def failure(
    error_type: ErrorType,
    message: str,
    request: Invocation | None = None,
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
        request=request,
    )


def shown(name: object) -> str:
    """A model-supplied name, safe to echo in a message: short and printable, quoted."""
    text = name if isinstance(name, str) else type(name).__name__
    text = "".join(ch if ch.isprintable() else "?" for ch in text[:64])
    return repr(text)


def short(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One line, capped: what the model may read of a message."""
    text = " ".join(str(message).split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def timeout_outcome(inv: Invocation) -> Outcome:
    """The ``timeout`` answer (built directly: this runs for every call of a hung flood).

    A tool that is not idempotent was stopped after it may have started its effect (an
    abandoned thread or a sent request may still commit it): its timeout is not retryable
    and says so."""
    assert inv.tool is not None
    decl = inv.tool.decl
    if inv.slot_bound:
        assert inv.slot is not None
        message = (
            f"{decl.name} was stopped after {inv.slot.elapsed():.1f} s: "
            "the model's time budget ran out"
        )
        verdict = Verdict.IGNORE
    else:
        message = f"{decl.name} did not answer within its {decl.timeout_s:g} s deadline"
        verdict = Verdict.FAILURE
    if decl.is_idempotent:
        return Outcome(False, None, ErrorType.TIMEOUT, message, True, None, verdict, request=inv)
    message = short(message + UNKNOWN_EFFECT)
    return Outcome(False, None, ErrorType.TIMEOUT, message, False, None, verdict, False, True,
                   request=inv)  # fmt: skip


def error_outcome(
    inv: Invocation, exc: Exception, redact: Callable[[str], str] | None = None
) -> Outcome:
    """The answer for an exception; a plugin's own message is redacted (it may quote an
    upstream, credentials and all) before it is cut to the message cap, so a secret is
    never shown in part. Any other exception is logged with its traceback, redacted too;
    the model reads only its type. ``redact`` defaults to the default patterns."""
    assert inv.tool is not None
    if redact is None:
        redact = _DEFAULT_REDACTOR
    if isinstance(exc, ToolError):
        text = str(exc.message)
        if len(text) > MAX_REDACTED_CHARS:  # the model reads 240 characters of it at most
            text = text[:MAX_REDACTED_CHARS]
        message = short(redact(text)) or f"{inv.tool.decl.name} failed and gave no reason"
        return Outcome(
            False,
            None,
            exc.error_type,
            message,
            exc.retryable,
            exc.retry_after_s,
            Verdict.FAILURE if exc.counts_as_failure else Verdict.IGNORE,
            request=inv,
        )
    # Not exc_info: a handler would format the traceback (the exception's text, which may
    # quote a secret) out of reach of redaction. The redacted traceback is the message.
    return raised_outcome(inv, type(exc).__name__, describe_exception(exc, redact))


def raised_outcome(inv: Invocation, name: str, details: str) -> Outcome:
    """The answer for a handler that raised ``name`` (``details``: its redacted
    traceback, logged; the model reads only the type)."""
    assert inv.tool is not None
    tool = inv.tool.decl.name
    log.warning("toolrelay: tool %s raised %s\n%s", tool, name, details)
    return unexpected(inv, f"{tool} failed unexpectedly ({name})")


def unexpected(inv: Invocation, message: str) -> Outcome:
    """A ``tool_error`` the breaker counts; for a tool that is not idempotent, its effect
    may be done (it failed part-way)."""
    assert inv.tool is not None
    if inv.tool.decl.is_idempotent:
        return failure(ErrorType.TOOL_ERROR, message, inv, verdict=Verdict.FAILURE)
    message = short(message + UNKNOWN_EFFECT)
    return Outcome(False, None, ErrorType.TOOL_ERROR, message, False, None, Verdict.FAILURE,
                   False, True, request=inv)  # fmt: skip


class _BreakerSettings(Protocol):
    @property
    def reset_timeout_s(self) -> float: ...


class OpenBreaker(Protocol):
    """What :func:`circuit_open` reads of a key's breaker."""

    @property
    def key(self) -> str: ...
    @property
    def options(self) -> _BreakerSettings: ...
    @property
    def pinned_open(self) -> bool: ...
    def retry_after(self) -> float: ...


def circuit_open(
    inv: Invocation, breaker: OpenBreaker, wait: float | None = None, attempts: int = 0
) -> Outcome:
    """The ``circuit_open`` answer, with when to try again (``wait``, if already known);
    ``attempts``: the refused attempt it counts itself (fast-fail's).

    A breaker pinned open by an operator (``force_open``) is due no trial: the answer says
    so instead of promising one, and ``retry_after_s`` is the break, as an interval at
    which to ask again."""
    assert inv.tool is not None
    name = inv.tool.decl.name
    if wait is None:
        wait = breaker.retry_after()
    if breaker.pinned_open:
        message = (
            f"{name} is paused: an operator paused {breaker.key}; "
            "calls are refused until it is released"
        )
    else:
        if wait > 0:
            hint = f"try again in {wait:.1f} s" if wait < 10 else f"try again in {wait:.0f} s"
        else:  # half-open, with every trial place taken
            wait = min(1.0, breaker.options.reset_timeout_s)
            hint = "a trial call is testing it; try again in a moment"
        message = f"{name} is paused because {breaker.key} is failing; {hint}"
    return Outcome(False, None, ErrorType.CIRCUIT_OPEN, short(message), True, wait,
                   Verdict.SUCCESS, False, False, None, inv, 0.0, attempts)  # fmt: skip
