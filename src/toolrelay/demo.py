"""``toolrelay demo``: an agent keeps answering while the services it depends on fail.

The demo starts the stand-in upstream on loopback, loads the bundled plugins against it,
and runs a scripted model (deterministic for a seed) that holds the model slot for each
turn and issues tool calls, sometimes several at once, while a fault schedule makes the
search upstream hang, the weather upstream answer 5xx in bursts and a sync tool block. It
ends with invariant verdicts and an exit status.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
from prometheus_client import CollectorRegistry

from .breakers import BreakerConfig
from .chaos.timeline import Timeline
from .chaos.timeline import Window as FaultWindow
from .chaos.upstream import Upstream
from .contract import AuthContext
from .dispatcher import Dispatcher
from .events import AttemptEnded, Event, HedgeEnded
from .loading import load_plugins
from .pipeline import Invocation, Observer
from .registry import ToolRegistry
from .result import ToolCall, ToolResult

__all__ = ["DemoOptions", "DemoReport", "run_demo"]

SLOT_BUDGET_S = 3.0
FALLBACK = "web_search_backup"
TIMEOUT_SLACK_S = 0.05
CITIES = ["Oslo", "Berlin", "London", "Paris", "Tokyo", "Sydney", "Reykjavík", "Cairo"]
QUERIES = ["circuit breaker pattern", "open-meteo api", "anyio cancellation", "searxng json"]
BREAKERS = {
    "searxng": BreakerConfig(fail_max=2, reset_timeout_s=1.5, max_attempts=1),
    "open-meteo": BreakerConfig(fail_max=4, reset_timeout_s=1.5, max_attempts=2),
    "legacy-crm": BreakerConfig(fail_max=2, reset_timeout_s=1.5, max_concurrent=4),
    # the status feed has a slow tail (1 in 5 takes 1.5 s): hedged after 0.15 s
    "feeds": BreakerConfig(hedge_after_s=0.15, max_attempts=1),
}


@dataclass(frozen=True)
class Window:
    """A fault in force from ``start`` to ``end`` (fractions of the run)."""

    what: str
    start: float
    end: float
    breaker_key: str


SCHEDULE = (
    Window("search upstream hangs", 0.27, 0.60, "searxng"),
    Window("weather upstream answers 503 in bursts", 0.40, 0.47, "open-meteo"),
    Window("sync CRM tool blocks", 0.63, 0.73, "legacy-crm"),
    Window("weather upstream answers 503 in bursts", 0.73, 0.80, "open-meteo"),
)


@dataclass
class DemoOptions:
    duration_s: float = 30.0
    seed: int = 1
    metrics_port: int = 9464
    otlp_endpoint: str | None = None
    json_path: Path | None = None
    html_path: Path | None = None
    live: bool | None = None
    """Rich live view; ``None`` means: when stdout is a terminal and rich is installed."""


@dataclass
class Invariant:
    name: str
    ok: bool
    figure: str


@dataclass
class DemoReport:
    duration_s: float
    seed: int
    turns: int = 0
    calls: int = 0
    answered: int = 0
    escaped: list[str] = field(default_factory=list)
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    transitions: list[tuple[float, str, str, str]] = field(default_factory=list)
    slot_holds: list[float] = field(default_factory=list)
    overruns_ms: list[float] = field(default_factory=list)
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    served: list[tuple[float, str, bool]] = field(default_factory=list)
    """(started at, fallback, ok) of each answer a fallback gave."""
    hedges: Counter[str] = field(default_factory=Counter)
    """Hedged attempts by result: won, lost, skipped (docs/hedging.md)."""
    invariants: list[Invariant] = field(default_factory=list)
    metrics_url: str | None = None
    timeline: Timeline | None = None

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.invariants)

    def p95(self, tool: str) -> float:
        values = sorted(self.latencies.get(tool, []))
        if not values:
            return 0.0
        return values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": "toolrelay demo",
            "duration_s": self.duration_s,
            "seed": self.seed,
            "turns": self.turns,
            "calls": self.calls,
            "answered": self.answered,
            "exceptions_escaped": self.escaped,
            "tools": {
                tool: {
                    "outcomes": dict(outcomes),
                    "p95_latency_s": round(self.p95(tool), 4),
                }
                for tool, outcomes in sorted(self.outcomes.items())
            },
            "breaker_transitions": [
                {"at_s": round(at, 3), "breaker_key": key, "from": old, "to": new}
                for at, key, old, new in self.transitions
            ],
            "slot": {
                "budget_s": SLOT_BUDGET_S,
                "holds": len(self.slot_holds),
                "max_hold_s": round(max(self.slot_holds, default=0.0), 4),
            },
            "timeouts": {
                "count": len(self.overruns_ms),
                "max_overrun_ms": round(max(self.overruns_ms, default=0.0), 2),
            },
            "fault_windows": [
                {"fault": what, "from_s": round(a, 2), "to_s": round(b, 2)}
                for what, a, b in self.windows
            ],
            "served_by_fallback": {
                name: sum(1 for _, by, _ in self.served if by == name)
                for name in sorted({by for _, by, _ in self.served})
            },
            "hedges": dict(self.hedges),
            "invariants": [i.__dict__ for i in self.invariants],
            "ok": self.ok,
            "timeline": (self.timeline or Timeline(self.duration_s)).to_json(),
        }


class _BlockingCrm:
    """A sync tool over a legacy client: blocks while its fault window is on."""

    def __init__(self) -> None:
        self.blocking = threading.Event()

    def __call__(self, args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        started = time.monotonic()
        while self.blocking.is_set() and time.monotonic() - started < 3.0:
            time.sleep(0.02)
        return {"customer": args["customer"], "tier": "gold", "open_tickets": 2}


def _registry(up: Upstream, crm: _BlockingCrm) -> ToolRegistry:
    registry = ToolRegistry()
    load_plugins(
        registry,
        ["toolrelay_plugins.weather", "toolrelay_plugins.websearch", "toolrelay_plugins.feeds"],
        {
            "weather": {"base_url": up.url, "geocoding_url": up.url},
            "websearch": {"base_url": up.url},
            "feeds": {"feeds": {"status": f"{up.url}/feeds/rss.xml"}},
        },
    )
    registry.tool(
        name="crm_lookup",
        description="Look a customer up in the legacy CRM.",
        parameters={
            "type": "object",
            "properties": {"customer": {"type": "string", "minLength": 1, "maxLength": 64}},
            "required": ["customer"],
            "additionalProperties": False,
        },
        timeout_s=0.8,
        breaker_key="legacy-crm",
    )(crm)
    # a second search service answers while the first is down (docs/fallbacks.md)
    load_plugins(
        registry,
        ["toolrelay_plugins.websearch"],
        {"websearch": {"base_url": f"{up.url}/backup", "tool": FALLBACK}},
    )
    registry.override("web_search", timeout_s=1.0, fallback=[FALLBACK])
    return registry


class ScriptedModel:
    """Picks the tool calls of each turn from what ``specs()`` offers, like a model would."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.counter = 0

    def turn(self, offered: set[str]) -> list[ToolCall]:
        rng = self.random
        menu: list[tuple[str, Callable[[], str]]] = [
            ("web_search", lambda: json.dumps({"query": rng.choice(QUERIES)})),
            ("web_search", lambda: json.dumps({"query": rng.choice(QUERIES), "max_results": 3})),
            ("weather_current", lambda: json.dumps({"city": rng.choice(CITIES)})),
            ("weather_forecast", lambda: json.dumps({"city": rng.choice(CITIES), "days": 3})),
            ("feed_latest", lambda: json.dumps({"feed": "status", "limit": 3})),
            ("crm_lookup", lambda: json.dumps({"customer": f"c-{rng.randrange(100)}"})),
        ]
        calls = []
        for _ in range(rng.choice([1, 2, 2, 3])):
            name, make_args = rng.choice(menu)
            if name not in offered and rng.random() < 0.8:
                continue  # the model was told the tool is unavailable; mostly it listens
            self.counter += 1
            calls.append(ToolCall(name, make_args(), f"call_{self.counter}"))
        if "web_search" in offered and not any(c.name == "web_search" for c in calls):
            self.counter += 1
            query = json.dumps({"query": rng.choice(QUERIES)})
            calls.append(ToolCall("web_search", query, f"call_{self.counter}"))
        return calls


