"""Chaos faults as settings: what to inject, into which calls, how often.

The pipeline's faults stage (:class:`~toolrelay.pipeline.faults.FaultInjector`) injects
them; ``toolrelay.toml``, the admin API and chaos experiments describe them with
:class:`Fault`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import Field, Strict, field_validator, model_validator
from pydantic.dataclasses import dataclass

from .contract import ErrorType
from .jsonlimits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, too_big
from .settings import DATACLASS, Seconds, Share, one_line_errors

FaultKind = Literal["latency", "error", "exception", "hang", "bad_output"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)


class InjectedFault(Exception):
    """The unexpected exception a ``kind="exception"`` fault raises in place of the handler."""


@one_line_errors("fault {}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class Fault:
    """One fault: what to do, to which calls, how often.

    ``latency`` delays the call by ``latency_s`` plus up to ``jitter_s`` (cut at the deadline);
    ``error`` answers as ``ToolError(message, error_type=, retryable=)`` would; ``exception``
    raises :class:`InjectedFault`; ``hang`` never returns (the deadline answers ``timeout``);
    ``bad_output`` returns ``output`` (default: a value that is not JSON; at most 64 levels
    deep and 256 KiB as JSON) instead of calling the handler. Exactly one of ``tool`` and
    ``breaker_key`` names the target.
    """

    kind: FaultKind
    tool: Annotated[str, Strict()] | None = None
    breaker_key: Annotated[str, Strict()] | None = None
    rate: Share = 1.0
    latency_s: Seconds = 0.0
    jitter_s: Seconds = 0.0
    error_type: ErrorType = ErrorType.TOOL_ERROR
    message: Annotated[str, Strict(), Field(max_length=240)] = "injected fault"
    retryable: Annotated[bool, Strict()] = True
    output: Any = None

    @field_validator("output")
    @classmethod
    def _output_fits(cls, value: Any) -> Any:
        problem = None if value is None else too_big(value, DEFAULT_MAX_DEPTH, DEFAULT_MAX_BYTES)
        if problem is not None:
            raise ValueError(problem.removeprefix("it "))  # "fault output is nested deeper…"
        return value

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if (self.tool is None) == (self.breaker_key is None):
            raise ValueError("a fault targets exactly one of tool= or breaker_key=")
        return self

    def matches(self, tool: str, key: str) -> bool:
        return self.tool == tool if self.tool is not None else self.breaker_key == key

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown fault settings: {sorted(unknown)}")
        return cls(**data)
