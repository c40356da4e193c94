"""How the demo shows itself: its figures (:class:`DemoReport`, also its ``--json``), a
rich live view on a terminal, plain lines elsewhere, and the summary at the end."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio

from .chaos.record import Check, Record, outcome
from .chaos.timeline import Timeline, percentile, transition_rows
from .dispatcher import Dispatcher

STATE_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}


@dataclass
class DemoReport:
    """The demo's figures, read from the runner's record (live, while the run goes)."""

    duration_s: float
    seed: int
    record: Record = field(default_factory=lambda: Record(0.0))
    slot_budget_s: float = 3.0
    verdicts: list[Check] = field(default_factory=list)
    metrics_url: str | None = None
    timeline: Timeline | None = None

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def outcomes(self) -> dict[str, Counter[str]]:
        outcomes: dict[str, Counter[str]] = {}
        for _, tool, result, _ in self.record.answers:
            outcomes.setdefault(tool, Counter())[outcome(result)] += 1
        return outcomes

    @property
    def slot_holds(self) -> list[float]:
        return [held for held, _ in self.record.holds]

    @property
    def overruns_ms(self) -> list[float]:
        """How late each timeout was answered, past its deadline."""
        return [
            max(0.0, (result.duration_s - deadline) * 1000)
            for _, _, result, deadline in self.record.answers
            if result.error_type == "timeout"
        ]

    @property
    def served(self) -> list[tuple[float, str, bool]]:
        """(started at, fallback, ok) of each answer a fallback gave."""
        return [
            (started, result.served_by, result.ok)
            for started, _, result, _ in self.record.answers
            if result.served_by is not None
        ]

    def p95(self, tool: str) -> float:
        latencies = [a[2].duration_s for a in self.record.answers if a[1] == tool]
        return percentile(latencies, 0.95) or 0.0

    def to_json(self) -> dict[str, Any]:
        holds, overruns, served = self.slot_holds, self.overruns_ms, self.served
        record = self.record
        return {
            "name": "toolrelay demo",
            "duration_s": self.duration_s,
            "seed": self.seed,
            "turns": record.turns,
            "calls": record.calls,
            "answered": record.answered,
            "exceptions_escaped": record.escaped,
            "tools": {
                tool: {"outcomes": dict(outcomes), "p95_latency_s": round(self.p95(tool), 4)}
                for tool, outcomes in sorted(self.outcomes.items())
            },
            "breaker_transitions": transition_rows(record.moves),
            "slot": {
                "budget_s": self.slot_budget_s,
                "holds": len(holds),
                "max_hold_s": round(max(holds, default=0.0), 4),
            },
            "timeouts": {
                "count": len(overruns),
                "max_overrun_ms": round(max(overruns, default=0.0), 2),
            },
            "fault_windows": [
                {"fault": w.fault, "from_s": round(w.from_s, 2), "to_s": round(w.until_s, 2)}
                for w in record.windows
            ],
            "served_by_fallback": dict(sorted(Counter(by for _, by, _ in served).items())),
            "hedges": dict(record.hedges),
            "invariants": [v.__dict__ for v in self.verdicts],
            "ok": self.ok,
            "timeline": (self.timeline or Timeline(self.duration_s)).to_json(),
        }


def _tool_rows(report: DemoReport) -> list[tuple[str, int, str, float]]:
    rows = []
    for tool in sorted(report.outcomes):
        outcomes = report.outcomes[tool]
        detail = " ".join(f"{k}={v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]))
        rows.append((tool, sum(outcomes.values()), detail, report.p95(tool)))
    return rows


class PlainView:
    """One status line a second, and one line per breaker transition."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = sys.stdout if out is None else out

    async def run(self, report: DemoReport, dispatcher: Dispatcher, t0: float) -> None:
        seen = 0
        while True:
            await anyio.sleep(1.0)
            now = anyio.current_time() - t0
            for at, key, old, new in report.record.moves[seen:]:
                print(f"[{at:5.1f}s] breaker {key}: {old} → {new}", file=self.out)
            seen = len(report.record.moves)
            states = " ".join(
                f"{key}={info['state']}" for key, info in dispatcher.breakers.snapshot().items()
            )
            ok = sum(c["ok"] for c in report.outcomes.values())
            record = report.record
            print(
                f"[{now:5.1f}s] calls {record.calls} answered {record.answered} ok {ok} "
                f"| breakers {states}",
                file=self.out,
                flush=True,
            )


