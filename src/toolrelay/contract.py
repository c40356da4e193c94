"""The plugin contract: what a tool declares, what it receives, what it may raise.

Plugins import this module and nothing else from toolrelay.
"""

from __future__ import annotations

import contextvars
import enum
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "AuthContext",
    "CallContext",
    "ErrorType",
    "Isolation",
    "Risk",
    "ToolDeclaration",
    "ToolError",
    "ToolPlugin",
]

Risk = Literal["read", "write", "dangerous"]
RISKS: tuple[Risk, ...] = ("read", "write", "dangerous")
RISK_ORDER: dict[str, int] = {"read": 0, "write": 1, "dangerous": 2}
Isolation = Literal["thread", "process"]
ISOLATIONS: tuple[Isolation, ...] = ("thread", "process")


class ErrorType(enum.StrEnum):
    """The stable, documented set of failure kinds a model can be told about.

    The value is also the span's ``error.type`` and the metrics' ``outcome`` label.
    """

    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_POLICY = "tool_policy"
    VALIDATION_ERROR = "validation_error"
    NEEDS_APPROVAL = "needs_approval"
    DENIED = "denied"
    CIRCUIT_OPEN = "circuit_open"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    TOOL_ERROR = "tool_error"
    INVALID_OUTPUT = "invalid_output"
    INTERNAL_ERROR = "internal_error"


@dataclass(frozen=True, slots=True)
class AuthContext:
    """Who is calling, as the host knows it. Identity never comes from model arguments."""

    user_id: str | None = None
    tenant_id: str | None = None
    roles: frozenset[str] = frozenset()
    attributes: Mapping[str, Any] = field(default_factory=dict)


class _Attempt(Protocol):
    """What the invoke stage knows about the running attempt (an ``Invocation``)."""

    name: str
    call_id: str | None
    attempts: int
    key: str | None
    deadline: float


CURRENT_ATTEMPT: contextvars.ContextVar[list[Any]] = contextvars.ContextVar("toolrelay_attempt")
"""Set by the invoke stage around each attempt: ``[invocation, deadline]``, the deadline on
``time.monotonic()``'s clock, already there for sync handlers (they run on a worker thread,
with a copy of this context, where the event loop's clock cannot be read); ``None`` until
:meth:`CallContext.current` first works it out on the event loop, once per attempt."""


@dataclass(frozen=True, slots=True)
class CallContext:
    """The tool call being run: what a handler may want to know about it besides its
    arguments. A typed handler receives it by annotating a parameter ``CallContext``; any
    handler or plugin can ask for :meth:`current`."""

    tool: str
    call_id: str | None
    """The host's call id (at most 128 printable characters), or ``None``."""
    attempt: int
    """1 for the first attempt, 2 for the first retry, …"""
    deadline: float
    """When the whole call (every attempt) must have answered, in ``time.monotonic()``
    seconds: usable from any thread. (On the event loop, ``anyio.current_effective_deadline()``
    gives the same instant on anyio's clock.)"""
    breaker_key: str

    @property
    def time_left(self) -> float:
        """Seconds until :attr:`deadline`, never below 0 (read from the clock now)."""
        return max(0.0, self.deadline - time.monotonic())

    @classmethod
    def current(cls) -> CallContext:
        """The call whose attempt is running in this context (a handler, a plugin's
        ``execute``, or anything they call, on the event loop or the worker thread).

        Raises :class:`LookupError` outside a tool call."""
        try:
            attempt = CURRENT_ATTEMPT.get()
        except LookupError:
            raise LookupError("no toolrelay tool call is running in this context") from None
        inv: _Attempt = attempt[0]
        deadline: float | None = attempt[1]
        if deadline is None:  # on the event loop: anyio's clock is readable here
            import anyio

            deadline = attempt[1] = inv.deadline - anyio.current_time() + time.monotonic()
        return cls(inv.name, inv.call_id, inv.attempts, deadline, inv.key or inv.name)


@dataclass(frozen=True, slots=True)
class ToolDeclaration:
    """What a tool is: its name, schema and how it should be run.

    Declarations are values: to change a tool, return a new declaration from ``describe()``
    rather than mutating the old one (toolrelay caches compiled schemas per declaration).
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    output_schema: Mapping[str, Any] | None = None
    risk: Risk = "read"
    timeout_s: float = 10.0
    breaker_key: str | None = None
    """Tools naming the same key share one breaker, retry policy and concurrency limit.
    ``None`` means the tool's own name."""
    idempotent: bool | None = None
    """Whether a retry is safe. ``None`` means ``risk == "read"``."""
    max_attempts: int | None = None
    """All attempts, the first included. ``None`` uses the breaker key's setting."""
    version: str = "1"
    tags: frozenset[str] = frozenset()
    isolation: Isolation = "thread"
    """Where a sync handler runs: ``"thread"``, a worker thread of its breaker key, abandoned
    at the deadline; ``"process"``, a worker process of its breaker key, killed and replaced
    at the deadline (the handler must be a module-level function: ``docs/isolation.md``).
    Async handlers run on the event loop either way."""
    fallback: tuple[str, ...] = ()
    """Tools that answer instead, in order, when this one's breaker is open, it is
    overloaded, or (idempotent tools only) it timed out with time left before its deadline.
    A fallback's own fallbacks are not followed (``docs/fallbacks.md``)."""

    @property
    def key(self) -> str:
        return self.breaker_key or self.name

    @property
    def is_idempotent(self) -> bool:
        return self.risk == "read" if self.idempotent is None else self.idempotent


class ToolError(Exception):
    """Raised by a plugin for a precise answer to the model.

    ``counts_as_failure`` says whether the breaker should count it against the service; it
    defaults to ``retryable`` (a "not found" is a business answer, a 503 is a failure).
    """

    def __init__(
        self,
        message: str,
        *,
        error_type: ErrorType | str = ErrorType.TOOL_ERROR,
        retryable: bool = False,
        counts_as_failure: bool | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = ErrorType(error_type)
        self.retryable = retryable
        self.counts_as_failure = retryable if counts_as_failure is None else counts_as_failure
        self.retry_after_s = retry_after_s


@runtime_checkable
class ToolPlugin(Protocol):
    """Anything that describes tools and executes them.

    ``execute`` may be ``async def`` (awaited, cancelled at the deadline) or a plain ``def``
    (run on a worker thread of the tool's breaker key, abandoned at the deadline). Optional
    capabilities are protocols of their own: :mod:`toolrelay.capabilities`.
    """

    def describe(self) -> Sequence[ToolDeclaration]: ...

    def execute(
        self, name: str, args: dict[str, Any], ctx: AuthContext
    ) -> Any | Awaitable[Any]: ...
