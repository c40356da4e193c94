"""Stage 9: chaos faults, injected inside the breaker as a real service failure would be.

Off unless a fault is configured (one attribute check per call). Faults target a tool name
or a breaker key, each with a ``rate``; draws come from one seeded ``random.Random`` so a
run with the same seed and the same calls injects the same faults.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import asdict
from typing import Annotated, Any, Literal, Self, get_args

import anyio
from pydantic import Field, Strict, field_validator, model_validator
from pydantic.dataclasses import dataclass

from ..contract import ErrorType, ToolError
from ..events import FaultInjected
from ..outcome import Outcome
from ..settings import DATACLASS, Seconds, Share, one_line_errors
from . import Invocation, Next
from .decode import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, too_big
from .invoke import error_outcome, timeout_outcome

__all__ = ["FAULT_KINDS", "Fault", "FaultInjector", "InjectedFault"]

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


class FaultInjector:
    """The faults in force. Change them at run time: ``add``, ``remove``, ``clear``, ``seed``."""

    def __init__(self, faults: Iterable[Fault] = (), seed: int | None = None) -> None:
        self._ids = itertools.count(1)
        self._faults: dict[int, Fault] = {}
        self.random = random.Random(seed)
        for fault in faults:
            self.add(fault)

    def add(self, fault: Fault) -> int:
        """Put a fault in force; returns its id."""
        fault_id = next(self._ids)
        self._faults[fault_id] = fault
        return fault_id

    def remove(self, fault_id: int) -> bool:
        return self._faults.pop(fault_id, None) is not None

    def clear(self) -> None:
        self._faults.clear()

    def seed(self, seed: int | None) -> None:
        """Restart the random source: the same seed and calls give the same injections."""
        self.random.seed(seed)

    def list(self) -> dict[int, Fault]:
        return dict(self._faults)

    def __bool__(self) -> bool:
        return bool(self._faults)

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        if not self._faults:
            return call_next(inv)
        return self._inject(call_next, inv)

    async def _inject(self, call_next: Next, inv: Invocation) -> Outcome:
        assert inv.tool is not None and inv.key is not None
        name, key = inv.tool.decl.name, inv.key
        for fault in list(self._faults.values()):
            if not fault.matches(name, key) or self.random.random() >= fault.rate:
                continue
            if inv.observers:
                inv.emit(FaultInjected(fault.kind, key))
            if fault.kind == "latency":
                delay = fault.latency_s + self.random.uniform(0, fault.jitter_s)
                with anyio.CancelScope(deadline=inv.deadline) as scope:
                    await anyio.sleep(delay)
                if scope.cancel_called:
                    return timeout_outcome(inv)
                continue
            if fault.kind == "hang":
                with anyio.CancelScope(deadline=inv.deadline):
                    await anyio.sleep_forever()
                return timeout_outcome(inv)
            if fault.kind == "error":
                error = ToolError(
                    fault.message, error_type=fault.error_type, retryable=fault.retryable
                )
                return error_outcome(inv, error)
            if fault.kind == "exception":
                return error_outcome(inv, InjectedFault(fault.message))
            output = {"injected": float("nan")} if fault.output is None else fault.output
            return Outcome(True, output)
        return await call_next(inv)
