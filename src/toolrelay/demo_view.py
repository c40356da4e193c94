"""How the demo shows itself: a rich live view on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

import anyio

if TYPE_CHECKING:
    from .demo import DemoReport
    from .dispatcher import Dispatcher

STATE_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}


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
            for at, key, old, new in report.transitions[seen:]:
                print(f"[{at:5.1f}s] breaker {key}: {old} → {new}", file=self.out)
            seen = len(report.transitions)
            states = " ".join(
                f"{key}={info['state']}" for key, info in dispatcher.breakers.snapshot().items()
            )
            ok = sum(c["ok"] for c in report.outcomes.values())
            print(
                f"[{now:5.1f}s] calls {report.calls} answered {report.answered} ok {ok} "
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
            moves = [t for t in report.transitions if t[1] == key]
            last = f"{moves[-1][2]} → {moves[-1][3]} at {moves[-1][0]:.1f} s" if moves else "—"
            style = STATE_STYLE.get(info["state"], "")
            breakers.add_row(key, f"[{style}]{info['state']}[/]", str(len(moves)), last)
        holds = report.slot_holds
        slot = (
            f"model slot: {len(holds)} turns, last hold {holds[-1]:.2f} s, "
            f"max {max(holds):.2f} s of a 3.0 s budget"
            if holds
            else "model slot: waiting for the first turn"
        )
        active = [w for w in report.windows if w[1] <= elapsed < w[2]]
        faults = "faults now: " + (", ".join(w[0] for w in active) if active else "none")
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
    if live is None:
        live = out.isatty()
    if live:
        try:
            return RichView(duration_s)
        except ImportError:
            pass
    return PlainView(out)


def print_summary(report: DemoReport, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    print("", file=out)
    print(f"toolrelay demo — {report.duration_s:.0f} s, seed {report.seed}", file=out)
    print(f"{report.turns} turns, {report.calls} tool calls, {report.answered} answers", file=out)
    for tool, calls, detail, p95 in _tool_rows(report):
        print(f"  {tool:<18} {calls:>4} calls  p95 {p95 * 1000:6.0f} ms  {detail}", file=out)
    for name in sorted({by for _, by, _ in report.served}):
        ok = sum(1 for _, by, good in report.served if by == name and good)
        print(f"  {ok} ok answers were served by the fallback {name}", file=out)
    if report.hedges:
        won, lost = report.hedges["won"], report.hedges["lost"]
        print(f"  hedging: {won} slow feed calls answered by a hedge ({lost} hedges lost, "
              f"{report.hedges['skipped']} skipped)", file=out)  # fmt: skip
    for at, key, old, new in report.transitions:
        print(f"  [{at:5.1f}s] breaker {key}: {old} → {new}", file=out)
    for invariant in report.invariants:
        mark = "PASS" if invariant.ok else "FAIL"
        print(f"  {mark}  {invariant.name}: {invariant.figure}", file=out)
    if report.metrics_url:
        print(f"metrics were served at {report.metrics_url}", file=out)
    print("all invariants hold" if report.ok else "an invariant failed", file=out)
