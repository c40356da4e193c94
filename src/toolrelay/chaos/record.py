"""What the experiment runner records while an experiment plays (:class:`Record`, on one
clock: seconds from the run's start; a live view reads it during the run), the finished
:class:`Run` the checks judge, and each check's :class:`Check`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..dispatcher import Dispatcher
from ..events import AttemptEnded, Event, HedgeEnded
from ..invocation import Invocation
from ..result import ToolResult
from .timeline import Timeline, Window

Transition = tuple[float, str, str, str, int, int, int]
"""(at, breaker key, from, to, admitted, trials admitted, failures recorded) at the move."""

Answered = tuple[float, str, ToolResult, float]
"""(turn started at, tool, the answer, the call's deadline in seconds)."""


def outcome(result: ToolResult) -> str:
    """``ok``, or the answer's error type."""
    return "ok" if result.ok else str(result.error_type)


@dataclass
class Check:
    """One judged invariant: its name, whether it held, and the figure measured."""

    name: str
    ok: bool
    figure: str

    def line(self) -> str:
        """``PASS  name: figure`` (or ``FAIL``), as the reports print it."""
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.figure}"


@dataclass
class Record:
    """What the runner records while the experiment runs."""

    t0: float
    windows: list[Window] = field(default_factory=list)
    """The fault schedule, labelled (from the experiment's ``faults``)."""
    turns: int = 0
    calls: int = 0
    escaped: list[str] = field(default_factory=list)
    answers: list[Answered] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    failures_at_start: dict[str, int] = field(default_factory=dict)
    attempts: list[tuple[float, str | None, str]] = field(default_factory=list)
    hedges: Counter[str] = field(default_factory=Counter)
    """Hedged attempts by result: won, lost, skipped (docs/hedging.md)."""
    holds: list[tuple[float, float]] = field(default_factory=list)
    """(held for, budget) of each model-slot hold, in seconds."""

    def now(self) -> float:
        return anyio.current_time() - self.t0

    def observe(self, inv: Invocation, event: Event) -> None:
        """The dispatcher's observer: attempts (and whether they reached the service), hedges."""
        if isinstance(event, AttemptEnded):
            self.attempts.append((self.now(), inv.key, event.result))
        elif isinstance(event, HedgeEnded):
            self.hedges[event.result] += 1

    @property
    def answered(self) -> int:
        return len(self.answers)

    @property
    def moves(self) -> list[tuple[float, str, str, str]]:
        """The breaker transitions as (at, breaker key, from, to)."""
        return [(t[0], t[1], t[2], t[3]) for t in self.transitions]


@dataclass
class Run:
    """A finished run: what the checks judge and the reports show."""

    name: str
    seed: int
    duration_s: float
    data: dict[str, Any]
    dispatcher: Dispatcher
    record: Record
    calls_metric: float
    """``toolrelay_tool_calls_total`` once the run settled."""
    leaks: dict[str, float]
    timeline: Timeline
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` report."""
        record = self.record
        return {
            "name": self.name,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "calls": record.calls,
            "answers": record.answered,
            "outcomes": dict(Counter(outcome(a[2]) for a in record.answers)),
            "exceptions_escaped": list(record.escaped),
            "invariants": [check.__dict__ for check in self.checks],
            "ok": self.ok,
            "timeline": self.timeline.to_json(),
        }