class RichView:
    """A live table: tools, breakers, the model slot and a progress bar."""

    def __init__(self, duration_s: float) -> None:
        from rich.console import Console

        self.duration_s = duration_s
        self.console = Console()

    def render(self, report: DemoReport, dispatcher: Dispatcher, elapsed: float) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        tools = Table(title="tools", expand=True)
        for column in ("tool", "calls", "outcomes", "p95"):
            tools.add_column(column, justify="right" if column in ("calls", "p95") else "left")
        for tool, calls, detail, p95 in _tool_rows(report):
            tools.add_row(tool, str(calls), detail, f"{p95 * 1000:.0f} ms")
        breakers = Table(title="breakers", expand=True)
        for column in ("breaker key", "state", "transitions", "last change"):
            breakers.add_column(column)
        for key, info in dispatcher.breakers.snapshot().items():
            moves = [t for t in report.record.moves if t[1] == key]
            last = f"{moves[-1][2]} → {moves[-1][3]} at {moves[-1][0]:.1f} s" if moves else "—"
            style = STATE_STYLE.get(info["state"], "")
            breakers.add_row(key, f"[{style}]{info['state']}[/]", str(len(moves)), last)
        holds = report.slot_holds
        slot = (
            f"model slot: {len(holds)} turns, last hold {holds[-1]:.2f} s, "
            f"max {max(holds):.2f} s of a {report.slot_budget_s:.1f} s budget"
            if holds
            else "model slot: waiting for the first turn"
        )
        active = [w.fault for w in report.record.windows if w.from_s <= elapsed < w.until_s]
        faults = "faults now: " + (", ".join(active) if active else "none")
        bar = ProgressBar(total=self.duration_s, completed=min(elapsed, self.duration_s))
        return Group(tools, breakers, slot, faults, bar, f"{elapsed:.1f} / {self.duration_s:.0f} s")

    async def run(self, report: DemoReport, dispatcher: Dispatcher, t0: float) -> None:
        from rich.live import Live

        with Live(console=self.console, refresh_per_second=4, transient=False) as live:
            while True:
                live.update(self.render(report, dispatcher, anyio.current_time() - t0))
                await anyio.sleep(0.25)


def pick_view(live: bool | None, duration_s: float, out: TextIO | None = None) -> Any:
    out = sys.stdout if out is None else out
    if live or (live is None and out.isatty()):
        try:
            return RichView(duration_s)
        except ImportError:
            pass
    return PlainView(out)


def print_summary(report: DemoReport, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    print("", file=out)
    print(f"toolrelay demo — {report.duration_s:.0f} s, seed {report.seed}", file=out)
    record = report.record
    print(f"{record.turns} turns, {record.calls} tool calls, {record.answered} answers", file=out)
    for tool, calls, detail, p95 in _tool_rows(report):
        print(f"  {tool:<18} {calls:>4} calls  p95 {p95 * 1000:6.0f} ms  {detail}", file=out)
    for name in sorted({by for _, by, _ in report.served}):
        ok = sum(1 for _, by, good in report.served if by == name and good)
        print(f"  {ok} ok answers were served by the fallback {name}", file=out)
    if record.hedges:
        won, lost, skipped = (record.hedges[k] for k in ("won", "lost", "skipped"))
        print(f"  hedging: {won} slow feed calls answered by a hedge ({lost} hedges lost, "
              f"{skipped} skipped)", file=out)  # fmt: skip
    for at, key, old, new in report.record.moves:
        print(f"  [{at:5.1f}s] breaker {key}: {old} → {new}", file=out)
    for check in report.verdicts:
        print(f"  {check.line()}", file=out)
    if report.metrics_url:
        print(f"metrics were served at {report.metrics_url}", file=out)
    print("all invariants hold" if report.ok else "an invariant failed", file=out)