async def _schedule(
    up: Upstream, crm: _BlockingCrm, report: DemoReport, duration: float, t0: float
) -> None:
    events: list[tuple[float, bool, Window]] = []
    for window in SCHEDULE:
        events.append((window.start * duration, True, window))
        events.append((window.end * duration, False, window))
        report.windows.append((window.what, window.start * duration, window.end * duration))
    for at, on, window in sorted(events, key=lambda e: e[0]):
        await anyio.sleep(max(0.0, t0 + at - anyio.current_time()))
        if window.what.startswith("search"):
            if on:
                up.set_fault("/search", "hang")
            else:
                up.clear_faults("/search")
        elif window.what.startswith("weather"):
            if on:
                up.set_fault("/v1/forecast", "status", rate=0.6, status=503)
            else:
                up.clear_faults("/v1/forecast")
        elif on:
            crm.blocking.set()
        else:
            crm.blocking.clear()


def _tracer_provider(endpoint: str | None) -> Any:
    if not endpoint:
        return None
    from .telemetry.otlp import otlp_tracer_provider

    return otlp_tracer_provider(endpoint, "toolrelay-demo")


def _verdicts(report: DemoReport, duration: float) -> list[Invariant]:
    hang = next(w for w in report.windows if w[0].startswith("search"))
    opened = [at for at, key, _, new in report.transitions if key == "searxng" and new == "open"]
    closed = [at for at, key, _, new in report.transitions if key == "searxng" and new == "closed"]
    opened_in = [at for at in opened if hang[1] <= at <= hang[2] + 1.0]
    closed_after = [at for at in closed if opened_in and at >= hang[2]]
    max_hold = max(report.slot_holds, default=0.0)
    max_overrun = max(report.overruns_ms, default=0.0)
    # while search was down: from the outage's start until its breaker closed after it
    until = closed_after[0] if closed_after else duration
    served = [ok for at, by, ok in report.served if by == FALLBACK and hang[1] <= at < until]
    return [
        Invariant(
            "every call answered",
            report.calls == report.answered and report.calls > 0,
            f"{report.answered}/{report.calls} answered",
        ),
        Invariant(
            "no slot held beyond its budget",
            max_hold <= SLOT_BUDGET_S + TIMEOUT_SLACK_S,
            f"max hold {max_hold:.3f} s of {SLOT_BUDGET_S:.1f} s",
        ),
        Invariant(
            "every timeout answered within its deadline + 50 ms",
            max_overrun <= TIMEOUT_SLACK_S * 1000,
            f"{len(report.overruns_ms)} timeouts, max overrun {max_overrun:.1f} ms",
        ),
        Invariant(
            "the search breaker opened during the outage and closed after it",
            bool(opened_in and closed_after),
            (
                f"opened at {opened_in[0]:.1f} s, closed at {closed_after[0]:.1f} s "
                f"(outage {hang[1]:.1f}–{hang[2]:.1f} s)"
                if opened_in and closed_after
                else f"opened at {opened}, closed at {closed} "
                f"(outage {hang[1]:.1f}–{hang[2]:.1f} s)"
            ),
        ),
        Invariant(
            f"{FALLBACK} answered web_search calls while search was down",
            sum(served) > 0,
            f"{sum(served)} ok answers served by {FALLBACK} "
            f"({len(served) - sum(served)} failed) between {hang[1]:.1f} and {until:.1f} s",
        ),
        Invariant(
            "no exception escaped",
            not report.escaped,
            f"{len(report.escaped)} escaped" + (f": {report.escaped[0]}" if report.escaped else ""),
        ),
    ]


