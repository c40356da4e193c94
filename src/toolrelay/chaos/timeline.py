"""A chaos run's answers, breaker transitions and fault windows, for its reports.

:meth:`Timeline.to_json` is the ``timeline`` of the ``--json`` report and the only input of
the HTML report, so the picture and the numbers never disagree. Aggregates use every
answer; only the scatter's points are downsampled past :data:`MAX_POINTS`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MAX_POINTS = 3000
"""The most call points the report's scatter shows; past it, ok answers are sampled evenly."""

REFUSALS = frozenset({"circuit_open", "overloaded"})
"""Attempt results that never reached the service."""


@dataclass(frozen=True, slots=True)
class Answer:
    started_s: float
    tool: str
    outcome: str
    latency_s: float


@dataclass(frozen=True, slots=True)
class Window:
    """A fault in force from ``from_s`` to ``until_s``; on one tool or breaker key if named."""

    fault: str
    from_s: float
    until_s: float
    tool: str | None = None
    breaker_key: str | None = None


@dataclass
class Timeline:
    duration_s: float
    answers: list[Answer] = field(default_factory=list)
    transitions: list[tuple[float, str, str, str]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    breaker_keys: dict[str, str] = field(default_factory=dict)
    deadlines: dict[str, float] = field(default_factory=dict)
    attempts: int = 0
    """Attempts that reached the service (retries counted; breaker and bulkhead refusals not)."""
    upstream_requests: int | None = None
    """Requests the stand-in upstream received (``None`` when the run had none)."""

    def answer(
        self, started_s: float, tool: str, outcome: str, latency_s: float, deadline_s: float
    ) -> None:
        self.answers.append(Answer(started_s, tool, outcome, latency_s))
        self.deadlines[tool] = round(max(self.deadlines.get(tool, 0.0), deadline_s), 4)

    def to_json(self, max_points: int = MAX_POINTS) -> dict[str, Any]:
        last = max((a.started_s + a.latency_s for a in self.answers), default=0.0)
        end = max(self.duration_s, last, *(w.until_s for w in self.windows))
        points = _downsample(sorted(self.answers, key=lambda a: a.started_s), max_points)
        tools = sorted({a.tool for a in self.answers})
        keys = sorted({self.breaker_keys[t] for t in tools if t in self.breaker_keys})
        keys += sorted({t[1] for t in self.transitions} - set(keys))
        n = len(self.answers)
        ok = sum(a.outcome == "ok" for a in self.answers)
        return {
            "duration_s": self.duration_s,
            "end_s": round(end, 3),
            "headline": {
                "answers": n,
                "ok_ratio": round(ok / n, 4) if n else None,
                "p99_latency_s": _round(_p99(self.answers)),
                "attempts_per_call": round(self.attempts / n, 3) if n else None,
                "upstream_requests_per_call": (
                    round(self.upstream_requests / n, 3)
                    if n and self.upstream_requests is not None
                    else None
                ),
            },
            "tools": {
                tool: {
                    "breaker_key": self.breaker_keys.get(tool),
                    "deadline_s": self.deadlines.get(tool),
                    "answers": sum(a.tool == tool for a in self.answers),
                    "p99_latency_s": _round(_p99([a for a in self.answers if a.tool == tool])),
                }
                for tool in tools
            },
            "calls": {
                "answers": len(self.answers),
                "shown": len(points),
                "points": [
                    {
                        "t_s": round(a.started_s, 3),
                        "tool": a.tool,
                        "outcome": a.outcome,
                        "latency_ms": round(a.latency_s * 1000, 1),
                    }
                    for a in points
                ],
            },
            "answers_per_second": [
                {"second": second, "outcome": outcome, "answers": n}
                for (second, outcome), n in sorted(
                    Counter(
                        (math.floor(a.started_s + a.latency_s), a.outcome) for a in self.answers
                    ).items()
                )
            ],
            "fault_windows": [
                {
                    "fault": w.fault,
                    "from_s": round(w.from_s, 3),
                    "until_s": round(w.until_s, 3),
                    **({"tool": w.tool} if w.tool else {}),
                    **({"breaker_key": w.breaker_key} if w.breaker_key else {}),
                }
                for w in self.windows
            ],
            "breaker_transitions": transition_rows(self.transitions),
            "breaker_states": {key: self._states(key, end) for key in keys},
        }

    def _states(self, key: str, end: float) -> list[dict[str, Any]]:
        """The key's state as intervals from 0 to ``end`` (closed until its first move)."""
        bands = []
        since, state = 0.0, "closed"
        for at, _, _, new in (t for t in self.transitions if t[1] == key):
            if at > since:
                bands.append({"from_s": round(since, 3), "until_s": round(at, 3), "state": state})
            since, state = at, new
        if end > since:
            bands.append({"from_s": round(since, 3), "until_s": round(end, 3), "state": state})
        return bands


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0.99 for p99); ``None`` for no values."""
    ranked = sorted(values)
    if not ranked:
        return None
    return ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)]


def transition_rows(transitions: list[tuple[float, str, str, str]]) -> list[dict[str, Any]]:
    """Breaker transitions as the JSON reports list them."""
    return [
        {"at_s": round(at, 3), "breaker_key": key, "from": old, "to": new}
        for at, key, old, new in transitions
    ]


def _p99(answers: list[Answer]) -> float | None:
    return percentile([a.latency_s for a in answers], 0.99)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _downsample(answers: list[Answer], limit: int) -> list[Answer]:
    """Every failure, and ok answers evenly spaced to fill up to ``limit`` (in time order)."""
    if len(answers) <= limit:
        return answers
    failures = [a for a in answers if a.outcome != "ok"]
    ok = [a for a in answers if a.outcome == "ok"]
    room = max(0, limit - len(failures))
    kept = {id(ok[int(i * len(ok) / room)]) for i in range(room)} if room and ok else set()
    return [a for a in answers if a.outcome != "ok" or id(a) in kept]
