"""The plugin contract: what a tool declares, what it receives, what it may raise.

Plugins import this module and nothing else from toolrelay.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "AuthContext",
    "ErrorType",
    "Risk",
    "ToolDeclaration",
    "ToolError",
    "ToolPlugin",
]

Risk = Literal["read", "write", "dangerous"]
RISKS: tuple[Risk, ...] = ("read", "write", "dangerous")
RISK_ORDER: dict[str, int] = {"read": 0, "write": 1, "dangerous": 2}


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
    (run on a worker thread of the tool's breaker key, abandoned at the deadline).
    A plugin may also offer ``declaration(name) -> ToolDeclaration | None`` for O(1) lookups.
    """

    def describe(self) -> Sequence[ToolDeclaration]: ...

    def execute(
        self, name: str, args: dict[str, Any], ctx: AuthContext
    ) -> Any | Awaitable[Any]: ...