async def run_demo(
    options: DemoOptions, out: TextIO = sys.stdout, view: Any | None = None
) -> DemoReport:
    """Run the demo; ``view`` (see :mod:`toolrelay.demo_view`) renders progress."""
    from .telemetry import serve_metrics

    duration = options.duration_s
    if options.html_path is not None:
        from .chaos.report_html import require_renderer

        require_renderer()  # before the run, not after it
    report = DemoReport(duration_s=duration, seed=options.seed)
    timeline = report.timeline = Timeline(duration)
    crm = _BlockingCrm()
    provider = _tracer_provider(options.otlp_endpoint)
    metrics = CollectorRegistry()
    server = None
    if options.metrics_port:
        try:
            server = serve_metrics(options.metrics_port, registry=metrics)
            report.metrics_url = f"http://127.0.0.1:{server.server_port}/metrics"
        except OSError as exc:
            print(f"toolrelay: not serving /metrics: port {options.metrics_port}: "
                  f"{exc.strerror}", file=out)  # fmt: skip
    async with Upstream(seed=options.seed) as up:
        up.set_fault("/feeds", "slow_tail", seconds=0.01, tail=0.2, tail_seconds=1.5)
        dispatcher = Dispatcher(
            _registry(up, crm),
            breakers=BREAKERS,
            metrics_registry=metrics,
            tracer_provider=provider,
            audit=None,
        )
        t0 = anyio.current_time()
        dispatcher.breakers.add_listener(
            lambda key, old, new: report.transitions.append(
                (anyio.current_time() - t0, key, old, new)
            )
        )
        dispatcher.observers = (*dispatcher.observers, _attempts(timeline, report))
        timeline.breaker_keys = {
            tool.decl.name: tool.decl.key for tool in dispatcher.registry.tools()
        }
        model = ScriptedModel(options.seed)
        slot = dispatcher.model_slot(budget_s=SLOT_BUDGET_S)
        slot.listeners.append(lambda lease: report.slot_holds.append(lease.elapsed()))
        ctx = AuthContext(user_id="demo-user", tenant_id="demo")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_schedule, up, crm, report, duration, t0)
                if view is not None:
                    tg.start_soon(view.run, report, dispatcher, t0)
                while anyio.current_time() - t0 < duration:
                    specs = dispatcher.specs(hide_fallbacks=True)
                    offered = {spec["function"]["name"] for spec in specs}
                    calls = model.turn(offered)
                    report.turns += 1
                    report.calls += len(calls)
                    try:
                        async with slot.hold() as lease:
                            started = anyio.current_time() - t0
                            left = lease.remaining()
                            results = await dispatcher.dispatch_many(calls, ctx, slot=lease)
                    except Exception as exc:  # an invariant, not a crash: count it
                        report.escaped.append(f"{type(exc).__name__}: {exc}"[:200])
                        continue
                    _record(report, dispatcher, calls, results, left, started)
                    await anyio.sleep(model.random.uniform(0.1, 0.3))
                tg.cancel_scope.cancel()
        finally:
            timeline.upstream_requests = sum(up.stats["requests"].values())
            crm.blocking.clear()
            await dispatcher.aclose()
            if server is not None:
                server.shutdown()
                server.server_close()
            if provider is not None:
                provider.shutdown()
    report.invariants = _verdicts(report, duration)
    timeline.transitions = list(report.transitions)
    timeline.windows = [
        FaultWindow(w.what, w.start * duration, w.end * duration, breaker_key=w.breaker_key)
        for w in SCHEDULE
    ]
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if options.html_path is not None:
        from .chaos.report_html import write_html

        write_html([report.to_json()], options.html_path)
    return report


def _attempts(timeline: Timeline, report: DemoReport) -> Observer:
    """An observer counting the attempts that reached the service, and hedges."""

    def observe(inv: Invocation, event: Event) -> None:
        if isinstance(event, AttemptEnded):
            timeline.attempt(event.result)
        elif isinstance(event, HedgeEnded):
            report.hedges[event.result] += 1

    return observe


def _record(
    report: DemoReport,
    dispatcher: Dispatcher,
    calls: list[ToolCall],
    results: list[ToolResult],
    slot_left: float,
    started: float,
) -> None:
    report.answered += len(results)
    for call, result in zip(calls, results, strict=True):
        outcome = "ok" if result.ok else str(result.error_type)
        report.outcomes[call.name][outcome] += 1
        report.latencies[call.name].append(result.duration_s)
        if result.served_by is not None:
            report.served.append((started, result.served_by, result.ok))
        tool = dispatcher.registry.resolve(call.name)
        timeout = tool.decl.timeout_s if tool is not None else slot_left
        deadline = min(timeout, slot_left)
        if report.timeline is not None:
            report.timeline.answer(started, call.name, outcome, result.duration_s, deadline)
        if result.error_type == "timeout":
            report.overruns_ms.append(max(0.0, (result.duration_s - deadline) * 1000))
